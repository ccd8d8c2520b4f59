//! Start-up and shutdown: the epoch, the listeners, one pinned thread per
//! shard core, and the signals that stop them.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ringlock_shards::{Shard, ShardConfig};

use crate::auth::SharedAuth;
use crate::cluster::ExitReason;
use crate::config::{ClusterSettings, Config};
use crate::node::counters::CoreStats;
use crate::node::epoch::EpochStore;
use crate::node::role::{ClusterLink, Report};
use crate::node::seed::random_seed;
use crate::node::shared::Shared;
use crate::node::tokens::{TOKEN_RANGE_LEN, TokenAuthority};
use crate::ops::{http as ops_http, sd_notify};
use crate::replication::{self, PeerSecret, PeerTls};
use crate::shard_core::listener::{bind_listeners, bind_retrying, listen_error};
use crate::shard_core::mailbox::{self, Inbox, Mailbox};
use crate::shard_core::per_ip::PerIpConnections;
use crate::shard_core::{EventLoop, build_ring, ring_mode_name};

/// A shard thread: `Ok` once it has stopped, or what stopped it.
type ShardThread = JoinHandle<Result<(), String>>;

/// What a shard thread says once set up: whether its ring has
/// defer-taskrun, or why it could not start.
type ShardReady = Result<bool, String>;

/// Runs the server until SIGINT or SIGTERM; errors are for the operator.
pub fn run(config: Config) -> Result<(), String> {
    let cluster = config.cluster()?;
    let peer_tls = peer_tls(&config, cluster.as_ref())?;
    let peer_secret = peer_secret(&config, cluster.as_ref(), peer_tls.is_some())?;
    let auth = config.auth_file.as_deref().map(SharedAuth::load).transpose()?;
    let tls = match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => Some(crate::tls::SharedTls::load(cert, key, config.tls_client_ca.as_deref())?),
        _ => None,
    };
    if let Some(auth) = &auth {
        let (_, table) = auth.current();
        tracing::info!(
            auth_file = %auth.path().display(),
            secrets = table.len(),
            "clients must authenticate (U <secret>) with a name of the auth file"
        );
    }
    let shards = config.shard_count();
    let cpus = config.shard_cpus()?;
    let shard_config = shard_config(&config, cluster.is_some())?;
    raise_descriptor_limit();
    ignore_sigpipe();

    let (authority, cluster_store) = token_authority(&config, cluster.as_ref())?;
    // In a cluster the peer port is bound first, so that a taken port stops
    // the start before clients can connect.
    let peer_listener = cluster.as_ref().map(bind_peer_listener).transpose()?;
    let metrics_listener = config.metrics_address()?.map(ops_http::bind).transpose()?;
    let (report_sender, reports) = crossbeam_channel::bounded(replication::REPORTS_QUEUED_MAX);

    let (listeners, local) = bind_listeners(config.listen_address()?, shards, &config.socket_options())?;
    let (mailboxes, inboxes) = inboxes(shards)?;
    let link = cluster.as_ref().map(|settings| ClusterLink::new(report_sender, settings.cluster.min_standbys));
    if tls.is_some() {
        tracing::info!(mutual = config.tls_client_ca.is_some(), "the client port speaks TLS only");
    }
    let security = Security { auth, tls, peer_tls };
    let shared = shared(&config, mailboxes, authority.clone(), local, link, security);

    // The loops must not take the signals: block them before the threads
    // start (they inherit the mask) and wait for them here.
    let signals = block_handled_signals();

    let (threads, ready) = start_shards(&shared, &shard_config, cpus.as_deref(), listeners, inboxes)?;
    let defer_taskrun = await_shards(&ready, shards).inspect_err(|_| stop(&shared))?;
    tracing::info!(
        max_unsent_mb = config.max_unsent_bytes() >> 20,
        output_stall_ms = config.output_stall_ms,
        "replies held unsent for slow readers: at most {} MiB in all before connections are squeezed{}",
        config.max_unsent_bytes() >> 20,
        if config.max_unsent_mb.is_none() { " (a sixty-fourth of the host's memory)" } else { "" }
    );
    tracing::info!(
        max_keys = config.max_keys(),
        "keys held or waited on: at most {}{}",
        config.max_keys(),
        if config.max_keys.is_none() {
            format!(
                " (a quarter of {} MiB of memory at {} bytes a key; --max-keys to change)",
                crate::config::usable_memory_bytes() >> 20,
                crate::config::KEY_BYTES_BUDGETED
            )
        } else {
            String::new()
        }
    );
    if config.auth_file.is_some() {
        match config.max_keys_per_name() {
            0 => tracing::info!("no per-name quota: one name may fill the key table (--max-keys-per-name 0)"),
            quota => tracing::info!(
                max_keys_per_name = quota,
                "each name may hold plus wait on at most {quota} keys{}",
                if config.max_keys_per_name.is_none() { " (half of --max-keys)" } else { "" }
            ),
        }
    } else {
        match config.max_keys_per_connection() {
            0 => tracing::info!(
                "no per-connection quota (--max-keys-per-connection): without --auth-file, one client may take keys \
                 up to --max-keys"
            ),
            quota => tracing::info!(
                max_keys_per_connection = quota,
                "each connection may hold plus wait on at most {quota} keys"
            ),
        }
    }
    tracing::info!(
        listen = %local,
        shards,
        pinned = ?cpus,
        epoch = authority.epoch(),
        data_dir = %config.data_dir.display(),
        "ringlock listening on {local}; io_uring mode: {}",
        ring_mode_name(defer_taskrun)
    );
    let replication = match (cluster, cluster_store, peer_listener) {
        (Some(settings), Some(store), Some(listener)) => {
            let started = start_replication(&config, settings, store, &shared, reports, listener, peer_secret);
            Some(started.inspect_err(|_| stop(&shared))?)
        }
        _ => {
            if let Some(cpu) = config.replication_cpu {
                tracing::info!(cpu, "single node: no replication core runs, --replication-cpu applies in a cluster");
            }
            None
        }
    };

    // Started once the cores serve, so that `/readyz` never says ready
    // before they do; after the signal mask, which the thread inherits.
    if let Some(listener) = metrics_listener {
        serve_metrics(listener, &shared).inspect_err(|_| stop(&shared))?;
    }
    sd_notify::notify(&format!("READY=1\nSTATUS=serving clients on {local}"));
    let drain = Duration::from_millis(config.drain_ms);
    let result = wait_for_stop(&signals, &threads, &shared, replication, drain);
    stop(&shared);
    let result = join_shards(threads, result);
    if result.is_ok() {
        tracing::info!("stopped");
    }
    result
}

