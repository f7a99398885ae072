// The Node side of `proctable bench --wire` (proctable/bench/wire.py runs it):
//   node wire_client.js CONFIG_JSON
// CONFIG: {client (clients/node/index.js), sidecar (the serve command), socket (a
// socket sidecar's path, started by wire.py, or null), socketPid, clkTck, rounds,
// warmup, streams [{name, args, bytes, tail (hex)}], modes ["stdio", "socket",
// "base64"], manyKeys {keys, rate, seconds, args} or null}.
// It prints one JSON object: every sample of every row, and the 50-key run.
// Every wait is bounded; every key it starts ends with its sidecar.
"use strict";
const fs = require("node:fs");
const { spawn } = require("node:child_process");

const cfg = JSON.parse(process.argv[2]);
const { Sidecar } = require(cfg.client);
const now = () => Number(process.hrtime.bigint()) / 1e9;
const BOUND_MS = (cfg.boundSeconds || 120) * 1000;
const bounded = (p, what) => {
  let timer;
  const limit = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: not done in ${BOUND_MS / 1000} s`)),
      BOUND_MS);
  });
  return Promise.race([p, limit]).finally(() => clearTimeout(timer));
};

// Node's own children still running: killed if the run fails (the sidecars' keys end
// with their sidecar).
const children = new Set();
function track(cp) {
  children.add(cp);
  cp.on("exit", () => children.delete(cp));
  return cp;
}

// What is going on, to stderr: wire.py shows the last lines when the run fails.
const progress = (text) => process.stderr.write(`wire: ${text}\n`);

// utime + stime of a process (all its threads), in seconds; null when unreadable.
function procCpu(pid) {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, "latin1");
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(f[11]) + Number(f[12])) / cfg.clkTck; // fields 14 and 15
  } catch {
    return null;
  }
}

// This process's CPU (every thread), in seconds.
function selfCpu() {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1e6;
}

// The last `n` bytes seen so far, kept cheaply (the stream's end is checked).
function keepTail(tail, data, n) {
  if (data.length >= n) return data.subarray(data.length - n);
  const both = Buffer.concat([tail, data]);
  return both.subarray(Math.max(0, both.length - n));
}

// Node's own child_process reading the same command: the reference.
function nodeOnce(stream) {
  return bounded(new Promise((resolve, reject) => {
    const n = stream.tail.length / 2;
    const c0 = selfCpu();
    const t0 = now();
    let got = 0;
    let chunks = 0;
    let tail = Buffer.alloc(0);
    const cp = track(spawn(stream.args[0], stream.args.slice(1),
      { stdio: ["ignore", "pipe", "ignore"] }));
    cp.on("error", reject);
    cp.stdout.on("data", (d) => { got += d.length; chunks += 1; tail = keepTail(tail, d, n); });
    cp.on("close", () => {
      const t1 = now();
      resolve({ seconds: t1 - t0, bytes: got, client_cpu: selfCpu() - c0, sidecar_cpu: null,
        tail_ok: tail.toString("hex") === stream.tail, gaps: 0, told: 0, chunks });
    });
  }), `node ${stream.name}`);
}

// One connected Sidecar and what its output handler counts for the key being read.
class Wire {
  constructor(mode) {
    this.mode = mode;
    this.sc = null;
    this.pid = null;
    this.reading = null; // {key, got, offset, gaps, told, tail, n, done}
  }

  async open() {
    if (this.mode === "socket") {
      this.sc = await Sidecar.connect(cfg.socket, { timeout: 20000 });
      this.pid = cfg.socketPid;
    } else {
      this.sc = Sidecar.spawn({ command: cfg.sidecar, stderr: "inherit" });
      this.pid = this.sc.child.pid;
    }
    const hello = await bounded(this.sc.hello(this.mode === "base64" ? { output: "base64" } : {}),
      "hello");
    if (hello.output !== (this.mode === "base64" ? "base64" : "binary")) {
      throw new Error(`hello gave output ${hello.output} in mode ${this.mode}`);
    }
    this.sc.on("output", (o) => {
      const r = this.reading;
      if (r === null || o.key !== r.key) return;
      if (o.offset !== r.offset) r.gaps += 1; // bytes this client did not get
      r.told += o.dropped;
      r.got += o.data.length;
      r.frames += 1;
      r.offset = o.offset + o.data.length;
      r.tail = keepTail(r.tail, o.data, r.n);
    });
    this.sc.on("lost", (l) => {
      const r = this.reading;
      if (r !== null && l.key === r.key) r.told += l.bytes;
    });
    this.sc.on("event", (ev) => {
      const r = this.reading;
      if (r !== null && ev.key === r.key && ev.kind === "exited") r.done();
    });
  }

  async once(stream, key) {
    const n = stream.tail.length / 2;
    const ended = new Promise((resolve) => {
      this.reading = { key, got: 0, frames: 0, offset: 0, gaps: 0, told: 0, tail: Buffer.alloc(0), n,
        done: resolve };
    });
    const s0 = procCpu(this.pid);
    const c0 = selfCpu();
    const t0 = now();
    await bounded(this.sc.start(key, stream.args), `start ${key}`);
    await bounded(ended, `${key}'s exited`);
    const t1 = now();
    const c1 = selfCpu();
    const s1 = procCpu(this.pid);
    const r = this.reading;
    this.reading = null;
    await bounded(this.sc.remove(key, { grace: 1 }), `remove ${key}`);
    return { seconds: t1 - t0, bytes: r.got, client_cpu: c1 - c0,
      sidecar_cpu: s0 === null || s1 === null ? null : s1 - s0,
      tail_ok: r.tail.toString("hex") === stream.tail, gaps: r.gaps, told: r.told,
      chunks: r.frames };
  }

  async close() {
    await bounded(this.sc.close({ grace: 1 }), "close");
    await bounded(this.sc.end(), "end");
  }
}

