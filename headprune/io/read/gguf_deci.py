"""headprune's own ``deci`` GGUF exports read back: the uneven prune it was, as a native headprune folder.

A ``deci`` file gives each layer its own query and KV head counts (n_l, g_l) and no original head numbering. The
export's ``headprune.export`` record keeps what llama.cpp does not need: the source's head counts (h, g: query head i
read KV head ⌊i / (h/g)⌋) and each layer's kept query heads K_l (original indices). With them the layout of
:mod:`headprune.io.write.gguf_layout` is undone exactly: layer l's kept KV heads are {⌊i / (h/g)⌋ : i ∈ K_l} in order,
KV head slot s of the file serves query slots s·r_l .. s·r_l + r_l − 1 (r_l = n_l / g_l), the first c_s of them its
kept heads in order and the rest zero-weight padding, which is dropped. A layer with no head kept holds nothing (or,
where the file keeps one zero head over one zero KV head, that head is dropped).

The folder it becomes is what :func:`headprune.io.write.export.export_native` writes: the source's Llama config
with ``headprune_kept_heads`` (and ``headprune_o_bias`` where a layer has an attention output bias) and each layer's
smaller q/k/v/o tensors, so :func:`headprune.io.read.loading.load_model` reloads it as the pruned model, head names
included. A ``deci`` file without that record (another tool's Nemotron-NAS or DeciLM model: per-layer MLP widths,
no original numbering) is refused.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from headprune.errors import HeadpruneError
from headprune.io.read.gguf_metadata import Metadata

EXPORT_KEY = "headprune.export"
#: The per-head tensors :func:`deci_tensor` reduces (biases and norms are per layer).
DECI_ATTENTION = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight")


class DeciRecord:
    """The original head counts and the kept heads of a headprune ``deci`` export, checked against the file's
    per-layer counts (``heads``, ``kv_heads``)."""

    def __init__(self, meta: Any):
        raw = meta.get(EXPORT_KEY)
        record = json.loads(raw) if isinstance(raw, str) else None
        if not isinstance(record, dict) or not {"n_heads", "n_kv_heads", "kept_heads"} <= set(record):
            raise HeadpruneError("this deci GGUF was not written by headprune (no headprune.export record with the "
                                 "source's head counts); headprune reads back its own deci exports only")
        self.n_heads, self.n_kv_heads = int(record["n_heads"]), int(record["n_kv_heads"])
        self.kept: list[list[int]] = [sorted(int(h) for h in layer) for layer in record["kept_heads"]]
        self.heads = [int(n) for n in _per_layer(meta, "attention.head_count")]
        self.kv_heads = [int(n) for n in _per_layer(meta, "attention.head_count_kv")]
        n_layers = int(meta.need("block_count"))
        if not len(self.kept) == len(self.heads) == len(self.kv_heads) == n_layers:
            raise HeadpruneError(f"the deci GGUF's head counts ({len(self.heads)} layers) or its headprune.export "
                                 f"record ({len(self.kept)} layers) do not match its {n_layers} blocks")
        for layer in range(n_layers):
            self._check(layer)

    @property
    def group(self) -> int:
        """r = h / g: query heads per KV head in the source."""
        return self.n_heads // self.n_kv_heads

    def kv_of(self, layer: int) -> list[int]:
        """The kept KV heads of ``layer`` (original indices, in order)."""
        return sorted({h // self.group for h in self.kept[layer]})

    def query_slots(self, layer: int) -> list[int]:
        """The file's query-head slot of each kept head of ``layer``, in kept order (padding slots left out)."""
        kv = self.kv_of(layer)
        if not kv:
            return []
        per_kv = self.heads[layer] // len(kv)
        slots = []
        for s, g in enumerate(kv):
            mine = [h for h in self.kept[layer] if h // self.group == g]
            slots += [s * per_kv + j for j in range(len(mine))]
        return slots

    def _check(self, layer: int) -> None:
        kept, n, g = self.kept[layer], self.heads[layer], self.kv_heads[layer]
        if any(not 0 <= h < self.n_heads for h in kept) or self.n_heads % max(self.n_kv_heads, 1):
            raise HeadpruneError(f"the deci GGUF's headprune.export record keeps heads {kept} in layer {layer} of a "
                                 f"model of {self.n_heads} heads over {self.n_kv_heads} KV heads; the file is broken")
        kv = self.kv_of(layer)
        counts = [sum(1 for h in kept if h // self.group == k) for k in kv]
        fits = (n == g == 0 or (not kept and (n, g) == (1, 1)) or
                (g == len(kv) and g > 0 and n % g == 0 and n // g >= max(counts, default=0)))
        if not fits:
            raise HeadpruneError(f"the deci GGUF's layer {layer} has {n} query heads over {g} KV heads, but its "
                                 f"headprune.export record keeps heads {kept} (KV heads {kv}); the file is broken")


def _per_layer(meta: Any, key: str) -> list:
    value = meta.model(key)
    if not isinstance(value, list):
        raise HeadpruneError(f"the deci GGUF's {meta.arch}.{key} is {value!r}, not a count per layer")
    return value


def deci_tensor(record: DeciRecord, name: str, values: np.ndarray, d_head: int) -> np.ndarray | None:
    """A deci file's attention tensor of its layer (transformers' layout, rotary order already undone) reduced to
    the kept heads: q rows and W_O columns of the kept slots; k/v rows as they are; None: a dropped zero head's."""
    layer = int(name.split(".")[1])
    if not record.kept[layer]:
        return None  # an emptied layer's one zero head (or b_O, handled by the caller)
    slots = np.asarray(record.query_slots(layer))
    rows = (slots[:, None] * d_head + np.arange(d_head)).reshape(-1)
    if name.endswith("attn_q.weight"):
        return values[rows]
    if name.endswith("attn_output.weight"):
        return values[:, rows]
    return values


class DeciAsLlama(Metadata):
    """A headprune ``deci`` export's metadata read as the Llama it was pruned from: the ``deci.*`` keys, with the
    source's head counts from its ``headprune.export`` record."""

    def __init__(self, meta: Metadata, record: DeciRecord):
        self.fields, self.arch, self.prefix, self._record = meta.fields, "llama", meta.prefix, record

    def model(self, key: str, default: Any = None) -> Any:
        if key == "attention.head_count":
            return self._record.n_heads
        if key == "attention.head_count_kv":
            return self._record.n_kv_heads
        return super().model(key, default)


def check_deci_shapes(meta: DeciAsLlama, deci: DeciRecord, tensors: dict[str, tuple[int, ...]]) -> None:
    """Each layer's q/k/v tensors against its head counts, before any reshape: one line where they disagree."""
    d = int(meta.need("embedding_length"))
    d_head = int(meta.need("attention.key_length"))
    for layer, (n, g) in enumerate(zip(deci.heads, deci.kv_heads)):
        for what, rows in (("attn_q", n * d_head), ("attn_k", g * d_head), ("attn_v", g * d_head)):
            shape = tensors.get(f"blk.{layer}.{what}.weight", (0, d))
            if shape != (rows, d):
                raise HeadpruneError(f"the deci GGUF's blk.{layer}.{what}.weight is {shape}, but layer {layer}'s "
                                     f"head counts ({n} query, {g} KV heads of {d_head}) imply {(rows, d)}; the "
                                     "file's metadata does not match its weights")


def deci_fields(deci: DeciRecord, tensors: dict[str, tuple[int, ...]]) -> dict:
    """What the native folder's config adds to the source Llama's: its kept heads, and ``headprune_o_bias`` where a
    layer has an attention output bias."""
    fields: dict = {"headprune_kept_heads": deci.kept}
    if any(name.endswith("attn_output.bias") for name in tensors):
        fields["headprune_o_bias"] = True
    return fields


def fill_emptied_layers(state: dict, arch: Any, hf: dict) -> None:
    """What a native folder holds where llama.cpp's ``deci`` holds nothing: an emptied layer's zero-size q/k/v/o,
    its attention norm (ones: it normalises the input of no head) and, with ``headprune_o_bias``, a zero b_O."""
    import torch

    d, d_head = hf["hidden_size"], hf["head_dim"]
    for layer in range(hf["num_hidden_layers"]):
        fills: dict[str, tuple[int, ...] | None] = {"attn_q.weight": (0, d), "attn_k.weight": (0, d),
                                                    "attn_v.weight": (0, d), "attn_output.weight": (d, 0),
                                                    "attn_norm.weight": None}
        if hf.get("headprune_o_bias"):
            fills["attn_output.bias"] = (d,)
        for what, shape in fills.items():
            name = arch.hf_name(f"blk.{layer}.{what}")
            assert name is not None and d_head > 0
            if name not in state:
                state[name] = torch.ones(d) if shape is None else torch.zeros(shape)
