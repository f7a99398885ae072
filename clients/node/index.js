"use strict";
// The reference Node client of `proctable serve` (docs/serve.md): JSON-RPC 2.0,
// one object a line, over the sidecar's stdio or a Unix socket. No dependencies.

const { spawn } = require("node:child_process");
const { EventEmitter } = require("node:events");
const net = require("node:net");

/** The protocol version this client was written for (hello's `protocol`). */
const PROTOCOL = 1;

/** The longest request line, in bytes, until hello says (docs/serve.md: 1 MiB). */
const MAX_LINE = 1 << 20;

/** The names of JSON-RPC's standard codes (a sidecar before 0.2 sent no data.error). */
const STANDARD_ERRORS = {
  "-32700": "parse_error",
  "-32600": "invalid_request",
  "-32601": "method_not_found",
  "-32602": "invalid_params",
  "-32603": "internal_error",
};

/**
 * Every rejection of this client: `error` names it (data.error of the sidecar's error
 * response, or one of this client's own: `disconnected`, `timeout`, `line_too_long`,
 * `bad_line`, `unsupported_protocol`), `code` is the JSON-RPC code (null for the
 * client's own), `data` what the sidecar said more, `method` the call.
 */
class ProctableError extends Error {
  constructor(method, error, cause) {
    super(`${method}: ${error.message}`, cause === undefined ? undefined : { cause });
    this.name = "ProctableError";
    this.code = typeof error.code === "number" ? error.code : null;
    this.data = error.data === undefined ? null : error.data;
    const named = this.data && typeof this.data.error === "string" ? this.data.error : null;
    this.error = named || STANDARD_ERRORS[String(this.code)] || null;
    this.method = method;
  }
}

function ownError(method, name, message, data = {}, cause = undefined) {
  return new ProctableError(method, { code: null, message, data: { error: name, ...data } }, cause);
}

// Options of a call that are this client's, not the sidecar's.
function split(options = {}) {
  const { callTimeout, ...wire } = options;
  return [wire, { callTimeout }];
}

/**
 * One connection: the streams, the line framing, and every call waiting for its
 * answer. A Sidecar has one at a time (a reconnect is a new Connection); what
 * outlives a connection (handlers, the line limit) is the Sidecar's.
 */
class Connection {
  constructor(sidecar, input, output) {
    this.sidecar = sidecar;
    this.input = input; // where we read the sidecar's lines
    this.output = output; // where we write requests
    this.pending = new Map(); // id -> {method, size, resolve, reject, timer, watch}
    this.late = new Set(); // ids of calls that timed out: their answers are ignored
    this.parts = []; // the start of a line, in Buffers
    this.frame = null; // a binary output frame whose bytes are still coming
    this.ended = null; // the error every call gets once the connection ended
    this.fatal = null; // what the sidecar said before it cut us off (forbidden)
    input.on("data", (chunk) => this._data(chunk));
    input.on("end", () => this._end(null));
    input.on("error", (err) => this._end(err));
    if (output !== input) output.on("error", (err) => this._end(err));
  }

  /** Send one request; {id, promise}. */
  request(method, params, { callTimeout, watch = false } = {}) {
    const id = this.sidecar._nextId++;
    if (this.ended) return { id, promise: Promise.reject(this._gone(method)) };
    const msg = { jsonrpc: "2.0", id, method };
    if (params !== undefined) msg.params = params;
    const line = JSON.stringify(msg);
    const size = Buffer.byteLength(line);
    if (size > this.sidecar.maxLine) {
      const err = ownError(method, "line_too_long", `the request is ${size} bytes, over the ` +
        `sidecar's line limit of ${this.sidecar.maxLine}: never sent`,
        { limit: this.sidecar.maxLine, size });
      return { id, promise: Promise.reject(err) };
    }
    const promise = new Promise((resolve, reject) => {
      const p = { method, size, resolve, reject, timer: null, watch, answered: false };
      const ms = callTimeout === undefined ? this.sidecar.callTimeout : callTimeout;
      if (ms) {
        p.timer = setTimeout(() => {
          this.pending.delete(id);
          this.late.add(id);
          reject(ownError(method, "timeout", `no answer within ${ms} ms (a late one is ignored)`,
            { timeout: ms }));
        }, ms);
      }
      this.pending.set(id, p);
      this._write(line);
    });
    return { id, promise };
  }

