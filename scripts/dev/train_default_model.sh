# Trains the embedded default model (models/kjv-tiny-hybrid) on a machine without network: builds the tool against
# Debian packages unpacked from .debs/, measures the step rate, then trains for the number of steps that fits the
# budget. The printed command reproduces the run exactly (deterministic for a thread count).
#   bash scripts/dev/train_default_model.sh KJV_TEXT OUT_DIR [SECONDS]
set -e
text=$1 out=$2 budget=${3:-300}
# shellcheck source=scripts/dev/offline_deps.sh
source "$(dirname "$0")/offline_deps.sh"
cmake --preset release -DHYMIX_BUILD_TESTS=OFF -DHYMIX_BUILD_BENCHMARKS=OFF > /tmp/cfg.log 2>&1 || { tail -20 /tmp/cfg.log; exit 1; }
cmake --build build/release -j"$(nproc)" --target hymix_tool > /tmp/build.log 2>&1 || { grep -E 'error' -A5 /tmp/build.log | head -40; exit 1; }
tool=build/release/examples/tool/hymix
args=(--stack hybrid --d-model 192 --layers 6 --d-ff 320 --linear-heads 3 --attn-heads 3 --attn-kv-heads 1 --head-dim 64
      --batch 16 --seq-len 256 --lr 2e-3 --warmup 50 --schedule cosine --seed 1 --threads "$(nproc)" --log-every 10
      --text "$text")
t0=$(date +%s.%N)
rm -rf /tmp/probe "$out/run"
"$tool" train "${args[@]}" --steps 20 --out /tmp/probe --eval-bytes 2048 >/tmp/probe.log 2>&1 || { tail -5 /tmp/probe.log; exit 1; }
t1=$(date +%s.%N)
steps=$(python3 -c "print(int(($budget - 20) / (($t1 - $t0) / 20.0)) // 50 * 50)")
echo "probe: 20 steps in $(python3 -c "print(round($t1 - $t0, 1))") s -> $steps steps"
echo "command: hymix train ${args[*]} --steps $steps --export-bf16 models/kjv-tiny-hybrid --out runs/kjv-tiny-hybrid"
"$tool" train "${args[@]}" --steps "$steps" --out "$out/run" --export-bf16 "$out/kjv-tiny-hybrid" 2>&1 | tail -5
