# Runs scripts/amor_experiments.sh on a machine without network (the device machine's many-core host): Debian
# packages unpacked from .debs/, the shared models and text copied into .shared_models/ (data/kjv.txt,
# models/<name>/{config.json,model.safetensors}). Uses a carried tool in .tool/hymix when it runs there, else builds
# it. The docs it writes, the runs' logs, loss curves and last AMOR files are packed into $OUT/amor_docs.tar.gz.
#   MINUTES=4 PARALLEL=6 THREADS=2 DEADLINE_S=500 bash scripts/dev/device_amor.sh
#   CALL_S=570 ... bash scripts/dev/device_amor.sh   (the training minutes are what the call leaves after the build)
# A budget longer than one call: RESUME=1 TRAIN_ONLY=1 with the runs folder carried from the previous call (unpack its
# $OUT/amor_runs.tar.gz into build/amor_runs and carry that, and the tool it left in $OUT/hymix as .tool/hymix).
set -e
t_call=$(date +%s)
# shellcheck source=scripts/dev/offline_deps.sh
source "$(dirname "$0")/offline_deps.sh"
tool=.tool/hymix
if ! "$tool" --version >/dev/null 2>&1; then
    echo "device_amor: building the tool here"
    t0=$(date +%s)
    cmake --preset release -DHYMIX_BUILD_TESTS=OFF -DHYMIX_BUILD_BENCHMARKS=OFF >/tmp/cfg.log 2>&1 || { tail -20 /tmp/cfg.log; exit 1; }
    cmake --build build/release -j"$(nproc)" --target hymix_tool >/tmp/build.log 2>&1 || { grep -E 'error' -A5 /tmp/build.log | head -40; exit 1; }
    echo "device_amor: built in $(( $(date +%s) - t0 )) s"
    tool=build/release/examples/tool/hymix
    cp "$tool" "$OUT/hymix"  # the next call carries it as .tool/hymix
fi
"$tool" --version
# CALL_S: the seconds this call may take in all; the runs then train for what is left of it after the build, less a
# margin for the final evaluation, checkpoint and packing (overrides MINUTES).
if [ -n "${CALL_S:-}" ]; then
    MINUTES=$(awk -v c="$CALL_S" -v used="$(( $(date +%s) - t_call ))" 'BEGIN { printf "%.2f", (c - used - 45) / 60 }')
    export MINUTES
    echo "device_amor: training for $MINUTES minutes"
fi
# DEADLINE_S (0 = none): stop the experiment after that many seconds and still pack what it wrote, so that a call that
# would outrun its limit brings back the finished runs' logs and AMOR files.
SHARED=$PWD/.shared_models HYMIX=$tool timeout "${DEADLINE_S:-0}" bash scripts/amor_experiments.sh \
    || echo "device_amor: the experiment stopped early (exit $?): packing what it wrote"
runs=${RUNS:-build/amor_runs}
files=()
shopt -s nullglob
for r in "$runs"/*/latest; do
    ck="$(dirname "$r")/$(cat "$r")/amor.safetensors"
    if [ -f "$ck" ]; then files+=("$ck"); fi
done
for f in "$runs"/*/loss.csv "$runs"/*/loss.svg; do files+=("$f"); done  # the loss curves, also of runs not yet swept
# Whole run folders (latest checkpoint with optimizer state, loss curve) for a later call to resume.
tar czf "$OUT/amor_runs.tar.gz" -C "$runs" . || true
tar czf "$OUT/amor_docs.tar.gz" "${DOCS:-docs/amor}" "$runs"/*.out "$runs"/*.log "$runs"/*.sweep "${files[@]}" || true
