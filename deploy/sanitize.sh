#!/usr/bin/env bash
# Runs the test suite under a sanitizer: the Swift test suite in-process, then (with --e2e) the end-to-end tests
# against an ils-gateway binary built with the same sanitizer, so the controller, gateway and tunnel processes are
# checked too.
#
#   deploy/sanitize.sh address            # AddressSanitizer (+ LeakSanitizer): Swift tests
#   deploy/sanitize.sh thread --e2e       # ThreadSanitizer: Swift tests, then the end-to-end tests
#
# Each sanitizer gets its own build directory (.build-asan, .build-tsan; a first build takes ~10 minutes on 2 cores).
# Every report a sanitizer writes, from the test runner or from any child process, lands in
# .build-<kind>/reports/; the run fails if that directory is not empty at the end, whatever the tests said.
# Options: --filter REGEX (Swift tests to run), --e2e (also the end-to-end tests), -k EXPR (pytest selection).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

[ $# -ge 1 ] || usage 64
kind=$1
shift
case "$kind" in
    address) short=asan ;;
    thread) short=tsan ;;
    -h | --help) usage 0 ;;
    *) echo "sanitize.sh: unknown sanitizer '$kind' (address or thread)" >&2; exit 64 ;;
esac

filter=()
e2e=false
pytest_select=()
while [ $# -gt 0 ]; do
    case "$1" in
        --filter) filter=(--filter "$2"); shift 2 ;;
        --e2e) e2e=true; shift ;;
        -k) pytest_select=(-k "$2"); shift 2 ;;
        -h | --help) usage 0 ;;
        *) echo "sanitize.sh: unknown option '$1'" >&2; usage 64 ;;
    esac
done

./deploy/install-deps.sh

scratch="${ILS_SANITIZE_SCRATCH:-.build-$short}"   # another build directory: ILS_SANITIZE_SCRATCH
reports="$(realpath -m "$scratch")/reports"
rm -rf "$reports"
mkdir -p "$reports"

# log_path sends every report to a file named after the process, so a child that dies of a report is never missed.
# Leak suppressions (deploy/sanitizers/lsan.supp) cover XCTest's runner and swift-nio's perpetual global thread pool only.
export LSAN_OPTIONS="suppressions=$PWD/deploy/sanitizers/lsan.supp:print_suppressions=0"
export ASAN_OPTIONS="log_path=$reports/asan:detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=0"
export TSAN_OPTIONS="log_path=$reports/tsan:halt_on_error=0:second_deadlock_stack=1"

# Sanitized code runs several times slower: the tests' own deadlines stretch by this factor (Sources/ILSTesting/TestTiming.swift).
if [ "$kind" = thread ]; then default_scale=10; else default_scale=4; fi
export ILS_TEST_TIME_SCALE="${ILS_TEST_TIME_SCALE:-$default_scale}"

echo "== swift build --sanitize=$kind ($scratch)" >&2
swift build --build-tests --sanitize="$kind" --scratch-path "$scratch"

echo "== swift test --sanitize=$kind" >&2
status=0
if ((${#filter[@]})); then
    swift test --skip-build --sanitize="$kind" --scratch-path "$scratch" "${filter[@]}" || status=$?
else
    # As deploy/test.sh: the store suites on their own. Their PostgreSQL servers take free ports while they run, and
    # a parallel suite that stops a backend and dials its port again could reach one of them.
    # Not run here yet: the store suites (deploy/test.sh runs them unsanitized). Under ASan they ran clean once, but
    # once PostgresStoreTests.restart waited out its 3-minute limit for the change feed to listen again after a
    # server restart (issue 25's notes: the feed's reconnect under a slow process is not yet understood).
    swift test --skip-build --sanitize="$kind" --scratch-path "$scratch" --skip ILSStoreTests || status=$?
fi

if $e2e; then
    echo "== end-to-end tests against the $kind-sanitized binary" >&2
    bin="$(swift build --sanitize="$kind" --scratch-path "$scratch" --show-bin-path)/ils-gateway"
    ILS_BIN="$bin" python3 -m pytest -q Tests/e2e ${pytest_select[@]+"${pytest_select[@]}"} || status=$?
fi

# Any report fails the run: memory errors, data races and leaks alike.
if compgen -G "$reports/*" >/dev/null; then
    echo "== $kind sanitizer reports (in $reports):" >&2
    for report in "$reports"/*; do
        echo "--- $report" >&2
        head -n 60 "$report" >&2
    done
    exit 1
fi
if [ "$status" -ne 0 ]; then
    echo "== tests failed under the $kind sanitizer (exit $status)" >&2
    exit "$status"
fi
echo "== clean under the $kind sanitizer: no reports" >&2
