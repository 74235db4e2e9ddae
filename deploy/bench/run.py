#!/usr/bin/env python3
"""ils-gateway benchmark harness: every path side by side, in one run, on 127.0.0.1.

Paths: direct to the backend; the ils overlay (tunnel -> controller -> dark gateway); `ssh -R` through a local sshd;
ils HTTP mode, plain and TLS; nginx and HAProxy as reverse proxies, plain and TLS. The backend is `ils-bench backend`
(SwiftNIO), so the backend is never what limits a path. Writes docs/benchmarks.md and a JSON file of the raw figures
(--markdown and --json put them elsewhere, for a partial run that must not replace the page).

`--only cluster` measures two controllers on one PostgreSQL that the run starts itself (the e2e tests' pg_fixture):
revocation through one of a stream on the other, failover after SIGKILL, and latency, new circuits/s and idle-stream
memory on PostgreSQL beside SQLite. Run alone, it keeps the other figures of the JSON file.

`--only mobile` measures the first byte of a small answer from a device in a network namespace behind an 80 ms round
trip (and 1 % loss): ILSClient, the tunnel, `ssh -R` and direct TLS, cold, warm and keep-alive (deploy/bench/mobile.py).
Run alone, it too keeps the other figures of the JSON file.

Run it through deploy/bench/run.sh, which installs what is missing and builds release binaries first.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import os
import platform
import random
import re
import resource
import shutil
import signal
import statistics
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024

# ---------------------------------------------------------------------------------------------------------------------
# Processes and ports


PROCESSES: list[subprocess.Popen] = []


def stop_all() -> None:
    for proc in reversed(PROCESSES):
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + 5
    for proc in PROCESSES:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()


atexit.register(stop_all)


HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A free port below the kernel's ephemeral range, never twice in a run: a `bind(0)` port comes from that range,
    where the source port of a connection opened meanwhile could take it before the child listens on it."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    lowest = 10000 if low > 12000 else 1024
    for _ in range(200):
        port = random.randrange(lowest, low)
        if port in HANDED_OUT:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        HANDED_OUT.add(port)
        return port
    raise RuntimeError("no free port below the ephemeral range")


def wait_port(port: int, proc: subprocess.Popen | None = None, timeout: float = 20, host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process {proc.args!r} exited with {proc.returncode}")
        try:
            socket.create_connection((host, port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.01)
    raise RuntimeError(f"nothing listens on {host}:{port} after {timeout}s")


def start(args: list[str], log: Path, cwd: Path, env: dict | None = None) -> subprocess.Popen:
    proc = subprocess.Popen(
        args, cwd=cwd, stdout=log.open("ab"), stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
    )
    PROCESSES.append(proc)
    return proc


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def with_descendants(roots: list[int]) -> list[int]:
    """The processes `roots` and all their descendants, from the parent ids in /proc/*/stat: /proc/PID/task/*/children
    needs CONFIG_PROC_CHILDREN, which not every kernel has. nginx's workers and sshd's per-session processes are the
    children that do a path's work."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass  # it exited meanwhile
    found = [pid for pid in roots if pid in parent]
    for pid in found:  # grows while it runs: breadth first down the tree
        found += [child for child, ppid in parent.items() if ppid == pid and child not in found]
    return found


def usage(pids: list[int]) -> tuple[float, int]:
    """CPU seconds and context switches so far, summed over `pids`. The CPU includes children that exited and were
    reaped (cutime, cstime), so a process that ends between two samples still counts; context switches are summed over
    the live threads (/proc/PID/status alone gives the main thread's)."""
    cpu, switches = 0.0, 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cpu += sum(int(fields[i]) for i in (11, 12, 13, 14)) / os.sysconf("SC_CLK_TCK")
            for task in Path(f"/proc/{pid}/task").iterdir():
                for line in (task / "status").read_text().splitlines():
                    if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
                        switches += int(line.split()[1])
        except (OSError, IndexError, ValueError):
            pass  # a process or thread that exited meanwhile
    return cpu, switches


def settle(s: "Setup", quiet: float = 0.3, limit: float = 30) -> float:
    """Waits until tunnel, controller and gateway have used no CPU for `quiet` seconds (at most `limit`), so that
    one measurement's teardown (10,000 SSE circuits closing, say) is not timed in the next. Returns the wait."""
    pids = [s.procs[name].pid for name in ("tunnel", "controller", "gateway") if name in s.procs]
    started = time.monotonic()
    last = [cpu_seconds(pid) for pid in pids]
    while time.monotonic() - started < limit:
        time.sleep(quiet)
        now = [cpu_seconds(pid) for pid in pids]
        if now == last:
            break
        last = now
    return time.monotonic() - started


def run(args: list[str], cwd: Path, timeout: float = 60) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))} failed ({done.returncode}): {done.stderr.strip()[:500]}")
    return done.stdout


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


# ---------------------------------------------------------------------------------------------------------------------
# The system under test


@dataclass
class Path_:
    """One way to reach the backend."""

    name: str
    port: int
    tls: bool = False

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"


@dataclass
class Setup:
    work: Path
    bin: Path
    bench: Path
    backend_port: int = 0
    paths: dict[str, Path_] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    controller_port: int = 0

    def ils(self, *args: str, timeout: float = 60) -> str:
        return run([str(self.bin), *args], cwd=self.work, timeout=timeout)


def start_backend(s: Setup) -> None:
    s.backend_port = free_port()
    proc = start([str(s.bench), "backend", "--port", str(s.backend_port), "--threads", "2"], s.work / "backend.log", s.work)
    wait_port(s.backend_port, proc)
    s.procs["backend"] = proc
    s.paths["direct"] = Path_("direct", s.backend_port)


def make_tls_cert(s: Setup) -> tuple[Path, Path]:
    cert, key = s.work / "tls.pem", s.work / "tls.key"
    run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        cwd=s.work,
    )
    return cert, key


def start_controller(s: Setup, fresh: bool) -> subprocess.Popen:
    if fresh:
        s.controller_port = free_port()
        s.ils("controller", "init", "--state-dir", "controller", "--address", f"https://127.0.0.1:{s.controller_port}")
    proc = start(
        [str(s.bin), "controller", "run", "--state-dir", "controller", "--listen", f"127.0.0.1:{s.controller_port}",
         *BENCH_CIRCUIT_CAPS],
        s.work / "controller.log",
        s.work,
    )
    wait_port(s.controller_port, proc)
    s.procs["controller"] = proc
    return proc


