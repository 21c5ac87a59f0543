"""``headprune anatomy``: what each head does: roles, composition, logit attribution."""

from __future__ import annotations

import argparse

from headprune.cli.common import data_from_args, load_from_args, windowing_from_args
from headprune.cli.options import add_anatomy_args, add_data_args, add_model_args, add_out_arg
from headprune.errors import HeadpruneError

HELP = 'what each head does: roles, composition, logit attribution'


def configure(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_data_args(p, "validation")
    add_anatomy_args(p)
    add_out_arg(p, "output directory (heads.csv, composition.csv, ...)")


def run(args: argparse.Namespace) -> None:
    from headprune.anatomy.write import AnatomyInputs, run_anatomy
    from headprune.io.work.files import check_writable

    check_writable(args.out)
    model = load_from_args(args)
    w = windowing_from_args(args, model)
    ids = data_from_args(args, model)
    if 2 * args.probe_length + (w.bos is not None) > model.cfg.n_positions:
        after_bos = " after the BOS token" if w.bos is not None else ""
        raise HeadpruneError(f"--probe-length {args.probe_length} is too long: twice it must fit n_positions "
                             f"{model.cfg.n_positions}{after_bos}")
    inputs = AnatomyInputs(probe_length=args.probe_length, probe_count=args.probe_count, seed=args.seed,
                           rows=args.rows)
    out, anatomy = run_anatomy(model, ids, w, inputs=inputs, out=args.out,
                               settings={"model": args.model, "data": args.data, "split": args.split})
    top = anatomy.heads.sort_values("induction", ascending=False).head(5)
    print(top[["head_id", "previous_token", "duplicate_token", "induction", "dla", "copying"]].to_string(
        index=False, float_format=lambda x: f"{x:.3f}"))
    print(f"{len(anatomy.heads)} heads, {len(anatomy.composition):,} composition pairs -> {out}")
