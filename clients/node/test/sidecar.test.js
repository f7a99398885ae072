"use strict";
// The sidecar from Node, through the documented protocol only (docs/serve.md).
const assert = require("node:assert");
const { test } = require("node:test");
const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");
const { spawn } = require("node:child_process");
const { Sidecar, ProctableError, PROTOCOL } = require("..");

const gone = (probe) => !["running", "stopped"].includes(probe.state);

test("hello names the protocol and the host's capabilities", async () => {
  const pt = Sidecar.spawn();
  const h = await pt.hello();
  assert.strictEqual(h.protocol, PROTOCOL);
  for (const k of ["pidfds", "bpf", "cgroup", "subreaper", "connector"]) {
    assert.strictEqual(typeof h.capabilities[k], "boolean", k);
  }
  for (const m of ["start", "stop", "remove", "adopt", "list", "write", "resize", "signal",
                   "tail", "members", "ps", "probe", "watch", "close"]) {
    assert.ok(h.methods.includes(m), m);
  }
  assert.strictEqual(await pt.end(), 0);
});

test("errors carry their code and name", async () => {
  const pt = Sidecar.spawn();
  await assert.rejects(pt.call("frobnicate"), (e) => e instanceof ProctableError && e.code === -32601);
  await assert.rejects(pt.call("stop", { key: 3 }), (e) => e.code === -32602);
  await assert.rejects(pt.stop("nope"), (e) => e.code === -32001 && e.error === "no_such_key");
  await assert.rejects(pt.start("x", ["/no/such/thing"]),
    (e) => e.code === -32003 && e.error === "command_not_found");
  await pt.close();
  await assert.rejects(pt.start("x", ["true"]), (e) => e.code === -32005 && e.error === "closed");
  assert.strictEqual(await pt.end(), 0);
});

test("stdin's end closes every key, escapes included, and the sidecar exits 0", async () => {
  const pt = Sidecar.spawn();
  await pt.start("a", ["sh", "-c", "setsid sleep 300 & exec sleep 300"]);
  let members = [];
  while (members.length < 2) members = (await pt.members("a")).members;
  const code = await pt.end();
  assert.strictEqual(code, 0);
  const check = Sidecar.spawn();
  for (const m of members) assert.ok(gone(await check.probe(m.pid, m.start_time)), String(m.pid));
  await check.end();
});

test("socket clients share keys and events; a start answers after its created", async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "pt-node-"));
  const sock = path.join(dir, "s.sock");
  const server = spawn("proctable", ["serve", "--socket", sock], { stdio: ["ignore", "ignore", "inherit"] });
  try {
    for (let i = 0; i < 300 && !fs.existsSync(sock); i++) await new Promise((r) => setTimeout(r, 20));
    assert.strictEqual(fs.statSync(sock).mode & 0o777, 0o600);
    const a = await Sidecar.connect(sock);
    const b = await Sidecar.connect(sock);
    const seenA = [];
    const seenB = [];
    a.on("event", (ev) => seenA.push(ev.kind));
    b.on("event", (ev) => seenB.push(ev.kind));
    const r = await a.start("shared", ["sleep", "300"]);
    assert.deepStrictEqual(seenA, ["created"]);          // before the response
    const [row] = await b.list();
    assert.strictEqual(row.pid, r.pid);
    await b.stop("shared");
    assert.deepStrictEqual(seenB, ["created", "exited"]);
    await a.call("hello");
    assert.deepStrictEqual(seenA, ["created", "exited"]);
    await a.end();
    await b.end();
  } finally {
    const ended = new Promise((resolve) => server.once("exit", (code) => resolve(code)));
    server.kill("SIGTERM");
    assert.strictEqual(await ended, 0);
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("run --events to Node's extra stdio (a socketpair): /dev/fd/3 and --events-fd 3", async () => {
  for (const opt of [["--events", "/dev/fd/3"], ["--events-fd", "3"]]) {
    const child = spawn("proctable", ["run", ...opt, "--", "sh", "-c", "echo hi; exit 5"],
      { stdio: ["ignore", "pipe", "inherit", "pipe"] });
    let events = "";
    let out = "";
    child.stdio[3].setEncoding("utf8");
    child.stdio[3].on("data", (d) => { events += d; });
    child.stdout.on("data", (d) => { out += d; });
    const code = await new Promise((resolve) => child.on("close", (c) => resolve(c)));
    const types = events.trim().split("\n").map((l) => JSON.parse(l));
    assert.deepStrictEqual(types.map((o) => o.type), ["started", "exited", "teardown", "end"]);
    assert.strictEqual(types[3].exit_code, 5);
    assert.strictEqual(code, 5);
    assert.strictEqual(out, "hi\n");
  }
});

test("output, a stdin pipe and a pty, where the sidecar has the output engine", async (t) => {
  const pt = Sidecar.spawn();
  const h = await pt.hello();
  if (!h.capabilities.output) {
    await pt.end();
    t.skip("this proctable has no output engine");
    return;
  }
  const out = new Map();
  pt.on("output", (o) => out.set(o.key, Buffer.concat([out.get(o.key) || Buffer.alloc(0), o.data])));
  const exited = (key) => new Promise((resolve) =>
    pt.on("event", (ev) => ev.key === key && ev.kind === "exited" && resolve(ev)));

  const catDone = exited("cat");
  await pt.start("cat", ["cat"], { stdin: "pipe" });
  await pt.write("cat", Buffer.from([0, 255, 10]), { eof: true });
  assert.strictEqual((await catDone).code, 0);
  assert.deepStrictEqual(out.get("cat"), Buffer.from([0, 255, 10]));

  const ttyDone = exited("tty");
  await pt.start("tty", ["sh", "-c", "read x; stty size; echo got:$x"], { pty: { rows: 24, cols: 80 } });
  await pt.resize("tty", 30, 100);
  await pt.write("tty", "yes\n");
  await ttyDone;
  const text = out.get("tty").toString();
  assert.match(text, /30 100/);
  assert.match(text, /got:yes/);
  assert.match((await pt.tail("tty")).toString(), /got:yes/);
  assert.strictEqual(await pt.end(), 0);
});

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

test("a sidecar whose stderr is a pipe nobody reads answers every bad pid", async () => {
  // Issue 30, item 6: probe/watch of a pid above pid_t's range were internal errors
  // with a traceback on stderr, and with stderr a pipe nobody drains the sidecar
  // stopped answering after a few of them. Bad params are -32602; logging never blocks.
  const pt = Sidecar.spawn({ stderr: "pipe" });   // and never read
  const kill = () => pt.child.kill("SIGKILL");
  try {
    for (let i = 0; i < 300; i++) {
      const method = i % 2 ? "probe" : "watch";
      await within(assert.rejects(pt.call(method, { pid: 2 ** 31 + i }),
        (e) => e instanceof ProctableError && e.code === -32602 && e.data.param === "pid"),
      30000, `${method} ${i}`, kill);
    }
    assert.strictEqual((await within(pt.hello(), 30000, "hello", kill)).protocol, PROTOCOL);
    assert.strictEqual(await within(pt.end(), 60000, "end", kill), 0);
  } finally {
    if (pt.child.exitCode === null && pt.child.signalCode === null) kill();
  }
});
