#!/usr/bin/env bash
# Checks the unit files with `systemd-analyze verify` (and, where systemd supports it, prints the offline
# `systemd-analyze security` exposure score). verify wants ExecStart's binary to exist, so the units are checked
# from a copy whose ExecStart points at ILS_BIN (default: the debug build), a real ils-gateway binary.
# Exit 0 when they pass, 1 when verify complains, 77 (skipped) when systemd-analyze is not installed.
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! command -v systemd-analyze >/dev/null; then
    echo "skipped: systemd-analyze is not installed here" >&2
    exit 77
fi
BIN=${ILS_BIN:-$(swift build --show-bin-path)/ils-gateway}
[ -x "$BIN" ] || { echo "no ils-gateway binary at $BIN; build it first (swift build)" >&2; exit 1; }
BIN=$(realpath "$BIN")   # ExecStart= takes absolute paths only

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
for unit in deploy/systemd/*.service; do
    sed "s#/usr/local/bin/ils-gateway#$BIN#" "$unit" >"$WORK/$(basename "$unit")"
done
# Drop-ins (ils-controller.service.d/: the PostgreSQL store) are checked as part of their unit: verify reads a unit's
# NAME.d/ beside it, so a bad line in a drop-in fails the unit.
for dropins in deploy/systemd/*.service.d; do
    [ -d "$dropins" ] && cp -r "$dropins" "$WORK/"
done

echo "== systemd-analyze verify $(systemd-analyze --version | head -1)"
# verify prints nothing for a clean unit; any line is a finding, so any output fails the check.
OUT=$(cd "$WORK" && SYSTEMD_LOG_LEVEL=notice systemd-analyze verify --man=no ./*.service 2>&1) || {
    echo "$OUT"
    exit 1
}
if [ -n "$OUT" ]; then
    echo "$OUT"
    exit 1
fi
echo "verify: all units clean: $(cd "$WORK" && echo ./*.service)"
DROPINS=$(cd "$WORK" && find . -path './*.service.d/*.conf' | sort | paste -sd ' ' -)
[ -z "$DROPINS" ] || echo "verify: with drop-ins: $DROPINS"

if systemd-analyze security --help 2>/dev/null | grep -q -- '--offline'; then
    for unit in "$WORK"/*.service; do
        echo "== systemd-analyze security --offline=yes $(basename "$unit")"
        systemd-analyze security --offline=yes --no-pager "$unit" 2>&1 | tail -1
    done
fi