  /** A response to a request of the sidecar's (fresh). */
  respond(id, body) {
    if (!this.ended) this._write(JSON.stringify({ jsonrpc: "2.0", id, ...body }));
  }

  _write(line) {
    try {
      this.output.write(line + "\n");
    } catch (err) {
      this._end(err);
    }
  }

  _gone(method) {
    if (this.fatal) return new ProctableError(method, this.fatal);
    return ownError(method, "disconnected", "the connection to the sidecar ended",
      {}, this.ended instanceof Error ? this.ended : undefined);
  }

  // Lines, and the raw bytes of binary output frames (docs/serve.md, "Binary
  // output"): a frame's line says its size, and that many bytes follow it.
  _data(chunk) {
    let at = 0;
    while (at < chunk.length) {
      const f = this.frame;
      if (f) {
        const take = Math.min(f.size - f.got, chunk.length - at);
        f.parts.push(chunk.subarray(at, at + take));
        f.got += take;
        at += take;
        if (f.got === f.size) this._frameDone();
        continue;
      }
      const nl = chunk.indexOf(10, at);
      if (nl < 0) {
        this.parts.push(chunk.subarray(at));
        break;
      }
      let line;
      if (this.parts.length) {
        this.parts.push(chunk.subarray(at, nl));
        line = Buffer.concat(this.parts).toString("utf8");
        this.parts = [];
      } else {
        line = chunk.toString("utf8", at, nl);
      }
      at = nl + 1;
      if (line.trim()) this._line(line);
    }
  }

  _frameDone() {
    const f = this.frame;
    this.frame = null;
    f.params.data = f.parts.length === 1 ? f.parts[0] : Buffer.concat(f.parts, f.size);
    this.sidecar._notification("output", f.params);
  }

  _line(line) {
    let msg;
    try {
      msg = JSON.parse(line);
    } catch (err) {
      this._complain(ownError("(read)", "bad_line", `a line from the sidecar is not JSON: ${err.message}`,
        { line: line.slice(0, 200) }));
      return;
    }
    if (msg === null || typeof msg !== "object" || Array.isArray(msg)) {
      this._complain(ownError("(read)", "bad_line", "a line from the sidecar is not a JSON object",
        { line: line.slice(0, 200) }));
      return;
    }
    if (typeof msg.method === "string") {
      const p = msg.params;
      if (msg.method === "output" && p && typeof p.size === "number" && p.data_b64 === undefined) {
        this.frame = { params: p, size: p.size, got: 0, parts: [] }; // its bytes follow
        if (p.size === 0) this._frameDone();
        return;
      }
      if (msg.id !== undefined) this.sidecar._serverRequest(this, msg);
      else this.sidecar._notification(msg.method, msg.params || {});
      return;
    }
    if (msg.id === null || msg.id === undefined) {
      this._unaddressed(msg.error || { code: null, message: "a response without an id" });
      return;
    }
    const p = this.pending.get(msg.id);
    if (!p) {
      if (this.late.delete(msg.id)) return; // the call timed out: its answer is ignored
      if (msg.error) this._complain(new ProctableError("(no request)", msg.error));
      return;
    }
    if (msg.error) {
      this._settle(msg.id, p);
      p.reject(new ProctableError(p.method, msg.error));
    } else if (p.watch) {
      p.answered = true; // a watch settles with its exit notification
    } else {
      this._settle(msg.id, p);
      p.resolve(msg.result);
    }
  }

  _settle(id, p) {
    this.pending.delete(id);
    if (p.timer) clearTimeout(p.timer);
  }

  /** The end of a watch (the exit notification of the request id). */
  watchEnded(id, params) {
    const p = this.pending.get(id);
    if (p && p.watch) {
      this._settle(id, p);
      p.resolve(params);
    }
  }

