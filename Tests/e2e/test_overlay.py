"""End-to-end tests of the overlay mode (`serve --mode ziti` and `tunnel`) through the real binaries.

One set-up per module: the `controller` fixture of conftest.py (`controller init` + `controller run` in a temporary
directory, with a copy of the binary), a sample backend of this module's own, two enrolled identities -- gw1
(gateway) and ipad (device) -- the gateway (`serve --mode ziti`, which opens no listening socket and dials out to the
controller) and the device's `tunnel` on a loopback port. Every client request below goes to the tunnel port, so it
crosses the whole overlay: tunnel -> controller relay -> gateway -> backend.

Streaming assertions compare a local receive time with the backend's `emitted_at` on the same machine, as
test_http_mode.py does: "the first event arrived before the backend produced the last" proves nothing buffered the
stream, without tight timings. Tests that disturb the set-up (controller restart, backend stop) come last.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import httpx
import pytest
from websockets.sync.client import connect as ws_connect

import sse_helpers
from conftest import Backend, Controller, ManagedProcess, STARTUP_TIMEOUT_S, cli_env, free_port
from sse_helpers import assert_gateway_error, curl_timed_lines, parse_sse, timed_lines, wait_for_idle_streams

pytestmark = pytest.mark.e2e

SERVICE = "claude-api"
N_EVENTS = 5
INTERVAL_MS = 400  # the last of 5 events is emitted 1.6 s after the first: a wide margin for "before"
DOWNLOAD_SIZE = 64 * 1024 * 1024
UPLOAD_SIZE = 24 * 1024 * 1024

REFUSAL_BOUND_S = 10.0  # a refused circuit must end the client's connection well before this
HANGUP_BOUND_S = 2.0  # client hang-up -> backend sees the disconnect
RECOVERY_BOUND_S = 10.0  # controller back up -> requests through the same tunnel work again


# ------------------------------------------------------------------------------------------------------------------
# The overlay set-up
# ------------------------------------------------------------------------------------------------------------------


class Tunnel(ManagedProcess):
    def __init__(self, controller: Controller, identity: str, log_dir: Path) -> None:
        self.port = free_port()
        super().__init__(
            f"tunnel-{identity}",
            [str(controller.binary), "tunnel", "--identity", f"identities/{identity}.json",
             "--service", SERVICE, "--listen", f"127.0.0.1:{self.port}", "--log-level", "info"],
            log_dir,
            cwd=controller.root,
            env=cli_env(),
        )

    def start(self, probe: bool = True) -> None:
        """probe=False waits for the log line only: a probe connection is itself a circuit attempt, which would
        add a line of its own to a refused tunnel's log."""
        super().start()
        self.wait_for_log("tunnel listening")
        if probe:
            self.wait_for_port(self.port)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, timeout: float = 30.0) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, trust_env=False, timeout=httpx.Timeout(timeout, connect=5.0))


@dataclass
class Overlay:
    controller: Controller
    backend: Backend
    gateway: ManagedProcess
    tunnel: Tunnel
    log_dir: Path
    ipad_id: str
    ready_s: float  # gateway start -> "hosting service" logged

    def client(self, timeout: float = 30.0) -> httpx.Client:
        return self.tunnel.client(timeout)


def enroll(controller: Controller, name: str, role: str) -> None:
    r = controller.cli("admin", "identity", "create", name, "--role", role, "-o", f"{name}.jwt")
    assert r.returncode == 0, f"creating identity {name}\n{r.describe()}"
    r = controller.cli("enroll", f"{name}.jwt")
    assert r.returncode == 0, f"enrolling {name}\n{r.describe()}"
    assert (controller.root / "identities" / f"{name}.json").is_file(), f"enroll did not write identities/{name}.json"


