"use strict";
// The reference Node client of `proctable serve` (docs/serve.md): JSON-RPC 2.0,
// one object a line, over the sidecar's stdio or a Unix socket. No dependencies.

const { spawn } = require("node:child_process");
const { EventEmitter } = require("node:events");
const net = require("node:net");

/** The protocol version this client was written for (hello's `protocol`). */
const PROTOCOL = 1;

/** An error response from the sidecar: `code` (JSON-RPC), `name` (data.error), `data`. */
class ProctableError extends Error {
  constructor(method, error) {
    super(`${method}: ${error.message}`);
    this.code = error.code;
    this.data = error.data === undefined ? null : error.data;
    this.error = this.data && typeof this.data.error === "string" ? this.data.error : null;
    this.method = method;
  }
}

/**
 * One connection to a sidecar. Emits:
 * - "event" (params): a supervisor event (created, exited, restarting, gave_up,
 *   teardown_failed, deleted), in each key's order;
 * - "output" (params, with `data` a Buffer decoded from data_b64);
 * - "exit" (params): the end of a watch;
 * - "lost" (params): output this connection did not read in time and the sidecar dropped;
 * - "close" (): the stream ended; "error" (err): a stream error.
 */
class Sidecar extends EventEmitter {
  constructor(input, output, child) {
    super();
    this._input = input; // where we read the sidecar's lines
    this._output = output; // where we write requests
    this.child = child || null; // the sidecar process, when we spawned it
    this._nextId = 1;
    this._pending = new Map();
    this._buf = "";
    this._closed = false;
    this._watches = new Map();
    input.setEncoding("utf8");
    input.on("data", (chunk) => this._data(chunk));
    input.on("end", () => this._end(new Error("the sidecar closed the stream")));
    input.on("error", (err) => this._end(err));
    output.on("error", (err) => this._end(err));
  }

  /** Spawn `proctable serve` and speak to it on its stdio. */
  static spawn(options = {}) {
    const command = options.command || ["proctable", "serve"];
    const [file, ...args] = command;
    const child = spawn(file, [...args, ...(options.args || [])], {
      stdio: ["pipe", "pipe", options.stderr || "inherit"],
      env: options.env || process.env,
    });
    const sc = new Sidecar(child.stdout, child.stdin, child);
    child.on("error", (err) => sc._end(err));
    return sc;
  }

  /** Connect to `proctable serve --socket PATH`. */
  static connect(path) {
    return new Promise((resolve, reject) => {
      const sock = net.createConnection(path);
      sock.once("error", reject);
      sock.once("connect", () => {
        sock.removeListener("error", reject);
        resolve(new Sidecar(sock, sock, null));
      });
    });
  }

  _data(chunk) {
    this._buf += chunk;
    let nl;
    while ((nl = this._buf.indexOf("\n")) >= 0) {
      const line = this._buf.slice(0, nl);
      this._buf = this._buf.slice(nl + 1);
      if (line.trim()) this._message(JSON.parse(line));
    }
  }

  _message(msg) {
    if (msg.method !== undefined) {
      const p = msg.params || {};
      if (msg.method === "output") p.data = Buffer.from(p.data_b64 || "", "base64");
      if (msg.method === "exit" && this._watches.has(p.watch)) {
        this._watches.get(p.watch)(p);
        this._watches.delete(p.watch);
      }
      this.emit(msg.method, p);
      return;
    }
    const pending = this._pending.get(msg.id);
    if (!pending) {
      // an error that names no request (a line we sent that was no request)
      // (emitted only to a listener: an unhandled "error" event would end the process)
      if (msg.error && this.listenerCount("error")) {
        this.emit("error", new ProctableError("(no request)", msg.error));
      }
      return;
    }
    this._pending.delete(msg.id);
    if (msg.error) pending.reject(new ProctableError(pending.method, msg.error));
    else pending.resolve(msg.result);
  }

  _end(err) {
    if (this._closed) return;
    this._closed = true;
    for (const p of this._pending.values()) p.reject(err);
    this._pending.clear();
    for (const resolve of this._watches.values()) resolve(null);
    this._watches.clear();
    this.emit("close", err);
  }

