//! Chaos runs: a cluster of real nodes under client load while faults are
//! injected, with everything the clients see recorded in a [`History`] and
//! checked afterwards. Shared by the fencing test and the soak.
//!
//! The load has three parts:
//! - **workers**: threads with an official client each, that acquire one of a
//!   few shared keys, write to a [`FencedResource`] with the token, hold the
//!   key a moment (sometimes extending the lease), write again and release;
//! - **a FIFO probe**: raw connections to the active that queue waiters on a
//!   fresh key one after the other, each sent only once the node has surely
//!   read the previous one (a `P` sent behind it was answered: with one
//!   shard, a node handles a connection's lines in order);
//! - **stalled readers**, on demand: a connection that takes a workers' key,
//!   pipelines many requests and never reads a reply.
//!
//! Every fault opens a failover window in the history that closes once the
//! cluster has settled: one active, the highest-priority running node, that
//! every other running node follows. Between faults the driver keeps
//! polling the roles; a change it did not cause (a node starved of CPU on a
//! busy machine misses heartbeats) opens an unplanned window from the last
//! poll that saw the cluster settled.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use ringlock_client::proto::ErrorCode;
use ringlock_client::{Client, Error, ReleaseOutcome};

use crate::cluster_support::{Cluster, ClusterOptions, PATIENCE};
use crate::history::fenced::FencedResource;
use crate::history::{History, Op, Outcome, RequestId, Route, check};

/// How long the FIFO probe waits for a reply beyond a request's own wait,
/// before it gives up on it (it then counts as unanswered).
const PROBE_PATIENCE: Duration = Duration::from_secs(30);

/// How often the driver polls the roles between faults.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// What a chaos run puts on the cluster.
#[derive(Clone, Debug)]
pub struct ChaosOptions {
    pub nodes: usize,
    /// Worker threads, each with its own official client.
    pub workers: usize,
    /// Keys the workers share (more workers than keys means waiting).
    pub keys: usize,
    pub lease: Duration,
    pub wait: Duration,
    /// How long a worker holds a key between its two writes.
    pub hold: Duration,
    /// Waiters the FIFO probe queues behind its holder each round (0: no probe).
    pub fifo_waiters: usize,
    /// The prefix of every key, so that runs never share keys.
    pub key_prefix: String,
}

impl Default for ChaosOptions {
    fn default() -> ChaosOptions {
        ChaosOptions {
            nodes: 3,
            workers: 8,
            keys: 4,
            lease: Duration::from_secs(2),
            wait: Duration::from_secs(2),
            hold: Duration::from_millis(2),
            fifo_waiters: 3,
            key_prefix: "chaos".to_string(),
        }
    }
}

/// A fault the driver can inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// kill -9 of a node; it stays down until [`Chaos::restart`].
    Kill9 { node: usize },
    /// SIGINT (Ctrl+C): a graceful stop with hand-off; down until restarted.
    CtrlC { node: usize },
    /// SIGSTOP, and SIGCONT after `pause`.
    Pause { node: usize, pause: Duration },
    /// The node's peer links cut (its clients still reach it) for `cut`.
    Partition { node: usize, cut: Duration },
    /// The node's peer links silent (nothing passes, nothing is closed; its
    /// clients still reach it) for `cut`.
    SilentPartition { node: usize, cut: Duration },
    /// Every client connection to the node cut at once (`ss -K`).
    CutClients { node: usize },
    /// A client that takes a workers' key, pipelines requests and stops
    /// reading for `stall`.
    StalledReader { stall: Duration },
}

impl Fault {
    pub fn name(&self) -> &'static str {
        match self {
            Fault::Kill9 { .. } => "kill -9",
            Fault::CtrlC { .. } => "Ctrl+C",
            Fault::Pause { .. } => "SIGSTOP/SIGCONT",
            Fault::Partition { .. } => "partition",
            Fault::SilentPartition { .. } => "silent partition",
            Fault::CutClients { .. } => "cut client connections",
            Fault::StalledReader { .. } => "client stops reading",
        }
    }
}

