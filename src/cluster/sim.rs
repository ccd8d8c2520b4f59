//! A deterministic simulator of a ringlock cluster, to drive the cluster
//! logic through faults and check its invariants.
//!
//! Each simulated host runs one [`Node`] and a stand-in for the replication
//! core: an abstract lock table of [`KEYS`] keys (the last token granted on
//! each), a delta stream to the standbys that asked for a snapshot, received
//! by the replication core's own rules ([`StreamReceiver`]), an epoch store
//! that survives crashes, and a client that asks the active for grants.
//! The network loses, delays and reorders control messages, can be cut
//! (both ways or one way), and carries the replication stream in order per
//! link like TCP, where a lost item breaks the stream. Hosts crash (memory
//! lost, epoch kept), restart, pause (SIGSTOP: events wait until they
//! resume) and stop gracefully. Everything comes from one seed.
//!
//! After a fault phase the network heals, paused hosts resume and most down
//! hosts restart; the run then checks that the cluster settles.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::fmt::Write as _;

use ringlock_shards::token::{token, token_epoch};

use super::receive::{Break, Received, ReplicaTable, StreamReceiver};
use super::sim_rng::SimRng;
use super::{ClusterConfig, Effect, ExitReason, Node, PeerMessage, TableVersion};

/// Keys of the abstract lock table.
pub const KEYS: usize = 4;

/// Trace lines kept for a replay (the end of the run matters most).
const TRACE_LINES_MAX: usize = 4000;

/// Kinds of fault the chaos schedule draws from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    Crash,
    Restart,
    Pause,
    Stop,
    Partition,
    OneWayCut,
    HealNetwork,
    Loss,
}

const FAULTS: [Fault; 8] = [
    Fault::Crash,
    Fault::Restart,
    Fault::Pause,
    Fault::Stop,
    Fault::Partition,
    Fault::OneWayCut,
    Fault::HealNetwork,
    Fault::Loss,
];

/// Everything a run depends on, drawn from its seed.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// The seed everything else comes from.
    pub seed: u64,
    /// Nodes in the cluster.
    pub nodes: usize,
    /// `--heartbeat-ms` of every node.
    pub heartbeat_ms: u64,
    /// `--failover-ms` of every node.
    pub failover_ms: u64,
    /// Length of the fault phase.
    pub fault_ms: u64,
    /// Control messages lost per thousand during the fault phase (at first).
    pub loss_per_mille: u64,
    /// Largest ordinary network delay.
    pub delay_ms_max: u64,
    /// Largest gap between two faults.
    pub chaos_gap_ms_max: u64,
    /// Weight of each fault kind, in the order of `FAULTS`.
    fault_weights: [u64; FAULTS.len()],
    /// `--min-standbys` of every node (0 in most runs).
    pub min_standbys: usize,
}

impl SimConfig {
    /// The configuration of run `seed`.
    pub fn from_seed(seed: u64) -> SimConfig {
        let mut rng = SimRng::new(seed ^ 0x5eed_c0f1_9000_0000);
        let nodes = rng.between(2, 5) as usize;
        let (heartbeat_ms, failover_ms) = if rng.chance(150) {
            (super::HEARTBEAT_MS_DEFAULT, super::FAILOVER_MS_DEFAULT)
        } else {
            let heartbeat_ms = rng.pick(&[10, 20, 50, 100]);
            (heartbeat_ms, heartbeat_ms * rng.between(2, 10))
        };
        let fault_ms = failover_ms * rng.between(5, 25);
        let loss_per_mille = rng.pick(&[0, 0, 10, 50, 200]);
        // Ordinary delays stay well below the failover timeout, or no peer
        // would ever look live; longer ones are a fault of their own.
        let delay_ms_max = rng.pick(&[1, heartbeat_ms / 4 + 1, heartbeat_ms.min(failover_ms / 4)]);
        let chaos_gap_ms_max = failover_ms * rng.between(1, 4);
        let mut fault_weights = [0; FAULTS.len()];
        for weight in &mut fault_weights {
            *weight = rng.pick(&[0, 1, 2, 4]);
        }
        // Restarts keep the cluster populated when crashes and stops are drawn.
        fault_weights[1] = fault_weights[1].max(fault_weights[0]).max(fault_weights[3]);
        // Drawn last, so that every other setting of a seed stays as it was.
        let min_standbys = if rng.chance(250) { rng.between(1, nodes as u64 - 1) as usize } else { 0 };
        SimConfig {
            seed,
            nodes,
            heartbeat_ms,
            failover_ms,
            fault_ms,
            loss_per_mille,
            delay_ms_max,
            chaos_gap_ms_max,
            fault_weights,
            min_standbys,
        }
    }

    fn cluster(&self, me: usize) -> ClusterConfig {
        ClusterConfig {
            me,
            nodes: self.nodes,
            heartbeat_ms: self.heartbeat_ms,
            failover_ms: self.failover_ms,
            min_standbys: self.min_standbys,
        }
    }

    fn handoff_timeout_ms(&self) -> u64 {
        self.cluster(0).handoff_timeout_ms()
    }

    /// From the heal, how long until exactly one active is required: a
    /// hand-off under way may still fail, then a failover and a promotion.
    fn converge_ms(&self) -> u64 {
        self.handoff_timeout_ms() + 3 * self.failover_ms + 4 * self.delay_ms_max + 100
    }

    /// From the heal, when the cluster must be in its final shape: the
    /// highest-priority node active and every node following it, caught up.
    fn settle_ms(&self) -> u64 {
        self.converge_ms() + 3 * self.handoff_timeout_ms() + 6 * self.failover_ms
    }
}

