#!/usr/bin/env bash
# Oryx layer speed per read-out and schedule (issue 10): runs bench/bench_oryx.cpp (Oryx-GDN and Oryx-Mamba-2 layers,
# d 256, 4 heads × 64: decode steps read out linearly or by attention at a context of 1K–64K, prefill of 1K and 4K
# tokens under all-linear, all-attention and periodic schedules; beside an attention layer and a Gated DeltaNet layer
# of the same width) and writes docs/oryx_bench.csv (Google Benchmark's CSV, with GFLOP/s, GB/s and the peaks
# measured in the same run) and docs/oryx_bench.md (tokens/s tables).
# Usage: scripts/oryx_bench.sh        environment: BENCH (default build/release/bench/bench_oryx), FILTER (a
#   --benchmark_filter regex), DOCS (docs), NOTE (a sentence for the report: what else ran, which host), FROM_CSV
#   (non-empty: only re-write docs/oryx_bench.md from the existing CSV; the machine line is then this machine's)
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "$0")/common.sh"
cd "$HYMIX_ROOT"
bench=${BENCH:-build/release/bench/bench_oryx} docs=${DOCS:-docs}
csv=$docs/oryx_bench.csv
if [ -n "${FROM_CSV:-}" ]; then  # re-write the tables of a finished run
    bench_csv_ok "$csv" || { echo "oryx_bench: FROM_CSV is set but '$csv' is not a benchmark CSV with results" >&2; exit 2; }
else
    mkdir -p "$docs"
    run_bench_csv "$bench" "$csv" ${FILTER:+--benchmark_filter="$FILTER"} || exit $?
fi
# Columns of Google Benchmark's CSV: name,iterations,real_time,cpu_time,time_unit,..., then the counters in name
# order. The awk programs read the counters by header name.
table() {
    awk -F, -v what="$1" '
        { gsub(/"/, "") }
        /^name,/ { for (i = 1; i <= NF; i++) col[$i] = i; started = 1; next }
        !started { next }
        {
            n = split($1, p, "/"); kind = p[1]
            for (i = 2; i <= n; i++) { split(p[i], kv, ":"); a[kv[1]] = kv[2] }
            tps = $col["tokens/s"]; fl = $col["flop_peak_frac"]; bw = $col["bw_peak_frac"]
            if (what == "decode") {
                if (kind == "BM_oryx_decode") d[(a["gdn"] ? "Oryx-GDN" : "Oryx-Mamba-2") (a["schedule"] ? ", attention read-out" : ", linear read-out"), a["n"]] = sprintf("%.0f (%.0f%%)", tps, 100 * bw)
                else if (kind == "BM_attention_decode") d["attention layer", a["n"]] = sprintf("%.0f (%.0f%%)", tps, 100 * bw)
                else if (kind == "BM_gdn_decode") for (c = 1024; c <= 65536; c *= 4) d["Gated DeltaNet layer", c] = sprintf("%.0f (%.0f%%)", tps, 100 * bw)
            } else if (kind == "BM_oryx_prefill") {
                s = a["schedule"] == 0 ? "all linear" : a["schedule"] == 1 ? "all attention" : "periodic (1 block of 128 in 8)"
                d[(a["gdn"] ? "Oryx-GDN" : "Oryx-Mamba-2") ", " s, a["T"]] = sprintf("%.0f (%.0f%%)", tps, 100 * fl)
            }
            delete a
        }
        END {
            if (what == "decode") {
                print "| layer, read-out | 1K | 4K | 16K | 64K |"; print "|---|---|---|---|---|"
                split("Oryx-GDN, linear read-out|Oryx-GDN, attention read-out|Oryx-Mamba-2, linear read-out|Oryx-Mamba-2, attention read-out|attention layer|Gated DeltaNet layer", rows, "|")
                for (r = 1; r <= 6; r++) printf "| %s | %s | %s | %s | %s |\n", rows[r], d[rows[r], 1024], d[rows[r], 4096], d[rows[r], 16384], d[rows[r], 65536]
            } else {
                print "| layer, schedule | T 1024 | T 4096 |"; print "|---|---|---|"
                split("all linear|all attention|periodic (1 block of 128 in 8)", ss, "|")
                for (g = 0; g < 2; g++) for (s = 1; s <= 3; s++) { r = (g == 0 ? "Oryx-GDN" : "Oryx-Mamba-2") ", " ss[s]; printf "| %s | %s | %s |\n", r, d[r, 1024], d[r, 4096] }
            }
        }' "$csv"
}
peaks=$(awk -F, '{ gsub(/"/, "") } /^name,/ { for (i = 1; i <= NF; i++) col[$i] = i; next }
                 col["peak_GFLOP/s"] && NF > 5 { f = $col["peak_GFLOP/s"]; b = $col["peak_GB/s"]; lo = (lo == "" || b < lo) ? b : lo; hi = (b > hi) ? b : hi }
                 END { printf "%.0f GFLOP/s FMA; read bandwidth %.0f–%.0f GB/s, measured at each benchmark'"'"'s working-set size", f, lo, hi }' "$csv")
{
    echo "# Oryx layer speed (scripts/oryx_bench.sh)"
    echo
    echo "bench/bench_oryx.cpp: one Oryx layer (d 256, 4 heads × 64, random f32 weights, batch 1, every core of the"
    echo "machine) beside an attention layer (4 heads × 64) and a Gated DeltaNet layer (4 / 4 heads × 64) of the same width."
    echo "Machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores; peaks measured in the same run: $peaks"
    echo "(so a step whose bytes straddle a cache level can show more than 100%).${NOTE:+ $NOTE} Raw numbers: [oryx_bench.csv](oryx_bench.csv)."
    echo
    echo "Decode: tokens/s of one step after n cached tokens (the step is rolled back off the KV cache, so n stays fixed),"
    echo "with the fraction of the read-bandwidth peak the step's bytes (weights, linear state, KV read) reach:"
    echo
    table decode
    echo
    echo "Prefill of T tokens from an empty state: tokens/s, with the fraction of the FMA peak (FLOPs of spec.md §6.6):"
    echo
    table prefill
} >"$docs/oryx_bench.md"
if [ -n "${FROM_CSV:-}" ]; then echo "oryx_bench: wrote $docs/oryx_bench.md from $csv" >&2; else echo "oryx_bench: wrote $csv and $docs/oryx_bench.md" >&2; fi
