//! The replicated lock table: every held grant of the node's keys, with its
//! token and when its lease ends.
//!
//! On the active it is fed the shards' deltas and is what a joining standby
//! gets as a snapshot; on a standby it is fed the active's snapshot and delta
//! stream, and is what the shards restore when the node becomes active. It
//! reads no clock: every input carries `now_ms`, the replication core's
//! monotonic time. Leases are kept as deadlines in that time, so a lease on a
//! standby ends at most one replication lag later than on the active: late,
//! never early, which is the safe side for mutual exclusion.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use ringlock_shards::{Delta, Key, shard_of, token_epoch};

use crate::cluster::wire::SnapshotEntry;

/// One held grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Grant {
    token: u64,
    lease_end_ms: u64,
}

/// A replicated grant whose token is not above the key's current token.
#[derive(Debug, PartialEq, Eq)]
pub struct OutOfOrder {
    pub key: Key,
    pub token: u64,
    pub previous: u64,
}

impl std::fmt::Display for OutOfOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "grant of {:?} with token {} after token {}", self.key, self.token, self.previous)
    }
}

/// The replicated table of one node.
#[derive(Debug)]
pub struct Mirror {
    grants: HashMap<Key, Grant, ahash::RandomState>,
    /// The highest epoch of any token applied, for the cluster logic.
    token_epoch_max: u64,
}

impl Mirror {
    pub fn new() -> Mirror {
        // Keys come from clients: a seeded hash keeps them from aiming at one bucket.
        let seed = crate::server::random_seed();
        let hasher = ahash::RandomState::with_seeds(seed, seed.rotate_left(17), seed ^ 0x9e37_79b9, 0x5bd1_e995);
        Mirror { grants: HashMap::with_hasher(hasher), token_epoch_max: 0 }
    }

    /// Held grants.
    pub fn len(&self) -> usize {
        self.grants.len()
    }

    pub fn token_epoch_max(&self) -> u64 {
        self.token_epoch_max
    }

    /// Applies one change made by the active's shards. A grant whose token
    /// is not above the key's current one is refused and changes nothing:
    /// within one active's stream a key's tokens only grow, so such a delta
    /// means the stream was applied out of order or is not an active's.
    pub fn apply(&mut self, now_ms: u64, delta: Delta) -> Result<(), OutOfOrder> {
        match delta {
            Delta::Grant { key, token, lease_ms } => {
                self.token_epoch_max = self.token_epoch_max.max(token_epoch(token));
                let grant = Grant { token, lease_end_ms: now_ms.saturating_add(lease_ms) };
                match self.grants.entry(key) {
                    Entry::Occupied(mut held) => {
                        let previous = held.get().token;
                        if token <= previous {
                            return Err(OutOfOrder { key: held.key().clone(), token, previous });
                        }
                        held.insert(grant);
                    }
                    Entry::Vacant(free) => {
                        free.insert(grant);
                    }
                }
            }
            Delta::Extend { key, token, lease_ms } => {
                if let Some(grant) = self.grants.get_mut(&key)
                    && grant.token == token
                {
                    grant.lease_end_ms = now_ms.saturating_add(lease_ms);
                }
            }
            Delta::Release { key, token } | Delta::Expire { key, token } => {
                if self.grants.get(&key).is_some_and(|grant| grant.token == token) {
                    self.grants.remove(&key);
                }
            }
        }
        Ok(())
    }

    /// Installs one entry of a snapshot.
    pub fn insert(&mut self, now_ms: u64, entry: SnapshotEntry) {
        self.token_epoch_max = self.token_epoch_max.max(token_epoch(entry.token));
        let grant = Grant { token: entry.token, lease_end_ms: now_ms.saturating_add(entry.lease_left_ms) };
        self.grants.insert(entry.key, grant);
    }

    /// Drops the grants whose lease ran out by `now_ms`: the active's expiry
    /// deltas normally remove them, but a standby that becomes active, or a
    /// snapshot, must not carry a lease that is already over.
    pub fn drop_expired(&mut self, now_ms: u64) {
        self.grants.retain(|_, grant| grant.lease_end_ms > now_ms);
    }

