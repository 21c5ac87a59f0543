"""Pruned models saved to folders: ``native`` (the really smaller tensors, reloads in headprune) and ``hf`` (the
original shapes with removed heads zeroed, loads in stock transformers), each written atomically with a
``headprune_export.json`` record of what was removed, how and from what. Both keep the source's special token ids
and, unless ``dtype`` is given, its weights' dtype (:mod:`headprune.io.export_source`); every file gets the mode
a new file gets under the umask (0644 under 022)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from headprune.errors import HeadpruneError
from headprune.io.export_source import cast_floats, dtype_name, export_dtype, source_token_ids
from headprune.io.files import (
    clear_stale_temporaries,
    current_umask,
    ensure_dir,
    glob_escape,
    pid_alive,
    temp_prefix,
    write_failures,
)
from headprune.io.hf_keys import hf_tensors
from headprune.models.gpt2 import GPT2, Attention
from headprune.models.gpt2_config import ModelConfig
from headprune.models.heads import head_id
from headprune.pruning.prune import removed_heads

EXPORT_MARKER = "headprune_export.json"

#: Licence files of the source folder an export passes on when present (the Gemma terms and their notice).
LICENCE_FILES = ("NOTICE.md", "GEMMA_TERMS.html", "LICENSE")


#: The files of the source folder an export copies when present: the tokenizer (GPT-2's BPE files, tokenizer.json or
#: SentencePiece's model) and the generation and chat settings.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json", "vocab.json", "merges.txt", "chat_template.jinja")


def check_export_target(folder: Path, overwrite: bool) -> None:
    if folder.exists() and not folder.is_dir():
        raise HeadpruneError(f"export target {folder} is a file; choose a folder")
    if folder.is_dir() and any(folder.iterdir()) and not (folder / EXPORT_MARKER).is_file() and not overwrite:
        raise HeadpruneError(f"export target {folder} is a non-empty folder that is not a headprune export; "
                             "choose another folder or pass overwrite")


def _replace_dir(tmp: Path, folder: Path) -> None:
    """Rename the finished ``tmp`` folder to ``folder``, swapping out any previous one (moved to
    ``.NAME.PID.RANDOM.old`` first, then deleted; a kill in between leaves it for :func:`clear_stale_old`)."""
    if not folder.exists():
        os.rename(tmp, folder)
        return
    old = folder.with_name(f"{temp_prefix(folder)}{uuid.uuid4().hex[:8]}.old")
    os.rename(folder, old)
    try:
        os.rename(tmp, folder)
    except OSError:
        os.rename(old, folder)
        raise
    shutil.rmtree(old, ignore_errors=True)


def clear_stale_old(folder: Path) -> None:
    """Deal with the previous exports a killed writer left as ``.NAME.PID.*.old`` (its PID no longer running): if
    it was killed between its two renames, ``folder`` is missing and the newest of them is put back; the rest
    are deleted."""
    stale = []
    for old in folder.parent.glob(f".{glob_escape(folder.name)}.*.old"):
        pid = old.name[len(folder.name) + 2:].split(".")[0]
        if old.is_dir() and pid.isdigit() and not pid_alive(int(pid)):
            stale.append(old)
    stale.sort(key=lambda p: p.stat().st_mtime_ns)
    if stale and not folder.exists():
        os.rename(stale.pop(), folder)
    for old in stale:
        shutil.rmtree(old, ignore_errors=True)


def _write_export(folder: str | os.PathLike, write: Callable[[Path], None], overwrite: bool) -> Path:
    """Build the export in a temporary folder beside ``folder`` (``write(tmp)``), fsync, rename into place."""
    folder = Path(folder).expanduser().absolute()
    clear_stale_old(folder)
    check_export_target(folder, overwrite)
    clear_stale_temporaries(folder)
    tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(folder), suffix=".tmp", dir=ensure_dir(folder.parent)))
    try:
        with write_failures(f"export {folder}"):  # a full disk in safetensors' writer too: one line, no folder
            os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes 0700; the export gets the usual permissions
            write(tmp)
            for f in tmp.iterdir():  # safetensors' writer makes 0600 files; every file gets what open() gives
                os.chmod(f, 0o666 & ~current_umask())
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
            _replace_dir(tmp, folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _writer(model: GPT2, cfg: ModelConfig, state: dict[str, Tensor], marker: dict,
            dtype: torch.dtype) -> Callable[[Path], None]:

    config = cfg.to_hf() | source_token_ids(model) | {"dtype": dtype_name(dtype)}
    marker = marker | {"dtype": dtype_name(dtype)}

    def write(tmp: Path) -> None:
        write_checkpoint(tmp, config, hf_tensors(cast_floats(state, dtype)), model.origin.folder, marker)

    return write


def write_checkpoint(tmp: Path, config: dict, tensors: dict[str, Tensor], source: Path | None, marker: dict) -> None:
    """An export's files into ``tmp``: config.json, model.safetensors, the source folder's :data:`TOKENIZER_FILES`
    and :data:`LICENCE_FILES` (those it has) and the :data:`EXPORT_MARKER` record."""
    from safetensors.torch import save_file

    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    for name in (*TOKENIZER_FILES, *LICENCE_FILES):
        if source is not None and (source / name).is_file():
            shutil.copyfile(source / name, tmp / name)
    (tmp / EXPORT_MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")


def export_native(model: GPT2, folder: str | os.PathLike, overwrite: bool = False,
                  metadata: dict | None = None, dtype: str | torch.dtype | None = None) -> Path:
    """Save a (pruned) model as a headprune checkpoint that :func:`headprune.io.loading.load_model` reloads:
    config.json (with ``headprune_kept_heads``), model.safetensors with the smaller tensors, the tokenizer files
    of ``model.origin.folder``, and headprune_export.json (what was removed, plus ``metadata``). Weights in
    ``dtype``, by default the source checkpoint's."""
    if not isinstance(model, GPT2):  # Llama, Mistral, Qwen, GPT-NeoX
        from headprune.io.family_export import export_family_native

        return export_family_native(model, folder, overwrite, metadata, dtype)
    marker = {"format": "native", "source": model.origin.source,
              "removed_heads": [head_id(*h) for h in removed_heads(model)], **(metadata or {})}
    writer = _writer(model, model.cfg, model.state_dict(), marker, export_dtype(model, dtype))
    return _write_export(folder, writer, overwrite)


