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
//!   growth moves about 1/256 of the keys: near 7.3 M keys, about 29 K
//!   entries, which took 0.6–1.1 ms on the test machine. Keys spread evenly
//!   but not exactly, so the sub-tables reach their growth points at
//!   slightly different key counts, and the growths of one doubling happen
//!   hundreds of requests apart on average rather than within one request.
//! - **No slab reads while growing.** Each entry keeps the low 32 bits of
//!   its key's hash beside the slot, and a sub-table places entries by those
//!   bits alone. Growing reads the entries and nothing else: rehashing by the
//!   key would read the lock slab at a random place for every entry, a cache
//!   miss each, while a sub-table of tens of thousands of entries moves
//!   within the core's caches.
//!
//! The price is 4 bytes more per bucket (9 with hashbrown's control byte,
//! against 5 for a bare slot), about 7 bytes per held lock, and a few
//! instructions per request to split the hash, done once per request in
//! [`KeyHash`]. Sizing a single table for the key limit at start also avoids
//! growth, but it costs its pages before any key comes.

use ahash::RandomState;
use hashbrown::HashTable;
use hashbrown::hash_table::OccupiedEntry;

/// Top bits of a key's hash that choose its sub-table.
const SUB_TABLE_BITS: u32 = 8;

/// How many sub-tables the index is split into.
pub const SUB_TABLES: usize = 1 << SUB_TABLE_BITS;

/// A key's hash, split once into the two parts the index uses, so that a
/// request that looks its key up and then adds or removes it splits it once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyHash {
    /// The hash the key's sub-table files it under (see [`place_hash`]).
    place: u64,
    /// The key's sub-table. As a `u8` it indexes the array of 256 with no
    /// bounds check.
    sub_table: u8,
}

impl KeyHash {
    /// Splits a 64-bit hash: its top bits choose the sub-table, its low 32
    /// bits place the key within it.
    #[inline]
    pub fn from_hash(hash: u64) -> KeyHash {
        const _: () = assert!(SUB_TABLE_BITS == u8::BITS, "a sub-table number is a u8");
        KeyHash { place: place_hash(hash as u32), sub_table: (hash >> (u64::BITS - SUB_TABLE_BITS)) as u8 }
    }

    /// The bits of the hash that an entry keeps.
    #[inline]
    fn low(self) -> u32 {
        self.place as u32
    }
}

/// One key's entry: its lock's slot, and enough of its hash to place it in
/// its sub-table without reading the key.
#[derive(Clone, Copy, Debug)]
struct Entry {
    slot: u32,
    hash_low: u32,
}

/// A key found by [`LockIndex::find_mut`], which can leave the index without
/// a second search.
pub struct Found<'index> {
    entry: OccupiedEntry<'index, Entry>,
}

impl Found<'_> {
    /// The slot of the key's lock.
    #[inline]
    pub fn slot(&self) -> u32 {
        self.entry.get().slot
    }

    /// Takes the key out of the index.
    #[inline]
    pub fn remove(self) {
        self.entry.remove();
    }
}

/// A map from a key's hash to the slot of its lock. It holds no keys: a
/// lookup confirms a candidate slot through the caller's `is_key`, since
/// different keys may share a hash.
#[derive(Debug)]
pub struct LockIndex {
    /// Seeded per shard, so that clients cannot aim keys at one place.
    hasher: RandomState,
    sub_tables: Box<[HashTable<Entry>; SUB_TABLES]>,
}

impl LockIndex {
    /// An empty index that hashes keys with `hasher`. Sub-tables allocate
    /// when their first key comes.
    pub fn new(hasher: RandomState) -> LockIndex {
        LockIndex { hasher, sub_tables: Box::new(std::array::from_fn(|_| HashTable::new())) }
    }

    /// The hash of `key`, for the other methods. Every request hashes its
    /// key once, and a call here would cost more than the work it wraps.
    #[inline(always)]
    pub fn hash(&self, key: &[u8]) -> KeyHash {
        KeyHash::from_hash(self.hasher.hash_one(key))
    }

    /// The slot of the key with this `hash`, for which `is_key(slot)` holds.
    #[inline]
    pub fn find(&self, hash: KeyHash, mut is_key: impl FnMut(u32) -> bool) -> Option<u32> {
        let hash_low = hash.low();
        // The stored bits are compared first, which spares a slab read for
        // most keys that only share the control byte's seven bits.
        self.sub_tables[usize::from(hash.sub_table)]
            .find(hash.place, |entry| entry.hash_low == hash_low && is_key(entry.slot))
            .map(|entry| entry.slot)
    }