  // An error response with id null: the sidecar could not read one of our lines as a
  // request. Ours are JSON it can parse, so it is a line over its limit (the oldest
  // one sent that was larger than the limit it gives: it reads lines in order), or
  // the refusal of a socket peer (forbidden), which ends the connection.
  _unaddressed(error) {
    const name = error.data && error.data.error;
    if (name === "forbidden") {
      this.fatal = error;
      this._end(null);
      this.output.end();
      return;
    }
    if (name === "line_too_long") {
      const limit = typeof error.data.limit === "number" ? error.data.limit : null;
      if (limit !== null) this.sidecar.maxLine = Math.min(this.sidecar.maxLine, limit);
      for (const [id, p] of this.pending) {
        if (limit === null || p.size > limit) {
          this._settle(id, p);
          p.reject(new ProctableError(p.method, error));
          return;
        }
      }
    }
    this._complain(new ProctableError("(no request)", error));
  }

  // "error" is emitted only to a listener: unheard, EventEmitter would throw it
  // and end the program for what is only a report.
  _complain(err) {
    if (this.sidecar.listenerCount("error")) this.sidecar.emit("error", err);
  }

  _end(err) {
    if (this.ended) return;
    this.ended = err || new Error("the sidecar closed the stream");
    for (const [id, p] of this.pending) {
      this._settle(id, p);
      if (p.watch && p.answered && !this.fatal) p.resolve(null); // documented: null
      else p.reject(this._gone(p.method));
    }
    this.late.clear();
    this.sidecar._closed(this, this.fatal ? new ProctableError("(connection)", this.fatal)
      : this._gone("(connection)"));
  }

  end() {
    this.output.end();
  }

  /** End it now, from our side: pending calls reject with disconnected. */
  destroy() {
    this._end(null);
    this.input.destroy();
    if (this.output !== this.input) this.output.destroy();
  }
}

// Connect to path, trying again every `interval` ms for `timeout` ms while nothing
// answers there (ENOENT, ECONNREFUSED: a sidecar that is starting or restarting).
async function openUntil(method, path, timeout, interval = 100) {
  const deadline = Date.now() + timeout;
  for (;;) {
    try {
      return await openSocket(path);
    } catch (err) {
      const left = deadline - Date.now();
      const retry = err && (err.code === "ENOENT" || err.code === "ECONNREFUSED");
      if (!retry || left <= 0) {
        throw ownError(method, "disconnected", `no sidecar answered at ${path}` +
          (timeout ? ` within ${timeout} ms` : "") + `: ${err.code || err.message}`,
          { path }, err);
      }
      await new Promise((resolve) => setTimeout(resolve, Math.min(interval, left)));
    }
  }
}

function openSocket(path) {
  return new Promise((resolve, reject) => {
    const sock = net.createConnection(path);
    sock.once("error", reject);
    sock.once("connect", () => {
      sock.removeListener("error", reject);
      resolve(sock);
    });
  });
}

/**
 * A client of one sidecar. Emits:
 * - "event" (params): a supervisor event (created, exited, restarting, gave_up,
 *   teardown_failed, deleted), in each key's order;
 * - "output" (params, with `data` a Buffer decoded from data_b64);
 * - "exit" (params): the end of a watch;
 * - "lost" (params): output this connection did not read in time and the sidecar dropped;
 * - "close" (err): the connection ended (a ProctableError: disconnected, forbidden);
 * - "error" (err): what names no call (a bad line, an unaddressed error), to a listener only.
 */
class Sidecar extends EventEmitter {
  constructor(input, output, child, options = {}) {
    super();
    this.child = child || null; // the sidecar process, when we spawned it
    this.path = null; // the socket path, for a Sidecar.connect (reconnect)
    this.maxLine = MAX_LINE; // the sidecar's line limit (hello's max_line)
    this.callTimeout = options.callTimeout || 0; // ms; 0: calls wait as long as it takes
    this._nextId = 1;
    this._fresh = new Map(); // key -> fresh handler given with its start
    this._onFresh = null;
    this._writes = new Map(); // key -> the end of its chain of writes
    this._conn = new Connection(this, input, output);
  }

