// One test per id of clients/scenarios.json (docs/protocol.md section 4),
// against the real server and ringlock-testkit; a test fails if an id has
// none.

import assert from "node:assert/strict";
import { readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import {
  AuthenticationError,
  Client,
  ConnectionError,
  ForbiddenError,
  LockTimeoutError,
  NoActiveNodeError,
  NoConnectionError,
  TLSError,
} from "../dist/index.js";
import { ALPHA_SECRET, AuthFile, BETA_SECRET, SCENARIOS, Server, Testkit, sleep } from "./harness.mjs";
import { singleBlackHoledAddress } from "./silent.mjs";

const ids = JSON.parse(readFileSync(SCENARIOS, "utf8")).scenarios.map((scenario) => scenario.id);

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

const server = async (own, ...args) => own(await Server.start(...args), (s) => s.stop());
const testkit = async (own) => own(await Testkit.start(), (k) => k.stop());
const client = (own, addresses, options) => own(new Client(addresses, options), (c) => c.close());

async function cycle(c, key, options = { wait: 5 }) {
  const lock = await c.acquire(key, options);
  await lock.release();
  return lock;
}

/** Waits (polling) until `check` is true, or fails after 10 s. */
async function until(check, what) {
  const deadline = Date.now() + 10000;
  while (!(await check())) {
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await sleep(10);
  }
}

/** Captures a promise's rejection (fails if it resolves). */
async function rejection(promise) {
  try {
    await promise;
  } catch (error) {
    return error;
  }
  assert.fail("expected a rejection");
}

const authServer = async (own) => {
  const file = own(new AuthFile({ alpha: ALPHA_SECRET, beta: BETA_SECRET }), (f) => f.cleanup());
  const s = await server(own, "--auth-file", file.path);
  return { file, s };
};

let certs;
const cert = (name) => readFileSync(join(certs, name));
const tlsServer = (own, ...more) =>
  server(own, "--tls-cert", join(certs, "server.pem"), "--tls-key", join(certs, "server-key.pem"), ...more);

const scenarios = {
  "one-address-two-connections": () =>
    using(async (own) => {
      const s = await server(own);
      const kit = await testkit(own);
      const proxy = await kit.proxy(s.address);
      const c = client(own, proxy.address);
      await c.ping();
      await kit.cmd("wait-open", proxy.id, 2);
      assert.equal((await kit.cmd("open", proxy.id))[0], "2");
    }),

  "round-robin": () =>
    using(async (own) => {
      const s = await server(own);
      const kit = await testkit(own);
      const one = await kit.proxy(s.address);
      const two = await kit.proxy(s.address);
      const c = client(own, [one.address, two.address]);
      await kit.cmd("wait-open", one.id, 1);
      await kit.cmd("wait-open", two.id, 1);
      for (let index = 0; index < 8; index += 1) await cycle(c, `rr-${index}`);
      for (const proxy of [one, two]) {
        const [conn] = await kit.cmd("wait-upstream", proxy.id, "-", "rr-");
        assert.match(conn, /^[0-9]+$/);
      }
    }),

  "cut-node-left-out-and-reconnected": () =>
    using(async (own) => {
      const s = await server(own);
      const kit = await testkit(own);
      const one = await kit.proxy(s.address);
      const two = await kit.proxy(s.address);
      const c = client(own, [one.address, two.address]);
      await kit.cmd("wait-open", one.id, 1);
      await kit.cmd("wait-open", two.id, 1);
      await kit.cmd("refuse", one.id, "on");
      await kit.cmd("cut", one.id);
      for (let index = 0; index < 20; index += 1) await cycle(c, `cut-${index}`);
      const accepted = await kit.count("accepted", one.id);
      await kit.cmd("refuse", one.id, "off");
      await kit.side("wait-accepted", one.id, accepted + 1);
      await kit.cmd("wait-open", one.id, 1);
      for (let index = 0; index < 4; index += 1) await cycle(c, `after-${index}`);
    }),

  "pipelined-pairing-out-of-order": () =>
    using(async (own) => {
      const s = await server(own);
      const kit = await testkit(own);
      const proxy = await kit.proxy(s.address);
      const c = client(own, proxy.address);
      await c.ping();
      await kit.cmd("reorder", proxy.id, "on");
      const keys = Array.from({ length: 16 }, (_, index) => `po-${index}`);
      const locks = await Promise.all(keys.map((key) => c.acquire(key, { wait: 10 })));
      await kit.cmd("resume", proxy.id);
      locks.forEach((lock, index) => assert.equal(lock.key, keys[index]));
      assert.equal(new Set(locks.map((lock) => lock.token)).size, 16);
      // Each token is that key's grant: its release is answered released.
      await Promise.all(locks.map((lock) => lock.release()));
    }),

  "same-key-in-send-order": () =>
    using(async (own) => {
      const s = await server(own);
      const kit = await testkit(own);
      const proxy = await kit.proxy(s.address);
      const c = client(own, proxy.address);
      const first = await c.acquire("k", { wait: 5 });
      const second = c.acquire("k", { wait: "forever" });
      await kit.cmd("wait-upstream", proxy.id, "-", "A k 30 0");
      await first.release();
      const lock = await second;
      assert.ok(lock.token > first.token);
      await lock.release();
    }),

  "acquire-moves-on-cut": () =>
    using(async (own) => {
      const s = await server(own);
      const kit = await testkit(own);
      const proxy = await kit.proxy(s.address);
      const c = client(own, proxy.address);
      await c.ping();
      await kit.cmd("wait-open", proxy.id, 2);
      await kit.cmd("stall", proxy.id);
      const pending = c.acquire("moving", { wait: 10 });
      const [conn] = await kit.cmd("wait-upstream", proxy.id, "-", "A moving");
      await kit.cmd("cut", proxy.id, conn);
      await kit.cmd("resume", proxy.id);
      const lock = await pending;
      assert.ok(lock.locked);
      const error = await rejection(c.acquire("moving", { wait: 0.2 }));
      assert.ok(error instanceof LockTimeoutError, String(error));
      await lock.release();
    }),

  "no-connection-left": () =>
    using(async (own) => {
      const s = await server(own);
      const kit = await testkit(own);
      const proxy = await kit.proxy(s.address);
      const c = client(own, proxy.address);
      await c.ping();
      await kit.cmd("wait-open", proxy.id, 2);
      await kit.cmd("refuse", proxy.id, "on");
      await kit.cmd("cut", proxy.id);
      await kit.cmd("wait-open", proxy.id, 0);
      const started = performance.now();
      const error = await rejection(c.acquire("nc", { wait: 1 }));
      const took = performance.now() - started;
      assert.ok(error instanceof NoConnectionError, String(error));
      assert.ok(error instanceof ConnectionError);
      assert.ok(took >= 900, `returned after ${took} ms`);
      assert.match(error.message, /after [0-9.]+ s/);
      assert.ok(error.message.includes(proxy.address), error.message);
      assert.match(error.message, /closed by the server/);
    }),

  "release-retried": () =>
    using(async (own) => {
      const s = await server(own);
      const kit = await testkit(own);
      const proxy = await kit.proxy(s.address);
      const c = client(own, proxy.address);
      const lock = await c.acquire("k", { wait: 5 });
      await kit.cmd("stall", proxy.id);
      const releasing = lock.release();
      await kit.cmd("wait-upstream", proxy.id, "-", "R k");
      await kit.cmd("cut", proxy.id);
      await kit.cmd("resume", proxy.id);
      await releasing;
      const again = await c.acquire("k", { wait: 0.1 });
      await again.release();
    }),

  "restart-within-wait": () =>
    using(async (own) => {
      const s = await server(own);
      const c = client(own, s.address);
      const before = await c.acquire("before", { wait: 5 });
      await before.release();
      await s.kill();
      await until(() => c.usableConnections === 0, "the client to see its connections broken");
      const pending = c.acquire("after-restart", { wait: 20 });
      await sleep(20);
      await s.restart();
      const lock = await pending;
      assert.ok(lock.token > before.token);
      await lock.release();
    }),

  "connect-backoff": () =>
    using(async (own) => {
      const s = await server(own);
      const kit = await testkit(own);
      const proxy = await kit.proxy(s.address);
      await kit.cmd("refuse", proxy.id, "on");
      client(own, proxy.address, { connectionsPerNode: 1, reconnectDelayMax: 1 });
      await kit.side("wait-attempts", proxy.id, 9);
      const [, ...times] = await kit.cmd("attempts", proxy.id);
      const at = times.slice(0, 9).map(Number);
      const gaps = at.slice(1).map((time, index) => (time - at[index]) / 1000);
      const mean = (list) => list.reduce((a, b) => a + b, 0) / list.length;
      assert.ok(gaps[0] < 0.5, `first gap ${gaps}`);
      assert.ok(mean(gaps.slice(-3)) > 2 * mean(gaps.slice(0, 3)), `gaps ${gaps}`);
      assert.ok(Math.max(...gaps.slice(-3)) >= 0.3, `gaps ${gaps}`);
      assert.ok(Math.max(...gaps) <= 2.5, `gaps ${gaps}`);
    }),

  "redirect-followed": () =>
    using(async (own) => {
      const s = await server(own);
      const kit = await testkit(own);
      const fake = await kit.fake(s.address);
      const c = client(own, [fake.address, s.address]);
      let firstSeen = 0;
      for (let index = 0; index < 20; index += 1) {
        await cycle(c, `rd-${index}`);
        if (firstSeen === 0) firstSeen = await kit.count("redirected", fake.id);
      }
      // Round-robin sent a request to the fake, which redirected it; from
      // then on the client sent to the active only.
      assert.ok(firstSeen >= 1);
      assert.equal(await kit.count("redirected", fake.id), firstSeen);
    }),

  "redirect-to-no-active": () =>
    using(async (own) => {
      const kit = await testkit(own);
      const fake = await kit.fake("-");
      const c = client(own, fake.address);
      const error = await rejection(c.acquire("na", { wait: 1 }));
      assert.ok(error instanceof NoActiveNodeError, String(error));
    }),

  "timeout-is-not-a-grant": () =>
    using(async (own) => {
      const s = await server(own);
      const one = client(own, s.address);
      const two = client(own, s.address);
      const lock = await one.acquire("k", { wait: 5 });
      const error = await rejection(two.acquire("k", { wait: 0.2 }));
      assert.ok(error instanceof LockTimeoutError, String(error));
      assert.ok(await lock.held());
      await lock.release();
    }),

  "delayed-replies": () =>
    using(async (own) => {
      const s = await server(own);
      const kit = await testkit(own);
      const proxy = await kit.proxy(s.address);
      await kit.cmd("delay", proxy.id, 300);
      const c = client(own, proxy.address);
      const lock = await c.acquire("slow", { wait: 5 });
      assert.equal(lock.key, "slow");
      await lock.extend(20);
      await lock.release();
    }),

  "silent-connection-suspected": singleBlackHoledAddress,

  "auth-ok": () =>
    using(async (own) => {
      const { s } = await authServer(own);
      const c = client(own, s.address, { secret: ALPHA_SECRET });
      await cycle(c, "alpha/one");
      assert.equal(c.name, "alpha");
    }),

  "auth-wrong": () =>
    using(async (own) => {
      const { s } = await authServer(own);
      const c = client(own, s.address, { secret: "nobody-1234" });
      const error = await rejection(c.acquire("alpha/x", { wait: 1 }));
      assert.ok(error instanceof AuthenticationError, String(error));
      assert.ok(error.message.includes(s.address), error.message);
      assert.match(error.message, /auth-failed/);
      assert.ok(!error.message.includes("nobody-1234"));
    }),

  "auth-forbidden-key": () =>
    using(async (own) => {
      const { s } = await authServer(own);
      const c = client(own, s.address, { secret: ALPHA_SECRET });
      const error = await rejection(c.acquire("beta/x", { wait: 1 }));
      assert.ok(error instanceof ForbiddenError, String(error));
      await cycle(c, "alpha/x");
    }),

  "auth-revoked-on-reload": () =>
    using(async (own) => {
      const { file, s } = await authServer(own);
      const alpha = client(own, s.address, { secret: ALPHA_SECRET });
      const beta = client(own, s.address, { secret: BETA_SECRET });
      await cycle(alpha, "alpha/one");
      await cycle(beta, "beta/one");
      file.write({ beta: BETA_SECRET });
      s.signal("SIGHUP");
      const error = await rejection(
        (async () => {
          // Until the reload lands, alpha's acquires may still be granted.
          for (;;) {
            const lock = await alpha.acquire("alpha/two", { wait: 1 });
            await lock.release();
            await sleep(20);
          }
        })(),
      );
      assert.ok(error instanceof AuthenticationError, String(error));
      assert.match(error.message, /auth-failed/);
      assert.ok(error.message.includes(s.address));
      await cycle(beta, "beta/two");
    }),

  "auth-reconnect": () =>
    using(async (own) => {
      const { s } = await authServer(own);
      const c = client(own, s.address, { secret: ALPHA_SECRET });
      await cycle(c, "alpha/one");
      await s.kill();
      await until(() => c.usableConnections === 0, "the client to see its connections broken");
      await s.restart();
      const lock = await c.acquire("alpha/two", { wait: 5 });
      await lock.release();
    }),

  "tls-connect": () =>
    using(async (own) => {
      const s = await tlsServer(own);
      const c = client(own, s.address, { tlsCa: cert("ca.pem") });
      const lock = await c.acquire("tls", { wait: 5 });
      await lock.extend(20);
      await lock.release();
      await Promise.all(Array.from({ length: 64 }, (_, index) => cycle(c, `tls-${index}`)));
    }),

  "tls-mtls": () =>
    using(async (own) => {
      const s = await tlsServer(own, "--tls-client-ca", join(certs, "ca.pem"));
      const good = client(own, s.address, {
        tlsCa: cert("ca.pem"),
        tlsCert: cert("client.pem"),
        tlsKey: cert("client-key.pem"),
      });
      await cycle(good, "mtls");
      const bare = client(own, s.address, { tlsCa: cert("ca.pem") });
      const error = await rejection(bare.acquire("mtls", { wait: 1 }));
      assert.ok(error instanceof ConnectionError, String(error));
      assert.ok(error.message.includes(s.address), error.message);
      assert.match(error.message, /TLS|SSL|certificate/i);
    }),

  "tls-wrong-ca": () =>
    using(async (own) => {
      const s = await tlsServer(own);
      const c = client(own, s.address, { tlsCa: cert("other-ca.pem") });
      const error = await rejection(c.acquire("wrong", { wait: 1 }));
      assert.ok(error instanceof TLSError, String(error));
      assert.ok(error.message.includes(s.address), error.message);
      assert.match(error.message, /not trusted/);
    }),
};

describe("scenarios", () => {
  before(async () => {
    certs = await Testkit.certs();
  });

  test("every scenario id has a test", () => {
    const missing = ids.filter((id) => !(id in scenarios));
    assert.deepEqual(missing, []);
    const unknown = Object.keys(scenarios).filter((id) => !ids.includes(id));
    assert.deepEqual(unknown, []);
  });

  for (const id of ids) {
    test(id, { timeout: 60000 }, async () => {
      const body = scenarios[id];
      assert.ok(body, `no test for scenario ${id}`);
      await body();
    });
  }

  after(() => {
    if (certs) rmSync(certs, { recursive: true, force: true });
  });
});
