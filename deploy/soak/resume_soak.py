#!/usr/bin/env python3
"""Issue 38's resumption soak: SSE answers stream for the whole run while the device's network path is switched
every minute and one of two controllers is SIGKILLed and restarted every three minutes.

Topology (made by this run, removed at its end; needs root for the namespace, the veth pairs and iptables):

    device namespace ("wifi" + "cell" veth pairs)          this namespace
    ┌───────────────────────────────────────┐
    │ curl ──► ils-gateway tunnel ──┐       │ wifi ─┐   controller A ─┐
    │                               ├───────┼───────┼─► (wifi pair's  ├─ PostgreSQL (127.0.0.1, started here)
    │ ils-client-example (ILSClient)┘       │ cell ─┘    address)     │
    └───────────────────────────────────────┘           controller B ─┘
                                                              ▲
                                           dark overlay gateway (`serve`) ──► sample backend (deploy/backend/app.py)

Both controllers listen on this namespace's end of the wifi pair (Tests/e2e's `DeviceNetns`), A made with
`controller init --store`, B with `controller join`; the device's two identities (the tunnel's, ipad-r, and the app's,
app-r) and the gateway's are enrolled through A once B has joined, so each lists A then B. The gateway links to both.
The backend and PostgreSQL listen on 127.0.0.1. The device's processes run with keepalive 1 s + 1 s (as the e2e
tests do), so a black-holed path is noticed in about 2 s.

Load: two streamers in the device's namespace, each running answers back to back for the whole run: curl through the
tunnel, and `ils-client-example stream` (URLSession through ILSClient, one process per answer). Each answer is
`GET /claude/stream` of --events events (default 400) --interval-ms apart (default 50: 20 s), with a prompt unique
to the answer. Each answer is checked: every event index 0..N-1 exactly once and in order, each event's text the
word the backend derives from this answer's prompt (a spliced stream fails), `done` with the right count, exit
status 0. An answer that fails is counted as a failure; the streamer then starts the next answer, a new request, and
never retries the failed one.

Events, in the main thread: every --switch-period seconds (default 60) the device's path is switched, wifi → cell →
wifi … (`DeviceNetns.switch`: the path in use and its address black-holed with iptables DROP both ways, no reset;
the route to the controllers moved to the other interface). Every --kill-period seconds (default 180; offset by half
a switch period so the two kinds of fault are told apart) controller A or B, in turn, is SIGKILLed and restarted at
once on the same port, state directory and store; the gateway must link to it again. Before each kill,
`admin sessions` says which controller relays each of the device's circuits: a kill of the controller the device
is not using is still a fault, for the gateway's link to it. An event waits (at most 30 s) until both streamers are
2 s into an answer (a kill also 4 s from its end, so that the sessions listed are the ones killed), so it lands
mid-stream. For each event and each stream: the resume time, from the event's effect (the
rules in force, the controller dead) to the arrival of the first event the backend emitted after it (the bench's
measure, deploy/bench/resume.py).

Memory: every few seconds VmRSS and RssAnon (private) of every long-lived process (controllers A and B, each
incarnation apart, the gateway, the backend, the tunnel) and of the app's current process, with deploy/soak/soak.py's
Sampler. Judged as soak.py judges (`analyse_memory`): per incarnation, after the run's warm-up and its own, the
slope of the per-minute floor of private memory, extrapolated over the run, within max(8 MiB, 20 %), for any
incarnation with 5 minutes of samples to fit (--min-fit-span lowers that for a trial run). A controller incarnation
lives two kill periods at most (idle while the other relays, then relaying), often too short to fit, so the
controllers are also judged across incarnations: the private memory each full-cycle incarnation settles at (median of its last third)
must not exceed the first full-cycle one's by more than the same bound. The app's processes live one answer each:
the series of their peaks is judged like one process. Descriptors of the gateway, tunnel and backend at rest after
the run must be back to their count at rest before it (+2).

Pass (exit 0) only if: every answer completed, 0 events lost, 0 duplicated, 0 out of order, 0 with another answer's
text; the backend saw exactly one request per answer, none cancelled (its `disconnected` counter did not move), all
completed; no held circuit ran out its grace window in the gateway; every planned switch and kill happened, every
killed controller came back and the gateway linked to it again; no process exited by itself and each exited cleanly
on SIGTERM; memory judged flat for every process (a run too short to judge the gateway, tunnel and backend fails, and
says so); the store password in no log. Writes report.json (every answer, event and sample) and report.md to --out.

Run it as `deploy/soak/run.sh --resume --minutes 30` or directly (as root):
    python3 deploy/soak/resume_soak.py --bin .build/release/ils-gateway \
        --client-example-bin .build/release/ils-client-example --minutes 30 --out /tmp/resume-soak
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parents[2]
# The e2e tests' namespace and process helpers, the soak's memory judge and the sample backend's text are imported,
# not copied.
for where in (ROOT / "Tests" / "e2e", ROOT / "deploy" / "soak", ROOT / "deploy" / "backend"):
    sys.path.insert(0, str(where))

import pg_fixture  # noqa: E402
import soak  # noqa: E402
from app import fake_answer  # noqa: E402
from conftest import Backend, ManagedProcess, cli_env, free_port  # noqa: E402
from soak import (HarnessFailure, MIB, RSS_LIMIT_FRACTION, RSS_LIMIT_MIB, Gate, Sampler, analyse_memory,  # noqa: E402
                  fd_checks, log, rss_verdict, stop_leftovers)
from sse_helpers import parse_sse, read_timed_lines  # noqa: E402
from test_cluster import ClusterController, wait_gateway_linked  # noqa: E402
from test_faults import backend_streams, gateway_process, sigkill  # noqa: E402
from test_overlay import SERVICE, enroll  # noqa: E402
from test_resumption import DEVICE_KEEPALIVE, DeviceNetns, NetnsUnavailable, device_namespace  # noqa: E402

ANSWER_SLACK_S = 90.0  # an answer may take this much longer than its events' pacing before it is called hung
IN_FLIGHT_WAIT_S = 30.0  # an event waits at most this long for both streams to be mid-answer:
IN_FLIGHT_MIN_S = 2.0  # at least this far into their answers,
IN_FLIGHT_LEFT_S = 4.0  # and, for a kill, this far from their ends (its `admin sessions` query comes first)
RELINK_BOUND_S = 30.0  # a restarted controller: the gateway must link to it again within this
SETTLE_AFTER_KILL_S = 1.0
FD_SLACK = soak.FD_SLACK
NAMES = ("A", "B")


# ------------------------------------------------------------------------------------------------------------------
# Answers and their checks
# ------------------------------------------------------------------------------------------------------------------


@dataclass
class Answer:
    kind: str  # tunnel | app
    number: int
    prompt: str
    started: float  # time.time()
    ended: float = 0.0
    pid: int = 0
    status: Optional[int] = None
    events: int = 0  # message events received
    lost: int = 0
    duplicated: int = 0
    out_of_order: int = 0
    wrong_text: int = 0
    done_ok: bool = False
    max_gap_s: float = 0.0  # the longest wait between two events
    error: str = ""
    cut: bool = False  # killed by this run on Ctrl-C or SIGTERM: not judged
    arrivals: list = field(default_factory=list, repr=False)  # (arrival time, backend's emitted_at), not reported

    @property
    def ok(self) -> bool:
        return (self.status == 0 and not self.error and self.done_ok and not
                (self.lost or self.duplicated or self.out_of_order or self.wrong_text))

    def problem(self) -> str:
        parts = [f"exit {self.status}"] if self.status != 0 else []
        parts += [f"{v} {k}" for k, v in (("lost", self.lost), ("duplicated", self.duplicated),
                                           ("out of order", self.out_of_order), ("with wrong text", self.wrong_text))
                  if v]
        if not self.done_ok:
            parts.append("no (right) done event")
        if self.error:
            parts.append(self.error)
        return ", ".join(parts)

    def report(self) -> dict:
        d = asdict(self)
        d.pop("arrivals")
        return {**d, "ok": self.ok}


def judge_answer(answer: Answer, events: list, n: int) -> None:
    """Fills the answer's counts: each index 0..n-1 expected once, in order, with this prompt's word."""
    words = fake_answer(answer.prompt).split()
    seen: set[int] = set()
    highest = -1
    for e in events:
        if e.event != "message":
            continue
        answer.events += 1
        try:
            body = e.json
            index = int(body["index"])
        except (ValueError, KeyError, TypeError):
            answer.wrong_text += 1
            continue
        answer.arrivals.append((e.received_at, float(body.get("emitted_at", 0.0))))
        if index in seen or not 0 <= index < n:
            answer.duplicated += 1
            continue
        if index < highest:
            answer.out_of_order += 1
        if body.get("text") != words[index % len(words)]:
            answer.wrong_text += 1
        seen.add(index)
        highest = max(highest, index)
    answer.lost = n - len(seen)
    last = events[-1] if events else None
    try:
        answer.done_ok = last is not None and last.event == "done" and last.json.get("count") == n
    except ValueError:
        answer.done_ok = False
    times = [at for at, _ in answer.arrivals]
    answer.max_gap_s = round(max((b - a for a, b in zip(times, times[1:])), default=0.0), 3)


class Streamer:
    """Runs answers back to back in a thread until `stop` is set (the answer under way is finished, never cut)."""

    def __init__(self, kind: str, command: Callable[[str], list[str]], n: int, interval_ms: int, cwd: Path,
                 logs: Path, stop: threading.Event) -> None:
        self.kind = kind
        self.command = command
        self.n = n
        self.pacing_s = n * interval_ms / 1000  # how long an answer takes without a pause
        self.timeout = self.pacing_s + ANSWER_SLACK_S
        self.cwd = cwd
        self.stderr_log = logs / f"{kind}-answers.stderr.log"
        self.stop = stop
        self.answers: list[Answer] = []
        self.current: Optional[Answer] = None
        self.proc: Optional[subprocess.Popen] = None
        self.thread = threading.Thread(target=self.run, name=f"stream-{kind}", daemon=True)

    def run(self) -> None:
        number = 0
        while not self.stop.is_set():
            number += 1
            answer = self.one(number)
            self.answers.append(answer)
            if not answer.ok and not answer.cut:
                log(f"{self.kind} answer {number} ({answer.prompt}) FAILED: {answer.problem()}")
                self.stop.wait(1.0)  # not a retry: the next answer is a new request, judged on its own

    def in_flight_for(self) -> Optional[float]:
        current = self.current
        return None if current is None else time.time() - current.started

    def one(self, number: int) -> Answer:
        prompt = f"resume-soak-{self.kind}-{number}-{os.urandom(3).hex()}"
        answer = Answer(self.kind, number, prompt, time.time())
        lines: list[tuple[float, str]] = []
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(self.command(prompt), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=err, cwd=self.cwd, bufsize=0)
            answer.pid = proc.pid
            self.proc, self.current = proc, answer

            reader = threading.Thread(target=read_timed_lines,
                                      args=(proc.stdout, lambda at, line: lines.append((at, line))), daemon=True)
            reader.start()
            reader.join(self.timeout)
            if reader.is_alive():
                answer.error = f"still streaming after {self.timeout:.0f} s: killed"
                proc.kill()
            try:
                answer.status = proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                answer.status = proc.wait(timeout=10)
                answer.error = (answer.error + " did not exit after its output ended: killed").strip()
            answer.ended = time.time()
            self.proc, self.current = None, None
            err.seek(0)
            stderr = err.read().decode(errors="replace")
        if stderr.strip():
            with self.stderr_log.open("a") as f:
                f.write(f"--- {prompt} (exit {answer.status})\n{stderr}\n")
            if answer.status != 0:
                answer.error = (answer.error + " " + stderr.strip()[-300:]).strip()
        judge_answer(answer, parse_sse(self.sse_lines(lines)), self.n)
        return answer

    def sse_lines(self, lines: list[tuple[float, str]]) -> list[tuple[float, str]]:
        if self.kind != "app":
            return lines
        # ils-client-example prints each non-empty line after its arrival time: put back the blank line that ends
        # an event (as Tests/e2e/test_resumption.py reads it).
        out: list[tuple[float, str]] = []
        for at, line in lines:
            line = line.split(" ", 1)[1] if " " in line else line
            out += [(at, line)] + ([(at, "")] if line.startswith("data:") else [])
        return out

    def kill_current(self) -> None:
        """Ends the answer under way (the run is being interrupted): it is marked cut, not judged."""
        proc, current = self.proc, self.current
        if proc is not None and proc.poll() is None:
            if current is not None:
                current.cut = True
            proc.kill()


# ------------------------------------------------------------------------------------------------------------------
# The system under test
# ------------------------------------------------------------------------------------------------------------------


class NsController(ClusterController):
    """A controller of the cluster that listens on `host` (this namespace's end of the device's wifi pair, which
    the device reaches over wifi or, after a switch, over cell)."""

    def __init__(self, name: str, binary: Path, root: Path, logs: Path, store: str, host: str) -> None:
        super().__init__(name, binary, root, logs, store)
        self.host = host
        self.address = f"https://{host}:{self.port}"

    def start(self) -> None:
        assert self.process is None or not self.process.alive(), f"controller {self.name} already running"
        self.process = ManagedProcess(
            f"controller-{self.name}",
            [str(self.binary), "controller", "run", "--state-dir", str(self.state_dir), "--store", self.store,
             "--listen", f"{self.host}:{self.port}", "--log-level", "info"],
            self.log_dir, cwd=self.root, env=cli_env(),  # PGPASSWORD comes from the environment
        )
        self.process.start()
        self.process.wait_for_port(self.port, host=self.host)


class Rig:
    """PostgreSQL, controllers A and B, the backend, the gateway and the device's tunnel. A killed controller is
    replaced by a new process on the same object, so always go through `controllers`."""

    def __init__(self, ns: DeviceNetns, binary: Path, work: Path, logs: Path) -> None:
        self.ns = ns
        self.binary = binary
        self.root = work / "root"
        self.root.mkdir()
        self.logs = logs
        self.pg: Optional[pg_fixture.TestPostgres] = None
        self.controllers: dict[str, NsController] = {}
        self.backend: Optional[Backend] = None
        self.gateway: Optional[ManagedProcess] = None
        self.tunnel: Optional[ManagedProcess] = None
        self.tunnel_port = free_port()
        self.lock = threading.Lock()  # process replacement against the sampler

    @property
    def a(self) -> NsController:
        return self.controllers["A"]

    def start(self) -> None:
        self.pg = pg_fixture.start_postgres()
        atexit.register(self.pg.stop)  # idempotent; a backstop
        store = self.pg.create_database()
        os.environ["PGPASSWORD"] = pg_fixture.PASSWORD  # the controllers get it through their environment only
        for name in NAMES:
            self.controllers[name] = NsController(name, self.binary, self.root, self.logs, store, self.ns.wifi_host)
        a, b = self.a, self.controllers["B"]
        r = a.cli("controller", "init", "--state-dir", str(a.state_dir), "--address", a.address, "--store", store)
        if r.returncode != 0:
            raise RuntimeError(f"controller init --store failed\n{r.describe()}")
        a.start()
        r = b.cli("controller", "join", "--identity", "identities/admin.json", "--address", b.address,
                  "--state-dir", str(b.state_dir))
        if r.returncode != 0:
            raise RuntimeError(f"controller join failed\n{r.describe()}")
        b.start()
        self.backend = Backend(self.logs)
        self.backend.start()
        for name, role in (("gw-r", "gateway"), ("ipad-r", "device"), ("app-r", "device")):
            enroll(a, name, role)
            listed = json.loads((self.root / "identities" / f"{name}.json").read_text()).get("controllers")
            if listed != [a.address, b.address]:
                raise RuntimeError(f"{name}'s identity file lists controllers {listed}, expected A then B")
        gateway = gateway_process(a, self.backend, self.logs, identity="gw-r")
        gateway.start()
        gateway.wait_for_log("hosting service")
        wait_gateway_linked(SimpleNamespace(gateway=gateway), a, b)
        self.gateway = gateway
        self.tunnel = ManagedProcess(
            "tunnel",
            self.ns.exec_args() + [str(self.binary), "tunnel", "--identity", "identities/ipad-r.json", "--service",
                                   SERVICE, "--listen", f"127.0.0.1:{self.tunnel_port}", "--log-level", "info",
                                   *DEVICE_KEEPALIVE],
            self.logs, cwd=self.root, env=cli_env(),
        )
        self.tunnel.start()
        self.tunnel.wait_for_log("tunnel listening")

    def long_lived(self) -> list[tuple[str, ManagedProcess]]:
        with self.lock:
            out = [(f"controller-{n}", c.process) for n, c in self.controllers.items()]
        return out + [("gateway", self.gateway), ("backend", self.backend), ("tunnel", self.tunnel)]

    def relaying(self) -> dict:
        """Which controller relays each of the device's circuits now (`admin sessions`, asked of every controller)."""
        r = self.a.cli("admin", "sessions", "--identity", "identities/admin.json", "--json", timeout=15)
        if r.returncode != 0:
            return {"error": (r.stderr or r.stdout).strip()[-200:]}
        names = {c.address: n for n, c in self.controllers.items()}
        out: dict[str, list[str]] = {}
        for s in json.loads(r.stdout):
            if s.get("device") in ("ipad-r", "app-r"):
                out.setdefault(s["device"], []).append(names.get(s.get("controller"), str(s.get("controller"))))
        return {device: sorted(where) for device, where in out.items()}

    def kill_and_restart(self, name: str) -> dict:
        """SIGKILL controller `name`, restart it at once on the same port, state directory and store, and wait until
        the gateway has linked to it again."""
        c = self.controllers[name]
        relaying = self.relaying()
        mark = len(self.gateway.full_log())
        old = c.process.pid
        killed = time.monotonic()
        with self.lock:
            sigkill(c.process)  # returns once it is dead: its sockets are closed
        killed_at = time.time()
        time.sleep(SETTLE_AFTER_KILL_S)  # the other controller takes the device and the gateway's circuits meanwhile
        with self.lock:
            c.start()
        restarted = time.monotonic() - killed
        deadline = time.monotonic() + RELINK_BOUND_S
        relinked = None
        while time.monotonic() < deadline:
            after = self.gateway.full_log()[mark:]
            if any("connected to controller" in line and f"controller={c.address}" in line
                   for line in after.splitlines()):
                relinked = round(time.monotonic() - killed, 2)
                break
            time.sleep(0.05)
        return {"controller": name, "killed_at": killed_at, "killed_pid": old, "new_pid": c.process.pid, "relaying_before": relaying,
                "device_used_it": any(name in where for where in relaying.values() if isinstance(where, list)),
                "restarted_s": round(restarted, 2), "gateway_relinked_s": relinked,
                "ok": relinked is not None}

    def stop(self) -> dict[str, Optional[int]]:
        return soak.stop_all([("tunnel", self.tunnel), ("gateway", self.gateway), ("backend", self.backend),
                              *[(f"controller-{n}", c.process) for n, c in self.controllers.items()]], self.pg)


