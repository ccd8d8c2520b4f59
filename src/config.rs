//! Command-line flags, each also readable from an environment variable.

use std::net::SocketAddr;

use crate::address::Endpoint;
use std::path::PathBuf;

use clap::Parser;
use ringlock_proto::{LEASE_MS_MAX_DEFAULT, parse_seconds_ms};
use ringlock_ring::{CpuList, parse_cpu_list};

/// ringlock: a lock server with FIFO hand-off, leases and fencing tokens.
///
/// Keys are hash-sharded onto pinned cores; each shard core runs its own
/// io_uring event loop. Clients speak the line protocol described in the
/// README (`A key lease wait`, `R key token`, `X key token lease`, `P`, `S`).
#[derive(Parser, Debug, Clone)]
#[command(name = "ringlock", version, about, long_about)]
pub struct Config {
    /// Address to accept clients on. One listening socket serves every shard
    /// core, each connection going to one of them. The address is never
    /// shared: if another process listens there (tried again for up to 2 s,
    /// for a server killed a moment ago), the start fails.
    /// Default: 127.0.0.1:7700, or in a cluster this node's entry in --peers.
    /// A DNS name is resolved once, at start, and the first address it
    /// gives is listened on (`localhost` may give ::1 before 127.0.0.1:
    /// give the IP address to be sure); a name that does not resolve stops
    /// the start.
    #[arg(long, env = "RINGLOCK_LISTEN", value_parser = Endpoint::parse)]
    pub listen: Option<Endpoint>,

    /// Cluster: every node's client address, comma-separated, in promotion
    /// priority order (first = highest), this node included; at most 16.
    /// The peer transport of each node listens on its client port + 10000,
    /// or on the address written after `@` (`127.0.0.1:7700@127.0.0.1:9000`).
    /// Each entry is host:port, with an IP address (`[::1]:7700` for IPv6)
    /// or a DNS name (`ringlock-0.ringlock:7700`); a peer's name is looked
    /// up again at every connection to it, so a node that comes back with a
    /// new IP is found, and one that does not resolve yet is retried. `P` and
    /// `M` replies name these client addresses as written. Every node must be
    /// given the same list, written the same way. Without --peers the server
    /// is a single node.
    #[arg(long, env = "RINGLOCK_PEERS", value_delimiter = ',', value_parser = parse_peer)]
    pub peers: Vec<PeerAddress>,

    /// Cluster: which entry of --peers this node is, as an index (0 = first)
    /// or as the address written there. Default: the entry equal to --listen.
    #[arg(long, env = "RINGLOCK_NODE")]
    pub node: Option<String>,

    /// Cluster: period of the heartbeats every node sends every peer, in
    /// milliseconds.
    #[arg(long, env = "RINGLOCK_HEARTBEAT_MS", default_value_t = crate::cluster::HEARTBEAT_MS_DEFAULT)]
    pub heartbeat_ms: u64,

    /// Cluster: a peer with no heartbeat for this long (milliseconds) is dead,
    /// and a standby takes over from a dead active. At least twice
    /// --heartbeat-ms. Lower fails over faster but mistakes a pause of the
    /// host for a death more often. A peer connection on which nothing
    /// arrives, or whose sent bytes stay unacknowledged, for the larger of
    /// this and 1 s is closed and opened again.
    #[arg(long, env = "RINGLOCK_FAILOVER_MS", default_value_t = crate::cluster::FAILOVER_MS_DEFAULT)]
    pub failover_ms: u64,

    /// Cluster: semi-synchronous replication. With N > 0, a grant (by an
    /// acquire or by a hand-off to a waiter) or an extend is answered only
    /// once N caught-up standbys have applied it, which costs about a
    /// replication turn and a round trip per grant; and an active that has
    /// had fewer than N caught-up standbys for --failover-ms stops granting
    /// (new acquires and extends get `no-standby`, holders keep their leases)
    /// until enough are back. No grant is then lost by a failover, and an
    /// active cut off from its standbys grants nothing the new active could
    /// grant again. 0 (the default): asynchronous replication, and a single
    /// live node serves. Below the number of nodes in --peers; the same on
    /// every node.
    #[arg(long, env = "RINGLOCK_MIN_STANDBYS", default_value_t = 0)]
    pub min_standbys: usize,

    /// Cluster: address the peer transport listens on (a name is resolved
    /// at start). Default: this node's peer address from --peers (its client
    /// port + 10000 unless given after `@`).
    #[arg(long, env = "RINGLOCK_CLUSTER_LISTEN", value_parser = Endpoint::parse)]
    pub cluster_listen: Option<Endpoint>,

