#!/usr/bin/env bash
# The `hymix` tool's own tests on a tiny random checkpoint written by `check tiny` (no shared files needed): exit
# codes, messages for bad arguments, non-finite weights and results, generation options, short texts, logits.
#   cli_test.sh TOOL CHECK WORK_DIR GROUP      (GROUP: args nonfinite generate score logits train amor)
set -uo pipefail
export LC_ALL=C  # strings are bytes
tool=$1 check=$2 work=$3 group=$4
rm -rf "$work"
mkdir -p "$work"
unset HYMIX_MODEL
failures=0
tiny=$work/tiny
"$check" tiny "$tiny" || { echo "FAIL: could not write the tiny checkpoint"; exit 1; }

# run ARGS...: the tool's stdout, stderr and both (in order) land in $work/{out,err,all}; status in $rc.
run() {
    "$tool" "$@" >"$work/out" 2>"$work/err"
    rc=$?
    "$tool" "$@" >"$work/all" 2>&1
}
# expect CODE REGEX ARGS...: exit status CODE and REGEX found in the combined output.
expect() {
    local code=$1 pattern=$2
    shift 2
    run "$@"
    if [ "$rc" != "$code" ] || ! grep -aqE -- "$pattern" "$work/all"; then
        echo "FAIL: hymix $* -> exit $rc (expected $code; output should match: $pattern)"
        sed 's/^/    /' "$work/all" | head -c 3000
        failures=$((failures + 1))
    else
        echo "ok:   hymix $* -> $code"
    fi
}
# expect1 CODE REGEX ARGS...: as expect, running the command once (commands with side effects: train).
expect1() {
    local code=$1 pattern=$2
    shift 2
    "$tool" "$@" >"$work/all" 2>&1
    rc=$?
    if [ "$rc" != "$code" ] || ! grep -aqE -- "$pattern" "$work/all"; then
        echo "FAIL: hymix $* -> exit $rc (expected $code; output should match: $pattern)"
        sed 's/^/    /' "$work/all" | head -c 3000
        failures=$((failures + 1))
    else
        echo "ok:   hymix $* -> $code"
    fi
}
# absent REGEX: the last output does not match REGEX.
absent() {
    if grep -aqE -- "$1" "$work/all"; then
        echo "FAIL: the output of the last command matches '$1'"
        failures=$((failures + 1))
    fi
}
# same FILE1 FILE2 WHAT
same() {
    if cmp -s "$1" "$2"; then echo "ok:   $3"; else echo "FAIL: $3 ($1 and $2 differ)"; failures=$((failures + 1)); fi
}

case $group in
args)
    expect 1 "no command given" 
    expect 1 "unknown command 'foo'" foo
    expect 0 "^hymix [0-9]+\.[0-9]+\.[0-9]+ \(SIMD" --version
    expect 0 "Exit status" --help
    for code in 0 1 2 3 4 5; do grep -q "^  $code  " "$work/out" || { echo "FAIL: --help does not list exit status $code"; failures=$((failures + 1)); }; done
    expect 0 "temperature.*=0\.8" generate --help
    for d in "=128" "=512" "random, printed" "max_position_embeddings" "=1 " "=64" "=0 "; do
        grep -q -- "$d" "$work/out" || { echo "FAIL: generate --help does not show the default '$d'"; failures=$((failures + 1)); }
    done
    expect 0 "to the end of the text" score --help
    expect 0 "Exit status" info --help
    expect 1 "--threads: 'abc' is not a whole number \(expected 0 to [0-9]+" info -m "$tiny" --threads abc
    expect 1 "--threads: '-1' is out of range \(expected 0 to [0-9]+" info -m "$tiny" --threads -1
    expect 1 "--threads: '1000' is out of range" info -m "$tiny" --threads 1000
    absent "TBB"
    expect 1 "--threads: '9{37}\.\.\.' is out of range" info -m "$tiny" --threads "$(printf '9%.0s' {1..300})"
    absent "[0-9]{40}"
    expect 1 "--threads: '2\.5' is not a whole number" info -m "$tiny" --threads 2.5
    expect 1 "--threads is given 2 times; it takes one value" info -m "$tiny" --threads 1 --threads 2
    expect 2 "is a file, not a directory.*--model '.*tiny'" info --model "$tiny/config.json"
    expect 2 "model directory '/nonexistent/model' does not exist" info --model /nonexistent/model
    expect 1 "unexpected arguments: a b --foo c \(--foo is not an option of 'info'\)" info -m "$tiny" a b --foo c
    expect 1 "no model given" info
    # Training needs fp32 weights: the training commands have no --weights.
    expect 1 "--weights is not an option of 'amor-train'" amor-train -m "$tiny" --text /dev/null --weights bf16
    expect 1 "--weights is not an option of 'train'" train --text /dev/null --weights bf16
    expect 0 "qwen3_5_text" info -m "$tiny"
    grep -qE "^system: backend cpu \| [0-9]+ of [0-9]+ threads \| SIMD " "$work/err" ||
        { echo "FAIL: info does not print the system line"; failures=$((failures + 1)); }
    grep -qE "^load: .* in [0-9.]+ s" "$work/err" || { echo "FAIL: info does not print the load time"; failures=$((failures + 1)); }
    HYMIX_MODEL=$tiny expect 0 "GA" info
    expect 1 "--text is required" score -m "$tiny"
    expect 1 "--top-p: '0' is out of range" generate -m "$tiny" -p x --top-p 0
    expect 1 "--n-predict: '-2' is out of range \(expected -1 to" generate -m "$tiny" -p x -n -2
    expect 1 "--temperature: 'hot' is not a number" generate -m "$tiny" -p x --temperature hot
    expect 1 "--seed: '-5' is not a seed" generate -m "$tiny" -p x --seed -5
    expect 1 "--stop: stop strings must not be empty" generate -m "$tiny" -p x --stop ""
    expect 1 "--stop: 'a\\\\q': unknown escape at byte 1" generate -m "$tiny" -p x --stop 'a\q'
    expect 1 "--prompt excludes --file" generate -m "$tiny" -p x -f /dev/null
    ;;
