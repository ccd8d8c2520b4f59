//! The rules of docs/protocol.md §1, one test each, on a shard driven by hand.

use super::*;
use crate::token::token;

const C1: ClientId = ClientId(1);
const C2: ClientId = ClientId(2);
const C3: ClientId = ClientId(3);

fn config() -> ShardConfig {
    ShardConfig { hash_seed: 7, ..ShardConfig::default() }
}

/// A shard with one big token range of epoch 1.
fn shard_with(config: ShardConfig) -> Shard {
    let mut shard = Shard::new(config, 0);
    assert_eq!(shard.drain_effects().collect::<Vec<_>>(), vec![Effect::NeedTokens]);
    shard.add_token_range(0, TokenRange { epoch: 1, first: 1, end: 1 << 30 }).unwrap();
    shard
}

fn shard() -> Shard {
    shard_with(config())
}

/// The replies produced since the last call, as (client, reply).
fn replies(shard: &mut Shard) -> Vec<(ClientId, ShardReply)> {
    shard
        .drain_effects()
        .filter_map(|effect| match effect {
            Effect::Reply { client, reply } => Some((client, reply)),
            _ => None,
        })
        .collect()
}

fn acquired(shard: &mut Shard, client: ClientId, key: &[u8]) -> u64 {
    match replies(shard).as_slice() {
        [(to, ShardReply::Acquired { key: got, token })] if *to == client && got.as_bytes() == key => *token,
        other => panic!("expected one grant of {key:?} to {client:?}, got {other:?}"),
    }
}

fn error(op: Op, key: &[u8], code: ErrorCode) -> ShardReply {
    ShardReply::Error { op, key: Key::new(key), code }
}

#[test]
fn a_free_key_is_granted_at_once_and_dropped_on_release() {
    let mut shard = shard();
    shard.acquire(0, C1, b"k", 1000, 0);
    let token = acquired(&mut shard, C1, b"k");
    assert_eq!(shard.holder_token(b"k"), Some(token));
    assert_eq!(shard.stats().keys, 1);
    shard.release(5, C1, b"k", token);
    assert_eq!(replies(&mut shard), vec![(C1, ShardReply::Released { key: Key::new(b"k") })]);
    assert_eq!(shard.holder_token(b"k"), None);
    assert_eq!(shard.stats().keys, 0, "a free key keeps no state");
    assert_eq!(shard.stats().held_keys, 0);
    assert!(shard.timers.is_empty(), "no timer is left behind");
}

#[test]
fn release_hands_the_key_to_waiters_in_fifo_order_with_greater_tokens() {
    let mut shard = shard();
    shard.acquire(0, C1, b"k", 1000, 0);
    let first = acquired(&mut shard, C1, b"k");
    shard.acquire(1, C2, b"k", 1000, 0);
    shard.acquire(2, C3, b"k", 1000, 0);
    assert!(replies(&mut shard).is_empty(), "a held key queues its waiters");
    assert_eq!(shard.queue_len(b"k"), 2);

    shard.release(3, C1, b"k", first);
    let got = replies(&mut shard);
    assert_eq!(got[0], (C1, ShardReply::Released { key: Key::new(b"k") }));
    let ShardReply::Acquired { token: second, .. } = got[1].1 else { panic!("{got:?}") };
    assert_eq!(got[1].0, C2, "the first waiter gets the key");
    assert!(second > first);

    shard.release(4, C2, b"k", second);
    let got = replies(&mut shard);
    let ShardReply::Acquired { token: third, .. } = got[1].1 else { panic!("{got:?}") };
    assert_eq!(got[1].0, C3);
    assert!(third > second);
    assert_eq!(shard.stats().handoffs, 2);
}

#[test]
fn an_expired_lease_hands_the_key_on() {
    let mut shard = shard();
    shard.acquire(0, C1, b"k", 100, 0);
    let first = acquired(&mut shard, C1, b"k");
    shard.acquire(10, C2, b"k", 100, 0);
    shard.advance(99);
    assert!(replies(&mut shard).is_empty(), "the lease has not run out at 99 ms");
    shard.advance(100);
    let second = acquired(&mut shard, C2, b"k");
    assert!(second > first);
    assert_eq!(shard.stats().expiries, 1);
    shard.release(101, C1, b"k", first);
    assert_eq!(replies(&mut shard), vec![(C1, error(Op::Release, b"k", ErrorCode::NotHolder))]);
    // The new holder's lease counts from its grant.
    shard.advance(199);
    assert_eq!(shard.holder_token(b"k"), Some(second));
    shard.advance(200);
    assert_eq!(shard.holder_token(b"k"), None);
    assert_eq!(shard.stats().keys, 0);
}

