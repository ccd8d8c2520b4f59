//! Start-up and shutdown: the epoch, the listeners, one pinned thread per
//! shard core, and the signals that stop them.

use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ringlock_shards::{Shard, ShardConfig};

use crate::cluster::ExitReason;
use crate::config::{Config, Keepalive};
use crate::epoch::EpochStore;
use crate::event_loop::{EventLoop, Shared, build_ring, ring_mode_name};
use crate::ops_http;
use crate::per_ip::PerIpConnections;
use crate::replication;
use crate::role::ClusterLink;
use crate::router;
use crate::sd_notify;
use crate::stats::CoreStats;
use crate::tokens::{TOKEN_RANGE_LEN, TokenAuthority};

/// Runs the server until SIGINT or SIGTERM; errors are for the operator.
pub fn run(config: Config) -> Result<(), String> {
    let cluster = config.cluster()?;
    let shards = config.shard_count();
    let cpus = config.shard_cpus()?;
    let shard_config = ShardConfig {
        keys_max: config.keys_per_shard(),
        waiters_per_key_max: config.max_waiters_per_key,
        waiters_max: config.max_waiters,
        lease_ms_max: config.max_lease.0,
        // Only standbys need the changes of the table.
        deltas: cluster.is_some(),
        ..ShardConfig::default()
    };
    shard_config.validate()?;
    raise_descriptor_limit();
    ignore_sigpipe();

    let store = EpochStore::open(&config.data_dir)?;
    // A single node owns its epochs; in a cluster the replication core
    // chooses them (ballots) and persists them before any token.
    let (authority, cluster_store) = match &cluster {
        None => (Arc::new(TokenAuthority::start(store, 0, TOKEN_RANGE_LEN)?), None),
        Some(settings) => (Arc::new(TokenAuthority::cluster(settings.cluster.me as u64, TOKEN_RANGE_LEN)), Some(store)),
    };
    // In a cluster the peer port is bound first, so that a taken port stops
    // the start before clients can connect.
    let peer_listener = match &cluster {
        None => None,
        Some(settings) => Some(
            bind_retrying(settings.listen, "--cluster-listen", || std::net::TcpListener::bind(settings.listen))
                .map_err(|error| {
                    listen_error("for peers ", settings.listen, "--cluster-listen or --peers entry", &error)
                })?,
        ),
    };
    let metrics_listener = config.metrics_listen.map(ops_http::bind).transpose()?;
    let (report_sender, reports) = crossbeam_channel::bounded(crate::replication::REPORTS_QUEUED_MAX);

    let (listeners, local) = bind_listeners(config.listen_address()?, shards, &config.keepalive())?;
    let mut mailboxes = Vec::with_capacity(shards);
    let mut inboxes = Vec::with_capacity(shards);
    for _ in 0..shards {
        let (mailbox, inbox) = router::inbox().map_err(|error| format!("cannot create an eventfd: {error}"))?;
        mailboxes.push(mailbox);
        inboxes.push(inbox);
    }
    let shared = Arc::new(Shared {
        mailboxes,
        authority: authority.clone(),
        advertised: local.to_string(),
        lease_ms_max: config.max_lease.0,
        max_connections: config.max_connections,
        connections: AtomicU32::new(0),
        next_core: AtomicUsize::new(0),
        per_ip: PerIpConnections::new(config.max_connections_per_ip),
        stop: AtomicBool::new(false),
        stopping: AtomicBool::new(false),
        stopped_reading: AtomicUsize::new(0),
        drained: AtomicUsize::new(0),
        stats: (0..shards).map(|_| Mutex::new(CoreStats::default())).collect(),
        started: Instant::now(),
        cluster: cluster.as_ref().map(|_| ClusterLink::new(report_sender)),
    });

    // The loops must not take the signals: block them before the threads
    // start (they inherit the mask) and wait for them here.
    let signals = handled_signals();
    // SAFETY: changing this thread's signal mask with a valid set.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &signals, std::ptr::null_mut()) };

    let mut threads: Vec<JoinHandle<Result<(), String>>> = Vec::with_capacity(shards);
    let (ready_sender, ready) = std::sync::mpsc::channel::<Result<bool, String>>();
    for (core, (listener, inbox)) in listeners.into_iter().zip(inboxes).enumerate() {
        let shared = shared.clone();
        let cpu = cpus.as_ref().map(|cpus| cpus[core]);
        let shard_config = ShardConfig { hash_seed: random_seed() ^ core as u64, ..shard_config.clone() };
        let ready_sender = ready_sender.clone();
        let thread = std::thread::Builder::new()
            .name(format!("ringlock-shard-{core}"))
            .spawn(move || {
                if let Some(cpu) = cpu
                    && !core_affinity::set_for_current(core_affinity::CoreId { id: cpu })
                {
                    let error = format!("cannot pin shard {core} to CPU {cpu}; check --cpus or pass --no-pin");
                    let _ = ready_sender.send(Err(error.clone()));
                    return Err(error);
                }
                let started = build_ring().and_then(|(ring, defer)| {
                    let shard = Shard::new(shard_config, shared.started.elapsed().as_millis() as u64);
                    EventLoop::new(ring, core, shared.clone(), shard, listener, inbox).map(|event_loop| (event_loop, defer))
                });
                let event_loop = match started {
                    Ok((event_loop, defer)) => {
                        let _ = ready_sender.send(Ok(defer));
                        event_loop
                    }
                    Err(error) if error.raw_os_error() == Some(libc::EPERM) => {
                        let error = format!(
                            "cannot set up io_uring on shard {core}: {error}: io_uring is forbidden here; in a container, \
                             run with deploy/seccomp-ringlock.json (Docker's default seccomp profile blocks io_uring), \
                             on a host check the sysctl kernel.io_uring_disabled"
                        );
                        let _ = ready_sender.send(Err(error.clone()));
                        return Err(error);
                    }
                    Err(error) => {
                        let error = format!("cannot set up io_uring on shard {core}: {error} (ringlock needs Linux 6.1 or later with io_uring enabled)");
                        let _ = ready_sender.send(Err(error.clone()));
                        return Err(error);
                    }
                };
                event_loop.run().map_err(|error| format!("shard {core} stopped: {error}"))
            })
            .map_err(|error| format!("cannot start a thread: {error}"))?;
        threads.push(thread);
    }
    drop(ready_sender);
    let mut defer_taskrun = true;
    for _ in 0..shards {
        match ready.recv() {
            Ok(Ok(defer)) => defer_taskrun &= defer,
            Ok(Err(error)) => {
                stop(&shared);
                return Err(error);
            }
            Err(_) => break,
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
            let started = replication::start(replication::Start {
                settings,
                store,
                shared: shared.clone(),
                reports,
                listener,
                cpu: if config.no_pin { None } else { config.replication_cpu },
                incarnation: wall_clock_micros(),
                keys_max: usize::try_from(config.max_keys).unwrap_or(usize::MAX),
            });
            match started {
                Ok(thread) => Some(thread),
                Err(error) => {
                    stop(&shared);
                    return Err(error);
                }
            }
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
        let address = listener.local_addr().map_or_else(|_| "?".to_string(), |address| address.to_string());
        if let Err(error) = ops_http::spawn(listener, shared.clone()) {
            stop(&shared);
            return Err(error);
        }
        tracing::info!(metrics = %address, "serving /metrics, /livez and /readyz on {address}");
    }
    sd_notify::notify(&format!("READY=1\nSTATUS=serving clients on {local}"));
    let drain = Duration::from_millis(config.drain_ms);
    let mut result = wait_for_stop(&signals, &threads, &shared, replication, drain);
    stop(&shared);
    for thread in threads {
        match thread.join() {
            Ok(Ok(())) => {}
            Ok(Err(error)) => result = Err(error),
            Err(_) => result = Err("a shard thread panicked".to_string()),
        }
    }
    if result.is_ok() {
        tracing::info!("stopped");
    }
    result
}

/// Waits for SIGINT or SIGTERM, or for a thread that ended on its own. A
/// stop signal first makes the node not ready and, with `--drain-ms`, keeps
/// it serving that long. Then, in a cluster, the replication core hands the
/// active role over; a further signal stops at once. SIGHUP is logged and
/// ignored.
fn wait_for_stop(
    signals: &libc::sigset_t,
    threads: &[JoinHandle<Result<(), String>>],
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
            // A hang-up of the terminal or session that started the server
            // must not drop every lock and waiter, and there is no
            // configuration to reload: the server keeps serving.
            tracing::warn!(
                signal,
                "SIGHUP ignored: ringlock keeps serving (it has nothing to reload); stop it with SIGTERM or SIGINT"
            );
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
            return match thread.join() {
                Ok(Ok(reason)) if stopping => {
                    tracing::info!(?reason, "left the cluster; closing connections");
                    Ok(())
                }
                Ok(Ok(reason)) => Err(format!("the replication core ended on its own ({reason:?})")),
                Ok(Err(error)) => Err(error),
                Err(_) => Err("the replication core panicked".to_string()),
            };
        }
        if threads.iter().any(JoinHandle::is_finished) {
            return Err("a shard core stopped unexpectedly".to_string());
        }
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

/// The signals the main thread waits for: SIGINT and SIGTERM stop the
/// server, SIGHUP is only logged.
fn handled_signals() -> libc::sigset_t {
    // SAFETY: building a signal set in a zeroed value.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
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

/// A seed for the lock tables' hash, so clients cannot aim keys at one chain.
pub(crate) fn random_seed() -> u64 {
    let mut seed = [0u8; 8];
    // SAFETY: getrandom fills the buffer we pass.
    let filled = unsafe { libc::getrandom(seed.as_mut_ptr().cast(), 8, 0) };
    if filled == 8 {
        u64::from_ne_bytes(seed)
    } else {
        Instant::now().elapsed().as_nanos() as u64 ^ u64::from(std::process::id())
    }
}

/// How long a start keeps trying an address that another socket holds. A
/// server killed a moment ago keeps its listener until the kernel has torn
/// down its io_uring rings, which takes milliseconds; a live server holds it
/// for good, and the start fails once this has passed.
const BIND_RETRY_FOR: Duration = Duration::from_secs(2);
/// Pause between two tries of a held address.
const BIND_RETRY_PAUSE: Duration = Duration::from_millis(10);

/// Calls `bind` until it succeeds, fails otherwise than "address in use", or
/// [`BIND_RETRY_FOR`] has passed. `flag` names the flag that chose the address.
pub(crate) fn bind_retrying<T>(
    address: SocketAddr,
    flag: &str,
    mut bind: impl FnMut() -> io::Result<T>,
) -> io::Result<T> {
    let deadline = Instant::now() + BIND_RETRY_FOR;
    let mut warned = false;
    loop {
        match bind() {
            Err(error) if error.kind() == io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                if !warned {
                    tracing::warn!(
                        %address,
                        "{address} ({flag}) is in use; trying again for up to {BIND_RETRY_FOR:?}, since a server \
                         killed a moment ago may still hold it"
                    );
                    warned = true;
                }
                std::thread::sleep(BIND_RETRY_PAUSE);
            }
            result => return result,
        }
    }
}

/// The operator's message for a socket that could not listen on `address`.
pub(crate) fn listen_error(what: &str, address: SocketAddr, flag: &str, error: &io::Error) -> String {
    if error.kind() == io::ErrorKind::AddrInUse {
        format!(
            "cannot listen {what}on {address}: address in use; pick another {flag} (another process listens \
             there, and ringlock never shares a port)"
        )
    } else {
        format!("cannot listen {what}on {address}: {error}; check {flag}")
    }
}

/// One listening socket for every shard core, and a duplicate descriptor of
/// it per core, on which that core arms its accept. io_uring hands each new
/// connection to one waiting accept only, and the core that accepted it
/// hands it on round the cores, so each connection lives on one core. The socket has no SO_REUSEPORT: a second server started on
/// the same address fails to bind, rather than splitting the clients with
/// this one and granting the same keys. Port 0 picks a free port, which the
/// log line and `P` then name.
fn bind_listeners(
    address: SocketAddr,
    count: usize,
    keepalive: &Keepalive,
) -> Result<(Vec<RawFd>, SocketAddr), String> {
    let fd = bind_retrying(address, "--listen", || listen_on(address))
        .map_err(|error| listen_error("", address, "--listen", &error))?;
    // Accepted sockets inherit these options from the listening socket, so
    // setting them here costs no system call per connection.
    set_keepalive(fd, keepalive)
        .map_err(|error| format!("cannot set TCP keepalive on {address}: {error}; check --keepalive-*"))?;
    let local = local_address(fd).map_err(|error| format!("cannot read the listening address: {error}"))?;
    let mut listeners = vec![fd];
    for _ in 1..count {
        // SAFETY: duplicating a descriptor we own.
        let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if copy < 0 {
            return Err(format!("cannot duplicate the listening socket: {}", io::Error::last_os_error()));
        }
        listeners.push(copy);
    }
    Ok((listeners, local))
}

/// Sets TCP keepalive and the user timeout on a socket, so that the
/// connections of a client host that vanished without a reset end, and their
/// queued acquires with them.
fn set_keepalive(fd: RawFd, keepalive: &Keepalive) -> io::Result<()> {
    let mut options = vec![(libc::SOL_SOCKET, libc::SO_KEEPALIVE, i32::from(keepalive.idle_s > 0))];
    if keepalive.idle_s > 0 {
        options.extend([
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, keepalive.idle_s as i32),
            (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, keepalive.interval_s as i32),
            (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, keepalive.probes as i32),
        ]);
    }
    options.push((libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, keepalive.user_timeout_ms as i32));
    for (level, option, value) in options {
        let value: libc::c_int = value;
        // SAFETY: setting an integer option on a socket we own.
        let result = unsafe {
            libc::setsockopt(
                fd,
                level,
                option,
                (&value as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if result != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

fn listen_on(address: SocketAddr) -> io::Result<RawFd> {
    let family = if address.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: plain socket calls on a descriptor we create; errors checked.
    unsafe {
        let fd = libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SO_REUSEADDR lets a restart bind while connections of the last run
        // are in TIME_WAIT; unlike SO_REUSEPORT, it never lets two listening
        // sockets share the address.
        let one: libc::c_int = 1;
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&one as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        );
        let (storage, len) = socket_address(address);
        if libc::bind(fd, (&storage as *const libc::sockaddr_storage).cast(), len) != 0 || libc::listen(fd, 4096) != 0 {
            let error = io::Error::last_os_error();
            libc::close(fd);
            return Err(error);
        }
        Ok(fd)
    }
}

fn socket_address(address: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: a zeroed sockaddr_storage is valid, and each arm writes the
    // sockaddr type that fits in it.
    unsafe {
        let mut storage: libc::sockaddr_storage = std::mem::zeroed();
        match address {
            SocketAddr::V4(v4) => {
                let out = &mut *(&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>();
                out.sin_family = libc::AF_INET as libc::sa_family_t;
                out.sin_port = v4.port().to_be();
                out.sin_addr = libc::in_addr { s_addr: u32::from_ne_bytes(v4.ip().octets()) };
                (storage, size_of::<libc::sockaddr_in>() as libc::socklen_t)
            }
            SocketAddr::V6(v6) => {
                let out = &mut *(&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>();
                out.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                out.sin6_port = v6.port().to_be();
                out.sin6_addr = libc::in6_addr { s6_addr: v6.ip().octets() };
                out.sin6_flowinfo = v6.flowinfo();
                out.sin6_scope_id = v6.scope_id();
                (storage, size_of::<libc::sockaddr_in6>() as libc::socklen_t)
            }
        }
    }
}

fn local_address(fd: RawFd) -> io::Result<SocketAddr> {
    // SAFETY: getsockname writes at most `len` bytes into the storage.
    unsafe {
        let mut storage: libc::sockaddr_storage = std::mem::zeroed();
        let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        if libc::getsockname(fd, (&mut storage as *mut libc::sockaddr_storage).cast(), &mut len) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(socket_address_of(&storage))
    }
}

/// The IPv4 or IPv6 address a socket call wrote into `storage`.
pub(crate) fn socket_address_of(storage: &libc::sockaddr_storage) -> SocketAddr {
    // SAFETY: the family field says which sockaddr type the storage holds.
    unsafe {
        match i32::from(storage.ss_family) {
            libc::AF_INET => {
                let v4 = &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>();
                let ip = std::net::Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr));
                SocketAddr::from((ip, u16::from_be(v4.sin_port)))
            }
            _ => {
                let v6 = &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>();
                let ip = std::net::Ipv6Addr::from(v6.sin6_addr.s6_addr);
                SocketAddr::from((ip, u16::from_be(v6.sin6_port)))
            }
        }
    }
}
