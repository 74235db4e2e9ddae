#!/usr/bin/env bash
# Runs the whole system locally on its embedded defaults, every part on 127.0.0.1, and shows a streamed answer
# arriving event by event through it:
#   controller (CA, SQLite identity store, relay) ← dark gateway (serve --mode ziti, no listening socket) → the
#   sample Claude Code backend (FastAPI); an enrolled device identity; the device tunnel; curl -N through the tunnel.
# Everything lives in .ils-quickstart/ and is stopped at the end; --keep-running leaves it up until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
KEEP_RUNNING=0
[ "${1:-}" = "--keep-running" ] && KEEP_RUNNING=1

./deploy/install-deps.sh --product

STATE="$ROOT/.ils-quickstart"
rm -rf "$STATE"
mkdir -p "$STATE"
chmod 700 "$STATE"

echo "== building ils-gateway (the first build takes a few minutes)"
swift build --product ils-gateway >"$STATE/build.log" 2>&1 || { tail -30 "$STATE/build.log"; exit 1; }
BIN="$(swift build --show-bin-path)/ils-gateway"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
CONTROLLER_PORT=${QUICKSTART_CONTROLLER_PORT:-$(free_port)}
BACKEND_PORT=${QUICKSTART_BACKEND_PORT:-$(free_port)}
TUNNEL_PORT=${QUICKSTART_TUNNEL_PORT:-$(free_port)}

PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT

wait_for_port() {
    for _ in $(seq 1 150); do
        if python3 -c "import socket; socket.create_connection(('127.0.0.1',$1),0.2)" 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    echo "nothing is listening on 127.0.0.1:$1; see $2" >&2
    tail -20 "$2" >&2
    return 1
}

wait_for_log() {
    for _ in $(seq 1 150); do
        if grep -q "$1" "$2" 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    echo "'$1' never appeared in $2" >&2
    tail -20 "$2" >&2
    return 1
}

cd "$STATE"
echo "== controller: CA, identity store and admin identity in $STATE/controller"
"$BIN" controller init --state-dir controller --address "https://127.0.0.1:$CONTROLLER_PORT" | sed 's/^/   /'
"$BIN" controller run --state-dir controller --listen "127.0.0.1:$CONTROLLER_PORT" >controller.log 2>&1 &
PIDS+=($!)
wait_for_port "$CONTROLLER_PORT" controller.log

echo "== enrolling a gateway and a device (one-time tokens; each key pair made where it lives)"
"$BIN" admin identity create gateway --role gateway -o gateway.jwt 2>/dev/null
"$BIN" enroll gateway.jwt | sed 's/^/   /'
"$BIN" admin identity create ipad --role device -o ipad.jwt 2>/dev/null
"$BIN" enroll ipad.jwt | sed 's/^/   /'
rm -f gateway.jwt ipad.jwt

echo "== sample backend on http://127.0.0.1:$BACKEND_PORT"
python3 "$ROOT/deploy/backend/app.py" --host 127.0.0.1 --port "$BACKEND_PORT" >backend.log 2>&1 &
PIDS+=($!)
wait_for_port "$BACKEND_PORT" backend.log

echo "== dark gateway: ils-gateway serve (overlay mode) — it dials out and listens on nothing"
NETWORKING_MODE=ziti "$BIN" serve --identity identities/gateway.json --backend "http://127.0.0.1:$BACKEND_PORT" \
    >gateway.log 2>&1 &
GATEWAY_PID=$!
PIDS+=($GATEWAY_PID)
wait_for_log "hosting service" gateway.log
if command -v ss >/dev/null && ss -ltnup 2>/dev/null | grep -q "pid=$GATEWAY_PID,"; then
    echo "   unexpected: the gateway owns a listening socket" >&2
    exit 1
fi
echo "   the gateway process (pid $GATEWAY_PID) owns no listening socket"

echo "== device tunnel on http://127.0.0.1:$TUNNEL_PORT"
"$BIN" tunnel --identity identities/ipad.json --listen "127.0.0.1:$TUNNEL_PORT" >tunnel.log 2>&1 &
PIDS+=($!)
wait_for_port "$TUNNEL_PORT" tunnel.log

echo "== a streamed answer: curl → tunnel → controller relay → gateway → backend, encrypted end to end"
echo "   curl -N 'http://127.0.0.1:$TUNNEL_PORT/claude/stream?prompt=hello&n=6&interval_ms=300'"
curl -sSN --max-time 30 "http://127.0.0.1:$TUNNEL_PORT/claude/stream?prompt=hello&n=6&interval_ms=300" |
    while IFS= read -r line; do
        line=${line%$'\r'}
        # `||`, not `&&`: a blank line (the end of every event) must not become the loop's, and so the pipeline's,
        # failing status under `set -e -o pipefail`.
        [ -z "$line" ] || printf '   %s  %s\n' "$(date +%T.%3N)" "$line"
    done
echo
echo "== the gateway's access line names the device it verified:"
# Written just after the answer's end (by the log's own thread): wait for it rather than read once.
wait_for_log " access " gateway.log
grep ' access ' gateway.log | tail -1 | sed 's/^/   /'
cat <<NEXT

What to try next (with --keep-running; run these in $STATE):
  curl http://127.0.0.1:$TUNNEL_PORT/debug/headers               # the backend sees X-ILS-Identity: ipad
  curl -N -X POST -H 'content-type: application/json' -d '{"prompt":"hi","n":5}' \\
       http://127.0.0.1:$TUNNEL_PORT/claude/stream
  $BIN admin identity list
  $BIN admin audit
  $BIN --help
Logs: $STATE/{controller,gateway,tunnel,backend}.log
NEXT

if [ "$KEEP_RUNNING" = 1 ]; then
    echo "Running until Ctrl-C."
    wait
fi
