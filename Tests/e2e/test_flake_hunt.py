"""deploy/flake-hunt.sh's report (its --parse mode), on fabricated logs: failures are grouped by test across runs
(Swift Testing, XCTest and pytest's summary lines) with each run's message, a run that failed with no failing test
(a hang, a sanitizer report) is listed with its reason and the end of its log, and the exit status and the last
line count the failed runs.

No test suites run: a few seconds."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import REPO_ROOT

FLAKE_HUNT = REPO_ROOT / "deploy" / "flake-hunt.sh"

SWIFT_RUN_1 = """\
== flake-hunt run 1/4: swift test --skip-build --skip ILSStoreTests
◇ Test run started.
◇ Suite PostgresStoreTests started.
◇ Test "reconnects after a restart" started.
◇ Test quick() started.
✘ Test "reconnects after a restart" recorded an issue at PostgresStoreTests.swift:88:9: Expectation failed: (listening → false) == true
↳ the change feed listens again
± some difference
✔ Test quick() passed after 0.010 seconds.
✘ Test "reconnects after a restart" failed after 31.500 seconds with 1 issue.
✘ Suite PostgresStoreTests failed after 31.600 seconds with 1 issue.
✘ Test run with 2 tests in 1 suite failed after 31.700 seconds with 1 issue.
"""

SWIFT_RUN_2 = """\
◇ Test run started.
✘ Test "reconnects after a restart" recorded an issue at PostgresStoreTests.swift:90:13: Caught error: timedOut
✘ Test "reconnects after a restart" failed after 180.000 seconds with 1 issue.
✘ Test roundTrip(size:) recorded an issue with 1 argument size → 4096 at ProxyTests.swift:40:9: Expectation failed: (n → 4095) == 4096
✘ Test roundTrip(size:) with 3 test cases failed after 0.500 seconds with 1 issue.
/work/Tests/ILSCoreTests/FrameTests.swift:12: error: FrameTests.testDecode : XCTAssertEqual failed: ("1") is not equal to ("2")
Test Case 'FrameTests.testDecode' failed (0.002 seconds)
✘ Test run with 40 tests in 9 suites failed after 190.000 seconds with 2 issues.
"""

CLEAN_RUN = """\
◇ Test run started.
✔ Test run with 40 tests in 9 suites passed after 60.000 seconds.
"""

HANG_RUN = """\
◇ Test run started.
◇ Test "drains every circuit" started.
◇ Test quick() started.
✔ Test quick() passed after 0.010 seconds.
last words before the hang
== flake-hunt swift run 4: still running after 900s; thread backtraces of the test processes, then stopping it
== backtraces of 4242
Thread 1 (LWP 4242):
#0  0x00007f in futex_wait ()
== flake-hunt swift run 4: stopped (status 143)
"""

PYTEST_RUN = """\
Tests/e2e/test_faults.py::test_silent_drop[tls] FAILED                [ 50%]
Tests/e2e/test_faults.py::test_other PASSED                            [100%]
=================================== FAILURES ===================================
___________________________ test_silent_drop[tls] ____________________________
E   AssertionError: the tunnel reconnects within 30 s
=========================== short test summary info ============================
FAILED Tests/e2e/test_faults.py::test_silent_drop[tls] - AssertionError: the tunnel reconnects within 30 s
  assert False
