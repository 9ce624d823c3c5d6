# Many-core measurements on the device machine's host CPU (no GPU used), for issues 12 and 10: real-size models from
# bench/configs (random weights) with f32, bf16 and i8 projection weights, Hugging Face transformers on the same
# configs in the same run, and the same benchmarks pinned to 1, 2, 4, 8 and 16 cores with taskset (oneTBB follows the
# mask; HYMIX_BENCH_THREADS is set to the core count too). Builds bench_model_sizes and bench_oryx against Debian
# packages unpacked from .debs/ (the machine has no network), unless .benchbin/ holds ones that run there.
#   PHASE=models bash scripts/dev/device_scaling.sh   hymix at every core: prefill and decode B 1 / B 8, f32 bf16 i8;
#                                                     the small Oryx / GDN / attention layer cases over core counts
#   PHASE=peers  bash scripts/dev/device_scaling.sh   transformers (f32) and hymix f32 on the same configs, one run
#                                                     (Mamba-2's transformers decode after a 16-token prompt too);
#                                                     hymix decode at batch 1 (f32, i8) over core counts
#   PHASE=prefill bash scripts/dev/device_scaling.sh  torch's GEMM rate on each model's own prefill projections
#                                                     (scripts/torch_gemm_rate.py, all cores), then hymix's f32
#                                                     prefill 512 on 16, 1, 2, 4 and 8 cores
#   PHASE=layers bash scripts/dev/device_scaling.sh   Qwen3.5 0.8B's prefill by part on 1 and 16 cores: its gated
#                                                     DeltaNet and attention layers (B 1, T 512), the chunked delta
#                                                     rule alone (16 heads × 128) and its projections (bench_linear's
#                                                     model shapes, M 512)
#   PHASE=profile bash scripts/dev/device_scaling.sh  where the time goes, op by op (HYMIX_OP_PROFILE): prefill 512
#                                                     (f32) and decode B 1 / B 8 (f32, bf16) of both configs on every
#                                                     core, and their prefill on 2 cores, one CSV per benchmark under
#                                                     $OUT/profile_<cores>/; then the attention decode kernel
#                                                     at 32K keys (32 / 8 heads × 128, f32 and bf16 KV) on every core
#   PHASE=ab bash scripts/dev/device_scaling.sh       before/after on every core: builds bench_model_sizes from this
#                                                     tree and from a copy with the files of .ab_old/ laid over it
#                                                     (the earlier versions of the changed headers), then alternates
#                                                     the two for ROUNDS rounds (default 1) on prefill and decode;
#                                                     one op profile of the new build; all in $OUT/ab.tar.gz
#   PHASE=subnormal bash scripts/dev/device_scaling.sh  what subnormal numbers cost: the chunked SSD and gated
#                                                     delta rule alone with random-init or mild decays, subnormals
#                                                     flushed or kept (bench_*_subnormals), on every core and on 2;
#                                                     then whole-model prefill 512 (f32) with HYMIX_FLUSH_SUBNORMALS
#                                                     1 and 0 alternated twice, and an op profile of each
#   PHASE=abbench bash scripts/dev/device_scaling.sh  before/after of one kernel benchmark: builds AB_TARGET (default
#                                                     bench_mamba2) from this tree and from a copy with .ab_old/ laid
#                                                     over it, then runs AB_FILTER on each count of AB_CORES (default
#                                                     1 and every core, pinned with taskset), old and new alternated for ROUNDS
#                                                     rounds (default 2); with AB_MODEL_FILTER, bench_model_sizes
#                                                     too, on every core, in the same rounds; CSVs in $OUT/abbench/
# Results (Google Benchmark CSVs, peaks measured in the same run) land in $OUT, with the two binaries where this call
# built them (models, peers and prefill phases).
set -eo pipefail
: "${OUT:?device_scaling: set OUT to the folder for the results}"
# shellcheck source=scripts/dev/offline_deps.sh
source "$(dirname "$0")/offline_deps.sh"
bin=.benchbin
configure() { cmake --preset release -DHYMIX_BUILD_TESTS=OFF >/tmp/cfg.log 2>&1 || { tail -20 /tmp/cfg.log; exit 1; }; }
build_benches() {  # build_benches TARGET...: configures and builds them, then runs them from build/release/bench
    t0=$(date +%s)
    configure
    cmake --build build/release -j"$(nproc)" --target "$@" >/tmp/build.log 2>&1 \
        || { grep -E 'error' -A5 /tmp/build.log | head -40; exit 1; }
    echo "device_scaling: built in $(( $(date +%s) - t0 )) s"
    bin=build/release/bench
}
if [ "${PHASE:-models}" = layers ]; then  # builds its own three benchmarks below
    configure
