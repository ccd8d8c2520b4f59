//! The replicated lock table: every held grant of the node's keys, with its
//! token and when its lease ends.
//!
//! On the active it is fed the shards' deltas and is what a joining standby
//! gets as a snapshot; on a standby it is fed the active's snapshot and delta
//! stream, and is what the shards restore when the node becomes active. It
//! A grant keeps the name that took it, so that after a failover the new
//! active still refuses its release or extend by another name.
//!
//! It reads no clock: every input carries `now_ms`, the replication core's
//! monotonic time. Leases are kept as deadlines in that time, so a lease on a
//! standby ends at most one replication lag later than on the active: late,
//! never early, which is the safe side for mutual exclusion.

use ringlock_shards::lock_index::LockIndex;
use ringlock_shards::{Delta, Key, NameId, shard_of, token_epoch};

use crate::cluster::receive::ReplicaTable;
use crate::cluster::wire::SnapshotEntry;
use crate::node::role::Restored;

/// One held grant.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Grant {
    key: Key,
    token: u64,
    /// When the lease ends (the high 48 bits, in the replication core's ms)
    /// and the name that took the grant (the low 16): one word, so that a
    /// grant with its name takes 48 bytes, as it did without.
    end_and_name: u64,
}

/// Lease ends are kept below 2^48 ms (some 8,900 years of uptime).
const LEASE_END_MS_MAX: u64 = (1 << 48) - 1;

impl Grant {
    fn new(key: Key, token: u64, lease_end_ms: u64, name: NameId) -> Grant {
        Grant { key, token, end_and_name: pack(lease_end_ms, name) }
    }

    fn lease_end_ms(&self) -> u64 {
        self.end_and_name >> 16
    }

    fn name(&self) -> NameId {
        NameId(self.end_and_name as u16)
    }

    fn set_lease_end_ms(&mut self, lease_end_ms: u64) {
        self.end_and_name = pack(lease_end_ms, self.name());
    }
}

