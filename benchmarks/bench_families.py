"""A Llama-3.2-1B-shaped model in headprune and in stock transformers: loading, the forward, and pruned exports.

    python -m benchmarks.bench_families [--dir DIR] [--fractions 0,0.25,0.5] [--out reports/bench_families.json]

The checkpoint: Llama-3.2-1B's architecture (16 layers, 32 query / 8 KV heads of 64, d 2048, SwiGLU 8192, vocab
128256, tied embeddings, rotary with llama3 scaling) with random weights (speed does not depend on their values),
fp32, sharded safetensors with an index: 1.24 B parameters, 4.9 GB. Built once into DIR and reused.

Each measurement runs in its own process, one after another, so its peak RSS (``ru_maxrss``) is its own:

    load      ``load_model`` (headprune) and ``AutoModelForCausalLM.from_pretrained`` (transformers), then an 8-token
              forward: peak RSS / fp32 bytes; "runtime": the imports alone
    forward   headprune's forward vs transformers' eager and sdpa on the same weights, 1 × 512 tokens, interleaved
    export F  in every layer, the F·8 KV groups of lowest summed ``wo_fro`` removed with their query heads (so the
              KV cache shrinks by F), ``export_hf``; its logits on 2 × 32 tokens kept for the next stage
    serve F   :func:`headprune.pruning.serving.measure_serving` of the export in stock transformers (sdpa, as
              loaded): its head counts, max |Δlogit| against headprune's pruned model, prefill of 8 × 512 tokens
              (the KV cache filled, only the last logits computed; median of 3), decode at batch 1 and 32
              (median of 16 steps after a 16-token prompt), each rate's spread (``*_min`` / ``*_max``: the
              slowest and fastest repeat), the KV cache's bytes per token
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

SHAPE = {"vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
         "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072,
         "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": True,
         "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 8192}}
if os.environ.get("BENCH_FAMILIES_SMOKE"):  # a tiny model of the same layout, to check the script end to end
    SHAPE |= {"vocab_size": 512, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "head_dim": 4}


def peak_rss() -> float:
    """This process's peak resident set, bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0


def build(folder: Path) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM

    t0 = time.perf_counter()
    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(**SHAPE)).eval()
    hf.save_pretrained(folder, max_shard_size="2GB")
    n = sum(p.numel() for p in hf.parameters())
    return {"parameters": n, "fp32_bytes": 4 * n, "seconds": time.perf_counter() - t0}


def _fp32_bytes(folder: Path) -> int:
    return json.loads((folder / "bench_build.json").read_text())["fp32_bytes"]


def load(folder: Path, which: str) -> dict:
    """Peak RSS of loading and one 8-token forward (transformers maps safetensors lazily: the forward makes every
    weight resident, so both sides hold the whole model). ``which`` = "runtime": the imports alone."""
    import transformers  # in every process: the runtime both sides pay

    from headprune.io.read.loading import load_model

    t0 = time.perf_counter()
    x = torch.zeros(1, 8, dtype=torch.long)
    if which == "runtime":
        return {"which": which, "peak_rss": peak_rss()}
    if which == "headprune":
        model = load_model(folder)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    seconds = time.perf_counter() - t0
    with torch.no_grad():
        model(x)
    return {"which": which, "seconds": seconds, "peak_rss": peak_rss(), "x_fp32": peak_rss() / _fp32_bytes(folder)}


def forward(folder: Path, tokens: int, repeats: int) -> dict:
    from transformers import AutoModelForCausalLM

    from benchmarks.common import time_interleaved
    from headprune.io.read.loading import load_model

    ours = load_model(folder)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    x = torch.randint(0, SHAPE["vocab_size"], (1, tokens), generator=torch.Generator().manual_seed(0))

    def run_hf(impl):
        hf.set_attn_implementation(impl)
        return hf(x, use_cache=False).logits

    with torch.no_grad():
        diff = {impl: float((ours(x) - run_hf(impl)).abs().max()) for impl in ("eager", "sdpa")}
        times = time_interleaved({"headprune": lambda: ours(x), "eager": lambda: run_hf("eager"),
                                  "sdpa": lambda: run_hf("sdpa")}, repeats=repeats)
    return {"tokens": tokens, "repeats": repeats, "seconds": times, "max_abs_logit_diff": diff,
            "ratio_eager": times["headprune"] / times["eager"], "ratio_sdpa": times["headprune"] / times["sdpa"]}


