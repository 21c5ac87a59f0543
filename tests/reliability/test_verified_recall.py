"""recall_at_k by hand (a mutation of its ordering survived the oracle tests: issue 52, 8)."""

from __future__ import annotations

import pytest

from headprune.scoring.verified_stats import recall_at_k


@pytest.mark.parametrize("verified, want", [
    ([False, True, False, False], 1.0),  # K=1: the true top by |ΔL| is head 1 (|−5|)
    ([True, False, True, False], 0.0),  # K=2: the true top two are heads 1 and 3, neither verified
    ([False, True, True, False], 0.5),
])
def test_recall_at_k_by_hand(verified, want):
    assert recall_at_k([0.1, -5.0, 0.2, 3.0], verified) == want
