"""SmolLM2 pruned and served in llama.cpp beside stock transformers, measured side by side in one process.

    python -m benchmarks.bench_gguf_serving [--fractions 0,0.25,0.5] [--type q8_0] [--out FILE.json]

Heads ranked by ``wo_fro`` (weights only: no data, seconds). llama.cpp rows: the serving stage's GGUF prunes
(:mod:`headprune.pruning.serving_gguf`: "uniform", the best prune with the same query and KV head counts in every
layer near the fraction, a ``llama`` file; "uneven", the ranking's own heads, a ``deci`` file), perplexity on 8
windows of 128 tokens of the default corpus' test split, prefill of 512 random tokens and 32 decoding steps (median of
5 repeats after a warm-up, with the slowest and fastest). transformers rows: the uniform prunes' hf exports
(:mod:`headprune.pruning.serving`) on the same windows. llama.cpp runs on every core; compare rows of one run.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import pandas as pd


def main() -> None:
    from headprune.data.tokens import corpus_ids
    from headprune.io.read.loading import load_model
    from headprune.io.read.tokenizer import load_tokenizer
    from headprune.perplexity import Windowing
    from headprune.pruning.serving import serving_table
    from headprune.pruning.serving_gguf import export_gguf_prunes, serve_gguf_prunes
    from headprune.scoring.weights import weight_scores

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fractions", default="0,0.25,0.5")
    p.add_argument("--type", default="q8_0")
    p.add_argument("--out", default="reports/bench_gguf_serving.json")
    args = p.parse_args()
    name = "smollm2-135m-instruct"
    model = load_model(name)
    ids = corpus_ids("default", "test", load_tokenizer(name, model.cfg.vocab_size), 1024)
    windowing = Windowing.for_model(model, 128)
    layers, heads = zip(*model.head_ids)
    scores = pd.DataFrame({"layer": layers, "head": heads, "head_id": [f"L{a}H{b}" for a, b in model.head_ids],
                           "wo_fro": weight_scores(model)["wo_fro"]})
    fractions = tuple(float(f) for f in args.fractions.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        prunes, refused = export_gguf_prunes(model, scores, "wo_fro", ids, windowing, Path(tmp),
                                             fractions=fractions, gguf_type=args.type)
        llama_cpp = serve_gguf_prunes(prunes, ids, windowing, gguf_type=args.type)
    transformers = serving_table(model, scores, "wo_fro", ids, windowing, fractions)
    for runtime, table in (("llama.cpp", llama_cpp), ("transformers", transformers)):
        print(runtime, table.round(2).to_string(index=False), sep="\n", flush=True)
    Path(args.out).write_text(json.dumps({"model": name, "gguf_type": args.type, "refused": refused,
                                          "llama_cpp": llama_cpp.to_dict("records"),
                                          "transformers": transformers.to_dict("records")}, indent=2) + "\n")


if __name__ == "__main__":
    main()
