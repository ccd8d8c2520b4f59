//! The lock shard of ringlock: a pure state machine.
//!
//! A [`Shard`] owns one hash-partition of the lock table: per key the holder
//! (token and lease deadline) and a FIFO queue of waiters, a hierarchical
//! [`TimerWheel`] for lease and wait deadlines, and the fencing-token ranges
//! it may issue from. It does no I/O, starts no thread and reads no clock:
//! every input carries `now_ms`, and every output is an [`Effect`] (a reply
//! addressed to a client, or a request for tokens) or, when enabled, a
//! replication [`Delta`] (taken apart with [`Shard::take_deltas`]).
//! That is what lets the server's event loop drive it at full speed and lets
//! tests drive it through thousands of seeded schedules.
//!
//! # Layout
//! - [`shard`]: the state machine: acquire, release, extend, waiter gone,
//!   advance time, token ranges; reply ordering per (client, key).
//! - [`timer_wheel`]: hierarchical timer wheel, 1 ms resolution, O(1) insert
//!   and cancel.
//! - [`token`]: the token layout (epoch and sequence) and the ranges a shard
//!   issues from.
//! - [`effect`]: what the shard asks its caller to do.
//! - [`histogram`]: fixed-bucket duration histograms (waits and holds).
//! - [`hot_keys`]: the keys waited on and handed off most in the last
//!   minute, in a bounded sketch.
//! - [`key`]: keys stored inline up to 24 bytes.
//! - [`limits`]: named limits and settings with their defaults.
//! - [`lock_index`]: the table's index from a key's hash to its lock's slot,
//!   one cache line per lookup, growing a few buckets at a time (the
//!   replication core's table uses it too).
//!
//! # Memory
//! Measured with a counting allocator by `cargo bench -p ringlock-shards
//! --bench shard` (1 Mi entries, 16-byte keys, so every key is inline):
//! - **104 B per held lock**: a 64-byte slab entry (the name that took the
//!   grant, with client authentication, fills 2 bytes that were padding), a
//!   24-byte timer node and 16 bytes of index (8-byte buckets, a `u32` slot beside 32 bits of the
//!   key's hash so that the index grows without reading keys, at most three
//!   quarters of them used: 2 Mi buckets for 1 Mi keys).
//! - **180 B per waiter** when every waiter comes from its own connection: a
//!   48-byte node, a 24-byte timer, and one entry in each of the per-client
//!   and per-(client, key) maps; waiters of one connection share those entries.
//!
//! A free key holds no memory: its slab slot and timer return to free lists
//! that the next key reuses.

pub mod effect;
pub mod histogram;
pub mod hot_keys;
pub mod key;
pub mod limits;
pub mod lock_index;
pub mod shard;
pub mod timer_wheel;
pub mod token;

pub use effect::{ClientId, Delta, Effect, KeyState, NameId, ShardReply};
pub use histogram::{HISTOGRAM_BOUNDS, HISTOGRAM_BOUNDS_MS, Histogram};
pub use hot_keys::{HOT_KEYS_REPORTED, HotKeyCounts, HotKeys};
pub use key::{KEY_INLINE_LEN_MAX, Key};
pub use limits::ShardConfig;
pub use shard::{Shard, ShardStats};
pub use timer_wheel::{TimerHandle, TimerWheel};
pub use token::{TokenRange, TokenRangeError, TokenSupply, token, token_epoch, token_sequence};

/// The shard that owns `key` among `shards` shards. Every part of the server
/// routes with this one function; the seeds are fixed so that the answer
/// depends on the key alone.
#[inline(always)]
pub fn shard_of(key: &[u8], shards: usize) -> usize {
    debug_assert!(shards > 0);
    if shards == 1 {
        // One shard owns every key: no need to hash, nor to call anything,
        // as this runs for every request.
        return 0;
    }
    shard_of_hashed(key, shards)
}

/// [`shard_of`] among more than one shard.
fn shard_of_hashed(key: &[u8], shards: usize) -> usize {
    const ROUTING: ahash::RandomState = ahash::RandomState::with_seeds(
        0x243f_6a88_85a3_08d3,
        0x1319_8a2e_0370_7344,
        0xa409_3822_299f_31d0,
        0x082e_fa98_ec4e_6c89,
    );
    // Multiply-shift maps the hash onto 0..shards without a division.
    ((u128::from(ROUTING.hash_one(key)) * shards as u128) >> 64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_of_is_stable_and_spreads() {
        let mut counts = [0usize; 4];
        for i in 0..4000u32 {
            let key = format!("key-{i}");
            let shard = shard_of(key.as_bytes(), 4);
            assert_eq!(shard, shard_of(key.as_bytes(), 4));
            counts[shard] += 1;
        }
        assert!(counts.iter().all(|&count| count > 800), "{counts:?}");
        assert_eq!(shard_of(b"anything", 1), 0);
    }
}
