#!/usr/bin/env python3
"""Two ringlock server builds compared round by round (scripts/ab.sh).

Usage: ab_report.py --out PREFIX --old PATH --new PATH --command CMD RUN.json ...

Each RUN.json is one `ringlock-bench run --json` whose label is
`round-<n>-<echo|old|new>`. For each round with all three, the ratios
new/old, new/echo and old/echo of lock operations per second; the report
gives each ratio's median over the rounds with the quartiles, each
target's median rate, and the CPU pressure and steal the runs saw (no run
was retried, so a disturbed comparison shows there). Writes PREFIX.md and
PREFIX.json, and prints the Markdown.
"""

import argparse
import json
import re
import statistics
import sys

LABEL = re.compile(r"^round-(\d+)-(echo|old|new)$")
RATIOS = (("new", "old"), ("new", "echo"), ("old", "echo"))


def quartiles(values):
    """(first quartile, median, third quartile); all three the value itself
    for a single one."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    first, median, third = statistics.quantiles(values, n=4, method="inclusive")
    return first, median, third


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--old", required=True)
    parser.add_argument("--new", required=True)
    parser.add_argument("--command", required=True)
    parser.add_argument("runs", nargs="+")
    args = parser.parse_args()

    rounds = {}
    runs = []
    for path in args.runs:
        with open(path) as file:
            run = json.load(file)
        runs.append(run)
        match = LABEL.match(run["label"])
        if not match:
            sys.exit(f"{path}: label {run['label']!r} is not round-<n>-<echo|old|new>")
        rounds.setdefault(int(match[1]), {})[match[2]] = run

    complete = {number: got for number, got in sorted(rounds.items()) if len(got) == 3}
    if not complete:
        sys.exit("no round has all of echo, old and new")
    incomplete = len(rounds) - len(complete)
    rate = {name: [got[name]["ops_per_s"] for got in complete.values()] for name in ("echo", "old", "new")}
    ratios = {}
    for top, bottom in RATIOS:
        values = [got[top]["ops_per_s"] / got[bottom]["ops_per_s"] for got in complete.values()]
        first, median, third = quartiles(values)
        ratios[f"{top}/{bottom}"] = {"median": median, "q1": first, "q3": third, "rounds": values}
    errors = sum(sum(run.get("errors", {}).values()) for run in runs)
    disturbance = {
        name: [run.get(field) or 0 for run in runs]
        for name, field in (("pressure", "cpu_pressure_percent"), ("steal", "cpu_steal_percent"))
    }
    sample = next(iter(complete.values()))["echo"]
    shape = f"{sample['connections']} connections x {sample['depth']} in flight"

    lines = [
        "# ringlock A/B: two server builds, short interleaved rounds",
        "",
        f"- command: `{args.command}`",
        f"- old: `{args.old}`",
        f"- new: `{args.new}`",
        f"- {len(complete)} rounds of {shape}, {sample['duration_s']:.1f} s each"
        + (f" ({incomplete} incomplete rounds left out)" if incomplete else "")
        + f"; errors in the runs: {errors}",
        "- CPU pressure of the runs: median {:.1f} %, max {:.1f} %; CPU stolen: median {:.1f} %, max {:.1f} %".format(
            statistics.median(disturbance["pressure"]),
            max(disturbance["pressure"]),
            statistics.median(disturbance["steal"]),
            max(disturbance["steal"]),
        ),
        "",
        "| ratio | median of the rounds | quartiles |",
        "|---|---:|---:|",
    ]
    for name, ratio in ratios.items():
        lines.append(f"| {name} | {ratio['median']:.3f} | {ratio['q1']:.3f}–{ratio['q3']:.3f} |")
    lines += ["", "| target | median lock ops/s |", "|---|---:|"]
    for name in ("echo", "old", "new"):
        lines.append(f"| {name} | {statistics.median(rate[name]) / 1e6:.2f} M |")
    markdown = "\n".join(lines) + "\n"

    with open(args.out + ".md", "w") as file:
        file.write(markdown)
    with open(args.out + ".json", "w") as file:
        json.dump(
            {"command": args.command, "old": args.old, "new": args.new, "ratios": ratios, "runs": runs},
            file,
            indent=1,
        )
    print(markdown, end="")


if __name__ == "__main__":
    main()
