"""The admin console in a real browser (issue 26, items 2 and 4): headless Chromium, driven by selenium, against the
real `admin console`, controller, gateway and FastAPI backend. It signs in with the one-time URL (a second use is
refused), creates an identity and reads its QR code back from the page image with zbarimg (the token enrolls and
streams), revokes a device with a live SSE stream (the stream ends, the sessions page drops it, the audit page shows
it), edits a service's policy (a live stream it leaves out ends), and refuses forged changes, leaving the target
untouched. Screenshots of every page at 1280x800 and 390x844 go to .ils-artifacts/console (or
$ILS_E2E_ARTIFACTS/console)."""

from __future__ import annotations

import http.server
import json
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from conftest import Backend, Certs, Controller, ManagedProcess, free_port
from console_browser import Browser, Console, artifacts, require_browser, sign_in_another
from test_qr import zbarimg
from test_services import END_BOUND_S, ServiceTunnel, Stream, create, serve

pytestmark = pytest.mark.e2e


@dataclass
class Setup:
    controller: Controller
    console: Console
    desktop: Browser
    log_dir: Path


@pytest.fixture(scope="module")
def setup(controller: Controller) -> Iterator[Setup]:
    require_browser()
    log_dir = controller.log_dir
    started: list[ManagedProcess] = []
    browsers: list[Browser] = []
    try:
        fastapi = Backend(log_dir)
        fastapi.start()
        started.append(fastapi)
        create(controller, "gw-console-e2e", "gateway")
        started.append(serve(controller, "gw-console-e2e", "claude-api", fastapi.url, log_dir))
        console = Console(controller)
        console.start()
        started.append(console)
        desktop = Browser()
        browsers.append(desktop)
        yield Setup(controller, console, desktop, log_dir)
    finally:
        for browser in browsers:
            browser.quit()
        for process in reversed(started):
            process.stop()


def identity(controller: Controller, name: str) -> dict:
    r = controller.cli("admin", "identity", "show", name, "--json")
    assert r.returncode == 0, r.describe()
    return json.loads(r.stdout)


def session_cookie(browser: Browser) -> str:
    cookie = browser.driver.get_cookie("ils_console")
    assert cookie is not None, "no session cookie"
    return cookie["value"]


def csrf(browser: Browser) -> str:
    return browser.element("input[name='csrf']").get_attribute("value")


# The tests run in file order: the first signs the desktop browser in, the others use that session (a test that
# may run alone makes sure of one with signed_in).


def signed_in(setup: Setup) -> None:
    """Makes sure the desktop browser has a session: a test run alone signs it in with the first link."""
    base = setup.console.base
    setup.desktop.driver.get(base + "/identities")
    if setup.desktop.driver.current_url != base + "/identities":
        setup.desktop.driver.get(setup.console.first_url)
    setup.desktop.element("#identities")


