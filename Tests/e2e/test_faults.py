"""Fault tests against the real binaries: processes killed with SIGKILL mid-traffic and restarted, a network path
cut and restored, a disk that fills up while enrolling.

One overlay per module (controller, gateway gw-f, device ipad-f with its tunnel, the sample backend), built with the
helpers of test_overlay.py. Each test ends with the overlay healthy again, so the order of the tests does not matter
for correctness; what each one breaks, it restores itself.

What "recovered" means here is always the same: a new request through the *same* tunnel process reaches the backend
with the device's identity. No test restarts the tunnel or the gateway to get there, except the one that kills the
gateway on purpose.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

import httpx
import pytest

from conftest import Backend, Controller, ManagedProcess, cli_env
from sse_helpers import assert_gateway_error, parse_sse, timed_lines, wait_for_idle_streams
from test_overlay import SERVICE, Tunnel, enroll

pytestmark = pytest.mark.e2e

RECOVERY_AFTER_RESTART_S = 5.0  # the promise: traffic flows again within 5 s of the controller's port
STREAM_END_BOUND_S = 15.0  # a stream whose path died must end (not hang) well within this
ERROR_BOUND_S = 15.0  # a request while something is down must be answered or closed within this


@dataclass
class Faulty:
    controller: Controller
    backend: Backend
    gateway: ManagedProcess
    tunnel: Tunnel
    log_dir: Path
    device: str = "ipad-f"

    def client(self, timeout: float = 10.0) -> httpx.Client:
        return self.tunnel.client(timeout)


def gateway_process(controller: Controller, backend: Backend, log_dir: Path, identity: str = "gw-f",
                    prefix: tuple[str, ...] = (), extra: tuple[str, ...] = ()) -> ManagedProcess:
    """The dark gateway (overlay mode) for an enrolled gateway identity; also used by deploy/soak. `prefix` runs it
    elsewhere (`ip netns exec NAME`); `extra` adds flags."""
    return ManagedProcess(
        "gateway-faults" if identity == "gw-f" else f"gateway-{identity}",
        [*prefix, str(controller.binary), "serve", "--mode", "ziti", "--identity", f"identities/{identity}.json",
         "--service", SERVICE, "--backend", backend.url, "--log-level", "info", *extra],
        log_dir,
        cwd=controller.root,
        env=cli_env(),
    )


@pytest.fixture(scope="module")
def faulty(controller: Controller) -> Iterator[Faulty]:
    log_dir = controller.log_dir
    backend = Backend(log_dir)
    backend.start()
    enroll(controller, "gw-f", "gateway")
    enroll(controller, "ipad-f", "device")
    gateway = gateway_process(controller, backend, log_dir)
    gateway.start()
    gateway.wait_for_log("hosting service")
    tunnel = Tunnel(controller, "ipad-f", log_dir)
    tunnel.start()
    f = Faulty(controller, backend, gateway, tunnel, log_dir)
    try:
        yield f
    finally:
        for p in (f.tunnel, f.gateway, f.backend):
            p.stop()


def through_tunnel_ok(f: Faulty, timeout: float = 3.0) -> tuple[bool, str]:
    """One request through the tunnel; True when it reached the backend as the tunnel's device."""
    try:
        with f.client(timeout) as c:
            r = c.get("/debug/headers")
        if r.status_code == 200 and r.json()["headers"].get("x-ils-identity") == [f.device]:
            return True, "HTTP 200"
        return False, f"HTTP {r.status_code}: {r.text[:200]!r}"
    except httpx.HTTPError as e:
        return False, repr(e)


def wait_until_flowing(f: Faulty, bound_s: float) -> float:
    """Polls the tunnel until a request goes through; returns the seconds it took, fails after bound_s."""
    started = time.monotonic()
    attempts, last = 0, ""
    while True:
        attempts += 1
        ok, last = through_tunnel_ok(f, timeout=min(3.0, bound_s))
        elapsed = time.monotonic() - started
        if ok:
            return elapsed
        if elapsed > bound_s:
            pytest.fail(f"no request through the tunnel within {bound_s} s ({attempts} attempts; last: {last})",
                        pytrace=False)
        time.sleep(0.1)


def open_stream(f: Faulty, n: int = 600, interval_ms: int = 50,
                deadline_s: float = STREAM_END_BOUND_S) -> tuple[httpx.Client, httpx.Response, Iterator]:
    """A long SSE stream through the tunnel, with its first two events read."""
    client = f.client(timeout=deadline_s)
    response = client.send(
        client.build_request("GET", "/claude/stream", params={"n": n, "interval_ms": interval_ms}), stream=True
    )
    assert response.status_code == 200
    lines = timed_lines(response, deadline_s=deadline_s)
    events = parse_sse(lines, stop_after=2)
    assert [e.json["index"] for e in events] == [0, 1]
    return client, response, lines


