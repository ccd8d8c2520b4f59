//! Named limits of one shard, each with the error a request gets when it hits it.

use ringlock_proto::{LEASE_MS_MAX_DEFAULT, WAIT_MS_MAX};

/// The limits and settings of one shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardConfig {
    /// Keys held or waited on at once; beyond it, acquires of a new key get
    /// `too-many-keys`.
    pub keys_max: u32,
    /// Waiters queued on one key; beyond it, `too-many-waiters`.
    pub waiters_per_key_max: u32,
    /// Waiters queued on the whole shard; beyond it, `too-many-waiters`.
    pub waiters_max: u32,
    /// Keys held plus acquires queued by one authenticated name (never
    /// [`NameId::NONE`](crate::NameId::NONE)); at it, the name's acquires
    /// of a new key get `too-many-keys` and its acquires of a held key
    /// `too-many-waiters`. 0 = no quota.
    pub name_keys_max: u32,
    /// Keys held plus acquires queued through one client connection (its
    /// [`ClientId`](crate::ClientId)): grants it took that are still held,
    /// and its queued acquires; at it, as for `name_keys_max`. For a server
    /// without names. 0 = no quota.
    pub client_keys_max: u32,
    /// Longest lease an acquire or extend may ask for; beyond it, `bad-lease`.
    pub lease_ms_max: u64,
    /// Produce replication deltas (only needed when standbys listen).
    pub deltas: bool,
    /// Ask for a new token range when fewer than this many tokens are left.
    pub tokens_low_water: u64,
    /// Seed of the lock table's hash, so that clients cannot aim keys at one
    /// bucket chain. Deterministic tests pass a constant.
    pub hash_seed: u64,
}

/// Default [`ShardConfig::keys_max`]: 16 Mi keys.
pub const KEYS_MAX_DEFAULT: u32 = 1 << 24;
/// Default [`ShardConfig::waiters_per_key_max`].
pub const WAITERS_PER_KEY_MAX_DEFAULT: u32 = 65_536;
/// Default [`ShardConfig::waiters_max`].
pub const WAITERS_MAX_DEFAULT: u32 = 1 << 22;
/// Default [`ShardConfig::tokens_low_water`].
pub const TOKENS_LOW_WATER_DEFAULT: u64 = 1 << 16;
/// The largest value [`ShardConfig::keys_max`] and [`ShardConfig::waiters_max`]
/// may take: slot numbers keep their top bit for the timer wheel.
pub const SLOTS_MAX: u32 = (1 << 31) - 1;
/// The largest lease a shard supports: leases are kept in 32 bits of milliseconds.
pub const LEASE_MS_LIMIT: u64 = u32::MAX as u64;

impl Default for ShardConfig {
    fn default() -> Self {
        ShardConfig {
            keys_max: KEYS_MAX_DEFAULT,
            waiters_per_key_max: WAITERS_PER_KEY_MAX_DEFAULT,
            waiters_max: WAITERS_MAX_DEFAULT,
            name_keys_max: 0,
            client_keys_max: 0,
            lease_ms_max: LEASE_MS_MAX_DEFAULT,
            deltas: false,
            tokens_low_water: TOKENS_LOW_WATER_DEFAULT,
            hash_seed: 0,
        }
    }
}

impl ShardConfig {
    /// Checks the settings, saying what is wrong in words an operator can act on.
    pub fn validate(&self) -> Result<(), String> {
        if self.keys_max == 0 || self.keys_max > SLOTS_MAX {
            return Err(format!("keys per shard must be between 1 and {SLOTS_MAX}, not {}", self.keys_max));
        }
        if self.waiters_max > SLOTS_MAX {
            return Err(format!("waiters per shard must be at most {SLOTS_MAX}, not {}", self.waiters_max));
        }
        let timers = u64::from(self.keys_max) + u64::from(self.waiters_max);
        if timers > crate::timer_wheel::TIMERS_MAX as u64 {
            return Err(format!(
                "keys per shard ({}) plus waiters per shard ({}) must be at most {}, the timers one shard can hold",
                self.keys_max,
                self.waiters_max,
                crate::timer_wheel::TIMERS_MAX
            ));
        }
        if self.lease_ms_max == 0 || self.lease_ms_max > LEASE_MS_LIMIT {
            return Err(format!(
                "the longest lease must be between 1 ms and {LEASE_MS_LIMIT} ms, not {} ms",
                self.lease_ms_max
            ));
        }
        Ok(())
    }

    /// The longest wait a request may ask for, in milliseconds.
    pub const fn wait_ms_max(&self) -> u64 {
        WAIT_MS_MAX
    }
}
