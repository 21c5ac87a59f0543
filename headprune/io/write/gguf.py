"""A (pruned) model as ONE GGUF file that llama.cpp runs, written atomically with gguf-py's ``GGUFWriter``.

* **Architecture.** A uniform prune (every layer the same h' query / h_kv' KV heads, :func:`~.export.is_uniform`)
  keeps the source's (``llama``, ``qwen3``, ``gemma3``; ``qwen2`` unpruned only: llama.cpp's qwen2 needs
  h·d_k = d) at the smaller counts. Any other prune of a Llama model without q/k/v biases is written as ``deci``
  (llama.cpp's Nemotron-NAS graph, which builds each layer from its own ``n_head(il)`` / ``n_head_kv(il)``) with
  per-layer ``attention.head_count`` / ``head_count_kv`` arrays; each layer in llama.cpp's grouping
  (:mod:`.gguf_layout`: zero-weight query heads complete uneven KV groups, an emptied layer has no attention
  tensors). Other families pruned unevenly are refused: prune them with ``--uniform``.
* **Weights.** llama.cpp's rotary row order for Llama q/k (the inverse of what :mod:`headprune.io.read.gguf`
  undoes), Gemma's RMSNorm weights stored as 1 + w, norms and biases in F32, the matrices in ``gguf_type``.
  The default ``q8_0`` (:mod:`.gguf_types` says why).
* **b_O** (a compensation constant or folded value biases): written as ``attn_output.bias``, which llama.cpp's
  ``llama`` and ``deci`` graphs add; the others have none and such an export is refused (nothing to fold it into
  exactly: Gemma's post-attention norm sits after it).
* **Tokenizer and chat template.** Carried over from the source GGUF (``tokenizer.*`` and ``general.*`` metadata):
  the model's own (loaded from a GGUF, or an export of one) or ``source=``. A model from a transformers folder
  is refused in one line: llama.cpp's converter names the pre-tokenizer by hashing the tokenizer's output on its
  test text, which headprune does not redo. The source's licence files (``LICENSE``, Gemma's ``NOTICE.md`` and
  ``GEMMA_TERMS.html``) are written beside the file as ``STEM.NAME``.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
from torch import Tensor

from headprune.errors import HeadpruneError
from headprune.io.work.files import atomic_path, check_writable, write_failures
from headprune.io.write.export import is_uniform
from headprune.io.write.export_folder import LICENCE_FILES
from headprune.io.write.gguf_layout import GgufAttention, padded_layer, permute_rotary, uniform_layer
from headprune.io.write.gguf_types import DEFAULT_GGUF_TYPE, GGUF_TYPES
from headprune.models.base import HeadModel
from headprune.models.families import GGUF_ARCHITECTURES, gguf_arch, model_type
from headprune.models.gguf_names import BLOCK_NAMES, TOP_NAMES
from headprune.models.llama import Attention


@dataclass
class GgufPlan:
    """What the file will hold: its architecture and each layer's attention in llama.cpp's layout."""

    arch: str
    layers: list[GgufAttention]

    @property
    def padded(self) -> int:
        return sum(layer.padded for layer in self.layers)

    def describe(self) -> str:
        """The one line ``prune --format gguf`` prints."""
        heads = [layer.n_head for layer in self.layers]
        if self.arch != "deci":
            return f"gguf export: {self.arch}, {heads[0]} query / {self.layers[0].n_head_kv} KV heads per layer"
        cost = (f"; {self.padded} zero-weight query heads complete uneven KV groups (query compute only, no KV cache)"
                if self.padded else "")
        empty = sum(not h for h in heads)
        return (f"gguf export: deci (per-layer head counts {min(heads)}..{max(heads)}, {empty} "
                f"layer{'s' if empty != 1 else ''} without attention){cost}")


def check_exportable(model: HeadModel, source: str | os.PathLike | None = None) -> Path:
    """Before any work: the model's family has a GGUF form and its tokenizer source is found (returned)."""
    _gguf_form(model_type(model))
    return source_gguf(model, source)


def _gguf_form(kind: str):
    """The family record's llama.cpp form of ``kind``; HeadpruneError where it has none."""
    if kind not in GGUF_ARCHITECTURES.values():
        raise HeadpruneError(f"llama.cpp has no GGUF form of headprune's {kind} models (GGUF export: "
                             f"{', '.join(GGUF_ARCHITECTURES.values())})")
    return gguf_arch(kind)


