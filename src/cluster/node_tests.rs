//! One hand-written schedule per rule of docs/protocol.md §5: a single [`Node`] is fed
//! the heartbeats and messages its peers would send, and the effects it
//! answers with are checked.

use super::*;

const HEARTBEAT_MS: u64 = 100;
const FAILOVER_MS: u64 = 1000;
const HANDOFF_TIMEOUT_MS: u64 = 2000;

fn config(me: usize, nodes: usize) -> ClusterConfig {
    ClusterConfig { me, nodes, heartbeat_ms: HEARTBEAT_MS, failover_ms: FAILOVER_MS, min_standbys: 0 }
}

fn drain(node: &mut Node) -> Vec<Effect> {
    std::iter::from_fn(|| node.poll_effect()).collect()
}

/// The heartbeats among `effects`, with their destination.
fn heartbeats(effects: &[Effect]) -> Vec<(usize, Heartbeat)> {
    effects
        .iter()
        .filter_map(|effect| match effect {
            Effect::Send { to, message: PeerMessage::Heartbeat(heartbeat) } => Some((*to, *heartbeat)),
            _ => None,
        })
        .collect()
}

/// Every effect but heartbeats.
fn others(effects: &[Effect]) -> Vec<Effect> {
    effects
        .iter()
        .filter(|effect| !matches!(effect, Effect::Send { message: PeerMessage::Heartbeat(_), .. }))
        .cloned()
        .collect()
}

fn standby(sequence: u64) -> Heartbeat {
    Heartbeat {
        incarnation: 1,
        sequence,
        role: PeerRole::Standby,
        epoch: 0,
        epoch_seen: 0,
        following: None,
        caught_up: false,
        table: None,
        handing_off_to: None,
    }
}

fn caught_up(sequence: u64, stream: u64) -> Heartbeat {
    Heartbeat { caught_up: true, table: Some(TableVersion { stream, version: 0 }), ..standby(sequence) }
}

fn follower(sequence: u64, active: usize, stream: Option<u64>) -> Heartbeat {
    Heartbeat {
        following: Some(active),
        caught_up: stream.is_some(),
        table: stream.map(|stream| TableVersion { stream, version: 0 }),
        ..standby(sequence)
    }
}

fn active(sequence: u64, epoch: u64) -> Heartbeat {
    Heartbeat {
        role: PeerRole::Active,
        epoch,
        epoch_seen: epoch,
        caught_up: true,
        table: Some(TableVersion { stream: epoch, version: 0 }),
        ..standby(sequence)
    }
}

fn hb(heartbeat: Heartbeat) -> PeerMessage {
    PeerMessage::Heartbeat(heartbeat)
}

/// Ticks `node` every heartbeat period from `from_ms` to `to_ms`, as the
/// runtime does (a longer silence would look like a pause of the node).
fn tick_until(node: &mut Node, from_ms: u64, to_ms: u64) {
    let mut now_ms = from_ms;
    while now_ms < to_ms {
        now_ms = (now_ms + HEARTBEAT_MS).min(to_ms);
        node.tick(now_ms);
    }
}

/// Node `me` of `nodes`, alone since start-up, active after one failover period.
fn active_alone(me: usize, nodes: usize) -> (Node, u64) {
    let mut node = Node::new(config(me, nodes), 0, 1, 0);
    tick_until(&mut node, 0, FAILOVER_MS);
    let epoch = crate::cluster::next_epoch(0, me as u64).unwrap();
    assert!(others(&drain(&mut node)).contains(&Effect::PersistEpoch { epoch }));
    node.epoch_persisted(FAILOVER_MS, epoch);
    assert!(others(&drain(&mut node)).contains(&Effect::Activate { epoch, stream: epoch }));
    (node, epoch)
}

#[test]
fn heartbeats_go_to_every_peer_each_period_with_role_epoch_and_caught_up() {
    let mut node = Node::new(config(1, 3), 0, 7, 0);
    let sent = heartbeats(&drain(&mut node));
    assert_eq!(sent.iter().map(|(to, _)| *to).collect::<Vec<_>>(), vec![0, 2]);
    let (_, first) = sent[0];
    assert_eq!((first.role, first.epoch, first.caught_up, first.following), (PeerRole::Standby, 0, false, None));
    assert_eq!(first.incarnation, 7);
    node.tick(HEARTBEAT_MS - 1);
    assert!(heartbeats(&drain(&mut node)).is_empty(), "not before the period");
    node.tick(HEARTBEAT_MS);
    let again = heartbeats(&drain(&mut node));
    assert_eq!(again.len(), 2);
    assert!(again[0].1.sequence > first.sequence);
    assert!(node.next_deadline_ms() <= 2 * HEARTBEAT_MS);
}

#[test]
fn start_up_waits_one_failover_period_before_promoting_alone() {
    let mut node = Node::new(config(0, 3), 0, 1, 0);
    assert_eq!(node.status(), Status { active: false, epoch: 0, active_node: None }, "P standby 0 -");
    tick_until(&mut node, 0, FAILOVER_MS - 1);
    assert!(others(&drain(&mut node)).is_empty());
    node.tick(FAILOVER_MS);
    assert_eq!(others(&drain(&mut node)), vec![Effect::PersistEpoch { epoch: 16 }]);
    node.tick(FAILOVER_MS + 500);
    assert!(!node.status().active, "never active before the epoch is persisted");
    node.epoch_persisted(FAILOVER_MS + 500, 16);
    assert_eq!(others(&drain(&mut node)), vec![Effect::Activate { epoch: 16, stream: 16 }]);
    assert_eq!(node.status(), Status { active: true, epoch: 16, active_node: Some(0) });
}

#[test]
fn start_up_decides_once_every_peer_is_heard() {
    let mut node = Node::new(config(0, 3), 0, 1, 0);
    node.receive(10, 1, hb(standby(1)));
    assert!(others(&drain(&mut node)).is_empty(), "peer 2 is not heard yet");
    node.receive(20, 2, hb(standby(1)));
    assert_eq!(others(&drain(&mut node)), vec![Effect::PersistEpoch { epoch: 16 }]);
}

