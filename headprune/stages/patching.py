"""The patching stage: which heads carry a behaviour, as the report, ``patch`` and the studies show it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from headprune.io.work.progress import Progress
    from headprune.models.base import HeadModel
    from headprune.patching.pairs import PromptPairs
    from headprune.patching.study import Study, StudyOptions
    from headprune.report.patching_section import PatchingReport


def patching_report(study: Study, task: str | None, **info: Any) -> PatchingReport:
    """The report's record of ``study``: its tables and its summary with the task (and the task's text, for a
    built-in task) and ``info``."""
    from headprune.patching.tasks import TASK_TEXT
    from headprune.report.patching_section import PatchingReport

    text = {"task_text": TASK_TEXT[task]} if task in TASK_TEXT else {}
    return PatchingReport(study.table, study.agreement, study.missed, study.summary | {"task": task, **info, **text})


def patch_stage(model: HeadModel, pairs: PromptPairs, options: StudyOptions, *, task: str | None,
                progress: Progress | None = None, quiet: bool = False, **info: Any) -> tuple[Study, PatchingReport]:
    """Patch every head on ``pairs`` (exact patching, AtP and AtP* as ``options`` says; resumable through
    ``progress``) and the report's record of it."""
    from headprune.patching.study import patch_study

    study = patch_study(model, pairs, options, progress=progress, show_progress=not quiet)
    return study, patching_report(study, task, **info)
