"""Hostile HTTP through the overlay: the same malformed and smuggled requests as test_hostile_http.py, sent as exact
bytes into a device's tunnel, so they cross the relay end-to-end encrypted and meet the dark gateway's proxy core.

The gateway must refuse them exactly as HTTP mode does (a 400 JSON error or a close, the backend hearing nothing),
cut a stalled upload, and keep its memory and descriptors flat over hundreds of hostile circuits.
"""

from __future__ import annotations

import socket
import uuid
from dataclasses import dataclass
from typing import Iterator

import pytest

from conftest import Backend, Controller, ManagedProcess, cli_env
from hostile import assert_no_growth, backend_saw, fd_count, read_until_closed, rss_bytes, send_raw
from test_hostile_http import SMUGGLED
from test_overlay import SERVICE, Tunnel, enroll

pytestmark = pytest.mark.e2e

IDLE_TIMEOUT_S = 2
CLOSE_BOUND_S = 15.0


@dataclass
class HostileOverlay:
    backend: Backend
    gateway: ManagedProcess
    tunnel: Tunnel


@pytest.fixture(scope="module")
def overlay(controller: Controller) -> Iterator[HostileOverlay]:
    backend = Backend(controller.log_dir)
    backend.start()
    enroll(controller, "gw-h", "gateway")
    enroll(controller, "ipad-h", "device")
    gateway = ManagedProcess(
        "gateway-hostile",
        [str(controller.binary), "serve", "--mode", "ziti", "--identity", "identities/gw-h.json",
         "--service", SERVICE, "--backend", backend.url, "--idle-timeout", f"{IDLE_TIMEOUT_S}s",
         "--log-level", "info"],
        controller.log_dir, cwd=controller.root, env=cli_env(),
    )
    tunnel = Tunnel(controller, "ipad-h", controller.log_dir)
    try:
        gateway.start()
        gateway.wait_for_log("hosting service")
        tunnel.start()
        yield HostileOverlay(backend, gateway, tunnel)
    finally:
        tunnel.stop()
        gateway.stop()
        backend.stop()


def assert_still_serves(o: HostileOverlay) -> None:
    assert o.gateway.alive(), f"the gateway exited:\n{o.gateway.logs()}"
    assert o.tunnel.alive(), f"the tunnel exited:\n{o.tunnel.logs()}"
    marker = f"p{uuid.uuid4().hex}"
    with o.tunnel.client(timeout=10) as c:
        r = c.get("/debug/headers", params={"probe": marker})
    assert r.status_code == 200 and r.json()["headers"].get("x-ils-identity") == ["ipad-h"], r.text
    assert backend_saw(o.backend, marker, wait_s=5)


def assert_never_reached(o: HostileOverlay, marker: str, what: str) -> None:
    """The overlay still serves, and `marker` is not in the backend's access log once that later request is: it, not
    a clock, bounds the wait for a late line."""
    assert_still_serves(o)
    assert marker not in o.backend.full_log(), what


@pytest.mark.parametrize("name,template", SMUGGLED, ids=[c[0] for c in SMUGGLED])
def test_smuggled_and_malformed_requests_through_the_overlay(overlay: HostileOverlay, name: str,
                                                             template: bytes) -> None:
    marker = f"p{uuid.uuid4().hex}"
    out = send_raw(overlay.tunnel.port, template.replace(b"{P}", marker.encode()), deadline_s=CLOSE_BOUND_S)
    print(f"{name}: {out.describe()}")
    assert out.closed, f"{name}: the circuit stayed open: {out.describe()}"
    if out.data:
        assert out.status == 400 and out.responses == 1, f"{name}: {out.describe()}"
        assert out.body.startswith(b'{"error":"'), out.describe()
    assert_never_reached(overlay, marker, f"{name}: the request reached the backend")
    assert marker not in overlay.gateway.full_log(), f"{name}: the gateway logged the request's query"


def test_stalled_upload_through_the_overlay_is_cut(overlay: HostileOverlay) -> None:
    with socket.create_connection(("127.0.0.1", overlay.tunnel.port), timeout=5) as s:
        s.sendall(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789")
        out = read_until_closed(s, deadline_s=CLOSE_BOUND_S + IDLE_TIMEOUT_S)
    print(f"stalled upload through the overlay: {out.describe()}")
    assert out.closed and out.status == 408, out.describe()
    assert b'"code":"request_timeout"' in out.body
    assert_still_serves(overlay)


def test_hostile_circuits_leave_no_memory_or_descriptors_behind(overlay: HostileOverlay) -> None:
    payloads = [t.replace(b"{P}", b"mem") for _, t in SMUGGLED]

    def round_of_abuse() -> None:
        for p in payloads:
            send_raw(overlay.tunnel.port, p, deadline_s=CLOSE_BOUND_S)

    round_of_abuse()
    assert_still_serves(overlay)
    procs = {"gateway": overlay.gateway.pid, "tunnel": overlay.tunnel.pid}
    before = {name: (rss_bytes(pid), fd_count(pid)) for name, pid in procs.items()}
    rounds = 8
    for _ in range(rounds):
        round_of_abuse()
    assert_still_serves(overlay)
    for name, pid in procs.items():
        assert_no_growth(name, pid, before[name], f"{rounds * len(payloads)} hostile circuits")
