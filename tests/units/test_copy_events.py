"""copy_events (headprune.scoring.retrieval) on hand-made windows: the edges of the recent window and the sinks."""

from __future__ import annotations

import torch

from headprune.scoring.retrieval import copy_events


def events(tokens: list[int], sink: int, recent: int, wrong: tuple[int, ...] = ()) -> list[int]:
    x = torch.tensor(tokens)
    predicted = x[1:].clone()
    predicted[list(wrong)] = -1  # the model's top-1 misses these positions
    scored = torch.ones(len(tokens) - 1, dtype=torch.bool)
    return copy_events(x, predicted, scored, sink, recent).nonzero().flatten().tolist()


def test_source_exactly_recent_back_is_beyond_the_window():
    # t = 4 predicts 7, found at s = 2 = t − recent: a streaming head (keys t − s < 2) cannot see it
    assert events([9, 0, 7, 1, 2, 7], sink=0, recent=2) == [4]
    assert events([9, 0, 7, 1, 2, 7], sink=0, recent=3) == []  # now s = 2 is in the recent window


def test_sources_among_the_sinks_or_also_recent_are_no_event():
    assert events([7, 1, 2, 3, 4, 7], sink=1, recent=2) == []  # the only source is a sink
    assert events([7, 1, 2, 3, 4, 7], sink=0, recent=2) == [4]
    assert events([5, 7, 1, 2, 7, 7], sink=0, recent=2) == [3]  # t = 4's 7 is also at s = 4: recent


def test_only_tokens_the_model_predicts():
    assert events([9, 0, 7, 1, 2, 7], sink=0, recent=2, wrong=(4,)) == []