nonfinite)
    "$check" poison "$tiny" "$work/inf" lm_head.weight 3 inf
    "$check" poison "$tiny" "$work/nan" model.layers.0.mlp.up_proj.weight 5 nan
    head -c 700 /dev/urandom >"$work/text.bin"
    expect 3 "tensor 'lm_head.weight' \[256, 32\] in '.*' holds 32 non-finite values, the first \+Inf at \[3, 0\].*--allow-nonfinite" info -m "$work/inf"
    expect 3 "tensor 'model.layers.0.mlp.up_proj.weight' \[48, 32\] .* the first NaN at \[5, 0\]" info -m "$work/nan"
    expect 3 "tensor 'lm_head.weight'" score -m "$work/inf" --text "$work/text.bin"
    expect 0 "warning: tensor 'lm_head.weight'" info -m "$work/inf" --allow-nonfinite
    # Quantizing to i8 needs a finite absmax per row: an allowed Inf weight is still refused there, naming the tensor.
    expect 3 "lm_head: value inf at \[3, 0\] cannot be quantized to i8" info -m "$work/inf" --allow-nonfinite --weights i8
    expect 3 "score: predicting the byte at offset 1 .*(NaN|Inf)" score -m "$work/inf" --allow-nonfinite --text "$work/text.bin"
    absent "bits/byte [-+0-9n]"
    expect 3 "sampling: logits\[3\] = (NaN|\+Inf)" generate -m "$work/inf" --allow-nonfinite -p "hello" -n 8 --temperature 0
    grep -aqE "^hymix: error: sampling" "$work/all" || { echo "FAIL: generate's error is not on a fresh line"; failures=$((failures + 1)); }
    ;;
generate)
    head -c 200 /dev/urandom | tr -d '\000' | head -c 150 >"$work/p150"
    expect 0 "stopped: token limit \(-n 20\) after 20 generated tokens" generate -m "$tiny" -p "In the beginning" -n 20 --temperature 0
    cp "$work/out" "$work/greedy1"
    expect 0 "prefill: 16 tokens" generate -m "$tiny" -p "In the beginning" -n 20 --temperature 0
    same "$work/greedy1" "$work/out" "greedy generation is repeatable"
    [ "$(head -c 16 "$work/out")" = "In the beginning" ] && [ "$(wc -c <"$work/out")" = 37 ] ||
        { echo "FAIL: generate should print the prompt, 20 bytes and a newline"; failures=$((failures + 1)); }
    expect 0 "seed: [0-9]+ \(random; pass --seed to repeat this run\)" generate -m "$tiny" -p "abc" -n 30
    seed=$(grep -aoE "seed: [0-9]+" "$work/err" | cut -d' ' -f2)
    cp "$work/out" "$work/sampled1"
    expect 0 "^seed: $seed\$" generate -m "$tiny" -p "abc" -n 30 --seed "$seed"
    same "$work/sampled1" "$work/out" "a random-seed run is repeated with the printed --seed"
    expect 0 "seed: 1" generate -m "$tiny" -p "abc" -n 30 --seed 1 --top-k 5 --top-p 0.9 --min-p 0.05 --repeat-penalty 1.3 --repeat-last-n 16
    expect 0 "prefill: 150 tokens .*chunks of 7" generate -m "$tiny" -f "$work/p150" -n 24 --temperature 0 --ubatch 7
    cp "$work/out" "$work/chunked"
    expect 0 "prefill: 150 tokens .*chunks of 512" generate -m "$tiny" -f "$work/p150" -n 24 --temperature 0
    same "$work/chunked" "$work/out" "prefill in chunks of 7 gives the same greedy text as one chunk"
    expect 0 "stopped: context limit \(256 tokens, max_position_embeddings of config.json\) after 106 generated tokens" \
        generate -m "$tiny" -f "$work/p150" -n -1 --temperature 0
    [ "$(wc -c <"$work/out")" = 257 ] || { echo "FAIL: -n -1 should stop at the context limit (256 bytes + newline)"; failures=$((failures + 1)); }
    expect 0 "stopped: context limit \(160 tokens, --ctx-size\) after 10 generated tokens" \
        generate -m "$tiny" -f "$work/p150" -n 50 --temperature 0 -c 160
    head -c 300 /dev/zero | tr '\0' 'a' >"$work/p300"
    expect 1 "the prompt has 300 tokens, more than the context limit of 256 \(max_position_embeddings of config.json\).*--ctx-size 0" \
        generate -m "$tiny" -f "$work/p300" -n 4
    expect 0 "stopped: token limit \(-n 4\)" generate -m "$tiny" -f "$work/p300" -n 4 -c 0
    expect 0 "stopped: token limit \(-n 0\) after 0 generated tokens" generate -m "$tiny" -p "only the prompt" -n 0
    [ "$(cat "$work/out")" = "only the prompt" ] || { echo "FAIL: -n 0 should print the prompt only"; failures=$((failures + 1)); }
    # A stop string taken from the greedy continuation ends the generation right after its first occurrence.
    stop=$(tail -c +17 "$work/greedy1" | head -c 5 | tail -c 2)
    if [ "${#stop}" = 2 ]; then  # (not when it holds a NUL or ends in a newline, which the shell drops)
        # The same string typed with escapes: a backslash doubled, and as two \xHH bytes.
        expect 0 "stopped: stop string" generate -m "$tiny" -p "In the beginning" -n 20 --temperature 0 --stop "${stop//\\/\\\\}"
        want=$(tail -c +17 "$work/greedy1" | head -c 20)
        want=${want%%"$stop"*}$stop
        [ "$(tail -c +17 "$work/out")" = "$want" ] || { echo "FAIL: --stop '$stop' should end the text after it"; failures=$((failures + 1)); }
        hexed=$(printf '%s' "$stop" | od -An -tx1 | tr -d ' \n' | sed 's/../\\x&/g')
        expect 0 "stopped: stop string" generate -m "$tiny" -p "In the beginning" -n 20 --temperature 0 --stop "$hexed"
        [ "$(tail -c +17 "$work/out")" = "$want" ] || { echo "FAIL: --stop '$hexed' should end the text after '$stop'"; failures=$((failures + 1)); }
    else
        echo "note: no usable 2-byte stop string in the greedy text; --stop is covered by tests/text"
    fi
    expect 2 "--file: '$work/missing' does not exist" generate -m "$tiny" -f "$work/missing"
    : >"$work/empty"
    expect 2 "the prompt file '.*empty' is empty" generate -m "$tiny" -f "$work/empty"
    expect 1 "give a non-empty --prompt" generate -m "$tiny"
    ;;