def serve_page(page: bytes) -> http.server.ThreadingHTTPServer:
    """A page of another site (the browser reaches it as localhost, another site than the console's 127.0.0.1),
    served until `shutdown()`. Threading: Chromium opens a spare connection that would hold up a one-at-a-time
    server."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_login_url_works_once(setup: Setup) -> None:
    desktop = setup.desktop
    desktop.driver.get(setup.console.first_url)
    desktop.element("#identities")
    assert desktop.driver.current_url == setup.console.base + "/identities", "no secret left in the address bar"
    cookie = desktop.driver.get_cookie("ils_console")
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict" and cookie["path"] == "/", cookie
    assert "expiry" not in cookie, "a session cookie, not one kept on disk"

    # A second browser with the same URL is refused and gets no session.
    other = Browser()
    try:
        other.driver.get(setup.console.first_url)
        assert "used already" in other.element("main").text
        assert other.driver.get_cookie("ils_console") is None
        other.driver.get(setup.console.base + "/identities")
        assert other.driver.current_url.endswith("/signed-out")
    finally:
        other.quit()
    r = httpx.get(setup.console.first_url, follow_redirects=False, trust_env=False)
    assert r.status_code == 403 and "set-cookie" not in r.headers
    assert setup.console.first_url.split("t=")[1] not in setup.console.full_log().replace(setup.console.first_url, "")
    assert desktop.errors() == []


def test_created_identity_qr_enrolls(setup: Setup) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    desktop, controller = setup.desktop, setup.controller
    desktop.driver.get(setup.console.base + "/identities")
    form = desktop.element("#create-identity")
    form.find_element(By.NAME, "name").send_keys("ipad-qr")
    Select(form.find_element(By.NAME, "role")).select_by_value("device")
    form.find_element(By.NAME, "attributes").send_keys("ipad")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    image = desktop.element("#enroll-qr")
    assert desktop.driver.current_url == setup.console.base + "/identities", "the token is never in a URL"
    picture = artifacts() / "enroll-qr-read-back.png"
    image.screenshot(str(picture))
    desktop.screenshot("identity-created")
    uri = zbarimg(picture)
    assert uri.startswith("ils-enroll://v1/"), uri
    assert uri == desktop.driver.execute_script("return document.getElementById('enroll-uri').textContent")
    r = controller.cli("enroll", uri)
    assert r.returncode == 0, r.describe()
    assert identity(controller, "ipad-qr")["attributes"] == ["ipad"]
    tunnel = ServiceTunnel(controller, "ipad-qr", "claude-api", setup.log_dir)
    tunnel.start()
    try:
        stream = Stream(tunnel)
        assert stream.events >= 1, "the QR's identity streams through the overlay"
    finally:
        tunnel.stop()


def test_revoke_ends_live_stream_and_leaves_the_sessions_page(setup: Setup) -> None:
    from selenium.webdriver.common.by import By

    desktop, controller = setup.desktop, setup.controller
    create(controller, "tablet", "device")
    tunnel = ServiceTunnel(controller, "tablet", "claude-api", setup.log_dir)
    tunnel.start()
    try:
        stream = Stream(tunnel)
        desktop.driver.get(setup.console.base + "/sessions")
        desktop.element("tr[data-device='tablet']")
        desktop.screenshot("sessions")

        desktop.driver.get(setup.console.base + "/identities")
        row = desktop.element("tr[data-name='tablet']")
        row.find_element(By.CSS_SELECTOR, "form[action='/identities/tablet/revoke'] button").click()
        alert = desktop.wait(lambda d: d.switch_to.alert)
        assert "Revoke tablet?" in alert.text
        alert.accept()
        assert desktop.element("#notice").text == "tablet was revoked."
        answered = time.monotonic()
        stream.thread.join(END_BOUND_S)
        assert stream.ended_at is not None, "the revoked device's stream went on"
        print(f"tablet's stream ended {1000 * (stream.ended_at - answered):.0f} ms after the page answered")
        assert identity(controller, "tablet")["state"] == "revoked"

        def gone(driver) -> bool:
            driver.get(setup.console.base + "/sessions")
            return not driver.find_elements(By.CSS_SELECTOR, "tr[data-device='tablet']")

        desktop.wait(gone)
    finally:
        tunnel.stop()


def test_revocation_in_audit_page(setup: Setup) -> None:
    """A device revoked through the console shows in the audit page: the revocation alone under its filter, and the
    identity family for that target (create, enroll, revoke) and nothing else. The device is this test's own, with a
    name no other test uses, so it runs alone or after the others alike."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    desktop, controller, base = setup.desktop, setup.controller, setup.console.base
    name = f"audited-{uuid.uuid4().hex[:12]}"
    create(controller, name, "device")
    signed_in(setup)
    desktop.driver.get(base + "/identities")
    row = desktop.element(f"tr[data-name='{name}']")
    row.find_element(By.CSS_SELECTOR, f"form[action='/identities/{name}/revoke'] button").click()
    alert = desktop.wait(ec.alert_is_present())
    assert f"Revoke {name}?" in alert.text
    alert.accept()
    assert desktop.element("#notice").text == f"{name} was revoked."
    assert identity(controller, name)["state"] == "revoked"

    desktop.driver.get(base + "/audit")
    form = desktop.element("#audit-filter")
    form.find_element(By.NAME, "action").send_keys("identity.revoke")
    form.find_element(By.NAME, "target").send_keys(name)
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    desktop.wait(lambda d: "action=identity.revoke" in d.current_url)
    rows = desktop.elements("#audit tbody tr")
    cells = [[td.text for td in row.find_elements(By.TAG_NAME, "td")] for row in rows]
    assert len(cells) == 1 and cells[0][1:4] == ["admin", "identity.revoke", name], cells
    desktop.screenshot("audit")
    # The family filter finds the create too, and nothing about other targets.
    desktop.driver.get(f"{base}/audit?action=identity.&target={name}")
    actions = [row.find_elements(By.TAG_NAME, "td")[2].text for row in desktop.elements("#audit tbody tr")]
    assert actions == ["identity.revoke", "identity.enroll", "identity.create"], actions


