#!/usr/bin/env python3
"""Tables, goals and chart of scripts/latency.sh, from its runs' JSON.

Usage:
  latency_report.py saturation LABEL TARGET RUN.json...
      prints the saturation of TARGET: the highest lock ops/s of its
      closed-loop runs labelled LABEL (on a shared machine a disturbed round
      only ever measures less than the server can do)
  latency_report.py report --json OUT.json --markdown OUT.md [--chart OUT.png]
                    [--command CMD] [--shape CxD] [--throughput-shape CxD]
                    [--elapsed-s S] RUN.json...

--shape is the sweep's (connections x lanes), --throughput-shape the
pipelined throughput goal's. Runs are told apart by their label:
`closed-<shape>`, `closed-<throughput shape>` and `closed-64x1` (closed
loop, the saturation rounds), `sweep-<fraction>` (open loop at that
fraction of the target's own saturation), `goal-at-ringlock-0.8` and
`goal-at-redis-1.0` (open loop at another target's rate, for the goals) and
`contended-<rate>`. Latencies are acquire latencies in microseconds, from
each request's intended send time.
"""

import argparse
import json
import statistics
import sys
import time

COLORS = {"echo": "#7f7f7f", "ringlock": "#1f77b4", "redis": "#d62728"}
TARGETS = ["echo", "ringlock", "redis"]

# The goals: (name, goal, "<=" or ">=").
GOAL_RINGLOCK_VS_ECHO_P99 = 1.5
GOAL_RINGLOCK_VS_REDIS_P99 = 0.1
GOAL_PIPELINED_VS_ECHO = 0.90
GOAL_UNPIPELINED_VS_ECHO = 1.0


def load(paths):
    runs = []
    for path in paths:
        with open(path) as f:
            runs.append(json.load(f))
    return runs


def closed_ops(runs, label, target):
    """Ops/s of TARGET's closed-loop runs labelled LABEL, in run order."""
    return [r["ops_per_s"] for r in runs if r["label"] == label and r["target"] == target and not r.get("open_loop")]


def median(values):
    return statistics.median(values) if values else None


def by_round_ratio(runs, label, ours, base):
    """Median over rounds of ours/base, pairing the i-th run of each."""
    ratios = [a / b for a, b in zip(closed_ops(runs, label, ours), closed_ops(runs, label, base)) if b > 0]
    return median(ratios), ratios


def point(run):
    """One open-loop run as a point of the sweep."""
    open_loop = run["open_loop"]
    acquire = run["acquire_latency_us"]
    return {
        "label": run["label"],
        "target": run["target"],
        "workload": run["workload"],
        "fraction": float(run["label"].rsplit("-", 1)[1]) if run["label"].startswith("sweep-") else None,
        "offered_ops_per_s": open_loop["offered_ops_per_s"],
        "achieved_ops_per_s": open_loop["achieved_ops_per_s"],
        "p50_us": acquire["p50"],
        "p90_us": acquire["p90"],
        "p99_us": acquire["p99"],
        "p999_us": acquire["p999"],
        "max_us": acquire["max"],
        "release_p99_us": run["release_latency_us"]["p99"],
        "lag_p99_us": open_loop["lag_us"]["p99"],
        "held_share": open_loop["held_acquires"] / max(open_loop["sent_acquires"], 1),
        "keeping": open_loop["keeping"],
        "cpu_pressure_percent": run.get("cpu_pressure_percent"),
        "cpu_steal_percent": run.get("cpu_steal_percent", 0.0),
        "server_cpu_percent": (run.get("server") or {}).get("cpu_percent"),
        "generator_cpu_percent": run.get("generator_cpu_percent"),
        "timeouts": sum(run.get("timeouts", {}).values()),
        "busy_retries": run.get("errors", {}).get("busy", 0),
    }


def find(points, target, label):
    for p in points:
        if p["target"] == target and p["label"] == label:
            return p
    return None


def find_fraction(points, target, fraction):
    for p in points:
        if p["target"] == target and p["fraction"] is not None and abs(p["fraction"] - fraction) < 1e-9:
            return p
    return None


def goal(name, value, limit, direction, detail):
    met = None if value is None else (value <= limit if direction == "<=" else value >= limit)
    return {"goal": name, "value": value, "limit": limit, "direction": direction, "met": met, "detail": detail}


