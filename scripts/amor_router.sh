#!/usr/bin/env bash
# The fitted entropy router (spec.md §5.6) on the shared byte backbones, in a few minutes: for each backbone, a short
# AMOR run (3 blocks of 4 heads × 64, κ 0.2, STEPS steps of the paper's batches; the gate's EMA momentum is 0.9 instead
# of 0.99 so that its statistics settle within the short run), then `hymix amor-router` (65536 recorded positions per
# block from the training split, 8 epochs) and its held-out report: per-block decision agreement with the exact
# gates at the trained τ, fire rates, R² of Ĥ, bits/byte. Writes docs/amor/router_<backbone>.csv and .txt (the report).
# What the router costs against the exact gate at decode is measured by bench/bench_amor (variant amor_router).
#
# Usage: scripts/amor_router.sh        Environment: SHARED (../shared), BACKBONES ("kjv-mamba2-byte kjv-gdn-byte"),
#   STEPS (30), THREADS (0: all cores), HYMIX (build/release/examples/tool/hymix), RUNS (build/amor_router_runs), DOCS (docs/amor)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/amor_env.sh
source scripts/amor_env.sh
steps=${STEPS:-30} threads=${THREADS:-0}
runs=${RUNS:-build/amor_router_runs} docs=${DOCS:-docs/amor}
mkdir -p "$runs" "$docs"
for bb in $backbones; do
    dir=$runs/$bb
    rm -rf "$dir"
    echo "== $bb: amor-train, $steps steps" >&2
    "$tool" amor-train --model "$shared/models/$bb" --text "$text" --kappa 0.2 --momentum 0.9 --steps "$steps" --warmup 10 --seed 1 \
        --threads "$threads" --log-every 5 --out "$dir" >"$dir.train" 2>&1 || { tail -20 "$dir.train" >&2; exit 1; }
    echo "== $bb: amor-router" >&2
    "$tool" amor-router --model "$shared/models/$bb" --amor "$dir/$(cat "$dir/latest")/amor.safetensors" --text "$text" \
        --threads "$threads" --out "$dir/routers.safetensors" --csv "$docs/router_$bb.csv" >"$docs/router_$bb.txt" 2>"$dir.router" \
        || { tail -20 "$dir.router" >&2; exit 1; }
    cat "$docs/router_$bb.txt" >&2
done