/// What the driver saw of the cluster, apart from the clients' history.
#[derive(Clone, Debug, Default)]
pub struct ClusterEvents {
    pub faults: BTreeMap<&'static str, usize>,
    pub restarts: usize,
    /// Changes of the settled active node.
    pub failovers: usize,
    /// Role changes the driver did not cause, as text.
    pub unplanned: Vec<String>,
    /// Client connections cut by the cut faults.
    pub connections_cut: usize,
    /// Faults that could not be carried out, with why.
    pub skipped: BTreeMap<String, usize>,
    /// Nodes that exited when not told to, exited non-zero after Ctrl+C,
    /// printed a panic, or never settled: each with the evidence.
    pub crashes: Vec<String>,
}

/// A running chaos run; stop it with [`Chaos::finish`].
pub struct Chaos {
    pub cluster: Cluster,
    pub history: History,
    pub options: ChaosOptions,
    pub events: ClusterEvents,
    stop: Arc<AtomicBool>,
    /// The settled active, for the FIFO probe and the stalled readers.
    active: Arc<AtomicUsize>,
    settled: (usize, u64),
    threads: Vec<JoinHandle<()>>,
    stalled: Vec<JoinHandle<()>>,
    stalled_count: usize,
}

impl Chaos {
    /// Starts a partitionable cluster, waits for node 0 to be active, and
    /// starts the load.
    pub fn start(options: ChaosOptions) -> Chaos {
        let cluster =
            Cluster::start(ClusterOptions { nodes: options.nodes, partitionable: true, ..Default::default() });
        let epoch = cluster.wait_active(0, "node 0 to become the first active");
        let history = History::new();
        let resource = Arc::new(FencedResource::new(history.clone()));
        let stop = Arc::new(AtomicBool::new(false));
        let active = Arc::new(AtomicUsize::new(0));
        let addresses = cluster.addresses();
        let mut threads = Vec::new();
        for worker in 0..options.workers {
            let (history, resource, stop, options, addresses) =
                (history.clone(), resource.clone(), stop.clone(), options.clone(), addresses.clone());
            threads.push(thread::spawn(move || run_worker(worker, &addresses, &options, &history, &resource, &stop)));
        }
        if options.fifo_waiters > 0 {
            let (history, stop, active, options) = (history.clone(), stop.clone(), active.clone(), options.clone());
            let nodes: Vec<SocketAddr> = cluster.nodes.iter().map(|node| node.client).collect();
            threads.push(thread::spawn(move || run_fifo_probe(&nodes, &active, &options, &history, &stop)));
        }
        Chaos {
            cluster,
            history,
            options,
            events: ClusterEvents::default(),
            stop,
            active,
            settled: (0, epoch),
            threads,
            stalled: Vec::new(),
            stalled_count: 0,
        }
    }

    /// Lets the load run for `period` while watching the roles.
    pub fn run_for(&mut self, period: Duration) {
        let deadline = Instant::now() + period;
        self.run_until(|_| Instant::now() >= deadline);
    }

    /// Lets the load run until the clients have received `count` more
    /// grants; fails the test with the roles and logs if they do not come.
    pub fn wait_grants(&mut self, count: usize, what: &str) {
        let target = self.history.grant_count() + count;
        let deadline = Instant::now() + PATIENCE * 2;
        self.run_until(|chaos| {
            let grants = chaos.history.grant_count();
            if Instant::now() > deadline {
                panic!(
                    "timed out waiting for {what} ({grants} of {target} grants)\n{}",
                    chaos.cluster.describe(&chaos.cluster.pings())
                );
            }
            grants >= target
        });
    }