/// The token authority: a single node's owns its epochs (the epoch file);
/// in a cluster the replication core chooses them (ballots) and persists
/// them before any token, so it gets the epoch file.
fn token_authority(
    config: &Config,
    cluster: Option<&ClusterSettings>,
) -> Result<(Arc<TokenAuthority>, Option<EpochStore>), String> {
    let store = EpochStore::open(&config.data_dir)?;
    Ok(match cluster {
        None => (Arc::new(TokenAuthority::start(store, 0, TOKEN_RANGE_LEN)?), None),
        Some(settings) => (Arc::new(TokenAuthority::cluster(settings.cluster.me as u64, TOKEN_RANGE_LEN)), Some(store)),
    })
}

/// The shards' settings from the flags, checked.
fn shard_config(config: &Config, clustered: bool) -> Result<ShardConfig, String> {
    let shard_config = ShardConfig {
        keys_max: config.keys_per_shard(),
        waiters_per_key_max: config.max_waiters_per_key,
        waiters_max: config.max_waiters,
        // Names exist only with an auth file; without one a connection may
        // have a quota instead (--max-keys-per-connection, off by default).
        name_keys_max: if config.auth_file.is_some() { config.name_keys_per_shard() } else { 0 },
        client_keys_max: if config.auth_file.is_some() { 0 } else { config.connection_keys_per_shard() },
        lease_ms_max: config.max_lease.0,
        // Only standbys need the changes of the table.
        deltas: clustered,
        ..ShardConfig::default()
    };
    shard_config.validate()?;
    Ok(shard_config)
}

