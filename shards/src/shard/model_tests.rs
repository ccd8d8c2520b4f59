//! Model-based test: random operations and time steps on a shard and on a
//! naive reference model, compared after every step.
//!
//! The model keeps, per key, the holder and a plain `Vec` queue, and replays
//! due deadlines in time order. After each step the test checks that both
//! answered the same requests the same way (grant, timeout, error code), that
//! each request is answered exactly once, that a key has at most one holder,
//! that tokens strictly increase per key and never repeat, that grants follow
//! FIFO order, and that free keys leave no state in the shard.
//!
//! Clients come under two names (clients 0 and 2 are one, 1 and 3 the
//! other): a grant records its taker's name, a release or an extend from the
//! other name is refused even with the right token, and `I` shows the token
//! to the holder's name only. Each name may hold or queue on at most
//! `NAME_KEYS_MAX` keys at once, and each client (a connection) at most
//! `CLIENT_KEYS_MAX`: the grants it took that are still held, and its
//! queued acquires.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use proptest::prelude::*;

use super::*;
use crate::token::TOKEN_RANGES_QUEUED_MAX;

const KEYS: [&[u8]; 4] = [b"a", b"b", b"c", b"a-much-longer-key-that-lives-on-the-heap"];
const CLIENTS: u64 = 4;
const LEASE_MS_MAX: u64 = 400;
/// Keys held plus acquires queued by one name.
const NAME_KEYS_MAX: u32 = 3;
/// Keys held plus acquires queued through one client.
const CLIENT_KEYS_MAX: u32 = 2;

/// The authenticated name of a client: two clients share each name.
fn name_of(client: u64) -> NameId {
    NameId((client % 2 + 1) as u16)
}

fn config() -> ShardConfig {
    ShardConfig {
        keys_max: 3,
        waiters_per_key_max: 3,
        waiters_max: 6,
        name_keys_max: NAME_KEYS_MAX,
        client_keys_max: CLIENT_KEYS_MAX,
        lease_ms_max: LEASE_MS_MAX,
        deltas: false,
        tokens_low_water: 4,
        hash_seed: 11,
    }
}

#[derive(Clone, Debug)]
enum Step {
    /// `direct`: through [`Shard::acquire_direct`], as the server's request path.
    Acquire {
        client: u64,
        key: usize,
        lease_ms: u64,
        wait_ms: u64,
        direct: bool,
    },
    /// Release with the current holder's token (if `current`) or an old one;
    /// `direct`: through [`Shard::release_direct`].
    Release {
        client: u64,
        key: usize,
        current: bool,
        direct: bool,
    },
    Extend {
        client: u64,
        key: usize,
        current: bool,
        lease_ms: u64,
    },
    Reject {
        client: u64,
        key: usize,
    },
    Gone {
        client: u64,
    },
    Advance {
        ms: u64,
    },
    Tokens {
        count: u64,
        new_epoch: bool,
    },
}

fn step() -> impl Strategy<Value = Step> {
    let client = 0..CLIENTS;
    let key = 0..KEYS.len();
    prop_oneof![
        6 => (client.clone(), key.clone(), prop_oneof![Just(0u64), 1..=LEASE_MS_MAX + 1], prop_oneof![Just(0u64), 1..300u64], any::<bool>())
            .prop_map(|(client, key, lease_ms, wait_ms, direct)| Step::Acquire { client, key, lease_ms, wait_ms, direct }),
        4 => (client.clone(), key.clone(), proptest::bool::weighted(0.8), any::<bool>())
            .prop_map(|(client, key, current, direct)| Step::Release { client, key, current, direct }),
        2 => (client.clone(), key.clone(), any::<bool>(), 1..=LEASE_MS_MAX)
            .prop_map(|(client, key, current, lease_ms)| Step::Extend { client, key, current, lease_ms }),
        1 => (client.clone(), key.clone()).prop_map(|(client, key)| Step::Reject { client, key }),
        1 => client.prop_map(|client| Step::Gone { client }),
        5 => prop_oneof![Just(0u64), 1..20u64, 20..500u64].prop_map(|ms| Step::Advance { ms }),
        1 => (1..6u64, proptest::bool::weighted(0.2)).prop_map(|(count, new_epoch)| Step::Tokens { count, new_epoch }),
    ]
}

/// How a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Granted,
    TimedOut,
    Released,
    Extended,
    Error(ErrorCode),
}