class Watched:
    """What the Sampler samples: the long-lived processes, and the app's process of the answer under way."""

    def __init__(self, rig: Rig, app: Streamer) -> None:
        self.rig = rig
        self.app = app

    def processes(self) -> list[tuple[str, object]]:
        out: list[tuple[str, object]] = [(role, p) for role, p in self.rig.long_lived() if p is not None and p.alive()]
        proc = self.app.proc
        if proc is not None and proc.poll() is None:
            out.append(("app", SimpleNamespace(pid=proc.pid)))
        return out


# ------------------------------------------------------------------------------------------------------------------
# Events
# ------------------------------------------------------------------------------------------------------------------


@dataclass
class Event:
    kind: str  # switch-to-cell | switch-to-wifi | kill-A | kill-B
    planned_s: float
    at_s: float = 0.0  # seconds since t0, when it was done
    at: float = 0.0  # time.time() when it took effect (rules in force, controller dead), for the resume times
    ok: bool = False
    in_flight: dict = field(default_factory=dict)  # stream -> seconds into its answer when the event landed
    details: dict = field(default_factory=dict)
    resume_s: dict = field(default_factory=dict)  # stream -> event to the first event emitted after it


def plan_events(duration: float, switch_period: float, kill_period: float) -> list[Event]:
    """Switches at switch_period, 2 x switch_period, ...; kills at kill_period - switch_period / 2, ... (A, B, A,
    ...), all before the end."""
    plan = []
    k = 1
    while switch_period > 0 and k * switch_period < duration:
        plan.append(Event("switch-to-cell" if k % 2 else "switch-to-wifi", k * switch_period))
        k += 1
    k = 1
    while kill_period > 0 and k * kill_period - switch_period / 2 < duration:
        plan.append(Event(f"kill-{NAMES[(k - 1) % 2]}", k * kill_period - switch_period / 2))
        k += 1
    return sorted(plan, key=lambda e: e.planned_s)


