// Several clusters (docs/protocol.md section 4, "Several clusters"): the
// choice checked against every vector of clients/cluster-hash-vectors.json,
// the names checked, and two real single-node servers: keys held where the
// hash sends them (asked of each server on a connection of its own), and the
// drain procedure of a cluster taken out of the list.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { Client, Clusters, InvalidArgumentError, clusterFor, clusterScore } from "../dist/index.js";
import { ROOT, Server, rawLine, sleep } from "./harness.mjs";

const VECTORS = JSON.parse(readFileSync(join(ROOT, "clients", "cluster-hash-vectors.json"), "utf8")).vectors;

test("every vector of cluster-hash-vectors.json: each score and the choice", () => {
  assert.ok(VECTORS.length >= 28, `only ${VECTORS.length} vectors`);
  for (const vector of VECTORS) {
    const key = Buffer.from(vector.key_hex, "hex");
    const what = `${JSON.stringify(vector.clusters)} key ${vector.key_hex || "(empty)"}`;
    vector.clusters.forEach((name, index) => {
      assert.equal(clusterScore(name, key).toString(16).padStart(16, "0"), vector.scores_hex[index], `score of ${name}, ${what}`);
    });
    assert.equal(clusterFor(vector.clusters, key), vector.chosen, what);
    // The order the names are given in changes nothing.
    assert.equal(clusterFor([...vector.clusters].reverse(), key), vector.chosen, `reversed, ${what}`);
    // A key given as a string is hashed as its UTF-8.
    const text = key.toString("utf8");
    if (Buffer.from(text, "utf8").equals(key)) assert.equal(clusterFor(vector.clusters, text), vector.chosen, `string, ${what}`);
  }
});

test("cluster names: non-empty, unique, valid Unicode, and at least one", () => {
  assert.throws(() => clusterFor([], "k"), InvalidArgumentError);
  assert.throws(() => clusterFor(["a", ""], "k"), /non-empty/);
  assert.throws(() => clusterFor(["a", "b", "a"], "k"), /given twice/);
  assert.throws(() => clusterFor(["a", "\uD800"], "k"), /valid Unicode/);
  assert.throws(() => clusterFor(["a"], 42), InvalidArgumentError);
  assert.throws(() => new Clusters({}), /at least one cluster/);
  assert.throws(() => new Clusters({ a: "127.0.0.1:1" }), /not given a Client/);
  assert.throws(() => Clusters.connect({ a: "127.0.0.1:1", "": "127.0.0.1:2" }), /non-empty/);
});

let serverA;
let serverB;
const opened = [];
const track = (clusters) => {
  opened.push(clusters);
  return clusters;
};

before(async () => {
  [serverA, serverB] = await Promise.all([Server.start(), Server.start()]);
});
after(async () => {
  for (const clusters of opened) clusters.close();
  await Promise.all([serverA?.stop(), serverB?.stop()]);
});

/** The token holding `key` on the server at `address`, asked on a fresh
 * connection of its own (null: free). */
async function holderOn(address, key) {
  const line = await rawLine(address, `I ${key}`);
  const fields = line?.split(" ") ?? [];
  assert.equal(fields[0], "I", `I ${key} at ${address} answered ${line}`);
  return fields[2] === "-" ? null : BigInt(fields[2]);
}

async function heldKeys(client) {
  return (await client.stats()).total.held_keys;
}

const KEYS = Array.from({ length: 24 }, (_, index) => `node-clusters/${index}`);

test("keys are held on the cluster the hash names, and only there", async () => {
  const clusters = track(Clusters.connect({ a: serverA.address, b: serverB.address }));
  assert.deepEqual(clusters.names, ["a", "b"]);
  const address = { a: serverA.address, b: serverB.address };
  const counts = { a: 0, b: 0 };
  const locks = [];
  for (const key of KEYS) {
    const name = clusters.nameFor(key);
    assert.equal(name, clusterFor(["a", "b"], key));
    assert.equal(clusters.clientFor(key), clusters.client(name));
    counts[name] += 1;
    const lock = await clusters.acquire(key, { lease: 30, wait: 5 });
    locks.push(lock);
    const other = name === "a" ? "b" : "a";
    assert.equal(await holderOn(address[name], key), lock.token, `${key} held on ${name}`);
    assert.equal(await holderOn(address[other], key), null, `${key} not on ${other}`);
    assert.equal((await clusters.inspect(key)).token, lock.token);
    assert.equal(lock.address, address[name]);
  }
  assert.ok(counts.a > 0 && counts.b > 0, `both clusters get keys: ${JSON.stringify(counts)}`);
  // Bad input is refused before sending, as by a Client.
  assert.throws(() => clusters.acquire("a key", { wait: 1 }), InvalidArgumentError);
  assert.throws(() => clusters.acquire("k".repeat(251), { wait: 1 }), InvalidArgumentError);
  assert.throws(() => clusters.acquire("k", { lease: -1 }), InvalidArgumentError);
  assert.throws(() => clusters.inspect(Buffer.from("a\0b")), InvalidArgumentError);
  // A Lock rebuilt from (key, token) goes to its key's cluster too.
  const first = locks[0];
  await clusters.lock(first.key, first.token).release();
  assert.equal(await holderOn(address[clusters.nameFor(first.key)], first.key), null);
  for (const lock of locks.slice(1)) await lock.release();
  for (const key of KEYS) {
    assert.equal(await holderOn(address[clusters.nameFor(key)], key), null, `${key} released`);
  }
  clusters.close();
  await assert.rejects(clusters.acquire(KEYS[0], { wait: 1 }), /closed/);
});

test("draining cluster b: its holders release until its S shows no held key, then a list without b sends its keys to a", async () => {
  const both = track(new Clusters(new Map([["a", new Client(serverA.address)], ["b", new Client(serverB.address)]])));
  const locks = [];
  for (const key of KEYS) locks.push(await both.acquire(key, { lease: 30, wait: 5 }));
  const onB = locks.filter((lock) => both.nameFor(lock.key) === "b");
  const onA = locks.filter((lock) => both.nameFor(lock.key) === "a");
  assert.ok(onB.length > 0 && onA.length > 0);
  const clientB = both.client("b");
  assert.equal(await heldKeys(clientB), onB.length);

  // Drain: b's holders release (no new work under b's keys); a's go on.
  for (const lock of onB) await lock.release();
  let held = await heldKeys(clientB);
  for (let tries = 0; held !== 0 && tries < 100; tries += 1) {
    await sleep(20);
    held = await heldKeys(clientB);
  }
  assert.equal(held, 0, "b shows no held key once drained");
  assert.equal(await heldKeys(both.client("a")), onA.length, "a's holders are untouched");

  // Every client's list drops b: b's keys now go to a.
  const onlyA = track(new Clusters({ a: new Client(serverA.address) }));
  for (const lock of onB) {
    assert.equal(onlyA.nameFor(lock.key), "a");
    const moved = await onlyA.acquire(lock.key, { lease: 30, wait: 5 });
    assert.equal(await holderOn(serverA.address, lock.key), moved.token, `${lock.key} now held on a`);
    assert.equal(await holderOn(serverB.address, lock.key), null, `${lock.key} not on b`);
    await moved.release();
  }
  assert.equal(await heldKeys(clientB), 0, "nothing came to b");
  for (const lock of onA) await lock.release();
});