    /// Lets the load run until `done` holds, while watching the roles: a
    /// change the driver did not cause opens an unplanned window until the
    /// cluster settles again.
    fn run_until(&mut self, mut done: impl FnMut(&Chaos) -> bool) {
        let mut last_settled = self.history.now();
        while !done(self) {
            let pings = self.cluster.pings();
            let settled = self.cluster.single_active(&pings);
            if settled == Some(self.settled) {
                last_settled = self.history.now();
            } else {
                // A node that answered P too slowly also lands here; the
                // window is opened anyway, but only a settled state that
                // differs counts as a role change.
                let before = self.settled;
                let window = self.history.open_window_at("unplanned", last_settled);
                self.settle("the cluster to settle after a role change nobody caused");
                self.history.close_window(window);
                if self.settled != before {
                    let (from, to) = (before, self.settled);
                    let at = self.history.now();
                    self.events.unplanned.push(format!(
                        "at {at:.1?}: active node {} epoch {} became node {} epoch {}",
                        from.0, from.1, to.0, to.1
                    ));
                }
                last_settled = self.history.now();
            }
            self.check_processes();
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// Injects `fault` and, for the faults that touch roles, waits inside a
    /// failover window until the cluster has settled again.
    pub fn inject(&mut self, fault: Fault) {
        if let Some(reason) = self.cannot_inject(fault) {
            *self.events.skipped.entry(format!("{}: {reason}", fault.name())).or_default() += 1;
            return;
        }
        *self.events.faults.entry(fault.name()).or_default() += 1;
        match fault {
            Fault::Kill9 { node } => {
                let window = self.history.open_window(fault.name());
                self.cluster.node_mut(node).kill9();
                self.settle("a new active after kill -9");
                self.history.close_window(window);
            }
            Fault::CtrlC { node } => {
                let window = self.history.open_window(fault.name());
                let status = self.cluster.node_mut(node).stop(libc::SIGINT);
                if !status.success() {
                    let log = self.cluster.node(node).log();
                    self.events.crashes.push(format!("node {node} exited with {status} after Ctrl+C:\n{log}"));
                }
                self.settle("a new active after Ctrl+C");
                self.history.close_window(window);
            }
            Fault::Pause { node, pause } => {
                let window = self.history.open_window(fault.name());
                self.cluster.node_mut(node).pause();
                thread::sleep(pause);
                self.cluster.node_mut(node).resume();
                self.settle("one active after SIGCONT");
                self.history.close_window(window);
            }
            Fault::Partition { node, cut } => {
                let window = self.history.open_window(fault.name());
                self.cluster.isolate(node);
                thread::sleep(cut);
                self.cluster.heal();
                self.settle("one active after the partition healed");
                self.history.close_window(window);
            }
            Fault::SilentPartition { node, cut } => {
                let window = self.history.open_window(fault.name());
                self.cluster.isolate_silently(node);
                thread::sleep(cut);
                self.cluster.heal();
                self.settle("one active after the silent partition healed");
                self.history.close_window(window);
            }
            Fault::CutClients { node } => {
                // No window: cutting client connections changes no role, so
                // it must not break any rule.
                match cut_client_connections(self.cluster.node(node).client) {
                    Ok(cut) => self.events.connections_cut += cut,
                    Err(reason) => {
                        *self.events.faults.entry(fault.name()).or_default() -= 1;
                        *self.events.skipped.entry(format!("{}: {reason}", fault.name())).or_default() += 1;
                    }
                }
            }
            Fault::StalledReader { stall } => {
                self.stalled_count += 1;
                let key = format!("{}/{}", self.options.key_prefix, self.stalled_count % self.options.keys);
                let address = self.cluster.node(self.active.load(Ordering::SeqCst)).client;
                let lease = self.options.lease;
                self.stalled.push(thread::spawn(move || run_stalled_reader(address, &key, lease, stall)));
            }
        }
    }

    fn cannot_inject(&self, fault: Fault) -> Option<&'static str> {
        let node = match fault {
            Fault::Kill9 { node }
            | Fault::CtrlC { node }
            | Fault::Pause { node, .. }
            | Fault::Partition { node, .. }
            | Fault::SilentPartition { node, .. }
            | Fault::CutClients { node } => node,
            Fault::StalledReader { .. } => return None,
        };
        let running = self.cluster.nodes.iter().filter(|node| node.is_running()).count();
        if !self.cluster.node(node).is_running() {
            return Some("the node is down");
        }
        if running < 2 && !matches!(fault, Fault::CutClients { .. }) {
            return Some("it is the last node running");
        }
        None
    }

    /// Restarts node `node` (after kill -9 or Ctrl+C) in a window that lasts
    /// until it has caught up and the cluster has settled (it takes the
    /// active role back by hand-off if it has the highest priority).
    pub fn restart(&mut self, node: usize) {
        let window = self.history.open_window("restart");
        self.cluster.node_mut(node).restart();
        self.events.restarts += 1;
        self.settle("the restarted node to rejoin");
        self.history.close_window(window);
    }

    /// Nodes that are down (killed or stopped).
    pub fn down_nodes(&self) -> Vec<usize> {
        self.cluster.nodes.iter().filter(|node| !node.is_running()).map(|node| node.index).collect()
    }

    /// The settled active.
    pub fn active(&self) -> usize {
        self.settled.0
    }

    /// Waits until the highest-priority running node is the single active,
    /// and counts a failover if the active changed. A cluster that does not
    /// settle is recorded as a crash (with the roles and logs) and the run
    /// goes on to its end.
    fn settle(&mut self, what: &str) {
        let leader = self.cluster.nodes.iter().find(|node| node.is_running() && !node.is_paused()).map(|n| n.index);
        let Some(leader) = leader else { return };
        let cluster = &self.cluster;
        match catch_unwind(AssertUnwindSafe(|| cluster.wait_active(leader, what))) {
            Ok(epoch) => {
                if leader != self.settled.0 {
                    self.events.failovers += 1;
                }
                self.settled = (leader, epoch);
                self.active.store(leader, Ordering::SeqCst);
            }
            Err(panic) => {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|text| text.to_string()))
                    .unwrap_or_default();
                self.events.crashes.push(format!("the cluster did not settle: {message}"));
                // Go on with whatever roles there are, so that the run ends
                // with its summary.
                self.settled = (usize::MAX, 0);
            }
        }
    }

    /// Records a node that exited without being told to.
    fn check_processes(&mut self) {
        for node in &self.cluster.nodes {
            if node.is_running() && process_exited(node.pid()) {
                let evidence = format!("node {} exited on its own:\n{}", node.index, node.log());
                if !self.events.crashes.contains(&evidence) {
                    self.events.crashes.push(evidence);
                }
            }
        }
    }

    /// Stops the load, restarts what is down, checks the history and the
    /// node logs, and returns the summary.
    pub fn finish(mut self) -> Summary {
        self.stop.store(true, Ordering::SeqCst);
        for thread in self.threads.drain(..) {
            thread.join().expect("a load thread");
        }
        for thread in self.stalled.drain(..) {
            thread.join().expect("a stalled reader");
        }
        self.check_processes();
        for node in &self.cluster.nodes {
            let log = node.log();
            if let Some(at) = log.find("panicked") {
                let end = (at + 2000).min(log.len());
                let evidence = format!("node {} panicked: {}", node.index, &log[at..end]);
                self.events.crashes.push(evidence);
            }
        }
        let record = self.history.record();
        let report = check(&record);
        Summary { report, events: self.events.clone(), duration: record.end }
    }
}

