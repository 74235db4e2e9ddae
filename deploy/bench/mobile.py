"""Issue 39's mobile-link figures for deploy/bench/run.py (`--only mobile`): time to the first byte of a small answer
(`GET /small`, 1 KiB) from a device behind a link with an 80 ms round trip, and the same with 1 % loss.

The device is a network namespace of its own; its one link to the root namespace delays every packet by 40 ms each
way (and, in the second run, drops each packet with a probability of 1 % in each direction, independently). With
`tc netem` in the kernel, the link is a veth pair with netem on both ends; a kernel built without netem (as some VMs
are) gets the same link from a user-space emulator instead: a TUN device on each side and a process that moves each
packet from one to the other 40 ms after it left, dropping the same share (`python3 mobile.py link`, below). The
report says which one ran.

Everything else (controller, gateway, backend, sshd and `ssh -R`, a TLS front to the backend) runs in the root
namespace and listens on the link's root-side address or on 127.0.0.1; the device's processes run in the namespace
(`ip netns exec`). Per path, three cases, each sample timed inside the process that makes the request (process
start-up is never timed):

- **cold**: no connection open. ILSClient: a new `ils-bench load` process per sample, its first request (controller
  connection, circuit, request). The tunnel: a new tunnel process per sample, with no connection to its controller
  (checked in the namespace's /proc/net/tcp before the request). ssh -R and direct TLS: a new TCP (+TLS) connection.
- **warm**: the first hop's connection open, a new circuit for the request (ILSClient: the request after one on an
  earlier circuit; the tunnel: a new local TCP connection to a tunnel that has served one). ssh -R and direct TLS have
  no first hop apart from the connection itself: none.
- **keep-alive**: the next request on an open circuit (ILSClient: on one `OverlayDialer` circuit, which
  `OverlayClient` itself does not keep: it opens a circuit per exchange) or connection (HTTP keep-alive).

Also runs as a script inside the namespace: `mobile.py probe` (the Python client of the tunnel, ssh -R and direct
TLS) and `mobile.py link` (the user-space link). With ILS_BENCH_LINK_LOG=FILE in the environment, the user-space link
writes a line per TCP packet it carries to FILE (time, direction, ports, flags, payload bytes): where the round trips
of a case go."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import gc
import heapq
import json
import os
import random
import re
import select
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import time
from pathlib import Path

RTT_MS = 80
ONE_WAY_MS = RTT_MS // 2
LOSS = 0.01  # per packet, in each direction
GAP_MS = 100  # between the untimed request and the timed one, and between keep-alive requests
SERVICE = "claude-api"
CASES = ("cold", "warm", "keep-alive")
PATHS = ("ILSClient", "tunnel", "ssh -R", "direct TLS")
REQUEST = b"GET /small HTTP/1.1\r\nHost: bench\r\n\r\n"


# ---------------------------------------------------------------------------------------------------------------------
# The link


class Link:
    """The device's namespace and its one link to this namespace: `host_ip` here, `device_ip` there, 40 ms each way."""

    def __init__(self, run_mod, work: Path) -> None:
        sys.path.insert(0, str(run_mod.ROOT / "Tests" / "e2e"))
        from test_resumption import made_netns  # noqa: E402

        self.run_mod = run_mod
        self.name, tag = made_netns("ils-m")
        octet = 16 + int(tag[:2], 16) % 200
        self.host_ip, self.device_ip = f"10.236.{octet}.1", f"10.236.{octet}.2"
        self.host_if, self.device_if = f"hm{tag}", f"mob{tag}"
        self.kind = ""
        self.emulator: subprocess.Popen | None = None
        self.work = work
        self.loss = 0.0
        self.netem_error = ""
        self.no_netem = ""  # why the user-space link runs instead (tc's words)

    def exec_args(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def open(self) -> None:
        from test_resumption import make_veth  # noqa: E402

        make_veth(self.name, self.host_if, self.device_if, self.host_ip, self.device_ip)
        if self._netem(self.host_if, [], "add") and self._netem(self.device_if, self.exec_args(), "add"):
            self.kind = "netem"
            return
        self.no_netem = self.netem_error
        # No netem in this kernel: the veth pair goes, a TUN pair and the user-space link take its place.
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, timeout=20)
        self.kind = "emulator"
        self.emulator = subprocess.Popen(
            [sys.executable, __file__, "link", "--host-if", self.host_if, "--device-if", self.device_if,
             "--delay-ms", str(ONE_WAY_MS), *(["--log"] if os.environ.get("ILS_BENCH_LINK_LOG") else [])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            stderr=Path(os.environ.get("ILS_BENCH_LINK_LOG") or self.work / "link.log").open("ab"))
        if self.emulator.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the user-space link did not start (see {self.work / 'link.log'})")
        sh = self.run_mod.run
        sh(["ip", "link", "set", self.device_if, "netns", self.name], cwd=self.work)
        sh(["ip", "addr", "add", self.host_ip, "peer", self.device_ip, "dev", self.host_if], cwd=self.work)
        sh(["ip", "link", "set", self.host_if, "up"], cwd=self.work)
        sh(["ip", "-n", self.name, "addr", "add", self.device_ip, "peer", self.host_ip, "dev", self.device_if],
           cwd=self.work)
        sh(["ip", "-n", self.name, "link", "set", self.device_if, "up"], cwd=self.work)

    def _netem(self, dev: str, prefix: list[str], verb: str) -> bool:
        loss = ["loss", f"{self.loss * 100:g}%"] if self.loss else []
        done = subprocess.run([*prefix, "tc", "qdisc", verb, "dev", dev, "root", "netem", "delay", f"{ONE_WAY_MS}ms",
                               *loss], capture_output=True, text=True, timeout=20)
        self.netem_error = done.stderr.strip()
        return done.returncode == 0

    def set_loss(self, loss: float) -> None:
        self.loss = loss
        if self.kind == "netem":
            if not (self._netem(self.host_if, [], "change") and self._netem(self.device_if, self.exec_args(),
                                                                             "change")):
                raise RuntimeError("tc qdisc change (netem loss) failed")
        else:
            self._command(f"loss {loss}")

    def packets(self) -> dict:
        """Packets carried and dropped so far, per direction."""
        if self.kind == "netem":
            out = {}
            for direction, prefix, dev in (("to_device", [], self.host_if),
                                           ("to_host", self.exec_args(), self.device_if)):
                text = subprocess.run([*prefix, "tc", "-s", "qdisc", "show", "dev", dev], capture_output=True,
                                      text=True, timeout=20).stdout
                found = re.search(r"Sent \d+ bytes (\d+) pkt \(dropped (\d+)", text)
                out[direction] = {"sent": int(found.group(1)), "dropped": int(found.group(2))} if found else {}
            return out
        return json.loads(self._command("stats"))

    def _command(self, line: str) -> str:
        assert self.emulator is not None and self.emulator.stdin is not None
        self.emulator.stdin.write(line + "\n")
        self.emulator.stdin.flush()
        return self.emulator.stdout.readline().strip()

    def close(self) -> None:
        if self.emulator is not None:
            with contextlib.suppress(OSError):
                self.emulator.stdin.close()  # it ends; its TUN devices go with it
            try:
                self.emulator.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.emulator.kill()
                self.emulator.wait(timeout=5)
        # Removing the veth pair removes its qdiscs; the namespace goes last.
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, timeout=20)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=20)


TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000


def open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def link_main(args: argparse.Namespace) -> int:
    """The user-space link: each IP packet read from one TUN device is written to the other `--delay-ms` later,
    unless dropped (probability set by `loss P` on stdin, in each direction on its own). `stats` answers the counts
    as JSON; end of stdin ends it (and its TUN devices with it)."""
    host, device = open_tun(args.host_if), open_tun(args.device_if)
    # Woken on time for each packet's departure even while the device's processes keep both cores busy (it blocks in
    # select between packets, so it takes a core only for the moments it forwards).
    realtime = False
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        realtime = True
    delay = args.delay_ms / 1000
    loss = 0.0
    rng = random.Random(39)  # the same drops for the same packets, run after run
    queue: list[tuple[float, int, int, bytes]] = []
    counts = {"to_device": {"sent": 0, "dropped": 0}, "to_host": {"sent": 0, "dropped": 0}, "write_errors": 0,
              "realtime": realtime}
    order = 0
    control = sys.stdin.fileno()
    pending = b""
    print("ready", flush=True)
    while True:
        timeout = max(0.0, queue[0][0] - time.monotonic()) if queue else None
        ready, _, _ = select.select([host, device, control], [], [], timeout)
        for fd in ready:
            if fd == control:
                data = os.read(control, 4096)
                if not data:
                    return 0
                pending += data
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    words = line.decode().split()
                    if words[:1] == ["loss"]:
                        loss = float(words[1])
                        print("ok", flush=True)
                    elif words[:1] == ["stats"]:
                        print(json.dumps(counts), flush=True)
                continue
            packet = os.read(fd, 65536)
            direction = counts["to_device" if fd == host else "to_host"]
            if args.log:
                log_packet(fd == host, packet)
            if loss and rng.random() < loss:
                direction["dropped"] += 1
                continue
            direction["sent"] += 1
            heapq.heappush(queue, (time.monotonic() + delay, order, device if fd == host else host, packet))
            order += 1
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, out, packet = heapq.heappop(queue)
            try:
                os.write(out, packet)
            except OSError:
                counts["write_errors"] += 1


