"""The soak test's checkers can fail: deploy/soak/soak.py's verifiers flag tampered, truncated, reordered and foreign
payloads (also through the worker's own request code, with a mock transport in place of the gateway), its flatness
analysis flags a growing series and not a noisy flat one, and a failure outside a fault window is "unexpected".

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
