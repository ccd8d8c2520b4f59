// The floor of one unpipelined round trip from Node: a bare socket (no
// client library) sends one line, waits for its reply, sends the next,
// for SECONDS:
//   node roundtrip.mjs ringlock ADDR SECONDS   (P, answered P role epoch addr)
//   node roundtrip.mjs redis    PORT SECONDS   (PING, answered +PONG)
// prints one line: "<target>-raw round-trips/s=<x> p99_ms=<y> node_cpu_us=<z>"
// where node_cpu_us is this process's CPU time (user + system) per round
// trip, with "server_cpu_us=<w>" (the server's) when SERVER_PID names it.
// A lock cycle at 1 loop is two round trips for ringlock and for Redis
// alike, so half this rate bounds what any Node client of either reaches.

import { readFileSync } from "node:fs";
import * as net from "node:net";
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

const [target, where, secondsText] = process.argv.slice(2);
const seconds = Number(secondsText);
const [host, port] = target === "redis" ? ["127.0.0.1", Number(where)] : [where.split(":")[0], Number(where.split(":")[1])];
const line = Buffer.from(target === "redis" ? "*1\r\n$4\r\nPING\r\n" : "P\n");

const socket = net.connect({ host, port });
socket.setNoDelay(true);
await new Promise((done, fail) => socket.once("connect", done).once("error", fail));

let until = 0;
let count = 0;
let sentAt = 0;
let times = null;
let finished = null;
socket.on("data", (chunk) => {
  // One reply per request, each one line: a chunk ending in LF ends it.
  if (chunk[chunk.length - 1] !== 0x0a) return;
  const now = performance.now();
  times?.push(now - sentAt);
  count += 1;
  if (now >= until) {
    finished();
    return;
  }
  sentAt = now;
  socket.write(line);
});

const phase = (ms, record) =>
  new Promise((done) => {
    count = 0;
    times = record;
    finished = done;
    until = performance.now() + ms;
    sentAt = performance.now();
    socket.write(line);
  });

await phase(1000, null); // warm-up
const cpuBefore = process.cpuUsage();
const serverBefore = serverCpuUs();
const start = performance.now();
const record = [];
await phase(seconds * 1000, record);
const elapsed = (performance.now() - start) / 1000;
const cpu = process.cpuUsage(cpuBefore);
const serverAfter = serverCpuUs();
const server = serverBefore === null ? "" : ` server_cpu_us=${((serverAfter - serverBefore) / count).toFixed(1)}`;
record.sort((a, b) => a - b);
const p99 = record[Math.min(record.length - 1, Math.floor(record.length * 0.99))];
console.log(
  `${target}-raw round-trips/s=${Math.round(count / elapsed)} p99_ms=${p99.toFixed(3)} ` +
    `node_cpu_us=${((cpu.user + cpu.system) / count).toFixed(1)}${server}`,
);
socket.destroy();
