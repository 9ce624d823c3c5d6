#!/usr/bin/env bash
# AMOR decode throughput against context (issue 9): runs bench/bench_amor.cpp (a Mamba-2 backbone alone, with 3 AMOR
# blocks true-sparse at about 22% fire, the same blocks always on, and a fixed hybrid of the same size; the shared
# KJV models' size and a large-vocabulary one; batch 1 and 8; contexts 1K–128K) and writes
# docs/amor/decode_vs_context.csv (Google Benchmark's CSV) and docs/amor/decode_vs_context.md (tokens/s per variant,
# and where true-sparse overtakes always-on).
# Usage: scripts/amor_decode_bench.sh        environment: BENCH (default build/release/bench/bench_amor),
#   FILTER (a --benchmark_filter regex), DOCS (docs/amor), NOTE (a sentence for the report: what else ran, which host)
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "$0")/common.sh"
cd "$HYMIX_ROOT"
bench=${BENCH:-build/release/bench/bench_amor} docs=${DOCS:-docs/amor}
mkdir -p "$docs"
csv=$docs/decode_vs_context.csv
run_bench_csv "$bench" "$csv" ${FILTER:+--benchmark_filter="$FILTER"} || exit $?
{
    echo "# AMOR decode throughput against context (scripts/amor_decode_bench.sh)"
    echo
    echo "bench/bench_amor.cpp: one decode step of B sequences after n cached tokens, random f32 weights, every core"
    echo "of the machine. Variants: the Mamba-2 backbone alone; + 3 AMOR blocks true-sparse (τ set at the 78th percentile"
    echo "of the decode entropies, the measured fire rate in brackets); the same blocks always on; a fixed hybrid (the"
    echo "backbone + 3 ungated attention layers of the blocks' shape). Sizes: kjv (d 256, 6 layers, V 256, blocks 4 × 64)"
    echo "and large_vocab (d 1024, 24 layers, V 128256, blocks 16 × 64). Machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1),"
    echo "$(nproc) cores.${NOTE:+ $NOTE} Raw numbers (with GB/s and the measured peaks): [decode_vs_context.csv](decode_vs_context.csv)."
    echo
    echo "| size | B | context | backbone tok/s | AMOR true-sparse tok/s (fire rate) | AMOR always-on tok/s | fixed hybrid tok/s | sparse / always-on |"
    echo "|---|---|---|---|---|---|---|---|"
    # Columns of Google Benchmark's CSV: name,iterations,real_time,cpu_time,time_unit,bytes_per_second,items_per_second,
    # label,error_occurred,error_message, then the counters in name order. Read the counters by header name.
    awk -F, '
        { gsub(/"/, "") }
        /^name,/ { for (i = 1; i <= NF; i++) col[$i] = i; started = 1; next }
        !started { next }
        {
            split($1, p, "/"); if (p[1] != "BM_amor_decode") next  # f32 rows only (BM_amor_decode_bf16: docs/amor.md)
            size = p[2]; v = p[3]; B = p[4]; n = p[5]
            sub("size:", "", size); sub("variant:", "", v); sub("B:", "", B); sub("ctx:", "", n)
            tps[size, v, B, n] = $col["tokens/s"]; fire[size, v, B, n] = $col["fire_rate"]
            if (v == 1) { key = size SUBSEP B SUBSEP n; if (!(key in seen)) { seen[key] = 1; order[++m] = key } }
        }
        END {
            names[0] = "kjv"; names[1] = "large_vocab"
            for (i = 1; i <= m; i++) {
                split(order[i], k, SUBSEP); s = k[1]; B = k[2]; n = k[3]
                sp = tps[s, 1, B, n]; al = tps[s, 2, B, n]
                printf "| %s | %s | %d K | %.1f | %.1f (%.3f) | %.1f | %.1f | %.2f× |\n", names[s], B, n / 1024, tps[s, 0, B, 1024], sp,
                       fire[s, 1, B, n], al, tps[s, 3, B, n], (al > 0 ? sp / al : 0)
            }
        }' "$csv"
} >"$docs/decode_vs_context.md"
echo "amor_decode_bench: wrote $csv and $docs/decode_vs_context.md" >&2
