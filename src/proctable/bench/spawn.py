"""What a lineage costs per command, beside a plain Popen, in one run.

- spawn + wait + teardown of ``true`` through ``Lineage.spawn`` in each mode, against
  ``subprocess.Popen(["true"]).wait()`` interleaved with it (the floor);
- the memory of everything a lineage adds beside the command (the helper's mirror
  and reaper): RSS as ``ps`` shows it, and PSS (their shared pages counted once);
- ``Supervisor.start`` -> ``exited`` of ``true``;
- ``import proctable`` and a one-shot ``proctable ps`` against ``import psutil``
  and ``ps -e``, each in a fresh process;
- the first ``process_iter`` of a fresh process (import excluded), proctable against
  psutil, with the same attributes.

Every process started here is ended here (lineages torn down, Popens waited).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Optional

from ..lineage import MODES, Lineage
from ..lineage._cgroup import usable_parent

__all__ = ["helper_memory", "spawn_bench"]


def _median_ms(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1000, 3)


def _modes() -> list[str]:
    out = [m for m in MODES if m != "auto"]
    return out if usable_parent() is not None else [m for m in out if m != "cgroup"]


def _lineage_once(mode: str) -> float:
    t0 = time.perf_counter()
    lin = Lineage.spawn(["true"], mode=mode)
    lin.process.wait(timeout=30)
    lin.terminate(grace=1.0)
    return time.perf_counter() - t0


def _popen_once() -> float:
    t0 = time.perf_counter()
    subprocess.Popen(["true"]).wait(timeout=30)
    return time.perf_counter() - t0


def _kib(pid: int, path: str, key: str) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/{path}") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def proctable_name(pid: int) -> Optional[str]:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None


def helper_memory(mode: str = "subreaper") -> dict[str, Any]:
    """RSS and PSS (KiB) of the lineage's helper processes beside a running command."""
    lin = Lineage.spawn(["sleep", "30"], mode=mode)
    try:
        time.sleep(0.2)
        helpers = [lin.process.pid] if mode != "scan" else []
        if mode != "scan":
            with open(f"/proc/{lin.process.pid}/task/{lin.process.pid}/children") as f:
                helpers += [int(x) for x in f.read().split()]
            helpers = [p for p in helpers if lin.root is None or p != lin.root.pid]
            for reaper in list(helpers[1:]):  # cgroup mode: the reaper's guard too
                try:
                    with open(f"/proc/{reaper}/task/{reaper}/children") as f:
                        kids = [int(x) for x in f.read().split()]
                except OSError:
                    kids = []
                helpers += [k for k in kids if (proctable_name(k) or "") == "pt-guard"]
        rss = [_kib(p, "status", "VmRSS") or 0 for p in helpers]
        pss = [_kib(p, "smaps_rollup", "Pss") or 0 for p in helpers]
        return {"mode": mode, "processes": len(helpers), "rss_kib": sum(rss),
                "pss_kib": sum(pss)}
    finally:
        lin.terminate(grace=1.0)


def _supervised_once() -> float:
    from ..supervise import Supervisor  # noqa: PLC0415 - loads only for this figure

    done = threading.Event()
    sup = Supervisor(on_event=lambda ev: done.set() if ev.kind == "exited" else None)
    try:
        t0 = time.perf_counter()
        sup.start("k", ["true"])
        done.wait(30)
        return time.perf_counter() - t0
    finally:
        sup.close()


def _fresh(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
                   timeout=60)
    return time.perf_counter() - t0


_ATTRS = "['pid', 'ppid', 'name', 'status', 'create_time']"
_FIRST_PROCTABLE = ("import proctable, time; t = time.perf_counter(); "
                    f"list(proctable.process_iter({_ATTRS})); print(time.perf_counter() - t)")
_FIRST_PSUTIL = ("import psutil, time; t = time.perf_counter(); "
                 f"list(psutil.process_iter({_ATTRS})); print(time.perf_counter() - t)")


