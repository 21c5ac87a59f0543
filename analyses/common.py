"""Shared set-up of the analysis scripts: model, scoring (validation) and evaluation (test) tokens, output folder."""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure

from headprune.data.tokens import corpus_ids
from headprune.io.read.loading import load_model
from headprune.io.read.tokenizer import model_tokenizer
from headprune.io.work.files import ensure_dir, write_bytes, write_json, write_table, write_text
from headprune.perplexity import Windowing
from headprune.schema import DEFAULT_MAX_TOKENS, DEFAULT_MODEL

REPORTS = Path(__file__).resolve().parent.parent / "reports"


def setup(name: str, doc: str, add_arguments: Callable[[argparse.ArgumentParser], None] | None = None):
    """Parse the common options (and the script's own, ``add_arguments``); return (args, model, score_ids,
    eval_ids, out_dir)."""
    ap = argparse.ArgumentParser(description=doc)
    if add_arguments is not None:
        add_arguments(ap)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--data", default="default", help="corpus (validation split to score, test split to evaluate)")
    ap.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                    help="tokens per split (default: headprune run's, so every report shares one baseline)")
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--out", default=str(REPORTS / name))
    args = ap.parse_args()
    model = load_model(args.model)
    tok = model_tokenizer(model)
    args.windowing = Windowing.for_model(model, args.seq_len)
    args.seq_len = args.windowing.seq_len
    score_ids = corpus_ids(args.data, "validation", tok, args.max_tokens)
    eval_ids = corpus_ids(args.data, "test", tok, args.max_tokens)
    return args, model, score_ids, eval_ids, ensure_dir(args.out)


def save(out: Path, name: str, fig: Figure | None = None, table=None, text: str | None = None,
         meta: dict | None = None):
    """Write a figure (PNG), a table (csv), a markdown note or a JSON record into ``out``, atomically."""
    if fig is not None:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
        write_bytes(out / f"{name}.png", buf.getvalue())
    if table is not None:
        write_table(table, out / f"{name}.csv")
    if text is not None:
        write_text(out / f"{name}.md", text)
    if meta is not None:
        write_json(out / f"{name}.json", json.loads(json.dumps(meta, default=str)))
