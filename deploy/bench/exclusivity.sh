#!/usr/bin/env bash
# What the shipped builds' `-enforce-exclusivity=unchecked` gains (issue 27, item 5): release binaries built with and
# without it (the second in its own scratch path, .build-checked/, so neither invalidates the other), then
# `run.py --only rps` for each, alternating, ROUNDS times (default 3), so a slow moment of the shared machine lands
# on both. Prints requests/s and CPU µs per request of every path for each build, and the medians' ratio.
# Two cold release builds take about 15 minutes on 2 cores; the runs about 2 minutes each.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds="${ROUNDS:-3}"
flag=(-Xswiftc -enforce-exclusivity=unchecked)
for product in ils-gateway ils-bench; do
    swift build -c release --product "$product" "${flag[@]}"
    swift build -c release --scratch-path .build-checked --product "$product"
done
unchecked="$(swift build -c release --show-bin-path)"
checked="$(swift build -c release --scratch-path .build-checked --show-bin-path)"
out="$(mktemp -d -t ils-exclusivity-XXXXXX)"
for round in $(seq "$rounds"); do
    for variant in unchecked checked; do
        bin="$unchecked"
        [ "$variant" = checked ] && bin="$checked"
        echo "== round $round of $rounds: $variant" >&2
        python3 deploy/bench/run.py --bin "$bin/ils-gateway" --bench "$bin/ils-bench" --only rps \
            --json "$out/$variant-$round.json" --markdown "$out/$variant-$round.md" >&2
    done
done
python3 - "$out" <<'PY'
import json, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
runs = {v: [json.loads(p.read_text()) for p in sorted(out.glob(f"{v}-*.json"))] for v in ("unchecked", "checked")}
paths = [name for name in runs["unchecked"][0]["paths"] if name != "direct"]
print("| path | requests/s unchecked | checked | CPU µs/request unchecked | checked | checked ÷ unchecked (CPU) |")
print("|---|---:|---:|---:|---:|---:|")
for name in paths:
    rps = {v: statistics.median(r["paths"][name]["rps"] for r in rs) for v, rs in runs.items()}
    cpu = {v: statistics.median(r["paths"][name]["rps_cpu"]["cpu_us_per_request"] for r in rs) for v, rs in runs.items()}
    print(f"| {name} | {rps['unchecked']:,.0f} | {rps['checked']:,.0f} | {cpu['unchecked']:.1f} | {cpu['checked']:.1f} "
          f"| {cpu['checked'] / cpu['unchecked']:.3f}× |")
print(f"\nraw runs: {out}")
PY