#[test]
fn a_wait_that_runs_out_answers_t_and_never_grants() {
    let mut shard = shard();
    shard.acquire(0, C1, b"k", 10_000, 0);
    let first = acquired(&mut shard, C1, b"k");
    shard.acquire(0, C2, b"k", 10_000, 500);
    shard.advance(499);
    assert!(replies(&mut shard).is_empty());
    shard.advance(500);
    assert_eq!(replies(&mut shard), vec![(C2, ShardReply::TimedOut { key: Key::new(b"k") })]);
    assert_eq!(shard.queue_len(b"k"), 0);
    shard.release(600, C1, b"k", first);
    assert_eq!(
        replies(&mut shard),
        vec![(C1, ShardReply::Released { key: Key::new(b"k") })],
        "the timed-out waiter is not granted"
    );
    assert_eq!(shard.stats().keys, 0);
    assert_eq!(shard.stats().timeouts, 1);
}

#[test]
fn a_grant_and_a_timeout_in_the_same_batch_answer_once() {
    let mut shard = shard();
    shard.acquire(0, C1, b"k", 100, 0);
    acquired(&mut shard, C1, b"k");
    // The lease ends at 100, the wait at 150: one advance past both grants,
    // because the key was free for the waiter before its wait ran out.
    shard.acquire(0, C2, b"k", 1000, 150);
    shard.advance(1000);
    acquired(&mut shard, C2, b"k");
    // Now the other way round: the wait ends before the lease.
    shard.acquire(1000, C3, b"k", 1000, 50);
    shard.advance(5000);
    let got = replies(&mut shard);
    assert_eq!(got, vec![(C3, ShardReply::TimedOut { key: Key::new(b"k") })]);
    assert_eq!(shard.stats().keys, 0);
}

#[test]
fn wait_zero_waits_without_limit() {
    let mut shard = shard();
    shard.acquire(0, C1, b"k", 86_400_000, 0);
    let first = acquired(&mut shard, C1, b"k");
    shard.acquire(0, C2, b"k", 1000, 0);
    shard.advance(86_399_999);
    assert!(replies(&mut shard).is_empty());
    assert_eq!(shard.queue_len(b"k"), 1);
    shard.release(86_399_999, C1, b"k", first);
    assert_eq!(replies(&mut shard).len(), 2);
}

#[test]
fn extend_moves_the_lease_either_way_and_checks_the_token() {
    let mut shard = shard();
    shard.acquire(0, C1, b"k", 100, 0);
    let token = acquired(&mut shard, C1, b"k");
    shard.extend(50, C1, b"k", token, 1000);
    assert_eq!(replies(&mut shard), vec![(C1, ShardReply::Extended { key: Key::new(b"k"), token })]);
    shard.advance(1049);
    assert_eq!(shard.holder_token(b"k"), Some(token), "extended past its first lease");
    shard.extend(1049, C2, b"k", token, 1);
    replies(&mut shard);
    shard.advance(1050);
    assert_eq!(shard.holder_token(b"k"), None, "a shorter extension ends it sooner");
    shard.extend(1051, C1, b"k", token, 1000);
    assert_eq!(replies(&mut shard), vec![(C1, error(Op::Extend, b"k", ErrorCode::NotHolder))]);
    assert_eq!(shard.stats().extends, 2);
}

#[test]
fn a_stale_or_unknown_token_is_not_holder() {
    let mut shard = shard();
    shard.acquire(0, C1, b"k", 1000, 0);
    let token = acquired(&mut shard, C1, b"k");
    shard.release(0, C1, b"k", token + 1);
    shard.release(0, C1, b"other", token);
    shard.extend(0, C1, b"k", token - 1, 10);
    assert_eq!(
        replies(&mut shard),
        vec![
            (C1, error(Op::Release, b"k", ErrorCode::NotHolder)),
            (C1, error(Op::Release, b"other", ErrorCode::NotHolder)),
            (C1, error(Op::Extend, b"k", ErrorCode::NotHolder)),
        ]
    );
    assert_eq!(shard.holder_token(b"k"), Some(token), "a refused release changes nothing");
    shard.release(0, C2, b"k", token);
    assert_eq!(
        replies(&mut shard),
        vec![(C2, ShardReply::Released { key: Key::new(b"k") })],
        "any connection may release with the right token"
    );
}

