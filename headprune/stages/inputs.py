"""The inputs every stage of a run reads, loaded once: the model, its windows and tokenizer, both token streams, the
budget a real model's run picks and the patching task's pairs (built before anything is spent)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from headprune.data.tokens import corpus_ids, token_digest
from headprune.errors import HeadpruneError
from headprune.io.read.fingerprint import model_fingerprint
from headprune.io.read.loading import load_model
from headprune.io.read.tokenizer import model_tokenizer
from headprune.models.base import HeadModel
from headprune.perplexity import Windowing
from headprune.runtime import configure_allocator
from headprune.stages.settings import RunSettings, run_plan, saved_settings, settings_fields
from headprune.version import __version__


@dataclass
class RunInputs:
    """What every stage of a run reads: the model, its windows and tokenizer, the two token streams, and how long
    loading and tokenizing took."""

    model: HeadModel
    windowing: Windowing
    tokenizer: Any
    eval_ids: Tensor  # test split of ``data``: the curves judge heads here
    score_ids: Tensor  # validation split of ``score_data``: heads are scored here
    seconds_load: float
    seconds_tokenize: float
    budget: Any = None  # the headprune.cost.Budget a budgeted run picked (None: the given max_tokens)
    patch_pairs: Any = None  # the PromptPairs of s.patch_task (None for "none"), built by resolve_patch_task
    patch_note: str | None = None  # why the patching task differs from the first choice (resolve_patch_task)

    def fingerprint(self, s: RunSettings, methods: list[str]) -> dict:
        """What the run's progress file is valid for: settings, model, both token streams, windows, device."""
        return settings_fields(s) | {
            "methods": methods, "out": None, "model_fingerprint": model_fingerprint(self.model),
            "eval_tokens": token_digest(self.eval_ids), "score_tokens": token_digest(self.score_ids),
            **self.windowing.settings(), "device_type": self.model.device.type, "version": __version__}


def resolve_budget(s: RunSettings, model: HeadModel) -> Any:
    """With ``s.budget`` off a GPU: :func:`headprune.cost.run_budget` for ``s``; where it cuts the tokens, its tokens
    and window are written into ``s.max_tokens`` and ``s.seq_len`` (so that the settings, the fingerprint and the
    reproduce commands are those of the explicit command). ``s.budget`` is then off; None without a budget (a GPU
    runs the given one)."""
    if not s.budget:
        return None
    s.budget = False
    if model.device.type == "cuda" or not s.max_tokens:
        return None
    from headprune.cost import run_budget

    budget = run_budget(model, run_plan(s), s.max_tokens, s.seq_len, s.stride)
    if budget.tokens < s.max_tokens:
        s.max_tokens, s.seq_len = budget.tokens, budget.seq_len
    return budget


AUTO_PATCH_TASKS = ("brackets", "induction")  # --patch-task auto: the first whose pairs the tokenizer builds


def resolve_patch_task(s: RunSettings, model: HeadModel, tokenizer) -> tuple[Any, str | None]:
    """Build, before anything is spent, ``s.patch_task``'s pairs for this model and tokenizer (a task that cannot
    raises here, not after the scoring); ``auto`` becomes the first of :data:`AUTO_PATCH_TASKS` that builds.
    Returns (the pairs, None for "none"; a line saying why a task was passed over, None where none was)."""
    from headprune.patching.tasks import task_pairs

    if s.patch_task == "none":
        return None, None
    passed: list[str] = []
    for task in AUTO_PATCH_TASKS if s.patch_task == "auto" else (s.patch_task,):
        try:
            pairs = task_pairs(task, model, tokenizer, n_pairs=s.patch_pairs, seed=s.seed)
        except HeadpruneError as err:
            if s.patch_task != "auto":
                raise HeadpruneError(f"--patch-task: {err} (give another task, or none)", "patch-task") from err
            passed.append(f"{task} ({err})")
            continue
        s.patch_task = task
        return pairs, (f"patching task: {task}, in place of {'; '.join(passed)}" if passed else None)
    raise AssertionError("induction pairs are random tokens: they build for every tokenizer")


def load_inputs(s: RunSettings) -> RunInputs:
    """The model of ``s`` on its device and dtype, its windows, and the tokens of both splits (with ``s.budget``,
    as many as :func:`resolve_budget` picks)."""
    t_start = time.perf_counter()
    model = load_model(s.model, device=s.device, dtype=s.dtype, fold_value_bias=s.fold_value_bias)
    configure_allocator(model)  # no number changes (headprune.runtime)
    t_load = time.perf_counter() - t_start
    budget = resolve_budget(s, model)
    windowing = Windowing.for_model(model, s.seq_len, s.stride, s.batch_size)
    tokenizer = model_tokenizer(model)
    patch_pairs, patch_note = resolve_patch_task(s, model, tokenizer)
    eval_ids = corpus_ids(s.data, "test", tokenizer, s.max_tokens)
    score_ids = corpus_ids(s.score_data, "validation", tokenizer, s.max_tokens)
    return RunInputs(model, windowing, tokenizer, eval_ids, score_ids, t_load,
                     time.perf_counter() - t_start - t_load, budget, patch_pairs, patch_note)


def reload_inputs(folder: str | Path) -> tuple[dict, RunSettings, RunInputs]:
    """A finished run's settings.json record, its :class:`RunSettings` and its inputs as its own stages loaded them
    (the same model, windows and token streams: :func:`saved_settings`), for a stage run later on its folder."""
    path = Path(folder) / "settings.json"
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise HeadpruneError(f"{folder} holds no settings.json: not the output folder of headprune run") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise HeadpruneError(f"cannot read {path} ({type(err).__name__}); run headprune run again") from None
    if not isinstance(record, dict):
        raise HeadpruneError(f"{path} must hold a JSON object: not the settings of headprune run")
    try:
        s = saved_settings(record)
    except (TypeError, ValueError) as err:  # a field missing or of the wrong kind
        raise HeadpruneError(f"{path} is not the settings of headprune run ({err})") from None
    return record, s, load_inputs(s)
