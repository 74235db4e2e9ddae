"""Hostile input to HTTP mode (`serve --mode http`) of the real binary, sent as exact bytes on a raw socket.

Every refusal is checked four ways: the gateway's answer (a 4xx JSON error, or a close without a response when
there is no request to answer), the connection is closed, the backend never saw the request (each request carries
a unique probe in its target, looked for in the backend's access log), and the gateway still serves a good request
afterwards. Memory and descriptors are checked over a few hundred hostile connections at the end.

The gateways here have a short `--idle-timeout` so that slow-header and slow-body connections are cut within
seconds.
"""

from __future__ import annotations

import os
import socket
import ssl
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from conftest import Backend, Certs, Gateway, free_port
from hostile import RawOutcome, assert_no_growth, backend_saw, fd_count, read_until_closed, rss_bytes, send_raw

pytestmark = pytest.mark.e2e

IDLE_TIMEOUT_S = 2
CLOSE_BOUND_S = 10.0  # a refused or stalled connection must be closed well within this


@pytest.fixture(scope="module")
def hostile_backend(work_dir: Path) -> Iterator[Backend]:
    b = Backend(work_dir)
    b.start()
    yield b
    b.stop()


def _gateway(ils_bin: Path, mode: str, backend: Backend, certs: Certs, work_dir: Path) -> Gateway:
    return Gateway(ils_bin, mode, backend, certs, work_dir, ["--idle-timeout", f"{IDLE_TIMEOUT_S}s"])


@pytest.fixture(scope="module")
def plain_gw(ils_bin: Path, hostile_backend: Backend, certs: Certs, work_dir: Path) -> Iterator[Gateway]:
    g = _gateway(ils_bin, "plain", hostile_backend, certs, work_dir)
    g.start()
    yield g
    g.stop()


@pytest.fixture(scope="module")
def tls_gw(ils_bin: Path, hostile_backend: Backend, certs: Certs, work_dir: Path) -> Iterator[Gateway]:
    g = _gateway(ils_bin, "tls", hostile_backend, certs, work_dir)
    g.start()
    yield g
    g.stop()


def probe() -> str:
    return f"p{uuid.uuid4().hex}"


def assert_still_serves(g: Gateway) -> None:
    assert g.alive(), f"the gateway exited:\n{g.logs()}"
    marker = probe()
    with g.client(timeout=10) as c:
        r = c.get("/debug/headers", params={"probe": marker})
    assert r.status_code == 200, r.text
    assert backend_saw(g.backend, marker, wait_s=5), "the positive control did not show up in the backend log"


def assert_never_reached(g: Gateway, marker: str, what: str = "the request reached the backend") -> None:
    """The gateway still serves, and `marker` is not in the backend's access log once that later request is: it, not
    a clock, bounds the wait for a late line."""
    assert_still_serves(g)
    assert marker not in g.backend.full_log(), what


def assert_json_refusal(out: RawOutcome, statuses: tuple[int, ...], what: str) -> None:
    assert out.status in statuses, f"{what}: expected one of {statuses}, got {out.describe()}"
    head = out.data.split(b"\r\n\r\n", 1)[0].lower()
    assert b"content-type: application/json" in head, f"{what}: not a JSON error: {out.describe()}"
    assert out.body.startswith(b'{"error":"'), f"{what}: {out.describe()}"
    assert out.closed, f"{what}: the connection stayed open after the refusal: {out.describe()}"


# ------------------------------------------------------------------------------------------------------------------
# Malformed and smuggled requests
# ------------------------------------------------------------------------------------------------------------------

