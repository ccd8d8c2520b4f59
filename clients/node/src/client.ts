// The client: connections, routing, requests waiting for a connection or
// moving after a cut, and the Lock objects handed to callers.

import { EventEmitter } from "node:events";
import * as net from "node:net";
import { performance } from "node:perf_hooks";
import * as tls from "node:tls";

import {
  type Key,
  type Reply,
  type Wait,
  Outbox,
  Pairing,
  ProtocolError,
  ReplyReader,
  encode,
  keyBytes,
  leaseMs as checkLease,
  parseAddress,
  reconnectDelay,
  tokenOf,
  waitMs as checkWait,
} from "./core.js";
import {
  type AddressFailure,
  AuthenticationError,
  ClientClosedError,
  ConnectionError,
  InvalidArgumentError,
  LockLostError,
  LockTimeoutError,
  NoActiveNodeError,
  NoConnectionError,
  NotHolderError,
  TLSError,
  serverError,
} from "./errors.js";

/** Options of a Client. Durations are in seconds, as leases and waits are. */
export interface ClientOptions {
  /** The secret sent as `U <secret>` on every connection; default: the
   * environment variable RINGLOCK_SECRET, if set. */
  secret?: string | Buffer;
  /** How long a call that has no limit of its own waits for a usable
   * connection, in seconds (default 10). */
  connectLimit?: number;
  /** The first reconnect delay, in seconds (default 0.05). */
  reconnectDelayFirst?: number;
  /** The reconnect delay's cap, in seconds (default 3). */
  reconnectDelayMax?: number;
  /** Connections per address (default 2 with one address, else 1). */
  connectionsPerNode?: number;
  /** How long a connection with requests in flight may read nothing before
   * it is sent a `P`, in seconds (default 1). With pingTimeout it bounds what
   * a host that vanished or a partition (no reset, no close) costs a request:
   * the connection is cut, as a broken one, about suspectAfter + pingTimeout
   * after it went silent, and its requests move on or wait for a connection
   * within their own limits. */
  suspectAfter?: number;
  /** How long a suspected connection may go on reading nothing after its `P`
   * before it is cut, in seconds (default 1). */
  pingTimeout?: number;
  /** The CA certificate(s) (PEM) the servers' certificates must chain to;
   * setting it (or tlsCert) turns TLS on. */
  tlsCa?: string | Buffer;
  /** The client certificate (PEM) for servers that ask for one. */
  tlsCert?: string | Buffer;
  /** The client certificate's private key (PEM). */
  tlsKey?: string | Buffer;
  /** The name the server's certificate must hold (default: the host of the
   * address). */
  tlsServerName?: string;
}

/** Options of Client.acquire. */
export interface AcquireOptions {
  /** The lease in seconds, counted from the grant (default 30). */
  lease?: number;
  /** How long to wait in the key's queue (default "forever"): a number of
   * seconds, "once" or "forever". */
  wait?: Wait;
  /** Aborting it cancels a waiting acquire (a grant that raced the abort is
   * released). */
  signal?: AbortSignal;
  /** Extend the lease at about a third of it until released (default
   * false); a lost lock emits "lost" and aborts lock.signal. */
  autoExtend?: boolean;
}

/** What `P` answers. */
export interface PingReply {
  role: string;
  epoch: bigint;
  /** The address of the active node, null if the node knows none. */
  active: string | null;
}

/** What `I` answers. */
export interface InspectReply {
  /** The holder's token, null if the key is free. */
  token: bigint | null;
  leaseLeftMs: number;
  waiters: number;
}

const RETRY_MS = 200;
const RELEASE_RETRY_MS = 5000;
const NO_ACTIVE_RETRY_MS = 5000;
const REDIRECT_MAX = 16;
const LIMIT_GRACE_MS = 1000;
/** TCP keepalive: probes start after this long without traffic. */
const KEEPALIVE_IDLE_MS = 5000;

type Op = "A" | "R" | "X" | "I" | "P" | "S";

/** One request, from its call to its reply, over as many connections as it
 * takes. It is also the state its promise settles from (promiseOf gives it
 * the promise's resolve and reject, with no closure per call) and, for an
 * acquire given a signal, the signal's abort listener (handleEvent). An
 * acquire or a Lock's release allocates this record and its promise (its
 * line is written straight into the connection's outbox), a grant its Lock
 * and token; other calls their line too. */
class Request {
  conn: Connection | null = null;
  done = false;
  sentAt = 0;
  /** When the request first found no usable connection (null: it has not,
   * or a server answered something since). */
  noConnSince: number | null = null;
  noActiveSince: number | null = null;
  redirects = 0;
  /** An M just named the active: the next send goes to its connections
   * only (waiting for them if none is usable), not back to a standby. */
  toActive = false;
  timer: NodeJS.Timeout | null = null;
  /** Fires at the request's limit, wherever it is then. */
  limitTimer: NodeJS.Timeout | null = null;
  waiting = false;
  /** An acquire that tries once: a shutting-down answer ends it at once,
   * as it has no wait to spend. */
  tryOnce = false;
  /** A stopping server answered it shutting-down: it had no effect and is
   * sent again within its limit; if that runs out, the error says so. */
  shuttingDown = false;
  /** The promise's settling functions; null for a request nobody awaits (a
   * ping probe, the release of a grant that raced its caller's abort). */
  resolve: ((value: unknown) => void) | null = null;
  reject: ((error: unknown) => void) | null = null;
  /** An acquire's lease and wait in ms (wait: null for "forever", 0 for
   * "once"), its signal and whether its Lock auto-extends. */
  leaseMs = 0;
  waitMs: number | null = null;
  signal: AbortSignal | null = null;
  autoExtend = false;
  /** The Lock a release frees: its signal is aborted once the release
   * settles, either way. */
  lock: Lock | null = null;

