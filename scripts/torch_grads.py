#!/usr/bin/env python3
"""Reference gradients from PyTorch autograd for hymix's training engine (run where torch + transformers exist).

For each checkpoint directory given, loads the model with Hugging Face transformers in float64 on the CPU, feeds the
first 300 held-out KJV bytes of its reference.safetensors (input_ids [1, 300]), takes the mean next-byte
cross-entropy over the 299 predictions (computed in float64) and back-propagates. Writes
OUT_DIR/<model>.json with the loss, and for every parameter tensor (Hugging Face names) its gradient's L2 norm and
the gradient at 24 seeded positions (flat indices listed), small enough to keep in the repository.

    python3 scripts/torch_grads.py OUT_DIR MODEL_DIR [MODEL_DIR ...]
"""
import json
import sys
import zlib
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for d in map(Path, sys.argv[2:]):
        ids = load_file(str(d / "reference.safetensors"))["input_ids"].to(torch.long)
        model = AutoModelForCausalLM.from_pretrained(str(d), torch_dtype=torch.float64)
        model.train(False)
        logits = model(input_ids=ids, use_cache=False).logits  # float64 (transformers' own loss casts to float32)
        loss = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:])
        loss.backward()
        grads = {}
        for name, p in model.named_parameters():
            if p.grad is None:
                continue
            g = p.grad.detach().reshape(-1).numpy()
            rng = np.random.default_rng(zlib.crc32(name.encode()))
            idx = sorted(set(int(i) for i in rng.integers(0, g.size, size=min(24, g.size))))
            grads[name] = {"shape": list(p.shape), "norm": float(np.linalg.norm(g)), "index": idx,
                           "value": [float(g[i]) for i in idx]}
        rec = {"model": d.name, "loss": float(loss), "n_predictions": int(ids.shape[1] - 1),
               "torch": torch.__version__, "dtype": "float64", "grads": grads}
        head = {k: v for k, v in rec.items() if k != "grads"}
        lines = [json.dumps(head)[:-1] + ', "grads": {']
        lines += [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in grads.items()]
        lines[-1] = lines[-1].rstrip(",")
        (out / f"{d.name}.json").write_text("\n".join(lines) + "\n}}\n")
        print(f"{d.name}: loss {rec['loss']:.10f}, {len(grads)} gradient tensors")


if __name__ == "__main__":
    main()
