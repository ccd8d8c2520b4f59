//! The lock table's index: from a key's hash to its lock's slot in the slab.
//!
//! # Shape
//! One open-addressing table of 8-byte entries, probed linearly. An entry
//! holds its lock's slot and 32 bits of its key's hash, the *tag*, side by
//! side, and the tag alone places it: its low bits are its home bucket. So
//! a lookup reads the table's header (kept in the shard, beside its other
//! hot fields) and then, for a key that is there, usually one cache line of
//! entries, where the tags rule out every other key before the lock slab is
//! read. (A key that is not there is searched for up to the next empty
//! bucket, a few lines away at worst near full load, and while the table
//! grows, in the old table too.) A lookup in
//! a general-purpose table reads a line of control bytes and then another of
//! entries; a request that finds its index cold in the cache (the kernel's
//! network work between two batches evicts much of the core's L1) pays one
//! miss here where it paid two, and one dependent miss fewer before the
//! lock's own line.
//!
//! # Growing a step at a time
//! A table grows by moving every entry into one twice as large. All in one
//! step, that stopped a shard's core for more than half a second near 7 M
//! keys, with every client of the core waiting. Here the larger table is
//! allocated zeroed (a large one from fresh pages, which cost nothing until
//! written; a smaller one, up to tens of MiB, may be cleared first, a few
//! milliseconds at most) and the
//! entries move [`MOVES_PER_CHANGE`] buckets at a time, with each insert and
//! each removal, while lookups search both tables. The move reads the old
//! entries and nothing else: the tag gives an entry's place in the new table,
//! so no key is read from the slab and hashed again. Inserts go to the new
//! table; a key removed from the old one leaves a *tombstone* there, so that
//! the probe sequences of the keys behind it stay whole until they move.
//! Since a growth starts at three quarters full and moves eight buckets per
//! insert, it ends long before the new table is three quarters full itself.
//!
//! # Costs
//! At most three quarters of the buckets are used, so a table filling up
//! takes between 10.7 and 21.3 bytes per key (about 13 at 10 M keys). While
//! a growth runs, the old table is kept too: up to 32 bytes per key. The
//! table never shrinks, so after many removals it keeps the size of its
//! peak, as the lock slab does. Removal in the current table
//! shifts the entries behind the removed one back (no tombstones), so a
//! table with keys coming and going keeps its probe sequences short.

use ahash::RandomState;

/// An empty bucket.
const EMPTY: u64 = 0;

/// The slot field of a tombstone: a key removed from the old table while
/// it grows. It is above every slot + 1 (`SLOTS_MAX` is 2^31 - 1).
const TOMBSTONE_SLOT: u32 = u32::MAX;

/// A tombstone entry.
const TOMBSTONE: u64 = (TOMBSTONE_SLOT as u64) << 32;

/// Buckets of the first table.
const BUCKETS_MIN: usize = 16;

/// Old buckets moved by each insert and each removal while the table grows.
pub const MOVES_PER_CHANGE: usize = 8;

/// A key's hash as the index uses it: the tag its entry keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyHash {
    tag: u32,
}

impl KeyHash {
    /// The bits kept, for other tables that want a cheap first comparison
    /// before they compare keys (the hot-keys sketch).
    pub(crate) fn bits(self) -> u64 {
        u64::from(self.tag)
    }

    /// The index's part of a 64-bit hash.
    #[inline]
    pub fn from_hash(hash: u64) -> KeyHash {
        KeyHash { tag: hash as u32 }
    }
}

/// The highest slot an entry can hold: slot + 1 must be neither 0 (empty)
/// nor [`TOMBSTONE_SLOT`]. Above `SLOTS_MAX`, so a shard never reaches it;
/// the replication core's mirror, which holds every shard's grants, would
/// need billions.
pub const SLOT_MAX: u32 = TOMBSTONE_SLOT - 2;

