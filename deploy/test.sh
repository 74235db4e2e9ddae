#!/usr/bin/env bash
# The project's test command (README.md; CI runs exactly this):
# format lint, the private-API check, build, the Swift test suite, then the end-to-end tests against the real binary
# and the sample backend.
set -euo pipefail
cd "$(dirname "$0")/.."

./deploy/install-deps.sh

echo "== swift format lint" >&2
swift format lint --strict --recursive Sources Tests Package.swift

echo "== swift-crypto's internals only in the documented exception" >&2
./deploy/check-private-api.sh

echo "== swift build" >&2
swift build --build-tests

BIN_PATH="$(swift build --show-bin-path)"
export ILS_BIN="$BIN_PATH/ils-gateway" ILS_CLIENT_EXAMPLE_BIN="$BIN_PATH/ils-client-example"

# The idle test mostly waits: its claim is two minutes in which an idle tunnel sends no packet, counted on the
# interfaces of a network namespace of its own, which the load of the Swift suite does not touch. It runs beside the
# Swift suite instead of adding its two minutes to the end-to-end run; its result is checked before the end-to-end
# tests start.
idle_log="$(mktemp)"
python3 -m pytest -q -p no:cacheprovider Tests/e2e/test_idle.py >"$idle_log" 2>&1 &
idle_test=$!
trap 'kill -INT "$idle_test" 2>/dev/null || true; wait "$idle_test" 2>/dev/null || true; rm -f "$idle_log"' EXIT

echo "== swift test" >&2
# Bounded (deploy/bounded.sh): a healthy run takes about a minute; a hang fails here with every thread's backtrace.
./deploy/bounded.sh 900 "swift test" swift test --skip-build --skip ILSStoreTests
# The store suites on their own: they start PostgreSQL servers on free ports (and stop one to play an outage); run
# beside the proxy suites, a test that stops its backend and dials the port again once reached a PostgreSQL server
# that had taken it.
echo "== swift test: stores (SQLite and a PostgreSQL the tests start)" >&2
./deploy/bounded.sh 600 "swift test: stores" swift test --skip-build --filter ILSStoreTests

echo "== end-to-end: the idle test, run beside the Swift suite" >&2
idle_status=0
wait "$idle_test" || idle_status=$?
cat "$idle_log"
if [ "$idle_status" -ne 0 ]; then
    echo "the idle test failed (exit $idle_status)" >&2
    exit "$idle_status"
fi

echo "== end-to-end tests (real binary, sample FastAPI backend)" >&2
python3 -m pytest -q --durations=20 --ignore=Tests/e2e/test_idle.py Tests/e2e
