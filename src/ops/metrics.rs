//! `/metrics` in the Prometheus text format (version 0.0.4), and what
//! `/readyz` answers.
//!
//! Everything here runs on the operator endpoint's thread: it reads the
//! counters each shard core publishes once per loop turn (`CoreStats`) and
//! the replication core's status, and never touches a shard. The format is
//! written by hand: it is a few lines per metric, and no crate would save
//! more code than it brings. Names follow Prometheus conventions: base units
//! (seconds), `_total` for counters, and labels with few values (operation,
//! result, error code, shard index); no label names a client, and only the
//! hot-key gauges name keys (at most 16 each).

use std::fmt::Write;
use std::sync::atomic::Ordering;

use ringlock_proto::{ErrorCode, Role};
use ringlock_shards::{HISTOGRAM_BOUNDS, HISTOGRAM_BOUNDS_MS, Histogram, ShardStats};

use crate::auth::SharedAuth;
use crate::cluster::Blocked;
use crate::node::counters::{CoreStats, REQUEST_OPS, REQUEST_RESULTS, RequestCounters, hot_keys};
use crate::node::role::{ClusterLink, LAG_UNKNOWN};
use crate::node::shared::{Shared, total_stats};

/// Whether the node should receive clients, for `/readyz`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// Active, or a standby that holds a complete table.
    Ready,
    /// A standby still without a complete table (it could not take over).
    CatchingUp,
    /// A stop signal came: the node is draining, handing off or exiting.
    Stopping,
    /// It should serve and cannot, and an operator must act (the reason).
    Blocked(Blocked),
}

impl Readiness {
    pub fn describe(self) -> String {
        match self {
            Readiness::Ready => "ready".to_string(),
            Readiness::CatchingUp => "catching up: this standby has no complete copy of the table yet".to_string(),
            Readiness::Stopping => "stopping".to_string(),
            Readiness::Blocked(reason) => format!("blocked: {reason}"),
        }
    }
}

/// The node's readiness now.
pub fn readiness(shared: &Shared) -> Readiness {
    if shared.stopping.load(Ordering::SeqCst) || shared.stop.load(Ordering::SeqCst) {
        return Readiness::Stopping;
    }
    match &shared.cluster {
        None => Readiness::Ready,
        Some(link) if link.stop.load(Ordering::SeqCst) => Readiness::Stopping,
        Some(link) if let Some(reason) = link.blocked() => Readiness::Blocked(reason),
        Some(link) if link.status().active || link.caught_up.load(Ordering::Relaxed) => Readiness::Ready,
        Some(_) => Readiness::CatchingUp,
    }
}

/// Writes one metric family's `HELP` and `TYPE` lines.
fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A key as a label value in the text format. The format is UTF-8 and a key
/// is any bytes, so a byte that is not part of UTF-8 is shown as `\xNN`
/// (and a backslash of the key as two), which keeps distinct keys distinct
/// series; then backslash, double quote and newline are escaped as the
/// format asks.
fn label_value(out: &mut String, value: &[u8]) {
    let mut push = |character: char| match character {
        '\\' => out.push_str("\\\\"),
        '"' => out.push_str("\\\""),
        '\n' => out.push_str("\\n"),
        character => out.push(character),
    };
    for chunk in value.utf8_chunks() {
        for character in chunk.valid().chars() {
            if character == '\\' {
                push('\\');
            }
            push(character);
        }
        for byte in chunk.invalid() {
            push('\\');
            for character in format!("x{byte:02x}").chars() {
                push(character);
            }
        }
    }
}

