# Shared helpers for scripts/run.sh, scripts/test.sh and the experiment scripts (sourced, not run). Builds go
# through the presets of CMakePresets.json (build/<preset>); set BUILD_ROOT to put every build directory under
# another folder instead (BUILD_ROOT/<preset>), e.g. to test the scripts without touching build/.
# shellcheck shell=bash

HYMIX_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
JOBS=${JOBS:-2}
BUILD_ROOT=${BUILD_ROOT:-}
if [ -n "$BUILD_ROOT" ]; then
    BUILD_ROOT=$(mkdir -p "$BUILD_ROOT" && cd "$BUILD_ROOT" && pwd)
fi

# Build directory of a preset.
preset_dir() {
    if [ -n "$BUILD_ROOT" ]; then echo "$BUILD_ROOT/$1"; else echo "$HYMIX_ROOT/build/$1"; fi
}

# Configure preset $1 (extra arguments go to cmake).
preset_configure() {
    local p=$1
    shift
    if [ -n "$BUILD_ROOT" ]; then
        cmake --preset "$p" -B "$BUILD_ROOT/$p" "$@"
    else
        cmake --preset "$p" "$@"
    fi
}

# Build preset $1 (extra arguments, e.g. --target X, go to cmake --build). Ninja keeps going after a failed
# target (-k 0), so one broken test does not hide the others; the build still fails as a whole.
preset_build() {
    local p=$1
    shift
    if [ -n "$BUILD_ROOT" ]; then
        cmake --build "$BUILD_ROOT/$p" -j"$JOBS" "$@" -- -k 0
    else
        cmake --build --preset "$p" -j"$JOBS" "$@" -- -k 0
    fi
}

# Run preset $1's tests with ctest (the test preset sets output-on-failure and the sanitizer options). With
# BUILD_ROOT, ctest runs without the preset (a test preset always uses its configure preset's directory), so
# the settings of CMakePresets.json's test presets are repeated here: keep the two in step.
preset_test() {
    local p=$1
    shift
    if [ -z "$BUILD_ROOT" ]; then
        ctest --preset "$p" "$@"
        return
    fi
    local args=(--test-dir "$BUILD_ROOT/$p" --output-on-failure --no-tests=error)
    if [ "$p" = sanitize ]; then
        args+=(--label-exclude '^(headers|failtest|package|docs)$')
        ASAN_OPTIONS=halt_on_error=1:abort_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:strict_init_order=1:check_initialization_order=1 \
            UBSAN_OPTIONS=halt_on_error=1:abort_on_error=1:print_stacktrace=1 \
            ctest "${args[@]}" "$@"
    else
        ctest "${args[@]}" "$@"
    fi
}

stage() {
    printf '\n==== %s ====\n' "$*"
}

# This machine's CPU for result pages: lscpu's model name and CPU family (the kind varies between sessions).
cpu_name() {
    echo "$(lscpu | sed -n 's/^Model name: *//p' | head -n1) (CPU family $(lscpu | sed -n 's/^CPU family: *//p' | head -n1))"
}

# Whether $1 is a Google Benchmark CSV with its header and at least one result row.
bench_csv_ok() {
    awk -F, '/^"?name"?,/ { h = 1; next } h && NF > 5 { r = 1 } END { exit !(h && r) }' "$1" 2>/dev/null
}

# run_bench_csv BENCH CSV [ARGS...]: runs the Google Benchmark binary BENCH with ARGS into CSV, through a temporary
# file that replaces CSV only when the run succeeded and wrote results (a mistyped --benchmark_filter matches
# nothing: the previous results stay). Returns non-zero, naming BENCH, otherwise.
run_bench_csv() {
    local bench=$1 csv=$2
    shift 2
    [ -x "$bench" ] || { echo "no benchmark executable '$bench' (build it first: cmake --build --preset release --target $(basename "$bench"))" >&2; return 2; }
    local tmp="$csv.tmp.$$"
    if "$bench" "$@" --benchmark_out="$tmp" --benchmark_out_format=csv >&2 && bench_csv_ok "$tmp"; then
        mv "$tmp" "$csv"
    else
        rm -f "$tmp"
        echo "'$bench' failed or produced no results; '$csv' is unchanged" >&2
        return 1
    fi
}


# The inputs of the recall scripts (recall_bench.sh, recall_seeds.sh, recall_stage1.sh), called from the repository
# root: sets `text` to TEXT (relative to CALLER_DIR, the caller's working directory, where such a file exists; default
# ../shared/data/kjv.txt from the root) and `exe` to $EXAMPLE (default build/release/examples/example_recall), and
# exits 2, naming the script, when either is missing.
recall_inputs() {  # recall_inputs NAME CALLER_DIR [TEXT]
    local name=$1 caller=$2
    shift 2
    text=${1:-../shared/data/kjv.txt}
    case $text in /*) ;; *) [ -f "$caller/$text" ] && [ $# -ge 1 ] && text=$caller/$text ;; esac
    exe=${EXAMPLE:-build/release/examples/example_recall}
    [ -x "$exe" ] || { echo "$name: build the example first (cmake --build --preset release --target example_recall)" >&2; exit 2; }
    [ -f "$text" ] || { echo "$name: no text file '$text'" >&2; exit 2; }
}
