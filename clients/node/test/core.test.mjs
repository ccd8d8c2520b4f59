// The sans-I/O core, without sockets: checks, request lines, the reply
// parser, the line splitter, pairing and the reconnect schedule.

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  OUTBOX_BATCH_BYTES,
  OUTBOX_SLAB_BYTES,
  Outbox,
  Pairing,
  ProtocolError,
  REPLY_LINE_MAX,
  ReplyReader,
  encode,
  formatMs,
  keyBytes,
  leaseMs,
  parseAddress,
  parseReply,
  reconnectDelay,
  tokenOf,
  waitMs,
} from "../dist/core.js";
import { InvalidArgumentError } from "../dist/errors.js";

test("keys: bytes checked before anything is sent", () => {
  assert.deepEqual(keyBytes("orders/42"), Buffer.from("orders/42"));
  assert.deepEqual(keyBytes(Buffer.from([0xff, 0x80])), Buffer.from([0xff, 0x80]));
  assert.equal(keyBytes("é").length, 2);
  assert.deepEqual(keyBytes("a\u00e9b\u{1f512}"), Buffer.from("a\u00e9b\u{1f512}", "utf8"));
  assert.deepEqual(keyBytes("~!\u007f"), Buffer.from([0x7e, 0x21, 0x7f]));
  assert.equal(keyBytes("k".repeat(250)).length, 250);
  for (const bad of ["", "a b", "a\tb", "a\nb", "a\rb", "a\0b", "-", "k".repeat(251), Buffer.alloc(0)]) {
    assert.throws(() => keyBytes(bad), InvalidArgumentError, JSON.stringify(String(bad)));
  }
  assert.throws(() => keyBytes(42), InvalidArgumentError);
  assert.throws(() => keyBytes("k".repeat(251)), /1 to 250 bytes/);
});

test("leases and waits: the accepted range, in milliseconds", () => {
  assert.equal(leaseMs(30), 30000);
  assert.equal(leaseMs(0.5), 500);
  assert.equal(leaseMs(86400), 86400000);
  for (const bad of [0, -1, 86400.5, NaN, Infinity, "30", 0.0001]) {
    assert.throws(() => leaseMs(bad), InvalidArgumentError, String(bad));
  }
  assert.throws(() => leaseMs(-1), /0.001 to 86400/);
  assert.equal(waitMs("forever"), null);
  assert.equal(waitMs("once"), 0);
  assert.equal(waitMs(2.125), 2125);
  for (const bad of [0, -1, "0", null, 90000]) assert.throws(() => waitMs(bad), InvalidArgumentError, String(bad));
  assert.throws(() => waitMs(0), /"once", "forever"/);
});

test("tokens are u64 bigints", () => {
  assert.equal(tokenOf(5n), 5n);
  assert.equal(tokenOf("18446744073709551615"), 18446744073709551615n);
  for (const bad of [5, -1n, 18446744073709551616n, "x", "-1"]) assert.throws(() => tokenOf(bad), InvalidArgumentError);
});

test("request lines", () => {
  assert.equal(formatMs(30000), "30");
  assert.equal(formatMs(2125), "2.125");
  assert.equal(formatMs(50), "0.050");
  assert.equal(encode.acquire(Buffer.from("k"), 30000, 1).toString(), "A k 30 0.001\n");
  assert.equal(encode.release(Buffer.from("k"), 18446744073709551615n).toString(), "R k 18446744073709551615\n");
  assert.equal(encode.extend(Buffer.from("k"), 7n, 1500).toString(), "X k 7 1.500\n");
  assert.equal(encode.inspect(Buffer.from("k")).toString(), "I k\n");
  assert.deepEqual(encode.acquire(Buffer.from([0xff]), 1000, 0), Buffer.from([0x41, 0x20, 0xff, 0x20, 0x31, 0x20, 0x30, 0x0a]));
  assert.equal(encode.acquire(Buffer.from("k"), 86400000, 1234567).toString(), "A k 86400 1234.567\n");
  assert.equal(encode.acquire(Buffer.from("k"), 10, 100).toString(), "A k 0.010 0.100\n");
  assert.equal(encode.release(Buffer.from("k"), 0n).toString(), "R k 0\n");
  assert.equal(encode.release(Buffer.from("k"), 9007199254740991n).toString(), "R k 9007199254740991\n");
  assert.equal(encode.release(Buffer.from("k"), 9007199254740993n).toString(), "R k 9007199254740993\n");
  assert.equal(encode.extend(Buffer.from("k"), 18446744073709551615n, 30000).toString(), "X k 18446744073709551615 30\n");
  assert.equal(encode.auth(Buffer.from("s3cret")).toString(), "U s3cret\n");
  for (let ms = 0; ms < 3000; ms += 7) {
    const line = encode.extend(Buffer.from("k"), BigInt(ms) * 1000003n, ms).toString();
    assert.equal(line, `X k ${BigInt(ms) * 1000003n} ${formatMs(ms)}\n`);
  }
});