score)
    head -c 1024 /dev/urandom >"$work/t1024"
    expect 0 "bits/byte [0-9]+\.[0-9]+ ± [0-9]+\.[0-9]+  \(2 windows, 1023 scored bytes" score -m "$tiny" --text "$work/t1024" --bytes 1024 --window 512
    expect 0 "offset 0  bytes 1024  window 512" score -m "$tiny" --text "$work/t1024"
    expect 0 "\(1 windows, 512 scored bytes" score -m "$tiny" --text "$work/t1024" --window 512 --full-windows
    expect 0 "\(3 windows, 1023 scored bytes" score -m "$tiny" --text "$work/t1024" --window 400 --batch 1
    grep -aqE "^\[3/3 windows\] 1023 bytes: bits/byte [0-9.]+ ± [0-9.]+" "$work/err" ||
        { echo "FAIL: score does not print the running estimate"; failures=$((failures + 1)); }
    head -c 100 "$work/t1024" >"$work/t100"
    expect 0 "\(1 windows, 99 scored bytes" score -m "$tiny" --text "$work/t100"
    expect 0 "\(1 windows, 9 scored bytes" score -m "$tiny" --text "$work/t100" --offset 50 --bytes 10
    head -c 1 "$work/t1024" >"$work/t1"
    # A text too short to score is an unusable input (2); a range too short is a command-line choice (1).
    expect 2 "nothing to score: '.*t1' has 1 byte" score -m "$tiny" --text "$work/t1"
    : >"$work/t0"
    expect 2 "nothing to score: '.*t0' has 0 byte" score -m "$tiny" --text "$work/t0"
    expect 1 "nothing to score: the range \[99, 100\)" score -m "$tiny" --text "$work/t100" --offset 99
    expect 1 "--offset 5000 is past the end" score -m "$tiny" --text "$work/t1024" --offset 5000
    expect 1 "--bytes 1000 from --offset 100 runs past the end" score -m "$tiny" --text "$work/t1024" --offset 100 --bytes 1000
    expect 1 "--full-windows needs more than --window 512" score -m "$tiny" --text "$work/t100" --full-windows
    expect 2 "--text: '$work' is a directory" score -m "$tiny" --text "$work"
    # --profile-ops: the time per op in a CSV, the largest shares on stderr; the reference backend has no op profile.
    rm -f "$work/ops.csv"
    expect 0 "ops: [0-9.]+ s inside ops of [0-9.]+ s .*largest shares: [a-z_0-9]+ [0-9.]+%" score -m "$tiny" --text "$work/t1024" --profile-ops "$work/ops.csv"
    if head -1 "$work/ops.csv" | grep -qx 'op,shapes,calls,seconds,fraction' && grep -qE '^linear,"\[[0-9,]+\] \[[0-9,]+\] \[[0-9,]+\]",[1-9][0-9]*,' "$work/ops.csv"; then
        echo "ok:   --profile-ops CSV"
    else
        echo "FAIL: --profile-ops CSV"; head -5 "$work/ops.csv"; failures=$((failures + 1))
    fi
    cp "$work/ops.csv" "$work/ops_before.csv"  # a failed command leaves an earlier profile as it was
    # (the prompt's length is checked after the model has loaded, inside the profiled part of the command)
    expect 1 "more than the context limit of 2" generate -m "$tiny" -p "a prompt of many bytes" -c 2 -n 1 --profile-ops "$work/ops.csv"
    same "$work/ops.csv" "$work/ops_before.csv" "--profile-ops: a failed command keeps the earlier file"
    expect 1 "--profile-ops times the cpu backend's ops" score -m "$tiny" --text "$work/t100" --backend ref --profile-ops "$work/ops.csv"
    expect 2 "--profile-ops: '$work/no/such/dir/ops.csv' cannot be written: no directory" score -m "$tiny" --text "$work/t100" --profile-ops "$work/no/such/dir/ops.csv"
    # Never over an input (or anything that is not a profile CSV written earlier), a directory, or a device's node.
    cp "$work/t100" "$work/t100_before"
    expect 2 "--profile-ops: '$work/t100' exists and is not a profile CSV: refusing to overwrite it" score -m "$tiny" --text "$work/t100" --profile-ops "$work/t100"
    same "$work/t100" "$work/t100_before" "--profile-ops: the text it would have overwritten is kept"
    expect 2 "--profile-ops: '$work' is a directory" score -m "$tiny" --text "$work/t100" --profile-ops "$work"
    expect 0 "per op and shape in /dev/null" score -m "$tiny" --text "$work/t100" --profile-ops /dev/null
    [ -c /dev/null ] || { echo "FAIL: --profile-ops /dev/null replaced the device"; failures=$((failures + 1)); }
    ;;