/// `seconds` as the text format writes a float.
fn seconds(ms: u64) -> String {
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

fn histogram(out: &mut String, name: &str, label: &str, value: &str, histogram: &Histogram) {
    let mut cumulative = 0;
    for (index, bound_ms) in HISTOGRAM_BOUNDS_MS.iter().enumerate() {
        cumulative += histogram.buckets[index];
        let _ = writeln!(out, "{name}_bucket{{{label}=\"{value}\",le=\"{}\"}} {cumulative}", seconds(*bound_ms));
    }
    cumulative += histogram.buckets[HISTOGRAM_BOUNDS];
    let _ = writeln!(out, "{name}_bucket{{{label}=\"{value}\",le=\"+Inf\"}} {cumulative}");
    let _ = writeln!(out, "{name}_sum{{{label}=\"{value}\"}} {}", seconds(histogram.sum_ms));
    let _ = writeln!(out, "{name}_count{{{label}=\"{value}\"}} {cumulative}");
}

/// The whole `/metrics` page.
pub fn render(shared: &Shared) -> String {
    let (cores, total) = total_stats(shared);
    let mut out = String::with_capacity(16 << 10);
    render_node(&mut out, shared);
    if let Some(link) = &shared.cluster {
        render_cluster(&mut out, link);
    }
    render_requests(&mut out, &cores, &total);
    render_per_shard(&mut out, &cores);
    render_connections(&mut out, &cores);
    if let Some(auth) = &shared.auth {
        render_auth(&mut out, &cores, auth);
        render_auth_failures(&mut out, shared);
    }
    if let Some(peer_tls) = &shared.peer_tls {
        render_peer_tls(&mut out, peer_tls);
    }
    if let Some(tls) = &shared.tls {
        render_tls(&mut out, &cores, tls);
    }
    render_latencies(&mut out, &total);
    render_hot_keys(&mut out, &cores);
    out
}

/// The build, uptime, role, readiness and epoch of the node.
fn render_node(out: &mut String, shared: &Shared) {
    family(out, "ringlock_build_info", "gauge", "Always 1; the labels name the build.");
    let _ = writeln!(out, "ringlock_build_info{{version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"));
    family(out, "ringlock_uptime_seconds", "gauge", "Seconds since the server started.");
    let _ = writeln!(out, "ringlock_uptime_seconds {}", seconds(shared.started.elapsed().as_millis() as u64));

    let (role, epoch) = match &shared.cluster {
        None => (Role::Active, shared.authority.epoch()),
        Some(link) => {
            let status = link.status();
            (status.role(), status.epoch)
        }
    };
    family(out, "ringlock_role", "gauge", "1 for the role this node has now (active or standby), 0 for the other.");
    for candidate in [Role::Active, Role::Standby] {
        let _ = writeln!(out, "ringlock_role{{role=\"{}\"}} {}", candidate.as_str(), u8::from(candidate == role));
    }
    family(
        out,
        "ringlock_ready",
        "gauge",
        "1 when /readyz answers 200: active, or a caught-up standby, and not stopping.",
    );
    let _ = writeln!(out, "ringlock_ready {}", u8::from(readiness(shared) == Readiness::Ready));
    if let Some(link) = &shared.cluster {
        family(
            out,
            "ringlock_blocked",
            "gauge",
            "1 while this node should serve and cannot, by reason (the log and /readyz say why and what to do).",
        );
        let exhausted = matches!(link.blocked(), Some(Blocked::EpochSpaceExhausted { .. }));
        let _ = writeln!(out, "ringlock_blocked{{reason=\"epoch_space_exhausted\"}} {}", u8::from(exhausted));
        let no_standby = matches!(link.blocked(), Some(Blocked::NoStandby { .. }));
        let _ = writeln!(out, "ringlock_blocked{{reason=\"no_standby\"}} {}", u8::from(no_standby));
    }
    family(
        out,
        "ringlock_epoch",
        "gauge",
        "The epoch of the active's tokens (this node's, or the active it follows; 0 if none).",
    );
    let _ = writeln!(out, "ringlock_epoch {epoch}");
}