/** A reply's slot as text: the operation it answers and its key ("-" for
 * none, "" for a reply that answers no request). */
function slotOfLine(text) {
  const reader = new ReplyReader();
  const bytes = Buffer.from(text, "latin1");
  const reply = reader.parse(bytes, 0, bytes.length);
  const op = reader.slotOp === 0 ? "" : String.fromCharCode(reader.slotOp);
  const key = reader.keyStart < 0 ? "-" : bytes.toString("latin1", reader.keyStart, reader.keyEnd);
  return { reply, slot: op === "" ? "" : `${op} ${key}` };
}

test("replies parse from bytes, with the slot of the request they answer", () => {
  assert.deepEqual(slotOfLine("A k 18446744073709551615"), {
    reply: { kind: "A", token: 18446744073709551615n },
    slot: "A k",
  });
  assert.equal(parseReply(Buffer.from("A k 7")).token, 7n);
  assert.equal(parseReply(Buffer.from("A k 123456789012345")).token, 123456789012345n);
  assert.equal(parseReply(Buffer.from("A k 1234567890123456")).token, 1234567890123456n);
  // 16 digits on both sides of 2^53 (read with number arithmetic below it).
  for (const token of [4503599627370497n, 9007199254740991n, 9007199254740992n, 9007199254740993n, 9999999999999999n]) {
    assert.equal(parseReply(Buffer.from(`A k ${token}`)).token, token);
    assert.equal(encode.release(Buffer.from("k"), token).toString(), `R k ${token}\n`);
  }
  for (const token of [0n, 9n, 10n, 99999999n, 100000000n, 100000001n, 1234567890123456n]) {
    assert.equal(encode.release(Buffer.from("k"), token).toString(), `R k ${token}\n`);
  }
  assert.deepEqual(slotOfLine("T k"), { reply: { kind: "T" }, slot: "A k" });
  assert.deepEqual(slotOfLine("R k"), { reply: { kind: "R" }, slot: "R k" });
  assert.deepEqual(slotOfLine("X k 9"), { reply: { kind: "X" }, slot: "X k" });
  assert.deepEqual(slotOfLine("M A k 127.0.0.1:7700"), {
    reply: { kind: "M", active: "127.0.0.1:7700" },
    slot: "A k",
  });
  assert.equal(parseReply(Buffer.from("M R k -")).active, null);
  assert.deepEqual(slotOfLine("E A k forbidden"), {
    reply: { kind: "E", op: "A", key: "k", code: "forbidden" },
    slot: "A k",
  });
  assert.equal(slotOfLine("E U - auth-failed").slot, "U -");
  assert.equal(slotOfLine("E P - shutting-down").slot, "P -");
  assert.equal(slotOfLine("E - - auth-revoked").slot, "");
  assert.equal(parseReply(Buffer.from("E - - auth-revoked")).op, "-");
  assert.equal(slotOfLine("E AB k forbidden").slot, "");
  assert.deepEqual(slotOfLine("I k - 0 2"), {
    reply: { kind: "I", token: null, leaseLeftMs: 0, waiters: 2 },
    slot: "I k",
  });
  assert.equal(parseReply(Buffer.from("I k 5 1500 0")).token, 5n);
  assert.deepEqual(slotOfLine("P active 16 127.0.0.1:1"), {
    reply: { kind: "P", role: "active", epoch: 16n, address: "127.0.0.1:1" },
    slot: "P -",
  });
  assert.equal(parseReply(Buffer.from("P standby 3 -")).address, null);
  assert.deepEqual(slotOfLine("U alpha"), { reply: { kind: "U", name: "alpha" }, slot: "U -" });
  assert.deepEqual(slotOfLine('S {"role":"active", "x": 1}'), {
    reply: { kind: "S", json: '{"role":"active", "x": 1}' },
    slot: "S -",
  });
  // A non-UTF-8 key's slot holds its bytes as they are.
  assert.equal(slotOfLine("R \xff").slot, "R \xff");
  for (const bad of ["", "Z k", "A k", "A k x", "A k 1 2", "A k 18446744073709551616x", "AB k 1", "X k", "X k -1",
    "A k 123456789012345678901", "T", "P active x -", "I k 1 2", "Sx"]) {
    assert.throws(() => parseReply(Buffer.from(bad)), ProtocolError, bad);
  }
});

