//! Test support for clusters of real `ringlock` processes on loopback (docs/protocol.md §5).
//!
//! A [`Cluster`] starts every node with its own free client and peer ports and
//! its own data directory, watches the roles through `P`, and can kill,
//! stop, pause, restart and partition nodes. A partitionable cluster puts a
//! [`Proxy`] on every directed peer link, so that cutting a node off its peers
//! leaves its clients' connections alone. A [`Load`] runs client threads that
//! acquire and release through the official client and records every grant.
//!
//! Nothing here sleeps to let the cluster settle: every wait polls `P` (or the
//! load's progress) for a condition, with a deadline that fails the test.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use ringlock_client::{Client, ReleaseOutcome};

use crate::common::{Conn, DataDir};
use ringlock_testkit::Proxy;

/// How long a test waits for a cluster event before it fails: many failover
/// periods, so that a slow, shared CI machine does not fail a correct cluster.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Heartbeat period of the test clusters, in milliseconds.
pub const HEARTBEAT_MS: u64 = 50;

/// Failover timeout of the test clusters, in milliseconds.
pub const FAILOVER_MS: u64 = 500;

/// How long one `P` may take before the node counts as not answering.
const PING_TIMEOUT: Duration = Duration::from_millis(500);

/// Pause between two polls of the cluster's roles.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Lines of each node's log shown when a wait fails.
const LOG_TAIL_LINES: usize = 40;

/// A free loopback port: bound, read and released. Another process could take
/// it before the node binds it; the ports are drawn from the kernel's
/// ephemeral range, which makes that rare. Within this process a port is
/// handed out once: the kernel may offer a port it just released again, and
/// one cluster asks for several in a row.
pub fn free_port() -> u16 {
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
        let port = listener.local_addr().unwrap().port();
        if !handed_out.contains(&port) {
            handed_out.push(port);
            return port;
        }
    }
}

/// A node's role as `P` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Active,
    Standby,
}

/// A node's answer to `P`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ping {
    pub role: Role,
    pub epoch: u64,
    /// The active's client address, `None` for `-`.
    pub active: Option<String>,
}

impl Ping {
    /// Parses `P <role> <epoch> <active-addr>`.
    pub fn parse(line: &str) -> Result<Ping, String> {
        let fields: Vec<&str> = line.split(' ').collect();
        let bad = || format!("not a P reply: {line:?}");
        if fields.len() != 4 || fields[0] != "P" {
            return Err(bad());
        }
        let role = match fields[1] {
            "active" => Role::Active,
            "standby" => Role::Standby,
            _ => return Err(bad()),
        };
        let epoch = fields[2].parse().map_err(|_| bad())?;
        let active = (fields[3] != "-").then(|| fields[3].to_string());
        Ok(Ping { role, epoch, active })
    }

    pub fn is_active(&self) -> bool {
        self.role == Role::Active
    }
}

/// Sends `P` on a new connection; `None` if the node does not answer in time
/// (dead, stopped, or not listening yet).
pub fn ping(addr: SocketAddr) -> Option<Result<Ping, String>> {
    let mut stream = TcpStream::connect_timeout(&addr, PING_TIMEOUT).ok()?;
    stream.set_read_timeout(Some(PING_TIMEOUT)).ok()?;
    stream.write_all(b"P\n").ok()?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).ok()?;
    if !line.ends_with('\n') {
        return None;
    }
    Some(Ping::parse(line.trim_end()))
}

/// What a test wants of its cluster.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    pub nodes: usize,
    pub heartbeat_ms: u64,
    pub failover_ms: u64,
    /// Route every peer link through a proxy the test can cut.
    pub partitionable: bool,
    /// Every node's `--peer-secret-file`.
    pub peer_secret_file: Option<std::path::PathBuf>,
    /// More flags for node `i` (such as its peer TLS files); a node
    /// beyond the list gets none.
    pub node_args: Vec<Vec<String>>,
}

impl Default for ClusterOptions {
    fn default() -> ClusterOptions {
        ClusterOptions {
            nodes: 3,
            heartbeat_ms: HEARTBEAT_MS,
            failover_ms: FAILOVER_MS,
            partitionable: false,
            peer_secret_file: None,
            node_args: Vec::new(),
        }
    }
}