  /** Send one request; a promise of its result (rejects with ProctableError). */
  call(method, params) {
    if (this._closed) return Promise.reject(new Error("the sidecar is gone"));
    const id = this._nextId++;
    const msg = { jsonrpc: "2.0", id, method };
    if (params !== undefined) msg.params = params;
    return new Promise((resolve, reject) => {
      this._pending.set(id, { resolve, reject, method });
      this._output.write(JSON.stringify(msg) + "\n");
    });
  }

  /** The protocol version and the host's capabilities; refuses a newer protocol. */
  async hello() {
    const r = await this.call("hello");
    if (r.protocol > PROTOCOL) {
      throw new Error(`proctable protocol v${r.protocol} is newer than this client (v${PROTOCOL})`);
    }
    return r;
  }

  /** Start args under key (replacing what runs there); {pid, start_time, generation}. */
  start(key, args, options = {}) {
    return this.call("start", { key, args, ...options });
  }

  /** Stop key and its whole lineage (escapes included); the root's exit. */
  stop(key, options = {}) {
    return this.call("stop", { key, ...options });
  }

  /** Stop key if it runs (exited), then delete it (deleted). */
  remove(key, options = {}) {
    return this.call("remove", { key, ...options });
  }

  /** Take over a process started earlier, with its lineage. */
  adopt(key, pid, startTime, options = {}) {
    return this.call("adopt", { key, pid, start_time: startTime, ...options });
  }

  /** Every key: state, generation, pid, start_time. */
  async list() {
    return (await this.call("list")).keys;
  }

  /** Write bytes to key's pty or stdin pipe ({eof: true} closes the input after). */
  write(key, data, options = {}) {
    const b = Buffer.isBuffer(data) ? data : Buffer.from(String(data));
    return this.call("write", { key, data_b64: b.toString("base64"), ...options });
  }

  resize(key, rows, cols) {
    return this.call("resize", { key, rows, cols });
  }

  /** Send a signal (a number or a name such as "SIGUSR1") to key's process. */
  signal(key, signal) {
    return this.call("signal", { key, signal });
  }

  /** The last bytes key wrote, as a Buffer. */
  async tail(key, bytes) {
    const r = await this.call("tail", bytes === undefined ? { key } : { key, bytes });
    return Buffer.from(r.data_b64, "base64");
  }

  /** The members and suspects of key's lineage now. */
  members(key) {
    return this.call("members", { key });
  }

  /** Rows of the process table ({pids, uids, name, kernel_threads} filters). */
  async ps(filters = {}) {
    return (await this.call("ps", filters)).procs;
  }

  /** What happened to (pid, start_time), read without reaping it. */
  probe(pid, startTime) {
    return this.call("probe", startTime === undefined ? { pid } : { pid, start_time: startTime });
  }

  /**
   * Watch (pid, start_time) until it ends: a promise of the `exit` notification's params
   * (also emitted as "exit"). Its exit is read without reaping it, whoever its parent is.
   */
  watch(pid, startTime) {
    const id = this._nextId; // the id call() is about to use
    const ended = new Promise((resolve) => this._watches.set(id, resolve));
    const params = startTime === undefined ? { pid } : { pid, start_time: startTime };
    return this.call("watch", params).then(
      () => ended,
      (err) => {
        this._watches.delete(id);
        throw err;
      },
    );
  }

  /** Stop every key side by side; later starts fail with `closed`. */
  close(options = {}) {
    return this.call("close", options);
  }

  /**
   * End the connection. For a spawned sidecar: close its stdin (it closes every key
   * and exits 0) and resolve with its exit code.
   */
  end() {
    if (this.child) {
      const child = this.child;
      return new Promise((resolve) => {
        if (child.exitCode !== null) return resolve(child.exitCode);
        child.once("exit", (code, sig) => resolve(code === null ? `signal ${sig}` : code));
        this._output.end();
      });
    }
    this._output.end();
    return Promise.resolve(null);
  }
}

module.exports = { Sidecar, ProctableError, PROTOCOL };