elif [ "${PHASE:-models}" = profile ] && ! "$bin/bench_model_sizes" --benchmark_list_tests >/dev/null 2>&1; then
    build_benches bench_model_sizes bench_attention
elif [ "${PHASE:-models}" = subnormal ]; then
    build_benches bench_model_sizes bench_gated_deltanet bench_mamba2
elif [ "${PHASE:-models}" = profile ] || [ "${PHASE:-models}" = ab ] || [ "${PHASE:-models}" = abbench ]; then
    :
elif ! "$bin/bench_oryx" --benchmark_list_tests >/dev/null 2>&1 || ! "$bin/bench_model_sizes" --benchmark_list_tests >/dev/null 2>&1; then
    build_benches bench_model_sizes bench_oryx
    cp "$bin/bench_model_sizes" "$bin/bench_oryx" "$OUT/"
fi
lscpu | grep -E 'Model name|^CPU\(s\)|Thread|L3' || true
g++ --version | head -1
cores=$(nproc)
sizes() {  # sizes OUT_CSV CORES FILTER MIN_TIME
    HYMIX_BENCH_THREADS=$2 taskset -c "0-$(( $2 - 1 ))" "$bin/bench_model_sizes" --benchmark_filter="$3" \
        --benchmark_min_time="$4" --benchmark_out="$1" --benchmark_out_format=csv >/dev/null
    grep -E '^"?(prefill|decode)' "$1" | cut -d, -f1,3 | sed "s/^/  $2 cores: /" || true
}
build_old_new() {  # build_old_new TARGET...: builds them here and in /tmp/ab_old (this tree with .ab_old/ laid over it), at once
    rm -rf /tmp/ab_old
    mkdir -p /tmp/ab_old
    tar --exclude=./build --exclude=./.ab_old -cf - . | tar -C /tmp/ab_old -xf -
    cp -a .ab_old/. /tmp/ab_old/
    configure
    (cd /tmp/ab_old && configure)
    cmake --build build/release -j"$cores" --target "$@" >/tmp/build_new.log 2>&1 &
    local pid_new=$!
    (cd /tmp/ab_old && cmake --build build/release -j"$cores" --target "$@" >/tmp/build_old.log 2>&1) &
    local pid_old=$!
    wait "$pid_new" || { grep -E 'error' -A5 /tmp/build_new.log | head -40; kill "$pid_old" 2>/dev/null; exit 1; }
    wait "$pid_old" || { grep -E 'error' -A5 /tmp/build_old.log | head -40; exit 1; }
    echo "device_scaling: built both in $(( $(date +%s) - t0 )) s"
}
case "${PHASE:-models}" in
models)
    sizes "$OUT/model_sizes_16core.csv" "$cores" '(prefill/.*/(f32|bf16|i8)/)|(decode/.*/(f32|bf16|i8)/batch:(1|8)/)' 1
    for c in 1 2 4 8 16; do
        [ "$c" -le "$cores" ] || continue
        HYMIX_BENCH_THREADS=$c taskset -c "0-$(( c - 1 ))" "$bin/bench_oryx" \
            --benchmark_filter='^(BM_oryx_decode/gdn:./schedule:0/n:1024|BM_oryx_decode/gdn:1/schedule:1/n:65536|BM_attention_decode/n:1024|BM_gdn_decode|BM_oryx_prefill/gdn:./schedule:0/T:4096)$' \
            --benchmark_out="$OUT/oryx_scaling_$c.csv" --benchmark_out_format=csv >/dev/null
        echo "  bench_oryx on $c cores done"
    done
    ;;
