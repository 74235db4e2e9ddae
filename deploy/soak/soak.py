#!/usr/bin/env python3
"""ils-gateway soak test: hours of mixed traffic through both paths, with faults and revocations on a schedule.

Topology, all on 127.0.0.1 with free ports and a temporary directory:

    device tunnels (2 long-lived) ──► controller ──► dark overlay gateway ──┐
                                                                            ├──► sample backend (deploy/backend/app.py)
    TLS client ────────────────────► HTTP-mode gateway (TLS) ──────────────┘

Load: one worker per (path, kind), kinds SSE / download / upload / WebSocket; every payload is checked (SSE: every
event present, in order, with the text the backend derives from this request's own prompt; download: size and
SHA-256 of the backend's seeded generator, computed here; upload: the SHA-256 and size the backend reports; WebSocket:
every echoed message equal to what was sent). An outcome is ok, failed (connection error, gateway error status,
timeout) or CORRUPTED (completed, but the content is wrong). A failure is "expected" only if the request overlapped a
fault window of its path (from the SIGKILL to first success after the restart, plus FAULT_GRACE_S); any other
failure is an "unexpected failure".

Events, one every --fault-period seconds in the middle of the run, in a cycle: SIGKILL the controller and restart it
(then PRAGMA integrity_check on its SQLite store), SIGKILL the backend and restart it, SIGKILL the overlay gateway and
restart it, and revoke a throwaway device (create, enroll, start a tunnel, open a live SSE stream, revoke; the stream
must end at once and the tunnel must refuse new requests). Time to recover (first request through each affected path
after the restart) is measured by probing.

Every SAMPLE_S seconds the resident memory (VmRSS, and its private part RssAnon), CPU time and open descriptors of
every long-lived process are read from /proc, per incarnation (pid). At the end of warm-up and at the end of the run,
load pauses and the counts settle (quiescent points); the descriptors at the end must be back to the first quiescent
point's, and the slope of private memory after warm-up, extrapolated over the run, must stay under the limit. Private
memory is judged because file-backed pages (the executable's code, faulted in as code paths first run) are not
memory the process holds on to; RSS is reported beside it. Exit status 0 only if everything holds.

Each incarnation is judged after its own warm-up under load, not after its birth: a restarted process may idle for
minutes before traffic reaches it (a restarted controller of two gets the devices only when the other one is killed),
and its caches, arenas and pools fill only then. An incarnation carries load from the first sample after which, in
most sample intervals over LOAD_CONFIRM_S, it uses at least LOAD_CPU_FRACTION of its own busy level (its highest
sustained CPU share) and LOAD_CPU_FLOOR of a core (CPU time from /proc/PID/stat: every byte relayed costs CPU;
heartbeats, links and the start-up burst do not make a majority). Its judged window starts once it has carried load
for the run's own warm-up (never before the run's warm-up ends). An incarnation that never carries load is judged as
idle, from INCARNATION_WARMUP_S after its birth: an idle process must not grow either (heartbeats, admin requests,
links), and with nothing to warm up, what it holds after its start is its level. Either way a window shorter than
MIN_FIT_SPAN_S is not slope-judged, and a quiescent point is compared with the end only for an incarnation that was
past its warm-up at that point. The report says, per incarnation, which it was and from when.

--inject-leak BYTES proves the judge can still fail a run: it starts both gateways with
ILS_TEST_LEAK_BYTES_PER_REQUEST=BYTES, a test-only switch that makes the proxy core keep BYTES of private memory for
every request it forwards to the backend (Sources/ILSProxy/InjectedLeak.swift). Such a run must end FAIL on memory.

Two controllers (--controllers 2; the default is 1, as above): a PostgreSQL server this run starts (Tests/e2e/
pg_fixture.py: initdb in a temporary directory, stopped at the end whatever happens), controller A on it (`controller
init --store`), B joined (`controller join`); the devices and the overlay gateway are enrolled through A once B is up,
so their identity files list both, and the gateway links to both before the load starts. The fault cycle then has
three controller kills in six events, each SIGKILLing one controller, A and B in turn, while the other keeps serving:
the tunnels fail over at once, so the overlay's fault window runs from the kill to the first request through each
overlay path after it (plus FAULT_GRACE_S), not to the restart. The killed controller is restarted and must answer an
admin read, and the gateway must link to it again. Meanwhile a writer thread makes admin writes (create, disable,
revoke identities soak-w-N) through A and B in turn, each with an admin file that dials that controller only, and
records which were acknowledged; at the end every controller's `admin identity list` must show each identity in the
state its last acknowledged write left ("lost acknowledged writes" must be 0). A write that failed because its
controller was killed under it may or may not have been applied: both are allowed, and the report counts each. The
store password reaches the controllers in PGPASSWORD only, and no log may contain it.

Run it through deploy/soak/run.sh, which picks the binary (ILS_BIN) and installs missing Python packages.
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import json
import logging
import os
import random
import re
import shutil
import signal
import string
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Iterable, Optional

import httpx
import pytest
from websockets.sync.client import connect as ws_connect

ROOT = Path(__file__).resolve().parents[2]
# The end-to-end tests' process helpers and the sample backend's generator are imported, not copied.
sys.path.insert(0, str(ROOT / "Tests" / "e2e"))
sys.path.insert(0, str(ROOT / "deploy" / "backend"))

import conftest  # noqa: E402
import pg_fixture  # noqa: E402
from app import fake_answer, pseudorandom_blocks  # noqa: E402
from conftest import Backend, Controller, Gateway, ManagedProcess, make_certs  # noqa: E402
from hostile import fd_count  # noqa: E402
from sse_helpers import parse_sse, timed_lines  # noqa: E402
from test_cluster import ClusterController, wait_gateway_linked  # noqa: E402
from test_faults import gateway_process, integrity, sigkill  # noqa: E402
from test_overlay import Tunnel, enroll  # noqa: E402

# The helpers report a failed start with pytest.fail (a missing PostgreSQL with pytest.skip), whose exceptions are not
# Exception subclasses.
HarnessFailure = (pytest.fail.Exception, pytest.skip.Exception)

MIB = 1024 * 1024
KIB = 1024
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
LEAK_ENV = "ILS_TEST_LEAK_BYTES_PER_REQUEST"  # the gateways' test-only leak (--inject-leak)

REQUEST_TIMEOUT_S = 30.0  # any single operation (one download, one SSE stream, one WebSocket session)
FAULT_GRACE_S = 2.0  # after the first success through a path, every request that starts later must succeed
RECOVERY_BOUND_S = 15.0  # restart (port back / hosting) -> first success through the path
REVOKE_END_BOUND_S = 5.0  # revoke command returned -> the revoked device's live stream has ended
REFUSAL_BOUND_S = 10.0  # a request through a revoked device's tunnel must be refused within this (not hang)
SAMPLE_S = 5.0
FD_SLACK = 2  # descriptors at the final quiescent point may exceed the first one by this much
RSS_LIMIT_MIB = 8.0  # the growth allowed over the run (slope after warm-up x run length), or
RSS_LIMIT_FRACTION = 0.20  # this fraction of the process's RSS after warm-up, whichever is larger
INCARNATION_WARMUP_S = 30.0  # an idle incarnation's first seconds are its start-up: identity, store, links
LOAD_CPU_FRACTION = 0.25  # an incarnation carries load from when it uses this fraction of its own busy level (its
# highest sustained CPU share; see load_onset), and at least
LOAD_CPU_FLOOR = 0.02  # this share of one core: heartbeats and links cost well under it (an idle process judged as
# loaded only starts its window later; a loaded one judged idle would count its warm-up as growth)
LOAD_CONFIRM_S = 20.0  # most sample intervals over this long must reach the threshold: a start-up burst is not load
MIN_FIT_SPAN_S = 300.0  # a slope over less than 5 minutes of samples after warm-up is not judged: allocator noise
# (±5 MiB swings with 4 MiB bodies) and the slow end of warm-up cannot be told from a leak in less
QUIESCENT_RSS_LIMIT_MIB = 16.0  # the check every run makes, short ones included: RSS at the final quiescent point
# minus RSS at the first one, same process. Two single samples are noisier than a fit, hence twice RSS_LIMIT_MIB.
MIN_FIT_SAMPLES = 6
FLOOR_BUCKET_S = 60.0
EVENTS_SHARE = 0.6  # events happen in the first 60% of the time after warm-up; the rest is steady load, so the
# last incarnation of every process is observed for a long time before the end

KINDS = ("sse", "download", "upload", "ws")
FAULT_CYCLE = ("controller", "backend", "gateway", "revoke")
# With two controllers, half the events kill one of them: a 3-minute run then kills A and B at least once each, and
# the controllers are killed alternately across the whole run (A, B, A, B, ...: see label_controller_kills).
CLUSTER_FAULT_CYCLE = ("controller", "backend", "controller", "gateway", "controller", "revoke")
CONTROLLER_NAMES = ("A", "B")
WRITE_INTERVAL_S = (0.3, 1.0)  # the admin writer's pause between writes (uniform)
CLI_WRITE_TIMEOUT_S = 20.0  # one admin write; a controller killed under it fails the write, it does not hang it
# Which load paths each fault takes down.
FAULT_PATHS = {"controller": ("overlay",), "gateway": ("overlay",), "backend": ("overlay", "http")}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_duration(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 90s, 2m, 1h)")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


# ------------------------------------------------------------------------------------------------------------------
# Verification (pure functions: a result of None means the content is right, a string says what is wrong)
# ------------------------------------------------------------------------------------------------------------------


def expected_digest(size: int, seed: int) -> str:
    h = hashlib.sha256()
    for block in pseudorandom_blocks(size, seed):
        h.update(block)
    return h.hexdigest()


def verify_download(received: int, digest: str, size: int, seed: int) -> Optional[str]:
    if received != size:
        return f"{received} bytes, expected {size}"
    want = expected_digest(size, seed)
    if digest != want:
        return f"sha256 {digest[:16]}… expected {want[:16]}… (size {size}, seed {seed})"
    return None


def verify_upload(reply: object, size: int, digest: str) -> Optional[str]:
    if not isinstance(reply, dict) or reply.get("sha256") != digest or reply.get("bytes") != size:
        return f"backend saw {reply!r}, sent {size} bytes sha256 {digest[:16]}…"
    return None


def verify_sse(events: list, prompt: str, n: int) -> Optional[str]:
    """Events 0..n-1 in order, each with the word the backend derives from this request's prompt, then `done`."""
    words = fake_answer(prompt).split()
    messages = [e for e in events if e.event == "message"]
    for i, e in enumerate(messages):
        try:
            body = e.json
        except ValueError:
            return f"event {i} is not JSON: {e.data[:80]!r}"
        if body.get("index") != i:
            return f"event {i} has index {body.get('index')!r} (missing or out of order)"
        if body.get("text") != words[i % len(words)]:
            return f"event {i} text {body.get('text')!r}, expected {words[i % len(words)]!r} (another stream's data?)"
    if len(messages) != n:
        return f"{len(messages)} events, expected {n}"
    if not events or events[-1].event != "done":
        return "stream ended cleanly without its done event (truncation reported as success)"
    try:
        done = events[-1].json
    except ValueError:
        return f"done event is not JSON: {events[-1].data[:80]!r}"
    if done.get("count") != n:
        return f"done says {done!r}, expected count {n}"
    return None


