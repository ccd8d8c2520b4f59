//! The lock table's index: from a key's hash to its lock's slot in the slab.
//!
//! # Why it is not one hash table
//! A hash table grows by moving every entry into a table twice as large, all
//! in one step. With one table per shard, that step moved millions of
//! entries at once and stopped the shard's core for more than half a second
//! near 7 M keys, with every client of the core waiting. Two choices bound
//! the step instead:
//!
//! - **Many small tables.** The index is [`SUB_TABLES`] sub-tables, one
//!   chosen by the top bits of the key's hash, each growing on its own. One
//!   growth moves about 1/256 of the keys. Keys spread evenly but not
//!   exactly, so the sub-tables reach their growth points at slightly
//!   different key counts, and the growths of one doubling happen a few
//!   hundred requests apart rather than within one request.
//! - **No slab reads while growing.** Each entry keeps the low 32 bits of
//!   its key's hash beside the slot, and a sub-table places entries by those
//!   bits alone. Growing reads the entries and nothing else: rehashing by the
//!   key would read the lock slab at a random place for every entry, a cache
//!   miss each, while a sub-table of tens of thousands of entries moves
//!   within the core's caches.
//!
//! The price is 4 bytes more per bucket (9 with hashbrown's control byte,
//! against 5 for a bare slot), about 7 bytes per held lock, and one shift
//! and one load per lookup to pick the sub-table. Sizing a single table for
//! the key limit at start also avoids growth, but it costs its pages before
//! any key comes.

use hashbrown::HashTable;

/// Top bits of a key's hash that choose its sub-table.
const SUB_TABLE_BITS: u32 = 8;

/// How many sub-tables the index is split into.
pub(crate) const SUB_TABLES: usize = 1 << SUB_TABLE_BITS;

/// One key's entry: its lock's slot, and enough of its hash to place it in
/// its sub-table without reading the key.
#[derive(Clone, Copy, Debug)]
struct Entry {
    slot: u32,
    hash_low: u32,
}

/// A map from a key's 64-bit hash to the slot of its lock. It holds no keys:
/// a lookup confirms a candidate slot through the caller's `is_key`, since
/// different keys may share a hash.
pub(crate) struct LockIndex {
    sub_tables: Box<[HashTable<Entry>; SUB_TABLES]>,
}

impl LockIndex {
    /// An empty index; sub-tables allocate when their first key comes.
    pub(crate) fn new() -> LockIndex {
        LockIndex { sub_tables: Box::new(std::array::from_fn(|_| HashTable::new())) }
    }

    /// The slot of the key with this `hash`, for which `is_key(slot)` holds.
    #[inline]
    pub(crate) fn find(&self, hash: u64, mut is_key: impl FnMut(u32) -> bool) -> Option<u32> {
        let hash_low = hash as u32;
        // The stored bits are compared first, which spares a slab read for
        // most keys that only share the control byte's seven bits.
        self.sub_table(hash)
            .find(place_hash(hash_low), |entry| entry.hash_low == hash_low && is_key(entry.slot))
            .map(|entry| entry.slot)
    }

    /// Adds `slot` for a key with this `hash` that the index does not hold.
    #[inline]
    pub(crate) fn insert(&mut self, hash: u64, slot: u32) {
        let hash_low = hash as u32;
        self.sub_table_mut(hash)
            .insert_unique(place_hash(hash_low), Entry { slot, hash_low }, |entry| place_hash(entry.hash_low));
    }

    /// Removes `slot`, filed under `hash`; false if it is not there.
    #[inline]
    pub(crate) fn remove(&mut self, hash: u64, slot: u32) -> bool {
        // A slot is in the index at most once, so it alone names the entry.
        match self.sub_table_mut(hash).find_entry(place_hash(hash as u32), |entry| entry.slot == slot) {
            Ok(entry) => {
                entry.remove();
                true
            }
            Err(_) => false,
        }
    }

    /// Heap bytes of the index, for memory measurements.
    pub(crate) fn allocation_size(&self) -> usize {
        size_of::<[HashTable<Entry>; SUB_TABLES]>()
            + self.sub_tables.iter().map(HashTable::allocation_size).sum::<usize>()
    }

    /// Entries in the index.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.sub_tables.iter().map(HashTable::len).sum()
    }

    /// Each sub-table's capacity, to watch them grow.
    #[cfg(test)]
    pub(crate) fn sub_table_capacities(&self) -> Vec<usize> {
        self.sub_tables.iter().map(HashTable::capacity).collect()
    }

    #[inline]
    fn sub_table(&self, hash: u64) -> &HashTable<Entry> {
        &self.sub_tables[sub_table_of(hash)]
    }

    #[inline]
    fn sub_table_mut(&mut self, hash: u64) -> &mut HashTable<Entry> {
        &mut self.sub_tables[sub_table_of(hash)]
    }
}

