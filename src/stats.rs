//! The `S` reply: one line of JSON with per-shard and total counters.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use ringlock_client::proto::{ErrorCode, Role};
use ringlock_shards::ShardStats;

use crate::event_loop::{Shared, total_stats};

/// What one core publishes for `S`, once per loop turn.
#[derive(Clone, Debug, Default)]
pub struct CoreStats {
    pub shard: ShardStats,
    pub connections: u64,
    /// Connections refused by `--max-connections-per-ip` since the start.
    pub refused_per_ip: u64,
    /// Times a connection stopped being read because it had the most
    /// requests in flight a connection may have.
    pub in_flight_pauses: u64,
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
        "{{\"grants\":{},\"releases\":{},\"extends\":{},\"expiries\":{},\"timeouts\":{},\"handoffs\":{},\
         \"held_keys\":{},\"waiters\":{},\"keys\":{},\"connections\":{},\"refused_per_ip\":{},\
         \"in_flight_pauses\":{},\"errors\":{{",
        stats.grants,
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