fn pack(lease_end_ms: u64, name: NameId) -> u64 {
    (lease_end_ms.min(LEASE_END_MS_MAX) << 16) | u64::from(name.0)
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
///
/// Grants live in numbered slots, found by key through an index. A slot
/// keeps its number for as long as its grant lives, and a freed slot is
/// reused, so a walk over the slot numbers that spans many turns (a
/// snapshot sent in slices) meets every grant that lives throughout it.
///
/// The index is the shards' own [`LockIndex`]: it grows a few buckets at a
/// time, so millions of grants never stop the replication core (and its
/// heartbeats) for a rehash of them all.
#[derive(Debug)]
pub struct Mirror {
    slots: Vec<Option<Grant>>,
    free: Vec<u32>,
    /// Slot numbers, by the hash of their key.
    index: LockIndex,
    /// The highest epoch of any token applied, for the cluster logic.
    token_epoch_max: u64,
}

impl Mirror {
    /// An empty mirror.
    pub fn new() -> Mirror {
        // Keys come from clients: a seeded hash keeps them from aiming at one bucket.
        let seed = crate::node::seed::random_seed();
        let hasher = ahash::RandomState::with_seeds(seed, seed.rotate_left(17), seed ^ 0x9e37_79b9, 0x5bd1_e995);
        Mirror { slots: Vec::new(), free: Vec::new(), index: LockIndex::new(hasher), token_epoch_max: 0 }
    }

    /// Held grants: every slot but the free ones.
    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    pub fn token_epoch_max(&self) -> u64 {
        self.token_epoch_max
    }

    /// The slot holding `key`, if any.
    fn find(&self, key: &[u8]) -> Option<u32> {
        let slots = &self.slots;
        self.index
            .find(self.index.hash(key), |slot| slots[slot as usize].as_ref().is_some_and(|grant| grant.key.is(key)))
    }

    /// Stores a grant for a key that has none.
    fn add(&mut self, grant: Grant) {
        let hash = self.index.hash(grant.key.as_bytes());
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(grant);
                slot
            }
            None => {
                self.slots.push(Some(grant));
                (self.slots.len() - 1) as u32
            }
        };
        self.index.insert(hash, slot);
    }

    /// Frees `slot` and its index entry.
    fn remove(&mut self, slot: u32) {
        let Some(grant) = self.slots[slot as usize].take() else { return };
        self.index.remove(self.index.hash(grant.key.as_bytes()), slot);
        self.free.push(slot);
    }

    /// Applies one change made by the active's shards. A grant whose token
    /// is not above the key's current one is refused and changes nothing:
    /// within one active's stream a key's tokens only grow, so such a delta
    /// means the stream was applied out of order or is not an active's.
    pub fn apply(&mut self, now_ms: u64, delta: Delta) -> Result<(), OutOfOrder> {
        match delta {
            Delta::Grant { key, token, lease_ms, name } => {
                let lease_end_ms = now_ms.saturating_add(lease_ms);
                match self.find(key.as_bytes()) {
                    Some(slot) => {
                        let held = self.slots[slot as usize].as_mut().expect("an indexed slot holds a grant");
                        if token <= held.token {
                            return Err(OutOfOrder { key, token, previous: held.token });
                        }
                        held.token = token;
                        held.end_and_name = pack(lease_end_ms, name);
                    }
                    None => self.add(Grant::new(key, token, lease_end_ms, name)),
                }
                self.token_epoch_max = self.token_epoch_max.max(token_epoch(token));
            }
            Delta::Extend { key, token, lease_ms } => {
                if let Some(slot) = self.find(key.as_bytes())
                    && let Some(grant) = self.slots[slot as usize].as_mut()
                    && grant.token == token
                {
                    grant.set_lease_end_ms(now_ms.saturating_add(lease_ms));
                }
            }
            Delta::Release { key, token } | Delta::Expire { key, token } => {
                if let Some(slot) = self.find(key.as_bytes())
                    && self.slots[slot as usize].as_ref().is_some_and(|grant| grant.token == token)
                {
                    self.remove(slot);
                }
            }
        }
        Ok(())
    }

    /// Installs one entry of a snapshot, in place of what the key had: a
    /// snapshot entry is the key's state when it was sent, which is newer
    /// than anything received before it.
    pub fn insert(&mut self, now_ms: u64, entry: SnapshotEntry) {
        self.token_epoch_max = self.token_epoch_max.max(token_epoch(entry.token));
        let lease_end_ms = now_ms.saturating_add(entry.lease_left_ms);
        match self.find(entry.key.as_bytes()) {
            Some(slot) => {
                let held = self.slots[slot as usize].as_mut().expect("an indexed slot holds a grant");
                held.token = entry.token;
                held.end_and_name = pack(lease_end_ms, entry.name);
            }
            None => self.add(Grant::new(entry.key, entry.token, lease_end_ms, entry.name)),
        }
    }

    /// Drops the grants whose lease ran out by `now_ms`: the active's expiry
    /// deltas normally remove them, but a standby that becomes active, or a
    /// snapshot, must not carry a lease that is already over.
    pub fn drop_expired(&mut self, now_ms: u64) {
        for slot in 0..self.slots.len() as u32 {
            if self.slots[slot as usize].as_ref().is_some_and(|grant| grant.lease_end_ms() <= now_ms) {
                self.remove(slot);
            }
        }
    }

    /// The live grants as snapshot entries with the lease left at `now_ms`.
    pub fn entries(&self, now_ms: u64) -> impl Iterator<Item = SnapshotEntry> + '_ {
        self.slots.iter().flatten().filter_map(move |grant| entry_of(grant, now_ms))
    }

    /// One slice of a walk over the table: the live grants of the slots from
    /// `first_slot` on, at most `count_max` of them, appended to `out`.
    /// Returns the slot to go on from, or `None` once the walk is past the
    /// last slot.
    pub fn entries_from(
        &self,
        first_slot: usize,
        now_ms: u64,
        count_max: usize,
        out: &mut Vec<SnapshotEntry>,
    ) -> Option<usize> {
        let end = out.len() + count_max;
        let mut slot = first_slot;
        while slot < self.slots.len() {
            if out.len() >= end {
                return Some(slot);
            }
            if let Some(entry) = self.slots[slot].as_ref().and_then(|grant| entry_of(grant, now_ms)) {
                out.push(entry);
            }
            slot += 1;
        }
        None
    }

    /// The live grants split by the shard core that owns each key, as
    /// (key, token, lease left in ms, name), for the cores of a node
    /// becoming active.
    pub fn restore_lists(&self, now_ms: u64, cores: usize) -> Vec<Vec<Restored>> {
        let mut lists: Vec<Vec<Restored>> = (0..cores).map(|_| Vec::new()).collect();
        for entry in self.entries(now_ms) {
            let core = shard_of(entry.key.as_bytes(), cores);
            lists[core].push((entry.key, entry.token, entry.lease_left_ms, entry.name));
        }
        lists
    }
}

/// A grant as a snapshot entry, if its lease has not run out by `now_ms`.
fn entry_of(grant: &Grant, now_ms: u64) -> Option<SnapshotEntry> {
    (grant.lease_end_ms() > now_ms).then(|| SnapshotEntry {
        key: grant.key.clone(),
        token: grant.token,
        lease_left_ms: grant.lease_end_ms() - now_ms,
        name: grant.name(),
    })
}

