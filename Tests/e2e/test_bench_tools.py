"""The benchmark's own parts can fail: `ils-bench relay` (the NIO floor row) carries bytes both ways, passes a
half-close on, and drops a client it cannot connect onwards instead of holding it; deploy/bench/report.py puts the
floor rows in the table and next to the targets they bound.

Real processes on 127.0.0.1 (ils-bench from the same build as ILS_BIN), a Python echo server; a few seconds."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import REPO_ROOT, free_port, port_accepts

sys.path.insert(0, str(REPO_ROOT / "deploy" / "bench"))
import report  # noqa: E402


@pytest.fixture
def bench_bin(ils_bin: Path) -> Path:
    path = ils_bin.parent / "ils-bench"
    if not path.is_file():
        pytest.fail(f"ils-bench not built next to {ils_bin} (`swift build` builds both)", pytrace=False)
    return path


def wait_accepting(port: int, proc: subprocess.Popen) -> None:
    for _ in range(500):
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args} exited with {proc.returncode}")
        if port_accepts(port):
            return
        threading.Event().wait(0.02)
    raise AssertionError(f"nothing listens on {port}")


@pytest.fixture
def spawn() -> Iterator:
    procs: list[subprocess.Popen] = []

    def start(*args: str) -> subprocess.Popen:
        proc = subprocess.Popen(list(args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait(timeout=10)


class EchoServer:
    """Echoes what it reads; on the client's EOF it sends `bye` and closes its side (a half-close must arrive)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(65536):
                    conn.sendall(data)
                conn.sendall(b"bye")


def read_until_eof(sock: socket.socket) -> bytes:
    out = b""
    while data := sock.recv(65536):
        out += data
    return out


def test_relay_carries_bytes_both_ways_and_passes_the_half_close_on(bench_bin: Path, spawn) -> None:
    echo = EchoServer()
    port = free_port()
    wait_accepting(port, spawn(str(bench_bin), "relay", "--port", str(port), "--target", str(echo.port)))
    payload = bytes(range(256)) * 4096  # 1 MiB: several reads and writes each way, with backpressure
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sender = threading.Thread(target=lambda: (sock.sendall(payload), sock.shutdown(socket.SHUT_WR)))
        sender.start()
        got = read_until_eof(sock)
        sender.join(timeout=10)
    # Everything came back in order, then the server's words after our EOF reached it, then its EOF reached us.
    assert got == payload + b"bye"
    echo.listener.close()


def test_relay_serves_http_keep_alive_through_to_the_bench_backend(bench_bin: Path, spawn) -> None:
    backend, port = free_port(), free_port()
    wait_accepting(backend, spawn(str(bench_bin), "backend", "--port", str(backend), "--threads", "1"))
    wait_accepting(port, spawn(str(bench_bin), "relay", "--port", str(port), "--target", str(backend)))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for _ in range(3):
            sock.sendall(b"GET /small HTTP/1.1\r\nHost: bench\r\n\r\n")
            data = b""
            while not (b"\r\n\r\n" in data and len(data.partition(b"\r\n\r\n")[2]) >= 1024):
                chunk = sock.recv(65536)
                assert chunk, "the relay closed a keep-alive connection"
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200")
            assert body == b"x" * 1024


def test_relay_on_two_loops_serves_concurrent_keep_alive_connections(bench_bin: Path, spawn) -> None:
    backend, port = free_port(), free_port()
    wait_accepting(backend, spawn(str(bench_bin), "backend", "--port", str(backend), "--threads", "1"))
    wait_accepting(port, spawn(str(bench_bin), "relay", "--port", str(port), "--target", str(backend), "--threads", "2"))
    socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(4)]
    try:
        for _ in range(3):
            for sock in socks:  # interleaved, so connections on both loops are live at once
                sock.sendall(b"GET /small HTTP/1.1\r\nHost: bench\r\n\r\n")
            for sock in socks:
                data = b""
                while not (b"\r\n\r\n" in data and len(data.partition(b"\r\n\r\n")[2]) >= 1024):
                    chunk = sock.recv(65536)
                    assert chunk, "the relay closed a keep-alive connection"
                    data += chunk
                assert data.startswith(b"HTTP/1.1 200") and data.partition(b"\r\n\r\n")[2] == b"x" * 1024
    finally:
        for sock in socks:
            sock.close()


@pytest.mark.parametrize("threads", ["0", "65"])
def test_relay_refuses_a_thread_count_out_of_range(bench_bin: Path, threads: str) -> None:
    port = free_port()
    done = subprocess.run([str(bench_bin), "relay", "--port", str(port), "--target", "1", "--threads", threads],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode != 0
    assert "--threads must be 1 to 64" in done.stderr
    assert not port_accepts(port), "a refused relay must not listen"


def test_relay_closes_a_client_it_cannot_connect_onwards(bench_bin: Path, spawn) -> None:
    nowhere, port = free_port(), free_port()
    relay = spawn(str(bench_bin), "relay", "--port", str(port), "--target", str(nowhere))
    wait_accepting(port, relay)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"hello")
        # Closed (an EOF, or a reset since "hello" was never read), not held open: a hang fails on the timeout.
        try:
            assert read_until_eof(sock) == b""
        except ConnectionResetError:
            pass
    assert relay.poll() is None, "one failed connection must not stop the relay"