impl Drop for Chaos {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// The end of a chaos run.
#[derive(Debug)]
pub struct Summary {
    pub report: crate::history::Report,
    pub events: ClusterEvents,
    pub duration: Duration,
}

impl Summary {
    /// Violations outside failover windows, and crashes.
    pub fn failed(&self) -> bool {
        !self.report.violations.is_empty() || !self.events.crashes.is_empty()
    }

    /// The summary table, in Markdown.
    pub fn table(&self) -> String {
        let counts = &self.report.counts;
        let faults: usize = self.events.faults.values().sum();
        let fault_kinds: Vec<String> =
            self.events.faults.iter().map(|(name, count)| format!("{name} {count}")).collect();
        let excused: Vec<String> =
            self.report.excused_by_label().iter().map(|(label, count)| format!("{label} {count}")).collect();
        let skipped: Vec<String> =
            self.events.skipped.iter().map(|(reason, count)| format!("{reason} ({count})")).collect();
        let rows = [
            ("duration", format!("{:.0} s", self.duration.as_secs_f64())),
            (
                "operations",
                format!(
                    "{} requests: {} acquires ({} granted, {} timed out), {} releases, {} extends",
                    counts.requests, counts.acquires, counts.grants, counts.timeouts, counts.releases, counts.extends
                ),
            ),
            (
                "client errors, redirects, cut requests",
                format!("{}, {}, {}", counts.errors, counts.redirects, counts.cuts),
            ),
            ("faults injected", format!("{faults} ({})", fault_kinds.join(", "))),
            ("client connections cut", self.events.connections_cut.to_string()),
            ("faults skipped", if skipped.is_empty() { "0".to_string() } else { skipped.join(", ") }),
            ("restarts", self.events.restarts.to_string()),
            ("failovers (changes of the settled active)", self.events.failovers.to_string()),
            ("unplanned role changes", self.events.unplanned.len().to_string()),
            ("grants lost (release or extend found no grant while the lease ran)", counts.grants_lost.to_string()),
            ("leases that ran out before release", counts.lease_ran_out.to_string()),
            ("fenced writes accepted", counts.writes_accepted.to_string()),
            ("stale-token refusals (fencing kept a stale holder out)", counts.writes_refused.to_string()),
            ("FIFO pairs checked", counts.fifo_pairs.to_string()),
            (
                "findings inside failover windows (allowed)",
                format!("{} ({})", self.report.excused.len(), excused.join(", ")),
            ),
            ("invariant violations outside failover windows", self.report.violations.len().to_string()),
            ("crashes", self.events.crashes.len().to_string()),
        ];
        let mut table = String::from("| measure | value |\n|---|---|\n");
        for (name, value) in rows {
            table.push_str(&format!("| {name} | {value} |\n"));
        }
        table
    }

