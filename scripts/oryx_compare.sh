#!/usr/bin/env bash
# Oryx against single-mixer baselines on a byte-level text (issue 10): trains Oryx-GDN, Oryx-Mamba-2, GDN, Mamba-2 and
# attention stacks of the same width and depth for the same number of steps (= the same tokens), then scores each on
# the held-out bytes with the protocol of shared/models/README.md (offset 4083327, 131072 bytes, full windows of 512
# and 2048) — the Oryx models under every inference schedule. Writes docs/oryx_compare.csv and docs/oryx_compare.md,
# then the mode-switch curves of both Oryx models (examples/oryx_switch.cpp: 128 held-out windows of 256 bytes, switch
# at 128) as docs/oryx_switch_{gdn,mamba2}.csv/.svg.
# Usage: scripts/oryx_compare.sh [TEXT] (default ../shared/data/kjv.txt); environment: STEPS (250), THREADS (1),
# D_MODEL (128), LAYERS (4), D_FF (256), HYMIX (the tool, default build/release/examples/tool/hymix), RUNS (run dirs,
# default build/oryx_compare), NOTE (a sentence added to the report, e.g. what else ran on the machine). Progress goes
# to stderr; the whole run is reproducible from this one command.
set -euo pipefail
cd "$(dirname "$0")/.."
text=${1:-../shared/data/kjv.txt}
tool=${HYMIX:-build/release/examples/tool/hymix}
steps=${STEPS:-250} threads=${THREADS:-1} d=${D_MODEL:-128} layers=${LAYERS:-4} dff=${D_FF:-256}
runs=${RUNS:-build/oryx_compare}
[ -x "$tool" ] || { echo "oryx_compare: build the tool first (cmake --preset release && cmake --build --preset release)" >&2; exit 2; }
[ -f "$text" ] || { echo "oryx_compare: no text file '$text'" >&2; exit 2; }
mkdir -p "$runs" docs
csv=docs/oryx_compare.csv
echo "stack,parameters,steps,tokens,train_seconds,schedule,window,bits_per_byte,stderr" >"$csv"
for st in oryx-gdn oryx-mamba2 gdn mamba2 attention; do
    echo "== $st: training $steps steps" >&2
    rm -rf "${runs:?}/$st"
    "$tool" train --stack "$st" --text "$text" --d-model "$d" --layers "$layers" --head-dim 32 --linear-heads 4 --attn-heads 4 \
        --attn-kv-heads 4 --d-ff "$dff" --d-state 32 --batch 16 --seq-len 256 --steps "$steps" --warmup 30 --lr 2e-3 \
        --eval-bytes 65536 --threads "$threads" --seed 1 --block-size 64 --p-attention 0.5 --out "$runs/$st" 2>"$runs/$st.log" >"$runs/$st.out"
    ck="$runs/$st/$(cat "$runs/$st/latest")"
    params=$("$tool" info -m "$ck" 2>/dev/null | awk '/^parameters/ {print $2}')
    secs=$(sed -n 's/.* in \([0-9.]*\) s: .*/\1/p' "$runs/$st.out" | head -1)
    tokens=$(sed -n 's/.*steps (\([0-9]*\) tokens).*/\1/p' "$runs/$st.out" | head -1)
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
            echo "$st,$params,$steps,$tokens,$secs,$sched,$w,$bpb,$err" >>"$csv"
            echo "   $st $sched window $w: $bpb ± $err bits/byte" >&2
        done
    done
done
{
    echo "# Oryx against single-mixer baselines (scripts/oryx_compare.sh)"
    echo
    echo "Byte-level stacks of d_model $d, $layers layers, d_ff $dff, heads of 32, trained $steps steps of 16 × 256 bytes"
    echo "(equal tokens, seed 1, lr 2e-3) on the first 95% of \`$(basename "$text")\`; held-out bits/byte with the"
    echo "protocol of shared/models/README.md. Oryx: block-random training, blocks of 64, P(attention) 0.5."
    echo "Machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $threads thread(s).${NOTE:+ $NOTE} Raw numbers: [oryx_compare.csv](oryx_compare.csv)."
    echo
    echo "| stack | parameters | train s | schedule | bpb @512 | bpb @2048 |"
    echo "|---|---|---|---|---|---|"
    awk -F, 'NR > 1 { key = $1 "|" $6; if (!(key in seen)) { order[++n] = key; seen[key] = 1; p[key] = $2; s[key] = $5 }
                      v[key, $7] = $8 " ± " $9 }
             END { for (i = 1; i <= n; i++) { split(order[i], a, "|"); k = order[i];
                   printf "| %s | %s | %s | %s | %s | %s |\n", a[1], p[k], s[k], a[2], v[k, 512], v[k, 2048] } }' "$csv"
} >docs/oryx_compare.md
echo "oryx_compare: wrote $csv and docs/oryx_compare.md" >&2
switch=${SWITCH:-build/release/examples/example_oryx_switch}
if [ -x "$switch" ]; then
    for k in gdn mamba2; do
        "$switch" "$runs/oryx-$k/$(cat "$runs/oryx-$k/latest")" "$text" "docs/oryx_switch_$k" 4083327 128 256 128 >&2
    done
else
    echo "oryx_compare: $switch not built (cmake --build --preset release --target example_oryx_switch): no switch curves" >&2
fi
