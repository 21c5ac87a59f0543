"""User-facing errors: the CLI prints them as one line on stderr and exits with status 2."""


class HeadpruneError(Exception):
    """A problem with the user's input (model, data, head spec, option) that the user can fix.

    The message must say what is wrong and what to do, on one line. ``param``: the Python parameter the
    message starts with (e.g. ``seq_len``); the CLI shows it as its option (``--seq-len``).
    """

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def warn(message: str) -> None:
    """A one-line warning on stderr (the run goes on)."""
    import sys

    print(f"headprune: warning: {message}", file=sys.stderr)
