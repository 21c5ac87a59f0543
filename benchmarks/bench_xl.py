"""GPT-2 XL on one machine: load time, wall time and peak resident memory of the main commands.

    python -m benchmarks.bench_xl [--dir /tmp/headprune-gpt2-xl] [--keep] [--out reports/bench_xl.json]

Builds a GPT-2 XL-architecture checkpoint (48 layers × 25 heads × 1600, vocab 50257, 1.56 B parameters) with
random weights in the hub's safetensors layout (``h.0.attn.c_attn.weight`` keys, the causal-mask buffers
``attn.bias``/``attn.masked_bias`` included, float32: 6.43 GB, like ``openai-community/gpt2-xl``), cut into
~2 GB shards with a ``model.safetensors.index.json`` as ``save_pretrained(max_shard_size="2GB")`` cuts them. The
files are written tensor by tensor (header first, then each tensor generated and written), so building needs
one tensor of memory, not a copy of the model. Then each measurement runs in its own process, one at a time,
and reports its wall time and peak resident set (``wait4``'s ``ru_maxrss``):

  load fp32 / load bf16   ``load_model`` alone (Python API), seconds inside the process
  info                    ``headprune info``
  eval                    ``headprune eval --max-tokens 512``
  score                   ``headprune score --methods wo_fro,ov_fro,fluct,grad --max-tokens 512``
  ablate L0, ablate L47   one layer of the zero-ablation sweep (Python API: ``cache_batch`` + ``ablate_layer``)
                          on the same 512 tokens: the first layer (the most expensive unit) and the last

The checkpoint is deleted at the end unless ``--keep``. Speed does not depend on weight values.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

XL = {"n_layer": 48, "n_head": 25, "n_embd": 1600, "vocab_size": 50257, "n_positions": 1024}
SHARD_BYTES = 2 * 10**9
TOKENS = 512


def hub_tensors(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every tensor of a hub GPT-2 checkpoint (``GPT2Model`` keys, mask buffers included)."""
    d, n, v = cfg["n_embd"], cfg["n_positions"], cfg["vocab_size"]
    out = [("wte.weight", (v, d)), ("wpe.weight", (n, d))]
    for i in range(cfg["n_layer"]):
        p = f"h.{i}."
        out += [(p + "ln_1.weight", (d,)), (p + "ln_1.bias", (d,)), (p + "attn.bias", (1, 1, n, n)),
                (p + "attn.masked_bias", ()), (p + "attn.c_attn.weight", (d, 3 * d)),
                (p + "attn.c_attn.bias", (3 * d,)),
                (p + "attn.c_proj.weight", (d, d)), (p + "attn.c_proj.bias", (d,)), (p + "ln_2.weight", (d,)),
                (p + "ln_2.bias", (d,)), (p + "mlp.c_fc.weight", (d, 4 * d)), (p + "mlp.c_fc.bias", (4 * d,)),
                (p + "mlp.c_proj.weight", (4 * d, d)), (p + "mlp.c_proj.bias", (d,))]
    return out + [("ln_f.weight", (d,)), ("ln_f.bias", (d,))]


def make_tensor(name: str, shape: tuple[int, ...], gen: torch.Generator, cfg: dict) -> torch.Tensor:
    """GPT-2's initialisation (Radford et al. 2019): N(0, 0.02) weights, residual projections scaled by 1/√(2L)."""
    if name.endswith(".attn.bias"):
        n = cfg["n_positions"]
        return torch.tril(torch.ones(n, n)).view(shape)
    if name.endswith("attn.masked_bias"):
        return torch.tensor(-1e4)
    if ".ln_" in name or name.startswith("ln_f"):
        return torch.ones(shape) if name.endswith("weight") else torch.zeros(shape)
    std = 0.02 / math.sqrt(2 * cfg["n_layer"]) if name.endswith("c_proj.weight") else 0.02
    return (torch.randn(shape, generator=gen) * std if name.endswith("weight")
            else torch.randn(shape, generator=gen) * 0.01)


def _write_shard(path: Path, tensors: list[tuple[str, tuple[int, ...]]], gen: torch.Generator, cfg: dict) -> None:
    """One safetensors file written tensor by tensor: the header (names, dtypes, offsets), then the data."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in tensors:
        size = 4 * math.prod(shape)
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # safetensors pads the header to 8 bytes
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little") + blob)
        for name, shape in tensors:
            f.write(memoryview(make_tensor(name, shape, gen, cfg).contiguous().numpy()).cast("B"))


def build_checkpoint(folder: Path, cfg: dict = XL, seed: int = 0, shard_bytes: int = SHARD_BYTES) -> int:
    """Write the sharded checkpoint into ``folder``; return its weight bytes (float32, mask buffers excluded)."""
    from safetensors import safe_open

    folder.mkdir(parents=True, exist_ok=True)
    tensors = hub_tensors(cfg)
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in tensors:
        nbytes = 4 * math.prod(shape)
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    gen = torch.Generator().manual_seed(seed)
    weight_map = {}
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        _write_shard(folder / file, shard, gen, cfg)
        with safe_open(str(folder / file), framework="pt") as check:  # the library accepts the file
            assert set(check.keys()) == {name for name, _ in shard}
        weight_map |= {name: file for name, _ in shard}
    total = sum(4 * math.prod(s) for _, s in tensors)
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    hf = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_ctx": cfg["n_positions"],
          "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new", **cfg}
    (folder / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    return sum(4 * math.prod(s) for n, s in tensors if not n.endswith((".attn.bias", ".attn.masked_bias")))


def measure(cmd: list[str], env: dict) -> dict:
    """Run ``cmd``; its wall seconds, CPU seconds (user + system: the work itself, whatever else shares the
    machine), peak resident memory (GiB) from wait4, and the last line of its stdout."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage (Popen.wait would discard it)
        proc.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{stderr[-2000:]}")
    last = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    return {"seconds": round(seconds, 1), "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
            "peak_rss_gib": round(usage.ru_maxrss / 2**20, 2), "stdout": last}


