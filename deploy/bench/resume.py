"""Issue 38's figures for deploy/bench/run.py (`--only resume`): what circuit resumption costs and how long it takes.

- **Overhead**: keep-alive latency and bulk throughput through two tunnels of the same device, in one run and in
  alternating rounds: one that offers suite 5 (resumable: every record kept until ACKed, ACKs both ways) and one with
  `--resume-grace 0`, which offers suite 4 as an earlier release did (no ACK, nothing kept).
- **Path switches**: a device in a network namespace with two interfaces, "wifi" and "cell" (Tests/e2e's
  `DeviceNetns`); an SSE answer of an event every 20 ms streams through its tunnel while the path is switched 20
  times (the one in use black-holed with iptables DROP, the route moved to the other). Resume time: from the switch
  to the first event that arrives after it. Every event is checked: the bench backend stamps each with its own
  monotonic clock, so a lost event shows as a gap in the stamps and a repeated one as a stamp that does not grow.
- **Controller SIGKILL**: two controllers on one PostgreSQL (run.py's cluster set-up), a device that lists both;
  the controller relaying its stream is SIGKILLed and the stream resumes through the other. Same measure and checks.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

EVENT_MS = 20
SETTLE_S = 1.0  # steady events between two switches (and before the first)
KEEPALIVE = ["--keepalive", "1s", "--keepalive-timeout", "1s"]


class EventClock:
    """Reads an SSE stream (lines from `proc`'s stdout) in a thread: each event's arrival time (monotonic, here) and
    the backend's stamp (its monotonic nanoseconds)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.events: list[tuple[float, int]] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(b"data: "):
                stamp = int(line[6:].strip())
                with self.lock:
                    self.events.append((time.monotonic(), stamp))

    def count(self) -> int:
        with self.lock:
            return len(self.events)

    def first_after(self, at: float, timeout: float) -> float:
        """Seconds from `at` to the arrival of the first event the backend sent after `at`. (The backend stamps each
        event with CLOCK_MONOTONIC, as `time.monotonic` reads it here: events already on their way at the switch
        say nothing of the new path, so they are not the measure.)"""
        deadline = time.monotonic() + timeout
        since = int(at * 1e9)
        while time.monotonic() < deadline:
            with self.lock:
                found = next((arrived for arrived, stamp in self.events if stamp >= since), None)
            if found is not None:
                return found - at
            time.sleep(0.002)
        raise RuntimeError(f"no event within {timeout:.0f} s of the switch: the stream did not resume")

    def wait_events(self, more: int, timeout: float) -> None:
        target = self.count() + more
        deadline = time.monotonic() + timeout
        while self.count() < target:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"the stream stopped at {self.count()} events")
            time.sleep(0.01)

    def check(self) -> dict:
        """No event lost (no gap in the backend's stamps above 2.5 intervals) and none repeated (stamps grow)."""
        with self.lock:
            stamps = [stamp for _, stamp in self.events]
        gaps = [(b - a) / 1e6 for a, b in zip(stamps, stamps[1:])]
        repeated = sum(1 for gap in gaps if gap <= 0)
        lost = sum(1 for gap in gaps if gap > 2.5 * EVENT_MS)
        if repeated or lost:
            raise RuntimeError(f"{repeated} events repeated, {lost} gaps in the backend's stamps (an event lost)")
        return {"events": len(stamps), "lost": 0, "repeated": 0}


def sse_reader(command: list[str]) -> EventClock:
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    clock = EventClock(proc)
    clock.wait_events(3, timeout=30)
    return clock


def curl_sse(port: int) -> list[str]:
    return ["curl", "-sN", "--http1.1", "-H", "Host: bench", f"http://127.0.0.1:{port}/sse?interval_ms={EVENT_MS}"]


