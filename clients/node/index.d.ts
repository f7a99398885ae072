// Types of the reference Node client of `proctable serve` (docs/serve.md).
import { EventEmitter } from "node:events";
import { ChildProcess } from "node:child_process";

/** The protocol version this client was written for (hello's `protocol`). */
export declare const PROTOCOL: number;
/** The longest request line, in bytes, until hello says (1 MiB). */
export declare const MAX_LINE: number;

export interface Status {
  code: number | null;
  signal: number | null;
  signal_name: string | null;
  core_dumped: boolean;
  raw: number | null;
  returncode: number;
}

export interface Started {
  pid: number;
  start_time: number;
  handle: number | null;
  generation: number;
}

export interface ExitFields {
  exit: Status | null;
  code: number | null;
  signal: number | null;
}

export interface Survivor {
  pid: number;
  start_time: number;
  name: string | null;
}

export interface SupervisorEvent extends Partial<ExitFields> {
  key: string;
  generation: number;
  /** "adopted": a durable session taken back by a sidecar started on its state directory. */
  kind: "created" | "adopted" | "exited" | "restarting" | "gave_up" | "teardown_failed" |
    "deleted" | string;
  pid: number | null;
  start_time: number | null;
  time: number;
  status?: "exited" | "signaled" | "killed" | "timeout" | string;
  reason?: string;
  survivors?: Survivor[];
}

export interface Output {
  key: string;
  generation: number;
  stream: "stdout" | "stderr" | "pty" | string;
  /** The bytes in base64: only where hello did not ask for binary frames. */
  data_b64?: string;
  /** The exact bytes. */
  data: Buffer;
  dropped: number;
  /** Where data starts in its generation's output (its bytes before it, dropped included). */
  offset: number;
}

export interface Lost {
  key: string;
  generation: number;
  bytes: number;
  chunks: number;
}

export interface WatchExit extends ExitFields {
  watch: number | string;
  pid: number;
  start_time: number | null;
  outcome: "exited" | "unknown" | "gone" | "reused" | string;
  source: "pidfd_info" | "waitid" | "zombie" | string | null;
  error: string | null;
}

export interface Terminated extends ExitFields {
  outcome: "exited" | "unknown" | string;
}

export interface Proc {
  pid: number;
  ppid: number;
  pgid: number;
  sid: number | null;
  start_time: number;
  create_time: number;
  state: string;
  kernel_thread: boolean;
  num_threads: number | null;
  uid: number | null;
  name: string;
  tty_nr: number;
  utime: number | null;
  stime: number | null;
  rss: number | null;
  vms: number | null;
  exit: Status | null;
  exit_masked: boolean;
}

/** A process the sidecar could not read (hidepid, another user's, a security module). */
export interface Denied {
  pid: number;
  uid: number | null;
}

/** ps()'s rows, with the processes that could not be read beside them. */
export type PsRows = Proc[] & { denied: Denied[] };

export interface PsFilters {
  pids?: number[];
  uids?: number[];
  /** A regular expression on the name. */
  name?: string;
  kernel_threads?: boolean;
}

export interface LastInput {
  /** Seconds since the epoch. */
  time: number;
  data_b64: string;
  /** The last 16 bytes written to the key (data_b64 decoded). */
  data: Buffer;
}

export interface KeyRow {
  key: string;
  state: "running" | "stopped" | "gave_up" | "failed" | string;
  generation: number;
  running: boolean;
  pid: number | null;
  start_time: number | null;
  mode: "cgroup" | "subreaper" | "scan" | string | null;
  last_input: LastInput | null;
}

export interface Members {
  members: Proc[];
  suspects: { proc: Proc; via: string; id: number }[];
}

export interface Probe {
  pid: number;
  start_time: number | null;
  name: string | null;
  state: "running" | "stopped" | "exited" | "leader_exited" | "masked" | "gone" | "reused" | string;
  status: Status | null;
}

export interface Hello {
  protocol: number;
  /** How output comes to this client from now on. */
  output?: "binary" | "base64";
  version: string;
  pid: number;
  uid: number;
  methods: string[];
  notifications: string[];
  /** What the sidecar may ask a client: "fresh". */
  requests?: string[];
  max_line: number;
  output_budget: number;
  /** The bytes of output kept per key for tail (262,144). */
  tail_limit?: number;
  /** Seconds a write waits for a command that does not read (5). */
  write_timeout?: number;
  /** The state directory of a durable sidecar (serve --state), else null. */
  state_dir?: string | null;
  /** What its start could not take back from the state directory, said in words. */
  adoption_problems?: string[];
  capabilities: {
    /** Started with --state: sessions outlive it (detach, reconnect). */
    durable?: boolean;
    pidfds: boolean;
    pidfd_exit_info: boolean;
    bpf: boolean;
    bpf_why_not: string | null;
    cgroup: boolean;
    subreaper: boolean;
    connector: boolean;
    output: boolean;
    pty: boolean;
  };
}

