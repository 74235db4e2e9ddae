"""The tunnel serves the device's own programs, not the web pages its browser shows (issue 37, item 3), in a real
headless Chromium: a page of another site, a page of the same site on another port, and a page reached through a
rebinding name that resolves to 127.0.0.1 get no answer from the backend and make it do nothing; the backend sees
none of their requests; curl, httpx and the tunnel's own pages still work, and a flood of refusals is logged once."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from typing import Iterator

import httpx
import pytest

from conftest import Backend, Controller
from console_browser import Browser
from test_console_browser import serve_page
from test_gateway_links import backend, serve, wait_for  # noqa: F401 (backend: the module's fixture)
from test_overlay import Tunnel, enroll

pytestmark = pytest.mark.e2e

BOUND_S = 30.0


@pytest.fixture(scope="module")
def tunnel(controller: Controller, backend: Backend) -> Iterator[Tunnel]:
    enroll(controller, "gw-web", "gateway")
    enroll(controller, "ipad-web", "device")
    gateway = serve(controller, backend, "identities/gw-web.json", "gateway-web")
    t = Tunnel(controller, "ipad-web", controller.log_dir)
    try:
        gateway.wait_for_log("hosting service")
        t.start()
        yield t
    finally:
        t.stop()
        gateway.stop()


def fence(tunnel: Tunnel, backend: Backend) -> None:
    """A later allowed request, waited for in the backend's log: once it is there, anything sent before it that
    reached the backend would be there too. It, not a clock, bounds the wait for a late line."""
    marker = f"fence-{uuid.uuid4().hex}"
    with tunnel.client(10.0) as c:
        assert c.get("/debug/headers", params={"m": marker}).status_code == 200
    wait_for(lambda: marker in backend.full_log(), BOUND_S, "the fence request in the backend's log")


ATTACK = """<!doctype html><title>attacker</title><body><script>
const tunnel = "http://127.0.0.1:%(port)d";
const results = {};
async function attempt(name, url, init) {
  try {
    const r = await fetch(url, init);
    results[name] = r.type === "opaque" ? "opaque" : r.status + " " + (await r.text());
  } catch (e) { results[name] = "error " + e; }
}
(async () => {
  await attempt("post", tunnel + "/claude/stream?n=1&m=%(marker)s-post", {mode: "no-cors", method: "POST", body: "rm -rf"});
  await attempt("get", tunnel + "/debug/headers?m=%(marker)s-get", {mode: "no-cors"});
  await attempt("read", tunnel + "/debug/headers?m=%(marker)s-read", {});
  for (let i = 0; i < 20; i++) await attempt("flood" + i, tunnel + "/debug/headers?m=%(marker)s-flood", {mode: "no-cors"});
  document.body.dataset.results = JSON.stringify(results);
  document.title = "done";
})();
</script></body>"""


def run_attack(browser: Browser, url: str) -> dict:
    browser.driver.get(url)
    browser.wait(lambda d: d.title == "done")
    return json.loads(browser.driver.execute_script("return document.body.dataset.results"))


@pytest.mark.parametrize("site", ["attacker.test", "127.0.0.1"], ids=["another-site", "same-site-other-port"])
def test_a_web_page_cannot_drive_the_tunnel(tunnel: Tunnel, backend: Backend, site: str) -> None:
    marker = f"page-{uuid.uuid4().hex}"
    server = serve_page((ATTACK % {"port": tunnel.port, "marker": marker}).encode())
    browser = Browser(loopback_names=("attacker.test",))
    log_mark = len(tunnel.full_log())
    try:
        results = run_attack(browser, f"http://{site}:{server.server_address[1]}/")
    finally:
        browser.quit()
        server.shutdown()
    print(f"the page at {site}: {json.dumps({k: v for k, v in results.items() if not k.startswith('flood')})}")
    # The readable fetch gets no answer of the backend (CORS hides the 403 from the page, but nothing else came).
    assert "x-ils-identity" not in json.dumps(results), results
    fence(tunnel, backend)
    assert marker not in backend.full_log(), "a request of the web page reached the backend"
    log = tunnel.wait_for_log_count("tunnel refused a request", after=log_mark)
    refusals = [line for line in log.splitlines() if "tunnel refused a request" in line]
    print("\n".join(refusals))
    assert len(refusals) == 1, f"23 refused requests from one page: expected one log line, got {len(refusals)}"
    assert "cross_site_request" in refusals[0], refusals[0]


def test_a_rebinding_name_gets_421_and_reaches_nothing(tunnel: Tunnel, backend: Backend) -> None:
    marker = f"rebind-{uuid.uuid4().hex}"
    browser = Browser(loopback_names=("rebind.test",))
    try:
        browser.driver.get(f"http://rebind.test:{tunnel.port}/debug/headers?m={marker}")
        text = browser.driver.find_element("tag name", "body").text
        # The page's own script runs in the rebinding origin: a same-origin fetch is refused the same way.
        status = browser.driver.execute_async_script(
            "const done = arguments[0];"
            f"fetch('/debug/headers?m={marker}-fetch', {{method: 'POST', body: 'x'}})"
            ".then(r => done(r.status), e => done('error ' + e));"
        )
    finally:
        browser.quit()
    print(f"navigation answered: {text[:200]!r}; the page's fetch: {status}")
    assert "misdirected_request" in text, text
    assert status == 421, status
    fence(tunnel, backend)
    assert marker not in backend.full_log(), "a request through the rebinding name reached the backend"


def test_curl_httpx_and_the_tunnels_own_pages_still_work(tunnel: Tunnel, backend: Backend) -> None:
    with tunnel.client(10.0) as c:
        r = c.get("/debug/headers")
        assert r.status_code == 200 and r.json()["headers"]["x-ils-identity"] == ["ipad-web"], r.text
        r = c.post("/debug/headers", headers={"Host": "localhost"}, content=b"body")
        assert r.status_code in (200, 405), r.text
    curl = shutil.which("curl")
    if curl:
        out = subprocess.run([curl, "-sS", "-N", f"{tunnel.base_url}/claude/stream?n=3&interval_ms=10"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.count("data:") >= 3, out.stdout + out.stderr
    browser = Browser()
    try:
        # A person opening the tunnel's address (Sec-Fetch-Site: none), and that page's own same-origin fetch.
        browser.driver.get(f"{tunnel.base_url}/debug/headers")
        text = browser.driver.find_element("tag name", "body").text
        assert "ipad-web" in text, text
        status = browser.driver.execute_async_script(
            "const done = arguments[0];"
            "fetch('/debug/headers', {method: 'POST', body: 'x'}).then(r => done(r.status), e => done('error ' + e));"
        )
        assert status in (200, 405), status
    finally:
        browser.quit()


def test_allow_origin_lets_one_origin_in(controller: Controller, backend: Backend, tunnel: Tunnel) -> None:
    """--allow-origin names a web app the user chose: its page may use the tunnel; any other page still may not."""
    server = serve_page(b"<!doctype html><title>app</title>")
    origin = f"http://localhost:{server.server_address[1]}"
    allowed = Tunnel(controller, "ipad-web", controller.log_dir)
    allowed.args += ["--allow-origin", origin]
    allowed.start()
    try:
        marker = f"mid-{uuid.uuid4().hex}"
        with httpx.Client(base_url=allowed.base_url, trust_env=False, timeout=10.0) as c:
            r = c.get("/debug/headers", headers={"Origin": origin, "Sec-Fetch-Site": "same-site"})
            assert r.status_code == 200, r.text
            # Another origin on a connection of its own: answered 403 before any circuit.
            with httpx.Client(base_url=allowed.base_url, trust_env=False, timeout=10.0) as other:
                r = other.get("/debug/headers", headers={"Origin": "http://localhost:1", "Sec-Fetch-Site": "same-site"})
            assert r.status_code == 403 and r.json()["code"] == "cross_site_request", r.text
            # Another origin on the connection that already carries a circuit: the connection is reset (an answer
            # would have to wait for the answers before it), and nothing of the request goes on.
            with pytest.raises(httpx.TransportError):
                c.get("/debug/headers", params={"m": marker},
                      headers={"Origin": "http://localhost:1", "Sec-Fetch-Site": "same-site"})
        fence(allowed, backend)
        assert marker not in backend.full_log(), "a refused request on a kept-alive connection reached the backend"
    finally:
        allowed.stop()
        server.shutdown()