#[test]
fn a_standby_follows_the_active_it_hears_even_during_start_up() {
    let mut node = Node::new(config(0, 3), 0, 1, 0);
    drain(&mut node);
    node.receive(10, 2, hb(active(1, 18)));
    let effects = others(&drain(&mut node));
    assert_eq!(
        effects,
        vec![
            Effect::Follow { active: Some(2) },
            Effect::Send { to: 2, message: PeerMessage::SnapshotRequest },
            Effect::PersistEpoch { epoch: 18 }
        ]
    );
    assert_eq!(node.status(), Status { active: false, epoch: 18, active_node: Some(2) });
    // It is the highest priority, but it holds no table: it never promotes
    // while the active lives.
    for step in 1..30 {
        node.receive(10 + step * HEARTBEAT_MS, 2, hb(active(1 + step, 18)));
    }
    assert!(
        !others(&drain(&mut node))
            .iter()
            .any(|effect| matches!(effect, Effect::PersistEpoch { epoch } if epoch % 16 == 0))
    );
}

#[test]
fn a_peer_is_live_only_within_the_failover_timeout() {
    let mut node = Node::new(config(2, 3), 0, 1, 0);
    node.receive(0, 0, hb(active(1, 16)));
    node.receive(0, 1, hb(follower(1, 0, None)));
    drain(&mut node);
    tick_until(&mut node, 0, FAILOVER_MS - 1);
    assert_eq!(node.status().active_node, Some(0));
    assert!(node.next_deadline_ms() <= FAILOVER_MS, "wakes up when the active expires");
    node.tick(FAILOVER_MS);
    let effects = others(&drain(&mut node));
    assert!(effects.contains(&Effect::Follow { active: None }), "{effects:?}");
    assert_eq!(node.status(), Status { active: false, epoch: 0, active_node: None });
}

#[test]
fn a_streaming_active_is_live_while_its_heartbeats_wait_behind_the_stream() {
    let mut node = Node::new(config(2, 3), 0, 1, 0);
    node.receive(0, 0, hb(active(1, 16)));
    node.receive(0, 1, hb(follower(1, 0, None)));
    drain(&mut node);
    // Three failover periods of stream frames from the active and nothing
    // else: its heartbeats are queued behind them.
    let mut now_ms = 0;
    while now_ms < 3 * FAILOVER_MS {
        now_ms += HEARTBEAT_MS;
        node.stream_heard(now_ms, 0);
    }
    assert_eq!(node.status().active_node, Some(0));
    assert!(!others(&drain(&mut node)).contains(&Effect::Follow { active: None }));
    // Once the stream stops too, the active is gone one failover period later.
    tick_until(&mut node, now_ms, now_ms + FAILOVER_MS);
    assert!(others(&drain(&mut node)).contains(&Effect::Follow { active: None }));
}

#[test]
fn a_stream_frame_from_a_peer_never_heard_says_nothing_of_its_role() {
    let mut node = Node::new(config(0, 3), 0, 1, 0);
    drain(&mut node);
    node.stream_heard(10, 2);
    assert_eq!(node.status(), Status { active: false, epoch: 0, active_node: None });
    assert!(others(&drain(&mut node)).is_empty());
}

#[test]
fn the_highest_priority_caught_up_node_promotes_not_the_highest_priority() {
    // Node 1 holds the table of the dead active 2; node 0 restarted empty.
    let mut node = Node::new(config(1, 3), 0, 1, 0);
    node.receive(0, 2, hb(active(1, 18)));
    node.receive(0, 0, hb(follower(1, 2, None)));
    node.snapshot_applied(5, 2, TableVersion { stream: 18, version: 3 }, 18);
    drain(&mut node);
    for step in 1..=10 {
        node.receive(step * HEARTBEAT_MS, 0, hb(standby(1 + step)));
    }
    node.tick(FAILOVER_MS);
    assert_eq!(others(&drain(&mut node)), vec![Effect::Follow { active: None }, Effect::PersistEpoch { epoch: 33 }]);

    // Node 0's side of the same story: it sees node 1 caught up and waits.
    let mut empty = Node::new(config(0, 3), 0, 1, 0);
    empty.receive(0, 2, hb(active(1, 18)));
    empty.receive(0, 1, hb(follower(1, 2, Some(18))));
    for step in 1..=20 {
        empty.receive(step * HEARTBEAT_MS, 1, hb(caught_up(1 + step, 18)));
    }
    empty.tick(20 * HEARTBEAT_MS);
    let effects = others(&drain(&mut empty));
    assert!(
        !effects.iter().any(|effect| matches!(effect, Effect::PersistEpoch { epoch } if epoch % 16 == 0)),
        "{effects:?}"
    );
}

#[test]
fn with_no_caught_up_node_the_highest_priority_live_node_promotes() {
    let mut node = Node::new(config(1, 3), 0, 1, 0);
    let mut lower = Node::new(config(2, 3), 0, 1, 0);
    for step in 0..=10 {
        node.receive(step * HEARTBEAT_MS, 2, hb(standby(1 + step)));
        lower.receive(step * HEARTBEAT_MS, 1, hb(standby(1 + step)));
    }
    assert_eq!(others(&drain(&mut node)), vec![Effect::PersistEpoch { epoch: 17 }], "node 0 is dead: 1 is highest");
    assert!(others(&drain(&mut lower)).is_empty());
}

#[test]
fn never_active_with_an_empty_table_while_a_live_peer_has_the_state() {
    let mut node = Node::new(config(0, 2), 0, 1, 0);
    node.receive(0, 1, hb(caught_up(1, 17)));
    for step in 1..50 {
        node.receive(step * HEARTBEAT_MS, 1, hb(caught_up(1 + step, 17)));
    }
    assert!(others(&drain(&mut node)).is_empty(), "peer 1 has the state; it should promote, not 0");
    // The peer goes silent: once it is dead, an empty table is all there is.
    tick_until(&mut node, 49 * HEARTBEAT_MS, 49 * HEARTBEAT_MS + FAILOVER_MS - 1);
    assert!(others(&drain(&mut node)).is_empty());
    node.tick(49 * HEARTBEAT_MS + FAILOVER_MS);
    assert_eq!(others(&drain(&mut node)), vec![Effect::PersistEpoch { epoch: 16 }]);
}

#[test]
fn an_election_promotion_is_dropped_when_a_peer_with_the_state_appears() {
    let mut node = Node::new(config(0, 2), 0, 1, 0);
    tick_until(&mut node, 0, FAILOVER_MS);
    assert_eq!(others(&drain(&mut node)), vec![Effect::PersistEpoch { epoch: 16 }]);
    node.receive(FAILOVER_MS + 1, 1, hb(caught_up(1, 17)));
    node.epoch_persisted(FAILOVER_MS + 2, 16);
    assert!(others(&drain(&mut node)).is_empty(), "no Activate");
    assert!(!node.status().active);
}