#[test]
fn a_closed_connection_leaves_its_queues_but_keeps_its_locks() {
    let mut shard = shard();
    shard.acquire(0, C1, b"held", 1000, 0);
    let held = acquired(&mut shard, C1, b"held");
    shard.acquire(0, C2, b"held", 1000, 0);
    shard.acquire(0, C3, b"held", 1000, 0);
    shard.acquire(0, C2, b"held", 1000, 0);
    shard.acquire(0, C2, b"held", 1000, 10);
    assert_eq!(shard.client_gone(1, C2), 3, "three requests of C2 were dropped");
    assert_eq!(shard.client_gone(1, C2), 0);
    assert_eq!(shard.queue_len(b"held"), 1);
    assert_eq!(shard.client_gone(1, C1), 0, "a holder has no request waiting");
    assert_eq!(shard.holder_token(b"held"), Some(held), "a holder's connection closing does not release");
    shard.advance(20);
    assert!(replies(&mut shard).is_empty(), "nothing is answered to a closed connection");
    shard.release(30, C3, b"held", held);
    let got = replies(&mut shard);
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].0, C3, "the waiter left is next");
    assert!(shard.waiters.iter().filter(|w| w.state != WaiterState::Free).count() == 0);
    assert!(shard.clients.is_empty() && shard.chains.is_empty());
}

#[test]
fn locks_are_not_reentrant() {
    let mut shard = shard();
    shard.acquire(0, C1, b"k", 1000, 0);
    let token = acquired(&mut shard, C1, b"k");
    shard.acquire(0, C1, b"k", 1000, 0);
    assert!(replies(&mut shard).is_empty(), "a second acquire by the holder queues");
    shard.release(0, C1, b"k", token);
    assert_eq!(replies(&mut shard).len(), 2);
}

#[test]
fn limits_answer_their_errors_and_change_nothing() {
    let mut shard =
        shard_with(ShardConfig { keys_max: 2, waiters_per_key_max: 1, waiters_max: 2, lease_ms_max: 5000, ..config() });
    shard.acquire(0, C1, b"a", 1000, 0);
    shard.acquire(0, C1, b"b", 1000, 0);
    shard.acquire(0, C1, b"c", 1000, 0);
    let got = replies(&mut shard);
    assert_eq!(got[2], (C1, error(Op::Acquire, b"c", ErrorCode::TooManyKeys)));
    shard.acquire(0, C2, b"a", 1000, 0);
    shard.acquire(0, C3, b"a", 1000, 0);
    assert_eq!(replies(&mut shard), vec![(C3, error(Op::Acquire, b"a", ErrorCode::TooManyWaiters))]);
    shard.acquire(0, C2, b"b", 1000, 0);
    shard.acquire(0, C3, b"b", 1000, 0);
    assert_eq!(replies(&mut shard), vec![(C3, error(Op::Acquire, b"b", ErrorCode::TooManyWaiters))]);
    shard.acquire(0, C2, b"d", 5001, 0);
    shard.acquire(0, C2, b"d", 0, 0);
    shard.acquire(0, C2, b"d", 10, 86_400_001);
    shard.extend(0, C2, b"a", 1, 5001);
    assert_eq!(
        replies(&mut shard),
        vec![
            (C2, error(Op::Acquire, b"d", ErrorCode::BadLease)),
            (C2, error(Op::Acquire, b"d", ErrorCode::BadLease)),
            (C2, error(Op::Acquire, b"d", ErrorCode::BadWait)),
            (C2, error(Op::Extend, b"a", ErrorCode::BadLease)),
        ]
    );
    assert_eq!(shard.stats().errors_of(ErrorCode::BadLease), 3);
    assert_eq!(shard.stats().errors_of(ErrorCode::TooManyWaiters), 2);
    assert_eq!(shard.stats().keys, 2);
    assert_eq!(shard.stats().waiters, 2);
}

#[test]
fn a_later_answer_on_the_same_key_waits_behind_an_earlier_queued_acquire() {
    let mut shard = shard();
    shard.acquire(0, C1, b"k", 1000, 0);
    let token = acquired(&mut shard, C1, b"k");
    shard.acquire(0, C2, b"k", 1000, 0); // waits without limit
    shard.acquire(0, C2, b"k", 1000, 10); // times out first
    shard.reject(0, C2, Op::Acquire, b"k", ErrorCode::BadLease);
    shard.acquire(0, C2, b"other", 1000, 0); // another key is not held back
    shard.acquire(0, C3, b"k", 1000, 0); // another client is not held back
    let got = replies(&mut shard);
    assert_eq!(got.len(), 1);
    assert!(matches!(&got[0], (c, ShardReply::Acquired { key, .. }) if *c == C2 && key.as_bytes() == b"other"));
    shard.advance(50);
    assert!(replies(&mut shard).is_empty(), "the T waits behind the first A k of C2");
    assert_eq!(shard.queue_len(b"k"), 2, "the timed-out request left the queue");

    shard.release(60, C1, b"k", token);
    let got = replies(&mut shard);
    assert_eq!(got.len(), 4, "{got:?}");
    assert_eq!(got[0].1, ShardReply::Released { key: Key::new(b"k") });
    assert!(matches!(got[1], (c, ShardReply::Acquired { .. }) if c == C2));
    assert_eq!(got[2], (C2, ShardReply::TimedOut { key: Key::new(b"k") }));
    assert_eq!(got[3], (C2, error(Op::Acquire, b"k", ErrorCode::BadLease)));
    assert_eq!(shard.queue_len(b"k"), 1, "C3 still waits");
}

