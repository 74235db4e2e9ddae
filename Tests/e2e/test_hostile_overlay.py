"""Hostile HTTP through the overlay: the same malformed and smuggled requests as test_hostile_http.py, sent as exact
bytes into a device's tunnel, so they cross the relay end-to-end encrypted and meet the dark gateway's proxy core.

The gateway must refuse them exactly as HTTP mode does (a 400 JSON error or a close, the backend hearing nothing),
cut a stalled upload, and keep its memory and descriptors flat over hundreds of hostile circuits.
"""

from __future__ import annotations

import os
import signal
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Iterator

import httpx
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
    # The hostile requests name their host `x`: let the tunnel pass that name, so they reach its framing check and,
    # past it, the dark gateway's parser (a web page's rebinding name is test_tunnel_browser.py's business).
    tunnel.args += ["--allowed-host", "x"]
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


STALLED_DOWNLOADS = 100
# What one stalled download may hold at the controller (docs/design/overlay-buffers.md, "A stalled circuit at the controller"):
# its stream window (1 MiB) waiting in the gateway stream, up to the relay's 256 KiB in flight plus one window more
# handed over at once, each frame in a buffer rounded up to a power of two, and the decoder buffers those frames pin.
# Measured 2.3 to 5.8 MiB, depending on how reads coalesce.
STALLED_BOUND_PER_CIRCUIT = 8 * 1024 * 1024


def settled_rss(pid: int, bound_s: float = 60.0) -> int:
    """The process's RSS once it stops changing (four samples 0.5 s apart within 1 MiB of each other): flow control
    has filled every window and nothing more can be buffered. Bounded, as a guard against a leak that never settles."""
    deadline = time.monotonic() + bound_s
    samples = [rss_bytes(pid)]
    while True:
        # Sleep: RSS has no event to wait for; "stopped changing" is a comparison of samples over time.
        time.sleep(0.5)
        samples = (samples + [rss_bytes(pid)])[-4:]
        if (len(samples) == 4 and max(samples) - min(samples) < 1024 * 1024) or time.monotonic() > deadline:
            return samples[-1]


def test_stalled_downloads_are_bounded_at_the_controller_and_given_back(overlay: HostileOverlay,
                                                                        controller: Controller) -> None:
    """Issue 37, item 1: 100 downloads whose device stopped reading took the controller from 64 to 411 MB (about
    3.5 MB each), and the memory stayed after they closed. Here a tunnel of its own carries 100 downloads and is then
    stopped (SIGSTOP: its controller connection is no longer read, as a device that went to sleep). Each download may
    hold STALLED_BOUND_PER_CIRCUIT at the controller, and once the tunnel is gone the controller gives the memory back
    (malloc_trim after circuits close, at most every 10 s): RSS within 10 % of its baseline 30 s after."""
    pid = controller.process.pid
    assert_still_serves(overlay)
    # A device of its own: the stalled downloads count against its circuit cap, not against the probe's device.
    enroll(controller, "ipad-stalled", "device")
    stalled_tunnel = Tunnel(controller, "ipad-stalled", controller.log_dir)
    stalled_tunnel.start()
    baseline = settled_rss(pid)
    socks = []
    try:
        for _ in range(STALLED_DOWNLOADS):
            s = socket.create_connection(("127.0.0.1", stalled_tunnel.port), timeout=10)
            s.sendall(b"GET /bytes?size=268435456 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            socks.append(s)
        for s in socks:
            assert s.recv(4096).startswith(b"HTTP/1.1 200"), "a stalled download never started"
        os.kill(stalled_tunnel.pid, signal.SIGSTOP)
        stalled = settled_rss(pid)
        grown = stalled - baseline
        print(f"controller RSS: baseline {baseline / 1048576:.1f} MiB, {STALLED_DOWNLOADS} stalled downloads "
              f"{stalled / 1048576:.1f} MiB (+{grown / STALLED_DOWNLOADS / 1048576:.2f} MiB each)")
        assert grown <= STALLED_DOWNLOADS * STALLED_BOUND_PER_CIRCUIT, \
            f"{grown / 1048576:.1f} MiB for {STALLED_DOWNLOADS} stalled downloads"
    finally:
        for s in socks:
            s.close()
        os.kill(stalled_tunnel.pid, signal.SIGKILL)
        os.kill(stalled_tunnel.pid, signal.SIGCONT)
        stalled_tunnel.stop()
    closed_at = time.monotonic()
    deadline = closed_at + 30
    while rss_bytes(pid) > baseline * 1.1 and time.monotonic() < deadline:
        # Sleep: a poll of RSS, which has no event; the 30 s is the issue's own requirement, not a guess at speed.
        time.sleep(0.5)
    after = rss_bytes(pid)
    print(f"controller RSS {time.monotonic() - closed_at:.1f} s after the downloads closed: {after / 1048576:.1f} MiB")
    assert after <= baseline * 1.1, \
        f"RSS {after / 1048576:.1f} MiB 30 s after the downloads closed (baseline {baseline / 1048576:.1f} MiB)"
    # The overlay still serves another device. (This once hung for up to two minutes: not the overlay, but the sample
    # backend spinning through 100 abandoned downloads; a direct request to it tells the two apart.)
    with httpx.Client(base_url=overlay.backend.url, trust_env=False, timeout=30) as direct:
        assert direct.get("/health").status_code == 200, "the backend itself does not answer"
    assert_still_serves(overlay)