#[test]
fn epochs_are_ballots_above_every_epoch_seen_or_persisted() {
    let mut node = Node::new(config(2, 3), 40, 1, 0);
    node.receive(0, 1, hb(Heartbeat { epoch_seen: 70, ..standby(1) }));
    assert_eq!(others(&drain(&mut node)), vec![Effect::PersistEpoch { epoch: 70 }], "a seen epoch is persisted");
    tick_until(&mut node, 0, FAILOVER_MS);
    // Node 1 is silent now: node 2 is alone and promotes in round 5 (80..95).
    assert_eq!(others(&drain(&mut node)), vec![Effect::PersistEpoch { epoch: 82 }]);
    node.epoch_persisted(FAILOVER_MS, 82);
    assert_eq!(others(&drain(&mut node)), vec![Effect::Activate { epoch: 82, stream: 82 }]);
}

#[test]
fn a_higher_epoch_seen_while_persisting_moves_the_new_epoch_above_it() {
    let mut node = Node::new(config(0, 2), 16, 1, 0);
    tick_until(&mut node, 0, FAILOVER_MS);
    assert_eq!(others(&drain(&mut node)), vec![Effect::PersistEpoch { epoch: 32 }]);
    node.receive(FAILOVER_MS + 1, 1, hb(Heartbeat { epoch_seen: 49, ..standby(1) }));
    node.epoch_persisted(FAILOVER_MS + 2, 32);
    let effects = others(&drain(&mut node));
    assert!(!effects.iter().any(|effect| matches!(effect, Effect::Activate { .. })), "{effects:?}");
    assert!(effects.contains(&Effect::PersistEpoch { epoch: 64 }), "{effects:?}");
    node.epoch_persisted(FAILOVER_MS + 3, 64);
    assert_eq!(others(&drain(&mut node)), vec![Effect::Activate { epoch: 64, stream: 64 }]);
}

#[test]
fn epochs_of_replicated_tokens_count_as_seen() {
    let mut node = Node::new(config(1, 2), 0, 1, 0);
    node.receive(0, 0, hb(active(1, 16)));
    drain(&mut node);
    node.snapshot_applied(1, 0, TableVersion { stream: 16, version: 9 }, 48);
    assert_eq!(others(&drain(&mut node)), vec![Effect::PersistEpoch { epoch: 48 }]);
    tick_until(&mut node, 1, 1 + FAILOVER_MS);
    assert!(others(&drain(&mut node)).contains(&Effect::PersistEpoch { epoch: 65 }), "above every token it holds");
}

/// Node 0 active in epoch 16 with standbys 1 (caught up) and 2 (empty), both following it.
fn active_with_followers() -> Node {
    let (mut node, _) = active_alone(0, 3);
    node.receive(FAILOVER_MS + 10, 2, hb(follower(1, 0, None)));
    node.receive(FAILOVER_MS + 10, 1, hb(follower(1, 0, Some(16))));
    drain(&mut node);
    node
}

#[test]
fn a_stopping_active_hands_off_to_its_caught_up_successor_then_redirects_and_exits() {
    let mut node = active_with_followers();
    let now = FAILOVER_MS + 20;
    node.stop_requested(now);
    let effects = drain(&mut node);
    assert_eq!(others(&effects), vec![Effect::Hold]);
    assert!(heartbeats(&effects).iter().all(|(_, heartbeat)| heartbeat.handing_off_to == Some(1)));
    node.table_changed(now + 1, 6);
    node.clients_held(now + 2, 7);
    let table = TableVersion { stream: 16, version: 7 };
    assert_eq!(
        others(&drain(&mut node)),
        vec![Effect::Send { to: 1, message: PeerMessage::HandOff { table, epoch_seen: 16 } }]
    );
    assert!(node.status().active, "still the active until the successor answers");
    node.receive(now + 5, 1, PeerMessage::HandOffDone { table, epoch: 33 });
    let effects = drain(&mut node);
    assert_eq!(others(&effects), vec![Effect::Follow { active: Some(1) }, Effect::PersistEpoch { epoch: 33 }]);
    assert!(heartbeats(&effects).iter().all(|(_, heartbeat)| heartbeat.role == PeerRole::Leaving));
    // The successor's epoch is persisted before the exit, so that this node,
    // restarting alone, goes above it.
    node.receive(now + 6, 2, hb(Heartbeat { epoch_seen: 40, ..follower(2, 1, None) }));
    node.epoch_persisted(now + 7, 33);
    assert_eq!(others(&drain(&mut node)), vec![Effect::PersistEpoch { epoch: 40 }]);
    node.epoch_persisted(now + 8, 40);
    assert_eq!(others(&drain(&mut node)), vec![Effect::Exit { reason: ExitReason::HandedOff }]);
    // Until the process ends, `P` sends clients to the successor.
    assert_eq!(node.status(), Status { active: false, epoch: 33, active_node: Some(1) });
    node.tick(now + 10 * FAILOVER_MS);
    assert!(drain(&mut node).is_empty(), "an exited node does nothing");
}

#[test]
fn a_stop_hand_off_without_answer_fails_after_max_one_second_twice_failover() {
    let mut node = active_with_followers();
    let now = FAILOVER_MS + 20;
    node.stop_requested(now);
    node.clients_held(now, 0);
    drain(&mut node);
    node.tick(now + HANDOFF_TIMEOUT_MS - 1);
    let effects = others(&drain(&mut node));
    assert!(effects.iter().all(|effect| matches!(effect, Effect::Send { message: PeerMessage::HandOff { .. }, .. })));
    assert!(!effects.is_empty(), "the offer is repeated in case it was lost");
    node.tick(now + HANDOFF_TIMEOUT_MS);
    assert_eq!(others(&drain(&mut node)), vec![Effect::Exit { reason: ExitReason::HandOffFailed }]);

    let fast = ClusterConfig { failover_ms: 300, ..config(0, 2) };
    assert_eq!(fast.handoff_timeout_ms(), 1000);
}