#[test]
fn without_tokens_acquires_wait_for_a_range() {
    let mut shard = Shard::new(config(), 0);
    assert_eq!(shard.drain_effects().collect::<Vec<_>>(), vec![Effect::NeedTokens]);
    shard.acquire(0, C1, b"k", 1000, 0);
    shard.acquire(0, C2, b"j", 1000, 50);
    assert!(replies(&mut shard).is_empty(), "no token, no grant");
    shard.advance(50);
    assert_eq!(replies(&mut shard), vec![(C2, ShardReply::TimedOut { key: Key::new(b"j") })]);
    shard.add_token_range(60, TokenRange { epoch: 3, first: 0, end: 2 }).unwrap();
    let got: Vec<Effect> = shard.drain_effects().collect();
    assert_eq!(
        got,
        vec![
            Effect::Reply { client: C1, reply: ShardReply::Acquired { key: Key::new(b"k"), token: token(3, 0) } },
            Effect::NeedTokens,
        ]
    );
    shard.acquire(60, C1, b"a", 1000, 0);
    shard.acquire(60, C1, b"b", 1000, 0);
    let got = replies(&mut shard);
    assert_eq!(got.len(), 1, "the second acquire waits for the next range");
    shard.add_token_range(61, TokenRange { epoch: 4, first: 0, end: 100 }).unwrap();
    let got = replies(&mut shard);
    assert_eq!(got, vec![(C1, ShardReply::Acquired { key: Key::new(b"b"), token: token(4, 0) })]);
}

#[test]
fn a_new_epoch_keeps_per_key_tokens_increasing() {
    let mut shard = shard();
    shard.acquire(0, C1, b"k", 1000, 0);
    let first = acquired(&mut shard, C1, b"k");
    shard.acquire(0, C2, b"k", 1000, 0);
    shard.add_token_range(0, TokenRange { epoch: 2, first: 0, end: 10 }).unwrap();
    shard.release(0, C1, b"k", first);
    let got = replies(&mut shard);
    let ShardReply::Acquired { token: second, .. } = got[1].1 else { panic!("{got:?}") };
    assert_eq!(second, token(2, 0));
    assert!(second > first);
}

#[test]
fn deltas_follow_every_change_when_enabled() {
    let mut shard = shard_with(ShardConfig { deltas: true, ..config() });
    shard.acquire(0, C1, b"k", 100, 0);
    shard.acquire(0, C2, b"k", 100, 0);
    let first = shard.take_deltas(Vec::new());
    let [Delta::Grant { token: t1, lease_ms: 100, .. }] = first[..] else { panic!("{first:?}") };
    assert!(!shard.has_deltas());
    shard.extend(10, C1, b"k", t1, 500);
    shard.release(20, C1, b"k", t1);
    shard.advance(120);
    let deltas = shard.take_deltas(Vec::new());
    assert_eq!(deltas.len(), 4, "{deltas:?}");
    let k = Key::new(b"k");
    assert_eq!(deltas[0], Delta::Extend { key: k.clone(), token: t1, lease_ms: 500 });
    assert_eq!(deltas[1], Delta::Release { key: k.clone(), token: t1 });
    let Delta::Grant { token: t2, .. } = deltas[2] else { panic!("{deltas:?}") };
    assert_eq!(deltas[3], Delta::Expire { key: k, token: t2 });
}

#[test]
fn long_keys_work_like_short_ones() {
    let mut shard = shard();
    let key = [b'x'; 250];
    shard.acquire(0, C1, &key, 1000, 0);
    let token = acquired(&mut shard, C1, &key);
    shard.release(0, C1, &key, token);
    assert_eq!(replies(&mut shard).len(), 1);
    assert_eq!(shard.stats().keys, 0);
}

