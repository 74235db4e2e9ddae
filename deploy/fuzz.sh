#!/usr/bin/env bash
# Builds the libFuzzer harness (Tests/Fuzz) with -sanitize=fuzzer,address and runs fuzz targets for a while each.
#
#   deploy/fuzz.sh [--time SECONDS] [--target NAME] [--jobs N]
#
# Every target in Tests/Fuzz/Corpus runs for --time seconds (default 60), --jobs at once (default 1), from a
# scratch copy of its committed seeds (plus Tests/Fuzz/Regressions), so the repository stays clean. Prints runs,
# exec/s, coverage (cov/ft), corpus size and peak RSS per target. Exits 1 on any finding (crash, leak, timeout,
# out-of-memory); the reproducer is kept under Tests/Fuzz/.build-runs/TARGET/findings/ (git-ignored). Replay one:
#   ILS_FUZZ_TARGET=TARGET Tests/Fuzz/.build/debug/ils-fuzz FILE
# A fixed finding goes to Tests/Fuzz/Regressions/TARGET/, where `swift test` (ILSFuzzTests) replays it for good.
set -euo pipefail
cd "$(dirname "$0")/.."

time_per_target=60
only=""
jobs=1
while [ $# -gt 0 ]; do
    case "$1" in
        --time) time_per_target="$2"; shift 2 ;;
        --target) only="$2"; shift 2 ;;
        --jobs) jobs="$2"; shift 2 ;;
        -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "fuzz.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

package=Tests/Fuzz
runs="$package/.build-runs"
rss_limit_mb=2048
timeout_seconds=10

targets=()
for directory in "$package"/Corpus/*/; do
    name="$(basename "$directory")"
    if [ -z "$only" ] || [ "$only" = "$name" ]; then targets+=("$name"); fi
done
if [ ${#targets[@]} -eq 0 ]; then
    echo "fuzz.sh: no target named '$only' (the targets are the directories in $package/Corpus)" >&2
    exit 2
fi

echo "== building the fuzz harness (swift build -Xswiftc -sanitize=fuzzer,address)" >&2
build=(swift build -c debug --package-path "$package" -Xswiftc -sanitize=fuzzer,address)
"${build[@]}" >&2
binary="$("${build[@]}" --show-bin-path)/ils-fuzz"

run_target() {
    local name="$1" work="$runs/$1"
    rm -rf "$work"
    mkdir -p "$work/corpus" "$work/findings"
    cp "$package/Corpus/$name"/* "$work/corpus/"
    if [ -d "$package/Regressions/$name" ]; then cp "$package/Regressions/$name"/* "$work/corpus/" 2>/dev/null || true; fi
    local status=0
    ILS_FUZZ_TARGET="$name" ASAN_OPTIONS="detect_leaks=1:abort_on_error=0" \
        LSAN_OPTIONS="suppressions=$PWD/deploy/sanitizers/lsan-fuzz.supp:print_suppressions=0" "$binary" "$work/corpus" \
        -max_total_time="$time_per_target" -rss_limit_mb="$rss_limit_mb" -timeout="$timeout_seconds" \
        -artifact_prefix="$work/findings/" -print_final_stats=1 >"$work/log" 2>&1 || status=$?
    echo "$status" >"$work/status"
}

summarise() {
    local name="$1" work="$runs/$1" status last
    status="$(cat "$work/status")"
    last="$(grep -E '^#[0-9]+' "$work/log" | tail -1 || true)"
    printf '%-16s status=%s runs=%s exec/s=%s cov=%s ft=%s corpus=%s peak_rss_mb=%s\n' "$name" "$status" \
        "$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log")" \
        "$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/log")" \
        "$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")" \
        "$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")" \
        "$(sed -n 's/.* corp: \([0-9]*\/[0-9a-zA-Z]*\).*/\1/p' <<<"$last")" \
        "$(sed -n 's/^stat::peak_rss_mb: *//p' "$work/log")"
}

echo "== fuzzing ${targets[*]} for ${time_per_target}s each, $jobs at a time" >&2
for name in "${targets[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    run_target "$name" &
done
wait

failed=0
for name in "${targets[@]}"; do
    summarise "$name"
    if [ "$(cat "$runs/$name/status")" != 0 ] || [ -n "$(ls -A "$runs/$name/findings")" ]; then
        failed=1
        echo "FINDING in $name: $(ls "$runs/$name/findings") (log: $runs/$name/log)" >&2
        grep -E '^(==[0-9]+==ERROR|SUMMARY|Fatal error|.*Fatal error)' "$runs/$name/log" | head -5 >&2 || true
    fi
done
exit "$failed"
