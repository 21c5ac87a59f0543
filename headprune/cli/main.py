"""The ``headprune`` command line: one module per command, each with ``HELP``, ``configure(parser)`` and
``run(args)``. User errors: one line on stderr, exit status 2, no traceback.

Every option is declared once, in an ``add_*`` helper of :mod:`headprune.cli.options`. Library errors name the
Python parameter they are about; :func:`user_message` shows it as the option that the command declared for it
(read from the command's own parser). Commands import torch only when they run (``headprune report`` never does).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType

from headprune.cli.inputs import check_inputs
from headprune.cli.options import DESCRIPTION, EPILOG, HelpFormatter, check_counts
from headprune.cli.workers import launch, resolve_workers
from headprune.errors import HeadpruneError, os_error_line
from headprune.version import __version__

#: command name -> module of headprune.cli, in the order ``headprune --help`` lists them
COMMANDS = {"info": "info", "eval": "eval", "score": "score", "curve": "curve", "learn-gates": "learn_gates",
            "prune": "prune", "finetune": "finetune", "report": "report", "run": "run", "layers": "layers",
            "long": "long", "anatomy": "anatomy",
            "patch": "patch", "verify": "verify", "rank": "rank", "context": "context", "generate": "generate",
            "models": "models"}


def command_module(name: str) -> ModuleType:
    return importlib.import_module(f"headprune.cli.{COMMANDS[name]}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="headprune", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")
    for name in COMMANDS:
        module = command_module(name)
        module.configure(sub.add_parser(name, help=module.HELP, description=module.HELP, formatter_class=HelpFormatter))
    return parser


def option_names(parser: argparse.ArgumentParser, command: str) -> dict[str, str]:
    """``dest -> --option`` of one command, read from its parser: what a library parameter is called there; a
    command module's ``PARAMS`` (library parameter -> dest) names the parameters whose name differs."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    flags = {a.dest: max(a.option_strings, key=len) for a in sub.choices[command]._actions if a.option_strings}
    return flags | {param: flags[dest] for param, dest in getattr(command_module(command), "PARAMS", {}).items()}


def user_message(err: HeadpruneError, flags: dict[str, str]) -> str:
    """The error's text, with the library parameter it starts with shown as the command's option (``flags``)."""
    text = str(err)
    if err.param in flags and text.startswith(err.param):
        text = flags[err.param] + text[len(err.param):]
    return text


def command_list() -> str:
    """What ``headprune`` alone prints: each command on one line with what it does, then where the options are."""
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {command_module(name).HELP}" for name in COMMANDS]
    return "\n".join(["usage: headprune COMMAND [options]", "", "commands:", *lines, "",
                      "Run headprune COMMAND --help for a command's options, headprune --help for examples."])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:  # no command: the commands, one line each
        print(command_list())
        return 0
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if sys.stdout is None:  # started with file descriptor 1 closed: results would vanish without a word
            raise HeadpruneError("standard output is closed; redirect it to a file or /dev/null")
        check_counts(args)
        check_inputs(args, option_names(parser, args.command))  # before any model loads
        if getattr(args, "workers", None) is not None and (n := resolve_workers(args.workers, args.device)) > 1:
            return launch(argv, n)
        if hasattr(args, "device"):
            from headprune.io.work.distributed import init_from_env

            init_from_env(args.device)
        command_module(args.command).run(args)
        if sys.stdout is not None:
            sys.stdout.flush()  # a full or closed stdout fails here, inside the error handling
    except HeadpruneError as err:
        print(f"headprune: error: {user_message(err, option_names(parser, args.command))}", file=sys.stderr)
        return 2
    except OSError as err:  # disk full, name too long, stdout closed or full, ...: what failed, on one line
        if (line := os_error_line(err)) is None:
            raise
        print(f"headprune: error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("headprune: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    finally:
        if "torch.distributed" in sys.modules:  # never import torch just to tidy up
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
