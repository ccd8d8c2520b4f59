//! Seeded simulation runs of the cluster logic (see [`Sim`] for the world
//! they run in). Every run checks, as it goes:
//! - **epochs**: each activation is one of the node's ballots, above every
//!   epoch that node activated before (over all its lives), persisted before
//!   use, above every epoch the node could know (its data directory and every
//!   epoch it received), and no epoch is used by two nodes; a node that exits
//!   gracefully has persisted the highest epoch it knows;
//! - **tokens**: unique; each grant above the active's table for the key and
//!   never in an epoch below one the active knows; each replica apply above
//!   the standby's table; per key, grants by a sole serving active strictly
//!   increase across failovers and hand-offs, except where the granter never
//!   learned the earlier epoch because every node that knew it is gone
//!   (counted as `knowledge_gaps`: no quorum, nothing can prevent them);
//! - **state**: no node becomes active with an empty table while a peer
//!   whose heartbeat, sent while it held a table, arrived within the
//!   failover timeout still holds it (same life, not leaving); heartbeats say
//!   "caught up" exactly when the node holds a table (an active's may say
//!   not, in the quarter of runs with `--min-standbys`, while it is blocked);
//! - **after the heal** (a hand-off timeout plus three failover periods
//!   later, and from then on): exactly one active, an active holding its
//!   clients for a hand-off aside; at the end, the highest-priority running
//!   node serves and every other one follows it with a snapshot of its stream.
//!
//! Windows with two serving actives and the grants made in them are counted
//! and reported, not checked: there only fencing protects.
//!
//! A failing run prints its seed and a trace of its last events; replay it
//! alone with `RINGLOCK_SIM_SEED=<seed>` (add `RINGLOCK_SIM_TRACE=1` to print
//! every event of it as it happens). `RINGLOCK_SIM_RUNS` changes the runs per
//! test and `RINGLOCK_SIM_SEED_BASE` moves to other seeds.

use super::sim::{Sim, SimConfig, SimReport};

/// Runs per test; four tests make one CI run.
const RUNS_PER_PART: u64 = 1500;

fn env_u64(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    Some(text.trim().parse().unwrap_or_else(|_| panic!("{name}={text:?} is not a number")))
}

fn run_one(seed: u64) -> SimReport {
    match Sim::new(SimConfig::from_seed(seed), false).run() {
        Ok(report) => report,
        Err(_) => {
            // The same seed again, with a trace: the run does not depend on tracing.
            let traced = Sim::new(SimConfig::from_seed(seed), true).run().expect_err("a replay fails the same way");
            panic!(
                "cluster simulation failed: seed {seed}, {:?}\n{traced}\nreplay: RINGLOCK_SIM_SEED={seed} cargo test -p ringlock --profile test-release cluster::sim_tests",
                SimConfig::from_seed(seed)
            );
        }
    }
}

fn add(total: &mut SimReport, report: &SimReport) {
    total.events += report.events;
    total.grants_sole += report.grants_sole;
    total.grants_dual += report.grants_dual;
    total.dual_windows += report.dual_windows;
    total.dual_ms += report.dual_ms;
    total.knowledge_gaps += report.knowledge_gaps;
    total.activations += report.activations;
    total.handoffs_done += report.handoffs_done;
    total.handoffs_failed += report.handoffs_failed;
    total.faults += report.faults;
}

fn run_part(part: u64) {
    if let Some(seed) = env_u64("RINGLOCK_SIM_SEED") {
        if part == 0 {
            let config = SimConfig::from_seed(seed);
            let mut sim = Sim::new(config.clone(), true);
            if std::env::var_os("RINGLOCK_SIM_TRACE").is_some() {
                sim = sim.print_trace();
            }
            match sim.run() {
                Ok(report) => eprintln!("seed {seed} passes: {config:?}\n{report:?}"),
                Err(error) => panic!("cluster simulation failed: seed {seed}, {config:?}\n{error}"),
            }
        }
        return;
    }
    let runs = env_u64("RINGLOCK_SIM_RUNS").unwrap_or(RUNS_PER_PART);
    let first = env_u64("RINGLOCK_SIM_SEED_BASE").unwrap_or(0) + part * runs;
    let mut total = SimReport::default();
    for seed in first..first + runs {
        add(&mut total, &run_one(seed));
    }
    eprintln!("seeds {first}..{}: {total:?}", first + runs);
    // The runs must reach the cases they are meant to check.
    assert!(total.grants_sole > runs * 10, "{total:?}");
    assert!(total.activations > runs, "{total:?}");
    if runs >= 100 {
        assert!(total.handoffs_done > 0 && total.dual_windows > 0 && total.grants_dual > 0, "{total:?}");
    }
}

#[test]
fn seeded_runs_part_0() {
    run_part(0);
}

#[test]
fn seeded_runs_part_1() {
    run_part(1);
}

#[test]
fn seeded_runs_part_2() {
    run_part(2);
}

#[test]
fn seeded_runs_part_3() {
    run_part(3);
}
