//! The soak run of `scripts/soak.sh`: a three-node cluster under client load
//! and a random fault every few seconds, for as long as asked, ending with a
//! summary table. Ignored by the test suite; the script runs it with
//! `--ignored`.
//!
//! Settings (environment):
//! - `SOAK_SECONDS`: how long to inject faults (default 60);
//! - `SOAK_CLIENTS`: worker threads, each with its own client (default 8);
//! - `SOAK_SEED`: the seed of the fault schedule (default: from the clock;
//!   printed, so that a schedule can be replayed);
//! - `SOAK_SUMMARY`: a file to write the summary table to, in Markdown;
//! - `SOAK_FAULTS`: only these kinds of fault, comma-separated, among
//!   `kill`, `ctrl-c`, `pause`, `partition`, `cut`, `stall`,
//!   `silent-partition` (default: all).

mod chaos;
mod cluster_support;
mod common;
mod history;

use std::time::{Duration, Instant, SystemTime};

use chaos::{Chaos, ChaosOptions, Fault, Rng, print_summary};

fn setting(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(value) => value.parse().unwrap_or_else(|_| panic!("{name}={value:?} is not a number")),
        Err(_) => default,
    }
}

/// The names `SOAK_FAULTS` takes, in the order [`random_fault`] draws them.
const FAULT_NAMES: [&str; 7] = ["kill", "ctrl-c", "pause", "partition", "cut", "stall", "silent-partition"];

/// A random fault of a random allowed kind on a random node (most often the
/// active: the faults that matter).
fn random_fault(rng: &mut Rng, allowed: &[usize], active: usize, nodes: usize) -> Fault {
    let node = if rng.below(3) == 0 { rng.below(nodes as u64) as usize } else { active };
    let length = Duration::from_millis(700 + rng.below(1800));
    match allowed[rng.below(allowed.len() as u64) as usize] {
        0 => Fault::Kill9 { node },
        1 => Fault::CtrlC { node },
        2 => Fault::Pause { node, pause: length },
        3 => Fault::Partition { node, cut: length },
        4 => Fault::CutClients { node },
        5 => Fault::StalledReader { stall: length },
        _ => Fault::SilentPartition { node, cut: length },
    }
}

fn allowed_faults() -> Vec<usize> {
    let Ok(names) = std::env::var("SOAK_FAULTS") else { return (0..FAULT_NAMES.len()).collect() };
    names
        .split(',')
        .map(|name| {
            FAULT_NAMES
                .iter()
                .position(|known| *known == name.trim())
                .unwrap_or_else(|| panic!("SOAK_FAULTS: unknown fault {name:?}; known: {FAULT_NAMES:?}"))
        })
        .collect()
}

#[test]
#[ignore = "a long run; scripts/soak.sh runs it"]
fn soak() {
    let seconds = setting("SOAK_SECONDS", 60);
    let workers = setting("SOAK_CLIENTS", 8) as usize;
    let clock = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap();
    let seed = setting("SOAK_SEED", clock.as_nanos() as u64);
    eprintln!("soak: {seconds} s, {workers} clients, seed {seed} (SOAK_SEED={seed} replays the fault schedule)");

    let allowed = allowed_faults();
    let mut rng = Rng::new(seed);
    let options = ChaosOptions { workers, key_prefix: format!("soak{seed}"), ..ChaosOptions::default() };
    let nodes = options.nodes;
    let mut chaos = Chaos::start(options);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < deadline && chaos.events.crashes.is_empty() {
        chaos.run_for(Duration::from_millis(1000 + rng.below(3000)));
        // A node that is down comes back after a while, one at a time.
        if let Some(&node) = chaos.down_nodes().first()
            && rng.below(2) == 0
        {
            chaos.restart(node);
            continue;
        }
        let fault = random_fault(&mut rng, &allowed, chaos.active(), nodes);
        eprintln!("soak: {:>6.1} s  {fault:?}", chaos.history.now().as_secs_f64());
        chaos.inject(fault);
    }
    for node in chaos.down_nodes() {
        chaos.restart(node);
    }
    chaos.run_for(Duration::from_secs(2));

    let summary = chaos.finish();
    print_summary(&format!("soak summary (seed {seed}):"), &summary);
    if let Ok(path) = std::env::var("SOAK_SUMMARY") {
        std::fs::write(&path, summary.table()).unwrap_or_else(|error| panic!("write {path}: {error}"));
    }
    assert!(!summary.failed(), "the soak found problems:\n{}", summary.problems());
}
