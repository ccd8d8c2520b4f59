// Processes the tests run: the real ringlock server and ringlock-testkit,
// each on free loopback ports, stopped by whoever started them.

import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdtempSync, renameSync, rmSync, writeFileSync } from "node:fs";
import * as net from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../../..");
export const SCENARIOS = join(ROOT, "clients", "scenarios.json");

export function binary(name, variable) {
  const path = process.env[variable] || join(ROOT, "target", "release", name);
  if (!existsSync(path)) throw new Error(`${path} is missing: build ${name} or set ${variable}`);
  return path;
}

export const sleep = (ms) => new Promise((done) => setTimeout(done, ms));

/** Reads lines of a stream until `match` finds one; its match. */
function firstLine(stream, pattern, log) {
  return new Promise((done, fail) => {
    let text = "";
    const onData = (chunk) => {
      text += chunk.toString();
      let index;
      while ((index = text.indexOf("\n")) >= 0) {
        const line = text.slice(0, index);
        text = text.slice(index + 1);
        log?.push(line);
        const found = pattern.exec(line);
        if (found) {
          stream.off("data", onData);
          stream.on("data", (more) => log?.push(more.toString()));
          done(found);
          return;
        }
      }
    };
    stream.on("data", onData);
    stream.once("end", () => fail(new Error(`the process ended before printing ${pattern}:\n${log?.join("\n")}`)));
  });
}

/** A ringlock server on a free loopback port with its own data directory. */
export class Server {
  static async start(...args) {
    const server = new Server(args);
    server.address = await server.spawn("127.0.0.1:0");
    return server;
  }

  constructor(args) {
    this.args = args;
    this.data = mkdtempSync(join(tmpdir(), "ringlock-node-"));
    this.log = [];
  }

  async spawn(listen) {
    const command = [
      "--listen", listen, "--shards", "1", "--no-pin", "--data-dir", this.data, ...this.args,
    ];
    this.process = spawn(binary("ringlock", "RINGLOCK_BIN"), command, { stdio: ["ignore", "ignore", "pipe"] });
    this.exited = new Promise((done) => this.process.once("exit", done));
    const found = await firstLine(this.process.stderr, /listening on (\S+?);?\s/, this.log);
    return found[1].replace(/;$/, "");
  }

  signal(name) {
    this.process.kill(name);
  }

  async kill() {
    if (this.process.exitCode === null && this.process.signalCode === null) this.process.kill("SIGKILL");
    await this.exited;
  }

  /** Starts again on the same address and data directory; returns once it
   * answers a real P round trip. */
  async restart() {
    await this.spawn(this.address);
    const [host, port] = this.address.split(":");
    const deadline = Date.now() + 20000;
    for (;;) {
      const ok = await new Promise((done) => {
        const socket = net.connect({ host, port: Number(port) });
        let text = "";
        socket.on("connect", () => socket.write("P\n"));
        socket.on("data", (chunk) => {
          text += chunk;
          if (text.includes("\n")) {
            socket.destroy();
            done(text.startsWith("P "));
          }
        });
        socket.on("error", () => done(false));
        socket.on("close", () => done(false));
      });
      if (ok) return;
      if (Date.now() > deadline) throw new Error(`the restarted server does not answer:\n${this.log.join("\n")}`);
      await sleep(1);
    }
  }

  /** SIGTERM (a graceful stop: queued acquires are answered shutting-down);
   * resolves to the exit code. The data directory stays, for restart. */
  async terminate() {
    this.process.kill("SIGTERM");
    return await this.exited;
  }

  async stop() {
    await this.kill();
    rmSync(this.data, { recursive: true, force: true });
  }
}

export const ALPHA_SECRET = "alpha-5e0c1b7a9d2f4836";
export const BETA_SECRET = "beta-8a4d2c6e1f0b9357";

/** An auth file in a temporary directory: each name may lock <name>/*. */
export class AuthFile {
  constructor(names) {
    this.dir = mkdtempSync(join(tmpdir(), "ringlock-node-auth-"));
    this.path = join(this.dir, "auth");
    this.write(names);
  }

  write(names) {
    const text = Object.entries(names)
      .map(([name, secret]) => `${name} ${createHash("sha256").update(secret).digest("hex")} ${name}/*\n`)
      .join("");
    writeFileSync(`${this.path}.draft`, text);
    renameSync(`${this.path}.draft`, this.path);
  }