/// What guards the ports, as read from the files at start.
struct Security {
    auth: Option<SharedAuth>,
    tls: Option<crate::tls::SharedTls>,
    peer_tls: Option<PeerTls>,
}

/// What every core shares, as the flags and the start so far set it.
fn shared(
    config: &Config,
    mailboxes: Vec<Mailbox>,
    authority: Arc<TokenAuthority>,
    local: SocketAddr,
    cluster: Option<ClusterLink>,
    security: Security,
) -> Arc<Shared> {
    let Security { auth, tls, peer_tls } = security;
    let shards = mailboxes.len();
    Arc::new(Shared {
        mailboxes,
        authority,
        advertised: local.to_string(),
        lease_ms_max: config.max_lease.0,
        max_connections: config.max_connections,
        connections: AtomicU32::new(0),
        next_core: AtomicUsize::new(0),
        per_ip: PerIpConnections::new(config.max_connections_per_ip),
        auth_failures: Arc::new(crate::shard_core::per_ip::AuthFailures::new()),
        stop: AtomicBool::new(false),
        stopping: AtomicBool::new(false),
        stopped_reading: AtomicUsize::new(0),
        drained: AtomicUsize::new(0),
        stats: (0..shards).map(|_| Mutex::new(CoreStats::default())).collect(),
        started: Instant::now(),
        cluster,
        auth,
        tls,
        peer_tls,
        handshake_ms: config.handshake_ms,
        connection_limits: crate::shard_core::Limits {
            core_output_max: (config.max_unsent_bytes() / shards.max(1) as u64) as usize,
            output_stall_ms: config.output_stall_ms,
            requests_per_turn: config.requests_per_turn,
            ..crate::shard_core::Limits::DEFAULT
        },
    })
}

/// Starts one thread per shard core, on its listener copy and inbox, each
/// shard with a hash seed of its own; each says on the returned channel
/// whether it could set up.
fn start_shards(
    shared: &Arc<Shared>,
    shard_config: &ShardConfig,
    cpus: Option<&[usize]>,
    listeners: Vec<RawFd>,
    inboxes: Vec<Inbox>,
) -> Result<(Vec<ShardThread>, Receiver<ShardReady>), String> {
    let (ready_sender, ready) = std::sync::mpsc::channel::<ShardReady>();
    let mut threads: Vec<ShardThread> = Vec::with_capacity(listeners.len());
    for (core, (listener, inbox)) in listeners.into_iter().zip(inboxes).enumerate() {
        let cpu = cpus.map(|cpus| cpus[core]);
        let shard_config = ShardConfig { hash_seed: random_seed() ^ core as u64, ..shard_config.clone() };
        let start = ShardStart { core, cpu, shared: shared.clone(), shard_config, listener, inbox };
        threads.push(spawn_shard(start, ready_sender.clone())?);
    }
    Ok((threads, ready))
}

/// Starts the replication core of a cluster node.
fn start_replication(
    config: &Config,
    settings: ClusterSettings,
    store: EpochStore,
    shared: &Arc<Shared>,
    reports: crossbeam_channel::Receiver<Report>,
    listener: std::net::TcpListener,
    peer_secret: Option<PeerSecret>,
) -> Result<JoinHandle<Result<ExitReason, String>>, String> {
    replication::start(replication::Start {
        settings,
        store,
        shared: shared.clone(),
        reports,
        listener,
        cpu: if config.no_pin { None } else { config.replication_cpu },
        incarnation: wall_clock_micros(),
        keys_max: usize::try_from(config.max_keys()).unwrap_or(usize::MAX),
        peer_secret,
    })
}

/// Reads the files of peer TLS (bad files stop the start, even on a single
/// node, so that a mistake shows before the node joins a cluster).
fn peer_tls(config: &Config, cluster: Option<&ClusterSettings>) -> Result<Option<PeerTls>, String> {
    let Some(files) = config.peer_tls_files()? else {
        return Ok(None);
    };
    let peer_tls = PeerTls::load(&files.cert, &files.key, &files.ca)?;
    match cluster {
        Some(_) => tracing::info!(
            peer_tls_cert = %files.cert.display(),
            peer_tls_ca = %files.ca.display(),
            "peer connections run over mutual TLS: every peer must show a certificate of --peer-tls-ca that names \
             its host in --peers"
        ),
        None => tracing::info!("single node: --peer-tls-cert, --peer-tls-key and --peer-tls-ca apply in a cluster"),
    }
    Ok(Some(peer_tls))
}

