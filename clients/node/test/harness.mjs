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
