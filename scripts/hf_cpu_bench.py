#!/usr/bin/env python3
"""Times Hugging Face transformers on the CPU for the same configs and the same work as bench/bench_model_sizes.cpp
(issue 12's reference point): a model built from a config.json with random weights, prefill of 512 tokens at batch 1,
then greedy decode after that 512-token prompt.

Both are timed through `generate` (the path transformers users take, KV / SSM cache included): prefill is the time of
generate(512-token prompt, 1 new token), that is the prompt's forward plus one greedy pick; decode is the time of
generate(same prompt, 1 + D new tokens) minus that, divided by D (--decode-prompt: a shorter prompt for this pair,
where a slow prefill's run-to-run noise would swamp D decode steps). Each figure is the best of `--repeats` runs, after
one warm-up call on a 16-token prompt.

Writes CSV rows to stdout: framework,model,weights,phase,batch,threads,ms,tokens_per_s (ms: per prefill call, or per
decode token)

Usage: python3 scripts/hf_cpu_bench.py --threads 16 bench/configs/qwen3.5-0.8b.json bench/configs/mamba2-780m.json
Needs torch and transformers (the device machine has both); a config transformers cannot build is reported on stderr
and skipped.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time


def build(config_path, dtype):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as d:
        shutil.copy(config_path, os.path.join(d, "config.json"))
        cfg = AutoConfig.from_pretrained(d)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    model = model.to(dtype).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model, cfg


def best_of(repeats, fn):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=16)
    ap.add_argument("--decode-prompt", type=int, default=0,
                    help="prompt length for the decode timing (0: --prompt); a short one keeps a slow prefill's noise out")
    ap.add_argument("--phases", default="prefill,decode")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--dtypes", default="f32", help="comma-separated: f32, bf16")
    args = ap.parse_args()

    import torch
    import transformers

    torch.set_num_threads(args.threads)
    print(f"# torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} threads",
          file=sys.stderr)
    print("framework,model,weights,phase,batch,threads,ms,tokens_per_s")
    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16}
    for path in args.configs:
        name = os.path.splitext(os.path.basename(path))[0]
        vocab = json.load(open(path))["vocab_size"]
        for dn in args.dtypes.split(","):
            try:
                t0 = time.perf_counter()
                model, _ = build(path, dtypes[dn])
                print(f"# {name} {dn}: built in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            except Exception as e:  # noqa: BLE001 - report and go on with the next config
                print(f"# {name} {dn}: transformers cannot build it: {type(e).__name__}: {e}", file=sys.stderr)
                continue
            g = torch.Generator().manual_seed(2)
            ids = torch.randint(0, vocab, (1, args.prompt), generator=g)
            with torch.inference_mode():
                def gen(n, prompt=ids):
                    return lambda: model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False)

                gen(2, ids[:, :16])()  # warm-up
                phases = args.phases.split(",")
                if "prefill" in phases:
                    t1 = best_of(args.repeats, gen(1))
                    print(f"transformers,{name},{dn},prefill,1,{args.threads},{t1 * 1e3:.1f},{args.prompt / t1:.2f}", flush=True)
                if "decode" in phases:
                    dp = ids[:, :args.decode_prompt] if args.decode_prompt else ids
                    t1 = best_of(args.repeats, gen(1, dp))
                    tn = best_of(args.repeats, gen(1 + args.decode_tokens, dp))
                    per = (tn - t1) / args.decode_tokens
                    print(f"transformers,{name},{dn},decode,1,{args.threads},{per * 1e3:.1f},{1 / per:.2f}", flush=True)
            del model


if __name__ == "__main__":
    main()
