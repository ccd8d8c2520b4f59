//! The `S` reply: one line of JSON with per-shard and total counters.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use ringlock_proto::{ErrorCode, Role};
use ringlock_shards::ShardStats;

use crate::node::counters::hot_keys;
use crate::node::shared::{Shared, total_stats};

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
        match link.blocked() {
            Some(crate::cluster::Blocked::EpochSpaceExhausted { highest }) => {
                let _ =
                    write!(out, ",\"blocked\":{{\"reason\":\"epoch_space_exhausted\",\"highest_epoch\":{highest}}}");
            }
            Some(crate::cluster::Blocked::NoStandby { needed }) => {
                let _ = write!(out, ",\"blocked\":{{\"reason\":\"no_standby\",\"min_standbys\":{needed}}}");
            }
            None => {}
        }
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
