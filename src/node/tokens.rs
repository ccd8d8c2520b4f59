//! Token ranges for the shards, under the node's current epoch.
//!
//! Shards ask for a range when they run low and get it at once. Ranges come
//! from one counter per epoch, so every range is above the ones before it.
//! A single node owns its epoch store: when the sequence space of an epoch
//! nears its end it moves to a new epoch, persisted before its first range is
//! handed out (docs/protocol.md §2.6). In a cluster the replication core decides the
//! epoch (an election ballot, persisted by the core) and sets it with
//! [`TokenAuthority::activate`]; a used-up epoch is reported to it instead.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use ringlock_shards::TokenRange;
use ringlock_shards::token::SEQUENCE_MAX;

use crate::node::epoch::EpochStore;

/// Tokens in one range handed to a shard.
pub const TOKEN_RANGE_LEN: u64 = 1 << 16;

/// Hands out token ranges; shared by every shard core of a node.
pub struct TokenAuthority {
    node: u64,
    state: Mutex<AuthorityState>,
    /// The current epoch, readable without the lock (every `P` reads it).
    current: AtomicU64,
    range_len: u64,
    /// Cluster: the epoch's sequence space ran out; the replication core
    /// must move to a new epoch.
    exhausted: AtomicBool,
}

struct AuthorityState {
    /// A single node's own store; `None` in a cluster.
    store: Option<EpochStore>,
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
            state: Mutex::new(AuthorityState { store: Some(store), epoch, next_sequence: 0 }),
            current: AtomicU64::new(epoch),
            range_len,
            exhausted: AtomicBool::new(false),
        })
    }
}

// Called by the replication core, which is not built yet (issue 6).
#[cfg_attr(not(test), allow(dead_code))]
impl TokenAuthority {
    /// A cluster member's authority: no tokens until [`activate`](Self::activate).
    pub fn cluster(node: u64, range_len: u64) -> TokenAuthority {
        assert!(range_len > 0 && range_len <= SEQUENCE_MAX);
        TokenAuthority {
            node,
            state: Mutex::new(AuthorityState { store: None, epoch: 0, next_sequence: 0 }),
            current: AtomicU64::new(0),
            range_len,
            exhausted: AtomicBool::new(false),
        }
    }

    /// Hands out ranges of `epoch` from now on (already persisted by the caller).
    pub fn activate(&self, epoch: u64) {
        let mut state = self.state.lock().expect("token authority lock");
        if state.epoch != epoch {
            state.epoch = epoch;
            state.next_sequence = 0;
        }
        self.current.store(epoch, Ordering::Relaxed);
        self.exhausted.store(false, Ordering::Relaxed);
    }

    /// Hands out nothing more: the node is not active.
    pub fn deactivate(&self) {
        let mut state = self.state.lock().expect("token authority lock");
        state.epoch = 0;
        self.current.store(0, Ordering::Relaxed);
    }

    /// Cluster: whether the current epoch ran out since the last call.
    pub fn take_exhausted(&self) -> bool {
        self.exhausted.swap(false, Ordering::Relaxed)
    }
}

impl TokenAuthority {
    /// The epoch tokens are issued in now.
    pub fn epoch(&self) -> u64 {
        self.current.load(Ordering::Relaxed)
    }

    /// The next range; moves to a new epoch when this one is used up.
    pub fn take_range(&self) -> Result<TokenRange, String> {
        let mut state = self.state.lock().expect("token authority lock");
        if state.epoch == 0 {
            return Err("this node is not active".to_string());
        }
        if state.next_sequence + self.range_len > SEQUENCE_MAX + 1 {
            let seen = state.epoch;
            let Some(store) = &mut state.store else {
                self.exhausted.store(true, Ordering::Relaxed);
                return Err(format!("the sequence space of epoch {seen} is used up; moving to a new epoch"));
            };
            state.epoch = store.advance(self.node, seen)?;
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

    #[test]
    fn a_cluster_authority_hands_out_ranges_only_in_the_epoch_it_is_given() {
        const HALF: u64 = 1 << 39;
        assert_eq!(2 * HALF, SEQUENCE_MAX + 1);
        let authority = TokenAuthority::cluster(2, HALF);
        assert!(authority.take_range().is_err(), "no token before the node is active");
        authority.activate(34);
        assert_eq!(authority.epoch(), 34);
        let first = authority.take_range().unwrap();
        assert_eq!((first.epoch, first.first), (34, 0));
        assert_eq!(authority.take_range().unwrap().epoch, 34);
        assert!(!authority.take_exhausted());
        assert!(authority.take_range().is_err(), "a used-up epoch is not left on its own");
        assert!(authority.take_exhausted(), "and it is reported once");
        assert!(!authority.take_exhausted());
        authority.activate(50);
        assert_eq!(authority.take_range().unwrap(), TokenRange { epoch: 50, first: 0, end: HALF });
        authority.deactivate();
        assert_eq!(authority.epoch(), 0);
        assert!(authority.take_range().is_err(), "nothing once the node stops being active");
    }
}