def gguf_plan(model: HeadModel) -> GgufPlan:
    """The architecture and layer layout of ``model``'s GGUF, or HeadpruneError where llama.cpp cannot run it."""
    kind = model_type(model)
    form = _gguf_form(kind)
    cfg = model.cfg
    if any(getattr(cfg, "sliding_windows", [])) and not form.sliding_windows:
        raise HeadpruneError(f"this {kind} model has sliding-window layers, which llama.cpp's {kind} does not have")
    pruned = cfg.is_pruned
    if not pruned or (is_uniform(model) and form.uniform_prunes):
        arch = form.name
        plan = GgufPlan(arch, [uniform_layer(cast(Attention, blk.attn)) for blk in model.h])
        if not form.output_bias and any(layer.b_o is not None for layer in plan.layers):
            raise HeadpruneError(f"llama.cpp's {arch} has no attention output bias for the compensation constant "
                                 "in b_O; prune with --compensate none (or export --format native)")
        return plan
    if not form.uneven_as_deci or getattr(cfg, "qkv_bias", False):
        why = (f"{form.name} needs h·d_k = d in llama.cpp" if not form.uniform_prunes else
               "only Llama models without q/k/v biases have llama.cpp's per-layer form (deci)")
        raise HeadpruneError(f"llama.cpp cannot run this {kind} prune: {why}; prune with --uniform (the same head "
                             "counts in every layer)")
    return GgufPlan("deci", [padded_layer(cast(Attention, blk.attn), keep_empty=layer == 0)
                             for layer, blk in enumerate(model.h)])


def source_gguf(model: HeadModel, source: str | os.PathLike | None = None) -> Path:
    """The GGUF whose tokenizer and metadata the export carries: ``source``, else the one the model (or the
    export it was loaded from) was read from."""
    if source is not None:
        path = Path(source).expanduser()
        if not path.is_file() or path.suffix.lower() != ".gguf":
            raise HeadpruneError(f"GGUF tokenizer source {path} is not a .gguf file")
        return path
    folder = model.origin.folder
    for _ in range(3):  # the model's folder, or the source of the export it was loaded from (a fine-tune's too)
        if folder is None:
            break
        record = folder / "headprune_gguf.json"
        if record.is_file():
            found = Path(json.loads(record.read_text())["source"])
            if found.is_file():
                return found
        marker = folder / "headprune_export.json"
        if not marker.is_file():
            break
        from headprune.io.read.sources import resolve_source

        try:
            folder = resolve_source(str(json.loads(marker.read_text()).get("source")))
        except HeadpruneError:
            break
    raise HeadpruneError("a GGUF export needs the model's tokenizer in llama.cpp's form, from the GGUF file it was "
                         "loaded from; this model comes from a transformers folder (convert it with llama.cpp's "
                         "convert_hf_to_gguf.py and load that .gguf, or pass the source GGUF)")


def _gguf_name(hf_key: str, kind: str) -> str:
    """llama.cpp's tensor name of a transformers key (``model.layers.3.mlp.up_proj.weight`` -> blk.3.ffn_up.weight)."""
    from headprune.models.families import gguf_arch

    ffn_norm = gguf_arch(kind).ffn_norm
    stem, _, what = hf_key.rpartition(".")
    for gguf, hf in TOP_NAMES.items():
        if stem == hf:
            return f"{gguf}.{what}"
    parts = stem.split(".", 3)  # model, layers, l, inner
    inner = {v: k for k, v in BLOCK_NAMES.items()} | {ffn_norm: "ffn_norm"}
    if len(parts) == 4 and parts[1] == "layers" and parts[3] in inner:
        return f"blk.{parts[2]}.{inner[parts[3]]}.{what}"
    raise HeadpruneError(f"the model holds a tensor {hf_key} that llama.cpp's GGUF has no name for")


_PLANNED = (".q_proj.weight", ".k_proj.weight", ".v_proj.weight", ".o_proj.weight", ".o_proj.bias")


