// The Promise API against a real server: bad input refused before sending,
// the three wait forms, abort, release on scope exit, auto-extend and the
// lost-lock signal, held() asked of the server, a lock from (key, token),
// and a process with an idle client exiting by itself.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { getEventListeners, once } from "node:events";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { after, before, test } from "node:test";

import * as net from "node:net";

import {
  Client,
  ClientClosedError,
  InvalidArgumentError,
  LockLostError,
  LockTimeoutError,
  NoConnectionError,
  NotHolderError,
} from "../dist/index.js";
import { Server, rawLine, sleep } from "./harness.mjs";

let server;
const clients = [];
const client = (options) => {
  const c = new Client(server.address, options);
  clients.push(c);
  return c;
};

before(async () => {
  server = await Server.start();
});
after(async () => {
  for (const c of clients) c.close();
  await server.stop();
});

async function rejection(promise) {
  try {
    await promise;
  } catch (error) {
    return error;
  }
  assert.fail("expected a rejection");
}

test("bad input is refused before sending, with the accepted range", async () => {
  const c = client();
  const bad = [
    ["a key", {}],
    ["k".repeat(251), {}],
    [Buffer.from("a\0b"), {}],
    ["-", {}],
    ["k", { lease: -1 }],
    ["k", { lease: 1e12 }],
    ["k", { lease: 0 }],
    ["k", { wait: 0 }],
    ["k", { wait: -2 }],
  ];
  for (const [key, options] of bad) {
    assert.throws(() => c.acquire(key, options), InvalidArgumentError, `${key} ${JSON.stringify(options)}`);
  }
  assert.throws(() => c.acquire("k", { lease: 1e12 }), /0.001 to 86400 seconds/);
  assert.throws(() => c.lock("k", 5), InvalidArgumentError);
  assert.throws(() => new Client("nowhere"), InvalidArgumentError);
  // Nothing of the above reached the server: the connection still answers.
  await c.ping();
  // A non-ASCII key as bytes works end to end.
  const lock = await c.acquire(Buffer.from([0xc3, 0xa9, 0xff]), { wait: 5 });
  assert.deepEqual(lock.keyBytes, Buffer.from([0xc3, 0xa9, 0xff]));
  assert.ok(await lock.held());
  await lock.release();
});

test("the three wait forms: a duration, once, forever", async () => {
  const one = client();
  const two = client();
  const held = await one.acquire("wait-forms", { wait: 5 });
  assert.equal(typeof held.token, "bigint");
  assert.ok((await rejection(two.acquire("wait-forms", { wait: "once" }))) instanceof LockTimeoutError);
  assert.ok((await rejection(two.acquire("wait-forms", { wait: 0.1 }))) instanceof LockTimeoutError);
  const forever = two.acquire("wait-forms", { wait: "forever" });
  await sleep(100);
  await held.release();
  const next = await forever;
  assert.ok(next.token > held.token);
  await next.release();
  const free = await two.acquire("wait-forms", { wait: "once" });
  await free.release();
});

test("an abort cancels a waiting acquire, and a grant that raced it is released", async () => {
  const c = client();
  const held = await c.acquire("abort", { wait: 5 });
  const controller = new AbortController();
  const pending = c.acquire("abort", { signal: controller.signal });
  await sleep(50);
  controller.abort();
  const error = await rejection(pending);
  assert.equal(error.name, "AbortError");
  // The server still queued that acquire: it grants it on release, and the
  // client hands it back at once.
  await held.release();
  const deadline = Date.now() + 5000;
  while ((await c.inspect("abort")).token !== null) {
    assert.ok(Date.now() < deadline, "the raced grant was not released");
    await sleep(10);
  }
  const aborted = new AbortController();
  aborted.abort();
  assert.equal((await rejection(c.acquire("abort", { signal: aborted.signal }))).name, "AbortError");
});

test("Symbol.asyncDispose releases the lock", async () => {
  const c = client();
  const lock = await c.acquire("dispose", { wait: 5 });
  await lock[Symbol.asyncDispose]();
  assert.equal((await c.inspect("dispose")).token, null);
  assert.ok(lock.signal.aborted);
  await lock[Symbol.asyncDispose](); // twice is no error
});

test("a signal's abort listener is added for the acquire and removed once it settles", async () => {
  const c = client();
  const controller = new AbortController();
  const lock = await c.acquire("listener", { wait: 5, signal: controller.signal });
  assert.equal(getEventListeners(controller.signal, "abort").length, 0, "after a grant");
  const pending = c.acquire("listener", { wait: 5, signal: controller.signal });
  assert.equal(getEventListeners(controller.signal, "abort").length, 1, "while waiting");
  const timedOut = c.acquire("listener", { wait: 0.05, signal: controller.signal });
  assert.ok((await rejection(timedOut)) instanceof LockTimeoutError);
  await lock.release();
  await (await pending).release();
  assert.equal(getEventListeners(controller.signal, "abort").length, 0, "after a timeout and a grant");
  controller.abort();
});

/** The token holding `key` on the test server, asked on a connection of its
 * own (null: free). */
async function holderOnServer(key) {
  const line = await rawLine(server.address, `I ${key}`);
  const fields = line?.split(" ") ?? [];
  assert.equal(fields[0], "I", `I ${key} answered ${line}`);
  return fields[2] === "-" ? null : BigInt(fields[2]);
}

// `await using` in a module of its own: as written where the runtime parses
// it (Node 24 and later), else as TypeScript compiles it for Node 20
// (target ES2022: its helpers call the lock's Symbol.asyncDispose at the end
// of the scope, as the runtime would).
const SCOPED = `
export async function scoped(client, key, inside) {
  await using lock = await client.acquire(key, { lease: 30, wait: 5 });
  await inside(lock);
}
`;

