"""SmolLM2 pruned and served in llama.cpp: GGUF exports at 0/25/50% of heads removed, uniform and uneven.

    python -m benchmarks.bench_gguf_serving [--fractions 0,0.25,0.5] [--type q8_0] [--out FILE.json]

Heads ranked by ``wo_fro`` (weights only: no data, seconds); "uniform": the best prune with the same query and KV
head counts in every layer near the fraction (:func:`headprune.pruning.uniform.uniform_heads`, a ``llama`` GGUF);
"uneven": the global ranking's (a ``deci`` GGUF with per-layer head counts). Each row, from one process, one after
another:

    file_bytes            the .gguf's size (matrices in --type, norms f32)
    kv_bytes_per_token    Σ_l 2 · n_head_kv(l) · d_k · 2 (llama.cpp's default f16 cache)
    prefill_tokens_per_s  256 random tokens / median seconds of 5 timed repeats after one warm-up (min/max: spread)
    decode_tokens_per_s   32 single-token steps after them / median seconds (min/max: spread)
    ppl                   llama.cpp's perplexity on 4 windows of 256 tokens of the default corpus' test split
    headprune_ppl         headprune's float32 pruned model on the same windows

llama.cpp runs on every core of this machine (2 here); compare rows of one run.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

import pandas as pd
import torch


def _ranking(model) -> pd.DataFrame:
    from headprune.scoring.weights import weight_scores

    layers, heads = zip(*model.head_ids)
    return pd.DataFrame({"layer": layers, "head": heads, "wo_fro": weight_scores(model)["wo_fro"]})


def _row(model, pruned, path: Path, windows: list[list[int]]) -> dict:
    from headprune.pruning.llama_cpp import gguf_nll, kv_bytes_per_token, median_rate, open_gguf, time_gguf

    times = time_gguf(path, prompt=256, steps=32, repeats=5)
    prefill, decode = median_rate(256, times["prefill"]), median_rate(32, times["decode"])
    nll, count = gguf_nll(open_gguf(path, 256), windows)
    with torch.no_grad():
        x = torch.tensor(windows)
        ours = float(-torch.log_softmax(pruned(x).double(), -1)[:, :-1].gather(-1, x[:, 1:, None]).sum())
    return {"query_heads": len(pruned.head_ids), "file_bytes": path.stat().st_size,
            "kv_bytes_per_token": kv_bytes_per_token(path), "prefill_tokens_per_s": prefill[0],
            "prefill_tokens_per_s_min": prefill[1], "prefill_tokens_per_s_max": prefill[2],
            "decode_tokens_per_s": decode[0], "decode_tokens_per_s_min": decode[1],
            "decode_tokens_per_s_max": decode[2], "ppl": math.exp(nll / count), "headprune_ppl": math.exp(ours / count)}


def main() -> None:
    from headprune.data.tokens import corpus_ids
    from headprune.io.read.loading import load_model
    from headprune.io.read.tokenizer import load_tokenizer
    from headprune.io.write.gguf import export_gguf, gguf_plan
    from headprune.models.prune import prune_heads
    from headprune.pruning.selection import select_heads
    from headprune.pruning.uniform import uniform_heads

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fractions", default="0,0.25,0.5")
    p.add_argument("--type", default="q8_0")
    p.add_argument("--out", default="reports/bench_gguf_serving.json")
    args = p.parse_args()
    name = "smollm2-135m-instruct"
    model = load_model(name)
    ids = corpus_ids("default", "test", load_tokenizer(name, model.cfg.vocab_size), 1024).tolist()
    windows = [ids[i:i + 256] for i in range(0, 1024, 256)]
    scores, rows = _ranking(model), []
    for fraction in (float(f) for f in args.fractions.split(",")):
        shapes = {"uniform": uniform_heads(model, scores, "wo_fro", fraction),
                  "uneven": select_heads(scores, "wo_fro", fraction)} if fraction else {"unpruned": []}
        for shape, heads in shapes.items():
            pruned = prune_heads(model, heads)
            with tempfile.TemporaryDirectory() as tmp:
                path = export_gguf(pruned, Path(tmp) / "m.gguf", gguf_type=args.type)
                row = {"fraction": fraction, "shape": shape, "removed": len(heads), "arch": gguf_plan(pruned).arch,
                       "padded_heads": gguf_plan(pruned).padded, **_row(model, pruned, path, windows)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    Path(args.out).write_text(json.dumps({"model": name, "gguf_type": args.type, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
