#!/usr/bin/env python3
"""Renders the chart of scripts/bench.sh from its JSON summary.

Usage: chart.py bench/results/latest.json bench/results/latest.png

Three panels: uncontended lock ops/s of the echo ceiling, ringlock and Redis
with the ratios; contended grants/s with the p99 wait; memory per held lock.
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"echo": "#9e9e9e", "ringlock": "#1f77b4", "redis": "#d62728"}


def throughput_panel(ax, comparisons, unit, unit_name, title):
    labels = [c["label"] for c in comparisons]
    width = 0.26
    for offset, target in enumerate(["echo", "ringlock", "redis"]):
        values = [(c.get(f"{target}_ops_per_s") or 0) / unit for c in comparisons]
        xs = [i + (offset - 1) * width for i in range(len(labels))]
        bars = ax.bar(xs, values, width, label=target if target != "echo" else "echo ceiling", color=COLORS[target])
        for bar, value in zip(bars, values):
            ax.annotate(f"{value:.3g}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8)
    top = max([(c.get(f"{t}_ops_per_s") or 0) / unit for c in comparisons for t in ("echo", "ringlock", "redis")] + [1])
    for i, c in enumerate(comparisons):
        parts = []
        if c.get("ringlock_vs_echo") is not None:
            parts.append(f"{c['ringlock_vs_echo']:.2f}x echo")
        if c.get("ringlock_vs_redis") is not None:
            parts.append(f"{c['ringlock_vs_redis']:.1f}x redis")
        ax.annotate("ringlock\n" + "\n".join(parts), (i, top * 1.06), ha="center", va="bottom", fontsize=9,
                    color=COLORS["ringlock"])
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels)
    ax.set_ylabel(f"lock ops/s ({unit_name}), acquires + releases")
    ax.set_title(title)
    ax.set_ylim(0, top * 1.45)
    ax.legend(loc="upper left", fontsize=8)


def main(summary_path, png_path):
    with open(summary_path) as f:
        summary = json.load(f)
    runs = summary["runs"]
    comparisons = summary["comparisons"]

    fig, axes = plt.subplots(1, 4, figsize=(18, 5.2), gridspec_kw={"width_ratios": [2.2, 1.2, 1.4, 1.1]})
    pipelined = [c for c in comparisons if c["label"].startswith("pipelined")]
    unpipelined = [c for c in comparisons if not c["label"].startswith("pipelined")]
    throughput_panel(axes[0], pipelined, 1e6, "millions", "Uncontended, pipelined, one server core")
    throughput_panel(axes[1], unpipelined, 1e3, "thousands", "Uncontended, no pipelining")

    ax = axes[2]
    contended = [r for r in runs if r["workload"] == "contended"]
    names = [r["target"] for r in contended]
    grants = [r["acquires_per_s"] / 1e3 for r in contended]
    bars = ax.bar(names, grants, color=[COLORS.get(n, "#555") for n in names])
    for bar, r in zip(bars, contended):
        ax.annotate(f"{bar.get_height():.0f} k/s\np99 wait {r['acquire_latency_us']['p99'] / 1000:.1f} ms",
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    if contended:
        r = contended[0]
        ax.set_title(f"Contended: {r['hot_keys']} hot keys, {r['connections'] * r['depth']} clients")
        ax.set_ylim(0, max(grants + [1]) * 1.3)
    ax.set_ylabel("grants (hand-offs) per second, thousands")

    ax = axes[3]
    held = [r for r in runs if r.get("hold") and r["hold"].get("bytes_per_lock") is not None]
    names = [r["target"] for r in held]
    per_lock = [r["hold"]["bytes_per_lock"] for r in held]
    bars = ax.bar(names, per_lock, color=[COLORS.get(n, "#555") for n in names])
    for bar in bars:
        ax.annotate(f"{bar.get_height():.0f} B", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=9)
    goal = summary.get("hold_bytes_per_lock_goal")
    if goal:
        ax.axhline(goal, color="black", linestyle="--", linewidth=1)
        ax.annotate(f"goal {goal:.0f} B", (-0.4, goal), va="bottom", fontsize=8)
    if held:
        keys = held[0]["hold"]["keys_held"]
        keys_text = f"{keys / 1e6:g} M" if keys >= 1e6 else f"{keys / 1e3:g} k"
        ax.set_title(f"Memory per held lock ({keys_text} keys)")
        ax.set_ylim(0, max(per_lock + [goal or 0]) * 1.25)
    ax.set_ylabel("server RSS growth / held locks, bytes")

    host = summary.get("host", {})
    fig.suptitle(f"ringlock-bench, {host.get('cpus', '?')} CPUs ({host.get('cpu_model', 'unknown CPU')}), "
                 f"Linux {host.get('kernel', '?')}: server on CPU 1, load generator on CPU 0", fontsize=10)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