def read_resumed_stream(lines: Iterator, n: int, cut_at: float) -> float:
    """Reads the rest of a stream opened with `open_stream(n=n)` whose path was cut at `cut_at` (time.time()), and
    checks that it resumed: every event after the first two exactly once, in order, then `done`. Returns the pause:
    the longest gap between two events after the cut."""
    events = parse_sse(lines)
    messages = [e for e in events if e.event == "message"]
    assert [e.json["index"] for e in messages] == list(range(2, n)), [e.json["index"] for e in messages][:20]
    assert events[-1].event == "done" and events[-1].json == {"count": n}, events[-1]
    times = [cut_at] + [e.received_at for e in messages if e.received_at >= cut_at]
    return max((b - a for a, b in zip(times, times[1:])), default=0.0)


def backend_streams(backend: "Backend") -> dict:
    with backend.client() as direct:
        return direct.get("/debug/streams").json()


def drain_until_end(lines: Iterator) -> tuple[float, str]:
    """Reads the rest of a stream whose path was cut; returns (seconds until it ended, how it ended)."""
    started = time.monotonic()
    how = "clean end"
    try:
        for _ in lines:
            pass
    except httpx.HTTPError as e:
        how = repr(e)
    return time.monotonic() - started, how


def sigkill(p: ManagedProcess) -> None:
    assert p.proc is not None
    p.proc.send_signal(signal.SIGKILL)
    p.proc.wait(timeout=10)
    p.stop()  # closes the log and forgets the process; it is already dead


def integrity(store: Path) -> str:
    db = sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=10)
    try:
        return db.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        db.close()


def stored_names(store: Path) -> set[str]:
    db = sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=10)
    try:
        return {row[0] for row in db.execute("SELECT name FROM identities")}
    finally:
        db.close()


# ------------------------------------------------------------------------------------------------------------------
# The controller killed mid-traffic
# ------------------------------------------------------------------------------------------------------------------


def test_controller_sigkill_mid_traffic_recovers_by_itself(faulty: Faulty) -> None:
    f = faulty
    c = f.controller
    store = c.state_dir / "store.sqlite"
    gw_pid, tunnel_pid = f.gateway.pid, f.tunnel.pid
    wait_until_flowing(f, 10.0)

    # Writes in flight when the controller dies: an admin creating identities in a loop.
    created: list[str] = []
    stop_writing = threading.Event()

    def writer() -> None:
        i = 0
        while not stop_writing.is_set():
            name = f"kill-{i}"
            r = c.cli("admin", "identity", "create", name, "--role", "device", "-o", f"{name}.jwt", timeout=15)
            if r.returncode == 0:
                created.append(name)
            i += 1

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    before = backend_streams(f.backend)
    # A stream that outlives the outage: held at both ends while the controller is down (the grace window is 60 s),
    # resumed once it is back.
    n = 120
    client, response, lines = open_stream(f, n=n, deadline_s=RECOVERY_AFTER_RESTART_S + 30)
    try:
        deadline = time.monotonic() + 20
        while len(created) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(created) >= 2, "the admin writer never got going"
        sigkill(c.process)
        killed, cut_at = time.monotonic(), time.time()
        stop_writing.set()
        thread.join(timeout=20)

        # The store survived: the file is intact and every write the admin was told succeeded is in it.
        assert integrity(store) == "ok"
        missing = set(created) - stored_names(store)
        assert not missing, f"identities acknowledged before SIGKILL are gone from the store: {sorted(missing)}"

        # While it is down (at least 2 s, so the gateway's reconnect backoff grows): new requests fail, promptly.
        while time.monotonic() - killed < 2.0:
            ok, outcome = through_tunnel_ok(f, timeout=ERROR_BOUND_S)
            assert not ok, "a request went through with the controller down"
            assert "Timeout" not in outcome, f"a request hung with the controller down: {outcome}"
            # Sleep: paces the probes through a down time whose length (the backoff must grow) is the test.
            time.sleep(0.2)

        c.start()  # same state directory, same port; returns once the port accepts
        back = time.monotonic()
        print(f"controller down {back - killed:.2f} s")
        pause = read_resumed_stream(lines, n, cut_at)
    finally:
        response.close()
        client.close()
        stop_writing.set()
        thread.join(timeout=20)
    print(f"the stream through the killed controller resumed after it was back; longest pause {pause:.2f} s")
    after = backend_streams(f.backend)
    assert after["completed"] == before["completed"] + 1, (before, after)
    assert after["disconnected"] == before["disconnected"], (before, after)
    took = wait_until_flowing(f, RECOVERY_AFTER_RESTART_S)
    print(f"traffic through the same tunnel flowed again {took:.2f} s after the stream ended")
    assert f.gateway.alive() and f.gateway.pid == gw_pid, "the gateway process exited"
    assert f.tunnel.alive() and f.tunnel.pid == tunnel_pid, "the tunnel process exited"
    assert integrity(store) == "ok"
    assert set(created) <= {e["name"] for e in json.loads(c.cli("admin", "identity", "list", "--json").stdout)}


