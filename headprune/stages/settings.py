"""The settings of ``headprune run`` (:class:`RunSettings`, parsed once at the edge) and what follows from them
alone: which rankings the curves measure and what the run's cost depends on."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from headprune.bootstrap import DEFAULT_REPLICATES
from headprune.errors import HeadpruneError
from headprune.pruning.gates import GATE
from headprune.schema import (
    ACTIVATION_METHODS,
    DEFAULT_FRACTIONS,
    DEFAULT_MAX_TOKENS,
    DEFAULT_SEEDS,
    IMPORTANCE_METHODS,
    LAYER_NORMALIZED,
    RANDOM,
    WEIGHT_METHODS,
    parse_methods,
)


@dataclass
class RunSettings:
    model: str
    data: str = "default"  # curves are measured here (default: test split)
    score_data: str = "default"  # heads are scored here (default: validation split)
    out: str = "headprune-report"
    device: str = "auto"
    dtype: str = "fp32"
    fold_value_bias: bool = False  # fold value biases into b_O at load (headprune.models.folding)
    batch_size: int = 8
    seq_len: int | None = None
    stride: int | None = None
    max_tokens: int | None = DEFAULT_MAX_TOKENS
    # pick max_tokens (at most the given one) and, where seq_len is None, the window from the model's size
    # (headprune.cost.run_budget); resolved once the model is loaded, into max_tokens and seq_len
    budget: bool = False
    fractions: tuple[float, ...] = DEFAULT_FRACTIONS
    seeds: int = DEFAULT_SEEDS  # random-baseline seeds: its band shows seed and data spread
    seed: int = 0
    ablation_rows: int | None = None  # see score_heads
    bootstrap: int = DEFAULT_REPLICATES  # replicates of every 95% interval (0: none)
    # also abl_opt and the best method's optimal-compensated curve (costly: README, Optimal ablation)
    optimal: bool = False
    learn_gates: bool = False  # also curve hard-concrete gates learned per fraction (headprune.pruning.gates; slow)
    gate_steps: int = 200  # training steps per fraction
    # the built-in task of the patching section ("none": no patching; "auto": brackets where the model's tokenizer
    # can build its pairs, induction (random tokens: any tokenizer) where not); resolved once the model is loaded
    patch_task: str = "auto"
    patch_pairs: int = 32
    methods: tuple[str, ...] = ("all",)  # scored ("all": every method but the opt-in abl_zero_folded, abl_opt,
    #                                      abl_resample; abl_opt with `optimal`); those that rank heads also get
    #                                      curves. Parsed once, here: afterwards the method names in canonical order

    def __post_init__(self) -> None:
        from headprune.patching.tasks import TASKS

        self.methods = tuple(parse_methods([*self.methods, *(["abl_opt"] if self.optimal else [])]))
        if self.patch_task not in (*TASKS, "none", "auto"):
            raise HeadpruneError(f"patch task {self.patch_task!r} is not one of {', '.join(TASKS)}, auto or none",
                                 "patch-task")
        if self.patch_pairs < 2:
            raise HeadpruneError(f"patch pairs {self.patch_pairs} must be at least 2", "patch-pairs")


def settings_fields(s: RunSettings) -> dict:
    """The settings as a dict; the gate settings only where gates are learned (runs without them are unchanged);
    ``budget`` never (once resolved, max_tokens and seq_len hold what it picked)."""
    return {k: v for k, v in asdict(s).items()
            if k != "budget" and (s.learn_gates or k not in ("learn_gates", "gate_steps"))}


def rankings_of(s: RunSettings, ranked: list[str]) -> list[str]:
    """Every ranking the curves measure: each ranking score, weight and activation scores also normalized per layer
    (Michel et al.), the learned gates where asked, and random."""
    return [*ranked, *(m + LAYER_NORMALIZED for m in ranked if m in WEIGHT_METHODS + ACTIVATION_METHODS),
            *([GATE] if s.learn_gates else []), RANDOM]


def run_plan(s: RunSettings) -> Any:
    """The :class:`~headprune.cost.RunPlan` of ``s``: what its cost depends on."""
    from headprune.cost import RunPlan

    ranked = [m for m in s.methods if m in IMPORTANCE_METHODS]
    return RunPlan(list(s.methods), len(rankings_of(s, ranked)) - 1, tuple(s.fractions), s.seeds,
                   s.patch_pairs if s.patch_task != "none" else 0)


def split_text(corpus: str, split: str, n_tokens: int) -> str:
    """How a run's settings name the tokens a stage read, e.g. 'default (validation split), 1,024 tokens'
    (:func:`saved_settings` reads the corpus back from it)."""
    return f"{corpus} ({split} split), {n_tokens:,} tokens"


_SPLIT_TEXT = re.compile(r"(?P<corpus>.*) \((?P<split>\w+) split\), [\d,]+ tokens")


def saved_settings(record: Mapping[str, Any]) -> RunSettings:
    """The :class:`RunSettings` a finished run ran with, from the settings.json it wrote
    (:func:`headprune.pipeline.run_settings`): its options, with the tokens and window its budget picked, so that
    :func:`headprune.stages.inputs.load_inputs` rebuilds the run's model, windows and token streams."""
    values = {f.name: record[f.name] for f in fields(RunSettings) if f.name in record}
    named = _SPLIT_TEXT.fullmatch(str(record.get("score_data", "")))
    if named is None:
        raise HeadpruneError(f"settings name the scoring tokens as {record.get('score_data')!r}, not as a run writes "
                             "them: not the settings.json of headprune run")
    values |= {"score_data": named["corpus"], "fractions": tuple(values.get("fractions", DEFAULT_FRACTIONS)),
               "methods": tuple(values.get("methods", ("all",)))}
    return RunSettings(**values)
