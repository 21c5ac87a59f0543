"""What patching measures at each pair's last position, from the logits ℓ (N, V) there:

    logit_diff   m = ℓ[answer] − ℓ[wrong]                         (the default)
    logprob      m = log softmax(ℓ)[answer]
    kl           m = KL(p_clean ‖ p) = Σ_v p_clean(v) (log p_clean(v) − log p(v))   (0 on the clean run)

and its normalisation against the two unpatched runs, 1 = the clean behaviour, 0 = the corrupt one:

    normalised(m) = (m − m_corrupt) / (m_clean − m_corrupt)
"""

from __future__ import annotations

import torch
from torch import Tensor

from headprune.errors import HeadpruneError
from headprune.models.base import HeadModel

METRICS = ("logit_diff", "logprob", "kl")
DEFAULT_METRIC = "logit_diff"


def check_metric(metric: str) -> str:
    if metric not in METRICS:
        raise HeadpruneError(f"unknown metric {metric!r}; choose from {', '.join(METRICS)}", "metric")
    return metric


def last_logits(model: HeadModel, resid: Tensor, last: Tensor) -> Tensor:
    """The logits (N, V) at position last[n] of each row of the final residual stream resid (N, T, d).
    LayerNorm and the LM head act per position, so only N positions are unembedded."""
    return model.unembed(resid[torch.arange(len(last), device=resid.device), last].unsqueeze(1))[:, 0]


def metric_values(metric: str, logits: Tensor, answer: Tensor, wrong: Tensor,
                  clean_logprobs: Tensor | None = None) -> Tensor:
    """m (N,) float32 from last-position logits (N, V); ``clean_logprobs`` (N, V): log p_clean, for ``kl``."""
    logits = logits.float()
    rows = torch.arange(len(logits), device=logits.device)
    if metric == "logit_diff":
        return logits[rows, answer] - logits[rows, wrong]
    logprobs = logits.log_softmax(-1)
    if metric == "logprob":
        return logprobs[rows, answer]
    if metric == "kl":
        assert clean_logprobs is not None, "kl needs the clean run's log-probabilities"
        return (clean_logprobs.exp() * (clean_logprobs - logprobs)).sum(-1)
    raise HeadpruneError(f"unknown metric {metric!r}; choose from {', '.join(METRICS)}", "metric")


def normalise(m: Tensor, m_clean: Tensor, m_corrupt: Tensor) -> Tensor:
    """(m − m_corrupt) / (m_clean − m_corrupt), elementwise (broadcasting)."""
    return (m - m_corrupt) / (m_clean - m_corrupt)