# ------------------------------------------------------------------------------------------------------------------
# The backend killed
# ------------------------------------------------------------------------------------------------------------------


def kill_mid_stream(f: Faulty, victim: ManagedProcess, what: str) -> float:
    """Opens an SSE stream through the overlay, SIGKILLs `victim` mid-stream, and returns how long the stream took
    to end after it."""
    client, response, lines = open_stream(f)
    try:
        sigkill(victim)
        took, how = drain_until_end(lines)
    finally:
        response.close()
        client.close()
    print(f"stream {what} ended {took:.2f} s after SIGKILL ({how})")
    return took


def test_backend_sigkill_gives_502_then_recovers(faulty: Faulty) -> None:
    f = faulty
    port = f.backend.port
    wait_until_flowing(f, 10.0)
    wait_for_idle_streams(f.backend)
    took = kill_mid_stream(f, f.backend, "from the killed backend")
    assert took < STREAM_END_BOUND_S

    for attempt in range(3):  # none may hang on, or reuse, a dead backend connection
        started = time.monotonic()
        with f.client(timeout=ERROR_BOUND_S) as c:
            body = assert_gateway_error(c.get("/health"), 502)
        elapsed = time.monotonic() - started
        print(f"backend down, attempt {attempt}: 502 {body['code']} after {elapsed * 1000:.0f} ms")
        assert body["code"] == "backend_unreachable"
        assert elapsed < ERROR_BOUND_S

    revived = Backend(f.log_dir, port=port)
    revived.start()
    f.backend = revived
    took = wait_until_flowing(f, 5.0)
    print(f"requests succeeded again {took:.2f} s after the backend was back")
    assert f.gateway.alive() and f.tunnel.alive()


# ------------------------------------------------------------------------------------------------------------------
# The gateway killed
# ------------------------------------------------------------------------------------------------------------------


def test_gateway_sigkill_then_restart_recovers(faulty: Faulty) -> None:
    f = faulty
    tunnel_pid = f.tunnel.pid
    wait_until_flowing(f, 10.0)
    wait_for_idle_streams(f.backend)
    # The gateway held the circuit and died with it: the tunnel keeps trying to resume it (the gateway may only have
    # lost its link) until a gateway answers that it holds no such circuit, or its grace window ends.
    client, response, lines = open_stream(f, deadline_s=60.0)
    try:
        sigkill(f.gateway)
        # The backend learns that its client went away (the gateway's sockets died with it).
        deadline = time.monotonic() + 10
        with f.backend.client() as direct:
            while direct.get("/debug/streams").json()["active"] != 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert direct.get("/debug/streams").json()["active"] == 0, "the backend still streams to a dead gateway"

        # No gateway: a new request is refused (closed or answered with an error) promptly, never left hanging.
        started = time.monotonic()
        ok, outcome = through_tunnel_ok(f, timeout=ERROR_BOUND_S)
        elapsed = time.monotonic() - started
        print(f"with no gateway: {outcome} after {elapsed * 1000:.0f} ms")
        assert not ok
        assert "Timeout" not in outcome, f"the request hung instead of being refused: {outcome}"

        f.gateway = gateway_process(f.controller, f.backend, f.log_dir)
        f.gateway.start()
        f.gateway.wait_for_log("hosting service")
        hosting = time.monotonic()
        took, how = drain_until_end(lines)
    finally:
        response.close()
        client.close()
    print(f"the held stream ended {time.monotonic() - hosting:.2f} s after the new gateway hosted ({how})")
    assert how != "clean end", "a stream whose gateway died ended as if complete"
    assert time.monotonic() - hosting < STREAM_END_BOUND_S
    f.tunnel.wait_for_log("circuit lost and not resumed")
    took = wait_until_flowing(f, 5.0)
    print(f"requests flowed again {took:.2f} s after the new gateway was hosting")
    assert f.tunnel.alive() and f.tunnel.pid == tunnel_pid, "the tunnel process exited"


# ------------------------------------------------------------------------------------------------------------------
# The network path between gateway and controller cut and restored (network namespace + veth pair)
# ------------------------------------------------------------------------------------------------------------------

CUT_ERROR_BOUND_S = 20.0  # relay gives a silent gateway 5 s, then the device's connection ends
CUT_RECOVERY_BOUND_S = 20.0  # TCP retransmission or the gateway's reconnect (backoff up to 3 s) after restore


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=20)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {r.stderr.strip()}")
    return r


