"""How long a start takes to show: ``true`` started, to ``created`` and to ``exited``.

Two pairs, each measured side by side in one run (rounds interleaved, A B A B ...):

- over the wire: a real Node client (``clients/node``) starts ``true`` under a new key
  of ``proctable serve`` (stdio, default output mode) and times its ``start`` request to
  the ``created`` and ``exited`` notifications and to the response; beside it, Node's
  own ``child_process.spawn("true")`` to its ``spawn`` and ``exit`` events, in the same
  Node process;
- in Python: ``Supervisor.start(key, ["true"])`` to ``created`` and ``exited`` (as
  ``on_event`` sees them) and to the call's return, beside ``subprocess.Popen(["true"])``
  to its return and to ``wait()``'s.

Medians and ranges (min-max) in milliseconds, with the load average before and after,
since a 2-CPU machine shared with other work moves every figure. Every process started
here is ended here (the sidecar closes every key at the end of its stdin; the
Supervisor is closed; Popens are waited).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Optional

__all__ = ["find_node_client", "latency_bench", "render"]

# The Node side: the client module's path, the sidecar's command (JSON) and the rounds
# as arguments; prints one JSON object with every sample (milliseconds).
_NODE_SCRIPT = r"""
"use strict";
const { spawn } = require("node:child_process");
const { Sidecar } = require(process.argv[2]);
const command = JSON.parse(process.argv[3]);
const rounds = Number(process.argv[4]);
const warmup = Number(process.argv[5]);
const now = () => Number(process.hrtime.bigint()) / 1e6;
const bounded = (p, what) => Promise.race([p, new Promise((_, reject) =>
  setTimeout(() => reject(new Error(`${what}: no answer in 30 s`)), 30000).unref())]);

function nodeOnce() {
  return bounded(new Promise((resolve, reject) => {
    const t0 = now();
    let spawned = null;
    const cp = spawn("true", []);
    cp.on("error", reject);
    cp.on("spawn", () => { spawned = now() - t0; });
    cp.on("exit", () => resolve({ spawn: spawned, exit: now() - t0 }));
  }), "node spawn");
}

async function main() {
  const sc = Sidecar.spawn({ command, stderr: "inherit" });
  await bounded(sc.hello(), "hello");
  const waiting = new Map();
  sc.on("event", (p) => {
    const w = waiting.get(p.key);
    if (w === undefined) return;
    if (p.kind === "created") w.created = now() - w.t0;
    if (p.kind === "exited") { w.exited = now() - w.t0; w.done(); }
  });
  async function sidecarOnce(key) {
    const w = { t0: now() };
    const ended = new Promise((resolve) => { w.done = resolve; });
    waiting.set(key, w);
    await bounded(sc.start(key, ["true"]), "start");
    w.response = now() - w.t0;
    await bounded(ended, "exited");
    waiting.delete(key);
    return { created: w.created, exited: w.exited, response: w.response };
  }
  const out = { node: [], sidecar: [] };
  for (let i = 0; i < warmup + rounds; i++) {
    const a = await nodeOnce();
    const b = await sidecarOnce(`latency-${i}`);
    if (i >= warmup) { out.node.push(a); out.sidecar.push(b); }
    await new Promise((r) => setTimeout(r, 5));
  }
  await bounded(sc.call("close", {}), "close");
  process.stdout.write(JSON.stringify(out) + "\n");
  await bounded(sc.end(), "end");
}
main().catch((err) => { process.stderr.write(String(err.stack || err) + "\n"); process.exit(1); });
"""


def find_node_client() -> Optional[str]:
    """The repository's Node client (clients/node/index.js) beside this source tree, or
    None (an installed wheel has no clients/ directory)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for up in (3, 4):
        root = here
        for _ in range(up):
            root = os.path.dirname(root)
        path = os.path.join(root, "clients", "node", "index.js")
        if os.path.isfile(path):
            return path
    return None


def _stats(xs: list[float]) -> dict[str, float]:
    return {"median_ms": round(statistics.median(xs), 3), "min_ms": round(min(xs), 3),
            "max_ms": round(max(xs), 3)}


def _load() -> Optional[list[float]]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def wire_bench(rounds: int, client: str, warmup: int = 5) -> dict[str, Any]:
    """The Node side (see the module): raw samples summarised."""
    node = shutil.which("node")
    if node is None:
        raise FileNotFoundError("node is not installed: the wire figures need it")
    with tempfile.TemporaryDirectory(prefix="proctable-latency-") as tmp:
        script = os.path.join(tmp, "latency.js")
        with open(script, "w") as f:
            f.write(_NODE_SCRIPT)
        command = json.dumps([sys.executable, "-m", "proctable", "serve"])
        done = subprocess.run([node, script, os.path.abspath(client), command, str(rounds),
                               str(warmup)], capture_output=True, text=True, check=False,
                              timeout=60 + rounds * 10)
    if done.returncode != 0:
        raise RuntimeError(f"the Node side failed ({done.returncode}): {done.stderr.strip()}")
    raw = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "node_spawn": _stats([r["spawn"] for r in raw["node"]]),
        "node_exit": _stats([r["exit"] for r in raw["node"]]),
        "sidecar_created": _stats([r["created"] for r in raw["sidecar"]]),
        "sidecar_response": _stats([r["response"] for r in raw["sidecar"]]),
        "sidecar_exited": _stats([r["exited"] for r in raw["sidecar"]]),
    }