def resume_times(event: Event, streamers: list[Streamer]) -> dict:
    """Per stream: seconds from the event's effect to the arrival of the first event the backend emitted after it,
    in the answer that was under way: it had received an event before, and had not ended (None: no answer was, or
    it ended first)."""
    out = {}
    for s in streamers:
        for a in s.answers:
            if a.arrivals and a.arrivals[0][0] < event.at <= (a.ended or float("inf")):
                first = next((arrived for arrived, emitted in a.arrivals if emitted >= event.at), None)
                out[s.kind] = round(first - event.at, 3) if first is not None else None
                break
    return out


DEVICE_OF = {"tunnel": "ipad-r", "app": "app-r"}  # the identity each stream's circuits belong to


def resume_summary(events: list[Event]) -> dict:
    """Resume times per kind of event and stream: switches; kills of the controller that relayed the stream's
    device (per `admin sessions` just before), and kills of the other one (the stream should not even pause)."""
    out: dict = {}
    for e in events:
        for stream, took in e.resume_s.items():
            if took is None:
                continue
            if e.kind.startswith("switch"):
                kind = "path switch"
            else:
                relaying = e.details.get("relaying_before", {}).get(DEVICE_OF[stream])
                kind = ("controller kill (unknown relay)" if not isinstance(relaying, list) else
                        "controller kill, relaying it" if e.kind[-1] in relaying else "controller kill, the other one")
            out.setdefault(kind, {}).setdefault(stream, []).append(took)
    return {kind: {stream: {"count": len(v), "p50": percentile(v, 0.5), "max": max(v)} for stream, v in row.items()}
            for kind, row in out.items()}