def enroll(s: Setup, name: str, role: str) -> float:
    """Creates and enrolls an identity; returns the wall time of `ils-gateway enroll` in seconds."""
    token = s.work / f"{name}.jwt"
    s.ils("admin", "identity", "create", name, "--role", role, "-o", str(token))
    began = time.perf_counter()
    s.ils("enroll", str(token))
    elapsed = time.perf_counter() - began
    token.unlink()
    return elapsed


# One bench device opens a circuit per request (about 7,000 a second) and holds 10,000 SSE streams: far beyond the
# per-identity caps an honest device needs (256 open, 200 new a second), which are what this run must not measure.
BENCH_CIRCUIT_CAPS = ["--max-circuits-per-identity", "16384", "--circuit-opens-per-second", "1000000"]


def start_tunnel(s: Setup, name: str, port: int, extra: list[str] | None = None) -> subprocess.Popen:
    proc = start(
        # The load tools name their host `bench`, which the tunnel answers only when told (it refuses other names
        # so a web page cannot reach it through DNS rebinding).
        [str(s.bin), "tunnel", "--identity", f"identities/{name}.json", "--listen", f"127.0.0.1:{port}",
         "--allowed-host", "bench", *(extra or [])],
        s.work / f"tunnel-{name}-{port}.log",
        s.work,
    )
    wait_port(port, proc)
    return proc


def start_gateway(s: Setup) -> None:
    """Enrolls `gateway` and starts it in overlay mode: it dials out to its controllers and hosts the backend."""
    enroll(s, "gateway", "gateway")
    s.procs["gateway"] = start(
        [str(s.bin), "serve", "--identity", "identities/gateway.json", "--backend", f"http://127.0.0.1:{s.backend_port}"],
        s.work / "gateway.log",
        s.work,
        env={"NETWORKING_MODE": "ziti"},
    )


def start_overlay(s: Setup) -> None:
    start_controller(s, fresh=True)
    enroll(s, "bench-device", "device")
    start_gateway(s)
    port = free_port()
    s.procs["tunnel"] = start_tunnel(s, "bench-device", port)
    s.paths["overlay"] = Path_("overlay", port)
    wait_for_overlay(port, timeout=20)


def wait_for_overlay(port: int, timeout: float) -> float:
    """Polls with fresh connections until a request through the tunnel succeeds; returns when (monotonic)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if http_get_status(port, "/small", timeout=1.0) == 200:
                return time.monotonic()
        except OSError:
            pass
        time.sleep(0.005)
    raise RuntimeError(f"no answer through the overlay on port {port} within {timeout}s")


def http_get_status(port: int, path: str, timeout: float) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
        parts = data.split(b" ", 2)
        return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def start_http_mode(s: Setup, cert: Path, key: Path) -> None:
    plain, secure = free_port(), free_port()
    backend = f"http://127.0.0.1:{s.backend_port}"
    s.procs["ils-http"] = start(
        [str(s.bin), "serve", "--mode", "http", "--plain-http", "--listen", f"127.0.0.1:{plain}", "--backend", backend],
        s.work / "ils-http.log",
        s.work,
    )
    s.procs["ils-https"] = start(
        [
            str(s.bin), "serve", "--mode", "http", "--listen", f"127.0.0.1:{secure}", "--backend", backend,
            "--tls-cert", str(cert), "--tls-key", str(key),
        ],
        s.work / "ils-https.log",
        s.work,
    )
    wait_port(plain, s.procs["ils-http"])
    wait_port(secure, s.procs["ils-https"])
    s.paths["ils-http"] = Path_("ils-http", plain)
    s.paths["ils-https"] = Path_("ils-https", secure, tls=True)


NGINX_CONF = """
worker_processes auto;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log;
events {{ worker_connections 16384; }}
http {{
    access_log {work}/nginx-access.log;
    client_body_temp_path {work}/nginx-tmp/body;
    proxy_temp_path {work}/nginx-tmp/proxy;
    fastcgi_temp_path {work}/nginx-tmp/fastcgi;
    uwsgi_temp_path {work}/nginx-tmp/uwsgi;
    scgi_temp_path {work}/nginx-tmp/scgi;
    upstream backend {{ server 127.0.0.1:{backend}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{plain};
        listen 127.0.0.1:{secure} ssl;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            client_max_body_size 0;
        }}
    }}
}}
"""


def start_nginx(s: Setup, cert: Path, key: Path) -> None:
    plain, secure = free_port(), free_port()
    (s.work / "nginx-tmp").mkdir(exist_ok=True)
    conf = s.work / "nginx.conf"
    conf.write_text(
        NGINX_CONF.format(work=s.work, backend=s.backend_port, plain=plain, secure=secure, cert=cert, key=key)
    )
    s.procs["nginx"] = start(["nginx", "-c", str(conf), "-p", str(s.work), "-g", "daemon off;"], s.work / "nginx.log", s.work)
    wait_port(plain, s.procs["nginx"])
    wait_port(secure, s.procs["nginx"])
    s.paths["nginx-http"] = Path_("nginx-http", plain)
    s.paths["nginx-https"] = Path_("nginx-https", secure, tls=True)


# A second anchor next to nginx: HAProxy streams both ways by default (no `option http-buffer-request`, so an upload
# is not held back until it is whole), reuses idle backend connections (`http-reuse safe`), and logs every request to
# its log file as nginx and ils do. `option http-no-delay` is the one setting a streaming API needs, as nginx's
# `proxy_buffering off`: without it HAProxy sends body data with MSG_MORE, and the kernel held an SSE stream's events
# on plain HTTP for 200-300 ms and sent them three at a time (measured: events 100 ms apart arrived at 0.2, 0.5, 0.8 s).
HAPROXY_CONF = """
global
    nbthread 2
    maxconn {maxconn}
    log stdout format raw local0
    ssl-default-bind-options ssl-min-ver TLSv1.2
defaults
    mode http
    log global
    option httplog
    option forwardfor
    option http-no-delay
    http-reuse safe
    timeout connect 5s
    timeout client 60s
    timeout server 300s
    timeout http-keep-alive 60s
frontend fe
    bind 127.0.0.1:{plain}
    bind 127.0.0.1:{secure} ssl crt {work}/haproxy.pem alpn http/1.1
    default_backend be
backend be
    server b1 127.0.0.1:{backend}
