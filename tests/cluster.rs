//! Clusters of real nodes on loopback (docs/protocol.md §5), driven from outside:
//! the roles through `P`, locks through raw protocol lines and the official
//! client, failures through signals (kill -9, Ctrl+C, SIGSTOP) and a proxy on
//! every peer link that the test cuts.
//!
//! Every wait polls for an event with a deadline; nothing asserts a timing.

mod cluster_support;
mod common;

use std::collections::HashMap;
use std::time::Duration;

use cluster_support::{Cluster, ClusterOptions, Load, LoadOptions, Role, grant_token, stats_role, table_version};
use common::{Conn, SecretFile};
use ringlock_client::{Client, ReleaseOutcome};

/// Locks the tests hold across a failure, then release with their tokens.
const HELD_KEYS: usize = 16;

/// Acquires `count` keys `<prefix>/<i>` with a long lease on `conn`.
fn hold_keys(cluster: &Cluster, conn: &mut Conn, prefix: &str, count: usize) -> Vec<(String, u64)> {
    (0..count)
        .map(|index| {
            let key = format!("{prefix}/{index}");
            let reply = cluster.call(conn, &format!("A {key} 120 0"));
            let token = grant_token(&reply, &key).unwrap_or_else(|| panic!("expected a grant of {key}, got {reply:?}"));
            (key, token)
        })
        .collect()
}

/// Checks on the active `conn` that every lock of `held` is still held (a new
/// acquire times out), that its old token releases it, and that the next
/// grant of the key has a greater token.
fn assert_still_held_and_releasable(conn: &mut Conn, held: &[(String, u64)], cluster: &Cluster) {
    for (key, token) in held {
        let reply = cluster.call(conn, &format!("A {key} 30 0.1"));
        assert_eq!(
            reply,
            format!("T {key}"),
            "{key} (token {token}) is still held on the new active\n{}",
            cluster.describe(&cluster.pings())
        );
        let reply = cluster.call(conn, &format!("R {key} {token}"));
        assert_eq!(reply, format!("R {key}"), "the old token {token} releases {key} on the new active");
        let reply = cluster.call(conn, &format!("A {key} 30 0"));
        let next = grant_token(&reply, key).unwrap_or_else(|| panic!("expected a grant of {key}, got {reply:?}"));
        assert!(next > *token, "{key}: token {next} after {token}");
        assert_eq!(cluster.call(conn, &format!("R {key} {next}")), format!("R {key}"));
    }
}

