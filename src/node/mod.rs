//! What the shard cores of one node share, beside their mailboxes.
//!
//! # Layout
//! - `shared`: `Shared`, the settings, flags and counters every core sees.
//! - `epoch`: the durable epoch file.
//! - `tokens`: token ranges for the shards under the current epoch.
//! - `role`: a shard core's role in a cluster, the orders it takes and the
//!   reports it makes, and the link to the replication core.
//! - `counters`: what each core publishes for `S` and `/metrics`.
//! - `stats_reply`: the `S` reply's JSON.
//! - `seed`: random seeds for the lock tables' hash.
//! - `names`: the numbers that authenticated names have in the lock tables.

pub(crate) mod counters;
pub(crate) mod epoch;
pub(crate) mod names;
pub(crate) mod role;
pub(crate) mod seed;
pub(crate) mod shared;
pub(crate) mod stats_reply;
pub(crate) mod tokens;
