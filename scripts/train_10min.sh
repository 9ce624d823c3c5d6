#!/usr/bin/env bash
# Ten minutes of training from scratch on this machine (issue 8): a Mamba-2 stack and a GDN/attention hybrid, each
# shaped like the shared checkpoint of its family (kjv-mamba2-byte: 6 x Mamba-2, d_model 256, 2.72M parameters;
# kjv-hybrid-byte: [GDN, GDN, attention] x 2, 4.35M), trained with `hymix train --minutes` on the first 95% of the
# KJV and scored on the held-out bytes with the protocol of shared/models/README.md (131072 bytes, windows of 512).
# The schedule's length (--steps) is set from a 6-step probe of each stack's speed so that the cosine decay ends near
# the time limit. Writes docs/training_10min/<stack>/{loss.csv,loss.svg,train.log}, docs/training_10min.csv (one row
# per stack) and docs/training_10min.md (the table beside the shared checkpoints' published numbers).
# Usage: scripts/train_10min.sh     environment: TOOL (build/release/examples/tool/hymix), TEXT (../shared/data/kjv.txt), MINUTES (10),
#   THREADS (0 = all cores), STACKS ("mamba2 hybrid"), DOCS (docs), WORK (a temporary folder for the run folders),
#   FROM_CSV (non-empty: only re-write docs/training_10min.md from docs/training_10min.csv).
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "$0")/common.sh"
cd "$HYMIX_ROOT"
tool=${TOOL:-build/release/examples/tool/hymix} text=${TEXT:-../shared/data/kjv.txt} minutes=${MINUTES:-10}
threads=${THREADS:-0} stacks=${STACKS:-"mamba2 hybrid"} docs=${DOCS:-docs}
if [ -z "${FROM_CSV:-}" ]; then
    [ -x "$tool" ] || { echo "train_10min: '$tool' is not built (cmake --preset release && cmake --build build/release)" >&2; exit 2; }
    [ -f "$text" ] || { echo "train_10min: no text '$text' (set TEXT)" >&2; exit 2; }
fi
work=${WORK:-$(mktemp -d)}
mkdir -p "$work" "$docs/training_10min"
batch=8 seq=512  # 4096 bytes a step: small steps suit a budget of minutes on 2 cores

# Published held-out bits/byte (window 512) of the shared checkpoints, shared/models/README.md.
declare -A shared_name=([mamba2]=kjv-mamba2-byte [hybrid]=kjv-hybrid-byte)
declare -A shared_bpb=([mamba2]=1.71393 [hybrid]=1.58450)

field() {  # field NAME LINE: the number after NAME in the tool's closing line
    sed -n "s|.*$1 \([0-9.eE+-]*\).*|\1|p" <<< "$2" | head -n1
}

csv=$docs/training_10min.csv
if [ -n "${FROM_CSV:-}" ]; then  # only re-write docs/training_10min.md from the committed CSV
    [ -s "$csv" ] || { echo "train_10min: FROM_CSV needs $csv" >&2; exit 2; }