    /// Cluster: a file holding a shared secret, one line of at least 32
    /// bytes, which are the key as written (make one with `head -c 32
    /// /dev/urandom | base64 > FILE`: 44 characters; the same file on every
    /// node, readable only by the server's user). Every
    /// peer connection then proves, both ways, that its two nodes hold it
    /// (HMAC-SHA256 over fresh nonces, the node index and the --peers list)
    /// before anything else it sends is read; a peer without it is refused.
    /// It does not encrypt the peer traffic (see docs/security.md). Without
    /// it, anyone who reaches the peer port can speak for a node.
    #[arg(long, env = "RINGLOCK_PEER_SECRET_FILE", value_name = "FILE")]
    pub peer_secret_file: Option<PathBuf>,

    /// Cluster: this node's certificate chain (PEM) for mutual TLS on the
    /// peer port. With --peer-tls-key and --peer-tls-ca (all three or
    /// none), every peer connection runs over TLS 1.3, and each end shows
    /// this certificate: it must be signed by the CA of --peer-tls-ca and
    /// name (as a DNS name or IP address subject alternative name) the host
    /// of this node's peer address in --peers. A peer without TLS, or whose
    /// certificate does not check, is refused. Combines with
    /// --peer-secret-file. SIGHUP re-reads the three files for new
    /// connections (docs/security.md).
    #[arg(long, env = "RINGLOCK_PEER_TLS_CERT", value_name = "FILE")]
    pub peer_tls_cert: Option<PathBuf>,

    /// Cluster: the private key of --peer-tls-cert (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "RINGLOCK_PEER_TLS_KEY", value_name = "FILE")]
    pub peer_tls_key: Option<PathBuf>,

    /// Cluster: the CA certificates (PEM) that every peer's certificate
    /// must chain to, both ways.
    #[arg(long, env = "RINGLOCK_PEER_TLS_CA", value_name = "FILE")]
    pub peer_tls_ca: Option<PathBuf>,

    /// Number of shard cores (event loops). Default: one per online CPU.
    /// On a host that also runs the clients, leave them a core (see tuning/).
    #[arg(long, env = "RINGLOCK_SHARDS", value_parser = clap::value_parser!(u16).range(1..=128))]
    pub shards: Option<u16>,

    /// CPUs to pin the shard cores to, in order, as a list such as `1,3` or
    /// `2-5`. Default: the first CPUs this process may run on, in order (the
    /// CPUs 0, 1, 2... of the host, or those a container or `taskset` gives
    /// it). Must list at least --shards CPUs.
    #[arg(long, env = "RINGLOCK_CPUS", value_parser = parse_cpu_list)]
    pub cpus: Option<CpuList>,

    /// Do not pin threads to CPUs (for hosts where pinning is not allowed or
    /// where another scheduler decides).
    #[arg(long, env = "RINGLOCK_NO_PIN")]
    pub no_pin: bool,

    /// CPU for the replication core, which hands out token ranges and (in a
    /// cluster) streams deltas to standbys. Default: not pinned.
    #[arg(long, env = "RINGLOCK_REPLICATION_CPU")]
    pub replication_cpu: Option<usize>,

    /// Directory for the durable state (the epoch file). Created if missing;
    /// the server refuses to start if it is not writable.
    #[arg(long, env = "RINGLOCK_DATA_DIR", default_value = "ringlock-data")]
    pub data_dir: PathBuf,

    /// Most client connections at once; beyond it a new connection is
    /// answered `E - - too-many-connections` and closed.
    #[arg(long, env = "RINGLOCK_MAX_CONNECTIONS", default_value_t = 10_000)]
    pub max_connections: u32,

    /// Most client connections at once from one IP address; beyond it a new
    /// connection from that address is answered `E - - too-many-connections`
    /// and closed, so one host cannot take every slot. 0 = no limit.
    #[arg(long, env = "RINGLOCK_MAX_CONNECTIONS_PER_IP", default_value_t = 1024)]
    pub max_connections_per_ip: u32,

    /// A file of the names clients authenticate as, one a line:
    /// `<name> <sha256 of its secret, 64 hex digits> <scope>`, where the
    /// scope lists key prefixes ending in `*` (`*` alone: every key) and
    /// optionally the word `stats` (allows `S`), comma-separated; `#`
    /// starts a comment line. A connection then sends `U <secret>` first:
    /// until it does, every request but `P` is answered `auth-required`,
    /// and afterwards a key outside its scope is `forbidden`. SIGHUP
    /// re-reads the file. Default: off (every connection may do anything).
    #[arg(long, env = "RINGLOCK_AUTH_FILE", value_name = "FILE")]
    pub auth_file: Option<PathBuf>,

