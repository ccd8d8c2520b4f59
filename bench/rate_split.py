#!/usr/bin/env python3
"""Where one server's CPU time goes, per lock operation, at one offered rate
(docs/performance.md, "Latency under open-loop load"); written by
scripts/rate-split.sh.

Usage: rate_split.py --markdown OUT.md --json OUT.json --command CMD
                     TARGET:RUN.json:PERF.data:PERF.stat ...

RUN.json is ringlock-bench's report of the run, PERF.data a `perf record -e
cpu-clock -g` profile of the server taken during it, and PERF.stat the
`perf stat` counts of the server's io_uring_enter calls and submitted
requests over the same seconds (its `seconds time elapsed` line gives them).
A sample goes to the first group its call stack names:

- sends: an io_uring send down to TCP. On loopback the receiving side's
  TCP work (tcp_v4_rcv, the generator's receive) runs inside the sender's
  call, so it is reported apart, as "of which the peer's receive".
- receives: an io_uring receive up from TCP.
- other kernel: io_uring_enter itself, waiting, scheduling, timers.
- polling: the server's loop with nothing to do (bench/perf_split.py's
  "idle poll and sleep" functions, outside the kernel).
- own work: every other sample in user space: parsing, the lock table,
  replies, the event loop.

Nanoseconds per operation are the group's samples times the sampling period,
over the operations answered while perf ran (the run's achieved rate times
the profile's length).
"""

import argparse
import json
import re
import subprocess
import sys

from perf_split import GROUPS

SEND = {"tcp_sendmsg", "sock_sendmsg", "io_send", "io_sendmsg", "io_send_zc"}
RECEIVE = {"tcp_recvmsg", "sock_recvmsg", "io_recv", "io_recvmsg", "io_recv_finish"}
PEER_RECEIVE = "tcp_v4_rcv"
POLLING = GROUPS["idle poll and sleep"]
ORDER = ["own work", "polling", "sends", "of which the peer's receive", "receives", "other kernel"]

FRAME = re.compile(r"^\s*[0-9a-f]+\s+(\S+?)(?:\+0x[0-9a-f]+)?\s+\((.*)\)\s*$")
HEADER = re.compile(r"\s(\d+)\s+cpu-clock:")


def samples(perf_data):
    """Yields (period in ns, [(symbol, is_kernel), ...] from the leaf up)."""
    script = subprocess.run(["perf", "script", "-i", perf_data, "-F", "period,event,ip,sym,dso"],
                            capture_output=True, text=True, check=True).stdout
    period, frames = None, []
    for line in script.splitlines() + [""]:
        header = HEADER.search(line)
        if header:
            period, frames = int(header.group(1)), []
            continue
        frame = FRAME.match(line)
        if frame and period is not None:
            frames.append((frame.group(1), "kernel" in frame.group(2)))
            continue
        if not line.strip() and period is not None:
            yield period, frames
            period, frames = None, []


def group_of(frames):
    symbols = {symbol for symbol, _ in frames}
    if symbols & SEND:
        return "sends", PEER_RECEIVE in symbols
    if symbols & RECEIVE:
        return "receives", False
    if frames and frames[0][1]:
        return "other kernel", False
    if (frames and frames[0][0] in POLLING) or "ringlock::ring_poll::poll_before_sleep" in symbols:
        return "polling", False
    return "own work", False


def stat_counts(perf_stat):
    counts, seconds = {}, None
    with open(perf_stat) as stat:
        lines = stat.read().splitlines()
    for line in lines:
        count = re.match(r"\s*([\d,]+)\s+(\S+)", line)
        if count and ":" in count.group(2):
            counts[count.group(2)] = int(count.group(1).replace(",", ""))
        elapsed = re.match(r"\s*([\d.]+) seconds time elapsed", line)
        if elapsed:
            seconds = float(elapsed.group(1))
    return counts, seconds


def split(target, run_json, perf_data, perf_stat):
    with open(run_json) as run_file:
        run = json.load(run_file)
    counts, seconds = stat_counts(perf_stat)
    ns = {name: 0 for name in ORDER}
    busy = 0
    for period, frames in samples(perf_data):
        group, peer = group_of(frames)
        ns[group] += period
        if peer:
            ns["of which the peer's receive"] += period
        busy += period
    ops = run["ops_per_s"] * seconds
    per_op = {name: value / ops for name, value in ns.items()}
    return {
        "target": target,
        "offered_ops_per_s": (run.get("open_loop") or {}).get("offered_ops_per_s"),
        "achieved_ops_per_s": run["ops_per_s"],
        "keeping": (run.get("open_loop") or {}).get("keeping"),
        "acquire_p99_us": run["acquire_latency_us"]["p99"],
        "cpu_pressure_percent": run.get("cpu_pressure_percent"),
        "profile_s": seconds,
        "busy_percent": 100 * busy / (seconds * 1e9),
        "ns_per_op": per_op,
        "ns_per_op_total": busy / ops,
        "enters_per_1000_ops": 1000 * counts.get("syscalls:sys_enter_io_uring_enter", 0) / ops,
        "submissions_per_1000_ops": 1000 * counts.get("io_uring:io_uring_submit_req", 0) / ops,
    }


def markdown(rows, command):
    lines = [
        "# CPU per lock operation at one offered rate",
        "",
        f"Command: `{command}`; servers on CPU 1, the generator on CPU 0,"
        " perf profiling each server during its run.",
        "",
        "| | " + " | ".join(row["target"] for row in rows) + " |",
        "|---|" + "---:|" * len(rows),
    ]

    def line(label, cells):
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    line("offered lock ops/s", [f"{(row['offered_ops_per_s'] or 0) / 1e6:.2f} M" for row in rows])
    line("achieved lock ops/s", [f"{row['achieved_ops_per_s'] / 1e6:.2f} M" for row in rows])
    line("schedule", [str(row["keeping"]) for row in rows])
    line("acquire p99 (perf running)", [f"{row['acquire_p99_us']:.0f} µs" for row in rows])
    line("server core busy", [f"{row['busy_percent']:.0f} %" for row in rows])
    line("**CPU per lock op**", [f"**{row['ns_per_op_total']:.0f} ns**" for row in rows])
    for name in ORDER:
        line(f"– {name}", [f"{row['ns_per_op'][name]:.0f} ns" for row in rows])
    line("io_uring_enter calls per 1,000 ops", [f"{row['enters_per_1000_ops']:.1f}" for row in rows])
    line("submissions per 1,000 ops", [f"{row['submissions_per_1000_ops']:.1f}" for row in rows])
    line("CPU pressure during the run", [f"{row['cpu_pressure_percent']:.1f} %" for row in rows])
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", required=True)
    parser.add_argument("--json", required=True)
    parser.add_argument("--command", required=True)
    parser.add_argument("runs", nargs="+", help="TARGET:RUN.json:PERF.data:PERF.stat")
    args = parser.parse_args()
    rows = [split(*run.split(":", 3)) for run in args.runs]
    with open(args.json, "w") as out:
        json.dump({"command": args.command, "runs": rows}, out, indent=2)
    with open(args.markdown, "w") as out:
        out.write(markdown(rows, args.command))


if __name__ == "__main__":
    sys.exit(main())
