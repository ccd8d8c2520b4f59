// Several clusters: each key goes to one of them, chosen by rendezvous
// (highest-random-weight) hashing over the clusters' names, as
// docs/protocol.md section 4 ("Several clusters") specifies, so that every
// client in every language sends a key to the same cluster:
//
//   score(name, key) = fmix64(fnv1a64(name ++ 0xFF ++ key))
//
// the highest score wins (unsigned 64-bit), a tie goes to the name first in
// byte order. The 64-bit arithmetic is done on two 32-bit halves (exact in
// doubles), not with bigint, so that choosing costs no allocation;
// clients/cluster-hash-vectors.json checks it (test/clusters.test.mjs).

import { type AcquireOptions, type ClientOptions, type InspectReply, Client, Lock } from "./client.js";
import { type Key } from "./core.js";
import { InvalidArgumentError } from "./errors.js";

const TWO_32 = 4294967296;

/** FNV-1a 64's state, as two unsigned 32-bit halves. */
interface Halves {
  hi: number;
  lo: number;
}

const FNV_OFFSET_HI = 0xcbf29ce4;
const FNV_OFFSET_LO = 0x84222325;
/** The FNV prime 0x100000001b3 is 2^40 + 0x1b3. */
const FNV_PRIME_LOW = 0x1b3;

/** Feeds `bytes[start, end)` into the FNV-1a 64 state `state`. */
function fnvFeed(state: Halves, bytes: Uint8Array, start: number, end: number): void {
  let hi = state.hi;
  let lo = state.lo;
  for (let index = start; index < end; index += 1) {
    lo = (lo ^ bytes[index]) >>> 0;
    // (hi·2^32 + lo) · (2^40 + 0x1b3) mod 2^64
    const low = lo * FNV_PRIME_LOW; // < 2^41: exact
    hi = (Math.imul(hi, FNV_PRIME_LOW) + Math.floor(low / TWO_32) + (lo << 8)) >>> 0;
    lo = low >>> 0;
  }
  state.hi = hi;
  state.lo = lo;
}

/** (ahi·2^32 + alo) · (bhi·2^32 + blo) mod 2^64, into `out`. */
function mul64(ahi: number, alo: number, bhi: number, blo: number, out: Halves): void {
  // alo · blo in full, from 16-bit limbs (each product below 2^32).
  const a0 = alo & 0xffff;
  const a1 = alo >>> 16;
  const b0 = blo & 0xffff;
  const b1 = blo >>> 16;
  const middle = a0 * b1 + a1 * b0; // < 2^33
  const low = a0 * b0 + (middle % 65536) * 65536; // < 2^33
  const high = a1 * b1 + Math.floor(middle / 65536) + Math.floor(low / TWO_32);
  out.lo = low >>> 0;
  out.hi = (high + Math.imul(alo, bhi) + Math.imul(ahi, blo)) >>> 0;
}

/** MurmurHash3's 64-bit finalizer, in place. */
function fmix64(state: Halves): void {
  // x ^= x >> 33: the high half moves down by one bit into the low half.
  state.lo = (state.lo ^ (state.hi >>> 1)) >>> 0;
  mul64(state.hi, state.lo, 0xff51afd7, 0xed558ccd, state);
  state.lo = (state.lo ^ (state.hi >>> 1)) >>> 0;
  mul64(state.hi, state.lo, 0xc4ceb9fe, 0x1a85ec53, state);
  state.lo = (state.lo ^ (state.hi >>> 1)) >>> 0;
}

/** A key's bytes as hashed: a string's UTF-8, or the bytes given (not
 * checked as a key: the vectors hash the empty key too). */
function hashBytes(key: Key): Uint8Array {
  if (typeof key === "string") return Buffer.from(key, "utf8");
  if (key instanceof Uint8Array) return key;
  throw new InvalidArgumentError("key", "a key must be a string or a Buffer");
}

const SEPARATOR = Uint8Array.of(0xff);
/** Half a surrogate pair: no UTF-8 of its own (it would become U+FFFD). */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/** A cluster's name, checked, and its FNV-1a state after `name ++ 0xFF`
 * (every key's hash starts from it). */
class Candidate {
  readonly bytes: Buffer;
  readonly prefix: Halves;
  constructor(readonly name: string) {
    if (typeof name !== "string" || name.length === 0) {
      throw new InvalidArgumentError("clusters", "a cluster's name must be a non-empty string");
    }
    if (LONE_SURROGATE.test(name)) {
      throw new InvalidArgumentError("clusters", `a cluster's name must be valid Unicode: ${JSON.stringify(name)}`);
    }
    this.bytes = Buffer.from(name, "utf8");
    this.prefix = { hi: FNV_OFFSET_HI, lo: FNV_OFFSET_LO };
    fnvFeed(this.prefix, this.bytes, 0, this.bytes.length);
    fnvFeed(this.prefix, SEPARATOR, 0, 1);
  }
}


/** The names as candidates, in byte order (so that the first of equal
 * scores is the one a tie goes to); throws on an empty list, an empty or
 * repeated name. */
function candidates(names: Iterable<string>): Candidate[] {
  const list = [...names].map((name) => new Candidate(name));
  if (list.length === 0) throw new InvalidArgumentError("clusters", "give at least one cluster");
  list.sort((a, b) => Buffer.compare(a.bytes, b.bytes));
  for (let index = 1; index < list.length; index += 1) {
    if (Buffer.compare(list[index - 1].bytes, list[index].bytes) === 0) {
      throw new InvalidArgumentError("clusters", `the cluster name ${JSON.stringify(list[index].name)} is given twice`);
    }
  }
  return list;
}

