"""Remove attention heads: as gates (masking), physically (a smaller model), and as exported checkpoints.

Attention output of a layer with heads i (W_O^(i) = rows i·d_k..(i+1)·d_k of W_O):

    out = Σ_i z_i W_O^(i) + b_O

Pruning a set P of heads drops their terms. Mean compensation replaces z_i (i ∈ P) by its mean z̄_i over
the data instead of 0; a constant term, it folds into the bias:

    out = Σ_{i∉P} z_i W_O^(i) + (b_O + Σ_{i∈P} z̄_i W_O^(i))

so the physically pruned model equals the mean-ablated one (gates 0, fills z̄) up to rounding.

Physical pruning keeps, per layer, only the remaining heads' Q/K/V columns of c_attn ([d, 3·h·d_k]:
Q block, K block, V block, head-major inside each) and W_O rows of c_proj ([h·d_k, d]); ``cfg.kept_heads``
records the ORIGINAL indices of the heads left. A layer may keep no head (its attention adds b_O only).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Callable, Iterable, Mapping

import torch
from torch import Tensor

from .errors import HeadpruneError
from .heads import check_heads, head_id
from .ledger import attention_flops_per_token, param_table, wo_table
from .model import GPT2, ModelConfig
from .outputs import current_umask, ensure_dir

Head = tuple[int, int]
EXPORT_MARKER = "headprune_export.json"
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json", "generation_config.json")


# ---------------------------------------------------------------- gates and fills (no weights change)

def _position(model: GPT2, layer: int, head: int) -> int:
    """Index of original head ``head`` in layer ``layer``'s weights (its gate / W_O row block)."""
    return model.cfg.kept_heads[layer].index(head)


def mask_gates(model: GPT2, heads: Iterable[Head]) -> list[Tensor]:
    """Gates per layer ([n_heads_l], float32): 1, and 0 at the positions of ``heads``."""
    gates = model.ones_gates()
    for layer, head in check_heads(model, heads):
        gates[layer][_position(model, layer, head)] = 0.0
    return gates


def _check_fills(model: GPT2, heads: list[Head], fills: Mapping[Head, Tensor] | None) -> dict[Head, Tensor]:
    """The fills of ``heads`` (each [d_head]); extra keys are ignored, a missing one is an error."""
    if fills is None:
        return {}
    missing = [h for h in heads if tuple(h) not in fills]
    if missing:
        raise HeadpruneError(f"no mean output (fill) for pruned head {head_id(*missing[0])}; compute fills for every "
                             "pruned head or prune without compensation")
    out = {}
    for h in heads:
        f = torch.as_tensor(fills[h])
        if f.shape != (model.cfg.d_head,):
            raise HeadpruneError(
                f"fill of head {head_id(*h)} has shape {tuple(f.shape)}, expected ({model.cfg.d_head},)"
            )
        out[h] = f
    return out


def fill_tensors(model: GPT2, fills: Mapping[Head, Tensor]) -> list[Tensor]:
    """The ``fills`` argument of ``model.forward``: per layer [n_heads_l, d_head], z̄_i at head i's position,
    0 elsewhere. Heads of ``fills`` the model lacks are an error."""
    out = [torch.zeros(blk.attn.n_heads, model.cfg.d_head, device=model.device, dtype=model.dtype) for blk in model.h]
    for (layer, head), f in _check_fills(model, check_heads(model, fills.keys()), fills).items():
        out[layer][_position(model, layer, head)] = f.to(out[layer])
    return out


def removed_heads(model: GPT2) -> list[Head]:
    """(layer, head) of every original head the model no longer holds."""
    cfg = model.cfg
    return [(l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads) if h not in cfg.kept_heads[l]]


# ---------------------------------------------------------------- physical pruning

def _qkv_columns(positions: Tensor, n_heads: int, d_head: int) -> Tensor:
    """c_attn output columns of the heads at ``positions``: part·h·d_k + p·d_k + k, Q then K then V."""
    part = torch.arange(3, device=positions.device).view(3, 1, 1) * n_heads * d_head
    k = torch.arange(d_head, device=positions.device).view(1, 1, d_head)
    return (part + positions.view(1, -1, 1) * d_head + k).reshape(-1)  # [3·len(positions)·d_k]


def _wo_rows(positions: Tensor, d_head: int) -> Tensor:
    """c_proj input rows of the heads at ``positions``: p·d_k + k."""
    return (positions.view(-1, 1) * d_head + torch.arange(d_head, device=positions.device)).reshape(-1)