  constructor(
    readonly client: Client,
    readonly op: Op,
    readonly key: Buffer | null,
    /** The line to send; null for an acquire, whose line is written at
     * each send with the wait it has left, and a Lock's release, written
     * from the lock's key and token (see writeTo). */
    readonly line: Buffer | null,
    /** A fixed end for waiting (a bounded acquire, a release's retry window,
     * an extend's lease), or null for the client's connect limit. */
    readonly limitAt: number | null,
    readonly startedAt: number,
  ) {}

  get keyText(): string {
    return this.key === null ? "-" : this.key.toString("utf8");
  }

  /** An acquire's wait field to send now, in ms (0 for "forever", 1 for
   * "once", else what is left of the wait); 0 for other requests; -1 once
   * the wait has run out. */
  waitToSend(now: number): number {
    const wait = this.waitMs;
    if (this.op !== "A" || wait === null) return 0;
    if (wait === 0) return 1;
    const left = Math.ceil(this.startedAt + wait - now);
    return left < 1 ? -1 : left;
  }

  /** Writes the request's line into `outbox`: an acquire's and a Lock's
   * release are written in place from the request's fields (no line of
   * their own); others copy the line they were given. */
  writeTo(outbox: Outbox, now: number): void {
    if (this.op === "A") outbox.pushAcquire(this.key as Buffer, this.leaseMs, this.waitToSend(now));
    else if (this.line !== null) outbox.push(this.line);
    else outbox.pushRelease(this.key as Buffer, (this.lock as Lock).token);
  }

  /** The acquire's signal was aborted (this is its listener). */
  handleEvent(): void {
    if (!this.done && this.signal !== null) this.client.finish(this, this.signal.reason);
  }

  /** Settles the promise with the reply. */
  succeed(reply: Reply, conn: Connection): void {
    this.unlisten();
    const resolve = this.resolve;
    const reject = this.reject;
    if (resolve === null || reject === null) return;
    if (this.op === "A") {
      if (reply.kind === "A") {
        const key = this.key as Buffer;
        const lock = new Lock(this.client, key, reply.token, this.sentAt + this.leaseMs, conn.node.address);
        if (this.autoExtend) lock.autoExtend(this.leaseMs);
        resolve(lock);
      } else if (reply.kind === "T") {
        reject(new LockTimeoutError(this.keyText));
      } else {
        reject(new ProtocolError(`unexpected reply to an acquire: ${reply.kind}`));
      }
    } else if (this.lock !== null) {
      this.lock.releaseSettled();
      if (reply.kind === "R") resolve(undefined);
      else reject(new ProtocolError("unexpected reply to a release"));
    } else {
      resolve(reply);
    }
  }

  /** Settles the promise with an error. */
  fail(error: unknown): void {
    this.unlisten();
    this.lock?.releaseSettled();
    this.reject?.(error);
  }

  private unlisten(): void {
    if (this.signal !== null) {
      this.signal.removeEventListener("abort", this);
      this.signal = null;
    }
  }
}

/** The request promiseOf is making a promise for (the executor below reads
 * it: one shared function instead of a closure per call). */
let adopting: Request | null = null;

function adopt(resolve: (value: never) => void, reject: (error: unknown) => void): void {
  const request = adopting as Request;
  request.resolve = resolve as (value: unknown) => void;
  request.reject = reject;
}

/** A promise settled by `request` (Request.succeed and fail). */
function promiseOf<T>(request: Request): Promise<T> {
  adopting = request;
  const promise = new Promise<T>(adopt);
  adopting = null;
  return promise;
}

class Node {
  readonly conns: Connection[] = [];
  failure: AddressFailure | null = null;
  constructor(readonly address: string) {}
}

const VERIFY_CODES = new Set([
  "SELF_SIGNED_CERT_IN_CHAIN",
  "DEPTH_ZERO_SELF_SIGNED_CERT",
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
  "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
  "UNABLE_TO_GET_ISSUER_CERT",
  "CERT_HAS_EXPIRED",
  "CERT_NOT_YET_VALID",
  "ERR_TLS_CERT_ALTNAME_INVALID",
  "CERT_UNTRUSTED",
  "CERT_SIGNATURE_FAILURE",
]);

function describe(address: string, error: NodeJS.ErrnoException): AddressFailure {
  const code = error.code;
  if (code !== undefined && VERIFY_CODES.has(code)) {
    return { address, kind: "tls", code, cause: error, reason: `certificate not trusted: ${error.message}` };
  }
  if ((code !== undefined && code.startsWith("ERR_SSL")) || (error as { library?: string }).library !== undefined) {
    const detail = (error as { reason?: string }).reason ?? code ?? error.message.split("\n")[0];
    return { address, kind: "tls", code, cause: error, reason: `TLS failure: ${detail}` };
  }
  const words: Record<string, string> = {
    ECONNREFUSED: "connection refused",
    ECONNRESET: "connection reset",
    ETIMEDOUT: "timed out",
    EHOSTUNREACH: "host unreachable",
    ENETUNREACH: "network unreachable",
    EPIPE: "broken pipe",
  };
  return {
    address,
    kind: "connect",
    code,
    errno: typeof error.errno === "number" ? Math.abs(error.errno) : undefined,
    cause: error,
    reason: (code !== undefined && words[code]) || error.message,
  };
}

