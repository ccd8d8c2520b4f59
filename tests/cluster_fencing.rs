//! A fenced resource behind a three-node cluster under kill -9, Ctrl+C,
//! SIGSTOP/SIGCONT, a partition, cut client connections and a client that
//! stops reading (docs/protocol.md §2, §5): the resource never accepts a write out of
//! token order, and the history of every client is checked for overlapping
//! holders, token order, FIFO order and answers outside the failover
//! windows the faults open.
//!
//! Nothing here asserts a timing: every wait is for an event (grants
//! received, roles settled), with a deadline that fails the test.

mod chaos;
mod cluster_support;
mod common;
mod history;

use std::time::Duration;

use chaos::{Chaos, ChaosOptions, Fault, print_summary};

/// Grants the load must receive between two faults: proof that the cluster
/// serves again before the next fault.
const GRANTS_BETWEEN_FAULTS: usize = 100;

/// Longer than the failover timeout, so that a standby promotes.
const FAULT_LENGTH: Duration = Duration::from_millis(1500);

#[test]
fn fencing_tokens_keep_a_resource_in_order_through_every_kind_of_fault() {
    let mut chaos = Chaos::start(ChaosOptions { key_prefix: "fence".to_string(), ..ChaosOptions::default() });
    chaos.wait_grants(GRANTS_BETWEEN_FAULTS, "the load to start");

    let faults: [fn(usize) -> Fault; 7] = [
        |node| Fault::Kill9 { node },
        |node| Fault::Pause { node, pause: FAULT_LENGTH },
        |node| Fault::Partition { node, cut: FAULT_LENGTH },
        |node| Fault::SilentPartition { node, cut: FAULT_LENGTH },
        |node| Fault::CtrlC { node },
        |node| Fault::CutClients { node },
        |_| Fault::StalledReader { stall: FAULT_LENGTH },
    ];
    for fault in faults {
        let active = chaos.active();
        let fault = fault(active);
        chaos.inject(fault);
        chaos.wait_grants(GRANTS_BETWEEN_FAULTS, &format!("grants after {fault:?}"));
        for node in chaos.down_nodes() {
            chaos.restart(node);
            chaos.wait_grants(GRANTS_BETWEEN_FAULTS, &format!("grants after node {node} restarted"));
        }
    }

    let summary = chaos.finish();
    print_summary("fenced resource under faults:", &summary);
    let counts = &summary.report.counts;
    eprintln!(
        "fencing refused a stale holder {} times in {} writes",
        counts.writes_refused,
        counts.writes_refused + counts.writes_accepted
    );
    assert!(!summary.failed(), "{}", summary.problems());
    assert!(counts.writes_accepted >= GRANTS_BETWEEN_FAULTS, "the workers wrote to the resource");
    assert!(counts.fifo_pairs > 0, "the FIFO probe queued waiters the checker could compare");
    assert!(summary.events.failovers >= 4, "the faults moved the active role: {:?}", summary.events);
}
