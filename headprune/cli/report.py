"""``headprune report``: rebuild the report from saved scores and curves tables."""

from __future__ import annotations

import argparse

from headprune.cli.options import add_out_arg, add_scores_arg

HELP = 'rebuild the report from saved scores and curves tables'


def configure(p: argparse.ArgumentParser) -> None:
    add_scores_arg(p, required=True, help="scores table (.csv/.parquet); settings.json and baseline.json beside "
                        "it are used when present")
    p.add_argument("--curves", required=True, help="curves table (.csv/.parquet)")
    add_out_arg(p, "report directory")
    p.add_argument("--scale", choices=["value", "rank"], default="value",
                   help="heatmaps and scatters: each method's own values and units, or importance ranks on one shared "
                        "scale (1 = highest score)")


def run(args: argparse.Namespace) -> None:
    from headprune.report import rebuild_report

    print(f"report -> {rebuild_report(args.scores, args.curves, args.out, args.scale)}")