logits)
    "$check" ids "$work/ids.safetensors" 2 5 256
    expect 0 "wrote logits \[2, 5, 256\]" logits -m "$tiny" --input "$work/ids.safetensors" --output "$work/l.safetensors"
    # --profile-ops naming the command's own output: the output is kept, no profile is written over it.
    expect1 2 "--profile-ops: '$work/lp.safetensors' was written by the command itself" logits -m "$tiny" --input "$work/ids.safetensors" --output "$work/lp.safetensors" --profile-ops "$work/lp.safetensors"
    if head -1 "$work/lp.safetensors" | grep -aq '^op,shapes'; then echo "FAIL: --profile-ops overwrote logits' output"; failures=$((failures + 1)); fi
    # The same logits on the fp64 reference backend (--backend ref) agree with the CPU backend's.
    expect 0 "system: backend ref" logits -m "$tiny" --backend ref --input "$work/ids.safetensors" --output "$work/lref.safetensors"
    if "$check" logits "$work/lref.safetensors" "$work/l.safetensors" 1e-5 >"$work/cmp" 2>&1; then echo "ok:   cpu and ref backends agree"; else
        echo "FAIL: cpu and ref backends disagree: $(cat "$work/cmp")"; failures=$((failures + 1)); fi
    expect 1 "--backend: .*gpu" logits -m "$tiny" --backend gpu --input "$work/ids.safetensors" --output "$work/lx.safetensors"
    # 16-bit projection weights: named on the load line, logits within the weights' rounding of the f32 ones.
    expect 0 "load: .*; bf16 projection weights, [0-9.]+ MB\)" logits -m "$tiny" --weights bf16 --input "$work/ids.safetensors" --output "$work/lbf.safetensors"
    if "$check" logits "$work/lbf.safetensors" "$work/l.safetensors" 0.05 >"$work/cmp" 2>&1; then echo "ok:   bf16 weights close to f32"; else
        echo "FAIL: bf16 weights far from f32: $(cat "$work/cmp")"; failures=$((failures + 1)); fi
    expect 0 "f16 projection weights" logits -m "$tiny" --weights f16 --backend ref --input "$work/ids.safetensors" --output "$work/lh.safetensors"
    # 8-bit projection weights (per-row scales): named, logits within the quantization's reach of the f32 ones.
    expect 0 "load: .*; i8 projection weights, [0-9.]+ MB\)" logits -m "$tiny" --weights i8 --input "$work/ids.safetensors" --output "$work/lq.safetensors"
    if "$check" logits "$work/lq.safetensors" "$work/l.safetensors" 0.05 >"$work/cmp" 2>&1; then echo "ok:   i8 weights close to f32"; else
        echo "FAIL: i8 weights far from f32: $(cat "$work/cmp")"; failures=$((failures + 1)); fi
    expect 1 "--weights: .*int8" logits -m "$tiny" --weights int8 --input "$work/ids.safetensors" --output "$work/lx.safetensors"
    "$check" ids "$work/bad.safetensors" 1 4 300
    expect 2 "input_ids\[0, 3\] = 300 is outside the vocabulary \[0, 256\)" logits -m "$tiny" --input "$work/bad.safetensors" --output "$work/l2.safetensors"
    [ ! -e "$work/l2.safetensors" ] || { echo "FAIL: a failed logits run left an output file"; failures=$((failures + 1)); }
    # Finite weights whose logits overflow: row 3 of the LM head is 3e38 (x_i of size > 1.2 make a term overflow).
    "$check" poison "$tiny" "$work/big" lm_head.weight 3 3e38
    expect 3 "logits hold (NaN|\+Inf|-Inf) at \[0, 0, 3\]; pass --allow-nonfinite" logits -m "$work/big" --input "$work/ids.safetensors" --output "$work/l3.safetensors"
    [ ! -e "$work/l3.safetensors" ] || { echo "FAIL: non-finite logits were written"; failures=$((failures + 1)); }
    expect 2 "lm_head: value .* at \[[0-9]+, [0-9]+\] overflows f16" logits -m "$work/big" --weights f16 --input "$work/ids.safetensors" --output "$work/l4.safetensors"
    expect 0 "warning: the logits hold" logits -m "$work/big" --allow-nonfinite --input "$work/ids.safetensors" --output "$work/l3.safetensors"
    ;;
