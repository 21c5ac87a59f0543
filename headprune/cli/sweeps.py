"""What the ``score`` and ``curve`` commands share: the output table, its progress file, the settings that
must match to resume, and the finish (write the table, then drop the progress)."""

from __future__ import annotations

from pathlib import Path

from headprune.data.tokens import token_digest
from headprune.io.read.fingerprint import model_fingerprint
from headprune.io.work.distributed import is_main, progress_files
from headprune.io.work.files import check_table_suffix, check_writable, write_table
from headprune.io.work.progress import Progress


def table_output(args):
    """``--out`` of a sweep: a .csv/.parquet path that can be written (checked before any work)."""
    out = Path(args.out)
    check_table_suffix(out)
    check_writable(out, file=True)
    return out


def sweep_progress(args, out, settings: dict):
    """The sweep's progress file beside ``out`` (one per process under torchrun; those of a run with another
    number of processes are resumed from)."""
    mine, others = progress_files(out.with_name(out.name + ".progress.jsonl"))
    return Progress(mine, settings, overwrite=args.overwrite, others=others)


def finish_sweep(progress, table, out) -> bool:
    """Rank 0 writes ``table`` to ``out`` atomically, then the progress file goes (only once the result is safe).
    True where this process wrote."""
    if is_main():
        write_table(table, out)
    progress.remove()
    return is_main()


def sweep_settings(args, model, ids, windowing, command: str, **extra) -> dict:
    """What makes a sweep's results what they are: resuming requires all of it to be equal."""
    return {"command": command, "model": model_fingerprint(model), "dtype": str(model.dtype),
            "device": model.device.type, "data": args.data, "split": args.split, "tokens": token_digest(ids),
            **windowing.settings(),
            "ablation_rows": getattr(args, "ablation_rows", None), "fold_value_bias": args.fold_value_bias, **extra}


def finish_ranking(progress, result, out, as_json: bool) -> bool:
    """:func:`finish_sweep` of a ranking's table, then its summary written beside it as .json (and printed with
    ``out`` where ``as_json``). True where this process should print the ranking's sentences."""
    import json

    from headprune.io.work.files import write_json

    if not finish_sweep(progress, result.table, out):
        return False
    summary = result.summary()
    write_json(out.with_suffix(".json"), summary)
    if as_json:
        print(json.dumps(summary | {"out": str(out)}))
    return not as_json
