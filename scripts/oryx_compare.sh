#!/usr/bin/env bash
# Oryx against single-mixer baselines on a byte-level text (issue 10): trains Oryx-GDN, Oryx-Mamba-2, GDN, Mamba-2 and
# attention stacks, then scores each on the held-out bytes with the protocol of shared/models/README.md (offset
# 4083327, 131072 bytes, full windows of 512 and 2048) — the Oryx models under every inference schedule.
#   - Default (equal tokens): the same width and depth, the same number of steps. Writes docs/oryx_compare.csv and
#     docs/oryx_compare.md, then the mode-switch curves of both Oryx models (examples/oryx_switch.cpp: 128 held-out
#     windows of 256 bytes, switch at 128) as docs/oryx_switch_{gdn,mamba2}.csv/.svg.
#   - BUDGET=equal (equal parameters, equal time): each stack trains for MINUTES of wall-clock time (constant learning
#     rate after warmup), all PARALLEL at once, with sizes matched to Oryx-GDN's parameter count at the default width
#     and depth (GDN d_ff 299, attention d_ff 305, Mamba-2 7 layers: each within 4% of Oryx-GDN). Writes
#     docs/oryx_equal_budget.csv and .md (no switch curves).
# Usage: scripts/oryx_compare.sh [TEXT] (default ../shared/data/kjv.txt); environment: STEPS (250), THREADS (1, per
# stack), D_MODEL (128), LAYERS (4), D_FF (256), SEQ_LEN (256), BUDGET (tokens | equal), MINUTES (10, with equal),
# PARALLEL (5, with equal), HYMIX (the tool, default build/release/examples/tool/hymix), NAME (the report's file
# name under docs/, default oryx_compare or oryx_equal_budget; with NAME no switch curves are written), RUNS (run dirs, default build/NAME), NOTE (a sentence
# added to the report, e.g. what else ran on the machine), REUSE (1: keep a stack already trained in RUNS with the same
# command, e.g. to score again after an interrupted call; the tool binary is not compared: after rebuilding it, train
# again; default 0 trains every stack again). Progress goes to stderr; the whole run is reproducible from this one command.
set -euo pipefail
cd "$(dirname "$0")/.."
text=${1:-../shared/data/kjv.txt}
tool=${HYMIX:-build/release/examples/tool/hymix}
steps=${STEPS:-250} threads=${THREADS:-1} d=${D_MODEL:-128} layers=${LAYERS:-4} dff=${D_FF:-256} seq=${SEQ_LEN:-256}
budget=${BUDGET:-tokens} minutes=${MINUTES:-10} parallel=${PARALLEL:-5}
case $budget in
    tokens) name=${NAME:-oryx_compare} ;;
    equal)
        name=${NAME:-oryx_equal_budget}
        if [ "$d" != 128 ] || [ "$layers" != 4 ] || [ "$dff" != 256 ]; then
            echo "oryx_compare: BUDGET=equal matches parameter counts for D_MODEL 128, LAYERS 4, D_FF 256 only" >&2
            exit 2
        fi ;;
    *) echo "oryx_compare: BUDGET must be tokens or equal, found '$budget'" >&2; exit 2 ;;
esac
case ${REUSE:-0} in 0 | 1) ;; *) echo "oryx_compare: REUSE must be 0 or 1, found '$REUSE'" >&2; exit 2 ;; esac
case $name in *[!A-Za-z0-9_-]* | '') echo "oryx_compare: NAME must be letters, digits, _ and -, found '$name'" >&2; exit 2 ;; esac
runs=${RUNS:-build/$name}
[ -x "$tool" ] || { echo "oryx_compare: build the tool first (cmake --preset release && cmake --build --preset release)" >&2; exit 2; }
[ -f "$text" ] || { echo "oryx_compare: no text file '$text'" >&2; exit 2; }
mkdir -p "$runs" docs
csv=docs/$name.csv
stacks=(oryx-gdn oryx-mamba2 gdn mamba2 attention)

# The training command of stack $1 (its size for the budget, the run length).
train_args() {
    local st=$1 l=$layers f=$dff
    if [ "$budget" = equal ]; then
        case $st in gdn) f=299 ;; attention) f=305 ;; mamba2) l=7 ;; esac
    fi
    local a=(train --stack "$st" --text "$text" --d-model "$d" --layers "$l" --head-dim 32 --linear-heads 4 --attn-heads 4
        --attn-kv-heads 4 --d-ff "$f" --d-state 32 --batch 16 --seq-len "$seq" --warmup 30 --lr 2e-3 --eval-bytes 65536
        --threads "$threads" --seed 1 --block-size 64 --p-attention 0.5 --out "$runs/$st")
    if [ "$budget" = equal ]; then a+=(--minutes "$minutes" --steps 1000000000 --schedule constant); else a+=(--steps "$steps"); fi
    printf '%s\n' "${a[@]}"
}

train_one() {
    local st=$1
    mapfile -t args < <(train_args "$st")
    if [ "${REUSE:-0}" = 1 ] && [ -f "$runs/$st/latest" ] && grep -q '^trained ' "$runs/$st.out" 2>/dev/null \
        && [ "$(printf '%s\n' "${args[@]}")" = "$(cat "$runs/$st.args" 2>/dev/null)" ]; then
        echo "   (REUSE=1: keeping $runs/$st, trained with the same command)" >&2
        return 0
    fi
    rm -rf "${runs:?}/$st" "$runs/$st.args"
    "$tool" "${args[@]}" 2>"$runs/$st.log" >"$runs/$st.out" || return
    printf '%s\n' "${args[@]}" >"$runs/$st.args"
}

