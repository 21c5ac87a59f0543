"""The resumable state of a gate training (:func:`headprune.pruning.gates.learn_gates`) and its checkpoints.

A checkpoint is the whole state (log α, the Lagrange multipliers, both optimisers' moments, the noise generator and
the loss history) as one JSON unit of a :class:`~headprune.io.work.progress.Progress` under ``PREFIX/ckpt/STEP``;
JSON round-trips every float exactly, so a resumed training is bit-identical to one never stopped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from headprune.errors import HeadpruneError
from headprune.io.work.progress import NoProgress, Progress


def _to_json(value: Any) -> Any:
    """Optimiser state -> JSON: tensors as {dtype, shape, data}; dict keys as text."""
    if isinstance(value, Tensor):
        return {"__tensor__": str(value.dtype).removeprefix("torch."), "shape": list(value.shape),
                "data": value.detach().cpu().reshape(-1).tolist()}
    if isinstance(value, dict):
        return {str(k): _to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    return value


def _from_json(value: Any) -> Any:
    if isinstance(value, dict) and "__tensor__" in value:
        return torch.tensor(value["data"], dtype=getattr(torch, value["__tensor__"])).reshape(value["shape"])
    if isinstance(value, dict):
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


def _optimizer_state(opt: torch.optim.Optimizer) -> dict:
    return _to_json(opt.state_dict())


def _load_optimizer(opt: torch.optim.Optimizer, saved: dict) -> None:
    state = _from_json(saved)
    state["state"] = {int(k): v for k, v in state["state"].items()}  # JSON made the parameter indices text
    opt.load_state_dict(state)


def checkpoint_key(prefix: str, step: int) -> str:
    """The progress unit of the checkpoint after ``step`` steps."""
    return f"{prefix}/ckpt/{step:07d}"


def latest_checkpoint(progress: Progress | NoProgress, prefix: str) -> dict | None:
    """The checkpoint under ``prefix`` with the most steps that ``progress`` holds (None: none)."""
    units = getattr(progress, "units", {})
    keys = sorted(k for k in units if k.startswith(f"{prefix}/ckpt/"))
    return units[keys[-1]] if keys else None


@dataclass
class GateState:
    """Everything a gate training carries from step to step: ``log_alpha`` [N] (one per head, moved by ``opt``),
    ``lambdas`` the multipliers λ₁, λ₂ [2] of a target sparsity ([0] under a fixed penalty; moved by ascent by
    ``lam_opt``, None then), ``gen`` the generator of the noise u, ``history`` one record per checkpoint (step and
    the means since the last) and ``step`` the steps done."""

    log_alpha: Tensor
    lambdas: Tensor
    opt: torch.optim.Optimizer
    lam_opt: torch.optim.Optimizer | None
    gen: torch.Generator
    history: list[dict] = field(default_factory=list)
    step: int = 0

    def restore(self, saved: dict, steps: int) -> None:
        """Take on the checkpoint ``saved`` of a training of ``steps`` steps; a hand-edited or damaged record is
        refused in one line, never a KeyError from deep inside."""
        try:
            with torch.no_grad():
                self.log_alpha.copy_(torch.tensor(saved["log_alpha"], dtype=torch.float32))
                self.lambdas.copy_(torch.tensor(saved["lambdas"], dtype=torch.float32))
            _load_optimizer(self.opt, saved["opt"])
            if self.lam_opt is not None:
                _load_optimizer(self.lam_opt, saved["lam_opt"])
            self.gen.set_state(torch.tensor(bytearray.fromhex(saved["rng"]), dtype=torch.uint8))
            self.step, self.history = int(saved["step"]), list(saved["history"])
            if not 0 <= self.step <= steps:
                raise ValueError(f"step {self.step}")
        except (KeyError, TypeError, ValueError, RuntimeError, AttributeError, IndexError) as err:
            raise HeadpruneError(f"a gate checkpoint in the progress file is damaged ({type(err).__name__}: "
                                 f"{str(err)[:60]}); pass --overwrite to start afresh") from None

    def checkpoint(self) -> dict:
        """This state as one JSON record (the history is this state's list itself, not a copy)."""
        return {"step": self.step, "log_alpha": self.log_alpha.detach().cpu().tolist(),
                "lambdas": self.lambdas.detach().cpu().tolist(), "opt": _optimizer_state(self.opt),
                "lam_opt": _optimizer_state(self.lam_opt) if self.lam_opt is not None else None,
                "rng": bytes(self.gen.get_state().tolist()).hex(), "history": self.history}
