"""Recovery after pruning: train every remaining weight of a (physically pruned) model, optionally distilling
from the unpruned teacher, as structured-pruning work does (Sheared LLaMA, Xia et al. 2024: continued
pre-training; Minitron, Muralidharan et al. 2024: logit distillation from the unpruned model).

Loss per batch of windows x (B, L), over the B·(L−1) next-token predictions t, with student logits s_t,
teacher logits u_t, temperature T and distillation weight α (Hinton et al. 2015):

    CE = mean_t −log softmax(s_t)[x_{t+1}]
    KL = mean_t Σ_v p_v(u_t / T) · (log p_v(u_t / T) − log p_v(s_t / T))
    loss = (1 − α) · CE + α · T² · KL

(T² keeps the soft term's gradient, T·(p(s/T) − p(u/T)) per logit, on the scale of CE's as T changes.)

Optimiser: AdamW (β = 0.9, 0.95; weight decay on matrices only), gradient norm clipped, learning rate
lr · f(k) at update k = 0..N−1 (:func:`lr_factor`): linear warmup f = (k+1)/W for k < W, then cosine decay
f = r + (1 − r) · ½ (1 + cos(π (k − W)/(N − W))) towards the floor r = ``min_lr_ratio``.

Batch k is ``batch_size`` windows of ``seq_len`` tokens at random starts drawn from a generator seeded by
(seed, k), each after the model's BOS token where its tokenizer puts one before a text: the data position is
the step. A checkpoint (weights, optimiser, scheduler, RNG, step, losses) is written atomically every
``checkpoint_every`` steps; a killed run resumes from it to bit-identical weights.
"""

from __future__ import annotations

import math
import os
import signal
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from headprune.errors import HeadpruneError
from headprune.io.work.files import atomic_path
from headprune.io.work.progress import fingerprint
from headprune.models.base import HeadModel
from headprune.perplexity import DEFAULT_MAX_SEQ_LEN

#: For tests only: SIGKILL the process right after this many optimiser steps (a deterministic kill).
KILL_ENV = "HEADPRUNE_TEST_KILL_AFTER_STEPS"


@dataclass(frozen=True)
class Recipe:
    """How to fine-tune: steps, schedule, batches, distillation. :meth:`resolve` fills defaults and checks."""

    steps: int
    lr: float = 1e-4
    warmup: int | None = None  # default: 10% of steps
    batch_size: int = 8
    seq_len: int | None = None  # default: the model's n_positions, at most DEFAULT_MAX_SEQ_LEN
    seed: int = 0
    weight_decay: float = 0.1
    min_lr_ratio: float = 0.1
    clip: float = 1.0
    distill_weight: float = 0.0  # α: 0 = plain fine-tuning (no teacher needed)
    temperature: float = 2.0
    checkpoint_every: int = 50

    def resolve(self, n_positions: int, bos: bool = False) -> Recipe:
        """A copy with defaults filled in, every value checked (HeadpruneError naming the parameter); ``bos``:
        every window starts with a BOS token, which takes one of the ``n_positions``."""
        n_positions -= bos
        if not isinstance(self.steps, int) or self.steps < 1:
            raise HeadpruneError(f"steps {self.steps} must be at least 1")
        warmup = max(1, self.steps // 10) if self.warmup is None else self.warmup
        seq_len = min(n_positions, DEFAULT_MAX_SEQ_LEN) if self.seq_len is None else self.seq_len
        room = (f"n_positions - 1 ({n_positions}, one position left for the BOS token)" if bos
                else f"n_positions ({n_positions})")
        checks = [
            ("lr", self.lr, math.isfinite(self.lr) and self.lr > 0, "must be a positive number"),
            ("warmup", warmup, 0 <= warmup <= self.steps, f"must lie in 0..steps ({self.steps})"),
            ("batch_size", self.batch_size, 1 <= self.batch_size <= 1 << 16, "must lie in 1..65536"),
            ("seq_len", seq_len, 2 <= seq_len <= n_positions, f"must lie in 2..{room}"),
            ("seed", self.seed, self.seed >= 0, "must be at least 0"),
            ("weight_decay", self.weight_decay, 0 <= self.weight_decay < math.inf, "must be a number >= 0"),
            ("min_lr_ratio", self.min_lr_ratio, 0 <= self.min_lr_ratio <= 1, "must lie in [0, 1]"),
            ("clip", self.clip, 0 < self.clip < math.inf, "must be a positive number"),
            ("distill_weight", self.distill_weight, 0 <= self.distill_weight <= 1, "must lie in [0, 1]"),
            ("temperature", self.temperature, 0 < self.temperature < math.inf, "must be a positive number"),
            ("checkpoint_every", self.checkpoint_every, self.checkpoint_every >= 1, "must be at least 1"),
        ]
        for name, value, ok, rule in checks:
            if not ok:
                raise HeadpruneError(f"{name} {value} {rule}", name)
        return Recipe(**{**asdict(self), "warmup": warmup, "seq_len": seq_len})

    def as_dict(self) -> dict:
        return asdict(self)


def lr_factor(step: int, steps: int, warmup: int, min_lr_ratio: float = 0.1) -> float:
    """The learning-rate multiplier of update ``step`` (0-based): linear warmup, then cosine decay to the floor."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def train_batch(ids: Tensor, step: int, batch_size: int, seq_len: int, seed: int, bos: int | None = None) -> Tensor:
    """Batch ``step``: (batch_size, seq_len) windows of ``ids`` at starts drawn from a generator seeded by
    (seed, step), each after the token ``bos`` where one is given (then seq_len + 1 columns)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, len(ids) - seq_len + 1, (batch_size,), generator=g)
    prefix = ids.new_tensor([] if bos is None else [bos])
    return torch.stack([torch.cat([prefix, ids[s : s + seq_len]]) for s in starts.tolist()])


