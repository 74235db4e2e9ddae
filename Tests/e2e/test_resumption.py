"""Issue 38: an answer survives the network. The device sits in a network namespace of its own with two interfaces,
"wifi" and "cell", each a veth pair to this namespace with its own address; the controller listens on the wifi
pair's host address, which the device reaches over wifi first. Mid-stream the wifi path is black-holed (iptables
DROP in the device's namespace: no reset, no FIN; the old connection's packets just go nowhere) and the route to the
controller moves to cell. The tunnel and ILSClient (`ils-client-example`, URLSession) notice the dead connection by
their keepalive (1 s + 1 s here), resume the circuit on a new connection over cell, and the answer goes on: every
event once, in order; the backend saw one request per stream and none was cancelled. The same with the device's
processes stopped for 20 s, and with the gateway's own link black-holed (the gateway in a namespace of its own).
And the two ways a circuit ends on purpose: the device stopped past the gateway's grace window (the backend request
cancelled, nothing held, the app told `not_resumed`), and a cancel from the app or the tunnel's client (the backend
stopped at once, never held).

Real binaries, real TLS, real sockets; the namespaces, veth pairs, routes and iptables rules are made by the test and
removed after it. Skipped where namespaces cannot be made (not root)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
from contextlib import contextmanager
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import pytest

from conftest import Backend, Controller, ManagedProcess, cli_env, free_port
from sse_helpers import parse_sse, process_timed_lines
from test_faults import backend_streams, gateway_process, private_binary, run
from test_overlay import SERVICE, enroll

N = 400  # events per stream, 50 ms apart: 20 s
INTERVAL_MS = 50
SWITCH_AFTER = 40  # events seen before the wifi path is black-holed
DEVICE_KEEPALIVE = ["--keepalive", "1s", "--keepalive-timeout", "1s"]
PAUSE_BOUND_S = 15.0  # keepalive (2 s) + a new connection and the resumption; generous for a loaded CI machine


@dataclass
class Topology:
    """Where each part runs: the address the controller listens on, and the command prefixes of the device's
    processes (tunnel, app, curl) and of the gateway (`ip netns exec NAME`, or nothing for this namespace)."""
    controller_host: str
    device_exec: list[str]
    gateway_exec: list[str]
    backend_host: str = "127.0.0.1"


def make_veth(ns: str, host_if: str, ns_if: str, host_ip: str, ns_ip: str) -> None:
    """A veth pair from this namespace (`host_if`, `host_ip`/30) into `ns` (`ns_if`, `ns_ip`/30), both up."""
    run("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
    run("ip", "link", "set", ns_if, "netns", ns)
    run("ip", "addr", "add", f"{host_ip}/30", "dev", host_if)
    run("ip", "link", "set", host_if, "up")
    run("ip", "-n", ns, "addr", "add", f"{ns_ip}/30", "dev", ns_if)
    run("ip", "-n", ns, "link", "set", ns_if, "up")


class NetnsUnavailable(Exception):
    """No network namespace can be made here (a test skips; deploy/bench says why)."""


def made_netns(prefix: str) -> tuple[str, str]:
    """A new namespace `prefix-<tag>`; returns (name, tag)."""
    if subprocess.run(["which", "iptables"], capture_output=True).returncode != 0:
        raise NetnsUnavailable("iptables is not installed (deploy/install-deps.sh installs it)")
    tag = os.urandom(3).hex()
    name = f"{prefix}-{tag}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, timeout=20)
    if made.returncode != 0:
        raise NetnsUnavailable(f"cannot create a network namespace here ({made.stderr.strip()}): needs root / "
                               "CAP_NET_ADMIN")
    run("ip", "-n", name, "link", "set", "lo", "up")
    return name, tag


@dataclass
class DeviceNetns:
    """The device's namespace, with a wifi and a cell veth pair to this namespace."""
    name: str
    wifi_host: str  # this namespace's end of wifi: the controller listens here
    wifi_device: str
    cell_host: str
    cell_device: str
    wifi_if: str
    cell_if: str
    dropping: list[list[str]] = field(default_factory=list)  # the iptables rules in force (without -A/-D)

    def exec_args(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def topology(self) -> Topology:
        return Topology(controller_host=self.wifi_host, device_exec=self.exec_args(), gateway_exec=[])

    def switch_to_cell(self) -> None:
        """Black-holes wifi (packets dropped both ways in the device's namespace: no reset) and routes the
        controller's address over cell."""
        self.switch(to_cell=True)

    def switch(self, to_cell: bool) -> None:
        """Black-holes the interface in use and its address, both ways, in the device's namespace (the previous
        switch's rules go) and routes the controller's address over the other one: no reset, the old connection's
        packets just vanish, and only the device's keepalive notices. Also used by deploy/bench (resume times)."""
        for rule in self.dropping:
            run(*rule[:-1], "iptables", "-D", *rule[-1], check=False)
        self.dropping = []
        # The address of the path left behind is dead whichever interface its packets would take now (a socket
        # keeps its source address across the route change), as when a phone loses that network.
        address = self.wifi_device if to_cell else self.cell_device
        dropped = self.wifi_if if to_cell else self.cell_if
        for rule in (["OUTPUT", "-o", dropped, "-j", "DROP"], ["INPUT", "-i", dropped, "-j", "DROP"],
                     ["OUTPUT", "-s", address, "-j", "DROP"], ["INPUT", "-d", address, "-j", "DROP"]):
            run(*self.exec_args(), "iptables", "-A", *rule)
            self.dropping.append([*self.exec_args(), rule])
        if to_cell:
            run("ip", "-n", self.name, "route", "replace", f"{self.wifi_host}/32", "via", self.cell_host,
                "dev", self.cell_if, "src", self.cell_device)
        else:
            run("ip", "-n", self.name, "route", "del", f"{self.wifi_host}/32", check=False)


@pytest.fixture
def device_netns() -> Iterator[DeviceNetns]:
    try:
        with device_namespace() as ns:
            yield ns
    except NetnsUnavailable as e:
        pytest.skip(str(e))


@contextmanager
def device_namespace() -> Iterator[DeviceNetns]:
    """A device namespace with wifi and cell, removed on exit (raises NetnsUnavailable where none can be made)."""
    name, tag = made_netns("ils-r")
    octet = 16 + int(tag[:2], 16) % 200
    host_ifs = [f"hw{tag}", f"hc{tag}"]
    ns = DeviceNetns(name, f"10.232.{octet}.1", f"10.232.{octet}.2", f"10.233.{octet}.1",
                     f"10.233.{octet}.2", f"wifi{tag}", f"cell{tag}")
    try:
        make_veth(ns.name, host_ifs[0], ns.wifi_if, ns.wifi_host, ns.wifi_device)
        make_veth(ns.name, host_ifs[1], ns.cell_if, ns.cell_host, ns.cell_device)
        yield ns
    finally:
        for rule in ns.dropping:
            run(*rule[:-1], "iptables", "-D", *rule[-1], check=False)
        for host_if in host_ifs:
            run("ip", "link", "del", host_if, check=False)
        run("ip", "netns", "del", ns.name, check=False)


@dataclass
class GatewayNetns:
    """The gateway's namespace, with one uplink (a veth pair to this namespace); the controller and the backend listen
    on this namespace's end of it."""
    name: str
    uplink_host: str
    uplink_gateway: str

    def exec_args(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def topology(self) -> Topology:
        return Topology(controller_host=self.uplink_host, device_exec=[], gateway_exec=self.exec_args(),
                        backend_host=self.uplink_host)

    def link_rules(self, controller_port: int) -> list[list[str]]:
        """iptables rules (without -A/-D) that drop the gateway's traffic with the controller both ways, and nothing
        else: its backend stays reachable."""
        return [["OUTPUT", "-p", "tcp", "-d", self.uplink_host, "--dport", str(controller_port), "-j", "DROP"],
                ["INPUT", "-p", "tcp", "-s", self.uplink_host, "--sport", str(controller_port), "-j", "DROP"]]

    def black_hole_link(self, controller_port: int) -> None:
        for rule in self.link_rules(controller_port):
            run(*self.exec_args(), "iptables", "-A", *rule)

    def restore_link(self, controller_port: int) -> None:
        for rule in self.link_rules(controller_port):
            run(*self.exec_args(), "iptables", "-D", *rule)


@pytest.fixture
def gateway_netns() -> Iterator[GatewayNetns]:
    try:
        name, tag = made_netns("ils-g")
    except NetnsUnavailable as e:
        pytest.skip(str(e))
    octet = 16 + int(tag[:2], 16) % 200
    ns = GatewayNetns(name, f"10.234.{octet}.1", f"10.234.{octet}.2")
    host_if = f"hg{tag}"
    try:
        make_veth(ns.name, host_if, f"up{tag}", ns.uplink_host, ns.uplink_gateway)
        yield ns
    finally:
        run("ip", "link", "del", host_if, check=False)
        run("ip", "netns", "del", ns.name, check=False)


def indices(events) -> list[int]:
    return [e.json["index"] for e in events if e.event == "message"]


def pause_after(times: list[float], cut_at: float) -> float:
    after = [cut_at] + [t for t in times if t >= cut_at]
    return max((b - a for a, b in zip(after, after[1:])), default=0.0)


@dataclass
class Overlay:
    """The overlay that `overlay_in` started: the controller `c` (its `port`), the backend, the gateway, and the
    device's tunnel listening on `tunnel_port` in the device's namespace; identities ipad-r (the tunnel's) and app-r."""
    root: Path
    c: Controller
    backend: Backend
    gateway: ManagedProcess
    tunnel: ManagedProcess
    tunnel_port: int


@contextmanager
def overlay_in(net: Topology, ils_bin: Path, tmp_path: Path, controller_flags: tuple[str, ...] = (),
               gateway_flags: tuple[str, ...] = (), tunnel_flags: tuple[str, ...] = ()) -> Iterator[Overlay]:
    """Runs the overlay where `net` says (the controller on `net.controller_host`, the device's tunnel and the
    gateway in their namespaces), with the device's keepalive at 1 s + 1 s; stops everything on exit."""
    root, logs = tmp_path / "root", tmp_path / "logs"
    root.mkdir()
    logs.mkdir()
    binary = private_binary(ils_bin, logs)
    c = Controller(binary, root, logs)
    c.address = f"https://{net.controller_host}:{c.port}"
    assert c.init().returncode == 0
    controller = ManagedProcess(
        "controller-r",
        [str(binary), "controller", "run", "--state-dir", str(c.state_dir), "--listen", f"{net.controller_host}:{c.port}",
         "--log-level", "info", *controller_flags],
        logs, cwd=root, env=cli_env(),
    )
    backend = Backend(logs, host=net.backend_host)
    tunnel_port = 18000 + int.from_bytes(os.urandom(2), "big") % 20000
    tunnel = ManagedProcess(
        "tunnel-r",
        net.device_exec + [str(binary), "tunnel", "--identity", "identities/ipad-r.json", "--service", SERVICE,
                          "--listen", f"127.0.0.1:{tunnel_port}", "--log-level", "info", *DEVICE_KEEPALIVE,
                          *tunnel_flags],
        logs, cwd=root, env=cli_env(),
    )
    gateway: Optional[ManagedProcess] = None
    try:
        controller.start()
        controller.wait_for_log("controller listening")
        c.process = controller
        enroll(c, "gw-r", "gateway")
        enroll(c, "ipad-r", "device")
        enroll(c, "app-r", "device")
        backend.start()
        gateway = gateway_process(c, backend, logs, identity="gw-r", prefix=tuple(net.gateway_exec),
                                  extra=gateway_flags)
        gateway.start()
        gateway.wait_for_log("hosting service")
        tunnel.start()
        tunnel.wait_for_log("tunnel listening")
        yield Overlay(root, c, backend, gateway, tunnel, tunnel_port)
    finally:
        for p in (tunnel, gateway, backend, controller):
            if p is not None:
                p.stop()


@dataclass
class Streams:
    """N events streamed through the tunnel (curl) and through ILSClient (`ils-client-example`) at once, from the
    device's namespace: each reader's (exit status, timed lines, stderr) lands in `results` under "tunnel" or "app"."""
    readers: list[threading.Thread]
    results: dict[str, tuple[int, list[tuple[float, str]], str]]

    def join(self) -> None:
        for reader in self.readers:
            reader.join(timeout=N * INTERVAL_MS / 1000 + 120)


def start_streams(net: Topology, o: Overlay, client_example_bin: Path) -> Streams:
    """Starts both streams and returns once the backend serves both."""
    query = f"/claude/stream?n={N}&interval_ms={INTERVAL_MS}"
    results: dict[str, tuple[int, list[tuple[float, str]], str]] = {}

    def stream(name: str, args: list[str]) -> None:
        results[name] = process_timed_lines(net.device_exec + args, timeout=N * INTERVAL_MS / 1000 + 90, cwd=o.root)

    readers = [
        threading.Thread(target=stream, args=("tunnel", ["curl", "-sSN", "--max-time", "150",
                                                         f"http://127.0.0.1:{o.tunnel_port}{query}"])),
        threading.Thread(target=stream, args=("app", [str(client_example_bin), "stream", "--identity",
                                                      "identities/app-r.json", *DEVICE_KEEPALIVE, query])),
    ]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + 60
    while backend_streams(o.backend)["active"] < 2:
        assert time.monotonic() < deadline, "the streams never started"
        time.sleep(0.05)
    return Streams(readers, results)


def device_pids(tunnel: ManagedProcess, example: Path) -> list[int]:
    """The device's two processes: the tunnel, and the app (`ils-client-example stream`)."""
    assert tunnel.proc is not None
    found = subprocess.run(["pgrep", "-f", f"^{example} stream"], capture_output=True, text=True)
    pids = [tunnel.proc.pid] + [int(p) for p in found.stdout.split()]
    assert len(pids) == 2, f"the app's process was not found: {found.stdout!r}"
    return pids


def streams_survive(net: Topology, ils_bin: Path, client_example_bin: Path, tmp_path: Path, what: str,
                    interrupt, controller_flags: tuple[str, ...] = (), gateway_flags: tuple[str, ...] = (),
                    pause_allowance: float = 0.0, app_link_states: tuple[str, ...] = ()) -> None:
    """Runs the overlay where `net` says (the controller on `net.controller_host`, the device's processes and the
    gateway in their namespaces), streams N events through the tunnel (curl) and through ILSClient
    (`ils-client-example`) at once from the device's namespace, calls `interrupt(tunnel, example, controller_port)`
    once both are well under way, and checks that each stream got every event once, in order, with no pause above
    the bound (plus `pause_allowance`), and that the backend saw one request per stream, never cancelled.
    `app_link_states`: states the app's link state must pass through in that order (`link: STATE` on its stderr)."""
    with overlay_in(net, ils_bin, tmp_path, controller_flags, gateway_flags) as o:
        backend, gateway = o.backend, o.gateway
        before = backend_streams(backend)
        streams = start_streams(net, o, client_example_bin)
        time.sleep(SWITCH_AFTER * INTERVAL_MS / 1000)  # Sleep: the streams must be well under way; they pace it.
        cut_at = time.time()
        interrupt(o.tunnel, client_example_bin, o.c.port)
        streams.join()

        for name in ("tunnel", "app"):
            status, lines, stderr = streams.results[name]
            assert status == 0, f"{name}: exit {status}: {stderr}"
            sse: list[tuple[float, str]] = []
            for at, line in lines:
                if name == "app":
                    # ils-client-example prints each non-empty line after its arrival time: put the blank line
                    # that ends an event back.
                    line = line.split(" ", 1)[1] if " " in line else line
                    sse += [(at, line)] + ([(at, "")] if line.startswith("data:") else [])
                else:
                    sse.append((at, line))
            events = parse_sse(sse)
            assert indices(events) == list(range(N)), f"{name}: {indices(events)[:10]}…"
            assert events[-1].event == "done", f"{name}: {events[-1]}"
            pause = pause_after([e.received_at for e in events], cut_at)
            print(f"\n{what}, {name}: {N} events, each once and in order; longest pause after it {pause:.2f} s")
            assert pause < PAUSE_BOUND_S + pause_allowance, f"{name}: paused {pause:.1f} s"
            if name == "app" and app_link_states:
                states = [line.split("link: ", 1)[1].split(" ", 1)[0] for line in stderr.splitlines()
                          if line.startswith("link: ")]
                print(f"{what}, app: link states {states}")
                remaining = iter(states)
                assert all(wanted in remaining for wanted in app_link_states), \
                    f"the app's link states {states} do not pass through {app_link_states} in order"
        gateway.wait_for_log_count("circuit resumed", count=2)  # one per stream: each is an identity of its own
        after = backend_streams(backend)
        assert after["completed"] == before["completed"] + 2, (before, after)
        assert after["disconnected"] == before["disconnected"], (before, after)


STOP_S = 20.0


def test_a_network_switch_mid_stream_loses_nothing(device_netns: DeviceNetns, ils_bin: Path, client_example_bin: Path,
                                                   tmp_path: Path) -> None:
    # The app's UI sees it (issue 39): its link goes quiet past the keepalive (stalled), the circuit is held while a
    # new connection is made over cell (resuming), then it is back (ready).
    streams_survive(device_netns.topology(), ils_bin, client_example_bin, tmp_path,
                    "wifi black-holed, route moved to cell", lambda tunnel, example, port: device_netns.switch_to_cell(),
                    app_link_states=("ready", "stalled", "resuming", "ready"))


def test_a_device_stopped_for_20_s_loses_nothing(device_netns: DeviceNetns, ils_bin: Path, client_example_bin: Path,
                                                 tmp_path: Path) -> None:
    """The device's processes stopped (SIGSTOP) for 20 s, as a sleeping tablet's app is: the controller's keepalive
    (2 s + 2 s here) closes their connections meanwhile, the gateway holds both circuits, and when the processes go
    on (SIGCONT) they find their connections gone and resume."""

    def stop_the_device(tunnel: ManagedProcess, example: Path, controller_port: int) -> None:
        pids = device_pids(tunnel, example)
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(STOP_S)  # Sleep: the length of the stop is the test.
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)

    streams_survive(device_netns.topology(), ils_bin, client_example_bin, tmp_path, "device stopped for 20 s",
                    stop_the_device, controller_flags=("--keepalive", "2s", "--keepalive-timeout", "2s"),
                    pause_allowance=STOP_S)


GRACE_S = 3


def gateway_metrics(port: int) -> dict[str, float]:
    """The gateway's Prometheus metrics, by name (with labels), from `--metrics`."""
    text = subprocess.run(["curl", "-sS", f"http://127.0.0.1:{port}/metrics"], capture_output=True, text=True,
                          timeout=20, check=True).stdout
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def test_after_the_grace_window_the_backend_is_cancelled_and_the_app_told(
        device_netns: DeviceNetns, ils_bin: Path, client_example_bin: Path, tmp_path: Path) -> None:
    """The device's processes stopped (SIGSTOP) past the gateway's grace window (`--resume-grace 3s`): the
    controller's keepalive (2 s + 2 s) ends their connections, the gateway holds both circuits, and when the window
    runs out it cancels both backend requests and keeps nothing (its metrics: no circuit held, no byte kept). When the
    processes go on (SIGCONT) their resumptions are refused: the app's request fails with its own reason,
    `not_resumed` (never `truncated`, never a complete answer), and the tunnel resets its client's connection (curl
    fails; a FIN would read as a complete answer) and logs why."""
    metrics_port = free_port()
    with overlay_in(device_netns.topology(), ils_bin, tmp_path,
                    controller_flags=("--keepalive", "2s", "--keepalive-timeout", "2s"),
                    gateway_flags=("--resume-grace", f"{GRACE_S}s", "--metrics", f"127.0.0.1:{metrics_port}")) as o:
        before = backend_streams(o.backend)
        streams = start_streams(device_netns.topology(), o, client_example_bin)
        pids = device_pids(o.tunnel, client_example_bin)
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            # The event: the gateway gave up on both circuits (after the controller's keepalive and the grace).
            deadline = time.monotonic() + 120
            # Counted by the metric: the log says it once a minute with the count.
            while gateway_metrics(metrics_port).get("ils_gateway_circuits_not_resumed_total", 0) < 2:
                assert time.monotonic() < deadline, o.gateway.logs()
                time.sleep(0.1)
            while (now := backend_streams(o.backend))["active"] > before["active"]:
                assert time.monotonic() < deadline, now
                time.sleep(0.1)
            assert now["disconnected"] == before["disconnected"] + 2, (before, now)
            assert now["completed"] == before["completed"], (before, now)
            metrics = gateway_metrics(metrics_port)
            assert metrics.get("ils_gateway_circuits_not_resumed_total") == 2, metrics
            assert metrics.get("ils_gateway_circuits_held") == 0, metrics
            assert metrics.get("ils_gateway_resumption_kept_bytes") == 0, metrics
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        streams.join()
        status, lines, stderr = streams.results["app"]
        assert status == 74 and "(not_resumed)" in stderr, f"app: exit {status}: {stderr}"
        assert len(lines) < 2 * N, "the app got the whole answer"
        status, lines, stderr = streams.results["tunnel"]
        assert status != 0, f"curl read a clean end after {len(lines)} lines"
        assert not any('"event": "done"' in line or line == "event: done" for _, line in lines), "a complete answer"
        o.tunnel.wait_for_log("circuit lost and not resumed")
        assert "circuit cut before the gateway's end" not in o.tunnel.full_log()


def test_a_cancel_from_the_app_or_the_tunnel_client_stops_the_backend_at_once(
        device_netns: DeviceNetns, ils_bin: Path, client_example_bin: Path, tmp_path: Path) -> None:
    """A device that means to stop says so, sealed (CANCEL), and the gateway ends the backend request at once instead
    of holding it for a resumption: the app cancels its task (`ils-client-example stream --cancel-after`, which calls
    `URLSessionTask.cancel()`), and the tunnel's local client goes away (curl killed). The gateway counts both as
    cancelled and none as held or not resumed (its metrics), with the default grace window of 60 s: a cancel taken for
    a lost path would keep both backend requests running for that long."""
    metrics_port = free_port()
    net = device_netns.topology()
    with overlay_in(net, ils_bin, tmp_path, gateway_flags=("--metrics", f"127.0.0.1:{metrics_port}")) as o:
        before = backend_streams(o.backend)
        query = f"/claude/stream?n={N}&interval_ms={INTERVAL_MS}"
        app = subprocess.run(net.device_exec + [str(client_example_bin), "stream", "--identity", "identities/app-r.json",
                                                "--cancel-after", "5", query],
                             capture_output=True, text=True, timeout=120, cwd=o.root)
        assert app.returncode == 0, f"app: exit {app.returncode}: {app.stderr}"
        assert len(app.stdout.splitlines()) == 5, app.stdout
        curl = subprocess.Popen(net.device_exec + ["curl", "-sSN", f"http://127.0.0.1:{o.tunnel_port}{query}"],
                                stdout=subprocess.PIPE, text=True)
        assert curl.stdout is not None
        for _ in range(5):
            assert curl.stdout.readline(), "the tunnel's stream ended early"
        curl.kill()
        curl.wait(timeout=20)
        # The event: the backend saw both clients go away. Cancelled, never held: only the CANCEL ends a backend
        # request before the grace window (60 s) runs out.
        deadline = time.monotonic() + 50
        while (now := backend_streams(o.backend))["disconnected"] < before["disconnected"] + 2:
            assert time.monotonic() < deadline, now
            time.sleep(0.05)
        assert now["completed"] == before["completed"], (before, now)
        metrics = gateway_metrics(metrics_port)
        assert metrics.get("ils_gateway_circuits_cancelled_total") == 2, metrics
        assert metrics.get("ils_gateway_circuits_not_resumed_total", 0) == 0, metrics
        assert metrics.get("ils_gateway_circuits_held") == 0, metrics


BLACK_HOLE_S = 10.0


def test_a_black_holed_gateway_link_loses_nothing(gateway_netns: GatewayNetns, ils_bin: Path,
                                                  client_example_bin: Path, tmp_path: Path) -> None:
    """The gateway's link to the controller black-holed for 10 s (a home router that hangs under the gateway): the
    gateway's keepalive (1 s + 1 s) ends its link, so it holds both circuits and redials; the controller's (2 s + 2 s)
    ends it too and resets the devices' streams, so they resume, refused `gateway_unavailable` until the gateway's
    link is back, then accepted by the gateway, which kept reading the backend's answer meanwhile."""

    def black_hole(tunnel: ManagedProcess, example: Path, controller_port: int) -> None:
        gateway_netns.black_hole_link(controller_port)
        try:
            time.sleep(BLACK_HOLE_S)  # Sleep: the length of the outage is the test.
        finally:
            gateway_netns.restore_link(controller_port)

    streams_survive(gateway_netns.topology(), ils_bin, client_example_bin, tmp_path,
                    "gateway link black-holed for 10 s", black_hole,
                    controller_flags=("--keepalive", "2s", "--keepalive-timeout", "2s"),
                    gateway_flags=("--keepalive", "1s", "--keepalive-timeout", "1s"), pause_allowance=BLACK_HOLE_S)


UPLOAD_MIB = 16


def test_an_upload_survives_a_network_switch_midway(device_netns: DeviceNetns, ils_bin: Path, tmp_path: Path) -> None:
    """16 MiB uploaded through the tunnel from the device's namespace (curl, paced at 2 MiB/s so the switch lands
    midway); a quarter of the way in, wifi is black-holed and the route moves to cell. The backend hashes what it got:
    every byte once, in order (SHA-256 and size), in one request."""
    body = tmp_path / "upload.bin"
    body.write_bytes(os.urandom(UPLOAD_MIB * 1024 * 1024))
    expected = hashlib.sha256(body.read_bytes()).hexdigest()
    with overlay_in(device_netns.topology(), ils_bin, tmp_path) as o:
        upload = subprocess.Popen(
            device_netns.exec_args() + ["curl", "-sS", "--max-time", "120", "--limit-rate", "2M", "-H", "Expect:",
                                        "-X", "POST", "--data-binary", f"@{body}",
                                        f"http://127.0.0.1:{o.tunnel_port}/upload"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        # The upload is under way once the tunnel has dialled its circuit (its first connection to the controller).
        o.c.process.wait_for_log("device connected")
        # Sleep: curl's --limit-rate caps the upload at 2 MiB/s (8 s at best; a slower machine only makes it longer),
        # so this lands the switch inside it. That it did is checked below (the gateway resumed a circuit).
        time.sleep(UPLOAD_MIB / 2 / 4)
        device_netns.switch_to_cell()
        out, err = upload.communicate(timeout=150)
        assert upload.returncode == 0, f"curl: {err}"
        got = json.loads(out)
        assert got == {"bytes": UPLOAD_MIB * 1024 * 1024, "sha256": expected}, got
        o.gateway.wait_for_log("circuit resumed")  # the upload was resumed: the switch did not miss it