@pytest.fixture(scope="module")
def overlay(controller: Controller) -> Iterator[Overlay]:
    log_dir = controller.log_dir  # the harness directory, outside the controller's working directory
    backend = Backend(log_dir)
    backend.start()
    gateway: Optional[ManagedProcess] = None
    tunnel: Optional[Tunnel] = None
    try:
        enroll(controller, "gw1", "gateway")
        enroll(controller, "ipad", "device")
        gateway = ManagedProcess(
            "gateway-overlay",
            [str(controller.binary), "serve", "--mode", "ziti", "--identity", "identities/gw1.json",
             "--service", SERVICE, "--backend", backend.url, "--log-level", "info"],
            log_dir,
            cwd=controller.root,
            env=cli_env(),
        )
        gateway.start()
        ready_s = gateway.wait_for_log("hosting service", timeout=STARTUP_TIMEOUT_S)
        # Logged from the task that dialled, which nothing orders with the binding's answer on the event loop.
        gateway.wait_for_log("connected to controller", timeout=STARTUP_TIMEOUT_S)
        log = gateway.full_log()
        print(f"\ngateway ready ('hosting service') {ready_s:.2f} s after start")
        # deploy/apple-path.sh runs this module with ILS_AEAD=swift-crypto-api: the gateway must have taken that path.
        aead = os.environ.get("ILS_AEAD") or "boringssl-in-place"
        assert f"aead={aead}" in log, f"gateway's 'hosting service' line does not say aead={aead}:\n{log}"

        tunnel = Tunnel(controller, "ipad", log_dir)
        tunnel.start()
        ipad_id = json.loads((controller.root / "identities" / "ipad.json").read_text())["identity"]["id"]
        o = Overlay(controller, backend, gateway, tunnel, log_dir, ipad_id, ready_s)
        yield o
        backend = o.backend  # a test may have replaced it (restart on the same port)
    finally:
        for p in (tunnel, gateway, backend):
            if p is not None:
                p.stop()


# ------------------------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------------------------


# The shared assertion (sse_helpers), with this module's event count and failure message.
assert_streamed_event_by_event = functools.partial(
    sse_helpers.assert_streamed_event_by_event,
    n_events=N_EVENTS,
    blame="something in the overlay buffered the stream instead of forwarding each event",
    print_margin=True,
)


# Sockets, from the kernel's point of view (/proc), independent of ss.

_TCP_LISTEN = "0A"
_TCP_ESTABLISHED = "01"
_UDP_UNCONNECTED = "07"  # what `ss -lu` lists as UNCONN: a bound UDP socket that receives from anyone


def socket_inodes(pid: int) -> set[int]:
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(fd_dir / fd)
        except OSError:
            continue  # closed meanwhile
        m = re.fullmatch(r"socket:\[(\d+)\]", target)
        if m:
            inodes.add(int(m.group(1)))
    return inodes


@dataclass
class ProcSocket:
    proto: str
    local_port: int
    remote_port: int
    state: str
    inode: int

    @property
    def listening(self) -> bool:
        if self.proto.startswith("tcp"):
            return self.state == _TCP_LISTEN
        return self.state == _UDP_UNCONNECTED


def proc_sockets(pid: int) -> list[ProcSocket]:
    """The TCP and UDP sockets (IPv4 and IPv6) the process holds, from /proc/net/* and /proc/PID/fd."""
    owned = socket_inodes(pid)
    found = []
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        path = Path(f"/proc/{pid}/net/{proto}")  # the process's own network namespace
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            inode = int(fields[9])
            if inode in owned:
                found.append(ProcSocket(proto, int(fields[1].rsplit(":", 1)[1], 16),
                                        int(fields[2].rsplit(":", 1)[1], 16), fields[3], inode))
    return found