peers)
    OMP_NUM_THREADS=$cores python3 scripts/hf_cpu_bench.py --threads "$cores" --repeats "${REPEATS:-1}" \
        --decode-tokens "${DECODE_TOKENS:-8}" bench/configs/qwen3.5-0.8b.json bench/configs/mamba2-780m.json \
        | tee "$OUT/transformers_16core.csv"
    # Mamba-2's decode again after a 16-token prompt: behind the 512-token one, the spread of transformers' 41 s
    # prefill swamps a few decode steps (an SSM step does not depend on the context length).
    OMP_NUM_THREADS=$cores python3 scripts/hf_cpu_bench.py --threads "$cores" --repeats 2 --phases decode \
        --decode-prompt 16 --decode-tokens 32 bench/configs/mamba2-780m.json | tee "$OUT/transformers_mamba2_decode.csv"
    sizes "$OUT/model_sizes_peers_16core.csv" "$cores" '(prefill/.*/f32/)|(decode/.*/f32/batch:1/)' 1
    for c in 1 2 4 8; do
        [ "$c" -le "$cores" ] || continue
        sizes "$OUT/model_sizes_decode_$c.csv" "$c" 'decode/.*/(f32|i8)/batch:1/' 1
    done
    ;;
prefill)
    python3 scripts/torch_gemm_rate.py --threads "$cores" bench/configs/qwen3.5-0.8b.json bench/configs/mamba2-780m.json \
        | tee "$OUT/torch_gemm_rate.csv"
    for c in 16 1 2 4 8; do
        [ "$c" -le "$cores" ] || continue
        sizes "$OUT/model_sizes_prefill_$c.csv" "$c" 'prefill/.*/f32/' 0.5
    done
    ;;
layers)
    cmake --build build/release -j"$cores" --target bench_linear bench_gated_deltanet bench_attention >/tmp/build_layers.log 2>&1 \
        || { grep -E 'error' -A5 /tmp/build_layers.log | head -40; exit 1; }
    for c in 16 1; do
        [ "$c" -le "$cores" ] || continue
        HYMIX_BENCH_THREADS=$c taskset -c "0-$(( c - 1 ))" build/release/bench/bench_linear \
            --benchmark_filter='BM_linear_hymix_model_shapes' --benchmark_out="$OUT/layers_linear_$c.csv" --benchmark_out_format=csv >/dev/null
        HYMIX_BENCH_THREADS=$c taskset -c "0-$(( c - 1 ))" build/release/bench/bench_gated_deltanet \
            --benchmark_filter='BM_gdn_prefill/layer:2/|BM_gdn_chunked_core/T:512/chunk:64/heads:16' \
            --benchmark_out="$OUT/layers_gdn_$c.csv" --benchmark_out_format=csv >/dev/null
        taskset -c "0-$(( c - 1 ))" build/release/bench/bench_attention --benchmark_filter='BM_attn_prefill/layer:2/' \
            --benchmark_out="$OUT/layers_attention_$c.csv" --benchmark_out_format=csv >/dev/null
        echo "  layers on $c cores done"
    done
    ;;
