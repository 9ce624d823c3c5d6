#!/usr/bin/env bash
# Post-hoc AMOR on the shared byte-level backbones (issue 9, spec.md §5): for each backbone, trains 3 entropy-gated
# attention blocks (4 heads × 64, classic mode) on the frozen checkpoint with κ 0.2, κ 0.77 and always on (the
# paper's setup: AdamW 1e-3, 100 warmup steps then constant, betas (0.9, 0.95), weight decay 0.1 on matrices, clip 1,
# batches of 32 windows of 512 bytes, seed 1), then measures each with the held-out protocol of
# shared/models/README.md (offset 4083327, 131072 bytes, whole windows of 512 and 2048): the backbone alone, the AMOR
# stack as initialised (W_o = 0), at its trained κ, the same blocks always on, and a κ sweep at inference (fire rate
# against bits/byte). Writes under docs/amor/: results.csv, results.md, sweep_<backbone>_<variant>.csv/.svg, trace.html
# (`hymix amor-trace` of the κ 0.2 model on the first backbone), and the runs' loss curves
# (loss_<backbone>_<variant>.csv/.svg), and the fitted routers of the κ 0.2 models (router_<backbone>_k0.2.csv).
#
# Usage: scripts/amor_experiments.sh                   (one command; progress on stderr)
# Environment: SHARED (../shared), BACKBONES ("kjv-mamba2-byte kjv-gdn-byte"), VARIANTS ("k0.2 k0.77 always"),
#   STEPS (1550, the paper's budget), MINUTES (0: no limit; else each run stops after that many minutes of training,
#   which with the constant schedule is the same run cut short), THREADS (threads per run, default all cores),
#   PARALLEL (runs at once, default 1), SWEEP_THREADS (threads of the measurements, default all cores), SWEEP_KAPPAS
#   (the κ values swept at inference, comma-separated; each run's own κ is added), HYMIX (the tool; default build/release/examples/tool/hymix), RUNS (run dirs,
#   default build/amor_runs), DOCS (docs/amor), NOTE (a sentence for the report: what else ran, which machine),
#   RESUME (1: a run whose folder holds a checkpoint continues from it, so that a budget spread over several calls of
#   MINUTES each reaches STEPS; the loss curve and step count are the whole run's; a run at STEPS is not touched),
#   TRAIN_ONLY (1: stop after training), REUSE_SWEEPS (1: keep a sweep CSV newer than its run's AMOR file).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/amor_env.sh
source scripts/amor_env.sh
variants=${VARIANTS:-k0.2 k0.77 always}
steps=${STEPS:-1550} minutes=${MINUTES:-0} threads=${THREADS:-0} parallel=${PARALLEL:-1} sweep_threads=${SWEEP_THREADS:-0}
runs=${RUNS:-build/amor_runs} docs=${DOCS:-docs/amor}
sweep_kappas=${SWEEP_KAPPAS:--1,-0.5,0,0.2,0.5,0.77,1,1.5,2,3}
mkdir -p "$runs" "$docs"

kappa_of() { case $1 in k*) echo "${1#k}" ;; *) echo 0.2 ;; esac; }

# train BACKBONE VARIANT: one amor-train run into $runs/BACKBONE-VARIANT (log beside it).
train() {
    local bb=$1 v=$2 dir=$runs/$1-$2
    local args=(amor-train --model "$shared/models/$bb" --text "$text" --blocks 3 --heads 4 --head-dim 64 --residual classic
                --kappa "$(kappa_of "$v")" --steps "$steps" --minutes "$minutes" --seed 1 --threads "$threads"
                --eval-bytes 16384 --log-every 10 --checkpoint-every 100 --out "$dir")
    [ "$v" = always ] && args+=(--always-on)
    if [ "${RESUME:-0}" = 1 ] && [ -f "$dir/latest" ]; then
        if [ "$(sed -n 's/^checkpoint-//p' "$dir/latest")" -ge "$steps" ] 2>/dev/null; then
            echo "   $bb $v: already trained ($(cat "$dir/latest"))" >&2
            return 0
        fi
        args+=(--resume)
        [ ! -f "$dir.out" ] || cat "$dir.out" >>"$dir.out.earlier"  # each call's summary is kept
    else
        rm -rf "$dir" "$dir.out.earlier" "$dir.log"
    fi
    echo "== $bb $v: hymix ${args[*]}" >&2
    if ! "$tool" "${args[@]}" >"$dir.out" 2>>"$dir.log"; then
        echo "amor_experiments: $bb $v failed:" >&2
        tail -20 "$dir.log" >&2
        return 1
    fi
    echo "   $bb $v: $(grep -E '^trained' "$dir.out")" >&2
}

