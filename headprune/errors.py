"""User-facing errors: the CLI prints them as one line on stderr and exits with status 2."""

import errno
import os
import sys

#: Failures of the machine around a run that the user fixes (space, names, permissions, a closed stdout).
USER_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.ENAMETOOLONG, errno.EROFS, errno.EPIPE, errno.EACCES, errno.EFBIG,
               errno.EIO, errno.EBADF}


class HeadpruneError(Exception):
    """A problem with the user's input (model, data, head spec, option) that the user can fix.

    The message must say what is wrong and what to do, on one line. ``param``: the Python parameter the
    message starts with (e.g. ``seq_len``); the CLI shows it as its option (``--seq-len``).
    """

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def config_error(where: str, model_type: str, err: Exception) -> HeadpruneError:
    """The error for a config that cannot build a model: a missing field is named as such."""
    if isinstance(err, KeyError):
        return HeadpruneError(f"{where} has no {err.args[0]!r} field, which a {model_type} config needs; the "
                              "checkpoint is incomplete")
    return HeadpruneError(f"{where} is not a usable {model_type} config ({err})")


def os_error_line(err: OSError) -> str | None:
    """The one line for an OSError the user can fix (else None: a bug, shown with its traceback). stdout is pointed
    at /dev/null first, so the interpreter's last flush of a broken stdout adds no second error."""
    if err.errno not in USER_ERRNOS:
        return None
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, AttributeError, ValueError):
        pass
    where = f": {err.filename}" if err.filename else ""
    return f"{err.strerror or err}{where}; free space, shorten the name, or check permissions and the output"


def warn(message: str) -> None:
    """A one-line warning on stderr (the run goes on)."""
    print(f"headprune: warning: {message}", file=sys.stderr)
