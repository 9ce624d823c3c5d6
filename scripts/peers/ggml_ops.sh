#!/usr/bin/env bash
# Times ggml's CPU ops on the shapes of the README's "Performance against llama.cpp's CPU ops" table (issue 12), with
# ggml's own harness (`test-backend-ops perf`), so that hymix's benchmarks and ggml's can run in one session, on the
# same cores, one after the other.
#
# Usage: scripts/peers/ggml_ops.sh GGML_SRC [WORK_DIR]
#   GGML_SRC: a checkout of https://github.com/ggml-org/ggml (the table used commit d99724f2); it is copied, never
#   modified. WORK_DIR (default /tmp/ggml-peer) receives the copy and its build. The copy's perf list is replaced by the
#   cases below, the harness is built for this CPU (GGML_NATIVE) and run on the CPU backend with one thread per core
#   (ggml's default). Prints the harness's lines for these cases, then (unless HYMIX_BENCH is empty) runs the same rows
#   of hymix's benchmarks from HYMIX_BENCH (default build/release/bench), medians of REPS (3) repetitions, so both
#   sides come from one session on the same cores. ROUNDS (2) alternates the two that many times: shared machines are
#   noisy, so compare the best round of each side (and repeat the script where rounds disagree).
#
# The cases (all fp32 unless said):
#   SSM_SCAN   d_state 128, head_dim 64, 24 heads, 1 group: 512 tokens × 1 sequence; 1 token × 1, 4 and 8 sequences
#   SSM_CONV   1792 channels, kernel 4: 512 tokens, and 1 token (the decode step)
#   GATED_DELTA_NET  16 heads of 128: 512 tokens, and 1 token
#   FLASH_ATTN_EXT   head_dim 128, 8 KV heads × 4 (32 query heads): 512 queries over 8192 keys (f32 and f16 K/V),
#                    1 query over 32768 keys (f32 and f16 K/V)
set -euo pipefail
src=${1:?usage: scripts/peers/ggml_ops.sh GGML_SRC [WORK_DIR]}
work=${2:-/tmp/ggml-peer}
[ -f "$src/tests/test-backend-ops.cpp" ] || { echo "ggml_ops: $src is not a ggml checkout (no tests/test-backend-ops.cpp)" >&2; exit 2; }
mkdir -p "$work"
src=$(cd "$src" && pwd) work=$(cd "$work" && pwd)
cd "$(dirname "$0")/../.."  # HYMIX_BENCH is relative to the repository
rm -rf "$work/src"
cp -r "$src" "$work/src"
( cd "$work/src" && git log -1 --format='ggml commit %h (%cd)' 2>/dev/null ) || echo "ggml: not a git checkout"
python3 - "$work/src/tests/test-backend-ops.cpp" <<'PY'
import sys
path = sys.argv[1]
text = open(path).read()
head = "static std::vector<std::unique_ptr<test_case>> make_test_cases_perf() {\n    std::vector<std::unique_ptr<test_case>> test_cases;\n"
if head not in text:
    sys.exit("ggml_ops: make_test_cases_perf() not found where expected; this ggml revision needs the script updated")
cases = """
    // hymix's comparison cases (scripts/peers/ggml_ops.sh): these replace ggml's own perf list.
    test_cases.emplace_back(new test_ssm_scan(GGML_TYPE_F32, 128, 64, 24, 1, 512, 1));
    for (int64_t seqs : {1, 4, 8}) test_cases.emplace_back(new test_ssm_scan(GGML_TYPE_F32, 128, 64, 24, 1, 1, seqs));
    test_cases.emplace_back(new test_ssm_conv(GGML_TYPE_F32, {3 + 512, 1792, 1, 1}, {4, 1792, 1, 1}));
    test_cases.emplace_back(new test_ssm_conv(GGML_TYPE_F32, {3 + 1, 1792, 1, 1}, {4, 1792, 1, 1}));
    test_cases.emplace_back(new test_gated_delta_net(GGML_TYPE_F32, 16, 128, 512, 1));
    test_cases.emplace_back(new test_gated_delta_net(GGML_TYPE_F32, 16, 128, 1, 1));
    for (ggml_type kv : {GGML_TYPE_F32, GGML_TYPE_F16}) {
        test_cases.emplace_back(new test_flash_attn_ext(128, 128, 8, {4, 1}, 8192, 512, true, false, 0, 0, GGML_PREC_F32, kv, kv));
        test_cases.emplace_back(new test_flash_attn_ext(128, 128, 8, {4, 1}, 32768, 1, true, false, 0, 0, GGML_PREC_F32, kv, kv));
    }
    return test_cases;
"""
open(path, "w").write(text.replace(head, head + cases, 1))
PY
cmake -S "$work/src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_BUILD_TESTS=ON \
    -DGGML_BUILD_EXAMPLES=OFF >"$work/cmake.log" 2>&1 || { tail -20 "$work/cmake.log"; exit 1; }
cmake --build "$work/build" -j"$(nproc)" --target test-backend-ops >"$work/build.log" 2>&1 || { grep -E 'error' -A5 "$work/build.log" | head -40; exit 1; }
lscpu | grep -E 'Model name|^CPU\(s\)' || true
bench=${HYMIX_BENCH-build/release/bench}
reps=(--benchmark_repetitions="${REPS:-3}" --benchmark_report_aggregates_only=true)
hy() {  # hy BINARY FILTER
    [ -x "$bench/$1" ] || { echo "ggml_ops: no $bench/$1 (build the benchmarks: cmake --build --preset release)" >&2; exit 2; }
    "$bench/$1" --benchmark_filter="$2" "${reps[@]}" 2>/dev/null | grep -E '_median' | awk '{ print $1, $2, $3 }' \
        || echo "ggml_ops: no rows from $1 for '$2' (a benchmark renamed?)" >&2
}
for round in $(seq "${ROUNDS:-2}"); do
    echo "== round $round: ggml (test-backend-ops perf, CPU backend, $(nproc) threads)"
    "$work/build/bin/test-backend-ops" perf -b CPU 2>&1 | grep -E 'SSM_|GATED_DELTA|FLASH_ATTN' | sed -E 's/\x1b\[[0-9;]*m//g; s/  +/ /g' \
        || echo "ggml_ops: no rows from test-backend-ops (see $work/build.log)" >&2
    [ -n "$bench" ] || continue
    echo "== round $round: hymix ($bench, medians of ${REPS:-3})"
    hy bench_mamba2 'BM_ssd_chunked_core/T:512/chunk:(64|256)/|BM_ssd_step_core/B:(1|8)/H:24/threads:2'
    hy bench_conv1d_backward 'BM_conv1d_forward/T:(1|512)/threads:(1|2)$'
    hy bench_gated_deltanet 'BM_gdn_chunked_core/T:512/chunk:64/heads:16|BM_gdn_step_core/B:1/heads:16/threads:2'
    hy bench_attention 'BM_attn_prefill_kernel|BM_attn_decode_kernel/H:32/H_kv:8/d_h:128/ctx:32768/B:1'
done