def _tensors(model: HeadModel, plan: GgufPlan) -> dict[str, Tensor]:
    """llama.cpp's name -> float32 tensor in transformers' (out, in) layout, attention from ``plan``."""
    from headprune.models.families import family_of

    family, kind = family_of(model), model_type(model)
    form = gguf_arch(kind)
    norm_offset, permute = form.norm_offset, form.permute_qk
    out: dict[str, Tensor] = {}
    for key, t in model.state_dict().items():
        if key.endswith(_PLANNED) or key.endswith("inv_freq") or not t.is_floating_point():
            continue
        name = _gguf_name(family.hf_key(key), kind)
        t = t.detach().float()
        if permute and name.endswith(("attn_q.bias", "attn_k.bias")):  # uniform prunes only: deci has none
            t = permute_rotary(t, t.shape[0] // model.cfg.d_head)
        out[name] = t + norm_offset if name.endswith("norm.weight") else t
    for layer, attn in enumerate(plan.layers):
        if attn.n_head == 0:
            out = {k: v for k, v in out.items() if not k.startswith((f"blk.{layer}.attn_norm.",
                                                                     f"blk.{layer}.attn_q_norm.",
                                                                     f"blk.{layer}.attn_k_norm."))}
            continue
        q, k, v, o = attn.W_q, attn.W_k, attn.W_v, attn.W_o
        assert q is not None and k is not None and v is not None and o is not None  # n_head > 0
        if permute:
            q, k = permute_rotary(q, attn.n_head), permute_rotary(k, attn.n_head_kv)
        for what, w in (("attn_q", q), ("attn_k", k), ("attn_v", v), ("attn_output", o)):
            out[f"blk.{layer}.{what}.weight"] = w.float()
        if attn.b_o is not None:
            out[f"blk.{layer}.attn_output.bias"] = attn.b_o.float()
    return out



def _arch_metadata(model: HeadModel, plan: GgufPlan) -> dict[str, Any]:
    """``{arch}.*`` keys (without the prefix) from the model's config, head counts from ``plan``."""
    cfg: Any = model.cfg
    heads, kv = [a.n_head for a in plan.layers], [a.n_head_kv for a in plan.layers]
    uniform = plan.arch != "deci"
    meta: dict[str, Any] = {
        "context_length": cfg.n_positions, "embedding_length": cfg.d_model, "block_count": cfg.n_layers,
        "feed_forward_length": cfg.d_mlp, "attention.head_count": heads[0] if uniform else heads,
        "attention.head_count_kv": kv[0] if uniform else kv, "attention.layer_norm_rms_epsilon": cfg.rms_norm_eps,
        "attention.key_length": cfg.d_head, "attention.value_length": cfg.d_head, "vocab_size": cfg.vocab_size}
    return meta | gguf_arch(model_type(model)).metadata(cfg)


def _add_metadata(writer: Any, arch: str, values: dict[str, Any]) -> None:
    from gguf import GGUFValueType

    for key, value in values.items():
        if isinstance(value, list):
            writer.add_key_value(f"{arch}.{key}", value, GGUFValueType.ARRAY, sub_type=GGUFValueType.UINT32)
        elif isinstance(value, str):
            writer.add_string(f"{arch}.{key}", value)
        elif isinstance(value, float):
            writer.add_float32(f"{arch}.{key}", value)
        else:
            writer.add_uint32(f"{arch}.{key}", int(value))


def _typed(name: str, t: Tensor, gguf_type: str) -> tuple[np.ndarray, Any]:
    """(data, raw_dtype) of one tensor: matrices in ``gguf_type`` where their rows fit its blocks, the rest F32."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

    data = t.cpu().numpy().astype(np.float32, copy=False)
    qtype = GGMLQuantizationType[gguf_type.upper()]
    if data.ndim < 2 or gguf_type == "f32" or data.shape[-1] % GGML_QUANT_SIZES[qtype][0]:
        return data, None
    if gguf_type == "f16":
        return data.astype(np.float16), None
    return quants.quantize(data, qtype), qtype


_FILE_TYPES = {"f32": 0, "f16": 1, "q4_1": 3, "q8_0": 7, "bf16": 32}  # llama.cpp's LlamaFileType


def export_gguf(model: HeadModel, path: str | os.PathLike, *, gguf_type: str = DEFAULT_GGUF_TYPE,
                source: str | os.PathLike | None = None, metadata: dict | None = None) -> Path:
    """Write ``model`` as one GGUF file ``path`` that llama.cpp runs (module docstring): atomically (a temporary file
    renamed), its tokenizer from ``source`` or the GGUF it was loaded from, the matrices in ``gguf_type``;
    ``metadata`` (what was removed, how) kept as ``headprune.export`` JSON."""
    from gguf import GGUFWriter

    from headprune.io.read.gguf import copy_source_metadata

    path = Path(path).expanduser().absolute()
    if path.suffix.lower() != ".gguf":
        raise HeadpruneError(f"a GGUF export is one file ending in .gguf; got {path}")
    if gguf_type not in GGUF_TYPES:
        raise HeadpruneError(f"--gguf-type {gguf_type!r}: choose one of {', '.join(GGUF_TYPES)}")
    check_writable(path, file=True)
    plan = gguf_plan(model)
    tokenizer = source_gguf(model, source)
    writer = GGUFWriter(None, plan.arch)
    writer.add_file_type(_FILE_TYPES[gguf_type])
    writer.add_quantization_version(2)
    copy_source_metadata(writer, tokenizer, model.cfg.vocab_size)
    _add_metadata(writer, plan.arch, _arch_metadata(model, plan))
    kept = {"kept_heads": model.cfg.kept_heads, "padded_heads": plan.padded, "n_heads": model.cfg.n_heads,
            "n_kv_heads": getattr(model.cfg, "n_kv_heads", model.cfg.n_heads), **(metadata or {})}
    writer.add_string("headprune.export", json.dumps(kept, sort_keys=True, default=str))
    for name, t in _tensors(model, plan).items():
        data, raw = _typed(name, t, gguf_type)
        writer.add_tensor(name, data, raw_dtype=raw)
    with atomic_path(path) as tmp:
        writer.path = tmp
        writer.open_output_file(tmp)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    _licences(model, tokenizer, path)
    return path


def _licences(model: HeadModel, source: Path, path: Path) -> None:
    """The source's licence files beside the export, as ``STEM.NAME``."""
    for name in LICENCE_FILES:
        for folder in (source.parent, model.origin.folder):
            if folder is not None and (folder / name).is_file():
                with atomic_path(path.with_name(f"{path.stem}.{name}")) as tmp, write_failures(path):
                    shutil.copyfile(folder / name, tmp)
                break