/// The receive rules of `cluster::receive` run on the mirror.
impl ReplicaTable for Mirror {
    type Entry = SnapshotEntry;
    type Delta = Delta;
    type Refused = OutOfOrder;

    fn empty() -> Mirror {
        Mirror::new()
    }

    fn insert(&mut self, now_ms: u64, entry: SnapshotEntry) {
        Mirror::insert(self, now_ms, entry);
    }

    fn apply(&mut self, now_ms: u64, delta: Delta) -> Result<(), OutOfOrder> {
        Mirror::apply(self, now_ms, delta)
    }

    fn len(&self) -> usize {
        Mirror::len(self)
    }

    fn token_epoch_max(&self) -> u64 {
        Mirror::token_epoch_max(self)
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
        mirror
            .apply(100, Delta::Grant { key: key("a"), token: first, lease_ms: 1000, name: NameId::NONE })
            .expect("in order");
        mirror
            .apply(100, Delta::Grant { key: key("b"), token: first, lease_ms: 50, name: NameId::NONE })
            .expect("in order");
        assert_eq!(mirror.len(), 2);
        assert_eq!(mirror.token_epoch_max(), 32);
        // A hand-off: the old grant is released, the next waiter granted.
        mirror.apply(200, Delta::Release { key: key("a"), token: first }).expect("in order");
        mirror
            .apply(200, Delta::Grant { key: key("a"), token: second, lease_ms: 1000, name: NameId::NONE })
            .expect("in order");
        // A release with a stale token changes nothing.
        mirror.apply(210, Delta::Release { key: key("a"), token: first }).expect("in order");
        mirror.apply(300, Delta::Extend { key: key("a"), token: second, lease_ms: 5000 }).expect("in order");
        let entries: Vec<SnapshotEntry> = mirror.entries(300).collect();
        assert_eq!(
            entries,
            vec![SnapshotEntry { key: key("a"), token: second, lease_left_ms: 5000, name: NameId::NONE }]
        );
        mirror.apply(400, Delta::Expire { key: key("a"), token: second }).expect("in order");
        assert_eq!(mirror.entries(400).count(), 0);
    }

    #[test]
    fn snapshot_entries_keep_the_lease_left_and_restore_by_owning_core() {
        let mut mirror = Mirror::new();
        for index in 0..100u64 {
            let entry = SnapshotEntry {
                key: key(&format!("k{index}")),
                token: 1000 + index,
                lease_left_ms: 10 + index,
                name: NameId::NONE,
            };
            mirror.insert(1000, entry);
        }
        mirror.drop_expired(1050);
        assert_eq!(mirror.len(), 59, "the leases of 10 to 50 ms ended by then");
        let lists = mirror.restore_lists(1050, 3);
        assert_eq!(lists.iter().map(Vec::len).sum::<usize>(), 59);
        for (core, list) in lists.iter().enumerate() {
            for (key, token, lease_left_ms, _) in list {
                assert_eq!(shard_of(key.as_bytes(), 3), core);
                assert_eq!(*lease_left_ms, 10 + (token - 1000) - 50);
            }
        }
    }

    #[test]
    fn a_grant_out_of_order_is_refused_and_changes_nothing() {
        let mut mirror = Mirror::new();
        mirror
            .apply(100, Delta::Grant { key: key("a"), token: 7, lease_ms: 1000, name: NameId::NONE })
            .expect("in order");
        for token in [7, 6] {
            let refused = mirror.apply(200, Delta::Grant { key: key("a"), token, lease_ms: 10, name: NameId::NONE });
            assert_eq!(refused, Err(OutOfOrder { key: key("a"), token, previous: 7 }));
        }
        let entries: Vec<SnapshotEntry> = mirror.entries(300).collect();
        assert_eq!(entries, vec![SnapshotEntry { key: key("a"), token: 7, lease_left_ms: 800, name: NameId::NONE }]);
    }

    /// Every live grant of `mirror`, sorted, as (key, token, lease end).
    fn contents(mirror: &Mirror, now_ms: u64) -> Vec<(Vec<u8>, u64, u64)> {
        let mut all: Vec<_> =
            mirror.entries(now_ms).map(|e| (e.key.as_bytes().to_vec(), e.token, now_ms + e.lease_left_ms)).collect();
        all.sort();
        all
    }