def recovery_loss(logits: Tensor, tokens: Tensor, teacher_logits: Tensor | None = None, alpha: float = 0.0,
                  temperature: float = 1.0) -> tuple[Tensor, Tensor, Tensor | None]:
    """(loss, CE, KL) of student ``logits`` (B, L, V) on ``tokens`` (B, L); KL is None without a teacher.

    loss = (1 − α) CE + α T² KL(softmax(u/T) ‖ softmax(s/T)), both means over the B·(L−1) predictions."""
    V, wide = logits.shape[-1], torch.promote_types(logits.dtype, torch.float32)
    s = logits[:, :-1].reshape(-1, V).to(wide)  # (n, V), fp32 or wider
    ce = F.cross_entropy(s, tokens[:, 1:].reshape(-1))
    if teacher_logits is None or alpha == 0:
        return ce, ce, None
    u = teacher_logits[:, :-1].reshape(-1, V).to(wide)
    log_p_teacher, log_p_student = F.log_softmax(u / temperature, -1), F.log_softmax(s / temperature, -1)
    # Σ_v p_u (log p_u − log p_s), mean over n
    kl = F.kl_div(log_p_student, log_p_teacher, log_target=True, reduction="batchmean")
    return (1 - alpha) * ce + alpha * temperature**2 * kl, ce, kl


def make_optimizer(model: HeadModel, recipe: Recipe) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW (weight decay on the ≥2-D tensors only: not on biases or LayerNorms) and its LambdaLR schedule."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": recipe.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=recipe.lr, betas=(0.9, 0.95))
    steps, warmup, floor = recipe.steps, recipe.warmup or 0, recipe.min_lr_ratio
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: lr_factor(k, steps, warmup, floor))
    return opt, sched


@dataclass
class FinetuneResult:
    steps: int
    losses: list[float] = field(default_factory=list)  # loss of every step, in order
    resumed_from: int = 0  # the step a checkpoint resumed at (0: a fresh start)