#[derive(Clone, Debug)]
struct Queued {
    id: u64,
    client: u64,
    lease_ms: u64,
    wait_deadline: Option<Due>,
}

#[derive(Debug, Default)]
struct ModelKey {
    holder: Option<(u64, Due)>, // (token, lease deadline)
    /// The name of the holder's grant.
    name: NameId,
    /// The client the holder's grant went to.
    holder_client: u64,
    queue: Vec<Queued>,
    /// Answers held behind an earlier queued acquire of the same client.
    held: Vec<(u64, u64, Outcome)>, // (client, id, outcome)
}

/// A deadline and the order it was set in: the shard's wheel fires equal
/// deadlines in the order they were scheduled, and so does the model.
type Due = (u64, u64);

/// The naive reference.
struct Model {
    now: u64,
    scheduled: u64,
    keys: BTreeMap<usize, ModelKey>,
    /// Tokens left in each range the model holds, like the shard's supply.
    ranges: VecDeque<u64>,
    /// Keys waiting for tokens, in the order they ran short.
    starved: VecDeque<usize>,
}

impl Model {
    fn due(&mut self, deadline: u64) -> Due {
        self.scheduled += 1;
        (deadline, self.scheduled)
    }

    fn take_token(&mut self) -> bool {
        let Some(front) = self.ranges.front_mut() else { return false };
        *front -= 1;
        if *front == 0 {
            self.ranges.pop_front();
        }
        true
    }

    fn tokens_left(&self) -> u64 {
        self.ranges.iter().sum()
    }

    fn waiters(&self) -> usize {
        self.keys.values().map(|k| k.queue.len()).sum()
    }

    /// Keys held by grants to `client` plus acquires it queued.
    fn client_use(&self, client: u64) -> usize {
        let held = self.keys.values().filter(|k| k.holder.is_some() && k.holder_client == client).count();
        let queued = self.keys.values().flat_map(|k| &k.queue).filter(|q| q.client == client).count();
        held + queued
    }

    /// Keys held plus acquires queued by `name`.
    fn name_use(&self, name: NameId) -> usize {
        let held = self.keys.values().filter(|k| k.holder.is_some() && k.name == name).count();
        let queued = self.keys.values().flat_map(|k| &k.queue).filter(|q| name_of(q.client) == name).count();
        held + queued
    }

    fn answer(&mut self, out: &mut Vec<(u64, Outcome)>, key: usize, client: u64, id: u64, outcome: Outcome) {
        // The answer is held if an earlier request of the client on this key
        // is still queued.
        let entry = self.keys.entry(key).or_default();
        if entry.queue.iter().any(|q| q.client == client && q.id < id) {
            entry.held.push((client, id, outcome));
            return;
        }
        out.push((id, outcome));
        self.flush_held(out, key, client);
    }

    fn flush_held(&mut self, out: &mut Vec<(u64, Outcome)>, key: usize, client: u64) {
        let Some(entry) = self.keys.get_mut(&key) else { return };
        let first_queued = entry.queue.iter().filter(|q| q.client == client).map(|q| q.id).min();
        let mut release = Vec::new();
        entry.held.retain(|&(c, id, outcome)| {
            let free = c == client && first_queued.is_none_or(|first| id < first);
            if free {
                release.push((id, outcome));
            }
            !free
        });
        release.sort_by_key(|&(id, _)| id);
        out.extend(release);
    }

    /// Hands `key` to its first waiter, or drops it.
    fn hand_on(&mut self, out: &mut Vec<(u64, Outcome)>, key: usize, grants: &mut Vec<(usize, u64)>) {
        let entry = self.keys.get(&key).expect("key");
        debug_assert!(entry.holder.is_none());
        if entry.queue.is_empty() {
            if entry.held.is_empty() {
                self.drop_key(key);
            }
            return;
        }
        if !self.take_token() {
            self.mark_starved(key);
            return;
        }
        let due = self.due(self.now + self.keys[&key].queue[0].lease_ms);
        let entry = self.keys.get_mut(&key).expect("key");
        let first = entry.queue.remove(0);
        entry.holder = Some((0, due));
        entry.name = name_of(first.client);
        entry.holder_client = first.client;
        grants.push((key, first.id));
        out.push((first.id, Outcome::Granted));
        self.flush_held(out, key, first.client);
    }

    fn remove_if_free(&mut self, key: usize) {
        if let Some(entry) = self.keys.get(&key)
            && entry.holder.is_none()
            && entry.queue.is_empty()
            && entry.held.is_empty()
        {
            self.drop_key(key);
        }
    }