"""


def start_haproxy(s: Setup, cert: Path, key: Path) -> None:
    plain, secure = free_port(), free_port()
    # HAProxy takes the certificate and its key from one file.
    (s.work / "haproxy.pem").write_text(cert.read_text() + key.read_text())
    conf = s.work / "haproxy.cfg"
    # HAProxy refuses to start when it cannot raise its descriptor limit to about 2 per connection (client and
    # server side): 20,000 connections where that allows, fewer under a lower hard limit (wrk opens 32).
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    maxconn = 20000 if limit == resource.RLIM_INFINITY else min(20000, (limit - 200) // 2)
    conf.write_text(HAPROXY_CONF.format(work=s.work, backend=s.backend_port, plain=plain, secure=secure,
                                        maxconn=maxconn))
    run(["haproxy", "-c", "-q", "-f", str(conf)], cwd=s.work)  # a refused configuration says why, here
    s.procs["haproxy"] = start(["haproxy", "-db", "-f", str(conf)], s.work / "haproxy.log", s.work)
    wait_port(plain, s.procs["haproxy"])
    wait_port(secure, s.procs["haproxy"])
    s.paths["haproxy-http"] = Path_("haproxy-http", plain)
    s.paths["haproxy-https"] = Path_("haproxy-https", secure, tls=True)


SSHD_CONF = """
Port {port}
ListenAddress 127.0.0.1
HostKey {work}/ssh_host_key
AuthorizedKeysFile {work}/authorized_keys
PidFile {work}/sshd.pid
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
AllowTcpForwarding yes
LogLevel ERROR
"""


# Reference relays that do nothing but copy bytes: what the hops of a path cost before any work is done in them.
# "relay x2 (socat)" has the shape of `ssh -R` (sshd + ssh), "relay x3 (socat)" the shape of the overlay (tunnel,
# controller, gateway); "relay x3 (NIO)" is three plain SwiftNIO relays (`ils-bench relay`: no TLS, no HTTP/2, no
# records), "relay x2 (NIO)" two of them (the app's path's shape, beside it in the app section), and "relay x1 (NIO)"
# the least a proxy on SwiftNIO costs per request (it parses nothing), on one event loop and on two (one per core,
# as nginx's workers). Each entry: (kind, hops, event loops per NIO relay).
FLOORS = {"relay x2 (socat)": ("socat", 2, 0), "relay x3 (socat)": ("socat", 3, 0), "relay x2 (NIO)": ("nio", 2, 1),
          "relay x3 (NIO)": ("nio", 3, 1), "relay x1 (NIO)": ("nio", 1, 1), "relay x1 (NIO, 2 loops)": ("nio", 1, 2)}
FLOOR_RPS = ("relay x1 (NIO)", "relay x1 (NIO, 2 loops)")


def start_floors(s: Setup) -> None:
    for name, (kind, hops, loops) in FLOORS.items():
        target = s.backend_port
        for hop in range(hops):
            port = free_port()
            if kind == "socat":
                args = ["socat", f"TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork,nodelay",
                        f"TCP:127.0.0.1:{target},nodelay"]
            else:
                args = [str(s.bench), "relay", "--port", str(port), "--target", str(target),
                        "--threads", str(loops)]
            proc = start(args, s.work / f"floor-{kind}-{hops}-{loops}-{hop}.log", s.work)
            wait_port(port, proc)
            s.procs[f"{name} #{hop}"] = proc
            target = port
        s.paths[name] = Path_(name, target)


def start_ssh(s: Setup) -> str:
    ssh_port, forward_port = free_port(), free_port()
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)
    for name in ("ssh_host_key", "ssh_user_key"):
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(s.work / name)], cwd=s.work)
    shutil.copy(s.work / "ssh_user_key.pub", s.work / "authorized_keys")
    (s.work / "sshd_config").write_text(SSHD_CONF.format(port=ssh_port, work=s.work))
    s.procs["sshd"] = start(["/usr/sbin/sshd", "-D", "-e", "-f", str(s.work / "sshd_config")], s.work / "sshd.log", s.work)
    wait_port(ssh_port, s.procs["sshd"])
    s.procs["ssh"] = start(
        [
            "ssh", "-N", "-T", "-i", str(s.work / "ssh_user_key"), "-p", str(ssh_port),
            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
            "-o", "ExitOnForwardFailure=yes", "-R", f"127.0.0.1:{forward_port}:127.0.0.1:{s.backend_port}",
            f"{os.environ.get('USER', 'root')}@127.0.0.1",
        ],
        s.work / "ssh.log",
        s.work,
    )
    wait_port(forward_port, s.procs["ssh"])
    s.paths["ssh -R"] = Path_("ssh -R", forward_port)
    version = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
    return version


# ---------------------------------------------------------------------------------------------------------------------
# Measurements


def curl_base(p: Path_) -> list[str]:
    return ["curl", "-sS", "--fail", "--http1.1"] + (["-k"] if p.tls else [])


def download(p: Path_, size: int) -> float:
    """MiB/s for one GET of `size` bytes, timed by curl from request to last byte."""
    out = run(curl_base(p) + ["-o", "/dev/null", "-w", "%{size_download} %{time_total}", f"{p.url}/bytes/{size}"],
              cwd=ROOT, timeout=600)
    got, seconds = out.split()
    if int(got) != size:
        raise RuntimeError(f"{p.name}: downloaded {got} of {size} bytes")
    return size / MIB / float(seconds)


def upload(p: Path_, source: Path, size: int) -> float:
    """MiB/s for one PUT of `size` bytes; the backend's byte count is checked."""
    # No `Expect: 100-continue`: curl would wait a second for a 100 that a backend reached straight (direct,
    # ssh -R) never sends, and that proxies answer themselves.
    out = run(curl_base(p) + ["-H", "Expect:", "-T", str(source), "-w", " %{time_total}", f"{p.url}/upload"],
              cwd=ROOT, timeout=600)
    counted, seconds = out.split()
    if int(counted) != size:
        raise RuntimeError(f"{p.name}: backend counted {counted} of {size} bytes")
    return size / MIB / float(seconds)


def open_keepalive(p: Path_) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", p.port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if p.tls:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        sock = context.wrap_socket(sock)
    return sock


