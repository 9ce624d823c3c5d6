#!/usr/bin/env bash
# What storing the projection weights in fewer bits costs and saves (issue 12): scores the three shared checkpoints
# (kjv-mamba2-byte, kjv-gdn-byte, kjv-hybrid-byte) on the held-out KJV with the protocol of shared/models/README.md
# (first 131072 held-out bytes, whole windows of 512 and 2048) with the weights stored as f32, bf16, f16 and i8
# (per-row scales), then times the projection kernel alone (bench/bench_linear.cpp: N = K = 4096, decode M = 1 and 8,
# weights from DRAM) and whole real-size models at decode (bench/bench_model_sizes.cpp, random weights, Qwen3.5-0.8B
# and Mamba-2 780M configs). Writes docs/quantization.csv (bits/byte), docs/quantization_bench.csv and
# docs/quantization_models.csv (Google Benchmark CSVs, peaks measured in the same run) and docs/quantization.md.
# Usage: scripts/quantization.sh     environment: TOOL (build/release/examples/tool/hymix), BENCH_DIR (build/release/bench),
#   MODELS (../shared/models), TEXT (../shared/data/kjv.txt), THREADS (0 = all cores), DOCS (docs), SKIP_MODELS
#   (non-empty: leave out the real-size decode benchmark, which builds 0.8B-parameter models: minutes and 3.2 GB).
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "$0")/common.sh"
cd "$HYMIX_ROOT"
tool=${TOOL:-build/release/examples/tool/hymix} bench_dir=${BENCH_DIR:-build/release/bench}
models=${MODELS:-../shared/models} text=${TEXT:-../shared/data/kjv.txt} threads=${THREADS:-0} docs=${DOCS:-docs}
for f in "$tool" "$bench_dir/bench_linear" "$bench_dir/bench_model_sizes"; do
    [ -x "$f" ] || { echo "quantization: '$f' is not built (cmake --preset release && cmake --build build/release)" >&2; exit 2; }
done
[ -d "$models/kjv-mamba2-byte" ] || { echo "quantization: the shared checkpoints are not in '$models' (set MODELS)" >&2; exit 2; }
[ -f "$text" ] || { echo "quantization: no text '$text' (set TEXT)" >&2; exit 2; }
mkdir -p "$docs"
csv=$docs/quantization.csv tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
if [ -n "${FROM_CSV:-}" ]; then  # only re-write docs/quantization.md from the committed CSVs
    [ -s "$csv" ] && bench_csv_ok "$docs/quantization_bench.csv" || { echo "quantization: FROM_CSV needs $csv and $docs/quantization_bench.csv" >&2; exit 2; }
else
echo "model,weights,window,bits_per_byte,stderr,weight_MB" > "$tmp"
for m in kjv-mamba2-byte kjv-gdn-byte kjv-hybrid-byte; do
    for d in f32 bf16 f16 i8; do
        for w in 512 2048; do
            out=$("$tool" score -m "$models/$m" --text "$text" --offset 4083327 --bytes 131072 --window "$w" --full-windows \
                  --threads "$threads" --weights "$d" 2>&1) || { echo "$out" >&2; echo "quantization: scoring $m ($d, window $w) failed" >&2; exit 1; }
            # "bits/byte 1.714067 ± 0.006168  (255 windows, ...)" and the load line's "(..., 10.9 MB)". Scoring speed
            # is left out: the benchmarks below measure speed.
            line=$(grep -E '^bits/byte [0-9.]+ ± ' <<<"$out" | tail -1)
            bpb=$(awk '{print $2}' <<<"$line") se=$(awk '{print $4}' <<<"$line")
            mb=$(grep -oE '[0-9.]+ MB\)' <<<"$out" | head -1 | awk '{print $1}')
            [ -n "$bpb" ] || { echo "$out" >&2; echo "quantization: no bits/byte line for $m ($d, window $w)" >&2; exit 1; }
            echo "$m,$d,$w,$bpb,$se,${mb:-}" | tee -a "$tmp"
        done
    done
done
mv "$tmp" "$csv"
run_bench_csv "$bench_dir/bench_linear" "$docs/quantization_bench.csv" \
    --benchmark_filter='BM_linear_hymix.*/M:(1|8)/NK:4096/' --benchmark_min_time=0.3 || exit $?
if [ -z "${SKIP_MODELS:-}" ]; then
    run_bench_csv "$bench_dir/bench_model_sizes" "$docs/quantization_models.csv" \
        --benchmark_filter='decode/.*/batch:1/' --benchmark_min_time=2 || exit $?
fi
fi

