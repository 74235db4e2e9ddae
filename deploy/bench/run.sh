#!/usr/bin/env bash
# One command for the whole benchmark: installs what is missing (nginx, HAProxy, OpenSSH server and client, wrk, socat,
# curl, openssl, libsodium), builds release binaries, runs every path side by side on 127.0.0.1 and writes docs/benchmarks.md.
# Extra arguments go to deploy/bench/run.py (e.g. --size-mib 64 --streams 1000 for a quick look).
set -euo pipefail
cd "$(dirname "$0")/../.."
./deploy/install-deps.sh

need=()
command -v nginx >/dev/null || need+=(nginx-light)
command -v haproxy >/dev/null || need+=(haproxy)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh >/dev/null || need+=(openssh-client)
command -v wrk >/dev/null || need+=(wrk)
command -v socat >/dev/null || need+=(socat)
if ((${#need[@]})); then
    if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
    echo "installing Debian packages: ${need[*]}" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

echo "== building release binaries (the first release build takes several minutes)"
swift build -c release --product ils-gateway -Xswiftc -enforce-exclusivity=unchecked
swift build -c release --product ils-bench -Xswiftc -enforce-exclusivity=unchecked
BIN="$(swift build -c release --show-bin-path)"
exec python3 deploy/bench/run.py --bin "$BIN/ils-gateway" --bench "$BIN/ils-bench" "$@"