def _has_exited(seen: dict[str, dict[str, float]], key: str) -> bool:
    return "exited" in seen.get(key, {})


def python_bench(rounds: int, warmup: int = 5) -> dict[str, Any]:
    """Supervisor.start of ``true`` beside a bare Popen, interleaved (see the module)."""
    from ..supervise import Supervisor  # noqa: PLC0415 - loads only for this figure

    seen: dict[str, dict[str, float]] = {}
    ended = threading.Condition()

    def on_event(ev: Any) -> None:
        if ev.kind in ("created", "exited"):
            with ended:
                seen.setdefault(ev.key, {})[ev.kind] = time.perf_counter()
                ended.notify_all()

    popen_ret: list[float] = []
    popen_wait: list[float] = []
    sup_created: list[float] = []
    sup_ret: list[float] = []
    sup_exited: list[float] = []
    sup = Supervisor(on_event=on_event, grace=1.0)
    try:
        for i in range(warmup + rounds):
            t0 = time.perf_counter()
            p = subprocess.Popen(["true"])
            t1 = time.perf_counter()
            p.wait(timeout=30)
            t2 = time.perf_counter()
            key = f"latency-{i}"
            t3 = time.perf_counter()
            sup.start(key, ["true"])
            t4 = time.perf_counter()
            with ended:
                if not ended.wait_for(functools.partial(_has_exited, seen, key), 30):
                    raise TimeoutError(f"no exited for {key} within 30 s")
            if i >= warmup:
                popen_ret.append((t1 - t0) * 1e3)
                popen_wait.append((t2 - t0) * 1e3)
                sup_ret.append((t4 - t3) * 1e3)
                sup_created.append((seen[key]["created"] - t3) * 1e3)
                sup_exited.append((seen[key]["exited"] - t3) * 1e3)
            time.sleep(0.005)
    finally:
        sup.close()
    return {"popen": _stats(popen_ret), "popen_wait": _stats(popen_wait),
            "supervisor_created": _stats(sup_created), "supervisor_return": _stats(sup_ret),
            "supervisor_exited": _stats(sup_exited)}


def latency_bench(rounds: int = 50, client: Optional[str] = None) -> dict[str, Any]:
    """Every figure above; the wire's are left out (with the reason) without node or
    the Node client."""
    out: dict[str, Any] = {"rounds": rounds, "load_before": _load(), "cpus": os.cpu_count()}
    client = client or find_node_client()
    if client is None:
        out["wire"] = {"skipped": "no Node client here (clients/node/index.js of the "
                                  "repository)"}
    else:
        try:
            out["wire"] = wire_bench(rounds, client)
        except (FileNotFoundError, RuntimeError, subprocess.TimeoutExpired) as exc:
            out["wire"] = {"skipped": str(exc)}
    out["python"] = python_bench(rounds)
    out["load_after"] = _load()
    return out


def _row(name: str, s: dict[str, float]) -> str:
    return (f"  {name:<44} {s['median_ms']:7.2f} ms  "
            f"({s['min_ms']:.2f}-{s['max_ms']:.2f})")


def render(data: dict[str, Any]) -> str:
    lines = [f"start -> created / exited of `true` (medians and ranges of {data['rounds']}, "
             f"interleaved; load average {data['load_before']} before, "
             f"{data['load_after']} after, {data['cpus']} CPUs)"]
    w = data["wire"]
    if "skipped" in w:
        lines.append(f"  over proctable serve: left out ({w['skipped']})")
    else:
        lines += [
            "over `proctable serve` (stdio), from the Node client:",
            _row("start -> created", w["sidecar_created"]),
            _row("start -> response", w["sidecar_response"]),
            _row("start -> exited", w["sidecar_exited"]),
            "Node's own child_process.spawn('true'), same process, interleaved:",
            _row("spawn() -> 'spawn'", w["node_spawn"]),
            _row("spawn() -> 'exit'", w["node_exit"]),
            f"  created - spawn (medians): "
            f"{w['sidecar_created']['median_ms'] - w['node_spawn']['median_ms']:+.2f} ms; "
            f"exited - exit: "
            f"{w['sidecar_exited']['median_ms'] - w['node_exit']['median_ms']:+.2f} ms",
        ]
    p = data["python"]
    lines += [
        "in Python, interleaved:",
        _row("Supervisor.start -> created (on_event)", p["supervisor_created"]),
        _row("Supervisor.start returns", p["supervisor_return"]),
        _row("Supervisor.start -> exited (on_event)", p["supervisor_exited"]),
        _row("Popen(['true']) returns", p["popen"]),
        _row("Popen(['true']) -> wait() returns", p["popen_wait"]),
    ]
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    result = latency_bench(int(sys.argv[1]) if len(sys.argv) > 1 else 50)
    print(render(result))
    print(json.dumps(result, indent=2))
