"use strict";
// The client itself: large writes, errors and their names, timeouts, bad lines, a
// refused peer, every field of ps, the fresh request. Against a real sidecar.
const assert = require("node:assert");
const { test } = require("node:test");
const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");
const { spawn } = require("node:child_process");
const { Sidecar, ProctableError } = require("..");

// A promise that rejects after ms (and runs onTimeout first): a hang fails the test at once.
function within(promise, ms, what, onTimeout) {
  let timer;
  const late = new Promise((resolve, reject) => {
    timer = setTimeout(() => {
      if (onTimeout) onTimeout();
      reject(new Error(`${what}: no answer within ${ms} ms`));
    }, ms);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

// Every call bounded (a minute), so that a hang fails with the name of the call.
function sidecar(options) {
  const pt = Sidecar.spawn({ callTimeout: 60000, ...options });
  pt.kill = () => pt.child.kill("SIGKILL");
  return pt;
}

async function done(pt) {
  assert.strictEqual(await within(pt.end(), 60000, "end", pt.kill), 0);
}

test("a write larger than one line is split into lines that fit, and settles", async () => {
  // Issue 30, item 7: write() of 900 KiB made one line over 1 MiB; the sidecar answered
  // line_too_long with id null and the promise never settled.
  const pt = sidecar();
  const out = [];
  pt.on("output", (o) => o.key === "cat" && out.push(o.data));
  const exited = new Promise((resolve) => pt.on("event", (ev) => ev.key === "cat" && ev.kind === "exited" && resolve(ev)));
  await pt.start("cat", ["cat"], { stdin: "pipe" });
  const data = Buffer.alloc(900 << 10);
  for (let i = 0; i < data.length; i++) data[i] = i % 251;
  const r = await within(pt.write("cat", data, { eof: true }), 60000, "write", pt.kill);
  assert.deepStrictEqual(r, { written: data.length });
  assert.strictEqual((await within(exited, 60000, "exited", pt.kill)).code, 0);
  assert.ok(Buffer.concat(out).equals(data), "every byte, in order");
  await done(pt);
});

test("a line too long is refused: at once when the limit is known, else by the sidecar's id-null answer", async () => {
  // Issue 30, item 7: an id-null error answers the oldest line sent over the limit it names.
  const pt = sidecar();
  await pt.hello();
  const big = { key: "k", data_b64: "A".repeat(2 << 20) };
  await within(assert.rejects(pt.call("write", big), (e) => e instanceof ProctableError &&
    e.error === "line_too_long" && e.data.limit === 1 << 20), 30000, "write", pt.kill);
  pt.maxLine = 8 << 20;                      // a client that believes a larger limit
  const answers = [pt.call("hello"), pt.call("write", big), pt.call("list")];
  const [hello, write, list] = await within(Promise.allSettled(answers), 60000, "calls", pt.kill);
  assert.strictEqual(hello.status, "fulfilled");
  assert.strictEqual(write.status, "rejected");
  assert.strictEqual(write.reason.error, "line_too_long");
  assert.strictEqual(write.reason.code, -32600);
  assert.strictEqual(write.reason.method, "write");
  assert.strictEqual(list.status, "fulfilled");
  assert.strictEqual(pt.maxLine, 1 << 20, "the limit it named is learned");
  await done(pt);
});

test("every error has a name", async () => {
  // Issue 30, item 7: resize(-1, 80) rejected with e.error === null.
  const pt = sidecar();
  await assert.rejects(pt.resize("k", -1, 80), (e) => e instanceof ProctableError &&
    e.code === -32602 && e.error === "invalid_params" && e.data.param === "rows");
  await assert.rejects(pt.call("frobnicate"), (e) => e.error === "method_not_found");
  await assert.rejects(pt.stop("nope"), (e) => e.error === "no_such_key");
  await done(pt);
  await assert.rejects(pt.hello(), (e) => e instanceof ProctableError && e.error === "disconnected" &&
    e.code === null);
});

test("a line from the sidecar that is not JSON is an error event, not a crash", async () => {
  // Issue 30, item 7: each line was JSON.parse'd without a guard.
  const fake = ["sh", "-c", "echo 'not json'; echo '[1]'; " +
    "echo '{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"protocol\":1,\"max_line\":1048576}}'; cat >/dev/null"];
  const pt = sidecar({ command: fake });
  const errors = [];
  pt.on("error", (e) => errors.push(e));
  const h = await within(pt.hello(), 30000, "hello", pt.kill);
  assert.strictEqual(h.protocol, 1);
  assert.deepStrictEqual(errors.map((e) => [e.error, e.data.line]), [["bad_line", "not json"], ["bad_line", "[1]"]]);
  await done(pt);
});

test("a call times out with a named error, and its late answer is ignored", async () => {
  // Issue 31, item 6: per-call timeouts (an option per call, and a default). The calls
  // here cannot be answered before the test lets them: no race with the clock.
  const pt = sidecar({ callTimeout: 60000 });
  const errors = [];
  pt.on("error", (e) => errors.push(e));
  const exited = new Promise((resolve) => pt.on("event", (ev) => ev.key === "deaf" && ev.kind === "exited" && resolve(ev)));
  await pt.start("deaf", ["sh", "-c", "trap '' TERM; exec sleep 300"]);
  await within(assert.rejects(pt.stop("deaf", { grace: 300, callTimeout: 200 }), (e) =>
    e instanceof ProctableError && e.error === "timeout" && e.code === null && e.method === "stop" &&
    e.data.timeout === 200), 30000, "stop", pt.kill);
  await pt.signal("deaf", "SIGKILL");               // now the stop ends, and is answered late
  assert.strictEqual((await within(exited, 60000, "exited", pt.kill)).status, "killed");
  await pt.members("deaf");                          // answered after the stop (one key's order)
  assert.deepStrictEqual(errors, [], "the late answer is dropped, not reported");
  // The default, for every call: a watch of a process that runs on.
  const quick = sidecar({ callTimeout: 200 });
  const sleeper = spawn("sleep", ["300"]);
  try {
    const [row] = await quick.ps({ pids: [sleeper.pid] }, { callTimeout: 60000 });
    await within(assert.rejects(quick.watch(sleeper.pid, row.start_time), (e) => e.error === "timeout" &&
      e.method === "watch"), 30000, "watch", quick.kill);
  } finally {
    sleeper.kill("SIGKILL");
  }
  const exit = await within(new Promise((resolve) => quick.once("exit", resolve)), 30000, "exit", quick.kill);
  assert.strictEqual(exit.pid, sleeper.pid);         // still told as an event
  await done(quick);
  await done(pt);
});

test("ps keeps every field: the rows, and the processes it could not read", async () => {
  // Issue 31, item 6: `denied` was dropped.
  const pt = sidecar();
  const rows = await pt.ps({ pids: [process.pid] });
  assert.strictEqual(rows.length, 1);
  assert.strictEqual(rows[0].pid, process.pid);
  assert.ok(Array.isArray(rows.denied), "rows.denied");
  const raw = await pt.call("ps", { pids: [process.pid] });
  assert.deepStrictEqual(rows.denied, raw.denied);
  await done(pt);
});

test("45 clean exits give 45 distinct fresh ids", async () => {
  // Issue 31, item 3 (the double-Ctrl-C seed): restart.fresh_args was one fixed list;
  // over 45 fresh reruns a client saw 1 distinct id. Now the sidecar asks the client.
  const pt = sidecar();
  const ids = [];
  pt.on("output", (o) => o.key === "session" && ids.push(...o.data.toString().split("\n").filter(Boolean)));
  let n = 0;
  const asked = [];
  pt.onFresh((key, info) => {
    asked.push([key, info.generation]);
    n += 1;
    return n <= 45 ? ["sh", "-c", `echo conversation-${n}; exit 0`] : null;
  });
  const gaveUp = new Promise((resolve) => pt.on("event", (ev) => ev.key === "session" && ev.kind === "gave_up" && resolve(ev)));
  await pt.start("session", ["sh", "-c", "echo conversation-0; exit 0"],
    { restart: { fresh: "ask", fast_exit: 0 } });
  await within(gaveUp, 120000, "gave_up", pt.kill);
  const fresh = ids.filter((id) => id !== "conversation-0");
  assert.strictEqual(fresh.length, 45);
  assert.strictEqual(new Set(fresh).size, 45);
  assert.deepStrictEqual(asked.map(([, g]) => g), Array.from({ length: 46 }, (_, i) => i + 1));
  // A handler given with the start answers for that key alone; it may be async.
  const seen = [];
  pt.on("output", (o) => o.key === "own" && seen.push(o.data.toString().trim()));
  const ownDone = new Promise((resolve) => pt.on("event", (ev) => ev.key === "own" && ev.kind === "gave_up" && resolve(ev)));
  let m = 0;
  await pt.start("own", ["sh", "-c", "echo a; exit 0"], { restart: { fast_exit: 0, fresh: async (key, info) => {
    m += 1;
    return m === 1 ? ["sh", "-c", `echo ${key}-${info.generation}; exit 0`] : null;
  } } });
  await within(ownDone, 60000, "own gave_up", pt.kill);
  assert.deepStrictEqual(seen, ["a", "own-1"]);
  await done(pt);
});

test("terminate ends a process under no key; list says when a key last got input", async () => {
  // Issue 31, items 4 and 5.
  const pt = sidecar();
  const child = spawn("sleep", ["300"]);
  try {
    const [row] = await pt.ps({ pids: [child.pid] });
    const end = await pt.terminate(child.pid, row.start_time, { grace: 5 });
    assert.strictEqual(end.outcome, "exited");
    assert.strictEqual(end.signal, 15);
    await assert.rejects(pt.terminate(child.pid, row.start_time + 1), (e) => e.error === "no_such_process");
  } finally {
    child.kill("SIGKILL");  // (ended already, when the test holds: Node's handle knows)
  }
  await pt.start("cat", ["cat"], { stdin: "pipe" });
  assert.strictEqual((await pt.list())[0].last_input, null);
  await pt.write("cat", "\x03");
  const [cat] = await pt.list();
  assert.deepStrictEqual(cat.last_input.data, Buffer.from("\x03"));
  assert.ok(Math.abs(cat.last_input.time - Date.now() / 1000) < 60);
  await done(pt);
});

test("a socket peer of another uid is told forbidden, not EPIPE", { skip: process.getuid() !== 0 && "needs root to become another uid" }, async () => {
  // Issue 30, item 7: a connection refused as forbidden showed only `write EPIPE`.
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "pt-node-"));
  const sock = path.join(dir, "s.sock");
  const server = spawn("proctable", ["serve", "--socket", sock], { stdio: ["ignore", "ignore", "inherit"] });
  try {
    for (let i = 0; i < 500 && !fs.existsSync(sock); i++) await new Promise((r) => setTimeout(r, 20));
    fs.chmodSync(dir, 0o755);
    fs.chmodSync(sock, 0o666);                    // opened up by hand: SO_PEERCRED still refuses
    // The other uid loads a copy of the client from here: the checkout may sit where
    // it cannot look (a 0700 home or temp directory: a fresh clone under mktemp -d
    // failed with MODULE_NOT_FOUND).
    const client = path.join(dir, "client");
    fs.mkdirSync(client, { mode: 0o755 });
    for (const f of ["index.js", "package.json"]) {
      fs.copyFileSync(path.resolve(__dirname, "..", f), path.join(client, f));
      fs.chmodSync(path.join(client, f), 0o644);
    }
    const script = `
      const { Sidecar } = require(${JSON.stringify(client)});
      (async () => {
        const pt = await Sidecar.connect(${JSON.stringify(sock)});
        const closed = new Promise((resolve) => pt.on("close", resolve));
        const why = await pt.hello().then(() => "answered", (e) => e.error + " " + e.code);
        const c = await closed;
        console.log(JSON.stringify({ why, close: c.error, later: await pt.list().catch((e) => e.error) }));
      })();`;
    const other = spawn(process.execPath, ["-e", script], { uid: 65534, gid: 65534, stdio: ["ignore", "pipe", "inherit"] });
    let out = "";
    other.stdout.on("data", (d) => { out += d; });
    const code = await within(new Promise((resolve) => other.on("exit", resolve)), 30000, "other uid",
      () => other.kill("SIGKILL"));
    assert.strictEqual(code, 0);
    assert.deepStrictEqual(JSON.parse(out), { why: "forbidden -32008", close: "forbidden", later: "forbidden" });
    const mine = await Sidecar.connect(sock, { callTimeout: 60000 }); // its own user is still served
    assert.strictEqual((await mine.hello()).protocol, 1);
    await mine.end();
  } finally {
    const ended = new Promise((resolve) => server.once("exit", (c) => resolve(c)));
    server.kill("SIGTERM");
    assert.strictEqual(await within(ended, 60000, "the sidecar's exit", () => server.kill("SIGKILL")), 0);
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