    proptest::proptest! {
        /// A snapshot sent in slices while the table keeps changing, with
        /// the deltas in between, gives the standby the active's table.
        #[test]
        fn a_snapshot_sent_in_slices_between_deltas_ends_as_the_active_table(
            before in proptest::collection::vec((0u8..40, 0u8..4), 0..200),
            during in proptest::collection::vec((0u8..40, 0u8..4), 0..400),
            slice in 1usize..20,
        ) {
            let mut active = Mirror::new();
            let mut next_token = 1u64;
            let mut change = |mirror: &mut Mirror, key_index: u8, kind: u8| -> Option<Delta> {
                let key = key(&format!("k{key_index}"));
                let held = mirror.find(key.as_bytes()).and_then(|slot| mirror.slots[slot as usize].clone());
                let delta = match (kind, held) {
                    (0 | 1, None) | (0, Some(_)) => {
                        next_token += 1;
                        Delta::Grant { key, token: next_token, lease_ms: 10_000 + u64::from(key_index), name: NameId::NONE }
                    }
                    (1, Some(grant)) => Delta::Extend { key, token: grant.token, lease_ms: 20_000 },
                    (2, Some(grant)) => Delta::Release { key, token: grant.token },
                    (3, Some(grant)) => Delta::Expire { key, token: grant.token },
                    _ => return None,
                };
                mirror.apply(0, delta.clone()).expect("the active's own deltas are in order");
                Some(delta)
            };
            for (key_index, kind) in before {
                change(&mut active, key_index, kind);
            }
            // The standby: a fresh mirror fed the slices and deltas in the
            // order the active sends them.
            let mut standby = Mirror::new();
            let mut next_slot = Some(0);
            let mut during = during.into_iter();
            while let Some(first_slot) = next_slot {
                let mut entries = Vec::new();
                next_slot = active.entries_from(first_slot, 0, slice, &mut entries);
                for entry in entries {
                    standby.insert(0, entry);
                }
                for (key_index, kind) in during.by_ref().take(3) {
                    if let Some(delta) = change(&mut active, key_index, kind) {
                        standby.apply(0, delta).expect("deltas after a slice are in order for the standby");
                    }
                }
            }
            for (key_index, kind) in during {
                if let Some(delta) = change(&mut active, key_index, kind) {
                    standby.apply(0, delta).expect("in order");
                }
            }
            proptest::prop_assert_eq!(contents(&standby, 0), contents(&active, 0));
        }
    }

    #[test]
    fn a_grant_keeps_its_name_through_deltas_snapshots_and_restores() {
        let (alpha, beta) = (NameId(1), NameId(2));
        let mut active = Mirror::new();
        active.apply(100, Delta::Grant { key: key("a"), token: 5, lease_ms: 1000, name: alpha }).expect("in order");
        active.apply(100, Delta::Grant { key: key("b"), token: 6, lease_ms: 1000, name: beta }).expect("in order");
        // An extend keeps the name; a hand-off takes the new holder's.
        active.apply(200, Delta::Extend { key: key("a"), token: 5, lease_ms: 3000 }).expect("in order");
        active.apply(300, Delta::Release { key: key("b"), token: 6 }).expect("in order");
        active.apply(300, Delta::Grant { key: key("b"), token: 7, lease_ms: 1000, name: alpha }).expect("in order");
        let mut standby = Mirror::new();
        for entry in active.entries(300) {
            standby.insert(300, entry);
        }
        let mut got: Vec<(Vec<u8>, u64, u64, NameId)> =
            standby.entries(400).map(|e| (e.key.as_bytes().to_vec(), e.token, e.lease_left_ms, e.name)).collect();
        got.sort();
        assert_eq!(got, vec![(b"a".to_vec(), 5, 2800, alpha), (b"b".to_vec(), 7, 900, alpha)]);
        let restored: Vec<Restored> = standby.restore_lists(400, 1).remove(0);
        assert!(restored.iter().all(|(_, _, _, name)| *name == alpha), "{restored:?}");
        assert_eq!(size_of::<Option<Grant>>(), 48, "a grant with its name stays at 48 bytes");
    }

    #[test]
    fn freed_slots_are_reused_and_a_walk_sees_each_live_grant_once() {
        let mut mirror = Mirror::new();
        for token in 1..=10 {
            mirror
                .apply(0, Delta::Grant { key: key(&format!("k{token}")), token, lease_ms: 100, name: NameId::NONE })
                .expect("in order");
        }
        mirror.apply(0, Delta::Release { key: key("k3"), token: 3 }).expect("in order");
        mirror
            .apply(0, Delta::Grant { key: key("k11"), token: 11, lease_ms: 100, name: NameId::NONE })
            .expect("in order");
        assert_eq!(mirror.slots.len(), 10, "k11 took k3's slot");
        let mut seen = Vec::new();
        let mut next = Some(0);
        while let Some(first) = next {
            next = mirror.entries_from(first, 0, 3, &mut seen);
        }
        let mut tokens: Vec<u64> = seen.iter().map(|entry| entry.token).collect();
        tokens.sort_unstable();
        assert_eq!(tokens, vec![1, 2, 4, 5, 6, 7, 8, 9, 10, 11]);
        assert_eq!(mirror.len(), 10);
    }
}
