"""headprune: which attention heads of a GPT-2 model matter, and what pruning the rest costs.

The functions a notebook calls, importable from here (each loads its module, and torch, on first use, so
``import headprune`` and ``headprune --help`` stay light)::

    from headprune import load_model, tokens, score_heads
    model = load_model("stdlib-gpt2-mini")
    scored = score_heads(model, tokens("default", "validation", model, 16384), "wo_fro,grad")
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from headprune.version import __version__

#: Public name -> the module that defines it.
_EXPORTS = {
    "load_model": "headprune.io.read.loading",
    "model_tokenizer": "headprune.io.read.tokenizer",
    "tokens": "headprune.data.tokens",
    "load_texts": "headprune.data.sources",
    "corpus_ids": "headprune.data.tokens",
    "from_hf": "headprune.io.read.in_memory",
    "to_hf": "headprune.io.write.in_memory",
    "export_native": "headprune.io.write.export",
    "export_hf": "headprune.io.write.export",
    "export_gguf": "headprune.io.write.gguf",
    "evaluate": "headprune.perplexity",
    "score_heads": "headprune.scoring",
    "ScoringOptions": "headprune.scoring",
    "head_means": "headprune.scoring",
    "load_scores": "headprune.scoring.result",
    "load_curves": "headprune.stages.curves",
    "layer_ablation": "headprune.scoring.layers",
    "joint_constants": "headprune.scoring",
    "prune_model": "headprune.pruning.prune",
    "pruning_curves": "headprune.pruning.curves",
    "learn_gates": "headprune.pruning.gates",
    "GateOptions": "headprune.pruning.gates",
    "Selection": "headprune.pruning.options",
    "Compensation": "headprune.pruning.options",
    "CurveOptions": "headprune.pruning.options",
    "head_anatomy": "headprune.anatomy",
    "corpus_rows": "headprune.anatomy",
    "repeated_random_tokens": "headprune.anatomy",
    "HeadpruneError": "headprune.errors",
}

__all__ = [  # the names of _EXPORTS (tests/oracles/test_python_api.py checks they agree)
    "Compensation",
    "CurveOptions",
    "GateOptions",
    "HeadpruneError",
    "ScoringOptions",
    "Selection",
    "__version__",
    "corpus_ids",
    "corpus_rows",
    "evaluate",
    "export_gguf",
    "export_hf",
    "export_native",
    "from_hf",
    "head_anatomy",
    "head_means",
    "joint_constants",
    "layer_ablation",
    "learn_gates",
    "load_curves",
    "load_model",
    "load_scores",
    "load_texts",
    "model_tokenizer",
    "prune_model",
    "pruning_curves",
    "repeated_random_tokens",
    "score_heads",
    "to_hf",
    "tokens",
]

if TYPE_CHECKING:
    from headprune.anatomy import corpus_rows, head_anatomy, repeated_random_tokens
    from headprune.data.sources import load_texts
    from headprune.data.tokens import corpus_ids, tokens
    from headprune.errors import HeadpruneError
    from headprune.io.read.in_memory import from_hf
    from headprune.io.read.loading import load_model
    from headprune.io.read.tokenizer import model_tokenizer
    from headprune.io.write.export import export_hf, export_native
    from headprune.io.write.gguf import export_gguf
    from headprune.io.write.in_memory import to_hf
    from headprune.perplexity import evaluate
    from headprune.pruning.curves import pruning_curves
    from headprune.pruning.gates import GateOptions, learn_gates
    from headprune.pruning.options import Compensation, CurveOptions, Selection
    from headprune.pruning.prune import prune_model
    from headprune.scoring import ScoringOptions, head_means, joint_constants, score_heads
    from headprune.scoring.layers import layer_ablation
    from headprune.scoring.result import load_scores
    from headprune.stages.curves import load_curves


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use (PEP 562), and keep the name here."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'headprune' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
