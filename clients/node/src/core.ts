// The sans-I/O core of the client: argument checks and request lines, the
// reply parser, the pairing of replies with requests on one connection, and
// the reconnect schedule. Nothing here touches a socket or a timer, so the
// unit tests drive it with plain values (test/core.test.mjs).

import { InvalidArgumentError } from "./errors.js";

/** The longest key the server takes, in bytes. */
export const KEY_MAX = 250;
/** The longest lease and wait the server takes by default, in seconds. */
export const SECONDS_MAX = 86400;

/**
 * How long an acquire may wait in the key's queue:
 * - a number of seconds (above 0, at most 86400): up to that long;
 * - `"once"`: try once, never queued behind the holder longer than the
 *   server's timer tick (1 ms);
 * - `"forever"`: no limit.
 */
export type Wait = number | "once" | "forever";

/** A key as the caller gives it: a string (sent as UTF-8) or raw bytes. */
export type Key = string | Uint8Array;

/** Checks a key and returns its bytes. */
export function keyBytes(key: Key): Buffer {
  let bytes: Buffer;
  if (typeof key === "string") {
    bytes = Buffer.from(key, "utf8");
  } else if (key instanceof Uint8Array) {
    bytes = Buffer.from(key.buffer, key.byteOffset, key.byteLength);
  } else {
    throw new InvalidArgumentError("key", "a key must be a string or a Buffer");
  }
  if (bytes.length === 0 || bytes.length > KEY_MAX) {
    throw new InvalidArgumentError("key", `a key must be 1 to ${KEY_MAX} bytes long, not ${bytes.length}`);
  }
  for (const byte of bytes) {
    if (byte === 0x20 || byte === 0x09 || byte === 0x0d || byte === 0x0a || byte === 0x00) {
      throw new InvalidArgumentError("key", "a key must not hold a space, tab, CR, LF or NUL byte");
    }
  }
  if (bytes.length === 1 && bytes[0] === 0x2d) {
    throw new InvalidArgumentError("key", 'the key "-" cannot be paired with its errors and is refused');
  }
  return bytes;
}

/** Seconds as the wire writes them (at most three fractional digits), from
 * whole milliseconds. */
export function formatMs(ms: number): string {
  const whole = Math.floor(ms / 1000);
  const frac = ms % 1000;
  return frac === 0 ? String(whole) : `${whole}.${String(frac).padStart(3, "0")}`;
}

/** Checks a lease in seconds and returns it in whole milliseconds. */
export function leaseMs(lease: unknown, name = "lease"): number {
  if (typeof lease !== "number" || !Number.isFinite(lease)) {
    throw new InvalidArgumentError(name, `${name} must be a finite number of seconds, from 0.001 to ${SECONDS_MAX}`);
  }
  const ms = Math.round(lease * 1000);
  if (ms < 1 || ms > SECONDS_MAX * 1000) {
    throw new InvalidArgumentError(name, `${name} must be from 0.001 to ${SECONDS_MAX} seconds, not ${lease}`);
  }
  return ms;
}

/** Checks a wait; its limit in milliseconds, 0 for "once" and null for
 * "forever". */
export function waitMs(wait: unknown): number | null {
  if (wait === "forever") return null;
  if (wait === "once") return 0;
  if (typeof wait !== "number" || !Number.isFinite(wait) || wait <= 0) {
    throw new InvalidArgumentError(
      "wait",
      `wait must be "once", "forever" or a number of seconds from 0.001 to ${SECONDS_MAX}, not ${String(wait)}`,
    );
  }
  return leaseMs(wait, "wait");
}

/** Checks a token: a u64, as a bigint (or a decimal string). */
export function tokenOf(token: unknown): bigint {
  let value: bigint;
  if (typeof token === "bigint") value = token;
  else if (typeof token === "string" && /^[0-9]{1,20}$/.test(token)) value = BigInt(token);
  else throw new InvalidArgumentError("token", "a token must be a bigint (a u64)");
  if (value < 0n || value > 0xffff_ffff_ffff_ffffn) {
    throw new InvalidArgumentError("token", "a token must be from 0 to 2^64 - 1");
  }
  return value;
}

