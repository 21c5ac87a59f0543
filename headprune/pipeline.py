"""The main job (``headprune run``): ledger, baseline, all scores, pruning curves, report.

Heads are scored on one corpus split (``score_data``, default: the default corpus' validation split) and
the curves are measured on another (``data``, default: its test split), so no head is chosen on the text
that judges it. Every unit of work is recorded in ``OUT/.progress.jsonl``: a killed run resumes.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import pandas as pd

from . import __version__
from .corpus import corpus_ids, token_digest
from .curves import pruning_curves
from .distributed import is_main, shard_name
from .errors import HeadpruneError
from .ledger import format_info
from .loading import load_model, model_fingerprint, model_tokenizer
from .outputs import Progress, check_writable, ensure_dir, write_text
from .perplexity import Windowing, scored_bytes
from .report import best_method, build_report, summary_table
from .report.tables import bpb_factor
from .schema import DEFAULT_FRACTIONS, DEFAULT_MAX_TOKENS, IMPORTANCE_METHODS, METHODS, RANDOM, parse_methods
from .scoring import score_heads


@dataclass
class RunSettings:
    model: str
    data: str = "default"  # curves are measured here (default: test split)
    score_data: str = "default"  # heads are scored here (default: validation split)
    out: str = "headprune-report"
    device: str = "auto"
    dtype: str = "fp32"
    fold_value_bias: bool = False  # fold value biases into b_O at load (headprune.folding)
    batch_size: int = 8
    seq_len: int | None = None
    stride: int | None = None
    max_tokens: int | None = DEFAULT_MAX_TOKENS
    fractions: tuple[float, ...] = DEFAULT_FRACTIONS
    seeds: int = 3
    seed: int = 0
    ablation_rows: int | None = None  # see score_heads
    methods: tuple[str, ...] = METHODS  # scored; those of them in IMPORTANCE_METHODS also get curves


def run_analysis(s: RunSettings, overwrite: bool = False, quiet: bool = False, log=print) -> dict | None:
    """Run the whole analysis into ``s.out``; return the summary (paths, baseline, best method, table).

    Under torchrun every process shares the work; only rank 0 writes the report (others return None).
    """
    check_writable(s.out)
    methods = parse_methods(list(s.methods))
    ranked = [m for m in methods if m in IMPORTANCE_METHODS]
    if not ranked:
        raise HeadpruneError(f"methods {', '.join(methods)} rank no heads (a description only); add one of "
                             f"{', '.join(IMPORTANCE_METHODS)}", "methods")
    t_start = time.perf_counter()
    model = load_model(s.model, device=s.device, dtype=s.dtype, fold_value_bias=s.fold_value_bias)
    windowing = Windowing.resolve(model.cfg.n_positions, s.seq_len, s.stride, s.batch_size)
    seq_len, stride = windowing.seq_len, windowing.stride
    tokenizer = model_tokenizer(model)
    eval_ids = corpus_ids(s.data, "test", tokenizer, s.max_tokens)
    score_ids = corpus_ids(s.score_data, "validation", tokenizer, s.max_tokens)
    fingerprint = asdict(s) | {"methods": methods, "out": None, "model_fingerprint": model_fingerprint(model), "eval_tokens": token_digest(eval_ids),
                               "score_tokens": token_digest(score_ids), "seq_len": seq_len, "stride": stride,
                               "device_type": model.device.type, "version": __version__}
    out = ensure_dir(s.out)
    log = log if is_main() else (lambda *a: None)
    progress = Progress(out / shard_name(".progress.jsonl"), fingerprint, overwrite=overwrite)

    info = format_info(model, 1, seq_len)
    write_text(out / "ledger.txt", info + "\n")
    log(f"[1/4] ledger -> {out / 'ledger.txt'}")

    log(f"[2/4] scoring {len(model.head_ids)} heads on {s.score_data} (validation split), {len(score_ids):,} tokens")
    t0 = time.perf_counter()
    scored = score_heads(model, score_ids, methods, windowing, s.ablation_rows, progress, show_progress=not quiet)
    scores = scored.table
    t_score = time.perf_counter() - t0

    log(f"[3/4] pruning curves on {s.data} (test split), {len(eval_ids):,} tokens: "
        f"{', '.join(ranked)} + random")
    t0 = time.perf_counter()

    def curves_of(variants: list[tuple[str, str]]) -> pd.DataFrame:
        return pruning_curves(model, eval_ids, scores, variants, list(s.fractions), windowing, s.seeds, scored.means,
                              seed=s.seed, progress=progress, show_progress=not quiet)

    curves = curves_of([(m, "none") for m in ranked] + [(RANDOM, "none")])
    best = best_method(curves)
    compensated = curves_of([(best, "mean")])
    baseline = curves.attrs["baseline"] | {"bytes": scored_bytes(tokenizer, eval_ids, windowing)}
    curves = pd.concat([curves, compensated], ignore_index=True)
    t_curves = time.perf_counter() - t0

    settings = {**asdict(s), "methods": methods, "model_fingerprint": fingerprint["model_fingerprint"], "seq_len": seq_len,
                "stride": stride, "score_data": f"{s.score_data} (validation split), {len(score_ids):,} tokens",
                "eval_data": f"{s.data} (test split), {len(eval_ids):,} tokens", "device": str(model.device),
                "seconds_scoring": round(t_score, 1), "seconds_curves": round(t_curves, 1),
                "seconds_per_method": {k: round(v, 2) for k, v in scored.seconds.items()}}
    if not is_main():
        return None
    log("[4/4] report")
    report = build_report(scores, curves, out, settings, baseline)
    return {"report": report, "out": out, "best": best, "baseline": baseline, "table": summary_table(curves, bpb_factor(baseline)),
            "seconds": time.perf_counter() - t_start}