def verify_ws(sent: list, received: list) -> Optional[str]:
    if len(received) != len(sent):
        return f"{len(received)} echoes for {len(sent)} messages"
    for i, (a, b) in enumerate(zip(sent, received)):
        if type(a) is not type(b) or a != b:
            return f"message {i}: sent {type(a).__name__} of {len(a)}, echo {type(b).__name__} of {len(b)} differs"
    return None


# ------------------------------------------------------------------------------------------------------------------
# Analysis (pure functions)
# ------------------------------------------------------------------------------------------------------------------


def slope_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, in value units per minute."""
    n = len(points)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    if den == 0:
        return 0.0
    return 60.0 * sum((t - mt) * (v - mv) for t, v in points) / den


def floor_points(points: list[tuple[float, float]], bucket_s: float = FLOOR_BUCKET_S) -> list[tuple[float, float]]:
    """The lowest value of each bucket_s window: what a process holds between bursts."""
    buckets: dict[int, tuple[float, float]] = {}
    t0 = points[0][0]
    for t, v in points:
        k = int((t - t0) // bucket_s)
        if k not in buckets or v < buckets[k][1]:
            buckets[k] = (t0 + (k + 0.5) * bucket_s, v)
    return [buckets[k] for k in sorted(buckets)]


def rss_verdict(points: list[tuple[float, float]], run_s: float) -> dict:
    """points: (seconds, RSS bytes) under load after warm-up. Two least-squares slopes: over every sample, and over
    the floor (the minimum of each minute). The verdict uses the floor: memory that leaks is never given back, so
    it lifts the floor, while buffers of requests in flight (HTTP/2 windows, relay buffers, 4 MiB bodies) swing
    the samples by tens of MiB and say nothing about leaks. Growth = floor slope extrapolated over the whole run;
    too much is more than max(RSS_LIMIT_MIB, RSS_LIMIT_FRACTION of the first value)."""
    if len(points) < MIN_FIT_SAMPLES or points[-1][0] - points[0][0] < MIN_FIT_SPAN_S:
        return {"judged": False, "samples": len(points)}
    slope = slope_per_min(points)  # bytes/min
    floor_slope = slope_per_min(floor_points(points))
    growth = floor_slope * run_s / 60.0
    limit = max(RSS_LIMIT_MIB * MIB, RSS_LIMIT_FRACTION * points[0][1])
    return {
        "judged": True,
        "samples": len(points),
        "slope_kib_per_min": slope / KIB,
        "floor_slope_kib_per_min": floor_slope / KIB,
        "growth_over_run_mib": growth / MIB,
        "limit_mib": limit / MIB,
        "flat": growth <= limit,
    }


@dataclass
class Op:
    path: str  # overlay-1, overlay-2, http
    kind: str
    start: float  # monotonic
    end: float
    outcome: str  # ok | failed | corrupted
    detail: str = ""
    nbytes: int = 0


def fault_kind(kind: str) -> str:
    """The fault without its target: "controller-B" -> "controller"."""
    return kind.split("-", 1)[0]


def path_group(path: str) -> str:
    return "http" if path == "http" else "overlay"


def in_window(op: Op, windows: Iterable[tuple[str, float, float]]) -> bool:
    """windows: (path group, start, end). True if the op's interval overlaps a window of its path group."""
    group = path_group(op.path)
    return any(g == group and op.start <= end and op.end >= start for g, start, end in windows)


def classify(ops: list[Op], windows: list[tuple[str, float, float]]) -> dict:
    table: dict = {}
    unexpected: list[Op] = []
    for op in ops:
        row = table.setdefault((op.path, op.kind), {"ok": 0, "failed": 0, "corrupted": 0, "unexpected": 0,
                                                    "timeouts": 0, "bytes": 0})
        row[op.outcome] += 1
        row["bytes"] += op.nbytes if op.outcome == "ok" else 0
        if op.outcome == "failed":
            if "Timeout" in op.detail:
                row["timeouts"] += 1
            if not in_window(op, windows):
                row["unexpected"] += 1
                unexpected.append(op)
    return {"table": table, "unexpected": unexpected}


@dataclass
class Write:
    """One admin write the writer made through one controller. ok: the command exited 0, i.e. the controller
    acknowledged it; a write that failed may still have been applied (its controller died after committing)."""

    seq: int
    through: str  # controller name
    op: str  # create | disable | revoke
    name: str
    ok: bool
    start: float  # seconds since load start
    end: float
    detail: str = ""


# The identity state each write leaves behind (a created identity waits for enrollment: pending).
STATE_AFTER = {"create": "pending", "disable": "disabled", "revoke": "revoked"}
NEXT_OP = {"create": "disable", "disable": "revoke"}  # an identity's writes, in order; revoked is final


def check_writes(writes: list[Write], observed: dict[str, str]) -> dict:
    """Every acknowledged write must be visible: each identity written must be in the state its last acknowledged
    write left, unless a later write to it failed and that one's state is what is there (a failed write may or may
    not have been applied: both are allowed, and each is counted, not hidden). observed: name -> state as one
    controller lists them (a name missing from it: not there). Returns the counts and the offending writes."""
    by_name: dict[str, list[Write]] = {}
    for w in sorted(writes, key=lambda w: w.seq):
        by_name.setdefault(w.name, []).append(w)
    lost: list[dict] = []
    failed_applied: list[dict] = []
    failed_not_applied: list[dict] = []
    for name, ws in by_name.items():
        acked = [w for w in ws if w.ok]
        last_ack = acked[-1] if acked else None
        later_failed = [w for w in ws if not w.ok and (last_ack is None or w.seq > last_ack.seq)]
        seen = observed.get(name)
        if last_ack is not None and seen == STATE_AFTER[last_ack.op]:
            failed_not_applied += [asdict(w) for w in later_failed]
            continue
        applied = [w for w in later_failed if seen == STATE_AFTER[w.op]]
        if applied:
            failed_applied.append({**asdict(applied[-1]), "observed": seen})
            failed_not_applied += [asdict(w) for w in later_failed if w is not applied[-1]]
        elif last_ack is not None:
            lost.append({**asdict(last_ack), "observed": seen})
        elif seen is None:
            failed_not_applied += [asdict(w) for w in later_failed]
        else:  # never acknowledged, and in a state none of its writes leaves: not a lost write, but not explained
            failed_applied.append({**asdict(later_failed[-1]), "observed": seen})
    return {"acknowledged": sum(w.ok for w in writes), "failed": sum(not w.ok for w in writes), "lost": lost,
            "failed_applied": failed_applied, "failed_not_applied": len(failed_not_applied)}


def label_controller_kills(plan: list[tuple[float, str]], controllers: int) -> list[tuple[float, str]]:
    """With several controllers, each "controller" event names the one it kills, in turn (A, B, A, ...), so that
    the other one keeps serving and every controller is killed as often as the others."""
    if controllers < 2:
        return plan
    out, k = [], 0
    for at, kind in plan:
        if kind == "controller":
            kind = f"controller-{CONTROLLER_NAMES[k % controllers]}"
            k += 1
        out.append((at, kind))
    return out


# ------------------------------------------------------------------------------------------------------------------
# The system under test
# ------------------------------------------------------------------------------------------------------------------