    /// The violations and crashes, for a failure message.
    pub fn problems(&self) -> String {
        let mut text = String::new();
        if !self.report.violations.is_empty() {
            text.push_str(&format!("violations:\n{}\n", self.report.describe_violations(20)));
        }
        for crash in &self.events.crashes {
            text.push_str(&format!("crash: {crash}\n"));
        }
        text
    }
}

/// True if the process has ended (a zombie not yet reaped, or gone).
fn process_exited(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses.
        Ok(stat) => stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

/// Cuts every local client connection to `address` with `ss -K`, which
/// needs the kernel's socket-destroy support and CAP_NET_ADMIN; returns how
/// many it cut.
fn cut_client_connections(address: SocketAddr) -> Result<usize, String> {
    let output = Command::new("ss")
        .args(["-K", "-t", "dst", &address.ip().to_string(), "dport", "=", &address.port().to_string()])
        .output()
        .map_err(|error| format!("ss: {error}"))?;
    if !output.status.success() {
        return Err(format!("ss -K failed: {}", String::from_utf8_lossy(&output.stderr).trim()));
    }
    // ss prints a header, then one line per socket it destroyed.
    let cut = String::from_utf8_lossy(&output.stdout).lines().skip(1).filter(|line| !line.trim().is_empty()).count();
    if cut == 0 {
        return Err("ss -K cut nothing (no socket-destroy support or no CAP_NET_ADMIN?)".to_string());
    }
    Ok(cut)
}

/// A tiny deterministic generator (xorshift), so that the load needs no
/// dependency; each thread seeds its own.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound.max(1)
    }
}

fn node_of(addresses: &[String], client: &Client) -> Option<usize> {
    let active = client.active_node()?;
    addresses.iter().position(|address| *address == active)
}

fn error_outcome(error: &Error) -> Outcome {
    match error {
        Error::Server(ErrorCode::NotHolder) => Outcome::NotHeld,
        other => Outcome::Error(other.to_string()),
    }
}

/// Operations after which a worker replaces its client with a new one, as
/// a restarted application would.
const OPERATIONS_PER_CLIENT: usize = 64;

/// A worker's client: odd workers list the nodes in reverse, so that a new
/// client made while two nodes are active may find either of them.
fn worker_client(worker: usize, addresses: &[String]) -> Client {
    let mut addresses = addresses.to_vec();
    if worker % 2 == 1 {
        addresses.reverse();
    }
    Client::connect(addresses).expect("a client of the cluster")
}

