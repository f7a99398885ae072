"use strict";
// reconnect() and its bounds when the sidecar misbehaves: what a program that relies
// on the documented timeouts finds (each case says what broke and how it was found).
const assert = require("node:assert");
const { test } = require("node:test");
const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");
const { spawn } = require("node:child_process");
const { Sidecar } = require("..");

// Found by SIGSTOPping a socket sidecar (a restarting one that hangs, a frozen
// cgroup) and calling reconnect({timeout: 1000}): the socket still accepts (the
// kernel's listen queue), so the connect succeeded and the hello after it waited
// for ever; the promise never settled, whatever the timeout said. The timeout now
// bounds the hello too (`timeout` when it does not come in time).
test("reconnect's timeout bounds its hello too: a sidecar that accepts and never answers", async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "pt-review-"));
  const sock = path.join(dir, "s.sock");
  const side = spawn("proctable", ["serve", "--socket", sock], { stdio: ["ignore", "ignore", "inherit"] });
  const done = new Promise((resolve) => side.once("exit", resolve));
  let pt = null;
  try {
    pt = await Sidecar.connect(sock, { timeout: 30000 });
    await pt.hello();
    side.kill("SIGSTOP");
    let guard;
    const never = new Promise((resolve) => { guard = setTimeout(() => resolve("never settled"), 20000); });
    const got = await Promise.race([pt.reconnect({ timeout: 1000 }).then(() => "resolved", (e) => e), never]);
    clearTimeout(guard);
    assert.ok(got instanceof Error, `reconnect: ${got}`);
    assert.strictEqual(got.error, "timeout");
  } finally {
    if (pt) pt._conn.destroy();
    side.kill("SIGKILL");
    side.kill("SIGCONT");
    await done;
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