class System:
    """Controller(s), overlay gateway, backend, long-lived tunnels and the HTTP-mode gateway; processes that get
    killed are replaced by new objects, so always go through these attributes.

    One controller: SQLite in its state directory, as a single-controller deployment runs. Two: A (`controller init
    --store`) and B (`controller join`) on a PostgreSQL server this run starts and stops (pg_fixture); the devices
    and the gateway are enrolled through A once B has joined, so their identity files list both, in that order."""

    def __init__(self, binary: Path, work: Path, logs: Path, devices: int, controllers: int = 1,
                 leak_bytes: int = 0) -> None:
        self.work = work
        self.leak_bytes = leak_bytes  # --inject-leak: the gateways keep this much per request, on purpose
        self.logs = logs
        self.devices = [f"soak-dev-{i + 1}" for i in range(devices)]
        self.pg: Optional[pg_fixture.TestPostgres] = None
        self.store = ""
        root = work / "root"
        root.mkdir()
        if controllers == 1:
            self.controllers: dict[str, Controller] = {"": Controller(binary, root, logs)}
        else:
            self.controllers = {n: ClusterController(n, binary, root, logs, "") for n in CONTROLLER_NAMES[:controllers]}
        self.backend: Optional[Backend] = None
        self.gateway: Optional[ManagedProcess] = None
        self.http: Optional[Gateway] = None
        self.tunnels: dict[str, Tunnel] = {}
        self.certs = None
        self.lock = threading.Lock()  # guards process replacement against the sampler

    @property
    def controller(self) -> Controller:
        """The first controller: the one every identity is created and enrolled through."""
        return next(iter(self.controllers.values()))

    @property
    def clustered(self) -> bool:
        return len(self.controllers) > 1

    def role(self, name: str) -> str:
        return f"controller-{name}" if name else "controller"

    def admin_file(self, name: str) -> str:
        """The admin identity file that dials controller `name` only (one controller: the one init wrote)."""
        return f"identities/admin-{name}.json" if name else "identities/admin.json"

    def start(self) -> None:
        if self.clustered:
            self.start_cluster()
        else:
            r = self.controller.init()
            if r.returncode != 0:
                raise RuntimeError(f"controller init failed\n{r.describe()}")
            self.controller.start()
        self.backend = Backend(self.logs)
        self.backend.start()
        enroll(self.controller, "soak-gw", "gateway")
        for name in self.devices:
            enroll(self.controller, name, "device")
            listed = json.loads((self.controller.root / "identities" / f"{name}.json").read_text()).get("controllers")
            if self.clustered and listed != [c.address for c in self.controllers.values()]:
                raise RuntimeError(f"{name}'s identity file lists controllers {listed}, expected all of them in order")
        self.start_gateway()
        for i, name in enumerate(self.devices):
            t = Tunnel(self.controller, name, self.logs)
            t.start()
            self.tunnels[f"overlay-{i + 1}"] = t
        pki = self.work / "pki"
        pki.mkdir()
        self.certs = make_certs(pki)
        self.http = Gateway(self.controller.binary, "tls", self.backend, self.certs, self.logs, [])
        self.http.env = self.gateway_env(self.http.env)
        self.http.start()
        self.check_leak_switch(self.http)

    def start_cluster(self) -> None:
        """PostgreSQL, A on it, B joined to it, and an admin file per controller that dials that one only."""
        self.pg = pg_fixture.start_postgres()
        atexit.register(self.pg.stop)  # idempotent; a backstop for an exit that skips stop()
        self.store = self.pg.create_database()
        # Every controller command gets the password through the environment (cli_env), never on a command line.
        os.environ["PGPASSWORD"] = pg_fixture.PASSWORD
        a, *others = self.controllers.values()
        for c in self.controllers.values():
            c.store = self.store
        r = a.cli("controller", "init", "--state-dir", str(a.state_dir), "--address", a.address, "--store", self.store)
        if r.returncode != 0:
            raise RuntimeError(f"controller init --store failed\n{r.describe()}")
        a.start()
        for b in others:
            r = b.cli("controller", "join", "--identity", "identities/admin.json", "--address", b.address,
                      "--state-dir", str(b.state_dir))
            if r.returncode != 0:
                raise RuntimeError(f"controller join ({b.name}) failed\n{r.describe()}")
            b.start()
        admin = json.loads((a.root / "identities" / "admin.json").read_text())
        for name, c in self.controllers.items():
            path = a.root / self.admin_file(name)
            path.write_text(json.dumps({**admin, "controller": c.address, "controllers": [c.address]}, indent=2))
            os.chmod(path, 0o600)

    def start_gateway(self) -> None:
        g = gateway_process(self.controller, self.backend, self.logs, identity="soak-gw")
        g.env = self.gateway_env(g.env)
        g.start()
        g.wait_for_log("hosting service")
        self.check_leak_switch(g)
        if self.clustered:  # it learns the other controllers from the first and links to each
            wait_gateway_linked(SimpleNamespace(gateway=g), *self.controllers.values())
        with self.lock:
            self.gateway = g

    def gateway_env(self, env: Optional[dict[str, str]]) -> Optional[dict[str, str]]:
        """A gateway's environment: with --inject-leak, its own plus the leak switch; otherwise unchanged (None:
        inherit this process's). Only the gateways get it: they are what runs the proxy core."""
        if not self.leak_bytes:
            return env
        return {**(os.environ if env is None else env), LEAK_ENV: str(self.leak_bytes)}

    def check_leak_switch(self, gateway: ManagedProcess) -> None:
        """A leak run whose binary ignores the switch would pass and look like a judge that cannot see leaks."""
        if self.leak_bytes:
            gateway.wait_for_log(f"{LEAK_ENV} is set", timeout=10)

    def processes(self) -> list[tuple[str, ManagedProcess]]:
        with self.lock:
            out = [(self.role(n), c.process) for n, c in self.controllers.items()]
            out += [("gateway-overlay", self.gateway), ("backend", self.backend), ("gateway-http", self.http)]
            out += [(f"tunnel-{path}", t) for path, t in self.tunnels.items()]
        return [(role, p) for role, p in out if p is not None and p.alive()]

    # -- clients per path ----------------------------------------------------------------------------------------

    def paths(self) -> list[str]:
        return list(self.tunnels) + ["http"]

    def client(self, path: str, timeout: float = REQUEST_TIMEOUT_S) -> httpx.Client:
        if path == "http":
            return self.http.client(timeout)
        return self.tunnels[path].client(timeout)

    def ws(self, path: str, target: str):
        if path == "http":
            return ws_connect(self.http.ws_url(target), ssl=self.certs.client_context(), proxy=None,
                              compression=None, open_timeout=10, close_timeout=5, max_size=4 * MIB)
        return ws_connect(f"ws://127.0.0.1:{self.tunnels[path].port}{target}", proxy=None, compression=None,
                          open_timeout=10, close_timeout=5, max_size=4 * MIB)

    def identity_for(self, path: str) -> Optional[str]:
        return None if path == "http" else self.devices[int(path.split("-")[1]) - 1]

    def probe(self, path: str, timeout: float = 3.0) -> tuple[bool, str]:
        """One small request; for overlay paths it must arrive as the path's device."""
        try:
            with self.client(path, timeout) as c:
                r = c.get("/debug/headers")
            if r.status_code != 200:
                return False, f"HTTP {r.status_code}: {r.text[:120]!r}"
            who = self.identity_for(path)
            if who is not None and r.json()["headers"].get("x-ils-identity") != [who]:
                return False, f"identity header {r.json()['headers'].get('x-ils-identity')!r}, expected {who}"
            return True, "HTTP 200"
        except (httpx.HTTPError, OSError, ValueError) as e:
            return False, repr(e)

    def stop(self) -> dict[str, Optional[int]]:
        """SIGTERM everything still running (SIGKILL after 5 s), then stop PostgreSQL; returns each role's exit
        status."""
        return stop_all([(f"tunnel-{k}", t) for k, t in self.tunnels.items()] + [
            ("gateway-http", self.http), ("gateway-overlay", self.gateway), ("backend", self.backend),
            *[(self.role(n), c.process) for n, c in self.controllers.items()]], self.pg)


def stop_all(processes: list, pg) -> dict[str, Optional[int]]:
    """SIGTERM each (role, ManagedProcess) still running (SIGKILL after 5 s) and the leftovers, then stop PostgreSQL
    (`pg`, or None); returns each role's exit status (None where stopping failed, which is logged)."""
    codes: dict[str, Optional[int]] = {}
    try:
        for role, p in processes:
            if p is not None and p.proc is not None:
                try:
                    codes[role] = p.stop()
                except Exception as e:  # keep stopping the others
                    codes[role] = None
                    log(f"stopping {role}: {e!r}")
        stop_leftovers()
    finally:
        if pg is not None:
            try:
                pg.stop()
            except (Exception, *HarnessFailure) as e:
                log(f"stopping PostgreSQL: {type(e).__name__}: {str(e)[:300]}")
    return codes


def stop_leftovers() -> None:
    """Stops anything else started through the e2e helpers and still running (a throwaway tunnel, say)."""
    for p in list(conftest._running):
        try:
            p.stop(timeout=2)
        except Exception:
            pass


# ------------------------------------------------------------------------------------------------------------------
# Load
# ------------------------------------------------------------------------------------------------------------------


