//! `ringlock-bench run`: plans the connections, starts the workers, moves
//! them through warm-up, measurement and drain, samples the server, and
//! gathers one [`RunReport`].

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::cli::{RedisReleaseArg, RunArgs, Target};
use crate::keys::{KEY_LEN_MAX, KeyFormat};
use crate::pending::KEY_ID_MAX;
use crate::proc_sample;
use crate::report::{HoldReport, RunReport, ServerReport};
use crate::resp::{self, RespValue};
use crate::tls::{self, Security};
use crate::wire::{REDIS_RELEASE_SCRIPT, RedisRelease, Wire};
use crate::worker::{
    ConnectionPlan, Control, OpenLoop, PHASE_DRAIN, PHASE_MEASURE, PHASE_WARMUP, Routing, Settings, Worker,
    WorkerStats, Workload,
};
use ringlock_proto::cluster_index;

/// Most connections one run opens.
const CONNECTIONS_MAX: usize = 65_536;
/// Most requests in flight per connection.
const DEPTH_MAX: usize = 65_536;
/// How long a control request (`S`, `SCRIPT LOAD`) may take.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs one workload as `args` say.
pub fn run(args: &RunArgs) -> Result<RunReport, String> {
    let keys = KeyFormat::new(args.key_len, checked_key_count(args)?)?;
    let routing = routing(args, &keys)?;
    let plans = plan_connections(args)?;
    if let Some(routing) = &routing {
        check_slices(args, &plans, routing, &keys)?;
    }
    let settings = settings(args, keys, routing)?;
    let servers = settings.servers.clone();

    let server_pid = args.server_pid.map(|pid| pid.to_string());
    let sample_server = || server_pid.as_deref().map(proc_sample::sample).transpose().map_err(|e| e.to_string());
    let rss_before_start = sample_server()?;

    let hold = args.workload == Workload::Hold;
    let control = Arc::new(Control {
        phase: std::sync::atomic::AtomicU8::new(if hold { PHASE_MEASURE } else { PHASE_WARMUP }),
        connected: Barrier::new(args.threads + 1),
    });
    let threads = spawn_workers(args, &settings, &plans, &control)?;
    control.connected.wait();

    // Over every cluster: the sum of their `S` counts.
    let handoffs = || {
        (args.target == Target::Ringlock && !hold)
            .then(|| servers.iter().map(|(addr, security)| ringlock_handoffs(*addr, security)).sum::<Option<u64>>())
            .flatten()
    };
    let before;
    if hold {
        before = Samples::take(|| Ok(rss_before_start), None)?;
        let deadline = before.at + Duration::from_secs_f64(args.duration);
        while !threads.iter().all(|thread| thread.is_finished()) {
            if Instant::now() >= deadline {
                control.phase.store(PHASE_DRAIN, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    } else {
        std::thread::sleep(Duration::from_secs_f64(args.warmup));
        let handoffs_before = handoffs();
        control.phase.store(PHASE_MEASURE, Ordering::Relaxed);
        before = Samples::take(sample_server, handoffs_before)?;
        std::thread::sleep(Duration::from_secs_f64(args.duration));
    }
    let mut after = Samples::take(sample_server, None)?;
    control.phase.store(PHASE_DRAIN, Ordering::Relaxed);
    after.handoffs = handoffs();

    let mut total: Option<WorkerStats> = None;
    for thread in threads {
        let stats = thread.join().map_err(|_| "a load-generator thread panicked".to_string())??;
        match &mut total {
            Some(total) => total.add(&stats),
            None => total = Some(stats),
        }
    }
    Ok(report(args, &total.expect("at least one thread"), before, after))
}

/// The number of keys the workload draws from, checked with the other
/// limits of `args`.
fn checked_key_count(args: &RunArgs) -> Result<u64, String> {
    if args.connections == 0 || args.connections > CONNECTIONS_MAX {
        return Err(format!("--connections must be 1 to {CONNECTIONS_MAX}"));
    }
    if args.depth == 0 || args.depth > DEPTH_MAX {
        return Err(format!("--depth must be 1 to {DEPTH_MAX}"));
    }
    if args.threads == 0 || args.threads > args.connections {
        return Err("--threads must be at least 1 and at most --connections".into());
    }
    if args.rate.is_some() && args.workload == Workload::Hold {
        return Err("--rate does not apply to the hold workload (it fills the server as fast as it can)".into());
    }
    if args.target == Target::Echo && args.workload != Workload::Uncontended {
        return Err("the echo target only runs the uncontended workload (it holds no locks)".into());
    }
    let key_count = match args.workload {
        Workload::Uncontended => args.key_space,
        Workload::Contended => args.hot_keys,
        Workload::Hold => args.hold_keys,
    };
    if key_count == 0 || key_count > KEY_ID_MAX {
        return Err("the workload needs at least one key (--key-space, --hot-keys or --hold-keys)".into());
    }
    Ok(key_count)
}

/// What every worker shares: the servers with their TLS settings, the wire
/// format (loading Redis's release script on each server), the timings.
fn settings(args: &RunArgs, keys: KeyFormat, routing: Option<Arc<Routing>>) -> Result<Settings, String> {
    let lease_ms = (args.lease * 1000.0).round() as u64;
    if lease_ms == 0 {
        return Err("--lease must be above 0".into());
    }
    let addrs: Vec<SocketAddr> = if args.clusters.is_empty() {
        vec![args.addr]
    } else {
        args.clusters.iter().map(|cluster| cluster.addr).collect()
    };
    let servers = addrs
        .iter()
        .map(|&addr| args.security.security(addr).map(|security| (addr, security)))
        .collect::<Result<Vec<_>, String>>()?;
    if servers[0].1.secret.is_some() && args.target != Target::Ringlock {
        return Err("--secret (or RINGLOCK_SECRET) is for the ringlock target only".into());
    }
    let wire = match args.target {
        Target::Ringlock => Wire::Ringlock,
        Target::Echo => Wire::Echo,
        Target::Redis => Wire::Redis(match args.redis_release {
            RedisReleaseArg::Evalsha => {
                // Each server gets the script; its SHA-1 is the same everywhere.
                let mut sha = None;
                for (addr, security) in &servers {
                    sha = Some(redis_script_load(*addr, security)?);
                }
                RedisRelease::CompareAndDelete { sha: sha.expect("at least one server") }
            }
            RedisReleaseArg::Del => RedisRelease::Delete,
        }),
    };
    let wait_ms = (args.wait * 1000.0).round() as u64;
    Ok(Settings {
        servers,
        routing,
        acquire_line: wire.acquire_line(&keys, lease_ms, wait_ms),
        wire,
        workload: args.workload,
        keys,
        lanes_per_connection: args.depth,
        lease_ms,
        wait_ms,
        hot_keys: args.hot_keys,
        retry_delay: Duration::from_secs_f64(args.retry_delay_ms / 1000.0),
        drain_timeout: Duration::from_secs_f64(args.drain_timeout),
        poll: Duration::from_micros(args.poll_us),
        open_loop: args.rate.map(|ops_per_s| OpenLoop {
            // Each slot is an acquire and, after its grant, a release.
            cycles_per_s: ops_per_s / 2.0,
            connections: args.connections as u64,
            lag_tolerance: Duration::from_micros(args.lag_tolerance_us),
        }),
    })
}

/// Starts `--threads` workers, each with every `threads`-th connection of
/// `plans`, pinned as `--cpus` says.
fn spawn_workers(
    args: &RunArgs,
    settings: &Settings,
    plans: &[ConnectionPlan],
    control: &Arc<Control>,
) -> Result<Vec<JoinHandle<Result<WorkerStats, String>>>, String> {
    let base = Instant::now();
    let mut threads = Vec::with_capacity(args.threads);
    for thread in 0..args.threads {
        let plans: Vec<ConnectionPlan> = plans.iter().copied().skip(thread).step_by(args.threads).collect();
        let settings = settings.clone();
        let control = control.clone();
        let cpu = args.cpus.as_ref().filter(|cpus| !cpus.0.is_empty()).map(|cpus| cpus.0[thread % cpus.0.len()]);
        let seed = 0x9e37_79b9_7f4a_7c15_u64.wrapping_mul(thread as u64 + 1) ^ base.elapsed().as_nanos() as u64;
        let handle = std::thread::Builder::new()
            .name(format!("bench-{thread}"))
            .spawn(move || -> Result<WorkerStats, String> {
                if let Some(cpu) = cpu
                    && !core_affinity::set_for_current(core_affinity::CoreId { id: cpu })
                {
                    control.connected.wait();
                    return Err(format!("cannot pin thread {thread} to CPU {cpu}"));
                }
                match Worker::new(settings, plans, seed, base) {
                    Ok(worker) => worker.run(&control).map_err(|error| format!("thread {thread}: {error}")),
                    Err(error) => {
                        control.connected.wait();
                        Err(format!("thread {thread}: {error}"))
                    }
                }
            })
            .map_err(|error| format!("cannot start a thread: {error}"))?;
        threads.push(handle);
    }
    Ok(threads)
}

/// What is sampled at each end of the measured time.
struct Samples {
    at: Instant,
    machine: proc_sample::MachineSample,
    server: Option<proc_sample::ProcSample>,
    generator: Option<proc_sample::ProcSample>,
    /// The servers' hand-offs so far (ringlock, timed workloads).
    handoffs: Option<u64>,
}

impl Samples {
    /// Now, then the machine, the server (by `server`) and this process.
    fn take(
        server: impl FnOnce() -> Result<Option<proc_sample::ProcSample>, String>,
        handoffs: Option<u64>,
    ) -> Result<Samples, String> {
        let (at, machine) = (Instant::now(), proc_sample::machine_sample());
        let server = server()?;
        Ok(Samples { at, machine, server, generator: proc_sample::sample("self").ok(), handoffs })
    }
}

/// The run's report from the workers' `total` and the samples around the
/// measured time.
fn report(args: &RunArgs, total: &WorkerStats, before: Samples, after: Samples) -> RunReport {
    let measured = after.at.duration_since(before.at).as_secs_f64();
    let server = match (args.server_pid, before.server, after.server) {
        (Some(pid), Some(before), Some(after)) => Some(ServerReport {
            pid,
            cpu_percent: proc_sample::cpu_percent(&before, &after),
            rss_before_bytes: before.rss_bytes,
            rss_after_bytes: after.rss_bytes,
        }),
        _ => None,
    };
    let hold_report = (args.workload == Workload::Hold).then(|| HoldReport {
        keys_requested: args.hold_keys,
        keys_held: total.acquires,
        fill_s: measured,
        bytes_per_lock: server
            .as_ref()
            .filter(|_| total.acquires > 0)
            .map(|server| (server.rss_after_bytes as f64 - server.rss_before_bytes as f64) / total.acquires as f64),
    });
    let generator_cpu = match (before.generator, after.generator) {
        (Some(before), Some(after)) => Some(proc_sample::cpu_percent(&before, &after)),
        _ => None,
    };
    let server_handoffs = match (before.handoffs, after.handoffs) {
        (Some(before), Some(after)) => Some(after.saturating_sub(before)),
        _ => None,
    };
    let (pressure, steal) = proc_sample::machine_busy(&before.machine, &after.machine);
    let mut report = RunReport::new(args, measured, total, server, generator_cpu, server_handoffs, hold_report);
    report.cpu_pressure_percent = pressure;
    report.cpu_steal_percent = steal;
    report
}

/// Splits the key space (uncontended) or the keys to hold over the connections.
fn plan_connections(args: &RunArgs) -> Result<Vec<ConnectionPlan>, String> {
    let connections = args.connections as u64;
    let mut plans = Vec::with_capacity(args.connections);
    for index in 0..connections {
        let (key_first, key_count) = match args.workload {
            Workload::Uncontended => {
                let span = args.key_space / connections;
                if span < args.depth as u64 {
                    return Err(format!(
                        "--key-space {} gives each connection {span} keys, fewer than --depth {}: every \
                         request in flight needs keys of its own; raise it",
                        args.key_space, args.depth
                    ));
                }
                (index * span, span)
            }
            Workload::Contended => (0, 0),
            Workload::Hold => {
                let share = args.hold_keys.div_ceil(connections);
                let first = (index * share).min(args.hold_keys);
                (first, share.min(args.hold_keys - first))
            }
        };
        plans.push(ConnectionPlan { index, server: 0, key_first, key_count });
    }
    if args.clusters.len() > 1 {
        let clusters = args.clusters.len();
        if args.connections < clusters {
            return Err(format!("--connections {} is fewer than the {clusters} clusters", args.connections));
        }
        for plan in &mut plans {
            plan.server = plan.index as usize % clusters;
        }
        if args.workload == Workload::Hold {
            // Each cluster's connections split every key between them and
            // hold those of their cluster, so that each key is held once.
            for cluster in 0..clusters {
                let mine: Vec<&mut ConnectionPlan> = plans.iter_mut().filter(|plan| plan.server == cluster).collect();
                let share = args.hold_keys.div_ceil(mine.len() as u64);
                for (position, plan) in mine.into_iter().enumerate() {
                    plan.key_first = (position as u64 * share).min(args.hold_keys);
                    plan.key_count = share.min(args.hold_keys - plan.key_first);
                }
            }
        }
    }
    Ok(plans)
}

/// With several `--cluster`s: their names, and the hot keys of each.
fn routing(args: &RunArgs, keys: &KeyFormat) -> Result<Option<Arc<Routing>>, String> {
    if args.clusters.len() < 2 {
        return Ok(None);
    }
    let mut names: Vec<&str> = args.clusters.iter().map(|cluster| cluster.name.as_str()).collect();
    names.sort_unstable();
    if let Some(pair) = names.windows(2).find(|pair| pair[0] == pair[1]) {
        return Err(format!("the cluster {:?} is given twice; each --cluster needs a name of its own", pair[0]));
    }
    let mut routing = Routing {
        names: args.clusters.iter().map(|cluster| cluster.name.clone()).collect(),
        hot_keys: vec![Vec::new(); args.clusters.len()],
    };
    if args.workload == Workload::Contended {
        let mut buffer = [0u8; KEY_LEN_MAX];
        for key in 0..args.hot_keys {
            let cluster = cluster_index(&routing.names, keys.write(key, &mut buffer)).expect("two clusters or more");
            routing.hot_keys[cluster].push(key);
        }
        if let Some(cluster) = routing.hot_keys.iter().position(Vec::is_empty) {
            return Err(format!(
                "none of the {} --hot-keys goes to the cluster {:?}; raise --hot-keys",
                args.hot_keys, routing.names[cluster]
            ));
        }
    }
    Ok(Some(Arc::new(routing)))
}

/// Uncontended with several clusters: every lane's slice of keys must hold
/// a key of its connection's cluster, or the lane could draw none.
fn check_slices(args: &RunArgs, plans: &[ConnectionPlan], routing: &Routing, keys: &KeyFormat) -> Result<(), String> {
    if args.workload != Workload::Uncontended {
        return Ok(());
    }
    for plan in plans {
        let span = plan.key_count / args.depth as u64;
        for lane in 0..args.depth as u64 {
            let first = plan.key_first + lane * span;
            if !(first..first + span).any(|key| routing.owns(plan.server, key, keys)) {
                return Err(format!(
                    "a slice of {span} keys holds none of the cluster {:?}: raise --key-space",
                    routing.names[plan.server]
                ));
            }
        }
    }
    Ok(())
}

/// Loads the compare-and-delete script and returns its SHA-1.
fn redis_script_load(addr: SocketAddr, security: &Security) -> Result<[u8; 40], String> {
    let context = |error: std::io::Error| format!("SCRIPT LOAD on Redis at {addr}: {error}");
    let mut stream = tls::open(addr, security, CONTROL_TIMEOUT).map_err(context)?;
    stream.stream.set_read_timeout(Some(CONTROL_TIMEOUT)).map_err(context)?;
    let mut command = Vec::new();
    resp::encode_command(&[b"SCRIPT", b"LOAD", REDIS_RELEASE_SCRIPT.as_bytes()], &mut command);
    stream.write_all(&command).map_err(context)?;
    let mut reply = Vec::new();
    loop {
        reply.extend_from_slice(&stream.read_line().map_err(context)?);
        match resp::decode(&reply) {
            ringlock_proto::Decoded::Incomplete => continue,
            ringlock_proto::Decoded::Line { item: Ok(RespValue::Bulk(sha)), .. } if sha.len() == 40 => {
                let mut out = [0u8; 40];
                out.copy_from_slice(sha);
                return Ok(out);
            }
            other => return Err(format!("SCRIPT LOAD on Redis at {addr}: unexpected reply {other:?}")),
        }
    }
}

/// The `handoffs` total of ringlock's `S` reply, or `None` if it cannot be read.
fn ringlock_handoffs(addr: SocketAddr, security: &Security) -> Option<u64> {
    let mut stream = tls::open(addr, security, CONTROL_TIMEOUT).ok()?;
    stream.stream.set_read_timeout(Some(CONTROL_TIMEOUT)).ok()?;
    stream.write_all(b"S\n").ok()?;
    let line = String::from_utf8(stream.read_line().ok()?).ok()?;
    // The totals come first in the JSON, before the per-shard objects.
    let at = line.find("\"handoffs\":")? + "\"handoffs\":".len();
    let digits: String = line[at..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}