def overhead(run_mod, s, args) -> dict:
    """Keep-alive latency and throughput of circuits that never resume: suite 5 beside suite 4, alternating rounds."""
    size = min(args.size_mib, 256) * run_mod.MIB
    paths = {}
    for name, extra in (("suite 5 (resumable)", []), ("suite 4 (--resume-grace 0)", ["--resume-grace", "0"])):
        port = run_mod.free_port()
        s.procs[f"tunnel {name}"] = run_mod.start_tunnel(s, "bench-device", port, extra=extra)
        run_mod.wait_for_overlay(port, timeout=20)
        paths[name] = run_mod.Path_(name, port)
    source = Path("/dev/shm") / f"ils-bench-resume-{size}.bin"
    with source.open("wb") as out:
        out.truncate(size)
    rounds: dict[str, dict[str, list[float]]] = {name: {"p50": [], "p99": [], "down": [], "up": [], "down_cpu_s": []}
                                                  for name in paths}
    try:
        for round_ in range(3):
            for name in (list(paths) if round_ % 2 == 0 else list(reversed(paths))):
                p = paths[name]
                lat = run_mod.latency(p, args.latency_count)
                rounds[name]["p50"].append(lat["p50_us"])
                rounds[name]["p99"].append(lat["p99_us"])
                # The CPU time the download took in every process of the path (the bench's processes and curl
                # share the machine's cores, so CPU is what bounds a transfer here).
                pids = [s.procs[key].pid for key in ("controller", "gateway", "backend", f"tunnel {name}")]
                before = sum(run_mod.cpu_seconds(pid) for pid in pids)
                rounds[name]["down"].append(run_mod.download(p, size))
                rounds[name]["down_cpu_s"].append(sum(run_mod.cpu_seconds(pid) for pid in pids) - before)
                rounds[name]["up"].append(run_mod.upload(p, source, size))
                print(f"   {name}: latency p50 {lat['p50_us']:.0f} us p99 {lat['p99_us']:.0f} us, download "
                      f"{rounds[name]['down'][-1]:.0f} MiB/s ({rounds[name]['down_cpu_s'][-1]:.2f} CPU-s), upload "
                      f"{rounds[name]['up'][-1]:.0f} MiB/s", flush=True)
    finally:
        source.unlink(missing_ok=True)
    median = lambda values: sorted(values)[len(values) // 2]
    return {name: {"latency_p50_us": median(r["p50"]), "latency_p99_us": median(r["p99"]),
                   "download_mib_s": median(r["down"]), "upload_mib_s": median(r["up"]),
                   "download_cpu_s": round(median(r["down_cpu_s"]), 2),
                   "samples": {key: [round(v, 2 if key.endswith("cpu_s") else 1) for v in values]
                               for key, values in r.items()}}
            for name, r in rounds.items()} | {"size_mib": size // run_mod.MIB}


def path_switches(run_mod, s, switches: int) -> dict:
    """Resume time over `switches` path switches, each of a fresh device (its own namespace, controller, gateway and
    tunnel: switched back and forth, one device's later switches were not clean dead paths, its old connection kept
    delivering for a while). Mid-stream wifi and its address are black-holed (iptables DROP both ways, no reset) and
    the route moved to cell (Tests/e2e's `DeviceNetns.switch`)."""
    times, events, resumed = [], 0, 0
    for switch in range(switches):
        took, checked, logged = one_switch(run_mod, s, switch)
        times.append(took)
        events += checked["events"]
        resumed += logged
        print(f"   switch {switch + 1}: first event {took:.0f} ms after", flush=True)
    return {**run_mod.percentiles(times), "switches": switches, "each_ms": [round(t) for t in times],
            "gateway_resumptions": resumed, "events": events, "lost": 0, "repeated": 0}


def one_switch(run_mod, s, index: int) -> tuple[float, dict, int]:
    sys.path.insert(0, str(run_mod.ROOT / "Tests" / "e2e"))
    from test_resumption import device_namespace  # noqa: E402

    with device_namespace() as ns:
        work = s.work / f"switch-{index}"
        work.mkdir()
        r = run_mod.Setup(work=work, bin=s.bin, bench=s.bench, backend_port=s.backend_port)
        r.controller_port = run_mod.free_port()
        r.ils("controller", "init", "--state-dir", "controller", "--address",
              f"https://{ns.wifi_host}:{r.controller_port}")
        controller = run_mod.start(
            [str(r.bin), "controller", "run", "--state-dir", "controller", "--listen",
             f"{ns.wifi_host}:{r.controller_port}"],
            work / "controller.log", work)
        r.procs["controller"] = controller
        run_mod.wait_port(r.controller_port, controller, host=ns.wifi_host)
        run_mod.enroll(r, "switching-device", "device")
        run_mod.start_gateway(r)
        port = run_mod.free_port()
        r.procs["tunnel"] = run_mod.start(
            ns.exec_args() + [str(r.bin), "tunnel", "--identity", "identities/switching-device.json", "--listen",
                              f"127.0.0.1:{port}", "--allowed-host", "bench", *KEEPALIVE],
            work / "tunnel.log", work)
        deadline = time.monotonic() + 30
        clock = None
        try:
            while clock is None:
                try:
                    clock = sse_reader(ns.exec_args() + curl_sse(port))
                except RuntimeError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            clock.wait_events(int(SETTLE_S * 1000 / EVENT_MS), timeout=30)
            at = time.monotonic()
            ns.switch(to_cell=True)
            took = clock.first_after(at, timeout=60) * 1000
            clock.wait_events(int(SETTLE_S * 1000 / EVENT_MS), timeout=30)
            checked = clock.check()
            resumed = (work / "gateway.log").read_text(errors="replace").count("circuit resumed")
        finally:
            if clock is not None:
                clock.proc.terminate()
            run_mod.stop_setup(r)
    return took, checked, resumed


def controller_kills(run_mod, c, a_port: int, b_port: int, store: str, trials: int) -> dict:
    """Resume time after SIGKILL of the controller relaying a live stream, two controllers on one PostgreSQL."""
    run_mod.enroll(c, "resuming-device", "device")
    run_mod.pin(c, "resuming-device", [a_port, b_port])
    port = run_mod.free_port()
    tunnel = run_mod.start(
        [str(c.bin), "tunnel", "--identity", "identities/resuming-device.json", "--listen", f"127.0.0.1:{port}",
         "--allowed-host", "bench", *KEEPALIVE],
        c.work / "tunnel-resuming.log", c.work)
    run_mod.wait_port(port, tunnel)
    run_mod.wait_for_overlay(port, timeout=30)
    clock = sse_reader(curl_sse(port))
    names = {a_port: ("controller", "A"), b_port: ("controller-B", "B")}
    times = []
    try:
        # The device relays through A first (it lists A first); after A's kill, through B: the next kill is B's.
        for trial in range(trials):
            victim = a_port if trial % 2 == 0 else b_port
            key, name = names[victim]
            clock.wait_events(int(SETTLE_S * 1000 / EVENT_MS), timeout=30)
            at = time.monotonic()
            c.procs[key].send_signal(signal.SIGKILL)
            times.append(clock.first_after(at, timeout=60) * 1000)
            print(f"   SIGKILL of {name}: first event {times[-1]:.0f} ms after", flush=True)
            c.procs[key].wait(timeout=10)
            links = run_mod.gateway_links(c, victim)
            run_mod.start_cluster_controller(c, name, victim, store)
            run_mod.wait_gateway_linked(c, victim, more_than=links)
        clock.wait_events(int(SETTLE_S * 1000 / EVENT_MS), timeout=30)
        checked = clock.check()
    finally:
        clock.proc.terminate()
        tunnel.terminate()
        tunnel.wait(timeout=10)
    return {**run_mod.percentiles(times), "trials": trials, "each_ms": [round(t) for t in times], **checked}


def own_gateway(run_mod, s, name: str, gateway_flags: list[str]):
    """A controller and an overlay gateway of their own in `s.work / name`, the gateway with `gateway_flags` and
    `--metrics`, in front of the run's backend. Returns the setup and a function that reads one of the gateway's
    metrics (summed over its labels)."""
    work = s.work / name
    work.mkdir()
    h = run_mod.Setup(work=work, bin=s.bin, bench=s.bench, backend_port=s.backend_port)
    h.controller_port = run_mod.free_port()
    metrics_port = run_mod.free_port()
    h.ils("controller", "init", "--state-dir", "controller", "--address", f"https://127.0.0.1:{h.controller_port}")
    h.procs["controller"] = run_mod.start(
        [str(h.bin), "controller", "run", "--state-dir", "controller", "--listen",
         f"127.0.0.1:{h.controller_port}", *run_mod.BENCH_CIRCUIT_CAPS],
        work / "controller.log", work)
    run_mod.wait_port(h.controller_port, h.procs["controller"])
    run_mod.enroll(h, "gateway", "gateway")
    h.procs["gateway"] = run_mod.start(
        [str(h.bin), "serve", "--identity", "identities/gateway.json", "--backend",
         f"http://127.0.0.1:{h.backend_port}", *gateway_flags, "--metrics", f"127.0.0.1:{metrics_port}"],
        work / "gateway.log", work, env={"NETWORKING_MODE": "ziti"})

    def metric(wanted: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
            return sum(float(line.rpartition(" ")[2]) for line in r.read().decode().splitlines()
                       if line.startswith(wanted + " ") or line.startswith(wanted + "{"))

    return h, metric


def stalled(run_mod, s, circuits: int = 80, answer_mib: int = 1024) -> dict:
    """Issue 49's must-show at the defaults: `circuits` circuits of one device whose app takes nothing (local sockets
    that are never read: the tunnel stops reading each circuit once its socket is full, so the device acknowledges
    nothing), each asking for an answer of `answer_mib`, against a gateway of its own with no flag but `--metrics`
    (so `--client-stall-timeout` is its overlay default, 60 s). Meanwhile another device's SSE stream (an event every
    20 ms) runs through its own tunnel, and must repeat nothing (the largest gap is reported). Records when the gateway cuts the stalled
    circuits (`ils_gateway_circuits_stalled_total`), whether their backend requests end with them, and the gateway's
    RSS before, while stalled, and after."""
    h, metric = own_gateway(run_mod, s, "stall", [])
    for device in ("mute-device", "tab-device"):
        run_mod.enroll(h, device, "device")
    mute_port, tab_port = run_mod.free_port(), run_mod.free_port()
    mute = run_mod.start_tunnel(h, "mute-device", mute_port)
    tab = run_mod.start_tunnel(h, "tab-device", tab_port)
    for port in (mute_port, tab_port):
        run_mod.wait_for_overlay(port, timeout=30)
    gateway = h.procs["gateway"].pid
    run_mod.settle(h)
    baseline = run_mod.rss_kib(gateway)
    clock = sse_reader(curl_sse(tab_port))
    socks = []
    samples: list[tuple[float, float, int, float]] = []  # (s since the requests, kept MiB, RSS KiB, cut)
    try:
        began = time.monotonic()
        for _ in range(circuits):
            sock = run_mod.socket.create_connection(("127.0.0.1", mute_port), timeout=30)
            sock.setsockopt(run_mod.socket.SOL_SOCKET, run_mod.socket.SO_RCVBUF, 64 * 1024)
            sock.sendall(f"GET /bytes/{answer_mib * run_mod.MIB} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
            socks.append(sock)
        events_before = clock.count()
        first_cut = all_cut = None
        deadline = began + 180
        while time.monotonic() < deadline:
            time.sleep(0.5)
            cut = metric("ils_gateway_circuits_stalled_total")
            at = time.monotonic() - began
            samples.append((round(at, 1), round(metric("ils_gateway_resumption_kept_bytes") / run_mod.MIB, 1),
                            run_mod.rss_kib(gateway), cut))
            if cut and first_cut is None:
                first_cut = at
            if cut >= circuits:
                all_cut = at
                break
        print(f"   cut {first_cut or 0:.1f}–{all_cut or 0:.1f} s after the requests", flush=True)
        if all_cut is None:
            raise RuntimeError(f"after 180 s, {metric('ils_gateway_circuits_stalled_total'):.0f} of {circuits} "
                               "stalled circuits were cut")
        # The tunnel's sockets end with their circuits: reset (the tunnel's way of saying an answer was cut), or at
        # EOF once drained. One still open 30 s later is not counted.
        ended = 0
        for sock in socks:
            sock.settimeout(30)
            try:
                while sock.recv(1 << 20):
                    pass
                ended += 1
            except TimeoutError:
                pass
            except OSError:
                ended += 1
        active = metric("ils_gateway_circuits_active")
        after_at = time.monotonic()
        while time.monotonic() - after_at < 30:
            time.sleep(2)
        after = run_mod.rss_kib(gateway)
        clock.wait_events(10, timeout=30)
        # Not `clock.check()`: the backend also served the 80 answers, and its stamps show when it got to each event
        # (a gap is the backend late, not an event lost: TCP loses none). What is reported is the gaps.
        with clock.lock:
            stamps = [stamp for _, stamp in clock.events]
        gaps = [(b - a) / 1e6 for a, b in zip(stamps, stamps[1:])]
        if any(gap <= 0 for gap in gaps):
            raise RuntimeError("the other device's stream repeated an event")
        checked = {"events": len(stamps), "repeated": 0, "max_gap_ms": round(max(gaps)),
                   "gaps_over_50ms": sum(1 for gap in gaps if gap > 2.5 * EVENT_MS)}
        events_during = clock.count() - events_before
        log = (h.work / "gateway.log").read_text(errors="replace")
    finally:
        clock.proc.terminate()
        for sock in socks:
            sock.close()
        for proc in (mute, tab):
            proc.terminate()
        run_mod.stop_setup(h)
    stalled_rows = [row for row in samples if not row[3]]
    return {"circuits": circuits, "stall_timeout_s": 60, "first_cut_s": round(first_cut, 1),
            "all_cut_s": round(all_cut, 1), "cut_counted": circuits, "local_sockets_ended": ended,
            "circuits_active_after": active, "baseline_kib": baseline,
            "kept_mib_peak": max(row[1] for row in samples),
            "stalled_peak_kib": max(row[2] for row in stalled_rows) if stalled_rows else None,
            "30s_after_kib": after, "stalled_access_lines": log.count("outcome=client_stalled"),
            "other_device": {**checked, "events_while_stalled": events_during}, "samples": samples}


def held_memory(run_mod, s, circuits: int, total_mib: int = 256, grace_s: int = 40, stop_acking_s: int = 0,
                name: str = "held") -> dict:
    """The gateway's resident memory while `circuits` circuits are held, their backend answers still streaming (an
    SSE event every 10 ms each): a gateway of its own with `--resume-total` of `total_mib` and a window of `grace_s`,
    the device's tunnel SIGKILLed with every stream open. Samples the gateway's RSS from before the streams to 40 s
    after the window ran out (the gateway hands freed memory back at most every 10 s once circuits closed). The
    per-device cap of held circuits is lifted to `circuits`: each held circuit reserves one backend read (about
    131 KiB) within the total, so 1,000 need about 128 MiB of it before they keep anything.

    `stop_acking_s` > 0: the device stops acknowledging first (its tunnel SIGSTOPped, its connection left open) for
    that long, so every circuit keeps what its bounds let it while attached, and carries that into the held state
    when the tunnel is then SIGKILLed: what the hard total must bound (issue 49: 400 such circuits took a gateway at
    `--resume-total 32MiB` from 60 to 446 MB, and it stayed at 448 MB after they expired)."""
    h, metric = own_gateway(run_mod, s, name, ["--resume-total", f"{total_mib}MiB", "--resume-grace", f"{grace_s}s",
                                               "--resume-held-per-identity", str(circuits)])
    run_mod.enroll(h, "held-device", "device")
    port = run_mod.free_port()
    tunnel = run_mod.start_tunnel(h, "held-device", port)
    run_mod.wait_for_overlay(port, timeout=30)
    gateway = h.procs["gateway"].pid
    samples: list[tuple[str, float, int]] = []
    began = time.monotonic()

    def sample(label: str) -> int:
        rss = run_mod.rss_kib(gateway)
        samples.append((label, round(time.monotonic() - began, 1), rss))
        return rss

    run_mod.settle(h)
    baseline = sample("before")
    socks = []
    held_bytes_peak = 0.0
    try:
        for _ in range(circuits):
            sock = run_mod.socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.sendall(b"GET /sse?interval_ms=10 HTTP/1.1\r\nHost: bench\r\n\r\n")
            socks.append(sock)
        for sock in socks:
            data = b""
            while b"data: " not in data:
                chunk = sock.recv(4096)
                if not chunk:
                    raise RuntimeError("an SSE stream closed before its first event")
                data += chunk
        attached = sample(f"{circuits} attached")
        if stop_acking_s:
            tunnel.send_signal(signal.SIGSTOP)
            stopped = time.monotonic()
            while time.monotonic() - stopped < stop_acking_s:
                time.sleep(2)
                sample(f"not acknowledging, {time.monotonic() - stopped:.0f} s")
        tunnel.send_signal(signal.SIGKILL)
        tunnel.wait(timeout=10)
        killed = time.monotonic()
        while time.monotonic() - killed < grace_s + 40:
            time.sleep(2)
            sample(f"held, {time.monotonic() - killed:.0f} s")
            held_bytes_peak = max(held_bytes_peak, metric("ils_gateway_resumption_held_bytes"))
        expired = metric("ils_gateway_circuits_not_resumed_total")
        not_held = metric("ils_gateway_circuits_not_held_total")
    finally:
        for sock in socks:
            sock.close()
        run_mod.stop_setup(h)
    held = [rss for label, _, rss in samples if label.startswith("held")]
    in_window = [rss for label, at, rss in samples if label.startswith("held") and at - (killed - began) < grace_s]
    after = [rss for label, at, rss in samples if label.startswith("held") and at - (killed - began) >= grace_s + 30]
    return {"circuits": circuits, "total_mib": total_mib, "grace_s": grace_s, "stop_acking_s": stop_acking_s,
            "baseline_kib": baseline, "attached_kib": attached, "held_peak_kib": max(in_window),
            "held_bytes_peak": held_bytes_peak, "expired": expired, "not_held": not_held,
            "after_window_kib": held[-1], "30s_after_window_kib": after[0] if after else None, "samples": samples}


def bulk(run_mod, s, rounds: int, size_mib: int = 128) -> dict:
    """Issue 49's bulk figures in one run: the overlay with suite 5 (the default tunnel), the overlay with suite 4
    (a second tunnel of the same device with `--resume-grace 0`, through the same controller and gateway) and `ssh -R`,
    `size_mib` down and up each, in `rounds` rounds whose order rotates so a slow moment of the shared machine lands on
    every path alike. The medians count; every sample is kept. The CPU time of a download in every process of its
    path is beside it (the processes and curl share two cores, so CPU is what bounds a transfer here)."""
    size = size_mib * run_mod.MIB
    paths = {"suite 5": s.paths["overlay"], "ssh -R": s.paths["ssh -R"]}
    port = run_mod.free_port()
    s.procs["tunnel suite 4"] = run_mod.start_tunnel(s, "bench-device", port, extra=["--resume-grace", "0"])
    run_mod.wait_for_overlay(port, timeout=20)
    paths["suite 4"] = run_mod.Path_("suite 4", port)
    processes = {"suite 5": ["controller", "gateway", "backend", "tunnel"],
                 "suite 4": ["controller", "gateway", "backend", "tunnel suite 4"],
                 "ssh -R": ["backend"]}
    source = Path("/dev/shm") / f"ils-bench-bulk-{size}.bin"
    with source.open("wb") as out:
        out.truncate(size)
    names = list(paths)
    samples = {name: {"down": [], "up": [], "down_cpu_s": [], "up_cpu_s": []} for name in names}
    try:
        for round_ in range(rounds):
            order = names[round_ % len(names):] + names[:round_ % len(names)]
            for name in order:
                p = paths[name]
                pids = [s.procs[key].pid for key in processes[name]]
                if name == "ssh -R":  # sshd's per-session processes do its work
                    pids += run_mod.with_descendants([s.procs["sshd"].pid, s.procs["ssh"].pid])
                before = sum(run_mod.cpu_seconds(pid) for pid in pids)
                samples[name]["down"].append(run_mod.download(p, size))
                middle = sum(run_mod.cpu_seconds(pid) for pid in pids)
                samples[name]["up"].append(run_mod.upload(p, source, size))
                after = sum(run_mod.cpu_seconds(pid) for pid in pids)
                samples[name]["down_cpu_s"].append(middle - before)
                samples[name]["up_cpu_s"].append(after - middle)
                print(f"   round {round_ + 1}, {name}: download {samples[name]['down'][-1]:.0f} MiB/s "
                      f"({middle - before:.2f} CPU-s), upload {samples[name]['up'][-1]:.0f} MiB/s "
                      f"({after - middle:.2f} CPU-s)", flush=True)
    finally:
        source.unlink(missing_ok=True)
        tunnel = s.procs.pop("tunnel suite 4")
        tunnel.terminate()
        tunnel.wait(timeout=10)
    median = lambda values: sorted(values)[len(values) // 2]
    return {"size_mib": size_mib, "rounds": rounds,
            "paths": {name: {"download_mib_s": median(r["down"]), "upload_mib_s": median(r["up"]),
                             "download_cpu_s": round(median(r["down_cpu_s"]), 2),
                             "upload_cpu_s": round(median(r["up_cpu_s"]), 2),
                             "samples": {key: [round(v, 2 if key.endswith("cpu_s") else 1) for v in values]
                                         for key, values in r.items()}}
                      for name, r in samples.items()}}
