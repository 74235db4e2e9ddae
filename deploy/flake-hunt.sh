#!/usr/bin/env bash
# Runs one test suite N times in a row, optionally while other processes keep every core busy, then prints the
# failures grouped by test (in how many runs each failed, and the first lines of its message in each run) and the runs
# that failed with no failing test to show for it (build error, crash, hang, sanitizer report), with their log's tail.
#
#   deploy/flake-hunt.sh --suite swift|store|e2e|asan [--runs N] [--busy] [--filter REGEX] [-k EXPR] [--out DIR]
#   deploy/flake-hunt.sh [--suite NAME] --parse LOG...     # the same report for logs already written
#
# Suites (built once first, then run as deploy/test.sh and deploy/sanitize.sh run them):
#   swift   swift test --skip-build --skip ILSStoreTests
#   store   swift test --skip-build --filter ILSStoreTests
#   e2e     python3 -m pytest -vv -ra Tests/e2e, with ILS_BIN and ILS_CLIENT_EXAMPLE_BIN from swift build's bin path
#   asan    the swift suite built with AddressSanitizer in .build-asan (ILS_SANITIZE_SCRATCH), with sanitize.sh's
#           environment (deploy/sanitizers/env.sh); any report, from any process, fails the run
# Options:
#   --runs N         how many runs (default 10)
#   --busy           every core kept busy meanwhile: stress-ng --cpu $(nproc) (installed if missing), else busy loops
#   --filter REGEX   the Swift tests to run. swift, asan: in place of --skip ILSStoreTests, as in sanitize.sh
#                    (--suite asan --filter ILSStoreTests runs the store suites under ASan); store: within ILSStoreTests
#   -k EXPR          pytest's selection (e2e)
#   --limit SECONDS  bound of each run (deploy/bounded.sh: a hang is a failure, with backtraces). Default: swift 900,
#                    store 600, e2e 3600, asan 1800; twice that with --busy
#   --out DIR        where the logs go (default .flake-hunt/SUITE-TIMESTAMP): run-K.log, run-K.status, and
#                    run-K-reports/ (asan)
# The last line: "flake-hunt: SUITE: R runs, F failed" (+ " (busy)"); exit status 0 only if no run failed.
set -euo pipefail
caller_dir=$PWD   # --out and --parse's logs are paths from where the script was started
cd "$(dirname "$0")/.."
from_caller() { case "$1" in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$caller_dir/$1" ;; esac; }

usage() { awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; exit "${1:-0}"; }
fail_usage() { echo "flake-hunt.sh: $* (see --help)" >&2; exit 64; }

# The report: python3 reads the logs (and each one's run-K.status and run-K-reports/ beside it).
#   report --suite NAME [--busy] LOG...   the full report and the summary line; exit status 1 if any run failed
#   report --brief LOG                    one run's failing tests on one line (the progress lines)
report() {
    python3 - "$@" <<'PY'
import os
import re
import sys

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
# Swift Testing (console output; the symbols of its Linux output).
ST_ISSUE = re.compile(
    r"^\u2718 (Test|Suite) (.+?) recorded an issue(?: with \d+ arguments? (.+?))?(?: at ([^\s:]+):(\d+):(\d+))?: (.*)$")
ST_FAILED = re.compile(r"^\u2718 Test (.+?)(?: with \d+ test cases?)? failed after ")
ST_RUN = re.compile(r"^\S+ Test run with \d+ tests?\b")
ST_STARTED = re.compile(r"^\u25c7 Test (.+?) started\.$")
ST_ENDED = re.compile(
    r"^[\u2714\u2501\u2718\u279c] Test (.+?)(?: with \d+ test cases?)? (?:passed after|failed after|skipped)")
ST_CONTINUATION = ("\u21b3 ", "\u00b1 ", "  ")
# XCTest.
XC_ERROR = re.compile(r"^(.+?):(\d+): error: (\S+) : (.*)$")
XC_FAILED = re.compile(r"^Test Case '([^']+)' failed \(")
XC_STARTED = re.compile(r"^Test Case '([^']+)' started")
XC_ENDED = re.compile(r"^Test Case '([^']+)' (?:passed|failed|skipped)")
# pytest's short test summary (-ra).
PY_SUMMARY = re.compile(r"^=+ short test summary info =+$")
PY_RESULT = re.compile(r"^(FAILED|ERROR) (.+?)(?: - (.*))?$")
PY_OTHER = re.compile(r"^(FAILED|ERROR|SKIPPED|XFAIL|XPASS|PASSED) |^=+ ")
PY_TOTALS = re.compile(r"^=+ .*\b\d+ (failed|errors?)\b.* =+$")
# Whatever else fails a run.
HANG = re.compile(r"^== (.*): still running after (\d+)s")
SANITIZER = re.compile(r"^(?:==\d+==ERROR: \w+Sanitizer|WARNING: ThreadSanitizer|SUMMARY: \w+Sanitizer)")
SANITIZER_SUMMARY = re.compile(r"^SUMMARY: \w+Sanitizer.*")
CRASH = re.compile(r"Fatal error: |Program crashed: |Exited with (?:unexpected )?signal|^error: ")

MAX_ISSUES_PER_RUN = 3
MAX_CONTINUATION = 2
WIDTH = 240


def clip(text):
    text = text.rstrip()
    return text if len(text) <= WIDTH else text[: WIDTH - 1] + "\u2026"


def xc_name(name):
    objc = re.match(r"^-\[(\S+) (\S+)\]$", name)
    return f"{objc.group(1)}.{objc.group(2)}" if objc else name


class Run:
    def __init__(self, path, index):
        self.path = path
        number = re.match(r"^run-(\d+)\.log$", os.path.basename(path))
        self.label = f"run {number.group(1)}" if number else f"run {index} ({os.path.basename(path)})"
        with open(path, encoding="utf-8", errors="replace") as f:
            self.lines = [ANSI.sub("", line.rstrip("\n")) for line in f]
        self.status = {}
        status_path = re.sub(r"\.log$", ".status", path)
        if status_path != path and os.path.exists(status_path):
            with open(status_path) as f:
                self.status = dict(line.strip().split("=", 1) for line in f if "=" in line)
        self.reports_dir = re.sub(r"\.log$", "-reports", path)
        self.tests = {}  # test -> message lines, in the order found
        self.parse()
        self.classify()

    def add(self, test, message_lines):
        self.tests.setdefault(test, []).append([clip(line) for line in message_lines])

    def continuation(self, i, is_continuation):
        found = []
        for line in self.lines[i + 1 : i + 1 + MAX_CONTINUATION]:
            if not is_continuation(line):
                break
            found.append("  " + line.strip())
        return found

    def parse(self):
        st_failed, started, ended = [], [], set()
        in_summary = False
        self.hang = None
        self.sanitizer_lines, self.crash_lines, self.py_totals = [], [], False
        for i, line in enumerate(self.lines):
            issue = ST_ISSUE.match(line)
            if issue:
                kind, name, arguments, file, row, column, message = issue.groups()
                test = f"{'Suite ' if kind == 'Suite' else ''}{name}" + (f" ({file})" if file else "")
                where = f"{file}:{row}:{column}" if file else "(no source location)"
                if arguments:
                    where += f" ({arguments})"
                self.add(test, [f"{where}: {message}"] + self.continuation(i, lambda l: l.startswith(ST_CONTINUATION)))
                continue
            if ST_RUN.match(line):
                continue
            failed = ST_FAILED.match(line)
            if failed:
                st_failed.append((failed.group(1), line))
            started_match = ST_STARTED.match(line) or XC_STARTED.match(line)
            if started_match and started_match.group(1) != "run" and not line.startswith("\u25c7 Test case passing "):
                started.append(started_match.group(1))
            ended_match = ST_ENDED.match(line) or XC_ENDED.match(line)
            if ended_match:
                ended.add(ended_match.group(1))
            xc_error = XC_ERROR.match(line)
            if xc_error:
                file, row, name, message = xc_error.groups()
                self.add(xc_name(name), [f"{os.path.basename(file)}:{row}: {message}"])
                continue
            xc_failed = XC_FAILED.match(line)
            if xc_failed and xc_name(xc_failed.group(1)) not in self.tests:
                self.add(xc_name(xc_failed.group(1)), [line])
            if PY_SUMMARY.match(line):
                in_summary = True
                continue
            if in_summary:
                result = PY_RESULT.match(line)
                if result:
                    outcome, node, message = result.groups()
                    first = f"{outcome}: {message}" if outcome == "ERROR" else (message or "(no message)")
                    self.add(node, [first] + self.continuation(i, lambda l: bool(l.strip()) and not PY_OTHER.match(l)))
                elif line.startswith("="):
                    in_summary = False
            if PY_TOTALS.match(line):
                self.py_totals = True
            hang = HANG.match(line)
            if hang and self.hang is None:
                self.hang = (i, hang.group(2))
            if SANITIZER.match(line):
                self.sanitizer_lines.append(line)
            if CRASH.search(line):
                self.crash_lines.append(line)
        # A Swift Testing test that failed with no issue line of its own in the log (interleaved output, say).
        for name, line in st_failed:
            if not any(t == name or t.startswith(name + " (") for t in self.tests):
                self.add(name, [f"(no issue line found) {line}"])
        self.still_running = [name for name in dict.fromkeys(started) if name not in ended]

    def classify(self):
        self.exit = self.status.get("exit")
        self.reports = []
        if os.path.isdir(self.reports_dir):
            self.reports = sorted(os.path.join(self.reports_dir, f) for f in os.listdir(self.reports_dir))
        reasons = []
        if self.exit is not None and self.exit != "0":
            code = int(self.exit)
            reasons.append(f"exit {code}" + (f" (signal {code - 128})" if code > 128 else ""))
        if self.hang is not None:
            reasons.append(f"hang: still running after {self.hang[1]}s, stopped by deploy/bounded.sh "
                           "(thread backtraces in the log)")
        if self.reports:
            reasons.append(f"{len(self.reports)} sanitizer report(s) in {self.reports_dir}")
        elif self.sanitizer_lines:
            reasons.append("sanitizer report(s) in the log")
        if self.crash_lines:
            reasons.append("crash or error: " + clip(self.crash_lines[0]))
        self.reasons = reasons
        if self.exit is not None:
            self.failed = self.exit != "0" or bool(self.tests) or bool(self.reports) or self.hang is not None
        else:
            self.failed = bool(self.tests or self.hang or self.sanitizer_lines or self.crash_lines or self.py_totals)
        beyond_tests = self.hang is not None or self.reports or self.sanitizer_lines or \
            any("Fatal error: " in l or "Program crashed: " in l or "signal" in l for l in self.crash_lines) or \
            (self.exit is not None and self.exit.isdigit() and int(self.exit) > 128)
        self.other = self.failed and (not self.tests or bool(beyond_tests))

    def sanitizer_summaries(self):
        found = []
        for path in self.reports:
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    found += [l.rstrip() for l in f if SANITIZER_SUMMARY.match(l)]
            except OSError:
                pass
        found += [l for l in self.sanitizer_lines if SANITIZER_SUMMARY.match(l)]
        return list(dict.fromkeys(found))


def brief(path):
    run = Run(path, 1)
    tests = sorted(run.tests)
    text = ", ".join(tests[:4]) + (f" and {len(tests) - 4} more" if len(tests) > 4 else "")
    print(f"{len(tests)} failing test(s): {text}" if tests else "no failing test parsed")


def full(suite, busy, paths):
    def order(indexed):  # run-10.log after run-9.log, whatever order a glob gave
        number = re.match(r"^run-(\d+)\.log$", os.path.basename(indexed[1]))
        return (int(number.group(1)) if number else float("inf"), indexed[0])

    runs = [Run(path, i + 1) for i, path in sorted(enumerate(paths), key=order)]
    if suite is None:
        parent = os.path.basename(os.path.dirname(os.path.abspath(paths[0]))) if paths else ""
        named = re.match(r"^(swift|store|e2e|asan)-\d", parent)
        suite = named.group(1) if named else "logs"
    if not busy and runs and all(run.status.get("busy") == "1" for run in runs):
        busy = True
    failed = [run for run in runs if run.failed]

    by_test = {}
    for run in runs:
        for test, issues in run.tests.items():
            by_test.setdefault(test, []).append((run, issues))
    if by_test:
        print("== failures by test")
        for test, found in sorted(by_test.items(), key=lambda item: (-len(item[1]), item[0])):
            print(f"{test}: failed in {len(found)} of {len(runs)} runs")
            for run, issues in found:
                for n, issue in enumerate(issues[:MAX_ISSUES_PER_RUN]):
                    prefix = f"    {run.label}: " if n == 0 else " " * (len(run.label) + 6)
                    print(prefix + issue[0])
                    for more in issue[1:]:
                        print(" " * (len(run.label) + 6) + more)
                if len(issues) > MAX_ISSUES_PER_RUN:
                    print(" " * (len(run.label) + 6) + f"(and {len(issues) - MAX_ISSUES_PER_RUN} more issues)")
    others = [run for run in runs if run.other]
    if others:
        print("== runs that failed with no failing test parsed, or beyond their failing tests")
        for run in others:
            reasons = "; ".join(run.reasons) or "failed"
            print(f"{run.label}: {reasons}")
            for summary in run.sanitizer_summaries()[:5]:
                print(f"    {clip(summary)}")
            if run.still_running:
                names = ", ".join(run.still_running[:8]) + (" \u2026" if len(run.still_running) > 8 else "")
                print(f"    tests started and not finished: {names}")
            if run.hang is not None:
                tail = run.lines[max(0, run.hang[0] - 15) : run.hang[0]]
                print(f"    {run.path}, the last lines before the hang:")
            else:
                tail = run.lines[-15:]
                print(f"    {run.path}, its last lines:")
            for line in tail:
                print(f"    | {clip(line)}")
    print(f"flake-hunt: {suite}: {len(runs)} runs, {len(failed)} failed" + (" (busy)" if busy else ""))
    return 1 if failed else 0


args = sys.argv[1:]
if args[:1] == ["--brief"]:
    brief(args[1])
    sys.exit(0)
suite, busy = None, False
while args and args[0] in ("--suite", "--busy"):
    if args[0] == "--suite":
        suite, args = args[1], args[2:]
    else:
        busy, args = True, args[1:]
sys.exit(full(suite, busy, args))
PY
}

suite=""
runs=10
busy=false
filter=""
pytest_select=()
out=""
limit=""
parse=false
need_value() { [ "$2" -ge 2 ] || fail_usage "$1 needs a value"; }
while [ $# -gt 0 ]; do
    case "$1" in
        --suite) need_value "$1" $#; suite=$2; shift 2 ;;
        --runs) need_value "$1" $#; runs=$2; shift 2 ;;
        --busy) busy=true; shift ;;
        --filter) need_value "$1" $#; filter=$2; shift 2 ;;
        -k) need_value "$1" $#; pytest_select=(-k "$2"); shift 2 ;;
        --limit) need_value "$1" $#; limit=$2; shift 2 ;;
        --out) need_value "$1" $#; out=$2; shift 2 ;;
        --parse) parse=true; shift; break ;;
        -h | --help) usage 0 ;;
        *) fail_usage "unknown option '$1'" ;;
    esac