def ss_listeners() -> list[tuple[str, str, set[int]]]:
    """(netid, local address, owning pids) for every listening TCP and bound UDP socket, from `ss -H -ltunp`."""
    r = subprocess.run(["ss", "-H", "-l", "-t", "-u", "-n", "-p"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, f"ss failed: {r.stderr}"
    out = []
    for line in r.stdout.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        out.append((fields[0], fields[4], {int(p) for p in re.findall(r"pid=(\d+)", line)}))
    return out


# ------------------------------------------------------------------------------------------------------------------
# 1. The gateway is dark
# ------------------------------------------------------------------------------------------------------------------


def test_gateway_has_no_listening_socket(overlay: Overlay) -> None:
    gw_pid = overlay.gateway.pid
    tunnel_pid = overlay.tunnel.pid
    with overlay.client() as c:  # traffic first: a gateway that opened something per circuit would show it now
        assert c.get("/health").status_code == 200

    mine = proc_sockets(gw_pid)
    print(f"gateway pid {gw_pid} sockets: {[(s.proto, s.local_port, s.remote_port, s.state) for s in mine]}")
    listening = [s for s in mine if s.listening]
    assert not listening, f"the gateway owns listening sockets (per /proc): {listening}"
    # Positive controls: the method sees the gateway's outbound connection to the controller, and the tunnel's
    # listening socket.
    assert any(s.proto.startswith("tcp") and s.state == _TCP_ESTABLISHED and s.remote_port == overlay.controller.port
               for s in mine), f"no established connection from the gateway to the controller port: {mine}"
    assert any(s.listening and s.local_port == overlay.tunnel.port for s in proc_sockets(tunnel_pid)), (
        "the /proc check does not see the tunnel's own listening socket; it cannot be trusted"
    )

    if shutil.which("ss") is None:
        print("ss not installed: checked /proc only")
        return
    listeners = ss_listeners()
    owned = [(netid, addr) for netid, addr, pids in listeners if gw_pid in pids]
    assert not owned, f"`ss -ltunp` shows listening sockets owned by the gateway (pid {gw_pid}): {owned}"
    assert any(tunnel_pid in pids and addr.endswith(f":{overlay.tunnel.port}") for _, addr, pids in listeners), (
        f"`ss -ltunp` does not show the tunnel's listener on {overlay.tunnel.port}; the ss check cannot be trusted"
    )


# ------------------------------------------------------------------------------------------------------------------
# 2. Streaming
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_sse_event_by_event(overlay: Overlay, method: str) -> None:
    with overlay.client() as c:
        if method == "GET":
            request = c.stream("GET", "/claude/stream",
                               params={"prompt": "overlay", "n": N_EVENTS, "interval_ms": INTERVAL_MS})
        else:
            request = c.stream("POST", "/claude/stream",
                               json={"prompt": "overlay", "n": N_EVENTS, "interval_ms": INTERVAL_MS})
        with request as r:
            assert r.status_code == 200, r.read()
            assert r.headers["content-type"].startswith("text/event-stream")
            events = parse_sse(timed_lines(r))
    assert_streamed_event_by_event(events)


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_sse_event_by_event_curl(overlay: Overlay, method: str) -> None:
    base = overlay.tunnel.base_url
    if method == "GET":
        target = [f"{base}/claude/stream?prompt=curl&n={N_EVENTS}&interval_ms={INTERVAL_MS}"]
    else:
        body = json.dumps({"prompt": "curl", "n": N_EVENTS, "interval_ms": INTERVAL_MS})
        target = ["-H", "Content-Type: application/json", "--data", body, f"{base}/claude/stream"]
    lines = curl_timed_lines(
        ["curl", "--silent", "--show-error", "--noproxy", "*", "--max-time", "30", "-N"] + target, timeout=30.0
    )
    assert_streamed_event_by_event(parse_sse(lines))


# ------------------------------------------------------------------------------------------------------------------
# 3. Identity headers
# ------------------------------------------------------------------------------------------------------------------


def test_identity_headers(overlay: Overlay) -> None:
    sent = [("X-ILS-Identity", "mallory"), ("X-ILS-Identity-Id", "mallory-id"), ("X-Custom", "kept")]
    with overlay.client() as c:
        r = c.get("/debug/headers", headers=sent)
    assert r.status_code == 200, r.text
    h = r.json()["headers"]
    print(json.dumps(h, indent=1))
    assert h.get("x-custom") == ["kept"], f"an ordinary header was not forwarded: {h}"
    assert h.get("x-ils-identity") == ["ipad"], f"x-ils-identity: {h.get('x-ils-identity')}"
    assert "mallory" not in json.dumps(h), f"a client-supplied identity header reached the backend: {h}"
    ids = h.get("x-ils-identity-id")
    assert ids is not None and len(ids) == 1 and ids[0], f"x-ils-identity-id missing or repeated: {ids}"
    assert ids == [overlay.ipad_id], f"x-ils-identity-id {ids} is not ipad's id {overlay.ipad_id}"


# ------------------------------------------------------------------------------------------------------------------
# 4. WebSocket
# ------------------------------------------------------------------------------------------------------------------


def test_websocket_echo(overlay: Overlay) -> None:
    with ws_connect(
        f"ws://127.0.0.1:{overlay.tunnel.port}/ws/echo",
        proxy=None,
        open_timeout=10,
        close_timeout=5,
        max_size=4 * 1024 * 1024,
    ) as ws:
        for text in ["hello", "ünïcödé ✓", "x" * 100_000]:
            ws.send(text)
            assert ws.recv(timeout=10) == text
        for blob in [b"\x00\x01\x02\xff", os.urandom(1024 * 1024)]:
            ws.send(blob)
            echoed = ws.recv(timeout=10)
            assert isinstance(echoed, bytes) and echoed == blob


# ------------------------------------------------------------------------------------------------------------------
# 5. Large bodies
# ------------------------------------------------------------------------------------------------------------------


def test_large_download_intact(overlay: Overlay) -> None:
    params = {"size": DOWNLOAD_SIZE, "seed": 11}
    with overlay.backend.client() as direct:
        expected = direct.get("/bytes/sha256", params=params).json()["sha256"]
    h = hashlib.sha256()
    n = 0
    started = time.monotonic()
    with overlay.client(timeout=60) as c:
        with c.stream("GET", "/bytes", params=params) as r:
            assert r.status_code == 200
            for chunk in r.iter_raw(1024 * 1024):
                h.update(chunk)
                n += len(chunk)
    elapsed = time.monotonic() - started
    print(f"64 MiB download through the overlay: {elapsed:.2f} s ({n / 1048576 / elapsed:.1f} MiB/s)")
    assert n == DOWNLOAD_SIZE
    assert h.hexdigest() == expected


def test_large_upload_intact(overlay: Overlay) -> None:
    data = os.urandom(UPLOAD_SIZE)
    started = time.monotonic()
    with overlay.client(timeout=60) as c:
        r = c.post("/upload", content=data, headers={"Content-Type": "application/octet-stream"})
    elapsed = time.monotonic() - started
    print(f"24 MiB upload through the overlay: {elapsed:.2f} s ({UPLOAD_SIZE / 1048576 / elapsed:.1f} MiB/s)")
    assert r.status_code == 200, r.text
    assert r.json() == {"bytes": UPLOAD_SIZE, "sha256": hashlib.sha256(data).hexdigest()}


# ------------------------------------------------------------------------------------------------------------------
# 6. A gateway identity may not dial
# ------------------------------------------------------------------------------------------------------------------


def wait_for_backend_log(backend: Backend, text: str, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in backend.full_log():
            return True
        time.sleep(0.05)
    return False


def test_gateway_identity_may_not_dial(overlay: Overlay) -> None:
    # Positive control for the "did it reach the backend" check: a marked request through the good tunnel shows up
    # in the backend's access log.
    good_probe = f"probe-{uuid.uuid4().hex}"
    with overlay.client() as c:
        assert c.get("/debug/headers", params={"probe": good_probe}).status_code == 200
    assert wait_for_backend_log(overlay.backend, good_probe), "the backend access log does not show requests"

    rogue = Tunnel(overlay.controller, "gw1", overlay.log_dir)
    rogue.start(probe=False)
    assert "may not dial" not in rogue.full_log(), f"refusal logged before any connection:\n{rogue.full_log()}"
    try:
        probe = f"probe-{uuid.uuid4().hex}"
        started = time.monotonic()
        outcome = None
        with rogue.client(timeout=REFUSAL_BOUND_S) as c:
            try:
                r = c.get("/debug/headers", params={"probe": probe})
                outcome = f"HTTP {r.status_code}: {r.text[:300]!r}"
            except httpx.TimeoutException as e:
                outcome = f"timeout: {e!r}"
                pytest.fail(f"the refused request hung for {REFUSAL_BOUND_S} s instead of being closed ({e!r})")
            except httpx.HTTPError as e:
                outcome = f"closed: {e!r}"
        elapsed = time.monotonic() - started
        print(f"request through a gateway-identity tunnel: {outcome} after {elapsed * 1000:.0f} ms")
        # The tunnel answers in the gateway's JSON error format with the refusal's code (issue 23, item 10).
        assert outcome.startswith("HTTP 403") and '"code":"dial_denied"' in outcome, \
            f"expected 403 dial_denied from the tunnel, got {outcome}"
        assert elapsed < REFUSAL_BOUND_S

        # Exactly one line about it in the tunnel's log (it may be written just after the close). A second refused
        # request, answered, bounds the wait for a duplicate: then there are two lines, one for each.
        with rogue.client(timeout=REFUSAL_BOUND_S) as c:
            assert c.get("/debug/headers", params={"probe": probe}).status_code == 403
        deadline = time.monotonic() + 5
        lines: list[str] = []
        while time.monotonic() < deadline:
            lines = [l for l in rogue.full_log().splitlines() if "may not dial" in l]
            if len(lines) >= 2:
                break
            time.sleep(0.05)
        print("tunnel said:", lines)
        assert len(lines) == 2, f"expected one 'may not dial' line per refused request in the tunnel's log, got " \
                                f"{len(lines)} for 2:\n{rogue.full_log()}"
        assert rogue.alive(), "the tunnel exited after one refused circuit"
    finally:
        rogue.stop()
    # The refusal changed nothing for the device; its request, once in the backend's access log, bounds the wait for
    # a line of the refused one's.
    after = f"probe-{uuid.uuid4().hex}"
    with overlay.client() as c:
        assert c.get("/debug/headers", params={"probe": after}).status_code == 200
    assert wait_for_backend_log(overlay.backend, after), "the backend access log does not show requests"
    assert probe not in overlay.backend.full_log(), (
        "the refused request reached the backend (its probe is in the backend's access log)"
    )


# ------------------------------------------------------------------------------------------------------------------
# 7. Client hang-up reaches the backend
# ------------------------------------------------------------------------------------------------------------------


def test_client_hangup_reaches_backend(overlay: Overlay) -> None:
    backend = overlay.backend
    wait_for_idle_streams(backend)
    with backend.client() as direct:
        direct.post("/debug/reset").raise_for_status()
        client = overlay.client()
        try:
            with client.stream("GET", "/claude/stream", params={"n": 100, "interval_ms": 100}) as r:
                assert r.status_code == 200
                lines = timed_lines(r)  # keep a reference: a collected iterator would close the response early
                events = parse_sse(lines, stop_after=2)
                assert [e.json["index"] for e in events] == [0, 1]
                before = direct.get("/debug/streams").json()
                assert before["active"] == 1 and before["disconnected"] == 0, before
        finally:
            client.close()
        hung_up = time.monotonic()

        stats = None
        while time.monotonic() - hung_up < HANGUP_BOUND_S:
            stats = direct.get("/debug/streams").json()
            if stats["disconnected"] >= 1:
                break
            time.sleep(0.02)
        elapsed = time.monotonic() - hung_up
        print(f"hang-up reached the backend after {elapsed * 1000:.0f} ms: {stats}")
        assert stats is not None and stats["disconnected"] == 1, (
            f"backend did not see the client's hang-up within {HANGUP_BOUND_S} s (after {elapsed:.2f} s: {stats})"
        )
        assert stats["completed"] == 0, stats


# ------------------------------------------------------------------------------------------------------------------
# 8. Controller restart
# ------------------------------------------------------------------------------------------------------------------


def test_controller_restart_recovers(overlay: Overlay) -> None:
    gw_pid, tunnel_pid = overlay.gateway.pid, overlay.tunnel.pid
    with overlay.client() as c:
        assert c.get("/health").status_code == 200

    killed = time.monotonic()
    overlay.controller.restart()  # SIGTERM, wait for the port to close, `controller run` on the same state and port
    back_up = time.monotonic()

    attempts = 0
    last = None
    recovered_at = None
    while time.monotonic() - back_up < RECOVERY_BOUND_S:
        attempts += 1
        try:
            # A new client each time: a connection to the tunnel is one circuit, and the old ones died.
            with overlay.client(timeout=3) as c:
                r = c.get("/debug/headers")
            last = f"HTTP {r.status_code}: {r.text[:200]!r}"
            if r.status_code == 200 and r.json()["headers"].get("x-ils-identity") == ["ipad"]:
                recovered_at = time.monotonic()
                break
        except httpx.HTTPError as e:
            last = repr(e)
        time.sleep(0.2)
    assert overlay.gateway.alive() and overlay.gateway.pid == gw_pid, "the gateway process exited"
    assert overlay.tunnel.alive() and overlay.tunnel.pid == tunnel_pid, "the tunnel process exited"
    if recovered_at is None:
        pytest.fail(f"no successful request through the same tunnel within {RECOVERY_BOUND_S} s of the controller "
                    f"restart ({attempts} attempts; last: {last})")
    print(f"controller down for {back_up - killed:.2f} s; requests worked again {recovered_at - back_up:.2f} s "
          f"after it was back up ({recovered_at - killed:.2f} s after SIGTERM, {attempts} attempts)")

    # And streaming works again too.
    with overlay.client() as c:
        with c.stream("GET", "/claude/stream", params={"n": 3, "interval_ms": 50}) as r:
            assert r.status_code == 200
            events = parse_sse(timed_lines(r))
    assert [e.json["index"] for e in events if e.event == "message"] == [0, 1, 2]


# ------------------------------------------------------------------------------------------------------------------
# 9. Backend down, then back
# ------------------------------------------------------------------------------------------------------------------


def test_backend_down_then_back(overlay: Overlay) -> None:
    port = overlay.backend.port
    with overlay.client(timeout=15) as c:
        assert c.get("/health").status_code == 200
    overlay.backend.stop()

    for _ in range(2):  # a second try must not hang on, or reuse, a dead backend connection either
        with overlay.client(timeout=15) as c:
            body = assert_gateway_error(c.get("/health"), 502, strict=False)
        print("backend down:", body)

    revived = Backend(overlay.log_dir, port=port)
    revived.start()
    overlay.backend = revived  # module teardown stops this one
    assert overlay.gateway.alive(), "the gateway exited while its backend was down"

    started = time.monotonic()
    attempts = 0
    last = None
    while time.monotonic() - started < 5:
        attempts += 1
        with overlay.client(timeout=5) as c:
            try:
                r = c.get("/health")
                last = f"HTTP {r.status_code}: {r.text[:200]!r}"
                if r.status_code == 200:
                    break
            except httpx.HTTPError as e:
                last = repr(e)
        time.sleep(0.1)
    print(f"backend back: first success after {attempts} attempt(s), {time.monotonic() - started:.2f} s")
    assert last is not None and last.startswith("HTTP 200"), f"no recovery after the backend came back: {last}"
    with overlay.client(timeout=15) as c:
        r = c.post("/claude/query", json={"prompt": "back?"})
        assert r.status_code == 200 and r.json()["answer"].endswith("back?"), r.text