def latency(p: Path_, count: int, warmup: int = 200, gap: float = 0.0005) -> dict:
    """Sequential keep-alive requests for 1 KiB, each timed from its send to its last byte, 0.5 ms apart. A server
    that ends a connection after N requests (nginx: 1,000) says `Connection: close`; the next request then goes on a
    new connection, opened outside the timing."""
    sock = open_keepalive(p)
    request = b"GET /small HTTP/1.1\r\nHost: bench\r\n\r\n"
    samples: list[float] = []
    buf = b""
    gc.disable()
    try:
        for index in range(warmup + count):
            began = time.perf_counter_ns()
            sock.sendall(request)
            while b"\r\n\r\n" not in buf:
                buf += recv_some(sock, p.name)
            head, _, rest = buf.partition(b"\r\n\r\n")
            length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))
            while len(rest) < length:
                rest += recv_some(sock, p.name)
            buf = rest[length:]
            elapsed = (time.perf_counter_ns() - began) / 1000
            if index >= warmup:
                samples.append(elapsed)
            if re.search(rb"(?i)\r\nconnection:\s*close", head):
                sock.close()
                sock = open_keepalive(p)
                buf = b""
            time.sleep(gap)
    finally:
        gc.enable()
        sock.close()
    samples.sort()
    pick = lambda q: samples[min(len(samples) - 1, max(0, int(q / 100 * len(samples) + 0.999999) - 1))]
    return {"p50_us": pick(50), "p99_us": pick(99), "max_us": samples[-1], "count": count}


def recv_some(sock: socket.socket, name: str) -> bytes:
    data = sock.recv(65536)
    if not data:
        raise RuntimeError(f"{name}: the connection closed in the middle of the latency run")
    return data


def wrk(p: Path_, seconds: int, connections: int, close: bool) -> tuple[float, int]:
    """Requests/s and the number of requests wrk completed."""
    args = ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--timeout", "5s"]
    if close:
        args += ["-H", "Connection: close"]
    out = run(args + [f"{p.url}/small"], cwd=ROOT, timeout=seconds + 60)
    errors = re.search(r"Socket errors: (.*)", out)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if non2xx:
        raise RuntimeError(f"{p.name}: wrk saw {non2xx.group(1)} non-2xx responses:\n{out}")
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    count = int(re.search(r"(\d+) requests in", out).group(1))
    if errors and not close:
        print(f"   note: wrk on {p.name}: socket errors {errors.group(1)}", file=sys.stderr)
    return rate, count


def server_pids(s: Setup, name: str) -> list[int]:
    """The processes that do a path's work, without the backend (every path has it) and the client: what the path
    itself costs. Direct has none."""
    names = {
        "overlay": ["tunnel", "controller", "gateway"],
        "ssh -R": ["sshd", "ssh"],
        "nginx-http": ["nginx"], "nginx-https": ["nginx"],
        "haproxy-http": ["haproxy"], "haproxy-https": ["haproxy"],
        "ils-http": ["ils-http"], "ils-https": ["ils-https"],
    }.get(name, [key for key in s.procs if key.startswith(f"{name} #")])  # a floor's relays
    return with_descendants([s.procs[key].pid for key in names])


def rps_with_cpu(s: Setup, p: Path_, seconds: int) -> tuple[float, dict]:
    """wrk's keep-alive requests/s, and the CPU time and context switches the path's processes (and, apart, the
    backend's) spent on them, per request. Requests/s alone hides how much of the shared cores a path took to get
    there; per request, the figure is comparable across paths and machines."""
    pids = server_pids(s, p.name)
    backend = [s.procs["backend"].pid]
    before, backend_before = usage(pids), usage(backend)
    rate, count = wrk(p, seconds, 32, close=False)
    # A process started during the run counts from its start (a socat relay forks one per connection, say).
    pids = sorted(set(pids) | set(server_pids(s, p.name)))
    after, backend_after = usage(pids), usage(backend)
    per = lambda a, b, scale: (a - b) * scale / count if count else None  # noqa: E731
    return rate, {
        "requests": count,
        "processes": len(pids),
        "cpu_us_per_request": per(after[0], before[0], 1e6) if pids else None,
        "ctx_switches_per_request": per(after[1], before[1], 1) if pids else None,
        "backend_cpu_us_per_request": per(backend_after[0], backend_before[0], 1e6),
        "backend_ctx_switches_per_request": per(backend_after[1], backend_before[1], 1),
    }


def load(s: Setup, target: str, mode: str, *extra: str, timeout: float = 900) -> dict:
    """One `ils-bench load` run (the Swift client: ILSClient in process for `overlay:…`, plain NIO over TCP)."""
    return json.loads(run([str(s.bench), "load", target, "--mode", mode, *extra], cwd=s.work, timeout=timeout))


APP_SERVICE = "claude-api"