/** One connection to one address, reconnected in the background. */
class Connection {
  state: "connecting" | "auth" | "ready" | "down" | "closed" = "down";
  private socket: net.Socket | null = null;
  private readonly pairing = new Pairing<Request>();
  private reader = new ReplyReader();
  private attempt = 0;
  private openedAt = 0;
  private answered = false;
  private error: AddressFailure | null = null;
  private reconnectTimer: NodeJS.Timeout | null = null;
  /** Request lines sent in this tick, written at its end in one write. */
  private readonly outbox = new Outbox();
  private flushScheduled = false;
  private readonly flushNow = () => this.flush();
  /** Whether the socket is ref'd now (see refresh). */
  private refed = true;
  /** The silence check (see tick): when the socket last read anything, when
   * requests last went in flight on an idle connection, when the pending
   * ping went out (null: none). */
  private lastRead = 0;
  private busySince = 0;
  private pingedAt: number | null = null;
  private ticker: NodeJS.Timeout | null = null;

  constructor(
    private readonly client: Client,
    readonly node: Node,
  ) {}

  /** Whether this connection has answered anything since its connect. */
  get hasAnswered(): boolean {
    return this.answered;
  }

  start(): void {
    if (this.client.closed) return;
    const { host, port } = parseAddress(this.node.address);
    const settings = this.client.settings;
    this.state = "connecting";
    this.reader = new ReplyReader();
    this.answered = false;
    this.error = null;
    let socket: net.Socket;
    if (settings.tls) {
      socket = tls.connect({
        host,
        port,
        ca: settings.tlsCa,
        cert: settings.tlsCert,
        key: settings.tlsKey,
        servername: settings.tlsServerName ?? (net.isIP(host) ? undefined : host),
        checkServerIdentity: (name, cert) =>
          tls.checkServerIdentity(settings.tlsServerName ?? (name || host), cert),
      });
      socket.once("secureConnect", () => this.connected(socket));
    } else {
      socket = net.connect({ host, port });
      socket.once("connect", () => this.connected(socket));
    }
    this.socket = socket;
    this.refed = true; // as every new socket is
    socket.setNoDelay(true);
    // Node has no TCP_USER_TIMEOUT; the silence check covers what it would.
    socket.setKeepAlive(true, KEEPALIVE_IDLE_MS);
    this.refresh();
    socket.on("data", (chunk: Buffer) => this.received(socket, chunk));
    socket.on("error", (error: NodeJS.ErrnoException) => {
      if (this.socket === socket) this.error = describe(this.node.address, error);
    });
    socket.on("close", () => this.closed(socket));
  }

  private connected(socket: net.Socket): void {
    if (this.socket !== socket) return;
    this.openedAt = performance.now();
    const secret = this.client.settings.secret;
    if (secret !== null) {
      this.state = "auth";
      socket.write(encode.auth(secret));
    } else {
      this.ready();
    }
  }

  private ready(): void {
    this.state = "ready";
    this.node.failure = null;
    const now = performance.now();
    this.lastRead = now;
    this.busySince = now;
    this.pingedAt = null;
    if (this.ticker === null) {
      const settings = this.client.settings;
      this.ticker = setInterval(() => this.tick(), Math.min(settings.suspectAfterMs, settings.pingTimeoutMs) / 4);
      this.ticker.unref();
    }
    this.client.connectionReady();
  }

  /** The periodic silence check: once requests are in flight and nothing was
   * read for suspectAfter, sends `P`; if nothing is read for pingTimeout
   * after that, cuts the socket, whose requests then move on or wait as for
   * any broken connection. */
  private tick(): void {
    const socket = this.socket;
    if (socket === null || this.state !== "ready") {
      this.stopTicking();
      return;
    }
    const now = performance.now();
    const settings = this.client.settings;
    // A TLS connection that has answered nothing since its connect is left
    // to armLimit, which ends its requests at their limits: a ping written
    // to a connection the server is refusing (no client certificate) can
    // draw a reset that drops the server's alert, and with it the reason.
    if (this.pairing.size === 0 || (!this.answered && this.client.settings.tls)) {
      this.pingedAt = null;
      return;
    }
    if (this.pingedAt !== null) {
      if (this.lastRead >= this.pingedAt) {
        this.pingedAt = null;
      } else if (now - this.pingedAt >= settings.pingTimeoutMs) {
        const quiet = (now - Math.max(this.lastRead, this.busySince)) / 1000;
        this.error = {
          address: this.node.address,
          kind: "connect",
          code: "ETIMEDOUT",
          reason: `no answer for ${quiet.toFixed(1)} s, not even to a ping`,
        };
        socket.destroy();
        return;
      } else {
        return;
      }
    }
    if (now - Math.max(this.lastRead, this.busySince) >= settings.suspectAfterMs) {
      this.pingedAt = now;
      // Nobody waits for it (done from the start): its reply is only a sign
      // of life, and a cut does not move it elsewhere.
      const probe = new Request(this.client, "P", null, encode.ping(), null, now);
      probe.done = true;
      this.send(probe, now);
    }
  }

  private stopTicking(): void {
    if (this.ticker !== null) {
      clearInterval(this.ticker);
      this.ticker = null;
    }
  }

  /** Sends a request on this connection: its line goes into the outbox,
   * written with the others of this tick once the tick's callbacks and
   * promise reactions are done, or at once when the outbox holds a full
   * batch (OUTBOX_BATCH_BYTES), so that the server works on the first
   * lines of a busy tick while the client is still making the rest. */
  send(request: Request, now: number): void {
    request.conn = this;
    request.sentAt = now;
    if (this.pairing.size === 0) this.busySince = now;
    this.pairing.add(request.op.charCodeAt(0), request.key, request);
    request.writeTo(this.outbox, now);
    if (this.outbox.full) this.write();
    if (!this.flushScheduled) {
      this.flushScheduled = true;
      process.nextTick(this.flushNow);
    }
    this.refresh();
  }

