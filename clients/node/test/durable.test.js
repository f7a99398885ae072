"use strict";
// Durable sessions from Node (issue 29 and 31.6): a sidecar started with --state is
// killed (SIGKILL) or detached; the next one on the same directory gives a client that
// reconnects its sessions back: adopted, and every byte of the output once, stitched
// by offset from the events before, tail(since) and the events after.
const assert = require("node:assert");
const { test } = require("node:test");
const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");
const { spawn } = require("node:child_process");
const { Sidecar } = require("..");

const COUNTER = "i=0; while :; do echo $i; i=$((i+1)); sleep 0.005; done";
const until = async (ok, what, ms = 30000) => {
  const end = Date.now() + ms;
  while (!ok()) {
    if (Date.now() > end) throw new Error(`not within ${ms} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
};

function place() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "pt-durable-"));
  const sock = path.join(dir, "s.sock");
  const state = path.join(dir, "state");
  const started = [];
  const serve = () => {
    const p = spawn("proctable", ["serve", "--grace", "1", "--state", state, "--socket", sock],
      { stdio: ["ignore", "ignore", "inherit"] });
    p.done = new Promise((resolve) => p.once("exit", (code, sig) => resolve(code === null ? sig : code)));
    started.push(p);
    return p;
  };
  // The end of a test: every session closed by a sidecar, every sidecar gone.
  const clean = async (pt) => {
    try {
      if (pt) await pt.close({ callTimeout: 30000 });
    } finally {
      for (const p of started) {
        if (p.exitCode === null && p.signalCode === null) p.kill("SIGTERM");
        await p.done;
      }
      fs.rmSync(dir, { recursive: true, force: true });
    }
  };
  return { sock, serve, clean };
}

// Pieces (offset, data) of one generation's output: each byte placed once by its
// offset; a gap is an error.
function stitch(pieces) {
  const sorted = [...pieces].sort((a, b) => a[0] - b[0]);
  const parts = [];
  let have = 0;
  for (const [off, data] of sorted) {
    assert.ok(off <= have, `a gap: nothing between ${have} and ${off}`);
    if (off + data.length > have) {
      parts.push(data.subarray(have - off));
      have = off + data.length;
    }
  }
  return Buffer.concat(parts);
}

function numbers(buf) {
  const text = buf.toString();
  return text.slice(0, text.lastIndexOf("\n")).split("\n").map(Number);
}

test("a SIGKILLed sidecar: the next one gives a reconnecting client its session back, every line once", async () => {
  const { sock, serve, clean } = place();
  let pt = null;
  try {
    let side = serve();
    pt = await Sidecar.connect(sock, { timeout: 30000 });
    assert.strictEqual((await pt.hello()).capabilities.durable, true);
    const pieces = [];
    const events = [];
    pt.on("output", (o) => { if (o.key === "count" && o.generation === 1) pieces.push([o.offset, o.data]); });
    pt.on("event", (ev) => events.push(ev));
    let reconnects = 0;
    pt.on("reconnect", () => reconnects++);
    const started = await pt.start("count", ["sh", "-c", COUNTER]);
    await until(() => pieces.length > 5, "output before the kill");
    const stoppedAt = Math.max(...pieces.map(([o, d]) => o + d.length));
    side.kill("SIGKILL");
    await side.done;
    await new Promise((r) => setTimeout(r, 500)); // the counter goes on, unread
    side = serve();
    const hello = await pt.reconnect({ timeout: 30000 });
    assert.strictEqual(reconnects, 1);
    assert.deepStrictEqual(hello.adoption_problems, []);
    await until(() => events.some((e) => e.kind === "adopted"), "adopted");
    const adopted = events.find((e) => e.kind === "adopted");
    assert.strictEqual(adopted.generation, 1);
    assert.strictEqual(adopted.pid, started.pid);
    assert.strictEqual(adopted.start_time, started.start_time);
    const missed = await pt.tail("count", 1 << 20, { since: stoppedAt });
    assert.strictEqual(missed.generation, 1);
    assert.strictEqual(missed.offset, stoppedAt);
    assert.strictEqual(missed.dropped, 0);
    pieces.push([missed.offset, missed.data]);
    await until(() => pieces.some(([o, d]) => o + d.length > missed.end + 200), "output after");
    const all = numbers(stitch(pieces));
    assert.ok(all.length > 100, String(all.length));
    all.forEach((n, i) => assert.strictEqual(n, i, `line ${i}`));
    await pt.remove("count");
    const [row] = (await pt.list()).filter((r) => r.key === "count");
    assert.strictEqual(row, undefined);
  } finally {
    await clean(pt);
  }
});

test("detach leaves the session to the next sidecar; its exit meanwhile is told exactly", async () => {
  const { sock, serve, clean } = place();
  let pt = null;
  try {
    let side = serve();
    pt = await Sidecar.connect(sock, { timeout: 30000 });
    await pt.hello();
    const events = [];
    pt.on("event", (ev) => events.push(ev));
    await pt.start("seven", ["sh", "-c", "sleep 1; exit 7"]);
    await pt.start("long", ["sleep", "300"]);
    await pt.detach();
    assert.strictEqual(await side.done, 0);
    await new Promise((r) => setTimeout(r, 1500)); // seven exits while no sidecar runs
    side = serve();
    await pt.reconnect({ timeout: 30000 });
    await until(() => events.some((e) => e.key === "seven" && e.kind === "exited"), "seven's exit");
    const seven = events.filter((e) => e.key === "seven").map((e) => e.kind);
    assert.deepStrictEqual(seven.slice(0, 2), ["created", "adopted"]);
    const exited = events.find((e) => e.key === "seven" && e.kind === "exited");
    assert.strictEqual(exited.code, 7);
    const rows = await pt.list();
    assert.strictEqual(rows.find((r) => r.key === "long").running, true);
  } finally {
    await clean(pt);
  }
});

test("reconnect to a spawned sidecar is not_supported; to a path nobody serves, disconnected in time", async () => {
  const pt = Sidecar.spawn();
  await pt.hello();
  await assert.rejects(pt.reconnect(), (e) => e.error === "not_supported");
  assert.strictEqual(await pt.end(), 0);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "pt-none-"));
  try {
    const t0 = Date.now();
    await assert.rejects(Sidecar.connect(path.join(dir, "none.sock"), { timeout: 300 }),
      (e) => e.error === "disconnected" && e.data.path.endsWith("none.sock"));
    assert.ok(Date.now() - t0 >= 250);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