/// What only a cluster node has: failovers, catch-up, lag and table version.
fn render_cluster(out: &mut String, link: &ClusterLink) {
    family(
        out,
        "ringlock_failovers_total",
        "counter",
        "Times this node became active (start-up election, failover or hand-off).",
    );
    let _ = writeln!(out, "ringlock_failovers_total {}", link.activations.load(Ordering::Relaxed));
    family(
        out,
        "ringlock_replication_caught_up",
        "gauge",
        "1 when this node holds a complete table (the active always does).",
    );
    let _ = writeln!(out, "ringlock_replication_caught_up {}", u8::from(link.caught_up.load(Ordering::Relaxed)));
    let lag = link.replication_lag.load(Ordering::Relaxed);
    if lag != LAG_UNKNOWN {
        family(
            out,
            "ringlock_replication_lag_deltas",
            "gauge",
            "Table changes a standby has yet to apply, from the last heartbeats; on the active, the largest over its standbys.",
        );
        let _ = writeln!(out, "ringlock_replication_lag_deltas {lag}");
    }
    family(out, "ringlock_table_version", "gauge", "Changes of the active's stream this node's table holds.");
    let _ = writeln!(out, "ringlock_table_version {}", link.table_version.load(Ordering::Relaxed));
    family(
        out,
        "ringlock_peer_auth_failures_total",
        "counter",
        "Peer connections dropped before they proved the peer secret (--peer-secret-file) or, with peer TLS, \
         their certificate, by direction: inbound (accepted by this node) or outbound (opened by this node).",
    );
    for (direction, failures) in
        [("inbound", &link.peer_auth_failures_inbound), ("outbound", &link.peer_auth_failures_outbound)]
    {
        let _ = writeln!(
            out,
            "ringlock_peer_auth_failures_total{{direction=\"{direction}\"}} {}",
            failures.load(Ordering::Relaxed)
        );
    }
}

/// Replies by operation and result, errors by code, and the shards' counters.
fn render_requests(out: &mut String, cores: &[CoreStats], total: &ShardStats) {
    let mut requests = RequestCounters::default();
    for core in cores {
        requests.add(&core.requests);
    }
    family(
        out,
        "ringlock_requests_total",
        "counter",
        "Requests answered, by operation and result (ok, timeout, moved, error).",
    );
    for (op_index, op) in REQUEST_OPS.iter().enumerate() {
        for (result_index, result) in REQUEST_RESULTS.iter().enumerate() {
            let count = requests.counts[op_index][result_index];
            let _ = writeln!(out, "ringlock_requests_total{{op=\"{op}\",result=\"{result}\"}} {count}");
        }
    }
    family(out, "ringlock_errors_total", "counter", "Error replies and refused connections, by error code.");
    for (index, code) in ErrorCode::ALL.iter().enumerate() {
        let _ = writeln!(out, "ringlock_errors_total{{code=\"{}\"}} {}", code.as_str(), total.errors[index]);
    }
    family(
        out,
        "ringlock_grants_total",
        "counter",
        "Grants, by how: immediate (the key was free), handoff (after a release), expiry (after a lease ran out), token_wait (after waiting for tokens).",
    );
    let handoffs_after_release = total.handoffs - total.handoffs_after_expiry;
    let token_wait = total.grants.saturating_sub(total.grants_immediate + total.handoffs);
    for (how, count) in [
        ("immediate", total.grants_immediate),
        ("handoff", handoffs_after_release),
        ("expiry", total.handoffs_after_expiry),
        ("token_wait", token_wait),
    ] {
        let _ = writeln!(out, "ringlock_grants_total{{how=\"{how}\"}} {count}");
    }
    family(out, "ringlock_releases_total", "counter", "Grants released by their holder.");
    let _ = writeln!(out, "ringlock_releases_total {}", total.releases);
    family(out, "ringlock_lease_expirations_total", "counter", "Leases that ran out; the key was taken back.");
    let _ = writeln!(out, "ringlock_lease_expirations_total {}", total.expiries);
    family(out, "ringlock_extensions_total", "counter", "Leases extended.");
    let _ = writeln!(out, "ringlock_extensions_total {}", total.extends);
    family(out, "ringlock_wait_timeouts_total", "counter", "Acquires whose wait ran out (answered T).");
    let _ = writeln!(out, "ringlock_wait_timeouts_total {}", total.timeouts);
}