  /** Spawn `proctable serve` and speak to it on its stdio. */
  static spawn(options = {}) {
    const command = options.command || ["proctable", "serve"];
    const [file, ...args] = command;
    const child = spawn(file, [...args, ...(options.args || [])], {
      stdio: ["pipe", "pipe", options.stderr || "inherit"],
      env: options.env || process.env,
    });
    const sc = new Sidecar(child.stdout, child.stdin, child, options);
    child.on("error", (err) => sc._conn._end(err));
    return sc;
  }

  /**
   * Connect to `proctable serve --socket PATH`; with {timeout} (ms), keep trying
   * that long while nothing answers there (a sidecar starting up).
   */
  static async connect(path, options = {}) {
    const sock = await openUntil("connect", path, options.timeout || 0, options.interval);
    const sc = new Sidecar(sock, sock, null, options);
    sc.path = path;
    return sc;
  }

  /**
   * Socket mode: connect again to the same path, trying until `timeout` ms have
   * passed (the sidecar may be restarting: `proctable serve --state DIR --socket
   * PATH` gives its sessions back). The connection in use, if still open, is ended
   * first (its pending calls reject with `disconnected`, and no "close" is
   * emitted for it). Then hello, within what is left of `timeout` (else `timeout`);
   * emits "reconnect" with hello's result and resolves with it. Handlers (events,
   * onFresh, restart.fresh functions) carry over.
   */
  async reconnect(options = {}) {
    if (!this.path) {
      throw ownError("reconnect", "not_supported", "reconnect is for a sidecar reached " +
        "with Sidecar.connect(path); a spawned one ends with its client");
    }
    const timeout = options.timeout === undefined ? 10000 : options.timeout;
    const old = this._conn;
    old.quiet = true; // ended by us: no "close" (calls made meanwhile reject at once)
    old.destroy();
    const deadline = Date.now() + timeout;
    const sock = await openUntil("reconnect", this.path, timeout, options.interval);
    this._conn = new Connection(this, sock, sock);
    // The timeout bounds the hello too: a sidecar that accepts (the kernel's listen
    // queue) and never answers (stopped, hung) must not hold reconnect for ever.
    let callTimeout = options.callTimeout;
    if (timeout) {
      const left = Math.max(1, deadline - Date.now());
      callTimeout = callTimeout ? Math.min(callTimeout, left) : left;
    }
    const hello = await this.hello(callTimeout === undefined ? {} : { callTimeout });
    this.emit("reconnect", hello);
    return hello;
  }

  _closed(conn, err) {
    if (conn === this._conn && !conn.quiet) this.emit("close", err);
  }

  _notification(method, p) {
    if (method === "output" && !p.data) p.data = Buffer.from(p.data_b64 || "", "base64");
    if (method === "exit") this._conn.watchEnded(p.watch, p);
    if (method === "event" && p.kind === "deleted") this._fresh.delete(p.key);
    this.emit(method, p);
  }

  // A request of the sidecar's (docs/serve.md, "The fresh request"): answered here.
  _serverRequest(conn, msg) {
    if (msg.method !== "fresh") {
      conn.respond(msg.id, { error: { code: -32601, message: `no method ${msg.method} here` } });
      return;
    }
    const p = msg.params || {};
    const handler = this._fresh.get(p.key) || this._onFresh;
    if (!handler) {
      conn.respond(msg.id, { error: { code: -32601, message: `no fresh handler for key ${p.key}` } });
      return;
    }
    Promise.resolve()
      .then(() => handler(p.key, { generation: p.generation, args: p.args }))
      .then((args) => conn.respond(msg.id, { result: args === undefined ? null : args }),
        (err) => conn.respond(msg.id, { error: { code: -32000, message: String(err && err.message || err) } }));
  }

  /**
   * The handler asked for the args of a key's next clean rerun, for every key started
   * with `restart: {fresh: "ask"}` and no handler of its own: `handler(key, {generation,
   * args})` returns (or resolves to) the args, or null to stop the key.
   */
  onFresh(handler) {
    this._onFresh = handler;
    return this;
  }

