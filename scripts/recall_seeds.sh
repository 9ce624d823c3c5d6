#!/usr/bin/env bash
# The recall benchmark of scripts/recall_bench.sh over several training seeds, from one command: every (seed, stack)
# trains in its own process (one thread each, up to PARALLEL at once) for the same wall-clock time, is evaluated on the
# same held-out sequences under the same schedules (examples/recall.cpp), and the seeds are gathered into
# docs/recall_seeds.md (mean accuracy and the range over the seeds, per stack, schedule and task) and
# docs/recall_seeds.csv (one row per stack, schedule and task: the attention fraction, each seed's accuracy, mean,
# min and max). A (seed, stack) finished before under the same options is reused, so an interrupted call is resumed
# by running it again (an interrupted training starts over).
# Usage: scripts/recall_seeds.sh [TEXT] (default ../shared/data/kjv.txt); environment: SEEDS (1,2,3), MINUTES (6, per
#   stack), STACKS (oryx-gdn,oryx-mamba2,gdn,attention), PARALLEL (the number of cores), EXAMPLE
#   (build/release/examples/example_recall), RUNS (build/recall_seeds), EXTRA (more key=value options for
#   example_recall, except seed, stacks, threads and minutes, which this script sets; default eval_n=128), DOCS
#   (docs), NOTE (a sentence for the report); paths in the environment are relative to the repository root. Progress
#   goes to stderr and RUNS/seed<N>/<stack>.log; a failed run stops the others and shows the end of its log.
set -euo pipefail
here=$PWD
cd "$(dirname "$0")/.."
# shellcheck source=scripts/common.sh
source scripts/common.sh
recall_inputs recall_seeds "$here" "$@"
seeds=${SEEDS:-1,2,3} minutes=${MINUTES:-6} stacks=${STACKS:-oryx-gdn,oryx-mamba2,gdn,attention}
parallel=${PARALLEL:-$(nproc)} runs=${RUNS:-build/recall_seeds} docs=${DOCS:-docs}
# shellcheck disable=SC2206
extra=(${EXTRA-eval_n=128})
for kv in "${extra[@]}"; do
    case ${kv%%=*} in seed | stacks | threads | minutes)
        echo "recall_seeds: EXTRA may not set '${kv%%=*}' (use SEEDS, STACKS or MINUTES; one thread per run)" >&2; exit 2 ;;
    esac