    /// The live grants as snapshot entries with the lease left at `now_ms`.
    pub fn entries(&self, now_ms: u64) -> impl Iterator<Item = SnapshotEntry> + '_ {
        self.grants.iter().filter(move |(_, grant)| grant.lease_end_ms > now_ms).map(move |(key, grant)| {
            SnapshotEntry { key: key.clone(), token: grant.token, lease_left_ms: grant.lease_end_ms - now_ms }
        })
    }

    /// The live grants split by the shard core that owns each key, as
    /// (key, token, lease left in ms), for the cores of a node becoming active.
    pub fn restore_lists(&self, now_ms: u64, cores: usize) -> Vec<Vec<(Key, u64, u64)>> {
        let mut lists: Vec<Vec<(Key, u64, u64)>> = (0..cores).map(|_| Vec::new()).collect();
        for entry in self.entries(now_ms) {
            lists[shard_of(entry.key.as_bytes(), cores)].push((entry.key, entry.token, entry.lease_left_ms));
        }
        lists
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> Key {
        Key::new(name.as_bytes())
    }

    #[test]
    fn follows_grants_hand_offs_extends_releases_and_expiries() {
        let mut mirror = Mirror::new();
        let first = ringlock_shards::token(32, 1);
        let second = ringlock_shards::token(32, 2);
        mirror.apply(100, Delta::Grant { key: key("a"), token: first, lease_ms: 1000 }).expect("in order");
        mirror.apply(100, Delta::Grant { key: key("b"), token: first, lease_ms: 50 }).expect("in order");
        assert_eq!(mirror.len(), 2);
        assert_eq!(mirror.token_epoch_max(), 32);
        // A hand-off: the old grant is released, the next waiter granted.
        mirror.apply(200, Delta::Release { key: key("a"), token: first }).expect("in order");
        mirror.apply(200, Delta::Grant { key: key("a"), token: second, lease_ms: 1000 }).expect("in order");
        // A release with a stale token changes nothing.
        mirror.apply(210, Delta::Release { key: key("a"), token: first }).expect("in order");
        mirror.apply(300, Delta::Extend { key: key("a"), token: second, lease_ms: 5000 }).expect("in order");
        let entries: Vec<SnapshotEntry> = mirror.entries(300).collect();
        assert_eq!(entries, vec![SnapshotEntry { key: key("a"), token: second, lease_left_ms: 5000 }]);
        mirror.apply(400, Delta::Expire { key: key("a"), token: second }).expect("in order");
        assert_eq!(mirror.entries(400).count(), 0);
    }

    #[test]
    fn snapshot_entries_keep_the_lease_left_and_restore_by_owning_core() {
        let mut mirror = Mirror::new();
        for index in 0..100u64 {
            let entry =
                SnapshotEntry { key: key(&format!("k{index}")), token: 1000 + index, lease_left_ms: 10 + index };
            mirror.insert(1000, entry);
        }
        mirror.drop_expired(1050);
        assert_eq!(mirror.len(), 59, "the leases of 10 to 50 ms ended by then");
        let lists = mirror.restore_lists(1050, 3);
        assert_eq!(lists.iter().map(Vec::len).sum::<usize>(), 59);
        for (core, list) in lists.iter().enumerate() {
            for (key, token, lease_left_ms) in list {
                assert_eq!(shard_of(key.as_bytes(), 3), core);
                assert_eq!(*lease_left_ms, 10 + (token - 1000) - 50);
            }
        }
    }

    #[test]
    fn a_grant_out_of_order_is_refused_and_changes_nothing() {
        let mut mirror = Mirror::new();
        mirror.apply(100, Delta::Grant { key: key("a"), token: 7, lease_ms: 1000 }).expect("in order");
        for token in [7, 6] {
            let refused = mirror.apply(200, Delta::Grant { key: key("a"), token, lease_ms: 10 });
            assert_eq!(refused, Err(OutOfOrder { key: key("a"), token, previous: 7 }));
        }
        let entries: Vec<SnapshotEntry> = mirror.entries(300).collect();
        assert_eq!(entries, vec![SnapshotEntry { key: key("a"), token: 7, lease_left_ms: 800 }]);
    }
}