# ------------------------------------------------------------------------------------------------------------------
# Memory beyond soak.analyse_memory
# ------------------------------------------------------------------------------------------------------------------


def controller_incarnations(samples: list, role: str) -> dict:
    """Controller `role` across its incarnations: the private memory each settles at (median of the last third of
    its samples). Full-cycle incarnations (all but the first and the last: born of a kill, killed by the schedule,
    each idle while the other controller relayed, then relaying) are comparable; the first full one is the
    reference."""
    by_pid: dict[int, list] = {}
    for s in samples:
        if s.role == role:
            by_pid.setdefault(s.pid, []).append(s)
    rows = []
    for i, (pid, ss) in enumerate(sorted(by_pid.items(), key=lambda kv: kv[1][0].t)):
        tail = ss[len(ss) * 2 // 3:]
        rows.append({"pid": pid, "from_s": round(ss[0].t, 1), "to_s": round(ss[-1].t, 1),
                     "full_cycle": 0 < i < len(by_pid) - 1 and len(ss) >= 6,
                     "settled_private_mib": round(statistics.median(s.anon for s in tail) / MIB, 2),
                     "peak_private_mib": round(max(s.anon for s in ss) / MIB, 2),
                     "peak_rss_mib": round(max(s.rss for s in ss) / MIB, 2)})
    full = [r for r in rows if r["full_cycle"]]
    verdict: dict = {"role": role, "incarnations": rows, "judged": len(full) >= 2}
    if verdict["judged"]:
        first = full[0]["settled_private_mib"]
        growth = max(r["settled_private_mib"] for r in full[1:]) - first
        limit = max(RSS_LIMIT_MIB, RSS_LIMIT_FRACTION * first)
        verdict.update({"first_full_mib": first, "growth_mib": round(growth, 2), "limit_mib": round(limit, 2),
                        "flat": growth <= limit})
    return verdict


def app_peaks(samples: list, answers: list[Answer], t0_wall: float, fit_from_s: float, run_s: float) -> dict:
    """The app's processes (one per answer) as one series: each process's peak private memory at its answer's start,
    judged with soak's rss_verdict from the run's warm-up on."""
    peaks: dict[int, int] = {}
    for s in samples:
        if s.role == "app":
            peaks[s.pid] = max(peaks.get(s.pid, 0), s.anon)
    points = [(a.started - t0_wall, peaks[a.pid]) for a in answers if a.pid in peaks]
    judged = [(t, v) for t, v in points if t >= fit_from_s]
    verdict = rss_verdict(judged, run_s)
    return {"role": "app (one process per answer)", "processes_sampled": len(points),
            "peak_private_mib_first": round(points[0][1] / MIB, 2) if points else None,
            "peak_private_mib_max": round(max(v for _, v in points) / MIB, 2) if points else None,
            **{f"anon_{k}": v for k, v in verdict.items()}}


# ------------------------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> Optional[float]:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    return round(values[min(len(values) - 1, int(q * len(values)))], 3)


def render_markdown(rep: dict) -> str:
    t = rep["totals"]
    L = [f"# Resumption soak {rep['started_utc']}", "",
         f"`{rep['binary']}` ({rep['version']}), client `{rep['client_example_bin']}`; {rep['minutes']:g} min, "
         f"switch every {rep['switch_period_s']:g} s, controller SIGKILL every {rep['kill_period_s']:g} s, "
         f"answers of {rep['events_per_answer']} events every {rep['interval_ms']} ms; {rep['machine']}.", "",
         f"**Verdict: {'PASS' if rep['passed'] else 'FAIL'}**"
         + ("" if rep["passed"] else " — " + "; ".join(rep["failures"])), "",
         "| stream | answers | failed | events | lost | duplicated | out of order | wrong text | longest pause (s) |",
         "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for kind, row in rep["streams"].items():
        L.append(f"| {kind} | {row['answers']} | {row['failed']} | {row['events']} | {row['lost']} | "
                 f"{row['duplicated']} | {row['out_of_order']} | {row['wrong_text']} | {row['longest_pause_s']} |")
    b = rep["backend"]
    L += ["", f"Backend: {b['requests_seen']} requests for {t['answers']} answers (answers seen other than once: "
          f"{len(b['not_seen_once'])}), {b['completed']} completed, **{b['cancelled']} cancelled**, "
          f"{b['active_at_end']} active at the end. Gateway: {rep['gateway']['circuits_resumed']} circuits resumed, "
          f"{rep['gateway']['grace_expired']} held circuits expired.", "",
          "Resume time: from the event's effect to the first event the backend emitted after it.", "",
          "| event | stream | count | p50 (s) | max (s) |", "| --- | --- | ---: | ---: | ---: |"]
    for kind, row in rep["resume"].items():
        for stream, v in row.items():
            L.append(f"| {kind} | {stream} | {v['count']} | {v['p50']} | {v['max']} |")
    L += ["", "| at (s) | event | ok | in answers for (s) | resume (s) | relaying before | restarted / gateway "
          "relinked (s) |", "| ---: | --- | --- | --- | --- | --- | --- |"]
    for e in rep["events"]:
        d = e["details"]
        L.append(f"| {e['at_s']:.0f} | {e['kind']} | {'yes' if e['ok'] else '**NO**'} | "
                 + ", ".join(f"{k} {v}" for k, v in e["in_flight"].items()) + " | "
                 + ", ".join(f"{k} {v}" for k, v in e["resume_s"].items()) + " | "
                 + (", ".join(f"{k} {'+'.join(v) if isinstance(v, list) else v}"
                              for k, v in d.get("relaying_before", {}).items()) if d else "") + " | "
                 + (f"{d.get('restarted_s')} / {d.get('gateway_relinked_s')}" if d else "")
                 + (f" {d['error']}" if d.get("error") else "") + " |")
    L += ["", "| process | pid | judged from (s) | private first / last / max (MiB) | floor slope (KiB/min) | "
          "growth over run / limit (MiB) | flat |", "| --- | ---: | ---: | --- | ---: | --- | --- |"]
    for m in rep["memory"]:
        judged = m.get("anon_judged")
        L.append(f"| {m['role']} | {m['pid']} | {m['judged_from_s']:.0f} | {m['anon_first_mib']:.1f} / "
                 f"{m['anon_last_mib']:.1f} / {m['anon_max_mib']:.1f} | "
                 + (f"{m['anon_floor_slope_kib_per_min']:+.1f} | {m['anon_growth_over_run_mib']:+.2f} / "
                    f"{m['anon_limit_mib']:.1f} | {'yes' if m['anon_flat'] else '**NO**'} |" if judged
                    else "- | - | not judged (window too short) |"))
    for c in rep["controller_incarnations"]:
        settled = ", ".join(f"{r['settled_private_mib']:.1f}" + ("" if r["full_cycle"] else "*")
                            for r in c["incarnations"])
        verdict = (f"growth {c['growth_mib']:+.2f} MiB (limit {c['limit_mib']:.1f}): "
                   f"{'flat' if c['flat'] else '**GREW**'}" if c["judged"] else "not judged (< 2 full cycles)")
        L.append(f"\n{c['role']} across incarnations, settled private MiB ({len(c['incarnations'])}; * not a full "
                 f"cycle): {settled}; {verdict}.")
    a = rep["app_memory"]
    L.append(f"\nApp processes: {a['processes_sampled']} sampled, peak private {a['peak_private_mib_first']} MiB "
             f"(first) … {a['peak_private_mib_max']} MiB (max); "
             + (f"floor slope {a['anon_floor_slope_kib_per_min']:+.1f} KiB/min, "
                f"{'flat' if a['anon_flat'] else '**GREW**'}." if a.get("anon_judged") else "not judged."))
    return "\n".join(L) + "\n"


def print_summary(rep: dict) -> None:
    print()
    for kind, row in rep["streams"].items():
        print(f"{kind:<7} {row['answers']:>4} answers ({row['failed']} failed), {row['events']} events: lost "
              f"{row['lost']}, duplicated {row['duplicated']}, out of order {row['out_of_order']}, wrong text "
              f"{row['wrong_text']}; longest pause {row['longest_pause_s']} s")
    b = rep["backend"]
    print(f"backend {b['requests_seen']} requests, {b['completed']} completed, {b['cancelled']} cancelled, "
          f"{b['active_at_end']} active at the end; answers not seen exactly once: {len(b['not_seen_once'])}")
    print(f"gateway {rep['gateway']['circuits_resumed']} circuits resumed, {rep['gateway']['grace_expired']} expired")
    for kind, row in rep["resume"].items():
        print(f"resume after {kind}: " + "; ".join(f"{stream} p50 {v['p50']} s, max {v['max']} s ({v['count']})"
                                                    for stream, v in row.items()))
    for e in rep["events"]:
        d = e["details"]
        extra = (f" relaying before: {d.get('relaying_before')}, restarted {d.get('restarted_s')} s, gateway "
                 f"relinked {d.get('gateway_relinked_s')} s" if e["kind"].startswith("kill") else "")
        print(f"t={e['at_s']:7.1f}s {e['kind']:<15} {'ok ' if e['ok'] else 'BAD'} resume {e['resume_s']}{extra}"
              f"{' ' + d['error'] if d.get('error') else ''}")
    print()
    print(f"{'process':<14} {'pid':>7} {'judged@':>7} {'priv 1st':>8} {'last':>7} {'max':>7} {'KiB/min':>8} "
          f"{'floor':>8} {'growth':>7} {'fds f/l/max':>12}")
    for m in rep["memory"]:
        judged = m.get("anon_judged")
        slope = (f"{m['anon_slope_kib_per_min']:+8.1f} {m['anon_floor_slope_kib_per_min']:+8.1f} "
                 f"{m['anon_growth_over_run_mib']:+7.2f}" if judged else f"{'-':>8} {'-':>8} {'-':>7}")
        print(f"{m['role']:<14} {m['pid']:>7} {m['judged_from_s']:7.0f} {m['anon_first_mib']:8.1f} "
              f"{m['anon_last_mib']:7.1f} {m['anon_max_mib']:7.1f} {slope} "
              f"{m['fds_first']:>4}/{m['fds_last']}/{m['fds_max']}")
    for c in rep["controller_incarnations"]:
        print(f"{c['role']} incarnations (settled private MiB): "
              + ", ".join(f"{r['settled_private_mib']:.1f}{'' if r['full_cycle'] else '*'}" for r in c["incarnations"])
              + (f" -> growth {c['growth_mib']:+.2f} (limit {c['limit_mib']:.1f})" if c["judged"] else " (not judged)"))
    a = rep["app_memory"]
    print(f"app: {a['processes_sampled']} processes, peak private {a['peak_private_mib_first']} .. "
          f"{a['peak_private_mib_max']} MiB" + (f", floor slope {a['anon_floor_slope_kib_per_min']:+.1f} KiB/min"
                                                if a.get("anon_judged") else " (not judged)"))
    for q in rep["rest"]:
        print(f"at rest {q['role']:<10} fds {q['fds_first']} -> {q['fds_last']}  private {q['anon_first_mib']:.1f} "
              f"-> {q['anon_last_mib']:.1f} MiB  {'ok' if q['fds_ok'] else 'GREW'}")
    print()
    print("PASS" if rep["passed"] else "FAIL: " + "; ".join(rep["failures"]))


# ------------------------------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------------------------------


@dataclass
class Run:
    """What a run saw, for the judge."""
    plan: list[Event]
    duration: float
    warmup: float
    sample_interval: float
    failures: list[str] = field(default_factory=list)
    streamers: list[Streamer] = field(default_factory=list)
    sampler: Optional[Sampler] = None
    events: list[Event] = field(default_factory=list)  # the ones that ran
    rest_before: dict = field(default_factory=dict)  # per role, at rest before the streams and after them
    rest_after: dict = field(default_factory=dict)
    backend_before: dict = field(default_factory=dict)  # the backend's stream counters
    backend_after: dict = field(default_factory=dict)
    backend_log: str = ""
    gateway_log: str = ""
    unexpected_exits: list[str] = field(default_factory=list)
    exit_codes: dict = field(default_factory=dict)
    interrupted: bool = False
    t0: float = 0.0  # monotonic, when the streams started
    t0_wall: float = 0.0


def fire(event: Event, ns: DeviceNetns, rig: Rig, streamers: list[Streamer], t0: float) -> None:
    """Waits (at most IN_FLIGHT_WAIT_S) until both streams are under way in an answer, then switches or kills. A
    switch may land up to an answer's last event (its tail is what a held circuit must still deliver); a kill lands
    IN_FLIGHT_LEFT_S before it, so that the relaying circuits `admin sessions` lists are still the ones killed."""
    left = IN_FLIGHT_LEFT_S if event.kind.startswith("kill") else -float("inf")

    def mid_answer(s: Streamer) -> bool:
        into = s.in_flight_for()
        return into is not None and IN_FLIGHT_MIN_S <= into <= s.pacing_s - left

    waited = time.monotonic()
    while time.monotonic() - waited < IN_FLIGHT_WAIT_S and not all(mid_answer(s) for s in streamers):
        time.sleep(0.1)
    for s in streamers:
        into = s.in_flight_for()
        event.in_flight[s.kind] = round(into, 1) if into is not None else None
    event.at_s = round(time.monotonic() - t0, 1)
    try:
        if event.kind.startswith("switch"):
            ns.switch(to_cell=event.kind == "switch-to-cell")
            event.at = time.time()  # the old path is black-holed from here (the rules take ~0.2 s to put in place)
            event.ok = True
        else:
            event.details = rig.kill_and_restart(event.kind.split("-")[1])
            event.at = event.details.pop("killed_at")
            event.ok = event.details["ok"]
    except (Exception, *HarnessFailure) as e:
        event.details["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    log(f"{event.kind} at {event.at_s:.0f} s ({'ok' if event.ok else 'FAILED'}); streams in their answers for "
        f"{event.in_flight} s; answers so far "
        + ", ".join(f"{s.kind} {len(s.answers)} ({sum(not a.ok for a in s.answers)} failed)" for s in streamers)
        + (f"; {event.details}" if event.details else ""))


def observe(run: Run, args: argparse.Namespace, ns: DeviceNetns, rig: Rig, example: Path, logs: Path) -> None:
    """Starts everything, streams for the run's duration with the events in between, lets the answers under way
    finish, and stops everything (also on Ctrl-C or a harness error, which it records)."""
    stop = threading.Event()
    try:
        rig.start()
        query = f"/claude/stream?n={args.events}&interval_ms={args.interval_ms}&prompt="
        max_time = str(int(args.events * args.interval_ms / 1000 + ANSWER_SLACK_S))
        run.streamers = [
            Streamer("tunnel", lambda prompt: ns.exec_args() + [
                "curl", "-sSN", "--max-time", max_time, f"http://127.0.0.1:{rig.tunnel_port}{query}{prompt}"],
                args.events, args.interval_ms, rig.root, logs, stop),
            Streamer("app", lambda prompt: ns.exec_args() + [
                str(example), "stream", "--identity", "identities/app-r.json", *DEVICE_KEEPALIVE, f"{query}{prompt}"],
                args.events, args.interval_ms, rig.root, logs, stop),
        ]
        run.backend_before = backend_streams(rig.backend)
        run.sampler = Sampler(Watched(rig, run.streamers[1]), time.monotonic(), run.sample_interval, Gate())
        run.rest_before = run.sampler.quiescent("at rest before the streams")
        run.sampler.gate.resume()
        run.t0, run.t0_wall = time.monotonic(), time.time()
        run.sampler.t0 = run.t0
        run.sampler.thread.start()
        for s in run.streamers:
            s.thread.start()
        log(f"set up: controllers A {rig.a.address}, B {rig.controllers['B'].address}, device namespace {ns.name}; "
            "streaming")
        for event in run.plan:
            while time.monotonic() - run.t0 < event.planned_s:
                time.sleep(min(0.5, max(0.0, event.planned_s - (time.monotonic() - run.t0))))
            fire(event, ns, rig, run.streamers, run.t0)
            run.events.append(event)
        while time.monotonic() - run.t0 < run.duration:
            time.sleep(min(0.5, max(0.0, run.duration - (time.monotonic() - run.t0))))
        log("streaming time over: letting the answers under way finish")
        stop.set()
        for s in run.streamers:
            s.thread.join(s.timeout + 15)
        run.backend_after = backend_streams(rig.backend)
        run.rest_after = run.sampler.quiescent("at rest after the streams")
        run.sampler.samples.extend(run.sampler.read())
    except KeyboardInterrupt as e:
        run.interrupted = True
        run.failures.append(f"interrupted ({e or 'Ctrl-C'})")
        log("interrupted: stopping everything")
    except (Exception, *HarnessFailure) as e:
        run.failures.append(f"harness error: {type(e).__name__}: {str(e)[:500]}")
        log(f"harness error: {type(e).__name__}: {e}")
    finally:
        stop.set()
        if run.sampler is not None:
            run.sampler.stop.set()
        for s in run.streamers:
            s.kill_current()
        for s in run.streamers:
            if s.thread.is_alive():
                s.thread.join(15)
        run.unexpected_exits = [role for role, p in rig.long_lived()
                                if p is not None and p.proc is not None and not p.alive()]
        run.backend_log = rig.backend.full_log() if rig.backend is not None else ""
        run.gateway_log = rig.gateway.full_log() if rig.gateway is not None else ""
        run.exit_codes = rig.stop()


def tallied(log: str, text: str) -> int:
    """How many events the gateway's tallied lines for `text` count (`since_last_line=N`; 1 for a line without it)."""
    total = 0
    for line in log.splitlines():
        if text in line:
            found = re.search(r"since_last_line=(\d+)", line)
            total += int(found.group(1)) if found else 1
    return total


def judge(run: Run, logs: Path) -> dict:
    """The report's figures; every check that fails adds to run.failures."""
    failures, interrupted = run.failures, run.interrupted
    answers = [a for s in run.streamers for a in s.answers if not a.cut]
    counts = ("events", "lost", "duplicated", "out_of_order", "wrong_text")
    streams = {}
    for s in run.streamers:
        judged = [a for a in s.answers if not a.cut]
        streams[s.kind] = {k: sum(getattr(a, k) for a in judged) for k in counts}
        streams[s.kind].update({"answers": len(judged), "failed": sum(not a.ok for a in judged),
                                "cut_by_interruption": len(s.answers) - len(judged),
                                "longest_pause_s": max((a.max_gap_s for a in judged), default=None)})
        if not judged and not interrupted:
            failures.append(f"no {s.kind} answer at all")
    totals = {"answers": len(answers), **{k: sum(row[k] for row in streams.values()) for k in ("failed", *counts)}}
    for k in ("failed", "lost", "duplicated", "out_of_order", "wrong_text"):
        if totals[k]:
            failures.append(f"{totals[k]} {'answers failed' if k == 'failed' else 'events ' + k.replace('_', ' ')}")

    # The backend: one request per answer (its access log names each answer's prompt), none cancelled.
    seen = {a.prompt: run.backend_log.count(f"prompt={a.prompt} ") + run.backend_log.count(f"prompt={a.prompt}&")
            for a in answers}
    before, after = run.backend_before, run.backend_after
    backend = {"requests_seen": sum(seen.values()), "not_seen_once": {p: n for p, n in seen.items() if n != 1},
               "completed": after.get("completed", 0) - before.get("completed", 0),
               "cancelled": after.get("disconnected", 0) - before.get("disconnected", 0),
               "active_at_end": after.get("active")}
    if after:
        if backend["cancelled"]:
            failures.append(f"{backend['cancelled']} backend requests cancelled")
        if backend["completed"] != len(answers) and not interrupted:
            failures.append(f"the backend completed {backend['completed']} answers of {len(answers)}")
        if backend["active_at_end"]:
            failures.append(f"{backend['active_at_end']} backend streams still active at the end")
    if backend["not_seen_once"]:
        failures.append(f"{len(backend['not_seen_once'])} answers not seen exactly once by the backend")
    # The gateway logs these once a minute per identity (expiries: once a minute) with `since_last_line=N`: the sum
    # of the counts is every event up to the last line (those after it wait for the next line; the metrics have all).
    gateway = {"circuits_resumed": tallied(run.gateway_log, "circuit resumed"),
               "grace_expired": tallied(run.gateway_log, "was not resumed within the grace window")}
    if gateway["grace_expired"]:
        failures.append(f"{gateway['grace_expired']} held circuits ran out their grace window in the gateway")

    for e in run.events:
        e.resume_s = resume_times(e, run.streamers)
    if len(run.events) < len(run.plan) and not interrupted:
        failures.append(f"only {len(run.events)} of {len(run.plan)} events ran")
    bad = [f"{e.kind}@{e.at_s:.0f}s" for e in run.events if not e.ok]
    if bad:
        failures.append(f"events that failed: {', '.join(bad)}")

    samples = run.sampler.samples if run.sampler else []
    memory = analyse_memory([s for s in samples if s.role != "app"], run.warmup, run.duration, run.warmup)
    for m in memory:
        if m.get("anon_judged") and not m["anon_flat"]:
            failures.append(f"{m['role']} (pid {m['pid']}) private memory floor grows "
                            f"{m['anon_floor_slope_kib_per_min']:.0f} KiB/min ({m['anon_growth_over_run_mib']:.1f} "
                            f"MiB over the run, limit {m['anon_limit_mib']:.1f}; judged from {m['judged_from_s']:.0f} s)")
    for role in ("gateway", "tunnel", "backend"):
        if not interrupted and not any(m["role"] == role and m.get("anon_judged") for m in memory):
            failures.append(f"{role}'s memory not judged: the run is too short (a slope needs "
                            f"{soak.MIN_FIT_SPAN_S:.0f} s after the {run.warmup:.0f} s warm-up)")
    incarnations = [controller_incarnations(samples, f"controller-{n}") for n in NAMES]
    for c in incarnations:
        if c["judged"] and not c["flat"]:
            failures.append(f"{c['role']}'s incarnations settle {c['growth_mib']:+.1f} MiB above the first full one "
                            f"(limit {c['limit_mib']:.1f})")
    app = [s for s in run.streamers if s.kind == "app"]
    app_memory = app_peaks(samples, app[0].answers if app else [], run.t0_wall, run.warmup, run.duration)
    if app_memory.get("anon_judged") and not app_memory["anon_flat"]:
        failures.append(f"the app's peak private memory grows {app_memory['anon_floor_slope_kib_per_min']:.0f} KiB/min "
                        "from answer to answer")
    rest = [q for q in fd_checks(run.rest_before, run.rest_after, {m["pid"]: m["warm_from_s"] for m in memory})
            if q["role"] in ("gateway", "tunnel", "backend")]
    for q in rest:
        if not q["fds_ok"]:
            failures.append(f"{q['role']} descriptors at rest {q['fds_first']} before -> {q['fds_last']} after")

    if run.unexpected_exits and not interrupted:
        failures.append(f"processes exited by themselves: {run.unexpected_exits}")
    bad_codes = {r: c for r, c in run.exit_codes.items() if c != 0 and not (r == "backend" and c == -signal.SIGTERM)}
    if bad_codes:
        failures.append(f"non-zero exit after SIGTERM: {bad_codes}")
    leaked = [f.name for f in logs.glob("*.log") if pg_fixture.PASSWORD in f.read_text(errors="replace")]
    if leaked:
        failures.append(f"the store password is in these logs: {leaked}")
    return {"totals": totals, "streams": streams, "backend": backend, "gateway": gateway,
            "resume": resume_summary(run.events), "events": [asdict(e) for e in run.events], "memory": memory,
            "controller_incarnations": incarnations, "app_memory": app_memory, "rest": rest,
            "exit_codes": run.exit_codes, "answers": [a.report() for s in run.streamers for a in s.answers],
            "samples": [asdict(s) for s in samples]}


def default_binary(name: str) -> Path:
    for build in ("release", "debug"):
        path = ROOT / ".build" / build / name
        if path.is_file():
            return path
    return ROOT / ".build" / "release" / name


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", type=Path, default=default_binary("ils-gateway"), help="the ils-gateway binary")
    ap.add_argument("--client-example-bin", type=Path, default=default_binary("ils-client-example"),
                    help="ils-client-example (default: .build/release, else .build/debug)")
    ap.add_argument("--minutes", type=float, default=30.0, help="how long answers stream (default 30)")
    ap.add_argument("--switch-period", type=float, default=60.0, help="seconds between path switches")
    ap.add_argument("--kill-period", type=float, default=180.0, help="seconds between controller SIGKILLs")
    ap.add_argument("--events", type=int, default=400, help="SSE events per answer")
    ap.add_argument("--interval-ms", type=int, default=50, help="milliseconds between events")
    ap.add_argument("--sample-interval", type=float, default=None,
                    help=f"seconds between memory samples (default {soak.SAMPLE_S:.0f}, 2 under 10 minutes)")
    ap.add_argument("--min-fit-span", type=float, default=soak.MIN_FIT_SPAN_S,
                    help=f"shortest window a memory slope is judged over (default soak.py's "
                         f"{soak.MIN_FIT_SPAN_S:.0f} s; lower only for a trial run)")
    ap.add_argument("--out", type=Path, default=None, help="report directory (default .ils-soak/resume-<UTC time>)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (state, identities)")
    args = ap.parse_args()
    for path in (args.bin, args.client_example_bin):
        if not (path.is_file() and os.access(path, os.X_OK)):
            ap.error(f"no executable at {path}")
    if os.geteuid() != 0:
        ap.error("needs root: it makes a network namespace, veth pairs and iptables rules")

    duration = args.minutes * 60
    interval = args.sample_interval or (soak.SAMPLE_S if duration >= 600 else 2.0)
    warmup = min(180.0, max(40.0, 0.10 * duration))
    soak.MIN_FIT_SPAN_S = args.min_fit_span  # read by soak.rss_verdict
    plan = plan_events(duration, args.switch_period, args.kill_period)
    started_utc = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out = args.out or ROOT / ".ils-soak" / f"resume-{started_utc.replace(':', '')}"
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="ils-resume-soak-"))
    # Copies: a rebuild during a long run cannot swap the binaries under it.
    binary, example = work / "ils-gateway", work / "ils-client-example"
    shutil.copy2(args.bin, binary)
    shutil.copy2(args.client_example_bin, example)
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True).stdout.strip()
    log(f"resume soak: {args.minutes:g} min, {sum(e.kind.startswith('switch') for e in plan)} switches every "
        f"{args.switch_period:g} s, {sum(e.kind.startswith('kill') for e in plan)} controller kills every "
        f"{args.kill_period:g} s, warm-up {warmup:.0f} s; {args.bin}, {args.client_example_bin}; out {out}")

    def on_term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    atexit.register(stop_leftovers)
    run = Run(plan, duration, warmup, interval)
    try:
        with device_namespace() as ns:
            observe(run, args, ns, Rig(ns, binary, work, logs), example, logs)
    except NetnsUnavailable as e:
        log(f"resume soak: {e}")
        return 2
    except KeyboardInterrupt as e:
        run.interrupted = True
        run.failures.append(f"interrupted during teardown ({e or 'Ctrl-C'})")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    report = {
        "started_utc": started_utc, "binary": str(args.bin), "version": version,
        "client_example_bin": str(args.client_example_bin), "minutes": args.minutes,
        "run_s": round(time.monotonic() - run.t0, 1), "switch_period_s": args.switch_period,
        "kill_period_s": args.kill_period, "events_per_answer": args.events, "interval_ms": args.interval_ms,
        "warmup_s": warmup, "sample_interval_s": interval, "min_fit_span_s": soak.MIN_FIT_SPAN_S,
        **judge(run, logs),
        "machine": f"{os.cpu_count()} cores, load average at the end {os.getloadavg()[0]:.2f}",
    }
    report = {**report, "passed": not run.failures, "failures": run.failures}
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "report.md").write_text(render_markdown(report))
    print_summary(report)
    log(f"report: {out / 'report.md'} and report.json; process logs in {logs}")
    return 0 if not run.failures else 1


if __name__ == "__main__":
    sys.exit(main())