def log_packet(to_device: bool, packet: bytes) -> None:
    """One line on stderr per TCP/IPv4 packet (for a look at where round trips go): time, direction, ports, flags,
    payload length."""
    if len(packet) < 40 or packet[0] >> 4 != 4 or packet[9] != 6:
        return
    ihl = (packet[0] & 15) * 4
    sport, dport = struct.unpack("!HH", packet[ihl:ihl + 4])
    offset = (packet[ihl + 12] >> 4) * 4
    flags = "".join(name for bit, name in ((2, "S"), (16, "."), (8, "P"), (1, "F"), (4, "R")) if packet[ihl + 13] & bit)
    payload = struct.unpack("!H", packet[2:4])[0] - ihl - offset
    print(f"{time.monotonic():.4f} {'>dev' if to_device else '<dev'} {sport}->{dport} {flags} {payload}",
          file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------------
# The device's Python client (runs in the namespace)


def read_response(sock: socket.socket, first: bytes) -> None:
    """Reads the rest of one response whose first bytes are `first` (Content-Length framing, as /small has)."""
    data = first
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError("the connection closed in the middle of a response")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"answer {head[:40]!r}")
    length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError("the connection closed in the middle of a body")
        body += chunk


def tls_context(tls: bool) -> ssl.SSLContext | None:
    """A new client context (made before the timer starts: loading the system's CA store took 30-80 ms here). One per
    connection, and no session passed: a full handshake every time, nothing resumed."""
    if not tls:
        return None
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def connect(host: str, port: int, context: ssl.SSLContext | None) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return context.wrap_socket(sock) if context else sock


def first_byte(sock: socket.socket) -> bytes:
    data = sock.recv(65536)
    if not data:
        raise RuntimeError("the connection closed before the answer")
    return data


def listening(port: int) -> bool:
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
                    return True
    return False


def connections_to(port: int) -> int:
    """Sockets of this namespace connecting or connected to remote port `port` (SYN_SENT, ESTABLISHED: not the
    TIME_WAIT of earlier processes)."""
    found = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if int(fields[2].rsplit(":", 1)[1], 16) == port and fields[3] in ("01", "02"):
                    found += 1
    return found


