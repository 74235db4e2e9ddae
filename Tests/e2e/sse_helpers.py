"""Helpers shared by test_http_mode.py and test_overlay.py: reading a server-sent-event stream with a receive time
per line (through httpx or curl), and the assertions both modes make about streams and gateway errors.

Imported as a top-level module (`from sse_helpers import ...`), like conftest: pytest's default "prepend" import mode
puts this directory (it has no __init__.py) on sys.path, whether pytest is run from the repository root or from here.
"""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Optional

import httpx

if TYPE_CHECKING:
    from conftest import Backend


@dataclass
class SSEEvent:
    event: str
    data: str
    received_at: float  # time.time() when its data line arrived

    @property
    def json(self) -> dict:
        return json.loads(self.data)


def parse_sse(lines: Iterable[tuple[float, str]], stop_after: Optional[int] = None) -> list[SSEEvent]:
    """Parses (receive time, line) pairs into events; stops at `done` or after `stop_after` message events."""
    events: list[SSEEvent] = []
    name, data, data_at = "message", [], None
    for at, line in lines:
        if line.startswith(":"):
            continue  # comment / keep-alive ping
        if line == "":
            if data:
                events.append(SSEEvent(name, "\n".join(data), data_at))
                if name == "done":
                    break
                if stop_after is not None and sum(e.event == "message" for e in events) >= stop_after:
                    break
            name, data, data_at = "message", [], None
            continue
        key, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if key == "event":
            name = value
        elif key == "data":
            data.append(value)
            if data_at is None:
                data_at = at
    return events


def timed_lines(response: httpx.Response, deadline_s: float = 20.0) -> Iterator[tuple[float, str]]:
    """The response body's lines, each with its receive time (time.time()); fails if the stream outlives deadline_s.

    Keep a reference to the iterator while the response is meant to stay open: a line iterator that is
    garbage-collected closes the response, i.e. hangs up."""
    deadline = time.monotonic() + deadline_s
    for line in response.iter_lines():
        yield time.time(), line
        if time.monotonic() > deadline:
            raise AssertionError(f"stream still open after {deadline_s} s")


def read_timed_lines(stream: Any, emit: Callable[[float, str], None]) -> None:
    """Reads an unbuffered pipe to its end, calling `emit(arrival time, line)` for each line as it arrives."""
    buffer = b""
    while True:
        chunk = stream.read(4096)  # unbuffered: returns what has arrived, no waiting for a full block
        if not chunk:
            break
        now = time.time()
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            emit(now, line.rstrip(b"\r").decode(errors="replace"))


def process_timed_lines(
    args: list[str], timeout: float, **popen: Any
) -> tuple[int, list[tuple[float, str]], str]:
    """Runs a command and timestamps each stdout line as it arrives (a reader thread, so the main thread can time out);
    returns its exit status, the lines, and its stderr."""
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
                            **popen)
    lines: "queue.Queue[tuple[float, str]]" = queue.Queue()
    t = threading.Thread(target=read_timed_lines, args=(proc.stdout, lambda at, line: lines.put((at, line))),
                         daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        proc.kill()
    proc.wait(timeout=5)
    return proc.returncode, list(lines.queue), proc.stderr.read().decode(errors="replace")


def curl_timed_lines(args: list[str], timeout: float = 20.0) -> list[tuple[float, str]]:
    """Runs curl and timestamps each stdout line as it arrives."""
    status, lines, stderr = process_timed_lines(args, timeout)
    assert status == 0, f"curl exited {status}: {stderr}"
    return lines


def assert_streamed_event_by_event(
    events: list[SSEEvent], n_events: int, *, blame: str, print_margin: bool = False
) -> None:
    """Events 0..n_events-1 in order, then `done`, and event 0 received before the backend emitted the last one.

    Receive times and `emitted_at` come from the same machine and clock, so "first received < last emitted" proves
    the stream was not buffered without depending on tight timings. `blame` ends the failure message (what must have
    buffered the stream); print_margin prints by how much event 0 was early."""
    messages = [e for e in events if e.event == "message"]
    assert [e.json["index"] for e in messages] == list(range(n_events)), f"events out of order or missing: {events}"
    assert events[-1].event == "done", f"stream did not end with a done event: {events}"
    received = [e.received_at for e in messages]
    assert received == sorted(received)
    first_received = messages[0].received_at
    last_emitted = messages[-1].json["emitted_at"]
    if print_margin:
        print(f"event 0 received {last_emitted - first_received:.3f} s before event {n_events - 1} was emitted")
    assert first_received < last_emitted, (
        f"event 0 reached the client {first_received - last_emitted:.3f} s after the backend emitted event "
        f"{n_events - 1}: {blame}"
    )


def assert_gateway_error(response: httpx.Response, status: int, *, strict: bool = True) -> dict:
    """A JSON error answered by the gateway itself, with a non-empty string `code`; returns the body.

    strict also requires a non-empty string `error` and a `code` that is a stable lower-case slug (letters, digits,
    underscores)."""
    assert response.status_code == status, f"expected {status}, got {response.status_code}: {response.text!r}"
    assert response.headers.get("content-type", "").startswith("application/json"), response.headers
    body = response.json()
    if strict:
        assert isinstance(body.get("error"), str) and body["error"], body
    assert isinstance(body.get("code"), str) and body["code"], f"no 'code' in the error body: {body}"
    if strict:
        assert body["code"].replace("_", "").isalnum() and body["code"].islower(), f"code is not a stable slug: {body}"
    return body


def wait_for_idle_streams(backend: Backend, timeout: float = 5.0) -> None:
    """Streams left by earlier tests must be over before a test that counts them starts."""
    with backend.client() as direct:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if direct.get("/debug/streams").json()["active"] == 0:
                return
            time.sleep(0.05)
    raise AssertionError("backend still has active streams from an earlier test")