/** What a fresh handler is told: the run that exited cleanly, and what it ran. */
export interface FreshInfo {
  generation: number;
  args: string[] | null;
}

/** The args of a key's next clean rerun, or null (or nothing) to stop the key (gave_up). */
export type FreshHandler = (key: string, info: FreshInfo) =>
  string[] | null | undefined | Promise<string[] | null | undefined>;

export interface RestartOptions {
  max_restarts?: number;
  reset_after?: number;
  fast_exit?: number;
  max_fast_exits?: number;
  delay?: number;
  fresh_args?: string[];
  /** "ask": ask this client (onFresh) for each clean rerun's args; or the handler itself. */
  fresh?: "ask" | FreshHandler;
  /** Seconds the sidecar waits for the answer (default 5), then falls back. */
  fresh_timeout?: number;
}

export interface CallOptions {
  /** Milliseconds before the call rejects with a `timeout` error (0: no limit). */
  callTimeout?: number;
}

export interface StartOptions extends CallOptions {
  cwd?: string;
  env?: Record<string, string>;
  restart?: RestartOptions;
  /** Seconds the command may run (then it is stopped: exited with status timeout). */
  timeout?: number;
  output?: "events" | "discard" | "stderr";
  pty?: { rows: number; cols: number };
  stdin?: "pipe" | "null";
  /**
   * Drop output this client does not read in time (counted in `lost`) instead of
   * slowing the command down to its reading (the default: nothing lost).
   */
  drop_output?: boolean;
}

export interface TailOptions extends CallOptions {
  /** The current generation's bytes from this offset on (then tail resolves a TailSince). */
  since?: number;
  /**
   * The generation `since` belongs to (an output event's): rejects with
   * `generation_ended` where the key has restarted since.
   */
  generation?: number;
}

/** tail with `since`: the bytes of a generation from an offset on. */
export interface TailSince {
  data_b64: string;
  /** data_b64 decoded. */
  data: Buffer;
  asked: number;
  given: number;
  generation: number;
  since: number;
  /** Where data starts: since, or later when bytes before it are no longer kept. */
  offset: number;
  /** Bytes between since and offset that are no longer kept. */
  dropped: number;
  /** The generation's output so far: offset + given when nothing was cut by `bytes`. */
  end: number;
  /** The most kept (null: a durable session's ring, as --ring-size). */
  limit: number | null;
}

export interface ReconnectOptions extends CallOptions {
  /** Milliseconds to keep trying to connect, and to wait for its hello (default 10000). */
  timeout?: number;
  /** Milliseconds between attempts (default 100). */
  interval?: number;
}

export interface AdoptOptions extends CallOptions {
  /** What a restart runs. */
  args?: string[];
  restart?: RestartOptions;
  cwd?: string;
  env?: Record<string, string>;
}

export interface GraceOptions extends CallOptions {
  grace?: number;
}

export interface TerminateOptions extends CallOptions {
  grace?: number;
  kill_timeout?: number;
}

export interface WriteOptions extends CallOptions {
  /** Close the input after the data. */
  eof?: boolean;
}

/**
 * Every rejection of the client. `error` names it: the sidecar's (no_such_key,
 * teardown_failed, command_not_found, spawn_failed, closed, no_such_process, no_input,
 * forbidden, not_supported, failed, cancelled, generation_ended, parse_error, invalid_request,
 * method_not_found, invalid_params, internal_error, line_too_long, ...) or the
 * client's own (disconnected, timeout, line_too_long, bad_line, unsupported_protocol).
 */
export declare class ProctableError extends Error {
  /** The JSON-RPC code; null for the client's own errors. */
  code: number | null;
  data: Record<string, any> | null;
  error: string | null;
  /** The call that failed ("(connection)", "(read)" or "(no request)" where none). */
  method: string;
}

export interface SidecarOptions {
  /** The default callTimeout of every call, in milliseconds (0: no limit). */
  callTimeout?: number;
}

export interface ConnectOptions extends SidecarOptions {
  /** Milliseconds to keep trying while nothing answers at the path (default 0: once). */
  timeout?: number;
  /** Milliseconds between attempts (default 100). */
  interval?: number;
}

