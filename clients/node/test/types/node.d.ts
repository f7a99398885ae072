// The few shapes of Node's own types that index.d.ts uses, for `tsc` where
// @types/node is not installed (tests/test_serve_node.py type-checks with them).
// Where @types/node is installed, use it instead: these agree with it.
interface Buffer extends Uint8Array {
  toString(encoding?: string): string;
}
declare const Buffer: {
  from(data: string | Uint8Array | number[], encoding?: string): Buffer;
  alloc(size: number): Buffer;
  isBuffer(value: unknown): value is Buffer;
};

declare namespace NodeJS {
  interface ProcessEnv {
    [key: string]: string | undefined;
  }
}

declare module "node:events" {
  class EventEmitter {
    on(eventName: string | symbol, listener: (...args: any[]) => void): this;
    once(eventName: string | symbol, listener: (...args: any[]) => void): this;
    off(eventName: string | symbol, listener: (...args: any[]) => void): this;
    emit(eventName: string | symbol, ...args: any[]): boolean;
    listenerCount(eventName: string | symbol): number;
  }
}

declare module "node:child_process" {
  import { EventEmitter } from "node:events";
  class ChildProcess extends EventEmitter {
    readonly pid?: number;
    readonly exitCode: number | null;
    kill(signal?: string | number): boolean;
  }
}
