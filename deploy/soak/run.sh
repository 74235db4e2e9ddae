#!/usr/bin/env bash
# The soak test in one command: mixed SSE/download/upload/WebSocket load through the overlay and HTTP mode, with
# SIGKILL faults (controller, backend, overlay gateway) and device revocations on a schedule, every payload checked
# by SHA-256, memory and descriptors of every process sampled. Exit 0 only if nothing was corrupted, nothing failed
# outside a fault window, every fault recovered in time and memory and descriptors stayed flat.
#
#   deploy/soak/run.sh --duration 2m                 # what CI runs (about 3 minutes of wall time)
#   deploy/soak/run.sh --duration 30m --out /tmp/soak
#   deploy/soak/run.sh --duration 3m --controllers 2 # two controllers on a PostgreSQL the run starts and stops
#
# With --controllers 2 the controller fault SIGKILLs A and B in turn while the other keeps serving, and admin writes
# made through both during the run must all be visible at the end through each (0 lost acknowledged writes). It needs
# PostgreSQL installed (deploy/install-deps.sh); run as root, the server runs as the `postgres` user.
#
# The binary is $ILS_BIN, else this checkout's `swift build` product (built when missing). Other arguments go to
# deploy/soak/soak.py (--help lists them).
#
#   deploy/soak/run.sh --resume --minutes 30         # issue 38's resumption soak (deploy/soak/resume_soak.py, root)
#
# --resume runs the resumption soak instead: SSE answers through a device's tunnel and ils-client-example in a network
# namespace, its path switched every minute, one of two controllers on PostgreSQL SIGKILLed every 3 minutes; 0 events
# lost, duplicated or out of order, 0 backend requests cancelled, flat memory. ils-client-example is
# $ILS_CLIENT_EXAMPLE_BIN, else the one beside $ILS_BIN (built when missing). Other arguments go to resume_soak.py.
set -euo pipefail
cd "$(dirname "$0")/../.."

resume=0
if [ "${1:-}" = "--resume" ]; then
    resume=1
    shift
fi

if ! python3 -c 'import httpx, websockets, fastapi, uvicorn, sse_starlette, pytest' 2>/dev/null; then
    ./deploy/install-deps.sh
fi

if [ -z "${ILS_BIN:-}" ]; then
    ILS_BIN="$(swift build --show-bin-path)/ils-gateway"
    if [ ! -x "$ILS_BIN" ]; then
        echo "== building ils-gateway (debug)" >&2
        swift build --product ils-gateway
    fi
fi
if [ ! -x "$ILS_BIN" ]; then
    echo "soak: no executable ils-gateway at $ILS_BIN" >&2
    exit 2
fi

if [ "$resume" = 1 ]; then
    CLIENT_BIN="${ILS_CLIENT_EXAMPLE_BIN:-$(dirname "$ILS_BIN")/ils-client-example}"
    if [ ! -x "$CLIENT_BIN" ] && [ -z "${ILS_CLIENT_EXAMPLE_BIN:-}" ]; then
        config=debug
        [ "$(basename "$(dirname "$ILS_BIN")")" = release ] && config=release
        echo "== building ils-client-example ($config)" >&2
        swift build -c "$config" --product ils-client-example
    fi
    exec python3 deploy/soak/resume_soak.py --bin "$ILS_BIN" --client-example-bin "$CLIENT_BIN" "$@"
fi
exec python3 deploy/soak/soak.py --bin "$ILS_BIN" "$@"
