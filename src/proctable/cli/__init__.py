"""The ``proctable`` command line (also ``python -m proctable``).

One module per command (ps, tree, top, exit, watch, run, serve, bench), each with a
``register(subparsers)``; ``_output`` holds what their human output shares,
``_protocol`` the JSON-lines protocol, ``_columns`` the columns of ps and top.
``import proctable`` does not import this package.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, Optional

from .. import __version__
from . import bench, ps, run, serve, top, tree, watch
from . import exit as exit_cmd
from ._output import HelpFormatter

__all__ = ["build_parser", "main"]

# The exit code of a bare `proctable`: the help goes to stdout, and the code says
# "no command given", as any other usage error does (argparse uses 2).
NO_COMMAND = 2

_EPILOG = """\
Run 'proctable COMMAND --help' for a command's options. The JSON-lines
protocol of --json and run --events is described in docs/protocol.md, and the
whole command line in docs/cli.md.
"""


class _Parser(argparse.ArgumentParser):
    """Every parser of the command line wraps its help paragraph by paragraph."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line, every subcommand registered."""
    ap = _Parser(
        prog="proctable",
        description="A fast process table, exits read without reaping, and every process "
        "a command starts tracked and torn down. Start with 'proctable ps' or "
        "'proctable run -- CMD'.",
        epilog=_EPILOG,
    )
    ap.add_argument("--version", action="version", version=f"proctable {__version__}",
                    help="print the version and exit")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", title="commands",
                           parser_class=_Parser)
    for module in (ps, tree, top, exit_cmd, watch, run, serve, bench):
        module.register(sub)
    return ap


# Options whose value procps takes as it comes, a leading '-' included
# (`ps --sort -rss`), by command; argparse would take "-rss" for an option.
_DASH_VALUES = {"ps": ("-s", "--sort"), "top": ("-s", "--sort")}


def dash_values(argv: Sequence[str]) -> list[str]:
    """argv with ``--sort -rss`` (and ``-s -rss``) joined as ``--sort=-rss``, for
    the commands that sort, before a ``--``; everything else as given."""
    out = list(argv)
    at = next((i for i, a in enumerate(out) if not a.startswith("-")), None)
    if at is None or out[at] not in _DASH_VALUES:
        return out
    names = _DASH_VALUES[out[at]]
    i = at + 1
    while i < len(out) - 1 and out[i] != "--":
        value = out[i + 1]
        if out[i] in names and value.startswith("-") and value != "--":
            out[i:i + 2] = [f"--sort={value}"]
        i += 1
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(dash_values(sys.argv[1:] if argv is None else argv))
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stdout)
        return NO_COMMAND
    try:
        rc: int = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # `proctable ps | head`: the reader left; do not print a traceback.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130
    return rc


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
