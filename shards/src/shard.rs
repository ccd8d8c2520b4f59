//! One lock shard: the lock table, its FIFO queues, leases, wait limits and
//! fencing tokens, as a state machine with no I/O and no clock.
//!
//! Every input takes `now_ms`; every output is an [`Effect`] queued in the
//! shard until the caller takes it with [`Shard::drain_effects`] (or reads
//! it with [`Shard::effects`] and then calls [`Shard::clear_effects`]).
//!
//! # Storage
//! Locks and waiters live in two slabs addressed by `u32` slot numbers; the
//! table index (`LockIndex`) maps a key's hash to its lock's slot, so a held
//! lock costs one slab entry, one timer and a few bytes of index, with no heap
//! allocation of its own for keys up to [`crate::KEY_INLINE_LEN_MAX`] bytes.
//! The index grows in small steps, a few hundred requests apart, so that a
//! shard filling up with millions of keys never stops its core for long.
//! A key that is neither held nor waited on has no slot: its state is gone.
//!
//! # Reply order
//! docs/protocol.md §3 asks that replies for one (op, key) on one connection keep request
//! order. Grants are FIFO, so two queued `A k` from one connection are granted
//! in order; but a later one may time out first, or a later `A k` may be
//! refused while an earlier one is queued. Such an answer is *held*: its waiter
//! node leaves the key's queue (it can no longer be granted) but stays in its
//! **chain**, the list of one connection's requests on one key, and is sent
//! when every request ahead of it in the chain has been answered.

use ahash::RandomState;
use hashbrown::HashMap;
use ringlock_proto::{ErrorCode, Op};

use crate::effect::{ClientId, Delta, Effect, KeyState, NameId, ShardReply};
use crate::histogram::Histogram;
use crate::hot_keys::{HotKeyCounts, HotKeys};
use crate::key::Key;
use crate::limits::{LEASE_MS_LIMIT, ShardConfig};
use crate::lock_index::{KeyHash, LockIndex};
use crate::timer_wheel::{TimerHandle, TimerWheel};
use crate::token::{TokenRange, TokenRangeError, TokenSupply};

/// "No slot" in the intrusive lists.
const NONE: u32 = u32::MAX;
/// The holder of a key no connection of this node was granted (restored
/// from the active this node took over from), or of a free slot.
const NO_CLIENT: ClientId = ClientId(u64::MAX);

/// Timer values: a lock slot for a lease, or a waiter slot with this bit set.
const TIMER_WAIT_BIT: u32 = 1 << 31;

/// One key that is held or waited on.
#[derive(Debug)]
struct Lock {
    key: Key,
    /// The token of the current grant, or of the last one while the key waits
    /// for tokens; 0 before the first grant.
    token: u64,
    /// The lease timer; `Some` exactly while the key is held.
    lease_timer: Option<TimerHandle>,
    /// FIFO queue of live waiters.
    queue_head: u32,
    queue_tail: u32,
    queue_len: u32,
    /// Listed in `Shard::starved`.
    starved: bool,
    /// When the current grant was made, in the shard's milliseconds modulo
    /// 2^32, for the hold-time histograms: 4 bytes keep the entry at 64, and
    /// only a hold longer than 49 days would be measured short.
    granted_ms: u32,
    /// The name that took the current grant (see [`NameId`]): 2 bytes, so
    /// that the entry stays at 64.
    name: NameId,
}

impl Lock {
    fn is_held(&self) -> bool {
        self.lease_timer.is_some()
    }

    /// Whether the key is held under `token` by `name`: what a release or
    /// an extend must show. Another name with the right token is refused
    /// alike, so that the refusal does not tell it the token was right.
    #[inline(always)]
    fn is_held_by(&self, token: u64, name: NameId) -> bool {
        self.is_held() && self.token == token && self.name == name
    }
}

/// What a waiter node stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WaiterState {
    /// The slot is on the free list.
    Free,
    /// Queued for the key.
    Live,
    /// Queued, and its wait timer fired in the batch being processed.
    LiveWaitExpired,
    /// Answered `T`, sent once the requests ahead of it are answered.
    HeldTimeout,
    /// Answered with this error, sent once the requests ahead of it are answered.
    HeldError(ErrorCode),
}

/// One acquire request that has not been answered yet.
#[derive(Debug)]
struct Waiter {
    client: ClientId,
    wait_timer: Option<TimerHandle>,
    lock: u32,
    lease_ms: u32,
    queue_prev: u32,
    queue_next: u32,
    client_prev: u32,
    client_next: u32,
    /// Next node of the same (client, key) chain.
    chain_next: u32,
    /// When the request was queued, in the shard's milliseconds modulo 2^32,
    /// for the wait-time histograms (waits are at most a day).
    enqueued_ms: u32,
    state: WaiterState,
    /// The name the grant will carry: the waiter's own.
    name: NameId,
}

/// A doubly linked list's ends.
#[derive(Clone, Copy, Debug)]
struct Ends {
    head: u32,
    tail: u32,
}

/// Counters and gauges of one shard.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardStats {
    /// Keys granted (at once, by hand-off, or after waiting for tokens).
    pub grants: u64,
    /// Grants released by their holder.
    pub releases: u64,
    /// Leases extended.
    pub extends: u64,
    /// Leases that ran out.
    pub expiries: u64,
    /// Waits that ran out (answered `T`).
    pub timeouts: u64,
    /// Grants that went straight to a waiter after a release or an expiry.
    pub handoffs: u64,
    /// Error replies, indexed like [`ErrorCode::ALL`].
    pub errors: [u64; ErrorCode::ALL.len()],
    /// Keys held now.
    pub held_keys: u64,
    /// Requests queued now.
    pub waiters: u64,
    /// Keys with any state now (held or waited on).
    pub keys: u64,
    /// Grants made at once to an acquire of a free key.
    pub grants_immediate: u64,
    /// Hand-offs (counted in `handoffs`) that followed a lease expiry
    /// rather than a release.
    pub handoffs_after_expiry: u64,
    /// How long granted acquires waited (0 for those granted at once).
    pub wait_granted: Histogram,
    /// How long acquires answered `T` waited.
    pub wait_timed_out: Histogram,
    /// How long released grants were held.
    pub hold_released: Histogram,
    /// How long grants whose lease ran out were held.
    pub hold_expired: Histogram,
}