class Gate:
    """Lets workers start operations while open; pause() closes it and waits for the ones in flight."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.open = True
        self.inflight = 0

    def enter(self, stop: threading.Event) -> bool:
        with self.cond:
            while not self.open and not stop.is_set():
                self.cond.wait(0.2)
            if stop.is_set():
                return False
            self.inflight += 1
            return True

    def leave(self) -> None:
        with self.cond:
            self.inflight -= 1
            self.cond.notify_all()

    def pause(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.cond:
            self.open = False
            while self.inflight and time.monotonic() < deadline:
                self.cond.wait(0.2)
            return self.inflight == 0

    def resume(self) -> None:
        with self.cond:
            self.open = True
            self.cond.notify_all()


class Load:
    def __init__(self, system: System, max_bytes: int, seed: int) -> None:
        self.system = system
        self.max_bytes = max_bytes
        self.ops: list[Op] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.gate = Gate()
        self.threads: list[threading.Thread] = []
        self.seed = seed
        self.counter = 0
        self.current: dict[str, float] = {}  # worker -> start of its operation in flight

    def start(self) -> None:
        for path in self.system.paths():
            for kind in KINDS:
                t = threading.Thread(target=self.worker, args=(path, kind), name=f"{path}-{kind}", daemon=True)
                t.start()
                self.threads.append(t)

    def finish(self) -> None:
        """Stops the workers; one still inside an operation after every timeout has expired is hung (a blocking
        call without a timeout of its own, e.g. a WebSocket send to a peer that stopped reading): recorded as a
        failure by timeout."""
        self.stop.set()
        self.gate.resume()
        deadline = time.monotonic() + REQUEST_TIMEOUT_S + 10
        for t in self.threads:
            t.join(timeout=max(0.1, deadline - time.monotonic()))
        for t in self.threads:
            started = self.current.get(t.name)
            if t.is_alive() and started is not None:
                path, kind = t.name.rsplit("-", 1)
                with self.lock:
                    self.ops.append(Op(path, kind, started, time.monotonic(), "failed",
                                       "Timeout: operation still running at the end (hung)"))

    def next_id(self) -> int:
        with self.lock:
            self.counter += 1
            return self.counter

    def size(self, rng: random.Random) -> int:
        # Log-uniform from 1 byte to max_bytes, so small and large bodies are both common.
        return max(1, int(2 ** rng.uniform(0, max(1.0, (self.max_bytes).bit_length() - 1))))

    def worker(self, path: str, kind: str) -> None:
        rng = random.Random(f"{self.seed}-{path}-{kind}")
        op_fn: Callable = getattr(self, f"op_{kind}")
        client: Optional[httpx.Client] = None
        uses = 0
        while not self.stop.is_set():
            if not self.gate.enter(self.stop):
                break
            started = time.monotonic()
            self.current[threading.current_thread().name] = started
            try:
                if client is None and kind != "ws":
                    client, uses = self.system.client(path), 0
                outcome, detail, nbytes = op_fn(path, client, rng)
            except Exception as e:  # connection errors, timeouts, protocol errors: a failure, not a corruption
                outcome, detail, nbytes = "failed", f"{type(e).__name__}: {e}"[:300], 0
            finally:
                self.current.pop(threading.current_thread().name, None)
                self.gate.leave()
            op = Op(path, kind, started, time.monotonic(), outcome, detail, nbytes)
            with self.lock:
                self.ops.append(op)
            if outcome == "corrupted":
                log(f"CORRUPTED {path} {kind}: {detail}")
            uses += 1
            if client is not None and (outcome != "ok" or uses >= 50):  # fresh connections now and then
                client.close()
                client = None
            # Think time; longer after a failure, so a path that is down is not hammered in a tight loop.
            self.stop.wait(rng.uniform(0, 0.1) + (0.25 if outcome == "failed" else 0))
        if client is not None:
            client.close()

    def op_sse(self, path: str, client: httpx.Client, rng: random.Random) -> tuple[str, str, int]:
        n, interval = rng.randint(3, 30), rng.choice((0, 10, 50, 100))
        prompt = f"soak {path} {self.next_id()} {rng.getrandbits(32):08x}"
        with client.stream("GET", "/claude/stream", params={"prompt": prompt, "n": n, "interval_ms": interval}) as r:
            if r.status_code != 200:
                return "failed", f"HTTP {r.status_code} {r.read()[:120]!r}", 0
            events = parse_sse(timed_lines(r, deadline_s=REQUEST_TIMEOUT_S))
        problem = verify_sse(events, prompt, n)
        return ("corrupted", problem, 0) if problem else ("ok", "", n)

    def op_download(self, path: str, client: httpx.Client, rng: random.Random) -> tuple[str, str, int]:
        size, seed, chunked = self.size(rng), rng.getrandbits(31), rng.randint(0, 1)
        h, received = hashlib.sha256(), 0
        with client.stream("GET", "/bytes", params={"size": size, "seed": seed, "chunked": chunked}) as r:
            if r.status_code != 200:
                return "failed", f"HTTP {r.status_code} {r.read()[:120]!r}", 0
            for piece in r.iter_raw():
                h.update(piece)
                received += len(piece)
        problem = verify_download(received, h.hexdigest(), size, seed)
        return ("corrupted", problem, received) if problem else ("ok", "", received)

    def op_upload(self, path: str, client: httpx.Client, rng: random.Random) -> tuple[str, str, int]:
        body = rng.randbytes(self.size(rng))
        r = client.post("/upload", content=body, headers={"content-type": "application/octet-stream"})
        if r.status_code != 200:
            return "failed", f"HTTP {r.status_code} {r.text[:120]!r}", 0
        try:
            reply = r.json()
        except ValueError:
            reply = r.text[:120]
        problem = verify_upload(reply, len(body), hashlib.sha256(body).hexdigest())
        return ("corrupted", problem, len(body)) if problem else ("ok", "", len(body))

    def op_ws(self, path: str, client: None, rng: random.Random) -> tuple[str, str, int]:
        sent, received = [], []
        with self.system.ws(path, "/ws/echo") as ws:
            for _ in range(rng.randint(1, 20)):
                if rng.random() < 0.5:
                    msg: object = "".join(rng.choices(string.ascii_letters + string.digits + "äß€ ",
                                                      k=rng.randint(0, 4096)))
                else:
                    msg = rng.randbytes(rng.randint(0, 256 * KIB))
                sent.append(msg)
                ws.send(msg)
                received.append(ws.recv(timeout=REQUEST_TIMEOUT_S))
        problem = verify_ws(sent, received)
        total = sum(len(m) for m in sent)
        return ("corrupted", problem, total) if problem else ("ok", "", total)


# ------------------------------------------------------------------------------------------------------------------
# Sampling
# ------------------------------------------------------------------------------------------------------------------


@dataclass
class Sample:
    t: float  # seconds since load start
    role: str
    pid: int
    rss: int  # VmRSS: everything resident
    anon: int  # RssAnon: private (heap, stacks): what a leak grows, and what the verdict judges
    fds: int
    paused: bool = False  # taken while the load was paused for a quiescent point (not used in slope fits)
    cpu: float = 0.0  # CPU seconds used so far (user + system): where it grows fast, the incarnation carries load


def resident(pid: int) -> tuple[int, int]:
    """(VmRSS, RssAnon) in bytes. RSS also counts file-backed pages: the executable's and libraries' code and data,
    faulted in as code paths first run (a restart path, a TLS error path) and shared with every other process mapping
    them; they can grow only up to the size of those files. Private anonymous memory is where a leak shows."""
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon"):
                fields[key] = int(value.split()[0]) * 1024
    if "VmRSS" not in fields:
        raise AssertionError(f"no VmRSS for pid {pid}")
    return fields["VmRSS"], fields.get("RssAnon", fields["VmRSS"])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process so far, from /proc/PID/stat (fields 14 and 15, after the command name,
    which may itself hold spaces and parentheses)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class Sampler:
    def __init__(self, system: System, t0: float, interval: float, gate: Gate) -> None:
        self.system = system
        self.gate = gate
        self.t0 = t0
        self.interval = interval
        self.samples: list[Sample] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="sampler", daemon=True)

    def read(self) -> list[Sample]:
        now = time.monotonic() - self.t0
        paused = not self.gate.open
        out = []
        for role, p in self.system.processes():
            try:
                rss, anon = resident(p.pid)
                out.append(Sample(now, role, p.pid, rss, anon, fd_count(p.pid), paused, cpu_seconds(p.pid)))
            except (OSError, AssertionError, IndexError, ValueError):
                pass  # exited between the listing and the read
        return out

    def run(self) -> None:
        while not self.stop.is_set():
            self.samples.extend(self.read())
            self.stop.wait(self.interval)

    def quiescent(self, label: str) -> dict[str, dict]:
        """Pauses the load, waits for descriptors to settle (idle connections are closed after 4-5 s), returns a
        snapshot per role. The load stays paused; the caller resumes it."""
        drained = self.gate.pause(REQUEST_TIMEOUT_S + 10)
        time.sleep(6.0)
        previous = None
        deadline = time.monotonic() + 20
        while True:
            snap = {s.role: s for s in self.read()}
            counts = {r: s.fds for r, s in snap.items()}
            if counts == previous or time.monotonic() > deadline:
                break
            previous = counts
            time.sleep(1.0)
        log(f"quiescent point ({label}): " + ", ".join(f"{r} {s.fds} fds {s.rss / MIB:.1f} MiB "
                                                       f"({s.anon / MIB:.1f} private)"
                                                       for r, s in sorted(snap.items())))
        return {r: {**asdict(s), "drained": drained} for r, s in snap.items()}


# ------------------------------------------------------------------------------------------------------------------
# Faults and revocations
# ------------------------------------------------------------------------------------------------------------------


@dataclass
class Event:
    kind: str
    at: float  # seconds since load start
    ok: bool = False
    details: dict = field(default_factory=dict)
    window: Optional[tuple[float, float]] = None  # monotonic, for classification


class Chaos:
    def __init__(self, system: System, t0: float, stop: threading.Event) -> None:
        self.system = system
        self.t0 = t0
        self.stop = stop
        self.events: list[Event] = []
        self.windows: list[tuple[str, float, float]] = []  # (path group, start, end), monotonic
        self.revocations = 0

    def rel(self, t: float) -> float:
        return round(t - self.t0, 3)

    def wait_recovered(self, paths: list[str], since: float) -> dict[str, Optional[float]]:
        """Probes each path until one request goes through; seconds after `since`, None if not within the bound."""
        result: dict[str, Optional[float]] = {p: None for p in paths}

        def probe(p: str) -> None:  # one prober per path, so a slow path does not delay another's measurement
            last = ""
            while time.monotonic() - since < RECOVERY_BOUND_S:
                ok, last = self.system.probe(p, timeout=min(3.0, RECOVERY_BOUND_S))
                if ok:
                    result[p] = round(time.monotonic() - since, 3)
                    return
                time.sleep(0.1)
            log(f"  {p} not recovered within {RECOVERY_BOUND_S} s (last: {last})")

        threads = [threading.Thread(target=probe, args=(p,), daemon=True) for p in paths]
        for t in threads:
            t.start()
        for t in threads:
            t.join(RECOVERY_BOUND_S + 5)
        return result

    def run_event(self, kind: str) -> Event:
        ev = Event(kind, self.rel(time.monotonic()))
        log(f"event: {kind}")
        try:
            if kind == "revoke":
                self.revoke(ev)
            else:
                self.fault(kind, ev)
        except (Exception, HarnessFailure) as e:
            ev.ok = False
            ev.details["error"] = f"{type(e).__name__}: {e}"[:2000]
            log(f"  {kind} failed: {ev.details['error'][:300]}")
        if ev.window is not None:
            for group in FAULT_PATHS[fault_kind(kind)]:
                self.windows.append((group, *ev.window))
        self.events.append(ev)
        return ev

    def fault(self, kind: str, ev: Event) -> None:
        s = self.system
        if fault_kind(kind) == "controller" and s.clustered:
            self.kill_one_controller(kind.split("-", 1)[1], ev)
            return
        victim = {"controller": s.controller.process, "backend": s.backend, "gateway": s.gateway}[kind]
        ev.details["killed_pid"] = victim.pid
        killed = time.monotonic()
        ev.window = (killed, killed + RECOVERY_BOUND_S + 60)  # provisional, until recovery is known
        sigkill(victim)
        time.sleep(random.uniform(0.5, 2.0))  # down for a moment, with the load still running
        restarting = time.monotonic()
        if kind == "controller":
            s.controller.start()  # same state directory and port; returns once the port accepts
            ev.details["integrity_check"] = integrity(s.controller.state_dir / "store.sqlite")
        elif kind == "backend":
            b = Backend(s.logs, port=s.backend.port)
            b.start()  # returns once /health answers
            with s.lock:
                s.backend = b
        else:
            s.start_gateway()  # returns once it logs "hosting service"
        back = time.monotonic()
        new = {"controller": s.controller.process, "backend": s.backend, "gateway": s.gateway}[kind]
        ev.details.update(new_pid=new.pid, down_s=round(restarting - killed, 3), restart_s=round(back - restarting, 3))
        paths = [p for p in s.paths() if path_group(p) in FAULT_PATHS[kind]]
        recovered = self.wait_recovered(paths, back)
        ev.details["recovered_s"] = recovered
        ev.details["outage_s"] = {p: round(back + v - killed, 3) if v is not None else None
                                  for p, v in recovered.items()}
        done = [v for v in recovered.values() if v is not None]
        if len(done) == len(recovered):
            ev.window = (killed, back + max(done) + FAULT_GRACE_S)
        ev.ok = len(done) == len(recovered) and ev.details.get("integrity_check", "ok") == "ok"
        log(f"  killed pid {ev.details['killed_pid']}, down {ev.details['down_s']} s, restart took "
            f"{ev.details['restart_s']} s, recovered after {recovered}"
            + (f", integrity_check {ev.details['integrity_check']}" if kind == "controller" else ""))

    def kill_one_controller(self, name: str, ev: Event) -> None:
        """SIGKILL one controller of the cluster while the others keep serving. The tunnels fail over to the next
        controller in their list at once, so the overlay's fault window runs from the kill to the first request
        through each overlay path after it (plus FAULT_GRACE_S), not to the restart; the killed controller is then
        restarted (same state directory and port) and must serve admin reads again, and the gateway must link to it
        again, before the next event."""
        s = self.system
        c = s.controllers[name]
        ev.details.update(controller=name, killed_pid=c.process.pid)
        killed = time.monotonic()
        ev.window = (killed, killed + RECOVERY_BOUND_S + 60)  # provisional, until failover is measured
        gateway_mark = len(s.gateway.full_log())
        sigkill(c.process)
        paths = [p for p in s.paths() if path_group(p) == "overlay"]
        recovered = self.wait_recovered(paths, killed)  # through the surviving controller, with it still down
        ev.details["failover_s"] = recovered
        ev.details["recovered_s"] = recovered
        ev.details["outage_s"] = dict(recovered)
        done = [v for v in recovered.values() if v is not None]
        if len(done) == len(recovered):
            ev.window = (killed, killed + max(done) + FAULT_GRACE_S)
        time.sleep(random.uniform(0.5, 2.0))  # down for a moment more, with the load still running
        restarting = time.monotonic()
        c.start()  # returns once the port accepts
        back = time.monotonic()
        r = c.cli("admin", "identity", "list", "--identity", s.admin_file(name), "--json")
        serves = r.returncode == 0
        relinked: Optional[float] = None
        deadline = time.monotonic() + RECOVERY_BOUND_S
        while relinked is None and time.monotonic() < deadline:
            if any("hosting service" in line and f"controller={c.address}" in line
                   for line in s.gateway.full_log()[gateway_mark:].splitlines()):
                relinked = round(time.monotonic() - back, 3)
            else:
                time.sleep(0.1)
        ev.details.update(new_pid=c.process.pid, down_s=round(restarting - killed, 3),
                          restart_s=round(back - restarting, 3), serves_after_restart=serves,
                          gateway_relinked_s=relinked)
        if not serves:
            ev.details["error"] = f"admin identity list through {name} after its restart failed: {r.stderr[:300]}"
        ev.ok = len(done) == len(recovered) and serves and relinked is not None
        log(f"  killed controller {name} (pid {ev.details['killed_pid']}), overlay through the other after "
            f"{recovered}, restart took {ev.details['restart_s']} s, serves again {serves}, gateway relinked after "
            f"{relinked} s")

    def revoke(self, ev: Event) -> None:
        s, c = self.system, self.system.controller
        self.revocations += 1
        name = f"throwaway-{self.revocations}"
        started = time.monotonic()
        enroll(c, name, "device")
        tunnel = Tunnel(c, name, s.logs)
        try:
            tunnel.start()
            ev.details["enroll_and_start_s"] = round(time.monotonic() - started, 3)
            self.revoke_through(ev, name, tunnel)
        finally:
            if tunnel.proc is not None and tunnel.alive():  # the check failed half-way: do not leave it running
                tunnel.stop()

    def revoke_through(self, ev: Event, name: str, tunnel: Tunnel) -> None:
        c = self.system.controller
        client = tunnel.client(timeout=REVOKE_END_BOUND_S + 5)
        try:
            response = client.send(client.build_request(
                "GET", "/claude/stream", params={"prompt": name, "n": 100000, "interval_ms": 50}), stream=True)
            if response.status_code != 200:
                raise RuntimeError(f"the throwaway device's stream was refused: HTTP {response.status_code}")
            lines = timed_lines(response, deadline_s=60)
            first = parse_sse(lines, stop_after=2)
            ev.details["events_before_revoke"] = len(first)
            cmd_start = time.monotonic()
            r = c.cli("admin", "identity", "revoke", name)
            cmd_end = time.monotonic()
            if r.returncode != 0:
                raise RuntimeError(f"revoke failed\n{r.describe()}")
            how, more = "clean end", 0
            try:
                for line in lines:
                    if line[1].startswith("data:"):
                        more += 1
            except httpx.HTTPError as e:
                how = type(e).__name__
            except AssertionError:  # timed_lines' deadline
                how = "Timeout: still streaming 60 s after it opened"
            ended = time.monotonic()
            response.close()
        finally:
            client.close()
        ev.details.update(revoke_cmd_s=round(cmd_end - cmd_start, 3),
                          stream_end_after_cmd_return_s=round(ended - cmd_end, 3),
                          stream_end_after_cmd_start_s=round(ended - cmd_start, 3),
                          stream_ended_by=how, events_after_revoke=more)
        refusals = []
        for _ in range(2):  # new requests through the revoked device's tunnel must be refused, promptly
            t = time.monotonic()
            try:
                with tunnel.client(timeout=REFUSAL_BOUND_S) as cl:
                    st = cl.get("/health").status_code
                outcome = f"HTTP {st}"
            except httpx.HTTPError as e:
                outcome = type(e).__name__
            refusals.append({"outcome": outcome, "after_s": round(time.monotonic() - t, 3)})
        ev.details["new_requests"] = refusals
        refused = all(not x["outcome"].startswith("HTTP 2") and "Timeout" not in x["outcome"] for x in refusals)
        alive_before_stop = tunnel.alive()
        code = tunnel.stop()
        ev.details.update(tunnel_alive_until_stopped=alive_before_stop, tunnel_exit=code)
        ev.ok = (ended - cmd_end <= REVOKE_END_BOUND_S and "Timeout" not in how and refused
                 and alive_before_stop and code == 0)
        log(f"  {name}: revoke took {ev.details['revoke_cmd_s']} s, stream ended "
            f"{ev.details['stream_end_after_cmd_return_s'] * 1000:.0f} ms after it returned ({how}), new requests "
            f"{[x['outcome'] for x in refusals]}, tunnel exit {code}")


class AdminWriter:
    """Admin writes through the controllers in turn (A, B, A, ...), each with an admin file that dials that one
    only, so a write to a controller just killed fails instead of failing over: identities `soak-w-N` are created,
    then disabled, then revoked, one step per write. Each write is recorded with whether its controller acknowledged
    it (exit 0); an identity whose write failed gets no further writes, so its state can only be the last
    acknowledged one or the failed one's. The writer pauses with the load at quiescent points."""

    def __init__(self, system: System, t0: float, gate: Gate, seed: int) -> None:
        self.system = system
        self.t0 = t0
        self.gate = gate
        self.rng = random.Random(f"{seed}-writer")
        self.writes: list[Write] = []
        self.open: list[tuple[str, str]] = []  # (identity, its next write), after an acknowledged write
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="admin-writer", daemon=True)

    def run(self) -> None:
        names = list(self.system.controllers)
        created = 0
        while not self.stop.is_set():
            if not self.gate.enter(self.stop):
                break
            try:
                through = names[len(self.writes) % len(names)]
                if self.open and self.rng.random() < 0.6:
                    name, op = self.open.pop(self.rng.randrange(len(self.open)))
                else:
                    created += 1
                    name, op = f"soak-w-{created}", "create"
                start = time.monotonic() - self.t0
                ok, detail = self.write(through, op, name)
                end = time.monotonic() - self.t0
            finally:
                self.gate.leave()
            self.writes.append(Write(len(self.writes) + 1, through, op, name, ok, round(start, 3), round(end, 3),
                                     detail))
            if ok and op in NEXT_OP:
                self.open.append((name, NEXT_OP[op]))
            self.stop.wait(self.rng.uniform(*WRITE_INTERVAL_S))

    def write(self, through: str, op: str, name: str) -> tuple[bool, str]:
        c = self.system.controllers[through]
        admin = self.system.admin_file(through)
        # create prints the enrollment token on stdout: captured here and dropped, never logged.
        args = (["admin", "identity", "create", name, "--role", "device", "--identity", admin] if op == "create"
                else ["admin", "identity", op, "--identity", admin, name])
        try:
            r = c.cli(*args, timeout=CLI_WRITE_TIMEOUT_S)
        except HarnessFailure:
            return False, f"no answer within {CLI_WRITE_TIMEOUT_S:.0f} s"
        return r.returncode == 0, "" if r.returncode == 0 else f"exit {r.returncode}: {r.stderr.strip()[:300]}"

    def verify(self) -> dict:
        """Every controller's view of the written identities, checked against the acknowledged writes."""
        views: dict[str, dict] = {}
        for through, c in self.system.controllers.items():
            try:
                r = c.cli("admin", "identity", "list", "--identity", self.system.admin_file(through), "--json",
                          timeout=CLI_WRITE_TIMEOUT_S)
            except HarnessFailure as e:
                views[through] = {"error": str(e)[:300]}
                continue
            if r.returncode != 0:
                views[through] = {"error": f"exit {r.returncode}: {r.stderr.strip()[:300]}"}
                continue
            listed = json.loads(r.stdout)
            listed = listed.get("identities", []) if isinstance(listed, dict) else listed
            observed = {i["name"]: i["state"] for i in listed if str(i.get("name", "")).startswith("soak-w-")}
            views[through] = check_writes(self.writes, observed)
        return views


