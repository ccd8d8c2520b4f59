#!/usr/bin/env python3
"""Per-request cost split and multi-core projection of scripts/shard-cost.sh.

Usage: shard_cost_report.py --json OUT.json --markdown OUT.md [--command CMD] RUN.json...

Runs are labelled `own`, `own-shared` and `two-shards` (see the script).
A run's server cost per request is the server's CPU time over the measured
time (all its threads) divided by the lock ops it answered.

Model, for N shard cores, connections spread evenly over them and keys
hashed evenly: a request's key is on another core than its connection with
probability 1 - 1/N, so the server's CPU time per request is

    cost(N) = own + (1 - 1/N) * hop

and N cores busy serving give N / cost(N) requests per second. `own` is
the `own` run's cost (one core, the generator on the other CPU); `hop` is
(two-shards - own-shared) / (1/2), both of those with the generator
time-shared, so that time-sharing costs the same on both sides.
"""

import argparse
import json
import statistics
import sys
import time

PROJECTED_CORES = [1, 2, 4, 8, 16]


def cost_ns(run):
    server = run.get("server") or {}
    if not server or run["ops_per_s"] <= 0:
        return None
    return server["cpu_percent"] / 100.0 * 1e9 / run["ops_per_s"]


def summarize(runs, command):
    configs = {}
    for label in ["own", "own-shared", "two-shards"]:
        mine = [r for r in runs if r["label"] == label]
        costs = [c for c in (cost_ns(r) for r in mine) if c is not None]
        configs[label] = {
            "runs": len(mine),
            "cost_ns_per_op": statistics.median(costs) if costs else None,
            "cost_ns_by_round": costs,
            "ops_per_s": statistics.median([r["ops_per_s"] for r in mine]) if mine else None,
            "server_cpu_percent": statistics.median([r["server"]["cpu_percent"] for r in mine if r.get("server")])
            if mine else None,
            "generator_cpu_percent": statistics.median([r.get("generator_cpu_percent") or 0 for r in mine])
            if mine else None,
            "cpu_pressure_percent_max": max([r.get("cpu_pressure_percent") or 0 for r in mine], default=0),
            "cpu_steal_percent_max": max([r.get("cpu_steal_percent") or 0 for r in mine], default=0),
        }
    own = configs["own"]["cost_ns_per_op"]
    shared = configs["own-shared"]["cost_ns_per_op"]
    two = configs["two-shards"]["cost_ns_per_op"]
    # Rounds paired in order, as the script alternates the configurations.
    hop_by_round = [(t - s) / 0.5 for t, s in zip(configs["two-shards"]["cost_ns_by_round"],
                                                  configs["own-shared"]["cost_ns_by_round"])]
    hop = (two - shared) / 0.5 if two is not None and shared is not None else None
    projection = []
    if own is not None and hop is not None:
        for cores in PROJECTED_CORES:
            cost = own + (1 - 1 / cores) * hop
            projection.append({
                "cores": cores,
                "cost_ns_per_op": cost,
                "ops_per_s": cores * 1e9 / cost,
                "ops_per_s_without_hop": cores * 1e9 / own,
                "hop_share_of_cost": (1 - 1 / cores) * hop / cost,
            })
    return {
        "command": command,
        "generated_unix_s": int(time.time()),
        "configs": configs,
        "own_ns_per_op": own,
        "hop_ns_per_op": hop,
        "hop_ns_by_round": hop_by_round,
        "time_sharing_ns_per_op": shared - own if shared is not None and own is not None else None,
        "projection": projection,
        "runs": runs,
    }


def fmt(value, digits=0):
    return "-" if value is None else f"{value:,.{digits}f}"


def markdown(summary):
    lines = [
        "# Per-request cost: own core and cross-core hop",
        "",
        f"Command: `{summary['command']}`.",
        "",
        "| configuration | server cost per lock op (median) | by round | lock ops/s | server CPU | generator CPU "
        "| max CPU pressure / steal |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    names = {
        "own": "--shards 1 on CPU 1, generator on CPU 0",
        "own-shared": "--shards 1 on CPU 1, generator time-shared",
        "two-shards": "--shards 2 on CPUs 0-1, generator time-shared",
    }
    for label, config in summary["configs"].items():
        rounds = ", ".join(f"{c:.0f}" for c in config["cost_ns_by_round"])
        lines.append(
            f"| {names[label]} | {fmt(config['cost_ns_per_op'])} ns | {rounds} | {fmt(config['ops_per_s'])} "
            f"| {fmt(config['server_cpu_percent'])} % | {fmt(config['generator_cpu_percent'])} % "
            f"| {fmt(config['cpu_pressure_percent_max'], 1)} % / {fmt(config['cpu_steal_percent_max'], 1)} % |")
    lines += [
        "",
        f"- Own-core cost per request: **{fmt(summary['own_ns_per_op'])} ns** of server CPU.",
        f"- Cross-core hop, per request that hops: **{fmt(summary['hop_ns_per_op'])} ns** "
        f"(rounds: {', '.join(f'{h:.0f}' for h in summary['hop_ns_by_round'])}).",
        f"- Time-sharing the server's core with the generator added {fmt(summary['time_sharing_ns_per_op'])} ns.",
        "",
        "| shard cores | hop share | server CPU per request | projected lock ops/s | without the hop |",
        "|---:|---:|---:|---:|---:|",
    ]
    for p in summary["projection"]:
        lines.append(f"| {p['cores']} | {p['hop_share_of_cost']:.0%} | {p['cost_ns_per_op']:.0f} ns "
                     f"| {p['ops_per_s'] / 1e6:.1f} M | {p['ops_per_s_without_hop'] / 1e6:.1f} M |")
    lines.append("")
    return "\n".join(lines)


def main(argv):
    parser = argparse.ArgumentParser(usage=__doc__)
    parser.add_argument("--json", required=True)
    parser.add_argument("--markdown", required=True)
    parser.add_argument("--command", default="scripts/shard-cost.sh")
    parser.add_argument("runs", nargs="+")
    args = parser.parse_args(argv[1:])
    runs = []
    for path in args.runs:
        with open(path) as f:
            runs.append(json.load(f))
    summary = summarize(runs, args.command)
    with open(args.json, "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    with open(args.markdown, "w") as f:
        f.write(markdown(summary))


if __name__ == "__main__":
    main(sys.argv)