export interface SpawnOptions extends SidecarOptions {
  command?: string[];
  args?: string[];
  env?: NodeJS.ProcessEnv;
  stderr?: "inherit" | "pipe" | "ignore";
}

export declare class Sidecar extends EventEmitter {
  /** The sidecar process, when this client spawned it. */
  readonly child: ChildProcess | null;
  /** The sidecar's line limit (hello's max_line; 1 MiB until then). */
  maxLine: number;
  /** The default callTimeout, in milliseconds (0: no limit). */
  callTimeout: number;
  static spawn(options?: SpawnOptions): Sidecar;
  /** With timeout (ms): keep trying while nothing answers at path (a sidecar starting). */
  static connect(path: string, options?: ConnectOptions): Promise<Sidecar>;
  call(method: string, params?: Record<string, unknown>, options?: CallOptions): Promise<any>;
  /** Asks for binary output frames unless output is "base64". */
  hello(options?: CallOptions & { output?: "binary" | "base64" }): Promise<Hello>;
  start(key: string, args: string[], options?: StartOptions): Promise<Started>;
  stop(key: string, options?: GraceOptions): Promise<ExitFields>;
  remove(key: string, options?: GraceOptions): Promise<{}>;
  adopt(key: string, pid: number, startTime: number, options?: AdoptOptions): Promise<Started>;
  list(options?: CallOptions): Promise<KeyRow[]>;
  write(key: string, data: Buffer | string, options?: WriteOptions): Promise<{ written: number }>;
  resize(key: string, rows: number, cols: number, options?: CallOptions): Promise<{}>;
  signal(key: string, signal: number | string, options?: CallOptions):
    Promise<{ sent: boolean; pid?: number; start_time?: number }>;
  tail(key: string, bytes: number | undefined | null, options: TailOptions & { since: number }):
    Promise<TailSince>;
  tail(key: string, bytes?: number | null, options?: CallOptions): Promise<Buffer>;
  members(key: string, options?: CallOptions): Promise<Members>;
  ps(filters?: PsFilters, options?: CallOptions): Promise<PsRows>;
  probe(pid: number, startTime?: number, options?: CallOptions): Promise<Probe>;
  /** null when the connection ended before the exit came. */
  watch(pid: number, startTime?: number, options?: CallOptions): Promise<WatchExit | null>;
  terminate(pid: number, startTime: number, options?: TerminateOptions): Promise<Terminated>;
  close(options?: GraceOptions): Promise<{}>;
  /** A durable sidecar leaves every session running and exits (else not_supported). */
  detach(options?: CallOptions): Promise<{}>;
  /** The socket path of a Sidecar.connect; null for a spawned sidecar. */
  readonly path: string | null;
  /** Stop reading the sidecar (the keys this client paces wait, losing nothing). */
  pause(): this;
  /** Read the sidecar again. */
  resume(): this;
  /** Socket mode: connect again (the sidecar restarted); hello's result. */
  reconnect(options?: ReconnectOptions): Promise<Hello>;
  /** The handler of fresh requests for keys started with restart.fresh "ask". */
  onFresh(handler: FreshHandler | null): this;
  /** A spawned sidecar's exit code (or "signal NAME"); null for a socket. */
  end(): Promise<number | string | null>;

  on(event: "event", listener: (ev: SupervisorEvent) => void): this;
  on(event: "output", listener: (out: Output) => void): this;
  on(event: "exit", listener: (exit: WatchExit) => void): this;
  on(event: "lost", listener: (lost: Lost) => void): this;
  on(event: "close", listener: (err: ProctableError) => void): this;
  on(event: "error", listener: (err: ProctableError) => void): this;
  on(event: "reconnect", listener: (hello: Hello) => void): this;
  once(event: "event", listener: (ev: SupervisorEvent) => void): this;
  once(event: "output", listener: (out: Output) => void): this;
  once(event: "exit", listener: (exit: WatchExit) => void): this;
  once(event: "lost", listener: (lost: Lost) => void): this;
  once(event: "close", listener: (err: ProctableError) => void): this;
  once(event: "error", listener: (err: ProctableError) => void): this;
  once(event: "reconnect", listener: (hello: Hello) => void): this;
  off(event: "event", listener: (ev: SupervisorEvent) => void): this;
  off(event: "output", listener: (out: Output) => void): this;
  off(event: "exit", listener: (exit: WatchExit) => void): this;
  off(event: "lost", listener: (lost: Lost) => void): this;
  off(event: "close", listener: (err: ProctableError) => void): this;
  off(event: "error", listener: (err: ProctableError) => void): this;
  off(event: "reconnect", listener: (hello: Hello) => void): this;
}
