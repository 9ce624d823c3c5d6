#!/usr/bin/env bash
# The recall benchmark of issue 10 from one command: trains byte-level stacks of one size (default: Oryx-GDN, Gated
# DeltaNet, attention; d_model 128, 2 layers, 4 heads × 32, d_ff 256) on the recall tasks of train/recall.hpp (MQAR
# without filler first, then MQAR with 16 pairs and needles in 256-byte sequences over the KJV training split) for the
# same wall-clock time each, then measures answer accuracy on held-out sequences (MQAR at 64, 256 and 1024 bytes; one
# needle in 1K, 4K and 16K bytes of held-out KJV text) — the Oryx stacks under every schedule of examples/recall.cpp.
# Writes docs/recall.md (settings, machine, table), docs/recall.csv and docs/recall_<oryx stack>.svg (accuracy
# against the fraction of tokens in attention mode). The defaults are those of the committed run: four stacks trained at once,
# one thread each, 14 minutes (about 21 minutes in all on 2 cores, with the evaluation).
# Usage: scripts/recall_bench.sh [TEXT] (default ../shared/data/kjv.txt); environment: MINUTES (14, per stack),
#   STACKS (oryx-gdn,oryx-mamba2,gdn,attention), PARALLEL (4; n > 1 trains up to n stacks at once, 1 one after
#   another), THREADS (1 per stack; 0 = all cores), EXAMPLE (build/release/examples/example_recall), RUNS (run
#   directories, build/recall_runs; a stack done there under the same options is reused, and refused under others:
#   delete its directory to redo it), EXTRA (more key=value options for example_recall; default eval_n=128), DOCS
#   (docs), NOTE (a sentence for the report); paths in the environment are relative to the repository root.
#   Progress goes to stderr and RUNS/<stack>.log.
set -euo pipefail
here=$PWD
cd "$(dirname "$0")/.."
# shellcheck source=scripts/common.sh
source scripts/common.sh
recall_inputs recall_bench "$here" "$@"
minutes=${MINUTES:-14} stacks=${STACKS:-oryx-gdn,oryx-mamba2,gdn,attention} parallel=${PARALLEL:-4} threads=${THREADS:-1}
runs=${RUNS:-build/recall_runs} docs=${DOCS:-docs}
mkdir -p "$runs" "$docs"
# shellcheck disable=SC2206
extra=(${EXTRA-eval_n=128})
args=(minutes="$minutes" threads="$threads" "${extra[@]}")
t0=$(date +%s)
if [ "$parallel" -gt 1 ]; then
    pids=() names=()
    trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT  # a failure stops the other trainers too
    for st in ${stacks//,/ }; do
        while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do sleep 2; done
        echo "recall_bench: $st ($minutes min unless done before under the same options; log $runs/$st.log)" >&2
        "$exe" "$text" "$runs" stacks="$st" "${args[@]}" >>"$runs/$st.out" 2>>"$runs/$st.log" &
        pids+=($!) names+=("$st")
    done
    for i in "${!pids[@]}"; do
        wait "${pids[$i]}" || { echo "recall_bench: ${names[$i]} failed:" >&2; tail -20 "$runs/${names[$i]}.log" >&2; exit 1; }
    done
    trap - EXIT
fi
# One call over every stack: trains those not done yet (one after another), evaluates, gathers the results.
"$exe" "$text" "$runs" stacks="$stacks" "${args[@]}" docs="$docs" >>"$runs/all.out" 2> >(tee -a "$runs/all.log" >&2)
secs=$(( $(date +%s) - t0 ))
{
    echo "# Recall: Oryx against single-mixer stacks (scripts/recall_bench.sh)"
    echo
    echo "Tasks (train/recall.hpp): keys are bytes 0x80–0xBF, values 0xC0–0xFF; a sequence's last 2·Q bytes ask Q keys"
    echo "of its context, each followed by its value, and accuracy is the argmax prediction at each asked key (chance:"
    echo "1/64). Training, in two stages of one run (loss only on the answers): the first 30% of the time on"
    echo "\`mqar:64:16\` (16 pairs back to back, then the 16 queries: no filler), then 256-byte sequences alternating"
    echo "MQAR (16 pairs at the start, KJV training text as filler, 16 queries at the end) and 4 needles at random depths"
    echo "of the KJV training text (4 queries). Evaluation on held-out sequences (the held-out KJV bytes as haystack):"
    echo "\`mqar:T:N:Q\` and \`needle:T:1:1\`, one needle in T bytes (1K, 4K and 16K: beyond the training length)."
    echo "Stacks: ${stacks//,/, }; $minutes minutes of training each${extra[*]:+ (options: ${extra[*]})}; d_model 128, 2 layers,"
    echo "4 heads × 32, d_ff 256 unless the options say otherwise; AdamW lr 3e-3 (100 warmup steps, then constant, per"
    echo "stage), 32 sequences per step; Oryx in block-random mode (blocks of 32, P(attention) 0.5). This describes"
    echo "example_recall's defaults; the options above change them where they name them."
    echo
    echo "Oryx schedules at evaluation, the library's (schedule/mode_schedule.hpp; the context goes in as one prefill"
    echo "call, the query region as a second call in the decode phase): \`all_linear\`, \`all_attention\`,"
    echo "\`queries_attention\` (\`linear_prefill_attention_decode\`: linear over the context, attention on the query"
    echo "tokens), \`query_keys_attention\` (a \`mode_list\`: attention only at the asked keys, the positions whose next"
    echo "byte is scored; the fraction of attention tokens of both is in brackets) and \`random_blocks:f\`"
    echo "(\`block_random\`: each block of 64 tokens in attention mode with probability f, one fixed seed for every"
    echo "stack). Machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores,"
    echo "${parallel} stack(s) at a time, threads=${threads} (0: all).${NOTE:+ $NOTE} Raw numbers:"
    echo "[recall.csv](recall.csv) (training steps and seconds per stack). Accuracy against the attention fraction:"
    for st in ${stacks//,/ }; do
        [ -f "$docs/recall_$st.svg" ] && echo "[$st](recall_$st.svg)"
    done
    echo
    echo
    cat "$docs/recall_table.md"
} >"$docs/recall.md"
rm -f "$docs/recall_table.md"
echo "recall_bench: wrote $docs/recall.md, $docs/recall.csv and the plots in $secs s" >&2