# ------------------------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------------------------


def load_onset(ss: list[Sample], floor: float = LOAD_CPU_FLOOR, fraction: float = LOAD_CPU_FRACTION,
               confirm_s: float = LOAD_CONFIRM_S) -> Optional[float]:
    """When one incarnation's samples (in time order) start carrying load, None if they never do.

    Its busy level is the highest median CPU share (of one core, per interval between samples) over any confirm_s
    window of its life; it carries load from the first sample from which most intervals over the next confirm_s each
    reach `fraction` of that level, and at least `floor`. Relative, because what a process under load uses depends
    on the build and on how many processes share the cores (a tunnel relaying 4 MiB/s used 8 % of a core in a debug
    run on 2 cores); a floor, because an idle process's own busiest minute is still idle. A median and a majority, so
    that one busy interval (the start-up, a burst of admin requests) does not make an idle process loaded and one
    quiet interval does not hide a loaded one."""
    shares = [(b.cpu - a.cpu) / (b.t - a.t) if b.t > a.t else 0.0 for a, b in zip(ss, ss[1:])]
    windows = []  # (sample index, the shares of the intervals in the confirm_s seconds after it)
    j = 0
    for i, a in enumerate(ss):
        j = max(j, i + 1)
        while j < len(ss) and ss[j].t - a.t < confirm_s:
            j += 1
        if j == len(ss):
            break
        windows.append((i, shares[i:j]))
    if not windows:
        return None
    busy = max(sorted(w)[len(w) // 2] for _, w in windows)
    threshold = max(floor, fraction * busy)
    for i, w in windows:
        if 2 * sum(x >= threshold for x in w) > len(w):
            return ss[i].t
    return None


def warmed_up(ss: list[Sample], warmup_s: float,
              inc_warmup_s: float = INCARNATION_WARMUP_S) -> tuple[float, Optional[float]]:
    """(end of its own warm-up, load onset or None) for one incarnation: once it has carried load for the run's
    warm-up (warmup_s), or, if it never carries load, INCARNATION_WARMUP_S after its birth."""
    onset = load_onset(ss)
    return (onset + warmup_s if onset is not None else ss[0].t + inc_warmup_s), onset


def analyse_memory(samples: list[Sample], fit_from_s: float, run_s: float, warmup_s: float,
                   inc_warmup_s: float = INCARNATION_WARMUP_S) -> list[dict]:
    """Per incarnation (role, pid): first/last/max, and the RSS slope over the samples taken under load after the
    run's warm-up (fit_from_s: when the load resumed after the first quiescent point) and after the incarnation's
    own warm-up: warmup_s (the run's) from when it starts carrying load, or inc_warmup_s from its birth if it never
    does (judged as idle)."""
    by_inc: dict[tuple[str, int], list[Sample]] = {}
    for s in samples:
        by_inc.setdefault((s.role, s.pid), []).append(s)
    rows = []
    for (role, pid), ss in sorted(by_inc.items(), key=lambda kv: (kv[0][0], kv[1][0].t)):
        warm, onset = warmed_up(ss, warmup_s, inc_warmup_s)
        start = max(fit_from_s, warm)  # never before the run's warm-up and first quiescent point
        settled = [s for s in ss if s.t >= start and not s.paused]
        life = ss[-1].t - ss[0].t
        rss = rss_verdict([(s.t, s.rss) for s in settled], run_s)  # reported
        anon = rss_verdict([(s.t, s.anon) for s in settled], run_s)  # judged
        rows.append({
            "role": role, "pid": pid, "from_s": round(ss[0].t, 1), "to_s": round(ss[-1].t, 1), "samples": len(ss),
            "carries_load": onset is not None, "load_from_s": round(onset, 1) if onset is not None else None,
            "warm_from_s": round(warm, 1), "judged_from_s": round(start, 1),
            "cpu_share": (ss[-1].cpu - ss[0].cpu) / life if life > 0 else 0.0,
            "rss_first_mib": ss[0].rss / MIB, "rss_settled_mib": settled[0].rss / MIB if settled else None,
            "rss_last_mib": ss[-1].rss / MIB, "rss_max_mib": max(s.rss for s in ss) / MIB,
            "fds_first": ss[0].fds, "fds_last": ss[-1].fds, "fds_max": max(s.fds for s in ss),
            "fds_slope_per_min": slope_per_min([(s.t, s.fds) for s in settled]) if len(settled) > 1 else 0.0,
            "anon_first_mib": ss[0].anon / MIB, "anon_settled_mib": settled[0].anon / MIB if settled else None,
            "anon_last_mib": ss[-1].anon / MIB,
            "anon_max_mib": max(s.anon for s in ss) / MIB,
            **{f"rss_{k}": v for k, v in rss.items()},
            **{f"anon_{k}": v for k, v in anon.items()},
        })
    return rows


def fd_checks(first: dict, last: dict, settled_from: Optional[dict[int, float]] = None) -> list[dict]:
    """Quiescent point after warm-up vs at the end, per role: descriptors back to where they were (any
    incarnation: a restarted process at rest holds the same sockets and files), and for a process that was never
    restarted, private memory (RssAnon) grown by at most QUIESCENT_RSS_LIMIT_MIB. settled_from (pid -> seconds: the
    end of each incarnation's own warm-up, analyse_memory's warm_from_s) leaves memory uncompared where the first
    point was taken during that warm-up (under load, or its start-up if idle): what it fills then is not growth."""
    out = []
    for role in sorted(set(first) & set(last)):
        a, b = first[role], last[role]
        same = a["pid"] == b["pid"]
        warm = settled_from is None or a.get("t", 0.0) >= settled_from.get(a["pid"], 0.0)
        rss_judged = same and warm
        rss_ok = not rss_judged or b["anon"] - a["anon"] <= QUIESCENT_RSS_LIMIT_MIB * MIB
        out.append({"role": role, "pid_first": a["pid"], "pid_last": b["pid"], "fds_first": a["fds"],
                    "fds_last": b["fds"], "rss_first_mib": a["rss"] / MIB, "rss_last_mib": b["rss"] / MIB,
                    "anon_first_mib": a["anon"] / MIB, "anon_last_mib": b["anon"] / MIB,
                    "fds_ok": b["fds"] <= a["fds"] + FD_SLACK, "rss_judged": rss_judged, "rss_ok": rss_ok,
                    "ok": b["fds"] <= a["fds"] + FD_SLACK and rss_ok})
    return out


def admin_writes_summary(writes: list[Write], views: dict) -> dict:
    """The admin writer's counts per controller and, per controller's view at the end, lost acknowledged writes and
    failed writes that were applied anyway (allowed, reported)."""
    per = {}
    for w in writes:
        row = per.setdefault(w.through, {"acknowledged": 0, "failed": 0})
        row["acknowledged" if w.ok else "failed"] += 1
    checked = [v for v in views.values() if "error" not in v]
    return {
        "made": len(writes), "acknowledged": sum(w.ok for w in writes), "failed": sum(not w.ok for w in writes),
        "by_controller": per,
        "lost": max((len(v["lost"]) for v in checked), default=None) if len(checked) == len(views) else None,
        "failed_applied": max((len(v["failed_applied"]) for v in checked), default=0),
        "views": views,
        "failed_writes": [asdict(w) for w in writes if not w.ok][:200],
    }


def injected_leak(ops: list[Op], per_request: int, first: dict, last: dict, t0: float) -> dict:
    """What --inject-leak should have kept, per gateway: requests (one per operation; a WebSocket session is one)
    through its paths between the first quiescent point and the last, times the bytes per request. An estimate: a
    request that failed before reaching the gateway kept nothing."""
    out = {}
    for role, group in (("gateway-http", "http"), ("gateway-overlay", "overlay")):
        a, b = first.get(role, {}).get("t"), last.get(role, {}).get("t")
        n = sum(1 for o in ops if path_group(o.path) == group and a is not None and b is not None
                and a <= o.start - t0 <= b)
        out[role] = {"requests_between_quiescent_points": n, "expected_kept_mib": n * per_request / MIB}
    return out


def render_markdown(rep: dict) -> str:
    L = [f"# Soak run {rep['started_utc']}", "",
         f"Binary `{rep['binary']}`, load {rep['duration_s'] / 60:.1f} min, warm-up {rep['warmup_s']:.0f} s, "
         f"events every {rep['event_period_s']:.0f} s, controllers: {rep.get('controllers', 1)}, "
         f"machine: {rep['machine']}.", "",
         f"**Verdict: {'PASS' if rep['passed'] else 'FAIL'}**" + ("" if rep["passed"] else
                                                                 " — " + "; ".join(rep["failures"])), "",
         "## Requests", "", "| path | kind | ok | failed (in fault windows) | unexpected failures | timeouts | "
         "CORRUPTED | MiB verified |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rep["requests"]:
        L.append(f"| {r['path']} | {r['kind']} | {r['ok']} | {r['failed'] - r['unexpected']} | {r['unexpected']} | "
                 f"{r['timeouts']} | {r['corrupted']} | {r['bytes'] / MIB:.1f} |")
    t = rep["totals"]
    L.append(f"| **all** | | **{t['ok']}** | {t['failed'] - t['unexpected']} | **{t['unexpected']}** | "
             f"{t['timeouts']} | **{t['corrupted']}** | {t['bytes'] / MIB:.1f} |")
    L += ["", "## Faults", "", "| at (s) | fault | killed → new pid | down (s) | restart (s) | "
          "first success after restart (s) | outage, SIGKILL → first success (s) | integrity | ok |",
          "| ---: | --- | --- | ---: | ---: | --- | --- | --- | --- |"]
    for e in rep["events"]:
        d = e["details"]
        if e["kind"] == "revoke":
            continue
        rec = ", ".join(f"{p} {v if v is not None else 'NOT'}" for p, v in (d.get("recovered_s") or {}).items())
        outage = ", ".join(f"{p} {v}" for p, v in (d.get("outage_s") or {}).items() if v is not None)
        L.append(f"| {e['at']:.0f} | {e['kind']} | {d.get('killed_pid')} → {d.get('new_pid')} | {d.get('down_s')} | "
                 f"{d.get('restart_s')} | {rec or d.get('error', '')[:80]} | {outage} | {d.get('integrity_check', '')} | "
                 f"{'yes' if e['ok'] else '**NO**'} |")
    if rep.get("admin_writes"):
        w = rep["admin_writes"]
        L += ["", f"## Controllers and admin writes ({rep['controllers']} controllers on one PostgreSQL)", "",
              "| controller | SIGKILLs | writes acknowledged | writes failed |", "| --- | ---: | ---: | ---: |"]
        for n, k in rep["controller_kills"].items():
            row = w["by_controller"].get(n, {})
            L.append(f"| {n} | {k} | {row.get('acknowledged', 0)} | {row.get('failed', 0)} |")
        L += ["", f"Acknowledged writes: **{w['acknowledged']}**; failed (their controller was killed under them): "
              f"{w['failed']}, of which applied anyway: {w['failed_applied']}; **lost acknowledged writes: "
              f"{w['lost'] if w['lost'] is not None else 'NOT CHECKED'}** (every controller's `admin identity list` "
              "at the end compared with the last acknowledged state of each identity written).", ""]
        for through, v in w["views"].items():
            if "error" in v:
                L.append(f"- through {through}: **could not list**: {v['error']}")
            for x in v.get("lost", [])[:20]:
                L.append(f"- through {through}: **LOST** #{x['seq']} {x['op']} {x['name']} (acknowledged by "
                         f"{x['through']} at {x['start']:.1f} s), listed as {x['observed']!r}")
    L += ["", "## Revocations", "", "| at (s) | revoke command (s) | stream ended after it returned (ms) | how | "
          "new requests | tunnel exit | ok |", "| ---: | ---: | ---: | --- | --- | --- | --- |"]
    for e in rep["events"]:
        d = e["details"]
        if e["kind"] != "revoke":
            continue
        end = d.get("stream_end_after_cmd_return_s")
        L.append(f"| {e['at']:.0f} | {d.get('revoke_cmd_s')} | {end * 1000:.0f} | {d.get('stream_ended_by')} | "
                 f"{', '.join(x['outcome'] for x in d.get('new_requests', []))} | {d.get('tunnel_exit')} | "
                 f"{'yes' if e['ok'] else '**NO** ' + d.get('error', '')[:80]} |" if end is not None else
                 f"| {e['at']:.0f} | | | | | | **NO** {d.get('error', '')[:120]} |")
    if rep.get("injected_leak"):
        L += ["", f"## Injected leak: {rep['inject_leak_bytes_per_request']} bytes per proxied request (this run "
              "must FAIL on memory)", "", "| gateway | requests between the quiescent points | expected kept MiB |",
              "| --- | ---: | ---: |"]
        for role, x in rep["injected_leak"].items():
            L.append(f"| {role} | {x['requests_between_quiescent_points']} | {x['expected_kept_mib']:.1f} |")
    L += ["", "## Memory and descriptors (every incarnation; MiB; slopes under load after warm-up, over all "
          "samples and over each minute's minimum; growth = floor slope × run length)", "",
          "Judged: private memory (RssAnon: heap, stacks), where a leak shows. RSS also counts the executable's and "
          "libraries' pages, faulted in as code paths first run and bounded by those files' size; its floor slope "
          "is shown for reference.", "",
          f"Each incarnation is judged after its own warm-up: {rep['warmup_s']:.0f} s (the run's) after it starts "
          f"carrying load (in most intervals over {LOAD_CONFIRM_S:.0f} s, ≥ {LOAD_CPU_FRACTION:.0%} of its busiest "
          f"{LOAD_CONFIRM_S:.0f} s and ≥ {LOAD_CPU_FLOOR:.0%} of a core), or, if "
          f"it never does, as idle from {INCARNATION_WARMUP_S:.0f} s after its start; never before the run's warm-up "
          "ends.", "",
          "| process | pid | alive (s) | CPU (share of a core) | load from (s) | judged from (s) | "
          "RSS first / last / max | RSS floor slope KiB/min | private first / after "
          "warm-up / last / max | private slope KiB/min | private floor slope KiB/min | growth over run MiB (limit) | "
          "fds first / last / max | flat |",
          "| --- | ---: | --- | ---: | --- | ---: | --- | ---: | --- | ---: | ---: | ---: | --- | --- |"]
    for m in rep["memory"]:
        judged = m.get("anon_judged")
        L.append(
            f"| {m['role']} | {m['pid']} | {m['from_s']:.0f}–{m['to_s']:.0f} | {m['cpu_share']:.0%} | "
            + (f"{m['load_from_s']:.0f}" if m["carries_load"] else "idle: never")
            + f" | {m['judged_from_s']:.0f} | "
            f"{m['rss_first_mib']:.1f} / {m['rss_last_mib']:.1f} / {m['rss_max_mib']:.1f} | "
            + (f"{m['rss_floor_slope_kib_per_min']:+.1f}" if m.get("rss_judged") else "–")
            + f" | {m['anon_first_mib']:.1f} / "
            + (f"{m['anon_settled_mib']:.1f}" if m.get("anon_settled_mib") is not None else "–")
            + f" / {m['anon_last_mib']:.1f} / {m['anon_max_mib']:.1f} | "
            + (f"{m['anon_slope_kib_per_min']:+.1f} | {m['anon_floor_slope_kib_per_min']:+.1f} | "
               f"{m['anon_growth_over_run_mib']:+.2f} ({m['anon_limit_mib']:.1f})"
               if judged else "– | – | window after warm-up too short to judge")
            + f" | {m['fds_first']} / {m['fds_last']} / {m['fds_max']} | "
            + ("–" if not judged else ("yes" if m["anon_flat"] else "**NO**")) + " |")
    L += ["", "## Quiescent points (load paused, connections settled)", "",
          "| process | compared with | pid → at end | fds → at end | RSS MiB → at end | private MiB → at end | ok |",
          "| --- | --- | --- | --- | --- | --- | --- |"]
    for q in rep["quiescent"]:
        L.append(f"| {q['role']} | {q['from']} | {q['pid_first']} → {q['pid_last']} | {q['fds_first']} → {q['fds_last']} | "
                 f"{q['rss_first_mib']:.1f} → {q['rss_last_mib']:.1f} | "
                 f"{q['anon_first_mib']:.1f} → {q['anon_last_mib']:.1f}"
                 + ("" if q.get("rss_judged", True) else " (not compared: "
                    + ("restarted" if q["pid_first"] != q["pid_last"] else "in its warm-up") + ")")
                 + f" | {'yes' if q['ok'] else '**NO**'} |")
    if rep["unexpected_failures"]:
        L += ["", "## Unexpected failures (first 50)", ""]
        L += [f"- t={u['start_s']:.1f}–{u['end_s']:.1f} s {u['path']} {u['kind']}: {u['detail']}"
              for u in rep["unexpected_failures"][:50]]
    L += ["", f"Exit statuses at the end (SIGTERM): {rep['exit_codes']}; the controller's store after it: "
          f"integrity_check {rep['final_integrity_check']!r}.", ""]
    return "\n".join(L)


def print_summary(rep: dict) -> None:
    print()
    print(f"{'path':<10} {'kind':<9} {'ok':>7} {'failed':>7} {'unexp':>6} {'corrupt':>8} {'MiB':>9}")
    for r in rep["requests"]:
        print(f"{r['path']:<10} {r['kind']:<9} {r['ok']:>7} {r['failed']:>7} {r['unexpected']:>6} "
              f"{r['corrupted']:>8} {r['bytes'] / MIB:>9.1f}")
    t = rep["totals"]
    print(f"{'all':<10} {'':<9} {t['ok']:>7} {t['failed']:>7} {t['unexpected']:>6} {t['corrupted']:>8} "
          f"{t['bytes'] / MIB:>9.1f}")
    print()
    for e in rep["events"]:
        d = e["details"]
        if e["kind"] == "revoke":
            info = (f"stream ended {d.get('stream_end_after_cmd_return_s')} s after revoke returned, new requests "
                    f"{[x['outcome'] for x in d.get('new_requests', [])]}, tunnel exit {d.get('tunnel_exit')}")
        elif "failover_s" in d:
            info = (f"overlay through the other controller {d['failover_s']} s after the kill, restarted in "
                    f"{d.get('restart_s')} s, gateway relinked {d.get('gateway_relinked_s')} s later")
        else:
            info = f"recovered {d.get('recovered_s')} s after restart, integrity {d.get('integrity_check', '-')}"
        print(f"t={e['at']:7.1f}s {e['kind']:<10} {'ok ' if e['ok'] else 'BAD'} {info} {d.get('error', '')[:200]}")
    print()
    print(f"{'process':<18} {'pid':>7} {'CPU':>4} {'load@':>6} {'judged@':>7} {'RSS last':>8} {'priv 1st':>8} "
          f"{'settled':>8} {'last':>7} {'max':>7} {'KiB/min':>8} {'floor':>8} {'growth':>7} {'fds f/l/max':>12}")
    for m in rep["memory"]:
        judged = m.get("anon_judged")
        slope = (f"{m['anon_slope_kib_per_min']:+8.1f} {m['anon_floor_slope_kib_per_min']:+8.1f}" if judged
                 else f"{'-':>8} {'-':>8}")
        growth = f"{m['anon_growth_over_run_mib']:+7.2f}" if judged else f"{'-':>7}"
        settled = f"{m['anon_settled_mib']:8.1f}" if m.get("anon_settled_mib") is not None else f"{'-':>8}"
        load = f"{m['load_from_s']:6.0f}" if m["carries_load"] else f"{'idle':>6}"
        print(f"{m['role']:<18} {m['pid']:>7} {m['cpu_share']:4.0%} {load} {m['judged_from_s']:7.0f} "
              f"{m['rss_last_mib']:8.1f} {m['anon_first_mib']:8.1f} {settled} "
              f"{m['anon_last_mib']:7.1f} {m['anon_max_mib']:7.1f} {slope} {growth} "
              f"{m['fds_first']:>4}/{m['fds_last']}/{m['fds_max']}")
    print()
    for q in rep["quiescent"]:
        print(f"quiescent {q['role']:<18} {q['from']:<14} fds {q['fds_first']} -> {q['fds_last']}  "
              f"RSS {q['rss_first_mib']:.1f} -> {q['rss_last_mib']:.1f} MiB, private {q['anon_first_mib']:.1f} -> "
              f"{q['anon_last_mib']:.1f} MiB  {'ok' if q['ok'] else 'GREW'}"
              + ("" if q.get("rss_judged", True) or q["pid_first"] != q["pid_last"]
                 else " (memory not compared: in its warm-up)"))
    if rep.get("injected_leak"):
        print(f"\ninjected leak {rep['inject_leak_bytes_per_request']} B/request: " + ", ".join(
            f"{role} {x['requests_between_quiescent_points']} requests between the quiescent points "
            f"(~{x['expected_kept_mib']:.1f} MiB kept)" for role, x in rep["injected_leak"].items()))
    if rep.get("admin_writes"):
        w = rep["admin_writes"]
        print(f"\ncontrollers {rep['controllers']}, SIGKILLs {rep['controller_kills']}; admin writes "
              f"{w['acknowledged']} acknowledged, {w['failed']} failed ({w['failed_applied']} applied anyway), "
              f"lost acknowledged writes: {w['lost']}")
    print()
    print("PASS" if rep["passed"] else "FAIL: " + "; ".join(rep["failures"]))


# ------------------------------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------------------------------


def schedule(duration: float, warmup: float, period: Optional[float],
             controllers: int = 1) -> tuple[float, list[tuple[float, str]]]:
    """Event times (seconds since load start): after the warm-up quiescent point, within the first EVENTS_SHARE of
    the time left, one every `period` seconds, cycling through FAULT_CYCLE (CLUSTER_FAULT_CYCLE with several
    controllers, whose kills alternate between them)."""
    cycle = FAULT_CYCLE if controllers < 2 else CLUSTER_FAULT_CYCLE
    start = warmup + 15  # the first quiescent point pauses the load for ~10 s
    window = max(0.0, (duration - start) * EVENTS_SHARE)
    if period is None:
        period = min(45.0, window / len(cycle))
    n = int(window // period) if period > 0 else 0
    plan = [(start + period * (i + 0.5), cycle[i % len(cycle)]) for i in range(n)]
    return period, label_controller_kills(plan, controllers)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", type=Path, required=True, help="the ils-gateway binary")
    ap.add_argument("--duration", type=parse_duration, default=parse_duration("2m"), help="load time: 90s, 2m, 1h")
    ap.add_argument("--out", type=Path, default=None, help="report directory (default .ils-soak/<UTC time>)")
    ap.add_argument("--fault-period", type=parse_duration, default=None,
                    help="seconds between events (default: the run's middle split into at least 4, at most 60 s)")
    ap.add_argument("--devices", type=int, default=2, help="long-lived enrolled devices, each with a tunnel")
    ap.add_argument("--max-size-mib", type=float, default=4.0, help="largest download/upload")
    ap.add_argument("--sample-interval", type=float, default=None,
                    help=f"seconds between RSS/fd samples (default {SAMPLE_S:.0f}, 2 for runs under 10 minutes)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the temporary state directory")
    ap.add_argument("--controllers", type=int, choices=(1, 2), default=1,
                    help="1: one controller on SQLite; 2: A and B on a PostgreSQL server the run starts, killed in "
                         "turn, with admin writes through both checked for lost acknowledged writes")
    ap.add_argument("--inject-leak", type=int, default=0, metavar="BYTES",
                    help=f"start the gateways with {LEAK_ENV}=BYTES (test only: they keep BYTES per proxied request "
                         "forever), to show the memory judge fails a leaking process; such a run must FAIL")
    args = ap.parse_args()
    if args.inject_leak < 0:
        ap.error("--inject-leak takes a number of bytes, 0 or more")

    duration = args.duration
    interval = args.sample_interval or (SAMPLE_S if duration >= 600 else 2.0)
    warmup = min(180.0, max(40.0, 0.10 * duration))
    period, plan = schedule(duration, warmup, args.fault_period, args.controllers)
    seed = args.seed if args.seed is not None else random.SystemRandom().getrandbits(32)
    random.seed(seed)
    started_utc = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out = args.out or ROOT / ".ils-soak" / started_utc.replace(":", "")
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="ils-soak-"))
    binary = work / "ils-gateway"  # a copy: a rebuild during a long run cannot swap the binary under it
    shutil.copy2(args.bin, binary)
    if args.inject_leak:
        log(f"soak: INJECTED LEAK: the gateways keep {args.inject_leak} bytes per proxied request; this run must FAIL")
    log(f"soak: {args.controllers} controller(s), {duration:.0f} s of load, warm-up {warmup:.0f} s, {len(plan)} events every {period:.0f} s "
        f"({', '.join(k for _, k in plan)}), seed {seed}, binary {args.bin}, out {out}")

    def on_term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    atexit.register(stop_leftovers)  # backstop, e.g. for a second Ctrl-C during the teardown
    # websockets logs a traceback when a connection dies under it; the worker records the failure itself.
    logging.getLogger("websockets").setLevel(logging.CRITICAL)
    system = System(binary, work, logs, args.devices, args.controllers, args.inject_leak)
    load: Optional[Load] = None
    writer: Optional[AdminWriter] = None
    writes: dict = {}
    sampler: Optional[Sampler] = None
    chaos: Optional[Chaos] = None
    exit_codes: dict = {}
    final_integrity = ""
    interrupted = False
    failures: list[str] = []
    q_first: dict = {}
    q_tail: dict = {}
    q_last: dict = {}
    fit_from = warmup
    t0 = time.monotonic()
    try:
        setup_started = time.monotonic()
        system.start()
        log(f"set up in {time.monotonic() - setup_started:.1f} s: controller(s) "
            f"{', '.join(f':{c.port}' for c in system.controllers.values())}, backend "
            f":{system.backend.port}, tunnels {[t.port for t in system.tunnels.values()]}, HTTP mode "
            f":{system.http.port}")
        for p in system.paths():
            ok, detail = system.probe(p, timeout=10)
            if not ok:
                raise RuntimeError(f"path {p} does not work before the run: {detail}")
        t0 = time.monotonic()
        load = Load(system, int(args.max_size_mib * MIB), seed)
        sampler = Sampler(system, t0, interval, load.gate)
        chaos = Chaos(system, t0, load.stop)
        sampler.thread.start()
        load.start()
        if system.clustered:
            writer = AdminWriter(system, t0, load.gate, seed)
            writer.thread.start()

        def sleep_until(t: float) -> None:
            while time.monotonic() - t0 < t:
                time.sleep(min(0.5, max(0.0, t - (time.monotonic() - t0))))

        sleep_until(warmup)
        q_first = sampler.quiescent("after warm-up")
        load.gate.resume()
        fit_from = time.monotonic() - t0
        for at, kind in plan:
            sleep_until(at)
            chaos.run_event(kind)
        # A quiescent point at the start of the steady tail, when it is long enough to judge: every process is then
        # the incarnation that runs to the end, so all of them get a same-process comparison.
        tail_from = time.monotonic() - t0 + INCARNATION_WARMUP_S
        if duration - tail_from >= MIN_FIT_SPAN_S + 30:
            sleep_until(tail_from)
            q_tail = sampler.quiescent("start of the steady tail")
            load.gate.resume()
        sleep_until(duration)
        q_last = sampler.quiescent("end of run")
        sampler.samples.extend(sampler.read())
    except KeyboardInterrupt as e:
        interrupted = True
        failures.append(f"interrupted ({e or 'Ctrl-C'})")
        log("interrupted: stopping everything")
    except (Exception, HarnessFailure) as e:
        failures.append(f"harness error: {type(e).__name__}: {str(e)[:500]}")
        log(f"harness error: {type(e).__name__}: {e}")
    finally:
        if sampler is not None:
            sampler.stop.set()
        if writer is not None:
            writer.stop.set()
            writer.thread.join(CLI_WRITE_TIMEOUT_S + 5)
        if load is not None:
            load.finish()
        if writer is not None:
            try:
                writes = writer.verify()
            except (Exception, *HarnessFailure) as e:
                writes = {"": {"error": f"{type(e).__name__}: {str(e)[:300]}"}}
        unexpected_exits = [role for role, p in
                            [*[(system.role(n), c.process) for n, c in system.controllers.items()],
                             ("gateway-overlay", system.gateway),
                             ("backend", system.backend), ("gateway-http", system.http),
                             *[(f"tunnel-{k}", t) for k, t in system.tunnels.items()]]
                            if p is not None and p.proc is not None and not p.alive()]
        exit_codes = system.stop()
        store = system.controller.state_dir / "store.sqlite"
        try:
            if system.clustered:
                final_integrity = "n/a (PostgreSQL)"
            else:
                final_integrity = integrity(store) if store.exists() else "no store"
        except Exception as e:
            final_integrity = f"{type(e).__name__}: {e}"
        leaked = [f.name for f in logs.glob("*.log")
                  if system.clustered and pg_fixture.PASSWORD in f.read_text(errors="replace")]
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    run_s = time.monotonic() - t0
    ops = load.ops if load else []
    windows = chaos.windows if chaos else []
    cls = classify(ops, windows)
    requests = [{"path": p, "kind": k, **row} for (p, k), row in sorted(cls["table"].items())]
    totals = {k: sum(r[k] for r in requests) for k in ("ok", "failed", "corrupted", "unexpected", "timeouts", "bytes")}
    memory = analyse_memory(sampler.samples if sampler else [], fit_from, duration, warmup)
    warm_from = {m["pid"]: m["warm_from_s"] for m in memory}
    quiescent = [{"from": "after warm-up", **q} for q in fd_checks(q_first, q_last, warm_from)]
    quiescent += [{"from": "start of tail", **q} for q in fd_checks(q_tail, q_last, warm_from)]
    events = [asdict(e) for e in (chaos.events if chaos else [])]
    for e in events:
        e.pop("window", None)

    if totals["corrupted"]:
        failures.append(f"{totals['corrupted']} corrupted payloads")
    if totals["unexpected"]:
        failures.append(f"{totals['unexpected']} unexpected failures (outside fault windows)")
    if totals["timeouts"]:
        failures.append(f"{totals['timeouts']} requests hung until the client's {REQUEST_TIMEOUT_S:.0f} s timeout")
    for kind in KINDS:
        for path in (system.paths() if system.http else []):
            if not cls["table"].get((path, kind), {}).get("ok"):
                failures.append(f"no successful {kind} through {path}")
    bad_events = [f"{e['kind']}@{e['at']:.0f}s" for e in events if not e["ok"]]
    if bad_events:
        failures.append(f"events not recovered/checked: {', '.join(bad_events)}")
    if len(events) < len(plan):
        failures.append(f"only {len(events)} of {len(plan)} events ran")
    for m in memory:
        if m.get("anon_judged") and not m["anon_flat"]:
            how = f"under load from {m['load_from_s']:.0f} s" if m["carries_load"] else "idle"
            failures.append(f"{m['role']} (pid {m['pid']}) private memory floor grows "
                            f"{m['anon_floor_slope_kib_per_min']:.0f} KiB/min "
                            f"({m['anon_growth_over_run_mib']:.1f} MiB over the run, limit {m['anon_limit_mib']:.1f}; "
                            f"judged from {m['judged_from_s']:.0f} s, {how})")
    for q in quiescent:
        if not q["fds_ok"]:
            failures.append(f"{q['role']} descriptors {q['fds_first']} ({q['from']}) -> {q['fds_last']} (end)")
        if not q["rss_ok"]:
            failures.append(f"{q['role']} private memory {q['anon_first_mib']:.1f} MiB ({q['from']}) -> "
                            f"{q['anon_last_mib']:.1f} MiB (end), limit +{QUIESCENT_RSS_LIMIT_MIB:.0f} MiB")
    if not quiescent and not failures:
        failures.append("no quiescent points were taken")
    if final_integrity != "ok" and not system.clustered:
        failures.append(f"controller store after the run: integrity_check {final_integrity!r}")
    if leaked:
        failures.append(f"the store password is in these logs: {leaked}")
    if system.clustered:
        kills = {n: sum(e["kind"] == f"controller-{n}" for e in events) for n in system.controllers}
        if writer is None or not writer.writes:
            failures.append("no admin writes were made")
        for through, v in writes.items():
            if "error" in v:
                failures.append(f"listing identities through controller {through} at the end: {v['error']}")
            elif v["lost"]:
                failures.append(f"{len(v['lost'])} acknowledged writes not visible through controller {through}")
        if not interrupted and sum(fault_kind(k) == "controller" for _, k in plan) >= 2 and not all(kills.values()):
            failures.append(f"not every controller was killed: {kills}")
    else:
        kills = {"controller": sum(e["kind"] == "controller" for e in events)}
    if unexpected_exits and not interrupted:  # Ctrl-C in a terminal reaches the children too
        failures.append(f"processes exited by themselves: {unexpected_exits}")
    # uvicorn re-raises SIGTERM after its graceful shutdown, so the sample backend's clean stop is -15.
    bad_codes = {r: c for r, c in exit_codes.items() if c != 0 and not (r == "backend" and c == -signal.SIGTERM)}
    if bad_codes:
        failures.append(f"non-zero exit after SIGTERM: {bad_codes}")

    report = {
        "started_utc": started_utc, "binary": str(args.bin), "duration_s": duration, "run_s": round(run_s, 1),
        "warmup_s": warmup, "event_period_s": period, "seed": seed,
        "machine": f"{os.cpu_count()} cores, load average at the end {os.getloadavg()[0]:.2f}",
        "limits": {"recovery_bound_s": RECOVERY_BOUND_S, "fault_grace_s": FAULT_GRACE_S,
                   "revoke_end_bound_s": REVOKE_END_BOUND_S, "fd_slack": FD_SLACK, "rss_limit_mib": RSS_LIMIT_MIB,
                   "rss_limit_fraction": RSS_LIMIT_FRACTION, "request_timeout_s": REQUEST_TIMEOUT_S,
                 "min_fit_span_s": MIN_FIT_SPAN_S, "quiescent_rss_limit_mib": QUIESCENT_RSS_LIMIT_MIB},
        "requests": requests, "totals": totals, "events": events, "memory": memory, "quiescent": quiescent,
        "unexpected_failures": [{"path": u.path, "kind": u.kind, "start_s": u.start - t0, "end_s": u.end - t0,
                                 "detail": u.detail} for u in cls["unexpected"]],
        "failures_all": [{"path": o.path, "kind": o.kind, "start_s": o.start - t0, "end_s": o.end - t0,
                               "detail": o.detail} for o in ops if o.outcome == "failed"][:500],
        "samples": [asdict(s) for s in (sampler.samples if sampler else [])],
        "exit_codes": exit_codes, "final_integrity_check": final_integrity, "passed": not failures, "failures": failures,
        "controllers": len(system.controllers), "controller_kills": kills,
        "inject_leak_bytes_per_request": args.inject_leak,
        "injected_leak": injected_leak(ops, args.inject_leak, q_first, q_last, t0) if args.inject_leak else None,
        "admin_writes": admin_writes_summary(writer.writes if writer else [], writes) if system.clustered else None,
    }
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "report.md").write_text(render_markdown(report))
    print_summary(report)
    log(f"report: {out / 'report.md'} and report.json; process logs in {logs}")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