def latency_row(p50: float) -> dict:
    return {"p50_us": p50, "p99_us": p50 * 2, "max_us": p50 * 3, "count": 100}


def results_with_floors() -> dict:
    latency = latency_row
    return {
        "machine": {"cpu": "test", "cores": 2, "memory_gib": 1, "kernel": "6", "versions": {}},
        "config": {"size_mib": 1, "latency_count": 100, "seconds": 1, "streams": 10, "revocations": 1},
        "duration_s": 1.0,
        "paths": {
            "direct": {"latency": latency(60), "rps": 80000},
            "overlay": {"latency": latency(460), "rps": 12000},
            "ssh -R": {"latency": latency(220), "rps": 7000},
            "ils-http": {"latency": latency(170), "rps": 30000},
            "nginx-http": {"latency": latency(140), "rps": 40000},
        },
        "floors": {
            "relay x2 (socat)": {"latency": latency(190)},
            "relay x3 (socat)": {"latency": latency(251)},
            "relay x3 (NIO)": {"latency": latency(275)},
            "relay x1 (NIO)": {"latency": latency(130), "rps": 44000},
        },
    }


def test_report_shows_the_floors_and_puts_them_next_to_the_targets_they_bound() -> None:
    text = report.render(results_with_floors())
    assert "### Floors: relays that only copy bytes (same run)" in text
    assert "| relay x3 (socat) | 251 | 191 | – |" in text
    assert "| relay x1 (NIO) | 130 | 70 | 44,000 |" in text
    assert "400 µs vs 160 µs (three relays that only copy bytes: 191 µs)" in text
    assert "0.75× (a plain NIO relay: 1.10× of nginx's requests/s)" in text
    two_loops = results_with_floors()
    two_loops["floors"]["relay x1 (NIO, 2 loops)"] = {"latency": latency_row(140), "rps": 50000}
    text = report.render(two_loops)
    assert "| relay x1 (NIO, 2 loops) | 140 | 80 | 50,000 |" in text
    assert "(a plain NIO relay: 1.10× of nginx's requests/s; on 2 loops, as nginx has 2 workers: 1.25×)" in text
    without = results_with_floors()
    del without["floors"]
    assert "### Floors" not in report.render(without)


def cluster_figures(revocation_p99: float, failover_max: float, postgres_p50: float) -> dict:
    sse = lambda worst: {"kib_per_stream": {"tunnel": 3.0, "controller": worst, "gateway": 5.0},  # noqa: E731
                         "p99_us": 900, "closed_early": 0}
    return {
        "date": "2026-11-25",
        "postgres": "17",
        "latency": {"direct": {"p50_us": 60, "p99_us": 120}, "sqlite": {"p50_us": 460, "p99_us": 900},
                    "postgres": {"p50_us": postgres_p50, "p99_us": 950}},
        "new_circuits_s": {"sqlite": 2000.0, "postgres": 1500.0},
        "sse": {"sqlite": sse(8.0), "postgres": sse(10.0)},
        "revocation": {"trials": 20, "after_return_ms": {"p50": 2.0, "p99": revocation_p99},
                       "after_start_ms": {"p50": 30.0, "p99": 60.0}},
        "failover_ms": {"trials": 3, "each_ms": [40.0, 55.0, failover_max], "max": failover_max},
    }


def test_report_shows_the_cluster_rows_and_judges_their_targets() -> None:
    results = results_with_floors()
    results["cluster"] = cluster_figures(revocation_p99=12.5, failover_max=70.0, postgres_p50=480)
    text = report.render(results)
    assert "### Two controllers on one PostgreSQL (2026-11-25, PostgreSQL 17)" in text
    assert "| relay latency p50, added to direct (60 µs) | 400 µs | 420 µs | 1.05× |" in text
    assert "| new circuits/s (wrk, `Connection: close`) | 2,000 | 1,500 | 0.75× |" in text
    assert "| KiB per idle SSE stream, worst process | 8.0 | 10.0 | 1.25× |" in text
    assert "40, 55, 70 ms" in text
    assert "| revocation through A cuts a stream on B: p99 ≤ 50 ms | 12.5 ms after return | **met** |" in text
    assert "| failover: SIGKILL of a controller → next request through another ≤ 1 s | max 70 ms | **met** |" in text
    assert "PostgreSQL added p50 ≤ 1.1× SQLite's | 420 µs vs 400 µs | **met** |" in text

    # Each target can be missed, and says so.
    results["cluster"] = cluster_figures(revocation_p99=51.0, failover_max=1200.0, postgres_p50=520)
    text = report.render(results)
    assert "| revocation through A cuts a stream on B: p99 ≤ 50 ms | 51.0 ms after return | **not met** |" in text
    assert "| max 1200 ms | **not met** |" in text
    assert "| 460 µs vs 400 µs | **not met** |" in text
    del results["cluster"]
    assert "Two controllers" not in report.render(results)


