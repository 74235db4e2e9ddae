"""End-to-end tests of ils-client-example: what the app does (enroll from a token, then stream with URLSession
through ILSClient), against a real controller, a real gateway (`serve --mode ziti`) and the FastAPI sample backend.

Streaming is asserted by ordering, as in test_overlay.py: each line is stamped when it reaches this test, and the
first event must arrive before the backend emitted the last one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import pytest

from conftest import Backend, Controller, ManagedProcess, STARTUP_TIMEOUT_S, cli_env
from sse_helpers import process_timed_lines

pytestmark = pytest.mark.e2e

SERVICE = "claude-api"
STREAM_TIMEOUT_S = 30.0
LINE = re.compile(r"^(\d\d):(\d\d):(\d\d)\.(\d{3}) (.+)$")


@dataclass
class Setup:
    controller: Controller
    example: Path
    backend: Backend


@pytest.fixture(scope="module")
def setup(controller: Controller, client_example_bin: Path) -> Iterator[Setup]:
    example = controller.log_dir / "ils-client-example"  # a copy, like the controller's binary
    shutil.copy2(client_example_bin, example)
    backend = Backend(controller.log_dir)
    backend.start()
    gateway: Optional[ManagedProcess] = None
    try:
        r = controller.cli("admin", "identity", "create", "gw1", "--role", "gateway", "-o", "gw1.jwt")
        assert r.returncode == 0, r.describe()
        r = controller.cli("enroll", "gw1.jwt")
        assert r.returncode == 0, r.describe()
        gateway = ManagedProcess(
            "gateway-client-example",
            [str(controller.binary), "serve", "--mode", "ziti", "--identity", "identities/gw1.json",
             "--service", SERVICE, "--backend", backend.url, "--log-level", "info"],
            controller.log_dir,
            cwd=controller.root,
            env=cli_env(),
        )
        gateway.start()
        gateway.wait_for_log("hosting service", timeout=STARTUP_TIMEOUT_S)
        yield Setup(controller, example, backend)
    finally:
        for p in (gateway, backend):
            if p is not None:
                p.stop()


def example(s: Setup, *args: str, timeout: float = STREAM_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([str(s.example), *args], cwd=s.controller.root, env=cli_env(), capture_output=True,
                          text=True, timeout=timeout)


def enroll_device(s: Setup, name: str) -> Path:
    """A device identity made by ils-client-example enroll from a token given as text, with a paste's whitespace."""
    r = s.controller.cli("admin", "identity", "create", name, "--role", "device", "-o", f"{name}.jwt")
    assert r.returncode == 0, r.describe()
    token = (s.controller.root / f"{name}.jwt").read_text().strip()
    out = s.controller.root / f"{name}-device.json"
    r = example(s, "enroll", f"  {token}\n", "--out", str(out))
    assert r.returncode == 0, f"enroll failed ({r.returncode}): {r.stderr}"
    assert f"enrolled {name} (device)" in r.stdout, r.stdout
    assert stat.S_IMODE(out.stat().st_mode) == 0o600, oct(out.stat().st_mode)
    return out


def stream_lines(s: Setup, *args: str) -> tuple[int, list[tuple[float, str]], str]:
    """Runs `stream`, stamping each stdout line with its arrival time here."""
    return process_timed_lines(
        [str(s.example), "stream", *args], STREAM_TIMEOUT_S, cwd=s.controller.root, env=cli_env()
    )


def events(lines: list[tuple[float, str]]) -> list[tuple[float, dict]]:
    """The `data:` payloads of message events, each with the time its line arrived; every line is timestamped."""
    out = []
    for received, line in lines:
        m = LINE.match(line)
        assert m, f"line without an HH:MM:SS.mmm arrival time: {line!r}"
        text = m.group(5)
        if text.startswith("data: "):
            payload = json.loads(text[len("data: "):])
            if "index" in payload:
                out.append((received, payload))
    return out


def test_enrolls_and_streams_line_by_line(setup: Setup) -> None:
    identity = enroll_device(setup, "tablet")
    code, lines, stderr = stream_lines(setup, "--identity", str(identity),
                                       "/claude/stream?prompt=hello&n=5&interval_ms=400")
    assert code == 0, f"stream exited {code}: {stderr}"
    got = events(lines)
    assert [p["index"] for _, p in got] == list(range(5)), lines
    first_received, last_emitted = got[0][0], got[-1][1]["emitted_at"]
    print(f"event 0 printed {last_emitted - first_received:.3f} s before event 4 was emitted")
    assert first_received < last_emitted, "the example buffered the stream instead of printing each line as it came"
    # The printed time is the local arrival time, within a second of when this test read the line.
    stamp = LINE.match(lines[0][1])
    printed = int(stamp.group(1)) * 3600 + int(stamp.group(2)) * 60 + int(stamp.group(3))
    local = time.localtime(lines[0][0])
    assert abs(printed - (local.tm_hour * 3600 + local.tm_min * 60 + local.tm_sec)) <= 1 or printed == 0


def test_posts_json_and_streams(setup: Setup) -> None:
    identity = enroll_device(setup, "laptop")
    body = json.dumps({"prompt": "post me", "n": 3, "interval_ms": 100})
    code, lines, stderr = stream_lines(setup, "--identity", str(identity), "/claude/stream", "--data", body)
    assert code == 0, f"stream exited {code}: {stderr}"
    assert [p["index"] for _, p in events(lines)] == [0, 1, 2], lines
    assert any('"count": 3' in line for _, line in lines), lines


def test_refusals_print_the_reason_and_exit_non_zero(setup: Setup) -> None:
    identity = enroll_device(setup, "phone")
    code, lines, stderr = stream_lines(setup, "--identity", str(identity), "/health", "--service", "no-such-service")
    assert code == 67, f"unknown service: exit {code}, stderr {stderr!r}"
    # One line for the refusal; the link state's own lines (`link: STATE`, issue 39) come before it.
    reasons = [line for line in stderr.splitlines() if not line.startswith("link: ")]
    assert len(reasons) == 1 and "unknown_service" in reasons[0], stderr
    assert "link: ready" in stderr, stderr
    assert not lines

    r = setup.controller.cli("admin", "identity", "revoke", "phone")
    assert r.returncode == 0, r.describe()
    code, lines, stderr = stream_lines(setup, "--identity", str(identity), "/health")
    assert code == 77, f"revoked: exit {code}, stderr {stderr!r}"
    assert "identity_blocked" in stderr and "revoked" in stderr, stderr


def test_help_explains_each_command(setup: Setup) -> None:
    for args, expected in ((["--help"], "enroll"), (["enroll", "--help"], "--out"),
                           (["stream", "--help"], "HH:MM:SS.mmm")):
        r = example(setup, *args)
        assert r.returncode == 0 and expected in r.stdout, (args, r.stdout, r.stderr)
