#!/usr/bin/env bash
# The main job: run the `hymix` tool on real text — the King James Version printed by Debian's bible-kjv —
# with a pretrained checkpoint: model summary, held-out bits/byte, and a streamed greedy continuation.
#   scripts/main-job.sh [BUILD_DIR] [MODEL_DIR]
# The model is MODEL_DIR, else $HYMIX_MODEL, else the embedded default models/kjv-tiny-hybrid (trained by hymix).
set -euo pipefail
# Paths given by the caller are relative to the caller's directory: make them absolute before moving.
abs() { case $1 in /*) printf '%s' "$1" ;; *) printf '%s/%s' "$PWD" "$1" ;; esac; }
build_dir=${1:-}
model=${2:-${HYMIX_MODEL:-}}
[ -n "$build_dir" ] && build_dir=$(abs "$build_dir")
[ -n "$model" ] && model=$(abs "$model")
cd "$(dirname "$0")/.."
build_dir=${build_dir:-$PWD/build/release}
tool="$build_dir/examples/tool/hymix"
[ -x "$tool" ] || { echo "main-job: $tool is not built; run scripts/run.sh" >&2; exit 1; }

# Real text: the KJV from bible-kjv (the same bytes as ../shared/data/kjv.txt; sha256 checked).
text="$build_dir/kjv.txt"
if [ ! -s "$text" ]; then
    command -v bible >/dev/null || { echo "main-job: the 'bible' program is missing: apt-get install bible-kjv" >&2; exit 1; }
    bible "gen1:1-rev22:21" >"$text.part" && mv "$text.part" "$text"
fi
expected=82fa5f3788c6a9a010fb128a0f0bf588984b5888a82058520620eded59b033ea
if [ "$(sha256sum "$text" | cut -d' ' -f1)" != "$expected" ]; then
    echo "main-job: warning: $text differs from the KJV text the shared models were trained on (sha256)" >&2
fi

if [ -z "$model" ]; then
    # The embedded default: a small byte-level hybrid that hymix trained itself (models/kjv-tiny-hybrid/README.md).
    # The shared checkpoints are better: scripts/run.sh ../shared/models/kjv-hybrid-byte
    model=$PWD/models/kjv-tiny-hybrid
fi

echo "== hymix info"
"$tool" info --model "$model"
echo
echo "== hymix score: held-out KJV bytes [4083327, +131072), window 512 (the protocol of shared/models/README.md; models/kjv-tiny-hybrid/README.md gives the default model's figure)"
"$tool" score --model "$model" --text "$text" --offset 4083327 --bytes 131072 --window 512 --full-windows
echo
echo "== hymix generate: greedy continuation of a held-out verse"
"$tool" generate --model "$model" --prompt "$(tail -c +4083328 "$text" | head -c 64)" --max-new 160 --temperature 0