# Runs in the background, PARALLEL at a time; a failed run stops the others and the script.
pids=()
failed=0
stop_all() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap 'stop_all' INT TERM
for bb in $backbones; do
    for v in $variants; do
        train "$bb" "$v" &
        pids+=($!)
        if [ "${#pids[@]}" -ge "$parallel" ]; then
            wait "${pids[0]}" || failed=1
            pids=("${pids[@]:1}")
            [ "$failed" = 0 ] || { stop_all; exit 1; }
        fi
    done
done
for p in "${pids[@]}"; do wait "$p" || failed=1; done
[ "$failed" = 0 ] || exit 1
[ "${TRAIN_ONLY:-0}" != 1 ] || { echo "amor_experiments: trained (TRAIN_ONLY=1: nothing measured)" >&2; exit 0; }

# Measure every run: the backbone alone, the blocks at their trained κ (and swept), always on.
csv=$docs/results.csv
echo "backbone,variant,trained_kappa,steps,tokens,train_seconds,tokens_per_s,measured,window,bits_per_byte,fire_rate_mean,fire_block0,fire_block1,fire_block2" >"$csv"
for bb in $backbones; do
    for v in $variants; do
        dir=$runs/$bb-$v
        amor=$dir/$(cat "$dir/latest")/amor.safetensors
        kappas=$sweep_kappas
        case ",$kappas," in *",$(kappa_of "$v"),"*) ;; *) kappas="$kappas,$(kappa_of "$v")" ;; esac  # the run's own κ
        echo "== $bb $v: sweep κ over $kappas" >&2
        if [ "${REUSE_SWEEPS:-0}" = 1 ] && [ "$docs/sweep_${bb}_$v.csv" -nt "$amor" ]; then
            echo "   (REUSE_SWEEPS=1: keeping $docs/sweep_${bb}_$v.csv)" >&2
        else
            "$tool" amor-sweep --model "$shared/models/$bb" --amor "$amor" --text "$text" --kappa "$kappas" --window 512,2048 \
                --threads "$sweep_threads" --csv "$docs/sweep_${bb}_$v.csv" --svg "$docs/sweep_${bb}_$v.svg" >"$dir.sweep" 2>&1 \
                || { cat "$dir.sweep" >&2; exit 1; }
        fi
        cp "$dir/loss.csv" "$docs/loss_${bb}_$v.csv"
        cp "$dir/loss.svg" "$docs/loss_${bb}_$v.svg"
        read -r st tok secs tps < <(sed -n 's/^trained \([0-9]*\) steps (\([0-9]*\) tokens) in \([0-9.]*\) s: \([0-9]*\) tokens\/s.*/\1 \2 \3 \4/p' "$dir.out")
        k=$(kappa_of "$v")
        awk -F, -v bb="$bb" -v v="$v" -v fv="${variants%% *}" -v k="$k" -v st="$st" -v tok="$tok" -v secs="$secs" -v tps="$tps" '
            NR == 1 { next }
            { what = "" }
            $1 == "backbone" && v == fv { what = "backbone" }
            $1 == "untrained" && v == fv { what = "untrained" }
            $1 == "always_on" && v == "always" { what = "always_on" }
            $1 == "kappa" && v != "always" && ($2 + 0 == k + 0) { what = "gated" }
            what != "" { printf "%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s\n", bb, v, (v == "always" ? "" : k), st, tok, secs, tps,
                         what, $3, $4, $6, $7, $8, $9 }' "$docs/sweep_${bb}_$v.csv" >>"$csv"
    done
done

