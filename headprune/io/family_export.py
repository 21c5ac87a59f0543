"""Exports of a (pruned) Llama / Mistral / Qwen2 / Qwen3 / GPT-NeoX model (GPT-2's are :mod:`.export`).

``native``: the pruned model's smaller tensors under the checkpoint's own key names, config.json the source's with
``headprune_kept_heads`` (and ``headprune_o_bias`` where b_O holds a constant the family has no bias for);
:func:`headprune.io.loading.load_model` reloads it exactly.

``hf`` (stock ``AutoModelForCausalLM``), two layouts:

* **compact** when the prune is *uniform*: every layer keeps the same h' query heads and h_kv' KV heads, each kept
  KV head serving r = h'/h_kv' of them (transformers' ``repeat_kv`` pairs query head i with KV head ⌊i/r⌋). The kept
  heads, in original order, are already grouped by KV head, so the smaller tensors are written as they are, with
  ``num_attention_heads = h'``, ``num_key_value_heads = h_kv'`` and ``head_dim`` in the config (Llama, Mistral,
  Qwen2, Qwen3 all read ``head_dim`` when present). Only the Llama-like decoders: GPT-NeoX derives its head size
  from d/h.
* **zeroed** otherwise (and always for GPT-NeoX): the original shapes, each removed query head's q rows (and bias)
  and o_proj columns zero, each KV head whose query heads all went with zero k/v rows, so a removed head adds
  exactly 0 (its o_proj columns are 0).

b_O: a compensation constant (mean/optimal fills, value-bias folding) lives in the o_proj bias. Llama and Qwen3 have
one only with ``attention_bias``, which also gives q/k/v biases: the export sets ``attention_bias`` and writes the
missing q/k/v biases as zeros (the same model). GPT-NeoX likewise with its ``attention_bias``. Mistral and Qwen2 have
no o_proj bias at all in transformers: such an export is refused (use ``native``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from headprune.errors import HeadpruneError
from headprune.io.export_source import cast_floats, dtype_name, export_dtype
from headprune.models.base import HeadModel
from headprune.models.families import REGISTRY, Family, loadable_head_count, model_type
from headprune.models.heads import head_id

O_BIAS_SWITCH = {"llama": "attention_bias", "qwen3": "attention_bias", "gemma3_text": "attention_bias",
                 "gpt_neox": "attention_bias"}


def _source_config(model: HeadModel, dtype: torch.dtype) -> dict:
    """The source config.json (special token ids and all), its ``dtype`` the export's."""
    from headprune.io.loading import parse_config_json

    if model.origin.folder is None:
        raise HeadpruneError(f"exporting a {model_type(model)} model needs the config.json it was loaded from; this "
                             "model has no source folder (load it with headprune.io.loading.load_model)")
    hf = parse_config_json(model.origin.folder)
    for key in ("headprune_kept_heads", "headprune_o_bias", "torch_dtype"):
        hf.pop(key, None)
    hf["dtype"] = dtype_name(dtype)
    return hf


def _has_o_constant(model: HeadModel) -> bool:
    """Whether some b_O is non-zero while the source checkpoint has no o_proj bias of its own."""
    return model.cfg.o_bias and any(bool(blk.attn.b_O.detach().ne(0).any()) for blk in model.h)


def is_uniform(model: HeadModel) -> bool:
    """Every layer the same h' ≥ 1 query heads and h_kv' KV heads, each KV head serving h'/h_kv' consecutive kept
    query heads (``repeat_kv``'s layout)."""
    layouts = {(blk.attn.n_heads, blk.attn.n_kv_heads) for blk in model.h}
    return len(layouts) == 1 and min(layouts)[0] > 0 and all(blk.attn.one_to_one or blk.attn.repeats
                                                             for blk in model.h)