    /// [`LockIndex::find`], for a caller that may then remove the key.
    #[inline]
    pub fn find_mut(&mut self, hash: KeyHash, mut is_key: impl FnMut(u32) -> bool) -> Option<Found<'_>> {
        let hash_low = hash.low();
        self.sub_tables[usize::from(hash.sub_table)]
            .find_entry(hash.place, |entry| entry.hash_low == hash_low && is_key(entry.slot))
            .ok()
            .map(|entry| Found { entry })
    }

    /// Adds `slot` for a key with this `hash` that the index does not hold.
    #[inline]
    pub fn insert(&mut self, hash: KeyHash, slot: u32) {
        let entry = Entry { slot, hash_low: hash.low() };
        self.sub_tables[usize::from(hash.sub_table)]
            .insert_unique(hash.place, entry, |entry| place_hash(entry.hash_low));
    }

    /// Removes `slot`, filed under `hash`; false if it is not there.
    #[inline]
    pub fn remove(&mut self, hash: KeyHash, slot: u32) -> bool {
        // A slot is in the index at most once, so it alone names the entry.
        match self.sub_tables[usize::from(hash.sub_table)].find_entry(hash.place, |entry| entry.slot == slot) {
            Ok(entry) => {
                entry.remove();
                true
            }
            Err(_) => false,
        }
    }

    /// Heap bytes of the index, for memory measurements.
    pub fn allocation_size(&self) -> usize {
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
}

/// The hash a sub-table files an entry under, made of the stored bits alone
/// so that growing needs nothing else. hashbrown takes the bucket from the
/// hash's low bits and the control byte from its top seven, so both halves
/// carry the stored bits: a sub-table would need 2^25 buckets (2^33 keys in
/// all, beyond `SLOTS_MAX`) before the two uses overlap, and even then only
/// the control byte would filter less. The sub-table's own choice comes from
/// the hash's top bits, which are not among these, so within a sub-table the
/// entries still spread evenly.
#[inline]
fn place_hash(hash_low: u32) -> u64 {
    let wide = u64::from(hash_low);
    (wide << 32) | wide
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
        let mut capacity_before = 0;
        for (slot, key) in keys.iter().enumerate() {
            index.insert(index.hash(key), slot as u32);
            let capacity: usize = index.sub_table_capacities().iter().sum();
            growths += usize::from(capacity != capacity_before);
            capacity_before = capacity;
        }
        // 390 keys per sub-table on average: each grew from nothing through
        // 3, 7, 14, 28, 56, 112, 224 and 448 entries.
        assert!(growths >= 8 * SUB_TABLES, "only {growths} growths");
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
    fn one_insert_grows_at_most_one_sub_table() {
        let keys = keys(20_000);
        let mut index = index();
        let mut before = index.sub_table_capacities();
        for (slot, key) in keys.iter().enumerate() {
            index.insert(index.hash(key), slot as u32);
            let after = index.sub_table_capacities();
            let grown = before.iter().zip(&after).filter(|(old, new)| old != new).count();
            assert!(grown <= 1, "insert {slot} grew {grown} sub-tables");
            before = after;
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
    fn hashes_that_differ_only_in_the_sub_table_bits_stay_apart() {
        // Same low 32 bits, so the same place within a sub-table, but two
        // sub-tables: neither lookup sees the other's entry.
        let first = KeyHash::from_hash(0x0100_0000_1234_5678);
        let second = KeyHash::from_hash(0x0200_0000_1234_5678);
        assert_ne!(first.sub_table, second.sub_table);
        assert_eq!(first.place, second.place);
        let mut index = index();
        index.insert(first, 1);
        assert_eq!(index.find(second, |_| true), None);
        index.insert(second, 2);
        assert_eq!(index.find(first, |_| true), Some(1));
        assert_eq!(index.find(second, |_| true), Some(2));
        assert!(!index.remove(second, 1), "slot 1 is filed under the other hash");
        assert!(index.remove(first, 1));
        assert_eq!(index.find(second, |_| true), Some(2));
    }

    #[test]
    fn an_entry_is_placed_again_by_its_stored_bits_alone() {
        // What growing relies on: the stored bits rebuild the hash a lookup
        // uses, in every bit hashbrown reads (all of them, here).
        for hash in [0, 1, u64::MAX, 0xdead_beef_0123_4567, 0x8000_0000_ffff_0000] {
            let key_hash = KeyHash::from_hash(hash);
            assert_eq!(place_hash(key_hash.low()), key_hash.place);
            assert_eq!(key_hash.low(), hash as u32);
            assert_eq!(u64::from(key_hash.sub_table), hash >> 56);
        }
    }
}