const scratch: Halves = { hi: 0, lo: 0 };

/** The index in `list` (sorted by name bytes) of the cluster `bytes` goes
 * to. */
function choose(list: readonly Candidate[], bytes: Uint8Array): number {
  let best = 0;
  let bestHi = -1;
  let bestLo = -1;
  for (let index = 0; index < list.length; index += 1) {
    const prefix = list[index].prefix;
    scratch.hi = prefix.hi;
    scratch.lo = prefix.lo;
    fnvFeed(scratch, bytes, 0, bytes.length);
    fmix64(scratch);
    // Strictly greater: on a tie the earlier name (in byte order) stays.
    if (scratch.hi > bestHi || (scratch.hi === bestHi && scratch.lo > bestLo)) {
      best = index;
      bestHi = scratch.hi;
      bestLo = scratch.lo;
    }
  }
  return best;
}

/** The score of `key` for the cluster `name` (docs/protocol.md section 4,
 * "Several clusters"), a u64. */
export function clusterScore(name: string, key: Key): bigint {
  const candidate = new Candidate(name);
  const bytes = hashBytes(key);
  const state = { hi: candidate.prefix.hi, lo: candidate.prefix.lo };
  fnvFeed(state, bytes, 0, bytes.length);
  fmix64(state);
  return (BigInt(state.hi) << 32n) | BigInt(state.lo);
}

/** The name of the cluster `key` goes to among `names` (rendezvous hashing:
 * the highest score, a tie to the name first in byte order). Names are
 * non-empty and unique; the key is a string (hashed as UTF-8) or bytes. */
export function clusterFor(names: Iterable<string>, key: Key): string {
  const list = candidates(names);
  return list[choose(list, hashBytes(key))].name;
}

/**
 * Several independent clusters, one Client each, under names: each key goes
 * to one cluster, chosen by clusterFor over the names, so every client given
 * the same names sends a key to the same cluster. A Lock belongs to the
 * client that granted it (release, extend and held go there).
 *
 * What it gives up: a lock's fencing token comes from its own cluster, so
 * tokens of keys in different clusters are not comparable. Taking a cluster
 * out of the list moves its keys to the others: drain it first (README,
 * "Several clusters").
 */
export class Clusters {
  private readonly list: Candidate[];
  private readonly clients: Client[];

  /** `clusters`: each cluster's name and its Client, as an object or a
   * Map. Throws InvalidArgumentError on no cluster, an empty or repeated
   * name, or a value that is not a Client. */
  constructor(clusters: Record<string, Client> | Map<string, Client>) {
    const entries = clusters instanceof Map ? [...clusters.entries()] : Object.entries(clusters ?? {});
    const byName = new Map(entries);
    this.list = candidates(entries.map(([name]) => name));
    this.clients = this.list.map((candidate) => {
      const client = byName.get(candidate.name);
      if (!(client instanceof Client)) {
        throw new InvalidArgumentError("clusters", `the cluster ${JSON.stringify(candidate.name)} is not given a Client`);
      }
      return client;
    });
  }

  /** A Clusters of new Clients, one per cluster, each given that cluster's
   * addresses and the same options. */
  static connect(clusters: Record<string, string | string[]>, options: ClientOptions = {}): Clusters {
    const entries = Object.entries(clusters ?? {});
    candidates(entries.map(([name]) => name)); // checks the names before any connection starts
    const made: Client[] = [];
    try {
      const clients: Record<string, Client> = {};
      for (const [name, addresses] of entries) {
        const client = new Client(addresses, options);
        made.push(client);
        clients[name] = client;
      }
      return new Clusters(clients);
    } catch (error) {
      for (const client of made) client.close();
      throw error;
    }
  }

  /** The clusters' names, in byte order. */
  get names(): string[] {
    return this.list.map((candidate) => candidate.name);
  }

  /** The Client of the cluster named `name` (undefined if none). */
  client(name: string): Client | undefined {
    const index = this.list.findIndex((candidate) => candidate.name === name);
    return index < 0 ? undefined : this.clients[index];
  }

  /** The name of the cluster `key` goes to. */
  nameFor(key: Key): string {
    return this.list[choose(this.list, hashBytes(key))].name;
  }

  /** The Client of the cluster `key` goes to. */
  clientFor(key: Key): Client {
    return this.clients[choose(this.list, hashBytes(key))];
  }

  /** Client.acquire on the key's cluster. */
  acquire(key: Key, options?: AcquireOptions): Promise<Lock> {
    return this.clientFor(key).acquire(key, options);
  }

  /** Client.lock on the key's cluster: a Lock from its key and token. */
  lock(key: Key, token: bigint | string, options?: { lease?: number }): Lock {
    return this.clientFor(key).lock(key, token, options);
  }

  /** Client.inspect on the key's cluster. */
  inspect(key: Key): Promise<InspectReply> {
    return this.clientFor(key).inspect(key);
  }

  /** Closes every cluster's client. */
  close(): void {
    for (const client of this.clients) client.close();
  }

  [Symbol.dispose](): void {
    this.close();
  }
}