    /// The client port's TLS certificate chain (PEM). With --tls-key, the
    /// client port speaks only TLS (1.3, and 1.2 with AEAD suites); a client
    /// that does not is dropped. Default: off (plain TCP).
    #[arg(long, env = "RINGLOCK_TLS_CERT", value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "RINGLOCK_TLS_KEY", value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// With --tls-cert: the CA certificates (PEM) that client certificates
    /// must chain to; a client without such a certificate is refused during
    /// the handshake (mutual TLS). With --auth-file too, a certificate whose
    /// subject alternative name (DNS, then URI) is a name of the auth file
    /// authenticates its connection as that name, without `U`. SIGHUP
    /// re-reads this file, --tls-cert and --tls-key for new connections.
    #[arg(long, env = "RINGLOCK_TLS_CLIENT_CA", value_name = "FILE", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// Milliseconds a new client connection has to finish its TLS handshake
    /// (with --tls-cert) and, with --auth-file, to authenticate (a `U` line
    /// or a client certificate naming an entry). A connection still
    /// handshaking then is closed (ringlock_tls_handshake_timeouts_total);
    /// one still unauthenticated is answered `E - - auth-required` and
    /// closed (ringlock_auth_timeouts_total). Without TLS and auth it does
    /// nothing.
    #[arg(long, env = "RINGLOCK_HANDSHAKE_MS", default_value_t = 10_000, value_name = "MS",
          value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub handshake_ms: u64,

    /// Replies held unsent for clients that read slower than they ask, over
    /// all connections, in MiB. Past it (shared evenly among the shard
    /// cores), a core reads each connection only while it holds less than
    /// 64 KiB unsent, so those that read least stop being read first, until
    /// the total is half this again. Default: a sixty-fourth of the host's
    /// memory, from 32 MiB to 1 GiB (logged at start).
    #[arg(long, env = "RINGLOCK_MAX_UNSENT_MB", value_name = "MIB",
          value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub max_unsent_mb: Option<u64>,

    /// Most requests parsed from one connection in one turn of its core;
    /// what it sent beyond waits for the next turn, after every other
    /// connection had its share. While requests are costly (new keys into a
    /// table of millions), a connection gets what fits in 20 µs at their
    /// recent average cost, down to 16 (ringlock_turn_share). Lower keeps a
    /// bystander's wait short while another client pipelines thousands of
    /// requests; higher suits clients that keep more than this many requests
    /// in flight each (the load generator's default is 64): at 512 in flight
    /// per connection, the default costs about 13 % of throughput
    /// (docs/operations.md).
    #[arg(long, env = "RINGLOCK_REQUESTS_PER_TURN", default_value_t = 128, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=1 << 20))]
    pub requests_per_turn: u32,

