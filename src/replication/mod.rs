//! The replication core of a cluster node: a thread of its own, pinned by
//! `--replication-cpu`, running a glommio executor that drives the cluster
//! logic ([`crate::cluster::Node`]) and the peer connections.
//!
//! It takes the shards' deltas from a bounded queue, keeps them in a mirror
//! of the table, batches them (up to a frame's worth, at least every
//! millisecond) to every standby, sends a full snapshot to a standby that
//! (re)joins, tells the shard cores their role, and sets the epoch of the
//! token ranges the shards draw from, persisting each new epoch with fsync
//! before the first token of it.
//!
//! # Layout
//! - `driver`: the loop: reports, peer frames, cluster effects.
//! - `mirror`: the replicated table (pure).
//! - `peers`: the peer connections and their handshake.
//! - `stream`: a peer connection's bytes, plain or through TLS.
//! - `peer_tls`: the TLS settings of `--peer-tls-cert/-key/-ca`.
//! - `proof`: the proof of the peer secret (HMAC-SHA256, pure).
//! - `secret`: reading and checking `--peer-secret-file`.
//! - `log_limit`: how often failed peer connections are logged (pure).

mod driver;
mod log_limit;
mod mirror;
pub mod peer_tls;
mod peers;
mod proof;
mod secret;
mod stream;

pub use self::peer_tls::PeerTls;
pub use self::secret::PeerSecret;

use std::cell::{Cell, RefCell};
use std::os::fd::IntoRawFd;
use std::rc::Rc;
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::Receiver;
use glommio::{LocalExecutorBuilder, Placement};

use crate::cluster::{ExitReason, Node, wire};
use crate::config::ClusterSettings;
use crate::node::epoch::EpochStore;
use crate::node::role::Report;
use crate::node::shared::Shared;

use self::driver::ReplicationCore;
use self::peers::{EventQueue, Gate, Identity, Outbox, PeerLinks, Silence};

/// Memory glommio registers for its own I/O buffers. The peer sockets do
/// not use them, and locked memory is scarce (8 MiB on some hosts).
const IO_MEMORY_BYTES: usize = 512 << 10;

/// Reports (one per shard turn) the queue from the shards holds before a
/// shard keeps its own until the next turn.
pub const REPORTS_QUEUED_MAX: usize = 65_536;

/// What the replication thread needs to start.
pub struct Start {
    pub settings: ClusterSettings,
    pub store: EpochStore,
    pub shared: Arc<Shared>,
    pub reports: Receiver<Report>,
    /// The peer listener, bound already so that a taken port is a start-up error.
    pub listener: std::net::TcpListener,
    pub cpu: Option<usize>,
    pub incarnation: u64,
    /// `--max-keys`: the most held locks a replicated table may hold.
    pub keys_max: usize,
    /// `--peer-secret-file`: every peer connection proves it first.
    pub peer_secret: Option<PeerSecret>,
}

/// Starts the replication thread; it returns once the node has left the
/// cluster (after a stop request, see [`crate::node::role::ClusterLink::stop`]).
pub fn start(start: Start) -> Result<JoinHandle<Result<ExitReason, String>>, String> {
    let peer_names = peer_names(&start)?;
    let placement = match start.cpu {
        Some(cpu) => Placement::Fixed(cpu),
        None => Placement::Unbound,
    };
    let (ready_sender, ready) = std::sync::mpsc::channel::<Result<(), String>>();
    let thread = std::thread::Builder::new()
        .name("ringlock-replication".to_string())
        .spawn(move || {
            let nodes = start.settings.peers.len();
            let executor = LocalExecutorBuilder::new(placement)
                .name("ringlock-replication")
                .io_memory(IO_MEMORY_BYTES)
                // Blocking threads for the peers' name lookups: one per
                // peer, so that a slow lookup holds up no other peer's.
                .blocking_thread_pool_placement(glommio::PoolPlacement::Unbound(nodes.max(1)))
                .make()
                .map_err(|error| {
                    let hint = match start.cpu {
                        Some(cpu) => format!("; check --replication-cpu {cpu}"),
                        None => String::new(),
                    };
                    format!("cannot start the replication core: {error}{hint}")
                });
            let executor = match executor {
                Ok(executor) => {
                    let _ = ready_sender.send(Ok(()));
                    executor
                }
                Err(error) => {
                    let _ = ready_sender.send(Err(error.clone()));
                    return Err(error);
                }
            };
            Ok(executor.run(run(start, peer_names)))
        })
        .map_err(|error| format!("cannot start the replication thread: {error}"))?;
    match ready.recv() {
        Ok(Ok(())) => Ok(thread),
        Ok(Err(error)) => Err(error),
        Err(_) => Err("the replication thread ended at start".to_string()),
    }
}

/// With peer TLS, the name each node's certificate must hold: the host of
/// its peer address in `--peers`.
fn peer_names(start: &Start) -> Result<Vec<rustls::pki_types::ServerName<'static>>, String> {
    if start.shared.peer_tls.is_none() {
        return Ok(Vec::new());
    }
    start
        .settings
        .peers
        .iter()
        .map(|peer| {
            peer_tls::server_name(peer.peer.host())
                .map_err(|error| format!("--peers {}: {error}; peer TLS needs a name to check", peer.peer))
        })
        .collect()
}

async fn run(start: Start, peer_names: Vec<rustls::pki_types::ServerName<'static>>) -> ExitReason {
    let Start { settings, store, shared, reports, listener, incarnation, keys_max, peer_secret, .. } = start;
    let config = settings.cluster;
    let (me, nodes) = (config.me, config.nodes);
    let started = std::time::Instant::now();
    let now_ms = move || started.elapsed().as_millis() as u64;
    let node = Node::new(config, store.highest(), incarnation, now_ms());

    let events = Rc::new(RefCell::new(EventQueue::default()));
    let outboxes: Rc<Vec<RefCell<Outbox>>> = Rc::new((0..nodes).map(|_| RefCell::new(Outbox::default())).collect());
    let peers_fingerprint = wire::peers_fingerprint(settings.peers.iter().map(|peer| &peer.client));
    let hello = Rc::new(Cell::new(self::driver::hello(me, nodes, incarnation, peers_fingerprint)));
    let identity = Identity { me, nodes, peers_fingerprint };
    let silence = Silence::new(config.heartbeat_ms, config.failover_ms);
    let key = peer_secret.map(|secret| secret.key);
    let gate = Rc::new(Gate::new(identity, key, shared.clone(), silence, peer_names));
    let links = PeerLinks { events, outboxes, hello, gate };
    // SAFETY: the descriptor comes from a bound, listening std listener whose
    // ownership moves here.
    let listener =
        unsafe { <glommio::net::TcpListener as std::os::fd::FromRawFd>::from_raw_fd(listener.into_raw_fd()) };
    glommio::spawn_local(peers::accept(listener, links.gate.clone(), links.events.clone())).detach();
    for (to, peer) in settings.peers.iter().enumerate() {
        if to != me {
            let task = peers::write(to, peer.peer.clone(), links.clone());
            glommio::spawn_local(task).detach();
        }
    }
    tracing::info!(node = me, nodes, peer_listen = %settings.listen, "replication core started; standby until the cluster decides");
    let core = ReplicationCore::new(node, settings.peers, shared, store, reports, links, keys_max);
    core.run(now_ms).await
}