def _check_inputs(model: HeadModel, ids: Tensor, recipe: Recipe, teacher: HeadModel | None) -> None:
    if len(ids) < recipe.seq_len + 1:  # type: ignore[operator]
        raise HeadpruneError(f"the training data has {len(ids)} tokens, fewer than one window of seq_len "
                             f"{recipe.seq_len} (+1); give more text or a shorter --seq-len")
    if recipe.distill_weight > 0 and teacher is None:
        raise HeadpruneError("distill_weight > 0 needs a teacher (the unpruned model)", "distill_weight")
    if teacher is not None:
        if teacher.cfg.vocab_size != model.cfg.vocab_size:
            raise HeadpruneError(f"the teacher's vocabulary ({teacher.cfg.vocab_size}) differs from the student's "
                                 f"({model.cfg.vocab_size}); distil from the model that was pruned")
        if teacher.cfg.n_positions < recipe.seq_len + (model.origin.bos_token_id is not None):  # type: ignore[operator]
            raise HeadpruneError(f"the teacher has only {teacher.cfg.n_positions} positions, fewer than seq_len "
                                 f"{recipe.seq_len}")


def run_key(model: HeadModel, ids: Tensor, recipe: Recipe, teacher: HeadModel | None) -> str:
    """What a checkpoint must match to be resumed: the starting model, the data, the recipe, the teacher."""
    from headprune.data.tokens import token_digest
    from headprune.io.read.fingerprint import model_fingerprint

    return fingerprint(model=model_fingerprint(model), tokens=token_digest(ids), recipe=recipe.as_dict(),
                       bos=model.origin.bos_token_id,
                       teacher=model_fingerprint(teacher) if teacher is not None else None,
                       dtype=str(model.dtype), device=model.device.type)


def _save_checkpoint(path: Path, key: str, model: HeadModel, opt, sched, step: int, losses: list[float]) -> None:
    state = {"key": key, "step": step, "data_position": step, "losses": list(losses),
             "model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
             "rng": torch.get_rng_state()}
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def _load_checkpoint(path: Path, key: str, model: HeadModel, opt, sched, overwrite: bool) -> tuple[int, list[float]]:
    """Restore a checkpoint of the same run into model/opt/sched; (step, losses). (0, []) when there is none."""
    if not path.exists():
        return 0, []
    if not path.is_file():
        raise HeadpruneError(f"checkpoint {path} is not a regular file; remove it or choose another output")
    if overwrite:
        path.unlink()
        return 0, []
    try:
        state = torch.load(path, map_location=model.device, weights_only=True)
        if not isinstance(state, dict) or state.get("key") != key:
            raise HeadpruneError(f"{path} is the checkpoint of a different fine-tune (other model, data, teacher or "
                                 "recipe); pass --overwrite to discard it or choose another output")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"])
        return int(state["step"]), [float(x) for x in state["losses"]]
    except HeadpruneError:
        raise
    except Exception as err:  # noqa: BLE001 - torch.load and load_state_dict raise many kinds on a damaged file
        raise HeadpruneError(f"checkpoint {path} is damaged ({type(err).__name__}); pass --overwrite to start "
                             "afresh") from None


def finetune(
    model: HeadModel,
    ids: Tensor,  # 1-D training token ids
    recipe: Recipe,
    teacher: HeadModel | None = None,
    checkpoint: str | os.PathLike | None = None,
    overwrite: bool = False,
    show_progress: bool = True,
) -> FinetuneResult:
    """Train every parameter of ``model`` its checkpoint stores, in place, for ``recipe.steps`` AdamW steps.

    ``checkpoint``: a file to write every ``recipe.checkpoint_every`` steps and to resume from (the caller
    removes it once the result is safe). The model is left in eval mode without gradients."""
    bos = model.origin.bos_token_id
    recipe = recipe.resolve(model.cfg.n_positions, bos is not None)
    _check_inputs(model, ids, recipe, teacher)
    key = run_key(model, ids, recipe, teacher)
    model.train().requires_grad_(True)
    for b_O in _unstored_biases(model):
        b_O.requires_grad_(False)
    opt, sched = make_optimizer(model, recipe)
    path = Path(checkpoint) if checkpoint is not None else None
    start, losses = _load_checkpoint(path, key, model, opt, sched, overwrite) if path is not None else (0, [])
    if teacher is not None:
        teacher.eval().requires_grad_(False)
    kill_after = int(os.environ.get(KILL_ENV, "0"))
    params = [p for p in model.parameters() if p.requires_grad]
    bar = tqdm(range(start, recipe.steps), initial=start, total=recipe.steps, desc="fine-tune",
               disable=not show_progress, leave=False)
    for step in bar:
        tokens = train_batch(ids, step, recipe.batch_size, recipe.seq_len, recipe.seed,  # type: ignore[arg-type]
                             bos).to(model.device)
        teacher_logits = None
        if teacher is not None and recipe.distill_weight > 0:
            with torch.no_grad():
                teacher_logits = teacher(tokens)
        loss, ce, _ = recovery_loss(model(tokens), tokens, teacher_logits, recipe.distill_weight, recipe.temperature)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, recipe.clip)
        opt.step()
        sched.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.4f}", ce=f"{ce.item():.3f}", lr=f"{sched.get_last_lr()[0]:.2e}")
        done = step + 1
        if path is not None and (done % recipe.checkpoint_every == 0 or done == recipe.steps):
            _save_checkpoint(path, key, model, opt, sched, done, losses)
        if done == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
    bar.close()
    model.zero_grad(set_to_none=True)
    model.eval().requires_grad_(False)
    return FinetuneResult(recipe.steps, losses, start)


