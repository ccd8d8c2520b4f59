// One test per id of clients/scenarios.json (docs/protocol.md section 4),
// against the real server and ringlock-testkit; a test fails if an id has
// none.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFileSync, rmSync } from "node:fs";
import { dirname, join } from "node:path";
import { promisify } from "node:util";
import { after, before, describe, test } from "node:test";

import {
  AuthenticationError,
  Client,
  ConnectionError,
  ForbiddenError,
  InvalidArgumentError,
  LockLostError,
  LockTimeoutError,
  NoActiveNodeError,
  NoConnectionError,
  NotHolderError,
  ServerError,
  TLSError,
} from "../dist/index.js";
import {
  ALPHA_SECRET,
  AuthFile,
  BETA_SECRET,
  Cluster,
  RawConnection,
  SCENARIOS,
  Server,
  Testkit,
  binary,
  freePort,
  rawLine,
  sleep,
} from "./harness.mjs";
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

/** `promise`, or a rejection if it has not settled within 20 s: a call that
 * would hang (an acquire queued behind a holder) fails the test instead. */
function bounded(promise) {
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error("the call did not return within 20 s")), 20000);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

/** Takes `key` with `ringlock-cli acquire` (a process of its own); the
 * token it printed. */
async function cliAcquire(address, key) {
  const cli = join(dirname(binary("ringlock", "RINGLOCK_BIN")), "ringlock-cli");
  const { stdout } = await promisify(execFile)(cli, ["acquire", "--servers", address, "--lease", "30", key], {
    timeout: 30000,
  });
  return BigInt(stdout.match(/[0-9]+/g).at(-1));
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

  "shutting-down-retried": () =>
    using(async (own) => {
      const s = await server(own);
      const holder = await RawConnection.open(s.address);
      try {
        assert.match(await holder.call("A stopping 60 0"), /^A /);
        const c = client(own, s.address);
        const pending = c.acquire("stopping", { wait: 20 });
        await until(async () => (await rawLine(s.address, "I stopping"))?.endsWith(" 1"), "the acquire to be queued");
        // The stopping server answers the queued acquire shutting-down, which
        // had no effect: the client sends it again to the next server, within
        // its wait.
        assert.equal(await s.terminate(), 0);
        await s.restart();
        const lock = await pending;
        await lock.release();
      } finally {
        holder.close();
      }
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

  "wait-forms": () =>
    using(async (own) => {
      const s = await server(own);
      const holderClient = client(own, s.address);
      const c = client(own, s.address);
      const holder = await holderClient.acquire("forms", { lease: 30, wait: 5 });
      // It returns while the holder holds the key (queued behind it, it
      // would not): never queued.
      const tried = await rejection(bounded(c.acquire("forms", { lease: 30, wait: "once" })));
      assert.ok(tried instanceof LockTimeoutError, String(tried));
      assert.equal((await c.inspect("forms")).waiters, 0, "no try left queued behind the holder");
      assert.ok((await rejection(c.acquire("forms", { lease: 30, wait: 0.2 }))) instanceof LockTimeoutError);
      // A bare 0 is refused: write "once".
      for (const wait of [0, -1, 86401, Infinity, NaN]) {
        assert.throws(
          () => c.acquire("forms", { lease: 30, wait }),
          (error) => error instanceof InvalidArgumentError && error.argument === "wait" && /86400/.test(error.message),
          `wait ${wait}`,
        );
      }
      const forever = c.acquire("forms", { lease: 30, wait: "forever" });
      await until(async () => (await c.inspect("forms")).waiters === 1, "the forever acquire to queue");
      await holder.release();
      const next = await forever;
      assert.ok(next.token > holder.token);
      await next.release();
      const free = await c.acquire("forms", { lease: 30, wait: "once" });
      await free.release();
    }),

  "held-asks-server": () =>
    using(async (own) => {
      const s = await server(own);
      const c = client(own, s.address);
      const lock = await c.acquire("asked", { lease: 30, wait: 5 });
      assert.equal(await lock.held(), true);
      assert.equal(await rawLine(s.address, `R asked ${lock.token}`), "R asked");
      assert.equal(await lock.held(), false, "released elsewhere with its token");
      assert.equal(lock.locked, true, "the local view cannot know");
      const other = await c.acquire("asked", { lease: 30, wait: 5 });
      assert.equal(await lock.held(), false, "another grant's token holds the key");
      await other.release();

      const forgotten = await c.acquire("restart", { lease: 30, wait: 5 });
      await s.kill();
      await s.restart();
      assert.equal(await forgotten.held(), false, "the restarted server holds no grant of it");
      assert.equal(forgotten.locked, true, "the local view cannot know");

      const short = await c.acquire("short", { lease: 0.1, wait: 5 });
      assert.ok(short.locked);
      await until(() => !short.locked, "the lease to run out locally");
      await until(async () => !(await short.held()), "the server to expire it");
    }),

  "lock-from-key-and-token": () =>
    using(async (own) => {
      const s = await server(own);
      const c = client(own, s.address);
      const token = await cliAcquire(s.address, "elsewhere");
      const wrong = c.lock("elsewhere", token + 1n);
      assert.equal(await wrong.held(), false, "a wrong token");
      assert.ok((await rejection(wrong.release())) instanceof NotHolderError, "a wrong token releases nothing");
      const lock = c.lock("elsewhere", token, { lease: 30 });
      assert.equal(lock.token, token);
      assert.equal(lock.key, "elsewhere");
      assert.ok(lock.locked);
      assert.equal(await lock.held(), true);
      await lock.extend(20);
      await lock.release();
      assert.equal((await c.inspect("elsewhere")).token, null, "released from Node.js");
      assert.throws(() => c.lock("two words", 1n), InvalidArgumentError);
      assert.throws(() => c.lock("elsewhere", token, { lease: 0 }), InvalidArgumentError);
    }),

  "single-node-restart-reports-lost": () =>
    using(async (own) => {
      const s = await server(own);
      const c = client(own, s.address);
      const locks = [];
      for (let index = 0; index < 4; index += 1) {
        locks.push(await c.acquire(`restart-${index}`, { lease: 3, wait: 5, autoExtend: true }));
      }
      const counts = locks.map(() => 0);
      const lost = locks.map(
        (lock, index) =>
          new Promise((done) =>
            lock.on("lost", (reason) => {
              counts[index] += 1;
              done(reason);
            }),
          ),
      );
      await s.kill();
      await s.restart();
      const reasons = await bounded(Promise.all(lost));
      for (const [index, lock] of locks.entries()) {
        assert.ok(reasons[index] instanceof LockLostError, String(reasons[index]));
        assert.ok(lock.signal.aborted);
        assert.ok(!lock.locked);
        assert.equal(await lock.held(), false);
      }
      assert.deepEqual(counts, [1, 1, 1, 1], "each lock reported once");
    }),

  "error-kinds": () =>
    using(async (own) => {
      // The Node.js client refuses a lease over 24 h itself: a lower
      // --max-lease shows the server's refusal.
      const s = await server(own, "--max-lease", "60");
      const c = client(own, s.address);
      // Bad arguments, refused before sending, naming the range.
      assert.throws(
        () => c.acquire("errors", { lease: 0 }),
        (error) => error instanceof InvalidArgumentError && error.argument === "lease" && /0\.001 to 86400/.test(error.message),
      );
      assert.throws(
        () => c.acquire("errors", { wait: -1 }),
        (error) => error instanceof InvalidArgumentError && error.argument === "wait" && /0\.001 to 86400/.test(error.message),
      );
      // A lease above the server's limit: its bad-lease, naming the limit.
      const refused = await rejection(c.acquire("errors", { lease: 120, wait: 5 }));
      assert.ok(refused instanceof ServerError && refused.code === "bad-lease", String(refused));
      assert.match(refused.message, /--max-lease/);
      // Timeout: no grant.
      const holder = await c.acquire("errors", { lease: 30, wait: 5 });
      assert.ok((await rejection(c.acquire("errors", { lease: 30, wait: 0.05 }))) instanceof LockTimeoutError);
      // Not holder, once the grant is gone.
      const stale = c.lock("errors", holder.token, { lease: 30 });
      await holder.release();
      assert.ok((await rejection(stale.extend(30))) instanceof NotHolderError);
      assert.ok((await rejection(stale.release())) instanceof NotHolderError, "nothing left to release");
      // No connection: the address and the OS error.
      const address = `127.0.0.1:${await freePort()}`;
      const unreachable = client(own, address, { connectLimit: 0.3 });
      const error = await rejection(unreachable.ping());
      assert.ok(error instanceof NoConnectionError && error instanceof ConnectionError, String(error));
      assert.ok(error.message.includes(`${address} (connection refused)`), error.message);
      assert.equal(error.failures[0].address, address);
      assert.equal(error.failures[0].code, "ECONNREFUSED");
      assert.equal(typeof error.failures[0].errno, "number");
    }),

  "failover-keeps-auto-extended-lock": () =>
    using(async (own) => {
      const cluster = own(await Cluster.start(3), (c) => c.stop());
      const active = await cluster.waitSingleActive("an active node");
      const holder = client(own, cluster.addresses);
      const rival = client(own, cluster.addresses);
      const { version: since } = await cluster.table(active);
      const lock = await holder.acquire("failover/kept", { lease: 3, wait: 5, autoExtend: true });
      const lost = [];
      lock.on("lost", (reason) => lost.push(reason));
      await cluster.waitReplicated(active, since);
      await cluster.kill(active);
      assert.notEqual(await cluster.waitSingleActive("a standby to take over"), active);
      // Longer than the lease: granted unless the extends reach the new active.
      const taken = await rival.acquire("failover/kept", { lease: 30, wait: 4.5 }).then(
        (granted) => granted,
        (error) => error,
      );
      assert.ok(taken instanceof LockTimeoutError, `the key stayed held through the failover: ${taken}\n${cluster.tail()}`);
      assert.deepEqual(lost, [], "not reported lost");
      assert.ok(!lock.signal.aborted);
      assert.ok(lock.locked);
      assert.equal(await lock.held(), true, "held on the new active");
      await lock.extend(3);
      await lock.release();
      const after = await rival.acquire("failover/kept", { lease: 30, wait: "once" });
      assert.ok(after.token > lock.token, "the new active's epoch");
      await after.release();
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