def test_forged_changes_are_refused_and_change_nothing(setup: Setup) -> None:
    desktop, controller, base = setup.desktop, setup.controller, setup.console.base
    create(controller, "victim", "device")
    desktop.driver.get(base + "/identities")
    token, cookie = csrf(desktop), session_cookie(desktop)
    target = f"{base}/identities/victim/revoke"
    with httpx.Client(trust_env=False, cookies={"ils_console": cookie}, follow_redirects=False) as client:
        assert client.post(target, data={}).status_code == 403  # no CSRF token
        wrong = token[:-1] + ("B" if token.endswith("A") else "A")
        assert client.post(target, data={"csrf": wrong}).status_code == 403  # a wrong one
        assert client.post(target, data={"csrf": token}, headers={"Origin": "http://evil.example"}).status_code == 403
        assert client.post(target, data={"csrf": token}, headers={"Sec-Fetch-Site": "cross-site"}).status_code == 403
        assert client.post(target, data={"csrf": token}, headers={"Host": "evil.example"}).status_code == 421
        assert client.get(target).status_code in (404, 405)  # a GET changes nothing
    assert identity(controller, "victim")["state"] == "active"

    # A page on another site that submits a form to the console: SameSite=Strict keeps the cookie off, and the form
    # has no CSRF token anyway.
    page = (
        f'<!doctype html><form id="f" method="post" action="{target}"><input name="csrf" value="guess"></form>'
        '<script>document.getElementById("f").submit()</script>'
    ).encode()

    server = serve_page(page)
    try:
        desktop.driver.get(f"http://localhost:{server.server_port}/")
        desktop.wait(lambda d: d.current_url.startswith(base))
        # localhost is another site than 127.0.0.1: the browser sent no cookie at all.
        assert "Not signed in" in desktop.element("body").text
    finally:
        server.shutdown()
    assert identity(controller, "victim")["state"] == "active"
    log = setup.console.wait_for_log_count("console change refused")
    assert token not in log and cookie not in log, "no secret in the console's log"


def test_a_form_over_the_upload_limit_is_413_with_the_security_headers(setup: Setup) -> None:
    """Issue 37, item 7: the 413 for a form body over 64 KiB came from Hummingbird past the console's guard, without
    the security headers; every answer the console writes carries them, and the change is not made."""
    desktop, controller, base = setup.desktop, setup.controller, setup.console.base
    create(controller, "victim-413", "device")
    desktop.driver.get(base + "/identities")
    token, cookie = csrf(desktop), session_cookie(desktop)
    with httpx.Client(trust_env=False, cookies={"ils_console": cookie}, follow_redirects=False) as client:
        r = client.post(f"{base}/identities/victim-413/revoke", data={"csrf": token, "pad": "a" * (100 * 1024)})
    print(f"over the limit: HTTP {r.status_code} {dict(r.headers)}")
    assert r.status_code == 413, r.text
    assert "frame-ancestors 'none'" in r.headers.get("content-security-policy", ""), r.headers
    assert r.headers.get("x-frame-options") == "DENY" and r.headers.get("cache-control") == "no-store", r.headers
    assert r.headers.get("x-content-type-options") == "nosniff", r.headers
    assert identity(controller, "victim-413")["state"] == "active"


def test_a_login_link_opened_from_another_site_signs_in_after_one_press(setup: Setup) -> None:
    """A chat app or a web mail is another site: SameSite=Strict would withhold the new cookie from the redirect that
    follows a sign-in there, and the used link would land on "Not signed in". Such a link (and one fetched without a
    browser, as a link preview) gets a button instead and stays unused until it is pressed."""
    desktop, base = setup.desktop, setup.console.base
    signed_in(setup)
    preview = base + sign_in_another(desktop, base)
    chat = base + sign_in_another(desktop, base)

    # A link preview fetches the link without a browser's Sec-Fetch-Site: a page with a button, nothing used.
    r = httpx.get(preview, follow_redirects=False, trust_env=False)
    assert r.status_code == 200 and 'id="sign-in"' in r.text and "set-cookie" not in r.headers, r.text[:300]
    visitor = Browser()
    try:
        visitor.driver.get(preview)
        visitor.element("#identities")
        assert visitor.driver.current_url == base + "/identities", "the previewed link still signed in"
    finally:
        visitor.quit()

    page = f'<!doctype html><a id="go" href="{chat}">the console</a>'.encode()

    server = serve_page(page)
    other = Browser()
    try:
        # localhost is another site than the console's 127.0.0.1.
        other.driver.get(f"http://localhost:{server.server_port}/")
        other.element("#go").click()
        button = other.element("#sign-in")
        assert other.driver.get_cookie("ils_console") is None, "nothing is used before the press"
        other.wait(lambda d: d.current_url == base + "/login")  # the secret is out of the address bar
        button.click()
        other.element("#identities")
        assert other.driver.current_url == base + "/identities"
        assert other.driver.get_cookie("ils_console") is not None
        # Used now: the same link again, from the same page, is refused.
        other.driver.get(f"http://localhost:{server.server_port}/")
        other.element("#go").click()
        assert "used already" in other.element("main").text
        assert [e for e in other.errors() if "status of 403" not in e] == []  # the refusal's own 403 aside
    finally:
        other.quit()
        server.shutdown()
    # A post of a secret from another origin is refused and uses nothing.
    fresh = base + sign_in_another(desktop, base)
    secret = fresh.split("t=", 1)[1]
    r = httpx.post(base + "/login", data={"t": secret}, headers={"Origin": "http://localhost:1"},
                   follow_redirects=False, trust_env=False)
    assert r.status_code == 403 and "set-cookie" not in r.headers, r.text[:300]
    r = httpx.get(fresh, follow_redirects=False, trust_env=False)
    assert r.status_code == 200 and 'id="sign-in"' in r.text, "the refused post used the link up"
    assert secret not in setup.console.full_log()


