# Builds the release preset against Debian packages unpacked from .debs/ (a machine without network) and runs the
# runtime tests with the shared models copied into .shared_models/; prints the failures.
set -e
# shellcheck source=scripts/dev/offline_deps.sh
source "$(dirname "$0")/offline_deps.sh"
cmake --preset release -DHYMIX_WERROR=ON -DHYMIX_SHARED_DIR=$PWD/.shared_models > /tmp/cfg.log 2>&1 || { tail -30 /tmp/cfg.log; exit 1; }
t0=$(date +%s)
cmake --build build/release -j16 -- -k 0 > /tmp/build.log 2>&1 || { grep -E 'error|FAILED' -A5 /tmp/build.log | head -80; }
echo "build: $(( $(date +%s) - t0 )) s"
ctest --test-dir build/release -j16 --output-on-failure -LE 'headers|failtest|package' --timeout 500 > /tmp/ctest.log 2>&1 || true
grep -E 'tests passed|Failed|\*\*\*|Not Run|Timeout' /tmp/ctest.log | head -40
cp /tmp/ctest.log $OUT/ctest.log; grep -B2 -A30 'FAIL' /tmp/ctest.log | head -150 > $OUT/fail.log || true