@dataclass
class Netns:
    name: str
    host_if: str
    ns_if: str
    host_ip: str
    ns_ip: str

    def exec_args(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def cut(self) -> None:
        run("ip", "-n", self.name, "link", "set", self.ns_if, "down")

    def restore(self) -> None:
        run("ip", "-n", self.name, "link", "set", self.ns_if, "up")


@pytest.fixture
def netns() -> Iterator[Netns]:
    """A network namespace joined to this one by a veth pair on a private /30. Skipped where namespaces cannot be
    made (not root, no CAP_NET_ADMIN, no iproute2)."""
    tag = os.urandom(3).hex()
    octet = 16 + int(tag[:2], 16) % 200
    ns = Netns(f"ils-f-{tag}", f"ilsh{tag}", f"ilsn{tag}", f"10.231.{octet}.1", f"10.231.{octet}.2")
    try:
        made = subprocess.run(["ip", "netns", "add", ns.name], capture_output=True, text=True, timeout=20)
    except FileNotFoundError:
        pytest.skip("iproute2 (ip) is not installed: cannot cut a network path here")
    if made.returncode != 0:
        pytest.skip(f"cannot create a network namespace here ({made.stderr.strip()}): needs root / CAP_NET_ADMIN")
    try:
        run("ip", "link", "add", ns.host_if, "type", "veth", "peer", "name", ns.ns_if)
        run("ip", "link", "set", ns.ns_if, "netns", ns.name)
        run("ip", "addr", "add", f"{ns.host_ip}/30", "dev", ns.host_if)
        run("ip", "link", "set", ns.host_if, "up")
        run("ip", "-n", ns.name, "addr", "add", f"{ns.ns_ip}/30", "dev", ns.ns_if)
        run("ip", "-n", ns.name, "link", "set", ns.ns_if, "up")
        run("ip", "-n", ns.name, "link", "set", "lo", "up")
        yield ns
    finally:
        run("ip", "link", "del", ns.host_if, check=False)
        run("ip", "netns", "del", ns.name, check=False)


def private_binary(ils_bin: Path, logs: Path) -> Path:
    """A copy of the binary beside a test's logs, so the processes a test starts are its own to find and kill."""
    binary = logs / "ils-gateway"
    binary.write_bytes(ils_bin.read_bytes())
    binary.chmod(0o755)
    return binary


@dataclass
class NetnsOverlay:
    """A controller in this namespace, a gateway and its backend in `netns`, a tunnel in this namespace."""
    netns: Netns
    controller: ManagedProcess
    gateway: ManagedProcess
    tunnel: Tunnel
    faulty: Faulty
    controller_port: int


@contextlib.contextmanager
def netns_overlay(netns: Netns, ils_bin: Path, tmp_path: Path, keepalive: list[str]) -> Iterator[NetnsOverlay]:
    """The whole overlay across the veth pair; `keepalive` flags go to the controller and the gateway."""
    root, logs = tmp_path / "root", tmp_path / "logs"
    root.mkdir()
    logs.mkdir()
    binary = private_binary(ils_bin, logs)
    c = Controller(binary, root, logs)
    c.address = f"https://{netns.host_ip}:{c.port}"
    r = c.init()
    assert r.returncode == 0, r.describe()
    controller = ManagedProcess(
        "controller-netns",
        [str(binary), "controller", "run", "--state-dir", str(c.state_dir), "--listen", f"{netns.host_ip}:{c.port}",
         "--log-level", "info", *keepalive],
        logs, cwd=root, env=cli_env(),
    )
    backend_port = 18000 + int(netns.name[-4:], 16) % 20000
    backend = ManagedProcess(
        "backend-netns",
        netns.exec_args() + [sys.executable, str(Path(__file__).resolve().parents[2] / "deploy" / "backend" / "app.py"),
                             "--host", "127.0.0.1", "--port", str(backend_port), "--log-level", "info"],
        logs,
    )
    gateway = ManagedProcess(
        "gateway-netns",
        netns.exec_args() + [str(binary), "serve", "--mode", "ziti", "--identity", "identities/gw-ns.json",
                             "--service", SERVICE, "--backend", f"http://127.0.0.1:{backend_port}",
                             "--log-level", "info", *keepalive],
        logs, cwd=root, env=cli_env(),
    )
    tunnel: Optional[Tunnel] = None
    try:
        controller.start()
        controller.wait_for_log("controller listening")
        c.process = controller
        enroll(c, "gw-ns", "gateway")
        enroll(c, "ipad-ns", "device")
        backend.start()
        backend.wait_for_log("Uvicorn running")
        gateway.start()
        gateway.wait_for_log("hosting service")
        tunnel = Tunnel(c, "ipad-ns", logs)
        tunnel.start()
        f = Faulty(c, None, gateway, tunnel, logs, device="ipad-ns")  # type: ignore[arg-type]
        wait_until_flowing(f, 10.0)
        yield NetnsOverlay(netns, controller, gateway, tunnel, f, c.port)
    finally:
        for p in (tunnel, gateway, backend, controller):
            if p is not None:
                p.stop()


def test_network_cut_between_gateway_and_controller(netns: Netns, ils_bin: Path, tmp_path: Path) -> None:
    """The gateway and its backend live in their own network namespace and reach the controller over a veth pair;
    the device's tunnel stays in this one. With the gateway's link down, a request fails within a bound (no hang);
    once it is back up, the same tunnel and the same gateway carry requests again, with no restart."""
    with netns_overlay(netns, ils_bin, tmp_path, []) as o:
        f = o.faulty
        netns.cut()
        started = time.monotonic()
        ok, outcome = through_tunnel_ok(f, timeout=CUT_ERROR_BOUND_S)
        elapsed = time.monotonic() - started
        print(f"path cut: {outcome} after {elapsed:.2f} s")
        assert not ok, "a request went through while the gateway's link was down"
        assert "Timeout" not in outcome, f"the request hung for {CUT_ERROR_BOUND_S} s instead of failing: {outcome}"

        netns.restore()
        took = wait_until_flowing(f, CUT_RECOVERY_BOUND_S)
        print(f"path restored: requests flowed again {took:.2f} s later")
        assert o.gateway.alive() and o.tunnel.alive() and o.controller.alive()


KEEPALIVE_S, KEEPALIVE_TIMEOUT_S = 2, 2


def link_ports(o: NetnsOverlay) -> list[int]:
    """Local ports of the gateway's established connections to the controller, seen inside its namespace."""
    r = run(*o.netns.exec_args(), "ss", "-Htn", "state", "established", "dst", f"{o.netns.host_ip}:{o.controller_port}")
    return sorted(int(line.split()[-2].rsplit(":", 1)[1]) for line in r.stdout.splitlines() if line.strip())


def drop_silently(o: NetnsOverlay, ports: list[int]) -> None:
    """What a NAT does when it forgets a mapping: the packets of these connections vanish, both ways, with no RST
    and no ICMP; the link stays up and new connections (new source ports, a new mapping) go through."""
    for port in ports:
        for chain, flag in (("OUTPUT", "--sport"), ("INPUT", "--dport")):
            run(*o.netns.exec_args(), "iptables", "-A", chain, "-p", "tcp", flag, str(port), "-j", "DROP")


def test_silently_dropped_gateway_link_is_noticed_and_redialled(netns: Netns, ils_bin: Path, tmp_path: Path) -> None:
    """Issue 23, item 1. The gateway's links to the controller have their packets dropped without a word (iptables
    DROP on their ports in the gateway's namespace: a NAT that forgot its mapping), not taken down. Both ends notice
    by their keepalive: the gateway redials and serves again within the keepalive interval plus its timeout (plus
    the reconnect), and the controller closes the dead links, after which no circuit is routed to them. Without
    keepalives the gateway never noticed (80 s and counting) and every circuit routed to it hung for 5 s."""
    if subprocess.run(["which", "iptables"], capture_output=True).returncode != 0:
        pytest.skip("iptables is not installed (deploy/install-deps.sh installs it)")
    keepalive = ["--keepalive", f"{KEEPALIVE_S}s", "--keepalive-timeout", f"{KEEPALIVE_TIMEOUT_S}s"]
    with netns_overlay(netns, ils_bin, tmp_path, keepalive) as o:
        f = o.faulty
        ports = link_ports(o)
        assert ports, "the gateway has no established link to the controller"
        # Idle long enough for a keepalive round trip to have happened: PINGs alone must not disturb a live link.
        # Sleep: the keepalive interval and its timeout must elapse on an idle link; that idle time is the test.
        time.sleep(KEEPALIVE_S + KEEPALIVE_TIMEOUT_S + 1)
        assert "went silent" not in o.gateway.full_log(), "a healthy link was declared dead"
        assert link_ports(o) == ports, "a healthy link was closed"
        gateway_hosting_before = o.gateway.full_log().count("hosting service")

        drop_silently(o, ports)
        started = time.monotonic()
        bound = KEEPALIVE_S + KEEPALIVE_TIMEOUT_S + 8.0  # interval + timeout, then a redial (backoff <= 0.8 s)
        noticed = redialled = None
        while time.monotonic() - started < bound and (noticed is None or redialled is None):
            log = o.gateway.full_log()
            if noticed is None and "went silent" in log:
                noticed = time.monotonic() - started
            if redialled is None and log.count("hosting service") > gateway_hosting_before:
                redialled = time.monotonic() - started
            time.sleep(0.05)
        print(f"gateway noticed the dead link after {noticed} s and was hosting again after {redialled} s "
              f"(keepalive {KEEPALIVE_S}s + timeout {KEEPALIVE_TIMEOUT_S}s)")
        assert noticed is not None, f"the gateway did not notice its dead link within {bound} s"
        assert redialled is not None, f"the gateway did not host again within {bound} s"
        took = wait_until_flowing(f, bound)
        print(f"requests flowed {took:.2f} s after that")

        # The controller's own keepalive closes its ends of the dead links.
        deadline = time.monotonic() + bound
        while o.controller.full_log().count("went silent") < len(ports) and time.monotonic() < deadline:
            time.sleep(0.05)
        closed = o.controller.full_log().count("went silent")
        print(f"the controller closed {closed} dead link(s) of {len(ports)} after {time.monotonic() - started:.2f} s")
        assert closed >= len(ports), f"the controller kept {len(ports) - closed} dead link(s) open"

        mark = len(o.controller.full_log())
        for i in range(20):
            ok, outcome = through_tunnel_ok(f, timeout=10.0)
            assert ok, f"request {i} after recovery failed: {outcome}"
        routed_to_dead = o.controller.full_log()[mark:].count("gateway did not take a circuit")
        assert routed_to_dead == 0, f"{routed_to_dead} circuit(s) were routed to a dead link after it was closed"
        assert o.gateway.alive() and o.tunnel.alive() and o.controller.alive()


def test_device_reconnects_on_its_next_circuit_after_a_silent_drop(netns: Netns, ils_bin: Path,
                                                                     tmp_path: Path) -> None:
    """Issue 23, item 1, the device's side (a Wi-Fi to cellular switch: the old connection's packets go nowhere).
    The tunnel runs in the namespace, the controller and the gateway outside; the tunnel's connection to the
    controller is dropped silently. Its keepalive interval is set long (60 s) so that what is tested is the next
    circuit: the dial probes the quiet connection, finds it dead within the keepalive timeout, and dials again on a
    new connection, so the request after the drop is answered, not lost. Without it the request hung (the circuit
    request went into a dead connection that nothing watched)."""
    if subprocess.run(["which", "iptables"], capture_output=True).returncode != 0:
        pytest.skip("iptables is not installed (deploy/install-deps.sh installs it)")
    root, logs = tmp_path / "root", tmp_path / "logs"
    root.mkdir()
    logs.mkdir()
    binary = private_binary(ils_bin, logs)
    c = Controller(binary, root, logs)
    c.address = f"https://{netns.host_ip}:{c.port}"
    assert c.init().returncode == 0
    controller = ManagedProcess(
        "controller-netns",
        [str(binary), "controller", "run", "--state-dir", str(c.state_dir), "--listen", f"{netns.host_ip}:{c.port}",
         "--log-level", "info"],
        logs, cwd=root, env=cli_env(),
    )
    backend = Backend(logs)
    tunnel_port = 18000 + int(netns.name[-4:], 16) % 20000
    tunnel = ManagedProcess(
        "tunnel-netns",
        netns.exec_args() + [str(binary), "tunnel", "--identity", "identities/ipad-drop.json", "--service", SERVICE,
                             "--listen", f"127.0.0.1:{tunnel_port}", "--log-level", "info",
                             "--keepalive", "60s", "--keepalive-timeout", "2s"],
        logs, cwd=root, env=cli_env(),
    )
    gateway: Optional[ManagedProcess] = None

    def request() -> tuple[bool, str, float]:
        started = time.monotonic()
        r = subprocess.run(netns.exec_args() + ["curl", "-sS", "--max-time", "20", "-o", "-", "-w", "\n%{http_code}",
                                                 f"http://127.0.0.1:{tunnel_port}/debug/headers"],
                           capture_output=True, text=True, timeout=30)
        took = time.monotonic() - started
        status = r.stdout.rsplit("\n", 1)[-1] if r.stdout else ""
        return status == "200" and "ipad-drop" in r.stdout, f"{status} {r.stderr.strip()}", took

    try:
        controller.start()
        controller.wait_for_log("controller listening")
        c.process = controller
        enroll(c, "gw-drop", "gateway")
        enroll(c, "ipad-drop", "device")
        backend.start()
        gateway = gateway_process(c, backend, logs, identity="gw-drop")
        gateway.start()
        gateway.wait_for_log("hosting service")
        tunnel.start()
        tunnel.wait_for_log("tunnel listening")
        ok, outcome, _ = request()
        assert ok, f"the first request failed: {outcome}"
        r = run(*netns.exec_args(), "ss", "-Htn", "state", "established", "dst", f"{netns.host_ip}:{c.port}")
        ports = sorted(int(line.split()[-2].rsplit(":", 1)[1]) for line in r.stdout.splitlines() if line.strip())
        assert len(ports) == 1, f"the tunnel should hold one controller connection: {r.stdout}"
        for chain, flag in (("OUTPUT", "--sport"), ("INPUT", "--dport")):
            run(*netns.exec_args(), "iptables", "-A", chain, "-p", "tcp", flag, str(ports[0]), "-j", "DROP")
        # Sleep: quiet for longer than the probe's freshness (1 s): the clock must pass it.
        time.sleep(1.5)

        ok, outcome, took = request()
        print(f"first request after the silent drop: {outcome} after {took:.2f} s")
        assert ok, f"the request after the silent drop was not answered: {outcome}"
        for _ in range(5):
            ok, outcome, _ = request()
            assert ok, outcome
        assert tunnel.alive() and gateway.alive() and controller.alive()
    finally:
        for p in (tunnel, gateway, backend, controller):
            if p is not None:
                p.stop()


# ------------------------------------------------------------------------------------------------------------------
# Disk full
# ------------------------------------------------------------------------------------------------------------------


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Callable[[str, int], Path]]:
    """Mounts small tmpfs file systems (skipped where mount is not permitted); unmounts them all at the end."""
    mounted: list[Path] = []

    def make(name: str, size_kib: int) -> Path:
        point = tmp_path / name
        point.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k,mode=0700", "tmpfs", str(point)],
                           capture_output=True, text=True, timeout=20)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a small file system here ({r.stderr.strip()}): needs root / CAP_SYS_ADMIN")
        mounted.append(point)
        return point

    yield make
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], capture_output=True, timeout=20)


