"""``proctable bench``: the measurements of ``proctable.bench``, as a person reads them."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import textwrap
import time
from typing import Any, Optional, TextIO

from .._argtypes import count_arg, positive_count_arg
from ._output import terminal_width

__all__ = ["register", "render"]

_INSTALL = "psutil: pip install 'proctable[bench]'"


def _fmt_time(seconds: float) -> str:
    if math.isnan(seconds):
        return "-"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def _fmt_faster(x: Optional[float]) -> str:
    return "" if x is None else f"{x:.1f}x faster"


def _fmt_floor(x: Optional[float]) -> str:
    return "" if x is None else f"{x:.2f}x"


def _render_extras(data: dict[str, Any], out: TextIO) -> None:
    ex = data.get("exit_watcher")
    if ex is not None:
        lat, idle = ex["latency"], ex["idle"]
        wake = "" if idle["wakeups"] is None else f", {idle['wakeups']} wake-ups"
        out.write(
            "exit watcher\n"
            f"  lost exit -> resolved future        median {lat['median_ms']:.2f} ms, "
            f"max {lat['max_ms']:.2f} ms over {lat['n']} exits (a 1 s poller: up to 1000 ms)\n"
            f"  {idle['processes']:,} watched, none exiting       "
            f"{idle['cpu_percent_of_core']:.3f}% of a core over {idle['seconds']:.1f} s{wake}\n"
        )
    lin = data.get("lineage")
    if lin is not None:
        smp, td = lin["sampler"], lin["teardown"]
        out.write(
            f"lineage ({lin['host_processes']:,} processes on the host)\n"
            f"  sampler, {smp['members']} members, {smp['interval'] * 1e3:.0f} ms, "
            f"{smp['mode']:9} {smp['cpu_percent_of_core']:.2f}% of a core\n"
        )
        scan = lin.get("sampler_scan")
        if scan is not None:
            out.write(f"  sampler, same lineage, scan mode      "
                      f"{scan['cpu_percent_of_core']:.2f}% of a core\n")
        out.write(
            f"  teardown of {td['members']} members ({td['mode']})      "
            f"{td['teardown_seconds'] * 1e3:.1f} ms, "
            f"{td['beyond_own_exit_seconds'] * 1e3:.1f} ms beyond their own exit\n"
        )


def render(data: dict[str, Any], out: TextIO, psutil_asked: bool = True,
           width: Optional[int] = None) -> None:
    """The human table of ``proctable.bench.results()``.

    Without psutil the comparison columns say how to get them; notes wrap to width.
    """
    have_psutil = data["psutil"] is not None
    if have_psutil:
        about = f"psutil {data['psutil']}"
    elif psutil_asked:
        about = "psutil not installed (pip install 'proctable[bench]' for the comparison)"
    else:
        about = "psutil left out (--no-psutil)"
    out.write(
        f"proctable bench: {data['procs']:,} processes ({data['sleepers']:,} sleepers "
        f"started), {data['rounds']} rounds interleaved, {data['cpus']} CPUs, "
        f"{about}; medians\n"
    )
    if have_psutil:
        versus = f"{'vs psutil warm':>15} {'vs psutil cold':>15}"
    else:
        versus = f"{(_INSTALL if psutil_asked else 'vs psutil: left out'):>31}"
    namew = max([36] + [len(r["name"]) for s in data["sections"] for r in s["rows"]])
    out.write(f"{'':{namew + 2}} {'median':>10} {'us/proc':>8} {versus} {'vs floor':>9}\n")
    wrap = max(40, (width or 100) - 4)
    for s in data["sections"]:
        out.write(f"{s['title']}\n")
        if s["note"]:
            for line in textwrap.wrap(s["note"], wrap):
                out.write(f"    {line}\n")
        for r in s["rows"]:
            per = "" if r["us_per_proc"] is None else f"{r['us_per_proc']:.2f}"
            if have_psutil:
                cmp = (f"{_fmt_faster(r['vs_psutil_warm']):>15} "
                       f"{_fmt_faster(r['vs_psutil_cold']):>15}")
            else:
                cmp = " " * 31
            out.write(
                f"  {r['name']:{namew}} {_fmt_time(r['median_s']):>10} {per:>8} {cmp} "
                f"{_fmt_floor(r['vs_floor']):>9}".rstrip() + "\n"
            )
    rd = data.get("reader") or {}
    if rd.get("name") == "bpf":
        out.write("reader: bpf (a BPF task iterator: snapshot() and Scanner use it)\n")
    elif rd:
        out.write(f"reader: proc (not BPF: {rd.get('why_not')})\n")
    _render_extras(data, out)


class Progress:
    """What the bench is doing, on stderr.

    On a terminal: one line that overwrites itself. Elsewhere (a log, a CI job, a
    test): the first line of each phase and, when the phase ends, its last line
    with the time it took, so that a log never looks stuck half-way through.
    The phase is the first word of each text.
    """

    def __init__(self, stream: TextIO, enabled: bool = True) -> None:
        self.stream = stream
        self.enabled = enabled
        try:
            self.tty = stream.isatty()
        except (AttributeError, ValueError):
            self.tty = False
        self._phase = ""
        self._last = ""
        self._printed = ""
        self._since = time.monotonic()

    def _line(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()
        self._printed = text

    def _end_phase(self) -> None:
        if self._last and self._last != self._printed:
            took = time.monotonic() - self._since
            self._line(f"{self._last} ({took:.1f} s)")

    def __call__(self, text: str) -> None:
        if not self.enabled:
            return
        phase = text.split(maxsplit=1)[0] if text else ""
        if self.tty:
            self.stream.write("\r\033[K" + text)
            self.stream.flush()
        elif phase != self._phase:
            self._end_phase()
            self._since = time.monotonic()
            self._line(text)
        self._phase = phase
        self._last = text

    def done(self) -> None:
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r\033[K")
            self.stream.flush()
        else:
            self._end_phase()


def _cmd_bench(args: argparse.Namespace) -> int:
    from ..bench import run  # noqa: PLC0415 - the measurements load only for this command

    args.spawn = args.spawn or args.all
    args.output = args.output or args.all
    args.latency = args.latency or args.all
    args.wire = args.wire or args.all

    progress = Progress(sys.stderr, enabled=not args.quiet)
    try:
        data = run(args.procs, args.rounds, progress, use_psutil=not args.no_psutil,
                   watcher=args.watcher or args.all, lineage=args.lineage or args.all,
                   compat_api=args.compat or args.all)
    finally:
        progress.done()
    if args.spawn:
        from ..bench.spawn import render as render_spawn  # noqa: PLC0415
        from ..bench.spawn import spawn_bench  # noqa: PLC0415

        progress("lineage per command: spawn, wait, teardown (~20 s)")
        data["spawn"] = spawn_bench(max(5, args.rounds))
        progress.done()
    if args.output:
        from ..bench.output import output_bench  # noqa: PLC0415

        progress("owned output: one key's throughput, 50 chatty keys (~25 s)")
        data["output"] = output_bench()
        progress.done()
    if args.latency:
        from ..bench.latency import latency_bench  # noqa: PLC0415

        progress("start -> created / exited, beside Node's and Python's spawn (~15 s)")
        data["latency"] = latency_bench(max(50, args.rounds))
        progress.done()
    if args.wire:
        from ..bench.wire import wire_bench  # noqa: PLC0415

        progress("the wire: 200 MiB and 100 MiB through one key to the Node client beside "
                 "Node's own child_process, 50 keys of numbered lines (~35 s)")
        try:
            data["wire"] = wire_bench()
        except (RuntimeError, subprocess.TimeoutExpired) as exc:  # a stall, a lost sidecar
            data["wire"] = {"failed": str(exc)}
        progress.done()
    if args.json:
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        render(data, sys.stdout, psutil_asked=not args.no_psutil,
               width=terminal_width(sys.stdout))
        if "spawn" in data:
            sys.stdout.write("\n" + render_spawn(data["spawn"]) + "\n")
        if "output" in data:
            from ..bench.output import render as render_output  # noqa: PLC0415

            sys.stdout.write("\n" + render_output(data["output"]) + "\n")
        if "latency" in data:
            from ..bench.latency import render as render_latency  # noqa: PLC0415

            sys.stdout.write("\n" + render_latency(data["latency"]) + "\n")
        if "wire" in data:
            from ..bench.wire import render as render_wire  # noqa: PLC0415

            sys.stdout.write("\n" + render_wire(data["wire"]) + "\n")
    return 1 if "failed" in data.get("wire", {}) else 0


def register(subparsers: Any) -> None:
    """Add the `bench` subcommand to the proctable command line."""
    p = subparsers.add_parser(
        "bench",
        help="time proctable beside psutil and the C floor",
        description="Start N sleeping processes, then time proctable's table reads, "
        "psutil's and the C floor interleaved (A B A B ...), and print medians, "
        "us per process and ratios. psutil comes with the 'bench' extra "
        "(pip install 'proctable[bench]'). Every process it starts is stopped, also on "
        "Ctrl-C. docs/benchmarks.md describes the method.",
    )
    p.add_argument("--procs", type=count_arg, default=1000, metavar="N",
                   help="sleeping processes to start (default 1000; 0: the live table only)")
    p.add_argument("--rounds", type=positive_count_arg, default=15, metavar="R",
                   help="timed rounds, at least 1 (default 15)")
    p.add_argument("--json", action="store_true",
                   help="the results as one JSON document (not JSON lines)")
    p.add_argument("--no-psutil", action="store_true", help="leave psutil out")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument("--watcher", action="store_true",
                   help="also time the exit watcher: lost-exit latency and idle cost (~6 s)")
    p.add_argument("--lineage", action="store_true",
                   help="also time lineage sampling and teardown (~15 s)")
    p.add_argument("--spawn", action="store_true",
                   help="also time what a lineage costs per command beside a Popen (~20 s)")
    p.add_argument("--output", action="store_true",
                   help="also time owned output: one key's throughput through events beside "
                   "a Popen, and 50 keys writing 1,000 lines/s each (~25 s)")
    p.add_argument("--compat", action="store_true",
                   help="also time proctable.compat's process API beside psutil's: "
                   "Process(pid).as_dict() of one and of every process, children(recursive=True) "
                   "of a 200-process tree, pids(), pid_exists(), wait_procs() of 50 processes")
    p.add_argument("--latency", action="store_true",
                   help="also time start -> created and -> exited of true: over proctable "
                   "serve from the repository's Node client beside Node's own spawn (where "
                   "node and clients/node are here), and Supervisor.start beside a Popen; "
                   "at least 50 rounds (~15 s)")
    p.add_argument("--wire", action="store_true",
                   help="also time output over proctable serve to the repository's Node "
                   "client (stdio and socket, binary frames and base64), lossless, beside "
                   "Node's own child_process reading the same command: 200 MiB of "
                   "/dev/zero and 100 MiB of seq, 3 rounds; and 50 keys at 1,000 lines/s "
                   "each; skipped without node or clients/node (~35 s)")
    p.add_argument("--all", action="store_true",
                   help="--watcher, --lineage, --spawn, --output, --compat, --latency and "
                   "--wire")
    p.set_defaults(func=_cmd_bench)
