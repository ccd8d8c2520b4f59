#!/usr/bin/env python3
"""Splits a `perf record` profile of the ringlock server into the shares of
its CPU time that docs/performance.md ("Multi-core projection") names.

Usage: perf_split.py perf.data

Record it while ringlock-bench drives the server, for example:
  perf record -e cpu-clock -F 2000 -g -p "$(pidof ringlock)" -o perf.data -- sleep 3

Each sample is counted once, by the function it was taken in (perf report
--no-children). The groups are named by function, so they are approximate:
a function in no group counts as `other` (TCP, io_uring, parsing, the lock
table, replies).
"""

import re
import subprocess
import sys

GROUPS = {
    # The shard loop with nothing to do: it polls the ring (an
    # io_uring_enter that returns nothing, the clock read between polls)
    # for 30 us, then sleeps in io_uring_enter and is switched back in.
    "idle poll and sleep": {
        "do_syscall_64", "syscall", "__vdso_clock_gettime", "clock_gettime@@GLIBC_2.17", "fget", "fput",
        "x64_sys_call", "finish_task_switch.isra.0", "<std::sys::pal::unix::time::Timespec>::now", "read_tsc",
        "crossbeam_channel::channel::Receiver<T>::is_empty", "__do_sys_io_uring_enter", "entry_SYSCALL_64",
        "syscall_return_via_sysret", "irqentry_exit_to_user_mode", "ringlock::ring_poll::poll_before_sleep",
        "__schedule", "io_cqring_wait",
    },
    # Moving a request to the core that owns its key and its reply back:
    # routing, the batches (allocated per turn), the eventfd wake-up.
    "cross-core messages": {
        "ringlock::core::dispatch::<impl ringlock::core::state::CoreState>::route",
        "ringlock::core::dispatch::<impl ringlock::core::state::CoreState>::deliver",
        "ringlock::core::dispatch::Keyed::to_routed",
        "ringlock::core::mailbox::Mailbox::send", "realloc", "malloc", "_int_free", "free", "_int_malloc",
        "cfree@GLIBC_2.2.5", "eventfd_write", "_raw_spin_unlock_irq", "try_to_wake_up", "llist_reverse_order",
        "ringlock::core::effects::<impl ringlock::core::event_loop::EventLoop>::handle_shard_effects",
    },
}


def split(perf_data):
    report = subprocess.run(
        ["perf", "report", "-i", perf_data, "--no-children", "--sort", "sym", "--stdio", "-g", "none"],
        capture_output=True, text=True, check=True).stdout
    shares = {name: 0.0 for name in GROUPS}
    shares["other"] = 0.0
    for line in report.splitlines():
        match = re.match(r"\s+([\d.]+)%\s+\[[.k]\]\s+(.*\S)\s*$", line)
        if not match:
            continue
        share, symbol = float(match.group(1)), match.group(2)
        group = next((name for name, symbols in GROUPS.items() if symbol in symbols), None)
        if group is None and symbol.startswith("crossbeam_channel") and not symbol.endswith("is_empty"):
            group = "cross-core messages"
        shares[group or "other"] += share
    return shares


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    for name, share in split(sys.argv[1]).items():
        print(f"{name}: {share:.1f} %")
