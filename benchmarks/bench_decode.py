"""Decoding at a long context with a streaming pattern (:mod:`headprune.models.decoding`) against full attention:
the KV cache's bytes, the process' peak resident memory, prefill and decode time, each way in its own process.

    python -m benchmarks.bench_decode [--model smollm2-135m-instruct] [--context 8192] [--new 32]
                                      [--pattern reports/smollm2-135m-instruct/context/pattern] [--shares chosen,0.5,1]

The prompt is the first ``--context`` − ``--new`` tokens of the long documents' test split, so that the cache
holds ``--context`` tokens at the end. The ways: full attention,
and the pattern's order (least need for the context first) with the pattern's own number of streaming KV heads
(``chosen``) and with the given shares of them streaming. Per way, in a fresh process: the cache's bytes after the
prompt and after decoding (checked equal to :func:`~headprune.models.kv_cache.kv_cache_bytes` in the model's dtype),
the peak resident memory above the loaded model and its prompt (``VmHWM`` reset through ``/proc/self/clear_refs``,
so the load's own peak does not hide it), prefill seconds, decode tokens per second, and how many greedy tokens
equal full attention's. Prints one line per way and writes ``reports/bench_decode.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from headprune.context.pattern import check_for_model, read_pattern
from headprune.io.read.loading import load_model
from headprune.io.read.tokenizer import model_tokenizer
from headprune.models.decoding import KVCache, feed, greedy, prefill
from headprune.models.kv_cache import kv_cache_bytes
from headprune.patching.long_tasks import long_windows
from headprune.perplexity import Windowing

MIB = 2**20


def resident_kib(field: str) -> int:
    """``VmRSS`` or ``VmHWM`` (the peak since the last reset) of this process, KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def measure(args: argparse.Namespace, n_streaming: int) -> dict:
    """In this process: decode the prompt with the pattern's first ``n_streaming`` KV heads streaming (−1: none)."""
    model = load_model(args.model)
    pattern = read_pattern(args.pattern)
    check_for_model(pattern, model)
    prompt = long_windows(model_tokenizer(model), length=args.context, n_windows=1, split="test",
                          bos=Windowing.for_model(model, args.context).bos)[:, :args.context - args.new]
    heads = pattern.order[:max(n_streaming, 0)]
    cache = KVCache(model, heads, pattern.sink, pattern.recent)
    rss = resident_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    t0 = time.perf_counter()
    logits = prefill(model, cache, prompt, chunk=args.chunk)
    t1 = time.perf_counter()
    bytes_prompt = cache.bytes()
    chosen = greedy(model, cache, logits, args.new)  # (1, new)
    feed(model, cache, chosen[:, -1:], last_only=True)  # the last token too: the cache ends at --context
    tokens = chosen[0].tolist()
    t2 = time.perf_counter()
    width = model.dtype.itemsize
    expected = [kv_cache_bytes(model, n, heads, pattern.sink, pattern.recent, width)
                for n in (args.context - args.new, args.context)]
    assert [bytes_prompt, cache.bytes()] == expected, ([bytes_prompt, cache.bytes()], expected)
    return {"n_streaming": len(heads), "cache_mib_prompt": bytes_prompt / MIB, "cache_mib_end": cache.bytes() / MIB,
            "peak_mib_above_model": (resident_kib("VmHWM") - rss) / 1024, "prefill_s": t1 - t0,
            "decode_tokens_per_s": args.new / (t2 - t1), "tokens": tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--context", type=int, default=8192, help="tokens in the cache at the end (prompt + new)")
    parser.add_argument("--new", type=int, default=32, help="tokens decoded after the prompt")
    parser.add_argument("--pattern", default="reports/smollm2-135m-instruct/context/pattern")
    parser.add_argument("--shares", default="chosen,0.5,1", help="shares of the pattern's order streaming")
    parser.add_argument("--chunk", type=int, default=512, help="prompt tokens per prefill step")
    parser.add_argument("--out", default="reports/bench_decode.json")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the child: KV heads streaming (−1: none)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args, args.one)))
        return
    pattern = read_pattern(args.pattern)
    counts = {"full attention": -1} | {
        f"{'chosen' if s == 'chosen' else s} ({n} of {len(pattern.order)} KV heads streaming)": n
        for s in args.shares.split(",")
        for n in [pattern.n_streaming if s == "chosen" else round(float(s) * len(pattern.order))]}
    rows = []
    for way, n in counts.items():
        cmd = [sys.executable, "-m", "benchmarks.bench_decode", *sys.argv[1:], "--one", str(n)]
        row = {"way": way} | json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        row["same_tokens_as_full"] = sum(a == b for a, b in zip(row["tokens"], rows[0]["tokens"])) if rows else None
        rows.append(row)
        print(f"{way}: cache {row['cache_mib_end']:.1f} MiB, peak {row['peak_mib_above_model']:.0f} MiB above the "
              f"model, prefill {row['prefill_s']:.1f} s, decode {row['decode_tokens_per_s']:.1f} tokens/s"
              + ("" if row["same_tokens_as_full"] is None else
                 f", {row['same_tokens_as_full']}/{args.new} greedy tokens as full attention's"))
    record = {"model": args.model, "context": args.context, "new_tokens": args.new, "pattern": args.pattern,
              "sink": pattern.sink, "recent": pattern.recent, "chunk": args.chunk, "threads": torch.get_num_threads(),
              "rows": rows}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