    /// A connection whose unsent replies make no progress for this long
    /// (milliseconds: its client reads nothing) is closed, and what it held
    /// is freed (ringlock_output_stall_closes_total).
    #[arg(long, env = "RINGLOCK_OUTPUT_STALL_MS", default_value_t = 30_000, value_name = "MS",
          value_parser = clap::value_parser!(u64).range(100..=86_400_000))]
    pub output_stall_ms: u64,

    /// Address of the HTTP endpoint for operators: `/metrics` (Prometheus
    /// text format), `/livez` and `/readyz`. Served by a thread of its own,
    /// never by a shard core. A name is resolved at start. Default: off.
    #[arg(long, env = "RINGLOCK_METRICS_LISTEN", value_name = "ADDR", value_parser = Endpoint::parse)]
    pub metrics_listen: Option<Endpoint>,

    /// On SIGINT/SIGTERM, first report not ready (`/readyz` 503, systemd
    /// STOPPING) and keep serving for this many milliseconds, so that load
    /// balancers stop sending new clients before the node stops. A second
    /// signal ends the wait at once.
    #[arg(long, env = "RINGLOCK_DRAIN_MS", default_value_t = 0, value_name = "MS")]
    pub drain_ms: u64,

    /// Seconds a client connection may be silent before TCP keepalive probes
    /// check that its host is still there; 0 = no keepalive. A host that
    /// vanished without a reset then loses its connection, and its queued
    /// acquires leave their queues, after about idle + interval x probes.
    #[arg(long, env = "RINGLOCK_KEEPALIVE_IDLE_S", default_value_t = 30,
          value_parser = clap::value_parser!(u32).range(0..=32_767))]
    pub keepalive_idle_s: u32,

    /// Seconds between two unanswered keepalive probes.
    #[arg(long, env = "RINGLOCK_KEEPALIVE_INTERVAL_S", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(1..=32_767))]
    pub keepalive_interval_s: u32,

    /// Unanswered keepalive probes after which a connection is closed.
    #[arg(long, env = "RINGLOCK_KEEPALIVE_PROBES", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..=127))]
    pub keepalive_probes: u32,

    /// Milliseconds that sent replies may stay unacknowledged (or, with
    /// keepalive, that probes may go unanswered) before the connection is
    /// closed (TCP_USER_TIMEOUT); 0 = the kernel's default, about 15 minutes
    /// of retransmissions.
    #[arg(long, env = "RINGLOCK_TCP_USER_TIMEOUT_MS", default_value_t = 60_000,
          value_parser = clap::value_parser!(u32).range(0..=i32::MAX as i64))]
    pub tcp_user_timeout_ms: u32,

    /// Kernel send buffer of each client connection, in KiB (SO_SNDBUF; the
    /// kernel doubles it for its bookkeeping); 0 = the kernel's automatic
    /// sizing, up to net.ipv4.tcp_wmem's maximum (4 MiB by default). Lock
    /// replies are small, so a pipelining client needs far less; a bounded
    /// buffer means a client that stops reading is paused after this much
    /// rather than after megabytes, so a thousand of them cannot keep a core
    /// busy filling kernel memory.
    #[arg(long, env = "RINGLOCK_SEND_BUFFER_KIB", default_value_t = 128,
          value_parser = clap::value_parser!(u32).range(0..=1_048_576))]
    pub send_buffer_kib: u32,

    /// Most keys held or waited on at once, over all shards (each shard takes
    /// an equal part); beyond it, acquires of a new key get `too-many-keys`.
    /// Default: what a quarter of the memory this process may use holds at
    /// 512 bytes a key (a held lock with a 250-byte key and its index entry
    /// takes about 380), from 65,536 to 16,777,216; the memory is the
    /// host's, or the cgroup's limit if lower (a container). Logged at start.
    #[arg(long, env = "RINGLOCK_MAX_KEYS", value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=1 << 40))]
    pub max_keys: Option<u64>,

    /// With --auth-file: most keys one name may hold plus wait on at once,
    /// over all shards (each shard takes an equal part, as for --max-keys);
    /// at it, the name's acquires of a new key get `too-many-keys` and its
    /// acquires of a held key `too-many-waiters`, while other names go on.
    /// Default: half of --max-keys, so that no one name can fill the table;
    /// 0 = no quota.
    #[arg(long, env = "RINGLOCK_MAX_KEYS_PER_NAME", value_name = "N")]
    pub max_keys_per_name: Option<u64>,

    /// Without --auth-file: most keys one client connection may hold plus
    /// wait on at once (the grants it took that are still held, and its
    /// queued acquires), over all shards (each takes an equal part); at it,
    /// as for --max-keys-per-name. A grant outlives its connection, so a
    /// connection's count ends when it closes: this bounds what one
    /// connection takes (a client that leaks locks), not one client, which
    /// needs --auth-file. Costs about 4 % of pipelined throughput when on
    /// (docs/operations.md). Default: 0 = no quota.
    #[arg(long, env = "RINGLOCK_MAX_KEYS_PER_CONNECTION", value_name = "N")]
    pub max_keys_per_connection: Option<u64>,

    /// Most requests queued on one key; beyond it, `too-many-waiters`.
    #[arg(long, env = "RINGLOCK_MAX_WAITERS_PER_KEY", default_value_t = 65_536)]
    pub max_waiters_per_key: u32,

    /// Most requests queued over all keys of one shard; beyond it,
    /// `too-many-waiters`.
    #[arg(long, env = "RINGLOCK_MAX_WAITERS", default_value_t = 4_194_304)]
    pub max_waiters: u32,

    /// Longest lease an acquire or extend may ask for, in decimal seconds;
    /// longer ones get `bad-lease`.
    #[arg(long, env = "RINGLOCK_MAX_LEASE", default_value = "86400", value_parser = parse_lease_max)]
    pub max_lease: LeaseMax,

    /// Log filter: error, warn, info, debug or trace (or a tracing directive
    /// such as `ringlock=debug`).
    #[arg(long, env = "RINGLOCK_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
}

/// The socket options of client connections: TCP keepalive, the user
/// timeout and the send buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketOptions {
    /// 0 = no keepalive.
    pub idle_s: u32,
    pub interval_s: u32,
    pub probes: u32,
    /// 0 = the kernel's default.
    pub user_timeout_ms: u32,
    /// SO_SNDBUF in bytes; 0 = the kernel's automatic sizing.
    pub send_buffer_bytes: u32,
}

/// One node of --peers: where clients reach it, and where its peers do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerAddress {
    pub client: Endpoint,
    pub peer: Endpoint,
}

/// Peer ports are this far above client ports unless given.
pub const PEER_PORT_OFFSET: u16 = 10_000;

fn parse_peer(text: &str) -> Result<PeerAddress, String> {
    let (client_text, peer_text) = match text.split_once('@') {
        Some((client, peer)) => (client, Some(peer)),
        None => (text, None),
    };
    let client = Endpoint::parse(client_text).map_err(|error| format!("client address: {error}"))?;
    let peer = match peer_text {
        Some(peer) => Endpoint::parse(peer).map_err(|error| format!("peer address after `@`: {error}"))?,
        None => {
            let port = client.port().checked_add(PEER_PORT_OFFSET).ok_or_else(|| {
                format!("{client}: the client port + {PEER_PORT_OFFSET} is no port; give the peer address after `@`")
            })?;
            client.with_port(port)
        }
    };
    Ok(PeerAddress { client, peer })
}

/// The files of `--peer-tls-cert`, `--peer-tls-key` and `--peer-tls-ca`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerTlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// The cluster settings, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterSettings {
    pub cluster: crate::cluster::ClusterConfig,
    pub peers: Vec<PeerAddress>,
    /// Where this node's peer transport listens (resolved).
    pub listen: SocketAddr,
}