def fill(directory: Path) -> Path:
    """Writes a filler file until the file system is full; returns it."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        block = b"\0" * 4096
        while True:
            try:
                os.write(fd, block)
            except OSError:
                break
        for size in (512, 64, 1):  # the last partial blocks too
            try:
                while os.write(fd, block[:size]):
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


def test_disk_full_on_the_device_while_enrolling(controller: Controller, tiny_fs) -> None:
    """The identity file's disk is full: enroll takes its room on disk before it spends the token, so it fails with one
    clear sentence, leaves no partial or temporary file, and the *same* token enrolls once there is room (with
    --pem, the PEM files' room is taken too)."""
    disk = tiny_fs("device-disk", 256)
    r = controller.cli("admin", "identity", "create", "full-dev", "--role", "device", "-o", "full-dev.jwt")
    assert r.returncode == 0, r.describe()
    fill(disk)
    for extra in ([], ["--pem"]):
        r = controller.cli("enroll", "full-dev.jwt", "--out", str(disk / "full-dev.json"), *extra)
        print(f"enroll {' '.join(extra)} onto a full disk: exit {r.returncode}, {r.stderr.strip()!r}")
        assert r.returncode == 73, f"expected a clean refusal (cannot write), got {r.describe()}"
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ils-gateway: "), r.describe()
        assert "token was not used" in lines[0], r.describe()
        assert sorted(p.name for p in disk.iterdir()) == ["filler"], f"left behind: {list(disk.iterdir())}"
    store = controller.state_dir / "store.sqlite"
    assert integrity(store) == "ok"
    db = sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=10)
    try:
        state, consumed = db.execute(
            "SELECT i.state, t.consumed_at FROM identities i JOIN enrollment_tokens t ON t.identity_id = i.id "
            "WHERE i.name = 'full-dev'").fetchone()
    finally:
        db.close()
    assert (state, consumed) == ("pending", None), "the token was spent although nothing could be written"
    (disk / "filler").unlink()
    r = controller.cli("enroll", "full-dev.jwt", "--out", str(disk / "full-dev.json"), "--pem")
    assert r.returncode == 0, r.describe()
    assert json.loads((disk / "full-dev.json").read_text())["identity"]["name"] == "full-dev"
    assert sorted(p.name for p in disk.iterdir()) == [
        "full-dev.ca.pem", "full-dev.cert.pem", "full-dev.json", "full-dev.key.pem"]