def test_service_policy_edit_cuts_a_live_stream(setup: Setup) -> None:
    from selenium.webdriver.common.by import By

    desktop, controller, base = setup.desktop, setup.controller, setup.console.base
    create(controller, "desk", "device")
    tunnel = ServiceTunnel(controller, "desk", "claude-api", setup.log_dir)
    tunnel.start()
    try:
        stream = Stream(tunnel)
        desktop.driver.get(base + "/services")
        row = desktop.element("tr[data-name='claude-api']")
        assert "up:" in row.find_element(By.CSS_SELECTOR, "td[data-label='Health']").text
        stale = desktop.driver.page_source  # a page read before the change, for the conflict check below
        row.find_element(By.TAG_NAME, "summary").click()
        dial = row.find_element(By.CSS_SELECTOR, "#edit-claude-api input[name='dial']")
        dial.clear()
        dial.send_keys("#ipad")
        row.find_element(By.CSS_SELECTOR, "#edit-claude-api button[type=submit]").click()
        assert desktop.element("#notice").text == "claude-api was updated."
        stream.thread.join(END_BOUND_S)
        assert stream.ended_at is not None, "a device the new policy leaves out kept streaming"
        desktop.screenshot("services")

        # The form of the page read before the change carries revision 1: it is refused, not applied over revision 2.
        revision = stale.split('name="revision" value="', 1)[1].split('"', 1)[0]
        with httpx.Client(trust_env=False, cookies={"ils_console": session_cookie(desktop)}) as client:
            r = client.post(
                f"{base}/services/claude-api",
                data={"csrf": csrf(desktop), "revision": revision, "dialSemantic": "anyOf", "dial": "#all",
                      "bindSemantic": "anyOf", "bind": "role:gateway"},
            )
            assert r.status_code == 409 and "changed meanwhile" in r.text, r.text[:500]
    finally:
        tunnel.stop()
        r = controller.cli("admin", "service", "update", "claude-api", "--dial", "role:device")
        assert r.returncode == 0, r.describe()

    # Create one through the form; nobody hosts it yet.
    desktop.driver.get(base + "/services")
    form = desktop.element("#create-service")
    form.find_element(By.NAME, "name").send_keys("console-made")
    form.find_element(By.NAME, "dial").clear()
    form.find_element(By.NAME, "dial").send_keys("#ipad, role:admin")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    assert desktop.element("#notice").text == "console-made was created."
    health = desktop.element("tr[data-name='console-made'] td[data-label='Health']").text
    assert health == "down: no gateway hosts it"
    listed = json.loads(controller.cli("admin", "service", "show", "console-made", "--json").stdout)
    assert listed["dial"] == {"semantic": "anyOf", "tokens": ["#ipad", "role:admin"]}