/// One node process of a cluster; killed when dropped.
pub struct Node {
    pub index: usize,
    /// Where clients reach it, as every node's --peers names it.
    pub client: SocketAddr,
    /// Where its peer transport listens.
    pub peer: SocketAddr,
    args: Vec<String>,
    data_dir: Arc<DataDir>,
    child: Option<Child>,
    log: Arc<Mutex<String>>,
    paused: bool,
}

impl Node {
    fn spawn(&mut self) {
        assert!(self.child.is_none(), "node {} already runs", self.index);
        let mut command = Command::new(env!("CARGO_BIN_EXE_ringlock"));
        command.args(&self.args).arg("--data-dir").arg(&self.data_dir.0);
        command.env_remove("RUST_LOG").stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = command.spawn().expect("start the ringlock binary");
        let stderr = child.stderr.take().expect("stderr");
        let log = self.log.clone();
        let index = self.index;
        {
            let mut log = log.lock().unwrap();
            log.push_str(&format!("--- node {index} started: ringlock {}\n", self.args.join(" ")));
        }
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let mut log = log.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        self.child = Some(child);
        self.paused = false;
    }

    /// Waits until the node answers `P` and returns that first answer; gives
    /// back its log if it exited first.
    fn wait_answering(&mut self) -> Result<Ping, String> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            match ping(self.client) {
                Some(Ok(ping)) => return Ok(ping),
                Some(Err(error)) => return Err(format!("node {}: {error}\n{}", self.index, self.log())),
                None => {}
            }
            let child = self.child.as_mut().expect("running");
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                // Let the log reader take the last lines.
                thread::sleep(Duration::from_millis(100));
                return Err(format!("node {} exited with {status} before answering P:\n{}", self.index, self.log()));
            }
            if Instant::now() > deadline {
                return Err(format!("node {} did not answer P within {PATIENCE:?}:\n{}", self.index, self.log()));
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    pub fn is_paused(&self) -> bool {
        self.paused
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().unwrap_or_else(|| panic!("node {} is not running", self.index)).id() as i32
    }

    pub fn data_dir(&self) -> Arc<DataDir> {
        self.data_dir.clone()
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on the pid of a child this node owns and has not reaped.
        let result = unsafe { libc::kill(self.pid(), signal) };
        assert_eq!(result, 0, "kill({}, {signal}): {}", self.pid(), std::io::Error::last_os_error());
    }

    /// kill -9, and waits for the process to be gone.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            self.log.lock().unwrap().push_str(&format!("--- node {} killed with SIGKILL\n", self.index));
        }
        self.paused = false;
    }

    /// SIGSTOP: the process stays, but runs nothing until [`resume`](Self::resume).
    pub fn pause(&mut self) {
        self.signal(libc::SIGSTOP);
        self.paused = true;
        self.log.lock().unwrap().push_str(&format!("--- node {} stopped with SIGSTOP\n", self.index));
    }

    /// SIGCONT after [`pause`](Self::pause).
    pub fn resume(&mut self) {
        self.signal(libc::SIGCONT);
        self.paused = false;
        self.log.lock().unwrap().push_str(&format!("--- node {} continued with SIGCONT\n", self.index));
    }

    /// Sends SIGINT or SIGTERM and waits for the exit status.
    pub fn stop(&mut self, signal: libc::c_int) -> ExitStatus {
        self.signal(signal);
        self.log.lock().unwrap().push_str(&format!("--- node {} sent signal {signal}\n", self.index));
        let mut child = self.child.take().expect("running");
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("node {} did not exit within {PATIENCE:?} of signal {signal}:\n{}", self.index, self.log());
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Starts the process again with the same flags and data directory, and
    /// returns its first answer to `P`.
    pub fn restart(&mut self) -> Ping {
        self.spawn();
        self.wait_answering().unwrap_or_else(|log| panic!("{log}"))
    }

    /// `P` on a new connection; `None` if the node does not answer.
    pub fn ping(&self) -> Option<Ping> {
        if self.child.is_none() || self.paused {
            return None;
        }
        match ping(self.client)? {
            Ok(ping) => Some(ping),
            Err(error) => panic!("node {}: {error}", self.index),
        }
    }

    /// A raw protocol connection to this node.
    pub fn connect(&self) -> Conn {
        Conn::connect(self.client)
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// The last lines of the log, leaving out the peer connection attempts
    /// that a cut peer link repeats every few milliseconds.
    fn log_tail(&self) -> String {
        let log = self.log();
        let churn = ["peer connection lost", "connected to peer", "peer unreachable"];
        let lines: Vec<&str> = log.lines().filter(|line| !churn.iter().any(|noise| line.contains(noise))).collect();
        lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.paused && self.child.is_some() {
            // SIGKILL ends a stopped process too, but continue it first so
            // nothing of it is left waiting on a signal.
            // SAFETY: kill(2) on the pid of a child this node owns.
            unsafe { libc::kill(self.pid(), libc::SIGCONT) };
        }
        self.kill9();
    }
}

/// A cluster of real nodes; every node is killed when it is dropped.
pub struct Cluster {
    pub nodes: Vec<Node>,
    pub options: ClusterOptions,
    /// `links[from][to]`: the proxy `from` reaches `to`'s peer port through
    /// (partitionable clusters only).
    links: Vec<Vec<Option<Proxy>>>,
}

impl Cluster {
    /// Starts a cluster and waits until every node answers `P`.
    pub fn start(options: ClusterOptions) -> Cluster {
        Cluster::try_start(options).unwrap_or_else(|log| panic!("the cluster did not start:\n{log}"))
    }

    /// Starts a cluster, or gives back what a node printed if it did not start.
    pub fn try_start(options: ClusterOptions) -> Result<Cluster, String> {
        let count = options.nodes;
        let clients: Vec<SocketAddr> = (0..count).map(|_| SocketAddr::from(([127, 0, 0, 1], free_port()))).collect();
        let peers: Vec<SocketAddr> = (0..count).map(|_| SocketAddr::from(([127, 0, 0, 1], free_port()))).collect();
        let links: Vec<Vec<Option<Proxy>>> = (0..count)
            .map(|from| {
                // The nodes bind their ports only once started: a proxy on a
                // port the system picks could be given one of them meanwhile.
                (0..count)
                    .map(|to| {
                        (options.partitionable && from != to).then(|| {
                            Proxy::start_on(SocketAddr::from(([127, 0, 0, 1], free_port())), peers[to])
                                .expect("bind a peer link's proxy")
                        })
                    })
                    .collect()
            })
            .collect();
        let mut nodes = Vec::with_capacity(count);
        for index in 0..count {
            // Every node names the same client addresses (P and M replies use
            // them); in a partitionable cluster the peer addresses of the
            // others are this node's proxies to them.
            let entries: Vec<String> = (0..count)
                .map(|other| {
                    let peer = links[index][other].as_ref().map_or(peers[other], |proxy| proxy.addr);
                    format!("{}@{peer}", clients[other])
                })
                .collect();
            let mut args: Vec<String> = [
                "--listen".to_string(),
                clients[index].to_string(),
                "--peers".to_string(),
                entries.join(","),
                "--node".to_string(),
                index.to_string(),
                "--cluster-listen".to_string(),
                peers[index].to_string(),
                "--heartbeat-ms".to_string(),
                options.heartbeat_ms.to_string(),
                "--failover-ms".to_string(),
                options.failover_ms.to_string(),
                "--shards".to_string(),
                "1".to_string(),
                "--no-pin".to_string(),
                "--log-level".to_string(),
                "info".to_string(),
            ]
            .into();
            if let Some(file) = &options.peer_secret_file {
                args.extend(["--peer-secret-file".to_string(), file.display().to_string()]);
            }
            args.extend(options.node_args.get(index).into_iter().flatten().cloned());
            nodes.push(Node {
                index,
                client: clients[index],
                peer: peers[index],
                args,
                data_dir: Arc::new(DataDir::new()),
                child: None,
                log: Arc::new(Mutex::new(String::new())),
                paused: false,
            });
        }
        // All at once, so that no node decides alone long before the others start.
        for node in &mut nodes {
            node.spawn();
        }
        let mut cluster = Cluster { nodes, options, links };
        for node in &mut cluster.nodes {
            node.wait_answering()?;
        }
        Ok(cluster)
    }

    pub fn node(&self, index: usize) -> &Node {
        &self.nodes[index]
    }

    pub fn node_mut(&mut self, index: usize) -> &mut Node {
        &mut self.nodes[index]
    }

    /// Every node's client address, in priority order.
    pub fn addresses(&self) -> Vec<String> {
        self.nodes.iter().map(|node| node.client.to_string()).collect()
    }

    /// `P` of every node (`None` for a node that is down, paused or silent).
    pub fn pings(&self) -> Vec<Option<Ping>> {
        self.nodes.iter().map(Node::ping).collect()
    }

    /// Polls the roles until `done` holds for them, and returns them; fails
    /// the test with every node's roles and log after [`PATIENCE`].
    pub fn wait_for(&self, what: &str, mut done: impl FnMut(&[Option<Ping>]) -> bool) -> Vec<Option<Ping>> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let pings = self.pings();
            if done(&pings) {
                return pings;
            }
            if Instant::now() > deadline {
                panic!("timed out after {PATIENCE:?} waiting for {what}\n{}", self.describe(&pings));
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// Waits until exactly one node is active and every other running,
    /// unpaused node is a standby that names it with its epoch; returns the
    /// active's index and epoch.
    pub fn wait_single_active(&self, what: &str) -> (usize, u64) {
        let pings = self.wait_for(what, |pings| self.single_active(pings).is_some());
        self.single_active(&pings).unwrap()
    }

    /// Waits until node `index` is the single active (as in
    /// [`wait_single_active`](Self::wait_single_active)); returns its epoch.
    pub fn wait_active(&self, index: usize, what: &str) -> u64 {
        let pings = self.wait_for(what, |pings| self.single_active(pings).is_some_and(|(active, _)| active == index));
        self.single_active(&pings).unwrap().1
    }

    /// `(index, epoch)` of the only active if the roles agree on it.
    pub fn single_active(&self, pings: &[Option<Ping>]) -> Option<(usize, u64)> {
        let mut active = None;
        for (index, ping) in pings.iter().enumerate() {
            let node = &self.nodes[index];
            let Some(ping) = ping else {
                if node.is_running() && !node.is_paused() {
                    return None;
                }
                continue;
            };
            if ping.is_active() {
                if active.is_some() {
                    return None;
                }
                active = Some((index, ping.epoch));
            }
        }
        let (index, epoch) = active?;
        let address = self.nodes[index].client.to_string();
        let followers_agree = pings.iter().flatten().filter(|ping| !ping.is_active()).all(|ping| {
            // A standby shows the epoch of the active it follows.
            ping.active.as_deref() == Some(address.as_str()) && ping.epoch == epoch
        });
        followers_agree.then_some((index, epoch))
    }

    /// The roles and the tail of every node's log, for a failure message.
    pub fn describe(&self, pings: &[Option<Ping>]) -> String {
        let mut text = String::new();
        for (node, ping) in self.nodes.iter().zip(pings) {
            let state = match (node.is_running(), node.is_paused()) {
                (false, _) => "down",
                (true, true) => "paused",
                (true, false) => "running",
            };
            text.push_str(&format!("node {} ({}, {state}): P = {ping:?}\n", node.index, node.client));
        }
        for node in &self.nodes {
            text.push_str(&format!(
                "--- log of node {} (last {LOG_TAIL_LINES} lines):\n{}\n",
                node.index,
                node.log_tail()
            ));
        }
        text
    }

    /// Sends `line` on `conn` and returns the reply; fails the test with
    /// every node's roles and log if none comes within [`PATIENCE`].
    pub fn call(&self, conn: &mut Conn, line: &str) -> String {
        conn.request(line);
        conn.try_line(PATIENCE)
            .unwrap_or_else(|| panic!("no reply to {line:?} within {PATIENCE:?}\n{}", self.describe(&self.pings())))
    }

    /// Cuts node `index` off every peer (both ways): open peer connections are
    /// closed and new ones refused until [`heal`](Self::heal). Its clients
    /// still reach it.
    pub fn isolate(&self, index: usize) {
        assert!(self.options.partitionable, "isolate needs a partitionable cluster");
        for (from, row) in self.links.iter().enumerate() {
            for (to, link) in row.iter().enumerate() {
                if let Some(proxy) = link
                    && (from == index || to == index)
                {
                    proxy.set_refusing(true);
                    proxy.cut_all();
                }
            }
        }
        for node in &self.nodes {
            node.log.lock().unwrap().push_str(&format!("--- node {index} cut off its peers\n"));
        }
    }

    /// Cuts node `index` off its peers without a sound: its peer links
    /// stay open, and what is sent on them, or on links opened meanwhile, is
    /// dropped with neither a reset nor a close (a host that vanished, or a
    /// partition that drops packets). [`heal`](Self::heal) ends it.
    pub fn isolate_silently(&self, index: usize) {
        assert!(self.options.partitionable, "isolate_silently needs a partitionable cluster");
        for (from, row) in self.links.iter().enumerate() {
            for (to, link) in row.iter().enumerate() {
                if let Some(proxy) = link
                    && (from == index || to == index)
                {
                    proxy.blackhole();
                }
            }
        }
        for node in &self.nodes {
            node.log.lock().unwrap().push_str(&format!("--- node {index} silently cut off its peers\n"));
        }
    }

    /// Lets every peer link through again (black-holed links are cut, so
    /// that the nodes open new ones).
    pub fn heal(&self) {
        for proxy in self.links.iter().flatten().flatten() {
            proxy.set_refusing(false);
            proxy.lift_blackhole();
        }
        for node in &self.nodes {
            node.log.lock().unwrap().push_str("--- peer links healed\n");
        }
    }
}

/// The token of a grant reply `A <key> <token>`, or `None` for any other reply.
pub fn grant_token(reply: &str, key: &str) -> Option<u64> {
    let fields: Vec<&str> = reply.split(' ').collect();
    (fields.len() == 3 && fields[0] == "A" && fields[1] == key).then(|| fields[2].parse().ok()).flatten()
}

/// A field of the `S` reply's total counters, or `None` if it has none.
pub fn total_stat(conn: &mut Conn, name: &str) -> Option<u64> {
    let reply = conn.call("S");
    let json = reply.strip_prefix("S ")?;
    let total = &json[json.find("\"total\":")?..];
    let needle = format!("\"{name}\":");
    let at = total.find(&needle)? + needle.len();
    total[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// The `"table": {"stream": .., "version": ..}` of an `S` reply: the delta
/// stream (named by the epoch its active started it in) and how many deltas
/// of it the node has, as the active issued them or a standby applied them.
pub fn table_version(conn: &mut Conn) -> Option<(u64, u64)> {
    let reply = conn.call("S");
    let table = &reply[reply.find("\"table\":")?..];
    let number = |name: &str| -> Option<u64> {
        let needle = format!("\"{name}\":");
        let at = table.find(&needle)? + needle.len();
        table[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
    };
    Some((number("stream")?, number("version")?))
}

/// The `"role"` of an `S` reply.
pub fn stats_role(conn: &mut Conn) -> Option<String> {
    let reply = conn.call("S");
    let at = reply.find("\"role\":\"")? + "\"role\":\"".len();
    Some(reply[at..].split('"').next()?.to_string())
}

/// One grant a load thread received.
#[derive(Clone, Debug)]
pub struct Grant {
    pub key: String,
    pub token: u64,
    pub at: Instant,
    /// What its release found (`None`: the release failed with an error).
    pub release: Option<ReleaseOutcome>,
}

/// What a [`Load`] saw.
#[derive(Debug, Default)]
pub struct LoadReport {
    /// Every key's grants, in the order its (single) thread received them.
    pub grants: HashMap<String, Vec<Grant>>,
    /// Client errors, as text, with how often each happened.
    pub errors: HashMap<String, usize>,
    /// Acquires whose wait ran out.
    pub timeouts: usize,
}

impl LoadReport {
    pub fn grant_count(&self) -> usize {
        self.grants.values().map(Vec::len).sum()
    }

    /// Releases that found the grant gone (`not-holder`).
    pub fn not_held(&self) -> Vec<&Grant> {
        self.grants.values().flatten().filter(|grant| grant.release == Some(ReleaseOutcome::NotHeld)).collect()
    }

    /// Keys whose tokens did not strictly increase, with the offending pair.
    pub fn token_order_violations(&self) -> Vec<String> {
        let mut violations = Vec::new();
        for (key, grants) in &self.grants {
            for pair in grants.windows(2) {
                if pair[1].token <= pair[0].token {
                    violations.push(format!("{key}: {} then {}", pair[0].token, pair[1].token));
                }
            }
        }
        violations
    }

    /// The highest token granted for every key.
    pub fn highest_tokens(&self) -> HashMap<String, u64> {
        self.grants
            .iter()
            .filter_map(|(key, grants)| Some((key.clone(), grants.iter().map(|grant| grant.token).max()?)))
            .collect()
    }
}

/// Client threads acquiring and releasing through one official client that
/// knows every node; each thread cycles over keys of its own, so that every
/// key's grants are in one thread's order.
pub struct Load {
    stop: Arc<AtomicBool>,
    grants: Arc<AtomicU64>,
    threads: Vec<JoinHandle<LoadReport>>,
    pub client: Client,
}

/// Options of a [`Load`].
#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub threads: usize,
    pub keys_per_thread: usize,
    pub key_prefix: String,
    pub lease: Duration,
    pub wait: Duration,
    /// How long a thread holds each grant before releasing it.
    pub hold: Duration,
}

impl Default for LoadOptions {
    fn default() -> LoadOptions {
        LoadOptions {
            threads: 4,
            keys_per_thread: 8,
            key_prefix: "load".to_string(),
            lease: Duration::from_secs(10),
            wait: Duration::from_secs(2),
            hold: Duration::from_millis(1),
        }
    }
}

impl Load {
    pub fn start(addresses: &[String], options: LoadOptions) -> Load {
        let client = Client::connect(addresses.to_vec()).expect("a client of the cluster");
        let stop = Arc::new(AtomicBool::new(false));
        let grants = Arc::new(AtomicU64::new(0));
        let threads = (0..options.threads)
            .map(|thread_index| {
                let (client, stop, grants, options) = (client.clone(), stop.clone(), grants.clone(), options.clone());
                thread::spawn(move || run_load_thread(&client, thread_index, &options, &stop, &grants))
            })
            .collect();
        Load { stop, grants, threads, client }
    }

    /// Grants received so far, by all threads.
    pub fn grants(&self) -> u64 {
        self.grants.load(Ordering::SeqCst)
    }

    /// Waits until the threads have received `count` more grants than now.
    pub fn wait_more_grants(&self, count: u64, what: &str, cluster: &Cluster) {
        let target = self.grants() + count;
        let deadline = Instant::now() + PATIENCE;
        while self.grants() < target {
            if Instant::now() > deadline {
                panic!(
                    "timed out after {PATIENCE:?} waiting for {what} ({} of {target} grants)\n{}",
                    self.grants(),
                    cluster.describe(&cluster.pings())
                );
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Stops the threads and merges what they saw.
    pub fn stop(self) -> LoadReport {
        self.stop.store(true, Ordering::SeqCst);
        let mut report = LoadReport::default();
        for thread in self.threads {
            let part = thread.join().expect("a load thread");
            report.grants.extend(part.grants);
            for (error, count) in part.errors {
                *report.errors.entry(error).or_default() += count;
            }
            report.timeouts += part.timeouts;
        }
        report
    }
}

fn run_load_thread(
    client: &Client,
    thread_index: usize,
    options: &LoadOptions,
    stop: &AtomicBool,
    grants: &AtomicU64,
) -> LoadReport {
    let mut report = LoadReport::default();
    let mut round = 0usize;
    while !stop.load(Ordering::SeqCst) {
        let key = format!("{}/{thread_index}/{}", options.key_prefix, round % options.keys_per_thread);
        round += 1;
        match client.acquire(&key, options.lease, Some(options.wait)) {
            Ok(Some(lock)) => {
                let token = lock.token();
                let at = Instant::now();
                grants.fetch_add(1, Ordering::SeqCst);
                if !options.hold.is_zero() {
                    thread::sleep(options.hold);
                }
                let release = match lock.release() {
                    Ok(outcome) => Some(outcome),
                    Err(error) => {
                        *report.errors.entry(format!("release: {error}")).or_default() += 1;
                        None
                    }
                };
                report.grants.entry(key.clone()).or_default().push(Grant { key, token, at, release });
            }
            Ok(None) => report.timeouts += 1,
            Err(error) => {
                *report.errors.entry(format!("acquire: {error}")).or_default() += 1;
                // No active is known for a moment during a failover: do not spin.
                thread::sleep(Duration::from_millis(20));
            }
        }
    }
    report
}
