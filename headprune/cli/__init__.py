"""The ``headprune`` command line: one module per command, options declared once in :mod:`.options`."""

from headprune.cli.main import main

__all__ = ["main"]
