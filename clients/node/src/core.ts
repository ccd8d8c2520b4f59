// The sans-I/O core of the client: argument checks and request lines, the
// outbox they wait in until written, the reply reader, the pairing of
// replies with requests on one connection, and the reconnect schedule. Nothing here touches a socket or a timer, so the
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
  let bytes: Buffer | null;
  if (typeof key === "string") {
    bytes = asciiKeyBytes(key) ?? Buffer.from(key, "utf8");
  } else if (key instanceof Uint8Array) {
    bytes = Buffer.from(key.buffer, key.byteOffset, key.byteLength);
  } else {
    throw new InvalidArgumentError("key", "a key must be a string or a Buffer");
  }
  if (bytes.length === 0 || bytes.length > KEY_MAX) {
    throw new InvalidArgumentError("key", `a key must be 1 to ${KEY_MAX} bytes long, not ${bytes.length}`);
  }
  for (let index = 0; index < bytes.length; index += 1) {
    const byte = bytes[index];
    if (byte === 0x20 || byte === 0x09 || byte === 0x0d || byte === 0x0a || byte === 0x00) {
      throw new InvalidArgumentError("key", "a key must not hold a space, tab, CR, LF or NUL byte");
    }
  }
  if (bytes.length === 1 && bytes[0] === 0x2d) {
    throw new InvalidArgumentError("key", 'the key "-" cannot be paired with its errors and is refused');
  }
  return bytes;
}

/** The bytes of a key of ASCII characters, copied one by one (cheaper for
 * short keys than the UTF-8 encoder); null for any other string, which
 * goes through Buffer.from. */