/// What a run measured.
#[derive(Clone, Debug, Default)]
pub struct SimReport {
    /// Events processed.
    pub events: u64,
    /// Grants made by an active that was the only one serving.
    pub grants_sole: u64,
    /// Grants made while two or more nodes were serving.
    pub grants_dual: u64,
    /// Periods during which two or more nodes were serving.
    pub dual_windows: u64,
    /// Their total length.
    pub dual_ms: u64,
    /// Sole-active grants below an earlier sole-active grant of the key, made
    /// by a node that never learned the earlier epoch (it was down or cut off
    /// while that epoch was in use, and the nodes that knew it are gone; no
    /// quorum, so nothing can prevent this).
    pub knowledge_gaps: u64,
    /// Activations (promotions and hand-offs; epoch moves not counted).
    pub activations: u64,
    /// Hand-offs that ended with the old active following the successor.
    pub handoffs_done: u64,
    /// Stops that ended in a plain shutdown after a failed hand-off.
    pub handoffs_failed: u64,
    /// Faults injected.
    pub faults: u64,
}

/// The lock table stand-in: the last token granted on each key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SimTable {
    stream: u64,
    version: u64,
    tokens: [u64; KEYS],
}

impl SimTable {
    fn version(&self) -> TableVersion {
        TableVersion { stream: self.stream, version: self.version }
    }

    fn token_epoch_max(&self) -> u64 {
        self.tokens.iter().map(|&token| token_epoch(token)).max().unwrap_or(0)
    }
}

/// A token the table refused: key, token, and the key's token before.
type Refused = (usize, u64, u64);

/// The receive rules run on the abstract table: a snapshot entry and a delta
/// are both a key and its new token.
impl ReplicaTable for SimTable {
    type Entry = (usize, u64);
    type Delta = (usize, u64);
    type Refused = Refused;

    fn empty() -> SimTable {
        SimTable { stream: 0, version: 0, tokens: [0; KEYS] }
    }

    fn insert(&mut self, _now_ms: u64, (key, token): (usize, u64)) {
        self.tokens[key] = token;
    }

    fn apply(&mut self, _now_ms: u64, (key, token): (usize, u64)) -> Result<(), Refused> {
        if token <= self.tokens[key] {
            return Err((key, token, self.tokens[key]));
        }
        self.tokens[key] = token;
        Ok(())
    }

    fn len(&self) -> usize {
        self.tokens.iter().filter(|&&token| token > 0).count()
    }

    fn token_epoch_max(&self) -> u64 {
        SimTable::token_epoch_max(self)
    }
}

#[derive(Clone, Copy, Debug)]
enum StreamItem {
    Snapshot(SimTable),
    Delta { stream: u64, version: u64, key: usize, token: u64 },
}

#[derive(Clone, Debug)]
enum Event {
    Deliver { from: usize, to: usize, message: PeerMessage, sender_life: u64, sender_had_state: bool },
    Stream { from: usize, to: usize, from_life: u64, to_life: u64, connection: u64, item: StreamItem },
    StreamBroken { from: usize, to: usize, from_life: u64, to_life: u64, connection: u64 },
    Tick { node: usize },
    PersistDone { node: usize, life: u64, epoch: u64 },
    HoldDone { node: usize, life: u64 },
    Grants,
    Chaos,
    Resume { node: usize, life: u64 },
    Heal,
    End,
}

struct Scheduled {
    at_ms: u64,
    sequence: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at_ms, self.sequence) == (other.at_ms, other.sequence)
    }
}

impl Eq for Scheduled {}

impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Scheduled {
    // Reversed: the binary heap pops the earliest event first, ties in order of scheduling.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at_ms, other.sequence).cmp(&(self.at_ms, self.sequence))
    }
}

/// One simulated machine: a node, its runtime state and its data directory.
struct Host {
    node: Option<Node>,
    /// Changes at every crash, restart and exit, so that late events of a
    /// previous life (timers, connections) are recognised and dropped.
    life: u64,
    paused: bool,
    /// It has announced that it stops.
    leaving: bool,
    /// Events that arrived while paused, handled at resume.
    queued: Vec<Event>,
    /// The data directory's epoch: survives crashes.
    durable_epoch: u64,
    /// Epoch writes complete in order.
    persist_done_ms: u64,
    /// Activations only grow, over every life.
    activated_max: u64,
    // What a crash loses:
    serving_epoch: Option<u64>,
    held: bool,
    stream: u64,
    table: Option<SimTable>,
    followers: Vec<bool>,
    following: Option<usize>,
    /// The replication core's receive rules: the stream applied, if any.
    receiver: StreamReceiver<SimTable>,
    sequence: u64,
    /// The highest epoch this life could know: the data directory at start,
    /// every epoch received, and its own activations.
    knowledge: u64,
    /// Per peer: when a heartbeat from it arrived while it held a table, and its life then.
    stateful_heard: Vec<Option<(u64, u64)>>,
    /// When this life started, and the peers heard from since.
    started_ms: u64,
    heard_since_start: Vec<bool>,
    tick_at_ms: Option<u64>,
}

impl Host {
    fn new(nodes: usize) -> Host {
        Host {
            node: None,
            life: 0,
            paused: false,
            leaving: false,
            queued: Vec::new(),
            durable_epoch: 0,
            persist_done_ms: 0,
            activated_max: 0,
            serving_epoch: None,
            held: false,
            stream: 0,
            table: None,
            followers: vec![false; nodes],
            following: None,
            receiver: StreamReceiver::default(),
            sequence: 0,
            knowledge: 0,
            stateful_heard: vec![None; nodes],
            started_ms: 0,
            heard_since_start: vec![false; nodes],
            tick_at_ms: None,
        }
    }

