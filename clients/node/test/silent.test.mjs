// Silent connections (docs/protocol.md §4, issue 35 item 1): a node whose
// host vanished or a partition (no reset, no close), played by the test
// kit's black hole. A request ends or moves within its own limit plus the
// suspicion grace, never only when the link comes back: each test lifts the
// black hole only after the call returned, with a generous outer deadline
// that fails the test instead.

import assert from "node:assert/strict";
import { test } from "node:test";

import { Client, NoConnectionError } from "../dist/index.js";
import { Server, Testkit } from "./harness.mjs";

const OUTER_DEADLINE_MS = 20000;
const QUICK = { suspectAfter: 0.2, pingTimeout: 0.2 };

/** Runs `body` with resources that are stopped whatever happens. */
async function using(body) {
  const cleanups = [];
  const own = (thing, stop) => {
    cleanups.push(() => stop(thing));
    return thing;
  };
  try {
    return await body(own);
  } finally {
    for (const cleanup of cleanups.reverse()) await cleanup();
  }
}

/** The call's outcome: true if granted (the lock released again), else its
 * error; fails past the outer deadline. */
async function outcome(promise) {
  let timer;
  const deadline = new Promise((_, fail) => {
    timer = setTimeout(() => fail(new Error("the call outlived the outer deadline")), OUTER_DEADLINE_MS);
  });
  try {
    const lock = await Promise.race([promise, deadline]);
    await lock.release();
    return true;
  } catch (error) {
    if (error instanceof NoConnectionError) return error;
    throw error;
  } finally {
    clearTimeout(timer);
  }
}

test("an acquire on a black-holed address is granted elsewhere or fails", () =>
  using(async (own) => {
    const s = own(await Server.start(), (x) => x.stop());
    const kit = own(await Testkit.start(), (k) => k.stop());
    const dark = await kit.proxy(s.address);
    const good = await kit.proxy(s.address);
    const c = own(new Client([dark.address, good.address], QUICK), (x) => x.close());
    await c.ping();
    await c.ping();
    await kit.cmd("wait-open", dark.id, 1);
    await kit.cmd("blackhole", dark.id, "on");
    let outcomes;
    try {
      // Round-robin puts one of two acquires on each connection.
      outcomes = await Promise.all(["a", "b"].map((name) => outcome(c.acquire(`silent-${name}`, { wait: 1 }))));
      // The client cut the black-holed connection (suspected only with a
      // request in flight) and connected again.
      await kit.cmd("wait-accepted", dark.id, 2);
    } finally {
      await kit.cmd("blackhole", dark.id, "off");
    }
    for (const result of outcomes) assert.ok(result === true || result instanceof NoConnectionError, String(result));
    assert.ok(outcomes.includes(true), "the acquire on the good connection was granted");
    assert.equal((await c.ping()).role, "active");
  }));

test("an acquire on a single black-holed address fails, then the client reconnects", () =>
  using(async (own) => {
    const s = own(await Server.start(), (x) => x.stop());
    const kit = own(await Testkit.start(), (k) => k.stop());
    const proxy = await kit.proxy(s.address);
    const c = own(new Client(proxy.address), (x) => x.close());
    await c.ping();
    await kit.cmd("wait-open", proxy.id, 2);
    await kit.cmd("blackhole", proxy.id, "on");
    let result;
    try {
      result = await outcome(c.acquire("silent-single", { wait: 1 }));
    } finally {
      await kit.cmd("blackhole", proxy.id, "off");
    }
    assert.ok(result instanceof NoConnectionError, String(result));
    assert.equal((await c.ping()).role, "active", "the client reconnected once the link was back");
    const lock = await c.acquire("silent-single", { wait: 5 });
    await lock.release();
  }));

test("a waiting acquire keeps its answering connection", () =>
  using(async (own) => {
    const s = own(await Server.start(), (x) => x.stop());
    const kit = own(await Testkit.start(), (k) => k.stop());
    const proxy = await kit.proxy(s.address);
    const holder = own(new Client(s.address), (x) => x.close());
    await holder.acquire("silent-busy", { lease: 1.5 });
    const c = own(new Client(proxy.address, QUICK), (x) => x.close());
    // Granted once the holder's lease runs out, after several pings.
    const lock = await c.acquire("silent-busy", { wait: 10 });
    assert.equal(await kit.count("accepted", proxy.id), 2, "an answering connection was cut");
    await kit.cmd("wait-upstream", proxy.id, "-", "P");
    await lock.release();
  }));