else
echo "stack,parameters,threads,minutes,steps_planned,steps,tokens,seconds,tokens_per_s,final_train_loss_nats,heldout_bits_per_byte,shared_checkpoint,shared_heldout_bits_per_byte" > "$csv.tmp"
for s in $stacks; do
    [ -n "${shared_name[$s]:-}" ] || { echo "train_10min: unknown stack '$s' (mamba2 or hybrid)" >&2; exit 2; }
    common=(--stack "$s" --text "$text" --threads "$threads" --batch $batch --seq-len $seq --seed 0 --lr 0.002
            --warmup 30 --schedule cosine --eval-every 0)
    # Probe: steps 4-6 give the speed (the first steps are slow: pages fault in), so the planned steps end near the limit.
    rm -rf "$work/probe-$s"
    "$tool" train "${common[@]}" --steps 1000 --stop-after 6 --log-every 3 --out "$work/probe-$s" > "$work/probe-$s.log" 2>&1 \
        || { echo "train_10min: the probe of '$s' failed (see $work/probe-$s.log)" >&2; exit 1; }
    tps=$(awk -F, 'NR > 1 && $1 == 3 { t = $2; x = $7 } NR > 1 && $1 == 6 && $7 > x { printf "%.0f", ($2 - t) / ($7 - x) }' "$work/probe-$s/loss.csv")
    [ -n "$tps" ] || { echo "train_10min: the probe of '$s' wrote no speed (see $work/probe-$s.log)" >&2; exit 1; }
    steps=$(awk -v t="$tps" -v m="$minutes" -v b=$((batch * seq)) 'BEGIN { n = int(0.85 * t * 60 * m / b); print (n < 40 ? 40 : n) }')
    echo "== $s: probe $tps tokens/s -> $steps steps in $minutes minutes"
    rm -rf "$work/$s"
    "$tool" train "${common[@]}" --steps "$steps" --log-every 10 --minutes "$minutes" --out "$work/$s" 2>&1 | tr '\r' '\n' | tee "$work/$s.log" | grep -v '^step' || true
    head=$(grep -m1 '^train:' "$work/$s.log" || true) last=$(grep -m1 '^trained ' "$work/$s.log" || true)
    [ -n "$last" ] || { echo "train_10min: the run of '$s' did not finish (see $work/$s.log)" >&2; exit 1; }
    params=$(sed -n 's/.*, \([0-9]*\) parameters.*/\1/p' <<< "$head")
    n=$(field trained "$last") tokens=$(sed -n 's/.*steps (\([0-9]*\) tokens).*/\1/p' <<< "$last")
    secs=$(sed -n 's/.*) in \([0-9.]*\) s.*/\1/p' <<< "$last") rate=$(sed -n 's/.*: \([0-9.]*\) tokens\/s.*/\1/p' <<< "$last")
    loss=$(field "final train loss" "$last") bpb=$(field "held-out bits/byte" "$last")
    nthreads=$(sed -n 's/.* \([0-9]*\) threads$/\1/p' <<< "$head")
    echo "$s,$params,$nthreads,$minutes,$steps,$n,$tokens,$secs,$rate,$loss,$bpb,${shared_name[$s]},${shared_bpb[$s]}" >> "$csv.tmp"
    mkdir -p "$docs/training_10min/$s"
    cp "$work/$s/loss.csv" "$work/$s/loss.svg" "$docs/training_10min/$s/"
    grep -v '^step' "$work/$s.log" | sed "s|$work/||g" > "$docs/training_10min/$s/train.log"  # paths relative to the run folders
done
mv "$csv.tmp" "$csv"
fi

cpu=$(cpu_name)
{
    echo "# Ten minutes of training on this machine"
    echo
    echo "\`scripts/train_10min.sh\` ($(date -u +%Y-%m-%d), $cpu, $(nproc) cores): each stack trains from scratch for up"
    echo "to $minutes minutes with \`hymix train\` (batch $batch × $seq bytes, AdamW lr 0.002, 30 warmup steps, cosine decay to 10%"
    echo "over the steps that a probe of the stack's speed says fit in 85% of the time, so the runs end a little early) on"
    echo "the first 95% of the KJV; held-out bits/byte uses"
    echo "the protocol of shared/models/README.md (131072 held-out bytes, windows of 512). The shared checkpoints' numbers are"
    echo "their published ones (PyTorch, 140 s on one GPU, batch 32 × 512)."
    echo
    echo "| stack | parameters | steps | tokens | seconds | tokens/s | held-out bits/byte | shared checkpoint | its bits/byte |"
    echo "|---|---|---|---|---|---|---|---|---|"
    awk -F, 'NR > 1 { printf "| %s | %s | %s | %s | %s | %.0f | %s | %s | %s |\n", $1, $2, $6, $7, $8, $9, $11, $12, $13 }' "$csv"
    echo
    for s in $stacks; do echo "- $s: [loss.csv](training_10min/$s/loss.csv), ![loss curve](training_10min/$s/loss.svg)"; done
} > "$docs/training_10min.md"
echo "wrote $csv and $docs/training_10min.md"