#[test]
fn a_refused_hand_off_fails_at_once() {
    let mut node = active_with_followers();
    node.stop_requested(FAILOVER_MS + 20);
    node.clients_held(FAILOVER_MS + 20, 3);
    drain(&mut node);
    let table = TableVersion { stream: 16, version: 3 };
    node.receive(FAILOVER_MS + 30, 1, PeerMessage::HandOffRefused { table });
    assert_eq!(others(&drain(&mut node)), vec![Effect::Exit { reason: ExitReason::HandOffFailed }]);
}

#[test]
fn a_stopping_active_without_a_caught_up_standby_shuts_down_plainly() {
    let (mut node, _) = active_alone(0, 3);
    node.receive(FAILOVER_MS + 10, 2, hb(follower(1, 0, None)));
    node.stop_requested(FAILOVER_MS + 20);
    assert_eq!(others(&drain(&mut node)), vec![Effect::Exit { reason: ExitReason::NoSuccessor }]);
}

#[test]
fn a_stopping_standby_exits_at_once_and_peers_see_it_leave() {
    let mut node = Node::new(config(1, 2), 0, 1, 0);
    drain(&mut node);
    node.stop_requested(5);
    let effects = drain(&mut node);
    assert_eq!(others(&effects), vec![Effect::Exit { reason: ExitReason::Standby }]);
    let (_, leaving) = heartbeats(&effects)[0];
    assert_eq!(leaving.role, PeerRole::Leaving);

    // The peer that receives it treats node 1 as dead at once.
    let mut peer = Node::new(config(0, 2), 0, 1, 0);
    peer.receive(1, 1, hb(caught_up(1, 17)));
    peer.receive(6, 1, hb(leaving));
    assert!(others(&drain(&mut peer)).contains(&Effect::PersistEpoch { epoch: 16 }));
}

#[test]
fn the_successor_promotes_once_it_has_applied_the_offered_state() {
    let mut node = Node::new(config(1, 3), 0, 1, 0);
    node.receive(0, 0, hb(active(1, 16)));
    node.snapshot_applied(5, 0, TableVersion { stream: 16, version: 5 }, 16);
    drain(&mut node);
    let table = TableVersion { stream: 16, version: 7 };
    node.receive(10, 0, PeerMessage::HandOff { table, epoch_seen: 16 });
    assert!(others(&drain(&mut node)).is_empty(), "deltas 6 and 7 are not applied yet");
    node.replica_applied(11, 0, table, 16);
    assert_eq!(others(&drain(&mut node)), vec![Effect::PersistEpoch { epoch: 33 }]);
    assert_eq!(node.status().active_node, Some(0), "still redirects to the old active");
    node.epoch_persisted(12, 33);
    assert_eq!(
        others(&drain(&mut node)),
        vec![
            Effect::Activate { epoch: 33, stream: 33 },
            Effect::Send { to: 0, message: PeerMessage::HandOffDone { table, epoch: 33 } }
        ]
    );
    // The old active still says it is active, handing off to us: not a rival.
    node.receive(13, 0, hb(Heartbeat { handing_off_to: Some(1), ..active(2, 16) }));
    // Its repeated offer gets the answer again (the first may have been lost).
    node.receive(14, 0, PeerMessage::HandOff { table, epoch_seen: 16 });
    assert_eq!(
        others(&drain(&mut node)),
        vec![Effect::Send { to: 0, message: PeerMessage::HandOffDone { table, epoch: 33 } }]
    );
    assert!(node.status().active);
}

#[test]
fn an_offer_that_cannot_be_caught_up_in_time_is_refused() {
    let mut node = Node::new(config(1, 2), 0, 1, 0);
    node.receive(0, 0, hb(active(1, 16)));
    node.snapshot_applied(5, 0, TableVersion { stream: 16, version: 5 }, 16);
    drain(&mut node);
    let table = TableVersion { stream: 16, version: 9 };
    node.receive(10, 0, PeerMessage::HandOff { table, epoch_seen: 16 });
    node.receive(10 + HEARTBEAT_MS, 0, hb(active(2, 16)));
    node.receive(10 + HANDOFF_TIMEOUT_MS / 2, 0, hb(active(3, 16)));
    let effects = others(&drain(&mut node));
    assert_eq!(effects, vec![Effect::Send { to: 0, message: PeerMessage::HandOffRefused { table } }]);
    // The stream from node 0 is stuck (the active held still and the state
    // never came): the node re-syncs so that the next offer can succeed.
    node.receive(10 + HANDOFF_TIMEOUT_MS / 2 + 1, 0, hb(active(4, 16)));
    assert_eq!(others(&drain(&mut node)), vec![Effect::Send { to: 0, message: PeerMessage::SnapshotRequest }]);
}

#[test]
fn a_higher_priority_node_that_comes_back_catches_up_then_takes_over_by_hand_off() {
    // The returning node 0: it follows the active 1 and asks for a snapshot,
    // instead of promoting as the highest priority.
    let mut returning = Node::new(config(0, 2), 16, 2, 0);
    returning.receive(3, 1, hb(active(1, 33)));
    assert_eq!(
        others(&drain(&mut returning)),
        vec![
            Effect::Follow { active: Some(1) },
            Effect::Send { to: 1, message: PeerMessage::SnapshotRequest },
            Effect::PersistEpoch { epoch: 33 }
        ]
    );

    // The active 1 waits until node 0 holds a snapshot of its stream.
    let (mut node, epoch) = active_alone(1, 2);
    let mut now = FAILOVER_MS + 10;
    node.receive(now, 0, hb(follower(1, 1, None)));
    node.receive(now, 0, PeerMessage::SnapshotRequest);
    assert_eq!(others(&drain(&mut node)), vec![Effect::SendSnapshot { to: 0 }]);
    now += HEARTBEAT_MS;
    node.receive(now, 0, hb(follower(2, 1, Some(epoch))));
    assert_eq!(others(&drain(&mut node)), vec![Effect::Hold]);
    node.clients_held(now + 1, 4);
    let table = TableVersion { stream: epoch, version: 4 };
    assert_eq!(
        others(&drain(&mut node)),
        vec![Effect::Send { to: 0, message: PeerMessage::HandOff { table, epoch_seen: epoch } }]
    );
    node.receive(now + 5, 0, PeerMessage::HandOffDone { table, epoch: 48 });
    assert_eq!(
        others(&drain(&mut node)),
        vec![
            Effect::Follow { active: Some(0) },
            Effect::Send { to: 0, message: PeerMessage::SnapshotRequest },
            Effect::PersistEpoch { epoch: 48 }
        ],
        "it stays, as a standby of the new active, and re-syncs from it"
    );
    node.receive(now + 6, 0, hb(active(3, 48)));
    assert!(others(&drain(&mut node)).is_empty());
    assert_eq!(node.status(), Status { active: false, epoch: 48, active_node: Some(0) });
}