    fn drop_key(&mut self, key: usize) {
        self.keys.remove(&key);
        self.starved.retain(|&other| other != key);
    }

    fn mark_starved(&mut self, key: usize) {
        if !self.starved.contains(&key) {
            self.starved.push_back(key);
        }
    }

    /// Runs every deadline due by `now` in time order. Lease deadlines and
    /// wait deadlines never tie (the test gives them different parities).
    fn advance(&mut self, now: u64, out: &mut Vec<(u64, Outcome)>, grants: &mut Vec<(usize, u64)>) {
        self.now = now;
        loop {
            let mut due: Option<(Due, usize, Option<u64>)> = None; // (deadline, key, waiter id)
            for (&key, entry) in &self.keys {
                if let Some((_, deadline)) = entry.holder
                    && deadline.0 <= now
                    && due.is_none_or(|(d, ..)| deadline < d)
                {
                    due = Some((deadline, key, None));
                }
                for q in &entry.queue {
                    if let Some(deadline) = q.wait_deadline
                        && deadline.0 <= now
                        && due.is_none_or(|(d, ..)| deadline < d)
                    {
                        due = Some((deadline, key, Some(q.id)));
                    }
                }
            }
            let Some((_, key, waiter)) = due else { return };
            match waiter {
                None => {
                    self.keys.get_mut(&key).unwrap().holder = None;
                    self.hand_on(out, key, grants);
                }
                Some(id) => {
                    let entry = self.keys.get_mut(&key).unwrap();
                    let position = entry.queue.iter().position(|q| q.id == id).unwrap();
                    let gone = entry.queue.remove(position);
                    self.answer(out, key, gone.client, id, Outcome::TimedOut);
                    self.remove_if_free(key);
                }
            }
        }
    }
}

/// Requests sent to the shard and not answered yet, per (client, op, key).
#[derive(Default)]
struct Pending {
    by_route: HashMap<(u64, Op, Vec<u8>), VecDeque<u64>>,
}

impl Pending {
    fn push(&mut self, client: u64, op: Op, key: &[u8], id: u64) {
        self.by_route.entry((client, op, key.to_vec())).or_default().push_back(id);
    }

    /// The request a reply answers: the oldest one of its (client, op, key).
    fn pop(&mut self, client: u64, op: Op, key: &[u8]) -> u64 {
        let queue = self.by_route.get_mut(&(client, op, key.to_vec()));
        let id = queue.and_then(|q| q.pop_front());
        id.unwrap_or_else(|| panic!("a reply nobody asked for: client {client} {op} {key:?}"))
    }

    fn forget_client(&mut self, client: u64) {
        self.by_route.retain(|(c, op, _), _| *c != client || *op != Op::Acquire);
    }
}