/// Gauges per shard: held keys, waiters, keys, connections, turn share and request cost.
fn render_per_shard(out: &mut String, cores: &[CoreStats]) {
    for (name, help, value) in [
        ("ringlock_held_keys", "Keys held now, per shard.", (|core: &CoreStats| core.shard.held_keys) as fn(&_) -> u64),
        ("ringlock_waiters", "Acquires queued now, per shard.", |core| core.shard.waiters),
        ("ringlock_keys", "Keys held or waited on now, per shard.", |core| core.shard.keys),
        ("ringlock_connections", "Client connections open now, per shard core.", |core| core.connections),
        (
            "ringlock_turn_share",
            "Requests one connection may have parsed per turn of the shard core now: --requests-per-turn, or fewer \
             while requests are costly.",
            |core| u64::from(core.turn_share),
        ),
    ] {
        family(out, name, "gauge", help);
        for (index, core) in cores.iter().enumerate() {
            let _ = writeln!(out, "{name}{{shard=\"{index}\"}} {}", value(core));
        }
    }
    let name = "ringlock_request_cost_seconds";
    family(
        out,
        name,
        "gauge",
        "Average time a request took in the shard core's recent turns of 16 or more requests, its share of the turn's \
         work included (0 before any such turn).",
    );
    for (index, core) in cores.iter().enumerate() {
        let _ = writeln!(out, "{name}{{shard=\"{index}\"}} {}", core.request_cost_ns as f64 / 1e9);
    }
}

/// Connections admitted, refused by limit, and paused at the in-flight limit.
fn render_connections(out: &mut String, cores: &[CoreStats]) {
    let sum = |value: fn(&CoreStats) -> u64| cores.iter().map(value).sum::<u64>();
    family(out, "ringlock_connections_accepted_total", "counter", "Client connections admitted and served.");
    let _ = writeln!(out, "ringlock_connections_accepted_total {}", sum(|core| core.accepted));
    family(
        out,
        "ringlock_connections_refused_total",
        "counter",
        "Client connections refused, by limit: max_connections, per_ip, shutting_down.",
    );
    for (reason, count) in [
        ("max_connections", sum(|core| core.refused_max_connections)),
        ("per_ip", sum(|core| core.refused_per_ip)),
        ("shutting_down", sum(|core| core.refused_shutting_down)),
    ] {
        let _ = writeln!(out, "ringlock_connections_refused_total{{reason=\"{reason}\"}} {count}");
    }
    family(
        out,
        "ringlock_in_flight_pauses_total",
        "counter",
        "Times a connection stopped being read at the in-flight request limit.",
    );
    let _ = writeln!(out, "ringlock_in_flight_pauses_total {}", sum(|core| core.in_flight_pauses));
    family(
        out,
        "ringlock_output_squeezes_total",
        "counter",
        "Times a core's replies held unsent went over its share of --max-unsent-mb, so that each connection was read \
         only while it held less than 64 KiB unsent.",
    );
    let _ = writeln!(out, "ringlock_output_squeezes_total {}", sum(|core| core.output_squeezes));
    family(
        out,
        "ringlock_output_stall_closes_total",
        "counter",
        "Connections closed because their unsent replies made no progress for --output-stall-ms.",
    );
    let _ = writeln!(out, "ringlock_output_stall_closes_total {}", sum(|core| core.output_stall_closes));
}

/// Client authentication (`--auth-file`): failed `U` lines, connections
/// revoked by a reload, and the reloads' outcomes.
fn render_auth(out: &mut String, cores: &[CoreStats], auth: &SharedAuth) {
    let sum = |value: fn(&CoreStats) -> u64| cores.iter().map(value).sum::<u64>();
    family(out, "ringlock_auth_failures_total", "counter", "U lines whose secret named nobody in the auth file.");
    let _ = writeln!(out, "ringlock_auth_failures_total {}", sum(|core| core.auth_failures));
    family(
        out,
        "ringlock_auth_revoked_total",
        "counter",
        "Connections closed because a reload of the auth file removed their name.",
    );
    let _ = writeln!(out, "ringlock_auth_revoked_total {}", sum(|core| core.auth_revocations));
    family(
        out,
        "ringlock_auth_reloads_total",
        "counter",
        "Reloads of the auth file (SIGHUP), by result: ok, or failed (the file in force stays).",
    );
    for (result, count) in [("ok", &auth.reloads), ("failed", &auth.reload_failures)] {
        let _ = writeln!(out, "ringlock_auth_reloads_total{{result=\"{result}\"}} {}", count.load(Ordering::Relaxed));
    }
    family(
        out,
        "ringlock_auth_timeouts_total",
        "counter",
        "Connections answered auth-required and closed because they had not authenticated within --handshake-ms.",
    );
    let _ = writeln!(out, "ringlock_auth_timeouts_total {}", auth.timeouts.load(Ordering::Relaxed));
}