    /// Forgets everything memory held.
    fn lose_memory(&mut self) {
        self.node = None;
        self.life += 1;
        self.paused = false;
        self.leaving = false;
        self.queued.clear();
        self.serving_epoch = None;
        self.held = false;
        self.stream = 0;
        self.table = None;
        self.followers.fill(false);
        self.following = None;
        self.receiver = StreamReceiver::default();
        self.sequence = 0;
        self.knowledge = self.durable_epoch;
        self.stateful_heard.fill(None);
        self.heard_since_start.fill(false);
        self.tick_at_ms = None;
    }

    fn is_up(&self) -> bool {
        self.node.is_some()
    }

    fn is_serving(&self) -> bool {
        self.is_up() && self.serving_epoch.is_some() && !self.held
    }
}

/// The network between hosts.
struct Network {
    /// `cut[from][to]`: messages from `from` to `to` are lost.
    cut: Vec<Vec<bool>>,
    loss_per_mille: u64,
    delay_ms_max: u64,
    /// When the last stream item on each link arrives, to keep them in order.
    stream_arrival_ms: Vec<Vec<u64>>,
    /// The stream on this link lost an item; nothing passes until a new snapshot.
    stream_broken: Vec<Vec<bool>>,
    /// The connection each link's stream is on: a new one for every snapshot.
    stream_connection: Vec<Vec<u64>>,
}

/// One seeded run.
pub struct Sim {
    config: SimConfig,
    rng: SimRng,
    now_ms: u64,
    queue: BinaryHeap<Scheduled>,
    sequence: u64,
    hosts: Vec<Host>,
    network: Network,
    incarnations: u64,
    heal_ms: u64,
    healed: bool,
    last_sole_grant: [Option<(u64, u64)>; KEYS],
    tokens_issued: HashSet<u64>,
    epoch_owner: HashMap<u64, usize>,
    dual_since_ms: Option<u64>,
    report: SimReport,
    trace: Option<Vec<String>>,
    print: bool,
    violation: Option<String>,
}

impl Sim {
    /// A run of `config`; `trace` keeps a log of its last events.
    pub fn new(config: SimConfig, trace: bool) -> Sim {
        let nodes = config.nodes;
        let network = Network {
            cut: vec![vec![false; nodes]; nodes],
            loss_per_mille: config.loss_per_mille,
            delay_ms_max: config.delay_ms_max,
            stream_arrival_ms: vec![vec![0; nodes]; nodes],
            stream_broken: vec![vec![false; nodes]; nodes],
            stream_connection: vec![vec![0; nodes]; nodes],
        };
        Sim {
            rng: SimRng::new(config.seed),
            heal_ms: config.fault_ms,
            config,
            now_ms: 0,
            queue: BinaryHeap::new(),
            sequence: 0,
            hosts: (0..nodes).map(|_| Host::new(nodes)).collect(),
            network,
            incarnations: 0,
            healed: false,
            last_sole_grant: [None; KEYS],
            tokens_issued: HashSet::new(),
            epoch_owner: HashMap::new(),
            dual_since_ms: None,
            report: SimReport::default(),
            trace: trace.then(Vec::new),
            print: false,
            violation: None,
        }
    }

    /// Runs to the end; the error names the first invariant broken.
    pub fn run(mut self) -> Result<SimReport, String> {
        // Hosts start within one heartbeat of each other.
        for index in 0..self.config.nodes {
            let at_ms = self.rng.below(self.config.heartbeat_ms);
            self.schedule(at_ms, Event::Resume { node: index, life: u64::MAX });
        }
        self.schedule(1, Event::Grants);
        let first_fault_ms = self.rng.between(self.config.failover_ms, 2 * self.config.failover_ms);
        self.schedule(first_fault_ms, Event::Chaos);
        self.schedule(self.heal_ms, Event::Heal);
        self.schedule(self.heal_ms + self.config.settle_ms(), Event::End);
        while let Some(Scheduled { at_ms, event, .. }) = self.queue.pop() {
            debug_assert!(at_ms >= self.now_ms);
            self.now_ms = at_ms;
            self.report.events += 1;
            let end = matches!(event, Event::End);
            self.handle(event);
            self.after_event();
            if let Some(violation) = self.violation.take() {
                return Err(self.describe(&violation));
            }
            if end {
                break;
            }
        }
        self.check_settled();
        if let Some(violation) = self.violation.take() {
            return Err(self.describe(&violation));
        }
        Ok(self.report)
    }

    fn describe(&self, violation: &str) -> String {
        let mut text = format!("at {} ms: {violation}\n", self.now_ms);
        for (index, host) in self.hosts.iter().enumerate() {
            let status = host.node.as_ref().map(|node| node.status());
            let _ = writeln!(
                text,
                "  node {index}: up {} paused {} status {status:?} serving {:?} held {} table {:?} following {:?} durable {}",
                host.is_up(),
                host.paused,
                host.serving_epoch,
                host.held,
                host.table.map(|table| table.version()),
                host.following,
                host.durable_epoch
            );
        }
        if let Some(trace) = &self.trace {
            let _ = writeln!(text, "  last {} events:", trace.len());
            for line in trace {
                let _ = writeln!(text, "    {line}");
            }
        }
        text
    }