def export_hf(model: GPT2, folder: str | os.PathLike, overwrite: bool = False, metadata: dict | None = None,
              dtype: str | torch.dtype | None = None) -> Path:
    """Save a (pruned) model as a plain GPT-2 checkpoint for stock ``GPT2LMHeadModel``: original shapes, every
    removed head's Q/K/V columns, biases and W_O rows zeroed (its mean compensation is already in b_O). Weights
    in ``dtype``, by default the source checkpoint's."""
    if not isinstance(model, GPT2):  # compact when the prune is uniform, else zeroed (headprune.io.family_export)
        from headprune.io.family_export import export_family_hf

        return export_family_hf(model, folder, overwrite, metadata, dtype)
    marker = {"format": "hf", "source": model.origin.source,
              "removed_heads": [head_id(*h) for h in removed_heads(model)], **(metadata or {})}
    full, state = dense_state(model)
    return _write_export(folder, _writer(model, full, state, marker, export_dtype(model, dtype)), overwrite)


def dense_state(model: GPT2) -> tuple[ModelConfig, dict[str, Tensor]]:
    """The config and state (our keys, copies) of ``model`` at the full n_heads width: every head it lacks has
    zero Q/K/V columns (weights and biases) and zero W_O rows, so it contributes exactly 0 (z_i = A·0 = 0, then
    0·W_O^(i) = 0). What ``export_hf`` writes and :func:`headprune.io.in_memory.to_hf` loads."""
    cfg, H, dk = model.cfg, model.cfg.n_heads, model.cfg.d_head
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for layer, kept in enumerate(cfg.kept_heads):
        attn, pre = model.h[layer].attn, f"h.{layer}.attn."
        pos = torch.tensor(kept, dtype=torch.long, device=model.device)
        cols, rows = Attention.qkv_columns(pos, H, dk), Attention.wo_rows(pos, dk)
        w = attn.c_attn.weight.detach()
        state[pre + "c_attn.weight"] = w.new_zeros(cfg.d_model, 3 * H * dk).index_copy_(1, cols, w)
        state[pre + "c_attn.bias"] = w.new_zeros(3 * H * dk).index_copy_(0, cols, attn.c_attn.bias.detach())
        wo = attn.c_proj.weight.detach()
        state[pre + "c_proj.weight"] = wo.new_zeros(H * dk, cfg.d_model).index_copy_(0, rows, wo)
    return dataclasses.replace(cfg, kept_heads=[list(range(H))] * cfg.n_layers), state
