"""Modules built for their shapes alone: on the meta device, without their random initialisation."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor


@contextmanager
def on_meta() -> Iterator[None]:
    """Inside, modules are built on the meta device (nothing is allocated), without torch's warning about
    initialising the zero-element weights of an emptied layer, and ``nn.init.normal_`` leaves its tensor as it is: a
    meta tensor has no values to draw, and the draw's first call imports torch._dynamo (2 s)."""
    normal = torch.nn.init.normal_

    def keep(tensor: Tensor, *args, **kwargs) -> Tensor:
        return tensor

    torch.nn.init.normal_ = keep
    try:
        with torch.device("meta"), warnings.catch_warnings():
            # a layer pruned to no heads has zero-row projections: their (skipped) initialisation warns
            warnings.filterwarnings("ignore", message="Initializing zero-element tensors is a no-op")
            yield
    finally:
        torch.nn.init.normal_ = normal