train)
    # A small text: 60 KB of a repeated pangram with line numbers (the first 95% train, the rest is held out).
    for i in $(seq 1 1200); do echo "$i the quick brown fox jumps over the lazy dog"; done >"$work/text.txt"
    common=(--text "$work/text.txt" --d-model 32 --layers 2 --head-dim 16 --d-state 8 --batch 4 --seq-len 32 --warmup 4
            --log-every 2 --eval-bytes 2048 --threads 1 --seed 5)
    small=("${common[@]}" --steps 24)
    expect1 0 "held-out bits/byte [0-9.]+" train --stack mamba2 "${small[@]}" --out "$work/a" --checkpoint-every 6
    [ -f "$work/a/loss.csv" ] && [ -f "$work/a/loss.svg" ] && [ "$(cat "$work/a/latest")" = checkpoint-24 ] \
        && echo "ok:   loss.csv, loss.svg, latest -> checkpoint-24" || { echo "FAIL: run files missing"; failures=$((failures + 1)); }
    [ "$(ls -d "$work"/a/checkpoint-* | wc -l)" = 1 ] && echo "ok:   older checkpoints removed" || { echo "FAIL: old checkpoints kept"; failures=$((failures + 1)); }
    # The trained model loads with the other commands.
    expect 0 "Mamba2ForCausalLM" info -m "$work/a/checkpoint-24"
    expect 0 "bits/byte [0-9.]+" score -m "$work/a/checkpoint-24" --text "$work/text.txt" --bytes 600
    # Interrupted at step 12 (--stop-after), then resumed: the identical loss curve.
    expect1 0 "held-out bits/byte" train --stack mamba2 "${small[@]}" --out "$work/b" --checkpoint-every 6 --stop-after 12
    [ "$(cat "$work/b/latest")" = checkpoint-12 ] && echo "ok:   stopped at checkpoint-12" || { echo "FAIL: no checkpoint-12"; failures=$((failures + 1)); }
    expect 0 "Mamba2ForCausalLM" info -m "$work/b/checkpoint-12"
    expect1 0 "resuming from" train --stack mamba2 "${small[@]}" --out "$work/b" --checkpoint-every 6 --resume
    # Timing columns (tokens/s, seconds) differ; step, tokens, loss, lr, grad norm and held-out bits/byte may not
    # (the held-out column also holds the evaluation at the stop, so compare the rows of both runs up to it).
    cut -d, -f1-5 "$work/a/loss.csv" >"$work/a.curve"
    cut -d, -f1-5 "$work/b/loss.csv" >"$work/b.curve"
    same "$work/a.curve" "$work/b.curve" "the resumed run's loss curve equals the uninterrupted one"
    # Kill at random moments: whatever 'latest' names always loads.
    for delay in 0.3 0.7 1.1; do
        rm -rf "$work/c"
        "$tool" train --stack mamba2 "${common[@]}" --steps 200 --checkpoint-every 1 --out "$work/c" >/dev/null 2>&1 &
        pid=$!
        sleep "$delay"
        kill -9 "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        if [ -f "$work/c/latest" ]; then expect 0 "Mamba2ForCausalLM" info -m "$work/c/$(cat "$work/c/latest")"; fi
    done
    expect1 1 "already holds a training run" train --stack mamba2 "${small[@]}" --out "$work/a"
    expect1 2 "must match" train --stack mamba2 "${small[@]}" --lr 0.5 --out "$work/a" --resume
    expect 1 "--stack: .*foo" train --stack foo "${small[@]}" --out "$work/x"
    expect 2 "cannot open training text" train --stack mamba2 --text "$work/missing.txt" --out "$work/x"
    # The other families train and load too (a few steps each).
    for st in gdn attention hybrid; do
        expect1 0 "held-out bits/byte" train --stack "$st" "${common[@]}" --steps 4 --d-ff 48 --linear-heads 2 --attn-heads 2 --attn-kv-heads 1 --out "$work/$st"
        expect 0 "Qwen3_5ForCausalLM" info -m "$work/$st/checkpoint-4"
    done
    # Oryx stacks train in block-random mode and run under every read-out schedule.
    for st in oryx-gdn oryx-mamba2; do
        expect1 0 "block-random mode: blocks of 8 tokens" train --stack "$st" "${common[@]}" --steps 4 --d-ff 48 --linear-heads 2 \
            --block-size 8 --p-attention 0.3 --out "$work/$st"
        expect 0 "OryxForCausalLM" info -m "$work/$st/checkpoint-4"
        for sched in all_linear all_attention linear_prefill_attention_decode periodic:4:8 block_random:0.3:8:2; do
            expect 0 "bits/byte [0-9.]+" score -m "$work/$st/checkpoint-4" --schedule "$sched" --text "$work/text.txt" --bytes 600
        done
        expect 0 "modes: linear_prefill_attention_decode" generate -m "$work/$st/checkpoint-4" --schedule linear_prefill_attention_decode \
            -p "the" -n 8 --seed 1
    done
    # A resumed Oryx run draws with the block size and P(attention) it was started with, whatever the command line says.
    expect1 0 "held-out bits/byte" train --stack oryx-gdn "${common[@]}" --steps 4 --d-ff 48 --linear-heads 2 --block-size 8 \
        --p-attention 0.3 --stop-after 2 --out "$work/oryx-r"
    expect1 0 "blocks of 8 tokens, P\(attention\) 0.3 \(the run's own" train --stack oryx-gdn "${common[@]}" --steps 4 --d-ff 48 \
        --linear-heads 2 --out "$work/oryx-r" --resume
    expect 1 "--schedule: .*unknown" score -m "$work/oryx-gdn/checkpoint-4" --schedule sometimes --text "$work/text.txt" --bytes 600
    expect 1 "--schedule: .*no per-token read-out modes" score -m "$work/a/checkpoint-24" --schedule all_linear --text "$work/text.txt" --bytes 600
    ;;