#[test]
fn failing_waiters_answers_each_once_in_order_and_keeps_holders() {
    let mut shard = shard();
    shard.acquire(0, C1, b"k", 1000, 0);
    let token = acquired(&mut shard, C1, b"k");
    shard.acquire(0, C2, b"k", 1000, 0);
    shard.acquire(0, C2, b"k", 1000, 5);
    shard.acquire(0, C3, b"k", 1000, 0);
    shard.advance(10);
    assert!(replies(&mut shard).is_empty());
    shard.fail_waiters(10, ErrorCode::ShuttingDown);
    let mut got = replies(&mut shard);
    got.sort_by_key(|(client, _)| *client);
    assert_eq!(
        got,
        vec![
            (C2, error(Op::Acquire, b"k", ErrorCode::ShuttingDown)),
            (C2, ShardReply::TimedOut { key: Key::new(b"k") }),
            (C3, error(Op::Acquire, b"k", ErrorCode::ShuttingDown)),
        ]
    );
    assert_eq!(shard.queue_len(b"k"), 0);
    assert_eq!(shard.holder_token(b"k"), Some(token));
    assert_eq!(shard.stats().waiters, 0);
    shard.release(11, C1, b"k", token);
    assert_eq!(replies(&mut shard).len(), 1);
    assert_eq!(shard.stats().keys, 0);
    assert!(shard.timers.is_empty());
}

#[test]
fn failing_waiters_drops_keys_that_only_waited_for_tokens() {
    let mut shard = Shard::new(config(), 0);
    shard.acquire(0, C1, b"k", 1000, 0);
    shard.fail_waiters(0, ErrorCode::ShuttingDown);
    assert_eq!(replies(&mut shard), vec![(C1, error(Op::Acquire, b"k", ErrorCode::ShuttingDown))]);
    assert_eq!(shard.stats().keys, 0);
}

#[test]
fn stepping_down_moves_waiters_and_drops_every_key() {
    let mut shard = shard();
    shard.acquire(0, C1, b"k", 1000, 0);
    acquired(&mut shard, C1, b"k");
    shard.acquire(1, C1, b"other", 1000, 0);
    acquired(&mut shard, C1, b"other");
    shard.acquire(2, C2, b"k", 1000, 5);
    shard.acquire(3, C2, b"k", 1000, 0);
    shard.step_down(4);
    assert_eq!(
        replies(&mut shard),
        vec![
            (C2, ShardReply::Moved { op: Op::Acquire, key: Key::new(b"k") }),
            (C2, ShardReply::Moved { op: Op::Acquire, key: Key::new(b"k") })
        ]
    );
    let stats = shard.stats();
    assert_eq!((stats.keys, stats.held_keys, stats.waiters), (0, 0, 0));
    assert!(shard.timers.is_empty(), "no lease or wait timer is left");
    assert_eq!(shard.holder_token(b"k"), None);
}

#[test]
fn a_restored_grant_holds_releases_and_expires_like_any_other() {
    let mut shard = Shard::new(config(), 0);
    let old = token(1, 7);
    assert!(shard.restore(100, b"k", old, 50));
    assert!(!shard.restore(100, b"k", old, 50), "a known key is not restored twice");
    assert!(shard.drain_effects().all(|effect| matches!(effect, Effect::NeedTokens)), "no reply, no delta");
    assert_eq!(shard.holder_token(b"k"), Some(old));
    shard.add_token_range(100, TokenRange { epoch: 2, first: 0, end: 1 << 20 }).unwrap();
    shard.acquire(101, C2, b"k", 1000, 0);
    assert!(replies(&mut shard).is_empty(), "a restored key is held");
    shard.advance(149);
    assert!(replies(&mut shard).is_empty(), "its lease counts from the restore");
    shard.advance(150);
    let new = acquired(&mut shard, C2, b"k");
    assert!(new > old, "the next holder's token is greater");

    assert!(shard.restore(200, b"r", token(1, 9), 1000));
    shard.release(201, C1, b"r", token(1, 9));
    assert_eq!(replies(&mut shard), vec![(C1, ShardReply::Released { key: Key::new(b"r") })]);
    assert_eq!(shard.stats().keys, 1);
}

#[test]
fn table_entries_stay_small() {
    // The memory figures in the crate documentation rest on these sizes.
    assert!(size_of::<Lock>() <= 64, "Lock is {} bytes", size_of::<Lock>());
    assert!(size_of::<Waiter>() <= 48, "Waiter is {} bytes", size_of::<Waiter>());
    // Replies move through the effects and between cores on every request:
    // the rare `I` keeps its state boxed rather than make them all larger.
    assert!(size_of::<ShardReply>() <= 48, "ShardReply is {} bytes", size_of::<ShardReply>());
}

#[test]
fn a_freed_key_is_reused_without_growing_the_table() {
    let mut shard = shard();
    for round in 0..1000u64 {
        shard.acquire(round, C1, format!("key-{round}").as_bytes(), 1000, 0);
        let token = acquired(&mut shard, C1, format!("key-{round}").as_bytes());
        shard.release(round, C1, format!("key-{round}").as_bytes(), token);
        replies(&mut shard);
    }
    assert_eq!(shard.locks.len(), 1, "one slot served every key in turn");
    assert_eq!(shard.stats().keys, 0);
}