/// Reads `--peer-secret-file` (a bad file stops the start, even on a single
/// node, so that a mistake shows before the node joins a cluster), and says
/// at start what guards the peer port of a cluster (`peer_tls`: peer TLS is
/// on).
fn peer_secret(
    config: &Config,
    cluster: Option<&ClusterSettings>,
    peer_tls: bool,
) -> Result<Option<PeerSecret>, String> {
    let secret = config.peer_secret_file.as_deref().map(PeerSecret::load).transpose()?;
    if let (Some(secret), Some(path)) = (&secret, &config.peer_secret_file)
        && secret.readable_by_others
    {
        tracing::warn!(
            "--peer-secret-file {} can be read by other users than its owner; `chmod 600` it",
            path.display()
        );
    }
    match (cluster, &secret) {
        (Some(settings), None) if !peer_tls => tracing::warn!(
            peer_listen = %settings.listen,
            "the peer port has no authentication: anyone who reaches {} can speak for a node of this cluster, move \
             its epoch forward and take the active role; give every node the same --peer-secret-file, or \
             --peer-tls-cert, --peer-tls-key and --peer-tls-ca (see docs/security.md)",
            settings.listen
        ),
        (Some(_), None) => {}
        (Some(_), Some(_)) => tracing::info!("peer connections must prove the peer secret of --peer-secret-file"),
        (None, Some(_)) => tracing::info!("single node: --peer-secret-file applies in a cluster"),
        (None, None) => {}
    }
    Ok(secret)
}

/// Binds the port the peers connect to.
fn bind_peer_listener(settings: &ClusterSettings) -> Result<std::net::TcpListener, String> {
    bind_retrying(settings.listen, "--cluster-listen", || std::net::TcpListener::bind(settings.listen))
        .map_err(|error| listen_error("for peers ", settings.listen, "--cluster-listen or --peers entry", &error))
}

/// Each core's inbox, and the mailboxes the others reach it by.
fn inboxes(shards: usize) -> Result<(Vec<Mailbox>, Vec<Inbox>), String> {
    let mut mailboxes = Vec::with_capacity(shards);
    let mut inboxes = Vec::with_capacity(shards);
    for _ in 0..shards {
        let (mailbox, inbox) = mailbox::inbox().map_err(|error| format!("cannot create an eventfd: {error}"))?;
        mailboxes.push(mailbox);
        inboxes.push(inbox);
    }
    Ok((mailboxes, inboxes))
}

/// What one shard thread starts from.
struct ShardStart {
    core: usize,
    cpu: Option<usize>,
    shared: Arc<Shared>,
    shard_config: ShardConfig,
    listener: RawFd,
    inbox: Inbox,
}

/// Starts the thread of one shard core, which says on `ready` whether it
/// could set up, then runs its event loop until the server stops.
fn spawn_shard(start: ShardStart, ready: Sender<ShardReady>) -> Result<ShardThread, String> {
    let core = start.core;
    std::thread::Builder::new()
        .name(format!("ringlock-shard-{core}"))
        .spawn(move || {
            let event_loop = match set_up_shard(start) {
                Ok((event_loop, defer)) => {
                    let _ = ready.send(Ok(defer));
                    event_loop
                }
                Err(error) => {
                    let _ = ready.send(Err(error.clone()));
                    return Err(error);
                }
            };
            event_loop.run().map_err(|error| format!("shard {core} stopped: {error}"))
        })
        .map_err(|error| format!("cannot start a thread: {error}"))
}

