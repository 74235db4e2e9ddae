"""A stalled reader of the gateway's stderr (journald under pressure, a terminal paused with Ctrl-S) must not stall
the gateway: log lines are written by a thread of their own from a bounded queue (LogWriter), what does not fit is
dropped and counted, and the count is logged once the reader reads again.

The gateway (HTTP mode, in front of the sample backend) writes its stderr into a pipe this test does not read until
the end. A pipe takes 64 KiB and the queue 1 MiB; the requests below make several times that in access lines."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from conftest import Backend, free_port, port_accepts

REQUESTS = 6000
# A long path makes a long access line (about 400 bytes): 6,000 lines are about 2.4 MB, twice what fits.
PATH = "/not-found/" + "p" * 240  # the access log keeps 256 characters of a path
DROPPED = re.compile(r"log lines dropped.*dropped=(\d+)")


def test_a_stalled_stderr_reader_stalls_nothing_and_the_drop_count_is_logged(ils_bin: Path, backend: Backend) -> None:
    port = free_port()
    gateway = subprocess.Popen(
        [str(ils_bin), "serve", "--mode", "http", "--listen", f"127.0.0.1:{port}", "--backend", backend.url,
         "--plain-http", "--log-level", "info"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        while not port_accepts(port):
            assert gateway.poll() is None, "the gateway exited before listening"
            time.sleep(0.05)
        # Nobody reads stderr now. Every request must still be answered (the backend's 404), however many lines
        # that logs; before, the first full pipe stopped the event loop that logged, with its connections.
        def run(share: range) -> list[int]:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=30) as client:
                return [client.get(PATH).status_code for _ in share]

        with ThreadPoolExecutor(4) as pool:
            statuses = [s for part in pool.map(run, [range(i, REQUESTS, 4) for i in range(4)]) for s in part]
        assert statuses == [404] * REQUESTS

        # The reader comes back: read until every request's access line is accounted for, written whole or counted
        # in a "log lines dropped" warning (one, or more if a burst also overran the queue before the pipe filled).
        access: list[str] = []
        counted: list[int] = []
        done = threading.Event()

        def read() -> None:
            assert gateway.stderr is not None
            for raw in gateway.stderr:
                line = raw.decode("utf-8", "replace")
                if (match := DROPPED.search(line)) is not None:
                    counted.append(int(match.group(1)))
                elif " access " in line and "status=404" in line:
                    assert line.endswith("\n") and PATH in line, line
                    access.append(line)
                if len(access) + sum(counted) >= REQUESTS:
                    done.set()
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        # An event, not a time: the hang guard ends a run in which the lines are never all accounted for.
        done.wait()
        assert counted, "nothing was dropped: the pipe and the queue took it all, so nothing was shown"
        # Every request's line was written whole or counted as dropped: none lost without a word.
        assert len(access) + sum(counted) == REQUESTS, (len(access), counted)
    finally:
        gateway.kill()
        gateway.wait()