test("the reply reader scans chunks for LF, drops a CR before it, and keeps a split line", () => {
  const reader = new ReplyReader();
  const read = (text) => {
    reader.feed(Buffer.from(text, "latin1"));
    const slots = [];
    for (let reply = reader.next(); reply !== null; reply = reader.next()) {
      slots.push(`${reply.kind} ${reader.line.toString("latin1", reader.keyStart, reader.keyEnd)}`);
    }
    return slots;
  };
  assert.deepEqual(read("A k 1\nR"), ["A k"]);
  assert.deepEqual(read(" k\r"), []);
  assert.deepEqual(read("\nT x\nT y\n"), ["R k", "T x", "T y"]);
  assert.deepEqual(read("R a"), []);
  assert.deepEqual(read("b\r\n"), ["R ab"]);
  reader.feed(Buffer.from("A k 1\nZ\nR k\n"));
  assert.equal(reader.next().kind, "A");
  assert.throws(() => reader.next(), ProtocolError);
  const long = new ReplyReader();
  long.feed(Buffer.alloc(REPLY_LINE_MAX + 1, 0x41));
  assert.throws(() => long.next(), /longer than 1 MiB/);
});

test("pairing: a reply takes the oldest request of its slot, matched by key bytes", () => {
  const A = 0x41;
  const R = 0x52;
  const P = 0x50;
  const key = (text) => Buffer.from(text, "latin1");
  const line = key("A k A j A x R k R \xff");
  const pairing = new Pairing();
  pairing.add(A, key("k"), 1);
  pairing.add(A, key("j"), 2);
  pairing.add(A, key("k"), 3);
  pairing.add(P, null, 6);
  assert.equal(pairing.size, 4);
  assert.equal(pairing.take(A, line, 6, 7), 2);
  assert.equal(pairing.take(A, line, 2, 3), 1);
  assert.equal(pairing.take(A, line, 10, 11), undefined);
  assert.equal(pairing.take(R, line, 14, 15), undefined);
  assert.equal(pairing.take(A, line, -1, -1), undefined);
  assert.equal(pairing.take(P, line, 2, 3), undefined);
  assert.equal(pairing.take(P, line, -1, -1), 6);
  assert.ok(pairing.remove(A, key("k"), 3));
  assert.ok(!pairing.remove(A, key("k"), 3));
  assert.equal(pairing.size, 0);
  pairing.add(R, key("\xff"), 4);
  pairing.add(R, key("k"), 5);
  assert.equal(pairing.take(R, line, 18, 19), 4);
  pairing.add(R, key("\xff"), 7);
  assert.deepEqual(pairing.drain(), [5, 7]);
  assert.equal(pairing.size, 0);
});

