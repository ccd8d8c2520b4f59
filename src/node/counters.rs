//! The counters each core publishes once per loop turn, read by `S` and
//! `/metrics`.

use ringlock_proto::{Op, Reply};
use ringlock_shards::{HotKeyCounts, ShardStats};

/// What one core publishes for `S` and `/metrics`, once per loop turn.
#[derive(Clone, Debug, Default)]
pub struct CoreStats {
    pub shard: ShardStats,
    pub connections: u64,
    /// Connections refused by `--max-connections-per-ip` since the start.
    pub refused_per_ip: u64,
    /// Connections refused by `--max-connections` (or a full core).
    pub refused_max_connections: u64,
    /// Connections refused because the server was stopping.
    pub refused_shutting_down: u64,
    /// Connections admitted and served since the start.
    pub accepted: u64,
    /// Times a connection stopped being read because it had the most
    /// requests in flight a connection may have.
    pub in_flight_pauses: u64,
    /// Replies written, by operation and result.
    pub requests: RequestCounters,
    /// `U` lines whose secret named nobody.
    pub auth_failures: u64,
    /// Connections closed because a reload removed their name.
    pub auth_revocations: u64,
    /// TLS connections ended by a TLS error (a failed handshake, a bad record).
    pub tls_errors: u64,
    /// Times the core's unsent replies went over its share of
    /// `--max-unsent-mb` and every connection was squeezed.
    pub output_squeezes: u64,
    /// Connections closed because their unsent replies stalled for
    /// `--output-stall-ms`.
    pub output_stall_closes: u64,
    /// The shard's hot keys (see `ringlock_shards::HotKeys`), copied at most
    /// every `HOT_KEYS_PUBLISH_MS`: keys waited on, keys handed off.
    pub hot_waits: HotKeyCounts,
    pub hot_handoffs: HotKeyCounts,
    /// Requests one connection may have parsed per turn now, and the
    /// average cost of a request it follows (see the dispatcher's pacing).
    pub turn_share: u32,
    pub request_cost_ns: u64,
}

/// The operations replies are counted by, as metric labels; `none` is a
/// line that named no operation (`E - - <code>`), `auth` is `U`.
pub const REQUEST_OPS: [&str; 8] = ["acquire", "release", "extend", "inspect", "ping", "stats", "none", "auth"];
/// The results replies are counted by, as metric labels.
pub const REQUEST_RESULTS: [&str; 4] = ["ok", "timeout", "moved", "error"];

/// Replies by operation and result: one increment per reply, on the core
/// that writes it, so counting costs no atomic and no allocation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestCounters {
    /// Indexed by [`REQUEST_OPS`], then [`REQUEST_RESULTS`].
    pub counts: [[u64; REQUEST_RESULTS.len()]; REQUEST_OPS.len()],
}

impl RequestCounters {
    /// Counts the reply about to be written.
    #[inline(always)]
    pub fn count(&mut self, reply: &Reply<'_>) {
        let (op, result) = match *reply {
            Reply::Acquired { .. } => (0, 0),
            Reply::TimedOut { .. } => (0, 1),
            Reply::Released { .. } => (1, 0),
            Reply::Extended { .. } => (2, 0),
            Reply::Inspected { .. } => (3, 0),
            Reply::Pong { .. } => (4, 0),
            Reply::Stats { .. } => (5, 0),
            Reply::Authenticated { .. } => (7, 0),
            Reply::Moved { op, .. } => (op_index(op), 2),
            Reply::Error { op, .. } => (op.map_or(6, op_index), 3),
        };
        self.counts[op][result] += 1;
    }

    pub fn add(&mut self, other: &RequestCounters) {
        for (sums, counts) in self.counts.iter_mut().zip(&other.counts) {
            for (sum, count) in sums.iter_mut().zip(counts) {
                *sum += count;
            }
        }
    }
}

#[inline(always)]
fn op_index(op: Op) -> usize {
    match op {
        Op::Acquire => 0,
        Op::Release => 1,
        Op::Extend => 2,
        Op::Inspect => 3,
        Op::Ping => 4,
        Op::Stats => 5,
        Op::Authenticate => 7,
    }
}

/// The hot keys of every core: the [`ringlock_shards::HOT_KEYS_REPORTED`]
/// keys waited on most and handed off most in the last minute. Shards own
/// disjoint keys, so their reports merge by concatenation.
pub fn hot_keys(cores: &[CoreStats]) -> (HotKeyCounts, HotKeyCounts) {
    let mut waits: HotKeyCounts = cores.iter().flat_map(|core| core.hot_waits.iter().cloned()).collect();
    let mut handoffs: HotKeyCounts = cores.iter().flat_map(|core| core.hot_handoffs.iter().cloned()).collect();
    ringlock_shards::hot_keys::sort_and_truncate(&mut waits);
    ringlock_shards::hot_keys::sort_and_truncate(&mut handoffs);
    (waits, handoffs)
}