def is_compact(model: HeadModel) -> bool:
    """Whether stock transformers can hold the prune at smaller shapes: a Llama-like family, a uniform prune
    (:func:`is_uniform`), and a query head count its config accepts (:func:`~.families.loadable_head_count`)."""
    kind = model_type(model)
    return (kind != "gpt_neox" and is_uniform(model)
            and loadable_head_count(kind, model.cfg.d_model, model.h[0].attn.n_heads))


def hf_layout(model: HeadModel) -> str:
    """The one line ``prune --format hf`` prints about what it wrote."""
    if is_compact(model):
        a = model.h[0].attn
        return (f"hf export: compact, {a.n_heads} query / {a.n_kv_heads} KV heads per layer (was "
                f"{model.cfg.n_heads} / {model.cfg.n_kv_heads}), loads at smaller shapes in stock transformers")
    n = model.h[0].attn.n_heads
    why = ("GPT-NeoX derives its head size from d/h" if model_type(model) == "gpt_neox"
           else "the prune is not uniform: that needs the same query and KV head counts in every layer, each KV "
                "head serving as many query heads" if not is_uniform(model)
           else f"transformers' LlamaConfig needs hidden_size {model.cfg.d_model} to be a multiple of "
                f"num_attention_heads {n}; prune --uniform chooses only counts it accepts")
    return f"hf export: original shapes with the removed heads zeroed ({why})"


def _rows(heads: list[int], width: int, device: torch.device) -> Tensor:
    """Indices of ``width`` consecutive rows per head."""
    return (torch.tensor(heads, dtype=torch.long, device=device).view(-1, 1) * width
            + torch.arange(width, device=device)).reshape(-1)


def _widen(t: Tensor, dim: int, index: Tensor, size: int) -> Tensor:
    shape = list(t.shape)
    shape[dim] = size
    return t.new_zeros(shape).index_copy_(dim, index, t)


def _zeroed_state(model: HeadModel) -> dict[str, Tensor]:
    """Our state dict at the original head counts: removed heads' rows and columns zero."""
    cfg, dk = model.cfg, model.cfg.d_head
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for layer, kept in enumerate(cfg.kept_heads):
        pre, dev = f"h.{layer}.attn.", model.device
        if model_type(model) == "gpt_neox":
            qkv, cols = _rows(kept, 3 * dk, dev), _rows(kept, dk, dev)
            for name in ("query_key_value.weight", "query_key_value.bias"):
                if pre + name in state:
                    state[pre + name] = _widen(state[pre + name], 0, qkv, 3 * cfg.n_heads * dk)
            state[pre + "dense.weight"] = _widen(state[pre + "dense.weight"], 1, cols, cfg.n_heads * dk)
            continue
        q, kv = _rows(kept, dk, dev), _rows(cfg.kept_kv_heads(layer), dk, dev)
        for proj, index, n in (("q_proj", q, cfg.n_heads), ("k_proj", kv, cfg.n_kv_heads),
                               ("v_proj", kv, cfg.n_kv_heads)):
            for part in ("weight", "bias"):
                if pre + f"{proj}.{part}" in state:
                    state[pre + f"{proj}.{part}"] = _widen(state[pre + f"{proj}.{part}"], 0, index, n * dk)
        state[pre + "o_proj.weight"] = _widen(state[pre + "o_proj.weight"], 1, q, cfg.n_heads * dk)
    return state


def _add_o_bias(model: HeadModel, hf: dict, state: dict[str, Tensor]) -> None:
    """Make the HF config hold b_O (see the module docstring), or drop it when it is zero / native."""
    kind = model_type(model)
    if not _has_o_constant(model):
        if not _native_o_bias(hf, kind):
            for key in [k for k in state if k.endswith((".attn.o_proj.bias", ".attn.dense.bias"))]:
                del state[key]
        return
    if _native_o_bias(hf, kind):
        return
    if kind not in O_BIAS_SWITCH:
        raise HeadpruneError(f"transformers' {kind} has no o_proj bias, so an hf export cannot hold the compensation "
                             "constant (mean/optimal fills or folded value biases) in b_O; export --format native")
    hf[O_BIAS_SWITCH[kind]] = True
    for key, t in list(state.items()):  # the q/k/v biases attention_bias brings, as zeros
        for weight, bias in ((".q_proj.weight", ".q_proj.bias"), (".k_proj.weight", ".k_proj.bias"),
                             (".v_proj.weight", ".v_proj.bias"), (".query_key_value.weight", ".query_key_value.bias")):
            if key.endswith(weight) and key.replace(weight, bias) not in state:
                state[key.replace(weight, bias)] = t.new_zeros(t.shape[0])