# The trace page of the first backbone's κ 0.2 model (when it was trained).
first=${backbones%% *}
if [ -f "$runs/$first-k0.2/latest" ]; then
    "$tool" amor-trace --model "$shared/models/$first" --amor "$runs/$first-k0.2/$(cat "$runs/$first-k0.2/latest")/amor.safetensors" \
        --text "$text" --bytes 4096 --threads "$sweep_threads" --out "$docs/trace.html" >&2
fi

# Fitted routers (spec.md §5.6) for each backbone's κ 0.2 model: decisions and bits/byte beside the exact gates.
for bb in $backbones; do
    dir=$runs/$bb-k0.2
    [ -f "$dir/latest" ] || continue
    "$tool" amor-router --model "$shared/models/$bb" --amor "$dir/$(cat "$dir/latest")/amor.safetensors" --text "$text" \
        --threads "$sweep_threads" --out "$dir/routers.safetensors" --csv "$docs/router_${bb}_k0.2.csv" >"$dir.router" 2>&1 \
        || { echo "amor_experiments: amor-router on $bb failed:" >&2; tail -20 "$dir.router" >&2; exit 1; }
done

# The report.
{
    echo "# AMOR on the shared byte backbones (scripts/amor_experiments.sh)"
    echo
    echo "Post-hoc AMOR (spec.md §5): 3 entropy-gated attention blocks (4 heads × 64, classic mode) trained on a frozen"
    echo "backbone of \`shared/models\`, dense-with-mask, AdamW 1e-3 (100 warmup steps, then constant), betas (0.9, 0.95),"
    echo "weight decay 0.1 on matrices, clip 1.0, 32 windows of 512 bytes per step, seed 1, on the first 95% of kjv.txt."
    echo "Budget: STEPS=$steps, MINUTES=$minutes (0 = no limit); the steps each run reached are in the table. Held-out"
    echo "bits/byte with the protocol of shared/models/README.md (131072 bytes, whole windows). Fire rates are per block"
    echo "(the untrained stack's are in the CSV: with W_o = 0 its blocks add nothing wherever they fire)."
    echo "Machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores, THREADS=$threads, PARALLEL=$parallel.${NOTE:+ $NOTE}"
    echo "Raw numbers: [results.csv](results.csv); κ sweeps at inference: sweep_*.csv / .svg; loss curves: loss_*.csv / .svg;"
    echo "a trace page: [trace.html](trace.html). For reference, shared/models/README.md gives the fixed hybrid kjv-hybrid-byte"
    echo "(4 GDN + 2 attention layers, 4.35M parameters) 1.58450 bits/byte @512 and 1.61853 @2048 (hymix reproduces both)."
    echo
    echo "| backbone | model | steps | tokens | bpb @512 | fire rates @512 | bpb @2048 | fire rates @2048 |"
    echo "|---|---|---|---|---|---|---|---|"
    awk -F, 'NR > 1 { name = ($8 == "backbone" ? "backbone alone" : $8 == "untrained" ? "+ AMOR untrained (W_o = 0)" : $8 == "always_on" ? "+ AMOR always on" : "+ AMOR κ " $3)
                      key = $1 "|" name
                      none = ($8 == "backbone" || $8 == "untrained")
                      if (!(key in seen)) { seen[key] = 1; order[++n] = key; s[key] = (none ? "-" : $4); t[key] = (none ? "-" : $5) }
                      b[key, $9] = $10; f[key, $9] = (none ? "-" : sprintf("%.3f / %.3f / %.3f", $12, $13, $14)) }
             END { for (pass = 0; pass < 2; pass++) for (i = 1; i <= n; i++) { k = order[i]; split(k, a, "|")
                   if ((a[2] == "backbone alone" || a[2] ~ /untrained/) != (pass == 0)) continue
                   printf "| %s | %s | %s | %s | %.4f | %s | %.4f | %s |\n", a[1], a[2], s[k], t[k], b[k, 512], f[k, 512], b[k, 2048], f[k, 2048] } }' "$csv"
} >"$docs/results.md"
echo "amor_experiments: wrote $docs/results.md, $csv and the sweeps" >&2