async function scopedModule() {
  let native = true;
  try {
    new (async () => {}).constructor("await using x = null;");
  } catch {
    native = false;
  }
  let code = SCOPED;
  if (!native) {
    const { default: ts } = await import("typescript");
    code = ts.transpileModule(SCOPED, {
      compilerOptions: { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.ES2022 },
    }).outputText;
    assert.match(code, /__disposeResources/, "TypeScript lowered the await using");
  }
  const dir = mkdtempSync(join(tmpdir(), "ringlock-node-using-"));
  try {
    const file = join(dir, "scoped.mjs");
    writeFileSync(file, code);
    return { native, ...(await import(pathToFileURL(file).href)) };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test("await using releases the lock at the end of its scope, also when the scope throws", async (t) => {
  const { native, scoped } = await scopedModule();
  t.diagnostic(native ? "await using run natively" : "await using lowered by TypeScript (this Node cannot parse it)");
  const c = client();
  const rival = client();
  let token = null;
  await scoped(c, "scoped", async (lock) => {
    token = lock.token;
    assert.equal(await holderOnServer("scoped"), lock.token, "held inside the scope");
  });
  assert.notEqual(token, null);
  // Asked of the server on a connection of its own, then taken by a rival
  // client without waiting.
  assert.equal(await holderOnServer("scoped"), null, "free after the scope");
  const taken = await rival.acquire("scoped", { wait: "once" });
  await taken.release();

  const failure = new Error("the work failed");
  let inner = null;
  const error = await rejection(
    scoped(c, "scoped", async (lock) => {
      inner = lock;
      throw failure;
    }),
  );
  assert.equal(error, failure);
  assert.ok(inner.signal.aborted);
  assert.equal(await holderOnServer("scoped"), null, "free after a scope that threw");
  await (await rival.acquire("scoped", { wait: "once" })).release();
});

test("held() asks the server; a lock from (key, token) releases another client's lock", async () => {
  const one = client();
  const two = client();
  const lock = await one.acquire("rebuilt", { wait: 5 });
  assert.ok(await lock.held());
  const copy = two.lock("rebuilt", lock.token);
  assert.ok(await copy.held());
  await copy.extend(40);
  await copy.release();
  assert.equal(await lock.held(), false);
  assert.ok((await rejection(lock.release())) instanceof NotHolderError);
});

test("auto-extend keeps a short lease alive", async () => {
  const c = client();
  const lock = await c.acquire("auto", { lease: 0.6, wait: 5, autoExtend: true });
  await sleep(1500);
  assert.ok(lock.locked);
  assert.ok(await lock.held());
  await lock.release();
  assert.ok(!lock.locked);
});

test("a lease that runs out without extend is lost: event and signal", async () => {
  const c = client();
  const lock = await c.acquire("short", { lease: 0.3, wait: 5 });
  const [reason] = await once(lock, "lost");
  assert.ok(reason instanceof LockLostError);
  assert.ok(lock.signal.aborted);
  assert.ok(!lock.locked);
});

test("a single node that restarts: the auto-extended lock is reported lost", async () => {
  const own = await Server.start();
  const c = new Client(own.address);
  try {
    const lock = await c.acquire("restart-lost", { lease: 1.5, wait: 5, autoExtend: true });
    const lost = once(lock, "lost");
    await own.kill();
    await own.restart();
    const [reason] = await lost;
    assert.ok(reason instanceof LockLostError);
    assert.ok(lock.signal.aborted);
  } finally {
    c.close();
    await own.stop();
  }
});

test("a process with an idle client exits by itself", async () => {
  const program = `
    import { Client } from ${JSON.stringify(new URL("../dist/index.js", import.meta.url).href)};
    const client = new Client(${JSON.stringify(server.address)});
    const lock = await client.acquire("idle-exit", { wait: 5 });
    await lock.release();
    console.log("done");
  `;
  const child = spawn(process.execPath, ["--input-type=module", "-e", program], { stdio: ["ignore", "pipe", "inherit"] });
  let output = "";
  child.stdout.on("data", (chunk) => (output += chunk));
  const timer = setTimeout(() => child.kill("SIGKILL"), 20000);
  const [code, signal] = await once(child, "exit");
  clearTimeout(timer);
  assert.equal(signal, null, "the process did not exit by itself");
  assert.equal(code, 0);
  assert.equal(output.trim(), "done");
});

test("no listener: the connect limit, then an error naming the address and the OS error", async () => {
  const probe = net.createServer();
  await new Promise((done) => probe.listen(0, "127.0.0.1", done));
  const address = `127.0.0.1:${probe.address().port}`;
  await new Promise((done) => probe.close(done));
  const c = new Client(address, { connectLimit: 0.5 });
  clients.push(c);
  const error = await rejection(c.ping());
  assert.ok(error instanceof NoConnectionError, String(error));
  assert.ok(error.message.includes(`${address} (connection refused)`), error.message);
  assert.equal(error.failures[0].code, "ECONNREFUSED");
  assert.equal(typeof error.failures[0].errno, "number");
  // An acquire waiting for a connection is dropped when its signal aborts.
  const controller = new AbortController();
  const pending = c.acquire("never", { signal: controller.signal });
  await sleep(50);
  controller.abort();
  assert.equal((await rejection(pending)).name, "AbortError");
  c.close();
  assert.ok((await rejection(c.ping())) instanceof ClientClosedError);
});