#[test]
fn a_failed_preemptive_hand_off_resumes_and_waits_before_trying_again() {
    let (mut node, epoch) = active_alone(1, 2);
    let now = FAILOVER_MS + 10;
    node.receive(now, 0, hb(follower(1, 1, Some(epoch))));
    assert_eq!(others(&drain(&mut node)), vec![Effect::Hold]);
    node.clients_held(now, 0);
    drain(&mut node);
    let mut sequence = 2;
    let mut t = now;
    while t < now + HANDOFF_TIMEOUT_MS {
        t += HEARTBEAT_MS;
        node.receive(t, 0, hb(follower(sequence, 1, Some(epoch))));
        sequence += 1;
    }
    let effects = others(&drain(&mut node));
    assert!(effects.contains(&Effect::Resume), "{effects:?}");
    assert!(node.status().active);
    node.receive(t + HEARTBEAT_MS, 0, hb(follower(sequence, 1, Some(epoch))));
    assert!(!others(&drain(&mut node)).contains(&Effect::Hold), "no new hold right away");
    node.receive(t + HANDOFF_TIMEOUT_MS, 0, hb(follower(sequence + 1, 1, Some(epoch))));
    assert!(others(&drain(&mut node)).contains(&Effect::Hold));
}

#[test]
fn when_two_actives_meet_the_lower_priority_one_steps_down_and_resyncs() {
    let (mut node, _) = active_alone(1, 3);
    node.receive(FAILOVER_MS + 10, 0, hb(active(1, 32)));
    assert_eq!(
        others(&drain(&mut node)),
        vec![
            Effect::Follow { active: Some(0) },
            Effect::Send { to: 0, message: PeerMessage::SnapshotRequest },
            Effect::PersistEpoch { epoch: 32 },
        ]
    );
    assert_eq!(node.status(), Status { active: false, epoch: 32, active_node: Some(0) });
}

#[test]
fn the_remaining_active_moves_to_an_epoch_above_both() {
    let (mut node, epoch) = active_alone(0, 3);
    assert_eq!(epoch, 16);
    node.receive(FAILOVER_MS + 10, 2, hb(active(1, 34)));
    assert_eq!(
        others(&drain(&mut node)),
        vec![Effect::Hold, Effect::PersistEpoch { epoch: 48 }],
        "no grant below the rival's epoch: hold until the new epoch is persisted"
    );
    assert_eq!(node.status().epoch, 16);
    node.receive(FAILOVER_MS + 11, 2, hb(active(2, 34)));
    assert!(others(&drain(&mut node)).is_empty(), "one move per rival epoch");
    node.epoch_persisted(FAILOVER_MS + 12, 48);
    assert_eq!(others(&drain(&mut node)), vec![Effect::Activate { epoch: 48, stream: 16 }], "same stream");
    // A rival in a lower epoch needs no move: every token here is above its own.
    node.receive(FAILOVER_MS + 13, 1, hb(active(1, 33)));
    assert!(others(&drain(&mut node)).is_empty());
}

#[test]
fn a_late_heartbeat_is_ignored() {
    let mut node = Node::new(config(2, 3), 0, 1, 0);
    node.receive(0, 0, hb(active(5, 16)));
    node.receive(1, 0, hb(standby(6)));
    assert!(others(&drain(&mut node)).contains(&Effect::Follow { active: None }));
    node.receive(2, 0, hb(active(4, 16)));
    assert_eq!(node.status().active_node, None, "sequence 4 is older than 6");
    // A restart (new incarnation) starts its sequence again.
    node.receive(3, 0, hb(Heartbeat { incarnation: 2, ..active(1, 32) }));
    assert_eq!(node.status().active_node, Some(0));
}

#[test]
fn a_node_that_was_paused_does_not_declare_its_peers_dead_on_waking() {
    let mut node = Node::new(config(2, 3), 0, 1, 0);
    node.receive(0, 0, hb(active(1, 16)));
    node.receive(0, 1, hb(follower(1, 0, Some(16))));
    drain(&mut node);
    node.tick(5 * FAILOVER_MS);
    assert_eq!(node.status().active_node, Some(0), "the silence was this node's own");
    node.receive(5 * FAILOVER_MS + 1, 0, hb(active(60, 16)));
    tick_until(&mut node, 5 * FAILOVER_MS + 1, 6 * FAILOVER_MS);
    assert_eq!(node.status().active_node, Some(0));
    // Without a heartbeat, the active is dead one failover period after the last one.
    node.tick(6 * FAILOVER_MS + 1);
    assert_eq!(node.status().active_node, None);
}

#[test]
fn a_node_does_not_promote_while_a_live_peer_follows_an_active_it_cannot_hear() {
    let mut node = Node::new(config(1, 3), 0, 1, 0);
    for step in 0..=10 {
        node.receive(step * HEARTBEAT_MS, 2, hb(follower(1 + step, 0, Some(16))));
    }
    node.tick(FAILOVER_MS + 50);
    assert!(others(&drain(&mut node)).is_empty(), "node 2 still follows node 0");
    node.receive(FAILOVER_MS + 60, 2, hb(standby(20)));
    assert_eq!(others(&drain(&mut node)), vec![Effect::PersistEpoch { epoch: 17 }], "node 0 is gone for node 2 too");
}

#[test]
fn a_standby_asks_for_a_snapshot_again_when_its_stream_breaks() {
    let mut node = Node::new(config(1, 2), 0, 1, 0);
    node.receive(0, 0, hb(active(1, 16)));
    drain(&mut node);
    node.snapshot_applied(5, 0, TableVersion { stream: 16, version: 2 }, 16);
    node.replica_applied(6, 0, TableVersion { stream: 16, version: 3 }, 16);
    let effects = drain(&mut node);
    assert!(others(&effects).is_empty());
    node.tick(HEARTBEAT_MS);
    let (_, heartbeat) = heartbeats(&drain(&mut node))[0];
    assert_eq!(heartbeat.table, Some(TableVersion { stream: 16, version: 3 }));
    assert!(heartbeat.caught_up);
    node.replica_broken(HEARTBEAT_MS + 1, 0);
    assert_eq!(others(&drain(&mut node)), vec![Effect::Send { to: 0, message: PeerMessage::SnapshotRequest }]);
    // No answer: asked again after the retry period, not before.
    node.receive(HEARTBEAT_MS + 2, 0, hb(active(2, 16)));
    assert!(others(&drain(&mut node)).is_empty());
    node.receive(HEARTBEAT_MS + 1 + 2 * FAILOVER_MS, 0, hb(active(3, 16)));
    assert!(others(&drain(&mut node)).contains(&Effect::Send { to: 0, message: PeerMessage::SnapshotRequest }));
}