fn run(steps: Vec<Step>) {
    let mut shard = Shard::new(config(), 0);
    let mut model =
        Model { now: 0, scheduled: 0, keys: BTreeMap::new(), ranges: VecDeque::new(), starved: VecDeque::new() };
    let mut pending = Pending::default();
    let mut next_id = 0u64;
    let mut epoch = 1u64;
    let mut next_sequence = 0u64;
    // Every token seen per key, to check they increase and never repeat.
    let mut key_tokens: HashMap<usize, u64> = HashMap::new();
    let mut all_tokens: HashSet<u64> = HashSet::new();
    // Current and earlier tokens per key, for releases with stale tokens.
    let mut old_tokens: HashMap<usize, u64> = HashMap::new();
    let mut answered: HashSet<u64> = HashSet::new();
    // Queued requests of closed connections: never answered, out of every queue.
    let mut cancelled: HashSet<u64> = HashSet::new();
    let mut enqueue_order: HashMap<usize, Vec<u64>> = HashMap::new();

    for (index, step) in steps.into_iter().enumerate() {
        let mut expected: Vec<(u64, Outcome)> = Vec::new();
        let mut model_grants: Vec<(usize, u64)> = Vec::new();
        // The reply a direct call left to its caller, which writes it before
        // the call's effects.
        let mut direct_reply: Option<Effect> = None;
        let now = model.now;
        match step {
            Step::Acquire { client, key, lease_ms, wait_ms, direct } => {
                let id = next_id;
                next_id += 1;
                pending.push(client, Op::Acquire, KEYS[key], id);
                if direct {
                    direct_reply = shard
                        .acquire_direct(now, ClientId(client), name_of(client), KEYS[key], lease_ms, wait_ms)
                        .map(|token| Effect::Reply {
                            client: ClientId(client),
                            reply: ShardReply::Acquired { key: Key::new(KEYS[key]), token },
                        });
                } else {
                    shard.acquire_as(now, ClientId(client), name_of(client), KEYS[key], lease_ms, wait_ms);
                }
                let exists = model.keys.get(&key).is_some_and(|k| k.holder.is_some() || !k.queue.is_empty());
                let over_quota = model.name_use(name_of(client)) >= NAME_KEYS_MAX as usize
                    || model.client_use(client) >= CLIENT_KEYS_MAX as usize;
                if lease_ms == 0 || lease_ms > LEASE_MS_MAX {
                    model.answer(&mut expected, key, client, id, Outcome::Error(ErrorCode::BadLease));
                    model.remove_if_free(key);
                } else if exists {
                    let entry = &model.keys[&key];
                    if entry.queue.len() >= 3 || model.waiters() >= 6 || over_quota {
                        model.answer(&mut expected, key, client, id, Outcome::Error(ErrorCode::TooManyWaiters));
                    } else {
                        let wait_deadline = (wait_ms > 0).then(|| model.due(now + wait_ms));
                        model.keys.get_mut(&key).unwrap().queue.push(Queued { id, client, lease_ms, wait_deadline });
                        enqueue_order.entry(key).or_default().push(id);
                    }
                } else if model.keys.values().filter(|k| k.holder.is_some() || !k.queue.is_empty()).count() >= 3
                    || over_quota
                {
                    expected.push((id, Outcome::Error(ErrorCode::TooManyKeys)));
                } else if model.take_token() {
                    let due = model.due(now + lease_ms);
                    let entry = model.keys.entry(key).or_default();
                    entry.holder = Some((0, due));
                    entry.name = name_of(client);
                    entry.holder_client = client;
                    model_grants.push((key, id));
                    expected.push((id, Outcome::Granted));
                } else if model.waiters() >= 6 {
                    expected.push((id, Outcome::Error(ErrorCode::TooManyWaiters)));
                } else {
                    let wait_deadline = (wait_ms > 0).then(|| model.due(now + wait_ms));
                    model.keys.entry(key).or_default().queue.push(Queued { id, client, lease_ms, wait_deadline });
                    enqueue_order.entry(key).or_default().push(id);
                    model.mark_starved(key);
                }
            }
            Step::Release { client, key, current, .. } | Step::Extend { client, key, current, .. } => {
                let id = next_id;
                next_id += 1;
                let holder = model.keys.get(&key).and_then(|k| k.holder);
                let token = match (current, holder) {
                    (true, Some((token, _))) => token,
                    _ => old_tokens.get(&key).copied().unwrap_or(1),
                };
                let same_name = model.keys.get(&key).is_some_and(|k| k.name == name_of(client));
                let holds = holder.is_some_and(|(t, _)| t == token) && same_name;
                if let Step::Extend { lease_ms, .. } = step {
                    pending.push(client, Op::Extend, KEYS[key], id);
                    shard.extend_as(now, ClientId(client), name_of(client), KEYS[key], token, lease_ms);
                    if holds && lease_ms > 0 {
                        let due = model.due(now + lease_ms);
                        model.keys.get_mut(&key).unwrap().holder = Some((token, due));
                        expected.push((id, Outcome::Extended));
                    } else if lease_ms == 0 {
                        expected.push((id, Outcome::Error(ErrorCode::BadLease)));
                    } else {
                        expected.push((id, Outcome::Error(ErrorCode::NotHolder)));
                    }
                } else {
                    pending.push(client, Op::Release, KEYS[key], id);
                    if let Step::Release { direct: true, .. } = step {
                        if shard.release_direct(now, ClientId(client), name_of(client), KEYS[key], token) {
                            direct_reply = Some(Effect::Reply {
                                client: ClientId(client),
                                reply: ShardReply::Released { key: Key::new(KEYS[key]) },
                            });
                        }
                    } else {
                        shard.release_as(now, ClientId(client), name_of(client), KEYS[key], token);
                    }
                    if holds {
                        expected.push((id, Outcome::Released));
                        model.keys.get_mut(&key).unwrap().holder = None;
                        model.hand_on(&mut expected, key, &mut model_grants);
                    } else {
                        expected.push((id, Outcome::Error(ErrorCode::NotHolder)));
                    }
                }
            }
            Step::Reject { client, key } => {
                let id = next_id;
                next_id += 1;
                pending.push(client, Op::Acquire, KEYS[key], id);
                shard.reject(now, ClientId(client), Op::Acquire, KEYS[key], ErrorCode::BadWait);
                model.answer(&mut expected, key, client, id, Outcome::Error(ErrorCode::BadWait));
                model.remove_if_free(key);
            }
            Step::Gone { client } => {
                let removed = shard.client_gone(now, ClientId(client));
                let waiting: usize = model
                    .keys
                    .values()
                    .map(|k| {
                        k.queue.iter().filter(|q| q.client == client).count()
                            + k.held.iter().filter(|h| h.0 == client).count()
                    })
                    .sum();
                assert_eq!(removed as usize, waiting, "step {index}: requests dropped for a closed client");
                pending.forget_client(client);
                for entry in model.keys.values_mut() {
                    cancelled.extend(entry.queue.iter().filter(|q| q.client == client).map(|q| q.id));
                    entry.queue.retain(|q| q.client != client);
                    cancelled.extend(entry.held.iter().filter(|&&(c, ..)| c == client).map(|&(_, id, _)| id));
                    entry.held.retain(|&(c, ..)| c != client);
                }
                let keys: Vec<usize> = model.keys.keys().copied().collect();
                for key in keys {
                    model.remove_if_free(key);
                }
                model.starved.retain(|key| model.keys.contains_key(key));
            }
            Step::Advance { ms } => {
                shard.advance(now + ms);
                model.advance(now + ms, &mut expected, &mut model_grants);
            }
            Step::Tokens { count, new_epoch } => {
                if new_epoch {
                    epoch += 1;
                    next_sequence = 0;
                    model.ranges.clear();
                }
                let range = TokenRange { epoch, first: next_sequence, end: next_sequence + count };
                let accepted = shard.add_token_range(now, range);
                if model.ranges.len() < TOKEN_RANGES_QUEUED_MAX {
                    assert_eq!(accepted, Ok(()), "step {index}");
                    next_sequence += count;
                    model.ranges.push_back(count);
                    let starved = std::mem::take(&mut model.starved);
                    for key in starved {
                        let entry = model.keys.get(&key);
                        if entry.is_some_and(|k| k.holder.is_none() && !k.queue.is_empty()) {
                            model.hand_on(&mut expected, key, &mut model_grants);
                        }
                    }
                } else {
                    assert_eq!(accepted, Err(TokenRangeError::TooMany), "step {index}");
                }
            }
        }

        // What the shard answered, mapped to request ids by (client, op, key).
        let mut got: Vec<(u64, Outcome)> = Vec::new();
        let mut shard_grants: Vec<(usize, u64, u64)> = Vec::new(); // (key, id, token)
        for effect in direct_reply.into_iter().chain(shard.drain_effects()) {
            let Effect::Reply { client, reply } = effect else { continue };
            let key_bytes = reply.key().as_bytes().to_vec();
            let key = KEYS.iter().position(|k| *k == key_bytes.as_slice()).unwrap();
            let (op, outcome) = match reply {
                ShardReply::Acquired { token, .. } => {
                    shard_grants.push((key, u64::MAX, token));
                    (Op::Acquire, Outcome::Granted)
                }
                ShardReply::TimedOut { .. } => (Op::Acquire, Outcome::TimedOut),
                ShardReply::Released { .. } => (Op::Release, Outcome::Released),
                ShardReply::Extended { .. } => (Op::Extend, Outcome::Extended),
                ShardReply::Error { op, code, .. } => (op, Outcome::Error(code)),
                ShardReply::Moved { .. } => panic!("step {index}: the model never steps down"),
                ShardReply::Inspected { .. } => panic!("step {index}: the model sends no inspect"),
            };
            let id = pending.pop(client.0, op, &key_bytes);
            if let Some(last) = shard_grants.last_mut()
                && last.1 == u64::MAX
            {
                last.1 = id;
            }
            assert!(answered.insert(id), "step {index}: request {id} answered twice");
            got.push((id, outcome));
        }
        let mut got_sorted = got.clone();
        got_sorted.sort_by_key(|&(id, _)| id);
        let mut expected_sorted = expected.clone();
        expected_sorted.sort_by_key(|&(id, _)| id);
        assert_eq!(got_sorted, expected_sorted, "step {index}: answers differ (shard {got:?}, model {expected:?})");

        // Grants: same requests, FIFO per key, tokens increasing per key and unique.
        let mut model_granted: Vec<u64> = model_grants.iter().map(|&(_, id)| id).collect();
        model_granted.sort();
        let mut shard_granted: Vec<u64> = shard_grants.iter().map(|&(_, id, _)| id).collect();
        shard_granted.sort();
        assert_eq!(shard_granted, model_granted, "step {index}: different grants");
        for &(key, id, token) in &shard_grants {
            let last = key_tokens.entry(key).or_insert(0);
            assert!(token > *last, "step {index}: token {token} not above {last} on key {key}");
            *last = token;
            assert!(all_tokens.insert(token), "step {index}: token {token} issued twice");
            if let Some(order) = enqueue_order.get_mut(&key)
                && let Some(position) = order.iter().position(|&queued| queued == id)
            {
                // Everything queued before a granted waiter was answered already.
                for earlier in &order[..position] {
                    assert!(
                        answered.contains(earlier) || cancelled.contains(earlier),
                        "step {index}: {id} granted before earlier waiter {earlier}"
                    );
                }
                order.remove(position);
            }
            // The model adopts the shard's token, so that later releases use it;
            // the one it replaces becomes the key's stale token.
            let entry = model.keys.get_mut(&key).unwrap();
            let (_, deadline) = entry.holder.unwrap();
            entry.holder = Some((token, deadline));
            old_tokens.insert(key, token);
        }

        // State: one holder per key at most (by construction), the same holder
        // token and queue as the model, nothing kept for free keys.
        for (key, bytes) in KEYS.iter().enumerate() {
            let model_key = model.keys.get(&key);
            let holder = model_key.and_then(|k| k.holder.map(|(token, _)| token));
            assert_eq!(shard.holder_token(bytes), holder, "step {index}: holder of key {key}");
            let queued = model_key.map_or(0, |k| k.queue.len() as u32);
            assert_eq!(shard.queue_len(bytes), queued, "step {index}: queue of key {key}");
            let name = model_key.filter(|k| k.holder.is_some()).map(|k| k.name);
            assert_eq!(shard.holder_name(bytes), name, "step {index}: name of the holder of key {key}");
            // `I` from each name: the token for the holder's name only; the
            // lease left and the queue for both. It changes nothing.
            for asker in [NameId(1), NameId(2)] {
                shard.inspect_as(model.now, ClientId(99), asker, bytes);
                let effects: Vec<Effect> = shard.drain_effects().collect();
                let [Effect::Reply { reply: ShardReply::Inspected { state, .. }, .. }] = &effects[..] else {
                    panic!("step {index}: inspect answered {effects:?}")
                };
                let shown = (name == Some(asker)).then_some(holder).flatten().unwrap_or(0);
                assert_eq!(state.token, shown, "step {index}: token shown to {asker:?} for key {key}");
                assert_eq!(state.lease_left_ms > 0, holder.is_some(), "step {index}: held or free, key {key}");
                assert_eq!(state.waiters, queued, "step {index}: waiters shown, key {key}");
            }
        }
        let live_keys = model.keys.values().filter(|k| k.holder.is_some() || !k.queue.is_empty()).count();
        assert_eq!(shard.stats().keys, live_keys as u64, "step {index}: keys with state");
        assert_eq!(shard.stats().waiters, model.waiters() as u64, "step {index}: waiters");
        assert_eq!(shard.stats().held_keys, model.keys.values().filter(|k| k.holder.is_some()).count() as u64);
        for name in [name_of(0), name_of(1)] {
            assert_eq!(shard.name_keys(name) as usize, model.name_use(name), "step {index}: keys of name {name:?}");
        }
        for client in 0..CLIENTS {
            assert_eq!(
                shard.client_keys(ClientId(client)) as usize,
                model.client_use(client),
                "step {index}: keys of client {client}"
            );
        }
        assert_eq!(shard.tokens_remaining(), model.tokens_left(), "step {index}: tokens left");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn shard_matches_the_reference_model(steps in proptest::collection::vec(step(), 1..120)) {
        run(steps);
    }
}

#[test]
fn a_long_fixed_schedule_matches_the_model() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    // One long deterministic run reaches states the short ones rarely do.
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[42; 32]);
    let mut runner = TestRunner::new_with_rng(Config::default(), rng);
    let steps = proptest::collection::vec(step(), 5000).new_tree(&mut runner).unwrap().current();
    run(steps);
}
