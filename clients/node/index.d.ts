// Types of the reference Node client of `proctable serve` (docs/serve.md).
import { EventEmitter } from "node:events";
import { ChildProcess } from "node:child_process";

export declare const PROTOCOL: number;

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

export interface SupervisorEvent extends Partial<ExitFields> {
  key: string;
  generation: number;
  kind: "created" | "exited" | "restarting" | "gave_up" | "teardown_failed" | "deleted" | string;
  pid: number | null;
  start_time: number | null;
  time: number;
  status?: "exited" | "signaled" | "killed" | "timeout" | string;
  reason?: string;
  survivors?: { pid: number; start_time: number; name: string }[];
}

export interface Output {
  key: string;
  generation: number;
  stream: "stdout" | "stderr" | "pty" | string;
  data_b64: string;
  data: Buffer;
  dropped: number;
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
  source: string | null;
  error: string | null;
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

export interface KeyRow {
  key: string;
  state: string;
  generation: number;
  running: boolean;
  pid: number | null;
  start_time: number | null;
  mode: string | null;
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
  version: string;
  pid: number;
  uid: number;
  methods: string[];
  notifications: string[];
  max_line: number;
  output_budget: number;
  capabilities: {
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

export interface RestartOptions {
  max_restarts?: number;
  reset_after?: number;
  fast_exit?: number;
  max_fast_exits?: number;
  delay?: number;
  fresh_args?: string[];
}

export interface StartOptions {
  cwd?: string;
  env?: Record<string, string>;
  restart?: RestartOptions;
  timeout?: number;
  output?: "events" | "discard" | "stderr";
  pty?: { rows: number; cols: number };
  stdin?: "pipe" | "null";
}

export declare class ProctableError extends Error {
  code: number;
  data: Record<string, unknown> | null;
  /** data.error: no_such_key, teardown_failed, command_not_found, spawn_failed, closed, ... */
  error: string | null;
  method: string;
}

export interface SpawnOptions {
  command?: string[];
  args?: string[];
  env?: NodeJS.ProcessEnv;
  stderr?: "inherit" | "pipe" | "ignore";
}

export declare class Sidecar extends EventEmitter {
  readonly child: ChildProcess | null;
  static spawn(options?: SpawnOptions): Sidecar;
  static connect(path: string): Promise<Sidecar>;
  call(method: string, params?: Record<string, unknown>): Promise<any>;
  hello(): Promise<Hello>;
  start(key: string, args: string[], options?: StartOptions): Promise<Started>;
  stop(key: string, options?: { grace?: number }): Promise<ExitFields>;
  remove(key: string, options?: { grace?: number }): Promise<{}>;
  adopt(key: string, pid: number, startTime: number,
        options?: { args?: string[]; restart?: RestartOptions; cwd?: string;
                    env?: Record<string, string> }): Promise<Started>;
  list(): Promise<KeyRow[]>;
  write(key: string, data: Buffer | string, options?: { eof?: boolean }): Promise<{ written: number }>;
  resize(key: string, rows: number, cols: number): Promise<{}>;
  signal(key: string, signal: number | string): Promise<{ sent: boolean; pid?: number; start_time?: number }>;
  tail(key: string, bytes?: number): Promise<Buffer>;
  members(key: string): Promise<{ members: Proc[]; suspects: { proc: Proc; via: string; id: number }[] }>;
  ps(filters?: { pids?: number[]; uids?: number[]; name?: string; kernel_threads?: boolean }): Promise<Proc[]>;
  probe(pid: number, startTime?: number): Promise<Probe>;
  /** null when the connection ended before the exit came. */
  watch(pid: number, startTime?: number): Promise<WatchExit | null>;
  close(options?: { grace?: number }): Promise<{}>;
  end(): Promise<number | string | null>;

  on(event: "event", listener: (ev: SupervisorEvent) => void): this;
  on(event: "output", listener: (out: Output) => void): this;
  on(event: "exit", listener: (exit: WatchExit) => void): this;
  on(event: "lost", listener: (lost: Lost) => void): this;
  on(event: "close", listener: (err: Error) => void): this;
  on(event: "error", listener: (err: Error) => void): this;
}