# (name, request bytes with {P} for the probe). Every one must be refused with 400 and never reach the backend:
# each is a framing that two HTTP implementations can read differently (RFC 9112 §2.2, §5.1, §5.2, §6.1, §6.3,
# §7.1) or is not HTTP at all.
SMUGGLED: list[tuple[str, bytes]] = [
    ("CL+TE, TE first",
     b"POST /debug/headers?{P} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n"
     b"0\r\n\r\nGET /debug/headers?{P}-inner HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("CL+TE, CL first",
     b"POST /debug/headers?{P} HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"0\r\n\r\nX"),
    ("conflicting duplicate Content-Length",
     b"POST /debug/headers?{P} HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 40\r\n\r\nabc"),
    ("Content-Length list with different values",
     b"POST /debug/headers?{P} HTTP/1.1\r\nHost: x\r\nContent-Length: 3, 40\r\n\r\nabc"),
    ("signed Content-Length", b"POST /debug/headers?{P} HTTP/1.1\r\nHost: x\r\nContent-Length: +3\r\n\r\nabc"),
    ("negative Content-Length", b"POST /debug/headers?{P} HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n"),
    ("hex Content-Length", b"POST /debug/headers?{P} HTTP/1.1\r\nHost: x\r\nContent-Length: 0x3\r\n\r\nabc"),
    ("Content-Length beyond 64 bits",
     b"POST /debug/headers?{P} HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n"),
    ("obs-fold continuing Transfer-Encoding",
     b"POST /debug/headers?{P} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\n chunked\r\n\r\n0\r\n\r\n"),
    ("obs-fold in an ordinary header",
     b"GET /debug/headers?{P} HTTP/1.1\r\nHost: x\r\nX-Folded: a\r\n b\r\n\r\n"),
    ("space before the colon", b"POST /debug/headers?{P} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\n\r\n"
     b"0\r\n\r\n"),
    ("Transfer-Encoding that is not chunked",
     b"POST /debug/headers?{P} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n"),
    ("two Transfer-Encoding headers, chunked not last",
     b"POST /debug/headers?{P} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity"
     b"\r\n\r\n0\r\n\r\n"),
    ("Transfer-Encoding on HTTP/1.0",
     b"POST /debug/headers?{P} HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
    ("bare CR inside a header value",
     b"GET /debug/headers?{P} HTTP/1.1\r\nHost: x\r\nX-A: a\rTransfer-Encoding: chunked\r\n\r\n"),
    ("NUL inside a header value", b"GET /debug/headers?{P} HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n"),
    ("a header name with a space", b"GET /debug/headers?{P} HTTP/1.1\r\nHost: x\r\nX A: b\r\n\r\n"),
    ("two Host headers", b"GET /debug/headers?{P} HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n"),
    ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n{P}"),
    ("a version that does not exist", b"GET /debug/headers?{P} HTTP/7.3\r\nHost: x\r\n\r\n"),
    ("binary garbage", b"\x16\x03\x01\x00\xff{P}" + bytes(range(256)) + b"\r\n\r\n"),
]


@pytest.mark.parametrize("name,template", SMUGGLED, ids=[c[0] for c in SMUGGLED])
def test_smuggled_and_malformed_requests_are_refused(plain_gw: Gateway, name: str, template: bytes) -> None:
    marker = probe()
    payload = template.replace(b"{P}", marker.encode())
    out = send_raw(plain_gw.port, payload, deadline_s=CLOSE_BOUND_S)
    print(f"{name}: {out.describe()}")
    assert out.closed, f"{name}: the connection stayed open: {out.describe()}"
    if out.data:  # a close without any response is an acceptable answer to bytes that are not a request
        assert_json_refusal(out, (400,), name)
        assert out.responses == 1, f"{name}: more than one response, a request was smuggled through"
    assert_never_reached(plain_gw, marker, f"{name}: the request reached the backend")
    assert marker not in plain_gw.full_log(), f"{name}: the gateway logged the request's query"


# Broken chunked bodies: the head is valid, so a streaming proxy may already have passed it on when the body breaks.
# What must hold: the client gets one 400 and a close, and the backend never receives a complete request (its
# access log never shows the upload answered), nor anything smuggled after it.
BROKEN_BODIES: list[tuple[str, bytes]] = [
    ("chunk size beyond 64 bits", b"fffffffffffffffffffff\r\nabc\r\n0\r\n\r\n"),
    ("chunk size that is not hex", b"zz\r\nabc\r\n0\r\n\r\n"),
    ("chunk data longer than its size", b"3\r\nabcdef\r\n0\r\n\r\n"),
    ("bare LF after the chunk size", b"3\nabc\r\n0\r\n\r\n"),
]


@pytest.mark.parametrize("name,body", BROKEN_BODIES, ids=[c[0] for c in BROKEN_BODIES])
def test_broken_chunked_bodies_never_complete(plain_gw: Gateway, name: str, body: bytes) -> None:
    marker = probe()
    inner = f"GET /debug/headers?{marker}-inner HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    payload = (f"POST /upload?{marker} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
               + body + inner)
    out = send_raw(plain_gw.port, payload, deadline_s=CLOSE_BOUND_S)
    print(f"{name}: {out.describe()}")
    assert out.closed, out.describe()
    assert out.responses <= 1, f"{name}: more than one response: {out.describe()}"
    if out.data:
        assert_json_refusal(out, (400,), name)
    assert_never_reached(plain_gw, f"{marker}-inner", f"{name}: a request was smuggled in the body")
    log = plain_gw.backend.full_log()
    assert not any(marker in line and " 200" in line for line in log.splitlines()), (
        f"{name}: the backend answered the broken upload as if it were complete"
    )


def test_bare_lf_line_endings_do_not_smuggle(plain_gw: Gateway) -> None:
    """RFC 9112 §2.2 lets a recipient accept a bare LF as a line end. Whether the gateway does or not, a request
    framed with bare LFs is either refused or forwarded as exactly one request, with its header values intact:
    a bare LF must never split a header value into a second header on the way to the backend."""
    marker = probe()
    payload = (f"GET /debug/headers?{marker} HTTP/1.1\nHost: x\nX-A: one\nConnection: close\n\n").encode()
    out = send_raw(plain_gw.port, payload, deadline_s=CLOSE_BOUND_S)
    print(f"bare LF: {out.describe()}")
    assert out.closed
    if out.status == 200:
        assert out.responses == 1
        assert b'"x-a":["one"]' in out.body, out.describe()
        assert backend_saw(plain_gw.backend, marker)
    else:
        assert_json_refusal(out, (400,), "bare LF")
        assert_never_reached(plain_gw, marker)
    assert_still_serves(plain_gw)


def test_identical_duplicate_content_length_is_one_length(plain_gw: Gateway) -> None:
    """`Content-Length: 3` twice is either refused, or one length (RFC 9112 §6.3 ¶5): then the body is exactly
    those 3 bytes, and what follows on the connection is a second request, answered second, not part of the body."""
    marker = probe()
    payload = (
        f"POST /debug/headers?{marker} HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc"
        f"GET /debug/headers?{marker}-second HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    ).encode()
    out = send_raw(plain_gw.port, payload, deadline_s=CLOSE_BOUND_S)
    print(f"identical duplicate Content-Length: {out.describe()}")
    assert out.closed, out.describe()
    if out.status == 400:  # refusing is allowed too (RFC 9112 §6.3 ¶5: "MAY"); then nothing goes through
        assert_json_refusal(out, (400,), "identical duplicate Content-Length")
        assert out.responses == 1
        assert_never_reached(plain_gw, marker)
    else:
        assert out.responses == 2 and out.data.count(b"HTTP/1.1 200") == 2, out.describe()
        assert out.data.count(b'"content-length":["3"]') == 1, out.describe()
        assert backend_saw(plain_gw.backend, f"{marker}-second")
    assert_still_serves(plain_gw)


# ------------------------------------------------------------------------------------------------------------------
# Oversized
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["huge target", "huge header value", "10000 header fields"])
def test_oversized_requests_are_refused(plain_gw: Gateway, kind: str) -> None:
    marker = probe()
    if kind == "huge target":
        payload = f"GET /debug/headers?{marker}&{'a' * 200_000} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    elif kind == "huge header value":
        payload = f"GET /debug/headers?{marker} HTTP/1.1\r\nHost: x\r\nX-Big: {'b' * 200_000}\r\n\r\n".encode()
    else:
        fields = "".join(f"X-F{i}: v\r\n" for i in range(10_000))
        payload = f"GET /debug/headers?{marker} HTTP/1.1\r\nHost: x\r\n{fields}\r\n".encode()
    out = send_raw(plain_gw.port, payload, deadline_s=CLOSE_BOUND_S)
    print(f"{kind}: {out.describe()}")
    assert out.closed, out.describe()
    if out.data:
        assert_json_refusal(out, (400, 414, 431), kind)
    assert_never_reached(plain_gw, marker)


# ------------------------------------------------------------------------------------------------------------------
# Slowloris
# ------------------------------------------------------------------------------------------------------------------


def test_slow_header_connections_are_cut_and_others_are_served(plain_gw: Gateway) -> None:
    """Thirty connections trickle a request head one byte every 300 ms; each is closed after the idle timeout
    while a good client is served meanwhile, and none of the trickled requests reaches the backend."""
    marker = probe()
    head = f"GET /debug/headers?{marker} HTTP/1.1\r\nHost: x\r\nX-Slow: {'s' * 200}\r\n\r\n".encode()
    socks = [socket.create_connection(("127.0.0.1", plain_gw.port), timeout=5) for _ in range(30)]
    try:
        started = time.monotonic()
        open_socks = set(range(len(socks)))
        sent = 0
        while open_socks and time.monotonic() - started < CLOSE_BOUND_S + IDLE_TIMEOUT_S:
            for i in list(open_socks):
                try:
                    socks[i].send(head[sent:sent + 1])
                except OSError:
                    open_socks.discard(i)
            sent = min(sent + 1, len(head) - 3)  # never complete the head
            if sent == 5:
                assert_still_serves(plain_gw)  # the slow clients do not starve a good one
            # Sleep: one byte every 300 ms is the slow-header client the idle timeout is tested against.
            time.sleep(0.3)
        elapsed = time.monotonic() - started
        print(f"{len(socks) - len(open_socks)} of {len(socks)} slow-header connections cut after {elapsed:.1f} s")
        assert not open_socks, f"{len(open_socks)} slow-header connections still open after {elapsed:.1f} s"
        assert elapsed >= IDLE_TIMEOUT_S * 0.5, "cut before the idle timeout: the trickle itself was refused?"
    finally:
        for s in socks:
            s.close()
    assert_never_reached(plain_gw, marker)


def test_slow_body_connection_is_cut(plain_gw: Gateway) -> None:
    """A request whose body stalls after its head (Content-Length 1000, 10 bytes sent, then nothing) must not hold
    its client and backend connections for ever: 408 request_timeout after the idle timeout, then a close."""
    marker = probe()
    with socket.create_connection(("127.0.0.1", plain_gw.port), timeout=5) as s:
        s.sendall(f"POST /upload?{marker} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789".encode())
        out = read_until_closed(s, deadline_s=CLOSE_BOUND_S + IDLE_TIMEOUT_S)
    print(f"stalled body: {out.describe()}")
    assert out.closed, f"a stalled request body held the connection open: {out.describe()}"
    assert_json_refusal(out, (408,), "stalled body")
    assert b'"code":"request_timeout"' in out.body
    assert_still_serves(plain_gw)


def test_a_client_that_takes_nothing_is_cut_counted_and_logged(ils_bin: Path, hostile_backend: Backend, certs: Certs,
                                                               tmp_path: Path) -> None:
    """A client that reads nothing of a response far larger than the socket buffers is cut after
    `--client-stall-timeout` (1 s here), with its backend request; the gateway counts it
    (`ils_connections_stalled_total{listener="http"}`) and its access line says `outcome=client_stalled`."""
    from test_connection_caps import metric

    metrics_port = free_port()
    g = Gateway(ils_bin, "plain", hostile_backend, certs, tmp_path,
                ["--client-stall-timeout", "1s", "--metrics", f"127.0.0.1:{metrics_port}"])
    g.start()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            s.connect(("127.0.0.1", g.port))
            s.sendall(f"GET /bytes?size={256 * 1024 * 1024} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            # The event: the gateway's own count of the cut (its clock, not this test's, decides when).
            deadline = time.monotonic() + CLOSE_BOUND_S * 3
            while metric(metrics_port, "ils_connections_stalled_total", listener="http") != 1:
                assert time.monotonic() < deadline, "the stalled client was never cut"
                time.sleep(0.05)
            g.wait_for_log("outcome=client_stalled")
            # What was in flight drains, then the connection ends, far short of the body.
            out = read_until_closed(s, deadline_s=CLOSE_BOUND_S * 3)
        assert out.closed, f"the stalled client's connection stayed open: {out.describe()}"
        assert out.status == 200 and len(out.data) < 256 * 1024 * 1024, out.describe()
        assert g.full_log().count("outcome=client_stalled") == 1
        assert_still_serves(g)
    finally:
        g.stop()


# ------------------------------------------------------------------------------------------------------------------
# TLS port
# ------------------------------------------------------------------------------------------------------------------

CLIENT_HELLO_PREFIX = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 32


TLS_GARBAGE: list[tuple[str, bytes]] = [
    ("random bytes", os.urandom(4096)),
    ("plaintext HTTP on the TLS port", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("a truncated ClientHello", CLIENT_HELLO_PREFIX),
    ("a TLS record header announcing 16 MiB", b"\x16\x03\x03\xff\xff" + b"\x00" * 100),
    ("an alert before any handshake", b"\x15\x03\x03\x00\x02\x02\x28"),
]


@pytest.mark.parametrize("name,payload", TLS_GARBAGE, ids=[c[0] for c in TLS_GARBAGE])
@pytest.mark.parametrize("half_close", [False, True], ids=["open", "half-closed"])
def test_garbage_at_the_tls_port_is_dropped(tls_gw: Gateway, name: str, payload: bytes, half_close: bool) -> None:
    out = send_raw(tls_gw.port, payload, deadline_s=CLOSE_BOUND_S + IDLE_TIMEOUT_S, shut_write=half_close)
    print(f"{name}: {out.describe()}")
    assert out.closed, f"{name}: the TLS port kept the connection open: {out.describe()}"
    assert out.responses == 0
    assert_still_serves(tls_gw)


def test_tls_handshake_abandoned_midway_is_cut(tls_gw: Gateway) -> None:
    """A client that starts a real handshake and then goes silent is closed after the idle timeout."""
    raw = socket.create_connection(("127.0.0.1", tls_gw.port), timeout=5)
    context = ssl.create_default_context(cafile=str(tls_gw.certs.ca_cert))
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    try:
        raw.sendall(outgoing.read())  # the ClientHello, and then nothing more
        out = read_until_closed(raw, deadline_s=CLOSE_BOUND_S + IDLE_TIMEOUT_S)
    finally:
        raw.close()
    print(f"abandoned handshake: {out.describe()}")
    assert out.closed, out.describe()
    assert_still_serves(tls_gw)


# ------------------------------------------------------------------------------------------------------------------
# Resources over many hostile connections
# ------------------------------------------------------------------------------------------------------------------


def test_hostile_connections_leave_no_memory_or_descriptors_behind(plain_gw: Gateway, tls_gw: Gateway) -> None:
    """Hundreds of refused connections, plain and TLS: resident memory grows by less than 8 MiB after a warm-up
    round, and the descriptor count comes back to where it was."""
    plain_payloads = [t.replace(b"{P}", b"mem") for _, t in SMUGGLED]
    tls_payloads = [p for _, p in TLS_GARBAGE]

    def round_of_abuse() -> None:
        for p in plain_payloads:
            send_raw(plain_gw.port, p, deadline_s=CLOSE_BOUND_S)
        for p in tls_payloads:
            send_raw(tls_gw.port, p, deadline_s=CLOSE_BOUND_S, shut_write=True)

    round_of_abuse()  # warm-up: allocator arenas, caches
    assert_still_serves(plain_gw)
    assert_still_serves(tls_gw)
    before = {g.name: (rss_bytes(g.pid), fd_count(g.pid)) for g in (plain_gw, tls_gw)}
    rounds = 10
    for _ in range(rounds):
        round_of_abuse()
    assert_still_serves(plain_gw)
    assert_still_serves(tls_gw)
    for g in (plain_gw, tls_gw):
        n = rounds * (len(plain_payloads) if g is plain_gw else len(tls_payloads))
        assert_no_growth(g.name, g.pid, before[g.name], f"{n} hostile connections")
