"""The soak test's checkers can fail: deploy/soak/soak.py's verifiers flag tampered, truncated, reordered and foreign
payloads (also through the worker's own request code, with a mock transport in place of the gateway), its flatness
analysis flags a growing series and not a noisy flat one, each incarnation is judged after its own warm-up under load
(a restarted process that idles, then fills up under load, is not failed; one that keeps growing after is; one that
never carries load is judged as idle), and a failure outside a fault window is "unexpected". The resumption soak
(deploy/soak/resume_soak.py) counts each lost, duplicated, reordered and foreign event of an answer.

No processes, no sockets: a few seconds."""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys

import httpx

from conftest import REPO_ROOT
from sse_helpers import SSEEvent

sys.path.insert(0, str(REPO_ROOT / "deploy" / "soak"))
import soak  # noqa: E402

MIB = 1024 * 1024


def generated(size: int, seed: int) -> bytes:
    return b"".join(soak.pseudorandom_blocks(size, seed))


def test_download_verifier_catches_tampering_and_truncation() -> None:
    size, seed = 300_000, 42
    body = generated(size, seed)
    assert soak.verify_download(len(body), hashlib.sha256(body).hexdigest(), size, seed) is None
    tampered = bytearray(body)
    tampered[123_456] ^= 0x01
    assert "sha256" in soak.verify_download(len(tampered), hashlib.sha256(tampered).hexdigest(), size, seed)
    short = body[:-1]
    assert "bytes, expected" in soak.verify_download(len(short), hashlib.sha256(short).hexdigest(), size, seed)


def sse(prompt: str, n: int, *, order=None, text_from: str = "", done: bool = True) -> list[SSEEvent]:
    words = soak.fake_answer(text_from or prompt).split()
    events = [SSEEvent("message", json.dumps({"index": i, "text": words[i % len(words)]}), 0.0)
              for i in (order if order is not None else range(n))]
    return events + ([SSEEvent("done", json.dumps({"count": n}), 0.0)] if done else [])


def test_sse_verifier_catches_missing_reordered_foreign_and_truncated_streams() -> None:
    p = "soak overlay-1 7 deadbeef"
    assert soak.verify_sse(sse(p, 8), p, 8) is None
    assert "out of order" in soak.verify_sse(sse(p, 8, order=[0, 1, 3, 2, 4, 5, 6, 7]), p, 8)
    assert "missing" in soak.verify_sse(sse(p, 8, order=[0, 1, 2, 4, 5, 6, 7]), p, 8)
    assert "another stream" in soak.verify_sse(sse(p, 8, text_from="soak overlay-2 9 cafef00d"), p, 8)
    assert "without its done" in soak.verify_sse(sse(p, 8, done=False), p, 8)


def test_upload_and_websocket_verifiers() -> None:
    body = b"x" * 1000
    digest = hashlib.sha256(body).hexdigest()
    assert soak.verify_upload({"bytes": 1000, "sha256": digest}, 1000, digest) is None
    assert soak.verify_upload({"bytes": 1000, "sha256": "0" * 64}, 1000, digest) is not None
    assert soak.verify_upload({"bytes": 999, "sha256": digest}, 1000, digest) is not None
    assert soak.verify_ws(["a", b"b"], ["a", b"b"]) is None
    assert soak.verify_ws(["a", b"b"], ["a", b"c"]) is not None
    assert soak.verify_ws(["a"], [b"a"]) is not None  # text sent, binary echoed
    assert soak.verify_ws(["a", "b"], ["a"]) is not None


def mock_client(handler) -> httpx.Client:
    return httpx.Client(base_url="http://gateway.invalid", transport=httpx.MockTransport(handler))