def probe_main(args: argparse.Namespace) -> int:
    """Timed requests, printed as JSON: `new` times each from before connect() to the answer's first byte (a new
    connection per request; TCP, then TLS if asked); `keepalive` times each from its write to the first byte, on one
    connection that has carried an untimed request first; `connect` times TCP connects alone (the link's round
    trip)."""
    if args.wait_listen:
        deadline = time.monotonic() + args.wait_listen
        while not listening(args.port):
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on port {args.port} after {args.wait_listen} s")
            time.sleep(0.01)
    if args.settle_ms:
        time.sleep(args.settle_ms / 1000)
    out: dict = {}
    if args.idle_port:
        # A cold tunnel must not have dialled its controller already.
        out["connections_before"] = connections_to(args.idle_port)
    samples: list[float] = []
    gc.disable()
    if args.mode == "keepalive":
        sock = connect(args.host, args.port, tls_context(args.tls))
        sock.sendall(REQUEST)
        read_response(sock, first_byte(sock))
        for _ in range(args.count):
            time.sleep(args.gap_ms / 1000)
            began = time.perf_counter()
            sock.sendall(REQUEST)
            data = first_byte(sock)
            samples.append((time.perf_counter() - began) * 1000)
            read_response(sock, data)
        sock.close()
    else:
        for index in range(args.count):
            if index:
                time.sleep(args.gap_ms / 1000)
            context = tls_context(args.tls)
            began = time.perf_counter()
            if args.mode == "connect":
                socket.create_connection((args.host, args.port), timeout=30).close()
                samples.append((time.perf_counter() - began) * 1000)
                continue
            sock = connect(args.host, args.port, context)
            sock.sendall(REQUEST)
            data = first_byte(sock)
            samples.append((time.perf_counter() - began) * 1000)
            if args.tls:
                out["tls_version"] = sock.version()
            read_response(sock, data)
            sock.close()
    out["samples_ms"] = [round(v, 2) for v in samples]
    print(json.dumps(out))
    return 0


# ---------------------------------------------------------------------------------------------------------------------
# The harness's side (called by run.py)


SSHD_GATEWAY_PORTS = "GatewayPorts clientspecified\n"  # the forwarded port on the link's address, not loopback

NGINX_TLS_CONF = """
worker_processes 1;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log;
events {{ worker_connections 1024; }}
http {{
    access_log {work}/nginx-access.log;
    client_body_temp_path {work}/nginx-tmp/body;
    proxy_temp_path {work}/nginx-tmp/proxy;
    fastcgi_temp_path {work}/nginx-tmp/fastcgi;
    uwsgi_temp_path {work}/nginx-tmp/uwsgi;
    scgi_temp_path {work}/nginx-tmp/scgi;
    upstream backend {{ server 127.0.0.1:{backend}; keepalive 16; }}
    server {{
        listen {host}:{port} ssl;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        ssl_protocols TLSv1.2 TLSv1.3;
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
"""


