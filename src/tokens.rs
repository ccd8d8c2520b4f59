//! Token ranges for the shards, under the node's current epoch.
//!
//! This is the single-node stand-in for the replication core's token
//! service: shards ask for a range when they run low and get it at once.
//! Ranges come from one counter per epoch, so every range is above the ones
//! before it; when the sequence space of an epoch nears its end the node moves
//! to a new epoch, persisted before its first range is handed out (SPEC §2.6).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use ringlock_shards::TokenRange;
use ringlock_shards::token::SEQUENCE_MAX;

use crate::epoch::EpochStore;

/// Tokens in one range handed to a shard.
pub const TOKEN_RANGE_LEN: u64 = 1 << 16;

/// Hands out token ranges; shared by every shard core of a node.
pub struct TokenAuthority {
    node: u64,
    state: Mutex<AuthorityState>,
    /// The current epoch, readable without the lock (every `P` reads it).
    current: AtomicU64,
    range_len: u64,
}

struct AuthorityState {
    store: EpochStore,
    epoch: u64,
    next_sequence: u64,
}

impl TokenAuthority {
    /// Starts a new epoch for `node` (persisted with fsync) and hands out
    /// ranges of `range_len` tokens under it.
    pub fn start(mut store: EpochStore, node: u64, range_len: u64) -> Result<TokenAuthority, String> {
        assert!(range_len > 0 && range_len <= SEQUENCE_MAX);
        let previous = store.highest();
        let epoch = store.advance(node, 0)?;
        tracing::debug!(previous, epoch, "started a new epoch");
        Ok(TokenAuthority {
            node,
            state: Mutex::new(AuthorityState { store, epoch, next_sequence: 0 }),
            current: AtomicU64::new(epoch),
            range_len,
        })
    }

    /// The epoch tokens are issued in now.
    pub fn epoch(&self) -> u64 {
        self.current.load(Ordering::Relaxed)
    }

    /// The next range; moves to a new epoch when this one is used up.
    pub fn take_range(&self) -> Result<TokenRange, String> {
        let mut state = self.state.lock().expect("token authority lock");
        if state.next_sequence + self.range_len > SEQUENCE_MAX + 1 {
            let seen = state.epoch;
            state.epoch = state.store.advance(self.node, seen)?;
            self.current.store(state.epoch, Ordering::Relaxed);
            state.next_sequence = 0;
            tracing::info!(epoch = state.epoch, "sequence space used up; moved to a new epoch");
        }
        let first = state.next_sequence;
        state.next_sequence += self.range_len;
        Ok(TokenRange { epoch: state.epoch, first, end: first + self.range_len })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_increase_and_roll_over_to_a_new_persisted_epoch() {
        let dir = std::env::temp_dir().join(format!("ringlock-tokens-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = EpochStore::open(&dir).unwrap();
        // Ranges of a quarter of the sequence space: the fifth needs a new epoch.
        let authority = TokenAuthority::start(store, 0, (SEQUENCE_MAX + 1) / 4).unwrap();
        assert_eq!(authority.epoch(), 16);
        let mut last = 0;
        for _ in 0..4 {
            let range = authority.take_range().unwrap();
            assert_eq!(range.epoch, 16);
            let first = ringlock_shards::token(range.epoch, range.first);
            assert!(first > last);
            last = ringlock_shards::token(range.epoch, range.end - 1);
        }
        let range = authority.take_range().unwrap();
        assert_eq!((range.epoch, range.first), (32, 0));
        assert!(ringlock_shards::token(range.epoch, range.first) > last);
        drop(authority);
        assert_eq!(EpochStore::open(&dir).unwrap().highest(), 32, "the new epoch was persisted");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