#[test]
fn a_snapshot_that_keeps_arriving_is_not_asked_for_again() {
    let mut node = Node::new(config(1, 2), 0, 1, 0);
    node.receive(0, 0, hb(active(1, 16)));
    assert!(others(&drain(&mut node)).contains(&Effect::Send { to: 0, message: PeerMessage::SnapshotRequest }));
    // Parts keep coming for three retry periods: no second request.
    let mut now_ms = 0;
    let mut sequence = 1;
    while now_ms < 6 * FAILOVER_MS {
        now_ms += HEARTBEAT_MS;
        sequence += 1;
        node.snapshot_progress(now_ms, 0);
        node.receive(now_ms, 0, hb(active(sequence, 16)));
        assert!(!others(&drain(&mut node)).contains(&Effect::Send { to: 0, message: PeerMessage::SnapshotRequest }));
    }
    // Then it stalls: asked again one retry period after the last part.
    let last_part_ms = now_ms;
    while now_ms < last_part_ms + 2 * FAILOVER_MS - HEARTBEAT_MS {
        now_ms += HEARTBEAT_MS;
        sequence += 1;
        node.receive(now_ms, 0, hb(active(sequence, 16)));
        assert!(others(&drain(&mut node)).is_empty());
    }
    node.receive(last_part_ms + 2 * FAILOVER_MS, 0, hb(active(sequence + 1, 16)));
    assert!(others(&drain(&mut node)).contains(&Effect::Send { to: 0, message: PeerMessage::SnapshotRequest }));
}

#[test]
fn an_active_whose_sequences_run_out_moves_to_a_new_epoch() {
    let (mut node, epoch) = active_alone(2, 3);
    node.epoch_exhausted(FAILOVER_MS + 1);
    assert_eq!(others(&drain(&mut node)), vec![Effect::PersistEpoch { epoch: epoch + 16 }]);
    node.epoch_persisted(FAILOVER_MS + 2, epoch + 16);
    assert_eq!(others(&drain(&mut node)), vec![Effect::Activate { epoch: epoch + 16, stream: epoch }]);
}

#[test]
fn a_bad_peer_index_is_dropped() {
    let mut node = Node::new(config(0, 2), 0, 1, 0);
    drain(&mut node);
    node.receive(1, 5, hb(active(1, 99)));
    node.receive(1, 0, hb(active(1, 99)));
    assert!(drain(&mut node).is_empty());
}

#[test]
fn an_active_that_learns_of_a_higher_epoch_moves_above_it_before_granting_again() {
    let (mut node, _) = active_alone(0, 3);
    // A standby that was active in a partition comes back knowing epoch 65.
    node.receive(FAILOVER_MS + 10, 1, hb(Heartbeat { epoch_seen: 65, ..follower(1, 0, None) }));
    assert_eq!(others(&drain(&mut node)), vec![Effect::Hold, Effect::PersistEpoch { epoch: 80 }]);
    node.epoch_persisted(FAILOVER_MS + 11, 80);
    assert_eq!(others(&drain(&mut node)), vec![Effect::Activate { epoch: 80, stream: 16 }], "ends the hold");
}

#[test]
fn an_epoch_move_during_a_hand_off_that_fails_resumes_in_the_new_epoch() {
    let (mut node, epoch) = active_alone(1, 2);
    let now = FAILOVER_MS + 10;
    node.receive(now, 0, hb(follower(1, 1, Some(epoch))));
    assert_eq!(others(&drain(&mut node)), vec![Effect::Hold]);
    node.clients_held(now, 2);
    drain(&mut node);
    node.receive(now + 1, 0, hb(Heartbeat { epoch_seen: 40, ..follower(2, 1, Some(epoch)) }));
    assert_eq!(others(&drain(&mut node)), vec![Effect::PersistEpoch { epoch: 49 }], "already holding");
    node.epoch_persisted(now + 2, 49);
    assert!(others(&drain(&mut node)).is_empty(), "an Activate now would end the hand-off's hold");
    node.receive(now + 3, 0, PeerMessage::HandOffRefused { table: TableVersion { stream: epoch, version: 2 } });
    assert_eq!(others(&drain(&mut node)), vec![Effect::Activate { epoch: 49, stream: epoch }]);
}

#[test]
fn an_active_that_a_peer_refuses_steps_down_and_serves_again_once_refusals_stop() {
    let (mut node, epoch) = active_alone(0, 2);
    let now = FAILOVER_MS + 10;
    node.refused_by(now, 1);
    assert_eq!(others(&drain(&mut node)), vec![Effect::Follow { active: None }]);
    assert_eq!(node.status(), Status { active: false, epoch: 0, active_node: None });
    // Refusals keep coming (the peer refuses every reconnection): no promotion.
    let mut now_ms = now;
    for _ in 0..10 {
        tick_until(&mut node, now_ms, now_ms + 300);
        now_ms += 300;
        node.refused_by(now_ms, 1);
        assert!(!others(&drain(&mut node)).iter().any(|effect| matches!(effect, Effect::PersistEpoch { .. })));
        assert!(!node.status().active);
    }
    // The settings are fixed: after two failover periods without a refusal,
    // the node is elected again, in a new epoch.
    tick_until(&mut node, now_ms, now_ms + 2 * FAILOVER_MS + HEARTBEAT_MS);
    let next = crate::cluster::next_epoch(epoch, 0).unwrap();
    assert_eq!(others(&drain(&mut node)), vec![Effect::PersistEpoch { epoch: next }]);
}

#[test]
fn a_refused_standby_refuses_a_hand_off_offered_to_it() {
    let mut node = Node::new(config(1, 2), 0, 1, 0);
    node.receive(10, 0, hb(active(1, 16)));
    drain(&mut node);
    let table = TableVersion { stream: 16, version: 0 };
    node.refused_by(20, 0);
    node.receive(30, 0, PeerMessage::HandOff { table, epoch_seen: 16 });
    assert_eq!(others(&drain(&mut node)), vec![Effect::Send { to: 0, message: PeerMessage::HandOffRefused { table } }]);
}

