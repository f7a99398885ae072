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
  // A command that runs until go() is called, then exits 7: its exit falls where the
  // test says (while no sidecar runs), not after a sleep that a loaded machine outlasts.
  const gate = path.join(dir, "go");
  const sevenArgs = ["sh", "-c", `while [ ! -e '${gate}' ]; do sleep 0.02; done; exit 7`];
  const go = () => fs.writeFileSync(gate, "");
  return { sock, state, serve, clean, sevenArgs, go };
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
    side = serve(); // the counter goes on, unread, while the next sidecar starts
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
    // Output after the replay, and at least 400 bytes in all (lines 0 to 127 and more:
    // the count below is waited for, not hoped for from a pause before the restart).
    const enough = Math.max(missed.end + 200, 400);
    await until(() => pieces.some(([o, d]) => o + d.length > enough), "output after");
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
  const { sock, serve, clean, sevenArgs, go } = place();
  let pt = null;
  try {
    let side = serve();
    pt = await Sidecar.connect(sock, { timeout: 30000 });
    await pt.hello();
    const events = [];
    pt.on("event", (ev) => events.push(ev));
    const first = await pt.start("seven", sevenArgs);
    await pt.start("long", ["sleep", "300"]);
    await pt.detach();
    assert.strictEqual(await side.done, 0);
    go(); // seven exits while no sidecar runs
    await until(() => !alive([first.pid, first.start_time]), "seven's exit");
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

// -- issue 29's acceptance from Node: fifty sessions over a restarted sidecar --------

// What /proc says of a pid, read without asking the sidecar: its name, state, parent
// and start time (clock ticks since boot, as proctable gives it); null when none runs.
function procStat(pid) {
  let s;
  try {
    s = fs.readFileSync(`/proc/${pid}/stat`, "latin1");
  } catch {
    return null;
  }
  const close = s.lastIndexOf(")");
  const f = s.slice(close + 2).split(" ");
  return { name: s.slice(s.indexOf("(") + 1, close), state: f[0], ppid: Number(f[1]),
    startTime: Number(f[19]) };
}

// [pid, start time] still runs as that process (a zombie has ended; a pid reused since
// is another process).
function alive([pid, startTime]) {
  const s = procStat(pid);
  return s !== null && s.startTime === startTime && s.state !== "Z" && s.state !== "X";
}

// Every live process carrying the marker of a session of the state directory whose id
// is stateId (each session's processes have PROCTABLE_SESSION=<id>:<name> in their
// environment, escapes included), as [pid, start time].
function markedBy(stateId) {
  const want = Buffer.from(`PROCTABLE_SESSION=${stateId}:`);
  const out = [];
  for (const name of fs.readdirSync("/proc")) {
    if (!/^\d+$/.test(name) || Number(name) === process.pid) continue;
    const s = procStat(name);
    if (s === null || s.state === "Z" || s.state === "X") continue;
    let env;
    try {
      env = fs.readFileSync(`/proc/${name}/environ`);
    } catch {
      continue;
    }
    const at = env.indexOf(want);
    if (at === 0 || (at > 0 && env[at - 1] === 0)) {
      const again = procStat(name);
      if (again !== null && again.startTime === s.startTime) out.push([Number(name), s.startTime]);
    }
  }
  return out;
}

// The records of the state directory, by key (what the Python test reads too: each
// names its session's keeper, guard and command as [pid, start time, handle]).
function records(state) {
  const out = new Map();
  const keys = path.join(state, "keys");
  for (const f of fs.readdirSync(keys)) {
    if (!f.endsWith(".json")) continue;
    const rec = JSON.parse(fs.readFileSync(path.join(keys, f), "utf8"));
    out.set(rec.key, rec);
  }
  return out;
}

const within = (promise, ms, what) => Promise.race([promise, new Promise((_, reject) => {
  setTimeout(() => reject(new Error(`not within ${ms} ms: ${what}`)), ms).unref();
})]);

// An async check, tried until it gives a value other than undefined (bounded).
async function eventually(check, what, ms = 60000) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await check();
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error(`not within ${ms} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

test("fifty sessions outlive a SIGKILLed sidecar: the next one adopts each, every line once, the exit 7 exact, the killed helper's session ended, close() leaves nothing", async () => {
  const t0 = Date.now();
  const WAIT = 60000; // the bound of each wait: room for a loaded machine, not a timing claim
  const COUNTED = "i=0; while :; do echo $i; i=$((i+1)); sleep 0.01; done"; // the Python test's
  const shells = Array.from({ length: 24 }, (_, i) => `shell${i}`);
  const pipes = Array.from({ length: 24 }, (_, i) => `pipe${i}`);
  const { sock, state, serve, clean, sevenArgs, go } = place();
  let pt = null;
  let closed = false;
  let passed = false;
  let stateId = null;
  const seenIds = new Map(); // "pid:start" -> [pid, start]: every member seen, every helper
  const keep = (pid, startTime) => seenIds.set(`${pid}:${startTime}`, [pid, startTime]);
  const keepHelpers = (recs) => {
    for (const r of recs.values()) {
      for (const role of ["keeper", "session", "command"]) {
        if (r.session && r.session[role]) keep(r.session[role][0], r.session[role][1]);
      }
    }
  };
  try {
    let side = serve();
    pt = await Sidecar.connect(sock, { timeout: WAIT, callTimeout: WAIT });
    assert.strictEqual((await pt.hello()).capabilities.durable, true);
    stateId = fs.readFileSync(path.join(state, "id"), "utf8").trim();
    let conn = 0; // 0: the first sidecar's connection, 1: the next one's
    const events = [];
    const outs = new Map(); // key -> [{offset, data, generation, dropped, conn}]
    const shown = new Map(); // a pty shell's output so far, as text
    const lost = [];
    pt.on("event", (ev) => events.push({ ...ev, conn }));
    pt.on("lost", (l) => lost.push(l));
    pt.on("output", (o) => {
      if (!outs.has(o.key)) outs.set(o.key, []);
      outs.get(o.key).push({ offset: o.offset, data: o.data, generation: o.generation,
        dropped: o.dropped, conn });
      if (o.key.startsWith("shell")) shown.set(o.key, (shown.get(o.key) || "") + o.data.toString("latin1"));
    });
    const of = (key, c) => events.filter((e) => e.key === key && (c === undefined || e.conn === c));

    // 24 pty shells, 24 pipes counting, and the victim.
    const env = { ...process.env, PS1: "$ " };
    const started = new Map();
    await Promise.all([
      ...shells.map((k) => pt.start(k, ["sh"], { pty: { rows: 24, cols: 80 }, env })
        .then((r) => started.set(k, r))),
      ...pipes.map((k) => pt.start(k, ["sh", "-c", COUNTED]).then((r) => started.set(k, r))),
      pt.start("victim", ["sh", "-c", "setsid sleep 361 & exec sleep 360"])
        .then((r) => started.set("victim", r)),
    ]);
    const tStarted = Date.now();
    await Promise.all(shells.map((k) => pt.write(k,
      "nohup sleep 350 >/dev/null 2>&1 & setsid sleep 351 & echo re$((1+1))dy\n")));
    await until(() => shells.every((k) => (shown.get(k) || "").includes("re2dy")) &&
      pipes.every((k) => (outs.get(k) || []).some((o) => o.data.length > 0)),
    "re2dy from every shell, output from every pipe", WAIT);
    const tReady = Date.now();

    // Each key's members now: a shell and its two jobs, the victim and its escape.
    const before = new Map(); // key -> members [pid, start]
    // Settled: n members, each running, and each but the key's own process a sleep by
    // now. A count alone passed on a passing state: an interactive shell's background
    // `setsid` leads its process group, so setsid forks the sleep and exits; the shell,
    // the nohup'd sleep and that setsid made 3 too, and the setsid was gone a moment
    // later ("member ... runs" failed, 2 runs of 4 on a quiet machine).
    const settle = (k, n) => eventually(async () => {
      const m = (await pt.members(k)).members.map((r) => [r.pid, r.start_time]);
      const root = started.get(k).pid;
      const settled = m.length === n && m.every(alive) &&
        m.every(([p]) => p === root || (procStat(p) || {}).name === "sleep");
      return settled ? m : undefined;
    }, `${n} members of ${k}`, WAIT);
    await Promise.all([...shells.map((k) => settle(k, 3).then((m) => before.set(k, m))),
      settle("victim", 2).then((m) => before.set("victim", m))]);
    for (const k of pipes) before.set(k, (await pt.members(k)).members.map((r) => [r.pid, r.start_time]));
    for (const m of before.values()) m.forEach(([p, s]) => keep(p, s));
    // The identities are the table's: each member runs as /proc tells it, and carries
    // its session's marker (so the checks of the end can fail).
    const markedNow = new Set(markedBy(stateId).map(([p, s]) => `${p}:${s}`));
    for (const k of [...shells, "victim"]) {
      for (const id of before.get(k)) {
        assert.ok(alive(id), `${k}: member ${id} runs`);
        assert.ok(markedNow.has(`${id[0]}:${id[1]}`), `${k}: member ${id} is marked`);
      }
    }

    // "seven" last, then SIGKILL; seven exits in the gap (go() after the kill).
    const seven = await pt.start("seven", sevenArgs);
    started.set("seven", seven);
    keep(seven.pid, seven.start_time);
    const pieces = new Map(pipes.map((k) => [k, [...outs.get(k)]])); // before the kill
    side.kill("SIGKILL");
    assert.strictEqual(await within(side.done, WAIT, "the sidecar's end"), "SIGKILL");
    const tKill = Date.now();
    assert.deepStrictEqual(of("seven").map((e) => e.kind), ["created"]);
    for (const k of pipes) {
      for (const o of pieces.get(k)) {
        assert.strictEqual(o.generation, 1);
        assert.strictEqual(o.dropped, 0, `${k}: dropped before the kill`);
      }
    }

    // While no sidecar runs: the victim's keeper is SIGKILLed (found as the Python test
    // finds it, by its record; checked to be the pt-keeper that is its command's parent).
    const recs = records(state);
    keepHelpers(recs);
    const [kpid, kstart] = recs.get("victim").session.keeper;
    const keeper = procStat(kpid);
    assert.ok(keeper && keeper.name === "pt-keeper" && keeper.startTime === kstart, JSON.stringify(keeper));
    assert.strictEqual(procStat(started.get("victim").pid).ppid, kpid);
    process.kill(kpid, "SIGKILL");
    go();
    await until(() => !before.get("victim").some(alive), "the victim's members gone", WAIT);
    const tVictim = Date.now();
    await until(() => !alive([seven.pid, seven.start_time]), "seven's exit", WAIT);

    // The next sidecar on the same directory; the client reconnects.
    conn = 1;
    const tServe = Date.now();
    side = serve();
    const hello = await pt.reconnect({ timeout: WAIT });
    const tBack = Date.now();
    const adoptedAt = () => Date.now() - tServe;
    const live = [...shells, ...pipes];
    await until(() => [...live, "seven"].every((k) => of(k, 1).some((e) => e.kind === "adopted")) &&
      of("victim", 1).some((e) => e.kind === "deleted") &&
      of("seven", 1).some((e) => e.kind === "exited"), "adopted x49, the victim's end, seven's exit", WAIT);
    const tAdopted = adoptedAt();
    for (const k of [...live, "seven"]) {
      const [first] = of(k, 1);
      assert.strictEqual(first.kind, "adopted", k);
      assert.strictEqual(first.generation, 1, k);
      assert.strictEqual(first.pid, started.get(k).pid, k);
      assert.strictEqual(first.start_time, started.get(k).start_time, k);
    }
    // The victim: never adopted; its end told once (killed), then deleted; nothing left.
    assert.deepStrictEqual(of("victim", 1).map((e) => [e.kind, e.generation, e.status]),
      [["exited", 1, "killed"], ["deleted", 1, undefined]]);
    assert.deepStrictEqual(before.get("victim").filter(alive), []);

    // Every numbered line once: the events before the kill, tail(since) and the events after.
    let replayed = 0;
    for (const k of pipes) {
      const have = pieces.get(k).map((o) => [o.offset, o.data]);
      const last = Math.max(...have.map(([o, d]) => o + d.length));
      let since = last;
      let end;
      do { // (tail gives at most its `bytes` at a time: on until the end it names)
        const r = await pt.tail(k, undefined, { since, generation: 1 });
        assert.strictEqual(r.generation, 1, k);
        assert.strictEqual(r.dropped, 0, `${k}: dropped from the ring`);
        assert.strictEqual(r.offset, since, k);
        have.push([r.offset, r.data]);
        since = r.offset + r.data.length;
        end = r.end;
        replayed += r.data.length;
      } while (since < end);
      await until(() => outs.get(k).some((o) => o.conn === 1 && o.offset + o.data.length > end),
        `${k}: output after the replay`, WAIT);
      for (const o of outs.get(k).filter((x) => x.conn === 1)) {
        assert.strictEqual(o.generation, 1, k);
        assert.strictEqual(o.dropped, 0, `${k}: dropped after`);
        have.push([o.offset, o.data]);
      }
      const all = numbers(stitch(have));
      assert.ok(all.length > 50, `${k}: ${all.length} lines`);
      all.forEach((n, i) => assert.strictEqual(n, i, `${k}: line ${i}`));
    }
    assert.ok(replayed > 0, "tail(since) gave what the pipes wrote in the gap");
    assert.deepStrictEqual(lost, []);

    // The exit 7, exact and once.
    const exits = of("seven").filter((e) => e.kind === "exited");
    assert.strictEqual(exits.length, 1);
    assert.strictEqual(exits[0].status, "exited");
    assert.strictEqual(exits[0].code, 7);
    assert.strictEqual(exits[0].exit.raw, 7 << 8);

    // The pty shells answer again, with the same members (their jobs kept).
    await Promise.all(shells.map((k) => pt.write(k, "echo al$((1+1))ve\n")));
    await until(() => shells.every((k) => outs.get(k).some((o) => o.conn === 1 &&
      o.data.toString("latin1").includes("al2ve"))), "al2ve from every shell", WAIT);
    const ids = (m) => m.map(([p, s]) => `${p}:${s}`).sort();
    for (const k of shells) {
      const m = (await pt.members(k)).members.map((r) => [r.pid, r.start_time]);
      assert.deepStrictEqual(ids(m), ids(before.get(k)), k);
    }
    for (const k of live) (await pt.members(k)).members.forEach((r) => keep(r.pid, r.start_time));
    assert.deepStrictEqual(hello.adoption_problems, []);
    for (const k of live) assert.ok(!of(k).some((e) => e.kind === "exited"), `${k} exited`);

    // close() ends every session: no member seen, no helper, nothing marked runs after.
    await pt.close({ callTimeout: WAIT });
    closed = true;
    assert.deepStrictEqual([...seenIds.values()].filter(alive), []);
    assert.deepStrictEqual(markedBy(stateId), []);
    passed = true;
    console.log(`# fifty sessions: started in ${tStarted - t0} ms, ready ${tReady - tStarted} ms ` +
      `later; SIGKILL ${tKill - tReady} ms after; ${seenIds.size} identities; the victim's end ${tVictim - tKill} ms ` +
      `after the kill; the new sidecar's hello ${tBack - tServe} ms, its events told ${tAdopted} ms ` +
      `after its start; ${replayed} bytes replayed; ${Date.now() - t0} ms in all`);
  } finally {
    try { // (the helpers the records name, before clean() removes the directory)
      keepHelpers(records(state));
    } catch {
      // no records (the directory was never made): nothing they could name runs
    }
    try {
      await clean(closed ? null : pt);
    } catch (err) {
      if (passed) throw err; // else the test's own failure is the one to tell
    } finally { // what a failure may have left: SIGKILL by pid, each checked by its start time
      const left = [...seenIds.values(), ...(stateId ? markedBy(stateId) : [])].filter(alive);
      for (const [pid, st] of left) {
        if (alive([pid, st])) process.kill(pid, "SIGKILL");
      }
    }
  }
});
