// Every method and event of index.d.ts, used as the README uses them: `tsc --strict`
// must accept this file (and refuse what is marked @ts-expect-error).
import {
  Sidecar, ProctableError, PROTOCOL, MAX_LINE, Hello, Started, ExitFields, KeyRow, PsRows,
  Probe, WatchExit, Terminated, Members, SupervisorEvent, Output, Lost, FreshInfo, TailSince,
} from "../..";

async function main(): Promise<void> {
  const pt: Sidecar = Sidecar.spawn({ stderr: "pipe", callTimeout: 5000 });
  const other: Sidecar = await Sidecar.connect("/run/user/1000/pt.sock", { callTimeout: 1000 });
  const n: number = PROTOCOL + MAX_LINE + pt.maxLine + pt.callTimeout;
  const hello: Hello = await pt.hello({ callTimeout: 100 });
  const tailLimit: number | undefined = hello.tail_limit;
  pt.onFresh((key: string, info: FreshInfo) => (info.generation < 5 ? [key, ...(info.args || [])] : null));
  const s: Started = await pt.start("k", ["sleep", "1"], {
    cwd: "/", env: { A: "1" }, timeout: 5, output: "events", pty: { rows: 24, cols: 80 }, stdin: "pipe",
    restart: { max_restarts: 1, fresh: async (_key, info) => info.args, fresh_timeout: 2 }, callTimeout: 1,
  });
  await pt.start("j", ["true"], { restart: { fresh: "ask", fresh_args: ["true"] } });
  const stopped: ExitFields = await pt.stop("k", { grace: 1, callTimeout: 10 });
  await pt.remove("k", { grace: 1 });
  const adopted: Started = await pt.adopt("a", s.pid, s.start_time, {
    args: ["x"], restart: { delay: 1 }, cwd: "/", env: {}, callTimeout: 5,
  });
  const rows: KeyRow[] = await pt.list();
  const last: Buffer | undefined = rows[0].last_input?.data;
  const w: { written: number } = await pt.write("k", Buffer.from("x"), { eof: true, callTimeout: 5 });
  await pt.write("k", "text");
  await pt.resize("k", 24, 80, { callTimeout: 5 });
  const sent: boolean = (await pt.signal("k", "SIGTERM")).sent;
  const tail: Buffer = await pt.tail("k", 10);
  const since: TailSince = await pt.tail("k", undefined, { since: 0, callTimeout: 5 });
  const next: number = since.offset + since.data.length + since.dropped + since.end;
  // @ts-expect-error: without since, tail is a Buffer
  const notBuffer: TailSince = await pt.tail("k", 10);
  await pt.start("d", ["yes"], { drop_output: true });
  const durable: boolean | undefined = hello.capabilities.durable;
  const dir: string | null | undefined = hello.state_dir;
  await other.detach({ callTimeout: 5 });
  const again: Hello = await other.reconnect({ timeout: 5000, interval: 50, callTimeout: 1000 });
  other.on("reconnect", (h: Hello) => h.adoption_problems?.length);
  const where: string | null = other.path;
  const third: Sidecar = await Sidecar.connect("/tmp/x.sock", { timeout: 5000, interval: 50 });
  third.pause().resume();
  const form: "binary" | "base64" | undefined = (await third.hello({ output: "base64" })).output;
  const members: Members = await pt.members("k");
  const procs: PsRows = await pt.ps({ pids: [1], uids: [0], name: "^sh$", kernel_threads: false });
  const denied: number = procs.denied.length + procs[0].pid;
  const probe: Probe = await pt.probe(1, 2);
  const watched: WatchExit | null = await pt.watch(1, 2, { callTimeout: 1000 });
  // @ts-expect-error: watch gives null when the connection ended first
  const notNull: WatchExit = await pt.watch(1);
  const ended: Terminated = await pt.terminate(1, 2, { grace: 1, kill_timeout: 1, callTimeout: 5000 });
  await pt.close({ grace: 1 });
  const raw: unknown = await pt.call("hello", {}, { callTimeout: 5 });
  pt.on("event", (ev: SupervisorEvent) => ev.kind === "exited" && ev.status);
  pt.on("output", (out: Output) => out.data.length + out.offset);
  pt.on("exit", (exit: WatchExit) => exit.outcome);
  pt.on("lost", (lost: Lost) => lost.bytes);
  pt.on("close", (err: ProctableError) => err.error === "disconnected" || err.error === "forbidden");
  pt.once("error", (err: ProctableError) => err.code === null && err.data?.line);
  pt.off("event", () => undefined);
  const code: number | string | null = await pt.end();
  await other.end();
  try {
    await pt.hello();
  } catch (e) {
    if (e instanceof ProctableError) {
      const name: string | null = e.error;
      const c: number | null = e.code;
      const m: string = e.method;
    }
  }
  void [n, tailLimit, stopped, adopted, last, w, sent, tail, members, denied, probe, watched,
    notNull, ended, raw, code];
}

void main;