function line(...parts: (string | Buffer)[]): Buffer {
  let size = parts.length; // the spaces and the LF
  for (const part of parts) size += part.length; // the strings are ASCII
  const out = Buffer.allocUnsafe(size);
  let at = 0;
  for (let index = 0; index < parts.length; index += 1) {
    if (index > 0) out[at++] = 0x20;
    const part = parts[index];
    at += typeof part === "string" ? out.write(part, at, "latin1") : part.copy(out, at);
  }
  out[at] = 0x0a;
  return out;
}

export const encode = {
  acquire: (key: Buffer, leaseMs: number, waitMs: number): Buffer => line("A", key, formatMs(leaseMs), formatMs(waitMs)),
  release: (key: Buffer, token: bigint): Buffer => line("R", key, token.toString()),
  extend: (key: Buffer, token: bigint, leaseMs: number): Buffer => line("X", key, token.toString(), formatMs(leaseMs)),
  inspect: (key: Buffer): Buffer => line("I", key),
  ping: (): Buffer => Buffer.from("P\n"),
  stats: (): Buffer => Buffer.from("S\n"),
  auth: (secret: Buffer): Buffer => line("U", secret),
};

/** One reply line, parsed. `slot` is the pairing slot it answers: its
 * request's operation and key. */
export type Reply =
  | { kind: "A"; slot: string; key: string; token: bigint }
  | { kind: "T"; slot: string; key: string }
  | { kind: "R"; slot: string; key: string }
  | { kind: "X"; slot: string; key: string; token: bigint }
  | { kind: "M"; slot: string; key: string; active: string | null }
  | { kind: "E"; slot: string; op: string; key: string; code: string }
  | { kind: "P"; slot: string; role: string; epoch: bigint; address: string | null }
  | { kind: "S"; slot: string; json: string }
  | { kind: "I"; slot: string; key: string; token: bigint | null; leaseLeftMs: number; waiters: number }
  | { kind: "U"; slot: string; name: string };

/** The pairing slot of a request: its operation and key (latin1, so that
 * any bytes round-trip). */
export function slotOf(op: string, key: Buffer | null): string {
  return key === null ? op : `${op} ${key.toString("latin1")}`;
}

export class ProtocolError extends Error {}

/** Parses one reply line (without its EOL). Throws ProtocolError on a line
 * that is no reply. */
export function parseReply(bytes: Buffer): Reply {
  const text = bytes.toString("latin1");
  const fields = text.split(" ");
  const op = fields[0];
  const need = (n: number) => {
    if (fields.length !== n) throw new ProtocolError(`malformed reply: ${JSON.stringify(text.slice(0, 80))}`);
  };
  const big = (field: string) => {
    if (!/^[0-9]{1,20}$/.test(field)) throw new ProtocolError(`bad number in reply: ${JSON.stringify(text.slice(0, 80))}`);
    return BigInt(field);
  };
  switch (op) {
    case "A":
      need(3);
      return { kind: "A", slot: `A ${fields[1]}`, key: fields[1], token: big(fields[2]) };
    case "T":
      need(2);
      return { kind: "T", slot: `A ${fields[1]}`, key: fields[1] };
    case "R":
      need(2);
      return { kind: "R", slot: `R ${fields[1]}`, key: fields[1] };
    case "X":
      need(3);
      return { kind: "X", slot: `X ${fields[1]}`, key: fields[1], token: big(fields[2]) };
    case "M":
      need(4);
      return { kind: "M", slot: `${fields[1]} ${fields[2]}`, key: fields[2], active: fields[3] === "-" ? null : fields[3] };
    case "E": {
      need(4);
      const [, eop, key, code] = fields;
      const slot = eop === "-" ? "-" : eop === "P" || eop === "S" || eop === "U" ? eop : `${eop} ${key}`;
      return { kind: "E", slot, op: eop, key, code };
    }
    case "P":
      need(4);
      return { kind: "P", slot: "P", role: fields[1], epoch: big(fields[2]), address: fields[3] === "-" ? null : fields[3] };
    case "S":
      return { kind: "S", slot: "S", json: text.slice(2) };
    case "I":
      need(5);
      return {
        kind: "I",
        slot: `I ${fields[1]}`,
        key: fields[1],
        token: fields[2] === "-" ? null : big(fields[2]),
        leaseLeftMs: Number(fields[3]),
        waiters: Number(fields[4]),
      };
    case "U":
      need(2);
      return { kind: "U", slot: "U", name: fields[1] };
    default:
      throw new ProtocolError(`unknown reply: ${JSON.stringify(text.slice(0, 80))}`);
  }
}

