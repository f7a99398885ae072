"""The wire: output through ``proctable serve`` to the Node client, beside Node's own
``child_process`` reading the same command in the same run (issue 31).

One Node process (``wire_client.js``, shipped beside this module) drives the
repository's Node client (``clients/node``) and, interleaved with it round by round
(the order rotated each round), Node's own ``child_process.spawn`` of the same command:

- **rows**: ``head -c 200M /dev/zero`` and 100 MiB of numbered lines (``seq 1 N``)
  through one key, lossless (the default), to the client over stdio and over a Unix
  socket with binary output frames (what ``hello`` asks for by default), and over stdio
  in the base64 form (``hello`` with ``output: "base64"``, the path before binary
  frames). Each row: MB/s delivered (10^6 bytes a second, from ``start`` to the
  ``exited`` notification, every output notification before it), bytes lost
  (expected less delivered: must be 0; with ``gaps``, output offsets that skip, and
  ``told``, bytes the sidecar said it dropped), the sidecar's CPU (utime + stime of its
  process, from ``/proc/<pid>/stat``) and the Node client's (``process.cpuUsage()``)
  per 200 MiB, and the rate's ratio to Node's ``child_process`` in the same run;
- **many keys**: 50 keys each writing 1,000 numbered lines a second for 5 s, to one
  Node client over stdio: lines expected and received per key, every line checked in
  order; the sidecar's CPU and the client's; then the same writers read by Node's own
  ``child_process`` (its CPU, for reference).

``start`` -> ``created`` / ``exited`` beside Node's spawn is ``proctable bench
--latency`` (``proctable.bench.latency``), not repeated here.

Every process started here is ended here: the stdio sidecars close every key at the
end of their stdin (also when Node is killed), the socket sidecar is started by this
module and stopped by its pid (SIGTERM, then SIGKILL), and every key is removed after
its row.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from typing import Any, Optional

from .latency import find_node_client

__all__ = ["NODE_SCRIPT", "render", "seq_total", "wire_bench"]

NODE_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "wire_client.js")
MIB = 1 << 20
PER = 200 * MIB  # CPU is given per 200 MiB

# A key of the many-keys run: numbered lines "<key> line <n>", `rate` a second for
# `seconds`, written in batches every 10 ms (a chatty program's shape, not a line a
# wake-up); the key is its last argument.
_WRITER = ("import sys, time\n"
           "rate, seconds, key = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]\n"
           "w = sys.stdout\n"
           "n, t0, total = 0, time.monotonic(), int(rate * seconds)\n"
           "while n < total:\n"
           "    due = min(total, int((time.monotonic() - t0) * rate))\n"
           "    while n < due:\n"
           "        w.write('%s line %d\\n' % (key, n))\n"
           "        n += 1\n"
           "    w.flush()\n"
           "    time.sleep(0.01)\n")

MODES = ("stdio", "socket", "base64")
MODE_NAMES = {"node": "Node's own child_process", "stdio": "client over stdio, binary",
              "socket": "client over a socket, binary", "base64": "client over stdio, base64"}


def seq_total(n: int) -> int:
    """The bytes ``seq 1 n`` writes."""
    total, digits, low = 0, 1, 1
    while low <= n:
        high = min(n, 10 ** digits - 1)
        total += (high - low + 1) * (digits + 1)
        digits, low = digits + 1, 10 ** digits
    return total


def _seq_for(size: int) -> int:
    """The smallest n whose ``seq 1 n`` writes at least size bytes."""
    lo, hi = 1, max(1, size)
    while lo < hi:
        mid = (lo + hi) // 2
        if seq_total(mid) >= size:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _streams(zero_mib: float, lines_mib: float) -> list[dict[str, Any]]:
    zero = int(zero_mib * MIB)
    n = _seq_for(int(lines_mib * MIB))
    return [
        {"name": "zero", "args": ["head", "-c", str(zero), "/dev/zero"], "bytes": zero,
         "tail": (b"\0" * 16).hex(),
         "what": f"head -c {zero} /dev/zero ({zero / MIB:g} MiB)"},
        {"name": "lines", "args": ["seq", "1", str(n)], "bytes": seq_total(n),
         "tail": f"{n}\n".encode().hex(),
         "what": f"seq 1 {n} ({seq_total(n) / MIB:.1f} MiB of numbered lines)"},
    ]


def _load() -> Optional[list[float]]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _cpus() -> Optional[int]:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count()


def _range(xs: list[float], digits: int = 3) -> dict[str, float]:
    return {"median": round(statistics.median(xs), digits), "min": round(min(xs), digits),
            "max": round(max(xs), digits)}


def _row(stream: dict[str, Any], mode: str, samples: list[dict[str, Any]],
         node_rate: Optional[float]) -> dict[str, Any]:
    want = stream["bytes"]
    rates = [s["bytes"] / s["seconds"] / 1e6 for s in samples]
    scale = PER / want
    sidecar = [s["sidecar_cpu"] * scale for s in samples if s["sidecar_cpu"] is not None]
    rate = statistics.median(rates)
    return {
        "stream": stream["name"],
        "mode": mode,
        "what": MODE_NAMES[mode],
        "samples": len(samples),
        "bytes": want,
        "mb_s": _range(rates, 1),
        "lost": max(want - s["bytes"] for s in samples),
        "gaps": sum(s["gaps"] for s in samples),
        "told": sum(s["told"] for s in samples),
        "tail_ok": all(s["tail_ok"] for s in samples),
        # Every sample: each byte once (the count, no offset skipped), the stream's end.
        "whole": all(s["bytes"] == want and not s["gaps"] and s["tail_ok"] for s in samples),
        "sidecar_cpu_per_200mib": _range(sidecar) if sidecar else None,
        "client_cpu_per_200mib": _range([s["client_cpu"] * scale for s in samples]),
        # The mean bytes a read gives the client: an output notification's, or a
        # child_process 'data' event's.
        "chunk_kib": round(statistics.median(s["bytes"] / max(1, s["chunks"]) / 1024
                                             for s in samples), 1),
        "vs_node": None if mode == "node" or not node_rate else round(rate / node_rate, 3),
    }


def _many_keys(raw: dict[str, Any], keys: int, rate: int, seconds: float) -> dict[str, Any]:
    want = int(rate * seconds)

    def side(r: dict[str, Any]) -> dict[str, Any]:
        per = r["keys"]
        got = [per.get(f"k{i}", {"lines": 0, "bad": 0, "partial": 0}) for i in range(keys)]
        whole = sum(1 for k in got if k["lines"] == want and not k["bad"] and not k["partial"])
        return {"seconds": round(r["seconds"], 2),
                "lines": sum(k["lines"] for k in got),
                "min_lines": min(k["lines"] for k in got),
                "max_lines": max(k["lines"] for k in got),
                "bad_lines": sum(k["bad"] for k in got),
                "keys_whole": whole,
                "told_lost": sum(r["told"].values()),
                "sidecar_cpu": None if r["sidecar_cpu"] is None else round(r["sidecar_cpu"], 3),
                "client_cpu": round(r["client_cpu"], 3)}

    return {"keys": keys, "rate": rate, "seconds": seconds, "want_per_key": want,
            "want": want * keys, "sidecar": side(raw["sidecar"]), "node": side(raw["node"])}


def wire_bench(zero_mib: float = 200, lines_mib: float = 100, rounds: int = 3,
               warmup: int = 1, keys: int = 50, rate: int = 1000, seconds: float = 5.0,
               client: Optional[str] = None, modes: tuple[str, ...] = MODES,
               ) -> dict[str, Any]:
    """Every figure of the module, or {"skipped": why} without node or the client.

    ``keys=0`` leaves the many-keys run out. Raises RuntimeError when the Node side
    fails (a wait that ran out, a sidecar that ended).
    """
    node = shutil.which("node")
    if node is None:
        return {"skipped": "node is not on PATH: the wire figures need Node"}
    client = client or find_node_client()
    if client is None:
        return {"skipped": "no Node client here (clients/node/index.js of the repository; "
                           "an installed wheel has none)"}
    unknown = set(modes) - set(MODES)
    if unknown:
        raise ValueError(f"unknown modes {sorted(unknown)}: the modes are {MODES}")
    if rounds < 1 or warmup < 0 or keys < 0:
        raise ValueError(f"rounds {rounds} (at least 1), warmup {warmup} and keys {keys} "
                         "(at least 0)")
    if not (zero_mib > 0 and lines_mib > 0 and (keys == 0 or (rate > 0 and seconds > 0))):
        raise ValueError("the sizes, the rate and the seconds must be positive")
    streams = _streams(zero_mib, lines_mib)
    version = subprocess.run([node, "--version"], capture_output=True, text=True,
                             timeout=30, check=False).stdout.strip()
    out: dict[str, Any] = {"node": version, "rounds": rounds, "warmup": warmup,
                           "cpus": _cpus(), "load_before": _load(),
                           "streams": [{k: s[k] for k in ("name", "what", "args", "bytes")}
                                       for s in streams]}
    serve = [sys.executable, "-m", "proctable", "serve", "--grace", "1"]
    tmp = tempfile.mkdtemp(prefix="proctable-wire-")  # 0700: the socket is ours alone
    sock = os.path.join(tmp, "pt.sock")
    sidecar: Optional[subprocess.Popen[bytes]] = None
    try:
        if "socket" in modes:
            sidecar = subprocess.Popen([*serve, "--socket", sock], stdin=subprocess.DEVNULL)
        cfg = {
            "client": os.path.abspath(client), "sidecar": serve,
            "socket": sock if sidecar else None, "socketPid": sidecar.pid if sidecar else None,
            "clkTck": os.sysconf("SC_CLK_TCK"), "rounds": rounds, "warmup": warmup,
            "modes": list(modes), "streams": streams,
            "manyKeys": {"keys": keys, "rate": rate, "seconds": seconds,
                         "args": [sys.executable, "-S", "-c", _WRITER, str(rate),
                                  str(seconds)]} if keys else None,
        }
        # A backstop only (about 1 MB/s): every wait of the Node side is bounded
        # (120 s), and a loaded host slows the base64 rows a lot.
        mib = (zero_mib + lines_mib) * (rounds + warmup) * (1 + len(modes))
        try:
            done = subprocess.run([node, NODE_SCRIPT, json.dumps(cfg)], capture_output=True,
                                  text=True, check=False,
                                  timeout=300 + mib + (seconds * 4 if keys else 0))
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"the Node side took over {exc.timeout:.0f} s; it was at: "
                               f"{_last(exc.stderr)}") from exc
        if done.returncode != 0:
            raise RuntimeError(f"the Node side failed ({done.returncode}): "
                               f"{_last(done.stderr)}")
        last = done.stdout.strip().splitlines()[-1:]
        if not last:
            raise RuntimeError(f"the Node side said nothing: {_last(done.stderr)}")
        raw = json.loads(last[0])
    finally:
        if sidecar is not None:
            _stop(sidecar)
        shutil.rmtree(tmp, ignore_errors=True)
    rows = []
    for s in streams:
        node_samples = raw["rows"][f"{s['name']} node"]
        node_rate = statistics.median(x["bytes"] / x["seconds"] / 1e6 for x in node_samples)
        rows.append(_row(s, "node", node_samples, None))
        rows += [_row(s, m, raw["rows"][f"{s['name']} {m}"], node_rate) for m in modes]
    out["rows"] = rows
    if raw["many_keys"] is not None:
        out["many_keys"] = _many_keys(raw["many_keys"], keys, rate, seconds)
    out["load_after"] = _load()
    return out


def _last(err: object, n: int = 12) -> str:
    """The last lines of the Node side's stderr (progress, and a sidecar's words)."""
    text = err.decode(errors="replace") if isinstance(err, bytes) else str(err or "")
    return " | ".join(text.strip().splitlines()[-n:])


def _stop(sidecar: subprocess.Popen[bytes]) -> None:
    """SIGTERM (it stops every key and exits), bounded; then SIGKILL (its keys die
    with it)."""
    if sidecar.poll() is None:
        sidecar.send_signal(signal.SIGTERM)
        try:
            sidecar.wait(20)
        except subprocess.TimeoutExpired:
            sidecar.kill()
            sidecar.wait(10)


def _cpu(r: Optional[dict[str, float]]) -> str:
    return "-" if r is None else f"{r['median']:.2f} s"


def render(data: dict[str, Any]) -> str:
    if "skipped" in data:
        return f"the wire (proctable serve to the Node client): left out ({data['skipped']})"
    if "failed" in data:
        return f"the wire (proctable serve to the Node client): FAILED ({data['failed']})"
    lines = [f"the wire: one key's output to the Node client, lossless, beside Node's own "
             f"child_process in the same Node process (medians of {data['rounds']} rounds, "
             f"interleaved; node {data['node']}; load average {data['load_before']} before, "
             f"{data['load_after']} after; {data['cpus']} CPUs; CPU per 200 MiB)"]
    for s in data["streams"]:
        lines.append(f"{s['what']}:")
        lines.append(f"  {'':<30} {'MB/s':>6} {'(range)':<13} {'lost':>5} {'sidecar':>8} "
                     f"{'client':>8} {'vs Node':>8} {'KiB/read':>9}")
        for r in data["rows"]:
            if r["stream"] != s["name"]:
                continue
            rate = r["mb_s"]
            span = f"({rate['min']:.0f}-{rate['max']:.0f})"
            ratio = "" if r["vs_node"] is None else f"{r['vs_node']:.2f}"
            flag = "" if r["whole"] else (
                f"  NOT WHOLE (gaps {r['gaps']}, told {r['told']}, end ok {r['tail_ok']})")
            lines.append(f"  {r['what']:<30} {rate['median']:6.0f} {span:<13} {r['lost']:>5} "
                         f"{_cpu(r['sidecar_cpu_per_200mib']):>8} "
                         f"{_cpu(r['client_cpu_per_200mib']):>8} {ratio:>8} "
                         f"{r['chunk_kib']:>9.0f}{flag}")
    m = data.get("many_keys")
    if m is not None:
        lines.append(f"{m['keys']} keys x {m['rate']} numbered lines/s for {m['seconds']:g} s "
                     f"({m['want_per_key']:,} lines a key), every line checked in order:")
        for name, side in (("to the client over stdio", m["sidecar"]),
                           ("Node's own child_process", m["node"])):
            cpu = ("" if side["sidecar_cpu"] is None
                   else f"sidecar CPU {side['sidecar_cpu']:.2f} s, ")
            lines.append(f"  {name:<26} {side['lines']:,}/{m['want']:,} lines, "
                         f"{side['keys_whole']}/{m['keys']} keys whole (per key "
                         f"{side['min_lines']:,}-{side['max_lines']:,}), bad lines "
                         f"{side['bad_lines']}, told lost {side['told_lost']}; {cpu}client CPU "
                         f"{side['client_cpu']:.2f} s in {side['seconds']:.1f} s")
    lines.append("start -> created / exited beside Node's spawn: proctable bench --latency")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    result = wire_bench(rounds=int(sys.argv[1]) if len(sys.argv) > 1 else 3)
    print(render(result))
    print(json.dumps(result, indent=2))