/// On the shard's own thread: pins it, builds its ring and its loop.
/// Returns the loop and whether the ring has defer-taskrun.
fn set_up_shard(start: ShardStart) -> Result<(EventLoop, bool), String> {
    let ShardStart { core, cpu, shared, shard_config, listener, inbox } = start;
    if let Some(cpu) = cpu
        && !core_affinity::set_for_current(core_affinity::CoreId { id: cpu })
    {
        return Err(format!("cannot pin shard {core} to CPU {cpu}; check --cpus or pass --no-pin"));
    }
    let started = build_ring().and_then(|(ring, defer)| {
        let shard = Shard::new(shard_config, shared.started.elapsed().as_millis() as u64);
        EventLoop::new(ring, core, shared.clone(), shard, listener, inbox).map(|event_loop| (event_loop, defer))
    });
    started.map_err(|error| {
        if error.raw_os_error() == Some(libc::EPERM) {
            format!(
                "cannot set up io_uring on shard {core}: {error}: io_uring is forbidden here; in a container, \
                 run with deploy/seccomp-ringlock.json (Docker's default seccomp profile blocks io_uring), \
                 on a host check the sysctl kernel.io_uring_disabled"
            )
        } else {
            format!(
                "cannot set up io_uring on shard {core}: {error} (ringlock needs Linux 6.1 or later with io_uring \
                 enabled)"
            )
        }
    })
}

/// Waits until every shard thread is set up; true if every ring has
/// defer-taskrun. The first thread that could not start stops the start.
fn await_shards(ready: &Receiver<ShardReady>, shards: usize) -> Result<bool, String> {
    let mut defer_taskrun = true;
    for _ in 0..shards {
        match ready.recv() {
            Ok(Ok(defer)) => defer_taskrun &= defer,
            Ok(Err(error)) => return Err(error),
            Err(_) => break,
        }
    }
    Ok(defer_taskrun)
}

/// Starts the operator endpoint on its listener.
fn serve_metrics(listener: std::net::TcpListener, shared: &Arc<Shared>) -> Result<(), String> {
    let address = listener.local_addr().map_or_else(|_| "?".to_string(), |address| address.to_string());
    ops_http::spawn(listener, shared.clone())?;
    tracing::info!(metrics = %address, "serving /metrics, /livez and /readyz on {address}");
    Ok(())
}

/// Joins every shard thread: `result`, unless a thread failed, and then the
/// last thread's failure.
fn join_shards(threads: Vec<ShardThread>, mut result: Result<(), String>) -> Result<(), String> {
    for thread in threads {
        match thread.join() {
            Ok(Ok(())) => {}
            Ok(Err(error)) => result = Err(error),
            Err(_) => result = Err("a shard thread panicked".to_string()),
        }
    }
    result
}

/// SIGHUP: re-reads the auth file and the TLS files (of both ports). A hang-up of the
/// terminal or session that started the server must never drop a lock or a
/// waiter: the server keeps serving whatever the outcome, and a file that is
/// refused leaves the one in force.
fn reload(shared: &Shared) {
    if shared.auth.is_none() && shared.tls.is_none() && shared.peer_tls.is_none() {
        tracing::warn!(
            "SIGHUP: nothing to reload (no --auth-file, no --tls-cert, no --peer-tls-cert); ringlock keeps serving; \
             stop it with SIGTERM or SIGINT"
        );
        return;
    }
    if let Some(auth) = &shared.auth {
        match auth.reload() {
            Ok(names) => tracing::info!(
                auth_file = %auth.path().display(),
                names,
                "SIGHUP: auth file reloaded; connections whose name is gone are closed"
            ),
            Err(error) => tracing::error!("SIGHUP: {error}; the auth file in force stays"),
        }
    }
    if let Some(tls) = &shared.tls {
        match tls.reload() {
            Ok(()) => tracing::info!(
                tls_cert = %tls.cert_path().display(),
                "SIGHUP: TLS certificate, key and client CA reloaded; new connections use them, open ones keep theirs"
            ),
            Err(error) => tracing::error!("SIGHUP: {error}; the TLS settings in force stay"),
        }
    }
    if let Some(peer_tls) = &shared.peer_tls {
        match peer_tls.reload() {
            Ok(()) => tracing::info!(
                peer_tls_cert = %peer_tls.cert_path().display(),
                "SIGHUP: peer TLS certificate, key and CA reloaded; new peer connections use them, open ones keep \
                 theirs"
            ),
            Err(error) => tracing::error!("SIGHUP: {error}; the peer TLS settings in force stay"),
        }
    }
}