#[test]
fn the_table_stays_exact_while_its_index_grows() {
    // 30,000 keys take the index through thirteen tables (16 to 65,536
    // buckets), and many of the acquires below come while one is moving
    // its entries, with keys in both of its tables.
    const KEYS: u64 = 30_000;
    let key = |number: u64| format!("grow-{number}").into_bytes();
    let mut shard = shard();
    let mut tokens = Vec::new();
    let mut buckets = shard.index.buckets();
    let mut growths = 0;
    let mut while_growing = 0;
    for number in 0..KEYS {
        shard.acquire(number, C1, &key(number), 1_000_000, 0);
        tokens.push(acquired(&mut shard, C1, &key(number)));
        growths += usize::from(shard.index.buckets() != buckets);
        while_growing += usize::from(shard.index.is_growing());
        buckets = shard.index.buckets();
    }
    assert_eq!(growths, 13, "16 to 65,536 buckets");
    assert!(while_growing > 1_000, "only {while_growing} acquires while the index grew");
    assert_eq!(shard.stats().keys, KEYS);
    for number in 0..KEYS {
        assert_eq!(shard.holder_token(&key(number)), Some(tokens[number as usize]), "key {number}");
    }

    // Release two keys in three; the rest stay exactly as they were.
    for number in (0..KEYS).filter(|number| number % 3 != 0) {
        shard.release(KEYS, C1, &key(number), tokens[number as usize]);
    }
    replies(&mut shard);
    assert_eq!(shard.stats().keys, KEYS / 3);
    assert_eq!(shard.index.len(), (KEYS / 3) as usize);
    for number in 0..KEYS {
        let expected = (number % 3 == 0).then(|| tokens[number as usize]);
        assert_eq!(shard.holder_token(&key(number)), expected, "key {number}");
    }

    // Released keys are free again: a new acquire is granted at once, and
    // a queued one on a kept key still waits.
    shard.acquire(KEYS, C2, &key(1), 1000, 0);
    assert!(acquired(&mut shard, C2, &key(1)) > tokens[1]);
    shard.acquire(KEYS, C2, &key(3), 1000, 0);
    assert!(replies(&mut shard).is_empty(), "a held key queues");
    assert_eq!(shard.queue_len(&key(3)), 1);
    assert_eq!(shard.stats().keys, KEYS / 3 + 1);
}

#[test]
fn effects_read_in_place_are_those_drain_would_take_and_clear_forgets_them() {
    let mut twin = shard();
    let mut shard = shard();
    let long_key = [b'k'; crate::KEY_INLINE_LEN_MAX + 1];
    shard.acquire(0, C1, b"a", 1000, 0);
    shard.acquire(0, C2, &long_key, 1000, 0);
    let read: Vec<Effect> = shard.effects().to_vec();
    assert_eq!(read.len(), 2);
    assert!(
        matches!(&read[1], Effect::Reply { client: C2, reply: ShardReply::Acquired { key, .. } } if key.as_bytes() == long_key),
        "{read:?}"
    );
    // A shard given the same inputs drains the same effects.
    twin.acquire(0, C1, b"a", 1000, 0);
    twin.acquire(0, C2, &long_key, 1000, 0);
    assert_eq!(twin.drain_effects().collect::<Vec<_>>(), read, "drain takes what effects() reads");
    shard.clear_effects();
    assert!(shard.effects().is_empty());
    assert_eq!(shard.drain_effects().count(), 0, "cleared effects are not taken again");
    // Effects made after a clear are read as before.
    shard.acquire(1, C3, b"b", 1000, 0);
    let token = shard.holder_token(b"b").expect("granted");
    assert_eq!(
        shard.effects(),
        [Effect::Reply { client: C3, reply: ShardReply::Acquired { key: Key::new(b"b"), token } }]
    );
}

#[test]
fn inspect_reports_holder_lease_left_and_waiters_and_changes_nothing() {
    let mut shard = shard();
    shard.inspect(0, C1, b"k");
    let state = |token, lease_left_ms, waiters| Box::new(KeyState { token, lease_left_ms, waiters });
    let free = ShardReply::Inspected { key: Key::new(b"k"), state: state(0, 0, 0) };
    assert_eq!(replies(&mut shard), vec![(C1, free.clone())]);
    assert_eq!(shard.stats().keys, 0, "inspecting a free key leaves no state");

    shard.acquire(0, C1, b"k", 1000, 0);
    let token = acquired(&mut shard, C1, b"k");
    shard.acquire(10, C2, b"k", 1000, 0);
    shard.acquire(10, C3, b"k", 1000, 0);
    shard.inspect(250, C1, b"k");
    let held = ShardReply::Inspected { key: Key::new(b"k"), state: state(token, 750, 2) };
    assert_eq!(replies(&mut shard), vec![(C1, held)]);
    assert_eq!(shard.queue_len(b"k"), 2);
    assert_eq!(shard.holder_token(b"k"), Some(token));
}