# ---------------------------------------------------------------- pruned checkpoints in and out


def read_marker(folder: str | os.PathLike) -> dict:
    """The ``headprune_export.json`` of an export folder ({} for a plain GPT-2 folder)."""
    import json

    from headprune.io.read.sources import resolve_source
    from headprune.io.write.export_folder import EXPORT_MARKER

    path = resolve_source(folder) / EXPORT_MARKER
    if not path.is_file():
        return {}
    try:
        marker = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise HeadpruneError(f"cannot read {path} ({type(err).__name__}); the export is damaged") from None
    if not isinstance(marker, dict) or marker.get("format") not in ("native", "hf") or not isinstance(
            marker.get("removed_heads", []), list):
        raise HeadpruneError(f"{path} is not a headprune export record; the export is damaged")
    return marker


def _unstored_biases(model) -> list[torch.Tensor]:
    """The zero b_O of a family whose checkpoint has no o_proj bias (``cfg.o_bias`` False): held out of training,
    since its export could not store a trained value (transformers' Mistral and Qwen2 have no such bias)."""
    if getattr(model.cfg, "o_bias", True):
        return []
    return [blk.attn.b_O for blk in model.h]


def load_pruned(folder: str | os.PathLike, device="cpu", dtype=torch.float32, fold_value_bias: bool = False
                ) -> tuple[HeadModel, dict]:
    """A pruned export (``headprune prune --out``) as a physically pruned model, and its export record.

    ``native`` and compact ``hf`` exports load at their smaller shapes. Zeroed ``hf`` exports hold the original
    shapes with the removed heads zeroed: those heads are removed again (exactly: they contribute 0, checked), so
    training cannot revive them. ``fold_value_bias``: fold the value biases of the heads left into b_O (logits
    unchanged)."""
    from headprune.io.read.loading import load_model
    from headprune.models.heads import parse_head_id
    from headprune.pruning.provenance import check_removed_heads_zero
    from headprune.pruning.prune import prune_model

    marker = read_marker(folder)
    model = load_model(folder, device=device, dtype=dtype, fold_value_bias=fold_value_bias)
    if marker.get("format") == "hf" and marker.get("layout") != "compact" and marker.get("removed_heads"):
        try:
            heads = [parse_head_id(h) for h in marker["removed_heads"]]
        except (HeadpruneError, TypeError, AttributeError):
            raise HeadpruneError(f"{folder}: the export record lists malformed removed heads; the export is damaged"
                                 ) from None
        check_removed_heads_zero(model, heads, folder)
        model = prune_model(model, heads)
    return model, marker


def export_recovered(model: HeadModel, folder: str | os.PathLike, fmt: str, marker: dict, info: dict,
                     overwrite: bool = False) -> Path:
    """Write the fine-tuned model like the pruned export it came from (``fmt``: native or hf, shapes kept),
    its record carrying the pruning metadata plus ``finetune`` = ``info``; in the dtype it was trained in."""
    from headprune.io.write.export import export_hf, export_native

    meta = {k: v for k, v in marker.items() if k not in ("format", "source", "removed_heads", "dtype")}
    meta["finetune"] = info
    export = export_native if fmt == "native" else export_hf
    return export(model, folder, overwrite=overwrite, metadata=meta, dtype=model.dtype)

