"""What a command reads, checked before any model loads: a missing ``--scores``, ``--curves`` or ``--pairs`` file,
a missing corpus path, a missing model folder or a typo'd model name is one line at once, not after the model
(seconds to minutes) has loaded. Torch-free."""

from __future__ import annotations

import argparse
from pathlib import Path

from headprune.errors import HeadpruneError

FILES = ("scores", "curves", "pairs", "prompt_file")  # options naming an input file
CORPORA = ("data", "score_data", "train_data")  # options naming a corpus spec
MODELS = ("model", "teacher")  # options naming a model: a path, a known name or a hub id
FOLDERS = {"pruned": "PRUNED_DIR"}  # finetune's argument: a folder that `headprune prune` wrote


def check_inputs(args: argparse.Namespace, flags: dict[str, str]) -> None:
    """Refuse the first input of ``args`` that cannot exist; ``flags``: dest -> the command's option name."""
    from headprune.data.sources import check_corpus_spec
    from headprune.io.read.model_names import check_model_source

    for dest in FILES:
        if (value := getattr(args, dest, None)) is not None and not Path(value).expanduser().is_file():
            what = "is a folder, not a file" if Path(value).expanduser().is_dir() else "does not exist"
            raise HeadpruneError(f"{flags.get(dest, dest)} {value}: {what}")
    for dest, name in FOLDERS.items():
        if (value := getattr(args, dest, None)) is not None and not Path(value).expanduser().is_dir():
            raise HeadpruneError(f"{name} {value}: no such folder; give the folder that headprune prune --out wrote")
    for dest in MODELS:
        if (value := getattr(args, dest, None)) is not None:
            check_model_source(value)
    for dest in CORPORA:
        if (value := getattr(args, dest, None)) is not None:
            check_corpus_spec(value)