def goals(runs, points, throughput_shape):
    out = []
    ours, echo = find_fraction(points, "ringlock", 0.8), find(points, "echo", "goal-at-ringlock-0.8")
    value = ours["p99_us"] / echo["p99_us"] if ours and echo and echo["p99_us"] > 0 else None
    detail = (f"ringlock p99 {ours['p99_us']:.0f} us vs echo p99 {echo['p99_us']:.0f} us "
              f"at {ours['offered_ops_per_s'] / 1e6:.2f} M ops/s") if value is not None else "not measured"
    out.append(goal("ringlock p99 / echo p99, at 80 % of ringlock's saturation", value,
                    GOAL_RINGLOCK_VS_ECHO_P99, "<=", detail))
    ours, redis = find(points, "ringlock", "goal-at-redis-1.0"), find_fraction(points, "redis", 1.0)
    value = ours["p99_us"] / redis["p99_us"] if ours and redis and redis["p99_us"] > 0 else None
    detail = (f"ringlock p99 {ours['p99_us']:.0f} us vs Redis p99 {redis['p99_us']:.0f} us "
              f"at {redis['offered_ops_per_s'] / 1e3:.0f} k ops/s") if value is not None else "not measured"
    out.append(goal("ringlock p99 / Redis p99, at Redis's saturation rate", value,
                    GOAL_RINGLOCK_VS_REDIS_P99, "<=", detail))
    for label, limit, name in [(f"closed-{throughput_shape}", GOAL_PIPELINED_VS_ECHO,
                                f"pipelined throughput {throughput_shape}"),
                               ("closed-64x1", GOAL_UNPIPELINED_VS_ECHO, "unpipelined throughput 64x1")]:
        value, rounds = by_round_ratio(runs, label, "ringlock", "echo")
        detail = ("rounds " + ", ".join(f"{r:.3f}" for r in rounds)) if rounds else "not measured"
        out.append(goal(f"{name}: ringlock / echo (closed loop, median of rounds)", value, limit, ">=", detail))
    return out


def fmt_us(us):
    if us >= 10_000:
        return f"{us / 1000:.0f} ms"
    if us >= 1_000:
        return f"{us / 1000:.1f} ms"
    return f"{us:.0f} us"


def fmt_rate(ops):
    if ops >= 1e6:
        return f"{ops / 1e6:.2f} M"
    return f"{ops / 1e3:.0f} k"


KEEPING = {"on-schedule": "on schedule", "generator-behind": "**generator behind**", "server-behind": "server behind"}


