"""Each layer's heads removed together: which layer matters, as a joint ablation rather than a sum of singles.

For layer l with every one of its query heads zero-ablated at once (z_i = 0, so the layer's attention writes b_O):

    abl_layer_l = Σ_w (NLL_w(layer l's heads zeroed) − NLL_w) / Σ_w n_w          (nats/token)

over the windows w of the corpus (n_w scored tokens each), measured exactly with the set sweep of
:mod:`.set_sweep` (one batched copy per layer, run from the cached residual entering it). Its 95% interval comes
from percentile-bootstrap replicates that resample the windows (:mod:`headprune.bootstrap`); each layer's share
abl_layer_l / Σ_k abl_layer_k (stated only where no layer's ΔNLL is negative: parts of a whole) gets its interval from
the same replicates, so the shares are resampled jointly (a replicate whose total is not positive left out; a layer
whose own interval reaches below 0 can have a replicate share below 0, so its share interval may too). The
sum of a layer's single-head ablations is another number: heads of one layer can stand in for each other (the sum
overstates the joint) or need each other (it understates it).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from torch import Tensor

from headprune.bootstrap import check_replicates, interval, window_counts
from headprune.errors import HeadpruneError
from headprune.io.work.progress import NoProgress, Progress
from headprune.models.base import HeadModel
from headprune.perplexity import Windowing
from headprune.schema import LAYER_SCORE
from headprune.scoring import DEFAULT_SCORING, ScoringOptions
from headprune.scoring.base import rows_per_forward
from headprune.scoring.set_sweep import ZERO, SetSweep


def layer_ablation(
    model: HeadModel,
    ids: Tensor,  # 1-D token ids
    windowing: Windowing,
    *,
    options: ScoringOptions = DEFAULT_SCORING,  # its ablation_rows, bootstrap and seed
    progress: Progress | NoProgress | None = None,
    show_progress: bool = True,
    prefix: str = LAYER_SCORE,
) -> pd.DataFrame:
    """One row per layer that has heads (the columns of :data:`~headprune.schema.LAYER_COLUMNS` but ``split``): its
    heads zero-ablated together, ΔNLL and its share of the layers' total, each with a 95% interval over replicates
    of the windows (``options.bootstrap`` of them, seeded by ``options.seed``; 0 replicates: NaN intervals), an
    ablated copy per row of ``options.ablation_rows``. Resumable units keyed under ``prefix`` in ``progress``."""
    bootstrap = options.bootstrap
    check_replicates(bootstrap)
    batches = windowing.batches(ids)  # HeadpruneError where the ids make no window
    layers = [layer for layer in range(model.cfg.n_layers) if model.h[layer].attn.n_heads]
    if not layers:
        raise HeadpruneError("the model has no attention heads left to ablate", "model")
    sets = [[head for head in model.head_ids if head[0] == layer] for layer in layers]
    rows = rows_per_forward(model, options.ablation_rows)
    sweep = SetSweep(model, LAYER_SCORE, batches, ZERO, rows, progress or NoProgress(), show_progress, prefix)
    changes = sweep.measure_windows({prefix: sets}, "layers removed whole")[prefix]  # [L, W] ΔNLL sums
    tokens = sweep.window_tokens()  # [W]
    delta = changes.sum(1) / tokens.sum()  # [L]
    total = delta.sum()
    share = delta / total if total > 0 and (delta >= 0).all() else np.full_like(delta, np.nan)  # parts of a whole
    lo = hi = share_lo = share_hi = np.full_like(delta, np.nan)
    if bootstrap:
        counts = window_counts(len(tokens), bootstrap, options.seed).numpy()  # [B, W]
        replicates = (counts @ changes.T) / (counts @ tokens)[:, None]  # [B, L]
        totals = replicates.sum(1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            shares = np.where(totals > 0, replicates / totals, np.nan)
        (lo, hi), (share_lo, share_hi) = interval(replicates), interval(shares)
        share_lo, share_hi = np.where(np.isnan(share), np.nan, share_lo), np.where(np.isnan(share), np.nan, share_hi)
    return pd.DataFrame({"layer": layers, "n_heads": [len(s) for s in sets], LAYER_SCORE: delta,
                         f"{LAYER_SCORE}_ci_lo": lo, f"{LAYER_SCORE}_ci_hi": hi, "share": share,
                         "share_ci_lo": share_lo, "share_ci_hi": share_hi, "windows": len(tokens),
                         "tokens": int(tokens.sum())})
