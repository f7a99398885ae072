"""One script, run once with ``import psutil`` and once with
``import proctable.compat as psutil``, on the same processes: what each name of
psutil's process API gives (value and type, or the exception class and its
pid and name), as plain data that compares equal when the two agree.

The specimens stand still while the script runs (sleeping, stopped, zombies,
kernel threads), so their values do not move between the two runs; the
destructive calls (signals other than 0, ``wait()`` of a child) are left to
tests that give each module its own processes.
"""

from __future__ import annotations

import os
import signal
from typing import Any

# Every getter, called in this order (the order matters: psutil's exceptions
# carry the name a Process learnt from an earlier name() call).
GETTERS = [
    "ppid", "name", "exe", "cmdline", "status", "create_time", "username", "uids",
    "gids", "terminal", "cwd", "environ", "nice", "num_threads", "num_fds",
    "memory_info", "memory_percent", "cpu_times", "cpu_percent",
]
AS_DICT = ["pid", *GETTERS]
AD = "<ad_value>"


def plain(v: Any) -> Any:
    """A value as plain data, with its type where the type is part of the promise."""
    if isinstance(v, BaseException):
        return ("raises", type(v).__name__, getattr(v, "pid", None), getattr(v, "name", None))
    if type(v).__name__ == "Negsignal":
        return ("Negsignal", int(v))
    if isinstance(v, tuple) and hasattr(v, "_fields"):
        return (type(v).__name__, tuple(v))
    if isinstance(v, list):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {k: plain(x) for k, x in sorted(v.items())}
    if hasattr(v, "pid") and hasattr(v, "is_running"):  # a Process
        return ("Process", v.pid, hash(v))
    return (type(v).__name__, v)


def call(fn: Any, *args: Any, **kw: Any) -> Any:
    try:
        return plain(fn(*args, **kw))
    except Exception as e:
        return plain(e)


def observe(ps: Any, specimens: dict[str, int], *, signals: bool = True) -> dict[str, Any]:
    """What ps says of every specimen, by name: the Process API name by name."""
    out: dict[str, Any] = {}
    listed = set(ps.pids())
    for what, pid in specimens.items():
        seen: dict[str, Any] = {"pid_exists": ps.pid_exists(pid), "in pids()": pid in listed}
        out[what] = seen
        try:
            p = ps.Process(pid)
        except Exception as e:
            seen["Process()"] = plain(e)
            continue
        seen["Process()"] = "ok"
        for name in GETTERS:
            seen[name] = call(getattr(p, name))
        seen["cpu_percent(0.01)"] = call(p.cpu_percent, 0.01)
        seen["memory_percent(vms)"] = call(p.memory_percent, "vms")
        seen["is_running"] = call(p.is_running)
        seen["parent"] = call(p.parent)
        seen["parents"] = call(p.parents)
        seen["children"] = call(p.children)
        seen["children(recursive)"] = call(p.children, recursive=True)
        seen["as_dict"] = call(p.as_dict, AS_DICT, AD)
        seen["as_dict(name)"] = call(p.as_dict, ["name"])
        with p.oneshot():
            seen["oneshot"] = {n: call(getattr(p, n)) for n in ("name", "uids", "cpu_times",
                                                                 "memory_info", "status")}
        q = ps.Process(pid)
        seen["==, hash"] = (p == q, p != q, hash(p) == hash(q), p == pid)
        if not what.startswith("zombie"):  # a zombie's wait() reaps it, or differs on purpose
            seen["wait(0)"] = call(p.wait, 0)
        if signals:
            seen["send_signal(0)"] = call(p.send_signal, 0)
    infos = {p.pid: p.info for p in ps.process_iter(AS_DICT, AD)
             if p.pid in specimens.values()}
    for what, pid in specimens.items():
        out[what]["process_iter"] = plain(infos.get(pid))
    return out


def observe_children(ps: Any, specimens: dict[str, int]) -> dict[str, Any]:
    """children() and children(recursive=True) of every specimen, as observe()."""
    out: dict[str, Any] = {}
    for what, pid in specimens.items():
        try:
            p = ps.Process(pid)
        except Exception as e:
            out[what] = {"Process()": plain(e)}
            continue
        out[what] = {"children": call(p.children), "children(recursive)": call(p.children, True)}
    return out


def own_zombie() -> int:
    """A zombie child of the caller (forked here, reaped by whoever waits for it)."""
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    return pid


def kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def differences(a: dict[str, Any], b: dict[str, Any],
                moving: dict[str, set[str]]) -> list[str]:
    """Where observe() through psutil (a) and through proctable.compat (b) disagree.
    moving[specimen] names the attributes that move on their own (a busy
    process's cpu times): for those only the type is compared, wherever they
    appear (a getter, as_dict, oneshot, process_iter)."""
    out = []
    for what, theirs in a.items():
        ours = b.get(what, {})
        for k in sorted(set(theirs) | set(ours)):
            x, y = theirs.get(k, "<missing>"), ours.get(k, "<missing>")
            masked = moving.get(what, set())
            if k in masked or k.split("(")[0] in masked:
                x, y = _type_of(x), _type_of(y)
            elif isinstance(x, dict) and isinstance(y, dict):
                x = {n: _type_of(v) if n in masked else v for n, v in x.items()}
                y = {n: _type_of(v) if n in masked else v for n, v in y.items()}
            if x != y:
                out.append(f"{what} {k}: psutil {x!r}, proctable.compat {y!r}")
    return out


def _type_of(v: Any) -> Any:
    if isinstance(v, tuple) and v and v[0] == "raises":
        return v
    if isinstance(v, tuple) and v:
        return v[0]
    if isinstance(v, list):
        return "list"
    return type(v).__name__