  private flush(): void {
    this.flushScheduled = false;
    this.write();
  }

  private write(): void {
    const batch = this.outbox.take();
    if (this.socket === null || batch === null) return;
    this.socket.write(batch);
  }

  /** Forgets a request whose caller gave up before its reply. */
  forget(request: Request): void {
    this.pairing.remove(request.op.charCodeAt(0), request.key, request);
    this.refresh();
  }

  /** A socket keeps the process alive only while it has requests in flight
   * (ref and unref are called only when that changes). */
  private refresh(): void {
    if (this.socket === null) return;
    const wanted = this.pairing.size > 0 || this.state === "auth";
    if (wanted === this.refed) return;
    this.refed = wanted;
    if (wanted) this.socket.ref();
    else this.socket.unref();
  }

  private received(socket: net.Socket, chunk: Buffer): void {
    if (this.socket !== socket) return;
    this.lastRead = performance.now();
    const reader = this.reader;
    reader.feed(chunk);
    for (;;) {
      let reply: Reply | null;
      try {
        reply = reader.next();
      } catch (error) {
        socket.destroy(error as Error);
        return;
      }
      if (reply === null) break;
      if (this.reply(reply, reader)) {
        this.answered = true;
        this.attempt = 0;
      }
      if (this.socket !== socket) return;
    }
    this.refresh();
  }

  /** Handles one reply; false for a refusal that must not count as an
   * answer (a refused secret, a revoked name, line-too-long…), so that it
   * does not reset the reconnect schedule. */
  private reply(reply: Reply, reader: ReplyReader): boolean {
    if (reply.kind === "U" && this.state === "auth") {
      this.client.name = reply.name;
      this.ready();
      return true;
    }
    if (reply.kind === "E" && (reply.op === "U" || reply.op === "-")) {
      if (reply.op === "U" || reply.code === "auth-revoked") {
        const failure: AddressFailure = {
          address: this.node.address,
          kind: "auth",
          code: reply.code,
          reason: reply.code,
        };
        this.error = failure;
      } else {
        this.error = { address: this.node.address, kind: "connect", code: reply.code, reason: reply.code };
      }
      return false;
    }
    const request = this.pairing.take(reader.slotOp, reader.line, reader.keyStart, reader.keyEnd);
    if (request !== undefined) {
      request.conn = null;
      this.client.answered(request, reply, this);
    }
    return true;
  }

  private closed(socket: net.Socket): void {
    if (this.socket !== socket) return;
    this.socket = null;
    this.stopTicking();
    this.outbox.clear();
    const wasOpen = this.openedAt > 0 && this.state !== "connecting";
    const failure = this.error ?? {
      address: this.node.address,
      kind: "connect" as const,
      reason: "closed by the server",
    };
    if (this.state === "closed") return;
    this.node.failure = failure;
    const answered = this.answered;
    if (answered || (wasOpen && performance.now() - this.openedAt >= this.client.settings.delayMaxMs)) {
      this.attempt = 0;
    }
    this.state = "down";
    this.openedAt = 0;
    for (const request of this.pairing.drain()) {
      request.conn = null;
      if (request.done) continue;
      if (answered) request.noConnSince = null;
      this.client.dispatch(request);
    }
    const settings = this.client.settings;
    const delay = reconnectDelay(this.attempt, settings.delayFirstMs, settings.delayMaxMs, Math.random());
    this.attempt += 1;
    this.reconnectTimer = setTimeout(() => {
      this.reconnectTimer = null;
      this.start();
    }, delay);
    this.reconnectTimer.unref();
  }

  close(): void {
    this.state = "closed";
    this.stopTicking();
    if (this.reconnectTimer !== null) clearTimeout(this.reconnectTimer);
    const socket = this.socket;
    this.socket = null;
    socket?.destroy();
    for (const request of this.pairing.drain()) {
      request.conn = null;
      if (!request.done) this.client.finish(request, new ClientClosedError());
    }
  }
}

interface Settings {
  secret: Buffer | null;
  connectLimitMs: number;
  delayFirstMs: number;
  delayMaxMs: number;
  perNode: number;
  suspectAfterMs: number;
  pingTimeoutMs: number;
  tls: boolean;
  tlsCa?: string | Buffer;
  tlsCert?: string | Buffer;
  tlsKey?: string | Buffer;
  tlsServerName?: string;
}

function seconds(value: unknown, name: string, fallback: number): number {
  if (value === undefined) return fallback * 1000;
  if (typeof value !== "number" || !Number.isFinite(value) || value < 0) {
    throw new InvalidArgumentError(name, `${name} must be a number of seconds >= 0`);
  }
  return value * 1000;
}

function positive(value: unknown, name: string, fallback: number): number {
  const ms = seconds(value, name, fallback);
  if (ms < 1) throw new InvalidArgumentError(name, `${name} must be at least 0.001 seconds`);
  return ms;
}

/**
 * A ringlock client: persistent connections to the given addresses, requests
 * pipelined round-robin over them, reconnected in the background.
 */
export class Client {
  /** @internal */ readonly settings: Settings;
  /** @internal */ closed = false;
  /** The name the server authenticated the secret as (null without one, or
   * before the first connection is authenticated). */
  name: string | null = null;
  private readonly nodes: Node[] = [];
  /** Every connection of every node, in order, for the round-robin. */
  private readonly conns: Connection[] = [];
  private active: string | null = null;
  private turn = 0;
  private readonly waiting = new Set<Request>();
  private retryTimer: NodeJS.Timeout | null = null;