    /// Prints every event as it happens instead of keeping the last ones.
    pub fn print_trace(mut self) -> Sim {
        self.print = true;
        self
    }

    fn log(&mut self, line: impl FnOnce() -> String) {
        if self.print {
            eprintln!("{:>7} {}", self.now_ms, line());
            return;
        }
        if let Some(trace) = &mut self.trace {
            if trace.len() == TRACE_LINES_MAX {
                trace.drain(..TRACE_LINES_MAX / 2);
            }
            trace.push(format!("{:>7} {}", self.now_ms, line()));
        }
    }

    fn schedule(&mut self, at_ms: u64, event: Event) {
        self.sequence += 1;
        self.queue.push(Scheduled { at_ms, sequence: self.sequence, event });
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Deliver { to, .. } | Event::Stream { to, .. } | Event::StreamBroken { to, .. }
                if self.hosts[to].paused =>
            {
                self.hosts[to].queued.push(event)
            }
            Event::HoldDone { node, life } if self.hosts[node].paused && self.hosts[node].life == life => {
                self.hosts[node].queued.push(event)
            }
            Event::Deliver { from, to, message, sender_life, sender_had_state } => {
                self.deliver(from, to, message, sender_life, sender_had_state)
            }
            Event::Stream { from, to, from_life, to_life, connection, item } => {
                if self.hosts[to].life == to_life && self.hosts[from].life == from_life && self.hosts[to].is_up() {
                    self.receive_stream(from, to, connection, item);
                }
            }
            Event::StreamBroken { from, to, from_life, to_life, connection } => {
                self.stream_broken(from, to, from_life, to_life, connection)
            }
            Event::Tick { node } => {
                let host = &mut self.hosts[node];
                if host.paused || host.tick_at_ms != Some(self.now_ms) {
                    return;
                }
                host.tick_at_ms = None;
                if let Some(running) = host.node.as_mut() {
                    running.tick(self.now_ms);
                    self.drive(node);
                }
            }
            Event::PersistDone { node, life, epoch } => self.persist_done(node, life, epoch),
            Event::HoldDone { node, life } => {
                let host = &mut self.hosts[node];
                if host.life != life || !host.held {
                    return;
                }
                let version = host.table.map_or(0, |table| table.version);
                if let Some(running) = host.node.as_mut() {
                    running.clients_held(self.now_ms, version);
                    self.drive(node);
                }
            }
            Event::Grants => self.grants(),
            Event::Chaos => {
                if self.now_ms < self.heal_ms {
                    self.inject_fault();
                    let gap_ms = self.rng.between(1, self.config.chaos_gap_ms_max);
                    self.schedule(self.now_ms + gap_ms, Event::Chaos);
                }
            }
            Event::Resume { node, life } => {
                if life == u64::MAX {
                    self.start(node);
                } else if self.hosts[node].life == life && self.hosts[node].paused {
                    self.resume(node);
                }
            }
            Event::Heal => self.heal(),
            Event::End => {}
        }
    }

    /// A control message reaches `to`.
    fn deliver(&mut self, from: usize, to: usize, message: PeerMessage, sender_life: u64, sender_had_state: bool) {
        if !self.hosts[to].is_up() {
            return;
        }
        self.log(|| format!("{from} -> {to} {message:?}"));
        let now_ms = self.now_ms;
        let host = &mut self.hosts[to];
        host.knowledge = host.knowledge.max(message.epoch_max());
        if let PeerMessage::Heartbeat(_) = message {
            host.heard_since_start[from] = true;
            if sender_had_state {
                host.stateful_heard[from] = Some((now_ms, sender_life));
            }
        }
        host.node.as_mut().expect("up").receive(now_ms, from, message);
        self.drive(to);
    }

    /// The stream `from` → `to` on `connection` broke (a lost item).
    fn stream_broken(&mut self, from: usize, to: usize, from_life: u64, to_life: u64, connection: u64) {
        let host = &mut self.hosts[to];
        if host.life == to_life
            && self.hosts[from].life == from_life
            && self.hosts[to].receiver.connection_closed(from, connection)
        {
            let host = &mut self.hosts[to];
            host.node.as_mut().expect("up").replica_broken(self.now_ms, from);
            self.log(|| format!("stream {from} -> {to} broke"));
            self.drive(to);
        }
    }

    /// An epoch write of `node` is done.
    fn persist_done(&mut self, node: usize, life: u64, epoch: u64) {
        let host = &mut self.hosts[node];
        if host.life != life {
            return;
        }
        // The write is done even if the process is stopped; it learns so when it runs.
        host.durable_epoch = host.durable_epoch.max(epoch);
        if host.paused {
            host.queued.push(Event::PersistDone { node, life, epoch });
            return;
        }
        if let Some(running) = host.node.as_mut() {
            running.epoch_persisted(self.now_ms, epoch);
            self.drive(node);
        }
    }

    /// The client asks the serving nodes for grants now and then.
    fn grants(&mut self) {
        for index in 0..self.config.nodes {
            if self.hosts[index].is_serving() && !self.hosts[index].paused && self.rng.chance(500) {
                self.grant(index);
            }
        }
        let gap_ms = self.rng.between(1, (self.config.heartbeat_ms / 2).max(1));
        self.schedule(self.now_ms + gap_ms, Event::Grants);
    }

    fn start(&mut self, index: usize) {
        let host = &mut self.hosts[index];
        host.lose_memory();
        host.started_ms = self.now_ms;
        self.incarnations += 1;
        let node = Node::new(self.config.cluster(index), host.durable_epoch, self.incarnations, self.now_ms);
        host.node = Some(node);
        self.log(|| format!("node {index} starts"));
        self.drive(index);
    }

    fn resume(&mut self, index: usize) {
        self.log(|| format!("node {index} resumes"));
        let host = &mut self.hosts[index];
        host.paused = false;
        let queued = std::mem::take(&mut host.queued);
        // The process may see its timers or its sockets first.
        let tick_first = self.rng.chance(500);
        if tick_first && let Some(node) = self.hosts[index].node.as_mut() {
            node.tick(self.now_ms);
            self.drive(index);
        }
        for event in queued {
            self.handle(event);
        }
        if let Some(node) = self.hosts[index].node.as_mut() {
            node.tick(self.now_ms);
            self.drive(index);
        }
    }

    /// Applies every effect the node of host `index` queued, then sets its next tick.
    fn drive(&mut self, index: usize) {
        while let Some(effect) = self.hosts[index].node.as_mut().and_then(|node| node.poll_effect()) {
            self.apply(index, effect);
        }
        let host = &mut self.hosts[index];
        if let Some(node) = &host.node {
            let deadline_ms = node.next_deadline_ms();
            if deadline_ms == u64::MAX {
                return;
            }
            // The runtime wakes up at the deadline, or a little later.
            let at_ms = deadline_ms.max(self.now_ms + 1) + self.rng.below(2);
            if host.tick_at_ms.is_none_or(|scheduled_ms| scheduled_ms <= self.now_ms || at_ms < scheduled_ms) {
                host.tick_at_ms = Some(at_ms);
                self.schedule(at_ms, Event::Tick { node: index });
            }
        }
    }

    fn apply(&mut self, index: usize, effect: Effect) {
        if !matches!(effect, Effect::Send { message: PeerMessage::Heartbeat(_), .. }) {
            self.log(|| format!("node {index}: {effect:?}"));
        }
        match effect {
            Effect::Send { to, message } => self.send(index, to, message),
            Effect::PersistEpoch { epoch } => {
                let host = &mut self.hosts[index];
                let done_ms = host.persist_done_ms.max(self.now_ms) + self.rng.between(1, 5);
                host.persist_done_ms = done_ms;
                let life = host.life;
                self.schedule(done_ms, Event::PersistDone { node: index, life, epoch });
            }
            Effect::Activate { epoch, stream } => self.activate(index, epoch, stream),
            Effect::Follow { active } => {
                let host = &mut self.hosts[index];
                host.serving_epoch = None;
                host.held = false;
                host.followers.fill(false);
                host.following = active;
                if host.receiver.replica_from() != active {
                    host.receiver.clear();
                }
            }
            Effect::SendSnapshot { to } => {
                let host = &mut self.hosts[index];
                if host.serving_epoch.is_none() {
                    fail(&mut self.violation, format!("node {index} sends a snapshot but is not active"));
                    return;
                }
                host.followers[to] = true;
                let table = host.table.expect("an active holds a table");
                self.send_stream(index, to, StreamItem::Snapshot(table));
            }
            Effect::Hold => {
                let host = &mut self.hosts[index];
                if host.serving_epoch.is_none() {
                    fail(&mut self.violation, format!("node {index} holds clients but is not active"));
                    return;
                }
                host.held = true;
                let life = host.life;
                let done_ms = self.now_ms + self.rng.below(4);
                self.schedule(done_ms, Event::HoldDone { node: index, life });
            }
            Effect::Resume => self.hosts[index].held = false,
            Effect::Exit { reason } => self.exit(index, reason),
        }
    }

    /// Node `index` sends a control message; its heartbeats must tell the truth.
    fn send(&mut self, index: usize, to: usize, message: PeerMessage) {
        let host = &self.hosts[index];
        let had_state = host.table.is_some();
        // An active says it is caught up, unless --min-standbys blocks it
        // (as of when the heartbeat was made, which the effects' order hides).
        let semi_sync = self.config.min_standbys > 0;
        if let PeerMessage::Heartbeat(heartbeat) = message
            && if heartbeat.role == super::PeerRole::Active {
                !heartbeat.caught_up && !semi_sync
            } else {
                heartbeat.caught_up != had_state
            }
            && heartbeat.role != super::PeerRole::Leaving
        {
            let text = format!("node {index} says caught up {} but holds {:?}", heartbeat.caught_up, host.table);
            fail(&mut self.violation, text);
        }
        let life = host.life;
        if let PeerMessage::Heartbeat(heartbeat) = message
            && heartbeat.role == super::PeerRole::Leaving
        {
            // It is going away, and its state with it (a plain shutdown, or
            // after a hand-off): from now on no peer should wait for it.
            self.hosts[index].leaving = true;
        }
        self.send_control(index, to, message, life, had_state);
    }

    /// Node `index` exits: it must have persisted every epoch it knew.
    fn exit(&mut self, index: usize, reason: ExitReason) {
        match reason {
            ExitReason::HandedOff => self.report.handoffs_done += 1,
            ExitReason::HandOffFailed => self.report.handoffs_failed += 1,
            ExitReason::Standby | ExitReason::NoSuccessor => {}
        }
        let host = &self.hosts[index];
        if host.durable_epoch < host.knowledge {
            let text = format!(
                "node {index} exits having persisted epoch {} but knowing epoch {}",
                host.durable_epoch, host.knowledge
            );
            fail(&mut self.violation, text);
        }
        // Effects queued after Exit do not exist: the process is gone.
        self.hosts[index].lose_memory();
    }

    /// A node that becomes active with an empty table decides only after one
    /// failover period or once it heard every peer, and never while a peer
    /// heard lately holds the state.
    fn check_empty_activation(&mut self, index: usize) {
        let now_ms = self.now_ms;
        let failover_ms = self.config.failover_ms;
        let host = &self.hosts[index];
        // With an empty table, a node decides only after one failover
        // period or once it has heard from every peer (start-up rule).
        let heard_all = (0..self.config.nodes).all(|peer| peer == index || host.heard_since_start[peer]);
        if now_ms < host.started_ms + failover_ms && !heard_all {
            let started_ms = host.started_ms;
            let text = format!(
                "node {index} becomes active with an empty table {} ms after its start without hearing every peer",
                now_ms - started_ms
            );
            fail(&mut self.violation, text);
        }
        for (peer, other) in self.hosts.iter().enumerate() {
            if let Some((heard_ms, life)) = host.stateful_heard[peer]
                && now_ms < heard_ms + failover_ms
                && other.life == life
                && !other.leaving
                && other.table.is_some()
            {
                let text = format!(
                    "node {index} becomes active with an empty table while node {peer}, heard at {heard_ms} ms, holds the state"
                );
                fail(&mut self.violation, text);
            }
        }
    }

    fn activate(&mut self, index: usize, epoch: u64, stream: u64) {
        let host = &self.hosts[index];
        if epoch % 16 != index as u64 {
            fail(&mut self.violation, format!("node {index} activates epoch {epoch}, not one of its ballots"));
        }
        if epoch <= host.activated_max {
            fail(
                &mut self.violation,
                format!("node {index} activates epoch {epoch} after epoch {}", host.activated_max),
            );
        }
        if host.durable_epoch < epoch {
            fail(
                &mut self.violation,
                format!("node {index} activates epoch {epoch} but persisted only {}", host.durable_epoch),
            );
        }
        // Its own ballot may come back in peers' heartbeats before it is used.
        if epoch < host.knowledge || (epoch == host.knowledge && epoch % 16 != index as u64) {
            fail(
                &mut self.violation,
                format!("node {index} activates epoch {epoch}, not above epoch {} it knew", host.knowledge),
            );
        }
        if let Some(owner) = self.epoch_owner.insert(epoch, index)
            && owner != index
        {
            fail(&mut self.violation, format!("epoch {epoch} is used by nodes {owner} and {index}"));
        }
        let fresh = host.serving_epoch.is_none() || host.stream != stream;
        if fresh {
            self.report.activations += 1;
            if host.table.is_none() {
                self.check_empty_activation(index);
            }
        }
        let host = &mut self.hosts[index];
        if fresh {
            let tokens = host.table.map_or([0; KEYS], |table| table.tokens);
            host.table = Some(SimTable { stream, version: 0, tokens });
            host.stream = stream;
            host.followers.fill(false);
            host.receiver.clear();
            host.following = None;
        }
        host.serving_epoch = Some(epoch);
        host.held = false;
        host.sequence = 0;
        host.activated_max = epoch;
        host.knowledge = host.knowledge.max(epoch);
    }

    fn grant(&mut self, index: usize) {
        let key = self.rng.below(KEYS as u64) as usize;
        let serving = self.hosts.iter().filter(|host| host.is_serving()).count();
        let host = &mut self.hosts[index];
        let epoch = host.serving_epoch.expect("serving");
        host.sequence += 1;
        let granted = token(epoch, host.sequence);
        if host.knowledge > epoch {
            let text = format!("node {index} grants in epoch {epoch} although it knows epoch {}", host.knowledge);
            fail(&mut self.violation, text);
            return;
        }
        let table = host.table.as_mut().expect("an active holds a table");
        if granted <= table.tokens[key] {
            let text =
                format!("node {index} grants key {key} token {granted:#x} below its table's {:#x}", table.tokens[key]);
            fail(&mut self.violation, text);
            return;
        }
        table.tokens[key] = granted;
        table.version += 1;
        let delta = StreamItem::Delta { stream: table.stream, version: table.version, key, token: granted };
        let version = table.version;
        let knowledge = host.knowledge;
        let followers: Vec<usize> = (0..self.config.nodes).filter(|&peer| host.followers[peer]).collect();
        host.node.as_mut().expect("up").table_changed(self.now_ms, version);
        for to in followers {
            self.send_stream(index, to, delta);
        }
        self.drive(index);
        if !self.tokens_issued.insert(granted) {
            fail(&mut self.violation, format!("token {granted:#x} issued twice"));
        }
        self.log(|| format!("node {index} grants key {key} token {granted:#x} ({serving} serving)"));
        if serving >= 2 {
            self.report.grants_dual += 1;
            return;
        }
        self.report.grants_sole += 1;
        if let Some((last, last_epoch)) = self.last_sole_grant[key]
            && granted <= last
        {
            if last_epoch > knowledge {
                self.report.knowledge_gaps += 1;
                self.log(|| format!("knowledge gap: node {index} never learned epoch {last_epoch}"));
            } else {
                fail(
                    &mut self.violation,
                    format!(
                        "sole active {index} grants key {key} token {granted:#x} after {last:#x} although it knew epoch {last_epoch}"
                    ),
                );
            }
        }
        self.last_sole_grant[key] = Some((granted, epoch));
    }

    /// A stream item reaches `to`, through the replication core's receive
    /// rules: a snapshot (sent whole here) as its begin, one chunk and its
    /// end, a delta as a batch of one.
    fn receive_stream(&mut self, from: usize, to: usize, connection: u64, item: StreamItem) {
        let now_ms = self.now_ms;
        let host = &mut self.hosts[to];
        // As the replication core does: any stream frame shows its sender alive.
        host.node.as_mut().expect("up").stream_heard(now_ms, from);
        let serving = host.serving_epoch.is_some();
        let received = match item {
            StreamItem::Snapshot(table) => {
                // A host takes the snapshot of the active it follows only.
                if host.following != Some(from) {
                    return;
                }
                let entries = table.tokens.into_iter().enumerate().filter(|&(_, token)| token > 0);
                let receiver = &mut host.receiver;
                let mut received = receiver.snapshot_begin(from, connection, table.version(), serving);
                if received == Received::SnapshotBegun {
                    received = receiver.snapshot_chunk(now_ms, from, connection, entries, KEYS);
                }
                if received == Received::SnapshotProgress {
                    let mut replica = SimTable::empty();
                    received = receiver.snapshot_end(from, connection, table.version(), serving, &mut replica);
                    if let Received::SnapshotApplied { table: version, .. } = received {
                        host.table = Some(SimTable { stream: version.stream, version: version.version, ..replica });
                    }
                }
                received
            }
            StreamItem::Delta { stream, version, key, token: granted } => {
                let Some(table) = host.table.as_mut() else { return };
                let received =
                    host.receiver.deltas(now_ms, from, connection, stream, version, [(key, granted)], KEYS, table);
                if let Received::Applied { table: applied, .. } = received {
                    table.version = applied.version;
                }
                received
            }
        };
        match received {
            Received::Ignored => return,
            Received::SnapshotBegun | Received::SnapshotProgress => {}
            Received::SnapshotApplied { table, token_epoch_max, .. } => {
                host.knowledge = host.knowledge.max(token_epoch_max);
                host.node.as_mut().expect("up").snapshot_applied(now_ms, from, table, token_epoch_max);
            }
            Received::Applied { table, token_epoch_max } => {
                host.knowledge = host.knowledge.max(token_epoch_max);
                let node = host.node.as_mut().expect("up");
                node.replica_applied(now_ms, from, table, token_epoch_max);
                // The runtime acknowledges at the end of its turn; here at once.
                node.acknowledge(now_ms);
            }
            Received::Broken(Break::OutOfOrder((key, granted, previous))) => {
                let text = format!("node {to} applies key {key} token {granted:#x} below {previous:#x}");
                fail(&mut self.violation, text);
                return;
            }
            Received::Broken(_) => host.node.as_mut().expect("up").replica_broken(now_ms, from),
        }
        self.drive(to);
    }

    fn delay_ms(&mut self) -> u64 {
        // Now and then, while faults last, a message is very late, which reorders it far.
        if !self.healed && self.rng.chance(10) {
            self.rng.between(0, 2 * self.config.failover_ms)
        } else {
            self.rng.between(0, self.network.delay_ms_max)
        }
    }

    fn send_control(&mut self, from: usize, to: usize, message: PeerMessage, sender_life: u64, sender_had_state: bool) {
        if self.network.cut[from][to] || self.rng.chance(self.network.loss_per_mille) {
            return;
        }
        let at_ms = self.now_ms + self.delay_ms();
        self.schedule(at_ms, Event::Deliver { from, to, message, sender_life, sender_had_state });
    }

    fn send_stream(&mut self, from: usize, to: usize, item: StreamItem) {
        // The stream behaves like a TCP connection: a new snapshot opens a new
        // one; a lost item breaks it, nothing more passes, and the receiver
        // learns it a little later (a reset or a keep-alive timeout).
        if matches!(item, StreamItem::Snapshot(_)) {
            self.network.stream_broken[from][to] = false;
            self.network.stream_connection[from][to] += 1;
        }
        let connection = self.network.stream_connection[from][to];
        if self.network.stream_broken[from][to] {
            return;
        }
        if self.network.cut[from][to] || self.rng.chance(self.network.loss_per_mille / 4) {
            self.network.stream_broken[from][to] = true;
            // The reset comes after the data already on its way.
            let at_ms = (self.now_ms + self.rng.between(1, self.config.failover_ms))
                .max(self.network.stream_arrival_ms[from][to]);
            self.network.stream_arrival_ms[from][to] = at_ms;
            let (from_life, to_life) = (self.hosts[from].life, self.hosts[to].life);
            self.schedule(at_ms, Event::StreamBroken { from, to, from_life, to_life, connection });
            return;
        }
        let at_ms = (self.now_ms + self.rng.between(0, self.network.delay_ms_max))
            .max(self.network.stream_arrival_ms[from][to]);
        self.network.stream_arrival_ms[from][to] = at_ms;
        let (from_life, to_life) = (self.hosts[from].life, self.hosts[to].life);
        self.schedule(at_ms, Event::Stream { from, to, from_life, to_life, connection, item });
    }

    fn inject_fault(&mut self) {
        self.report.faults += 1;
        let total: u64 = self.config.fault_weights.iter().sum();
        if total == 0 {
            return;
        }
        let mut draw = self.rng.below(total);
        let mut fault = FAULTS[0];
        for (kind, weight) in FAULTS.iter().zip(self.config.fault_weights) {
            if draw < weight {
                fault = *kind;
                break;
            }
            draw -= weight;
        }
        let nodes = self.config.nodes;
        let target = self.rng.below(nodes as u64) as usize;
        // Faults aim at the active half of the time: that is where the interesting cases are.
        let active = (0..nodes).find(|&index| self.hosts[index].serving_epoch.is_some());
        let victim = match active {
            Some(active) if self.rng.chance(500) => active,
            _ => target,
        };
        self.log(|| format!("fault {fault:?} on node {victim}"));
        match fault {
            Fault::Crash => {
                if self.hosts[victim].is_up() {
                    self.hosts[victim].lose_memory();
                }
            }
            Fault::Restart => {
                if let Some(down) = (0..nodes).map(|step| (target + step) % nodes).find(|&i| !self.hosts[i].is_up()) {
                    self.start(down);
                }
            }
            Fault::Pause => {
                let host = &mut self.hosts[victim];
                if host.is_up() && !host.paused {
                    host.paused = true;
                    let life = host.life;
                    let pause_ms = self.rng.between(self.config.heartbeat_ms, 3 * self.config.failover_ms);
                    self.schedule(self.now_ms + pause_ms, Event::Resume { node: victim, life });
                }
            }
            Fault::Stop => {
                let host = &mut self.hosts[victim];
                if !host.paused
                    && let Some(node) = host.node.as_mut()
                {
                    node.stop_requested(self.now_ms);
                    self.drive(victim);
                }
            }
            Fault::Partition => {
                let sides: Vec<bool> = (0..nodes).map(|_| self.rng.chance(500)).collect();
                for from in 0..nodes {
                    for to in 0..nodes {
                        self.network.cut[from][to] = sides[from] != sides[to];
                    }
                }
            }
            Fault::OneWayCut => {
                let to = (victim + 1 + self.rng.below(nodes as u64 - 1) as usize) % nodes;
                self.network.cut[victim][to] = true;
            }
            Fault::HealNetwork => self.network.cut.iter_mut().for_each(|row| row.fill(false)),
            Fault::Loss => self.network.loss_per_mille = self.rng.pick(&[0, 10, 50, 200, 500]),
        }
    }

    fn heal(&mut self) {
        self.log(|| "heal".to_string());
        self.healed = true;
        self.network.cut.iter_mut().for_each(|row| row.fill(false));
        self.network.loss_per_mille = 0;
        let nodes = self.config.nodes;
        for index in 0..nodes {
            if self.hosts[index].paused {
                self.resume(index);
            }
        }
        // Most down nodes come back; at least one node runs.
        for index in 0..nodes {
            if !self.hosts[index].is_up() && self.rng.chance(700) {
                self.start(index);
            }
        }
        if !self.hosts.iter().any(Host::is_up) {
            let index = self.rng.below(nodes as u64) as usize;
            self.start(index);
        }
    }

    fn after_event(&mut self) {
        let serving = self.hosts.iter().filter(|host| host.is_serving()).count();
        match (serving >= 2, self.dual_since_ms) {
            (true, None) => self.dual_since_ms = Some(self.now_ms),
            (false, Some(since_ms)) => {
                self.report.dual_windows += 1;
                self.report.dual_ms += self.now_ms - since_ms;
                self.dual_since_ms = None;
            }
            _ => {}
        }
        if self.healed && self.now_ms >= self.heal_ms + self.config.converge_ms() {
            // An active holding its clients for a hand-off is on its way out;
            // while it holds, its successor may not be active yet.
            let is_active = |host: &Host| host.node.as_ref().is_some_and(|node| node.status().active);
            let actives: Vec<usize> = (0..self.config.nodes)
                .filter(|&index| is_active(&self.hosts[index]) && !self.hosts[index].held)
                .collect();
            let handing_off = self.hosts.iter().any(|host| is_active(host) && host.held);
            // A node stopping at the heal may leave nobody running: nothing to check then.
            let running = self.hosts.iter().any(Host::is_up);
            if actives.len() > 1 || (actives.is_empty() && !handing_off && running) {
                let text =
                    format!("{} ms after the network healed, the actives are {actives:?}", self.now_ms - self.heal_ms);
                fail(&mut self.violation, text);
            }
        }
    }

    /// The final shape: the highest-priority running node is active and every
    /// other running node follows it and holds a snapshot of its stream.
    fn check_settled(&mut self) {
        let Some(top) = (0..self.config.nodes).find(|&index| self.hosts[index].is_up()) else { return };
        let top_host = &self.hosts[top];
        if !top_host.is_serving() {
            fail(
                &mut self.violation,
                format!("after settling, node {top} (the highest priority running) is not serving"),
            );
            return;
        }
        let stream = top_host.stream;
        for index in top + 1..self.config.nodes {
            let host = &self.hosts[index];
            let Some(node) = &host.node else { continue };
            let synced =
                host.receiver.replica_from() == Some(top) && host.table.is_some_and(|table| table.stream == stream);
            if node.status().active_node != Some(top) || !synced {
                let text = format!(
                    "after settling, node {index} follows {:?} with table {:?}, not node {top}'s stream {stream}",
                    node.status().active_node,
                    host.table.map(|table| table.version())
                );
                fail(&mut self.violation, text);
            }
        }
    }
}

/// Keeps the first violation of a run.
fn fail(violation: &mut Option<String>, text: String) {
    if violation.is_none() {
        *violation = Some(text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_a_function_of_its_seed() {
        let first = Sim::new(SimConfig::from_seed(11), false).run().unwrap();
        let second = Sim::new(SimConfig::from_seed(11), false).run().unwrap();
        assert_eq!(
            (first.events, first.grants_sole, first.dual_ms),
            (second.events, second.grants_sole, second.dual_ms)
        );
        assert!(first.grants_sole > 0);
    }
}