class Bench:
    """The mobile set-up: a controller on the link's root-side address with its own gateway (to the run's backend),
    a device identity, sshd with `ssh -R` onto the link's address, and a TLS front to the backend there."""

    def __init__(self, run_mod, s, link: Link, samples: int) -> None:
        self.run_mod, self.s, self.link, self.samples = run_mod, s, link, samples
        self.work = s.work / "mobile"
        self.work.mkdir(exist_ok=True)
        self.r = run_mod.Setup(work=self.work, bin=s.bin, bench=s.bench, backend_port=s.backend_port)
        self.extra: list[subprocess.Popen] = []
        self.tls_front = ""

    # -- set-up

    def start(self) -> None:
        rm, r, host = self.run_mod, self.r, self.link.host_ip
        r.controller_port = rm.free_port()
        r.ils("controller", "init", "--state-dir", "controller", "--address", f"https://{host}:{r.controller_port}")
        r.procs["controller"] = rm.start(
            [str(r.bin), "controller", "run", "--state-dir", "controller", "--listen", f"{host}:{r.controller_port}"],
            self.work / "controller.log", self.work)
        rm.wait_port(r.controller_port, r.procs["controller"], host=host)
        rm.enroll(r, "mobile-device", "device")
        rm.start_gateway(r)
        self.identity = self.work / "identities" / "mobile-device.json"
        self._start_ssh()
        self._start_tls_front()

    def _start_ssh(self) -> None:
        rm, r, host = self.run_mod, self.r, self.link.host_ip
        ssh_port, self.ssh_forward = rm.free_port(), rm.free_port()
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        for name in ("ssh_host_key", "ssh_user_key"):
            rm.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.work / name)], cwd=self.work)
        shutil.copy(self.work / "ssh_user_key.pub", self.work / "authorized_keys")
        (self.work / "sshd_config").write_text(rm.SSHD_CONF.format(port=ssh_port, work=self.work) + SSHD_GATEWAY_PORTS)
        r.procs["sshd"] = rm.start(["/usr/sbin/sshd", "-D", "-e", "-f", str(self.work / "sshd_config")],
                                   self.work / "sshd.log", self.work)
        rm.wait_port(ssh_port, r.procs["sshd"])
        r.procs["ssh"] = rm.start(
            ["ssh", "-N", "-T", "-i", str(self.work / "ssh_user_key"), "-p", str(ssh_port),
             "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
             "-o", "ExitOnForwardFailure=yes", "-R", f"{host}:{self.ssh_forward}:127.0.0.1:{self.s.backend_port}",
             f"{os.environ.get('USER', 'root')}@127.0.0.1"],
            self.work / "ssh.log", self.work)
        rm.wait_port(self.ssh_forward, r.procs["ssh"], host=host)

    def _start_tls_front(self) -> None:
        """nginx terminating TLS on the link's address (the same configuration as run.py's, one worker); without
        nginx, ils HTTP mode with TLS."""
        rm, r, host = self.run_mod, self.r, self.link.host_ip
        cert, key = rm.make_tls_cert(r)
        self.tls_port = rm.free_port()
        if shutil.which("nginx"):
            (self.work / "nginx-tmp").mkdir(exist_ok=True)
            conf = self.work / "nginx.conf"
            conf.write_text(NGINX_TLS_CONF.format(work=self.work, backend=self.s.backend_port, host=host,
                                                  port=self.tls_port, cert=cert, key=key))
            r.procs["nginx"] = rm.start(["nginx", "-c", str(conf), "-p", str(self.work), "-g", "daemon off;"],
                                        self.work / "nginx.log", self.work)
            version = subprocess.run(["nginx", "-v"], capture_output=True, text=True).stderr.strip()
            self.tls_front = version.replace("nginx version: ", "")
        else:
            r.procs["tls-front"] = rm.start(
                [str(r.bin), "serve", "--mode", "http", "--listen", f"{host}:{self.tls_port}", "--backend",
                 f"http://127.0.0.1:{self.s.backend_port}", "--tls-cert", str(cert), "--tls-key", str(key)],
                self.work / "tls-front.log", self.work)
            self.tls_front = "ils HTTP mode (nginx not installed)"
        rm.wait_port(self.tls_port, list(r.procs.values())[-1], host=host)

    def stop(self) -> None:
        for proc in self.extra:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.extra:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        for proc in self.r.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.r.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()

    # -- the device's side

    def in_device(self, args: list[str], timeout: float = 120) -> str:
        return self.run_mod.run([*self.link.exec_args(), *args], cwd=self.work, timeout=timeout)

    def probe(self, *args: str) -> dict:
        return json.loads(self.in_device([sys.executable, __file__, "probe", *args]))

    def load(self, *args: str) -> float:
        """One timed request of `ils-bench load` in the namespace; milliseconds (to the 1 KiB answer's end)."""
        out = self.in_device([str(self.s.bench), "load", f"overlay:{self.identity}:{SERVICE}", "--mode", "latency",
                              "--count", "1", "--gap-ms", str(GAP_MS), *args])
        return json.loads(out)["p50Microseconds"] / 1000

    def wait_ready(self, timeout: float = 60) -> None:
        """Until the gateway has linked: an ILSClient request through it succeeds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.load("--warmup", "0")
                return
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)

    def start_tunnel(self) -> tuple[subprocess.Popen, int]:
        port = self.run_mod.free_port()
        proc = subprocess.Popen(
            [*self.link.exec_args(), str(self.s.bin), "tunnel", "--identity", str(self.identity), "--listen",
             f"127.0.0.1:{port}", "--allowed-host", "bench"],
            cwd=self.work, stdout=(self.work / "tunnel.log").open("ab"), stderr=subprocess.STDOUT)
        self.extra.append(proc)
        return proc, port

    def end(self, proc: subprocess.Popen) -> None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        self.extra.remove(proc)

    def ilsclient(self) -> dict[str, list[float]]:
        n = self.samples
        return {
            "cold": [self.load("--warmup", "0", "--connection-per-request") for _ in range(n)],
            "warm": [self.load("--warmup", "1", "--connection-per-request") for _ in range(n)],
            "keep-alive": [self.load("--warmup", "1") for _ in range(n)],
        }

    def tunnel(self) -> dict[str, list[float]]:
        n, ctrl = self.samples, str(self.r.controller_port)
        cold, dialled = [], 0
        for _ in range(n):
            proc, port = self.start_tunnel()
            try:
                got = self.probe("--host", "127.0.0.1", "--port", str(port), "--mode", "new", "--count", "1",
                                 "--wait-listen", "30", "--settle-ms", "300", "--idle-port", ctrl)
            finally:
                self.end(proc)
            dialled += got["connections_before"]
            cold += got["samples_ms"]
        if dialled:
            raise RuntimeError(f"{dialled} cold tunnels had a connection to the controller before their request")
        proc, port = self.start_tunnel()
        try:
            common = ["--host", "127.0.0.1", "--port", str(port), "--count", str(n), "--gap-ms", str(GAP_MS)]
            # The first request (untimed) connects the tunnel to its controller.
            self.probe("--host", "127.0.0.1", "--port", str(port), "--mode", "new", "--count", "1",
                       "--wait-listen", "30")
            warm = self.probe(*common, "--mode", "new")["samples_ms"]
            keep = self.probe(*common, "--mode", "keepalive")["samples_ms"]
        finally:
            self.end(proc)
        return {"cold": cold, "warm": warm, "keep-alive": keep}

    def plain(self, port: int, tls: bool) -> dict[str, list[float] | None]:
        common = ["--host", self.link.host_ip, "--port", str(port), "--count", str(self.samples),
                  "--gap-ms", str(GAP_MS), *(["--tls"] if tls else [])]
        got = self.probe(*common, "--mode", "new")
        if tls:
            self.tls_version = got.get("tls_version", "")
        return {"cold": got["samples_ms"], "warm": None,
                "keep-alive": self.probe(*common, "--mode", "keepalive")["samples_ms"]}

    def link_rtt(self) -> dict:
        got = self.probe("--host", self.link.host_ip, "--port", str(self.tls_port), "--mode", "connect",
                         "--count", str(self.samples), "--gap-ms", "20")
        return summary(got["samples_ms"])

    def one_run(self, loss: float) -> dict:
        self.link.set_loss(loss)
        before = self.link.packets()
        out: dict = {"loss_each_way": loss, "link_rtt_ms": self.link_rtt(), "paths": {}}
        print(f"   link: TCP connect p50 {out['link_rtt_ms']['p50_ms']:.1f} ms, "
              f"p90 {out['link_rtt_ms']['p90_ms']:.1f} ms", flush=True)
        for name, measure in (("ILSClient", self.ilsclient), ("tunnel", self.tunnel),
                              ("ssh -R", lambda: self.plain(self.ssh_forward, tls=False)),
                              ("direct TLS", lambda: self.plain(self.tls_port, tls=True))):
            began = time.monotonic()
            cases = measure()
            out["paths"][name] = {case: (summary(values) if values else None) for case, values in cases.items()}
            print(f"   {name}: " + "; ".join(
                f"{case} p50 {row['p50_ms']:.0f} ms ({row['p50_ms'] / RTT_MS:.1f} RT), p90 {row['p90_ms']:.0f}"
                for case, row in out["paths"][name].items() if row) + f" [{time.monotonic() - began:.0f} s]",
                flush=True)
        after = self.link.packets()
        out["link_packets"] = {direction: {key: after[direction].get(key, 0) - before[direction].get(key, 0)
                                           for key in ("sent", "dropped")}
                               for direction in ("to_device", "to_host")}
        return out


def pick(values: list[float], q: float) -> float:
    """Nearest-rank percentile, as the rest of the harness."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(q / 100 * len(ordered) + 0.999999) - 1))]