  constructor(addresses: string | string[], options: ClientOptions = {}) {
    const list = typeof addresses === "string" ? [addresses] : [...addresses];
    if (list.length === 0) throw new InvalidArgumentError("addresses", "give at least one address");
    for (const address of list) parseAddress(address);
    const secretOption = options.secret ?? process.env.RINGLOCK_SECRET;
    let secret: Buffer | null = null;
    if (secretOption !== undefined && secretOption !== "") {
      secret = Buffer.from(secretOption);
      if (/[ \t\r\n\0]/.test(secret.toString("latin1"))) {
        throw new InvalidArgumentError("secret", "a secret must not hold a space, tab, CR, LF or NUL byte");
      }
    }
    const delayFirstMs = seconds(options.reconnectDelayFirst, "reconnectDelayFirst", 0.05);
    const delayMaxMs = seconds(options.reconnectDelayMax, "reconnectDelayMax", 3);
    if (delayMaxMs < delayFirstMs) {
      throw new InvalidArgumentError("reconnectDelayMax", "reconnectDelayMax must be >= reconnectDelayFirst");
    }
    const perNode = options.connectionsPerNode ?? (list.length === 1 ? 2 : 1);
    if (!Number.isInteger(perNode) || perNode < 1 || perNode > 64) {
      throw new InvalidArgumentError("connectionsPerNode", "connectionsPerNode must be an integer from 1 to 64");
    }
    if ((options.tlsCert === undefined) !== (options.tlsKey === undefined)) {
      throw new InvalidArgumentError("tlsCert", "tlsCert and tlsKey go together");
    }
    this.settings = {
      secret,
      connectLimitMs: seconds(options.connectLimit, "connectLimit", 10),
      delayFirstMs,
      delayMaxMs,
      perNode,
      suspectAfterMs: positive(options.suspectAfter, "suspectAfter", 1),
      pingTimeoutMs: positive(options.pingTimeout, "pingTimeout", 1),
      tls: options.tlsCa !== undefined || options.tlsCert !== undefined,
      tlsCa: options.tlsCa,
      tlsCert: options.tlsCert,
      tlsKey: options.tlsKey,
      tlsServerName: options.tlsServerName,
    };
    for (const address of list) this.addNode(address);
  }

  /** How many connections are usable now (connected, and authenticated
   * when a secret is given). */
  get usableConnections(): number {
    let count = 0;
    for (const conn of this.conns) if (conn.state === "ready") count += 1;
    return count;
  }

  private addNode(address: string): Node {
    const node = new Node(address);
    this.nodes.push(node);
    for (let index = 0; index < this.settings.perNode; index += 1) {
      const conn = new Connection(this, node);
      node.conns.push(conn);
      this.conns.push(conn);
      conn.start();
    }
    return node;
  }

  /**
   * Acquires `key`: resolves to a Lock once granted; rejects with
   * LockTimeoutError when the wait runs out, with the signal's reason when
   * aborted, or with a ConnectionError when no connection came up within
   * the call's limit.
   */
  acquire(key: Key, options: AcquireOptions = {}): Promise<Lock> {
    const bytes = keyBytes(key);
    const lease = checkLease(options.lease ?? 30);
    const wait = checkWait(options.wait ?? "forever");
    const signal = options.signal;
    if (this.closed) return Promise.reject(new ClientClosedError());
    if (signal?.aborted) return Promise.reject(signal.reason);
    const start = performance.now();
    const request = new Request(this, "A", bytes, null, wait !== null && wait > 0 ? start + wait : null, start);
    request.leaseMs = lease;
    request.waitMs = wait;
    request.tryOnce = wait === 0;
    request.autoExtend = options.autoExtend === true;
    const promise = promiseOf<Lock>(request);
    if (signal !== undefined) {
      request.signal = signal;
      signal.addEventListener("abort", request, { once: true });
    }
    this.dispatch(request, start);
    return promise;
  }

  /** A lock from its key and token, taken by this or another process: it
   * can be released, extended and asked about. */
  lock(key: Key, token: bigint | string, options: { lease?: number } = {}): Lock {
    const bytes = keyBytes(key);
    const value = tokenOf(token);
    const lease = options.lease === undefined ? null : checkLease(options.lease);
    return new Lock(this, bytes, value, lease === null ? Infinity : performance.now() + lease, null);
  }

  /** Sends `P` to a node: its role, epoch and the active node it names. */
  ping(): Promise<PingReply> {
    return this.call("P", null, encode.ping()).then((reply) => {
      if (reply.kind !== "P") throw new ProtocolError("unexpected reply to a ping");
      return { role: reply.role, epoch: reply.epoch, active: reply.address };
    });
  }

  /** Sends `S`: the node's statistics, parsed. */
  stats(): Promise<Record<string, unknown>> {
    return this.call("S", null, encode.stats()).then((reply) => {
      if (reply.kind !== "S") throw new ProtocolError("unexpected reply to stats");
      return JSON.parse(reply.json) as Record<string, unknown>;
    });
  }

  /** Sends `I key`: who holds the key, without changing anything. */
  inspect(key: Key): Promise<InspectReply> {
    const bytes = keyBytes(key);
    return this.call("I", bytes, encode.inspect(bytes)).then((reply) => {
      if (reply.kind !== "I") throw new ProtocolError("unexpected reply to inspect");
      return { token: reply.token, leaseLeftMs: reply.leaseLeftMs, waiters: reply.waiters };
    });
  }