def _compensation(attn, positions: list[int], fills: list[Tensor]) -> Tensor:
    """Σ_i z̄_i W_O^(i) over the pruned heads, in float64: [d_model]."""
    W_O = attn.W_O.detach().double()  # [n_heads, d_head, d_model]
    total = torch.zeros(W_O.shape[-1], dtype=torch.float64, device=W_O.device)
    for p, f in zip(positions, fills):
        total += f.to(W_O) @ W_O[p]
    return total


def _pruned_layer_state(model: GPT2, layer: int, drop: set[int], fills: dict[Head, Tensor]) -> dict[str, Tensor]:
    """The attention weights of ``layer`` without the original heads ``drop``, compensation folded into b_O."""
    attn, kept = model.h[layer].attn, model.cfg.kept_heads[layer]
    dev = attn.c_attn.weight.device
    keep = torch.tensor([p for p, h in enumerate(kept) if h not in drop], dtype=torch.long, device=dev)
    cols, rows = _qkv_columns(keep, attn.n_heads, attn.d_head), _wo_rows(keep, attn.d_head)
    gone = [(p, h) for p, h in enumerate(kept) if h in drop and (layer, h) in fills]
    b_O = attn.c_proj.bias.detach()
    if gone:
        comp = _compensation(attn, [p for p, _ in gone], [fills[(layer, h)] for _, h in gone])
        b_O = (b_O.double() + comp).to(b_O.dtype)
    pre = f"h.{layer}.attn."
    return {
        pre + "c_attn.weight": attn.c_attn.weight.detach().index_select(1, cols),  # [d, 3·h'·d_k]
        pre + "c_attn.bias": attn.c_attn.bias.detach().index_select(0, cols),  # [3·h'·d_k]
        pre + "c_proj.weight": attn.c_proj.weight.detach().index_select(0, rows),  # [h'·d_k, d]
        pre + "c_proj.bias": b_O.clone(),  # [d]
    }


def prune_model(model: GPT2, heads: Iterable[Head], fills: Mapping[Head, Tensor] | None = None) -> GPT2:
    """A new, physically smaller GPT2 without ``heads`` (the input is not changed).

    ``fills``: {(layer, head): z̄ [d_head]}, the mean output of each pruned head; when given, Σ z̄_i W_O^(i)
    is folded into each layer's b_O, so the result equals ``model(tokens, mask_gates(...), fill_tensors(...))``.
    """
    heads = check_heads(model, heads)
    fills = _check_fills(model, heads, fills)
    drop: dict[int, set[int]] = {}
    for layer, head in heads:
        drop.setdefault(layer, set()).add(head)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for layer, gone in drop.items():
        state.update(_pruned_layer_state(model, layer, gone, fills))
    kept = [[h for h in k if h not in drop.get(layer, ())] for layer, k in enumerate(model.cfg.kept_heads)]
    return _build(model, dataclasses.replace(model.cfg, kept_heads=kept), state)


def _build(like: GPT2, cfg: ModelConfig, state: dict[str, Tensor]) -> GPT2:
    """GPT2(cfg) holding ``state`` (tensors adopted, not copied), with ``like``'s mode, grads and origin."""
    with torch.device("meta"):
        new = GPT2(cfg)
    new.load_state_dict(state, assign=True)
    grads = {name: p.requires_grad for name, p in like.named_parameters()}
    for name, p in new.named_parameters():
        p.requires_grad_(grads.get(name, False))
    new.train(like.training)
    new.source, new.folder = like.source, like.folder
    return new


def _dense_state(model: GPT2) -> dict[str, Tensor]:
    """The state of ``model`` at the full n_heads width: every head it lacks has zero Q/K/V columns (weights
    and biases) and zero W_O rows, so it contributes exactly 0 (z_i = A·0 = 0, then 0·W_O^(i) = 0)."""
    cfg, H, dk = model.cfg, model.cfg.n_heads, model.cfg.d_head
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for layer, kept in enumerate(cfg.kept_heads):
        attn, pre = model.h[layer].attn, f"h.{layer}.attn."
        pos = torch.tensor(kept, dtype=torch.long, device=model.device)
        cols, rows = _qkv_columns(pos, H, dk), _wo_rows(pos, dk)
        w = attn.c_attn.weight.detach()
        state[pre + "c_attn.weight"] = w.new_zeros(cfg.d_model, 3 * H * dk).index_copy_(1, cols, w)
        state[pre + "c_attn.bias"] = w.new_zeros(3 * H * dk).index_copy_(0, cols, attn.c_attn.bias.detach())
        wo = attn.c_proj.weight.detach()
        state[pre + "c_proj.weight"] = wo.new_zeros(H * dk, cfg.d_model).index_copy_(0, rows, wo)
    return state


# ---------------------------------------------------------------- export

