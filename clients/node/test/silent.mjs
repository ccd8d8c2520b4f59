// What the silent-connection tests share, and the one that is also the
// shared scenario silent-connection-suspected (clients/scenarios.json), so
// that both test files run the same body without importing each other's
// tests.

import assert from "node:assert/strict";

import { Client, NoConnectionError } from "../dist/index.js";
import { Server, Testkit } from "./harness.mjs";

export const OUTER_DEADLINE_MS = 20000;
export const QUICK = { suspectAfter: 0.2, pingTimeout: 0.2 };

/** Runs `body` with resources that are stopped whatever happens. */
export async function using(body) {
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
export async function outcome(promise) {
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

/** An acquire on a single black-holed address fails with NoConnectionError
 * within its wait and the suspicion grace; once the black hole is lifted the
 * client reconnects and serves. */
export const singleBlackHoledAddress = () =>
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
  });