def _first_read(code: str) -> float:
    """Seconds of a fresh process's first process_iter, as that process timed it."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    return float(out.stdout.strip())


def spawn_bench(rounds: int = 30) -> dict[str, Any]:
    """Every figure above, medians of ``rounds`` (interleaved with their floor)."""
    out: dict[str, Any] = {"rounds": rounds, "modes": {}}
    popen: list[float] = []
    for mode in _modes():
        times = []
        for _ in range(rounds):
            times.append(_lineage_once(mode))
            popen.append(_popen_once())
        out["modes"][mode] = {"lineage_ms": _median_ms(times)}
    out["popen_ms"] = _median_ms(popen)
    for m in out["modes"].values():
        m["added_ms"] = round(m["lineage_ms"] - out["popen_ms"], 3)
    out["memory"] = [helper_memory(m) for m in _modes() if m != "scan"]
    out["supervisor_start_to_exited_ms"] = _median_ms(
        [_supervised_once() for _ in range(max(5, rounds // 3))])
    py = sys.executable
    fresh: dict[str, list[str]] = {
        "python -c pass": [py, "-c", "pass"],
        "import proctable": [py, "-c", "import proctable"],
        "proctable ps": [py, "-m", "proctable", "ps"],
    }
    try:
        import psutil  # noqa: F401, PLC0415 - only to know whether to time it

        fresh["import psutil"] = [py, "-c", "import psutil"]
        fresh["psutil process_iter"] = [py, "-c", "import psutil; list(psutil.process_iter("
                                        "['pid', 'ppid', 'name', 'status', 'create_time']))"]
    except ImportError:
        pass
    fresh["proctable process_iter"] = [py, "-c", "import proctable; list(proctable.process_iter("
                                       "['pid', 'ppid', 'name', 'status', 'create_time']))"]
    if shutil.which("ps"):
        fresh["ps -e"] = ["ps", "-e"]
    n = max(5, rounds // 3)
    out["fresh_process_ms"] = {k: _median_ms([_fresh(v) for _ in range(n)])
                               for k, v in fresh.items()}
    # The first read alone, timed inside a fresh process (import excluded).
    first: dict[str, str] = {"proctable process_iter": _FIRST_PROCTABLE}
    if "import psutil" in fresh:
        first["psutil process_iter"] = _FIRST_PSUTIL
    out["first_read_ms"] = {k: _median_ms([_first_read(v) for _ in range(n)])
                            for k, v in first.items()}
    out["host_cpus"] = os.cpu_count()
    return out


def render(data: dict[str, Any]) -> str:
    lines = [f"lineage per command (medians of {data['rounds']}; Popen+wait of true: "
             f"{data['popen_ms']:.2f} ms in the same run)"]
    for mode, m in data["modes"].items():
        lines.append(f"  {mode:<10} spawn+wait+teardown {m['lineage_ms']:7.2f} ms  "
                     f"(+{m['added_ms']:.2f} ms over Popen)")
    for m in data["memory"]:
        lines.append(f"  {m['mode']:<10} helper processes {m['processes']}: RSS "
                     f"{m['rss_kib'] / 1024:.2f} MiB, PSS {m['pss_kib'] / 1024:.2f} MiB")
    lines.append(f"  Supervisor.start -> exited of true: "
                 f"{data['supervisor_start_to_exited_ms']:.2f} ms")
    lines.append("fresh process, wall time:")
    for k, v in data["fresh_process_ms"].items():
        lines.append(f"  {k:<22} {v:8.1f} ms")
    lines.append("first read of a fresh process (import excluded):")
    for k, v in data.get("first_read_ms", {}).items():
        lines.append(f"  {k:<22} {v:8.2f} ms")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    import json

    result = spawn_bench(int(sys.argv[1]) if len(sys.argv) > 1 else 30)
    print(render(result))
    print(json.dumps(result, indent=2))