profile)
    for c in "$cores" 2; do
        filter='prefill/.*/f32/'
        [ "$c" = "$cores" ] && filter='(prefill/.*/f32/)|(decode/.*/(f32|bf16)/batch:(1|8)/)'
        HYMIX_OP_PROFILE="$OUT/profile_$c" sizes "$OUT/profile_sizes_$c.csv" "$c" "$filter" 0.5 2>"$OUT/profile_$c.log"
        cat "$OUT/profile_$c.log"
    done
    HYMIX_BENCH_THREADS=$cores "$bin/bench_attention" --benchmark_filter='BM_attn_decode_kernel/H:32/H_kv:8/d_h:128/ctx:32768/' \
        --benchmark_repetitions=3 --benchmark_out="$OUT/attn_decode_$cores.csv" --benchmark_out_format=csv 2>&1 | grep -E 'median' || true
    ;;
ab)
    [ -d .ab_old ] || { echo "device_scaling: PHASE=ab needs .ab_old/ (the earlier versions of the changed files)" >&2; exit 2; }
    t0=$(date +%s)
    build_old_new bench_model_sizes
    mkdir -p "$OUT/ab"
    filter="${AB_FILTER:-(prefill/.*/f32/)|(decode/.*/f32/batch:(1|8)/)|(decode/mamba2-780m/bf16/batch:(1|8)/)}"
    # A third variant, "malloc": the new build with glibc's heap never trimmed or unmapped (MALLOC_TRIM_THRESHOLD_,
    # MALLOC_MMAP_THRESHOLD_ at their largest), which shows what freeing and re-faulting per-call scratch costs on
    # many cores.
    # One round of three variants and the profiles take about 4 minutes on 16 cores after the two builds: ROUNDS=1
    # fits the 10-minute limit of a device call from a cold start.
    for r in $(seq 1 "${ROUNDS:-1}"); do
        for v in new old malloc; do
            b=build/release/bench/bench_model_sizes
            [ "$v" = old ] && b=/tmp/ab_old/build/release/bench/bench_model_sizes
            env_malloc=()
            [ "$v" = malloc ] && env_malloc=(MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TOP_PAD_=268435456)
            env "${env_malloc[@]}" HYMIX_BENCH_THREADS=$cores "$b" --benchmark_filter="$filter" --benchmark_min_time=1 \
                --benchmark_out="$OUT/ab/${v}_$r.csv" --benchmark_out_format=csv >"$OUT/ab/${v}_$r.log" 2>&1 \
                || echo "  round $r $v: bench_model_sizes failed (see ${v}_$r.log)"
            grep -E '^"?(prefill|decode)' "$OUT/ab/${v}_$r.csv" | cut -d, -f1,3 | sed "s/^/  round $r $v: /" || true
        done
    done
    HYMIX_OP_PROFILE="$OUT/ab/profile_new" HYMIX_BENCH_THREADS=$cores build/release/bench/bench_model_sizes \
        --benchmark_filter='(prefill/.*/f32/)|(decode/mamba2-780m/f32/batch:8/)' --benchmark_min_time=0.2 >/dev/null 2>"$OUT/ab/profile_new.log"
    MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TOP_PAD_=268435456 \
        HYMIX_OP_PROFILE="$OUT/ab/profile_malloc" HYMIX_BENCH_THREADS=$cores build/release/bench/bench_model_sizes \
        --benchmark_filter='(prefill/qwen3.5-0.8b/f32/)' --benchmark_min_time=0.2 >/dev/null 2>"$OUT/ab/profile_malloc.log"
    cut -c1-400 "$OUT/ab/profile_new.log" "$OUT/ab/profile_malloc.log" || true
    tar -C "$OUT" -czf "$OUT/ab.tar.gz" ab && rm -rf "$OUT/ab"
    ;;