impl ShardStats {
    /// Adds another shard's counters and gauges to these.
    pub fn add(&mut self, other: &ShardStats) {
        self.grants += other.grants;
        self.releases += other.releases;
        self.extends += other.extends;
        self.expiries += other.expiries;
        self.timeouts += other.timeouts;
        self.handoffs += other.handoffs;
        for (sum, count) in self.errors.iter_mut().zip(other.errors) {
            *sum += count;
        }
        self.held_keys += other.held_keys;
        self.waiters += other.waiters;
        self.keys += other.keys;
        self.grants_immediate += other.grants_immediate;
        self.handoffs_after_expiry += other.handoffs_after_expiry;
        self.wait_granted.add(&other.wait_granted);
        self.wait_timed_out.add(&other.wait_timed_out);
        self.hold_released.add(&other.hold_released);
        self.hold_expired.add(&other.hold_expired);
    }

    /// Errors answered with `code`.
    pub fn errors_of(&self, code: ErrorCode) -> u64 {
        code.index().map_or(0, |index| self.errors[index])
    }
}

/// One lock shard. See the module documentation.
pub struct Shard {
    config: ShardConfig,
    index: LockIndex,
    locks: Vec<Lock>,
    locks_free: Vec<u32>,
    waiters: Vec<Waiter>,
    waiters_free: Vec<u32>,
    /// Every node of a client, live or held, in request order.
    clients: HashMap<ClientId, Ends, RandomState>,
    /// Every node of a (client, lock), live or held, in request order.
    chains: HashMap<(ClientId, u32), Ends, RandomState>,
    timers: TimerWheel<u32>,
    fired: Vec<u32>,
    tokens: TokenSupply,
    /// Locks with waiters but no holder because tokens ran out.
    starved: Vec<u32>,
    effects: Vec<Effect>,
    /// Changes for the standbys, in order (only with `config.deltas`). Kept
    /// apart from the effects so that the caller takes them in one piece.
    deltas: Vec<Delta>,
    stats: ShardStats,
    /// Keys held plus acquires queued, per authenticated name (indexed by
    /// [`NameId`]; never [`NameId::NONE`]), for [`ShardConfig::name_keys_max`].
    name_use: Vec<u32>,
    /// Keys held plus acquires queued, per client connection, for
    /// [`ShardConfig::client_keys_max`] (empty without that quota); a
    /// connection's entry goes once it holds and waits on nothing.
    client_use: HashMap<ClientId, u32, RandomState>,
    /// The connection each held key was granted to, by lock slot (only
    /// with [`ShardConfig::client_keys_max`]; [`NO_CLIENT`] for a grant
    /// restored from the active this node took over from).
    holder_clients: Vec<ClientId>,
    /// Keys acquires queued on, and keys handed from one holder to the next.
    hot_waits: HotKeys,
    hot_handoffs: HotKeys,
    now_ms: u64,
}

/// Why a key that is no longer held goes to its next waiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HandOn {
    Release,
    Expiry,
    /// The key waited for tokens, which have come.
    Tokens,
}

/// The time modulo 2^32 ms that locks and waiters keep (see `Lock::granted_ms`).
#[inline(always)]
fn short_ms(now_ms: u64) -> u32 {
    now_ms as u32
}

/// Milliseconds from `since` (a [`short_ms`]) to `now_ms`.
#[inline(always)]
fn elapsed_ms(now_ms: u64, since: u32) -> u64 {
    u64::from(short_ms(now_ms).wrapping_sub(since))
}

impl Shard {
    /// An empty shard at time `now_ms`. It holds no token yet: its first
    /// effect is [`Effect::NeedTokens`], and acquires wait until a range arrives.
    pub fn new(config: ShardConfig, now_ms: u64) -> Shard {
        if let Err(problem) = config.validate() {
            panic!("invalid shard configuration: {problem}");
        }
        let seed = config.hash_seed;
        let mut shard = Shard {
            index: LockIndex::new(RandomState::with_seeds(
                seed,
                seed ^ 0x9e37_79b9_7f4a_7c15,
                0x2545_f491_4f6c_dd1d,
                !seed,
            )),
            locks: Vec::new(),
            locks_free: Vec::new(),
            waiters: Vec::new(),
            waiters_free: Vec::new(),
            clients: HashMap::with_hasher(RandomState::with_seeds(seed, 1, 2, 3)),
            chains: HashMap::with_hasher(RandomState::with_seeds(seed, 4, 5, 6)),
            timers: TimerWheel::new(now_ms),
            fired: Vec::new(),
            tokens: TokenSupply::new(config.tokens_low_water.max(1)),
            starved: Vec::new(),
            effects: Vec::new(),
            deltas: Vec::new(),
            stats: ShardStats::default(),
            name_use: Vec::new(),
            client_use: HashMap::with_hasher(RandomState::with_seeds(seed, 7, 8, 9)),
            holder_clients: Vec::new(),
            hot_waits: HotKeys::new(now_ms),
            hot_handoffs: HotKeys::new(now_ms),
            now_ms,
            config,
        };
        shard.request_tokens_if_low();
        shard
    }

    /// The shard's settings.
    pub fn config(&self) -> &ShardConfig {
        &self.config
    }

    /// Counters and gauges.
    pub fn stats(&self) -> &ShardStats {
        &self.stats
    }

    /// The time of the latest input.
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// Tokens the shard may still issue without a new range.
    pub fn tokens_remaining(&self) -> u64 {
        self.tokens.remaining()
    }