  /** Send one request; a promise of its result (rejects with ProctableError). */
  call(method, params, options = {}) {
    return this._conn.request(method, params, options).promise;
  }

  /**
   * The protocol version and the host's capabilities; refuses a newer protocol.
   * Asks for output as binary frames (its raw bytes, no base64), unless
   * {output: "base64"}; either way "output" events carry `data`, a Buffer.
   */
  async hello(options = {}) {
    const [wire, call] = split(options);
    const r = await this.call("hello", { output: "binary", ...wire }, call);
    if (typeof r.max_line === "number") this.maxLine = r.max_line;
    if (r.protocol > PROTOCOL) {
      throw ownError("hello", "unsupported_protocol", `proctable protocol v${r.protocol} is ` +
        `newer than this client (v${PROTOCOL})`, { protocol: r.protocol });
    }
    return r;
  }

  // restart.fresh may be a function: it answers that key's fresh requests.
  _restart(key, options) {
    const restart = options.restart;
    if (restart && typeof restart.fresh === "function") {
      this._fresh.set(key, restart.fresh);
      return { ...options, restart: { ...restart, fresh: "ask" } };
    }
    this._fresh.delete(key);
    return options;
  }

  /** Start args under key (replacing what runs there); {pid, start_time, generation}. */
  start(key, args, options = {}) {
    const [wire, call] = split(options);
    return this.call("start", { key, args, ...this._restart(key, wire) }, call);
  }

  /** Stop key and its whole lineage (escapes included); the root's exit. */
  stop(key, options = {}) {
    const [wire, call] = split(options);
    return this.call("stop", { key, ...wire }, call);
  }

  /** Stop key if it runs (exited), then delete it (deleted). */
  remove(key, options = {}) {
    const [wire, call] = split(options);
    return this.call("remove", { key, ...wire }, call);
  }

  /** Take over a process started earlier, with its lineage. */
  adopt(key, pid, startTime, options = {}) {
    const [wire, call] = split(options);
    return this.call("adopt", { key, pid, start_time: startTime, ...this._restart(key, wire) }, call);
  }

  /** Every key: state, generation, pid, start_time, last_input (with `data` a Buffer). */
  async list(options = {}) {
    const rows = (await this.call("list", undefined, options)).keys;
    for (const r of rows) {
      if (r.last_input) r.last_input.data = Buffer.from(r.last_input.data_b64, "base64");
    }
    return rows;
  }

  /**
   * Write bytes to key's pty or stdin pipe ({eof: true} closes the input after).
   * Data of any size: sent in requests that each fit the sidecar's line limit, one
   * after the other; writes to one key keep their order. Resolves {written}; a
   * rejection's data.written counts the bytes of this write that went in.
   */
  write(key, data, options = {}) {
    const [wire, call] = split(options);
    const b = Buffer.isBuffer(data) ? data : Buffer.from(String(data));
    const prev = this._writes.get(key) || Promise.resolve();
    const done = prev.catch(() => {}).then(() => this._writeChunks(key, b, wire, call));
    const tail = done.catch(() => {});
    this._writes.set(key, tail);
    tail.then(() => {
      if (this._writes.get(key) === tail) this._writes.delete(key);
    });
    return done;
  }

  async _writeChunks(key, b, wire, call) {
    const bare = JSON.stringify({ jsonrpc: "2.0", id: Number.MAX_SAFE_INTEGER, method: "write",
      params: { key, data_b64: "", ...wire } });
    const room = this.maxLine - Buffer.byteLength(bare);
    const chunk = Math.max(3, Math.floor(room / 4) * 3); // base64: 4 bytes per 3
    let written = 0;
    let at = 0;
    do {
      const part = b.subarray(at, at + chunk);
      const last = at + part.length >= b.length;
      const params = { key, data_b64: part.toString("base64") };
      if (last && wire.eof !== undefined) params.eof = wire.eof;
      try {
        written += (await this.call("write", params, call)).written;
      } catch (err) {
        if (err instanceof ProctableError && err.data) {
          err.data.written = written + (typeof err.data.written === "number" ? err.data.written : 0);
        }
        throw err;
      }
      at += part.length;
    } while (at < b.length);
    return { written };
  }

