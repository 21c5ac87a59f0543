"""The layers stage of a run: each layer's heads removed together (:func:`headprune.scoring.layers.layer_ablation`)
on both token streams: the validation split, where the layer that matters most is chosen, and the test split, where
its cost is reported (:mod:`headprune.report.layers`). The table is the run's ``layers.csv``."""

from __future__ import annotations

import pandas as pd

from headprune.io.work.progress import NoProgress, Progress
from headprune.schema import LAYER_COLUMNS, LAYER_SCORE, LAYER_SPLITS
from headprune.scoring import ScoringOptions
from headprune.scoring.layers import layer_ablation
from headprune.stages.inputs import RunInputs
from headprune.stages.settings import RunSettings
from headprune.table_checks import check_layers


def layer_stage(inputs: RunInputs, s: RunSettings, progress: Progress | NoProgress, quiet: bool = False
                ) -> pd.DataFrame:
    """The checked layers table (one row per split and layer) of the run with settings ``s`` and ``inputs``: the
    score split's ids as the validation rows, the evaluation split's as the test rows, with the run's bootstrap, seed
    and ablation rows; resumable units under ``abl_layer/<split>`` in ``progress``."""
    options = ScoringOptions(ablation_rows=s.ablation_rows, bootstrap=s.bootstrap, seed=s.seed)
    frames = []
    for split, ids in zip(LAYER_SPLITS, (inputs.score_ids, inputs.eval_ids), strict=True):
        table = layer_ablation(inputs.model, ids, inputs.windowing, options=options, progress=progress,
                               show_progress=not quiet, prefix=f"{LAYER_SCORE}/{split}")
        frames.append(table.assign(split=split))
    return check_layers(pd.concat(frames, ignore_index=True)[list(LAYER_COLUMNS)])