def summary(values: list[float]) -> dict:
    return {"p50_ms": pick(values, 50), "p90_ms": pick(values, 90), "min_ms": min(values), "max_ms": max(values),
            "samples_ms": [round(v, 1) for v in values]}


def figures(run_mod, s, samples: int) -> dict:
    """Issue 39's mobile-link table: every path and case at 80 ms, then at 80 ms with 1 % loss each way."""
    began = time.monotonic()
    work = s.work / "mobile"
    work.mkdir(exist_ok=True)
    link = Link(run_mod, work)
    bench = None
    try:
        link.open()
        print(f"   device namespace {link.name}: {link.device_ip} ↔ {link.host_ip}, {ONE_WAY_MS} ms each way "
              f"({'tc netem' if link.kind == 'netem' else 'user-space link: no netem in this kernel'})", flush=True)
        bench = Bench(run_mod, s, link, samples)
        bench.start()
        bench.wait_ready()
        runs = {}
        for label, loss in (("80 ms", 0.0), ("80 ms, 1 % loss", LOSS)):
            print(f"   -- {label}", flush=True)
            runs[label] = bench.one_run(loss)
        m = run_mod.machine()
        return {
            "date": time.strftime("%Y-%m-%d"),
            "machine": {key: m[key] for key in ("cpu", "cores", "kernel", "memory_gib")},
            "rtt_ms": RTT_MS,
            "link": "netem" if link.kind == "netem" else "user-space (TUN, no netem in this kernel)",
            **({} if link.kind == "netem" else {"no_netem": link.no_netem,
                                                 "link_realtime": link.packets().get("realtime", False)}),
            "loss_each_way": LOSS,
            "samples": samples,
            "gap_ms": GAP_MS,
            "tls_front": bench.tls_front,
            "tls_version": getattr(bench, "tls_version", ""),
            "runs": runs,
            "duration_s": round(time.monotonic() - began),
        }
    finally:
        if bench is not None:
            bench.stop()
        link.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    probe = sub.add_parser("probe", help="timed requests from the device (run in its namespace)")
    probe.add_argument("--host", required=True)
    probe.add_argument("--port", type=int, required=True)
    probe.add_argument("--mode", choices=("new", "keepalive", "connect"), required=True)
    probe.add_argument("--count", type=int, default=20)
    probe.add_argument("--gap-ms", type=float, default=GAP_MS)
    probe.add_argument("--tls", action="store_true")
    probe.add_argument("--wait-listen", type=float, default=0, help="wait this long for the port to listen")
    probe.add_argument("--settle-ms", type=float, default=0)
    probe.add_argument("--idle-port", type=int, default=0, help="count connections to this remote port first")
    link = sub.add_parser("link", help="the user-space link between two TUN devices")
    link.add_argument("--host-if", required=True)
    link.add_argument("--device-if", required=True)
    link.add_argument("--delay-ms", type=float, default=ONE_WAY_MS)
    link.add_argument("--log", action="store_true", help="a line per TCP packet on stderr")
    args = parser.parse_args()
    return probe_main(args) if args.command == "probe" else link_main(args)


if __name__ == "__main__":
    sys.exit(main())