def _native_o_bias(hf: dict, kind: str) -> bool:
    """Whether the HF config as it stands gives the attention output projection a bias."""
    switch = O_BIAS_SWITCH.get(kind)
    return switch is not None and bool(hf.get(switch, kind == "gpt_neox"))


def _writer(model: HeadModel, family: Family, hf: dict, state: dict[str, Tensor],
            marker: dict, dtype: torch.dtype) -> Callable[[Path], None]:
    from headprune.io.export import write_checkpoint

    def write(tmp: Path) -> None:
        tensors = {family.hf_key(k): v for k, v in cast_floats(state, dtype).items()}
        write_checkpoint(tmp, hf, tensors, model.origin.folder, marker)

    return write


def _marker(model: HeadModel, fmt: str, metadata: dict | None) -> dict:
    removed = [(layer, h) for layer, kept in enumerate(model.cfg.kept_heads)
               for h in range(model.cfg.n_heads) if h not in kept]
    return {"format": fmt, "source": model.origin.source, "family": model_type(model),
            "removed_heads": [head_id(*h) for h in removed], **(metadata or {})}


def export_family_native(model: HeadModel, folder: str | os.PathLike, overwrite: bool = False,
                         metadata: dict | None = None, dtype: str | torch.dtype | None = None) -> Path:
    """Save a (pruned) family model as a headprune checkpoint that ``load_model`` reloads exactly (in ``dtype``,
    by default the source checkpoint's)."""
    from headprune.io.export import _write_export

    dtype = export_dtype(model, dtype)
    hf, family = _source_config(model, dtype), REGISTRY[model_type(model)]
    if model.cfg.is_pruned:
        hf["headprune_kept_heads"] = model.cfg.kept_heads
    state = {k: v for k, v in model.state_dict().items()}
    if model.cfg.o_bias and not _native_o_bias(hf, model_type(model)):
        hf["headprune_o_bias"] = True
    elif not model.cfg.o_bias:
        state = {k: v for k, v in state.items() if not k.endswith((".attn.o_proj.bias", ".attn.dense.bias"))}
    marker = _marker(model, "native", {**(metadata or {}), "dtype": dtype_name(dtype)})
    return _write_export(folder, _writer(model, family, hf, state, marker, dtype), overwrite)


def export_family_hf(model: HeadModel, folder: str | os.PathLike, overwrite: bool = False,
                     metadata: dict | None = None, dtype: str | torch.dtype | None = None) -> Path:
    """Save a (pruned) family model for stock transformers: compact when uniform, else zeroed (module docstring);
    in ``dtype``, by default the source checkpoint's."""
    from headprune.io.export import _write_export

    dtype = export_dtype(model, dtype)
    hf, family = _source_config(model, dtype), REGISTRY[model_type(model)]
    if is_compact(model):
        a = model.h[0].attn
        hf.update(num_attention_heads=a.n_heads, num_key_value_heads=a.n_kv_heads, head_dim=model.cfg.d_head)
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    else:
        state = _zeroed_state(model)
    _add_o_bias(model, hf, state)
    marker = _marker(model, "hf", {"layout": "compact" if is_compact(model) else "zeroed", **(metadata or {}),
                                   "dtype": dtype_name(dtype)})
    return _write_export(folder, _writer(model, family, hf, state, marker, dtype), overwrite)