amor)
    # AMOR on a tiny Mamba-2 backbone trained here: amor-train, then the κ sweep at inference and the trace page.
    for i in $(seq 1 1200); do echo "$i the quick brown fox jumps over the lazy dog"; done >"$work/text.txt"
    base=(--text "$work/text.txt" --batch 4 --seq-len 32 --warmup 2 --log-every 2 --eval-bytes 2048 --threads 1 --seed 5)
    expect1 0 "held-out bits/byte" train --stack mamba2 "${base[@]}" --d-model 32 --layers 2 --head-dim 16 --d-state 8 --steps 4 --out "$work/bb"
    bb=$work/bb/checkpoint-4
    expect1 0 "held-out window 512: bits/byte [0-9.]+; fire rate per block: [0-9.]+ [0-9.]+" amor-train -m "$bb" "${base[@]}" \
        --blocks 2 --heads 2 --head-dim 16 --kappa 0.2 --steps 6 --out "$work/am"
    trained512=$(sed -n 's/^held-out window 512: bits\/byte \([0-9.]*\);.*/\1/p' "$work/all")
    amor=$work/am/checkpoint-6/amor.safetensors
    # A hybrid backbone (a full_attention layer, listed or by the interval rule) is refused before anything is written.
    mkdir -p "$work/hy" && cp "$bb/model.safetensors" "$work/hy/"
    qwen='"model_type": "qwen3_5_text", "hidden_size": 32, "num_hidden_layers": 2, "intermediate_size": 64, "vocab_size": 256'
    echo "{$qwen, \"layer_types\": [\"linear_attention\", \"full_attention\"]}" > "$work/hy/config.json"
    expect 2 "key 'layer_types\[1\]' = \"full_attention\": AMOR blocks train on a backbone with no attention layers.*hybrid" \
        amor-train -m "$work/hy" "${base[@]}" --blocks 2 --steps 2 --out "$work/amhy"
    echo "{$qwen, \"full_attention_interval\": 2}" > "$work/hy/config.json"
    expect 2 "full_attention_interval.* makes layer 1 full_attention: AMOR blocks train on a backbone with no attention layers" \
        amor-train -m "$work/hy" "${base[@]}" --blocks 2 --steps 2 --out "$work/amhy"
    [ ! -e "$work/amhy" ] && echo "ok:   nothing written for the hybrid backbone" \
        || { echo "FAIL: amor-train wrote into --out for a hybrid backbone"; failures=$((failures + 1)); }
    # Resuming (on a copy): other block or gate options are refused, the same ones continue the run; Ctrl-C (SIGINT)
    # stops it after the step in hand with a checkpoint (exit 130) that --resume continues (timeout -s KILL: a run the
    # signal missed cannot hang the test).
    cp -r "$work/am" "$work/am2"
    expect1 2 "these options must match" amor-train -m "$bb" "${base[@]}" --blocks 2 --heads 2 --head-dim 16 --kappa 0.9 --steps 8 \
        --out "$work/am2" --resume
    expect1 2 "these options must match" amor-train -m "$bb" "${base[@]}" --blocks 3 --heads 2 --head-dim 16 --kappa 0.2 --steps 8 \
        --out "$work/am2" --resume
    expect1 0 "resuming from .*checkpoint-6" amor-train -m "$bb" "${base[@]}" --blocks 2 --heads 2 --head-dim 16 --kappa 0.2 --steps 8 \
        --out "$work/am2" --resume
    [ "$(cat "$work/am2/latest")" = checkpoint-8 ] && echo "ok:   the resumed run reached checkpoint-8" \
        || { echo "FAIL: resumed run's latest is '$(cat "$work/am2/latest")'"; failures=$((failures + 1)); }
    timeout -s KILL 300 "$tool" amor-train -m "$bb" "${base[@]}" --blocks 2 --heads 2 --head-dim 16 --kappa 0.2 --steps 1000000 \
        --out "$work/am2" --resume >"$work/int.out" 2>"$work/int.err" &
    pid=$!
    for _ in $(seq 600); do grep -q "^step 12 " "$work/int.err" 2>/dev/null && break; sleep 0.1; done
    kill -INT "$pid"  # timeout passes it on to the tool
    wait "$pid"
    rc=$?
    step=$(sed -n 's/^checkpoint-//p' "$work/am2/latest")
    if [ "$rc" = 130 ] && grep -q "interrupted at step $step: checkpoint" "$work/int.err" && [ "${step:-0}" -ge 12 ] \
        && [ -f "$work/am2/checkpoint-$step/amor.safetensors" ]; then
        echo "ok:   SIGINT stopped amor-train at step $step with its checkpoint (exit 130)"
    else
        echo "FAIL: SIGINT: exit $rc, latest '$(cat "$work/am2/latest")'"; tail -5 "$work/int.err"; failures=$((failures + 1))
    fi
    expect1 0 "resuming from .*checkpoint-$step" amor-train -m "$bb" "${base[@]}" --blocks 2 --heads 2 --head-dim 16 --kappa 0.2 \
        --steps $((step + 2)) --out "$work/am2" --resume
    expect1 0 "already holds its $((step + 2)) steps" amor-train -m "$bb" "${base[@]}" --blocks 2 --heads 2 --head-dim 16 --kappa 0.2 \
        --steps $((step + 2)) --out "$work/am2" --resume
    expect1 0 "holds no checkpoint: starting fresh" amor-train -m "$bb" "${base[@]}" --blocks 2 --heads 2 --head-dim 16 --steps 2 \
        --out "$work/am3" --resume
    expect 0 "wrote .*sweep.svg" amor-sweep -m "$bb" --amor "$amor" --text "$work/text.txt" --eval-bytes 2048 --window 256,512 \
        --kappa -1,0.2,100 --threads 1 --csv "$work/sweep.csv" --svg "$work/sweep.svg"
    grep -q "<svg" "$work/sweep.svg" && echo "ok:   sweep.svg is an SVG" || { echo "FAIL: sweep.svg"; failures=$((failures + 1)); }
    # Rows: backbone ×2, untrained ×2, κ -1, 0.2, 100 ×2, always on ×2. The backbone never fires, always-on always does, κ 100 never;
    # a lower κ fires at least as often; the trained κ's row is amor-train's own held-out figure.
    awk -F, -v t="$trained512" '
        NR == 1 { next }
        { n++ }
        $1 == "backbone" && $6 != 0 { bad = bad " backbone-fires" }
        $1 == "always_on" && $6 != 1 { bad = bad " always_on-rate" }
        $1 == "kappa" && $2 == 100 && $6 != 0 { bad = bad " kappa100-fires" }
        $1 == "kappa" && $3 == 512 { rate[$2] = $6; if ($2 == 0.2) b = $4 }
        $1 == "untrained" { u++ }
        END { if (n != 12 || u != 2) bad = bad " rows=" n " untrained=" u
              if (!(rate[-1] >= rate[0.2] && rate[0.2] >= rate[100])) bad = bad " not-monotone"
              if (t == "" || b - t > 6e-6 || t - b > 6e-6) bad = bad " trained-kappa " b " vs " t
              if (bad != "") { print "FAIL: sweep.csv:" bad; exit 1 } }' "$work/sweep.csv" \
        && echo "ok:   sweep.csv rows agree (fire rates, the trained κ's figure)" || failures=$((failures + 1))
    expect 1 "amor-sweep needs --amor" amor-sweep -m "$bb" --text "$work/text.txt"
    expect 1 "amor-sweep needs --text" amor-sweep -m "$bb" --amor "$amor"
    # A finished sweep is re-drawn from its CSV alone; a file that is not one is refused with its name and line.
    expect 0 "wrote .*redrawn.svg" amor-sweep --from-csv "$work/sweep.csv" --svg "$work/redrawn.svg"
    grep -q "backbone @512" "$work/redrawn.svg" && echo "ok:   the re-drawn plot holds the backbone line" \
        || { echo "FAIL: redrawn.svg"; failures=$((failures + 1)); }
    expect 1 "--from-csv draws a finished sweep" amor-sweep --from-csv "$work/sweep.csv"
    expect 2 "text.txt:1: not a CSV written by hymix amor-sweep" amor-sweep --from-csv "$work/text.txt" --svg "$work/x.svg"
    expect 1 "--kappa: 'abc' is not a number" amor-sweep -m "$bb" --amor "$amor" --text "$work/text.txt" --kappa 0.2,abc
    expect 1 "--kappa: '1,,2' has an empty item" amor-sweep -m "$bb" --amor "$amor" --text "$work/text.txt" --kappa 1,,2
    expect 1 "--window: '512,' has an empty item" amor-sweep -m "$bb" --amor "$amor" --text "$work/text.txt" --window=512,
    expect 1 "unexpected argument: 0.2," amor-sweep -m "$bb" --amor "$amor" --text "$work/text.txt" --kappa 0.1 0.2,
    expect 1 "--window 4096: the held-out range has 2048 byte\(s\)" amor-sweep -m "$bb" --amor "$amor" --text "$work/text.txt" \
        --eval-bytes 2048 --window 4096
    expect 0 "wrote .*trace.html \(512 bytes traced; fire rate per block: [0-9.]+ [0-9.]+\)" amor-trace -m "$bb" --amor "$amor" \
        --text "$work/text.txt" --bytes 512 --out "$work/trace.html"
    grep -q "</html>" "$work/trace.html" && echo "ok:   trace.html is whole" || { echo "FAIL: trace.html"; failures=$((failures + 1)); }
    expect 0 "bits/byte [0-9.]+" score -m "$bb" --amor "$amor" --text "$work/text.txt" --bytes 600
    # Refused before any evaluation: a missing output folder, another backend, a directory as text, an AMOR file made
    # for the other kind of backbone, a CSV row that is not a number.
    expect 1 "--csv '.*/nodir/s.csv': the folder '.*/nodir' does not exist" amor-sweep -m "$bb" --amor "$amor" --text "$work/text.txt" \
        --csv "$work/nodir/s.csv"
    expect 1 "amor-sweep runs on the cpu backend only" amor-sweep -m "$bb" --amor "$amor" --text "$work/text.txt" --backend ref
    expect 2 "is a directory, not a file" amor-sweep -m "$bb" --amor "$amor" --text "$work"
    expect1 0 "held-out bits/byte" train --stack gdn "${base[@]}" --d-model 32 --layers 1 --head-dim 16 --linear-heads 2 --d-ff 48 --steps 2 \
        --out "$work/gdn"
    expect 2 "an AMOR file for a mamba2 backbone, but .*config.json has model_type 'qwen3_5_text'" amor-sweep -m "$work/gdn/checkpoint-2" \
        --amor "$amor" --text "$work/text.txt"
    expect1 2 "trained on another backbone" amor-train -m "$work/gdn/checkpoint-2" "${base[@]}" --blocks 2 --heads 2 --head-dim 16 \
        --kappa 0.2 --steps 12 --out "$work/am2" --resume
    expect 2 "nope.safetensors" score -m "$bb" --amor "$work/nope.safetensors" --text "$work/text.txt" --bytes 600
    { head -3 "$work/sweep.csv"; echo "kappa,0.5,256,nan,1792,0.5,0.5,0.5"; } >"$work/bad.csv"
    expect 2 "bad.csv:4: expected a row .* found 'kappa,0.5,256,nan" amor-sweep --from-csv "$work/bad.csv" --svg "$work/bad.svg"
    # Blocks trained always on never moved their gate statistics: no κ rows, only the backbone, untrained and always on.
    expect1 0 "held-out window 512: bits/byte" amor-train -m "$bb" "${base[@]}" --blocks 2 --heads 2 --head-dim 16 --always-on --steps 2 --out "$work/aa"
    expect 0 "κ does not apply" amor-sweep -m "$bb" --amor "$work/aa/checkpoint-2/amor.safetensors" --text "$work/text.txt" \
        --eval-bytes 2048 --window 512 --kappa 0.2,0.2,1 --csv "$work/aa.csv"
    [ "$(cut -d, -f1 "$work/aa.csv" | tr '\n' ' ')" = "variant backbone untrained always_on " ] && echo "ok:   always-on file: rows without κ" \
        || { echo "FAIL: always-on sweep rows: $(cut -d, -f1 "$work/aa.csv" | tr '\n' ' ')"; failures=$((failures + 1)); }
    # --calibrate sets the statistics from the training split: the same file is then swept over κ.
    expect 0 "calibrated block 1: m̄ [0-9.]+  s̄ [0-9.]+  \(320 positions" amor-sweep -m "$bb" --amor "$work/aa/checkpoint-2/amor.safetensors" \
        --text "$work/text.txt" --eval-bytes 2048 --window 512 --kappa 0,1 --calibrate 300 --calibrate-window 64 --csv "$work/aac.csv"
    [ "$(cut -d, -f1,2 "$work/aac.csv" | tr '\n' ' ')" = "variant,kappa backbone, untrained, kappa,0 kappa,1 always_on, " ] \
        && echo "ok:   calibrated always-on file: κ rows" || { echo "FAIL: calibrated sweep rows: $(cut -d, -f1,2 "$work/aac.csv" | tr '\n' ' ')"; failures=$((failures + 1)); }
    expect 1 "--calibrate: '1' is out of range \(expected 2 to" amor-sweep -m "$bb" --amor "$work/aa/checkpoint-2/amor.safetensors" --text "$work/text.txt" --calibrate 1
    expect 1 "--calibrate-window requires --calibrate" amor-sweep -m "$bb" --amor "$work/aa/checkpoint-2/amor.safetensors" --text "$work/text.txt" \
        --calibrate-window 64
    expect 1 "--calibrate and --from-csv cannot be combined" amor-sweep --from-csv "$work/aac.csv" --svg "$work/aac.svg" --calibrate 300
    # Fitted routers (spec.md §5.6): amor-router writes one per block, score / amor-trace take them with --router.
    expect1 0 "wrote .*routers.safetensors" amor-router -m "$bb" --amor "$amor" --text "$work/text.txt" --samples 512 --keep 0.5 \
        --window 128 --epochs 3 --eval-bytes 1024 --threads 1 --out "$work/routers.safetensors" --csv "$work/routers.csv"
    grep -aqE "gate cost per position and block: head [0-9]+ FLOPs .*it does not pay at this vocabulary" "$work/all" \
        && echo "ok:   amor-router states that a byte vocabulary keeps the exact gate" || { echo "FAIL: amor-router cost line"; failures=$((failures + 1)); }
    awk -F, 'NR > 1 { n++; if ($3 != 512 || $7 < 0 || $7 > 1 || $8 < 0 || $8 > 1 || $9 < 0 || $9 > 1) bad = 1 }
             END { exit !(n == 2 && !bad) }' "$work/routers.csv" \
        && echo "ok:   routers.csv: a row per block with rates in [0, 1]" || { echo "FAIL: routers.csv"; cat "$work/routers.csv"; failures=$((failures + 1)); }
    expect 0 "gates: fitted entropy routers from .*routers.safetensors" score -m "$bb" --amor "$amor" --router "$work/routers.safetensors" \
        --text "$work/text.txt" --bytes 600
    expect 0 "wrote .*trace_r.html" amor-trace -m "$bb" --amor "$amor" --router "$work/routers.safetensors" --text "$work/text.txt" \
        --bytes 256 --out "$work/trace_r.html"
    expect 1 "--router needs the AMOR blocks" score -m "$bb" --router "$work/routers.safetensors" --text "$work/text.txt"
    expect 2 "not an AMOR router file" score -m "$bb" --amor "$amor" --router "$amor" --text "$work/text.txt" --bytes 600
    expect 2 "an AMOR router file .*pass it as --router" score -m "$bb" --amor "$work/routers.safetensors" --text "$work/text.txt" --bytes 600
    expect 1 "always-on blocks: they have no entropy gate" amor-router -m "$bb" --amor "$work/aa/checkpoint-2/amor.safetensors" \
        --text "$work/text.txt"
    expect 1 "amor-router needs --amor" amor-router -m "$bb" --text "$work/text.txt"
    # Refused before any work: an output over the AMOR file or a directory; a router file for another block count; routers
    # with always-on blocks; amor-sweep takes no --router.
    expect 1 "--out '.*amor.safetensors' would overwrite the --amor file" amor-router -m "$bb" --amor "$amor" --text "$work/text.txt" --out "$amor"
    expect 1 "--out '.*' is a directory" amor-router -m "$bb" --amor "$amor" --text "$work/text.txt" --out "$work"
    expect 1 "the held-out range has 2048 byte\(s\)" amor-router -m "$bb" --amor "$amor" --text "$work/text.txt" --eval-bytes 2048 --window 2048
    # A text too short for the window is a bad input (2, as for amor-train); more samples than positions a usage error.
    expect 2 "the held-out range of .* has [0-9]+ byte\(s\); a --window of 4096 needs more" amor-router -m "$bb" --amor "$amor" \
        --text "$work/text.txt" --window 4096
    head -c 100 "$work/text.txt" >"$work/short.txt"
    expect 2 "the training split of .*short.txt' has 95 bytes; a --window of 128 needs more" amor-router -m "$bb" --amor "$amor" \
        --text "$work/short.txt" --window 128
    expect 1 "--samples 10000000 exceeds the [0-9]+ positions of the training split" amor-router -m "$bb" --amor "$amor" \
        --text "$work/text.txt" --samples 10000000
    expect 2 "always on \(every token attends\)" score -m "$bb" --amor "$work/aa/checkpoint-2/amor.safetensors" --router "$work/routers.safetensors" \
        --text "$work/text.txt" --bytes 600
    expect 1 "--router" amor-sweep -m "$bb" --amor "$amor" --router "$work/routers.safetensors" --text "$work/text.txt"
    ;;
*)
    echo "unknown group $group"
    exit 2
    ;;
esac
echo "$failures failure(s)"
[ "$failures" = 0 ]
