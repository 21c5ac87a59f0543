"""Where headprune caches parsed documents and token ids."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """``$HEADPRUNE_CACHE`` if set, else ``~/.cache/headprune/tokens``."""
    env = os.environ.get("HEADPRUNE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "headprune" / "tokens"
