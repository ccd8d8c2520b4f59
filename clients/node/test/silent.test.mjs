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
import { QUICK, outcome, singleBlackHoledAddress, using } from "./silent.mjs";

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

test("an acquire on a single black-holed address fails, then the client reconnects", singleBlackHoledAddress);

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
