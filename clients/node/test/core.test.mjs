// The sans-I/O core, without sockets: checks, request lines, the reply
// parser, the line splitter, pairing and the reconnect schedule.

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  LineSplitter,
  Pairing,
  encode,
  formatMs,
  keyBytes,
  leaseMs,
  parseAddress,
  parseReply,
  reconnectDelay,
  slotOf,
  tokenOf,
  waitMs,
} from "../dist/core.js";
import { InvalidArgumentError } from "../dist/errors.js";

test("keys: bytes checked before anything is sent", () => {
  assert.deepEqual(keyBytes("orders/42"), Buffer.from("orders/42"));
  assert.deepEqual(keyBytes(Buffer.from([0xff, 0x80])), Buffer.from([0xff, 0x80]));
  assert.equal(keyBytes("é").length, 2);
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
});

test("replies parse, with the slot of the request they answer", () => {
  assert.deepEqual(parseReply(Buffer.from("A k 18446744073709551615")), {
    kind: "A", slot: "A k", key: "k", token: 18446744073709551615n,
  });
  assert.equal(parseReply(Buffer.from("T k")).slot, "A k");
  assert.equal(parseReply(Buffer.from("R k")).slot, "R k");
  assert.equal(parseReply(Buffer.from("X k 9")).token, 9n);
  assert.deepEqual(parseReply(Buffer.from("M A k 127.0.0.1:7700")), {
    kind: "M", slot: "A k", key: "k", active: "127.0.0.1:7700",
  });
  assert.equal(parseReply(Buffer.from("M R k -")).active, null);
  assert.equal(parseReply(Buffer.from("E A k forbidden")).slot, "A k");
  assert.equal(parseReply(Buffer.from("E U - auth-failed")).slot, "U");
  assert.equal(parseReply(Buffer.from("E - - auth-revoked")).slot, "-");
  assert.deepEqual(parseReply(Buffer.from("I k - 0 2")), {
    kind: "I", slot: "I k", key: "k", token: null, leaseLeftMs: 0, waiters: 2,
  });
  assert.equal(parseReply(Buffer.from("P active 16 127.0.0.1:1")).epoch, 16n);
  assert.equal(parseReply(Buffer.from("U alpha")).name, "alpha");
  assert.equal(parseReply(Buffer.from('S {"role":"active"}')).json, '{"role":"active"}');
  // A non-UTF-8 key pairs with the request that sent the same bytes.
  assert.equal(parseReply(Buffer.from([0x52, 0x20, 0xff])).slot, slotOf("R", Buffer.from([0xff])));
  for (const bad of ["", "Z k", "A k", "A k x", "A k 1 2", "A k 18446744073709551616x"]) {
    assert.throws(() => parseReply(Buffer.from(bad)), bad);
  }
});

test("the line splitter scans chunks for LF and drops a CR before it", () => {
  const splitter = new LineSplitter();
  assert.deepEqual(splitter.push(Buffer.from("A k 1\nR")).map(String), ["A k 1"]);
  assert.deepEqual(splitter.push(Buffer.from(" k\r")).map(String), []);
  assert.deepEqual(splitter.push(Buffer.from("\nT x\nT y\n")).map(String), ["R k", "T x", "T y"]);
});

test("pairing: a reply takes the oldest request of its slot", () => {
  const pairing = new Pairing();
  pairing.add("A k", 1);
  pairing.add("A j", 2);
  pairing.add("A k", 3);
  assert.equal(pairing.size, 3);
  assert.equal(pairing.take("A j"), 2);
  assert.equal(pairing.take("A k"), 1);
  assert.equal(pairing.take("A x"), undefined);
  assert.ok(pairing.remove("A k", 3));
  assert.ok(!pairing.remove("A k", 3));
  assert.equal(pairing.size, 0);
  pairing.add("R k", 4);
  pairing.add("R k", 5);
  assert.deepEqual(pairing.drain().sort(), [4, 5]);
  assert.equal(pairing.size, 0);
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