#[test]
fn refusals_from_out_of_range_or_own_indexes_change_nothing() {
    let (mut node, epoch) = active_alone(0, 2);
    node.refused_by(FAILOVER_MS + 1, 0);
    node.refused_by(FAILOVER_MS + 2, 5);
    assert!(others(&drain(&mut node)).is_empty());
    assert_eq!(node.status(), Status { active: true, epoch, active_node: Some(0) });
}

#[test]
fn a_restarted_peer_with_a_smaller_incarnation_is_heard_once_it_reconnects() {
    let mut node = Node::new(config(1, 2), 0, 1, 0);
    node.receive(10, 0, hb(Heartbeat { incarnation: 1_000, ..active(5, 16) }));
    drain(&mut node);
    assert_eq!(node.status().active_node, Some(0));
    // Node 0 restarts with its clock stepped back, as an active of a new
    // epoch: without a reconnection its heartbeats read as an older life.
    let restarted = Heartbeat { incarnation: 500, ..active(1, 32) };
    node.receive(20, 0, hb(restarted));
    drain(&mut node);
    assert_eq!(node.status().epoch, 16, "a late heartbeat of an older life is not taken");
    node.peer_reconnected(30, 0);
    node.receive(30, 0, hb(restarted));
    drain(&mut node);
    assert_eq!(node.status(), Status { active: false, epoch: 32, active_node: Some(0) });
    // From then on the order within the new life counts again.
    node.receive(40, 0, hb(Heartbeat { incarnation: 500, ..active(0, 48) }));
    assert_eq!(node.status().epoch, 32);
}

#[test]
fn messages_with_an_epoch_no_token_can_carry_are_ignored_whole() {
    let (mut node, epoch) = active_alone(0, 2);
    let now = FAILOVER_MS + 10;
    let too_high = ringlock_shards::token::EPOCH_MAX + 1;
    for message in [
        hb(Heartbeat { epoch_seen: too_high, ..follower(1, 0, None) }),
        hb(Heartbeat { epoch_seen: u64::MAX, ..follower(1, 0, None) }),
        hb(Heartbeat { epoch: u64::MAX, ..active(1, 17) }),
        PeerMessage::HandOff { table: TableVersion { stream: 1, version: 0 }, epoch_seen: u64::MAX },
        PeerMessage::HandOffDone { table: TableVersion { stream: u64::MAX, version: 0 }, epoch: 17 },
    ] {
        node.receive(now, 1, message);
        assert!(others(&drain(&mut node)).is_empty(), "{message:?}");
        assert_eq!(node.status(), Status { active: true, epoch, active_node: Some(0) });
    }
}

/// The last epoch of node `me`'s ballots.
fn last_epoch_of(me: u64) -> u64 {
    (ringlock_shards::token::EPOCH_MAX - me) / 16 * 16 + me
}

#[test]
fn an_active_that_sees_a_higher_epoch_it_cannot_pass_holds_for_good_and_says_why() {
    // Node 0 promotes into its last round; node 1 was active in a partition
    // in the same round, above it.
    let mut node = Node::new(config(0, 2), last_epoch_of(0) - 16, 1, 0);
    tick_until(&mut node, 0, FAILOVER_MS);
    assert!(others(&drain(&mut node)).contains(&Effect::PersistEpoch { epoch: last_epoch_of(0) }));
    node.epoch_persisted(FAILOVER_MS, last_epoch_of(0));
    drain(&mut node);
    assert_eq!(node.blocked(), None);
    let seen = last_epoch_of(1);
    node.receive(FAILOVER_MS + 10, 1, hb(Heartbeat { epoch_seen: seen, ..follower(1, 0, None) }));
    // It records the epoch seen, as every node does, and holds: no epoch is
    // left to move to, so it grants no more.
    assert_eq!(others(&drain(&mut node)), vec![Effect::Hold, Effect::PersistEpoch { epoch: seen }]);
    assert_eq!(node.blocked(), Some(Blocked::EpochSpaceExhausted { highest: seen }));
    node.receive(FAILOVER_MS + 20, 1, hb(Heartbeat { epoch_seen: seen, ..follower(2, 0, None) }));
    node.epoch_persisted(FAILOVER_MS + 20, seen);
    assert!(others(&drain(&mut node)).is_empty(), "held once, and no Activate ends the hold");
    assert_eq!(node.blocked(), Some(Blocked::EpochSpaceExhausted { highest: seen }));
}

#[test]
fn a_standby_that_cannot_promote_is_blocked_until_it_has_an_active_to_follow() {
    let mut node = Node::new(config(1, 2), last_epoch_of(1), 1, 0);
    tick_until(&mut node, 0, FAILOVER_MS + HEARTBEAT_MS);
    drain(&mut node);
    assert!(!node.status().active);
    assert_eq!(node.blocked(), Some(Blocked::EpochSpaceExhausted { highest: last_epoch_of(1) }));
    // An active above it appears (the operator started over elsewhere): it
    // follows, and nothing stops it any more.
    let now = FAILOVER_MS + 2 * HEARTBEAT_MS;
    node.receive(now, 0, hb(active(1, ringlock_shards::token::EPOCH_MAX - 15)));
    drain(&mut node);
    assert_eq!(node.status().active_node, Some(0));
    assert_eq!(node.blocked(), None);
}

// ----- `--min-standbys` -----

/// Node 0 of 3 with `--min-standbys 1`, active alone since start-up.
fn semi_sync_active() -> (Node, u64) {
    let semi_sync = ClusterConfig { min_standbys: 1, ..config(0, 3) };
    let mut node = Node::new(semi_sync, 0, 1, 0);
    tick_until(&mut node, 0, FAILOVER_MS);
    let epoch = crate::cluster::next_epoch(0, 0).unwrap();
    drain(&mut node);
    node.epoch_persisted(FAILOVER_MS, epoch);
    assert!(others(&drain(&mut node)).contains(&Effect::Activate { epoch, stream: epoch }));
    (node, epoch)
}

fn applied(sequence: u64, active: usize, stream: u64, version: u64) -> Heartbeat {
    Heartbeat { table: Some(TableVersion { stream, version }), ..follower(sequence, active, Some(stream)) }
}