/// Waits until the active's table version has grown by `deltas` from `since`
/// (its version before the grants and releases to wait for), then until every
/// running standby has applied the active's stream up to that version: those
/// grants and releases have reached every standby.
fn wait_replicated(cluster: &Cluster, active: usize, since: u64, deltas: u64) {
    let mut conn = cluster.node(active).connect();
    let mut target = None;
    cluster.wait_for(&format!("node {active} to count the {deltas} deltas in its table version"), |_| {
        target = table_version(&mut conn).filter(|(_, version)| *version >= since + deltas);
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

/// The table version of node `index` (see [`wait_replicated`]).
fn table_version_of(cluster: &Cluster, index: usize) -> u64 {
    let mut conn = cluster.node(index).connect();
    table_version(&mut conn).unwrap_or_else(|| panic!("node {index}'s S reply shows its table version")).1
}

/// Acquires once more every key the load used, on the active `conn`, and
/// checks that the new token exceeds every token the load was granted.
/// `wait_seconds` covers the lease of a grant that the client never saw
/// (its reply was lost in the failure) and that therefore still holds the key.
fn assert_next_tokens_exceed(cluster: &Cluster, conn: &mut Conn, highest: &HashMap<String, u64>, wait_seconds: u64) {
    for (key, highest) in highest {
        let reply = cluster.call(conn, &format!("A {key} 30 {wait_seconds}"));
        let token = grant_token(&reply, key).unwrap_or_else(|| panic!("expected a grant of {key}, got {reply:?}"));
        assert!(token > *highest, "{key}: token {token} on the new active, but {highest} was granted before");
        assert_eq!(cluster.call(conn, &format!("R {key} {token}")), format!("R {key}"));
    }
}

#[test]
fn the_first_node_becomes_active_and_the_standbys_send_clients_to_it() {
    let cluster = Cluster::start(ClusterOptions::default());
    let epoch = cluster.wait_active(0, "node 0 (highest priority) to become the active");
    assert!(epoch > 0, "an active node has started an epoch");
    let active = cluster.node(0).client.to_string();
    let mut conn = cluster.node(0).connect();
    assert_eq!(stats_role(&mut conn).as_deref(), Some("active"));

    for standby in [1, 2] {
        let mut conn = cluster.node(standby).connect();
        assert_eq!(cluster.call(&mut conn, "A k 30 0"), format!("M A k {active}"));
        assert_eq!(cluster.call(&mut conn, "R k 5"), format!("M R k {active}"));
        assert_eq!(cluster.call(&mut conn, "X k 5 30"), format!("M X k {active}"));
        // A standby checks a request fully before it redirects it.
        assert_eq!(cluster.call(&mut conn, "A k 0 0"), "E A k bad-lease");
        assert_eq!(stats_role(&mut conn).as_deref(), Some("standby"));
    }

    // The official client, given the standbys first, follows their M replies.
    let addresses: Vec<String> = cluster.addresses().into_iter().rev().collect();
    let client = Client::connect(addresses).unwrap();
    let mut last = 0;
    for _ in 0..20 {
        let lock = client.acquire("client/k", Duration::from_secs(30), None).unwrap().expect("no wait limit");
        assert!(lock.token() > last);
        last = lock.token();
        assert_eq!(lock.release(), Ok(ReleaseOutcome::Released));
    }
    assert_eq!(client.active_node(), Some(active));
}

#[test]
fn kill_9_of_the_active_under_load_promotes_the_next_node_which_keeps_the_held_locks() {
    let mut cluster = Cluster::start(ClusterOptions::default());
    let first_epoch = cluster.wait_active(0, "node 0 to become the active");
    let mut conn = cluster.node(0).connect();
    let since = table_version_of(&cluster, 0);
    let held = hold_keys(&cluster, &mut conn, "held", HELD_KEYS);
    wait_replicated(&cluster, 0, since, HELD_KEYS as u64);

    let lease_seconds = 3;
    let load = Load::start(
        &cluster.addresses(),
        LoadOptions { lease: Duration::from_secs(lease_seconds), ..LoadOptions::default() },
    );
    load.wait_more_grants(300, "the load to run on node 0", &cluster);
    cluster.node_mut(0).kill9();

    let second_epoch = cluster.wait_active(1, "node 1 to promote after kill -9 of node 0");
    assert!(second_epoch > first_epoch, "epoch {second_epoch} after {first_epoch}");
    load.wait_more_grants(300, "the load to run on node 1", &cluster);
    let report = load.stop();
    let lost = report.not_held().len();
    eprintln!(
        "kill -9 under load: {} grants, {lost} lost (release found nothing), {} timeouts, errors {:?}",
        report.grant_count(),
        report.timeouts,
        report.errors
    );
    assert!(
        report.token_order_violations().is_empty(),
        "tokens per key increase across the failover: {:?}",
        report.token_order_violations()
    );

    let mut conn = cluster.node(1).connect();
    assert_still_held_and_releasable(&mut conn, &held, &cluster);
    assert_next_tokens_exceed(&cluster, &mut conn, &report.highest_tokens(), 2 * lease_seconds);
}

#[test]
fn ctrl_c_of_the_active_under_load_hands_off_to_its_successor_without_losing_a_lock() {
    let mut cluster = Cluster::start(ClusterOptions::default());
    let first_epoch = cluster.wait_active(0, "node 0 to become the active");
    let mut conn = cluster.node(0).connect();
    // No wait for replication here: the hand-off itself must carry every lock.
    let held = hold_keys(&cluster, &mut conn, "held", HELD_KEYS);
    drop(conn);

    let load =
        Load::start(&cluster.addresses(), LoadOptions { lease: Duration::from_secs(60), ..LoadOptions::default() });
    load.wait_more_grants(300, "the load to run on node 0", &cluster);
    let status = cluster.node_mut(0).stop(libc::SIGINT);
    assert!(status.success(), "node 0 exits 0 after its hand-off, not {status}\n{}", cluster.node(0).log());

    let second_epoch = cluster.wait_active(1, "node 1 to be active after the hand-off");
    assert!(second_epoch > first_epoch, "epoch {second_epoch} after {first_epoch}");
    load.wait_more_grants(300, "the load to run on node 1", &cluster);
    let report = load.stop();
    eprintln!(
        "Ctrl+C under load: {} grants, {} timeouts, errors {:?}",
        report.grant_count(),
        report.timeouts,
        report.errors
    );
    let lost: Vec<_> = report.not_held().iter().map(|grant| format!("{} {}", grant.key, grant.token)).collect();
    assert!(lost.is_empty(), "grants lost in the hand-off (their release found nothing): {lost:?}");
    assert!(report.errors.is_empty(), "client errors during the hand-off: {:?}", report.errors);
    assert!(
        report.token_order_violations().is_empty(),
        "tokens per key increase across the hand-off: {:?}",
        report.token_order_violations()
    );

    let mut conn = cluster.node(1).connect();
    assert_still_held_and_releasable(&mut conn, &held, &cluster);
    assert_next_tokens_exceed(&cluster, &mut conn, &report.highest_tokens(), 10);
}

#[test]
fn a_restarted_higher_priority_node_catches_up_then_takes_over_by_hand_off() {
    let mut cluster = Cluster::start(ClusterOptions::default());
    let first_epoch = cluster.wait_active(0, "node 0 to become the active");
    cluster.node_mut(0).kill9();
    let second_epoch = cluster.wait_active(1, "node 1 to promote after kill -9 of node 0");
    assert!(second_epoch > first_epoch);

    // Locks granted while node 0 is down: it can only learn them from node 1.
    let mut conn = cluster.node(1).connect();
    let held = hold_keys(&cluster, &mut conn, "held", HELD_KEYS);
    drop(conn);
    let load =
        Load::start(&cluster.addresses(), LoadOptions { lease: Duration::from_secs(60), ..LoadOptions::default() });
    load.wait_more_grants(300, "the load to run on node 1", &cluster);

    let first_answer = cluster.node_mut(0).restart();
    assert_eq!(first_answer.role, Role::Standby, "a restarted node joins as a standby: {first_answer:?}");
    let third_epoch = cluster.wait_active(0, "node 0 to catch up and take the active role back");
    assert!(third_epoch > second_epoch, "epoch {third_epoch} after {second_epoch}");
    load.wait_more_grants(300, "the load to run on node 0 again", &cluster);
    let report = load.stop();
    eprintln!(
        "restart and take-over under load: {} grants, {} timeouts, errors {:?}",
        report.grant_count(),
        report.timeouts,
        report.errors
    );
    let lost: Vec<_> = report.not_held().iter().map(|grant| format!("{} {}", grant.key, grant.token)).collect();
    assert!(lost.is_empty(), "grants lost when node 0 took over (their release found nothing): {lost:?}");
    assert!(
        report.token_order_violations().is_empty(),
        "tokens per key increase across the take-over: {:?}",
        report.token_order_violations()
    );

    let mut conn = cluster.node(0).connect();
    assert_still_held_and_releasable(&mut conn, &held, &cluster);
    assert_next_tokens_exceed(&cluster, &mut conn, &report.highest_tokens(), 10);
}

#[test]
fn sigstop_of_the_active_beyond_the_failover_timeout_then_sigcont_leaves_one_active() {
    let mut cluster = Cluster::start(ClusterOptions::default());
    let first_epoch = cluster.wait_active(0, "node 0 to become the active");
    let mut conn = cluster.node(0).connect();
    let since = table_version_of(&cluster, 0);
    let before = hold_keys(&cluster, &mut conn, "paused", 4);
    for (key, token) in &before {
        assert_eq!(cluster.call(&mut conn, &format!("R {key} {token}")), format!("R {key}"));
    }
    // The releases must reach the standbys before the pause, or node 1 would
    // promote with these keys still held (the last deltas before a failure
    // are lost, docs/protocol.md §5).
    wait_replicated(&cluster, 0, since, 8);
    drop(conn);

    cluster.node_mut(0).pause();
    let second_epoch = cluster.wait_active(1, "node 1 to promote while node 0 is stopped");
    assert!(second_epoch > first_epoch);
    let mut conn = cluster.node(1).connect();
    let during = hold_keys(&cluster, &mut conn, "paused", 4);
    for ((key, token), (_, earlier)) in during.iter().zip(&before) {
        assert!(token > earlier, "{key}: token {token} on node 1 after {earlier} on node 0");
        assert_eq!(cluster.call(&mut conn, &format!("R {key} {token}")), format!("R {key}"));
    }
    drop(conn);

    cluster.node_mut(0).resume();
    // Node 0 keeps its old epoch for a moment when it stays active: it moves
    // above node 1's epoch (holding clients meanwhile) once it has seen it.
    let pings = cluster.wait_for("one active, in node 1's epoch or above, once node 0 runs again", |pings| {
        cluster.single_active(pings).is_some_and(|(_, epoch)| epoch >= second_epoch)
    });
    let (active, final_epoch) = cluster.single_active(&pings).unwrap();
    eprintln!("after SIGCONT: node {active} is the single active in epoch {final_epoch}");
    let mut conn = cluster.node(active).connect();
    let after = hold_keys(&cluster, &mut conn, "paused", 4);
    for ((key, token), (_, earlier)) in after.iter().zip(&during) {
        assert!(token > earlier, "{key}: token {token} on node {active} after {earlier} on node 1");
    }
}

#[test]
fn a_partition_between_peers_makes_two_actives_and_healing_it_demotes_one() {
    let cluster = Cluster::start(ClusterOptions { partitionable: true, ..ClusterOptions::default() });
    let first_epoch = cluster.wait_active(0, "node 0 to become the active");
    let mut conn0 = cluster.node(0).connect();
    let since = table_version_of(&cluster, 0);
    let before = hold_keys(&cluster, &mut conn0, "split", 4);
    for (key, token) in &before {
        assert_eq!(cluster.call(&mut conn0, &format!("R {key} {token}")), format!("R {key}"));
    }
    // Otherwise node 1 could promote still holding these grants, and keep
    // them until their leases end: the last deltas before a cut are lost.
    wait_replicated(&cluster, 0, since, 8);

    cluster.isolate(0);
    let pings = cluster.wait_for("node 1 to promote while node 0, cut off, stays active", |pings| {
        let active = |index: usize| pings[index].as_ref().is_some_and(|ping| ping.is_active());
        active(0) && active(1)
    });
    let (epoch0, epoch1) = (pings[0].as_ref().unwrap().epoch, pings[1].as_ref().unwrap().epoch);
    assert_eq!(epoch0, first_epoch, "node 0 did not change epoch while cut off");
    assert!(epoch1 > epoch0, "node 1's epoch {epoch1} is above node 0's {epoch0}");

    // Both sides grant: the window docs/protocol.md §5 warns of, that tokens make safe.
    let mut conn1 = cluster.node(1).connect();
    let on_node1 = hold_keys(&cluster, &mut conn1, "split", 4);
    for ((key, token), (_, earlier)) in on_node1.iter().zip(&before) {
        assert!(token > earlier, "{key}: token {token} on node 1 after {earlier} on node 0");
        assert_eq!(cluster.call(&mut conn1, &format!("R {key} {token}")), format!("R {key}"));
    }
    let on_node0 = hold_keys(&cluster, &mut conn0, "split", 4);
    for (key, token) in &on_node0 {
        assert_eq!(cluster.call(&mut conn0, &format!("R {key} {token}")), format!("R {key}"));
    }

    cluster.heal();
    // The standbys may follow the remaining active for a moment before it has
    // persisted its move above both epochs (it holds clients meanwhile).
    let pings = cluster.wait_for("one active, in an epoch above both sides', once the partition is healed", |pings| {
        cluster.single_active(pings).is_some_and(|(_, epoch)| epoch > epoch1)
    });
    let (active, final_epoch) = cluster.single_active(&pings).unwrap();
    eprintln!("after the heal: node {active} is the single active in epoch {final_epoch}");
    assert_eq!(active, 0, "the lower-priority active steps down (docs/protocol.md §5)");
    let mut conn = cluster.node(active).connect();
    let after = hold_keys(&cluster, &mut conn, "split", 4);
    for (index, (key, token)) in after.iter().enumerate() {
        let earlier = before[index].1.max(on_node1[index].1).max(on_node0[index].1);
        assert!(token > &earlier, "{key}: token {token} after the heal, but {earlier} was granted before");
    }
}

#[test]
fn two_nodes_are_a_cluster_and_the_survivor_of_a_kill_9_serves_alone() {
    let mut cluster = Cluster::start(ClusterOptions { nodes: 2, ..ClusterOptions::default() });
    kill_the_active_and_keep_its_locks(&mut cluster, "node 1 to promote alone, with no quorum needed");
}

/// Node 0 becomes the active and holds 4 keys, replicated; a kill -9 of it
/// makes node 1 promote to a higher epoch with those keys still held.
fn kill_the_active_and_keep_its_locks(cluster: &mut Cluster, promotion: &str) {
    let first_epoch = cluster.wait_active(0, "node 0 to become the active");
    let mut conn = cluster.node(0).connect();
    let since = table_version_of(cluster, 0);
    let held = hold_keys(cluster, &mut conn, "held", 4);
    wait_replicated(cluster, 0, since, 4);
    drop(conn);

    cluster.node_mut(0).kill9();
    let second_epoch = cluster.wait_active(1, promotion);
    assert!(second_epoch > first_epoch, "epoch {second_epoch} after {first_epoch}");
    let mut conn = cluster.node(1).connect();
    assert_still_held_and_releasable(&mut conn, &held, cluster);
}

#[test]
fn a_cluster_sharing_a_peer_secret_forms_and_fails_over_on_a_kill_9_of_the_active() {
    let secret = SecretFile::new(b"cluster-test-peer-secret-0123456789\n");
    let options = ClusterOptions { peer_secret_file: Some(secret.path.clone()), ..ClusterOptions::default() };
    let mut cluster = Cluster::start(options);
    kill_the_active_and_keep_its_locks(&mut cluster, "node 1 to promote after kill -9 of node 0");
    for node in &cluster.nodes {
        let log = node.log();
        assert!(log.contains("peer connections must prove the peer secret"), "node {}:\n{log}", node.index);
        assert!(!log.contains("the peer port has no authentication"), "no warning with a secret:\n{log}");
        assert!(!log.contains("before it proved the peer secret"), "no peer failed its proof:\n{log}");
    }
}

/// The order a Kubernetes StatefulSet's rolling update follows
/// (deploy/kubernetes/ringlock.yaml): the highest ordinal first, so the
/// standbys go before the active; one node at a time, stopped with SIGTERM,
/// and the next only once the restarted one holds the whole table (what its
/// `/readyz` waits for). Under load, no holder loses its lock.
#[test]
fn a_rolling_restart_standbys_first_then_the_active_loses_no_holder() {
    let mut cluster = Cluster::start(ClusterOptions::default());
    cluster.wait_active(0, "node 0 to become the active");
    let mut conn = cluster.node(0).connect();
    let held = hold_keys(&cluster, &mut conn, "held", HELD_KEYS);
    drop(conn);
    let load =
        Load::start(&cluster.addresses(), LoadOptions { lease: Duration::from_secs(60), ..LoadOptions::default() });
    load.wait_more_grants(300, "the load to run", &cluster);

    for index in [2, 1, 0] {
        let status = cluster.node_mut(index).stop(libc::SIGTERM);
        assert!(status.success(), "node {index} exits 0 on SIGTERM, not {status}\n{}", cluster.node(index).log());
        let (active, _) = cluster.wait_single_active(&format!("one active while node {index} is down"));
        assert_ne!(active, index);
        let answer = cluster.node_mut(index).restart();
        assert_eq!(answer.role, Role::Standby, "node {index} comes back as a standby: {answer:?}");
        wait_replicated(&cluster, active, 0, 0);
        load.wait_more_grants(300, &format!("the load to run after node {index} came back"), &cluster);
    }
    cluster.wait_active(0, "node 0, caught up again, to take the active role back");
    load.wait_more_grants(300, "the load to run on node 0 again", &cluster);
    let report = load.stop();
    eprintln!(
        "rolling restart under load: {} grants, {} timeouts, errors {:?}",
        report.grant_count(),
        report.timeouts,
        report.errors
    );
    let lost: Vec<_> = report.not_held().iter().map(|grant| format!("{} {}", grant.key, grant.token)).collect();
    assert!(lost.is_empty(), "grants lost in the rolling restart (their release found nothing): {lost:?}");
    assert!(report.errors.is_empty(), "client errors during the rolling restart: {:?}", report.errors);
    assert!(
        report.token_order_violations().is_empty(),
        "tokens per key increase across the rolling restart: {:?}",
        report.token_order_violations()
    );
    let mut conn = cluster.node(0).connect();
    assert_still_held_and_releasable(&mut conn, &held, &cluster);
}