// 50 keys, each a writer of numbered lines at `rate` a second: every line of every
// key checked in order (a line missing, doubled or torn shows), then the same
// writers read by Node's own child_process, one after the other.
function lineChecker() {
  const keys = new Map(); // key -> {next, rest, bad}
  return {
    keys,
    feed(key, data) {
      let k = keys.get(key);
      if (!k) { k = { next: 0, rest: "", bad: 0 }; keys.set(key, k); }
      const text = k.rest + data.toString("latin1");
      const lines = text.split("\n");
      k.rest = lines.pop();
      for (const line of lines) {
        if (line !== `${key} line ${k.next}`) k.bad += 1;
        k.next += 1;
      }
    },
    summary() {
      const out = {};
      for (const [key, k] of keys) out[key] = { lines: k.next, bad: k.bad, partial: k.rest.length };
      return out;
    },
  };
}

async function manyKeysSidecar(mk) {
  const wire = new Wire("stdio");
  await wire.open();
  const check = lineChecker();
  const told = new Map();
  let exited = 0;
  let allDone;
  const all = new Promise((resolve) => { allDone = resolve; });
  wire.sc.on("output", (o) => {
    check.feed(o.key, o.data);
    if (o.dropped) told.set(o.key, (told.get(o.key) || 0) + o.dropped);
  });
  wire.sc.on("lost", (l) => told.set(l.key, (told.get(l.key) || 0) + l.bytes));
  wire.sc.on("event", (ev) => {
    if (ev.kind === "exited" && ++exited === mk.keys) allDone();
  });
  const s0 = procCpu(wire.pid);
  const c0 = selfCpu();
  const t0 = now();
  const starts = [];
  for (let i = 0; i < mk.keys; i++) {
    const key = `k${i}`;
    starts.push(bounded(wire.sc.start(key, [...mk.args, key]), `start ${key}`));
  }
  await Promise.all(starts);
  await bounded(all, "the 50 keys' exits");
  const t1 = now();
  const c1 = selfCpu();
  const s1 = procCpu(wire.pid);
  await wire.close();
  return { seconds: t1 - t0, client_cpu: c1 - c0,
    sidecar_cpu: s0 === null || s1 === null ? null : s1 - s0,
    keys: check.summary(), told: Object.fromEntries(told) };
}

async function manyKeysNode(mk) {
  const check = lineChecker();
  const c0 = selfCpu();
  const t0 = now();
  const runs = [];
  for (let i = 0; i < mk.keys; i++) {
    const key = `k${i}`;
    runs.push(bounded(new Promise((resolve, reject) => {
      const cp = track(spawn(mk.args[0], [...mk.args.slice(1), key],
        { stdio: ["ignore", "pipe", "ignore"] }));
      cp.on("error", reject);
      cp.stdout.on("data", (d) => check.feed(key, d));
      cp.on("close", resolve);
    }), `node ${key}`));
  }
  await Promise.all(runs);
  const t1 = now();
  return { seconds: t1 - t0, client_cpu: selfCpu() - c0, sidecar_cpu: null,
    keys: check.summary(), told: {} };
}

async function main() {
  const out = { rows: {}, many_keys: null };
  const wires = [];
  for (const mode of cfg.modes) {
    const w = new Wire(mode);
    await w.open();
    wires.push(w);
  }
  // Rows: each stream through each mode and through Node's own child_process,
  // interleaved round by round, the order rotated each round.
  const trials = [];
  for (const stream of cfg.streams) {
    trials.push({ name: `${stream.name} node`, run: () => nodeOnce(stream) });
    for (const w of wires) {
      trials.push({ name: `${stream.name} ${w.mode}`, run: (i) => w.once(stream, `${stream.name}-${i}`) });
    }
  }
  for (const t of trials) out.rows[t.name] = [];
  for (let round = 0; round < cfg.warmup + cfg.rounds; round++) {
    const k = round % trials.length;
    for (const t of [...trials.slice(k), ...trials.slice(0, k)]) {
      progress(`round ${round}: ${t.name} ...`); // the last one names a stall
      const r = await t.run(round);
      progress(`round ${round}: ${t.name} ${r.bytes} bytes in ${r.seconds.toFixed(2)} s`);
      if (round >= cfg.warmup) out.rows[t.name].push(r);
    }
  }
  for (const w of wires) await w.close();
  if (cfg.manyKeys) {
    progress(`${cfg.manyKeys.keys} keys ...`);
    out.many_keys = { node: await manyKeysNode(cfg.manyKeys),
      sidecar: await manyKeysSidecar(cfg.manyKeys) };
  }
  process.stdout.write(JSON.stringify(out) + "\n");
}

main().catch((err) => {
  process.stderr.write(String(err.stack || err) + "\n");
  for (const cp of children) cp.kill("SIGKILL");
  process.exit(1);
});
