"""User-facing errors: the CLI prints them as one line on stderr and exits with status 2."""


class HeadpruneError(Exception):
    """A problem with the user's input (model, data, head spec, option) that the user can fix.

    The message must say what is wrong and what to do, on one line.
    """


def warn(message: str) -> None:
    """A one-line warning on stderr (the run goes on)."""
    import sys

    print(f"headprune: warning: {message}", file=sys.stderr)
