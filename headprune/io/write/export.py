"""Pruned models saved to folders, for every family: ``native`` (the really smaller tensors, reloads in headprune)
and ``hf`` (stock transformers' ``from_pretrained``), written atomically by :mod:`headprune.io.write.export_folder`.
Both keep the source's special token ids and, unless ``dtype`` is given, its weights' dtype
(:mod:`headprune.io.write.export_source`), and carry the source folder's tokenizer and licence files.

config.json: written from the model's config where the family record has a ``config_writer`` (GPT-2), else the
source checkpoint's own, with ``headprune_kept_heads`` (native) and ``headprune_o_bias`` (native, where b_O holds a
constant the family has no bias for); :func:`headprune.io.read.loading.load_model` reloads a native export exactly.

``hf``, two layouts:

* **compact** when the family's record allows it (transformers reads ``head_dim``: the Llama-like decoders and
  Gemma 3) and the prune is *uniform*: every layer keeps the same h' query heads and h_kv' KV heads, each kept KV
  head serving r = h'/h_kv' of them (transformers' ``repeat_kv`` pairs query head i with KV head ⌊i/r⌋). The kept
  heads, in original order, are already grouped by KV head, so the smaller tensors are written as they are, with
  ``num_attention_heads = h'``, ``num_key_value_heads = h_kv'`` and ``head_dim`` in the config.
* **zeroed** otherwise (always for GPT-2 and GPT-NeoX, which derive their head size from d/h): the original
  shapes, each removed query head's q rows (and bias) and W_O columns zero, each KV head whose query heads all went
  with zero k/v rows, so a removed head adds exactly 0 (``HeadAttention.full_width_state``).

b_O: a compensation constant (mean/optimal fills, value-bias folding) lives in the o_proj bias. GPT-2 always has
one; Llama, Qwen3 and Gemma 3 only with ``attention_bias``, which also gives q/k/v biases: the export sets it and
writes the missing q/k/v biases as zeros (the same model); GPT-NeoX likewise. Mistral and Qwen2 have no o_proj bias
at all in transformers: such an export is refused (use ``native``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from headprune.errors import HeadpruneError
from headprune.io.write.export_folder import write_checkpoint, write_export
from headprune.io.write.export_source import cast_floats, dtype_name, export_dtype, source_token_ids
from headprune.models.base import HeadModel
from headprune.models.families import ModelFamily, family_of, loadable_head_count, model_type
from headprune.models.heads import head_id
from headprune.models.prune import removed_heads


def _source_config(model: HeadModel, dtype: torch.dtype) -> dict:
    """The export's config.json before its layout: the family's own writer's, else the source config.json (special
    token ids and all), its ``dtype`` the export's."""
    from headprune.io.read.loading import parse_config_json

    writer = family_of(model).config_writer
    if writer is not None:
        unpruned = dataclasses.replace(model.cfg, kept_heads=[])
        return writer(unpruned) | source_token_ids(model) | {"dtype": dtype_name(dtype)}
    if model.origin.folder is None:
        raise HeadpruneError(f"exporting a {model_type(model)} model needs the config.json it was loaded from; this "
                             "model has no source folder (load it with headprune.io.read.loading.load_model)")
    hf = parse_config_json(model.origin.folder)
    for key in ("headprune_kept_heads", "headprune_o_bias", "torch_dtype"):
        hf.pop(key, None)
    hf["dtype"] = dtype_name(dtype)
    return hf


def _has_o_constant(model: HeadModel) -> bool:
    """Whether some b_O is non-zero in a model that stores an o_proj bias (``cfg.o_bias``: the source's own, or
    one pruning or folding gave it)."""
    return model.cfg.o_bias and any(bool(blk.attn.b_O.detach().ne(0).any()) for blk in model.h)


def is_uniform(model: HeadModel) -> bool:
    """Every layer the same h' ≥ 1 query heads and h_kv' KV heads, each KV head serving h'/h_kv' consecutive kept
    query heads (``repeat_kv``'s layout)."""
    layouts = {(blk.attn.n_heads, blk.attn.n_kv_heads) for blk in model.h}
    return len(layouts) == 1 and min(layouts)[0] > 0 and all(blk.attn.one_to_one or blk.attn.repeat_kv_layout
                                                             for blk in model.h)


def is_compact(model: HeadModel) -> bool:
    """Whether stock transformers can hold the prune at smaller shapes: a family whose record allows it, a uniform
    prune (:func:`is_uniform`), and a query head count its config accepts (:func:`~.families.loadable_head_count`)."""
    return (family_of(model).compact_export and is_uniform(model)
            and loadable_head_count(model_type(model), model.cfg.d_model, model.h[0].attn.n_heads))


def hf_layout(model: HeadModel) -> str:
    """The one line ``prune --format hf`` prints about what it wrote."""
    if is_compact(model):
        a = model.h[0].attn
        return (f"hf export: compact, {a.n_heads} query / {a.n_kv_heads} KV heads per layer (was "
                f"{model.cfg.n_heads} / {model.cfg.n_kv_heads}), loads at smaller shapes in stock transformers")
    n = model.h[0].attn.n_heads
    why = (f"{model_type(model)} derives its head size from d/h" if not family_of(model).compact_export
           else "the prune is not uniform: that needs the same query and KV head counts in every layer, each KV "
                "head serving as many query heads" if not is_uniform(model)
           else f"transformers' config needs hidden_size {model.cfg.d_model} to be a multiple of "
                f"num_attention_heads {n}; prune --uniform chooses only counts it accepts")
    return f"hf export: original shapes with the removed heads zeroed ({why})"