#[test]
fn grants_are_counted_by_how_and_waits_and_holds_are_timed() {
    let mut shard = shard();
    shard.acquire(0, C1, b"k", 1000, 0);
    let first = acquired(&mut shard, C1, b"k");
    shard.acquire(0, C2, b"k", 50, 0);
    shard.acquire(0, C3, b"k", 1000, 30);
    // C3's wait runs out first (30 ms), then C1 releases at 100 ms: C2 is
    // handed the key after waiting 100 ms, and its lease expires at 150 ms.
    shard.advance(30);
    shard.release(100, C1, b"k", first);
    shard.advance(150);
    let stats = shard.stats();
    assert_eq!((stats.grants, stats.grants_immediate, stats.handoffs, stats.handoffs_after_expiry), (2, 1, 1, 0));
    assert_eq!(stats.wait_granted.count(), 2);
    assert_eq!(stats.wait_granted.sum_ms, 100, "0 ms at once, then 100 ms");
    assert_eq!(stats.wait_timed_out.count(), 1);
    assert_eq!(stats.wait_timed_out.sum_ms, 30);
    assert_eq!((stats.hold_released.count(), stats.hold_released.sum_ms), (1, 100));
    assert_eq!((stats.hold_expired.count(), stats.hold_expired.sum_ms), (1, 50));

    // An expiry that hands the key on counts as a hand-off after expiry.
    shard.acquire(200, C1, b"e", 10, 0);
    shard.acquire(200, C2, b"e", 10, 0);
    shard.advance(210);
    assert_eq!(shard.stats().handoffs_after_expiry, 1);
    let (waits, handoffs) = shard.hot_keys(210);
    assert_eq!(waits, vec![(b"k".to_vec(), 2), (b"e".to_vec(), 1)]);
    assert_eq!(handoffs, vec![(b"e".to_vec(), 1), (b"k".to_vec(), 1)]);
}

const ALPHA: NameId = NameId(1);
const BETA: NameId = NameId(2);

/// The state `I` shows `name`, as (token, lease left, waiters).
fn inspected(shard: &mut Shard, name: NameId, key: &[u8]) -> (u64, u32, u32) {
    shard.inspect_as(shard.now_ms(), C3, name, key);
    match replies(shard).as_slice() {
        [(C3, ShardReply::Inspected { state, .. })] => (state.token, state.lease_left_ms, state.waiters),
        other => panic!("expected one inspect reply, got {other:?}"),
    }
}

#[test]
fn another_name_cannot_release_or_extend_a_grant_even_with_its_token() {
    let mut shard = shard();
    shard.acquire_as(0, C1, ALPHA, b"k", 1000, 0);
    let token = acquired(&mut shard, C1, b"k");
    assert_eq!(shard.holder_name(b"k"), Some(ALPHA));

    // Beta has the right token: refused exactly as with a wrong one.
    shard.release_as(1, C2, BETA, b"k", token);
    assert_eq!(replies(&mut shard), vec![(C2, error(Op::Release, b"k", ErrorCode::NotHolder))]);
    assert!(!shard.release_direct(1, C2, BETA, b"k", token));
    assert_eq!(replies(&mut shard), vec![(C2, error(Op::Release, b"k", ErrorCode::NotHolder))]);
    shard.release_as(1, C2, BETA, b"k", token + 1);
    assert_eq!(replies(&mut shard), vec![(C2, error(Op::Release, b"k", ErrorCode::NotHolder))]);
    shard.extend_as(2, C2, BETA, b"k", token, 60_000);
    assert_eq!(replies(&mut shard), vec![(C2, error(Op::Extend, b"k", ErrorCode::NotHolder))]);
    // Without a name is another name too.
    shard.release(2, C2, b"k", token);
    assert_eq!(replies(&mut shard), vec![(C2, error(Op::Release, b"k", ErrorCode::NotHolder))]);
    assert_eq!(shard.holder_token(b"k"), Some(token), "the grant is untouched");
    assert_eq!(shard.stats().releases + shard.stats().extends, 0);

    // Alpha, from another connection, may: the grant belongs to the name.
    shard.extend_as(3, C3, ALPHA, b"k", token, 2000);
    assert_eq!(replies(&mut shard), vec![(C3, ShardReply::Extended { key: Key::new(b"k"), token })]);
    assert!(shard.release_direct(4, C2, ALPHA, b"k", token));
    assert!(replies(&mut shard).is_empty(), "a direct release is answered by the caller");
    assert_eq!(shard.holder_token(b"k"), None);
}

