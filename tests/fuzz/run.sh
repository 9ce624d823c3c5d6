#!/usr/bin/env bash
# Runs each libFuzzer target for <seconds> on a scratch copy of its seed corpus (the repository's corpus is
# never written). Crash/leak/timeout inputs are kept under <build-dir>/fuzz-artifacts/<target>/.
# usage: tests/fuzz/run.sh <build-dir> <seconds> [extra libFuzzer flags...]
set -euo pipefail
if [[ $# -lt 2 ]]; then
    echo "usage: $0 <build-dir> <seconds> [libFuzzer flags...]" >&2
    exit 2
fi
build=$(cd "$1" && pwd)
seconds=$2
shift 2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
scratch=$(mktemp -d "${TMPDIR:-/tmp}/hymix-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

status=0
for name in safetensors config; do
    exe="$build/tests/fuzz/fuzz_$name"
    if [[ ! -x "$exe" ]]; then
        echo "missing $exe: configure with clang and -DHYMIX_BUILD_FUZZERS=ON, build target fuzz_$name" >&2
        status=1
        continue
    fi
    cp -r "$here/corpus/$name" "$scratch/corpus-$name"
    artifacts="$build/fuzz-artifacts/fuzz_$name"
    mkdir -p "$artifacts"
    dict=()
    [[ -f "$here/$name.dict" ]] && dict=("-dict=$here/$name.dict")
    echo "== fuzz_$name for ${seconds}s (corpus: $(ls "$scratch/corpus-$name" | wc -l) seeds)"
    if ! "$exe" "$scratch/corpus-$name" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
            -print_final_stats=1 -artifact_prefix="$artifacts/" "${dict[@]}" "$@"; then
        echo "!! fuzz_$name found a failure; reproducer(s) in $artifacts" >&2
        status=1
    fi
done
exit $status