/// Failed `U` lines by client address, without naming any: how many
/// addresses failed lately, how many are slowed now, and the connections
/// refused because of it. An address is not a label, so that a guesser with
/// many addresses cannot grow the series; the log names an address when it
/// becomes slowed.
fn render_auth_failures(out: &mut String, shared: &Shared) {
    let table = &shared.auth_failures;
    let counts = table.counts(shared.now_ms());
    family(
        out,
        "ringlock_auth_failure_addresses",
        "gauge",
        "Client addresses (IPv6: /64 blocks) with a failed U line in the last minute.",
    );
    let _ = writeln!(out, "ringlock_auth_failure_addresses {}", counts.addresses);
    family(
        out,
        "ringlock_auth_slowed_addresses",
        "gauge",
        "Client addresses whose repeated failed U lines delay their answers and refuse their new connections now.",
    );
    let _ = writeln!(out, "ringlock_auth_slowed_addresses {}", counts.slowed);
    family(
        out,
        "ringlock_auth_slowed_refusals_total",
        "counter",
        "New connections closed at once because their address was slowed by failed U lines.",
    );
    let _ = writeln!(out, "ringlock_auth_slowed_refusals_total {}", table.refused.load(Ordering::Relaxed));
}

/// TLS on the client port: errors, handshakes that ran out of time, and
/// the reloads' outcomes.
fn render_tls(out: &mut String, cores: &[CoreStats], tls: &crate::tls::SharedTls) {
    family(
        out,
        "ringlock_tls_errors_total",
        "counter",
        "Client connections ended by a TLS error: a failed handshake (a client that does not speak TLS, an \
         untrusted or missing client certificate) or a bad record.",
    );
    let errors: u64 = cores.iter().map(|core| core.tls_errors).sum();
    let _ = writeln!(out, "ringlock_tls_errors_total {errors}");
    family(
        out,
        "ringlock_tls_handshake_timeouts_total",
        "counter",
        "Client connections closed because their TLS handshake did not end within --handshake-ms.",
    );
    let _ = writeln!(out, "ringlock_tls_handshake_timeouts_total {}", tls.handshake_timeouts.load(Ordering::Relaxed));
    family(
        out,
        "ringlock_tls_reloads_total",
        "counter",
        "Reloads of --tls-cert, --tls-key and --tls-client-ca (SIGHUP), by result: ok, or failed (the settings in \
         force stay).",
    );
    for (result, count) in [("ok", &tls.config.reloads), ("failed", &tls.config.reload_failures)] {
        let _ = writeln!(out, "ringlock_tls_reloads_total{{result=\"{result}\"}} {}", count.load(Ordering::Relaxed));
    }
}

