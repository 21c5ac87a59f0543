"""The model names headprune knows without asking the hub, and what a name that is none of them and no path is.

A ``--model`` that is not a local path is a shipped model (``headprune/zoo``), a packaged one
(:data:`headprune.io.read.packaged.PACKAGED`) or a hub id. A hub id without an owner is one of the hub's old canonical
names (:data:`CANONICAL_HUB_IDS`, those of the supported families): a bare name within a few letters of a known
name (difflib ratio ≥ :data:`CUTOFF`) that is none of them and not in the local hub cache is a typo, said at once
with the names it is close to, instead of after the hub's timeouts. Nothing here imports torch.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from headprune.errors import HeadpruneError

ZOO = Path(__file__).parents[2] / "zoo"
CANONICAL_HUB_IDS = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "distilgpt2")
CUTOFF = 0.75  # "gtp2" ~ "gpt2": 0.75; "stdlib-gpt2-mimi" ~ "stdlib-gpt2-mini": 0.94


def shipped_names() -> list[str]:
    return sorted(p.name for p in ZOO.iterdir() if (p / "config.json").is_file())


def known_names() -> list[str]:
    """Every model name that needs no path: shipped, packaged, then the canonical hub ids."""
    from headprune.io.read.packaged import PACKAGED

    return [*shipped_names(), *PACKAGED, *CANONICAL_HUB_IDS]


def close_names(name: str, n: int = 3) -> list[str]:
    """The known names closest to ``name`` (case ignored), closest first."""
    known = {k.lower(): k for k in known_names()}
    return [known[k] for k in difflib.get_close_matches(name.lower(), list(known), n=n, cutoff=CUTOFF)]


def looks_like_path(source: str) -> bool:
    """Whether ``source`` can only be a local path: it starts with ``.``, ``/`` or ``~``, has more than one ``/``
    (a hub id has at most one), or its ``owner/`` part is a local folder (``out/pruned`` before prune wrote it)."""
    return (source.startswith((".", "/", "~")) or source.count("/") > 1 or os.sep + os.sep in source
            or ("/" in source and Path(source).parent.is_dir()))


def _in_hub_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # noqa: BLE001 - an id the hub library rejects is not cached
        return False


def check_model_source(source: str | os.PathLike) -> None:
    """Refuse at once a model that is no existing path and cannot be a model elsewhere: a missing local path, or a
    bare name that is a typo of a known one (:func:`close_names`). Existing paths, known names, owner/name hub ids
    and bare names close to none pass (the loader tries them)."""
    source = str(source)
    if Path(source).expanduser().exists() or source in known_names():
        return
    if looks_like_path(source):
        close = [str(p) for p in _close_siblings(Path(source).expanduser())]
        hint = f"; did you mean {' or '.join(close)}?" if close else "; pass a model directory, GGUF file or hub id"
        raise HeadpruneError(f"model directory {source!r} does not exist{hint}")
    if "/" in source or not (close := close_names(source)) or _in_hub_cache(source):
        return
    raise HeadpruneError(f"model {source!r} is not a shipped, packaged or known hub model; did you mean "
                         f"{' or '.join(repr(c) for c in close)}? (`headprune models` lists the packaged ones; an "
                         "owner/name hub id or a folder also works)")


def _close_siblings(path: Path) -> list[Path]:
    """Entries of ``path``'s (existing) parent folder whose names are close to ``path``'s."""
    parent = path.parent
    if not parent.is_dir():
        return []
    try:
        names = [p.name for p in parent.iterdir()]
    except OSError:
        return []
    return [parent / n for n in difflib.get_close_matches(path.name, names, n=2, cutoff=CUTOFF)]
