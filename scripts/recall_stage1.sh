#!/usr/bin/env bash
# Whether the recall training's first stage (examples/recall.cpp: MQAR with 16 pairs in 64 bytes) leaves its loss
# plateau, over seeds and learning rates, from one command. Each (stack, learning rate, seed) runs the first STEPS steps
# of stage 1 of scripts/recall_seeds.sh's 1024-byte runs (the same options except lr, and the same data stream per
# seed: identical logged losses where the runs overlap; one thread), limited by steps instead of minutes so that runs
# are comparable whatever the machine's load, and stops when stage 1 ends. The plateau is the
# answer loss of a uniform guess among the 64 values, ln 64 = 4.159 nats; a run has left it at the first logged step
# (every 25) whose loss is below 4.0.
# Usage: scripts/recall_stage1.sh [TEXT] (default ../shared/data/kjv.txt); environment: SEEDS (1,2,3,4,5,6), LRS
#   (3e-3,1e-3), STACKS (oryx-gdn,oryx-mamba2), STEPS (stage 1's steps: 3179, Oryx-GDN seed 3's stage 1 in the runs
#   behind docs/recall_train1024/, the shortest), PARALLEL (1), EXAMPLE (build/release/examples/example_recall),
#   RUNS (build/recall_stage1), DOCS (docs/recall_stage1). Writes DOCS/stage1.csv (stack, lr, seed, steps, the step
#   it left the plateau or empty, the last logged loss, seconds) and DOCS/stage1.md; a run finished before
#   (RUNS/<stack>_lr<lr>_seed<seed>/stage1.done) is reused. Progress on stderr.
set -euo pipefail
here=$PWD
cd "$(dirname "$0")/.."
# shellcheck source=scripts/common.sh
source scripts/common.sh
recall_inputs recall_stage1 "$here" "$@"
seeds=${SEEDS:-1,2,3,4,5,6} lrs=${LRS:-3e-3,1e-3} stacks=${STACKS:-oryx-gdn,oryx-mamba2} steps=${STEPS:-3179}
parallel=${PARALLEL:-1} runs=${RUNS:-build/recall_stage1} docs=${DOCS:-docs/recall_stage1}
mkdir -p "$runs" "$docs"
one() {  # one STACK LR SEED: stage 1 only (warm_fraction 0.5 of 2·STEPS steps, no time limit), then stops the run
    local d="$runs/$1_lr$2_seed$3" t0 pid
    [ -f "$d/stage1.done" ] && return 0
    rm -rf "$d"
    mkdir -p "$d"
    t0=$(date +%s)
    "$exe" "$text" "$d" stacks="$1" lr="$2" seed="$3" threads=1 minutes=0 steps=$((2 * steps)) warm_fraction=0.5 \
        eval_n=128 seq_len=1024 batch=8 train_tasks=mqar:1024:32,needle:1024:4 >"$d/out" 2>"$d/log" &
    pid=$!
    while kill -0 "$pid" 2>/dev/null && ! grep -qs "stage 1 done" "$d/log"; do sleep 2; done
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    grep -q "stage 1 done" "$d/log" || { echo "recall_stage1: $d did not finish stage 1:" >&2; tail -5 "$d/log" >&2; return 1; }
    echo "$(( $(date +%s) - t0 ))" >"$d/stage1.done"
    echo "recall_stage1: $1 lr $2 seed $3: $(grep 'stage 1 done' "$d/log")" >&2
}
for st in ${stacks//,/ }; do
    for lr in ${lrs//,/ }; do
        for seed in ${seeds//,/ }; do
            while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do wait -n || exit 1; done
            one "$st" "$lr" "$seed" &
        done
    done
done
while [ "$(jobs -rp | wc -l)" -gt 0 ]; do wait -n || exit 1; done
csv=$docs/stage1.csv
echo "stack,lr,seed,steps,left_plateau_at,last_loss,seconds" >"$csv"
for st in ${stacks//,/ }; do
    for lr in ${lrs//,/ }; do
        for seed in ${seeds//,/ }; do
            d="$runs/${st}_lr${lr}_seed$seed"
            awk -F, -v st="$st" -v lr="$lr" -v seed="$seed" -v secs="$(cat "$d/stage1.done")" '
                NR > 1 { last = $3; n = $1; if (left == "" && $3 < 4.0) left = $1 }
                END { printf "%s,%s,%s,%s,%s,%s,%s\n", st, lr, seed, n, left, last, secs }' "$d/$st/stage1/loss.csv"
        done
    done
done >>"$csv"
awk -F, -v seeds="$seeds" -v steps="$steps" '
    NR == 1 { next }
    { key = $1 " | " $2; if (!(key in seen)) { seen[key] = 1; keys[++nk] = key }
      cell[key, $3] = ($5 == "" ? "stayed (" $6 ")" : "left at " $5 " (" $6 ")"); if ($5 != "") ok[key]++; n[key]++ }
    END {
        ns = split(seeds, sd, ",")
        print "# Recall training, stage 1: leaving the ln 64 plateau (scripts/recall_stage1.sh)\n"
        print "Stage 1 of the 1024-byte recall runs (docs/recall_train1024/: MQAR, 16 pairs in 64 bytes, batch 8, one thread),"
        print steps " steps per run, by stack, learning rate and seed. Each cell: the first logged step (every 25) with an"
        print "answer loss below 4.0 nats (ln 64 = 4.159 is a uniform guess among the 64 values), and the loss at the last"
        print "logged step. Raw: [stage1.csv](stage1.csv).\n"
        printf "| stack | lr |"; for (s = 1; s <= ns; s++) printf " seed %s |", sd[s]; print " left the plateau |"
        printf "|---|---|"; for (s = 1; s <= ns; s++) printf "---|"; print "---|"
        for (k = 1; k <= nk; k++) {
            printf "| %s |", keys[k]; for (s = 1; s <= ns; s++) printf " %s |", cell[keys[k], sd[s]]
            printf " %d of %d |\n", ok[keys[k]], n[keys[k]]
        }
    }' "$csv" >"$docs/stage1.md"
echo "recall_stage1: wrote $csv and $docs/stage1.md" >&2
