// The Node client's worker for scripts/restart-soak.sh: WORKERS loops
// (default 8) share one client and loop acquire (lease LEASE s, wait WAIT s)
// then release over KEYS keys while the script restarts the server under
// them. Prints "ready" once a first lock cycle went through, runs until its
// standard input ends, then prints one JSON line of what the calls saw (the
// script reads it and describes the fields).
//   node restart-soak.mjs ADDR [WORKERS] [KEYS] [LEASE] [WAIT] < some-fifo
// Needs the client built (npx tsc -p clients/node).

import { Client, LockTimeoutError, NotHolderError, ServerError } from "../dist/index.js";

const [addr, workersText = "8", keysText = "4", leaseText = "10", waitText = "5"] = process.argv.slice(2);
const workers = Number(workersText);
const keys = Number(keysText);
const lease = Number(leaseText);
const wait = Number(waitText);

// Seconds since the Unix epoch: the script lines these up with its restarts.
const now = () => (performance.timeOrigin + performance.now()) / 1000;
const kind = (error) => (error instanceof ServerError ? `${error.constructor.name}(${error.code})` : error.constructor.name);

let stop = false;
let markReady;
const ready = new Promise((resolve) => (markReady = resolve));
const ended = new Promise((resolve) => {
  // Anything until the end of input: the script closes it to stop.
  process.stdin.on("end", resolve).resume();
});
void ended.then(() => (stop = true));

const client = new Client(addr);

async function work(index) {
  const tally = { ok: 0, lostByRestart: 0, notGranted: 0, failed: 0, failures: [], lost: [], last: null, stall: [0, 0] };
  const answered = (at) => {
    if (tally.last !== null && at - tally.last > tally.stall[1] - tally.stall[0]) tally.stall = [tally.last, at];
    tally.last = at;
  };
  const fail = (call, error) => {
    tally.failed += 1;
    tally.failures.push([now(), call, kind(error), String(error.message)]);
  };
  for (let turn = index + 1; !stop; turn++) {
    let lock;
    const askedAt = now();
    try {
      lock = await client.acquire(`restart-soak/${turn % keys}`, { lease, wait });
    } catch (error) {
      if (error instanceof LockTimeoutError) {
        tally.notGranted += 1;
      } else {
        fail("acquire", error);
        // A failure that comes at once must not spin the loop.
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
      continue;
    }
    const acquiredAt = now();
    tally.ok += 1;
    answered(acquiredAt);
    try {
      await lock.release();
      tally.ok += 1;
      answered(now());
      markReady();
    } catch (error) {
      if (error instanceof NotHolderError) {
        const at = now();
        tally.lostByRestart += 1;
        tally.lost.push([askedAt, at]);
        answered(at);
      } else {
        fail("release", error);
      }
    }
  }
  return tally;
}

const running = Promise.all(Array.from({ length: workers }, (_, index) => work(index)));
await Promise.race([ready, ended]);
console.log("ready");
const tallies = await running;
client.close();
const sum = (field) => tallies.reduce((total, tally) => total + tally[field], 0);
const stall = tallies.map((tally) => tally.stall).reduce((a, b) => (b[1] - b[0] > a[1] - a[0] ? b : a));
console.log(
  JSON.stringify({
    client: "node",
    workers,
    ok: sum("ok"),
    lost_by_restart: sum("lostByRestart"),
    not_granted: sum("notGranted"),
    failed: sum("failed"),
    stall_s: stall[1] - stall[0],
    stall_from: stall[0],
    stall_to: stall[1],
    failures: tallies.flatMap((tally) => tally.failures),
    lost: tallies.flatMap((tally) => tally.lost),
  }),
);