def test_refused_forms_write_nothing(setup: Setup) -> None:
    """Input the console or the controller refuses: 400 with its sentence, and no identity, service or audit row."""
    desktop, controller, base = setup.desktop, setup.controller, setup.console.base
    desktop.driver.get(base + "/identities")
    token, cookie = csrf(desktop), session_cookie(desktop)

    def snapshot() -> tuple:
        identities = controller.cli("admin", "identity", "list", "--json")
        services = controller.cli("admin", "service", "list", "--json")
        audit = controller.cli("admin", "audit", "--json")
        assert identities.returncode == services.returncode == audit.returncode == 0
        return identities.stdout, services.stdout, len(json.loads(audit.stdout))

    before = snapshot()
    refused = [
        ("/identities", {"name": "bad name", "role": "device"}, "letters, digits"),
        ("/identities", {"name": "esc\x1b[2J", "role": "device"}, "letters, digits"),
        ("/identities", {"name": "no-role", "role": "root"}, "device, gateway or admin"),
        ("/identities", {"name": "no-expiry", "role": "device", "expires": "0"}, "at least 1s"),
        ("/identities", {"name": "bad-attr", "role": "device", "attributes": "all"}, "all"),
        ("/services", {"name": "svc-x", "dial": "role:root"}, "role"),
        ("/services", {"name": "svc-y", "dialSemantic": "noneOf"}, "anyOf or allOf"),
        ("/services/claude-api", {"dial": "#all"}, "no revision"),
    ]
    with httpx.Client(trust_env=False, cookies={"ils_console": cookie}, follow_redirects=False) as client:
        for path, form, sentence in refused:
            r = client.post(base + path, data={"csrf": token, **form})
            assert r.status_code == 400, (path, form, r.status_code)
            banner = r.text.split('id="error"', 1)[1].split("</p>", 1)[0]
            assert sentence in banner, (form, banner)
            assert "\x1b" not in r.text
    assert snapshot() == before


PAGES = ["identities", "sessions", "services", "gateways", "audit"]


def test_screenshots_of_every_page_at_both_sizes(setup: Setup) -> None:
    from selenium.webdriver.common.by import By

    desktop, base = setup.desktop, setup.console.base
    desktop.errors()  # drain what the forged-change test left (refused requests log as errors)
    phone = Browser(phone=True)
    saved: list[Path] = []
    try:
        phone.driver.get(base + sign_in_another(desktop, base))
        desktop.element("#login-qr")
        saved.append(desktop.screenshot("sign-in-another-device"))
        phone.element("#identities")
        for browser in (desktop, phone):
            for name in PAGES:
                browser.driver.get(f"{base}/{name}")
                browser.element("main h1")
                if browser.phone:
                    width = browser.driver.execute_script("return document.documentElement.scrollWidth")
                    assert width <= 390, f"/{name} scrolls sideways on a phone ({width} px)"
                saved.append(browser.screenshot(name))
            assert browser.errors() == [], browser.errors()
        # The create page with its QR at phone size.
        phone.driver.get(base + "/identities")
        form = phone.element("#create-identity")
        form.find_element(By.NAME, "name").send_keys("phone-made")
        form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        phone.element("#enroll-qr")
        assert phone.driver.execute_script("return document.documentElement.scrollWidth") <= 390
        saved.append(phone.screenshot("identity-created"))
    finally:
        phone.quit()
    listing = artifacts() / "screenshots.txt"
    listing.write_text("\n".join(str(p) for p in saved) + "\n")
    print("console screenshots:\n" + listing.read_text())
    assert all(p.stat().st_size > 5000 for p in saved)


def test_beyond_loopback_needs_tls(setup: Setup) -> None:
    r = setup.controller.cli("admin", "console", "--listen", "0.0.0.0:0")
    assert r.returncode == 64 and "only with TLS" in r.stderr, r.describe()


def test_under_tls_the_cookie_is_secure_and_host_prefixed(setup: Setup, certs: Certs) -> None:
    console = Console(setup.controller, "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key))
    console.start()
    try:
        url = console.first_url
        assert url.startswith(f"https://127.0.0.1:{console.port}/login?t="), url
        with httpx.Client(verify=certs.client_context(), trust_env=False, follow_redirects=False) as client:
            # As a browser sends it for a link opened from a terminal (without it: the confirmation page).
            r = client.get(url, headers={"Sec-Fetch-Site": "none"})
            assert r.status_code == 303 and r.headers["location"] == "/identities", r.text
            cookie = r.headers["set-cookie"]
            assert cookie.startswith("__Host-ils_console=") and "Secure" in cookie and "HttpOnly" in cookie, cookie
            assert "SameSite=Strict" in cookie and "Path=/" in cookie and "Domain" not in cookie, cookie
            page = client.get(f"https://127.0.0.1:{console.port}/identities")
            assert page.status_code == 200 and 'id="identities"' in page.text
            # Plain HTTP to the TLS port is not served.
            with pytest.raises(httpx.HTTPError):
                httpx.get(f"http://127.0.0.1:{console.port}/identities", trust_env=False, timeout=5)
    finally:
        console.stop()