function asciiKeyBytes(key: string): Buffer | null {
  if (key.length === 0 || key.length > KEY_MAX) return null;
  const bytes = Buffer.allocUnsafe(key.length);
  for (let index = 0; index < key.length; index += 1) {
    const code = key.charCodeAt(index);
    if (code > 0x7f) return null;
    bytes[index] = code;
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

/** The bytes of `bytes[start, end)` as a string, one character per byte. */
function latin1(bytes: Buffer, start: number, end: number): string {
  return bytes.toString("latin1", start, end);
}

/** The largest token written with number arithmetic (beyond, the bigint's
 * own decimal text is used). */
const SAFE_TOKEN = BigInt(Number.MAX_SAFE_INTEGER);

/** 10^0 to 10^15: a whole number up to 2^53 - 1 has at most 16 digits. */
const POWERS_OF_TEN = Array.from({ length: 16 }, (_, power) => 10 ** power);

/** How many decimal digits a whole number (0 to 2^53 - 1) takes. */
function digitCount(value: number): number {
  let count = 1;
  while (count < POWERS_OF_TEN.length && value >= POWERS_OF_TEN[count]) count += 1;
  return count;
}

/** Writes a whole number (0 to 2^53 - 1) in decimal at `at`; returns the
 * offset after it. Digits come from 8-digit parts small enough for integer
 * arithmetic (a token is 16 digits). */
function writeNumber(out: Buffer, at: number, value: number): number {
  const stop = at + digitCount(value);
  let index = stop - 1;
  let rest = value;
  while (rest >= 1e8) {
    const high = Math.floor(rest / 1e8);
    let low = rest - high * 1e8;
    for (let digit = 0; digit < 8; digit += 1) {
      const tenth = (low / 10) | 0;
      out[index] = 0x30 + low - tenth * 10;
      index -= 1;
      low = tenth;
    }
    rest = high;
  }
  let small = rest | 0;
  for (; index >= at; index -= 1) {
    const tenth = (small / 10) | 0;
    out[index] = 0x30 + small - tenth * 10;
    small = tenth;
  }
  return stop;
}

/** The length of whole milliseconds written as seconds (see formatMs). */
function secondsLength(ms: number): number {
  return digitCount(Math.floor(ms / 1000)) + (ms % 1000 === 0 ? 0 : 4);
}

/** Writes whole milliseconds as seconds, as formatMs does, without a string. */
function writeSeconds(out: Buffer, at: number, ms: number): number {
  const frac = ms % 1000;
  let end = writeNumber(out, at, Math.floor(ms / 1000));
  if (frac !== 0) {
    out[end] = 0x2e;
    out[end + 1] = 0x30 + Math.floor(frac / 100);
    out[end + 2] = 0x30 + (Math.floor(frac / 10) % 10);
    out[end + 3] = 0x30 + (frac % 10);
    end += 4;
  }
  return end;
}

/** Starts a line `<op> <key>` of `size` bytes in all; returns it with the
 * offset after the key. */
function keyedLine(op: number, key: Buffer, size: number): Buffer {
  const out = Buffer.allocUnsafe(size);
  out[0] = op;
  out[1] = 0x20;
  out.set(key, 2);
  return out;
}

/** A token's decimal digits: a number when exact, else the bigint's text. */
function tokenDigits(token: bigint): number | string {
  return token <= SAFE_TOKEN ? Number(token) : token.toString();
}

function tokenLength(digits: number | string): number {
  return typeof digits === "number" ? digitCount(digits) : digits.length;
}

function writeToken(out: Buffer, at: number, digits: number | string): number {
  return typeof digits === "number" ? writeNumber(out, at, digits) : at + out.write(digits, at, "latin1");
}

/** The size of an acquire's line. */
function acquireSize(key: Buffer, leaseMs: number, waitMs: number): number {
  return 2 + key.length + 1 + secondsLength(leaseMs) + 1 + secondsLength(waitMs) + 1;
}

/** Writes `A <key> <lease> <wait>\n` at `at`; returns the offset after it. */
function writeAcquire(out: Buffer, at: number, key: Buffer, leaseMs: number, waitMs: number): number {
  out[at] = 0x41;
  out[at + 1] = 0x20;
  out.set(key, at + 2);
  let end = at + 2 + key.length;
  out[end] = 0x20;
  end = writeSeconds(out, end + 1, leaseMs);
  out[end] = 0x20;
  end = writeSeconds(out, end + 1, waitMs);
  out[end] = 0x0a;
  return end + 1;
}

/** Writes `R <key> <token>\n` at `at` (`digits` from tokenDigits); returns
 * the offset after it. */
function writeRelease(out: Buffer, at: number, key: Buffer, digits: number | string): number {
  out[at] = 0x52;
  out[at + 1] = 0x20;
  out.set(key, at + 2);
  const space = at + 2 + key.length;
  out[space] = 0x20;
  const end = writeToken(out, space + 1, digits);
  out[end] = 0x0a;
  return end + 1;
}

/** Request lines, each one Buffer written in place (no strings in between). */
export const encode = {
  acquire: (key: Buffer, leaseMs: number, waitMs: number): Buffer => {
    const out = Buffer.allocUnsafe(acquireSize(key, leaseMs, waitMs));
    writeAcquire(out, 0, key, leaseMs, waitMs);
    return out;
  },
  release: (key: Buffer, token: bigint): Buffer => {
    const digits = tokenDigits(token);
    const out = Buffer.allocUnsafe(2 + key.length + 1 + tokenLength(digits) + 1);
    writeRelease(out, 0, key, digits);
    return out;
  },
  extend: (key: Buffer, token: bigint, leaseMs: number): Buffer => {
    const digits = tokenDigits(token);
    const size = 2 + key.length + 1 + tokenLength(digits) + 1 + secondsLength(leaseMs) + 1;
    const out = keyedLine(0x58, key, size);
    out[2 + key.length] = 0x20;
    let at = writeToken(out, 2 + key.length + 1, digits);
    out[at] = 0x20;
    at = writeSeconds(out, at + 1, leaseMs);
    out[at] = 0x0a;
    return out;
  },
  inspect: (key: Buffer): Buffer => {
    const out = keyedLine(0x49, key, 2 + key.length + 1);
    out[2 + key.length] = 0x0a;
    return out;
  },
  ping: (): Buffer => Buffer.from("P\n"),
  stats: (): Buffer => Buffer.from("S\n"),
  auth: (secret: Buffer): Buffer => {
    const out = keyedLine(0x55, secret, 2 + secret.length + 1);
    out[2 + secret.length] = 0x0a;
    return out;
  },
};

/** One reply line, parsed. The request it answers is found by the slot the
 * reader leaves beside it (ReplyReader's slotOp, keyStart, keyEnd). */
export type Reply =
  | { readonly kind: "A"; readonly token: bigint }
  | { readonly kind: "T" }
  | { readonly kind: "R" }
  | { readonly kind: "X" }
  | { readonly kind: "M"; readonly active: string | null }
  | { readonly kind: "E"; readonly op: string; readonly key: string; readonly code: string }
  | { readonly kind: "P"; readonly role: string; readonly epoch: bigint; readonly address: string | null }
  | { readonly kind: "S"; readonly json: string }
  | {
      readonly kind: "I";
      readonly token: bigint | null;
      readonly leaseLeftMs: number;
      readonly waiters: number;
    }
  | { readonly kind: "U"; readonly name: string };

// The replies that carry nothing but their slot are shared, not allocated.
const T_REPLY: Reply = Object.freeze({ kind: "T" });
const R_REPLY: Reply = Object.freeze({ kind: "R" });
const X_REPLY: Reply = Object.freeze({ kind: "X" });

export class ProtocolError extends Error {}

/** The longest reply line the reader keeps waiting for its end, in bytes. */
export const REPLY_LINE_MAX = 1 << 20;
/** Fields of a reply line whose places are kept (I has the most: 5). */
const FIELDS_MAX = 8;
/** Digits read with number arithmetic (exact below 2^53) before a token's
 * text is used. */
const EXACT_DIGITS_MAX = 16;

/**
 * Reads replies from a byte stream: `feed` a chunk, then `next()` until it
 * returns null. Lines are found by scanning the Buffer for LF (a CR before
 * it is dropped) and parsed from their bytes: no string per line or chunk,
 * none per field but those a reply hands out (a role, an address, an error
 * code), and a token becomes a bigint only in the replies that carry one to
 * the caller. After each reply, `slotOp`, `keyStart` and `keyEnd` give the
 * slot of the request it answers (its operation's byte, and its key as a
 * range of `line`; keyStart -1 for a request without a key, slotOp 0 for a
 * reply that answers no request), for Pairing.take.
 */
export class ReplyReader {
  /** The bytes the last reply was read from. */
  line: Buffer = Buffer.alloc(0);
  slotOp = 0;
  keyStart = -1;
  keyEnd = -1;
  private data: Buffer | null = null;
  private at = 0;
  /** The start of a line whose end has not come yet (a copy). */
  private rest: Buffer | null = null;
  private readonly starts = new Int32Array(FIELDS_MAX);
  private readonly ends = new Int32Array(FIELDS_MAX);

  /** Takes the next chunk of the stream; the lines it completes come from
   * next(). */
  feed(chunk: Buffer): void {
    if (this.rest !== null) {
      chunk = Buffer.concat([this.rest, chunk]);
      this.rest = null;
    }
    this.data = chunk;
    this.at = 0;
  }

  /** The next whole reply fed, or null when none is left. Throws
   * ProtocolError on a line that is no reply or one over REPLY_LINE_MAX. */
  next(): Reply | null {
    const data = this.data;
    if (data === null) return null;
    const start = this.at;
    const lf = data.indexOf(0x0a, start);
    if (lf < 0) {
      this.data = null;
      if (start < data.length) {
        if (data.length - start > REPLY_LINE_MAX) throw new ProtocolError("a reply line longer than 1 MiB");
        this.rest = Buffer.from(data.subarray(start));
      }
      return null;
    }
    this.at = lf + 1;
    return this.parse(data, start, lf > start && data[lf - 1] === 0x0d ? lf - 1 : lf);
  }

  /** Parses the reply in `bytes[start, end)` (without its EOL). */
  parse(bytes: Buffer, start: number, end: number): Reply {
    this.line = bytes;
    this.slotOp = 0;
    this.keyStart = -1;
    this.keyEnd = -1;
    const op = end > start ? bytes[start] : 0;
    if (end > start + 1 && bytes[start + 1] !== 0x20) return this.fail("unknown reply", bytes, start, end);
    if (op === 0x53) {
      // S: the rest of the line is JSON, spaces and all.
      this.slotOp = op;
      return { kind: "S", json: end > start + 2 ? latin1(bytes, start + 2, end) : "" };
    }
    const count = this.split(bytes, start, end);
    const starts = this.starts;
    const ends = this.ends;
    switch (op) {
      case 0x41: // A key token
        this.need(count, 3, bytes, start, end);
        this.keyed(0x41, 1);
        return { kind: "A", token: this.big(2, bytes, start, end) };
      case 0x54: // T key: the acquire's wait ran out
        this.need(count, 2, bytes, start, end);
        this.keyed(0x41, 1);
        return T_REPLY;
      case 0x52: // R key
        this.need(count, 2, bytes, start, end);
        this.keyed(0x52, 1);
        return R_REPLY;
      case 0x58: // X key token
        this.need(count, 3, bytes, start, end);
        this.keyed(0x58, 1);
        this.digits(2, bytes, start, end);
        return X_REPLY;
      case 0x4d: // M op key active
        this.need(count, 4, bytes, start, end);
        this.keyed(ends[1] - starts[1] === 1 ? bytes[starts[1]] : 0, 2);
        return { kind: "M", active: this.dash(3) ? null : latin1(bytes, starts[3], ends[3]) };
      case 0x45: {
        // E op key code
        this.need(count, 4, bytes, start, end);
        const requestOp = ends[1] - starts[1] === 1 ? bytes[starts[1]] : 0;
        if (requestOp === 0x50 || requestOp === 0x53 || requestOp === 0x55) this.slotOp = requestOp;
        else if (requestOp !== 0x2d) this.keyed(requestOp, 2);
        return {
          kind: "E",
          op: latin1(bytes, starts[1], ends[1]),
          key: latin1(bytes, starts[2], ends[2]),
          code: latin1(bytes, starts[3], ends[3]),
        };
      }
      case 0x50: // P role epoch active
        this.need(count, 4, bytes, start, end);
        this.slotOp = 0x50;
        return {
          kind: "P",
          role: latin1(bytes, starts[1], ends[1]),
          epoch: this.big(2, bytes, start, end),
          address: this.dash(3) ? null : latin1(bytes, starts[3], ends[3]),
        };
      case 0x49: // I key token|- lease-left-ms waiters
        this.need(count, 5, bytes, start, end);
        this.keyed(0x49, 1);
        return {
          kind: "I",
          token: this.dash(2) ? null : this.big(2, bytes, start, end),
          leaseLeftMs: Number(latin1(bytes, starts[3], ends[3])),
          waiters: Number(latin1(bytes, starts[4], ends[4])),
        };
      case 0x55: // U name
        this.need(count, 2, bytes, start, end);
        this.slotOp = 0x55;
        return { kind: "U", name: latin1(bytes, starts[1], ends[1]) };
      default:
        return this.fail("unknown reply", bytes, start, end);
    }
  }

  /** Finds the fields (split at each space, as String.split(" ") would);
   * returns how many there are, the first FIELDS_MAX kept in starts/ends. */
  private split(bytes: Buffer, start: number, end: number): number {
    const starts = this.starts;
    const ends = this.ends;
    let count = 0;
    let fieldStart = start;
    for (let index = start; index < end; index += 1) {
      if (bytes[index] !== 0x20) continue;
      if (count < FIELDS_MAX) {
        starts[count] = fieldStart;
        ends[count] = index;
      }
      count += 1;
      fieldStart = index + 1;
    }
    if (count < FIELDS_MAX) {
      starts[count] = fieldStart;
      ends[count] = end;
    }
    return count + 1;
  }

  private keyed(op: number, field: number): void {
    this.slotOp = op;
    this.keyStart = this.starts[field];
    this.keyEnd = this.ends[field];
  }

  private dash(field: number): boolean {
    return this.ends[field] - this.starts[field] === 1 && this.line[this.starts[field]] === 0x2d;
  }

  private need(count: number, wanted: number, bytes: Buffer, start: number, end: number): void {
    if (count !== wanted) this.fail("malformed reply", bytes, start, end);
  }

  /** Checks that a field is 1 to 20 decimal digits; returns its length. */
  private digits(field: number, bytes: Buffer, start: number, end: number): number {
    const from = this.starts[field];
    const to = this.ends[field];
    if (to - from < 1 || to - from > 20) this.fail("bad number in reply", bytes, start, end);
    for (let index = from; index < to; index += 1) {
      const byte = bytes[index];
      if (byte < 0x30 || byte > 0x39) this.fail("bad number in reply", bytes, start, end);
    }
    return to - from;
  }

  private big(field: number, bytes: Buffer, start: number, end: number): bigint {
    const length = this.digits(field, bytes, start, end);
    const from = this.starts[field];
    if (length > EXACT_DIGITS_MAX) return BigInt(latin1(bytes, from, from + length));
    let value = 0;
    for (let index = from; index < from + length; index += 1) value = value * 10 + (bytes[index] - 0x30);
    // 16 digits are exact up to 2^53 - 1 (a value beyond rounds to 2^53 or
    // more, and is read from its text).
    if (value > Number.MAX_SAFE_INTEGER) return BigInt(latin1(bytes, from, from + length));
    return BigInt(value);
  }

  private fail(what: string, bytes: Buffer, start: number, end: number): never {
    const text = latin1(bytes, start, Math.min(end, start + 80));
    throw new ProtocolError(`${what}: ${JSON.stringify(text)}`);
  }
}

/** Parses one reply line (without its EOL); see ReplyReader. */
export function parseReply(bytes: Buffer): Reply {
  return new ReplyReader().parse(bytes, 0, bytes.length);
}

/** An entry of Pairing's table that is free (or the end of a chain). */
const NONE = -1;

/** The hash of a slot (a request's operation byte and key bytes, keyStart
 * -1 for none): FNV-1a, kept to a small integer. */
function slotHash(op: number, bytes: Uint8Array | null, keyStart: number, keyEnd: number): number {
  let hash = Math.imul(0x811c9dc5 ^ op, 0x01000193);
  if (bytes !== null && keyStart >= 0) {
    for (let index = keyStart; index < keyEnd; index += 1) hash = Math.imul(hash ^ bytes[index], 0x01000193);
  } else {
    hash = Math.imul(hash ^ 0x100, 0x01000193);
  }
  return hash & 0x3fffffff;
}

function sameKey(key: Buffer | null, bytes: Uint8Array, keyStart: number, keyEnd: number): boolean {
  if (key === null || keyStart < 0) return key === null && keyStart < 0;
  if (key.length !== keyEnd - keyStart) return false;
  for (let index = 0; index < key.length; index += 1) if (key[index] !== bytes[keyStart + index]) return false;
  return true;
}

/**
 * The requests in flight on one connection, by slot (operation and key),
 * each slot in send order: a reply answers the oldest request of its slot.
 * A hash table of chains kept in arrays, so that pairing a reply compares
 * its key bytes where they lie in the read Buffer: no string, no object per
 * request.
 */
export class Pairing<T> {
  private heads = new Int32Array(64).fill(NONE);
  private ops: number[] = [];
  private keys: (Buffer | null)[] = [];
  private values: (T | undefined)[] = [];
  private hashes: number[] = [];
  private nexts: number[] = [];
  /** Send order, to hand back a broken connection's requests in order. */
  private orders: number[] = [];
  private free = NONE;
  private count = 0;
  private sent = 0;

  get size(): number {
    return this.count;
  }

  /** Adds a request of operation `op` (its byte) on `key` (null: none). */
  add(op: number, key: Buffer | null, value: T): void {
    if (this.count >= this.heads.length) this.grow();
    const hash = slotHash(op, key, 0, key === null ? -1 : key.length);
    let entry = this.free;
    if (entry === NONE) {
      entry = this.ops.length;
      this.ops.push(op);
      this.keys.push(key);
      this.values.push(value);
      this.hashes.push(hash);
      this.nexts.push(NONE);
      this.orders.push(this.sent);
    } else {
      this.free = this.nexts[entry];
      this.ops[entry] = op;
      this.keys[entry] = key;
      this.values[entry] = value;
      this.hashes[entry] = hash;
      this.nexts[entry] = NONE;
      this.orders[entry] = this.sent;
    }
    this.sent += 1;
    this.count += 1;
    this.link(entry);
  }

  /** The request a reply of slot (op, bytes[keyStart, keyEnd)) answers,
   * removed; undefined if none. keyStart -1: a request without a key. */
  take(op: number, bytes: Uint8Array, keyStart: number, keyEnd: number): T | undefined {
    const hash = slotHash(op, bytes, keyStart, keyEnd);
    const bucket = hash & (this.heads.length - 1);
    let previous = NONE;
    for (let entry = this.heads[bucket]; entry !== NONE; entry = this.nexts[entry]) {
      if (this.hashes[entry] === hash && this.ops[entry] === op && sameKey(this.keys[entry], bytes, keyStart, keyEnd)) {
        const value = this.values[entry];
        this.unlink(bucket, previous, entry);
        return value;
      }
      previous = entry;
    }
    return undefined;
  }

  /** Removes a request (whose caller gave up) without pairing a reply. */
  remove(op: number, key: Buffer | null, value: T): boolean {
    const bucket = slotHash(op, key, 0, key === null ? -1 : key.length) & (this.heads.length - 1);
    let previous = NONE;
    for (let entry = this.heads[bucket]; entry !== NONE; entry = this.nexts[entry]) {
      if (this.values[entry] === value && this.ops[entry] === op) {
        this.unlink(bucket, previous, entry);
        return true;
      }
      previous = entry;
    }
    return false;
  }

  /** Every request in flight, removed, in send order (the connection
   * broke). */
  drain(): T[] {
    const live = this.chained();
    live.sort((a, b) => this.orders[a] - this.orders[b]);
    const all = live.map((entry) => this.values[entry] as T);
    this.heads.fill(NONE);
    this.ops = [];
    this.keys = [];
    this.values = [];
    this.hashes = [];
    this.nexts = [];
    this.orders = [];
    this.free = NONE;
    this.count = 0;
    return all;
  }

  /** Appends an entry to the end of its bucket's chain (after the older
   * requests of its slot). */
  private link(entry: number): void {
    const bucket = this.hashes[entry] & (this.heads.length - 1);
    let last = this.heads[bucket];
    if (last === NONE) {
      this.heads[bucket] = entry;
      return;
    }
    while (this.nexts[last] !== NONE) last = this.nexts[last];
    this.nexts[last] = entry;
  }

  private unlink(bucket: number, previous: number, entry: number): void {
    if (previous === NONE) this.heads[bucket] = this.nexts[entry];
    else this.nexts[previous] = this.nexts[entry];
    this.keys[entry] = null;
    this.values[entry] = undefined;
    this.nexts[entry] = this.free;
    this.free = entry;
    this.count -= 1;
  }

  /** The live entries, chain by chain, each chain in order. */
  private chained(): number[] {
    const live: number[] = [];
    for (let bucket = 0; bucket < this.heads.length; bucket += 1) {
      for (let entry = this.heads[bucket]; entry !== NONE; entry = this.nexts[entry]) live.push(entry);
    }
    return live;
  }

  /** Doubles the buckets; a slot's requests keep their order, as they move
   * from one chain to one chain in order. */
  private grow(): void {
    const live = this.chained();
    this.heads = new Int32Array(this.heads.length * 2).fill(NONE);
    for (const entry of live) {
      this.nexts[entry] = NONE;
      this.link(entry);
    }
  }
}

/** The slab an Outbox writes request lines into, in bytes. */
export const OUTBOX_SLAB_BYTES = 64 * 1024;
/** The bytes of request lines after which an Outbox is full: its lines are
 * written without waiting for the end of the tick. With 64 acquire/release
 * loops on one connection (about 1.6 KiB of lines a tick), writing at 1 KiB
 * let the server start sooner and gave more cycles/s in 12 of 16 alternated
 * runs of bench/bench.mjs than one write at the end of each tick. */
export const OUTBOX_BATCH_BYTES = 1024;
/** Below this much room left after a write, the next lines start a new
 * slab. */
const OUTBOX_ROOM_MIN_BYTES = 1024;

/**
 * The request lines of one connection not written yet, copied into a slab so
 * that the lines of one tick leave in one socket write, with no array of
 * Buffers and no concat. A batch taken is a view of the slab that is never
 * written over (the socket may still hold it): later lines go after it, and
 * into a new slab once the room left runs low.
 */
export class Outbox {
  private slab = Buffer.allocUnsafe(OUTBOX_SLAB_BYTES);
  private start = 0;
  private end = 0;

  /** Bytes waiting to be taken. */
  get size(): number {
    return this.end - this.start;
  }

  /** Whether a full batch waits (OUTBOX_BATCH_BYTES or more). */
  get full(): boolean {
    return this.end - this.start >= OUTBOX_BATCH_BYTES;
  }

  push(line: Uint8Array): void {
    if (this.end + line.length > this.slab.length) this.renew(line.length);
    this.slab.set(line, this.end);
    this.end += line.length;
  }

  /** Writes an acquire's line in place (as encode.acquire makes it, with no
   * Buffer of its own). */
  pushAcquire(key: Buffer, leaseMs: number, waitMs: number): void {
    const size = acquireSize(key, leaseMs, waitMs);
    if (this.end + size > this.slab.length) this.renew(size);
    this.end = writeAcquire(this.slab, this.end, key, leaseMs, waitMs);
  }

  /** Writes a release's line in place (as encode.release makes it). */
  pushRelease(key: Buffer, token: bigint): void {
    const digits = tokenDigits(token);
    const size = 2 + key.length + 1 + tokenLength(digits) + 1;
    if (this.end + size > this.slab.length) this.renew(size);
    this.end = writeRelease(this.slab, this.end, key, digits);
  }

  /** The lines pushed since the last take, as one Buffer; null if none. */
  take(): Buffer | null {
    if (this.end === this.start) return null;
    const batch = this.slab.subarray(this.start, this.end);
    this.start = this.end;
    if (this.slab.length - this.end < OUTBOX_ROOM_MIN_BYTES) {
      this.slab = Buffer.allocUnsafe(OUTBOX_SLAB_BYTES);
      this.start = 0;
      this.end = 0;
    }
    return batch;
  }

  /** Drops the lines not taken (the connection broke). */
  clear(): void {
    this.start = this.end;
  }

  /** Moves the lines not taken to a new slab with room for `more` bytes. */
  private renew(more: number): void {
    const waiting = this.end - this.start;
    const slab = Buffer.allocUnsafe(Math.max(OUTBOX_SLAB_BYTES, waiting + more));
    this.slab.copy(slab, 0, this.start, this.end);
    this.slab = slab;
    this.start = 0;
    this.end = waiting;
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