  /** @internal Releases a lock: retried within 5 s; its signal is aborted
   * once the release settles. */
  releaseLock(lock: Lock): Promise<void> {
    if (this.closed) {
      lock.releaseSettled();
      return Promise.reject(new ClientClosedError());
    }
    const now = performance.now();
    const request = new Request(this, "R", lock.keyBytes, null, now + RELEASE_RETRY_MS, now);
    request.lock = lock;
    const promise = promiseOf<void>(request);
    this.dispatch(request, now);
    return promise;
  }

  /** @internal Sends a request; resolves to its reply (an E reply rejects
   * with its ServerError). `limitAt`: see Request. */
  call(op: Op, key: Buffer | null, line: Buffer, limitAt: number | null = null): Promise<Reply> {
    if (this.closed) return Promise.reject(new ClientClosedError());
    const request = new Request(this, op, key, line, limitAt, performance.now());
    const promise = promiseOf<Reply>(request);
    this.dispatch(request);
    return promise;
  }

  /** The next usable connection, round-robin, the active node's first if
   * one is known. With none of the active's usable (it went away: a
   * failover), any other node's, which serves the request if it took over
   * or answers M naming the node that did; `activeOnly` (right after an M)
   * leaves that out. */
  private pick(activeOnly: boolean): Connection | null {
    const all = this.conns;
    let other: Connection | null = null;
    for (let tried = 0; tried < all.length; tried += 1) {
      this.turn = (this.turn + 1) % all.length;
      const conn = all[this.turn];
      if (conn.state !== "ready") continue;
      if (this.active === null || conn.node.address === this.active) return conn;
      other ??= conn;
    }
    return activeOnly ? null : other;
  }

  /** @internal Sends a request, or has it wait for a connection within its
   * limit. */
  dispatch(request: Request, now = performance.now()): void {
    if (request.done) return;
    if (this.closed) {
      this.finish(request, new ClientClosedError());
      return;
    }
    if (request.noConnSince !== null && now >= this.limitOf(request)) {
      this.expire(request, now);
      return;
    }
    const conn = this.pick(request.toActive);
    request.toActive = false;
    if (conn !== null) {
      if (request.waitToSend(now) < 0) {
        this.finish(request, new LockTimeoutError(request.keyText));
        return;
      }
      this.unwait(request);
      conn.send(request, now);
      if (!conn.hasAnswered) this.armLimit(request, now);
      return;
    }
    if (request.noConnSince === null) request.noConnSince = now;
    const limit = this.limitOf(request);
    if (now >= limit) {
      this.expire(request, now);
      return;
    }
    if (!request.waiting) {
      request.waiting = true;
      this.waiting.add(request);
      if (this.retryTimer === null) {
        this.retryTimer = setInterval(() => this.retry(), RETRY_MS);
      }
    }
    if (request.timer === null) {
      request.timer = setTimeout(() => {
        request.timer = null;
        if (request.waiting) this.expire(request, performance.now());
      }, limit - now);
    }
  }

  /** A request sent on a connection that has answered nothing yet (a TLS
   * handshake the server rejects after the client's side ended, a listener
   * that accepts and stays silent) still ends at its limit, plus a grace for
   * the server's own answer at that limit (an acquire's T). */
  private armLimit(request: Request, now: number): void {
    if (request.limitTimer !== null || (request.limitAt === null && request.noConnSince === null)) return;
    request.limitTimer = setTimeout(() => {
      request.limitTimer = null;
      if (request.done || request.waiting) return;
      const conn = request.conn;
      if (conn === null || !conn.hasAnswered) {
        this.expire(request, performance.now());
      }
    }, this.limitOf(request) - now + LIMIT_GRACE_MS);
  }

  private limitOf(request: Request): number {
    if (request.limitAt !== null) return request.limitAt;
    return (request.noConnSince ?? performance.now()) + this.settings.connectLimitMs;
  }

  private unwait(request: Request): void {
    if (request.done && request.limitTimer !== null) {
      clearTimeout(request.limitTimer);
      request.limitTimer = null;
    }
    if (request.timer !== null) {
      clearTimeout(request.timer);
      request.timer = null;
    }
    if (request.waiting) {
      request.waiting = false;
      this.waiting.delete(request);
      if (this.waiting.size === 0 && this.retryTimer !== null) {
        clearInterval(this.retryTimer);
        this.retryTimer = null;
      }
    }
  }

  private retry(): void {
    for (const request of [...this.waiting]) {
      if (request.noActiveSince !== null) continue;
      request.waiting = false;
      this.waiting.delete(request);
      this.dispatch(request);
    }
    if (this.waiting.size === 0 && this.retryTimer !== null) {
      clearInterval(this.retryTimer);
      this.retryTimer = null;
    }
  }

  /** @internal A connection became usable: the waiting requests go out. */
  connectionReady(): void {
    for (const request of [...this.waiting]) {
      if (request.noActiveSince !== null) continue;
      request.waiting = false;
      this.waiting.delete(request);
      this.dispatch(request);
    }
  }

  private expire(request: Request, now: number): void {
    if (request.noActiveSince !== null) {
      this.finish(request, new NoActiveNodeError("no node is active (the nodes answered M with no active)"));
      return;
    }
    const waited = now - (request.noConnSince ?? request.startedAt);
    this.finish(request, this.connectionError(waited, request.shuttingDown));
  }

