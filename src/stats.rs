//! The `S` reply: one line of JSON with per-shard and total counters.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use ringlock_proto::{ErrorCode, Op, Reply, Role};
use ringlock_shards::{HotKeyCounts, ShardStats};

use crate::event_loop::{Shared, total_stats};

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
    /// The shard's hot keys (see `ringlock_shards::HotKeys`), copied at most
    /// every `HOT_KEYS_PUBLISH_MS`: keys waited on, keys handed off.
    pub hot_waits: HotKeyCounts,
    pub hot_handoffs: HotKeyCounts,
}

/// The operations replies are counted by, as metric labels; `none` is a
/// line that named no operation (`E - - <code>`).
pub const REQUEST_OPS: [&str; 7] = ["acquire", "release", "extend", "inspect", "ping", "stats", "none"];
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

/// Writes `key` as a JSON string: UTF-8 keys as text, any other byte as
/// `\u00XX`, so that every key is readable and the line stays one line.
fn json_key(out: &mut String, key: &[u8]) {
    out.push('"');
    match std::str::from_utf8(key) {
        Ok(text) => {
            for character in text.chars() {
                match character {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    character if (character as u32) < 0x20 || character == '\u{7f}' => {
                        let _ = write!(out, "\\u{:04x}", character as u32);
                    }
                    character => out.push(character),
                }
            }
        }
        Err(_) => {
            for &byte in key {
                match byte {
                    b'"' => out.push_str("\\\""),
                    b'\\' => out.push_str("\\\\"),
                    0x20..0x7f => out.push(byte as char),
                    byte => {
                        let _ = write!(out, "\\u{:04x}", byte);
                    }
                }
            }
        }
    }
    out.push('"');
}

/// Bytes one hot-key list may take in `S`, so that the line stays under
/// 64 KiB whatever the keys hold (a 250-byte key of escaped bytes takes
/// 1.5 KB); the list is cut short past it.
const HOT_LIST_JSON_MAX: usize = 12 << 10;

fn json_hot_list(out: &mut String, name: &str, list: &[(Vec<u8>, u64)]) {
    let _ = write!(out, "\"{name}\":[");
    let start = out.len();
    for (index, (key, count)) in list.iter().enumerate() {
        if out.len() - start > HOT_LIST_JSON_MAX {
            break;
        }
        if index > 0 {
            out.push(',');
        }
        out.push_str("{\"key\":");
        json_key(out, key);
        let _ = write!(out, ",\"count\":{count}}}");
    }
    out.push(']');
}

/// `{"role":...,"epoch":...,"uptime_ms":...,"total":{...},"shards":[{...},...]}`.
pub fn json(shared: &Shared, role: Role, epoch: u64) -> String {
    let (cores, total) = total_stats(shared);
    let connections: u64 = cores.iter().map(|core| core.connections).sum();
    let refused_per_ip: u64 = cores.iter().map(|core| core.refused_per_ip).sum();
    let in_flight_pauses: u64 = cores.iter().map(|core| core.in_flight_pauses).sum();
    let mut out = String::with_capacity(512 + 400 * cores.len());
    let _ = write!(
        out,
        "{{\"role\":\"{}\",\"epoch\":{},\"uptime_ms\":{},\"total\":",
        role.as_str(),
        epoch,
        shared.started.elapsed().as_millis()
    );
    counters(&mut out, &total, connections, refused_per_ip, in_flight_pauses);
    if let Some(link) = &shared.cluster {
        let _ = write!(
            out,
            ",\"table\":{{\"stream\":{},\"version\":{}}}",
            link.table_stream.load(Ordering::Relaxed),
            link.table_version.load(Ordering::Relaxed)
        );
    }
    let (waits, handoffs) = hot_keys(&cores);
    out.push_str(",\"hot_keys\":{");
    json_hot_list(&mut out, "waits", &waits);
    out.push(',');
    json_hot_list(&mut out, "handoffs", &handoffs);
    out.push('}');
    out.push_str(",\"shards\":[");
    for (index, core) in cores.iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        counters(&mut out, &core.shard, core.connections, core.refused_per_ip, core.in_flight_pauses);
    }
    out.push_str("]}");
    out
}

fn counters(out: &mut String, stats: &ShardStats, connections: u64, refused_per_ip: u64, in_flight_pauses: u64) {
    let _ = write!(
        out,
        "{{\"grants\":{},\"grants_immediate\":{},\"handoffs_after_expiry\":{},\"releases\":{},\"extends\":{},\"expiries\":{},\"timeouts\":{},\"handoffs\":{},\
         \"held_keys\":{},\"waiters\":{},\"keys\":{},\"connections\":{},\"refused_per_ip\":{},\
         \"in_flight_pauses\":{},\"errors\":{{",
        stats.grants,
        stats.grants_immediate,
        stats.handoffs_after_expiry,
        stats.releases,
        stats.extends,
        stats.expiries,
        stats.timeouts,
        stats.handoffs,
        stats.held_keys,
        stats.waiters,
        stats.keys,
        connections,
        refused_per_ip,
        in_flight_pauses
    );
    for (index, code) in ErrorCode::ALL.iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        let _ = write!(out, "\"{}\":{}", code.as_str(), stats.errors[index]);
    }
    out.push_str("}}");
}
