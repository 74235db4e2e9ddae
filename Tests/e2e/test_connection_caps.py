"""Connection caps on the two listening ports, through the real binary: the controller's one port (`controller run
--max-connections[-per-source]`) and HTTP mode's listener (`serve --mode http --max-connections[-per-source]`).

A connection beyond a cap is accepted by the kernel and closed by the server at once, before TLS: the client reads
end of file without a byte. Each test checks the refusal (no bytes, closed), the metric
(`ils_connections_refused_total{listener,cap}`), the log line (one per source per interval, however many refusals),
that the connections already held were not disturbed, and that a good client is served once a held one closes.
"""

from __future__ import annotations

import re
import socket
import time
import urllib.request
from pathlib import Path
from typing import Iterator, Optional

import pytest

from conftest import STARTUP_TIMEOUT_S, Backend, Certs, Gateway, ManagedProcess, free_port, port_accepts
from hostile import assert_no_growth, fd_count, read_until_closed, rss_bytes
from test_hostile_controller import TunedController, api, assert_controller_serves, pem_files

pytestmark = pytest.mark.e2e

REFUSAL_BOUND_S = 5.0  # a refused connection is closed at accept: this bound is only for a loaded machine
HELD = 4
EXTRA = 3


def metric(port: int, name: str, missing: Optional[float] = 0.0, **labels: str) -> Optional[float]:
    """One sample of the Prometheus text at --metrics; `missing` when the series does not exist yet."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    for line in text.splitlines():
        m = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            return float(m.group(2))
    return missing


def refusals_once_counted(port: int, expected: int, **labels: str) -> Optional[float]:
    """ils_connections_refused_total once it reaches `expected`, or after 10 s: a refusal is counted just after the
    close its client sees, so a reading at once can miss the last one."""
    deadline = time.monotonic() + 10
    while (refused := metric(port, "ils_connections_refused_total", **labels)) < expected:
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return refused


def wait_open_connections(metrics_port: int, listener: str, n: int, explain) -> None:
    """Until the server's ils_connections_open{listener} reads n (a missing gauge is no reading: the server has counted
    no connection in yet). The server's own count is the event; `explain(reading)` says why it never came."""
    deadline = time.monotonic() + 10
    while (reading := metric(metrics_port, "ils_connections_open", missing=None, listener=listener)) != n:
        assert time.monotonic() < deadline, explain(reading)
        time.sleep(0.05)