/// One bucket: the tag in the low 32 bits, the slot + 1 in the high 32 (so
/// that an all-zero bucket is empty and a table can be allocated zeroed).
#[inline]
fn entry(tag: u32, slot: u32) -> u64 {
    assert!(slot <= SLOT_MAX, "slot {slot} is beyond what the index holds");
    u64::from(tag) | (u64::from(slot + 1) << 32)
}

#[inline]
fn entry_tag(entry: u64) -> u32 {
    entry as u32
}

/// The slot + 1 of a bucket: 0 if empty, [`TOMBSTONE_SLOT`] for a tombstone.
#[inline]
fn entry_slot_field(entry: u64) -> u32 {
    (entry >> 32) as u32
}

/// One open-addressing table; its length is a power of two.
#[derive(Debug, Default)]
struct Table {
    buckets: Box<[u64]>,
}

impl Table {
    /// A table of `len` empty buckets, allocated zeroed.
    fn with_buckets(len: usize) -> Table {
        debug_assert!(len.is_power_of_two());
        Table { buckets: vec![EMPTY; len].into_boxed_slice() }
    }

    #[inline]
    fn mask(&self) -> usize {
        self.buckets.len().wrapping_sub(1)
    }

    /// The bucket of the live entry with `tag` for which `is_key(slot)`
    /// holds. Tombstones are passed over; an empty bucket ends the search.
    #[inline(always)]
    fn find(&self, tag: u32, mut is_key: impl FnMut(u32) -> bool) -> Option<usize> {
        if self.buckets.is_empty() {
            return None;
        }
        let mask = self.mask();
        let mut at = tag as usize & mask;
        loop {
            let entry = self.buckets[at];
            let slot_field = entry_slot_field(entry);
            if slot_field == 0 {
                return None;
            }
            if entry_tag(entry) == tag && slot_field != TOMBSTONE_SLOT && is_key(slot_field - 1) {
                return Some(at);
            }
            at = (at + 1) & mask;
        }
    }

    /// Puts `entry` in the first free bucket from its home. The caller keeps
    /// the table under three quarters full, so there is one.
    #[inline]
    fn put(&mut self, entry: u64) {
        let mask = self.mask();
        let mut at = entry_tag(entry) as usize & mask;
        while self.buckets[at] != EMPTY {
            at = (at + 1) & mask;
        }
        self.buckets[at] = entry;
    }

    /// Empties bucket `at` and shifts back the entries behind it that may
    /// move, so that every probe sequence stays unbroken without tombstones.
    fn remove_shifting(&mut self, mut hole: usize) {
        let mask = self.mask();
        let mut at = hole;
        loop {
            at = (at + 1) & mask;
            let entry = self.buckets[at];
            if entry == EMPTY {
                break;
            }
            // The entry may fill the hole if the hole lies between its home
            // and where it is now, going forward.
            let home = entry_tag(entry) as usize & mask;
            if at.wrapping_sub(home) & mask >= at.wrapping_sub(hole) & mask {
                self.buckets[hole] = entry;
                hole = at;
            }
        }
        self.buckets[hole] = EMPTY;
    }

    fn allocation_size(&self) -> usize {
        size_of_val(&*self.buckets)
    }
}

/// Which table a found key is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    Current(usize),
    Old(usize),
}

/// A key found by [`LockIndex::find_mut`], which can leave the index without
/// a second search.
pub struct Found<'index> {
    index: &'index mut LockIndex,
    place: Place,
    slot: u32,
}

impl Found<'_> {
    /// The slot of the key's lock.
    #[inline]
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// Takes the key out of the index.
    #[inline]
    pub fn remove(self) {
        self.index.remove_at(self.place);
    }
}