  resize(key, rows, cols, options = {}) {
    return this.call("resize", { key, rows, cols }, options);
  }

  /** Send a signal (a number or a name such as "SIGUSR1") to key's process. */
  signal(key, signal, options = {}) {
    return this.call("signal", { key, signal }, options);
  }

  /**
   * The last bytes key wrote, as a Buffer (at most hello's tail_limit, 262,144).
   * With {since: offset}: the current generation's bytes from that offset on (an
   * `output` notification's offset plus its data's length: where a client stopped
   * reading), as {data, generation, since, offset, dropped, end, ...}: `offset` is
   * where `data` starts, `dropped` what was no longer kept between since and offset.
   * With {since, generation}: rejects with `generation_ended` where the key has
   * restarted since that generation (its bytes at that offset are another stream's).
   */
  async tail(key, bytes, options = {}) {
    const [wire, call] = split(options);
    const params = { key };
    if (bytes !== undefined && bytes !== null) params.bytes = bytes;
    if (wire.since !== undefined) params.since = wire.since;
    if (wire.generation !== undefined) params.generation = wire.generation;
    const r = await this.call("tail", params, call);
    const data = Buffer.from(r.data_b64, "base64");
    return wire.since === undefined ? data : { ...r, data };
  }

  /** The members and suspects of key's lineage now. */
  members(key, options = {}) {
    return this.call("members", { key }, options);
  }

  /**
   * Rows of the process table ({pids, uids, name, kernel_threads} filters); the
   * array's `denied` holds the processes the sidecar could not read ({pid, uid}).
   */
  async ps(filters = {}, options = {}) {
    const r = await this.call("ps", filters, options);
    const rows = r.procs;
    rows.denied = r.denied || [];
    return rows;
  }

  /** What happened to (pid, start_time), read without reaping it. */
  probe(pid, startTime, options = {}) {
    return this.call("probe", startTime === undefined ? { pid } : { pid, start_time: startTime },
      options);
  }

  /**
   * Watch (pid, start_time) until it ends: a promise of the `exit` notification's params
   * (also emitted as "exit"), or null when the connection ended first. Its exit is read
   * without reaping it, whoever its parent is. A callTimeout bounds the whole wait.
   */
  watch(pid, startTime, options = {}) {
    const params = startTime === undefined ? { pid } : { pid, start_time: startTime };
    return this._conn.request("watch", params, { ...options, watch: true }).promise;
  }

  /** End (pid, start_time), a process under no key: SIGTERM, grace, SIGKILL; its exit. */
  terminate(pid, startTime, options = {}) {
    const [wire, call] = split(options);
    return this.call("terminate", { pid, start_time: startTime, ...wire }, call);
  }

  /**
   * A durable sidecar (`proctable serve --state DIR`) leaves every session running
   * and exits after this answer: the next sidecar on DIR takes them back (a
   * reconnect() in socket mode). Else `not_supported`.
   */
  detach(options = {}) {
    return this.call("detach", undefined, options);
  }

  /**
   * Stop reading the sidecar until resume(): the keys this client paces (those it
   * started) are slowed down to it, nothing of them lost (unless started with
   * drop_output); other clients and their keys go on. Calls wait for resume too.
   */
  pause() {
    this._conn.input.pause();
    return this;
  }

  /** Read the sidecar again after pause(). */
  resume() {
    this._conn.input.resume();
    return this;
  }

  /** Stop every key side by side; later starts fail with `closed`. */
  close(options = {}) {
    const [wire, call] = split(options);
    return this.call("close", wire, call);
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
        this._conn.end();
      });
    }
    this._conn.end();
    return Promise.resolve(null);
  }
}

module.exports = { Sidecar, ProctableError, PROTOCOL, MAX_LINE };
