#!/usr/bin/env bash
# Acceptance run of the `hymix` tool on one shared checkpoint (issue: real checkpoints):
# greedy generation reproduces gen_ids, `hymix logits` matches reference logits (≤ 1e-4), and
# `hymix score` on the held-out KJV reproduces meta.json's bits/byte for windows 512 and 2048 (≤ 2e-4).
#   acceptance.sh TOOL CHECK MODEL_DIR TEXT WORK_DIR [what...]   (what: gen logits score512 score2048; default all)
set -euo pipefail
tool=$1 check=$2 model=$3 text=$4 work=$5
shift 5
what=${*:-gen logits score512 score2048}
if [ ! -f "$model/config.json" ] || [ ! -f "$text" ]; then
    echo "SKIPPED: $model or $text not found (the shared checkpoints and data are needed)"
    exit 77  # reported by ctest as skipped (SKIP_RETURN_CODE)
fi
mkdir -p "$work"
ref="$model/reference.safetensors"
for w in $what; do
    case $w in
    gen)
        "$check" prompt "$ref" 64 "$work/prompt.bin"
        "$tool" generate --model "$model" --prompt-file "$work/prompt.bin" --max-new 48 --temperature 0 >"$work/gen.out"
        "$check" gen "$ref" "$work/gen.out" ;;
    logits)
        "$tool" logits --model "$model" --input "$ref" --output "$work/logits.safetensors"
        "$check" logits "$ref" "$work/logits.safetensors" 1e-4 ;;
    score512 | score2048)
        L=${w#score}
        "$tool" score --model "$model" --text "$text" --offset 4083327 --bytes 131072 --window "$L" --full-windows | tee "$work/score$L.out"
        "$check" score "$model/meta.json" "$L" "$work/score$L.out" 2e-4 ;;
    *) echo "unknown check $w"; exit 2 ;;
    esac
done