/// A map from a key's hash to the slot of its lock. It holds no keys: a
/// lookup confirms a candidate slot through the caller's `is_key`, since
/// different keys may share a tag.
#[derive(Debug)]
pub struct LockIndex {
    /// Seeded per shard, so that clients cannot aim keys at one place.
    hasher: RandomState,
    /// Where inserts go.
    current: Table,
    /// The table being moved into `current`, while a growth runs; empty
    /// otherwise.
    old: Table,
    /// Old buckets before this one have moved.
    moved: usize,
    /// Keys in both tables.
    len: usize,
}

impl LockIndex {
    /// An empty index that hashes keys with `hasher`. It allocates when its
    /// first key comes.
    pub fn new(hasher: RandomState) -> LockIndex {
        LockIndex { hasher, current: Table::default(), old: Table::default(), moved: 0, len: 0 }
    }

    /// The hash of `key`, for the other methods. Every request hashes its
    /// key once, and a call here would cost more than the work it wraps.
    #[inline(always)]
    pub fn hash(&self, key: &[u8]) -> KeyHash {
        KeyHash::from_hash(self.hasher.hash_one(key))
    }

    /// The slot of the key with this `hash`, for which `is_key(slot)` holds.
    #[inline]
    pub fn find(&self, hash: KeyHash, is_key: impl FnMut(u32) -> bool) -> Option<u32> {
        self.locate(hash, is_key).map(|(_, slot)| slot)
    }