def wait_all_counted_out(metrics_port: int, listener: str) -> None:
    """Until the server has counted every connection so far out again (the start-up's port probe among them): its
    ils_connections_open gauge exists, so it counted one in, and reads 0. First until the metrics listener accepts:
    it starts beside the server's own port, which the start-up waited for, and a first reading once came before it
    (CI-2 of session 39: "connection refused" on the metrics port of HTTP mode's per-source test)."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not port_accepts(metrics_port):
        assert time.monotonic() < deadline, f"nothing accepts on the metrics port {metrics_port}"
        time.sleep(0.05)
    wait_open_connections(metrics_port, listener, 0,
                          lambda _: f"ils_connections_open{{listener={listener}}} did not come back to 0")


def hold(port: int, n: int) -> list[socket.socket]:
    """n TCP connections that send nothing (each within the server's handshake or idle deadline for this test)."""
    return [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(n)]


def wait_all_counted_in(metrics_port: int, listener: str, n: int, cap: str) -> None:
    """Until the server has admitted the n connections just held: the refusals that follow must meet a server at its
    cap, not one still accepting. If one of them was refused instead, says so."""
    wait_open_connections(metrics_port, listener, n, lambda held: (
        f"the server counts {held} open connections, not the {n} just held "
        f"({metric(metrics_port, 'ils_connections_refused_total', listener=listener, cap=cap)} refused by cap={cap}): "
        "a connection the test did not make took a place"))


def assert_refused_at_accept(port: int) -> None:
    """Connects and expects the server to close without sending a byte, before any TLS."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        out = read_until_closed(s, deadline_s=REFUSAL_BOUND_S)
    assert out.closed and out.data == b"", f"a connection beyond the cap was not refused at accept: {out.describe()}"


def assert_still_open(socks: list[socket.socket], metrics_port: int, listener: str) -> None:
    """No held connection was closed; if one was, says what the server counts (still open, and refused by cap)."""
    for i, s in enumerate(socks):
        s.setblocking(False)
        try:
            if s.recv(1) == b"":
                open_now = metric(metrics_port, "ils_connections_open", missing=None, listener=listener)
                refused = {cap: metric(metrics_port, "ils_connections_refused_total", listener=listener, cap=cap)
                           for cap in ("total", "per_source")}
                pytest.fail(f"held connection {i} of {len(socks)} was closed by the refusals of others "
                            f"(ils_connections_open {open_now}, refusals {refused})")
        except BlockingIOError:
            pass  # open, nothing to read: as expected
        finally:
            s.setblocking(True)


def refusal_lines(process: ManagedProcess) -> list[str]:
    """The log's refusal lines, once there is one: the binary writes a line a little after the refusal it reports."""
    log = process.wait_for_log_count("too many open connections")
    return [line for line in log.splitlines() if "too many open connections" in line]


# ------------------------------------------------------------------------------------------------------------------
# The controller's port
# ------------------------------------------------------------------------------------------------------------------


@pytest.fixture
def tuned_controller(ils_bin: Path, request) -> Iterator[TunedController]:
    metrics_port = free_port()
    extra = list(request.param) + ["--metrics", f"127.0.0.1:{metrics_port}"]
    with TunedController.running(ils_bin, extra) as c:
        c.metrics_port = metrics_port
        yield c


@pytest.mark.parametrize(
    "tuned_controller,cap",
    [
        ((f"--max-connections-per-source={HELD}",), "per_source"),
        ((f"--max-connections={HELD}", "--max-connections-per-source=100"), "total"),
    ],
    indirect=["tuned_controller"],
    ids=["per-source", "total"],
)
def test_controller_caps_refuse_at_accept(tuned_controller: TunedController, cap: str) -> None:
    c = tuned_controller
    admin = pem_files(c, "admin")
    wait_all_counted_out(c.metrics_port, "controller")
    socks = hold(c.port, HELD)
    try:
        wait_all_counted_in(c.metrics_port, "controller", HELD, cap)
        for _ in range(EXTRA):
            assert_refused_at_accept(c.port)
        assert_still_open(socks, c.metrics_port, "controller")
        refused = refusals_once_counted(c.metrics_port, EXTRA, listener="controller", cap=cap)
        assert refused == EXTRA, f"ils_connections_refused_total{{cap={cap}}} = {refused}, expected {EXTRA}"
        lines = refusal_lines(c.process)
        print(f"{EXTRA} refusals, log lines: {lines}")
        assert len(lines) == 1, f"expected one log line for {EXTRA} refusals from one source: {lines}"
        assert f"cap={cap}" in lines[0] and "source=127.0.0.1" in lines[0], lines[0]
    finally:
        for s in socks:
            s.close()
    # A good client is served once the held connections are gone.
    deadline = time.monotonic() + 10
    while True:
        status, body = api(c, "GET", "/v1/whoami", admin)
        if status == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert status == 200 and body["name"] == "admin", (status, body)
    assert_controller_serves(c, admin)
    # Every client connection is closed by now; the gauge comes down as the server handles each close.
    wait_all_counted_out(c.metrics_port, "controller")


FLOOD = 1000


@pytest.mark.parametrize("tuned_controller", [(f"--max-connections-per-source={HELD}",)], indirect=True,
                         ids=["per-source"])
def test_a_flood_beyond_the_cap_costs_no_descriptors_memory_or_log_lines(tuned_controller: TunedController) -> None:
    """1000 connections beyond the cap, opened and dropped as fast as one client can: each is closed at accept, the
    controller's descriptors and memory come back to where they were, and the log holds one line for all of them."""
    c = tuned_controller
    admin = pem_files(c, "admin")
    wait_all_counted_out(c.metrics_port, "controller")
    socks = hold(c.port, HELD)
    try:
        wait_all_counted_in(c.metrics_port, "controller", HELD, "per_source")
        assert_refused_at_accept(c.port)
        pid = c.process.pid
        before = (rss_bytes(pid), fd_count(pid))
        started = time.monotonic()
        for _ in range(FLOOD):
            with socket.create_connection(("127.0.0.1", c.port), timeout=5) as s:
                s.settimeout(5)
                assert s.recv(1) == b"", "a connection beyond the cap got bytes"
        elapsed = time.monotonic() - started
        print(f"{FLOOD} refused connections in {elapsed:.1f} s")
        assert_no_growth("controller", pid, before, f"{FLOOD} connections refused at accept")
        assert refusals_once_counted(c.metrics_port, FLOOD + 1, listener="controller", cap="per_source") == FLOOD + 1
        assert len(refusal_lines(c.process)) == 1
        assert_still_open(socks, c.metrics_port, "controller")
    finally:
        for s in socks:
            s.close()
    deadline = time.monotonic() + 10
    while api(c, "GET", "/v1/whoami", admin)[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert_controller_serves(c, admin)


# ------------------------------------------------------------------------------------------------------------------
# HTTP mode's listener
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags,cap",
    [
        ((f"--max-connections-per-source={HELD}",), "per_source"),
        ((f"--max-connections={HELD}", "--max-connections-per-source=100"), "total"),
    ],
    ids=["per-source", "total"],
)
def test_http_mode_caps_refuse_at_accept(ils_bin: Path, backend: Backend, certs: Certs, work_dir: Path,
                                         flags: tuple[str, ...], cap: str) -> None:
    metrics_port = free_port()
    g = Gateway(ils_bin, "tls", backend, certs, work_dir, [*flags, "--metrics", f"127.0.0.1:{metrics_port}"])
    g.start()
    try:
        wait_all_counted_out(metrics_port, "http")
        socks = hold(g.port, HELD)
        try:
            wait_all_counted_in(metrics_port, "http", HELD, cap)
            for _ in range(EXTRA):
                assert_refused_at_accept(g.port)
            assert_still_open(socks, metrics_port, "http")
            refused = refusals_once_counted(metrics_port, EXTRA, listener="http", cap=cap)
            assert refused == EXTRA, f"ils_connections_refused_total{{cap={cap}}} = {refused}, expected {EXTRA}"
            lines = refusal_lines(g)
            print(f"{EXTRA} refusals, log lines: {lines}")
            assert len(lines) == 1, f"expected one log line for {EXTRA} refusals from one source: {lines}"
            assert f"cap={cap}" in lines[0] and "source=127.0.0.1" in lines[0], lines[0]
        finally:
            for s in socks:
                s.close()
        deadline = time.monotonic() + 10
        while True:
            try:
                with g.client() as client:
                    r = client.get("/health")
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        assert r.status_code == 200, r.text
    finally:
        g.stop()