def load(bench_bin: Path, *args: str) -> dict:
    proc = subprocess.run([str(bench_bin), "load", *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_load_client_measures_every_mode_against_the_bench_backend(bench_bin: Path, spawn) -> None:
    """`ils-bench load` over TCP (the app path's yardstick): each mode runs to its end and reports what it moved."""
    backend = free_port()
    wait_accepting(backend, spawn(str(bench_bin), "backend", "--port", str(backend), "--threads", "1"))
    target = f"tcp:{backend}"
    latency = load(bench_bin, target, "--mode", "latency", "--count", "50", "--warmup", "5")
    assert latency["requests"] == 50 and 0 < latency["p50Microseconds"] <= latency["p99Microseconds"]
    fresh = load(bench_bin, target, "--mode", "latency", "--count", "20", "--warmup", "2", "--connection-per-request")
    assert fresh["requests"] == 20 and fresh["connectionPerRequest"] is True
    rps = load(bench_bin, target, "--mode", "rps", "--seconds", "1", "--connections", "4")
    assert rps["requests"] > 0 and rps["requestsPerSecond"] > 0
    for mode in ("download", "upload"):
        moved = load(bench_bin, target, "--mode", mode, "--size-mib", "8")
        assert moved["bytes"] == 8 << 20 and moved["mibPerSecond"] > 0


def test_load_client_fails_loudly_instead_of_reporting_a_figure(bench_bin: Path, spawn) -> None:
    nowhere = free_port()
    for args, words in (
        ([f"tcp:{nowhere}", "--mode", "latency", "--count", "5"], "refused"),
        (["udp:1", "--mode", "latency"], "neither tcp:PORT nor overlay"),
        (["tcp:1", "--mode", "sideways"], "'latency', 'rps', 'download' or 'upload'"),
        (["overlay:/nonexistent.json:claude-api"], "nonexistent"),
    ):
        proc = subprocess.run([str(bench_bin), "load", *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0 and proc.stdout == "", args
        assert words in proc.stderr, (args, proc.stderr)


def results_with_app(app_added: float, app_down: float) -> dict:
    def row(p50: float, fresh: float, down: float, up: float) -> dict:
        return {"latency": {"p50Microseconds": p50}, "latency_new_connection": {"p50Microseconds": fresh},
                "rps": {"requestsPerSecond": 5000.0}, "download_mib_s": down, "upload_mib_s": up}
    results = results_with_floors()
    results["app"] = {"direct": row(80, 300, 1000, 1000), "ssh -R": row(220, 40000, 400, 400),
                      "app": row(80 + app_added, 3000, app_down, 450)}
    return results


def test_report_shows_the_app_path_and_judges_its_targets() -> None:
    met = report.render(results_with_app(app_added=120, app_down=500))
    assert "### The app's own path (same run)" in met
    assert "| the app (ILSClient in process) | 200 | 120 | 3,000 | 2,700 | 5,000 | 500 | 450 |" in met
    assert "| the app's path: added p50 ≤ ssh -R's (keep-alive, same Swift client) | keep-alive 120 µs vs 140 µs" in met
    judged = [line for line in met.splitlines() if line.startswith("| the app's path")]
    assert len(judged) == 2 and all(line.endswith("| **met** |") for line in judged), judged
    missed = report.render(results_with_app(app_added=300, app_down=300))
    judged = [line for line in missed.splitlines() if line.startswith("| the app's path")]
    assert len(judged) == 2 and all("not met" in line for line in judged), judged
    assert "### The app's own path" not in report.render(results_with_floors())
    # The two-hop NIO floor (the app path's shape with nothing but copying) is shown beside the judged figure.
    floored = results_with_app(app_added=300, app_down=300)
    floored["app"]["relay x2 (NIO)"] = {"latency": {"p50Microseconds": 250}, "latency_new_connection": {"p50Microseconds": 700}}
    text = report.render(floored)
    assert "| relay x2 (NIO) | 250 | 170 | 700 | 400 | – | – | – |" in text
    assert "(two SwiftNIO relays that only copy bytes, the app path's shape without TLS, HTTP/2 or records: 170 µs)" in text


def test_a_run_keeps_what_it_did_not_measure() -> None:
    import run  # deploy/bench/run.py

    previous = {"paths": {"overlay": 1}, "cluster": {"old": True}, "handshake": {"rows": []}}
    full = run.carry_over({"paths": {"overlay": 2}}, previous, only=set())
    assert full == {"paths": {"overlay": 2}, "handshake": {"rows": []}}
    cluster = run.carry_over({"paths": {}, "cluster": {"new": True}}, previous, only={"cluster"})
    assert cluster == {"paths": {"overlay": 1}, "cluster": {"new": True}, "handshake": {"rows": []}}
    assert run.carry_over({"paths": {}}, {}, only=set()) == {"paths": {}}
