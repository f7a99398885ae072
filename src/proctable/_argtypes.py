"""argparse value types shared by the command line's subcommands."""

from __future__ import annotations

import argparse

from ._lowlevel import PID_MAX

__all__ = ["count_arg", "pid_arg", "positive_count_arg", "seconds_arg", "ticks_arg"]


def pid_arg(text: str) -> int:
    """A pid: a decimal int from 1 to the largest pid_t."""
    try:
        pid = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a pid: {text!r}") from None
    if pid <= 0 or pid > PID_MAX:
        raise argparse.ArgumentTypeError(f"not a pid: {text} (a positive int is needed)")
    return pid


def seconds_arg(text: str) -> float:
    """Seconds: a finite number >= 0 (nan and inf are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0.0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"seconds must be >= 0 and finite, not {text}")
    return value


def count_arg(text: str) -> int:
    """A count: a decimal int >= 0."""
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"not a count: {text} (0 or more)")
    return value


def positive_count_arg(text: str) -> int:
    """A count of at least one: a decimal int >= 1 (where 0 would measure nothing)."""
    value = count_arg(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a count of at least 1: {text}")
    return value


def ticks_arg(text: str) -> int:
    """A start time: clock ticks since boot, a decimal int >= 0."""
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a start time in clock ticks: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"a start time is 0 or more clock ticks, not {text}")
    return value
