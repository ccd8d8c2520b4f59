// The README's examples: every ```js block of README.md runs as a program of
// its own (importing "ringlock" as an application would, through the
// package's own name) against a real server, with the examples' address
// (127.0.0.1:7700) replaced by the server's, and a second server for the
// second cluster of the "Several clusters" example (127.0.0.1:7800). A block is skipped only if the
// line before its fence is a `<!-- not run: reason -->` mark.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { after, before, test } from "node:test";

import { Server } from "./harness.mjs";

const HERE = dirname(dirname(fileURLToPath(import.meta.url)));
const README = readFileSync(join(HERE, "README.md"), "utf8");
const SCRATCH = join(HERE, ".readme-run");

function blocks(text) {
  const found = [];
  const lines = text.split("\n");
  let previous = "";
  for (let index = 0; index < lines.length; index += 1) {
    const fence = /^```(\S*)/.exec(lines[index]);
    if (!fence) {
      if (lines[index].trim()) previous = lines[index].trim();
      continue;
    }
    const start = index;
    const body = [];
    for (index += 1; index < lines.length && !lines[index].startsWith("```"); index += 1) body.push(lines[index]);
    if (fence[1] === "js") {
      const mark = /^<!--\s*not run\s*:(.*)-->$/.exec(previous);
      found.push({ line: start + 1, code: body.join("\n"), notRun: mark ? mark[1].trim() : null });
    }
    previous = "";
  }
  return found;
}

let server;
let second;
before(async () => {
  [server, second] = await Promise.all([Server.start(), Server.start()]);
  mkdirSync(SCRATCH, { recursive: true });
});
after(async () => {
  rmSync(SCRATCH, { recursive: true, force: true });
  await Promise.all([server?.stop(), second?.stop()]);
});

test("the README has a first example that runs", () => {
  const all = blocks(README);
  assert.ok(all.length >= 2);
  assert.equal(all[0].notRun, null);
});

for (const block of blocks(README)) {
  test(`README.md block at line ${block.line}`, { skip: block.notRun ?? false }, async () => {
    const file = join(SCRATCH, `block-${block.line}.mjs`);
    writeFileSync(file, block.code.replaceAll("127.0.0.1:7700", server.address).replaceAll("127.0.0.1:7800", second.address));
    const child = spawn(process.execPath, [file], { cwd: HERE, stdio: ["ignore", "pipe", "pipe"] });
    let output = "";
    child.stdout.on("data", (chunk) => (output += chunk));
    child.stderr.on("data", (chunk) => (output += chunk));
    const timer = setTimeout(() => child.kill("SIGKILL"), 60000);
    const [code, signal] = await once(child, "exit");
    clearTimeout(timer);
    assert.equal(signal, null, `killed (ran over a minute):\n${output}`);
    assert.equal(code, 0, output);
  });
}
