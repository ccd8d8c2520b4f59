//! The Rust client through a failover of a cluster of real nodes on
//! loopback: the scenario failover-keeps-auto-extended-lock of
//! `clients/scenarios.json`. Its file name puts it among the cluster tests,
//! which nextest runs one at a time (`.config/nextest.toml`), so that no
//! other cluster starves its nodes into a failover nobody caused.

mod cluster_support;
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cluster_support::{Cluster, ClusterOptions, table_version};
use ringlock_client::{Client, ReleaseOutcome};

const LEASE: Duration = Duration::from_secs(600);

/// Waits until the table version of the active `active` has grown past
/// `since` (its version before the grant to wait for: the version counts
/// a grant once the replication core took it, not when it was granted),
/// then until every running standby has applied the active's table up to
/// that version: the grant has reached them.
fn wait_replicated(cluster: &Cluster, active: usize, since: u64) {
    let mut conn = cluster.node(active).connect();
    let mut target = None;
    cluster.wait_for(&format!("node {active}'s table version to grow past {since}"), |_| {
        target = table_version(&mut conn).filter(|(_, version)| *version > since);
        target.is_some()
    });
    let (stream, version) = target.unwrap();
    for node in cluster.nodes.iter().filter(|node| node.index != active && node.is_running()) {
        let mut conn = node.connect();
        cluster.wait_for(&format!("node {} to apply stream {stream} up to version {version}", node.index), |_| {
            table_version(&mut conn)
                .is_some_and(|(applied_stream, applied)| applied_stream == stream && applied >= version)
        });
    }
}

/// Scenario failover-keeps-auto-extended-lock: a kill -9 of the active
/// does not lose an auto-extended lock whose lease is many failover
/// timeouts long; its extends go on at the new active, which takes its
/// old token.
#[test]
fn failover_keeps_auto_extended_lock() {
    let lease = Duration::from_secs(3);
    let mut cluster = Cluster::start(ClusterOptions::default());
    let (active, _) = cluster.wait_single_active("an active node");
    let holder = Client::connect(cluster.addresses()).unwrap();
    let rival = Client::connect(cluster.addresses()).unwrap();
    let since = table_version(&mut cluster.node(active).connect()).expect("the active's S shows its table").1;
    let lock = holder.acquire("failover/kept", lease, None).unwrap().expect("no wait limit");
    let reported_lost = Arc::new(AtomicBool::new(false));
    let flag = reported_lost.clone();
    lock.on_lost(move || flag.store(true, Ordering::SeqCst));
    lock.auto_extend();
    wait_replicated(&cluster, active, since);

    cluster.node_mut(active).kill9();
    let (new_active, _) = cluster.wait_single_active("a standby to take over");
    assert_ne!(new_active, active);
    // Longer than the lease: granted unless the extends reach the new active.
    let taken = rival.acquire("failover/kept", LEASE, Some(lease * 3 / 2)).unwrap();
    assert!(taken.is_none(), "the key stayed held through the failover\n{}", cluster.describe(&cluster.pings()));
    assert!(!lock.is_lost() && !reported_lost.load(Ordering::SeqCst), "not reported lost");
    assert!(lock.is_locked());
    assert!(lock.held().unwrap(), "held on the new active");
    lock.extend(lease).unwrap();
    let token = lock.token();
    assert_eq!(lock.release(), Ok(ReleaseOutcome::Released), "the old token releases it");
    let next = rival.try_acquire("failover/kept", LEASE).unwrap().expect("free once released");
    assert!(next.token() > token, "the new active's epoch: {} after {token}", next.token());
}
