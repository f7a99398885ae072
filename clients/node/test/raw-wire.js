"use strict";
// The sidecar's wire (docs/serve.md) spoken directly over stdio with no client module,
// as an outside reviewer's client did. Usage: node raw-wire.js CASE ; exits 0 when the docs hold, 1 when not.
// PROCTABLE_PYTHON names the Python whose `-m proctable serve` is the sidecar.
const { spawn } = require("node:child_process");

function sidecar() {
  const py = process.env.PROCTABLE_PYTHON || "python3";
  const side = spawn(py, ["-m", "proctable", "serve"], { stdio: ["pipe", "pipe", "inherit"] });
  const msgs = [];
  let waiters = [];
  let buf = "";
  side.stdout.setEncoding("utf8");
  side.stdout.on("data", (d) => {
    buf += d;
    let i;
    while ((i = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, i);
      buf = buf.slice(i + 1);
      msgs.push(JSON.parse(line));
      for (const w of waiters.slice()) w();
    }
  });
  const exited = new Promise((r) => side.on("exit", (code, sig) => r([code, sig])));
  const until = (pred, ms = 20000) => new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error("no message in time")), ms);
    const chk = () => {
      const m = msgs.find(pred);
      if (m) { clearTimeout(t); waiters = waiters.filter((w) => w !== chk); resolve(m); }
    };
    waiters.push(chk);
    chk();
  });
  const write = (obj) => side.stdin.write(JSON.stringify(obj) + "\n");
  const call = async (id, method, params) => {
    write({ jsonrpc: "2.0", id, method, params });
    return until((m) => m.id === id && !m.method);
  };
  const end = async () => { side.stdin.end(); return exited; };
  return { side, msgs, until, write, call, end };
}

const cases = {
  // docs/serve.md, Framing: "A request without `id` is a notification: it is carried
  // out and never answered." (JSON-RPC 2.0 says the same, errors included.)
  async notifications_never_answered() {
    const s = sidecar();
    await s.call(1, "hello");
    const n0 = s.msgs.length;
    s.write({ jsonrpc: "2.0", method: "no_such_method" });
    s.write({ jsonrpc: "2.0", method: "start", params: { key: "n", args: "not a list" } });
    s.write({ jsonrpc: "2.0", method: "stop", params: { key: "never-started" } });
    await s.call(2, "hello"); // requests about no key: read in order; give the others time too
    await new Promise((r) => setTimeout(r, 300));
    const answered = s.msgs.slice(n0).filter((m) => m.id !== 2);
    const [code] = await s.end();
    if (code !== 0) return `sidecar exited ${code}`;
    if (answered.length) return "notifications were answered: " + JSON.stringify(answered);
    return null;
  },
  // docs/serve.md, Errors: -32003 `command_not_found` is "the command does not exist";
  // -32004 `spawn_failed` is "it exists but could not start". A missing cwd is the latter.
  async missing_cwd_is_not_command_not_found() {
    const s = sidecar();
    const r = await s.call(1, "start", { key: "c", args: ["sh", "-c", "exit 0"],
                                         cwd: "/nonexistent-dir-of-the-review" });
    const [code] = await s.end();
    if (code !== 0) return `sidecar exited ${code}`;
    if (!r.error) return "a start in a missing cwd succeeded: " + JSON.stringify(r);
    if (r.error.data && r.error.data.error === "command_not_found") {
      return "`sh` exists, yet the answer says the command does not: " + JSON.stringify(r.error);
    }
    return null;
  },
};

(async () => {
  const name = process.argv[2];
  if (!cases[name]) { console.error("cases: " + Object.keys(cases).join(" ")); process.exit(2); }
  const why = await cases[name]();
  if (why) { console.log("FAIL " + name + ": " + why); process.exit(1); }
  console.log("ok " + name);
})().catch((e) => { console.log("ERROR " + e.stack); process.exit(2); });