def full_width_state(model: HeadModel) -> dict[str, Tensor]:
    """Our state dict at the original head counts: attention tensors rebuilt, removed heads' rows and columns zero;
    the others are the model's own tensors (not copies: an export only reads them)."""
    state = dict(model.state_dict())
    for layer, blk in enumerate(model.h):
        state.update(blk.attn.full_width_state(f"h.{layer}.attn.", model.cfg))
    return state


def _add_o_bias(model: HeadModel, hf: dict, state: dict[str, Tensor]) -> None:
    """Make the HF config hold b_O (see the module docstring), or drop it when it is zero / native."""
    family = family_of(model)
    if not _has_o_constant(model):
        if not family.native_o_bias(hf):
            for key in [k for k in state if k.endswith((".attn.o_proj.bias", ".attn.dense.bias"))]:
                del state[key]
        return
    if family.native_o_bias(hf):
        return
    if family.o_bias_switch is None:
        raise HeadpruneError(f"transformers' {model_type(model)} has no o_proj bias, so an hf export cannot hold the "
                             "compensation constant (mean/optimal fills or folded value biases) in b_O; export "
                             "--format native")
    hf[family.o_bias_switch] = True
    for key, t in list(state.items()):  # the q/k/v biases attention_bias brings, as zeros
        for weight, bias in ((".q_proj.weight", ".q_proj.bias"), (".k_proj.weight", ".k_proj.bias"),
                             (".v_proj.weight", ".v_proj.bias"), (".query_key_value.weight", ".query_key_value.bias")):
            if key.endswith(weight) and key.replace(weight, bias) not in state:
                state[key.replace(weight, bias)] = t.new_zeros(t.shape[0])


def _writer(model: HeadModel, family: ModelFamily, hf: dict, state: dict[str, Tensor],
            marker: dict, dtype: torch.dtype) -> Callable[[Path], None]:
    def write(tmp: Path) -> None:
        tensors = {family.hf_key(k): v.cpu() for k, v in cast_floats(state, dtype).items()}
        write_checkpoint(tmp, hf, tensors, model.origin.folder, marker)

    return write


def _marker(model: HeadModel, fmt: str, metadata: dict | None) -> dict:
    return {"format": fmt, "source": model.origin.source, "family": model_type(model),
            "removed_heads": [head_id(*h) for h in removed_heads(model)], **(metadata or {})}


def export_native(model: HeadModel, folder: str | os.PathLike, *, overwrite: bool = False,
                  metadata: dict | None = None, dtype: str | torch.dtype | None = None) -> Path:
    """Save a (pruned) model as a headprune checkpoint that :func:`headprune.io.read.loading.load_model` reloads
    exactly: config.json (with ``headprune_kept_heads``), model.safetensors with the smaller tensors, the source
    folder's tokenizer and licence files, and headprune_export.json (what was removed, plus ``metadata``). Weights in
    ``dtype``, by default the source checkpoint's."""
    dtype = export_dtype(model, dtype)
    hf, family = _source_config(model, dtype), family_of(model)
    if model.cfg.is_pruned:
        hf["headprune_kept_heads"] = model.cfg.kept_heads
    state = {k: v for k, v in model.state_dict().items()}
    if model.cfg.o_bias and not family.native_o_bias(hf):
        hf["headprune_o_bias"] = True
    elif not model.cfg.o_bias:
        state = {k: v for k, v in state.items() if not k.endswith((".attn.o_proj.bias", ".attn.dense.bias"))}
    marker = _marker(model, "native", {**(metadata or {}), "dtype": dtype_name(dtype)})
    return write_export(folder, _writer(model, family, hf, state, marker, dtype), overwrite)


def export_hf(model: HeadModel, folder: str | os.PathLike, *, overwrite: bool = False,
              metadata: dict | None = None, dtype: str | torch.dtype | None = None) -> Path:
    """Save a (pruned) model for stock transformers: compact when its family allows it and the prune is uniform,
    else zeroed at the original shapes (module docstring); in ``dtype``, by default the source checkpoint's."""
    dtype = export_dtype(model, dtype)
    hf, family = _source_config(model, dtype), family_of(model)
    compact = is_compact(model)
    if compact:
        a = model.h[0].attn
        hf.update(num_attention_heads=a.n_heads, num_key_value_heads=a.n_kv_heads, head_dim=model.cfg.d_head)
        state = dict(model.state_dict())  # the model's own tensors: an export only reads them
    else:
        state = full_width_state(model)
    _add_o_bias(model, hf, state)
    marker = _marker(model, "hf", {"layout": "compact" if compact else "zeroed", **(metadata or {}),
                                   "dtype": dtype_name(dtype)})
    return write_export(folder, _writer(model, family, hf, state, marker, dtype), overwrite)