/// Waits for SIGINT or SIGTERM, or for a thread that ended on its own. A
/// stop signal first makes the node not ready and, with `--drain-ms`, keeps
/// it serving that long. Then, in a cluster, the replication core hands the
/// active role over; a further signal stops at once. SIGHUP reloads
/// (see [`reload`]).
fn wait_for_stop(
    signals: &libc::sigset_t,
    threads: &[ShardThread],
    shared: &Shared,
    mut replication: Option<JoinHandle<Result<ExitReason, String>>>,
    drain: Duration,
) -> Result<(), String> {
    let timeout = libc::timespec { tv_sec: 0, tv_nsec: 50_000_000 };
    let mut stopping = false;
    let mut draining_until: Option<Instant> = None;
    loop {
        // SAFETY: waiting for signals this thread has blocked.
        let signal = unsafe { libc::sigtimedwait(signals, std::ptr::null_mut(), &timeout) };
        if signal == libc::SIGHUP {
            reload(shared);
        }
        let mut stop_now = signal == libc::SIGINT || signal == libc::SIGTERM;
        if stop_now && !shared.stopping.swap(true, Ordering::SeqCst) {
            sd_notify::notify("STOPPING=1\nSTATUS=stopping");
            if !drain.is_zero() {
                tracing::info!(
                    signal,
                    drain_ms = drain.as_millis() as u64,
                    "stop signal: /readyz now answers 503; serving on for --drain-ms before stopping (another \
                     signal stops now)"
                );
                draining_until = Some(Instant::now() + drain);
                stop_now = false;
            }
        } else if stop_now {
            draining_until = None;
        }
        if draining_until.take_if(|until| Instant::now() >= *until).is_some() {
            stop_now = true;
        }
        if stop_now {
            let cause = if signal > 0 { format!("signal {signal}") } else { "end of --drain-ms".to_string() };
            match (&shared.cluster, stopping) {
                (Some(link), false) => {
                    tracing::info!(%cause, "stopping: handing the active role over first, if this node has it");
                    link.stop.store(true, Ordering::SeqCst);
                    stopping = true;
                }
                _ => {
                    tracing::info!(%cause, "stopping: answering queued acquires and closing connections");
                    return Ok(());
                }
            }
        }
        if let Some(thread) = replication.take_if(|thread| thread.is_finished()) {
            return replication_ended(thread, stopping);
        }
        if threads.iter().any(JoinHandle::is_finished) {
            return Err("a shard core stopped unexpectedly".to_string());
        }
    }
}

/// The replication core's thread ended: after a stop asked for, it left the
/// cluster, and the node stops; else the node cannot go on.
fn replication_ended(thread: JoinHandle<Result<ExitReason, String>>, stopping: bool) -> Result<(), String> {
    match thread.join() {
        Ok(Ok(reason)) if stopping => {
            tracing::info!(?reason, "left the cluster; closing connections");
            Ok(())
        }
        Ok(Ok(reason)) => Err(format!("the replication core ended on its own ({reason:?})")),
        Ok(Err(error)) => Err(error),
        Err(_) => Err("the replication core panicked".to_string()),
    }
}

/// Microseconds since the Unix epoch: grows across restarts of a node, which
/// is what tells its peers a new life from a late message of the old one.
fn wall_clock_micros() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_micros() as u64)
}

fn stop(shared: &Shared) {
    shared.stop.store(true, Ordering::SeqCst);
    for mailbox in &shared.mailboxes {
        mailbox.wake();
    }
}

/// Blocks, on this thread and the threads it starts from now on, the
/// signals the main thread waits for: SIGINT and SIGTERM stop the server,
/// SIGHUP reloads. Returns their set.
fn block_handled_signals() -> libc::sigset_t {
    // SAFETY: building a signal set in a zeroed value, and changing this
    // thread's signal mask with it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

fn ignore_sigpipe() {
    // SAFETY: ignoring SIGPIPE; sends report EPIPE instead.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
}

/// Lets the process open as many descriptors as its hard limit allows.
fn raise_descriptor_limit() {
    // SAFETY: reading and setting this process's own limit.
    unsafe {
        let mut limit: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}
