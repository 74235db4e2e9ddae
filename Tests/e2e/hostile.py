"""Raw-socket helpers for the hostile-input tests: send exact bytes, read whatever comes back until the peer closes
or a deadline passes, and read a process's resident memory. Imported as a top-level module, like sse_helpers.
"""

from __future__ import annotations

import os
import re
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Optional


@dataclass
class RawOutcome:
    data: bytes
    closed: bool  # the peer closed (FIN or reset) before the deadline
    reset: bool
    elapsed: float

    @property
    def status(self) -> Optional[int]:
        if not self.data.startswith(b"HTTP/1."):
            return None
        try:
            return int(self.data.split(b" ", 2)[1])
        except (IndexError, ValueError):
            return None

    @property
    def responses(self) -> int:
        """How many responses came back (status lines at the start or after a previous message's head)."""
        return len(re.findall(rb"(?:^|\r\n)HTTP/1\.[01] \d{3} ", self.data))

    @property
    def body(self) -> bytes:
        return self.data.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in self.data else b""

    def describe(self) -> str:
        return f"{len(self.data)} bytes {self.data[:300]!r}, closed={self.closed}, reset={self.reset}, " \
               f"after {self.elapsed:.2f} s"


def read_until_closed(sock: socket.socket, deadline_s: float) -> RawOutcome:
    started = time.monotonic()
    data = b""
    closed = reset = False
    while True:
        left = deadline_s - (time.monotonic() - started)
        if left <= 0:
            break
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            break
        except (ConnectionResetError, ssl.SSLError, ssl.SSLEOFError, BrokenPipeError, OSError):
            closed = reset = True
            break
        if not chunk:
            closed = True
            break
        data += chunk
    return RawOutcome(data, closed, reset, time.monotonic() - started)


def send_raw(port: int, payload: bytes, deadline_s: float = 10.0, shut_write: bool = False) -> RawOutcome:
    """Connects to 127.0.0.1:port, sends payload, and reads until the server closes or deadline_s passes."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        try:
            sock.sendall(payload)
            if shut_write:
                sock.shutdown(socket.SHUT_WR)
        except OSError:  # the server closed first (broken pipe, reset, not connected): that is a close too
            return RawOutcome(b"", True, True, 0.0)
        return read_until_closed(sock, deadline_s)


def rss_bytes(pid: int) -> int:
    """Resident set size of a process, from /proc (Linux)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def backend_saw(backend, marker: str, wait_s: float = 0.5) -> bool:
    """Whether the marker shows up in the backend's access log (after a short wait for a late line)."""
    deadline = time.monotonic() + wait_s
    while True:
        if marker in backend.full_log():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def assert_no_growth(name: str, pid: int, before: tuple[int, int], what: str) -> None:
    """After abuse: descriptors back to `before` (waiting up to 10 s for closes to land) and resident memory grown by
    less than 8 MiB."""
    rss0, fds0 = before
    deadline = time.monotonic() + 10
    while fd_count(pid) > fds0 and time.monotonic() < deadline:
        time.sleep(0.1)
    rss1, fds1 = rss_bytes(pid), fd_count(pid)
    print(f"{name}: {what}, RSS {rss0 / 1048576:.1f} -> {rss1 / 1048576:.1f} MiB, descriptors {fds0} -> {fds1}")
    assert rss1 - rss0 < 8 * 1024 * 1024, f"{name}: RSS grew by {(rss1 - rss0) / 1048576:.1f} MiB"
    assert fds1 <= fds0, f"{name}: descriptors leaked ({fds0} -> {fds1})"
