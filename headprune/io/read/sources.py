"""Where a model named on the command line lives: the local folder of a zoo name, a packaged model, a GGUF file
(converted once), a model directory or a hub id."""

from __future__ import annotations

import os
from pathlib import Path

from headprune.errors import HeadpruneError
from headprune.io.read.model_names import ZOO, check_model_source

_WEIGHT_PATTERNS = ["model.safetensors", "model.safetensors.index.json", "model-*.safetensors"]


_SIDE_PATTERNS = ["config.json", "vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json",
                  "special_tokens_map.json"]


def resolve_source(source: str | os.PathLike) -> Path:
    """The local directory holding ``source``: a zoo name, a packaged model's name (:mod:`.packaged`), a GGUF file
    or a folder holding one (converted once, :mod:`.gguf`), a model directory, or a hub id (HF cache or download)."""
    from headprune.io.read.gguf import gguf_folder, single_gguf
    from headprune.io.read.packaged import PACKAGED, packaged_folder

    source = str(source)
    if (ZOO / source / "config.json").is_file():
        return ZOO / source
    if source in PACKAGED:
        return packaged_folder(source)
    path = Path(source).expanduser()
    if path.is_dir():
        gguf = single_gguf(path)
        return gguf_folder(gguf) if gguf is not None else path
    if path.is_file() and path.suffix.lower() == ".gguf":
        return gguf_folder(path)
    if path.exists():
        raise HeadpruneError(f"model {source!r} is a file; pass a GGUF file or the directory holding config.json "
                             "and weights")
    check_model_source(source)  # a missing path, or a typo of a known name: said before the hub is asked
    return _snapshot(source)


def _snapshot(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    try:
        folder = Path(snapshot_download(repo_id, allow_patterns=_SIDE_PATTERNS + _WEIGHT_PATTERNS))
        if not any(folder.glob("*.safetensors")):
            folder = Path(snapshot_download(repo_id, allow_patterns=_SIDE_PATTERNS + ["pytorch_model.bin"]))
    except HFValidationError:
        raise HeadpruneError(f"model {repo_id!r} is neither a local directory nor a valid hub id") from None
    except Exception as err:  # noqa: BLE001 - offline without cache, unknown repo, network failure, ...
        raise HeadpruneError(
            f"model {repo_id!r} is not a local directory and could not be fetched from the Hugging Face hub "
            f"or its cache ({type(err).__name__}); pass a local model directory or pre-download it"
        ) from None
    return folder
