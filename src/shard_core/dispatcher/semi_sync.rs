//! `--min-standbys`: replies held until standbys have the change they report.
//!
//! A grant (by an acquire, or by a hand-off to a waiter) or an extend is a
//! change of the table a standby must know before the client may act on
//! it: an active cut off from its standbys could otherwise grant a key that
//! the standby promoted in its place grants again. So the reply of such a
//! change waits here until the replication core says that enough
//! caught-up standbys applied the core's report of deltas that carries it
//! ([`Dispatcher::acknowledged`]).
//!
//! The shard's deltas of a turn leave in one report, numbered by the core
//! from 1; a change made now is in report `reported + 1`. A reply that
//! needs no standby (a release, an error, an inspection) goes at once,
//! unless a reply to the same client is held: it then waits behind it, so
//! that a connection's replies from this shard keep their order. Replies
//! go out in the order they were made.
//!
//! The node that steps down answers each reply still held `M` (the grant
//! may be unknown to the new active; the client asks there), and one that
//! stops answers it `shutting-down`. With too few standbys the node grants
//! nothing ([`Dispatcher::set_granting`]): the replies it held, acquires and
//! extends are answered `no-standby`, and so are queued acquires, in order.

use std::collections::{HashMap, VecDeque};

use ringlock_proto::{ErrorCode, Op};
use ringlock_shards::{self as shards, ClientId, ShardReply};

use super::Dispatcher;

/// The held replies of one core and how far its reports are acknowledged.
#[derive(Debug)]
pub(super) struct SemiSync {
    /// Reports of deltas this core has sent.
    pub(super) reported: u64,
    /// Reports that enough standbys applied.
    acknowledged: u64,
    /// Whether the node may grant (it has enough standbys).
    pub(super) granting: bool,
    /// Held replies in the order made: the report that must be acknowledged
    /// first (0: none, it waits only for those ahead), the client, the reply.
    held: VecDeque<(u64, ClientId, ShardReply)>,
    /// Replies held per client.
    held_per_client: HashMap<ClientId, u32>,
}

impl SemiSync {
    pub(super) fn new() -> SemiSync {
        SemiSync {
            reported: 0,
            acknowledged: 0,
            granting: true,
            held: VecDeque::new(),
            held_per_client: HashMap::new(),
        }
    }

    fn hold(&mut self, report: u64, client: ClientId, reply: ShardReply) {
        self.held.push_back((report, client, reply));
        *self.held_per_client.entry(client).or_insert(0) += 1;
    }

    fn unhold(&mut self, client: ClientId) {
        if let Some(count) = self.held_per_client.get_mut(&client) {
            *count -= 1;
            if *count == 0 {
                self.held_per_client.remove(&client);
            }
        }
    }
}

/// Whether the reply reports a change a standby must have first.
fn needs_standby(reply: &ShardReply) -> bool {
    matches!(reply, ShardReply::Acquired { .. } | ShardReply::Extended { .. })
}

impl Dispatcher {
    /// Turns on `--min-standbys` for this core (cluster start-up).
    pub(crate) fn hold_grants_until_acknowledged(&mut self) {
        self.semi_sync = Some(Box::new(SemiSync::new()));
    }

    /// The shard's deltas so far left in a report (see [`Dispatcher::take_deltas`]).
    pub(crate) fn deltas_reported(&mut self) {
        if let Some(sync) = self.semi_sync.as_deref_mut() {
            sync.reported += 1;
        }
    }

    /// Enough standbys applied this core's reports up to number `reports`:
    /// the replies held for them go, in order.
    pub(crate) fn acknowledged(&mut self, reports: u64) {
        let Some(sync) = self.semi_sync.as_deref_mut() else { return };
        sync.acknowledged = sync.acknowledged.max(reports);
        while let Some(&(report, client, _)) = sync.held.front() {
            if report > sync.acknowledged {
                break;
            }
            let (_, _, reply) = sync.held.pop_front().expect("the front was just seen");
            sync.unhold(client);
            self.connections.deliver(client, &reply);
        }
    }

    /// Whether the node may grant. When it may not, the grants and extends
    /// whose replies are held are answered `no-standby` (the client does
    /// not count on them; the change stays in the table, as harmless as a
    /// grant to a client that went away), and so is every queued acquire.
    pub(crate) fn set_granting(&mut self, granting: bool) {
        let Some(sync) = self.semi_sync.as_deref_mut() else { return };
        let was = std::mem::replace(&mut sync.granting, granting);
        if was && !granting {
            self.release_held(Some(ErrorCode::NoStandby));
            if self.shard.stats().waiters > 0 {
                self.shard.fail_waiters(self.now_ms, ErrorCode::NoStandby);
                self.deliver_replies();
            }
        }
    }

    /// The shard's replies with `--min-standbys`: those that need a standby,
    /// and those behind a held reply to the same client, are held.
    pub(super) fn deliver_or_hold(&mut self) {
        let Some(sync) = self.semi_sync.as_deref_mut() else { return };
        let report = sync.reported + 1;
        for effect in self.shard.effects() {
            match effect {
                shards::Effect::Reply { client, reply } => {
                    if needs_standby(reply) {
                        sync.hold(report, *client, reply.clone());
                    } else if sync.held_per_client.contains_key(client) {
                        sync.hold(0, *client, reply.clone());
                    } else {
                        self.connections.deliver(*client, reply);
                    }
                }
                shards::Effect::NeedTokens => self.need_tokens = true,
            }
        }
        self.shard.clear_effects();
    }

    /// Whether an acquire or extend must be refused `no-standby` now.
    #[inline]
    pub(super) fn refuses_grants(&self) -> bool {
        self.semi_sync.as_deref().is_some_and(|sync| !sync.granting)
    }

    /// The node stops being active (it steps down, or stops): every reply
    /// still held goes now; one that needs a standby is replaced, since the
    /// change it reports may be lost: `M` (the client asks the new active)
    /// or, with `code`, `E <op> <key> <code>`.
    pub(super) fn release_held(&mut self, code: Option<ErrorCode>) {
        let Some(sync) = self.semi_sync.as_deref_mut() else { return };
        for (_, client, reply) in std::mem::take(&mut sync.held) {
            let reply = match reply {
                ShardReply::Acquired { key, .. } => replaced(Op::Acquire, key, code),
                ShardReply::Extended { key, .. } => replaced(Op::Extend, key, code),
                reply => reply,
            };
            self.connections.deliver(client, &reply);
        }
        sync.held_per_client.clear();
    }

    /// The connection `client` reads no more: its held replies are dropped
    /// (its grants stay held until released or expired, as when a client
    /// goes away holding them). Returns how many.
    pub(super) fn drop_held(&mut self, client: ClientId) -> u32 {
        let Some(sync) = self.semi_sync.as_deref_mut() else { return 0 };
        let Some(count) = sync.held_per_client.remove(&client) else { return 0 };
        sync.held.retain(|(_, held, _)| *held != client);
        count
    }

    /// Replies held now (0 without `--min-standbys`).
    #[cfg(test)]
    pub(super) fn held_replies(&self) -> usize {
        self.semi_sync.as_deref().map_or(0, |sync| sync.held.len())
    }
}

fn replaced(op: Op, key: ringlock_shards::Key, code: Option<ErrorCode>) -> ShardReply {
    match code {
        None => ShardReply::Moved { op, key },
        Some(code) => ShardReply::Error { op, key, code },
    }
}