def test_worker_download_reports_a_flipped_byte_as_corrupted() -> None:
    """The worker's own request code, with a gateway that flips one byte of the body it passes on."""
    load = soak.Load(system=None, max_bytes=MIB, seed=1)  # type: ignore[arg-type]

    def handler(request: httpx.Request) -> httpx.Response:
        q = request.url.params
        body = bytearray(generated(int(q["size"]), int(q["seed"])))
        body[len(body) // 2] ^= 0x80
        return httpx.Response(200, stream=httpx.ByteStream(bytes(body)))

    with mock_client(handler) as client:
        outcome, detail, _ = load.op_download("http", client, random.Random(3))
    assert outcome == "corrupted", detail

    def honest(request: httpx.Request) -> httpx.Response:
        q = request.url.params
        return httpx.Response(200, stream=httpx.ByteStream(generated(int(q["size"]), int(q["seed"]))))

    with mock_client(honest) as client:
        assert load.op_download("http", client, random.Random(3))[0] == "ok"


def test_worker_sse_reports_a_dropped_event_as_corrupted() -> None:
    load = soak.Load(system=None, max_bytes=MIB, seed=1)  # type: ignore[arg-type]

    def handler(request: httpx.Request) -> httpx.Response:
        q = request.url.params
        n = int(q["n"])
        events = sse(q["prompt"], n, order=[i for i in range(n) if i != 1])  # event 1 lost, stream ends cleanly
        text = "".join(f"event: {e.event}\r\ndata: {e.data}\r\n\r\n" for e in events)
        return httpx.Response(200, content=text.encode(), headers={"content-type": "text/event-stream"})

    with mock_client(handler) as client:
        outcome, detail, _ = load.op_sse("overlay-1", client, random.Random(5))
    assert outcome == "corrupted" and "index" in detail, detail


def test_flatness_flags_growth_and_accepts_noise() -> None:
    run_s = 1800.0
    rng = random.Random(0)
    flat = [(t, 60 * MIB + rng.uniform(-2, 2) * MIB) for t in range(200, 1800, 5)]
    assert soak.rss_verdict(flat, run_s)["flat"]
    leaking = [(t, 60 * MIB + t / 60 * 512 * 1024 + rng.uniform(-1, 1) * MIB) for t in range(200, 1800, 5)]
    v = soak.rss_verdict(leaking, run_s)  # 512 KiB/min: 15 MiB over 30 minutes
    assert not v["flat"] and 400 < v["slope_kib_per_min"] < 600, v
    assert not soak.rss_verdict(flat[:5], run_s)["judged"]  # too few samples to say anything


def test_quiescent_check_flags_descriptor_and_memory_growth() -> None:
    first = {"gateway-http": {"pid": 1, "fds": 17, "rss": 50 * MIB, "anon": 50 * MIB}}
    assert soak.fd_checks(first, {"gateway-http": {"pid": 1, "fds": 17 + soak.FD_SLACK, "rss": 60 * MIB, "anon": 60 * MIB}})[0]["ok"]
    assert not soak.fd_checks(first, {"gateway-http": {"pid": 1, "fds": 40, "rss": 50 * MIB, "anon": 50 * MIB}})[0]["fds_ok"]
    assert not soak.fd_checks(first, {"gateway-http": {"pid": 1, "fds": 17, "rss": 80 * MIB, "anon": 80 * MIB}})[0]["rss_ok"]
    # a restarted process (another pid) is compared by descriptors only
    assert soak.fd_checks(first, {"gateway-http": {"pid": 2, "fds": 17, "rss": 80 * MIB, "anon": 80 * MIB}})[0]["ok"]


def test_memory_is_judged_on_private_pages_not_on_code_faulted_in() -> None:
    first = {"gateway-http": {"pid": 1, "fds": 17, "rss": 40 * MIB, "anon": 8 * MIB}}
    # 30 MiB more of the executable's pages resident (code paths run for the first time): not a leak
    code = soak.fd_checks(first, {"gateway-http": {"pid": 1, "fds": 17, "rss": 70 * MIB, "anon": 9 * MIB}})[0]
    assert code["ok"], code
    # the same growth in private memory is
    heap = soak.fd_checks(first, {"gateway-http": {"pid": 1, "fds": 17, "rss": 70 * MIB, "anon": 38 * MIB}})[0]
    assert not heap["rss_ok"], heap
    rss, anon = soak.resident(os.getpid())
    assert 0 < anon <= rss


def test_failures_outside_fault_windows_are_unexpected() -> None:
    ops = [
        soak.Op("overlay-1", "sse", 10.0, 12.0, "failed", "ReadError"),  # overlaps the controller window
        soak.Op("http", "sse", 10.0, 12.0, "failed", "ReadError"),  # HTTP mode does not use the controller
        soak.Op("overlay-2", "download", 30.0, 31.0, "failed", "ReadTimeout"),  # after the window
        soak.Op("http", "upload", 5.0, 6.0, "corrupted", "sha256"),
        soak.Op("http", "upload", 6.0, 7.0, "ok", "", 100),
    ]
    result = soak.classify(ops, [("overlay", 11.0, 20.0)])
    assert [(o.path, o.start) for o in result["unexpected"]] == [("http", 10.0), ("overlay-2", 30.0)]
    t = result["table"]
    assert t[("overlay-2", "download")]["timeouts"] == 1
    assert t[("http", "upload")] == {"ok": 1, "failed": 0, "corrupted": 1, "unexpected": 0, "timeouts": 0,
                                     "bytes": 100}


def test_schedule_has_every_event_in_two_minutes_and_several_in_thirty() -> None:
    _, short = soak.schedule(120, 20, None)
    assert sorted(k for _, k in short) == sorted(soak.FAULT_CYCLE)
    _, long = soak.schedule(1800, 180, None)
    assert all(sum(k == kind for _, k in long) >= 4 for kind in soak.FAULT_CYCLE)
    assert max(t for t, _ in long) < 1800 * 0.7


def w(seq: int, op: str, name: str, ok: bool, through: str = "A") -> "soak.Write":
    return soak.Write(seq, through, op, name, ok, float(seq), float(seq) + 0.1)


def test_lost_write_check_flags_a_missing_acknowledged_write_and_accepts_a_failed_one() -> None:
    writes = [
        w(1, "create", "soak-w-1", True),
        w(2, "disable", "soak-w-1", True, "B"),
        w(3, "create", "soak-w-2", True, "B"),
        w(4, "create", "soak-w-3", False),  # its controller was killed under it: not applied
        w(5, "disable", "soak-w-2", False),  # killed after committing: applied anyway
    ]
    fine = {"soak-w-1": "disabled", "soak-w-2": "disabled"}
    v = soak.check_writes(writes, fine)
    assert (v["acknowledged"], v["failed"], v["lost"]) == (3, 2, []), v
    assert [x["seq"] for x in v["failed_applied"]] == [5] and v["failed_not_applied"] == 1, v
    # The acknowledged disable of soak-w-1 is not visible (still pending): lost.
    v = soak.check_writes(writes, {**fine, "soak-w-1": "pending"})
    assert [(x["seq"], x["observed"]) for x in v["lost"]] == [(2, "pending")], v
    # An acknowledged create that no controller lists: lost.
    v = soak.check_writes(writes, {"soak-w-1": "disabled"})
    assert [x["seq"] for x in v["lost"]] == [3], v


def test_cluster_schedule_alternates_the_controller_killed() -> None:
    _, short = soak.schedule(180, 40, None, controllers=2)
    kills = [k for _, k in short if k.startswith("controller")]
    assert kills[:2] == ["controller-A", "controller-B"], short
    _, long = soak.schedule(3600, 180, None, controllers=2)
    kills = [k for _, k in long if k.startswith("controller")]
    assert len(kills) >= 10 and kills == [f"controller-{'AB'[i % 2]}" for i in range(len(kills))], kills
    assert {soak.fault_kind(k) for _, k in long} == set(soak.FAULT_CYCLE)
    # one controller: today's plain "controller" events
    assert "controller" in [k for _, k in soak.schedule(180, 40, None)[1]]


def incarnation(role: str, pid: int, born: float, end: float, anon, cpu_share, step: float = 5.0) -> list:
    """Synthetic samples of one process: anon(t) in bytes and cpu_share(t) (share of a core used around t); the CPU
    time is their integral, as /proc/PID/stat would report it."""
    out, cpu, t = [], 0.0, born
    while t <= end:
        out.append(soak.Sample(t, role, pid, anon(t) + 30 * MIB, anon(t), 20, False, cpu))
        cpu += cpu_share(t) * step
        t += step
    return out


def sample_at(samples: list, t: float) -> dict:
    """The first sample at or after t, as a quiescent point's snapshot."""
    return next(s for s in samples if s.t >= t).__dict__


def noise(seed: int):
    rng = random.Random(seed)
    return lambda: rng.uniform(-1.5, 1.5) * MIB


# The reported 20-minute run: --controllers 2, warm-up 120 s, controller-B SIGKILLed and restarted at 611 s, idle
# (devices on A) until A is killed at 700 s, then carrying the devices and filling up to ~24 MiB, the plateau every
# incarnation under load reached (20-23 MiB), within 3 minutes.
RUN_S, WARMUP_S, FIT_FROM_S = 1200.0, 120.0, 135.0
B_BORN, B_LOADED = 611.0, 700.0


def warming_b(extra_per_min: float = 0.0, seed: int = 1):
    jitter = noise(seed)

    def anon(t: float) -> float:
        if t < B_LOADED:
            return 7.7 * MIB + jitter() / 10
        loaded = t - B_LOADED
        plateau = 7.7 * MIB + 16.3 * MIB * (1 - 2.718 ** (-loaded / 45))
        return plateau + extra_per_min * max(0.0, loaded - WARMUP_S) / 60 + jitter()

    return anon


def b_cpu(t: float) -> float:
    return 0.03 if t < B_LOADED else 0.45  # heartbeats and admin writes (above the floor), then two devices' traffic


def test_restarted_incarnation_that_idles_then_warms_up_under_load_is_not_failed() -> None:
    samples = incarnation("controller-B", 4242, B_BORN, RUN_S, warming_b(), b_cpu)
    # What the judge did before: its own warm-up counted from birth, so the climb under load looked like a leak.
    birth_rule = [(s.t, s.anon) for s in samples if s.t >= B_BORN + soak.INCARNATION_WARMUP_S]
    assert not soak.rss_verdict(birth_rule, RUN_S)["flat"]
    [row] = soak.analyse_memory(samples, FIT_FROM_S, RUN_S, WARMUP_S)
    assert row["carries_load"] and abs(row["load_from_s"] - B_LOADED) <= 10, row
    assert row["judged_from_s"] == row["warm_from_s"] == row["load_from_s"] + WARMUP_S, row
    assert row["anon_judged"] and row["anon_flat"], row
    # A quiescent point taken while it was still warming up under load is not compared with the end.
    mid, end = sample_at(samples, B_LOADED + 100), samples[-1].__dict__
    q = soak.fd_checks({"controller-B": mid}, {"controller-B": end}, {4242: row["warm_from_s"]})[0]
    assert q["ok"] and not q["rss_judged"], q


def test_incarnation_whose_floor_grows_after_its_warm_up_under_load_is_failed() -> None:
    # 1 MiB/min after its 120 s under load: 20 MiB over the run, the limit is 8 MiB.
    samples = incarnation("controller-B", 4242, B_BORN, RUN_S, warming_b(extra_per_min=1 * MIB), b_cpu)
    [row] = soak.analyse_memory(samples, FIT_FROM_S, RUN_S, WARMUP_S)
    assert row["anon_judged"] and not row["anon_flat"], row
    assert 800 < row["anon_floor_slope_kib_per_min"] < 1250, row
    # A faster one in a process that carried load from the start of the run, and its quiescent points.
    jitter = noise(2)
    first = incarnation("gateway-http", 77, 0.0, RUN_S,
                        lambda t: 20 * MIB + 1.5 * MIB * max(0.0, t - 60) / 60 + jitter(), lambda t: 0.6)
    [row] = soak.analyse_memory(first, FIT_FROM_S, RUN_S, WARMUP_S)
    assert row["load_from_s"] == 0.0 and row["judged_from_s"] == FIT_FROM_S, row
    assert not row["anon_flat"], row
    q = soak.fd_checks({"gateway-http": sample_at(first, WARMUP_S + 10)}, {"gateway-http": first[-1].__dict__},
                       {77: row["warm_from_s"]})[0]
    assert q["rss_judged"] and not q["rss_ok"], q


def test_incarnation_that_never_carries_load_is_judged_as_idle_from_its_start() -> None:
    jitter = noise(3)
    # A start-up burst (a whole core for 5 s) and admin requests now and then: not load.
    cpu = lambda t: 1.0 if t < B_BORN + 5 else (0.15 if int(t) % 60 < 5 else 0.005)  # noqa: E731
    idle = incarnation("controller-B", 4243, B_BORN, RUN_S, lambda t: 7.7 * MIB + jitter() / 5, cpu)
    [row] = soak.analyse_memory(idle, FIT_FROM_S, RUN_S, WARMUP_S)
    assert not row["carries_load"] and row["load_from_s"] is None, row
    assert row["judged_from_s"] == B_BORN + soak.INCARNATION_WARMUP_S, row
    assert row["anon_judged"] and row["anon_flat"], row
    # Idle is no excuse: an idle process whose floor grows (per heartbeat, per admin request) is failed.
    leaking = incarnation("controller-B", 4243, B_BORN, RUN_S,
                          lambda t: 7.7 * MIB + 0.75 * MIB * (t - B_BORN) / 60 + jitter() / 5, cpu)
    [row] = soak.analyse_memory(leaking, FIT_FROM_S, RUN_S, WARMUP_S)
    assert not row["carries_load"] and row["anon_judged"] and not row["anon_flat"], row
    # An idle incarnation born too late for MIN_FIT_SPAN_S of samples is reported, not slope-judged.
    late = incarnation("controller-B", 4244, RUN_S - 200, RUN_S, lambda t: 7.7 * MIB, lambda t: 0.005)
    [row] = soak.analyse_memory(late, FIT_FROM_S, RUN_S, WARMUP_S)
    assert not row["carries_load"] and not row["anon_judged"], row


def test_a_process_loaded_from_its_start_at_a_small_share_of_a_core_is_loaded_from_its_start() -> None:
    """A 2-minute debug run on 2 cores: the tunnels relayed 4 MiB/s each at 8 % of a core, the controller 21 %."""
    rng = random.Random(4)
    tunnel = incarnation("tunnel-overlay-1", 90, 0.0, 120.0, lambda t: 8 * MIB, lambda t: rng.uniform(0.04, 0.12),
                         step=2.0)
    assert soak.load_onset(tunnel) == 0.0
    assert soak.warmed_up(tunnel, 40.0) == (40.0, 0.0)


def test_cpu_time_is_read_from_proc() -> None:
    before = soak.cpu_seconds(os.getpid())
    deadline = soak.time.process_time() + 0.2
    while soak.time.process_time() < deadline:
        pass
    assert soak.cpu_seconds(os.getpid()) - before >= 0.1


def test_resume_soak_counts_each_lost_duplicated_reordered_and_foreign_event() -> None:
    """deploy/soak/resume_soak.py's answer judge counts every bad event (its totals are figures, not a first error),
    and an answer without its `done` fails."""
    import resume_soak

    def judged(events: list[SSEEvent], prompt: str = "resume-soak-app-1-abcdef") -> "resume_soak.Answer":
        answer = resume_soak.Answer("app", 1, prompt, 0.0, status=0)
        resume_soak.judge_answer(answer, events, 8)
        return answer

    p = "resume-soak-app-1-abcdef"
    good = judged(sse(p, 8))
    assert good.ok and (good.events, good.lost, good.duplicated, good.out_of_order, good.wrong_text) == (8, 0, 0, 0, 0)
    # 6 never came, the second 2 is a duplicate, 4 came after 5.
    bad = judged(sse(p, 8, order=[0, 1, 2, 2, 3, 5, 4, 7]))
    assert (bad.lost, bad.duplicated, bad.out_of_order, bad.wrong_text) == (1, 1, 1, 0) and not bad.ok
    # The backend's words are "This is a canned answer to: PROMPT", in turn: event 6 carries another answer's prompt.
    foreign = judged(sse(p, 8, text_from="resume-soak-app-2-012345"))
    assert foreign.wrong_text == 1 and not foreign.ok
    cut = judged(sse(p, 8, done=False))
    assert cut.lost == 0 and not cut.done_ok and not cut.ok


def test_resume_soak_plans_switches_and_alternating_kills_apart() -> None:
    import resume_soak

    plan = resume_soak.plan_events(240, 30, 60)
    assert [(e.planned_s, e.kind) for e in plan if e.kind.startswith("kill")] == [
        (45, "kill-A"), (105, "kill-B"), (165, "kill-A"), (225, "kill-B")]
    switches = [e.kind for e in plan if e.kind.startswith("switch")]
    assert switches == ["switch-to-cell", "switch-to-wifi"] * 3 + ["switch-to-cell"]
    assert len(resume_soak.plan_events(1800, 60, 180)) == 29 + 10