fn run_worker(
    worker: usize,
    addresses: &[String],
    options: &ChaosOptions,
    history: &History,
    resource: &FencedResource,
    stop: &AtomicBool,
) {
    let mut client = worker_client(worker, addresses);
    let mut rng = Rng::new(worker as u64 + 1);
    let mut operations = 0;
    while !stop.load(Ordering::SeqCst) {
        operations += 1;
        if operations % OPERATIONS_PER_CLIENT == 0 {
            client = worker_client(worker, addresses);
        }
        let key = format!("{}/{}", options.key_prefix, rng.below(options.keys as u64));
        let op = Op::Acquire { lease: options.lease, wait: Some(options.wait) };
        let id = history.send(&key, op, Route::Client);
        let lock = match client.acquire(&key, options.lease, Some(options.wait)) {
            Ok(Some(lock)) => lock,
            Ok(None) => {
                history.reply(id, Outcome::TimedOut, node_of(addresses, &client));
                continue;
            }
            Err(error) => {
                history.reply(id, error_outcome(&error), None);
                // No active is known for a moment during a failover.
                thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        let token = lock.token();
        history.reply(id, Outcome::Granted { token }, node_of(addresses, &client));
        resource.write(&key, token);
        thread::sleep(options.hold);
        if rng.below(4) == 0 {
            let id = history.send(&key, Op::Extend { token, lease: options.lease }, Route::Client);
            let outcome = match lock.extend(options.lease) {
                Ok(()) => Outcome::Extended { token },
                Err(error) => error_outcome(&error),
            };
            history.reply(id, outcome, node_of(addresses, &client));
        }
        resource.write(&key, token);
        let id = history.send(&key, Op::Release { token }, Route::Client);
        let outcome = match lock.release() {
            Ok(ReleaseOutcome::Released) => Outcome::Released,
            Ok(ReleaseOutcome::NotHeld) => Outcome::NotHeld,
            Err(error) => error_outcome(&error),
        };
        history.reply(id, outcome, node_of(addresses, &client));
    }
}

/// A raw protocol connection that reports a closed connection instead of
/// failing the test: a fault may end it at any moment.
struct RawConn {
    stream: TcpStream,
    buffer: Vec<u8>,
    closed: bool,
}

impl RawConn {
    fn connect(address: SocketAddr) -> Option<RawConn> {
        let stream = TcpStream::connect_timeout(&address, Duration::from_secs(1)).ok()?;
        stream.set_nodelay(true).ok()?;
        Some(RawConn { stream, buffer: Vec::new(), closed: false })
    }

    fn send(&mut self, lines: &str) -> bool {
        if self.stream.write_all(lines.as_bytes()).is_err() {
            self.closed = true;
        }
        !self.closed
    }

    /// The next line, `None` if the connection closed or nothing came
    /// before `deadline`.
    fn line(&mut self, deadline: Instant) -> Option<String> {
        loop {
            if let Some(end) = self.buffer.iter().position(|&byte| byte == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                return Some(String::from_utf8_lossy(&line[..line.len() - 1]).trim_end_matches('\r').to_string());
            }
            if self.closed {
                return None;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            self.stream.set_read_timeout(Some(left)).ok()?;
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) => self.closed = true,
                Ok(read) => self.buffer.extend_from_slice(&chunk[..read]),
                Err(error) if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    return None;
                }
                Err(_) => self.closed = true,
            }
        }
    }
}

/// The outcome of an acquire reply line of `key`, `None` for another line.
fn acquire_outcome(line: &str, key: &str) -> Option<Outcome> {
    let fields: Vec<&str> = line.split(' ').collect();
    match fields.as_slice() {
        ["A", k, token] if *k == key => Some(
            token
                .parse()
                .map_or_else(|_| Outcome::Error(format!("bad token in {line:?}")), |token| Outcome::Granted { token }),
        ),
        ["T", k] if *k == key => Some(Outcome::TimedOut),
        ["M", "A", k, _] if *k == key => Some(Outcome::Redirected),
        ["E", "A", k, code] if *k == key => Some(Outcome::Error(code.to_string())),
        _ => None,
    }
}

/// The outcome of a release reply line of `key`, `None` for another line.
fn release_outcome(line: &str, key: &str) -> Option<Outcome> {
    let fields: Vec<&str> = line.split(' ').collect();
    match fields.as_slice() {
        ["R", k] if *k == key => Some(Outcome::Released),
        ["E", "R", k, "not-holder"] if *k == key => Some(Outcome::NotHeld),
        ["M", "R", k, _] if *k == key => Some(Outcome::Redirected),
        ["E", "R", k, code] if *k == key => Some(Outcome::Error(code.to_string())),
        _ => None,
    }
}