    /// [`LockIndex::find`], for a caller that may then remove the key.
    #[inline]
    pub fn find_mut(&mut self, hash: KeyHash, is_key: impl FnMut(u32) -> bool) -> Option<Found<'_>> {
        let (place, slot) = self.locate(hash, is_key)?;
        Some(Found { index: self, place, slot })
    }

    /// Adds `slot` for a key with this `hash` that the index does not hold.
    #[inline]
    pub fn insert(&mut self, hash: KeyHash, slot: u32) {
        if (self.len + 1) * 4 > self.current.buckets.len() * 3 {
            self.grow();
        }
        self.current.put(entry(hash.tag, slot));
        self.len += 1;
        self.move_some();
    }

    /// Removes `slot`, filed under `hash`; false if it is not there.
    #[inline]
    pub fn remove(&mut self, hash: KeyHash, slot: u32) -> bool {
        // A slot is in the index at most once, so it alone names the entry.
        match self.locate(hash, |candidate| candidate == slot) {
            Some((place, _)) => {
                self.remove_at(place);
                true
            }
            None => false,
        }
    }

    /// Heap bytes of the index, for memory measurements.
    pub fn allocation_size(&self) -> usize {
        self.current.allocation_size() + self.old.allocation_size()
    }

    /// Keys in the index.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Buckets of the table inserts go to, to watch it grow.
    #[cfg(test)]
    pub(crate) fn buckets(&self) -> usize {
        self.current.buckets.len()
    }

    /// Whether a growth is still moving entries.
    #[cfg(test)]
    pub(crate) fn is_growing(&self) -> bool {
        !self.old.buckets.is_empty()
    }

    /// Where the key is, searching the current table first. Inlined into
    /// each caller, so that the request path makes no call to find a key.
    #[inline(always)]
    fn locate(&self, hash: KeyHash, mut is_key: impl FnMut(u32) -> bool) -> Option<(Place, u32)> {
        let slot_of = |table: &Table, at: usize| entry_slot_field(table.buckets[at]) - 1;
        if let Some(at) = self.current.find(hash.tag, &mut is_key) {
            return Some((Place::Current(at), slot_of(&self.current, at)));
        }
        let at = self.old.find(hash.tag, is_key)?;
        Some((Place::Old(at), slot_of(&self.old, at)))
    }

    #[inline]
    fn remove_at(&mut self, place: Place) {
        match place {
            Place::Current(at) => self.current.remove_shifting(at),
            Place::Old(at) => self.old.buckets[at] = TOMBSTONE,
        }
        self.len -= 1;
        self.move_some();
    }

    /// Starts moving into a table twice as large. A growth still running
    /// (which the move rate rules out) is finished first.
    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        while !self.old.buckets.is_empty() {
            self.move_some();
        }
        let buckets = (self.current.buckets.len() * 2).max(BUCKETS_MIN);
        // The growth that ended reset `moved` as it emptied the old table.
        debug_assert_eq!(self.moved, 0);
        self.old = std::mem::replace(&mut self.current, Table::with_buckets(buckets));
    }

    /// Moves the next [`MOVES_PER_CHANGE`] old buckets, if a growth runs.
    #[inline]
    fn move_some(&mut self) {
        if self.old.buckets.is_empty() {
            return;
        }
        self.move_buckets();
    }

    #[inline(never)]
    fn move_buckets(&mut self) {
        let end = (self.moved + MOVES_PER_CHANGE).min(self.old.buckets.len());
        for at in self.moved..end {
            let entry = self.old.buckets[at];
            let slot_field = entry_slot_field(entry);
            if slot_field != 0 && slot_field != TOMBSTONE_SLOT {
                self.current.put(entry);
                // Keys behind it, not moved yet, may probe through this
                // bucket. An empty bucket stays empty: no probe crossed it,
                // and the empty quarter of the table ends every search.
                self.old.buckets[at] = TOMBSTONE;
            }
        }
        self.moved = end;
        if end == self.old.buckets.len() {
            self.old = Table::default();
            self.moved = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index() -> LockIndex {
        LockIndex::new(RandomState::with_seeds(1, 2, 3, 4))
    }

    /// Keys `key-0`, `key-1`... with their slot equal to their number.
    fn keys(count: u32) -> Vec<Vec<u8>> {
        (0..count).map(|number| format!("key-{number}").into_bytes()).collect()
    }

    fn find(index: &LockIndex, keys: &[Vec<u8>], key: &[u8]) -> Option<u32> {
        index.find(index.hash(key), |slot| keys[slot as usize] == key)
    }

    #[test]
    fn every_key_is_found_across_growth_and_removed_keys_are_gone() {
        let keys = keys(100_000);
        let mut index = index();
        let mut growths = 0;
        let mut buckets_before = 0;
        for (slot, key) in keys.iter().enumerate() {
            index.insert(index.hash(key), slot as u32);
            growths += usize::from(index.buckets() != buckets_before);
            buckets_before = index.buckets();
        }
        // 16, 32, ... 262,144 buckets (three quarters of 131,072 is less
        // than 100,000): 15 tables.
        assert_eq!(growths, 15);
        assert_eq!(index.len(), keys.len());
        for (slot, key) in keys.iter().enumerate() {
            assert_eq!(find(&index, &keys, key), Some(slot as u32), "{key:?}");
        }

        for (slot, key) in keys.iter().enumerate().filter(|(slot, _)| slot % 3 != 0) {
            assert!(index.remove(index.hash(key), slot as u32));
        }
        assert_eq!(index.len(), keys.len().div_ceil(3));
        for (slot, key) in keys.iter().enumerate() {
            let expected = (slot % 3 == 0).then_some(slot as u32);
            assert_eq!(find(&index, &keys, key), expected, "{key:?}");
        }
        assert_eq!(find(&index, &keys, b"never-inserted"), None);
    }

    #[test]
    fn keys_stay_found_while_a_growth_moves_them_and_keys_come_and_go() {
        // Inserts, removals and lookups in every phase of several growths:
        // before, while and after each move, keys in both tables.
        let keys = keys(40_000);
        let mut index = index();
        let mut present = vec![false; keys.len()];
        let mut seen_growing = 0;
        for (slot, key) in keys.iter().enumerate() {
            index.insert(index.hash(key), slot as u32);
            present[slot] = true;
            // Remove an earlier key now and then, from either table.
            if slot % 5 == 4 {
                let gone = slot / 2;
                if present[gone] {
                    assert!(index.remove(index.hash(&keys[gone]), gone as u32));
                    present[gone] = false;
                }
            }
            if index.is_growing() {
                seen_growing += 1;
                // Check a spread of keys while both tables hold some.
                for probe in (0..=slot).step_by(997) {
                    let expected = present[probe].then_some(probe as u32);
                    assert_eq!(find(&index, &keys, &keys[probe]), expected, "key {probe} at insert {slot}");
                }
            }
        }
        assert!(seen_growing > 1000, "growths ran over {seen_growing} inserts");
        assert_eq!(index.len(), present.iter().filter(|&&here| here).count());
        for (slot, key) in keys.iter().enumerate() {
            assert_eq!(find(&index, &keys, key), present[slot].then_some(slot as u32), "{key:?}");
        }
    }

    #[test]
    fn a_growth_ends_before_the_new_table_needs_one() {
        let keys = keys(50_000);
        let mut index = index();
        for (slot, key) in keys.iter().enumerate() {
            let (buckets, growing) = (index.buckets(), index.is_growing());
            index.insert(index.hash(key), slot as u32);
            if index.buckets() != buckets {
                assert!(!growing, "insert {slot} grew a table that was still growing");
            }
        }
    }

    #[test]
    fn a_key_found_for_change_is_removed_by_its_handle() {
        let keys = keys(1000);
        let mut index = index();
        for (slot, key) in keys.iter().enumerate() {
            index.insert(index.hash(key), slot as u32);
        }
        let hash = index.hash(&keys[500]);
        let found = index.find_mut(hash, |slot| keys[slot as usize] == keys[500]).expect("key 500 is there");
        assert_eq!(found.slot(), 500);
        found.remove();
        assert_eq!(find(&index, &keys, &keys[500]), None);
        assert!(index.find_mut(hash, |slot| keys[slot as usize] == keys[500]).is_none());
        assert_eq!(index.len(), 999);
        for (slot, key) in keys.iter().enumerate().filter(|(slot, _)| *slot != 500) {
            assert_eq!(find(&index, &keys, key), Some(slot as u32));
        }
    }

    #[test]
    fn keys_with_one_hash_are_told_apart_by_the_caller() {
        // Three slots under one hash, as three keys that collide would be.
        let hash = KeyHash::from_hash(0xdead_beef_0123_4567);
        let mut index = index();
        for slot in [4, 9, 2] {
            index.insert(hash, slot);
        }
        for slot in [4, 9, 2] {
            assert_eq!(index.find(hash, |candidate| candidate == slot), Some(slot));
        }
        assert!(index.remove(hash, 9));
        assert!(!index.remove(hash, 9), "a slot is removed once");
        assert_eq!(index.find(hash, |candidate| candidate == 9), None);
        assert_eq!(index.find(hash, |candidate| candidate == 4), Some(4));
        assert_eq!(index.find(hash, |candidate| candidate == 2), Some(2));
        assert_eq!(index.len(), 2);
    }

    #[test]
    fn removal_shifts_back_entries_across_the_end_of_the_table() {
        // Tags whose home is the last buckets: their probe sequences wrap
        // to the front. Removing from the middle of the run must leave every
        // other one reachable.
        let mut index = index();
        index.insert(KeyHash::from_hash(0), 0);
        let buckets = index.buckets();
        let last = (buckets - 1) as u64;
        let hashes = [last, last, last - 1, last, 0, 1, last - 1];
        for (slot, &hash) in hashes.iter().enumerate() {
            index.insert(KeyHash::from_hash(hash), slot as u32 + 1);
        }
        assert_eq!(index.buckets(), buckets, "the run stays in one table");
        let mut left: Vec<u32> = (1..=hashes.len() as u32).collect();
        for removed in [2, 4, 1] {
            assert!(index.remove(KeyHash::from_hash(hashes[removed as usize - 1]), removed));
            left.retain(|&slot| slot != removed);
            for (slot, &hash) in (1..).zip(&hashes) {
                let expected = left.contains(&slot).then_some(slot);
                assert_eq!(index.find(KeyHash::from_hash(hash), |candidate| candidate == slot), expected);
            }
        }
        assert_eq!(index.find(KeyHash::from_hash(0), |candidate| candidate == 0), Some(0));
    }

    proptest::proptest! {
        /// Any mix of inserts and removals, with lookups after each, agrees
        /// with a map of the same keys. Tags come from a small range, so
        /// that keys share buckets and tags, runs wrap around the end of a
        /// table, and the caller's `is_key` has to tell keys apart.
        #[test]
        fn the_index_agrees_with_a_map_through_growths(
            ops in proptest::collection::vec((0u32..3000, 0u64..512, proptest::bool::ANY), 1..3000),
        ) {
            // Key `k` has hash `hashes[k]`; a key's slot is its number. The
            // caller's check fails on a slot that no key was given, as the
            // shard's would (it indexes the lock slab).
            let is = |key: u32| move |slot: u32| {
                assert!(slot < 3000, "is_key asked about slot {slot}");
                slot == key
            };
            let mut hashes = std::collections::HashMap::new();
            let mut present = std::collections::BTreeSet::new();
            let mut index = index();
            for (step, (key, hash, insert)) in ops.into_iter().enumerate() {
                let hash = *hashes.entry(key).or_insert(hash);
                let key_hash = KeyHash::from_hash(hash);
                if insert && !present.contains(&key) {
                    index.insert(key_hash, key);
                    present.insert(key);
                } else if !insert && step % 2 == 0 {
                    proptest::prop_assert_eq!(index.remove(key_hash, key), present.remove(&key));
                } else if !insert {
                    // Removed through the handle of a search, as a release does.
                    let found = index.find_mut(key_hash, is(key));
                    proptest::prop_assert_eq!(found.as_ref().map(Found::slot), present.contains(&key).then_some(key));
                    if let Some(found) = found {
                        found.remove();
                        present.remove(&key);
                    }
                }
                proptest::prop_assert_eq!(index.len(), present.len());
                let found = index.find(key_hash, is(key));
                proptest::prop_assert_eq!(found, present.contains(&key).then_some(key));
            }
            for (&key, &hash) in &hashes {
                let found = index.find(KeyHash::from_hash(hash), is(key));
                proptest::prop_assert_eq!(found, present.contains(&key).then_some(key));
            }
        }
    }

    #[test]
    fn a_search_passes_over_tombstones_without_asking_about_them() {
        // Tags 0 to 24: the 25th insert starts the growth from 32 buckets
        // to 64, which moves old buckets 0 to 7 and leaves tombstones there,
        // whose tag bits are 0. Removing slot 20, still in the old table,
        // leaves another, and moves buckets 8 to 15; 16 to 31 remain.
        let mut index = index();
        for slot in 0..25 {
            index.insert(KeyHash::from_hash(u64::from(slot)), slot);
        }
        assert!(index.remove(KeyHash::from_hash(20), 20));
        assert!(index.is_growing());
        // A search for tag 0 that matches no key reaches the old table and
        // its tombstones; the caller is only asked about real slots.
        let asked_about_real_slots = |slot: u32| {
            assert!(slot < 25, "asked about slot {slot}");
            false
        };
        assert_eq!(index.find(KeyHash::from_hash(0), asked_about_real_slots), None);
        assert_eq!(index.find(KeyHash::from_hash(20), |slot| slot == 20), None);
        assert_eq!(index.find(KeyHash::from_hash(21), |slot| slot == 21), Some(21));
    }

    #[test]
    fn a_new_table_is_allocated_zeroed_and_empty() {
        let table = Table::with_buckets(64);
        assert!(table.buckets.iter().all(|&bucket| entry_slot_field(bucket) == 0));
        assert_eq!(table.find(0, |_| true), None);
        assert_eq!(entry_slot_field(entry(7, 0)), 1, "slot 0 is not an empty bucket");
    }
}