subnormal)
    for c in "$cores" 2; do
        for b in gated_deltanet:BM_gdn_chunked_subnormals mamba2:BM_ssd_chunked_subnormals; do
            HYMIX_BENCH_THREADS=$c taskset -c "0-$(( c - 1 ))" "$bin/bench_${b%%:*}" --benchmark_filter="${b#*:}" \
                --benchmark_repetitions=3 --benchmark_report_aggregates_only=true --benchmark_out="$OUT/${b#*:}_$c.csv" \
                --benchmark_out_format=csv 2>&1 | grep -E 'median' | sed "s/^/  $c cores: /" || true
        done
    done
    for r in 1 2; do
        for f in 1 0; do
            HYMIX_FLUSH_SUBNORMALS=$f HYMIX_BENCH_THREADS=$cores "$bin/bench_model_sizes" --benchmark_filter='prefill/.*/f32/' \
                --benchmark_min_time=1 --benchmark_out="$OUT/prefill_flush${f}_$r.csv" --benchmark_out_format=csv >/dev/null 2>&1 \
                || echo "  round $r flush $f: bench_model_sizes failed"
            grep -E '^"?prefill' "$OUT/prefill_flush${f}_$r.csv" | cut -d, -f1,3 | sed "s/^/  round $r flush $f: /" || true
        done
    done
    for f in 1 0; do
        HYMIX_FLUSH_SUBNORMALS=$f HYMIX_OP_PROFILE="$OUT/profile_flush$f" HYMIX_BENCH_THREADS=$cores "$bin/bench_model_sizes" \
            --benchmark_filter='prefill/.*/f32/' --benchmark_min_time=0.2 >/dev/null 2>"$OUT/profile_flush$f.log" || true
        cut -c1-300 "$OUT/profile_flush$f.log"
    done
    tar -C "$OUT" -czf "$OUT/subnormal.tar.gz" profile_flush1 profile_flush0 && rm -rf "$OUT/profile_flush1" "$OUT/profile_flush0"
    ;;
abbench)
    [ -d .ab_old ] || { echo "device_scaling: PHASE=abbench needs .ab_old/ (the earlier versions of the changed files)" >&2; exit 2; }
    : "${AB_FILTER:?device_scaling: PHASE=abbench needs AB_FILTER (benchmarks that both builds have)}"
    target=${AB_TARGET:-bench_mamba2}
    targets=("$target")
    [ -n "${AB_MODEL_FILTER:-}" ] && targets+=(bench_model_sizes)
    t0=$(date +%s)
    mkdir -p "$OUT/abbench"
    build_old_new "${targets[@]}"
    for r in $(seq 1 "${ROUNDS:-2}"); do
        for c in ${AB_CORES:-1 $cores}; do
            [ "$c" -le "$cores" ] || continue
            for v in old new; do
                b=build/release/bench/$target
                [ "$v" = old ] && b=/tmp/ab_old/build/release/bench/$target
                HYMIX_BENCH_THREADS=$c taskset -c "0-$(( c - 1 ))" "$b" --benchmark_filter="$AB_FILTER" \
                    --benchmark_min_time="${AB_MIN_TIME:-0.5}" --benchmark_out="$OUT/abbench/${v}_${c}_$r.csv" \
                    --benchmark_out_format=csv >/dev/null 2>&1 || echo "  round $r $v $c cores: failed"
                grep -E '^"?BM' "$OUT/abbench/${v}_${c}_$r.csv" | cut -d, -f1,3 | sed "s/^/  round $r $c cores $v: /" || true
            done
        done
        [ -n "${AB_MODEL_FILTER:-}" ] || continue
        for v in old new; do
            b=build/release/bench/bench_model_sizes
            [ "$v" = old ] && b=/tmp/ab_old/build/release/bench/bench_model_sizes
            HYMIX_BENCH_THREADS=$cores "$b" --benchmark_filter="$AB_MODEL_FILTER" --benchmark_min_time=1 \
                --benchmark_out="$OUT/abbench/model_${v}_$r.csv" --benchmark_out_format=csv >/dev/null 2>&1 || echo "  round $r $v model: failed"
            grep -E '^"?(prefill|decode)' "$OUT/abbench/model_${v}_$r.csv" | cut -d, -f1,3 | sed "s/^/  round $r model $v: /" || true
        done
    done
    ;;
*) echo "device_scaling: PHASE is models, peers, prefill, layers, profile, ab, subnormal or abbench" >&2; exit 2 ;;
esac
