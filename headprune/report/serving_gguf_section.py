"""The report's llama.cpp serving section: the run's prunes as GGUF files run by llama.cpp itself, uniform (the source
architecture) and uneven (``deci``, per-layer head counts), beside the transformers section (torch-free:
:func:`headprune.pruning.serving_gguf.serve_gguf_prunes` measures it). File: serving_llama_cpp.csv, so ``headprune
report`` rebuilds the section; what was timed is in settings.json under ``serving_llama_cpp``.

A rate is called faster or slower than the unpruned file's only where the spreads of their timed repeats separate
(:func:`~.serving_section.rate_verdict`).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from headprune.errors import HeadpruneError
from headprune.io.work.files import read_table, write_table
from headprune.report.render import Block, Findings, Note, Section, Table
from headprune.report.serving_section import rate_words, spread_text

SECTION_TITLE = "Serving the pruned model in llama.cpp"
FILE = "serving_llama_cpp.csv"
_SHOWN = {"fraction": "asked", "shape": "shape", "removed": "removed", "query_heads": "q heads", "arch": "GGUF arch",
          "padded_heads": "padded", "file_bytes": "file MiB", "kv_bytes_per_token": "KV B/token",
          "ppl": "ppl (llama.cpp)", "headprune_ppl": "ppl (headprune)", "prefill_tokens_per_s": "prefill tok/s",
          "decode_tokens_per_s": "decode tok/s"}
_RATES = {"prefill_tokens_per_s": "prefill", "decode_tokens_per_s": "decode"}


def write_gguf_serving_file(out: Path, table: pd.DataFrame) -> None:
    write_table(table, out / FILE)


def read_gguf_serving_file(folder: Path) -> pd.DataFrame | None:
    """The llama.cpp serving table of a saved report folder, or None when it has none."""
    if not (folder / FILE).is_file():
        return None
    try:
        table = read_table(folder / FILE)
        missing = [c for c in (*_SHOWN, *(f"{r}_{e}" for r in _RATES for e in ("min", "max")))
                   if c not in table.columns]
    except (OSError, ValueError) as err:
        raise HeadpruneError(f"cannot read {folder / FILE} ({type(err).__name__}); fix or remove it") from None
    if missing or not (table["shape"] == "unpruned").any():
        lacks = ", ".join(missing) or "an unpruned row"
        raise HeadpruneError(f"{folder / FILE} is not a llama.cpp serving table (lacks {lacks}); fix or remove it")
    return table


def _rate_words(row: pd.Series, base: pd.Series, rate: str) -> str:
    return f"{_RATES[rate]} {rate_words(row, base, rate)}"


def gguf_serving_findings(table: pd.DataFrame, ranking: str) -> list[str]:
    """The unpruned file's rates; per pruned row its shape, size, cache, perplexity and rates against the unpruned
    file; per asked fraction with both shapes, their perplexities side by side."""
    base = table[table["shape"] == "unpruned"].iloc[0]
    spread = lambda col, fmt: f"{base[col + '_min']:{fmt}}–{base[col + '_max']:{fmt}}"
    kind = str(base["gguf_type"])
    sentences = [(f"Unpruned, the {kind} GGUF file ({base['file_bytes'] / 2**20:,.1f} MiB, {base['arch']}) runs "
                 f"{base['prefill_tokens_per_s']:,.0f} prefill tokens/s ({spread('prefill_tokens_per_s', ',.0f')} "
                 f"over the repeats) and decodes {base['decode_tokens_per_s']:,.1f} tokens/s "
                 f"({spread('decode_tokens_per_s', ',.1f')}) in llama.cpp; perplexity {base['ppl']:.2f} "
                 f"(headprune's float32 model: {base['headprune_ppl']:.2f} on the same tokens).")]
    for _, row in table[table["shape"] != "unpruned"].iterrows():
        padded = int(row["padded_heads"])
        how = (f"uniformly ({int(row['query_heads'])} query heads left, {row['arch']})" if row["shape"] == "uniform"
               else f"unevenly by {ranking} ({row['arch']}" + (f", {padded} zero-weight query heads completing KV "
                                                               "groups)" if padded else ")"))
        sentences.append(
            f"Removing {int(row['removed'])} heads {how} at {row['fraction']:.0%} asked: perplexity "
            f"{row['ppl']:.2f} in llama.cpp ({row['headprune_ppl']:.2f} in headprune); the file is "
            f"{row['file_bytes'] / base['file_bytes']:.0%} of the unpruned one, the KV cache "
            f"{row['kv_bytes_per_token'] / base['kv_bytes_per_token']:.0%} of its bytes per token; "
            f"{_rate_words(row, base, 'prefill_tokens_per_s')}; {_rate_words(row, base, 'decode_tokens_per_s')}.")
    for fraction, group in table[table["shape"] != "unpruned"].groupby("fraction", sort=True):
        if {"uniform", "uneven"} <= set(group["shape"]):
            even, uneven = group[group["shape"] == "uniform"].iloc[0], group[group["shape"] == "uneven"].iloc[0]
            lower = "uneven" if uneven["ppl"] < even["ppl"] else "uniform"
            sentences.append(
                f"Uneven against uniform at {fraction:.0%} asked: the uneven prune ({int(uneven['removed'])} heads) "
                f"has perplexity "
                f"{uneven['ppl']:.2f} in llama.cpp and the uniform one ({int(even['removed'])} heads) "
                f"{even['ppl']:.2f}: the {lower} prune is lower.")
    return sentences


def gguf_serving_parts(table: pd.DataFrame, settings: dict) -> Section:
    info = settings.get("serving_llama_cpp", {})
    work = info.get("workload", {})
    ranking = info.get("ranking", "the best ranking")
    shown = table[list(_SHOWN)].copy()
    shown["file_bytes"] = [f"{v / 2**20:,.1f}" for v in table["file_bytes"]]
    for rate in _RATES:
        shown[rate] = spread_text(table, rate)
    blocks: list[Block] = [Findings(gguf_serving_findings(table, ranking)), Table(shown.rename(columns=_SHOWN))]
    refused = info.get("refused") or []
    blocks.append(Note(
        f"Each asked fraction: the uniform prune by {info.get('uniform_method', ranking)} nearest it (the same "
        "query and KV heads in every layer: the source architecture at smaller counts), and the uneven prune by "
        f"{ranking} (its own heads: llama.cpp's `deci` graph with per-layer head counts), each written by "
        f"`prune --format gguf` at the default type ({table['gguf_type'].iloc[0]}) and run by llama.cpp "
        "(llama-cpp-python) on every core. Perplexity: llama.cpp's on the run's test windows, the tokens "
        "headprune scores. Prefill: "
        f"{work.get('prompt', '?')} random tokens, decode: {work.get('steps', '?')} single-token steps after them, "
        f"the median of {work.get('repeats', '?')} timed repeats after a warm-up (in brackets the slowest and the "
        "fastest repeat); KV B/token: llama.cpp's default f16 cache. Wall-clock on the machine of the run."
        + ("" if not refused else " Not exported: " + "; ".join(refused) + ".")))
    return Section(SECTION_TITLE, blocks)