def test_revocation_takes_effect_while_the_store_disk_is_full(ils_bin: Path, tmp_path: Path, tiny_fs) -> None:
    """The controller's store is on a full disk and a device streams through a tunnel: `revoke` cannot be saved, yet
    the device's live SSE stream is cut, new requests are refused, and the command says exactly that. Once there is
    room, the revocation is saved (the controller retries; running the command again saves it at once)."""
    disk = tiny_fs("controller-disk-revoke", 2048)
    logs = tmp_path / "logs"
    logs.mkdir()
    binary = private_binary(ils_bin, logs)
    c = Controller(binary, tmp_path / "root", logs)
    c.root.mkdir()
    c.state_dir = disk / "state"
    assert c.init().returncode == 0
    c.start()
    backend = Backend(logs)
    gateway: Optional[ManagedProcess] = None
    tunnel: Optional[Tunnel] = None
    try:
        backend.start()
        enroll(c, "gw-full", "gateway")
        enroll(c, "ipad-full", "device")
        gateway = gateway_process(c, backend, logs, identity="gw-full")
        gateway.start()
        gateway.wait_for_log("hosting service")
        tunnel = Tunnel(c, "ipad-full", logs)
        tunnel.start()
        f = Faulty(c, backend, gateway, tunnel, logs, device="ipad-full")
        wait_until_flowing(f, 10.0)
        client, response, lines = open_stream(f)
        filler = fill(disk)
        try:
            r = c.cli("admin", "identity", "revoke", "ipad-full")
            print(f"revoke on a full disk: exit {r.returncode}, {r.stderr.strip()!r}")
            took, how = drain_until_end(lines)
            print(f"the revoked device's stream ended {took:.3f} s after the command returned ({how})")
        finally:
            response.close()
            client.close()
        assert took < 5.0, f"the stream went on for {took:.1f} s after the revocation"
        assert r.returncode == 69, r.describe()
        assert "connections were closed" in r.stderr and "could not save" in r.stderr, r.describe()
        ok, outcome = through_tunnel_ok(f)
        assert not ok and "403" in outcome, f"the revoked device still got through: {outcome}"
        assert stored_state(c.state_dir / "store.sqlite", "ipad-full") == "active"  # not saved: the disk is full
        assert c.process is not None and c.process.alive()

        filler.unlink()
        r = c.cli("admin", "identity", "revoke", "ipad-full")
        assert r.returncode == 0 and "ipad-full is now revoked" in r.stdout, r.describe()
        assert stored_state(c.state_dir / "store.sqlite", "ipad-full") == "revoked"
        assert integrity(c.state_dir / "store.sqlite") == "ok"
    finally:
        for p in (tunnel, gateway, backend):
            if p is not None:
                p.stop()
        c.stop()