/// The longest lease, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseMax(pub u64);

fn parse_lease_max(text: &str) -> Result<LeaseMax, String> {
    match parse_seconds_ms(text.as_bytes()) {
        Some(ms) if ms > 0 && ms <= u64::from(u32::MAX) => Ok(LeaseMax(ms)),
        _ => Err(format!(
            "expected decimal seconds above 0 and at most {} (for example 30 or 0.5), not {text:?}",
            u32::MAX / 1000
        )),
    }
}

impl Default for LeaseMax {
    fn default() -> Self {
        LeaseMax(LEASE_MS_MAX_DEFAULT)
    }
}

impl Config {
    /// Where clients connect: --listen, else this node's --peers entry, else 127.0.0.1:7700.
    pub fn listen_address(&self) -> Result<SocketAddr, String> {
        if let Some(listen) = &self.listen {
            return listen.listen_address("--listen");
        }
        if self.peers.is_empty() {
            return Ok(SocketAddr::from(([127, 0, 0, 1], 7700)));
        }
        self.peers[self.cluster_config()?.me].client.listen_address("--peers (this node's entry, listened on)")
    }

    /// Where the metrics endpoint listens, if it is on.
    pub fn metrics_address(&self) -> Result<Option<SocketAddr>, String> {
        self.metrics_listen.as_ref().map(|endpoint| endpoint.listen_address("--metrics-listen")).transpose()
    }

    /// This node's index in --peers, not yet checked against its length.
    fn node_index(&self) -> Result<usize, String> {
        let index = match &self.node {
            Some(node) => match node.parse::<usize>() {
                Ok(index) => index,
                Err(_) => {
                    let address = Endpoint::parse(node)
                        .map_err(|_| format!("--node {node:?} is neither an index nor an address"))?;
                    self.peers
                        .iter()
                        .position(|peer| peer.client.same_as(&address))
                        .ok_or_else(|| format!("--node {address} is not in --peers"))?
                }
            },
            None => {
                let listen = self.listen.as_ref().ok_or("pass --node (its index in --peers) or --listen")?;
                self.peers
                    .iter()
                    .position(|peer| peer.client.same_as(listen))
                    .ok_or_else(|| format!("--listen {listen} is not in --peers; pass --node with this node's index"))?
            }
        };
        Ok(index)
    }

    /// This node's cluster settings from --peers (which must not be empty),
    /// checked, whatever the number of nodes.
    fn cluster_config(&self) -> Result<crate::cluster::ClusterConfig, String> {
        let cluster = crate::cluster::ClusterConfig {
            me: self.node_index()?,
            nodes: self.peers.len(),
            heartbeat_ms: self.heartbeat_ms,
            failover_ms: self.failover_ms,
            min_standbys: self.min_standbys,
        };
        cluster.validate()?;
        Ok(cluster)
    }

    /// The cluster settings, or `None` for a single node (no --peers, or
    /// --peers naming only this node).
    pub fn cluster(&self) -> Result<Option<ClusterSettings>, String> {
        if self.peers.is_empty() {
            if self.node.is_some() {
                return Err("--node needs --peers".to_string());
            }
            if self.min_standbys > 0 {
                return Err(format!(
                    "--min-standbys {} needs standbys: a single node has none; give --peers or drop it",
                    self.min_standbys
                ));
            }
            return Ok(None);
        }
        let cluster = self.cluster_config()?;
        let me = cluster.me;
        for (index, peer) in self.peers.iter().enumerate() {
            if self.peers[..index]
                .iter()
                .any(|other| other.client.same_as(&peer.client) || other.peer.same_as(&peer.peer))
            {
                return Err(format!("--peers names {} twice", peer.client));
            }
        }
        if self.peers.len() == 1 {
            if self.min_standbys > 0 {
                return Err(format!(
                    "--min-standbys {} needs standbys, but --peers names only this node",
                    self.min_standbys
                ));
            }
            return Ok(None);
        }
        let listen = match &self.cluster_listen {
            Some(listen) => listen.listen_address("--cluster-listen")?,
            None => self.peers[me].peer.listen_address("--peers (this node's peer address, listened on)")?,
        };
        Ok(Some(ClusterSettings { cluster, peers: self.peers.clone(), listen }))
    }

    /// The files of peer TLS, if it is on: --peer-tls-cert, --peer-tls-key
    /// and --peer-tls-ca come all three or not at all.
    pub fn peer_tls_files(&self) -> Result<Option<PeerTlsFiles>, String> {
        match (&self.peer_tls_cert, &self.peer_tls_key, &self.peer_tls_ca) {
            (Some(cert), Some(key), Some(ca)) => {
                Ok(Some(PeerTlsFiles { cert: cert.clone(), key: key.clone(), ca: ca.clone() }))
            }
            (None, None, None) => Ok(None),
            (cert, key, ca) => {
                let missing: Vec<&str> = [(cert, "--peer-tls-cert"), (key, "--peer-tls-key"), (ca, "--peer-tls-ca")]
                    .into_iter()
                    .filter_map(|(file, flag)| file.is_none().then_some(flag))
                    .collect();
                Err(format!(
                    "--peer-tls-cert, --peer-tls-key and --peer-tls-ca go together (mutual TLS on the peer port \
                     needs this node's certificate, its key and the peers' CA); {} missing",
                    missing.join(" and ")
                ))
            }
        }
    }

