#!/usr/bin/env bash
# Runs the whole thing locally on its embedded defaults and shows a streamed answer arriving event by event:
#   a controller (CA, SQLite identity store) with an enrolled device identity, the sample Claude Code backend
#   (FastAPI) on 127.0.0.1, ils-gateway in HTTP mode in front of it with a fresh local CA and TLS certificate,
#   and curl -N streaming Server-Sent Events through the gateway.
# Everything binds to 127.0.0.1 and lives in .ils-quickstart/; everything is stopped at the end.
# Use --keep-running to leave the gateway and backend up until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
KEEP_RUNNING=0
[ "${1:-}" = "--keep-running" ] && KEEP_RUNNING=1

./deploy/install-deps.sh

STATE="$ROOT/.ils-quickstart"
mkdir -p "$STATE"
chmod 700 "$STATE"

echo "== building ils-gateway (first build takes a few minutes)"
swift build --product ils-gateway >"$STATE/build.log" 2>&1 || { tail -30 "$STATE/build.log"; exit 1; }
BIN="$(swift build --show-bin-path)/ils-gateway"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
BACKEND_PORT=${QUICKSTART_BACKEND_PORT:-$(free_port)}
GATEWAY_PORT=${QUICKSTART_GATEWAY_PORT:-$(free_port)}

if [ ! -f "$STATE/server.pem" ]; then
    echo "== making a local CA and a TLS certificate for 127.0.0.1 in $STATE"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 -subj "/CN=ils-quickstart CA" \
        -keyout "$STATE/ca.key" -out "$STATE/ca.pem" \
        -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign >/dev/null 2>&1
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=localhost" \
        -keyout "$STATE/server.key" -out "$STATE/server.csr" >/dev/null 2>&1
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n' \
        >"$STATE/server.ext"
    openssl x509 -req -in "$STATE/server.csr" -CA "$STATE/ca.pem" -CAkey "$STATE/ca.key" -CAcreateserial \
        -days 30 -extfile "$STATE/server.ext" -out "$STATE/server.pem" >/dev/null 2>&1
    chmod 600 "$STATE"/*.key
fi

PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT

wait_for_port() {
    for _ in $(seq 1 100); do
        if python3 -c "import socket,sys; socket.create_connection(('127.0.0.1',$1),0.2)" 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    echo "nothing is listening on 127.0.0.1:$1; see $2" >&2
    tail -20 "$2" >&2
    return 1
}

CONTROLLER_PORT=${QUICKSTART_CONTROLLER_PORT:-$(free_port)}
rm -rf "$STATE/controller" "$STATE/identities"
echo "== creating a controller (CA, identity store, admin identity) in $STATE/controller"
(cd "$STATE" && "$BIN" controller init --state-dir controller --address "https://127.0.0.1:$CONTROLLER_PORT" \
    --admin-out identities/admin.json | sed 's/^/   /')
"$BIN" controller run --state-dir "$STATE/controller" --listen "127.0.0.1:$CONTROLLER_PORT" \
    >"$STATE/controller.log" 2>&1 &
PIDS+=($!)
wait_for_port "$CONTROLLER_PORT" "$STATE/controller.log"
echo "== enrolling a device: a one-time token from the admin, a key pair made on the device"
(cd "$STATE" && "$BIN" admin identity create ipad --role device -o ipad.jwt 2>/dev/null \
    && "$BIN" enroll ipad.jwt | sed 's/^/   /' && rm -f ipad.jwt)
(cd "$STATE" && "$BIN" admin identity list | sed 's/^/   /')

echo "== starting the sample backend on http://127.0.0.1:$BACKEND_PORT"
python3 deploy/backend/app.py --host 127.0.0.1 --port "$BACKEND_PORT" >"$STATE/backend.log" 2>&1 &
PIDS+=($!)
wait_for_port "$BACKEND_PORT" "$STATE/backend.log"

echo "== starting ils-gateway serve --mode http on https://127.0.0.1:$GATEWAY_PORT"
"$BIN" serve --mode http --listen "127.0.0.1:$GATEWAY_PORT" \
    --tls-cert "$STATE/server.pem" --tls-key "$STATE/server.key" \
    --backend "http://127.0.0.1:$BACKEND_PORT" >"$STATE/gateway.log" 2>&1 &
PIDS+=($!)
wait_for_port "$GATEWAY_PORT" "$STATE/gateway.log"

echo "== a streamed answer through the gateway (each line is printed as it arrives):"
echo "   curl -N --cacert $STATE/ca.pem 'https://127.0.0.1:$GATEWAY_PORT/claude/stream?prompt=hello&n=6&interval_ms=300'"
curl -sSN --max-time 30 --cacert "$STATE/ca.pem" \
    "https://127.0.0.1:$GATEWAY_PORT/claude/stream?prompt=hello&n=6&interval_ms=300" |
    while IFS= read -r line; do
        line=${line%$'\r'}
        [ -n "$line" ] && printf '   %s  %s\n' "$(date +%T.%3N)" "$line"
    done
echo
echo "== the gateway logged one access line per request:"
grep ' access ' "$STATE/gateway.log" | tail -2 | sed 's/^/   /'
cat <<NEXT

What to try next (while it runs, with --keep-running):
  curl --cacert $STATE/ca.pem https://127.0.0.1:$GATEWAY_PORT/health
  curl -N --cacert $STATE/ca.pem -X POST -H 'content-type: application/json' \\
       -d '{"prompt":"hi","n":5}' https://127.0.0.1:$GATEWAY_PORT/claude/stream
  $BIN serve --help
  (cd $STATE && $BIN admin identity list --json)
  (cd $STATE && $BIN admin audit)
Logs: $STATE/gateway.log, $STATE/backend.log, $STATE/controller.log
NEXT

if [ "$KEEP_RUNNING" = 1 ]; then
    echo "Running until Ctrl-C."
    wait
fi