/// One connection of the FIFO probe, with its requests in flight.
struct ProbeConn {
    conn: RawConn,
    node: usize,
    index: usize,
    acquire: Option<RequestId>,
    release: Option<RequestId>,
    /// The last answered request of each kind, to charge an extra reply to.
    answered: [Option<RequestId>; 2],
    pings: usize,
}

impl ProbeConn {
    fn route(&self) -> Route {
        Route::Connection { node: self.node, connection: self.index }
    }

    /// Reads lines until `until` holds or `deadline`; notes every reply.
    /// Returns false if the connection closed (its requests in flight are
    /// then noted as cut).
    fn read_until(
        &mut self,
        key: &str,
        history: &History,
        deadline: Instant,
        mut until: impl FnMut(&ProbeConn) -> bool,
    ) -> bool {
        while !until(self) {
            let Some(line) = self.conn.line(deadline) else {
                if self.conn.closed {
                    for id in [self.acquire.take(), self.release.take()].into_iter().flatten() {
                        history.reply(id, Outcome::Cut, Some(self.node));
                    }
                    return false;
                }
                return true;
            };
            if line.starts_with("P ") {
                self.pings = self.pings.saturating_sub(1);
                // A reply to a P sent after the acquire: the node has read it.
                if let Some(id) = self.acquire {
                    history.received(id);
                }
            } else if let Some(outcome) = acquire_outcome(&line, key) {
                match self.acquire.take().or(self.answered[0]) {
                    Some(id) => {
                        history.reply(id, outcome, Some(self.node));
                        self.answered[0] = Some(id);
                    }
                    None => panic!("the FIFO probe got {line:?} before sending any acquire"),
                }
            } else if let Some(outcome) = release_outcome(&line, key) {
                match self.release.take().or(self.answered[1]) {
                    Some(id) => {
                        history.reply(id, outcome, Some(self.node));
                        self.answered[1] = Some(id);
                    }
                    None => panic!("the FIFO probe got {line:?} before sending any release"),
                }
            }
        }
        true
    }

    fn send_acquire(&mut self, key: &str, lease: Duration, wait: Duration, history: &History) -> bool {
        let op = Op::Acquire { lease, wait: Some(wait) };
        let id = history.send(key, op, self.route());
        self.acquire = Some(id);
        self.pings += 1;
        let line = format!("A {key} {} {}\nP\n", seconds(lease), seconds(wait));
        if !self.conn.send(&line) {
            history.reply(id, Outcome::Cut, Some(self.node));
            self.acquire = None;
            return false;
        }
        true
    }

    fn send_release(&mut self, key: &str, token: u64, history: &History) -> bool {
        let id = history.send(key, Op::Release { token }, self.route());
        self.release = Some(id);
        if !self.conn.send(&format!("R {key} {token}\n")) {
            history.reply(id, Outcome::Cut, Some(self.node));
            self.release = None;
            return false;
        }
        true
    }

    /// The token of the last acquire if it was granted.
    fn granted(&self, history: &History) -> Option<u64> {
        let id = self.answered[0]?;
        match history.outcome(id)? {
            Outcome::Granted { token } => Some(token),
            _ => None,
        }
    }
}

fn seconds(duration: Duration) -> String {
    format!("{}.{:03}", duration.as_secs(), duration.subsec_millis())
}