    /// The socket options of client connections.
    pub fn socket_options(&self) -> SocketOptions {
        SocketOptions {
            idle_s: self.keepalive_idle_s,
            interval_s: self.keepalive_interval_s,
            probes: self.keepalive_probes,
            user_timeout_ms: self.tcp_user_timeout_ms,
            send_buffer_bytes: self.send_buffer_kib.saturating_mul(1024),
        }
    }

    /// The number of shard cores to run.
    pub fn shard_count(&self) -> usize {
        match self.shards {
            Some(shards) => usize::from(shards),
            None => std::thread::available_parallelism().map_or(1, usize::from),
        }
    }

    /// `--max-keys`, or its default from the memory this process may use.
    pub fn max_keys(&self) -> u64 {
        self.max_keys.unwrap_or_else(|| default_max_keys(usable_memory_bytes()))
    }

    /// Keys each shard may hold.
    pub fn keys_per_shard(&self) -> u32 {
        let shards = self.shard_count() as u64;
        let per_shard = self.max_keys().div_ceil(shards).max(1);
        per_shard.min(u64::from(ringlock_shards::limits::SLOTS_MAX)) as u32
    }

    /// `--max-keys-per-name`, or its default (half of `--max-keys`); 0 = none.
    pub fn max_keys_per_name(&self) -> u64 {
        self.max_keys_per_name.unwrap_or_else(|| self.max_keys().div_ceil(2))
    }

    /// The per-name quota each shard keeps (0 = none): an equal part of
    /// [`Config::max_keys_per_name`], like [`Config::keys_per_shard`].
    pub fn name_keys_per_shard(&self) -> u32 {
        per_shard_part(self.max_keys_per_name(), self.shard_count())
    }

    /// `--max-keys-per-connection`; 0 (the default) = none.
    pub fn max_keys_per_connection(&self) -> u64 {
        self.max_keys_per_connection.unwrap_or(0)
    }

    /// The quota per connection each shard keeps (0 = none): an equal part
    /// of [`Config::max_keys_per_connection`].
    pub fn connection_keys_per_shard(&self) -> u32 {
        per_shard_part(self.max_keys_per_connection(), self.shard_count())
    }

    /// The CPU each shard core is pinned to, or `None` when not pinning.
    pub fn shard_cpus(&self) -> Result<Option<Vec<usize>>, String> {
        if self.no_pin {
            return Ok(None);
        }
        let shards = self.shard_count();
        let cpus = match &self.cpus {
            Some(list) => list.0.clone(),
            None => allowed_cpus().filter(|allowed| allowed.len() >= shards).unwrap_or_else(|| (0..shards).collect()),
        };
        if cpus.len() < shards {
            return Err(format!(
                "--cpus lists {} CPUs but --shards is {shards}; list one CPU per shard or pass --no-pin",
                cpus.len()
            ));
        }
        Ok(Some(cpus[..shards].to_vec()))
    }
}

/// The host's memory in bytes (`MemTotal` of /proc/meminfo), if readable.
pub fn host_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|line| line.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The memory this process may use: the host's, or its cgroup's limit
/// (`memory.max` of cgroup v2, as a container sets it) if lower; 1 GiB if
/// neither can be read.
pub fn usable_memory_bytes() -> u64 {
    let host = host_memory_bytes();
    let cgroup = cgroup_memory_limit();
    match (host, cgroup) {
        (Some(host), Some(limit)) => host.min(limit),
        (Some(bytes), None) | (None, Some(bytes)) => bytes,
        (None, None) => 1 << 30,
    }
}

/// `memory.max` of this process's cgroup (v2), if it sets one.
fn cgroup_memory_limit() -> Option<u64> {
    let membership = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    // cgroup v2: one line `0::/path`.
    let path = membership.lines().find_map(|line| line.strip_prefix("0::"))?;
    let limit = std::fs::read_to_string(format!("/sys/fs/cgroup{}/memory.max", path.trim_end())).ok()?;
    limit.trim().parse().ok()
}

/// Bytes of memory [`default_max_keys`] counts per key: a held lock with a
/// key of the longest length (250 bytes) and its index entry take about 380
/// (`scripts/hostile-bench.sh`'s key fill measured 332 with 200-byte keys),
/// and the rest leaves room for waiters and connections.
pub const KEY_BYTES_BUDGETED: u64 = 512;

/// A quota over all shards split into equal parts, at least 1 each (0 = none).
fn per_shard_part(quota: u64, shards: usize) -> u32 {
    if quota == 0 {
        return 0;
    }
    quota.div_ceil(shards as u64).max(1).min(u64::from(u32::MAX)) as u32
}

