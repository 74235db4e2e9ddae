#!/usr/bin/env bash
# Generates the shell completions and the man page from the argument parser, so they always match the binary:
#   deploy/completions/ils-gateway.bash, _ils-gateway (zsh), ils-gateway.fish
#   deploy/man/ils-gateway.1 (and one page per subcommand)
# The completions come from the binary itself (--generate-completion-script); the man pages from
# swift-argument-parser's generate-manual plugin, which builds the package in debug mode (offline: it uses the
# dependencies already resolved). Usage: deploy/generate-docs.sh [OUTPUT-DIR]   (default: deploy)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-deploy}
BIN=${ILS_BIN:-}
if [ -z "$BIN" ]; then
    swift build --product ils-gateway >/dev/null
    BIN="$(swift build --show-bin-path)/ils-gateway"
fi

mkdir -p "$OUT/completions" "$OUT/man"
"$BIN" --generate-completion-script bash >"$OUT/completions/ils-gateway.bash"
"$BIN" --generate-completion-script zsh >"$OUT/completions/_ils-gateway"
"$BIN" --generate-completion-script fish >"$OUT/completions/ils-gateway.fish"
echo "completions: $OUT/completions/{ils-gateway.bash,_ils-gateway,ils-gateway.fish}"

if [ "${SKIP_MAN:-0}" = 1 ]; then
    exit 0
fi
# The page's date: the last commit's, so regenerating an unchanged tree gives the same files.
MAN_DATE=${MAN_DATE:-$(git log -1 --format=%cs 2>/dev/null || date +%F)}
LOG="${TMPDIR:-/tmp}/ils-generate-manual.$$.log"
swift package plugin generate-manual --configuration debug --multi-page --date "$MAN_DATE" >"$LOG" 2>&1 || {
    tail -20 "$LOG" >&2
    exit 1
}
rm -f "$LOG"
PAGES=.build/plugins/GenerateManual/outputs/ils-gateway
[ -f "$PAGES/ils-gateway.1" ] || { echo "generate-manual wrote no page for ils-gateway" >&2; exit 1; }
rm -f "$OUT"/man/ils-gateway*.1
cp "$PAGES"/ils-gateway*.1 "$OUT/man/"
echo "man pages: $(ls "$OUT"/man/*.1 | wc -l) in $OUT/man (man -l $OUT/man/ils-gateway.1)"
