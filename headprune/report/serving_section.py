"""The report's serving section (families with a compact hf export: not GPT-2 or GPT-NeoX): the run's best ranking
pruned uniformly, exported with ``--format hf`` and served by stock transformers, next to the pruned model's
perplexity (torch-free: :func:`headprune.pruning.serving.serving_table` measures it). File: serving.csv, so
``headprune report`` rebuilds the section; what was timed is in settings.json under ``serving``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from headprune.errors import HeadpruneError
from headprune.io.files import read_table, write_table
from headprune.report.render import Block, Findings, Note, Section, Table

SECTION_TITLE = "Serving the pruned model in stock transformers"
FILE = "serving.csv"
_SHOWN = {"fraction": "asked", "removed": "removed", "query_heads": "q heads", "kv_heads": "KV heads",
          "layout": "hf layout", "ppl": "ppl", "prefill_tokens_per_s": "prefill tok/s",
          "decode_b1_tokens_per_s": "decode b1 tok/s", "decode_b32_tokens_per_s": "decode b32 tok/s",
          "kv_bytes_per_token": "KV B/token", "max_abs_logit_diff": "max |Δlogit|"}


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


def serving_findings(table: pd.DataFrame, method: str) -> list[str]:
    """One sentence per pruned row: its shape, perplexity and throughput against the unpruned export."""
    base = table[table["removed"] == 0].iloc[0]
    ratio = lambda row, col: row[col] / base[col]
    sentences = [(f"Unpruned, stock transformers runs {base['prefill_tokens_per_s']:,.0f} prefill tokens/s and "
                  f"decodes {base['decode_b1_tokens_per_s']:,.1f} tokens/s at batch 1, "
                  f"{base['decode_b32_tokens_per_s']:,.1f} at batch 32 (perplexity {base['ppl']:.2f}).")]
    seen: set[int] = set()
    for _, row in table[table["removed"] > 0].iterrows():
        if int(row["removed"]) in seen:  # the same prune was nearest two asked fractions
            continue
        seen.add(int(row["removed"]))
        shape = (f"{int(row['query_heads'])} query / {int(row['kv_heads'])} KV heads per layer, compact"
                 if row["layout"] == "compact" else "the original shapes with the removed heads zeroed")
        sentences.append(
            f"Removing {int(row['removed'])} heads by {method} ({shape}): perplexity {row['ppl']:.2f}; prefill "
            f"×{ratio(row, 'prefill_tokens_per_s'):.2f}, decode ×{ratio(row, 'decode_b1_tokens_per_s'):.2f} at "
            f"batch 1 and ×{ratio(row, 'decode_b32_tokens_per_s'):.2f} at batch 32; the KV cache holds "
            f"{ratio(row, 'kv_bytes_per_token'):.0%} of the unpruned bytes per token.")
    return sentences


def serving_parts(table: pd.DataFrame, settings: dict) -> Section:
    info = settings.get("serving", {})
    work = info.get("workload", {})
    method = info.get("method", "the best ranking")
    shown = table[list(_SHOWN)].rename(columns=_SHOWN)
    blocks: list[Block] = [Findings(serving_findings(table, method)), Table(shown)]
    blocks.append(Note(
        f"Each row: the uniform prune by {method} nearest the asked fraction (the same query and KV heads in "
        "every layer, so transformers can hold it at smaller shapes where its config accepts the count), written "
        "by `prune --format hf` and loaded by `AutoModelForCausalLM.from_pretrained`. Prefill: "
        f"{work.get('batch', '?')} × {work.get('seq_len', '?')} tokens filling the KV cache; decode: the median "
        f"of {work.get('steps', '?')} cached steps after a {work.get('prompt', '?')}-token prompt. Wall-clock on "
        "the machine of the run: compare the rows, not other machines. max |Δlogit|: transformers' logits "
        "against headprune's pruned model."))
    return Section(SECTION_TITLE, blocks)