    /// Takes the effects produced so far, in the order they happened.
    pub fn drain_effects(&mut self) -> std::vec::Drain<'_, Effect> {
        self.effects.drain(..)
    }

    /// The effects produced so far, in the order they happened, for a caller
    /// that handles them where they lie and then calls
    /// [`Shard::clear_effects`]. Moving each effect out, as
    /// [`Shard::drain_effects`] does, copies it whole right after the shard
    /// stored it in parts, and that copy waits for the stores to reach the
    /// cache.
    #[inline]
    pub fn effects(&self) -> &[Effect] {
        &self.effects
    }

    /// Forgets the effects produced so far (see [`Shard::effects`]).
    #[inline]
    pub fn clear_effects(&mut self) {
        self.effects.clear();
    }

    /// Whether changes wait to be taken with [`Shard::take_deltas`].
    pub fn has_deltas(&self) -> bool {
        !self.deltas.is_empty()
    }

    /// Takes the replication deltas made so far, in the order they happened,
    /// and goes on filling `empty` (a buffer handed back for reuse).
    pub fn take_deltas(&mut self, empty: Vec<Delta>) -> Vec<Delta> {
        debug_assert!(empty.is_empty());
        std::mem::replace(&mut self.deltas, empty)
    }

    /// The earliest time at which [`Shard::advance`] may have work: the event
    /// loop sleeps at most until then.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        self.timers.next_deadline_ms()
    }

    /// The token of the current grant of `key`, if it is held.
    pub fn holder_token(&self, key: &[u8]) -> Option<u64> {
        let lock = &self.locks[self.find(key)? as usize];
        lock.is_held().then_some(lock.token)
    }

    /// The name that took the current grant of `key`, if it is held.
    pub fn holder_name(&self, key: &[u8]) -> Option<NameId> {
        let lock = &self.locks[self.find(key)? as usize];
        lock.is_held().then_some(lock.name)
    }

    /// The keys acquires queued on most in the last minute, and the keys
    /// handed from one holder to the next most (see [`HotKeys`]), with
    /// their counts, highest first.
    pub fn hot_keys(&mut self, now_ms: u64) -> (HotKeyCounts, HotKeyCounts) {
        (self.hot_waits.top(now_ms), self.hot_handoffs.top(now_ms))
    }

    /// Events the hot-keys sketches counted since the start, so that a caller
    /// copies their reports only when they may have changed.
    pub fn hot_key_events(&self) -> u64 {
        self.hot_waits.events() + self.hot_handoffs.events()
    }

    /// Live waiters queued on `key`.
    pub fn queue_len(&self, key: &[u8]) -> u32 {
        self.find(key).map_or(0, |slot| self.locks[slot as usize].queue_len)
    }

    /// Bytes the shard's tables occupy (slabs, index, timers), for memory
    /// measurements; keys longer than the inline size add their own boxes.
    pub fn table_bytes(&self) -> usize {
        self.locks.capacity() * size_of::<Lock>()
            + self.locks_free.capacity() * 4
            + self.waiters.capacity() * size_of::<Waiter>()
            + self.waiters_free.capacity() * 4
            + self.index.allocation_size()
            + self.clients.allocation_size()
            + self.chains.allocation_size()
    }

    // ----- inputs -----

    /// `A key lease wait`: grant `key` at once if it is free, else queue the
    /// request. `wait_ms` 0 waits without limit. The key must be valid
    /// (the codec checks keys before a request reaches a shard).
    pub fn acquire(&mut self, now_ms: u64, client: ClientId, key: &[u8], lease_ms: u64, wait_ms: u64) {
        self.acquire_answering::<false>(now_ms, client, NameId::NONE, key, lease_ms, wait_ms);
    }

    /// [`Shard::acquire`] by the authenticated `name`: the grant, made now
    /// or later, records it.
    pub fn acquire_as(&mut self, now_ms: u64, client: ClientId, name: NameId, key: &[u8], lease_ms: u64, wait_ms: u64) {
        self.acquire_answering::<false>(now_ms, client, name, key, lease_ms, wait_ms);
    }

    /// [`Shard::acquire`], except that a grant made at once is not among the
    /// effects: its token is returned, and the caller answers `A key token`
    /// itself, before it delivers the effects. Every other outcome (queued,
    /// an error) is answered through the effects as by `acquire`. The
    /// server's request path, which has the key at hand in the request line,
    /// so saves a copy of the key and an effect per grant.
    #[inline]
    pub fn acquire_direct(
        &mut self,
        now_ms: u64,
        client: ClientId,
        name: NameId,
        key: &[u8],
        lease_ms: u64,
        wait_ms: u64,
    ) -> Option<u64> {
        self.acquire_answering::<true>(now_ms, client, name, key, lease_ms, wait_ms)
    }

    /// `acquire`, the immediate grant's reply returned (`DIRECT`) or put
    /// among the effects.
    #[inline(always)]
    fn acquire_answering<const DIRECT: bool>(
        &mut self,
        now_ms: u64,
        client: ClientId,
        name: NameId,
        key: &[u8],
        lease_ms: u64,
        wait_ms: u64,
    ) -> Option<u64> {
        self.set_now(now_ms);
        debug_assert!(ringlock_proto::is_valid_key(key));
        if lease_ms == 0 || lease_ms > self.config.lease_ms_max {
            self.acquire_error(client, key, ErrorCode::BadLease);
            return None;
        }
        if wait_ms > self.config.wait_ms_max() {
            self.acquire_error(client, key, ErrorCode::BadWait);
            return None;
        }
        let hash = self.hash(key);
        let over_quota = self.name_over_quota(name) || self.client_over_quota(client);
        if let Some(slot) = self.find_hashed(hash, key) {
            let lock = &self.locks[slot as usize];
            if lock.queue_len >= self.config.waiters_per_key_max
                || self.stats.waiters >= u64::from(self.config.waiters_max)
                || over_quota
            {
                self.acquire_error(client, key, ErrorCode::TooManyWaiters);
                return None;
            }
            self.enqueue(client, name, slot, lease_ms, wait_ms);
            return None;
        }
        if self.stats.keys >= u64::from(self.config.keys_max) || over_quota {
            self.reply_error(client, Op::Acquire, key, ErrorCode::TooManyKeys);
            return None;
        }
        let slot = self.insert_lock(hash, key);
        match self.tokens.next_token() {
            Some(token) => {
                self.grant(slot, token, lease_ms, name, client);
                self.stats.grants_immediate += 1;
                self.stats.wait_granted.record(0);
                if !DIRECT {
                    self.reply(client, ShardReply::Acquired { key: Key::new(key), token });
                }
                self.request_tokens_if_low();
                DIRECT.then_some(token)
            }
            None => {
                if self.stats.waiters >= u64::from(self.config.waiters_max) {
                    self.remove_lock_hashed(slot, hash);
                    self.reply_error(client, Op::Acquire, key, ErrorCode::TooManyWaiters);
                    return None;
                }
                self.enqueue(client, name, slot, lease_ms, wait_ms);
                self.mark_starved(slot);
                None
            }
        }
    }

    /// `R key token`: release the grant if `token` holds `key` now, and hand
    /// the key to the first waiter.
    pub fn release(&mut self, now_ms: u64, client: ClientId, key: &[u8], token: u64) {
        self.release_answering::<false>(now_ms, client, NameId::NONE, key, token);
    }

    /// [`Shard::release`] by the authenticated `name`: only the name that
    /// took the grant may release it.
    pub fn release_as(&mut self, now_ms: u64, client: ClientId, name: NameId, key: &[u8], token: u64) {
        self.release_answering::<false>(now_ms, client, name, key, token);
    }

    /// [`Shard::release`], except that a release made is not answered among
    /// the effects: `true` says it was made, and the caller answers `R key`
    /// itself before it delivers the effects (the grant to the next waiter
    /// may be among them, and comes after the release). A refused release
    /// is answered through the effects as by `release`.
    #[inline]
    pub fn release_direct(&mut self, now_ms: u64, client: ClientId, name: NameId, key: &[u8], token: u64) -> bool {
        self.release_answering::<true>(now_ms, client, name, key, token)
    }

    /// `release`, the reply to a release made left to the caller (`DIRECT`)
    /// or put among the effects.
    #[inline(always)]
    fn release_answering<const DIRECT: bool>(
        &mut self,
        now_ms: u64,
        client: ClientId,
        name: NameId,
        key: &[u8],
        token: u64,
    ) -> bool {
        self.set_now(now_ms);
        let hash = self.hash(key);
        let locks = &self.locks;
        let Some(found) = self.index.find_mut(hash, |slot| locks[slot as usize].key.is(key)) else {
            self.reply_error(client, Op::Release, key, ErrorCode::NotHolder);
            return false;
        };
        let slot = found.slot();
        let lock = &locks[slot as usize];
        if !lock.is_held_by(token, name) {
            self.reply_error(client, Op::Release, key, ErrorCode::NotHolder);
            return false;
        }
        let nobody_waits = lock.queue_head == NONE;
        if nobody_waits {
            // The key keeps no state once released: it leaves the index now,
            // through the search that found it, rather than by a second one.
            found.remove();
        }
        let lock = &mut self.locks[slot as usize];
        let timer = lock.lease_timer.take().expect("a holder has a lease timer");
        self.timers.cancel(timer);
        self.stats.hold_released.record(elapsed_ms(self.now_ms, lock.granted_ms));
        self.stats.releases += 1;
        self.stats.held_keys -= 1;
        let holder = lock.name;
        self.name_used(holder, false);
        self.holder_left(slot);
        self.delta(|| Delta::Release { key: Key::new(key), token });
        if !DIRECT {
            self.reply(client, ShardReply::Released { key: Key::new(key) });
        }
        if nobody_waits {
            // What `hand_on` would do, for a key already out of the index.
            self.free_lock(slot);
        } else {
            self.hand_on(slot, HandOn::Release);
        }
        true
    }

    /// `X key token lease`: if `token` holds `key` now, its lease ends
    /// `lease_ms` from now, sooner or later than before.
    pub fn extend(&mut self, now_ms: u64, client: ClientId, key: &[u8], token: u64, lease_ms: u64) {
        self.extend_as(now_ms, client, NameId::NONE, key, token, lease_ms);
    }

    /// [`Shard::extend`] by the authenticated `name`: only the name that
    /// took the grant may extend it.
    pub fn extend_as(&mut self, now_ms: u64, client: ClientId, name: NameId, key: &[u8], token: u64, lease_ms: u64) {
        self.set_now(now_ms);
        if lease_ms == 0 || lease_ms > self.config.lease_ms_max {
            return self.reply_error(client, Op::Extend, key, ErrorCode::BadLease);
        }
        let Some(slot) = self.find_holder(key, token, name) else {
            return self.reply_error(client, Op::Extend, key, ErrorCode::NotHolder);
        };
        let timer = self.locks[slot as usize].lease_timer.take().expect("a holder has a lease timer");
        self.timers.cancel(timer);
        let timer = self.timers.insert(self.now_ms + lease_ms, slot);
        self.locks[slot as usize].lease_timer = Some(timer);
        self.stats.extends += 1;
        self.delta(|| Delta::Extend { key: Key::new(key), token, lease_ms });
        self.reply(client, ShardReply::Extended { key: Key::new(key), token });
    }

    /// `I key`: who holds `key` (its token, or 0 if nobody), the lease it has
    /// left, and how many requests are queued on it. Changes nothing.
    pub fn inspect(&mut self, now_ms: u64, client: ClientId, key: &[u8]) {
        self.inspect_as(now_ms, client, NameId::NONE, key);
    }

    /// [`Shard::inspect`] by the authenticated `name`: the token is shown
    /// only if `name` took the grant. Another name sees the token as 0 (`-`
    /// on the wire) and the lease left, at least 1 ms, so that a held key
    /// is still told from a free one.
    pub fn inspect_as(&mut self, now_ms: u64, client: ClientId, name: NameId, key: &[u8]) {
        self.set_now(now_ms);
        let (token, lease_left_ms, waiters) = match self.find(key) {
            None => (0, 0, 0),
            Some(slot) => {
                let lock = &self.locks[slot as usize];
                match lock.lease_timer {
                    Some(timer) if lock.name == name => {
                        let left = self.timers.deadline_ms(timer).saturating_sub(self.now_ms);
                        (lock.token, u32::try_from(left).unwrap_or(u32::MAX), lock.queue_len)
                    }
                    Some(timer) => {
                        let left = self.timers.deadline_ms(timer).saturating_sub(self.now_ms).max(1);
                        (0, u32::try_from(left).unwrap_or(u32::MAX), lock.queue_len)
                    }
                    None => (0, 0, lock.queue_len),
                }
            }
        };
        let state = Box::new(KeyState { token, lease_left_ms, waiters });
        self.reply(client, ShardReply::Inspected { key: Key::new(key), state });
    }

    /// A request on a valid `key` that the codec refused (bad lease, bad
    /// token...). It comes through the shard so that its `E` reply keeps its
    /// place among the replies for the same (op, key).
    pub fn reject(&mut self, now_ms: u64, client: ClientId, op: Op, key: &[u8], code: ErrorCode) {
        self.set_now(now_ms);
        match op {
            Op::Acquire => self.acquire_error(client, key, code),
            _ => self.reply_error(client, op, key, code),
        }
    }

    /// The client's connection closed: its queued requests leave their queues
    /// now, unanswered. Keys it holds stay held until released or expired.
    /// Returns how many of its requests were dropped unanswered.
    pub fn client_gone(&mut self, now_ms: u64, client: ClientId) -> u32 {
        self.set_now(now_ms);
        let Some(ends) = self.clients.remove(&client) else {
            return 0;
        };
        let mut removed = 0;
        let mut node = ends.head;
        while node != NONE {
            removed += 1;
            let waiter = &self.waiters[node as usize];
            let (next, slot, state) = (waiter.client_next, waiter.lock, waiter.state);
            self.chains.remove(&(client, slot));
            if matches!(state, WaiterState::Live | WaiterState::LiveWaitExpired) {
                if let Some(timer) = self.waiters[node as usize].wait_timer.take() {
                    self.timers.cancel(timer);
                }
                self.unlink_queue(node);
                self.remove_lock_if_unused(slot);
            }
            self.free_waiter(node);
            node = next;
        }
        removed
    }

    /// Answers every queued acquire `E A <key> <code>` (the server is stopping
    /// and has nobody to hand over to), with the answers held behind them
    /// still in request order. Held keys stay held.
    pub fn fail_waiters(&mut self, now_ms: u64, code: ErrorCode) {
        self.end_waiters(now_ms, Some(code));
    }

    /// The node is no longer active (it handed off or was demoted): every
    /// queued acquire is answered [`ShardReply::Moved`] (with the answers held
    /// behind them still in request order), and every key is dropped, since
    /// the active now owns the table and this node will get it back by
    /// replication. Nothing is replicated: the stream of this activation ends.
    pub fn step_down(&mut self, now_ms: u64) {
        self.end_waiters(now_ms, None);
        for slot in 0..self.locks.len() as u32 {
            let lock = &mut self.locks[slot as usize];
            if let Some(timer) = lock.lease_timer.take() {
                self.timers.cancel(timer);
                self.stats.held_keys -= 1;
                self.remove_lock(slot);
            }
        }
        self.name_use.clear();
        self.client_use.clear();
        self.holder_clients.clear();
        debug_assert_eq!(self.stats.keys, 0, "a shard that stepped down holds no key");
    }

    /// Installs a grant replicated from the active this node takes over
    /// from: `key` is held by `token` for `lease_ms` more. Produces no reply
    /// and no delta (the new active's standbys start from a snapshot).
    /// Returns false, changing nothing, if the key is already known here or
    /// the table is full.
    pub fn restore(&mut self, now_ms: u64, key: &[u8], token: u64, lease_ms: u64) -> bool {
        self.restore_as(now_ms, key, token, lease_ms, NameId::NONE)
    }

    /// [`Shard::restore`] of a grant taken by `name`, which goes on holding it.
    pub fn restore_as(&mut self, now_ms: u64, key: &[u8], token: u64, lease_ms: u64, name: NameId) -> bool {
        self.set_now(now_ms);
        let hash = self.hash(key);
        if self.find_hashed(hash, key).is_some() || self.stats.keys >= u64::from(self.config.keys_max) || token == 0 {
            return false;
        }
        let slot = self.insert_lock(hash, key);
        let lock = &mut self.locks[slot as usize];
        lock.token = token;
        lock.name = name;
        lock.lease_timer = Some(self.timers.insert(self.now_ms + lease_ms.max(1), slot));
        // The hold is measured from when this node took the grant over.
        lock.granted_ms = short_ms(self.now_ms);
        self.stats.held_keys += 1;
        self.name_used(name, true);
        if let Some(holder) = self.holder_clients.get_mut(slot as usize) {
            *holder = NO_CLIENT;
        }
        true
    }

    /// Ends every queued acquire: `E A <key> <code>`, or `M A <key>` when
    /// `code` is `None`.
    fn end_waiters(&mut self, now_ms: u64, code: Option<ErrorCode>) {
        self.set_now(now_ms);
        let clients: Vec<(ClientId, Ends)> = self.clients.drain().collect();
        let mut touched = Vec::new();
        for (client, ends) in clients {
            let mut node = ends.head;
            while node != NONE {
                let waiter = &mut self.waiters[node as usize];
                let (next, slot, state) = (waiter.client_next, waiter.lock, waiter.state);
                let key = self.locks[slot as usize].key.clone();
                let reply = match state {
                    WaiterState::Live | WaiterState::LiveWaitExpired => {
                        if let Some(timer) = waiter.wait_timer.take() {
                            self.timers.cancel(timer);
                        }
                        self.unlink_queue(node);
                        touched.push(slot);
                        match code {
                            Some(code) => {
                                self.count_error(code);
                                ShardReply::Error { op: Op::Acquire, key, code }
                            }
                            None => ShardReply::Moved { op: Op::Acquire, key },
                        }
                    }
                    WaiterState::HeldTimeout => ShardReply::TimedOut { key },
                    WaiterState::HeldError(held) => ShardReply::Error { op: Op::Acquire, key, code: held },
                    WaiterState::Free => unreachable!("a client list holds no free node"),
                };
                self.reply(client, reply);
                self.free_waiter(node);
                node = next;
            }
        }
        self.chains.clear();
        // Keys are dropped only now, after every held answer read its key.
        touched.sort_unstable();
        touched.dedup();
        for slot in touched {
            self.remove_lock_if_unused(slot);
        }
    }

    /// Moves time to `now_ms`: leases and waits that ran out by then end, in
    /// deadline order, and expired keys go to their next waiter.
    pub fn advance(&mut self, now_ms: u64) {
        self.set_now(now_ms);
        let mut fired = std::mem::take(&mut self.fired);
        self.timers.advance(self.now_ms, &mut fired);
        // Mark first, then act: an expiry may grant a waiter whose own wait
        // timer fired in this same batch, and that timer must not be cancelled
        // again nor answered after the grant.
        // A fired lease timer is only touched by its own expiry below, so
        // lease timers need no mark: their keys count as held until then.
        for &value in &fired {
            if value & TIMER_WAIT_BIT != 0 {
                let waiter = &mut self.waiters[(value & !TIMER_WAIT_BIT) as usize];
                assert_eq!(waiter.state, WaiterState::Live, "a fired wait timer belongs to a live waiter");
                waiter.wait_timer = None;
                waiter.state = WaiterState::LiveWaitExpired;
            }
        }
        for &value in &fired {
            if value & TIMER_WAIT_BIT != 0 {
                let node = value & !TIMER_WAIT_BIT;
                if self.waiters[node as usize].state == WaiterState::LiveWaitExpired {
                    self.wait_ran_out(node);
                }
            } else {
                self.lease_ran_out(value);
            }
        }
        fired.clear();
        self.fired = fired;
    }

    /// Gives the shard a range of tokens; keys that waited for tokens are
    /// granted now.
    pub fn add_token_range(&mut self, now_ms: u64, range: TokenRange) -> Result<(), TokenRangeError> {
        self.set_now(now_ms);
        self.tokens.add(range)?;
        // Keys are granted in the order they ran short; those still short
        // when this range runs out go back on the list.
        let starved = std::mem::take(&mut self.starved);
        for &slot in &starved {
            let lock = &mut self.locks[slot as usize];
            lock.starved = false;
            debug_assert!(!lock.is_held() && lock.queue_len > 0);
            self.hand_on(slot, HandOn::Tokens);
        }
        self.request_tokens_if_low();
        Ok(())
    }

    /// The range asked for by [`Effect::NeedTokens`] will not come (the
    /// replication core lost it); the next shortage asks again.
    pub fn token_request_lost(&mut self) {
        self.tokens.request_lost();
        self.request_tokens_if_low();
    }

    // ----- grants and hand-offs -----

    /// Marks `slot` held by `token` for `lease_ms` and replicates the grant.
    #[inline(always)]
    fn grant(&mut self, slot: u32, token: u64, lease_ms: u64, name: NameId, client: ClientId) {
        let lock = &mut self.locks[slot as usize];
        assert!(token > lock.token, "a key's tokens strictly increase");
        debug_assert!(lock.lease_timer.is_none());
        lock.token = token;
        lock.name = name;
        lock.lease_timer = Some(self.timers.insert(self.now_ms + lease_ms, slot));
        lock.granted_ms = short_ms(self.now_ms);
        self.stats.grants += 1;
        self.stats.held_keys += 1;
        self.name_used(name, true);
        if self.config.client_keys_max > 0 {
            if slot as usize >= self.holder_clients.len() {
                self.holder_clients.resize(slot as usize + 1, NO_CLIENT);
            }
            self.holder_clients[slot as usize] = client;
            self.client_used(client, true);
        }
        if self.config.deltas {
            let key = self.locks[slot as usize].key.clone();
            self.deltas.push(Delta::Grant { key, token, lease_ms, name });
        }
    }

    /// The key at `slot` is no longer held: give it to its first waiter, or
    /// drop it if nobody waits. Without tokens, it waits for a range.
    fn hand_on(&mut self, slot: u32, why: HandOn) {
        let node = self.locks[slot as usize].queue_head;
        if node == NONE {
            self.remove_lock(slot);
            return;
        }
        let Some(token) = self.tokens.next_token() else {
            self.mark_starved(slot);
            return;
        };
        let waiter = &mut self.waiters[node as usize];
        let (client, lease_ms, name) = (waiter.client, u64::from(waiter.lease_ms), waiter.name);
        let waited_ms = elapsed_ms(self.now_ms, waiter.enqueued_ms);
        if let Some(timer) = waiter.wait_timer.take() {
            self.timers.cancel(timer);
        }
        self.unlink_queue(node);
        self.grant(slot, token, lease_ms, name, client);
        self.stats.wait_granted.record(waited_ms);
        if why != HandOn::Tokens {
            self.stats.handoffs += 1;
            if why == HandOn::Expiry {
                self.stats.handoffs_after_expiry += 1;
            }
            let key = self.locks[slot as usize].key.as_bytes();
            self.hot_handoffs.record(self.now_ms, self.index.hash(key).bits(), key);
        }
        let key = self.locks[slot as usize].key.clone();
        self.answer_chain_head(client, slot, node, ShardReply::Acquired { key, token });
        self.request_tokens_if_low();
    }

    fn lease_ran_out(&mut self, slot: u32) {
        let lock = &mut self.locks[slot as usize];
        assert!(lock.lease_timer.take().is_some(), "a fired lease timer belongs to a held key");
        let token = lock.token;
        self.stats.hold_expired.record(elapsed_ms(self.now_ms, lock.granted_ms));
        self.stats.expiries += 1;
        self.stats.held_keys -= 1;
        let holder = lock.name;
        if self.config.deltas {
            let key = lock.key.clone();
            self.deltas.push(Delta::Expire { key, token });
        }
        self.name_used(holder, false);
        self.holder_left(slot);
        self.hand_on(slot, HandOn::Expiry);
    }

    fn wait_ran_out(&mut self, node: u32) {
        let waiter = &self.waiters[node as usize];
        let (client, slot) = (waiter.client, waiter.lock);
        self.stats.wait_timed_out.record(elapsed_ms(self.now_ms, waiter.enqueued_ms));
        self.stats.timeouts += 1;
        self.unlink_queue(node);
        let chain = self.chains[&(client, slot)];
        if chain.head == node {
            let key = self.locks[slot as usize].key.clone();
            self.answer_chain_head(client, slot, node, ShardReply::TimedOut { key });
        } else {
            self.waiters[node as usize].state = WaiterState::HeldTimeout;
        }
        self.remove_lock_if_unused(slot);
    }

    // ----- replies -----

    /// Answers `node`, the head of its (client, key) chain, which has left the
    /// key's queue; then sends the held answers behind it, up to the next
    /// request still queued.
    fn answer_chain_head(&mut self, client: ClientId, slot: u32, node: u32, reply: ShardReply) {
        self.reply(client, reply);
        let chain = self.chains.get_mut(&(client, slot)).expect("a queued request has a chain");
        assert_eq!(chain.head, node, "only the first request of a chain is answered");
        let mut next = self.waiters[node as usize].chain_next;
        self.unlink_client(node);
        self.free_waiter(node);
        loop {
            if next == NONE {
                self.chains.remove(&(client, slot));
                return;
            }
            let state = self.waiters[next as usize].state;
            let reply = match state {
                WaiterState::HeldTimeout => ShardReply::TimedOut { key: self.locks[slot as usize].key.clone() },
                WaiterState::HeldError(code) => {
                    ShardReply::Error { op: Op::Acquire, key: self.locks[slot as usize].key.clone(), code }
                }
                WaiterState::Live | WaiterState::LiveWaitExpired => {
                    self.chains.get_mut(&(client, slot)).expect("chain").head = next;
                    return;
                }
                WaiterState::Free => unreachable!("a chain holds no free node"),
            };
            self.reply(client, reply);
            let after = self.waiters[next as usize].chain_next;
            self.unlink_client(next);
            self.free_waiter(next);
            next = after;
        }
    }

    /// An `E A key code` reply, held behind the client's queued `A key` if any.
    fn acquire_error(&mut self, client: ClientId, key: &[u8], code: ErrorCode) {
        let slot = self.find(key);
        if let Some(slot) = slot
            && self.chains.contains_key(&(client, slot))
        {
            self.count_error(code);
            let node = self.alloc_waiter(client, slot, 0, WaiterState::HeldError(code));
            self.link_client_and_chain(client, slot, node);
            return;
        }
        self.reply_error(client, Op::Acquire, key, code);
    }

    fn reply_error(&mut self, client: ClientId, op: Op, key: &[u8], code: ErrorCode) {
        self.count_error(code);
        self.reply(client, ShardReply::Error { op, key: Key::new(key), code });
    }

    fn count_error(&mut self, code: ErrorCode) {
        if let Some(index) = code.index() {
            self.stats.errors[index] += 1;
        }
    }

    #[inline]
    fn reply(&mut self, client: ClientId, reply: ShardReply) {
        self.effects.push(Effect::Reply { client, reply });
    }

    #[inline]
    fn delta(&mut self, make: impl FnOnce() -> Delta) {
        if self.config.deltas {
            self.deltas.push(make());
        }
    }

    fn request_tokens_if_low(&mut self) {
        if self.tokens.should_request() {
            self.effects.push(Effect::NeedTokens);
        }
    }

    // ----- the table -----

    fn set_now(&mut self, now_ms: u64) {
        // Time never goes back inside a shard, whatever the caller's clock does.
        self.now_ms = self.now_ms.max(now_ms);
    }

    #[inline]
    fn hash(&self, key: &[u8]) -> KeyHash {
        self.index.hash(key)
    }

    #[inline]
    fn find(&self, key: &[u8]) -> Option<u32> {
        self.find_hashed(self.hash(key), key)
    }

    #[inline]
    fn find_hashed(&self, hash: KeyHash, key: &[u8]) -> Option<u32> {
        let locks = &self.locks;
        self.index.find(hash, |slot| locks[slot as usize].key.is(key))
    }

    fn find_holder(&self, key: &[u8], token: u64, name: NameId) -> Option<u32> {
        let slot = self.find(key)?;
        let lock = &self.locks[slot as usize];
        lock.is_held_by(token, name).then_some(slot)
    }

    #[inline(always)]
    fn insert_lock(&mut self, hash: KeyHash, key: &[u8]) -> u32 {
        let lock = Lock {
            key: Key::new(key),
            token: 0,
            lease_timer: None,
            queue_head: NONE,
            queue_tail: NONE,
            queue_len: 0,
            starved: false,
            granted_ms: 0,
            name: NameId::NONE,
        };
        let slot = match self.locks_free.pop() {
            Some(slot) => {
                self.locks[slot as usize] = lock;
                slot
            }
            None => {
                self.locks.push(lock);
                (self.locks.len() - 1) as u32
            }
        };
        self.index.insert(hash, slot);
        self.stats.keys += 1;
        slot
    }

    fn remove_lock_if_unused(&mut self, slot: u32) {
        let lock = &self.locks[slot as usize];
        if !lock.is_held() && lock.queue_len == 0 {
            self.remove_lock(slot);
        }
    }

    /// Lists a key that has waiters but no token to grant them.
    fn mark_starved(&mut self, slot: u32) {
        let lock = &mut self.locks[slot as usize];
        if !lock.starved {
            lock.starved = true;
            self.starved.push(slot);
        }
    }

    fn remove_lock(&mut self, slot: u32) {
        let hash = self.hash(self.locks[slot as usize].key.as_bytes());
        self.remove_lock_hashed(slot, hash);
    }

    /// [`Shard::remove_lock`] for a caller that has hashed the key already.
    fn remove_lock_hashed(&mut self, slot: u32, hash: KeyHash) {
        debug_assert_eq!(hash, self.index.hash(self.locks[slot as usize].key.as_bytes()));
        let removed = self.index.remove(hash, slot);
        assert!(removed, "a lock in the slab is in the index");
        self.free_lock(slot);
    }

    /// Frees the slab slot of a lock that has left the index.
    #[inline(always)]
    fn free_lock(&mut self, slot: u32) {
        let lock = &mut self.locks[slot as usize];
        debug_assert!(!lock.is_held() && lock.queue_len == 0);
        if lock.starved {
            // Only while tokens are missing, so the list is short and this rare.
            lock.starved = false;
            self.starved.retain(|&other| other != slot);
        }
        let lock = &mut self.locks[slot as usize];
        // Dropping the key frees a boxed one now, not when the slot is reused.
        lock.key = Key::new(b"");
        lock.token = 0;
        self.locks_free.push(slot);
        self.stats.keys -= 1;
    }

    // ----- waiters -----

    fn enqueue(&mut self, client: ClientId, name: NameId, slot: u32, lease_ms: u64, wait_ms: u64) {
        debug_assert!(lease_ms <= LEASE_MS_LIMIT);
        let node = self.alloc_waiter(client, slot, lease_ms as u32, WaiterState::Live);
        self.waiters[node as usize].name = name;
        let key = self.locks[slot as usize].key.as_bytes();
        self.hot_waits.record(self.now_ms, self.index.hash(key).bits(), key);
        if wait_ms > 0 {
            let timer = self.timers.insert(self.now_ms + wait_ms, node | TIMER_WAIT_BIT);
            self.waiters[node as usize].wait_timer = Some(timer);
        }
        let lock = &mut self.locks[slot as usize];
        let tail = lock.queue_tail;
        lock.queue_tail = node;
        if tail == NONE {
            lock.queue_head = node;
        }
        lock.queue_len += 1;
        if tail != NONE {
            self.waiters[tail as usize].queue_next = node;
        }
        self.waiters[node as usize].queue_prev = tail;
        self.stats.waiters += 1;
        self.name_used(name, true);
        self.client_used(client, true);
        self.link_client_and_chain(client, slot, node);
    }

    fn alloc_waiter(&mut self, client: ClientId, slot: u32, lease_ms: u32, state: WaiterState) -> u32 {
        let waiter = Waiter {
            client,
            wait_timer: None,
            lock: slot,
            lease_ms,
            queue_prev: NONE,
            queue_next: NONE,
            client_prev: NONE,
            client_next: NONE,
            chain_next: NONE,
            enqueued_ms: short_ms(self.now_ms),
            state,
            name: NameId::NONE,
        };
        match self.waiters_free.pop() {
            Some(node) => {
                self.waiters[node as usize] = waiter;
                node
            }
            None => {
                self.waiters.push(waiter);
                (self.waiters.len() - 1) as u32
            }
        }
    }

    fn free_waiter(&mut self, node: u32) {
        self.waiters[node as usize].state = WaiterState::Free;
        self.waiters_free.push(node);
    }

    fn link_client_and_chain(&mut self, client: ClientId, slot: u32, node: u32) {
        let ends = self.clients.entry(client).or_insert(Ends { head: NONE, tail: NONE });
        let tail = ends.tail;
        ends.tail = node;
        if tail == NONE {
            ends.head = node;
        } else {
            self.waiters[tail as usize].client_next = node;
        }
        self.waiters[node as usize].client_prev = tail;

        let chain = self.chains.entry((client, slot)).or_insert(Ends { head: node, tail: NONE });
        let tail = chain.tail;
        chain.tail = node;
        if tail != NONE {
            self.waiters[tail as usize].chain_next = node;
        }
    }

    /// Takes a live waiter out of its key's queue.
    fn unlink_queue(&mut self, node: u32) {
        let waiter = &self.waiters[node as usize];
        let (prev, next, slot) = (waiter.queue_prev, waiter.queue_next, waiter.lock);
        let lock = &mut self.locks[slot as usize];
        if prev == NONE {
            lock.queue_head = next;
        } else {
            self.waiters[prev as usize].queue_next = next;
        }
        if next == NONE {
            lock.queue_tail = prev;
        } else {
            self.waiters[next as usize].queue_prev = prev;
        }
        lock.queue_len -= 1;
        self.stats.waiters -= 1;
        let (name, client) = (self.waiters[node as usize].name, self.waiters[node as usize].client);
        self.name_used(name, false);
        self.client_used(client, false);
    }

    // ----- per-name and per-connection quotas -----

    /// Whether `name` holds or waits on its quota of keys already.
    #[inline(always)]
    fn name_over_quota(&self, name: NameId) -> bool {
        let quota = self.config.name_keys_max;
        quota > 0 && name != NameId::NONE && self.name_use.get(usize::from(name.0)).is_some_and(|&used| used >= quota)
    }

    /// `name` took (`more`) or let go of a key or a place in a queue.
    #[inline(always)]
    fn name_used(&mut self, name: NameId, more: bool) {
        if name == NameId::NONE || self.config.name_keys_max == 0 {
            return;
        }
        let index = usize::from(name.0);
        if index >= self.name_use.len() {
            self.name_use.resize(index + 1, 0);
        }
        let used = &mut self.name_use[index];
        if more {
            *used += 1;
        } else {
            debug_assert!(*used > 0, "a name lets go of more than it took");
            *used = used.saturating_sub(1);
        }
    }

    /// Whether `client` holds or waits on its quota of keys already.
    #[inline(always)]
    fn client_over_quota(&self, client: ClientId) -> bool {
        let quota = self.config.client_keys_max;
        quota > 0 && self.client_use.get(&client).is_some_and(|&used| used >= quota)
    }

    /// `client` took (`more`) or let go of a key or a place in a queue.
    #[inline(always)]
    fn client_used(&mut self, client: ClientId, more: bool) {
        if self.config.client_keys_max == 0 || client == NO_CLIENT {
            return;
        }
        if more {
            *self.client_use.entry(client).or_insert(0) += 1;
            return;
        }
        let Some(used) = self.client_use.get_mut(&client) else {
            debug_assert!(false, "a connection lets go of more than it took");
            return;
        };
        *used -= 1;
        if *used == 0 {
            self.client_use.remove(&client);
        }
    }

    /// The key at `slot` is no longer held: its holder's connection has one
    /// key fewer.
    #[inline(always)]
    fn holder_left(&mut self, slot: u32) {
        if self.config.client_keys_max == 0 {
            return;
        }
        if let Some(holder) = self.holder_clients.get_mut(slot as usize) {
            let client = std::mem::replace(holder, NO_CLIENT);
            self.client_used(client, false);
        }
    }

    /// Keys held plus acquires queued through `client` (0 without a quota).
    pub fn client_keys(&self, client: ClientId) -> u32 {
        self.client_use.get(&client).copied().unwrap_or(0)
    }

    /// Keys held plus acquires queued by `name` (0 without a quota).
    pub fn name_keys(&self, name: NameId) -> u32 {
        self.name_use.get(usize::from(name.0)).copied().unwrap_or(0)
    }

    fn unlink_client(&mut self, node: u32) {
        let waiter = &self.waiters[node as usize];
        let (prev, next, client) = (waiter.client_prev, waiter.client_next, waiter.client);
        if prev != NONE {
            self.waiters[prev as usize].client_next = next;
        }
        if next != NONE {
            self.waiters[next as usize].client_prev = prev;
        }
        if prev == NONE && next == NONE {
            self.clients.remove(&client);
            return;
        }
        let ends = self.clients.get_mut(&client).expect("a queued client is listed");
        if prev == NONE {
            ends.head = next;
        }
        if next == NONE {
            ends.tail = prev;
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod model_tests;