done
mkdir -p "$runs" "$docs"
t0=$(date +%s)
declare -A logs=()  # pid -> its log, for every run not yet waited for
trap 'kill $(jobs -rp) 2>/dev/null || true' EXIT  # a failure stops the other trainers too
reap() {  # waits for one run to end; exits on a failure, showing the end of its log
    local pid=
    if ! wait -n -p pid; then
        echo "recall_seeds: a run failed (log ${logs[$pid]:-?}):" >&2
        [ -n "${logs[$pid]:-}" ] && tail -20 "${logs[$pid]}" >&2
        exit 1
    fi
    unset "logs[$pid]"
}
for seed in ${seeds//,/ }; do
    mkdir -p "$runs/seed$seed"
    for st in ${stacks//,/ }; do
        while [ "${#logs[@]}" -ge "$parallel" ]; do reap; done
        echo "recall_seeds: seed $seed, $st ($minutes min unless done before; log $runs/seed$seed/$st.log)" >&2
        "$exe" "$text" "$runs/seed$seed" stacks="$st" seed="$seed" minutes="$minutes" threads=1 "${extra[@]}" \
            >>"$runs/seed$seed/$st.out" 2>>"$runs/seed$seed/$st.log" &
        logs[$!]=$runs/seed$seed/$st.log
    done
done
while [ "${#logs[@]}" -gt 0 ]; do reap; done
trap - EXIT
# Each seed's results gathered by one call over its stacks (nothing trains or evaluates again).
for seed in ${seeds//,/ }; do
    "$exe" "$text" "$runs/seed$seed" stacks="$stacks" seed="$seed" minutes="$minutes" threads=1 "${extra[@]}" >"$runs/seed$seed/all.out" 2>>"$runs/seed$seed/all.log"
done
# recall.csv columns: stack,parameters,train_steps,train_seconds,task,schedule,attention_fraction,answers,accuracy,all_correct_fraction
files=()
for seed in ${seeds//,/ }; do files+=("$runs/seed$seed/recall.csv"); done
awk -F, -v seeds="$seeds" -v out_csv="$docs/recall_seeds.csv" -v out_md="$runs/recall_seeds_table.md" '
    FNR == 1 { file++; next }
    {
        key = $1 SUBSEP $6; if (!(key in seen)) { seen[key] = 1; lines[++nl] = key }
        if (!($5 in tseen)) { tseen[$5] = 1; tasks[++nt] = $5 }
        acc[key, $5, file] = $9; frac[key, $5] = $7; steps[$1, file] = $3
    }
    END {
        n = split(seeds, sd, ",")
        printf "stack,schedule,task,attention_fraction" > out_csv
        for (f = 1; f <= n; f++) printf ",accuracy_seed%s", sd[f] > out_csv
        printf ",mean,min,max\n" > out_csv
        printf "| stack | schedule |" > out_md
        for (t = 1; t <= nt; t++) printf " %s |", tasks[t] > out_md
        printf "\n|---|---|" > out_md
        for (t = 1; t <= nt; t++) printf "---|" > out_md
        printf "\n" > out_md
        for (l = 1; l <= nl; l++) {
            split(lines[l], ks, SUBSEP)
            printf "| %s | %s |", ks[1], ks[2] > out_md
            for (t = 1; t <= nt; t++) {
                s = 0; lo = 2; hi = -1; m = 0
                printf "%s,%s,%s,%s", ks[1], ks[2], tasks[t], frac[lines[l], tasks[t]] > out_csv
                for (f = 1; f <= n; f++) {
                    a = acc[lines[l], tasks[t], f]
                    printf ",%s", a > out_csv
                    if (a != "") { s += a; m++; if (a < lo) lo = a; if (a > hi) hi = a }
                }
                if (m == 0) { printf ",,,\n" > out_csv; printf " – |" > out_md; continue }
                printf ",%.4f,%.4f,%.4f\n", s / m, lo, hi > out_csv
                if (ks[2] ~ /^quer/) printf " %.3f (%.3f–%.3f; %.2g%% attention) |", s / m, lo, hi, 100 * frac[lines[l], tasks[t]] > out_md
                else printf " %.3f (%.3f–%.3f) |", s / m, lo, hi > out_md
            }
            printf "\n" > out_md
        }
        printf "\nTraining steps per seed (%s):", seeds > out_md
        for (l = 1; l <= nl; l++) {
            split(lines[l], ks, SUBSEP)
            if (ks[1] in done) continue
            done[ks[1]] = 1
            printf " %s", ks[1] > out_md
            for (f = 1; f <= n; f++) printf "%s%s", (f == 1 ? " " : "/"), steps[ks[1], f] > out_md
            printf ";" > out_md
        }
        printf "\n" > out_md
    }' "${files[@]}"
secs=$(( $(date +%s) - t0 ))
{
    echo "# Recall over training seeds (scripts/recall_seeds.sh)"
    echo
    echo "The tasks, stacks, training and schedules of [recall.md](recall.md) (examples/recall.cpp), trained once per"
    echo "seed (${seeds//,/, }: the weights' initialisation and the training sequences; the evaluation sequences and the"
    echo "random blocks are the same for every seed) for $minutes minutes each${extra[*]:+ (options: ${extra[*]})}, one"
    echo "thread per (seed, stack), $parallel at once. Each cell: mean accuracy over the seeds (lowest–highest)."
    echo "Machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores; this call took $secs s (runs reused from earlier calls not counted).${NOTE:+ $NOTE}"
    echo "Per seed: [recall_seeds.csv](recall_seeds.csv)."
    echo
    cat "$runs/recall_seeds_table.md"
} >"$docs/recall_seeds.md"
echo "recall_seeds: wrote $docs/recall_seeds.md and $docs/recall_seeds.csv in $secs s" >&2
