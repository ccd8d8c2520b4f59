// Reads bench.sh's lines (several rounds, each starting "round N") on its
// standard input and prints each line's median over the rounds, then the
// ratios the issue sets goals for, taken within each round (so both sides of
// a ratio saw the same minutes of a shared machine): min, median, max.
//   clients/node/bench/bench.sh --rounds 5 (runs it itself)

import { readFileSync } from "node:fs";

const rounds = [];
let current = null;
let pendingBefore = null;
for (const raw of readFileSync(0, "utf8").split("\n")) {
  const line = raw.trim();
  if (line.startsWith("round ")) {
    current = new Map();
    rounds.push(current);
    continue;
  }
  if (current === null || !line.includes("=")) continue;
  const before = line.startsWith("before: ");
  const words = (before ? line.slice(8) : line).split(" ");
  const fields = Object.fromEntries(words.slice(1).map((word) => word.split("=")).map(([k, v]) => [k, Number(v)]));
  let name = words[0];
  if (fields.loops !== undefined) name += ` ${fields.loops}`;
  if (before) {
    // An earlier build's line has no connections field: it is the one of
    // the line right after it.
    pendingBefore = fields;
    continue;
  }
  if (fields.connections !== undefined) name += ` c${fields.connections}`;
  current.set(name, fields);
  if (pendingBefore !== null) {
    current.set(`before ${name}`, pendingBefore);
    pendingBefore = null;
  }
}

const median = (values) => {
  const sorted = values.filter((v) => Number.isFinite(v)).sort((a, b) => a - b);
  if (sorted.length === 0) return NaN;
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
};

const names = [...new Set(rounds.flatMap((round) => [...round.keys()]))];
console.log(`\n${rounds.length} rounds; medians:`);
console.log("| line | cycles/s (round trips/s for -raw) | p99 ms | Node CPU µs/cycle | server CPU µs/cycle |");
console.log("|---|---:|---:|---:|---:|");
const cell = (name, field, digits) => {
  const value = median(rounds.map((round) => round.get(name)?.[field]));
  return Number.isFinite(value) ? value.toLocaleString("en-US", { maximumFractionDigits: digits }) : "";
};
for (const name of names) {
  const rate = name.endsWith("-raw") ? "round-trips/s" : "cycles/s";
  const cpu = name.startsWith("ringlock-bench") ? "generator_cpu_us" : "node_cpu_us";
  console.log(
    `| ${name} | ${cell(name, rate, 0)} | ${cell(name, "p99_ms", 1)} | ${cell(name, cpu, 1)} | ${cell(name, "server_cpu_us", 1)} |`,
  );
}

const ratios = [
  ["ringlock 64 c1 / ringlock-bench 64 c1 (goal >= 0.5)", "ringlock 64 c1", "ringlock-bench 64 c1"],
  ["ringlock 1 / redlock 1 (goal >= 3)", "ringlock 1 c2", "redlock 1"],
  ["ringlock 1 / ioredis 1 (goal >= 3)", "ringlock 1 c2", "ioredis 1"],
  ["ringlock 64 / redlock 64 (goal >= 5)", "ringlock 64 c2", "redlock 64"],
  ["ringlock 64 / ioredis 64 (goal >= 5)", "ringlock 64 c2", "ioredis 64"],
  ["ringlock 1 cycle vs 2 bare round trips (ringlock-raw / 2)", "ringlock 1 c2", "ringlock-raw", 2],
  ["ioredis 1 cycle vs 2 bare round trips (redis-raw / 2)", "ioredis 1", "redis-raw", 2],
  ["ringlock 1: now / before", "ringlock 1 c2", "before ringlock 1 c2"],
  ["ringlock 64 c2: now / before", "ringlock 64 c2", "before ringlock 64 c2"],
  ["ringlock 64 c1: now / before", "ringlock 64 c1", "before ringlock 64 c1"],
];
console.log("\nratios within each round: min / median / max (each round)");
for (const [label, top, bottom, scale = 1] of ratios) {
  const values = rounds.map((round) => {
    const a = round.get(top);
    const b = round.get(bottom);
    const rate = (fields) => fields?.["cycles/s"] ?? fields?.["round-trips/s"];
    return a && b ? (rate(a) * scale) / rate(b) : NaN;
  });
  const finite = values.filter(Number.isFinite);
  if (finite.length === 0) continue;
  const show = (v) => v.toFixed(2);
  console.log(
    `${label}: ${show(Math.min(...finite))} / ${show(median(finite))} / ${show(Math.max(...finite))}` +
      `  (${values.map((v) => (Number.isFinite(v) ? show(v) : "-")).join(", ")})`,
  );
}