#[inline]
fn sub_table_of(hash: u64) -> usize {
    (hash >> (u64::BITS - SUB_TABLE_BITS)) as usize
}

/// The hash a sub-table files an entry under, made of the stored bits alone
/// so that growing needs nothing else. hashbrown takes the bucket from the
/// hash's low bits and the control byte from its top seven, so both halves
/// carry the stored bits: a sub-table would need 2^25 buckets (2^33 keys in
/// all, beyond `SLOTS_MAX`) before the two uses overlap. The sub-table's own
/// choice comes from the hash's top bits, which are not among these, so
/// within a sub-table the entries still spread evenly.
#[inline]
fn place_hash(hash_low: u32) -> u64 {
    let wide = u64::from(hash_low);
    (wide << 32) | wide
}

#[cfg(test)]
mod tests {
    use super::*;
    use ahash::RandomState;

    fn hasher() -> RandomState {
        RandomState::with_seeds(1, 2, 3, 4)
    }

    /// Keys `key-0`, `key-1`... with their slot equal to their number.
    fn keys(count: u32) -> Vec<Vec<u8>> {
        (0..count).map(|number| format!("key-{number}").into_bytes()).collect()
    }

    fn find(index: &LockIndex, hasher: &RandomState, keys: &[Vec<u8>], key: &[u8]) -> Option<u32> {
        index.find(hasher.hash_one(key), |slot| keys[slot as usize] == key)
    }

    #[test]
    fn every_key_is_found_across_growth_and_removed_keys_are_gone() {
        let hasher = hasher();
        let keys = keys(100_000);
        let mut index = LockIndex::new();
        let mut growths = 0;
        let mut capacity_before = 0;
        for (slot, key) in keys.iter().enumerate() {
            index.insert(hasher.hash_one(key), slot as u32);
            let capacity: usize = index.sub_table_capacities().iter().sum();
            growths += usize::from(capacity != capacity_before);
            capacity_before = capacity;
        }
        // 390 keys per sub-table on average: each grew from nothing through
        // 3, 7, 14, 28, 56, 112, 224 and 448 entries.
        assert!(growths >= 8 * SUB_TABLES, "only {growths} growths");
        assert_eq!(index.len(), keys.len());
        for (slot, key) in keys.iter().enumerate() {
            assert_eq!(find(&index, &hasher, &keys, key), Some(slot as u32), "{key:?}");
        }

        for (slot, key) in keys.iter().enumerate().filter(|(slot, _)| slot % 3 != 0) {
            assert!(index.remove(hasher.hash_one(key), slot as u32));
        }
        assert_eq!(index.len(), keys.len().div_ceil(3));
        for (slot, key) in keys.iter().enumerate() {
            let expected = (slot % 3 == 0).then_some(slot as u32);
            assert_eq!(find(&index, &hasher, &keys, key), expected, "{key:?}");
        }
        assert_eq!(find(&index, &hasher, &keys, b"never-inserted"), None);
    }

    #[test]
    fn one_insert_grows_at_most_one_sub_table() {
        let hasher = hasher();
        let keys = keys(20_000);
        let mut index = LockIndex::new();
        let mut before = index.sub_table_capacities();
        for (slot, key) in keys.iter().enumerate() {
            index.insert(hasher.hash_one(key), slot as u32);
            let after = index.sub_table_capacities();
            let grown = before.iter().zip(&after).filter(|(old, new)| old != new).count();
            assert!(grown <= 1, "insert {slot} grew {grown} sub-tables");
            before = after;
        }
    }

    #[test]
    fn keys_with_one_hash_are_told_apart_by_the_caller() {
        // Three slots under one hash, as three keys that collide would be.
        let hash = 0xdead_beef_0123_4567;
        let mut index = LockIndex::new();
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
    fn hashes_that_differ_only_in_the_sub_table_bits_stay_apart() {
        // Same low 32 bits, so the same place within a sub-table, but two
        // sub-tables: neither lookup sees the other's entry.
        let (first, second) = (0x0100_0000_1234_5678_u64, 0x0200_0000_1234_5678_u64);
        let mut index = LockIndex::new();
        index.insert(first, 1);
        assert_eq!(index.find(second, |_| true), None);
        index.insert(second, 2);
        assert_eq!(index.find(first, |_| true), Some(1));
        assert_eq!(index.find(second, |_| true), Some(2));
        assert!(!index.remove(second, 1), "slot 1 is filed under the other hash");
        assert!(index.remove(first, 1));
        assert_eq!(index.find(second, |_| true), Some(2));
    }
}
