#!/usr/bin/env python3
"""The TLS comparison of `TLS=1 scripts/bench.sh`: reads the JSON of its
`ringlock-bench run` and `connect-rate` runs and prints, as Markdown, each
target's median and each ratio of issue 33's goals as the median of the
rounds' ratios (round i pairs the i-th run of each side), with the goal and
whether it was met. --out writes everything as one JSON document."""

import argparse
import json
import statistics
from collections import defaultdict


def load(paths):
    runs, rates = defaultdict(list), defaultdict(list)
    for path in paths:
        with open(path) as file:
            run = json.load(file)
        key = (run["label"], run["target"])
        (rates if "connections_per_s" in run else runs)[key].append(run)
    return runs, rates


def paired(left, right, value):
    """The median of the rounds' ratios left/right, and how many rounds."""
    ratios = [value(a) / value(b) for a, b in zip(left, right) if value(b)]
    return (statistics.median(ratios) if ratios else None), len(ratios)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("files", nargs="+")
    parser.add_argument("--out")
    parser.add_argument("--command", default="TLS=1 scripts/bench.sh")
    args = parser.parse_args()
    runs, rates = load(args.files)
    ops = lambda run: run["ops_per_s"]
    lines = ["| label | target | lock ops/s (median) | server CPU % | disturbance % (max) |", "|---|---|---:|---:|---:|"]
    for (label, target), group in sorted(runs.items()):
        cpu = [run["server"]["cpu_percent"] for run in group if run.get("server")]
        disturbance = max(max(run.get("cpu_pressure_percent") or 0, run.get("cpu_steal_percent") or 0) for run in group)
        lines.append(
            f"| {label} | {target} | {statistics.median(map(ops, group)):,.0f} | "
            f"{statistics.median(cpu) if cpu else float('nan'):.0f} | {disturbance:.1f} |"
        )
    for (label, target), group in sorted(rates.items()):
        per = [run["server_cpu_us_per_connection"] for run in group if run.get("server_cpu_us_per_connection")]
        lines.append(
            f"| {label} | {target} | {statistics.median(r['connections_per_s'] for r in group):,.0f} connections/s | "
            f"{statistics.median(per) if per else float('nan'):.0f} us per connection | "
            f"{max(max(r.get('cpu_pressure_percent') or 0, r.get('cpu_steal_percent') or 0) for r in group):.1f} |"
        )
    get = lambda label, target: runs.get((label, target), [])
    goals = []

    def goal(name, ratio, rounds, target, at_least=True):
        met = None if ratio is None else (ratio >= target if at_least else ratio <= target)
        goals.append({"goal": name, "ratio": ratio, "rounds": rounds, "target": target, "at_least": at_least, "met": met})

    for shape, floor in (("pipelined-16x64", 0.70), ("unpipelined-64x1", 0.85)):
        goal(f"ringlock TLS / plain, {shape}", *paired(get(f"{shape}-tls", "ringlock"), get(shape, "ringlock"), ops), floor)
    for shape, floor in (("pipelined-16x64", 8.0), ("unpipelined-64x1", 1.2)):
        goal(f"ringlock TLS / Redis TLS, {shape}", *paired(get(f"{shape}-tls", "ringlock"), get(f"{shape}-tls", "redis"), ops), floor)
    for shape in ("pipelined-16x64", "unpipelined-64x1"):
        ratio, rounds = paired(get(f"{shape}-tls", "redis"), get(shape, "redis"), ops)
        goals.append({"goal": f"Redis TLS / plain, {shape} (for reference)", "ratio": ratio, "rounds": rounds,
                      "target": None, "at_least": True, "met": None})
    auth, rounds = paired(get("pipelined-16x64-auth", "ringlock"), get("pipelined-16x64", "ringlock"), ops)
    goal("ringlock auth cost, pipelined-16x64 (1 - auth/plain)", None if auth is None else 1 - auth, rounds, 0.01, False)
    per_connection = lambda run: run.get("server_cpu_us_per_connection") or 0
    ring_rate, redis_rate = rates.get(("connect-tls", "ringlock"), []), rates.get(("connect-tls", "redis"), [])
    goal("TLS handshake server CPU per connection, ringlock / Redis", *paired(ring_rate, redis_rate, per_connection), 1.5, False)
    ratio, rounds = paired(ring_rate, redis_rate, lambda run: run["connections_per_s"])
    goals.append({"goal": "new TLS connections/s, ringlock / Redis (for reference)", "ratio": ratio, "rounds": rounds,
                  "target": None, "at_least": True, "met": None})

    lines += ["", "| ratio (median of rounds) | value | goal | met |", "|---|---:|---:|---|"]
    for entry in goals:
        value = "n/a" if entry["ratio"] is None else f"{entry['ratio']:.3f}"
        target = "" if entry["target"] is None else ("≥ " if entry["at_least"] else "≤ ") + f"{entry['target']:g}"
        met = {True: "yes", False: "**no**", None: ""}[entry["met"]]
        lines.append(f"| {entry['goal']} ({entry['rounds']} rounds) | {value} | {target} | {met} |")
    lines += ["", f"Command: `{args.command}`"]
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as file:
            json.dump({"command": args.command, "goals": goals,
                       "runs": [run for group in runs.values() for run in group],
                       "connect_rate": [run for group in rates.values() for run in group]}, file, indent=1)


if __name__ == "__main__":
    main()
