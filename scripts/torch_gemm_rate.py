#!/usr/bin/env python3
"""The machine's GEMM rate for a model's prefill, measured with torch on the CPU (issue 12's reference for "prefill at
real model size ≥ 70% of the machine's GEMM rate").

For each config.json: builds the Hugging Face model with random weights (scripts/hf_cpu_bench.py's `build`), lists its
nn.Linear projections (the LM head left out: a prefill computes logits for the last position only), and times
torch.nn.functional.linear(x [T, in], w [out, in]) fp32 for every distinct shape at T tokens (best of --repeats after
two warm-up calls). The model's rate is Σ 2·T·in·out·count / Σ time·count: torch's GEMM rate on exactly the
projections that model's prefill runs. Also times one square GEMM of --square (the machine's large-GEMM rate).

Writes CSV rows to stdout: what,model,in_features,out_features,count,tokens,threads,ms,gflops

Usage: python3 scripts/torch_gemm_rate.py --threads 16 bench/configs/qwen3.5-0.8b.json bench/configs/mamba2-780m.json
Needs torch and transformers (the device machine has both).
"""
import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_cpu_bench import best_of, build  # noqa: E402


def best_time(repeats, fn):
    """hf_cpu_bench's best_of after two warm-up calls."""
    fn()
    fn()
    return best_of(repeats, fn)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--square", type=int, default=4096)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads", file=sys.stderr)
    print("what,model,in_features,out_features,count,tokens,threads,ms,gflops")
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        n = args.square
        a = torch.randn(n, n, generator=g)
        b = torch.randn(n, n, generator=g)
        t = best_time(args.repeats, lambda: torch.mm(a, b))
        print(f"square,,{n},{n},1,{n},{args.threads},{t * 1e3:.3f},{2 * n ** 3 / t / 1e9:.1f}", flush=True)
        del a, b
        for path in args.configs:
            name = os.path.splitext(os.path.basename(path))[0]
            model, _ = build(path, torch.float32)
            shapes = collections.Counter()
            for mod_name, mod in model.named_modules():
                if isinstance(mod, torch.nn.Linear) and not mod_name.endswith("lm_head"):
                    shapes[(mod.in_features, mod.out_features)] += 1
            del model
            T = args.tokens
            flops = seconds = 0.0
            for (k, o), count in sorted(shapes.items()):
                x = torch.randn(T, k, generator=g)
                w = torch.randn(o, k, generator=g)
                t = best_time(args.repeats, lambda: torch.nn.functional.linear(x, w))
                f = 2.0 * T * k * o
                flops += f * count
                seconds += t * count
                print(f"shape,{name},{k},{o},{count},{T},{args.threads},{t * 1e3:.3f},{f / t / 1e9:.1f}", flush=True)
            print(f"model,{name},,,{sum(shapes.values())},{T},{args.threads},{seconds * 1e3:.3f},{flops / seconds / 1e9:.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
