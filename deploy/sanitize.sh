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
# The report directory (.build-<kind>/reports, emptied here), ASAN/LSAN/TSAN_OPTIONS and ILS_TEST_TIME_SCALE:
# deploy/sanitizers/env.sh, shared with deploy/flake-hunt.sh.
# shellcheck source=deploy/sanitizers/env.sh
. deploy/sanitizers/env.sh
sanitizer_env "$kind" "$scratch"
reports="$sanitizer_reports"

echo "== swift build --sanitize=$kind ($scratch)" >&2
swift build --build-tests --sanitize="$kind" --scratch-path "$scratch"

echo "== swift test --sanitize=$kind" >&2
status=0
if ((${#filter[@]})); then
    swift test --skip-build --sanitize="$kind" --scratch-path "$scratch" "${filter[@]}" || status=$?
else
    # As deploy/test.sh: the store suites on their own, after the rest. Their PostgreSQL servers take free ports while
    # they run, and a parallel suite that stops a backend and dials its port again could reach one of them. Each run
    # is bounded (deploy/bounded.sh): a hang fails with every thread's backtrace instead of using up CI's time.
    ./deploy/bounded.sh 1500 "swift test --sanitize=$kind" \
        swift test --skip-build --sanitize="$kind" --scratch-path "$scratch" --skip ILSStoreTests || status=$?
    ./deploy/bounded.sh 900 "swift test --sanitize=$kind: stores" \
        swift test --skip-build --sanitize="$kind" --scratch-path "$scratch" --filter ILSStoreTests || status=$?
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
