#!/usr/bin/env bash
# The training kernels' speed (issue 8): forward and backward of the projections (linear, M 2048, N = K 768), the
# fused LM head + cross-entropy, the causal conv, chunked SSD (H 24, P 64, N 128, T 512), the chunked gated delta rule
# (16 heads x 128, T 512) and flash-style attention (T 1024), on 1 and 2 threads, each timed by its Google Benchmark
# (bench/bench_*_backward.cpp, bench_backward_basic.cpp) with the machine's FMA and bandwidth peaks measured in the same
# process (bench/peak.hpp). The backward / forward ratios come from the benchmarks that time both alternately in one
# loop. Writes docs/backward/<bench>.<family>.csv (Google Benchmark CSVs, medians of REPS repetitions) and
# docs/backward_bench.md (the table: time, GFLOP/s, fraction of the FMA peak, backward / forward).
# Usage: scripts/backward_bench.sh     environment: BENCH_DIR (build/release/bench), DOCS (docs), REPS (3),
#   MIN_TIME (0.5, seconds per repetition), FROM_CSV (non-empty: only re-write the table from the committed CSVs).
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "$0")/common.sh"
cd "$HYMIX_ROOT"
bench_dir=${BENCH_DIR:-build/release/bench} docs=${DOCS:-docs} reps=${REPS:-3} min_time=${MIN_TIME:-0.5}
benches="backward_basic conv1d_backward ssd_backward gated_delta_backward attention_backward"
mkdir -p "$docs/backward"
# Each benchmark family gets its own CSV (Google Benchmark's CSV writer needs every row to have the header's counters,
# and the families count different things): docs/backward/<bench>.<family>.csv.
families() { "$bench_dir/bench_$1" --benchmark_list_tests | sed 's|/.*||' | awk '!seen[$0]++'; }
if [ -z "${FROM_CSV:-}" ]; then
    # Into a fresh folder first: the committed CSVs are replaced only when every family of every benchmark ran.
    new=$(mktemp -d "$docs/backward.new.XXXXXX")
    trap 'rm -rf "$new"' EXIT
    for b in $benches; do
        [ -x "$bench_dir/bench_$b" ] || { echo "backward_bench: '$bench_dir/bench_$b' is not built (cmake --build build/release --target bench_$b)" >&2; exit 2; }
        fams=$(families "$b") && [ -n "$fams" ] || { echo "backward_bench: bench_$b lists no benchmarks" >&2; exit 1; }
        for f in $fams; do
            stage "bench_$b $f"
            run_bench_csv "$bench_dir/bench_$b" "$new/$b.$f.csv" --benchmark_filter="^$f/" --benchmark_repetitions="$reps" \
                --benchmark_report_aggregates_only=true --benchmark_min_time="$min_time"
        done
    done
    rm -f "$docs/backward"/*.csv
    mv "$new"/*.csv "$docs/backward/"
fi
for b in $benches; do
    ls "$docs/backward/$b".*.csv > /dev/null 2>&1 || { echo "backward_bench: no results for bench_$b in $docs/backward" >&2; exit 2; }
    for c in "$docs/backward/$b".*.csv; do bench_csv_ok "$c" || { echo "backward_bench: no results in $c" >&2; exit 2; }; done
done

# awk: splitcsv(line, out) splits a CSV line into out[1..n] (quoted fields may hold commas) and returns n.
splitcsv='
    function splitcsv(line, out,   n, i, c, f, q) {
        n = 0; f = ""; q = 0
        for (i = 1; i <= length(line); ++i) {
            c = substr(line, i, 1)
            if (c == "\"") { q = !q; continue }
            if (c == "," && !q) { out[++n] = f; f = ""; continue }
            f = f c
        }
        out[++n] = f
        return n
    }'

# One table row per median of the bench's CSVs (quoted fields may hold commas): the benchmark, its time (ms),
# GFLOP/s, fraction of the FMA peak, and bwd/fwd: the alternating benchmark's counter, or for a *_backward row the
# ratio of its median to the matching *_forward (or *_forward_train) row's.
table() {
    awk "$splitcsv"'
        FNR == 1 { on = 0 }
        { sub(/\r$/, "") }
        /^"?name"?,/ { delete col; m = splitcsv($0, h); for (i = 1; i <= m; ++i) col[h[i]] = i; on = 1; next }
        on {
            splitcsv($0, v)
            n = v[1]
            if (n !~ /_median$/) next
            sub(/_median$/, "", n); sub(/\/real_time$/, "", n); sub(/\/process_time$/, "", n)
            t = v[col["real_time"]]; u = v[col["time_unit"]]
            ms = (u == "ns") ? t / 1e6 : (u == "us") ? t / 1e3 : (u == "s") ? t * 1e3 : t
            rows[++nr] = n; time[n] = ms
            g[n] = ("GFLOP/s" in col) ? v[col["GFLOP/s"]] : ""
            f[n] = ("flop_peak_frac" in col) ? v[col["flop_peak_frac"]] : ""
            r[n] = ""
            if ("bwd/fwd" in col) r[n] = v[col["bwd/fwd"]]
            if ("bwd_over_fwd" in col) r[n] = v[col["bwd_over_fwd"]]
        }
        END {
            for (k = 1; k <= nr; ++k) {
                n = rows[k]; ratio = (r[n] == "") ? "" : sprintf("%.2f", r[n])
                if (ratio == "" && n ~ /_backward\//) {
                    fw = n; sub(/_backward\//, "_forward/", fw)
                    fwt = n; sub(/_backward\//, "_forward_train/", fwt)
                    if (fw in time) ratio = sprintf("%.2f (of medians)", time[n] / time[fw])
                    else if (fwt in time) ratio = sprintf("%.2f (of medians)", time[n] / time[fwt])
                }
                printf "| %s | %.3f | %s | %s | %s |\n", n, time[n], (g[n] == "" ? "" : sprintf("%.1f", g[n])),
                       (f[n] == "" ? "" : sprintf("%.0f%%", 100 * f[n])), ratio
            }
        }' "$@"
}
peak=$(awk "$splitcsv"'
        /^"?name"?,/ { k = splitcsv($0, h); c = 0; for (i = 1; i <= k; ++i) if (h[i] == "peak_GFLOP/s") c = i; next }
        c { splitcsv($0, v); if (v[c] + 0 > m) m = v[c] + 0 } END { if (m) printf "%.0f", m }' "$docs/backward"/backward_basic.*.csv)
cpu=$(cpu_name)
{
    echo "# Training kernels: forward and backward"
    echo
    echo "\`scripts/backward_bench.sh\` ($(date -u +%Y-%m-%d), $cpu, $(nproc) cores; FMA peak measured in the run:"
    echo "${peak:-?} GFLOP/s on 2 threads). Medians of $reps repetitions; FLOPs count the GEMMs as executed (see each"
    echo "benchmark's top comment). The bwd/fwd column comes from the benchmarks that time both alternately in one loop"
    echo "(issue 8 asks ≤ 2.5 for the chunked SSD and gated-delta ops and for attention). SSD rows are"
    echo "T/chunk/threads/states: states 1 adds a non-zero initial state and a final-state gradient (the training case is 0)."
    for b in $benches; do
        echo
        echo "## bench_$b"
        echo
        echo "| benchmark | ms | GFLOP/s | of FMA peak | bwd/fwd |"
        echo "|---|---|---|---|---|"
        table "$docs/backward/$b".*.csv
    done
} > "$docs/backward_bench.md"
echo "wrote $docs/backward_bench.md"