ERROR Tests/e2e/test_overlay.py::test_link - RuntimeError: gateway did not start
==================== 1 failed, 1 passed, 1 error in 42.00s =====================
"""


def write_run(directory: Path, k: int, log: str, exit_status: int, reports: dict[str, str] | None = None) -> Path:
    path = directory / f"run-{k}.log"
    path.write_text(log)
    (directory / f"run-{k}.status").write_text(
        f"exit={exit_status}\nseconds=1\nreports={len(reports or {})}\nbusy=1\n")
    if reports:
        (directory / f"run-{k}-reports").mkdir()
        for name, text in reports.items():
            (directory / f"run-{k}-reports" / name).write_text(text)
    return path


def parse(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(FLAKE_HUNT), "--parse", *map(str, args)], capture_output=True, text=True, timeout=60)


def block(output: str, header: str) -> str:
    """The lines of one test's (or run's) entry: its header line and the indented lines under it."""
    lines = output.splitlines()
    start = lines.index(header)
    end = start + 1
    while end < len(lines) and lines[end].startswith(" "):
        end += 1
    return "\n".join(lines[start:end])


def test_swift_failures_are_grouped_by_test_with_each_runs_message(tmp_path: Path) -> None:
    hunt = tmp_path / "swift-20260101-120000"
    hunt.mkdir()
    logs = [write_run(hunt, 1, SWIFT_RUN_1, 1), write_run(hunt, 2, SWIFT_RUN_2, 1), write_run(hunt, 3, CLEAN_RUN, 0)]
    result = parse(*logs)
    assert result.returncode == 1, result
    out = result.stdout

    restart = block(out, '"reconnects after a restart" (PostgresStoreTests.swift): failed in 2 of 3 runs')
    assert "run 1: PostgresStoreTests.swift:88:9: Expectation failed: (listening → false) == true" in restart
    assert "↳ the change feed listens again" in restart
    assert "run 2: PostgresStoreTests.swift:90:13: Caught error: timedOut" in restart
    assert "run 3" not in restart

    parameterized = block(out, "roundTrip(size:) (ProxyTests.swift): failed in 1 of 3 runs")
    assert "run 2: ProxyTests.swift:40:9 (size → 4096): Expectation failed" in parameterized
    xctest = block(out, "FrameTests.testDecode: failed in 1 of 3 runs")
    assert 'run 2: FrameTests.swift:12: XCTAssertEqual failed: ("1") is not equal to ("2")' in xctest

    # The test that failed most comes first; suites and the run's own summary line are no tests.
    entries = [line for line in out.splitlines() if ": failed in " in line]
    assert entries[0].startswith('"reconnects after a restart"') and len(entries) == 3, out
    assert "Suite PostgresStoreTests" not in out and "run with" not in out
    assert "no failing test parsed" not in out, "every failed run had its failing tests"
    # The suite comes from the directory's name, busy from the runs' status files.
    assert out.splitlines()[-1] == "flake-hunt: swift: 3 runs, 2 failed (busy)"


def test_pytest_failures_are_grouped_by_test_with_their_messages(tmp_path: Path) -> None:
    logs = [write_run(tmp_path, 1, PYTEST_RUN, 1), write_run(tmp_path, 2, PYTEST_RUN, 1)]
    result = parse(*logs)
    assert result.returncode == 1, result
    out = result.stdout
    drop = block(out, "Tests/e2e/test_faults.py::test_silent_drop[tls]: failed in 2 of 2 runs")
    assert "run 1: AssertionError: the tunnel reconnects within 30 s" in drop
    assert "  assert False" in drop and "run 2: AssertionError" in drop
    link = block(out, "Tests/e2e/test_overlay.py::test_link: failed in 2 of 2 runs")
    assert "run 1: ERROR: RuntimeError: gateway did not start" in link
    assert "test_other" not in out
    assert out.splitlines()[-1] == "flake-hunt: logs: 2 runs, 2 failed (busy)"


def test_a_hang_and_a_sanitizer_report_are_failed_runs_listed_with_their_reasons(tmp_path: Path) -> None:
    report = ("==4243==ERROR: AddressSanitizer: heap-use-after-free on address 0x6020\n"
              "SUMMARY: AddressSanitizer: heap-use-after-free Frame.swift:10 in decode\n")
    logs = [write_run(tmp_path, 1, CLEAN_RUN, 0), write_run(tmp_path, 2, HANG_RUN, 143),
            write_run(tmp_path, 3, CLEAN_RUN, 0, reports={"asan.4243": report})]
    result = parse(*logs)
    assert result.returncode == 1, result
    out = result.stdout
    assert ": failed in " not in out, "no test failed"

    hang = block(out, "run 2: exit 143 (signal 15); hang: still running after 900s, stopped by deploy/bounded.sh "
                      "(thread backtraces in the log)")
    assert '\n    tests started and not finished: "drains every circuit"\n' in hang, "quick() finished"
    assert "| last words before the hang" in hang and "futex_wait" not in hang

    sanitizer = block(out, f"run 3: 1 sanitizer report(s) in {tmp_path}/run-3-reports")
    assert "SUMMARY: AddressSanitizer: heap-use-after-free Frame.swift:10 in decode" in sanitizer
    assert "run 1" not in out
    assert out.splitlines()[-1] == "flake-hunt: logs: 3 runs, 2 failed (busy)"


def test_clean_runs_exit_zero(tmp_path: Path) -> None:
    result = parse(write_run(tmp_path, 1, CLEAN_RUN, 0), write_run(tmp_path, 2, CLEAN_RUN, 0))
    assert result.returncode == 0, result
    assert result.stdout == "flake-hunt: logs: 2 runs, 0 failed (busy)\n"


def test_usage_errors() -> None:
    assert subprocess.run([str(FLAKE_HUNT), "--help"], capture_output=True, text=True, timeout=30).stdout.startswith(
        "Runs one test suite N times")
    for args in (["--suite", "nope"], ["--runs", "3"], ["--suite", "e2e", "--filter", "X"], ["--parse"]):
        result = subprocess.run([str(FLAKE_HUNT), *args], capture_output=True, text=True, timeout=30)
        assert result.returncode == 64, (args, result)