#[test]
fn min_standbys_the_acknowledged_version_is_the_nth_highest_a_caught_up_follower_applied() {
    let (mut node, epoch) = semi_sync_active();
    let now = FAILOVER_MS + 10;
    assert_eq!(node.acknowledged_version(), None, "no standby yet");
    node.receive(now, 1, hb(applied(1, 0, epoch, 5)));
    assert_eq!(node.acknowledged_version(), Some(5));
    node.receive(now, 2, hb(applied(1, 0, epoch, 9)));
    assert_eq!(node.acknowledged_version(), Some(9), "one standby is enough");
    node.receive(now, 2, hb(applied(2, 0, epoch - 1, 20)));
    assert_eq!(node.acknowledged_version(), Some(5), "another stream's version says nothing");
    let two = ClusterConfig { min_standbys: 2, ..config(0, 3) };
    assert!(two.validate().is_ok());
    assert!(ClusterConfig { min_standbys: 3, ..config(0, 3) }.validate().is_err(), "at most nodes - 1");
}

#[test]
fn min_standbys_an_active_without_a_caught_up_standby_for_failover_ms_is_blocked_until_one_is_back() {
    let (mut node, epoch) = semi_sync_active();
    let activated = FAILOVER_MS;
    node.tick(activated + FAILOVER_MS - 1);
    assert_eq!(node.blocked(), None, "its standbys have one failover period to catch up");
    node.tick(activated + FAILOVER_MS);
    assert_eq!(node.blocked(), Some(Blocked::NoStandby { needed: 1 }));
    assert!(node.status().active, "it stays active for its holders");
    let back = activated + FAILOVER_MS + 50;
    node.receive(back, 1, hb(follower(1, 0, None)));
    assert_eq!(node.blocked(), Some(Blocked::NoStandby { needed: 1 }), "a standby without the table does not count");
    node.receive(back, 1, hb(applied(2, 0, epoch, 0)));
    assert_eq!(node.blocked(), None);
    // Silent for a failover period: blocked again, at the deadline it asked for.
    let deadline = node.next_deadline_ms();
    assert!(deadline <= back + FAILOVER_MS);
    tick_until(&mut node, back, back + FAILOVER_MS);
    assert_eq!(node.blocked(), Some(Blocked::NoStandby { needed: 1 }));
}

#[test]
fn min_standbys_a_standby_acknowledges_applied_deltas_to_its_active_at_once() {
    let semi_sync = ClusterConfig { min_standbys: 1, ..config(1, 3) };
    let mut node = Node::new(semi_sync, 0, 1, 0);
    node.receive(10, 0, hb(active(1, 5)));
    drain(&mut node);
    node.snapshot_applied(20, 0, TableVersion { stream: 5, version: 3 }, 0);
    node.replica_applied(21, 0, TableVersion { stream: 5, version: 7 }, 0);
    drain(&mut node);
    node.acknowledge(22);
    let sent = heartbeats(&drain(&mut node));
    assert_eq!(sent.len(), 1, "to the active only: {sent:?}");
    assert_eq!(sent[0].0, 0);
    assert_eq!(sent[0].1.table, Some(TableVersion { stream: 5, version: 7 }));
    node.acknowledge(23);
    assert!(drain(&mut node).is_empty(), "nothing new applied, nothing to say");
    let plain = Node::new(config(1, 3), 0, 1, 0);
    assert_eq!(plain.config().min_standbys, 0);
}

#[test]
fn min_standbys_a_blocked_active_yields_to_a_rival_that_is_not_whatever_their_priorities() {
    let (mut node, epoch) = semi_sync_active();
    let blocked_at = 2 * FAILOVER_MS;
    node.tick(blocked_at);
    assert_eq!(node.blocked(), Some(Blocked::NoStandby { needed: 1 }));
    let sent = heartbeats(&drain(&mut node));
    node.tick(blocked_at + HEARTBEAT_MS);
    let sent = [sent, heartbeats(&drain(&mut node))].concat();
    assert!(sent.iter().all(|(_, heartbeat)| !heartbeat.caught_up), "a blocked active says so: {sent:?}");
    // Node 1 became active on the other side of a partition, with node 2 as
    // its standby; node 0, blocked, hears it again and follows it.
    let rival_epoch = epoch + 16;
    let now = blocked_at + HEARTBEAT_MS + 10;
    node.receive(now, 1, hb(Heartbeat { epoch_seen: rival_epoch, ..active(1, rival_epoch) }));
    assert!(!node.status().active, "the blocked active stepped down");
    assert!(others(&drain(&mut node)).contains(&Effect::Follow { active: Some(1) }));
    assert_eq!(node.blocked(), None, "a standby is not blocked");

    // An active that is not blocked keeps its role before a blocked rival of higher priority.
    let semi_sync = ClusterConfig { min_standbys: 1, ..config(1, 3) };
    let mut node = Node::new(semi_sync, 0, 1, 0);
    tick_until(&mut node, 0, FAILOVER_MS);
    let epoch = crate::cluster::next_epoch(0, 1).unwrap();
    node.epoch_persisted(FAILOVER_MS, epoch);
    node.receive(FAILOVER_MS + 10, 2, hb(applied(1, 1, epoch, 0)));
    drain(&mut node);
    let blocked_rival = Heartbeat { caught_up: false, ..active(1, epoch - 1) };
    node.receive(FAILOVER_MS + 20, 0, hb(blocked_rival));
    assert!(node.status().active, "node 1 has its standby: it stays active");
    assert_eq!(node.blocked(), None);
    // A standby that hears both follows the one that is not blocked.
    let mut standby = Node::new(ClusterConfig { min_standbys: 1, ..config(2, 3) }, 0, 1, 0);
    standby.receive(10, 0, hb(blocked_rival));
    standby.receive(10, 1, hb(active(1, epoch)));
    assert_eq!(standby.status().active_node, Some(1));
}

#[test]
fn a_hand_off_that_succeeded_names_the_table_the_successor_holds_once() {
    let mut node = active_with_followers();
    let now = FAILOVER_MS + 20;
    node.stop_requested(now);
    node.clients_held(now + 2, 7);
    drain(&mut node);
    assert_eq!(node.take_handed_off(), None, "not before the successor answers");
    let table = TableVersion { stream: 16, version: 7 };
    node.receive(now + 5, 1, PeerMessage::HandOffDone { table, epoch: 33 });
    assert_eq!(node.take_handed_off(), Some(table));
    assert_eq!(node.take_handed_off(), None);
}