#[test]
fn inspect_shows_the_token_to_the_holders_name_only() {
    let mut shard = shard();
    assert_eq!(inspected(&mut shard, BETA, b"k"), (0, 0, 0), "a free key");
    shard.acquire_as(0, C1, ALPHA, b"k", 1000, 0);
    let token = acquired(&mut shard, C1, b"k");
    shard.acquire_as(10, C2, BETA, b"k", 1000, 0);
    assert!(replies(&mut shard).is_empty());
    assert_eq!(inspected(&mut shard, ALPHA, b"k"), (token, 990, 1));
    assert_eq!(inspected(&mut shard, BETA, b"k"), (0, 990, 1), "held, lease and waiters; no token");
    assert_eq!(inspected(&mut shard, NameId::NONE, b"k"), (0, 990, 1));
    // On the wire: `-` in place of the token, the same four fields.
    shard.inspect_as(10, C2, BETA, b"k");
    let got = replies(&mut shard);
    let wire = got[0].1.to_wire(None);
    assert_eq!(wire, ringlock_proto::Reply::Inspected { key: b"k", token: None, lease_left_ms: 990, waiters: 1 });
    // A lease at its last millisecond still shows as held to another name.
    shard.inspect_as(999, C2, BETA, b"k");
    let got = replies(&mut shard);
    let ShardReply::Inspected { state, .. } = &got[0].1 else { panic!("{got:?}") };
    assert_eq!((state.token, state.lease_left_ms), (0, 1));
}

#[test]
fn a_waiter_granted_later_holds_under_its_own_name() {
    let mut shard = shard_with(ShardConfig { deltas: true, ..config() });
    shard.acquire_as(0, C1, ALPHA, b"k", 1000, 0);
    let first = acquired(&mut shard, C1, b"k");
    shard.acquire_as(1, C2, BETA, b"k", 1000, 0);
    shard.release_as(2, C1, ALPHA, b"k", first);
    let got = replies(&mut shard);
    let ShardReply::Acquired { token: second, .. } = got[1].1 else { panic!("{got:?}") };
    assert_eq!(shard.holder_name(b"k"), Some(BETA), "the waiter's name, not the last holder's");
    shard.release_as(3, C1, ALPHA, b"k", second);
    assert_eq!(replies(&mut shard), vec![(C1, error(Op::Release, b"k", ErrorCode::NotHolder))]);
    assert_eq!(inspected(&mut shard, BETA, b"k").0, second);
    assert_eq!(inspected(&mut shard, ALPHA, b"k").0, 0);

    // And after an expiry as after a release; the deltas carry each name.
    shard.acquire_as(4, C1, ALPHA, b"k", 1000, 0);
    shard.advance(1003);
    let third = acquired(&mut shard, C1, b"k");
    assert_eq!(shard.holder_name(b"k"), Some(ALPHA));
    let names: Vec<(u64, NameId)> = shard
        .take_deltas(Vec::new())
        .into_iter()
        .filter_map(|delta| match delta {
            Delta::Grant { token, name, .. } => Some((token, name)),
            _ => None,
        })
        .collect();
    assert_eq!(names, vec![(first, ALPHA), (second, BETA), (third, ALPHA)]);
}

#[test]
fn a_restored_grant_keeps_its_name() {
    let mut shard = shard();
    let old = token(1, 7);
    assert!(shard.restore_as(100, b"k", old, 1000, ALPHA));
    shard.release_as(101, C2, BETA, b"k", old);
    assert_eq!(replies(&mut shard), vec![(C2, error(Op::Release, b"k", ErrorCode::NotHolder))]);
    assert_eq!(inspected(&mut shard, BETA, b"k").0, 0);
    assert_eq!(inspected(&mut shard, ALPHA, b"k").0, old);
    shard.release_as(102, C1, ALPHA, b"k", old);
    assert_eq!(replies(&mut shard), vec![(C1, ShardReply::Released { key: Key::new(b"k") })]);
}

#[test]
fn without_names_every_connection_may_release_with_the_token_as_before() {
    let mut shard = shard();
    shard.acquire(0, C1, b"k", 1000, 0);
    let token = acquired(&mut shard, C1, b"k");
    assert_eq!(shard.holder_name(b"k"), Some(NameId::NONE));
    assert_eq!(inspected(&mut shard, NameId::NONE, b"k"), (token, 1000, 0), "the token is shown to all");
    shard.extend(1, C2, b"k", token, 500);
    assert_eq!(replies(&mut shard), vec![(C2, ShardReply::Extended { key: Key::new(b"k"), token })]);
    shard.release(2, C3, b"k", token);
    assert_eq!(replies(&mut shard), vec![(C3, ShardReply::Released { key: Key::new(b"k") })]);
}
