"""The report's serving section (families with a compact hf export: not GPT-2 or GPT-NeoX): the run's best ranking
pruned uniformly, exported with ``--format hf`` and served by stock transformers, next to the pruned model's
perplexity (torch-free: :func:`headprune.pruning.serving.serving_table` measures it). File: serving.csv, so
``headprune report`` rebuilds the section; what was timed is in settings.json under ``serving``. Each rate is shown
as its median and, in brackets, the spread of its timed repeats (the slowest–the fastest: ``RATE_min``–``RATE_max``;
a table written before the spread was kept shows the median alone).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from headprune.errors import HeadpruneError
from headprune.io.work.files import read_table, write_table
from headprune.report.numbers import column_decimals, fixed
from headprune.report.render import Block, Findings, Note, Section, Table

SECTION_TITLE = "Serving the pruned model in stock transformers"
FILE = "serving.csv"
_SHOWN = {"fraction": "asked", "removed": "removed", "query_heads": "q heads", "kv_heads": "KV heads",
          "layout": "hf layout", "ppl": "ppl", "prefill_tokens_per_s": "prefill tok/s",
          "decode_b1_tokens_per_s": "decode b1 tok/s", "decode_b32_tokens_per_s": "decode b32 tok/s",
          "kv_bytes_per_token": "KV B/token", "max_abs_logit_diff": "max |Δlogit|"}
_RATES = ("prefill_tokens_per_s", "decode_b1_tokens_per_s", "decode_b32_tokens_per_s")


def spread_text(table: pd.DataFrame, rate: str) -> list[str]:
    """Each row's ``rate`` as "median (slowest–fastest)", one precision for the column; the median alone where the
    table has no spread columns."""
    d = column_decimals(table[rate].to_numpy(float))
    if f"{rate}_min" not in table.columns or f"{rate}_max" not in table.columns:
        return [fixed(float(v), d) for v in table[rate]]
    return [f"{fixed(float(m), d)} ({fixed(float(lo), d)}–{fixed(float(hi), d)})"
            for m, lo, hi in zip(table[rate], table[f"{rate}_min"], table[f"{rate}_max"], strict=True)]


def write_serving_file(out: Path, table: pd.DataFrame) -> None:
    write_table(table, out / FILE)


def read_serving_file(folder: Path) -> pd.DataFrame | None:
    """The serving table of a saved report folder, or None when it has none."""
    if not (folder / FILE).is_file():
        return None
    try:
        table = read_table(folder / FILE)
        missing = [c for c in _SHOWN if c not in table.columns]
    except (OSError, ValueError) as err:
        raise HeadpruneError(f"cannot read {folder / FILE} ({type(err).__name__}); fix or remove it") from None
    if missing or not (table["removed"] == 0).any():
        raise HeadpruneError(f"{folder / FILE} is not a serving table (needs {', '.join(_SHOWN)} and an unpruned "
                             "row); fix or remove it")
    return table


def rate_verdict(row: pd.Series, base: pd.Series, rate: str) -> str:
    """"faster" where ``row``'s slowest repeat beats ``base``'s fastest, "slower" where its fastest is below
    ``base``'s slowest, else "within the spread" (no difference the repeats can tell)."""
    if row[f"{rate}_min"] > base[f"{rate}_max"]:
        return "faster"
    if row[f"{rate}_max"] < base[f"{rate}_min"]:
        return "slower"
    return "within the spread"


def rate_words(row: pd.Series, base: pd.Series, rate: str) -> str:
    """"×r (verdict)": ``row``'s median ``rate`` over ``base``'s, and :func:`rate_verdict` (the ratio alone for a
    table written before the spread was kept)."""
    ratio = f"×{row[rate] / base[rate]:.2f}"
    if f"{rate}_min" not in base.index or f"{rate}_max" not in base.index:
        return ratio
    verdict = rate_verdict(row, base, rate)
    if verdict == "within the spread":
        return f"{ratio} (within the spread of the repeats: no measured difference)"
    return f"{ratio} ({verdict}: the repeats' spreads separate)"


def serving_findings(table: pd.DataFrame, method: str) -> list[str]:
    """One sentence per pruned row: its shape, perplexity and throughput against the unpruned export."""
    base = table[table["removed"] == 0].iloc[0]
    ratio = lambda row, col: row[col] / base[col]
    spread = lambda col, fmt: (f" ({base[col + '_min']:{fmt}}–{base[col + '_max']:{fmt}} over the repeats)"
                               if col + "_min" in base.index and col + "_max" in base.index else "")
    sentences = [(f"Unpruned, stock transformers runs {base['prefill_tokens_per_s']:,.0f} prefill tokens/s"
                  f"{spread('prefill_tokens_per_s', ',.0f')} and decodes {base['decode_b1_tokens_per_s']:,.1f} "
                  f"tokens/s at batch 1{spread('decode_b1_tokens_per_s', ',.1f')}, "
                  f"{base['decode_b32_tokens_per_s']:,.1f} at batch 32{spread('decode_b32_tokens_per_s', ',.1f')} "
                  f"(perplexity {base['ppl']:.2f}).")]
    seen: set[int] = set()
    for _, row in table[table["removed"] > 0].iterrows():
        if int(row["removed"]) in seen:  # the same prune was nearest two asked fractions
            continue
        seen.add(int(row["removed"]))
        shape = (f"{int(row['query_heads'])} query / {int(row['kv_heads'])} KV heads per layer, compact"
                 if row["layout"] == "compact" else "the original shapes with the removed heads zeroed")
        sentences.append(
            f"Removing {int(row['removed'])} heads by {method} ({shape}): perplexity {row['ppl']:.2f}; prefill "
            f"{rate_words(row, base, 'prefill_tokens_per_s')}, decode at batch 1 "
            f"{rate_words(row, base, 'decode_b1_tokens_per_s')}, at batch 32 "
            f"{rate_words(row, base, 'decode_b32_tokens_per_s')}; the KV cache holds "
            f"{ratio(row, 'kv_bytes_per_token'):.0%} of the unpruned bytes per token.")
    return sentences


def serving_parts(table: pd.DataFrame, settings: dict) -> Section:
    info = settings.get("serving", {})
    work = info.get("workload", {})
    method = info.get("method", "the best ranking")
    shown = table[list(_SHOWN)].copy()
    for rate in _RATES:
        shown[rate] = spread_text(table, rate)
    shown = shown.rename(columns=_SHOWN)
    blocks: list[Block] = [Findings(serving_findings(table, method)), Table(shown)]
    blocks.append(Note(
        f"Each row: the uniform prune by {method} nearest the asked fraction (the same query and KV heads in "
        "every layer, so transformers can hold it at smaller shapes where its config accepts the count), written "
        "by `prune --format hf` and loaded by `AutoModelForCausalLM.from_pretrained`. Prefill: "
        f"{work.get('batch', '?')} × {work.get('seq_len', '?')} tokens filling the KV cache, the median of "
        f"{work.get('prefills', '?')} timed repeats after a warm-up; decode: the median of {work.get('steps', '?')} "
        f"cached steps after a {work.get('prompt', '?')}-token prompt. In brackets: the rate of the slowest and of "
        "the fastest repeat. Wall-clock on "
        "the machine of the run: compare the rows, not other machines. max |Δlogit|: transformers' logits "
        "against headprune's pruned model."))
    return Section(SECTION_TITLE, blocks)
