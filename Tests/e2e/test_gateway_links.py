"""Gateway links against the real binary (issue 23, items 4, 5 and 10): a renewed gateway's old certificate gets no
circuit, a refused gateway says why once and does not hammer the controller, and a refused tunnel client is told why
in the gateway's JSON error format.

Each test has a controller of its own (module fixture `controller` is shared; names are unique per test)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from conftest import Backend, Controller, ManagedProcess, cli_env
from test_overlay import SERVICE, Tunnel, enroll

pytestmark = pytest.mark.e2e

HOSTING_BOUND_S = 15.0
# The `reason` label the controller counts a refused overlay connection under (`ils_refusals_total`): a superseded
# certificate and a revoked identity are both `permission_denied`.
REFUSED_IDENTITY = "permission_denied"


def serve(controller: Controller, backend: Backend, identity_file: str, name: str) -> ManagedProcess:
    p = ManagedProcess(
        name,
        [str(controller.binary), "serve", "--mode", "ziti", "--identity", identity_file, "--service", SERVICE,
         "--backend", backend.url, "--log-level", "debug"],
        controller.log_dir,
        cwd=controller.root,
        env=cli_env(),
    )
    p.start()
    return p


def wait_for(predicate, bound_s: float, what: str) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > bound_s:
            pytest.fail(f"{what} did not happen within {bound_s} s", pytrace=False)
        time.sleep(0.05)
    return time.monotonic() - started


@pytest.fixture(scope="module")
def backend(controller: Controller) -> Iterator[Backend]:
    b = Backend(controller.log_dir)
    b.start()
    yield b
    b.stop()


def one_request(tunnel: Tunnel) -> httpx.Response:
    """One request on a connection of its own, so each is a circuit of its own (the relay spreads circuits, not
    requests)."""
    with tunnel.client(10.0) as c:
        return c.get("/debug/headers")


def access_lines(process: ManagedProcess, start: int = 0) -> int:
    """Requests the gateway proxied (its access lines for the test's path) in its log from offset `start`."""
    return process.full_log()[start:].count("/debug/headers")


def test_refused_tunnel_client_is_told_why(controller: Controller, backend: Backend) -> None:
    """Item 10. A tunnel client whose circuit is refused gets an HTTP answer in the gateway's JSON error format with
    the stable code, not a bare close: no gateway hosting (503 service_unavailable), a service that does not exist
    (404 unknown_service), the device revoked (403 identity_blocked). First in this module: no gateway hosts yet."""
    enroll(controller, "ipad-told", "device")
    tunnel = Tunnel(controller, "ipad-told", controller.log_dir)
    tunnel.start()
    try:
        with httpx.Client(base_url=tunnel.base_url, trust_env=False, timeout=10.0) as c:
            r = c.get("/debug/headers")
        print(f"no gateway: HTTP {r.status_code} {r.text.strip()}")
        assert r.status_code == 503 and r.headers["content-type"] == "application/json", (r.status_code, r.text)
        assert r.json()["code"] == "service_unavailable" and "no gateway" in r.json()["error"], r.text

        unknown = Tunnel(controller, "ipad-told", controller.log_dir)
        unknown.args[unknown.args.index(SERVICE)] = "no-such-service"
        unknown.start()
        try:
            with httpx.Client(base_url=unknown.base_url, trust_env=False, timeout=10.0) as c:
                r = c.get("/debug/headers")
        finally:
            unknown.stop()
        print(f"unknown service: HTTP {r.status_code} {r.text.strip()}")
        assert r.status_code == 404 and r.json()["code"] == "unknown_service", (r.status_code, r.text)

        r = controller.cli("admin", "identity", "revoke", "ipad-told")
        assert r.returncode == 0, r.describe()
        with httpx.Client(base_url=tunnel.base_url, trust_env=False, timeout=10.0) as c:
            r = c.get("/debug/headers")
        print(f"revoked: HTTP {r.status_code} {r.text.strip()}")
        assert r.status_code == 403, (r.status_code, r.text)
        assert r.json()["code"] == "identity_blocked", r.text
        assert "revoked" in r.json()["error"], r.text
    finally:
        tunnel.stop()


def test_renewed_gateways_old_certificate_gets_no_circuit(controller: Controller, backend: Backend) -> None:
    """Item 4. Two gateway processes share one identity (the second runs a copy of the identity file). After
    `renew` on the first one's file, the copy's links, made with the replaced certificate, get no circuit: every
    request goes to the renewed gateway, which moved to its new certificate by itself, without a restart and
    without cutting a stream. Before the fix the copy got about half of the requests.

    Item 5 on the same copy: it is refused from then on (identity_blocked), logs the reason once, and retries a
    few times a minute at most (before: about 12 times a second, forever, without saying why)."""
    enroll(controller, "gw-renew", "gateway")
    enroll(controller, "ipad-renew", "device")
    identities = controller.root / "identities"
    shutil.copy(identities / "gw-renew.json", identities / "gw-renew-copy.json")
    (identities / "gw-renew-copy.json").chmod(0o600)
    first = serve(controller, backend, "identities/gw-renew.json", "gateway-renew-first")
    copy = serve(controller, backend, "identities/gw-renew-copy.json", "gateway-renew-copy")
    tunnel = Tunnel(controller, "ipad-renew", controller.log_dir)
    try:
        first.wait_for_log("hosting service")
        copy.wait_for_log("hosting service")
        tunnel.start()
        for _ in range(20):
            assert one_request(tunnel).status_code == 200
        wait_for(lambda: access_lines(first) + access_lines(copy) >= 20, HOSTING_BOUND_S,
                 "the access lines of the 20 requests before renew")
        print(f"before renew: first {access_lines(first)}, copy {access_lines(copy)} of 20 requests")
        assert access_lines(copy) > 0, "precondition: the copy takes circuits while its certificate is current"

        # A stream that stays open across the renewal and the re-link.
        stream_client = tunnel.client(30.0)
        stream = stream_client.send(
            stream_client.build_request("GET", "/claude/stream", params={"n": 40, "interval_ms": 100}), stream=True
        )
        assert stream.status_code == 200
        lines = stream.iter_lines()

        r = controller.cli("renew", "--force", "--identity", "identities/gw-renew.json")
        assert r.returncode == 0, r.describe()
        took = wait_for(lambda: "re-linking with it" in first.full_log(), HOSTING_BOUND_S,
                        "the running gateway moving to its renewed certificate")
        print(f"the first gateway moved to its new certificate {took:.2f} s after renew")
        wait_for(lambda: first.full_log().count("hosting service") >= 2, HOSTING_BOUND_S, "re-linking")

        copy_mark, first_mark = len(copy.full_log()), len(first.full_log())
        for i in range(20):
            r = one_request(tunnel)
            assert r.status_code == 200, f"request {i} after renew: {r.status_code} {r.text[:200]}"
            assert r.json()["headers"].get("x-ils-identity") == ["ipad-renew"]
        # A gateway writes its access line after the response's last byte went out, so the client can hold the
        # 20th answer before its line is in the log: wait for all 20 lines (in either log) before counting.
        wait_for(lambda: access_lines(copy, copy_mark) + access_lines(first, first_mark) >= 20, HOSTING_BOUND_S,
                 "the access lines of the 20 requests after renew")
        to_copy, to_first = access_lines(copy, copy_mark), access_lines(first, first_mark)
        print(f"after renew: first {to_first}, copy {to_copy} of 20 requests")
        assert to_copy == 0, f"the copy with the replaced certificate still got {to_copy} of 20 circuits"
        assert to_first == 20

        events = sum(1 for line in lines if line.startswith("data:"))
        stream.close()
        stream_client.close()
        print(f"the stream open across the renewal got all its {events} events")
        assert events >= 40, f"the stream open during the renewal was cut after {events} of 40 events"

        # Item 5: the copy is refused now; it says why once and backs off to minutes.
        wait_for(lambda: "refused this gateway's identity" in copy.full_log(), HOSTING_BOUND_S,
                 "the copy being told it is refused")
        refusals_mark = controller.refusals(REFUSED_IDENTITY)
        assert refusals_mark >= 1, "the controller counted no refusal of the copy's connection"
        window = 20.0
        # Sleep: how often it reconnects is a rate, counted over a window of time: the window is the test.
        time.sleep(window)
        refusals = controller.refusals(REFUSED_IDENTITY) - refusals_mark
        said = copy.full_log().count("refused this gateway's identity")
        print(f"the refused copy reconnected {refusals} times in {window:.0f} s and logged the reason at error "
              f"{copy.full_log().count('error ils-gateway: the controller refused')} time(s)")
        assert refusals <= 4, f"the refused copy reconnected {refusals} times in {window:.0f} s"
        assert said >= 1
        assert copy.full_log().count("error ils-gateway: the controller refused this gateway's identity") == 1, \
            "the reason must be logged once at error level, not at every retry"
        assert copy.alive(), "the refused copy exited (it waits and retries, which an admin's enable can heal)"
    except BaseException:
        for p in (first, copy, controller.process):
            print(f"--- {p.name}\n{p.logs(6000)}")
        raise
    finally:
        for p in (tunnel, copy, first):
            p.stop()


def test_revoked_gateway_says_why_and_backs_off(controller: Controller, backend: Backend) -> None:
    """Item 5. A revoked gateway's TLS handshake still succeeds (its certificate is from the CA), so it used to reset
    its backoff on every connect and reconnect about 12 times a second. Now the controller tells it why on its control
    stream, it logs that once, and it waits 30 s doubling to 5 minutes between tries."""
    enroll(controller, "gw-revoked", "gateway")
    gateway = serve(controller, backend, "identities/gw-revoked.json", "gateway-revoked")
    try:
        gateway.wait_for_log("hosting service")
        r = controller.cli("admin", "identity", "revoke", "gw-revoked")
        assert r.returncode == 0, r.describe()
        wait_for(lambda: "refused this gateway's identity" in gateway.full_log(), HOSTING_BOUND_S,
                 "the revoked gateway being told why")
        mark = controller.refusals(REFUSED_IDENTITY)
        assert mark >= 1, "the controller counted no refusal of the revoked gateway's connection"
        window = 15.0
        # Sleep: how often it reconnects is a rate, counted over a window of time: the window is the test.
        time.sleep(window)
        refusals = controller.refusals(REFUSED_IDENTITY) - mark
        print(f"revoked gateway: {refusals} reconnects in {window:.0f} s; log: "
              f"{[line for line in gateway.full_log().splitlines() if 'refused' in line][:3]}")
        assert refusals <= 2, f"the revoked gateway reconnected {refusals} times in {window:.0f} s"
        assert "is revoked" in gateway.full_log(), "the gateway's log does not say it was revoked"
    finally:
        gateway.stop()