def app_path(s: Setup, args: argparse.Namespace, floors: bool) -> dict:
    """The app's own path: requests dialled through ILSClient's `OverlayDialer` in the client's own process, as an
    app that links the library does (no tunnel: two relays, the controller and the gateway, as `ssh -R` has sshd and
    ssh). The same Swift client drives direct, ssh -R and the socat floors over TCP, so "added" is each path's p50
    minus this client's own direct p50, and the client's cost cancels. Measured on one keep-alive circuit, and with a
    circuit per request, which is what `OverlayClient.stream` (and URLSession through it) does today."""
    enroll(s, "bench-app", "device")
    targets = {
        "direct": f"tcp:{s.backend_port}",
        "ssh -R": f"tcp:{s.paths['ssh -R'].port}",
        "app": f"overlay:{s.work / 'identities' / 'bench-app.json'}:{APP_SERVICE}",
    }
    if floors:
        targets.update({name: f"tcp:{s.paths[name].port}"
                        for name in ("relay x2 (socat)", "relay x3 (socat)", "relay x2 (NIO)")})
    rows: dict = {name: {} for name in targets}
    count = str(args.latency_count)
    for name, target in targets.items():
        rows[name]["latency"] = load(s, target, "latency", "--count", count)
        rows[name]["latency_new_connection"] = load(
            s, target, "latency", "--count", str(max(200, args.latency_count // 3)), "--warmup", "50",
            "--connection-per-request",
        )
        print(f"   {name}: p50 {rows[name]['latency']['p50Microseconds']:.0f} us keep-alive, "
              f"{rows[name]['latency_new_connection']['p50Microseconds']:.0f} us with a new connection each",
              flush=True)
    for name in ("direct", "ssh -R", "app"):
        rows[name]["rps"] = load(s, targets[name], "rps", "--seconds", str(args.seconds), "--connections", "32")
        print(f"   {name}: {rows[name]['rps']['requestsPerSecond']:.0f} requests/s", flush=True)
    # Transfers in rounds over the paths, medians, as for the main table.
    samples: dict = {name: {"download": [], "upload": []} for name in ("direct", "ssh -R", "app")}
    for _ in range(args.transfers):
        for name in samples:
            for mode in ("download", "upload"):
                result = load(s, targets[name], mode, "--size-mib", str(args.size_mib))
                samples[name][mode].append(result["mibPerSecond"])
    for name, modes in samples.items():
        for mode, values in modes.items():
            rows[name][f"{mode}_mib_s"] = statistics.median(values)
            rows[name][f"{mode}_samples_mib_s"] = [round(v, 1) for v in values]
        print(f"   {name}: download {rows[name]['download_mib_s']:.0f} MiB/s, "
              f"upload {rows[name]['upload_mib_s']:.0f} MiB/s (medians)", flush=True)
    return rows


def slope(points: list[tuple[int, int]]) -> float:
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    num = sum((x - mean_x) * (y - mean_y) for x, y in points)
    den = sum((x - mean_x) ** 2 for x, _ in points)
    return num / den if den else float("nan")


def sse_memory(s: Setup, streams: int, measure: int) -> dict:
    """Holds `streams` idle SSE streams through the overlay in 4 steps; fits resident KiB per stream in each process."""
    watched = {name: s.procs[name].pid for name in ("tunnel", "controller", "gateway")}
    samples: dict[str, list[tuple[int, int]]] = {name: [(0, rss_kib(pid))] for name, pid in watched.items()}
    steps = [streams * k // 4 for k in (1, 2, 3, 4)]
    proc = subprocess.Popen(
        [
            str(s.bench), "sse", "--port", str(s.paths["overlay"].port), "--steps", ",".join(map(str, steps)),
            "--hold", "3", "--measure", str(measure), "--batch", "250",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    PROCESSES.append(proc)
    result = None
    for line in proc.stdout:
        if line.startswith("STEP"):
            count = int(line.split()[1])
            time.sleep(1.5)  # let the step settle; the client holds it for 3 s
            for name, pid in watched.items():
                samples[name].append((count, rss_kib(pid)))
            print(f"   {count} streams open after {line.split()[2]} s: "
                  + ", ".join(f"{n} {samples[n][-1][1] / 1024:.0f} MiB" for n in watched), flush=True)
        elif line.startswith("{"):
            result = json.loads(line)
    proc.wait(timeout=60)
    if result is None:
        raise RuntimeError(f"ils-bench sse failed: {proc.stderr.read()[-2000:]}")
    result["kib_per_stream"] = {name: slope(points) for name, points in samples.items()}
    result["rss_samples_kib"] = samples
    return result


def open_sse(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"GET /sse?interval_ms=100 HTTP/1.1\r\nHost: bench\r\n\r\n")
    data = b""
    while b"data: " not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise RuntimeError("SSE stream closed before its first event")
        data += chunk
    return sock


def revocation(s: Setup, trials: int, pin_to: list[int] | None = None, admin: str = "identities/admin.json") -> dict:
    """Per trial: a new device, enrolled, with its own tunnel and a live SSE stream; revoke it and time the close.
    With `pin_to`, the device's identity file lists only those controller ports (a stream on one controller, the
    revocation through `admin`'s, another)."""
    after_return, after_start, enrollments = [], [], []
    for trial in range(trials):
        name = f"revoke-{trial}"
        enrollments.append(enroll(s, name, "device"))
        if pin_to:
            pin(s, name, pin_to)
        port = free_port()
        tunnel = start_tunnel(s, name, port)
        sock = open_sse(port)
        sock.settimeout(10)
        closed_at: list[float] = []

        def reader() -> None:
            try:
                while sock.recv(65536):
                    pass
            except OSError:
                pass
            closed_at.append(time.perf_counter())

        thread = threading.Thread(target=reader)
        thread.start()
        began = time.perf_counter()
        s.ils("admin", "identity", "revoke", "--identity", admin, name)
        returned = time.perf_counter()
        thread.join(timeout=10)
        sock.close()
        tunnel.terminate()
        tunnel.wait(timeout=10)
        if not closed_at or closed_at[0] - began > 9:
            raise RuntimeError(f"trial {trial}: the revoked device's stream did not close")
        after_return.append((closed_at[0] - returned) * 1000)
        after_start.append((closed_at[0] - began) * 1000)
    return {
        "after_return_ms": percentiles(after_return),
        "after_start_ms": percentiles(after_start),
        "enroll_ms": percentiles([e * 1000 for e in enrollments]),
        "enroll_ms_each": [round(e * 1000, 1) for e in enrollments],
        "trials": trials,
    }


def percentiles(values: list[float]) -> dict:
    values = sorted(values)
    pick = lambda q: values[min(len(values) - 1, max(0, int(q / 100 * len(values) + 0.999999) - 1))]
    return {"p50": pick(50), "p99": pick(99), "min": values[0], "max": values[-1]}


def controller_restart(s: Setup, trials: int) -> dict:
    """Stops the controller (SIGTERM), starts it again, and times from its port accepting to a request through the
    same tunnel and gateway succeeding."""
    recovery = []
    port = s.paths["overlay"].port
    for _ in range(trials):
        proc = s.procs["controller"]
        proc.terminate()
        proc.wait(timeout=30)
        time.sleep(0.5)
        start_controller(s, fresh=False)
        back = time.monotonic()
        ok = wait_for_overlay(port, timeout=30)
        recovery.append((ok - back) * 1000)
        time.sleep(0.5)
    return percentiles(recovery)


# ---------------------------------------------------------------------------------------------------------------------
# Several controllers on one PostgreSQL (issue 25)


def pin(s: Setup, name: str, ports: list[int]) -> None:
    """Rewrites identity `name`'s file so that it dials only the controllers on `ports`, in that order."""
    path = s.work / "identities" / f"{name}.json"
    data = json.loads(path.read_text())
    addresses = [f"https://127.0.0.1:{port}" for port in ports]
    data["controller"], data["controllers"] = addresses[0], addresses
    path.write_text(json.dumps(data, indent=2))


def start_cluster_controller(c: Setup, name: str, port: int, store: str) -> subprocess.Popen:
    """`controller run --store URL` for controller `name` (A or B); PGPASSWORD comes from this process's environment."""
    proc = start(
        [str(c.bin), "controller", "run", "--state-dir", f"state-{name}", "--store", store,
         "--listen", f"127.0.0.1:{port}", *BENCH_CIRCUIT_CAPS],
        c.work / f"controller-{name}.log",
        c.work,
    )
    wait_port(port, proc)
    c.procs["controller" if name == "A" else f"controller-{name}"] = proc
    return proc


def gateway_links(c: Setup, port: int) -> int:
    """How many times the cluster's gateway has logged a link to the controller on `port`."""
    needle = f"controller=https://127.0.0.1:{port}"
    text = (c.work / "gateway.log").read_text(errors="replace")
    return sum(1 for line in text.splitlines() if "connected to controller" in line and needle in line)


def wait_gateway_linked(c: Setup, port: int, more_than: int = 0, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gateway_links(c, port) > more_than:
            return
        time.sleep(0.02)
    raise RuntimeError(f"the cluster's gateway did not link to the controller on port {port} within {timeout:.0f} s")


def start_cluster(s: Setup, store: str, a_port: int, b_port: int) -> Setup:
    """Controller A (`controller init --store`), replica B (`controller join`), both on `store`; a gateway enrolled
    through A that learns the list and links to both; a device pinned to A alone (the PostgreSQL overlay path)."""
    c = Setup(work=s.work / "cluster", bin=s.bin, bench=s.bench, backend_port=s.backend_port)
    c.work.mkdir()
    c.controller_port = a_port
    c.ils("controller", "init", "--state-dir", "state-A", "--address", f"https://127.0.0.1:{a_port}", "--store", store)
    start_cluster_controller(c, "A", a_port, store)
    c.ils("controller", "join", "--identity", "identities/admin.json", "--address", f"https://127.0.0.1:{b_port}",
          "--state-dir", "state-B")
    start_cluster_controller(c, "B", b_port, store)
    start_gateway(c)
    wait_gateway_linked(c, a_port)
    wait_gateway_linked(c, b_port)
    enroll(c, "pg-device", "device")
    pin(c, "pg-device", [a_port])
    port = free_port()
    c.procs["tunnel"] = start_tunnel(c, "pg-device", port)
    c.paths["overlay"] = Path_("overlay on PostgreSQL", port)
    wait_for_overlay(port, timeout=20)
    return c


def failover(c: Setup, a_port: int, b_port: int, store: str, trials: int) -> dict:
    """Per trial: a fresh tunnel for a device listing A then B, flowing through A; SIGKILL A; the time from the kill to
    the first request answered through the same tunnel (now through B). A is started again between trials."""
    enroll(c, "failover-device", "device")
    pin(c, "failover-device", [a_port, b_port])
    times = []
    for trial in range(trials):
        port = free_port()
        tunnel = start_tunnel(c, "failover-device", port)
        wait_for_overlay(port, timeout=30)
        links = gateway_links(c, a_port)
        killed = time.monotonic()
        c.procs["controller"].send_signal(signal.SIGKILL)
        ok = wait_for_overlay(port, timeout=30)
        times.append((ok - killed) * 1000)
        print(f"   trial {trial + 1}: first answer through B {times[-1]:.0f} ms after SIGKILL of A", flush=True)
        tunnel.terminate()
        tunnel.wait(timeout=10)
        c.procs["controller"].wait(timeout=10)
        start_cluster_controller(c, "A", a_port, store)
        wait_gateway_linked(c, a_port, more_than=links)
    return {**percentiles(times), "trials": trials, "each_ms": [round(t, 1) for t in times]}


def start_postgres():
    """A real PostgreSQL server in a temporary directory, as the e2e tests start it (`pg_fixture`); returns it and its
    version's name. PGPASSWORD is set for every controller command this process runs."""
    sys.path.insert(0, str(ROOT / "Tests" / "e2e"))
    import pg_fixture  # noqa: E402

    bin_dir = pg_fixture.binaries()
    if bin_dir is None:
        raise RuntimeError("PostgreSQL is not installed (no /usr/lib/postgresql/*/bin): run deploy/install-deps.sh")
    pg = pg_fixture.TestPostgres(bin_dir)
    atexit.register(pg.stop)
    os.environ["PGPASSWORD"] = pg_fixture.PASSWORD
    return pg, bin_dir.parent.name


def stop_setup(c: Setup) -> None:
    """Stops every process of set-up `c` (SIGTERM, then waits)."""
    for proc in c.procs.values():
        proc.terminate()
    for proc in c.procs.values():
        proc.wait(timeout=30)


def resumption_figures(s: Setup, args: argparse.Namespace) -> dict:
    """Issue 38's rows (deploy/bench/resume.py): suite 5's overhead beside suite 4, resume times over path switches,
    and after SIGKILL of the relaying controller of two on one PostgreSQL."""
    sys.path.insert(0, str(Path(__file__).parent))
    import resume  # noqa: E402

    this = sys.modules[__name__]
    out: dict = {}
    print("   overhead: suite 5 (resumable) beside suite 4, alternating rounds", flush=True)
    out["overhead"] = resume.overhead(this, s, args)
    print(f"   {args.switches} path switches (wifi → cell), each of a fresh device in a network namespace", flush=True)
    out["switches"] = resume.path_switches(this, s, args.switches)
    print(f"   {args.held_circuits} held circuits whose backend answers go on (a gateway of its own)", flush=True)
    out["held_memory"] = resume.held_memory(this, s, args.held_circuits)
    print(f"   {args.restarts * 2} SIGKILLs of the relaying controller (two on PostgreSQL)", flush=True)
    pg, version = start_postgres()
    try:
        store = pg.create_database()
        a_port, b_port = free_port(), free_port()
        c = start_cluster(s, store, a_port, b_port)
        out["controller_kill"] = resume.controller_kills(this, c, a_port, b_port, store, args.restarts * 2)
        stop_setup(c)
    finally:
        pg.stop()
    out["postgres"] = version
    out["date"] = time.strftime("%Y-%m-%d")
    return out


def cluster_figures(s: Setup, args: argparse.Namespace) -> dict:
    """Issue 25's rows, in one run: revocation through A of a stream on B, failover after SIGKILL, and the same
    overlay on SQLite (the main set-up) and on PostgreSQL (controller A of the cluster) for latency, new circuits/s
    and idle-stream memory."""
    pg, version = start_postgres()
    out: dict = {"postgres": version}
    try:
        store = pg.create_database()
        a_port, b_port = free_port(), free_port()
        c = start_cluster(s, store, a_port, b_port)
        direct, sqlite, postgres = s.paths["direct"], s.paths["overlay"], c.paths["overlay"]

        # Latency in two rounds, in opposite orders, so a slow moment of the machine lands on both stores alike.
        rounds: dict[str, list[dict]] = {"direct": [], "sqlite": [], "postgres": []}
        for order in (("sqlite", "postgres"), ("postgres", "sqlite")):
            rounds["direct"].append(latency(direct, args.latency_count))
            for name in order:
                rounds[name].append(latency(sqlite if name == "sqlite" else postgres, args.latency_count))
        out["latency"] = {
            name: {key: statistics.mean(r[key] for r in runs) for key in ("p50_us", "p99_us")}
            for name, runs in rounds.items()
        }
        for name in ("sqlite", "postgres"):
            print(f"   relay latency on {name}: p50 {out['latency'][name]['p50_us']:.0f} us, "
                  f"p99 {out['latency'][name]['p99_us']:.0f} us (direct p50 {out['latency']['direct']['p50_us']:.0f})",
                  flush=True)

        out["new_circuits_s"] = {
            "sqlite": wrk(sqlite, args.seconds, 32, close=True)[0],
            "postgres": wrk(postgres, args.seconds, 32, close=True)[0],
        }
        print(f"   new circuits/s: {json.dumps(out['new_circuits_s'])}", flush=True)

        out["sse"] = {}
        for name, setup in (("sqlite", s), ("postgres", c)):
            print(f"   {args.streams} idle SSE streams on {name} (after {settle(setup):.1f} s idle wait)", flush=True)
            sse = sse_memory(setup, args.streams, measure=10)
            out["sse"][name] = {"kib_per_stream": sse["kib_per_stream"], "p99_us": sse["p99_us"],
                                "closed_early": sse["closed_early"]}

        print(f"   revocation through A of a stream on B, {args.revocations} trials "
              f"(after {settle(c):.1f} s idle wait)", flush=True)
        out["revocation"] = revocation(c, args.revocations, pin_to=[b_port])
        print(f"   {json.dumps(out['revocation']['after_return_ms'])}", flush=True)

        print(f"   failover, {args.restarts} trials", flush=True)
        out["failover_ms"] = failover(c, a_port, b_port, store, args.restarts)
        stop_setup(c)
    finally:
        pg.stop()
    return out


# ---------------------------------------------------------------------------------------------------------------------
# Report


def machine() -> dict:
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    versions = {}
    for name, args in {
        "swift": ["swift", "--version"],
        "nginx": ["nginx", "-v"],
        "haproxy": ["haproxy", "-v"],
        "ssh": ["ssh", "-V"],
        "curl": ["curl", "--version"],
        "wrk": ["wrk", "--version"],
    }.items():
        try:
            done = subprocess.run(args, capture_output=True, text=True, timeout=20)
            versions[name] = (done.stdout + done.stderr).strip().splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            versions[name] = "not found"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "versions": versions,
    }


def carry_over(results: dict, previous: dict, only: set[str]) -> dict:
    """What a run writes, given the figures already in the JSON file: a run of `cluster` alone replaces only the
    cluster's section (its rows compare within themselves: SQLite and PostgreSQL, A and B, in that run), and so do
    `resume` and `mobile`; every run keeps the `handshake` section, which `ils-bench handshake` measures apart (the page
    says when)."""
    if only and only <= {"cluster", "resume", "mobile", "held", "bulk", "stall"} and previous:
        return {**previous, **{name: results[name] for name in only}}
    if "handshake" in previous:
        return {**results, "handshake": previous["handshake"]}
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", required=True, help="release ils-gateway binary")
    parser.add_argument("--bench", required=True, help="release ils-bench binary")
    parser.add_argument("--size-mib", type=int, default=512, help="bulk transfer size (default 512)")
    parser.add_argument("--transfers", type=int, default=3,
                        help="downloads and uploads per path, in rounds over all paths; the median counts (default 3)")
    parser.add_argument("--streams", type=int, default=10000, help="idle SSE streams (default 10000)")
    parser.add_argument("--seconds", type=int, default=8, help="duration of each wrk run (default 8)")
    parser.add_argument("--latency-count", type=int, default=3000)
    parser.add_argument("--revocations", type=int, default=20)
    parser.add_argument("--restarts", type=int, default=3)
    parser.add_argument("--switches", type=int, default=20, help="path switches for the resume times (default 20)")
    parser.add_argument("--held-circuits", type=int, default=1000, help="held circuits for the memory figure (default 1000)")
    parser.add_argument("--bulk-mib", type=int, default=128, help="size of each bulk transfer of --only bulk (default 128)")
    parser.add_argument("--bulk-rounds", type=int, default=5, help="rounds of the bulk comparison (default 5)")
    parser.add_argument("--mobile-samples", type=int, default=20,
                        help="samples per path and case on the mobile link, for its p50 and p90 (default 20)")
    parser.add_argument("--only", default="", help="comma-separated measurements to run: throughput, latency, rps, circuits, app, sse, "
                        "revocation, restart, floors, cluster, resume, held, stall, bulk, mobile (default all). A run of cluster, resume, held, "
                        "stall, bulk or "
                        "mobile alone "
                        "keeps the other figures of --json and adds its own")
    parser.add_argument("--json", default=str(ROOT / "docs" / "benchmarks.json"))
    parser.add_argument("--markdown", default=str(ROOT / "docs" / "benchmarks.md"))
    args = parser.parse_args()
    only = set(filter(None, args.only.split(",")))
    want = lambda name: not only or name in only

    raise_fd_limit()
    work = Path(tempfile.mkdtemp(prefix="ils-bench-"))
    print(f"== working in {work}", flush=True)
    s = Setup(work=work, bin=Path(args.bin).resolve(), bench=Path(args.bench).resolve())
    started = time.monotonic()
    results: dict = {"machine": machine(), "config": vars(args), "date": time.strftime("%Y-%m-%d"), "paths": {}}

    start_backend(s)
    cert, key = make_tls_cert(s)
    start_overlay(s)
    order = ["direct", "overlay", "ssh -R", "ils-http", "nginx-http", "haproxy-http", "ils-https", "nginx-https",
             "haproxy-https"]
    # The other paths only for the measurements that compare them (a run of cluster or resume alone needs none).
    if want("bulk") and only and only <= {"bulk", "cluster", "resume", "mobile", "held", "stall"}:
        results["machine"]["versions"]["ssh"] = start_ssh(s)  # bulk compares the overlay with ssh -R alone
    if any(want(name) for name in ("throughput", "latency", "rps", "circuits", "floors", "app", "sse", "revocation",
                                   "restart")):
        results["machine"]["versions"]["ssh"] = start_ssh(s)
        start_http_mode(s, cert, key)
        start_nginx(s, cert, key)
        start_haproxy(s, cert, key)
    else:
        order = []
    if want("floors"):
        start_floors(s)

    size = args.size_mib * MIB
    source = Path("/dev/shm") / f"ils-bench-upload-{os.getpid()}.bin"
    if want("throughput"):
        with source.open("wb") as out:
            out.truncate(size)
        atexit.register(lambda: source.unlink(missing_ok=True))

    # Throughput in rounds over all paths, so a slow moment of the shared machine lands on every path alike; the
    # median of each path's transfers counts (one transfer per path swung the overlay ÷ ssh -R ratio by ±10 %).
    samples: dict[str, dict[str, list[float]]] = {name: {"download": [], "upload": []} for name in order}
    if want("throughput"):
        for round_ in range(args.transfers):
            print(f"== throughput round {round_ + 1} of {args.transfers}", flush=True)
            for name in order:
                p = s.paths[name]
                samples[name]["download"].append(download(p, size))
                samples[name]["upload"].append(upload(p, source, size))
                print(f"   {name}: download {samples[name]['download'][-1]:.0f} MiB/s, "
                      f"upload {samples[name]['upload'][-1]:.0f} MiB/s", flush=True)

    for name in order + (list(FLOORS) if want("floors") else []):
        p = s.paths[name]
        floor = name in FLOORS
        row: dict = {}
        print(f"== {name} ({p.url})", flush=True)
        # Floors are measured on the paths' terms, but only for latency (and requests/s for the single NIO relay).
        if want("throughput") and not floor:
            row["download_mib_s"] = statistics.median(samples[name]["download"])
            row["upload_mib_s"] = statistics.median(samples[name]["upload"])
            row["download_samples_mib_s"] = [round(v, 1) for v in samples[name]["download"]]
            row["upload_samples_mib_s"] = [round(v, 1) for v in samples[name]["upload"]]
            print(f"   download {row['download_mib_s']:.0f} MiB/s, upload {row['upload_mib_s']:.0f} MiB/s (medians)",
                  flush=True)
        if floor or want("latency"):
            row["latency"] = latency(p, args.latency_count)
            print(f"   latency p50 {row['latency']['p50_us']:.0f} us, p99 {row['latency']['p99_us']:.0f} us", flush=True)
        if (name in FLOOR_RPS) if floor else want("rps"):
            row["rps"], row["rps_cpu"] = rps_with_cpu(s, p, args.seconds)
            cpu = row["rps_cpu"]
            print(f"   {row['rps']:.0f} requests/s (32 keep-alive connections); per request: "
                  f"{cpu['cpu_us_per_request'] or 0:.1f} us CPU and {cpu['ctx_switches_per_request'] or 0:.2f} context "
                  f"switches in {cpu['processes']} processes, backend {cpu['backend_cpu_us_per_request']:.1f} us",
                  flush=True)
        if want("circuits") and name in ("direct", "overlay", "ssh -R"):
            row["new_connections_s"] = wrk(p, args.seconds, 32, close=True)[0]
            print(f"   {row['new_connections_s']:.0f} new connections/s", flush=True)
        results.setdefault("floors" if floor else "paths", {})[name] = row

    if want("app"):
        print("== the app's own path (ILSClient in process, no tunnel) and the same Swift client on TCP", flush=True)
        results["app"] = app_path(s, args, floors=want("floors"))

    if want("sse"):
        print(f"== {args.streams} idle SSE streams through the overlay", flush=True)
        results["sse"] = sse_memory(s, args.streams, measure=10)
        print(f"   {json.dumps(results['sse']['kib_per_stream'])} KiB/stream; "
              f"delivery p99 {results['sse']['p99_us'] / 1000:.1f} ms", flush=True)
    if want("revocation"):
        print(f"== revocation, {args.revocations} trials (after {settle(s):.1f} s for the processes to go idle)",
              flush=True)
        results["revocation"] = revocation(s, args.revocations)
        print(f"   {json.dumps(results['revocation'])}", flush=True)
    if want("restart"):
        print(f"== controller restart, {args.restarts} trials (after {settle(s):.1f} s idle wait)", flush=True)
        results["restart_ms"] = controller_restart(s, args.restarts)
        print(f"   {json.dumps(results['restart_ms'])}", flush=True)

    if want("cluster"):
        print(f"== two controllers on one PostgreSQL (after {settle(s):.1f} s idle wait)", flush=True)
        results["cluster"] = cluster_figures(s, args)
        results["cluster"]["date"] = time.strftime("%Y-%m-%d")

    if want("resume"):
        print(f"== circuit resumption (after {settle(s):.1f} s idle wait)", flush=True)
        results["resume"] = resumption_figures(s, args)

    if want("held"):
        print(f"== held circuits against a hard total (after {settle(s):.1f} s idle wait)", flush=True)
        sys.path.insert(0, str(Path(__file__).parent))
        import resume  # noqa: E402

        results["held"] = {"date": results.get("date"), "runs": [
            resume.held_memory(sys.modules[__name__], s, 400, total_mib=32, grace_s=20, stop_acking_s=stop,
                               name=f"held-{stop}")
            for stop in (0, 40)]}

    if want("stall"):
        print(f"== 80 circuits whose device takes nothing, at the default stall timeout (after {settle(s):.1f} s idle "
              "wait)", flush=True)
        sys.path.insert(0, str(Path(__file__).parent))
        import resume  # noqa: E402

        results["stall"] = {"date": time.strftime("%Y-%m-%d"), **resume.stalled(sys.modules[__name__], s)}

    if want("bulk"):
        print(f"== bulk: suite 5, suite 4 and ssh -R, {args.bulk_mib} MiB both ways, {args.bulk_rounds} rounds "
              f"(after {settle(s):.1f} s idle wait)", flush=True)
        sys.path.insert(0, str(Path(__file__).parent))
        import resume  # noqa: E402

        results["bulk"] = {"date": time.strftime("%Y-%m-%d"),
                           **resume.bulk(sys.modules[__name__], s, args.bulk_rounds, args.bulk_mib)}

    if want("mobile"):
        print(f"== mobile link, 80 ms round trip: {args.mobile_samples} samples per path and case "
              f"(after {settle(s):.1f} s idle wait)", flush=True)
        sys.path.insert(0, str(Path(__file__).parent))
        sys.path.insert(0, str(ROOT / "Tests" / "e2e"))
        import mobile  # noqa: E402
        from test_resumption import NetnsUnavailable  # noqa: E402

        try:
            results["mobile"] = mobile.figures(sys.modules[__name__], s, args.mobile_samples)
        except NetnsUnavailable as e:
            if only:
                raise
            print(f"   skipped: {e}", flush=True)  # a full run goes on without it

    results["duration_s"] = duration = time.monotonic() - started
    stop_all()
    previous = json.loads(Path(args.json).read_text()) if Path(args.json).is_file() else {}
    results = carry_over(results, previous, only)
    Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    sys.path.insert(0, str(Path(__file__).parent))
    from report import load_before, render  # noqa: E402

    Path(args.markdown).write_text(render(results, load_before()))
    print(f"== done in {duration:.0f} s; wrote {args.markdown} and {args.json}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    sys.exit(main())