done

if $parse; then
    [ $# -ge 1 ] || fail_usage "--parse needs at least one log"
    logs=()
    for log in "$@"; do
        [ -f "$(from_caller "$log")" ] || fail_usage "no log file '$log' (the logs come last, after --parse)"
        logs+=("$(from_caller "$log")")
    done
    suite_option=()
    if [ -n "$suite" ]; then suite_option=(--suite "$suite"); fi
    status=0
    report ${suite_option[@]+"${suite_option[@]}"} "${logs[@]}" || status=$?
    exit "$status"
fi

case "$suite" in
    swift) default_limit=900 ;;
    store) default_limit=600 ;;
    e2e) default_limit=3600 ;;
    asan) default_limit=1800 ;;
    "") fail_usage "--suite is required" ;;
    *) fail_usage "unknown suite '$suite' (swift, store, e2e or asan)" ;;
esac
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || fail_usage "--runs needs a positive number"
if [ -n "$limit" ]; then
    [[ "$limit" =~ ^[1-9][0-9]*$ ]] || fail_usage "--limit needs a positive number of seconds"
elif $busy; then
    limit=$((default_limit * 2))
else
    limit=$default_limit
fi
if [ -n "$filter" ] && [ "$suite" = e2e ]; then fail_usage "--filter selects Swift tests; for e2e use -k"; fi
if ((${#pytest_select[@]})) && [ "$suite" != e2e ]; then fail_usage "-k selects end-to-end tests (--suite e2e)"; fi

if [ -n "$out" ]; then out="$(from_caller "$out")"; else out=".flake-hunt/$suite-$(date +%Y%m%d-%H%M%S)"; fi
mkdir -p "$out"

./deploy/install-deps.sh

# The build, once; its failure ends the hunt before any run.
build() {
    echo "== flake-hunt: $*" >&2
    if ! "$@" 2>&1 | tee -a "$out/build.log" >&2; then
        echo "flake-hunt: $suite: 0 runs, the build failed (log: $out/build.log)"
        exit 1
    fi
}
case "$suite" in
    swift | store)
        build swift build --build-tests
        command=(swift test --skip-build)
        ;;
    e2e)
        build swift build
        bin_path="$(swift build --show-bin-path)"
        export ILS_BIN="$bin_path/ils-gateway" ILS_CLIENT_EXAMPLE_BIN="$bin_path/ils-client-example"
        # -vv: pytest's summary lines carry each failure's whole message, not as much as fits 80 columns.
        command=(python3 -m pytest -vv -ra Tests/e2e ${pytest_select[@]+"${pytest_select[@]}"})
        ;;
    asan)
        scratch="${ILS_SANITIZE_SCRATCH:-.build-asan}"
        # shellcheck source=deploy/sanitizers/env.sh
        . deploy/sanitizers/env.sh
        sanitizer_env address "$scratch"
        build swift build --build-tests --sanitize=address --scratch-path "$scratch"
        command=(swift test --skip-build --sanitize=address --scratch-path "$scratch")
        ;;