# ---- docs/quantization.md --------------------------------------------------------------------------------------
# Google Benchmark CSV: counters are read by header name; names look like BM_linear_hymix_i8/M:1/NK:4096/threads:2/...
# and decode/qwen3.5-0.8b/i8/batch:1/context:512/real_time.
# Quoted fields (labels) may hold commas: they become semicolons before the line is split.
bench_rows() {  # prints: name real_time_us GB/s bw_peak_frac tokens/s peak_GB/s
    awk '{ line = ""; q = 0
           for (i = 1; i <= length($0); i++) { c = substr($0, i, 1); if (c == "\"") { q = !q; continue }; if (c == "," && q) c = ";"; line = line c }
           n = split(line, f, ",") }
        f[1] == "name" { for (i = 1; i <= n; i++) col[f[i]] = i; go = 1; next } !go { next }
        { t = f[col["real_time"]]; u = f[col["time_unit"]]; if (u == "ms") t *= 1000; else if (u == "ns") t /= 1000
          print f[1], t, f[col["GB/s"]], f[col["bw_peak_frac"]], f[col["tokens/s"]], f[col["peak_GB/s"]] }' "$1"
}
{
    echo "# Weight storage: what 16 and 8 bits cost in bits/byte and save in time"
    echo
    echo "Written by \`scripts/quantization.sh\` on $(lscpu | sed -n "s/^Model name: *//p" | head -1), $(nproc) cores, THREADS=$threads. Projection weights (mixers, MLPs,"
    echo "embedding, LM head) are stored as \`f32\`, \`bf16\`, \`f16\` or \`i8\` (\`--weights\` of the tool,"
    echo "\`model::store_weights_as\`); norms, convolutions, gates' parameters, states and every sum stay fp32. \`i8\` is"
    echo "symmetric per-row quantization: \`w[n, k] ≈ scale[n] · q[n, k]\`, \`scale[n] = max_k |w[n, k]| / 127\`, q rounded"
    echo "half away from zero (\`q8_view\` in \`include/hymix/core/linear_weight.hpp\`); the kernel sums x · q in fp32 (the"
    echo "integers widened exactly) and multiplies each output by its row's scale once."
    echo
    echo "## Held-out bits/byte of the shared checkpoints"
    echo
    echo "Protocol of \`shared/models/README.md\`: the first 131072 held-out bytes of \`kjv.txt\`, whole windows. Δ is"
    echo "against f32 on the same windows (the standard error is of the mean over windows; Δ between two storages of one"
    echo "model on the same bytes is far more precise than it)."
    echo
    echo "| model | window | f32 | bf16 (Δ) | f16 (Δ) | i8 (Δ) | weights f32 → i8 (MB) |"
    echo "|---|---|---|---|---|---|---|"
    awk -F, 'NR > 1 { b[$1, $2, $3] = $4; mb[$1, $2] = $6; if (!seen[$1, $3]++) order[++n] = $1 SUBSEP $3 }
        END { for (i = 1; i <= n; i++) { split(order[i], k, SUBSEP); m = k[1]; w = k[2]; f = b[m, "f32", w]
              printf "| %s | %s | %.5f |", m, w, f
              for (j = 1; j <= 3; j++) { d = j == 1 ? "bf16" : j == 2 ? "f16" : "i8"; printf " %.5f (%+.5f) |", b[m, d, w], b[m, d, w] - f }
              printf " %s → %s |\n", mb[m, "f32"], mb[m, "i8"] } }' "$csv"
    echo
    echo "## The projection kernel, N = K = 4096, weights read from DRAM"
    echo
    echo "\`bench/bench_linear.cpp\` (weights rotate through a pool far larger than the caches). Time per call, weight bytes"
    echo "per second and the fraction of the DRAM read peak measured in the same run; speed-up against f32 weights."
    echo
    echo "| M (rows) | threads | f32 | bf16 | f16 | i8 | i8 vs f32 | i8 vs bf16 |"
    echo "|---|---|---|---|---|---|---|---|"
    bench_rows "$docs/quantization_bench.csv" | awk '{ split($1, p, "/"); d = p[1]; sub(/BM_linear_hymix_?/, "", d); if (d == "") d = "f32"
            for (i = 2; i <= 4; i++) { split(p[i], kv, ":"); a[kv[1]] = kv[2] }
            key = a["M"] SUBSEP a["threads"]; if (!seen[key]++) order[++n] = key
            t[key, d] = $2; cell[key, d] = sprintf("%.0f µs, %.1f GB/s (%.0f%%)", $2, $3, 100 * $4) }
        END { for (i = 1; i <= n; i++) { split(order[i], k, SUBSEP); key = order[i]
              printf "| %s | %s | %s | %s | %s | %s | %.2f× | %.2f× |\n", k[1], k[2], cell[key, "f32"], cell[key, "bf16"], cell[key, "f16"],
                     cell[key, "i8"], t[key, "f32"] / t[key, "i8"], t[key, "bf16"] / t[key, "i8"] } }'
    if [ -f "$docs/quantization_models.csv" ]; then
        echo
        echo "## Whole models at real size, decode at batch 1 after a 512-token prompt"
        echo
        echo "\`bench/bench_model_sizes.cpp\` (random weights, the configs of \`bench/configs/\`), every core of this machine."
        echo "Tokens/s, parameter bytes read per second and the fraction of the DRAM read peak; speed-up against f32."
        echo
        echo "| model | f32 | bf16 | f16 | i8 | bf16 vs f32 | i8 vs f32 |"
        echo "|---|---|---|---|---|---|---|"
        bench_rows "$docs/quantization_models.csv" | awk '{ split($1, p, "/"); m = p[2]; d = p[3]; if (!seen[m]++) order[++n] = m
                tps[m, d] = $5; cell[m, d] = sprintf("%.1f tok/s, %.1f GB/s (%.0f%%)", $5, $3, 100 * $4) }
            END { for (i = 1; i <= n; i++) { m = order[i]
                  printf "| %s | %s | %s | %s | %s | %.2f× | %.2f× |\n", m, cell[m, "f32"], cell[m, "bf16"], cell[m, "f16"], cell[m, "i8"],
                         tps[m, "bf16"] / tps[m, "f32"], tps[m, "i8"] / tps[m, "f32"] } }'
    fi
} > "$docs/quantization.md"
echo "quantization: wrote $docs/quantization.md"