/// Rounds of: a holder takes a fresh key on the active; waiters queue behind
/// it one at a time, each sent once the node has surely read the one before;
/// the holder releases; each waiter, once granted, releases in turn.
fn run_fifo_probe(
    nodes: &[SocketAddr],
    active: &AtomicUsize,
    options: &ChaosOptions,
    history: &History,
    stop: &AtomicBool,
) {
    let lease = options.lease;
    let wait = options.wait * 2;
    let mut round = 0usize;
    while !stop.load(Ordering::SeqCst) {
        round += 1;
        let node = active.load(Ordering::SeqCst);
        let Some(&address) = nodes.get(node) else {
            thread::sleep(POLL_INTERVAL);
            continue;
        };
        let key = format!("{}-fifo/{round}", options.key_prefix);
        let mut conns: Vec<ProbeConn> = Vec::new();
        for index in 0..=options.fifo_waiters {
            let Some(conn) = RawConn::connect(address) else { break };
            conns.push(ProbeConn { conn, node, index, acquire: None, release: None, answered: [None, None], pings: 0 });
        }
        if conns.len() == options.fifo_waiters + 1 {
            probe_round(&mut conns, &key, lease, wait, history);
        }
        // A last P on each connection flushes any reply still to come, so
        // that a second answer to a request is seen; an acquire still
        // queued gets its T within its wait.
        for conn in &mut conns {
            if !conn.conn.closed && conn.conn.send("P\n") {
                conn.pings += 1;
                let deadline = Instant::now() + wait + PROBE_PATIENCE;
                conn.read_until(&key, history, deadline, |conn| {
                    conn.pings == 0 && conn.acquire.is_none() && conn.release.is_none()
                });
            }
            for id in [conn.acquire.take(), conn.release.take()].into_iter().flatten() {
                // Nothing came within the patience: it stays unanswered,
                // which the checker reports, unless the connection is gone.
                if conn.conn.closed {
                    history.reply(id, Outcome::Cut, Some(conn.node));
                }
            }
        }
        thread::sleep(POLL_INTERVAL);
    }
}

fn probe_round(conns: &mut [ProbeConn], key: &str, lease: Duration, wait: Duration, history: &History) {
    let patience = || Instant::now() + wait + PROBE_PATIENCE;
    let (holder, waiters) = conns.split_first_mut().expect("a holder connection");
    if !holder.send_acquire(key, lease, wait, history) {
        return;
    }
    if !holder.read_until(key, history, patience(), |conn| conn.acquire.is_none() && conn.pings == 0) {
        return;
    }
    let Some(token) = holder.granted(history) else { return };
    for waiter in waiters.iter_mut() {
        if !waiter.send_acquire(key, lease, wait, history) {
            break;
        }
        // Until the P behind the acquire is answered (or the acquire itself).
        if !waiter.read_until(key, history, patience(), |conn| conn.pings == 0 || conn.acquire.is_none()) {
            break;
        }
    }
    if holder.send_release(key, token, history) {
        holder.read_until(key, history, patience(), |conn| conn.release.is_none());
    }
    for waiter in waiters.iter_mut() {
        if waiter.acquire.is_none() && waiter.answered[0].is_none() {
            continue;
        }
        if !waiter.read_until(key, history, patience(), |conn| conn.acquire.is_none()) {
            continue;
        }
        if let Some(token) = waiter.granted(history)
            && waiter.send_release(key, token, history)
        {
            waiter.read_until(key, history, patience(), |conn| conn.release.is_none());
        }
    }
}

/// Takes `key` on `address`, pipelines requests and reads nothing for
/// `stall`, then goes away; the key comes back when its lease runs out.
fn run_stalled_reader(address: SocketAddr, key: &str, lease: Duration, stall: Duration) {
    let Some(mut conn) = RawConn::connect(address) else { return };
    let _ = conn.stream.set_write_timeout(Some(Duration::from_secs(1)));
    let mut lines = format!("A {key} {} 0\n", seconds(lease));
    for _ in 0..20_000 {
        lines.push_str("P\n");
    }
    let started = Instant::now();
    // The server may stop reading once its replies to us pile up; the
    // write timeout ends the attempt.
    let _ = conn.stream.write_all(lines.as_bytes());
    thread::sleep(stall.saturating_sub(started.elapsed()));
}

/// Shared so that the soak and the fencing test print the same thing.
pub fn print_summary(title: &str, summary: &Summary) {
    eprintln!("\n{title}\n\n{}", summary.table());
    for change in &summary.events.unplanned {
        eprintln!("unplanned role change {change}");
    }
    let mut shown = std::collections::HashMap::new();
    for (label, finding) in &summary.report.excused {
        let count = shown.entry(label.as_str()).or_insert(0);
        *count += 1;
        if *count <= 5 {
            eprintln!("allowed in a {label} window: {finding}");
        }
    }
    if summary.failed() {
        eprintln!("{}", summary.problems());
    }
}
