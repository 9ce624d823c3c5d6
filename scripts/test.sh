#!/usr/bin/env bash
# README's test command (and CI's): installs the Debian 12 dependencies, then
#   1. builds the release preset (tests, benchmarks, examples) with warnings as errors (-DHYMIX_WERROR=ON) and runs
#      its tests with ctest (JOBS at a time);
#   2. builds the sanitize preset (AddressSanitizer + UndefinedBehaviorSanitizer) and runs its tests;
#   3. builds the libFuzzer targets with clang and runs each for FUZZ_SECONDS (default 30) via tests/fuzz/run.sh.
# Exits non-zero if any stage fails; every stage runs, and a summary is printed at the end.
# Environment: BUILD_ROOT (build directories, default build/), JOBS (default 2), FUZZ_SECONDS.
set -uo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "$0")/common.sh"
cd "$HYMIX_ROOT" || exit 1
FUZZ_SECONDS=${FUZZ_SECONDS:-30}

failed=()
summary=()
# run_stage NAME COMMAND...: runs the command, records pass/fail, keeps going.
run_stage() {
    local name=$1
    shift
    stage "$name"
    local t0=$SECONDS
    if "$@"; then
        summary+=("PASS  $name ($((SECONDS - t0)) s)")
    else
        summary+=("FAIL  $name ($((SECONDS - t0)) s)")
        failed+=("$name")
    fi
}

scripts/install-deps.sh || exit 1

# CI builds treat warnings as errors (HYMIX_WERROR); a user's build of the presets does not.
for p in release sanitize; do
    if run_stage "$p: configure" preset_configure "$p" -DHYMIX_WERROR=ON; then
        run_stage "$p: build" preset_build "$p"
        # JOBS tests at a time: the tests that run the build tool hold a resource lock (one at a time), the others
        # fill the second core meanwhile; every test writes under its own directory or file names.
        run_stage "$p: ctest" preset_test "$p" -j"$JOBS"
    fi
done

fuzz() {
    if ! command -v clang++ >/dev/null 2>&1; then
        echo "fuzz: clang++ not found, skipping the fuzzers"
        return 0
    fi
    if [ ! -f tests/fuzz/run.sh ]; then
        echo "fuzz: tests/fuzz/run.sh does not exist yet, skipping the fuzzers"
        return 0
    fi
    local dir
    dir=$(dirname "$(preset_dir release)")/fuzz
    cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
        -DHYMIX_BUILD_FUZZERS=ON -DHYMIX_BUILD_BENCHMARKS=OFF -DHYMIX_BUILD_EXAMPLES=OFF -DHYMIX_WERROR=ON &&
        cmake --build "$dir" -j"$JOBS" --target fuzz_safetensors fuzz_config &&
        bash tests/fuzz/run.sh "$dir" "$FUZZ_SECONDS"
}
run_stage "fuzz: clang libFuzzer, ${FUZZ_SECONDS} s per target" fuzz

stage "summary"
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -ne 0 ]; then
    echo "test.sh: ${#failed[@]} stage(s) failed: ${failed[*]}"
    exit 1
fi
echo "test.sh: all stages passed"