def export(folder: Path, fraction: float, out: Path) -> dict:
    from headprune.io.read.loading import load_model
    from headprune.io.write.export import export_hf, hf_layout
    from headprune.models.prune import prune_heads
    from headprune.scoring.weights import weight_scores

    model = load_model(folder)
    t0 = time.perf_counter()
    cfg = model.cfg
    score = dict(zip(model.head_ids, weight_scores(model)["wo_fro"], strict=True))
    n_groups = round(fraction * cfg.n_kv_heads)
    heads = []
    for layer in range(cfg.n_layers):  # the n_groups KV groups of lowest summed wo_fro, all their query heads
        members = [[(layer, g * cfg.group_size + i) for i in range(cfg.group_size)] for g in range(cfg.n_kv_heads)]
        members.sort(key=lambda group: sum(score[h] for h in group))
        heads += [h for group in members[:n_groups] for h in group]
    pruned = prune_heads(model, heads)
    del model
    layout = hf_layout(pruned)
    export_hf(pruned, out, overwrite=True)
    x = torch.randint(0, SHAPE["vocab_size"], (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.save({"tokens": x, "logits": pruned(x)}, out / "bench_logits.pt")
    a = pruned.h[0].attn
    return {"fraction": fraction, "removed": len(heads), "query_heads": a.n_heads, "kv_heads": a.n_kv_heads,
            "layout": layout, "seconds": time.perf_counter() - t0}


def serve(folder: Path, decode_steps: int, prompt: int) -> dict:
    from headprune.pruning.serving import Workload, measure_serving

    check = torch.load(folder / "bench_logits.pt") if (folder / "bench_logits.pt").exists() else None
    work = Workload(batch=8, seq_len=512, steps=decode_steps, prompt=prompt, prefills=3)
    result = measure_serving(folder, work, check)
    return result | {"peak_rss": peak_rss()}


def _stage(*argv: str) -> dict:
    """Run one stage in a fresh process; its last stdout line is its JSON result."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "benchmarks.bench_families", *argv], capture_output=True, text=True,
                          check=False)
    if done.returncode:
        raise SystemExit(f"stage {argv} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"  {' '.join(argv[:2])}: {time.perf_counter() - t0:.0f} s wall", flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("stage", nargs="?", default="all", choices=["all", "build", "load", "forward", "export", "serve"])
    ap.add_argument("arg", nargs="?", default="")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/headprune-bench/llama-3.2-1b-shape"))
    ap.add_argument("--fractions", default="0,0.25,0.5")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--decode-steps", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--out", type=Path, default=Path("reports/bench_families.json"))
    args = ap.parse_args()
    folder: Path = args.dir
    if args.stage != "all":
        run = {"build": lambda: build(folder), "load": lambda: load(folder, args.arg),
               "forward": lambda: forward(folder, args.tokens, args.repeats),
               "export": lambda: export(folder, float(args.arg), folder.parent / f"export-{args.arg}"),
               "serve": lambda: serve(Path(args.arg), args.decode_steps, args.prompt)}[args.stage]
        print(json.dumps(run()))
        return
    print(f"Llama-3.2-1B shape, random weights, {torch.get_num_threads()} threads, checkpoint {folder}", flush=True)
    if not (folder / "bench_build.json").exists():
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "bench_build.json").write_text(json.dumps(_stage("build", "", "--dir", str(folder))))
    results: dict = {"shape": SHAPE, "threads": torch.get_num_threads(),
                     "build": json.loads((folder / "bench_build.json").read_text())}
    d = ["--dir", str(folder)]
    results["load"] = [_stage("load", which, *d) for which in ("runtime", "headprune", "transformers")]
    results["forward"] = _stage("forward", "", *d, "--tokens", str(args.tokens), "--repeats", str(args.repeats))
    results["exports"] = []
    for fraction in (float(f) for f in args.fractions.split(",")):
        entry = {"fraction": fraction}
        target = folder
        if fraction > 0:
            entry |= _stage("export", str(fraction), *d)
            target = folder.parent / f"export-{fraction}"
        entry |= _stage("serve", str(target), *d, "--decode-steps", str(args.decode_steps), "--prompt",
                        str(args.prompt))
        results["exports"].append(entry)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
