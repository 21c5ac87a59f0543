"""``headprune generate``: greedy decoding through headprune's KV cache (:mod:`headprune.models.decoding`), with a
streaming pattern's KV heads keeping only their sinks and recent window: the continuation, and the bytes the cache
holds against full attention's."""

from __future__ import annotations

import argparse

from headprune.cli.common import load_from_args
from headprune.cli.options import add_json_arg, add_model_args, add_pattern_arg, add_quiet_arg

HELP = "greedy decoding through a KV cache, a streaming pattern's heads holding less"
MIB = 2**20


def configure(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_pattern_arg(p)
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="the prompt text")
    prompt.add_argument("--prompt-file", help="a UTF-8 text file holding the prompt (a long context)")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens to generate (greedy), at least 1")
    p.add_argument("--chunk", type=int, help="prompt tokens fed per prefill step (default 512: "
                                             "headprune.models.decoding.DEFAULT_CHUNK)")
    add_json_arg(p, "one JSON object: prompt_tokens, new_tokens, text, kv_cache_bytes (what the cache holds at "
                    "the end), full_attention_bytes (what full attention would), streaming_kv_heads, prefill_s, "
                    "decode_tokens_per_s")
    add_quiet_arg(p)


def _prompt_ids(args: argparse.Namespace, model, tokenizer):
    """(1, T) prompt tokens: the text encoded after the model's BOS where its windows start with one."""
    import torch

    from headprune.errors import HeadpruneError
    from headprune.perplexity import Windowing

    if args.prompt is None:
        with open(args.prompt_file, encoding="utf-8") as f:
            text = f.read()
    else:
        text = args.prompt
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    bos = Windowing.for_model(model, 2).bos
    ids = ([] if bos is None else [bos]) + ids
    if not text or not ids:
        raise HeadpruneError("the prompt is empty: give some text to continue", "prompt")
    if len(ids) + args.new_tokens > model.cfg.n_positions:
        raise HeadpruneError(f"new_tokens: {len(ids):,} prompt tokens + {args.new_tokens} new exceed the model's "
                             f"context of {model.cfg.n_positions:,} tokens", "new_tokens")
    return torch.tensor([ids], device=model.device)


def _cache(args: argparse.Namespace, model):
    from headprune.models.decoding import KVCache

    if args.pattern is None:
        return KVCache(model)
    from headprune.context.pattern import check_for_model, read_pattern

    pattern = read_pattern(args.pattern)
    check_for_model(pattern, model)
    return KVCache(model, pattern.streaming_heads, pattern.sink, pattern.recent)


def run(args: argparse.Namespace) -> None:
    import json
    import time

    from headprune.cost.estimate import Estimate
    from headprune.cost.rate import Pace
    from headprune.errors import HeadpruneError
    from headprune.io.read.tokenizer import model_tokenizer
    from headprune.models.decoding import DEFAULT_CHUNK, greedy, prefill
    from headprune.models.kv_cache import kv_cache_bytes

    args.chunk = DEFAULT_CHUNK if args.chunk is None else args.chunk
    if args.new_tokens < 1 or args.chunk < 1:
        raise HeadpruneError(f"new_tokens {args.new_tokens} and chunk {args.chunk} must be at least 1", "new_tokens")
    model = load_from_args(args)
    tokenizer = model_tokenizer(model)
    prompt = _prompt_ids(args, model, tokenizer)
    cache = _cache(args, model)
    n, width = prompt.shape[1], model.dtype.itemsize
    if not args.json:
        pace = Pace.here(model, min(args.chunk, n))
        print(f"model: {args.model}; prompt: {n:,} tokens; {len(cache.streaming_heads)} KV heads streaming\n"
              + Estimate(f"for the prompt and {args.new_tokens} new tokens",
                         {"prefill": pace.seconds(model, n, n + args.new_tokens)}).line())
    t0 = time.perf_counter()
    logits = prefill(model, cache, prompt, chunk=args.chunk)
    t1 = time.perf_counter()
    new = greedy(model, cache, logits, args.new_tokens)[0].tolist()
    seconds = time.perf_counter() - t1
    held, full = cache.bytes(), kv_cache_bytes(model, cache.next, bytes_per_value=width)  # cache.next = n + new − 1
    text = tokenizer.decode(new)
    record = {"prompt_tokens": n, "new_tokens": len(new), "text": text, "kv_cache_bytes": held,
              "full_attention_bytes": full, "streaming_kv_heads": len(cache.streaming_heads),
              "prefill_s": round(t1 - t0, 2), "decode_tokens_per_s": round(len(new) / max(seconds, 1e-9), 2)}
    if args.json:
        print(json.dumps(record))
        return
    print(f"{text}\n\nKV cache holding {cache.next:,} tokens: {held / MIB:,.1f} MiB in {model.dtype} "
          f"(full attention: {full / MIB:,.1f} MiB, {held / full:.0%}); prefill {t1 - t0:.1f} s, "
          f"decoding {record['decode_tokens_per_s']} tokens/s")