def stored_state(store: Path, name: str) -> str:
    db = sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=10)
    try:
        return db.execute("SELECT state FROM identities WHERE name = ?", (name,)).fetchone()[0]
    finally:
        db.close()


def test_disk_full_under_the_controller_store(ils_bin: Path, tmp_path: Path, tiny_fs) -> None:
    """The controller's state directory is on a file system that fills up: identity creation and enrollment are
    refused with an error (not a crash), reads keep working, the store stays intact, and once there is room again
    writes succeed without a restart."""
    disk = tiny_fs("controller-disk", 2048)
    logs = tmp_path / "logs"
    logs.mkdir()
    binary = private_binary(ils_bin, logs)
    c = Controller(binary, tmp_path / "root", logs)
    c.root.mkdir()
    c.state_dir = disk / "state"
    r = c.init()
    assert r.returncode == 0, r.describe()
    c.start()
    try:
        r = c.cli("admin", "identity", "create", "before-full", "--role", "device", "-o", "before-full.jwt")
        assert r.returncode == 0, r.describe()
        filler = fill(disk)
        refusals = []
        for i in range(3):
            r = c.cli("admin", "identity", "create", f"while-full-{i}", "--role", "device",
                      "-o", f"while-full-{i}.jwt")
            refusals.append(f"create: exit {r.returncode}, {r.stderr.strip()!r}")
        r = c.cli("enroll", "before-full.jwt")
        refusals.append(f"enroll: exit {r.returncode}, {r.stderr.strip()!r}")
        print("\n".join(refusals))
        assert c.process is not None and c.process.alive(), f"the controller died on a full disk:\n{c.logs()}"
        r = c.cli("admin", "identity", "list", "--json")
        assert r.returncode == 0, f"reads stopped working on a full disk: {r.describe()}"
        names = {e["name"] for e in json.loads(r.stdout)}
        assert "before-full" in names
        assert integrity(c.state_dir / "store.sqlite") == "ok"

        filler.unlink()
        r = c.cli("admin", "identity", "create", "after-full", "--role", "device", "-o", "after-full.jwt")
        assert r.returncode == 0, f"writes did not recover once there was room: {r.describe()}"
        r = c.cli("enroll", "after-full.jwt")
        assert r.returncode == 0, r.describe()
        r = c.cli("enroll", "before-full.jwt")
        assert r.returncode == 0, f"the enrollment refused on a full disk spent its token: {r.describe()}"
    finally:
        c.stop()
    assert integrity(c.state_dir / "store.sqlite") == "ok"
    c.start()  # and it starts again on that store
    try:
        r = c.cli("admin", "identity", "list", "--json")
        assert r.returncode == 0 and "after-full" in r.stdout, r.describe()
    finally:
        c.stop()