/// Mutual TLS on the peer port: errors by direction, and the reloads' outcomes.
fn render_peer_tls(out: &mut String, peer_tls: &crate::replication::PeerTls) {
    family(
        out,
        "ringlock_peer_tls_errors_total",
        "counter",
        "Peer connections refused for TLS (a failed handshake: a peer without TLS, a certificate of another CA; or a \
         certificate that does not name the peer's host), by direction: inbound (accepted by this node) or outbound \
         (opened by this node).",
    );
    for (direction, errors) in [("inbound", &peer_tls.errors_inbound), ("outbound", &peer_tls.errors_outbound)] {
        let _ = writeln!(
            out,
            "ringlock_peer_tls_errors_total{{direction=\"{direction}\"}} {}",
            errors.load(Ordering::Relaxed)
        );
    }
    family(
        out,
        "ringlock_peer_tls_reloads_total",
        "counter",
        "Reloads of --peer-tls-cert, --peer-tls-key and --peer-tls-ca (SIGHUP), by result: ok, or failed (the \
         settings in force stay).",
    );
    for (result, count) in [("ok", &peer_tls.configs.reloads), ("failed", &peer_tls.configs.reload_failures)] {
        let _ =
            writeln!(out, "ringlock_peer_tls_reloads_total{{result=\"{result}\"}} {}", count.load(Ordering::Relaxed));
    }
}

/// Waits of acquires and holds of grants, as histograms.
fn render_latencies(out: &mut String, total: &ShardStats) {
    family(
        out,
        "ringlock_acquire_wait_seconds",
        "histogram",
        "Time acquires waited, by outcome: granted (0 when the key was free) or timed_out.",
    );
    histogram(out, "ringlock_acquire_wait_seconds", "outcome", "granted", &total.wait_granted);
    histogram(out, "ringlock_acquire_wait_seconds", "outcome", "timed_out", &total.wait_timed_out);
    family(out, "ringlock_hold_seconds", "histogram", "Time grants were held, by how they ended: release or expiry.");
    histogram(out, "ringlock_hold_seconds", "end", "release", &total.hold_released);
    histogram(out, "ringlock_hold_seconds", "end", "expiry", &total.hold_expired);
}

/// The hot keys of every core.
fn render_hot_keys(out: &mut String, cores: &[CoreStats]) {
    let (waits, handoffs) = hot_keys(cores);
    for (name, help, list) in [
        (
            "ringlock_hot_key_waits",
            "Acquires queued on this key in the last 30 to 60 s (top 16 keys; an upper bound).",
            &waits,
        ),
        (
            "ringlock_hot_key_handoffs",
            "Hand-offs of this key in the last 30 to 60 s (top 16 keys; an upper bound).",
            &handoffs,
        ),
    ] {
        family(out, name, "gauge", help);
        for (key, count) in list {
            out.push_str(name);
            out.push_str("{key=\"");
            label_value(out, key);
            let _ = writeln!(out, "\"}} {count}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped_and_seconds_keep_milliseconds() {
        let mut out = String::new();
        label_value(&mut out, b"a\"b\\c\nd\xff");
        // The label value is a"b\\c<newline>d\xff, escaped for the format.
        assert_eq!(out, r#"a\"b\\\\c\nd\\xff"#);
        // Keys that differ only in bytes outside UTF-8, or in a backslash
        // that looks like one of those, stay distinct.
        let labels: Vec<String> = [&b"k\xfe"[..], b"k\xff", b"k\\xff", "k\u{fffd}".as_bytes()]
            .iter()
            .map(|key| {
                let mut out = String::new();
                label_value(&mut out, key);
                out
            })
            .collect();
        assert_eq!(labels, [r"k\\xfe", r"k\\xff", r"k\\\\xff", "k\u{fffd}"]);
        assert_eq!(seconds(0), "0.000");
        assert_eq!(seconds(1), "0.001");
        assert_eq!(seconds(268_435_456), "268435.456");
    }

    #[test]
    fn histograms_are_cumulative_and_end_with_the_count() {
        let mut recorded = Histogram::default();
        recorded.record(0);
        recorded.record(3);
        recorded.record(u64::from(u32::MAX));
        let mut out = String::new();
        histogram(&mut out, "h", "end", "release", &recorded);
        assert!(
            out.starts_with("h_bucket{end=\"release\",le=\"0.001\"} 1\nh_bucket{end=\"release\",le=\"0.004\"} 2\n")
        );
        assert!(
            out.contains("h_bucket{end=\"release\",le=\"268435.456\"} 2\nh_bucket{end=\"release\",le=\"+Inf\"} 3\n")
        );
        assert!(out.ends_with("h_count{end=\"release\"} 3\n"));
    }
}