test("pairing: many requests, one slot's in send order after the table grows", () => {
  const pairing = new Pairing();
  const keys = Array.from({ length: 500 }, (_, index) => Buffer.from(`key-${index % 50}`));
  keys.forEach((key, index) => pairing.add(0x41, key, index));
  assert.equal(pairing.size, 500);
  const line = Buffer.from("key-7");
  const taken = [];
  for (let value = pairing.take(0x41, line, 0, line.length); value !== undefined; value = pairing.take(0x41, line, 0, line.length)) {
    taken.push(value);
  }
  assert.deepEqual(taken, Array.from({ length: 10 }, (_, index) => 7 + 50 * index));
  const rest = pairing.drain();
  assert.equal(rest.length, 490);
  assert.deepEqual(rest, [...rest].sort((a, b) => a - b));
});

test("the outbox hands out one tick's lines as one Buffer and never writes over a batch", () => {
  const outbox = new Outbox();
  assert.equal(outbox.take(), null);
  outbox.push(Buffer.from("A k 30 0\n"));
  outbox.push(Buffer.from("R k 1\n"));
  assert.ok(!outbox.full);
  const first = outbox.take();
  assert.equal(first.toString(), "A k 30 0\nR k 1\n");
  const big = Buffer.alloc(OUTBOX_SLAB_BYTES * 2, 0x61);
  for (let index = 0; index < 100; index += 1) outbox.push(Buffer.from(`R key-${index} ${index}\n`));
  assert.equal(outbox.full, outbox.size >= OUTBOX_BATCH_BYTES);
  outbox.push(big);
  assert.ok(outbox.full);
  const second = outbox.take();
  assert.equal(second.length, big.length + Buffer.byteLength(Array.from({ length: 100 }, (_, i) => `R key-${i} ${i}\n`).join("")));
  assert.ok(second.toString().startsWith("R key-0 0\nR key-1 1\n"));
  assert.equal(first.toString(), "A k 30 0\nR k 1\n");
  outbox.push(Buffer.from("P\n"));
  outbox.clear();
  assert.equal(outbox.size, 0);
  assert.equal(outbox.take(), null);
});

test("the outbox writes acquire and release lines in place, byte for byte as encode makes them, across slabs", () => {
  const outbox = new Outbox();
  const expected = [];
  const tokens = [0n, 7n, 9007199254740991n, 9007199254740993n, 18446744073709551615n];
  // Enough lines (of keys up to 250 bytes) to fill several slabs, taken in
  // batches of varying size.
  for (let index = 0; index < 2000; index += 1) {
    const key = Buffer.from(`key-${index}-${"x".repeat(index % 251 === 0 ? 240 : index % 13)}`);
    if (index % 2 === 0) {
      const lease = 1 + ((index * 37) % 86400000);
      const wait = index % 3 === 0 ? 0 : (index * 11) % 100000;
      outbox.pushAcquire(key, lease, wait);
      expected.push(encode.acquire(key, lease, wait));
    } else {
      const token = tokens[index % tokens.length];
      outbox.pushRelease(key, token);
      expected.push(encode.release(key, token));
    }
    if (index % 97 === 0) {
      assert.deepEqual(outbox.take(), Buffer.concat(expected.splice(0)));
    }
  }
  assert.deepEqual(outbox.take(), Buffer.concat(expected));
});

test("reconnect schedule: at once, then doubling within [d/2, d] up to the cap", () => {
  assert.equal(reconnectDelay(0, 50, 3000, 0.7), 0);
  assert.equal(reconnectDelay(1, 50, 3000, 0), 25);
  assert.equal(reconnectDelay(1, 50, 3000, 1), 50);
  assert.equal(reconnectDelay(3, 50, 3000, 1), 200);
  assert.equal(reconnectDelay(8, 50, 3000, 0), 1500);
  assert.equal(reconnectDelay(500, 50, 3000, 1), 3000);
  assert.equal(reconnectDelay(2, 50, 3000, NaN), 50);
});

test("addresses", () => {
  assert.deepEqual(parseAddress("127.0.0.1:7700"), { host: "127.0.0.1", port: 7700 });
  assert.deepEqual(parseAddress("[::1]:7700"), { host: "::1", port: 7700 });
  for (const bad of ["127.0.0.1", "x:0", "x:70000", ":1"]) assert.throws(() => parseAddress(bad), InvalidArgumentError);
});