  private connectionError(waitedMs: number, shuttingDown = false): ConnectionError {
    const nodes = this.active === null ? this.nodes : this.nodes.filter((node) => node.address === this.active);
    const failures = nodes.map(
      (node) => node.failure ?? { address: node.address, kind: "connect" as const, reason: "still connecting" },
    );
    const list = failures.map((failure) => `${failure.address} (${failure.reason})`).join(", ");
    const after = `after ${(waitedMs / 1000).toFixed(1)} s${shuttingDown ? " (the server was shutting down)" : ""}`;
    if (failures.every((failure) => failure.kind === "auth")) {
      return new AuthenticationError(`authentication failed ${after}: ${list}`, failures, waitedMs);
    }
    if (failures.every((failure) => failure.kind === "tls")) {
      return new TLSError(`no TLS connection ${after}: ${list}`, failures, waitedMs);
    }
    return new NoConnectionError(`no usable connection ${after}: ${list}`, failures, waitedMs, shuttingDown);
  }

  /** @internal Ends a request with an error (or, if it is in flight,
   * abandons it: its reply is taken and dropped, a grant released). */
  finish(request: Request, error: unknown): void {
    if (request.done) return;
    request.done = true;
    this.unwait(request);
    if (request.conn !== null && request.op !== "A") {
      request.conn.forget(request);
      request.conn = null;
    }
    request.fail(error);
  }

  /** @internal A reply paired with its request. */
  answered(request: Request, reply: Reply, conn: Connection): void {
    if (request.done) {
      // Its caller gave up while it was in flight: a grant nobody takes is
      // handed back at once.
      if (reply.kind === "A" && request.key !== null && !this.closed) {
        const now = performance.now();
        const line = encode.release(request.key, reply.token);
        this.dispatch(new Request(this, "R", request.key, line, now + RELEASE_RETRY_MS, now));
      }
      return;
    }
    if (reply.kind === "M") {
      request.redirects += 1;
      if (request.redirects > REDIRECT_MAX) {
        this.finish(request, new NoActiveNodeError(`redirected more than ${REDIRECT_MAX} times`));
        return;
      }
      if (reply.active !== null) {
        request.noActiveSince = null;
        request.toActive = true;
        this.follow(reply.active);
        this.dispatch(request);
        return;
      }
      const now = performance.now();
      if (request.noActiveSince === null) request.noActiveSince = now;
      const limit = Math.min(
        request.noActiveSince + NO_ACTIVE_RETRY_MS,
        request.limitAt ?? request.noActiveSince + this.settings.connectLimitMs,
      );
      if (now + RETRY_MS > limit) {
        this.finish(request, new NoActiveNodeError(`${conn.node.address} knows no active node`));
        return;
      }
      request.waiting = true;
      this.waiting.add(request);
      request.timer = setTimeout(() => {
        request.timer = null;
        request.waiting = false;
        this.waiting.delete(request);
        this.dispatch(request);
      }, RETRY_MS);
      return;
    }
    if (reply.kind === "E" && reply.code === "shutting-down" && "ARX".includes(request.op) && !request.tryOnce) {
      this.waitAfterShuttingDown(request);
      return;
    }
    if (reply.kind === "E") {
      this.finish(request, serverError(reply.code, reply.op, request.keyText, conn.node.address));
      return;
    }
    request.done = true;
    this.unwait(request);
    request.succeed(reply, conn);
  }

  /** A stopping server answered an acquire, release or extend
   * shutting-down: the request had no effect, and the next server (a
   * restart, or a cluster's new active) is usually there well within the
   * request's limit, so it waits for a connection as if this one had broken:
   * sent again when a connection comes up or after the retry interval. */
  private waitAfterShuttingDown(request: Request): void {
    const now = performance.now();
    request.shuttingDown = true;
    if (request.noConnSince === null) request.noConnSince = now;
    const limit = this.limitOf(request);
    if (now >= limit) {
      this.expire(request, now);
      return;
    }
    request.waiting = true;
    this.waiting.add(request);
    request.timer = setTimeout(
      () => {
        request.timer = null;
        request.waiting = false;
        this.waiting.delete(request);
        this.dispatch(request);
      },
      Math.min(RETRY_MS, limit - now),
    );
  }

  /** An M named `address` as the active node: send there from now on. */
  private follow(address: string): void {
    if (this.active === address) return;
    this.active = address;
    if (!this.nodes.some((node) => node.address === address)) {
      try {
        this.addNode(address);
      } catch {
        this.active = null;
      }
    }
  }

  /** Closes every connection; calls still pending reject with
   * ClientClosedError. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    for (const request of [...this.waiting]) this.finish(request, new ClientClosedError());
    if (this.retryTimer !== null) clearInterval(this.retryTimer);
    this.retryTimer = null;
    for (const node of this.nodes) for (const conn of node.conns) conn.close();
  }

  [Symbol.dispose](): void {
    this.close();
  }
}

/**
 * A granted lock (or one rebuilt from its key and token). Emits "lost" (with
 * a LockLostError) when the lease ran out without a confirmed extend or the
 * server answered not-holder; `signal` is aborted then too, and on release.
 */
export class Lock extends EventEmitter {
  /** The key's bytes. */
  readonly keyBytes: Buffer;
  /** The fencing token, a u64. */
  readonly token: bigint;
  private controller: AbortController | null = null;
  private leaseEnd: number;
  private released = false;
  private lostReason: LockLostError | null = null;
  private leaseTimer: NodeJS.Timeout | null = null;
  private extendTimer: NodeJS.Timeout | null = null;

  /** @internal */
  constructor(
    private readonly client: Client,
    key: Buffer,
    token: bigint,
    leaseEnd: number,
    /** The address that granted it, if known. */
    readonly address: string | null,
  ) {
    super();
    this.keyBytes = key;
    this.token = token;
    this.leaseEnd = leaseEnd;
  }

