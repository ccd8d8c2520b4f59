//! What every core of a node shares: read-mostly settings, the mailboxes,
//! the stop flags and counters, and the link to the replication core.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ringlock_shards::ShardStats;

use crate::node::counters::CoreStats;
use crate::node::role::ClusterLink;
use crate::node::tokens::TokenAuthority;
use crate::shard_core::mailbox::Mailbox;
use crate::shard_core::per_ip::PerIpConnections;

/// What every core shares: read-mostly settings, the mailboxes, counters.
pub struct Shared {
    pub mailboxes: Vec<Mailbox>,
    pub authority: Arc<TokenAuthority>,
    /// The address `P` names as the active node's.
    pub advertised: String,
    pub lease_ms_max: u64,
    pub max_connections: u32,
    pub connections: AtomicU32,
    /// The core the next accepted connection goes to, modulo the cores.
    pub next_core: AtomicUsize,
    /// Connections open from each client address, for `--max-connections-per-ip`.
    pub per_ip: PerIpConnections,
    /// Failed `U` lines per client address (the growing delay of a guesser).
    pub auth_failures: Arc<crate::shard_core::per_ip::AuthFailures>,
    pub stop: AtomicBool,
    /// A stop signal came: `/readyz` answers 503 from now on (the cores may
    /// still serve, during `--drain-ms` or a hand-off).
    pub stopping: AtomicBool,
    /// Cores that read no more requests since the stop began.
    pub stopped_reading: AtomicUsize,
    /// Cores that have answered every queued acquire after all stopped reading.
    pub drained: AtomicUsize,
    /// Each core's latest counters, for `S`.
    pub stats: Vec<Mutex<CoreStats>>,
    pub started: Instant,
    /// The link to the replication core, in a cluster.
    pub cluster: Option<ClusterLink>,
    /// The auth file, with `--auth-file`.
    pub auth: Option<crate::auth::SharedAuth>,
    /// The client port's TLS settings, with `--tls-cert` and `--tls-key`.
    pub tls: Option<crate::tls::SharedTls>,
    /// Mutual TLS on the peer port, with `--peer-tls-cert`, `--peer-tls-key`
    /// and `--peer-tls-ca`.
    pub peer_tls: Option<crate::replication::peer_tls::PeerTls>,
    /// `--handshake-ms`: how long a new connection has to finish its TLS
    /// handshake and, with an auth file, to authenticate.
    pub handshake_ms: u64,
    /// The limits that pause and close a connection (the unsent-replies
    /// budget is per core here).
    pub connection_limits: crate::shard_core::Limits,
}

impl Shared {
    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }
}

/// Gathers every core's counters.
pub fn total_stats(shared: &Shared) -> (Vec<CoreStats>, ShardStats) {
    let cores: Vec<CoreStats> =
        shared.stats.iter().map(|core| core.lock().map(|c| c.clone()).unwrap_or_default()).collect();
    let mut total = ShardStats::default();
    for core in &cores {
        total.add(&core.shard);
    }
    (cores, total)
}