/** Splits a byte stream into lines: `push` a chunk, get the whole lines it
 * completes (without EOL; a CR before the LF is dropped). Scans the Buffer
 * for LF rather than decoding each chunk. */
export class LineSplitter {
  private rest: Buffer | null = null;

  push(chunk: Buffer): Buffer[] {
    const data = this.rest === null ? chunk : Buffer.concat([this.rest, chunk]);
    const lines: Buffer[] = [];
    let start = 0;
    for (;;) {
      const end = data.indexOf(0x0a, start);
      if (end < 0) break;
      const stop = end > start && data[end - 1] === 0x0d ? end - 1 : end;
      lines.push(data.subarray(start, stop));
      start = end + 1;
    }
    this.rest = start < data.length ? Buffer.from(data.subarray(start)) : null;
    if (this.rest !== null && this.rest.length > 1 << 20) {
      throw new ProtocolError("a reply line longer than 1 MiB");
    }
    return lines;
  }
}

/** The requests in flight on one connection, by slot, each slot in send
 * order: a reply answers the oldest request of its slot. */
export class Pairing<T> {
  private readonly slots = new Map<string, T[]>();
  private count = 0;

  get size(): number {
    return this.count;
  }

  add(slot: string, request: T): void {
    const queue = this.slots.get(slot);
    if (queue === undefined) this.slots.set(slot, [request]);
    else queue.push(request);
    this.count += 1;
  }

  /** The request a reply of `slot` answers, removed; undefined if none. */
  take(slot: string): T | undefined {
    const queue = this.slots.get(slot);
    if (queue === undefined) return undefined;
    const request = queue.shift();
    if (queue.length === 0) this.slots.delete(slot);
    this.count -= 1;
    return request;
  }

  /** Removes a request (whose caller gave up) without pairing a reply. */
  remove(slot: string, request: T): boolean {
    const queue = this.slots.get(slot);
    const index = queue === undefined ? -1 : queue.indexOf(request);
    if (queue === undefined || index < 0) return false;
    queue.splice(index, 1);
    if (queue.length === 0) this.slots.delete(slot);
    this.count -= 1;
    return true;
  }

  /** Every request in flight, removed (the connection broke). */
  drain(): T[] {
    const all: T[] = [];
    for (const queue of this.slots.values()) all.push(...queue);
    this.slots.clear();
    this.count = 0;
    return all;
  }
}

/** The pause in ms before reconnect attempt `attempt` (0: the first after a
 * break, at once), given `draw` in [0, 1): drawn in [d/2, d], where d is
 * `firstMs` doubled `attempt - 1` times and capped at `maxMs`. */
export function reconnectDelay(attempt: number, firstMs: number, maxMs: number, draw: number): number {
  if (attempt <= 0) return 0;
  const ceiling = Math.min(firstMs * 2 ** Math.min(attempt - 1, 31), maxMs);
  const unit = Number.isFinite(draw) ? Math.min(Math.max(draw, 0), 1) : 0;
  return ceiling / 2 + (ceiling / 2) * unit;
}

/** Splits "host:port" (or "[v6]:port"). */
export function parseAddress(address: string): { host: string; port: number } {
  const match = /^(?:\[([^\]]+)\]|([^:]+)):([0-9]{1,5})$/.exec(address);
  const port = match ? Number(match[3]) : NaN;
  if (!match || port < 1 || port > 65535) {
    throw new InvalidArgumentError("addresses", `an address must be host:port, not ${JSON.stringify(address)}`);
  }
  return { host: match[1] ?? match[2], port };
}
