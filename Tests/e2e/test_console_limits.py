"""The admin console's connections are bounded in time and in number, through the real binary (`admin console`).

Hummingbird's idle timeout restarts with every byte read, so before these bounds a client trickling a byte every few
seconds held a console connection as long as it liked, and nothing capped how many it held. Now:
- a request head must be complete `--request-head-timeout` after accept (TLS included), however it trickles;
- a body `--request-body-timeout` after its head, also when the console refused the request and only drains it;
- `--max-connections` and `--max-connections-per-source` close a connection beyond a cap at accept, before any byte.

Each refusal is checked for what the client got (nothing but the close) and for what the console still does after
(serves a good request). Deadlines here are 1 s so the tests are quick; each trickle is planned to last far longer
than that, and the test checks ordering only: the console closed the connection while the client was still sending.
"""

from __future__ import annotations

import http.client
import re
import socket
import time
from typing import Iterator

import httpx
import pytest

from conftest import Controller
from console_browser import Console
from hostile import read_until_closed

pytestmark = pytest.mark.e2e

TRICKLE_S = 40.0  # how long each trickle would last if the console let it: far past any deadline here
STEP_S = 0.25


@pytest.fixture(scope="module")
def console(controller: Controller) -> Iterator[Console]:
    c = Console(controller, "--request-head-timeout", "1s", "--request-body-timeout", "1s")
    c.start()
    try:
        yield c
    finally:
        c.stop()


def trickle(port: int, first: bytes, byte: bytes) -> tuple[bool, float]:
    """Sends `first`, then `byte` every STEP_S for up to TRICKLE_S. Returns whether the console closed the connection
    before the trickle ended, and after how long."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(first)
        while time.monotonic() - started < TRICKLE_S:
            # Sleep: the gaps of the trickle are the slow client the deadlines are tested against.
            time.sleep(STEP_S)
            try:
                s.sendall(byte)
            except OSError:  # reset or broken pipe: the console closed it
                return True, time.monotonic() - started
            s.setblocking(False)
            try:
                if s.recv(65536) == b"":
                    return True, time.monotonic() - started
            except BlockingIOError:
                pass
            except OSError:
                return True, time.monotonic() - started
            finally:
                s.setblocking(True)
    return False, time.monotonic() - started


def assert_serves(console: Console) -> None:
    r = httpx.get(console.base + "/identities", follow_redirects=False, trust_env=False, timeout=10)
    # Not signed in: the sign-in page, served at once.
    assert r.status_code in (200, 303), r.text


def test_trickled_head_is_closed(console: Console) -> None:
    closed, after = trickle(console.port, b"GET /identities HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ", b"a")
    assert closed, f"a head trickled for {after:.1f} s was never cut"
    assert_serves(console)


def test_silent_connection_is_closed(console: Console) -> None:
    with socket.create_connection(("127.0.0.1", console.port), timeout=5) as s:
        out = read_until_closed(s, deadline_s=TRICKLE_S)
    assert out.closed and out.data == b"", out.describe()
    # Closed by the 1 s head deadline, not by Hummingbird's 30 s idle timeout.
    assert out.elapsed < 20, out.describe()


def test_trickled_body_of_a_refused_request_is_closed(console: Console) -> None:
    """No session: the console answers 303 before reading the body, then drains it; the drain is bounded too."""
    head = (b"POST /identities HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            b"Content-Length: 100000\r\n\r\nname=")
    closed, after = trickle(console.port, head, b"x")
    assert closed, f"a body trickled for {after:.1f} s was never cut"
    assert_serves(console)


def read_response(s: socket.socket) -> bytes:
    """One response with a Content-Length body, read from a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        assert chunk, f"closed before a whole head: {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(re.search(rb"(?im)^content-length: *(\d+)", head).group(1))
    while len(body) < length:
        chunk = s.recv(65536)
        assert chunk, "closed before a whole body"
        body += chunk
    return head


def test_a_kept_alive_connection_serves_several_requests(console: Console) -> None:
    """The deadlines bound what the client owes: on one connection, pauses longer than the head and body deadlines
    (1 s) but within the idle one (30 s) between requests cut nothing."""
    with socket.create_connection(("127.0.0.1", console.port), timeout=10) as s:
        for _ in range(3):
            s.sendall(b"GET /identities HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            head = read_response(s)
            assert head.startswith((b"HTTP/1.1 200", b"HTTP/1.1 303")), head
            # Sleep: an idle pause longer than the head and body deadlines is what must cut nothing.
            time.sleep(1.5)


def closed_without_a_byte(s: socket.socket, within_s: float) -> bool:
    out = read_until_closed(s, deadline_s=within_s)
    assert out.data == b"", f"a connection beyond a cap got bytes: {out.describe()}"
    return out.closed


def test_connections_beyond_the_caps_are_closed_at_accept(controller: Controller) -> None:
    """Each connection is counted in on its own event loop: of several that arrive together beyond a cap, which one
    is refused is not defined, so the test counts them."""
    # Held connections send nothing: a long head deadline keeps it out of the way.
    capped = Console(controller, "--max-connections", "4", "--max-connections-per-source", "3",
                     "--request-head-timeout", "120s")
    capped.start()
    held: list[socket.socket] = []
    try:
        # Four at once from one address: one is beyond --max-connections-per-source and closed with nothing sent.
        four = [socket.create_connection(("127.0.0.1", capped.port), timeout=5) for _ in range(4)]
        refused = [s for s in four if closed_without_a_byte(s, within_s=3)]
        assert len(refused) == 1, f"{len(refused)} of 4 connections from one address were refused, not 1"
        held = [s for s in four if s not in refused]
        refused[0].close()
        # Another loopback address gets the fourth slot; a fifth address is beyond --max-connections.
        # A request answered on it shows it was counted in before the fifth arrives.
        second = http.client.HTTPConnection("127.0.0.1", capped.port, timeout=10, source_address=("127.0.0.2", 0))
        second.request("GET", "/identities")
        answer = second.getresponse()
        answer.read()
        assert answer.status in (200, 303), answer.status
        with socket.create_connection(("127.0.0.1", capped.port), timeout=5, source_address=("127.0.0.3", 0)) as s:
            assert closed_without_a_byte(s, within_s=10), "a connection beyond --max-connections was not closed"
        # One line per source and cap, written as the connection is closed (the client may see the close first).
        deadline = time.monotonic() + 10
        while not ("cap=per_source" in capped.full_log() and "cap=total" in capped.full_log()):
            assert time.monotonic() < deadline, capped.full_log()
            time.sleep(0.1)
        refusals = [line for line in capped.full_log().splitlines() if "console connection refused" in line]
        assert len(refusals) == 2, refusals
        # The held ones were not disturbed, and once one closes a good client is served again.
        for s in held:
            assert not closed_without_a_byte(s, within_s=0.2), "a held connection was closed by the refusals of others"
        held.pop(0).close()
        deadline = time.monotonic() + 10
        while True:
            try:
                assert_serves(capped)
                break
            except (httpx.HTTPError, AssertionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        second.close()
    finally:
        for s in held:
            s.close()
        capped.stop()