def markdown(summary):
    lines = []
    add = lines.append
    add("# Latency under open-loop load")
    add("")
    add(f"Command: `{summary['command']}` ({summary['elapsed_s']} s). Host: {summary['host'].get('cpus', '?')} CPUs, "
        f"{summary['host'].get('cpu_model', '?')}, Linux {summary['host'].get('kernel', '?')}; servers on CPU 1, "
        "load generator on CPU 0.")
    noise = summary["noise"]
    add("")
    add(f"Machine noise over the measured runs: CPU pressure median {noise['pressure_median']:.1f} %, "
        f"max {noise['pressure_max']:.1f} %; steal max {noise['steal_max']:.1f} %; "
        f"{noise['disturbed_runs']} of {noise['runs']} runs kept with pressure or steal above 5 %.")
    add("")
    add("## Goals (ratios from this run)")
    add("")
    add("| goal | ratio | limit | met | measured |")
    add("|---|---:|---:|---|---|")
    for g in summary["goals"]:
        value = "-" if g["value"] is None else f"{g['value']:.3f}"
        met = {True: "yes", False: "**no**", None: "-"}[g["met"]]
        add(f"| {g['goal']} | {value} | {g['direction']} {g['limit']} | {met} | {g['detail']} |")
    add("")
    add("## Saturation (closed loop)")
    add("")
    add("Medians of the rounds; the sweep's saturation is each target's best round at "
        f"{summary['shape']}: " + ", ".join(f"{t} {fmt_rate(v)}" for t, v in summary["saturation"].items()) + ".")
    add("")
    add("| target | " + " | ".join(summary["closed"].keys()) + " |")
    add("|---|" + "---:|" * len(summary["closed"]))
    for target in TARGETS:
        if any(target in per_target for per_target in summary["closed"].values()):
            cells = [fmt_rate(summary["closed"][label][target]) if summary["closed"][label].get(target) else "-"
                     for label in summary["closed"]]
            add(f"| {target} | " + " | ".join(cells) + " |")
    add("")
    add(f"## Sweep: uncontended, {summary['shape']} (connections x most in flight each), open loop")
    add("")
    add("Acquire latency from each request's intended send time; rates in lock ops/s (acquires + releases). "
        "`generator lag` is how late the generator sent requests that had a free lane: it is inside every "
        "latency. `held` is the share of requests that waited for a free lane of their connection.")
    add("")
    add("| target | of saturation | offered | achieved | p50 | p99 | p99.9 | max | generator lag p99 | held "
        "| schedule | cpu pressure |")
    add("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for target in TARGETS:
        for p in summary["sweep"].get(target, []):
            share = f"{p['fraction']:.0%}" if p["fraction"] is not None else p["label"]
            pressure = "-" if p["cpu_pressure_percent"] is None else f"{p['cpu_pressure_percent']:.1f} %"
            add(f"| {target} | {share} | {fmt_rate(p['offered_ops_per_s'])} | {fmt_rate(p['achieved_ops_per_s'])} "
                f"| {fmt_us(p['p50_us'])} | {fmt_us(p['p99_us'])} | {fmt_us(p['p999_us'])} | {fmt_us(p['max_us'])} "
                f"| {fmt_us(p['lag_p99_us'])} | {p['held_share']:.1%} | {KEEPING[p['keeping']]} | {pressure} |")
    if summary["contended"]:
        add("")
        add("## Contended: 16 hot keys, 64 x 16, open loop at fixed rates")
        add("")
        add("Acquire latency is the wait for the grant (Redis: across its busy retries, one every ms).")
        add("")
        add("| target | offered | achieved | wait p50 | p99 | p99.9 | max | busy retries | timeouts | schedule |")
        add("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for p in summary["contended"]:
            add(f"| {p['target']} | {fmt_rate(p['offered_ops_per_s'])} | {fmt_rate(p['achieved_ops_per_s'])} "
                f"| {fmt_us(p['p50_us'])} | {fmt_us(p['p99_us'])} | {fmt_us(p['p999_us'])} | {fmt_us(p['max_us'])} "
                f"| {p['busy_retries']} | {p['timeouts']} | {KEEPING[p['keeping']]} |")
    add("")
    return "\n".join(lines)


def chart(summary, png_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 2 if summary["contended"] else 1
    fig, axes = plt.subplots(1, panels, figsize=(8 * panels, 5.6), squeeze=False)
    ax = axes[0][0]
    for target in TARGETS:
        points = sorted(summary["sweep"].get(target, []), key=lambda p: p["offered_ops_per_s"])
        points = [p for p in points if p["fraction"] is not None]
        if not points:
            continue
        xs = [p["achieved_ops_per_s"] for p in points]
        color = COLORS[target]
        ax.plot(xs, [p["p99_us"] for p in points], "-", color=color, label=f"{target} p99")
        ax.plot(xs, [p["p50_us"] for p in points], "--", color=color, alpha=0.6, label=f"{target} p50")
        for p, x in zip(points, xs):
            hollow = p["keeping"] != "on-schedule"
            marker = "x" if p["keeping"] == "generator-behind" else "o"
            ax.plot([x], [p["p99_us"]], marker, color=color, markerfacecolor="white" if hollow else color)
        saturation = summary["saturation"].get(target)
        if saturation:
            ax.axvline(saturation, color=color, linestyle=":", linewidth=1)
    for g_target, label in [("echo", "goal-at-ringlock-0.8"), ("ringlock", "goal-at-redis-1.0")]:
        for p in summary["goal_points"]:
            if p["target"] == g_target and p["label"] == label:
                ax.plot([p["achieved_ops_per_s"]], [p["p99_us"]], "*", markersize=12, color=COLORS[g_target])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("achieved lock ops/s (acquires + releases), log")
    ax.set_ylabel("acquire latency from intended send time, us (log)")
    ax.set_title(f"Open loop, uncontended, {summary['shape']}: latency vs throughput\n"
                 "dotted: closed-loop saturation; hollow: server behind; x: generator behind; *: goal points",
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")

    if summary["contended"]:
        ax = axes[0][1]
        for target in ["ringlock", "redis"]:
            points = sorted([p for p in summary["contended"] if p["target"] == target],
                            key=lambda p: p["offered_ops_per_s"])
            if not points:
                continue
            xs = [p["offered_ops_per_s"] for p in points]
            ax.plot(xs, [p["p99_us"] for p in points], "o-", color=COLORS[target], label=f"{target} wait p99")
            ax.plot(xs, [p["p50_us"] for p in points], "o--", color=COLORS[target], alpha=0.6,
                    label=f"{target} wait p50")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("offered lock ops/s, log")
        ax.set_ylabel("acquire wait, us (log)")
        ax.set_title("Contended: 16 hot keys, 64 connections x 16, open loop", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")

    host = summary["host"]
    fig.suptitle(f"ringlock-bench --rate, {host.get('cpus', '?')} CPUs ({host.get('cpu_model', '?')}): "
                 "servers on CPU 1, load generator on CPU 0", fontsize=10)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)


def host_facts():
    facts = {}
    try:
        with open("/proc/sys/kernel/osrelease") as f:
            facts["kernel"] = f.read().strip()
        with open("/proc/cpuinfo") as f:
            cpuinfo = f.read()
        facts["cpus"] = str(cpuinfo.count("processor\t:"))
        for line in cpuinfo.splitlines():
            if line.startswith("model name"):
                facts["cpu_model"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return facts


def summarize(runs, command, shape, throughput_shape, elapsed_s):
    points = [point(r) for r in runs if r.get("open_loop")]
    closed_labels = []
    for r in runs:
        if not r.get("open_loop") and r["label"] not in closed_labels:
            closed_labels.append(r["label"])
    closed = {label: {t: median(closed_ops(runs, label, t)) for t in TARGETS if closed_ops(runs, label, t)}
              for label in closed_labels}
    pressures = [r.get("cpu_pressure_percent") or 0.0 for r in runs]
    steals = [r.get("cpu_steal_percent") or 0.0 for r in runs]
    return {
        "command": command,
        "generated_unix_s": int(time.time()),
        "elapsed_s": elapsed_s,
        "host": host_facts(),
        "shape": shape,
        "throughput_shape": throughput_shape,
        "saturation": {t: max(closed_ops(runs, f"closed-{shape}", t)) for t in TARGETS
                       if closed_ops(runs, f"closed-{shape}", t)},
        "closed": closed,
        "sweep": {t: sorted([p for p in points if p["target"] == t and p["workload"] == "uncontended"
                             and p["fraction"] is not None], key=lambda p: p["fraction"]) for t in TARGETS},
        "goal_points": [p for p in points if p["label"].startswith("goal-")],
        "contended": [p for p in points if p["workload"] == "contended"],
        "goals": goals(runs, points, throughput_shape),
        "noise": {
            "runs": len(runs),
            "pressure_median": median(pressures) or 0.0,
            "pressure_max": max(pressures, default=0.0),
            "steal_max": max(steals, default=0.0),
            "disturbed_runs": sum(1 for p, s in zip(pressures, steals) if max(p, s) >= 5.0),
        },
        "runs": runs,
    }


def main(argv):
    if len(argv) >= 2 and argv[1] == "saturation":
        if len(argv) < 5:
            sys.exit(__doc__)
        value = max(closed_ops(load(argv[4:]), argv[2], argv[3]), default=None)
        if value is None:
            sys.exit(f"no closed-loop run of {argv[3]} labelled {argv[2]}")
        print(f"{value:.0f}")
        return
    parser = argparse.ArgumentParser(usage=__doc__)
    parser.add_argument("command_name", choices=["report"])
    parser.add_argument("--json", required=True)
    parser.add_argument("--markdown", required=True)
    parser.add_argument("--chart")
    parser.add_argument("--command", default="scripts/latency.sh")
    parser.add_argument("--shape", default="16x64")
    parser.add_argument("--throughput-shape", default="16x64")
    parser.add_argument("--elapsed-s", type=int, default=0)
    parser.add_argument("runs", nargs="+")
    args = parser.parse_args(argv[1:])
    summary = summarize(load(args.runs), args.command, args.shape, args.throughput_shape, args.elapsed_s)
    with open(args.json, "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    with open(args.markdown, "w") as f:
        f.write(markdown(summary))
    if args.chart:
        chart(summary, args.chart)


if __name__ == "__main__":
    main(sys.argv)