/// `--max-keys` by default: what a quarter of `memory` holds at
/// [`KEY_BYTES_BUDGETED`] a key, from 65,536 to 16,777,216.
pub fn default_max_keys(memory: u64) -> u64 {
    (memory / 4 / KEY_BYTES_BUDGETED).clamp(1 << 16, 1 << 24)
}

impl Config {
    /// `--max-unsent-mb` in bytes, or its default from the host's memory.
    pub fn max_unsent_bytes(&self) -> u64 {
        match self.max_unsent_mb {
            Some(mib) => mib << 20,
            None => (usable_memory_bytes() / 64).clamp(32 << 20, 1 << 30),
        }
    }
}

/// The CPUs this process may run on, in order (its affinity mask, which a
/// container's cpuset or `taskset` narrows); `None` if it cannot be read.
fn allowed_cpus() -> Option<Vec<usize>> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set, and sched_getaffinity
    // writes at most its size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let result = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if result != 0 {
        return None;
    }
    // SAFETY: CPU_ISSET reads the set filled above, for indices below its size.
    let cpus: Vec<usize> =
        (0..libc::CPU_SETSIZE as usize).filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) }).collect();
    (!cpus.is_empty()).then_some(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_cores_are_pinned_by_default_to_the_cpus_the_process_may_use() {
        let allowed = allowed_cpus().expect("the affinity mask of this process");
        let config = Config::try_parse_from(["ringlock", "--shards", "1"]).unwrap();
        assert_eq!(config.shard_cpus().unwrap(), Some(vec![allowed[0]]));
    }

    #[test]
    fn max_keys_defaults_to_a_quarter_of_memory_at_512_bytes_a_key_within_bounds() {
        assert_eq!(default_max_keys(24 << 30), (24 << 30) / 4 / 512);
        assert_eq!(default_max_keys(512 << 20), 262_144);
        assert_eq!(default_max_keys(64 << 20), 65_536, "a small container still gets 64 Ki keys");
        assert_eq!(default_max_keys(1 << 40), 16_777_216, "a large host keeps the 16 Mi ceiling");
        let config = Config::try_parse_from(["ringlock", "--shards", "2", "--max-keys", "1001"]).unwrap();
        assert_eq!((config.max_keys(), config.keys_per_shard()), (1001, 501));
        assert_eq!((config.max_keys_per_name(), config.name_keys_per_shard()), (501, 251), "half, split");
        let config = Config::try_parse_from(["ringlock", "--shards", "2", "--max-keys-per-name", "0"]).unwrap();
        assert_eq!(config.name_keys_per_shard(), 0, "no quota");
        let config = Config::try_parse_from(["ringlock", "--shards", "2", "--max-keys", "1001"]).unwrap();
        assert_eq!(config.connection_keys_per_shard(), 0, "none by default");
        let config = Config::try_parse_from(["ringlock", "--shards", "3", "--max-keys-per-connection", "10"]).unwrap();
        assert_eq!(config.connection_keys_per_shard(), 4, "split, rounded up");
        let config = Config::try_parse_from(["ringlock", "--max-keys-per-connection", "0"]).unwrap();
        assert_eq!(config.connection_keys_per_shard(), 0, "no quota");
        let config = Config::try_parse_from(["ringlock", "--shards", "1"]).unwrap();
        assert_eq!(config.max_keys(), default_max_keys(usable_memory_bytes()));
    }

    #[test]
    fn lease_max_is_decimal_seconds() {
        assert_eq!(parse_lease_max("86400"), Ok(LeaseMax(86_400_000)));
        assert_eq!(parse_lease_max("0.5"), Ok(LeaseMax(500)));
        assert!(parse_lease_max("0").is_err());
        assert!(parse_lease_max("-1").is_err());
    }

    #[test]
    fn flags_parse_with_defaults() {
        let config = Config::try_parse_from(["ringlock", "--shards", "2", "--cpus", "0-1"]).unwrap();
        assert_eq!(config.listen_address().unwrap().to_string(), "127.0.0.1:7700");
        assert_eq!(config.cluster(), Ok(None));
        assert_eq!(config.shard_cpus().unwrap(), Some(vec![0, 1]));
        assert_eq!(config.keys_per_shard() as u64, config.max_keys().div_ceil(2));
        let config = Config::try_parse_from(["ringlock", "--shards", "3", "--cpus", "0-1"]).unwrap();
        assert!(config.shard_cpus().is_err());
        assert!(Config::try_parse_from(["ringlock", "--shards", "0"]).is_err());
    }

    #[test]
    fn cluster_flags_name_this_node_and_derive_peer_ports() {
        let peers = "127.0.0.1:7700,127.0.0.1:7701@127.0.0.1:9001,127.0.0.1:7702";
        let config = Config::try_parse_from(["ringlock", "--peers", peers, "--node", "1"]).unwrap();
        let settings = config.cluster().unwrap().unwrap();
        assert_eq!((settings.cluster.me, settings.cluster.nodes), (1, 3));
        assert_eq!(settings.listen.to_string(), "127.0.0.1:9001");
        assert_eq!(settings.peers[2].peer.to_string(), "127.0.0.1:17702");
        assert_eq!(config.listen_address().unwrap().to_string(), "127.0.0.1:7701");
        let by_address = Config::try_parse_from(["ringlock", "--peers", peers, "--node", "127.0.0.1:7702"]).unwrap();
        assert_eq!(by_address.cluster().unwrap().unwrap().cluster.me, 2);
        let by_listen = Config::try_parse_from(["ringlock", "--peers", peers, "--listen", "127.0.0.1:7700"]).unwrap();
        assert_eq!(by_listen.cluster().unwrap().unwrap().cluster.me, 0);

        let errors = [
            vec!["--peers", peers],
            vec!["--peers", peers, "--node", "3"],
            vec!["--peers", peers, "--node", "127.0.0.1:1"],
            vec!["--peers", "127.0.0.1:7700,127.0.0.1:7700", "--node", "0"],
            vec!["--peers", peers, "--node", "0", "--heartbeat-ms", "600"],
            vec!["--node", "0"],
        ];
        for flags in errors {
            let config = Config::try_parse_from(std::iter::once("ringlock").chain(flags.iter().copied())).unwrap();
            assert!(config.cluster().is_err(), "{flags:?} is refused");
        }
        assert!(Config::try_parse_from(["ringlock", "--peers", "127.0.0.1:65000"]).is_err(), "no port above 65535");
        let single = Config::try_parse_from(["ringlock", "--peers", "127.0.0.1:7800", "--node", "0"]).unwrap();
        assert_eq!(single.cluster(), Ok(None), "a cluster of one is a single node");
        assert_eq!(single.listen_address().unwrap().to_string(), "127.0.0.1:7800");
    }

    #[test]
    fn peer_tls_flags_come_all_three_or_none() {
        let none = Config::try_parse_from(["ringlock"]).unwrap();
        assert_eq!(none.peer_tls_files(), Ok(None));
        let all = ["--peer-tls-cert", "c.pem", "--peer-tls-key", "k.pem", "--peer-tls-ca", "ca.pem"];
        let config = Config::try_parse_from(std::iter::once("ringlock").chain(all)).unwrap();
        let files = config.peer_tls_files().unwrap().unwrap();
        assert_eq!((files.cert, files.key, files.ca), ("c.pem".into(), "k.pem".into(), "ca.pem".into()));
        let config = Config::try_parse_from(std::iter::once("ringlock").chain(all[..2].iter().copied())).unwrap();
        let error = config.peer_tls_files().unwrap_err();
        assert!(
            error.contains("go together") && error.ends_with("--peer-tls-key and --peer-tls-ca missing"),
            "{error}"
        );
    }

    #[test]
    fn names_are_taken_where_addresses_are_and_kept_as_written() {
        let peers = "localhost:7700,ringlock-1.ringlock.invalid:7700,[::1]:7702@[::1]:9002";
        let config = Config::try_parse_from(["ringlock", "--peers", peers, "--node", "LOCALHOST:7700"]).unwrap();
        let settings = config.cluster().unwrap().unwrap();
        assert_eq!(settings.cluster.me, 0, "--node matches a name without case");
        let written: Vec<String> = settings.peers.iter().map(|peer| peer.client.to_string()).collect();
        assert_eq!(written, ["localhost:7700", "ringlock-1.ringlock.invalid:7700", "[::1]:7702"]);
        assert_eq!(settings.peers[1].peer.to_string(), "ringlock-1.ringlock.invalid:17700");
        assert_eq!(settings.peers[2].peer.to_string(), "[::1]:9002");
        assert!(settings.listen.ip().is_loopback(), "this node's own peer address was resolved");

        // Another node's name need not resolve at start; this node's own
        // listening addresses must.
        let elsewhere = Config::try_parse_from(["ringlock", "--peers", peers, "--node", "1"]).unwrap();
        let error = elsewhere.cluster().unwrap_err();
        assert!(error.contains("ringlock-1.ringlock.invalid:17700") && error.contains("resolve"), "{error}");
        let listen = Config::try_parse_from(["ringlock", "--listen", "nowhere.invalid:7700"]).unwrap();
        let error = listen.listen_address().unwrap_err();
        assert!(error.starts_with("--listen nowhere.invalid:7700: cannot resolve"), "{error}");
        for flag in ["--listen", "--cluster-listen", "--metrics-listen"] {
            assert!(Config::try_parse_from(["ringlock", flag, "::1:7700"]).is_err(), "{flag}: bare IPv6 refused");
            assert!(Config::try_parse_from(["ringlock", flag, "localhost:7700"]).is_ok(), "{flag}: a name is taken");
        }
    }
}