if [ "$budget" = equal ]; then
    echo "== training ${stacks[*]}: $minutes min each, $parallel at once, $threads thread(s) each" >&2
    pids=()
    for st in "${stacks[@]}"; do
        while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do sleep 2; done
        train_one "$st" &
        pids+=($!)
    done
    for i in "${!pids[@]}"; do
        wait "${pids[$i]}" || { echo "oryx_compare: training ${stacks[$i]} failed:" >&2; tail -20 "$runs/${stacks[$i]}.log" >&2; exit 1; }
    done
fi
echo "stack,parameters,steps,tokens,train_seconds,schedule,window,bits_per_byte,stderr" >"$csv"
for st in "${stacks[@]}"; do
    if [ "$budget" = tokens ]; then
        echo "== $st: training $steps steps" >&2
        train_one "$st" || { echo "oryx_compare: training $st failed:" >&2; tail -20 "$runs/$st.log" >&2; exit 1; }
    fi
    ck="$runs/$st/$(cat "$runs/$st/latest")"
    params=$("$tool" info -m "$ck" 2>/dev/null | awk '/^parameters/ {print $2}')
    secs=$(sed -n 's/.* in \([0-9.]*\) s: .*/\1/p' "$runs/$st.out" | head -1)
    tokens=$(sed -n 's/.*steps (\([0-9]*\) tokens).*/\1/p' "$runs/$st.out" | head -1)
    done_steps=$(sed -n 's/^trained \([0-9]*\) steps.*/\1/p' "$runs/$st.out" | head -1)
    scheds=(default)
    case $st in oryx-*) scheds=(all_attention all_linear periodic:4:64 linear_prefill_attention_decode) ;; esac
    for sched in "${scheds[@]}"; do
        for w in 512 2048; do
            args=(score -m "$ck" --text "$text" --offset 4083327 --bytes 131072 --window "$w" --full-windows --threads "$threads")
            [ "$sched" = default ] || args+=(--schedule "$sched")
            if ! "$tool" "${args[@]}" >"$runs/score.out" 2>&1; then
                echo "oryx_compare: hymix ${args[*]} failed:" >&2
                cat "$runs/score.out" >&2
                exit 1
            fi
            line=$(grep -E "^bits/byte" "$runs/score.out" | tail -1)
            bpb=$(echo "$line" | awk '{print $2}')
            err=$(echo "$line" | awk '{print $4}')
            echo "$st,$params,$done_steps,$tokens,$secs,$sched,$w,$bpb,$err" >>"$csv"
            echo "   $st $sched window $w: $bpb ± $err bits/byte" >&2
        done
    done
done
{
    echo "# Oryx against single-mixer baselines (scripts/oryx_compare.sh)"
    echo
    if [ "$budget" = equal ]; then
        echo "Equal parameters and equal time (BUDGET=equal): byte-level stacks of d_model $d, heads of 32, 4 layers and d_ff"
        echo "256 for the Oryx stacks, d_ff 299 for GDN and 305 for attention, 7 layers for Mamba-2 (no MLP), so that every"
        echo "count is within 4% of Oryx-GDN's; each trained for $minutes minutes ($parallel at once, $threads thread(s) each) on"
        echo "batches of 16 × $seq bytes (seed 1, lr 2e-3 after 30 warmup steps, then constant) from the first 95% of"
    else
        echo "Byte-level stacks of d_model $d, $layers layers, d_ff $dff, heads of 32, trained $steps steps of 16 × $seq bytes"
        echo "(equal tokens, seed 1, lr 2e-3) on the first 95% of"
    fi
    echo "\`$(basename "$text")\`; held-out bits/byte with the protocol of shared/models/README.md. Oryx: block-random"
    echo "training, blocks of 64, P(attention) 0.5. Machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores.${NOTE:+ $NOTE}"
    echo "Raw numbers: [$name.csv]($name.csv)."
    echo
    echo "| stack | parameters | steps | train s | schedule | bpb @512 | bpb @2048 |"
    echo "|---|---|---|---|---|---|---|"
    awk -F, 'NR > 1 { key = $1 "|" $6; if (!(key in seen)) { order[++n] = key; seen[key] = 1; p[key] = $2; st[key] = $3; s[key] = $5 }
                      v[key, $7] = $8 " ± " $9 }
             END { for (i = 1; i <= n; i++) { split(order[i], a, "|"); k = order[i];
                   printf "| %s | %s | %s | %s | %s | %s | %s |\n", a[1], p[k], st[k], s[k], a[2], v[k, 512], v[k, 2048] } }' "$csv"
} >"docs/$name.md"
echo "oryx_compare: wrote $csv and docs/$name.md" >&2
[ "$budget" = tokens ] && [ -z "${NAME:-}" ] || exit 0  # the switch curves belong to the default report only
switch=${SWITCH:-build/release/examples/example_oryx_switch}
if [ -x "$switch" ]; then
    for k in gdn mamba2; do
        "$switch" "$runs/oryx-$k/$(cat "$runs/oryx-$k/latest")" "$text" "docs/oryx_switch_$k" 4083327 128 256 128 >&2
    done
else
    echo "oryx_compare: $switch not built (cmake --build --preset release --target example_oryx_switch): no switch curves" >&2
fi