def child(args) -> None:
    """The measurements that use the Python API, run inside a measured process; prints one JSON line."""
    from headprune.data.tokens import corpus_ids
    from headprune.io.read.loading import load_model
    from headprune.io.read.tokenizer import model_tokenizer
    from headprune.perplexity import Windowing
    from headprune.scoring.ablation import ablate_layer, cache_batch

    t0, c0 = time.perf_counter(), time.process_time()
    model = load_model(args.dir, dtype=args.dtype)
    result: dict = {"load_s": round(time.perf_counter() - t0, 1), "load_cpu_s": round(time.process_time() - c0, 1)}
    if args.child == "ablate":
        ids = corpus_ids("default", "validation", model_tokenizer(model), TOKENS)
        (batch,) = Windowing.for_model(model, batch_size=1).batches(ids)
        t0, c0 = time.perf_counter(), time.process_time()
        resid_pre, base = cache_batch(model, batch)
        result |= {"forward_s": round(time.perf_counter() - t0, 1), "forward_cpu_s": round(time.process_time() - c0, 1)}
        t0, c0 = time.perf_counter(), time.process_time()
        sums = ablate_layer(model, batch, resid_pre[args.layer], args.layer, rows=8)
        result |= {"layer": args.layer, "heads": len(sums), "ablate_s": round(time.perf_counter() - t0, 1),
                   "ablate_cpu_s": round(time.process_time() - c0, 1), "baseline_nll_sum": round(base, 3)}
    print(json.dumps(result))


def measurements(args: argparse.Namespace, me: list[str], hp: list[str], model: list[str]) -> dict[str, list[str]]:
    """{name: command} of every measurement, or of those ``--only`` names."""
    runs = {
        "load fp32": me + ["--child", "load"],
        "load bf16": me + ["--child", "load", "--dtype", "bf16"],
        "info": hp + ["info", *model],
        "eval --max-tokens 512": hp + ["eval", *model, "--max-tokens", str(TOKENS), "--json"],
        "score wo_fro,ov_fro,fluct,grad": hp + ["score", *model, "--max-tokens", str(TOKENS), "--methods",
                                               "wo_fro,ov_fro,fluct,grad", "--quiet", "--overwrite",
                                               "--out", str(args.dir / "scores.csv")],
        "ablate layer 47 (abl_zero)": me + ["--child", "ablate", "--layer", str(XL["n_layer"] - 1)],
        "ablate layer 0 (abl_zero)": me + ["--child", "ablate", "--layer", "0"],
    }
    if args.only:
        wanted = args.only.split(",")
        runs = {k: v for k, v in runs.items()
                if k.split()[0] in wanted or (k.startswith("ablate") and f"ablate{k.split()[2]}" in wanted)}
    return runs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", type=Path, default=Path("/tmp/headprune-gpt2-xl"))
    p.add_argument("--keep", action="store_true", help="keep the checkpoint (default: delete it at the end)")
    p.add_argument("--reuse", action="store_true", help="use the checkpoint already in --dir (a --keep run's)")
    p.add_argument("--only", default=None, help="comma-separated measurements to run, by first word (load, info, "
                   "eval, score, ablate) or as 'ablate47' / 'ablate0' (default: all)")
    p.add_argument("--out", type=Path, default=Path("reports/bench_xl.json"))
    p.add_argument("--child", choices=["load", "ablate"], help=argparse.SUPPRESS)
    p.add_argument("--dtype", default="fp32", help=argparse.SUPPRESS)
    p.add_argument("--layer", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HEADPRUNE_CACHE": str(args.dir / "token-cache")}
    me = [sys.executable, "-m", "benchmarks.bench_xl", "--dir", str(args.dir)]
    hp = [sys.executable, "-m", "headprune"]
    model = ["--model", str(args.dir), "--device", "cpu"]
    results: dict = {"threads": torch.get_num_threads(), "torch": torch.__version__}
    if args.only and args.out.is_file():  # a partial run adds to (and replaces in) the earlier results
        results = json.loads(args.out.read_text()) | results
    try:
        t0 = time.perf_counter()
        if args.reuse and (args.dir / "model.safetensors.index.json").is_file():
            weight_bytes = sum(4 * math.prod(s) for n, s in hub_tensors(XL)
                               if not n.endswith((".attn.bias", ".attn.masked_bias")))
        else:
            weight_bytes = build_checkpoint(args.dir)
            results["build_s"] = round(time.perf_counter() - t0, 1)
        results["weights_gib"] = round(weight_bytes / 2**30, 2)
        results["files_gib"] = round(sum(f.stat().st_size for f in args.dir.glob("*.safetensors")) / 2**30, 2)
        print(f"built {args.dir}: {results['files_gib']} GiB in {results.get('build_s')} s", flush=True)
        runs = measurements(args, me, hp, model)
        for name, cmd in runs.items():
            results[name] = measure(cmd, env)
            r = results[name]
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=2) + "\n")  # after every measurement
            print(f"{name:32s} {r['seconds']:8.1f} s ({r['cpu_seconds']:7.1f} s CPU)  "
                  f"peak RSS {r['peak_rss_gib']:6.2f} GiB "
                  f"({r['peak_rss_gib'] / results['weights_gib']:.2f}x fp32 weights)  {r['stdout'][:100]}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(args.dir, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