  cleanup() {
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** One control connection to ringlock-testkit: one command, one reply. */
class Control {
  static open(address) {
    return new Promise((done, fail) => {
      const socket = net.connect(address, () => done(new Control(socket)));
      socket.once("error", fail);
    });
  }

  constructor(socket) {
    this.socket = socket;
    this.text = "";
    this.waiters = [];
    socket.on("data", (chunk) => {
      this.text += chunk;
      let index;
      while ((index = this.text.indexOf("\n")) >= 0) {
        const line = this.text.slice(0, index);
        this.text = this.text.slice(index + 1);
        this.waiters.shift()?.(line);
      }
    });
  }

  async command(...words) {
    const line = await new Promise((done) => {
      this.waiters.push(done);
      this.socket.write(`${words.join(" ")}\n`);
    });
    if (!line.startsWith("ok")) throw new Error(`testkit: ${words.join(" ")}: ${line}`);
    return line.split(" ").slice(1);
  }

  close() {
    this.socket.destroy();
  }
}

/** ringlock-testkit and a control connection to it. */
export class Testkit {
  static async start() {
    const kit = new Testkit();
    kit.process = spawn(binary("ringlock-testkit", "RINGLOCK_TESTKIT_BIN"), [], { stdio: ["pipe", "pipe", "ignore"] });
    kit.exited = new Promise((done) => kit.process.once("exit", done));
    const found = await firstLine(kit.process.stdout, /ringlock-testkit control (\S+)/);
    const [host, port] = found[1].split(":");
    kit.controlAddress = { host, port: Number(port) };
    kit.main = await Control.open(kit.controlAddress);
    kit.others = [];
    return kit;
  }

  /** Runs one control command; the reply's fields after ok. */
  cmd(...words) {
    return this.main.command(...words);
  }

  /** A command on a connection of its own (for one that waits). */
  async side(...words) {
    const control = await Control.open(this.controlAddress);
    try {
      return await control.command(...words);
    } finally {
      control.close();
    }
  }

  async proxy(target) {
    const [id, address] = await this.cmd("proxy", target);
    return { id, address };
  }

  async fake(active) {
    const [id, address] = await this.cmd("fake", active);
    return { id, address };
  }

  async count(what, id) {
    return Number((await this.cmd(what, id))[0]);
  }

  /** Makes the certificates of the TLS tests in a new directory. */
  static certs() {
    const dir = mkdtempSync(join(tmpdir(), "ringlock-node-certs-"));
    return new Promise((done, fail) => {
      const child = spawn(binary("ringlock-testkit", "RINGLOCK_TESTKIT_BIN"), ["certs", dir], { stdio: "ignore" });
      child.once("exit", (code) => (code === 0 ? done(dir) : fail(new Error(`ringlock-testkit certs exited ${code}`))));
    });
  }

  async stop() {
    this.main.close();
    this.process.stdin.end();
    await this.exited;
  }
}

const handedOut = new Set();

/** A free loopback port: bound, read and released; each handed out once in
 * this process, since the kernel may offer a port it just released again. */
export async function freePort() {
  for (;;) {
    const probe = net.createServer();
    await new Promise((done) => probe.listen(0, "127.0.0.1", done));
    const { port } = probe.address();
    await new Promise((done) => probe.close(done));
    if (!handedOut.has(port)) {
      handedOut.add(port);
      return port;
    }
  }
}

/** One request line on a connection of its own; the reply line, or null if
 * none came within `timeoutMs`. */
/** A plain protocol connection kept open: a holder that is not the client
 * under test. `call` sends a line and resolves to the reply line. */
export class RawConnection {
  static open(address) {
    const [host, port] = address.split(":");
    return new Promise((done, fail) => {
      const socket = net.connect({ host, port: Number(port) });
      socket.once("connect", () => done(new RawConnection(socket)));
      socket.once("error", fail);
    });
  }

  constructor(socket) {
    this.socket = socket;
    this.text = "";
    this.waiting = [];
    socket.on("data", (chunk) => {
      this.text += chunk;
      let index;
      while ((index = this.text.indexOf("\n")) >= 0) {
        const line = this.text.slice(0, index).replace(/\r$/, "");
        this.text = this.text.slice(index + 1);
        this.waiting.shift()?.(line);
      }
    });
    socket.on("error", () => {});
  }

  call(line) {
    return new Promise((done) => {
      this.waiting.push(done);
      this.socket.write(`${line}\n`);
    });
  }

  close() {
    this.socket.destroy();
  }
}

export function rawLine(address, line, timeoutMs = 20000) {
  const [host, port] = address.split(":");
  return new Promise((done) => {
    const socket = net.connect({ host, port: Number(port) });
    let text = "";
    const timer = setTimeout(() => finish(null), timeoutMs);
    const finish = (value) => {
      clearTimeout(timer);
      socket.destroy();
      done(value);
    };
    socket.on("connect", () => socket.write(`${line}\n`));
    socket.on("data", (chunk) => {
      text += chunk;
      const index = text.indexOf("\n");
      if (index >= 0) finish(text.slice(0, index).replace(/\r$/, ""));
    });
    socket.on("error", () => finish(null));
    socket.on("close", () => finish(null));
  });
}

/** A cluster of real ringlock nodes on free loopback ports (docs/protocol.md
 * section 5), each with its own data directory and log; `addresses` are the
 * client addresses in priority order. Heartbeats every 50 ms and a failover
 * timeout of 500 ms, as the workspace's cluster tests. */
export class Cluster {
  static async start(count = 3) {
    const cluster = new Cluster();
    cluster.dir = mkdtempSync(join(tmpdir(), "ringlock-node-cluster-"));
    cluster.addresses = [];
    const peers = [];
    for (let index = 0; index < count; index += 1) {
      cluster.addresses.push(`127.0.0.1:${await freePort()}`);
      peers.push(`127.0.0.1:${await freePort()}`);
    }
    const members = cluster.addresses.map((address, index) => `${address}@${peers[index]}`).join(",");
    cluster.logs = cluster.addresses.map(() => []);
    cluster.processes = cluster.addresses.map((address, index) => {
      const child = spawn(
        binary("ringlock", "RINGLOCK_BIN"),
        [
          "--listen", address, "--peers", members, "--node", String(index), "--cluster-listen", peers[index],
          "--heartbeat-ms", "50", "--failover-ms", "500", "--shards", "1", "--no-pin",
          "--data-dir", join(cluster.dir, `data-${index}`),
        ],
        { stdio: ["ignore", "ignore", "pipe"] },
      );
      child.stderr.on("data", (chunk) => cluster.logs[index].push(chunk.toString()));
      child.exited = new Promise((done) => child.once("exit", done));
      return child;
    });
    for (const [index, address] of cluster.addresses.entries()) {
      await cluster.until(async () => (await rawLine(address, "P", 500)) !== null, `node ${index} to answer P`);
    }
    return cluster;
  }

  /** Polls `check` until it is true; fails after 30 s with the logs. */
  async until(check, what) {
    const deadline = Date.now() + 30000;
    while (!(await check())) {
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}\n${this.tail()}`);
      await sleep(20);
    }
  }

  /** The tail of every node's log, for a failure message. */
  tail() {
    return this.addresses
      .map((address, index) => `--- node ${index} (${address}):\n${this.logs[index].join("").split("\n").slice(-30).join("\n")}`)
      .join("\n");
  }

  /** The index of the only active node if every other running node is a
   * standby naming it, else -1. */
  async singleActive() {
    const lines = await Promise.all(
      this.addresses.map((address, index) => (this.processes[index] ? rawLine(address, "P", 500) : null)),
    );
    const actives = lines.flatMap((line, index) => (line?.startsWith("P active ") ? [index] : []));
    if (actives.length !== 1) return -1;
    const [active] = actives;
    const follow = lines.every(
      (line, index) =>
        index === active ||
        !this.processes[index] ||
        (line?.startsWith("P standby ") && line.endsWith(` ${this.addresses[active]}`)),
    );
    return follow ? active : -1;
  }

  /** Waits until one node is active and the others follow it; its index. */
  async waitSingleActive(what) {
    let active = -1;
    await this.until(async () => (active = await this.singleActive()) >= 0, what);
    return active;
  }

  /** The { stream, version } of node `index`'s lock table, from S. */
  async table(index) {
    const line = await rawLine(this.addresses[index], "S");
    if (line === null) throw new Error(`node ${index} did not answer S`);
    const { stream, version } = JSON.parse(line.slice(2)).table;
    return { stream, version };
  }

  /** Waits until the active's table version has grown past `since` (its
   * version before the grant to wait for: the version counts a grant once
   * the replication core took it, not when it was granted), then until every
   * running standby has applied the active's table up to that version. */
  async waitReplicated(active, since) {
    let target;
    await this.until(async () => (target = await this.table(active)).version > since, `node ${active}'s table to grow`);
    for (const index of this.addresses.keys()) {
      if (index === active || !this.processes[index]) continue;
      await this.until(async () => {
        const applied = await this.table(index);
        return applied.stream === target.stream && applied.version >= target.version;
      }, `node ${index} to apply stream ${target.stream} up to version ${target.version}`);
    }
  }

  /** SIGKILL of node `index`, and waits for it to be gone. */
  async kill(index) {
    const child = this.processes[index];
    if (!child) return;
    this.processes[index] = null;
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    await child.exited;
  }

  async stop() {
    for (const index of this.addresses.keys()) await this.kill(index);
    rmSync(this.dir, { recursive: true, force: true });
  }
}
