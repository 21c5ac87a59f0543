"""A GGUF's hyper-parameters checked against its tensors' shapes before anything is reshaped.

The metadata says how the tensors are cut into heads; the shapes say what they hold. With ``d`` the embedding width
(``token_embd.weight``: [vocab, d]), ``d_k`` the head size (``{arch}.attention.key_length``, else d / head_count),
``h`` = head_count and ``g`` = head_count_kv, every block must have

    attn_q: [h·d_k, d]     attn_k, attn_v: [g·d_k, d]     attn_output: [d, h·d_k]     ffn_up: [feed_forward_length, d]

with g dividing h and d_k even (rotary pairs), as many ``blk.N`` as block_count, and a whole, positive count in every
count key (a string, a float or 0 is refused). A disagreement is one line naming the key, its value and what the
tensors imply, instead of a reshape error or a division by zero deep in the conversion.

``{arch}.rope.dimension_count`` (the dimensions rotary turns) must be the head size: transformers' Llama, Qwen2,
Qwen3 and Gemma 3 (and headprune's readers of them) rotate every q/k dimension, so a file with partial rotary has no
equivalent model to convert to and is refused rather than converted into one with different logits.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from headprune.errors import HeadpruneError

_BLOCK = re.compile(r"blk\.(\d+)\.")


def whole(meta: Any, key: str, default: Any = None) -> int:
    """The metadata ``{arch}.key`` as a positive whole number (``default`` where absent; required if None)."""
    value = meta.need(key) if default is None else meta.model(key, default)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise HeadpruneError(f"the GGUF's {meta.arch}.{key} is {value!r} ({type(value).__name__}), not a positive "
                             "whole number; the file's metadata is broken")
    return int(value)


def _mismatch(meta: Any, key: str, value: Any, implied: str) -> HeadpruneError:
    return HeadpruneError(f"the GGUF's {meta.arch}.{key} is {value!r}, but its tensors imply {implied}; the file's "
                          "metadata does not match its weights")


def _rows(tensors: dict[str, tuple[int, ...]], name: str) -> int | None:
    shape = tensors.get(name)
    return shape[0] if shape else None


def check_metadata(meta: Any, tensors: dict[str, tuple[int, ...]]) -> None:
    """Refuse (one line) metadata that disagrees with ``tensors`` (GGUF name -> (rows, cols), transformers' layout)."""
    embedding = tensors["token_embd.weight"]
    d = whole(meta, "embedding_length")
    if d != embedding[-1]:
        raise _mismatch(meta, "embedding_length", d, f"{embedding[-1]} (token_embd.weight is {embedding})")
    n_layers = whole(meta, "block_count")
    blocks = {int(m.group(1)) for name in tensors if (m := _BLOCK.match(name))}
    if blocks and blocks != set(range(n_layers)):  # a file without blocks fails as incomplete when loaded
        raise _mismatch(meta, "block_count", n_layers, f"{len(blocks)} blocks (blk.{min(blocks, default=0)}.. to "
                        f"blk.{max(blocks, default=-1)}.)")
    whole(meta, "context_length")
    whole(meta, "feed_forward_length")
    n_heads = whole(meta, "attention.head_count")
    if isinstance(meta.model("attention.head_count_kv"), list):
        raise HeadpruneError("the GGUF gives a KV head count per layer; headprune needs one count for every layer")
    n_kv = whole(meta, "attention.head_count_kv", n_heads)
    d_head = whole(meta, "attention.key_length", max(d // n_heads, 1))
    q_rows = _rows(tensors, "blk.0.attn_q.weight")
    if q_rows is not None and q_rows != n_heads * d_head:
        raise _mismatch(meta, "attention.head_count", n_heads, f"{q_rows} query rows (blk.0.attn_q.weight), not "
                        f"{n_heads} heads × {d_head}")
    _check_blocks(meta, tensors, n_layers, n_heads=n_heads, n_kv=n_kv, d_head=d_head, d=d)
    _check_rotary(meta, d_head)


def _check_blocks(meta: Any, tensors: dict[str, tuple[int, ...]], n_layers: int, *, n_heads: int, n_kv: int,
                  d_head: int, d: int) -> None:
    """Every block's attention and MLP shapes against the counts."""
    ff = whole(meta, "feed_forward_length")
    for i in range(n_layers):
        for part in ("attn_k", "attn_v"):
            rows = _rows(tensors, f"blk.{i}.{part}.weight")
            if rows is not None and rows != n_kv * d_head:
                raise _mismatch(meta, "attention.head_count_kv", n_kv,
                                f"{rows / d_head:g} KV heads of {d_head} (blk.{i}.{part}.weight has {rows} rows)")
        shape = tensors.get(f"blk.{i}.attn_output.weight")
        if shape is not None and shape != (d, n_heads * d_head):
            raise _mismatch(meta, "attention.head_count", n_heads, f"blk.{i}.attn_output.weight of shape {shape}, "
                            f"not ({d}, {n_heads} heads × {d_head})")
        rows = _rows(tensors, f"blk.{i}.ffn_up.weight")
        if rows is not None and rows != ff:
            raise _mismatch(meta, "feed_forward_length", ff, f"{rows} (blk.{i}.ffn_up.weight has {rows} rows)")
    if n_heads % n_kv:
        raise _mismatch(meta, "attention.head_count_kv", n_kv, f"a divisor of head_count {n_heads} (each KV head "
                        "serves a whole group of query heads)")
    if d_head % 2:
        raise _mismatch(meta, "attention.key_length", d_head, "an even head size (rotary turns pairs of dimensions)")


def _check_rotary(meta: Any, d_head: int) -> None:
    n_rot = meta.model("rope.dimension_count")
    if n_rot is None:
        return
    n_rot = whole(meta, "rope.dimension_count")
    if n_rot > d_head:
        raise _mismatch(meta, "rope.dimension_count", n_rot, f"at most the head size {d_head}")
    if n_rot < d_head:
        raise HeadpruneError(
            f"the GGUF's {meta.arch}.rope.dimension_count is {n_rot}, less than its head size {d_head} (partial "
            f"rotary); a {meta.arch} model rotates every dimension of a head in transformers and in headprune, so "
            "this file cannot be converted without changing its logits")