  // The lease's timer is armed only once someone can learn of a loss (a
  // "lost" listener, the signal, auto-extend): a plain acquire/release costs
  // no timer, and no listener of its own (these overrides see every way a
  // listener is added; once() adds through on()).
  override on(event: string | symbol, listener: (...args: any[]) => void): this {
    if (event === "lost") this.watch();
    return super.on(event, listener);
  }

  override addListener(event: string | symbol, listener: (...args: any[]) => void): this {
    if (event === "lost") this.watch();
    return super.addListener(event, listener);
  }

  override prependListener(event: string | symbol, listener: (...args: any[]) => void): this {
    if (event === "lost") this.watch();
    return super.prependListener(event, listener);
  }

  override prependOnceListener(event: string | symbol, listener: (...args: any[]) => void): this {
    if (event === "lost") this.watch();
    return super.prependOnceListener(event, listener);
  }

  private watching = false;

  private watch(): void {
    if (this.watching) return;
    this.watching = true;
    this.armLeaseTimer();
  }

  /** The key, decoded as UTF-8. */
  get key(): string {
    return this.keyBytes.toString("utf8");
  }

  /** Aborted when the lock is lost or released: pass it to the work the lock
   * protects. */
  get signal(): AbortSignal {
    this.watch();
    this.controller ??= new AbortController();
    if (!this.locked && !this.controller.signal.aborted) {
      this.controller.abort(this.lostReason ?? new LockLostError(this.released ? "released" : "the lease ran out"));
    }
    return this.controller.signal;
  }

  /** True while the lock is neither released nor lost and its lease, as the
   * client knows it, has not run out. Ask the server with held(). */
  get locked(): boolean {
    return !this.released && this.lostReason === null && performance.now() < this.leaseEnd;
  }

  /** Milliseconds left of the lease as the client knows it. */
  get leaseLeftMs(): number {
    return Math.max(0, this.leaseEnd - performance.now());
  }

  /** Asks the server (`I key`) whether this lock's token still holds the
   * key. */
  async held(): Promise<boolean> {
    const reply = await this.client.inspect(this.keyBytes);
    return reply.token === this.token;
  }

  /** Releases the lock; retried over other connections for 5 s after a cut.
   * Rejects with NotHolderError if the token no longer holds the key (its
   * lease ran out, or a retry after a cut finds that the first send freed
   * it). `signal` is aborted once the release is answered. */
  release(): Promise<void> {
    this.stop();
    this.released = true;
    return this.client.releaseLock(this);
  }

  /** @internal The release was answered (or failed). */
  releaseSettled(): void {
    this.controller?.abort(new LockLostError("released"));
  }

  /** Sets the lease to end `lease` seconds from now (default: 30). */
  async extend(lease = 30): Promise<void> {
    const ms = checkLease(lease);
    const sent = performance.now();
    const limit = Number.isFinite(this.leaseEnd) ? this.leaseEnd : sent + RELEASE_RETRY_MS;
    try {
      const reply = await this.client.call("X", this.keyBytes, encode.extend(this.keyBytes, this.token, ms), limit);
      if (reply.kind !== "X") throw new ProtocolError("unexpected reply to an extend");
    } catch (error) {
      if (error instanceof NotHolderError) this.lose(new LockLostError("the server no longer holds this token", { cause: error }));
      throw error;
    }
    this.leaseEnd = sent + ms;
    if (this.watching) this.armLeaseTimer();
  }

  /** @internal Extends at about a third of the lease until released or lost. */
  autoExtend(leaseMs: number): void {
    this.watch();
    const tick = () => {
      this.extendTimer = setTimeout(() => {
        this.extendTimer = null;
        if (this.released || this.lostReason !== null) return;
        this.extend(leaseMs / 1000).then(tick, () => {
          if (this.released || this.lostReason !== null) return;
          if (performance.now() < this.leaseEnd) tick();
        });
      }, Math.max(1, leaseMs / 3));
      this.extendTimer.unref();
    };
    tick();
  }

  private armLeaseTimer(): void {
    if (this.leaseTimer !== null) clearTimeout(this.leaseTimer);
    this.leaseTimer = null;
    if (!Number.isFinite(this.leaseEnd) || this.released || this.lostReason !== null) return;
    this.leaseTimer = setTimeout(
      () => {
        this.leaseTimer = null;
        if (!this.released && performance.now() >= this.leaseEnd) {
          this.lose(new LockLostError("the lease ran out without a confirmed extend"));
        } else {
          this.armLeaseTimer();
        }
      },
      Math.max(0, this.leaseEnd - performance.now()) + 1,
    );
    this.leaseTimer.unref();
  }

  private lose(reason: LockLostError): void {
    if (this.lostReason !== null || this.released) return;
    this.lostReason = reason;
    this.stop();
    this.controller?.abort(reason);
    this.emit("lost", reason);
  }

  private stop(): void {
    if (this.leaseTimer !== null) clearTimeout(this.leaseTimer);
    if (this.extendTimer !== null) clearTimeout(this.extendTimer);
    this.leaseTimer = null;
    this.extendTimer = null;
  }

  /** `await using lock = await client.acquire(...)` releases it at the end of
   * the scope (a release that finds it already gone is no error). */
  async [Symbol.asyncDispose](): Promise<void> {
    if (this.released || this.lostReason !== null) return;
    try {
      await this.release();
    } catch (error) {
      if (!(error instanceof NotHolderError)) throw error;
    }
  }
}

