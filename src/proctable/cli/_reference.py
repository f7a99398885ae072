"""docs/cli.md, generated from the argparse parser itself.

``python -m proctable.cli._reference > docs/cli.md`` writes it; a test fails when
the page and the parser differ. Built from the parser's actions, not from
``format_help()``, so that the page is the same on every Python version.
"""

from __future__ import annotations

import argparse
import sys

from . import build_parser

__all__ = ["markdown"]

_HEAD = """\
# Command line

<!-- Generated from the argparse parser: python -m proctable.cli._reference > docs/cli.md
     (tests/test_docs.py fails when this page and the parser differ). -->

`proctable` is installed with the package (`python -m proctable` works too).
Every command prints its options with `--help`. A bare `proctable` prints the
help below and exits with code 2 (a command is needed). Commands that take
`--json` (and `run --events`) speak the [JSON-lines protocol](protocol.md).

"""


def _subparsers(ap: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in ap._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _sub_help(ap: argparse.ArgumentParser) -> dict[str, str]:
    for action in ap._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {a.dest: a.help or "" for a in action._choices_actions}
    return {}


def _metavar(a: argparse.Action) -> str:
    if a.nargs == 0:
        return ""
    if a.metavar is not None:
        mv = a.metavar if isinstance(a.metavar, str) else " ".join(a.metavar)
    elif a.choices is not None:
        mv = "{" + ",".join(str(c) for c in a.choices) + "}"
    else:
        mv = a.dest.upper()
    if a.nargs == "+":
        return f"{mv}..." if a.option_strings == [] else f"{mv} [{mv} ...]"
    if a.nargs == "?":
        return f"[{mv}]"
    return mv


def _synopsis(name: str, ap: argparse.ArgumentParser) -> str:
    parts = [f"proctable {name}".rstrip()]
    for a in ap._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if a.option_strings:
            flag = a.option_strings[0]
            mv = _metavar(a)
            parts.append(f"[{flag} {mv}]" if mv else f"[{flag}]")
        else:
            parts.append(_metavar(a) if a.nargs != argparse.REMAINDER else str(a.metavar))
    if _subparsers(ap):
        parts.append("COMMAND ...")
    return " ".join(parts)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _options(ap: argparse.ArgumentParser) -> list[str]:
    rows = []
    for a in ap._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        mv = _metavar(a)
        if a.option_strings:
            name = ", ".join(f"`{o} {mv}`" if mv else f"`{o}`" for o in a.option_strings)
        else:
            name = f"`{mv if a.nargs != argparse.REMAINDER else a.metavar}`"
        help_ = (a.help or "").replace("%%", "%")
        if a.choices is not None and a.option_strings:
            help_ += " (one of: " + ", ".join(f"`{c}`" for c in a.choices) + ")"
        rows.append(f"| {name} | {_cell(help_)} |")
    if not rows:
        return []
    return ["| argument | meaning |", "| --- | --- |", *rows]


def _section(name: str, ap: argparse.ArgumentParser, summary: str) -> list[str]:
    out = [f"## `proctable {name}`" if name else "## `proctable`", ""]
    if summary:
        out += [f"*{summary}*", ""]
    out += ["```", _synopsis(name, ap), "```", ""]
    if ap.description:
        out += [ap.description.replace("%%", "%"), ""]
    out += _options(ap)
    out.append("")
    if ap.epilog:
        out += ["```text", ap.epilog.rstrip(), "```", ""]
    return out


def markdown() -> str:
    """The whole command-line reference page."""
    ap = build_parser()
    lines = [_HEAD.rstrip(), ""]
    lines += _section("", ap, "")
    helps = _sub_help(ap)
    for name, sp in _subparsers(ap).items():
        lines += _section(name, sp, helps.get(name, ""))
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":  # pragma: no cover
    sys.stdout.write(markdown())
