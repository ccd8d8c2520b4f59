// Lock cycles/s (an acquire and its release, each loop on its own key) from
// one Node process, with the p99 of a cycle's time:
//   node bench.mjs ringlock ADDR LOOPS SECONDS [CONNECTIONS]
//   node bench.mjs redlock  REDIS_PORT LOOPS SECONDS
//   node bench.mjs ioredis  REDIS_PORT LOOPS SECONDS
// prints one line: "<target> loops=<n> [connections=<c>] cycles/s=<x> p99_ms=<y> node_cpu_us=<z>"
// (this process's CPU time per cycle), with "server_cpu_us=<w>" (the server
// process's) when the environment names its pid in SERVER_PID.
// bench.sh beside it runs them all next to ringlock-bench.

import { readFileSync } from "node:fs";
import { performance } from "node:perf_hooks";

/** The CPU time (user + system, in µs) the process SERVER_PID has used, from
 * /proc (clock ticks of 10 ms); null without SERVER_PID. */
function serverCpuUs() {
  const pid = process.env.SERVER_PID;
  if (!pid) return null;
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return ((Number(fields[11]) + Number(fields[12])) * 1e6) / TICKS_PER_S;
}
const TICKS_PER_S = 100;

const [target, where, loopsText, secondsText, connectionsText] = process.argv.slice(2);
const loops = Number(loopsText);
const seconds = Number(secondsText);

async function makeCycle() {
  if (target === "ringlock") {
    const { Client } = await import("../dist/index.js");
    const options = connectionsText ? { connectionsPerNode: Number(connectionsText) } : {};
    const client = new Client(where, options);
    await client.ping();
    return {
      cycle: async (key) => {
        const lock = await client.acquire(key, { lease: 30, wait: 5 });
        await lock.release();
      },
      close: () => client.close(),
    };
  }
  const { default: Redis } = await import("ioredis");
  const redis = new Redis({ host: "127.0.0.1", port: Number(where), lazyConnect: true });
  await redis.connect();
  if (target === "redlock") {
    const { default: Redlock } = await import("redlock");
    const redlock = new Redlock([redis], { retryCount: 100, retryDelay: 10, retryJitter: 5 });
    return {
      cycle: async (key) => {
        const lock = await redlock.acquire([key], 30000);
        await lock.release();
      },
      close: () => redis.disconnect(),
    };
  }
  if (target === "ioredis") {
    redis.defineCommand("unlock", {
      numberOfKeys: 1,
      lua: 'if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end',
    });
    let serial = 0;
    return {
      cycle: async (key) => {
        const value = `${process.pid}-${serial++}`;
        if ((await redis.set(key, value, "PX", 30000, "NX")) !== "OK") throw new Error(`${key} is held`);
        await redis.unlock(key, value);
      },
      close: () => redis.disconnect(),
    };
  }
  throw new Error(`unknown target ${target}`);
}

const { cycle, close } = await makeCycle();
const run = async (until, times) => {
  let count = 0;
  await Promise.all(
    Array.from({ length: loops }, async (_, index) => {
      const key = `bench-${process.pid}-${index}`;
      while (performance.now() < until) {
        const start = performance.now();
        await cycle(key);
        times?.push(performance.now() - start);
        count += 1;
      }
    }),
  );
  return count;
};
await run(performance.now() + 1000, null); // warm-up
const times = [];
const cpuBefore = process.cpuUsage();
const serverBefore = serverCpuUs();
const start = performance.now();
const count = await run(start + seconds * 1000, times);
const elapsed = (performance.now() - start) / 1000;
const cpu = process.cpuUsage(cpuBefore);
const serverAfter = serverCpuUs();
times.sort((a, b) => a - b);
const p99 = times[Math.min(times.length - 1, Math.floor(times.length * 0.99))];
const server = serverBefore === null ? "" : ` server_cpu_us=${((serverAfter - serverBefore) / count).toFixed(1)}`;
const connections = target === "ringlock" ? ` connections=${connectionsText ?? 2}` : "";
console.log(
  `${target} loops=${loops}${connections} cycles/s=${Math.round(count / elapsed)} p99_ms=${p99.toFixed(3)} ` +
    `node_cpu_us=${((cpu.user + cpu.system) / count).toFixed(1)}${server}`,
);
close();