def _hf_tensors(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Our keys -> Hugging Face GPT2LMHeadModel keys (``transformer.`` prefix), contiguous CPU copies."""
    return {(k if k.startswith("lm_head.") else "transformer." + k): v.detach().cpu().contiguous().clone()
            for k, v in state.items()}


def _check_target(folder: Path, overwrite: bool) -> None:
    if folder.exists() and not folder.is_dir():
        raise HeadpruneError(f"export target {folder} is a file; choose a folder")
    if folder.is_dir() and any(folder.iterdir()) and not (folder / EXPORT_MARKER).is_file() and not overwrite:
        raise HeadpruneError(f"export target {folder} is a non-empty folder that is not a headprune export; "
                             "choose another folder or pass overwrite")


def _replace_dir(tmp: Path, folder: Path) -> None:
    """Rename the finished ``tmp`` folder to ``folder``, swapping out any previous one."""
    if not folder.exists():
        os.rename(tmp, folder)
        return
    old = folder.with_name(f".{folder.name}.{uuid.uuid4().hex[:8]}.old")
    os.rename(folder, old)
    try:
        os.rename(tmp, folder)
    except OSError:
        os.rename(old, folder)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _write_export(folder: str | os.PathLike, write: Callable[[Path], None], overwrite: bool) -> Path:
    """Build the export in a temporary folder beside ``folder`` (``write(tmp)``), fsync, rename into place."""
    folder = Path(folder).expanduser().absolute()
    _check_target(folder, overwrite)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=ensure_dir(folder.parent)))
    try:
        os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes 0700; the export gets the usual permissions
        write(tmp)
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        _replace_dir(tmp, folder)
    except OSError as err:
        raise HeadpruneError(f"cannot write export {folder} ({err.strerror or err})") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _writer(model: GPT2, cfg: ModelConfig, state: dict[str, Tensor], marker: dict) -> Callable[[Path], None]:
    from safetensors.torch import save_file

    def write(tmp: Path) -> None:
        (tmp / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2) + "\n")
        save_file(_hf_tensors(state), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        src = Path(model.folder) if model.folder is not None else None
        for name in TOKENIZER_FILES:
            if src is not None and (src / name).is_file():
                shutil.copyfile(src / name, tmp / name)
        (tmp / EXPORT_MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")

    return write


def export_native(model: GPT2, folder: str | os.PathLike, overwrite: bool = False,
                  metadata: dict | None = None) -> Path:
    """Save a (pruned) model as a headprune checkpoint that :func:`headprune.loading.load_model` reloads:
    config.json (with ``headprune_kept_heads``), model.safetensors with the smaller tensors, the tokenizer files
    of ``model.folder``, and headprune_export.json (what was removed, plus ``metadata``)."""
    marker = {"format": "native", "source": model.source,
              "removed_heads": [head_id(*h) for h in removed_heads(model)], **(metadata or {})}
    return _write_export(folder, _writer(model, model.cfg, model.state_dict(), marker), overwrite)


def export_hf(model: GPT2, heads: Iterable[Head], fills: Mapping[Head, Tensor] | None, folder: str | os.PathLike,
              overwrite: bool = False, metadata: dict | None = None) -> Path:
    """Save ``model`` without ``heads`` as a plain GPT-2 checkpoint for stock ``GPT2LMHeadModel``: original
    shapes, removed heads' Q/K/V columns, biases and W_O rows zeroed, mean compensation (``fills``) in b_O.
    Heads a pruned ``model`` already lacks are zero-filled too."""
    pruned = prune_model(model, heads, fills)
    full = dataclasses.replace(model.cfg, kept_heads=[list(range(model.cfg.n_heads))] * model.cfg.n_layers)
    marker = {"format": "hf", "source": model.source,
              "removed_heads": [head_id(*h) for h in removed_heads(pruned)], **(metadata or {})}
    return _write_export(folder, _writer(model, full, _dense_state(pruned), marker), overwrite)


# ---------------------------------------------------------------- accounting

def pruning_stats(model_before: GPT2, model_after: GPT2, seq_len: int) -> dict[str, int]:
    """What pruning saved: heads, parameters (ledger.param_table), W_O parameters (ledger.wo_table) and
    attention FLOPs per token at context ``seq_len`` (ledger.attention_flops_per_token); before, after, removed."""
    measures = {
        "heads": lambda m: len(m.head_ids),
        "params": lambda m: int(param_table(m).params.sum()),
        "wo_params": lambda m: int(wo_table(m).W_O_total.sum()),
        "attention_flops_per_token": lambda m: int(attention_flops_per_token(m, seq_len)),
    }
    stats: dict[str, int] = {"seq_len": int(seq_len)}
    for name, fn in measures.items():
        before, after = fn(model_before), fn(model_after)
        stats.update({f"{name}_before": before, f"{name}_after": after, f"{name}_removed": before - after})
    return stats