esac
case "$suite" in
    swift | asan)
        if [ -n "$filter" ]; then command+=(--filter "$filter"); else command+=(--skip ILSStoreTests); fi
        ;;
    store)
        # Both conditions: the tests the filter names, among the store suites only (--filter options would add up).
        if [ -n "$filter" ]; then
            command+=(--filter "$filter" --skip '^(?!ILSStoreTests\.)')
        else
            command+=(--filter ILSStoreTests)
        fi
        ;;
esac

busy_pids=()
run_pid=""
interrupted=false
# shellcheck disable=SC2317  # called from the traps
stop_run() {
    [ -n "$run_pid" ] || return 0
    # deploy/bounded.sh runs the command in a session of its own (setsid), led by its child.
    # Its other child, the watchdog, sleeps in a child of its own.
    local child
    for child in $(pgrep -P "$run_pid" 2>/dev/null); do
        pkill -TERM -s "$child" 2>/dev/null || true
        pkill -TERM -P "$child" 2>/dev/null || true
        kill -TERM "$child" 2>/dev/null || true
    done
    kill -TERM "$run_pid" 2>/dev/null || true
}
stop_busy() {
    ((${#busy_pids[@]})) || return 0
    kill -TERM "${busy_pids[@]}" 2>/dev/null || true
    wait "${busy_pids[@]}" 2>/dev/null || true
    busy_pids=()
}
trap 'stop_run; stop_busy' EXIT
trap 'interrupted=true; stop_run' INT TERM

busy_note=""
if $busy; then
    cores="$(nproc)"
    if ! command -v stress-ng >/dev/null; then
        if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
        echo "== flake-hunt: installing stress-ng (Debian package)" >&2
        export DEBIAN_FRONTEND=noninteractive
        $SUDO apt-get install -y -qq stress-ng >/dev/null 2>&1 ||
            { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq stress-ng >/dev/null; } ||
            echo "== flake-hunt: could not install stress-ng; shell busy loops instead" >&2
    fi
    # Both stop by themselves too: after 4 hours, and (setpriv's parent-death signal, the loops' check) when this
    # script is gone, however it ended.
    if command -v stress-ng >/dev/null; then
        pdeath=()
        if command -v setpriv >/dev/null; then pdeath=(setpriv --pdeathsig TERM); fi
        ${pdeath[@]+"${pdeath[@]}"} stress-ng --cpu "$cores" --timeout 4h </dev/null >"$out/busy.log" 2>&1 &
        busy_pids+=("$!")
        busy_note=" (busy: stress-ng --cpu $cores)"
    else
        for ((i = 0; i < cores; i++)); do
            (
                end=$((SECONDS + 4 * 3600))
                while [ "$SECONDS" -lt "$end" ] && kill -0 "$$" 2>/dev/null; do :; done
            ) </dev/null >/dev/null 2>&1 &
            busy_pids+=("$!")
        done
        busy_note=" (busy: $cores shell busy loops)"
    fi
fi

echo "== flake-hunt: $runs runs of: ${command[*]}$busy_note; each bounded at ${limit}s; logs in $out" >&2
done_runs=0
for ((k = 1; k <= runs; k++)); do
    log="$out/run-$k.log"
    if [ "$suite" = asan ]; then sanitizer_clear_reports; fi
    printf '== flake-hunt run %s/%s: %s%s\n' "$k" "$runs" "${command[*]}" "$busy_note" >"$log"
    started=$SECONDS
    ./deploy/bounded.sh "$limit" "flake-hunt $suite run $k" "${command[@]}" >>"$log" 2>&1 </dev/null &
    run_pid=$!
    status=0
    wait "$run_pid" || status=$?
    if $interrupted; then
        wait "$run_pid" 2>/dev/null || true
        run_pid=""
        echo "== flake-hunt: interrupted during run $k (not counted; its log: $log)" >&2
        break
    fi
    run_pid=""
    reports=0
    if [ "$suite" = asan ] && compgen -G "$sanitizer_reports/*" >/dev/null; then
        mkdir -p "$out/run-$k-reports"
        cp "$sanitizer_reports"/* "$out/run-$k-reports/"
        reports=$(find "$out/run-$k-reports" -type f | wc -l)
    fi
    printf 'exit=%s\nseconds=%s\nreports=%s\nbusy=%s\n' "$status" "$((SECONDS - started))" "$reports" \
        "$($busy && echo 1 || echo 0)" >"$out/run-$k.status"
    done_runs=$k
    if [ "$status" -eq 0 ] && [ "$reports" -eq 0 ]; then
        echo "== flake-hunt: run $k/$runs passed ($((SECONDS - started))s)" >&2
    else
        what="exit $status"
        if [ "$reports" -gt 0 ]; then what+=", $reports sanitizer report(s)"; fi
        echo "== flake-hunt: run $k/$runs FAILED ($what, $((SECONDS - started))s): $(report --brief "$log")" >&2
    fi
done
stop_busy

busy_option=()
if $busy; then busy_option=(--busy); fi
if [ "$done_runs" -eq 0 ]; then
    echo "flake-hunt: $suite: 0 runs, 0 failed$($busy && echo ' (busy)')"
    exit 130
fi
logs=()
for ((k = 1; k <= done_runs; k++)); do logs+=("$out/run-$k.log"); done
echo >&2
status=0
report --suite "$suite" ${busy_option[@]+"${busy_option[@]}"} "${logs[@]}" || status=$?
if $interrupted; then exit 130; fi
exit "$status"
