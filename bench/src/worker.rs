//! One load-generator thread: its own io_uring ring, its connections, and the
//! lanes of each connection.
//!
//! A lane is one request slot of a connection ("requests in flight per
//! connection" is the number of lanes): it always has exactly one request
//! out, or waits to retry, or is done. When its reply comes back the lane
//! sends its next request in the same loop turn, so the load is closed-loop
//! and the depth stays constant.
//!
//! Nothing is allocated per request: requests are encoded into each
//! connection's output buffer (two buffers, one being filled while the other
//! is in the kernel), replies are parsed in place from the provided receive
//! buffers, and lanes are found again from the reply: for ringlock's
//! uncontended workload by the key alone (each lane has its own slice of
//! keys), for its other workloads through the connection's [`PendingTable`]
//! (by op and key), and by the connection's FIFO for Redis and echo, which
//! answer in order.
//! The clock is read once per loop turn: a request's send time is the time
//! of the turn that encoded it, and a reply's time the time of the turn that
//! read it, so latencies are exact to one turn (a few microseconds).

use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use io_uring::types::{Fd, SubmitArgs, Timespec};
use io_uring::{IoUring, cqueue, opcode, squeue};
use ringlock_proto::Decoded;

use crate::keys::{KEY_LEN_MAX, KeyFormat};
use crate::open_loop::{Schedule, ScheduleStats};
use crate::pending::{NO_LANE, PendingOp, PendingTable};
use crate::tls::{Opened, Security};
use crate::wire::{AcquireLine, ErrorKind, Outcome, Parsed, Wire};
use ringlock_ring::{BufRing, poll_before_sleep};
use rustls::ClientConnection;

/// Receive buffers per thread, and their size.
const RECV_BUFFERS: u16 = 256;
const RECV_BUFFER_LEN: usize = 16 << 10;
const RECV_BUFFER_GROUP: u16 = 0;
/// Longest sleep of the loop, so it sees phase changes without traffic.
const IDLE_WAIT_MAX: Duration = Duration::from_millis(5);
/// Open loop: a slot due sooner than this is waited for by polling the
/// ring rather than by a timer.
const TIMETABLE_SPIN_BELOW: Duration = Duration::from_micros(50);
/// Longest latency a histogram holds, in nanoseconds (a minute).
const LATENCY_NS_MAX: u64 = 60_000_000_000;

/// Longest connect, TLS handshake or `U` exchange of a connection.
const OPEN_TIMEOUT: Duration = Duration::from_secs(5);

const KIND_RECV: u64 = 1;
const KIND_SEND: u64 = 2;

/// Phases of a run, set by the main thread and read by every worker once
/// per turn.
pub const PHASE_WARMUP: u8 = 0;
pub const PHASE_MEASURE: u8 = 1;
pub const PHASE_DRAIN: u8 = 2;

/// What the workers share with the main thread.
pub struct Control {
    pub phase: AtomicU8,
    /// Every worker has connected; the main thread starts the clock after it.
    pub connected: Barrier,
}

/// The workloads of the issue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Acquire then release random keys of a large key space; every
    /// request slot (connection x depth) draws from its own slice of it, so
    /// no two requests in flight share a key.
    Uncontended,
    /// Every lane acquires one of a few hot keys, releases it as soon as it
    /// is granted, and starts again: FIFO hand-offs under a queue.
    Contended,
    /// Acquire distinct keys and keep them, to measure memory per held lock.
    Hold,
}

/// What every worker of a run does.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The servers driven, each with its TLS settings: one, or one per
    /// cluster (`--cluster`), in the order of `routing`'s names.
    pub servers: Vec<(SocketAddr, Security)>,
    /// With several clusters: which keys each connection may draw.
    pub routing: Option<Arc<Routing>>,
    /// Acquire lines to patch (ringlock and echo); Redis encodes each.
    pub acquire_line: Option<AcquireLine>,
    pub wire: Wire,
    pub workload: Workload,
    pub keys: KeyFormat,
    pub lanes_per_connection: usize,
    pub lease_ms: u64,
    pub wait_ms: u64,
    pub hot_keys: u64,
    pub retry_delay: Duration,
    pub drain_timeout: Duration,
    /// How long the loop polls for replies before it sleeps.
    pub poll: Duration,
    /// `run --rate`: send on a timetable instead of as replies come back.
    pub open_loop: Option<OpenLoop>,
}

/// Several clusters: each connection draws only keys of its cluster, the
/// one the clients' hash chooses for the key (docs/protocol.md §4).
#[derive(Debug)]
pub struct Routing {
    /// The clusters' names, in the order of `Settings::servers`.
    pub names: Vec<String>,
    /// Contended: the hot keys of each cluster.
    pub hot_keys: Vec<Vec<u64>>,
}

impl Routing {
    /// Whether key number `key` goes to cluster `cluster`.
    pub fn owns(&self, cluster: usize, key: u64, keys: &KeyFormat) -> bool {
        let mut buffer = [0u8; KEY_LEN_MAX];
        ringlock_proto::cluster_index(&self.names, keys.write(key, &mut buffer)) == Some(cluster)
    }
}

/// The timetable of an open-loop run.
#[derive(Clone, Copy, Debug)]
pub struct OpenLoop {
    /// Acquires per second over every connection of the run.
    pub cycles_per_s: f64,
    /// Connections of the run, over every thread.
    pub connections: u64,
    /// A send later than this after its intended time is late.
    pub lag_tolerance: Duration,
}

/// One connection's share of the work.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionPlan {
    /// Index among all connections of the run.
    pub index: u64,
    /// Its server in `Settings::servers` (with several clusters, its
    /// cluster, whose keys alone it draws).
    pub server: usize,
    /// Uncontended: the keys it draws from; hold: the keys it acquires.
    pub key_first: u64,
    pub key_count: u64,
}

/// What one worker measured.
pub struct WorkerStats {
    pub acquires: u64,
    pub releases: u64,
    pub acquire_ns: Histogram<u64>,
    pub release_ns: Histogram<u64>,
    pub errors: [u64; ErrorKind::COUNT],
    /// Loop turns and replies read, to show how much each turn batches.
    pub turns: u64,
    pub replies: u64,
    /// Open loop: how the timetable was kept.
    pub schedule: ScheduleStats,
}

impl WorkerStats {
    fn new() -> WorkerStats {
        let histogram = || Histogram::new_with_bounds(1, LATENCY_NS_MAX, 3).expect("valid histogram bounds");
        WorkerStats {
            acquires: 0,
            releases: 0,
            acquire_ns: histogram(),
            release_ns: histogram(),
            errors: [0; ErrorKind::COUNT],
            turns: 0,
            replies: 0,
            schedule: ScheduleStats::new(),
        }
    }

    fn reset(&mut self) {
        self.acquires = 0;
        self.releases = 0;
        self.acquire_ns.reset();
        self.release_ns.reset();
        self.errors = [0; ErrorKind::COUNT];
        self.turns = 0;
        self.replies = 0;
        self.schedule.reset();
    }

    /// Adds another worker's figures to these.
    pub fn add(&mut self, other: &WorkerStats) {
        self.acquires += other.acquires;
        self.releases += other.releases;
        self.acquire_ns.add(&other.acquire_ns).expect("histograms of equal bounds");
        self.release_ns.add(&other.release_ns).expect("histograms of equal bounds");
        for (sum, count) in self.errors.iter_mut().zip(other.errors) {
            *sum += count;
        }
        self.turns += other.turns;
        self.replies += other.replies;
        self.schedule.add(&other.schedule);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LaneState {
    Idle,
    InFlight,
    Retrying,
}

#[derive(Clone, Copy, Debug)]
struct Lane {
    state: LaneState,
    op: PendingOp,
    key: u64,
    token: u64,
    sent_ns: u64,
    /// When the lane first asked for its current key: acquire latency runs
    /// from here, across Redis busy retries.
    first_ns: u64,
}

struct Connection {
    /// Owns the socket; the ring uses its descriptor.
    _stream: TcpStream,
    /// With TLS: the connection's TLS state. Each batch of requests is
    /// sealed at once into `sending`, and each receive opened into `plain`.
    tls: Option<Box<ClientConnection>>,
    plain: Vec<u8>,
    fd: RawFd,
    out: Vec<u8>,
    sending: Vec<u8>,
    sent: usize,
    send_in_flight: bool,
    recv_armed: bool,
    closed: bool,
    dirty: bool,
    /// The start of a reply whose end has not arrived.
    carry: Vec<u8>,
    pending: PendingTable,
    /// Lanes in request order, for targets that answer in order.
    order: VecDeque<u32>,
    lanes: Vec<Lane>,
    /// The pending table's list links, one per lane.
    next: Vec<u32>,
    plan: ConnectionPlan,
    /// Uncontended: how many keys each lane draws from.
    lane_span: u64,
    hold_next: u64,
    token_counter: u64,
}

impl Connection {
    fn uncontended_lane(&self, op: PendingOp, key: u64) -> Option<u32> {
        uncontended_lane(&self.lanes, self.plan.key_first, self.lane_span, op, key)
    }
}

/// Uncontended: the lane whose request (op, key) is in flight, found
/// without the pending table. Lane `n` draws its keys from
/// `key_first + n * lane_span` on, `lane_span` of them, and has one request
/// out, so the key names the lane; the lane's own state confirms it, and a
/// reply it does not confirm is unpaired.
fn uncontended_lane(lanes: &[Lane], key_first: u64, lane_span: u64, op: PendingOp, key: u64) -> Option<u32> {
    let lane = key.checked_sub(key_first)? / lane_span;
    let state = lanes.get(usize::try_from(lane).ok()?)?;
    (state.state == LaneState::InFlight && state.op == op && state.key == key).then_some(lane as u32)
}

/// Everything but the ring and the buffers, so that replies parsed from a
/// buffer can drive the lanes.
struct Clients {
    settings: Settings,
    connections: Vec<Connection>,
    dirty: Vec<u32>,
    /// Lanes waiting to send again: (due, connection, lane), in due order
    /// since the delay is constant.
    retries: VecDeque<(u64, u32, u32)>,
    stats: WorkerStats,
    random: u64,
    base: Instant,
    now_ns: u64,
    measuring: bool,
    draining: bool,
    drain_deadline_ns: u64,
    /// Lanes not idle.
    active: usize,
    /// Open loop: each connection's timetable and idle lanes.
    timetable: Option<Timetable>,
}

/// The open-loop state of one worker.
struct Timetable {
    schedules: Vec<Schedule>,
    /// Idle lanes of each connection, ready for the next due slot.
    free: Vec<Vec<u32>>,
    tolerance_ns: u64,
    /// The earliest intended time of a slot that has a free lane to go on.
    next_wake_ns: u64,
}

/// One thread of the load generator.
pub struct Worker {
    // Dropped in this order: the ring before the buffers it reads into.
    ring: IoUring,
    buffers: BufRing,
    clients: Clients,
    completions: Vec<(u64, i32, u32)>,
}

impl Worker {
    /// Connects this worker's connections and sets up its ring; call on the
    /// thread that runs it.
    pub fn new(settings: Settings, plans: Vec<ConnectionPlan>, seed: u64, base: Instant) -> io::Result<Worker> {
        let mut builder = IoUring::builder();
        builder.setup_single_issuer().setup_defer_taskrun().setup_cqsize(16384);
        let ring = match builder.build(4096) {
            Ok(ring) => ring,
            Err(_) => IoUring::builder().setup_cqsize(16384).build(4096)?,
        };
        let buffers = BufRing::register(&ring, RECV_BUFFER_GROUP, RECV_BUFFERS, RECV_BUFFER_LEN)?;
        let lanes = settings.lanes_per_connection;
        let mut connections = Vec::with_capacity(plans.len());
        for plan in plans {
            let (addr, security) = &settings.servers[plan.server];
            let Opened { stream, tls } = crate::tls::open(*addr, security, OPEN_TIMEOUT)
                .map_err(|error| io::Error::new(error.kind(), format!("cannot connect to {addr}: {error}")))?;
            let fd = stream.as_raw_fd();
            let idle =
                Lane { state: LaneState::Idle, op: PendingOp::Acquire, key: 0, token: 0, sent_ns: 0, first_ns: 0 };
            connections.push(Connection {
                _stream: stream,
                plain: Vec::with_capacity(if tls.is_some() { RECV_BUFFER_LEN } else { 0 }),
                tls,
                fd,
                out: Vec::with_capacity(lanes * 160),
                sending: Vec::with_capacity(lanes * 160),
                sent: 0,
                send_in_flight: false,
                recv_armed: false,
                closed: false,
                dirty: false,
                carry: Vec::with_capacity(4096),
                pending: PendingTable::new(lanes),
                order: VecDeque::with_capacity(lanes),
                lanes: vec![idle; lanes],
                next: vec![NO_LANE; lanes],
                plan,
                lane_span: plan.key_count / lanes as u64,
                hold_next: plan.key_first,
                token_counter: 0,
            });
        }
        let count = connections.len();
        let timetable = settings.open_loop.map(|open| Timetable {
            // Filled in once every worker has connected.
            schedules: Vec::with_capacity(count),
            free: vec![Vec::with_capacity(lanes); count],
            tolerance_ns: open.lag_tolerance.as_nanos() as u64,
            next_wake_ns: 0,
        });
        Ok(Worker {
            ring,
            buffers,
            clients: Clients {
                settings,
                connections,
                dirty: Vec::with_capacity(count),
                retries: VecDeque::with_capacity(count * lanes),
                stats: WorkerStats::new(),
                random: seed | 1,
                base,
                now_ns: 0,
                measuring: false,
                draining: false,
                drain_deadline_ns: u64::MAX,
                active: 0,
                timetable,
            },
            completions: Vec::with_capacity(16384),
        })
    }

    /// Runs until the drain phase ends (or, for `hold`, every key is held).
    pub fn run(mut self, control: &Control) -> io::Result<WorkerStats> {
        for index in 0..self.clients.connections.len() {
            self.arm_recv(index);
        }
        control.connected.wait();
        self.clients.tick(control);
        let lanes = self.clients.settings.lanes_per_connection as u32;
        if let (Some(open), Some(timetable)) = (self.clients.settings.open_loop, &mut self.clients.timetable) {
            // Every lane starts idle; the timetable starts now, the same
            // moment for every worker to within their wake-ups.
            let start_ns = self.clients.now_ns;
            for (connection, free) in self.clients.connections.iter().zip(&mut timetable.free) {
                timetable.schedules.push(Schedule::new(
                    start_ns,
                    open.cycles_per_s,
                    open.connections,
                    connection.plan.index,
                ));
                free.extend((0..lanes).rev());
            }
            self.clients.run_timetable();
        } else {
            for index in 0..self.clients.connections.len() {
                for lane in 0..lanes {
                    self.clients.active += 1;
                    self.clients.start(index, lane);
                }
            }
        }
        self.flush();
        loop {
            self.wait()?;
            self.clients.tick(control);
            self.clients.stats.turns += 1;
            self.handle_completions();
            self.clients.run_due_retries();
            self.clients.run_timetable();
            self.buffers.publish();
            self.flush();
            let clients = &self.clients;
            // An open loop has no lane out between two slots: only the
            // drain ends it.
            if (clients.active == 0 && (clients.timetable.is_none() || clients.draining))
                || (clients.draining && clients.now_ns >= clients.drain_deadline_ns)
                || clients.connections.iter().all(|connection| connection.closed)
            {
                break;
            }
        }
        let mut stats = self.clients.stats;
        for connection in &self.clients.connections {
            if !connection.closed {
                let unanswered = connection.lanes.iter().filter(|lane| lane.state == LaneState::InFlight).count();
                stats.errors[ErrorKind::NoReply.index()] += unanswered as u64;
            }
        }
        Ok(stats)
    }

    fn push(&mut self, entry: squeue::Entry) {
        loop {
            // SAFETY: every buffer an entry points to (a connection's
            // `sending` buffer, the provided buffers) stays alive and
            // unmoved until its completion arrives or the ring is dropped.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                return;
            }
            if let Err(error) = self.ring.submit() {
                eprintln!("ringlock-bench: io_uring submit failed: {error}");
            }
        }
    }

    fn arm_recv(&mut self, index: usize) {
        let connection = &mut self.clients.connections[index];
        connection.recv_armed = true;
        let entry = opcode::RecvMulti::new(Fd(connection.fd), RECV_BUFFER_GROUP)
            .build()
            .user_data(KIND_RECV << 32 | index as u64);
        self.push(entry);
    }

    fn wait(&mut self) -> io::Result<()> {
        let mut wait = IDLE_WAIT_MAX;
        let next_slot = self.clients.timetable.as_ref().filter(|_| !self.clients.draining).map(|t| t.next_wake_ns);
        let due = self.clients.retries.front().map(|&(due, _, _)| due).into_iter().chain(next_slot).min();
        if let Some(due) = due {
            let now = self.clients.base.elapsed().as_nanos() as u64;
            wait = wait.min(Duration::from_nanos(due.saturating_sub(now)));
            if next_slot.is_some() && wait < TIMETABLE_SPIN_BELOW {
                // A timer this short would wake the loop late by about
                // its own length, and that lag would count in every
                // latency: look for completions without sleeping instead.
                wait = Duration::ZERO;
            }
        }
        // A generator that sleeps makes the server wake it from inside each
        // `send` of replies, on the server's CPU; awake, it spares the
        // server that work, as an echo server that polls spares it.
        let poll = self.clients.settings.poll.min(wait);
        if !poll.is_zero() && poll_before_sleep(&mut self.ring, poll, || false)? {
            return Ok(());
        }
        let timespec = Timespec::from(wait);
        let args = SubmitArgs::new().timespec(&timespec);
        match self.ring.submitter().submit_with_args(1, &args) {
            Ok(_) => Ok(()),
            Err(error) if matches!(error.raw_os_error(), Some(libc::ETIME | libc::EINTR | libc::EBUSY)) => Ok(()),
            Err(error) => Err(error),
        }
    }

    fn handle_completions(&mut self) {
        let mut completions = std::mem::take(&mut self.completions);
        completions.extend(self.ring.completion().map(|cqe| (cqe.user_data(), cqe.result(), cqe.flags())));
        for &(data, result, flags) in &completions {
            let index = (data & 0xffff_ffff) as usize;
            match data >> 32 {
                KIND_RECV => self.received(index, result, flags),
                KIND_SEND => self.sent(index, result),
                _ => {}
            }
        }
        completions.clear();
        self.completions = completions;
    }

    fn received(&mut self, index: usize, result: i32, flags: u32) {
        if !cqueue::more(flags) {
            self.clients.connections[index].recv_armed = false;
        }
        let buffer = cqueue::buffer_select(flags);
        if result > 0 {
            let id = buffer.expect("a multishot recv result names its buffer");
            let data = self.buffers.get(id, result as usize);
            let connection = &mut self.clients.connections[index];
            if let Some(tls) = connection.tls.as_mut() {
                let mut plain = std::mem::take(&mut connection.plain);
                let opened = crate::tls::open_records(tls, data, &mut plain);
                self.buffers.push(id);
                if opened.is_err() {
                    self.clients.count(ErrorKind::BadReply);
                    self.clients.close(index);
                    return;
                }
                self.clients.on_data(index, &plain);
                plain.clear();
                self.clients.connections[index].plain = plain;
            } else {
                self.clients.on_data(index, data);
                self.buffers.push(id);
            }
        } else if let Some(id) = buffer {
            self.buffers.push(id);
        }
        if result == 0 || (result < 0 && result != -libc::ENOBUFS) {
            self.clients.close(index);
            return;
        }
        let connection = &self.clients.connections[index];
        if !connection.recv_armed && !connection.closed {
            self.arm_recv(index);
        }
    }

    fn sent(&mut self, index: usize, result: i32) {
        let connection = &mut self.clients.connections[index];
        if result < 0 {
            connection.send_in_flight = false;
            self.clients.close(index);
            return;
        }
        connection.sent += result as usize;
        if connection.sent < connection.sending.len() {
            let rest = &connection.sending[connection.sent..];
            let entry = opcode::Send::new(Fd(connection.fd), rest.as_ptr(), rest.len() as u32)
                .flags(libc::MSG_NOSIGNAL)
                .build()
                .user_data(KIND_SEND << 32 | index as u64);
            self.push(entry);
            return;
        }
        connection.sending.clear();
        connection.send_in_flight = false;
        if !connection.out.is_empty() {
            self.clients.mark_dirty(index);
        }
    }

    /// Starts one send per connection with output and no send in flight.
    fn flush(&mut self) {
        let mut dirty = std::mem::take(&mut self.clients.dirty);
        for &index in &dirty {
            let connection = &mut self.clients.connections[index as usize];
            connection.dirty = false;
            if connection.send_in_flight || connection.out.is_empty() || connection.closed {
                continue;
            }
            if let Some(tls) = connection.tls.as_mut() {
                // The whole batch in one piece of ciphertext (TLS records of
                // up to 16 KiB).
                connection.sending.clear();
                if crate::tls::seal(tls, &connection.out, &mut connection.sending).is_err() {
                    continue;
                }
                connection.out.clear();
            } else {
                std::mem::swap(&mut connection.out, &mut connection.sending);
            }
            connection.sent = 0;
            connection.send_in_flight = true;
            let entry =
                opcode::Send::new(Fd(connection.fd), connection.sending.as_ptr(), connection.sending.len() as u32)
                    .flags(libc::MSG_NOSIGNAL)
                    .build()
                    .user_data(KIND_SEND << 32 | u64::from(index));
            self.push(entry);
        }
        dirty.clear();
        self.clients.dirty = dirty;
    }
}

impl Clients {
    /// Reads the clock and the phase, once per turn.
    fn tick(&mut self, control: &Control) {
        self.now_ns = self.base.elapsed().as_nanos() as u64;
        let phase = control.phase.load(Ordering::Relaxed);
        if phase == PHASE_MEASURE && !self.measuring && !self.draining {
            self.measuring = true;
            self.stats.reset();
        }
        if phase == PHASE_DRAIN && !self.draining {
            if let Some(timetable) = &self.timetable
                && self.measuring
            {
                let now_ns = self.now_ns;
                self.stats.schedule.unsent_at_end =
                    timetable.schedules.iter().map(|schedule| schedule.backlog(now_ns)).sum();
            }
            self.measuring = false;
            self.draining = true;
            self.drain_deadline_ns = self.now_ns + self.settings.drain_timeout.as_nanos() as u64;
        }
    }

    fn random(&mut self) -> u64 {
        // xorshift64*: fast, and good enough to spread keys.
        self.random ^= self.random >> 12;
        self.random ^= self.random << 25;
        self.random ^= self.random >> 27;
        self.random.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..bound` without a division.
    fn below(&mut self, bound: u64) -> u64 {
        ((u128::from(self.random()) * u128::from(bound)) >> 64) as u64
    }

    fn mark_dirty(&mut self, index: usize) {
        let connection = &mut self.connections[index];
        if !connection.dirty {
            connection.dirty = true;
            self.dirty.push(index as u32);
        }
    }

    fn count(&mut self, kind: ErrorKind) {
        if self.measuring || kind == ErrorKind::ConnectionClosed {
            self.stats.errors[kind.index()] += 1;
        }
    }

    /// Gives a lane its next piece of work, or makes it idle.
    fn start(&mut self, index: usize, lane: u32) {
        if self.draining {
            return self.idle(index, lane);
        }
        if let Some(timetable) = &mut self.timetable {
            // Open loop: the lane waits for the connection's next slot,
            // which may be due already.
            timetable.free[index].push(lane);
            self.idle(index, lane);
            return self.run_slots(index);
        }
        self.start_at(index, lane, self.now_ns);
    }

    /// Open loop: sends every due slot of every connection that has a free
    /// lane, and notes when the next one is due.
    fn run_timetable(&mut self) {
        if self.draining || self.timetable.is_none() {
            return;
        }
        let mut next_wake_ns = u64::MAX;
        for index in 0..self.connections.len() {
            self.run_slots(index);
            let timetable = self.timetable.as_ref().expect("checked above");
            if !timetable.free[index].is_empty() {
                next_wake_ns = next_wake_ns.min(timetable.schedules[index].next_due_ns());
            }
        }
        if let Some(timetable) = &mut self.timetable {
            timetable.next_wake_ns = next_wake_ns;
        }
    }

    /// Open loop: sends the due slots of one connection while it has free lanes.
    fn run_slots(&mut self, index: usize) {
        if self.draining || self.connections[index].closed {
            return;
        }
        let now_ns = self.now_ns;
        loop {
            let Some(timetable) = &mut self.timetable else { return };
            let schedule = &mut timetable.schedules[index];
            if schedule.next_due_ns() > now_ns {
                return;
            }
            let Some(lane) = timetable.free[index].pop() else {
                // Every lane is out: the due slots wait for replies.
                return schedule.hold(now_ns);
            };
            let slot = schedule.take_due(now_ns).expect("due, checked above");
            if self.measuring {
                self.stats.schedule.record(slot, now_ns, timetable.tolerance_ns);
            }
            self.active += 1;
            self.start_at(index, lane, slot.intended_ns);
        }
    }

    /// Sends a lane's next acquire; its latency counts from `first_ns`.
    fn start_at(&mut self, index: usize, lane: u32, first_ns: u64) {
        let key = match self.settings.workload {
            Workload::Uncontended => {
                // Each lane draws from its own slice of the connection's
                // keys, so no two requests in flight ever share a key.
                let (key_first, lane_span, cluster) = {
                    let connection = &self.connections[index];
                    (connection.plan.key_first, connection.lane_span, connection.plan.server)
                };
                loop {
                    let key = key_first + u64::from(lane) * lane_span + self.below(lane_span);
                    // With several clusters, draw again until the key is
                    // the connection's cluster's (every slice holds some:
                    // run.rs checks).
                    match &self.settings.routing {
                        Some(routing) if !routing.owns(cluster, key, &self.settings.keys) => {}
                        _ => break key,
                    }
                }
            }
            Workload::Contended => {
                let cluster = self.connections[index].plan.server;
                match self.settings.routing.as_ref().map(|routing| routing.hot_keys[cluster].len()) {
                    None => self.below(self.settings.hot_keys),
                    Some(count) => {
                        let pick = self.below(count as u64) as usize;
                        self.settings.routing.as_ref().expect("checked above").hot_keys[cluster][pick]
                    }
                }
            }
            Workload::Hold => loop {
                let connection = &mut self.connections[index];
                if connection.hold_next >= connection.plan.key_first + connection.plan.key_count {
                    return self.idle(index, lane);
                }
                connection.hold_next += 1;
                let (key, cluster) = (connection.hold_next - 1, connection.plan.server);
                match &self.settings.routing {
                    Some(routing) if !routing.owns(cluster, key, &self.settings.keys) => {}
                    _ => break key,
                }
            },
        };
        self.connections[index].lanes[lane as usize].first_ns = first_ns;
        self.send_acquire(index, lane, key);
    }

    fn idle(&mut self, index: usize, lane: u32) {
        let lane = &mut self.connections[index].lanes[lane as usize];
        if lane.state != LaneState::Idle {
            lane.state = LaneState::Idle;
            self.active -= 1;
        }
    }

    fn send_acquire(&mut self, index: usize, lane: u32, key: u64) {
        let settings = &self.settings;
        let connection = &mut self.connections[index];
        connection.token_counter += 1;
        let token = settings.wire.acquire_token(connection.plan.index << 40 | connection.token_counter);
        match &settings.acquire_line {
            Some(line) => line.encode(&settings.keys, key, &mut connection.out),
            None => {
                let mut key_buffer = [0u8; KEY_LEN_MAX];
                let key_bytes = settings.keys.write(key, &mut key_buffer);
                settings.wire.encode_acquire(
                    key_bytes,
                    token,
                    settings.lease_ms,
                    settings.wait_ms,
                    &mut connection.out,
                );
            }
        }
        let state = &mut connection.lanes[lane as usize];
        *state =
            Lane { state: LaneState::InFlight, op: PendingOp::Acquire, key, token, sent_ns: self.now_ns, ..*state };
        if settings.wire.is_ordered() {
            connection.order.push_back(lane);
        } else if settings.workload != Workload::Uncontended {
            connection.pending.push(PendingOp::Acquire, key, lane, &mut connection.next);
        }
        self.mark_dirty(index);
    }

    fn send_release(&mut self, index: usize, lane: u32) {
        let settings = &self.settings;
        let connection = &mut self.connections[index];
        let state = &mut connection.lanes[lane as usize];
        let mut key_buffer = [0u8; KEY_LEN_MAX];
        let key_bytes = settings.keys.write(state.key, &mut key_buffer);
        settings.wire.encode_release(key_bytes, state.token, &mut connection.out);
        state.state = LaneState::InFlight;
        state.op = PendingOp::Release;
        state.sent_ns = self.now_ns;
        let key = state.key;
        if settings.wire.is_ordered() {
            connection.order.push_back(lane);
        } else if settings.workload != Workload::Uncontended {
            connection.pending.push(PendingOp::Release, key, lane, &mut connection.next);
        }
        self.mark_dirty(index);
    }

    fn retry_later(&mut self, index: usize, lane: u32) {
        if self.draining {
            return self.idle(index, lane);
        }
        self.connections[index].lanes[lane as usize].state = LaneState::Retrying;
        let due = self.now_ns + self.settings.retry_delay.as_nanos() as u64;
        self.retries.push_back((due, index as u32, lane));
    }

    fn run_due_retries(&mut self) {
        while let Some(&(due, index, lane)) = self.retries.front() {
            if due > self.now_ns {
                return;
            }
            self.retries.pop_front();
            let (index, state) = (index as usize, self.connections[index as usize].lanes[lane as usize]);
            if state.state != LaneState::Retrying {
                continue;
            }
            if self.draining || self.connections[index].closed {
                self.idle(index, lane);
            } else {
                self.send_acquire(index, lane, state.key);
            }
        }
    }

    /// Replies in `data`, after any partial reply kept from before.
    fn on_data(&mut self, index: usize, data: &[u8]) {
        let mut carry = std::mem::take(&mut self.connections[index].carry);
        let mut data = data;
        // Finish the kept partial reply a line at a time, so that only its
        // own bytes are copied, then parse the rest in place.
        while !carry.is_empty() {
            let Some(newline) = data.iter().position(|&byte| byte == b'\n') else {
                carry.extend_from_slice(data);
                data = &[];
                break;
            };
            carry.extend_from_slice(&data[..=newline]);
            data = &data[newline + 1..];
            let used = self.on_replies(index, &carry);
            carry.drain(..used);
            if self.connections[index].closed {
                return;
            }
        }
        if !data.is_empty() {
            let used = self.on_replies(index, data);
            carry.extend_from_slice(&data[used..]);
        }
        if !self.connections[index].closed {
            self.connections[index].carry = carry;
        }
    }

    /// Handles every whole reply at the front of `input`; returns the bytes used.
    fn on_replies(&mut self, index: usize, input: &[u8]) -> usize {
        let mut offset = 0;
        let wire = self.settings.wire;
        let keys = self.settings.keys;
        loop {
            match wire.decode(&input[offset..], &keys) {
                Decoded::Incomplete => return offset,
                Decoded::LineTooLong => {
                    self.count(ErrorKind::BadReply);
                    self.close(index);
                    return input.len();
                }
                Decoded::Line { consumed, item } => {
                    offset += consumed;
                    self.stats.replies += 1;
                    self.on_reply(index, item);
                }
            }
        }
    }

    fn on_reply(&mut self, index: usize, parsed: Parsed) {
        let connection = &mut self.connections[index];
        let (lane, outcome) = match parsed {
            Parsed::Keyed { op, key, outcome } => {
                let lane = match self.settings.workload {
                    Workload::Uncontended => connection.uncontended_lane(op, key),
                    Workload::Contended | Workload::Hold => connection.pending.pop(op, key, &connection.next),
                };
                match lane {
                    Some(lane) => (lane, outcome),
                    None => return self.count(ErrorKind::Unpaired),
                }
            }
            Parsed::Unkeyed(kind) => return self.count(kind),
            Parsed::Ordered(reply) => {
                let Some(lane) = connection.order.pop_front() else { return self.count(ErrorKind::Unpaired) };
                let state = connection.lanes[lane as usize];
                (lane, reply.outcome(state.op, state.token))
            }
        };
        self.on_outcome(index, lane, outcome);
    }

    fn on_outcome(&mut self, index: usize, lane: u32, outcome: Outcome) {
        let state = self.connections[index].lanes[lane as usize];
        debug_assert_eq!(state.state, LaneState::InFlight);
        match (state.op, outcome) {
            (PendingOp::Acquire, Outcome::Granted { token }) => {
                if self.measuring {
                    self.stats.acquires += 1;
                    self.stats.acquire_ns.saturating_record((self.now_ns - state.first_ns).max(1));
                }
                if self.settings.workload == Workload::Hold {
                    self.start(index, lane);
                } else {
                    // Released even while draining, so no lock outlives the run.
                    self.connections[index].lanes[lane as usize].token = token;
                    self.send_release(index, lane);
                }
            }
            (PendingOp::Acquire, Outcome::Failed(ErrorKind::WaitExpired)) => {
                self.count(ErrorKind::WaitExpired);
                if self.settings.workload == Workload::Hold {
                    self.retry_later(index, lane);
                } else {
                    self.start(index, lane);
                }
            }
            (PendingOp::Acquire, Outcome::Failed(kind)) => {
                self.count(kind);
                self.retry_later(index, lane);
            }
            (PendingOp::Release, Outcome::Released) => {
                if self.measuring {
                    self.stats.releases += 1;
                    self.stats.release_ns.saturating_record((self.now_ns - state.sent_ns).max(1));
                }
                self.start(index, lane);
            }
            (PendingOp::Release, Outcome::Failed(kind)) => {
                self.count(kind);
                self.start(index, lane);
            }
            (PendingOp::Acquire, Outcome::Released) | (PendingOp::Release, Outcome::Granted { .. }) => {
                self.count(ErrorKind::BadReply);
                self.start(index, lane);
            }
        }
    }

    /// The connection failed or was closed by the server: its lanes end.
    fn close(&mut self, index: usize) {
        if self.connections[index].closed {
            return;
        }
        self.count(ErrorKind::ConnectionClosed);
        let connection = &mut self.connections[index];
        connection.closed = true;
        // SAFETY: a socket this connection owns; shutting it down ends the
        // multishot receive and any send in flight.
        unsafe { libc::shutdown(connection.fd, libc::SHUT_RDWR) };
        let lost = connection.lanes.iter().filter(|lane| lane.state != LaneState::Idle).count();
        for lane in &mut connection.lanes {
            lane.state = LaneState::Idle;
        }
        self.active -= lost;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_uncontended_key_names_its_lane_only_while_its_request_is_out() {
        let (key_first, lane_span) = (1_000, 10);
        let idle = Lane { state: LaneState::Idle, op: PendingOp::Acquire, key: 0, token: 0, sent_ns: 0, first_ns: 0 };
        let mut lanes = vec![idle; 4];
        for (lane, state) in lanes.iter_mut().enumerate() {
            // The last key of each lane's slice.
            let key = key_first + lane as u64 * lane_span + lane_span - 1;
            *state = Lane { state: LaneState::InFlight, key, ..idle };
        }
        lanes[2].op = PendingOp::Release;
        lanes[3].state = LaneState::Retrying;
        let find = |op, key| uncontended_lane(&lanes, key_first, lane_span, op, key);
        assert_eq!(find(PendingOp::Acquire, 1_009), Some(0));
        assert_eq!(find(PendingOp::Acquire, 1_019), Some(1));
        assert_eq!(find(PendingOp::Release, 1_029), Some(2));
        // The wrong op, another key of the lane's slice, a lane with nothing
        // out, keys before the first slice and after the last.
        assert_eq!(find(PendingOp::Release, 1_009), None);
        assert_eq!(find(PendingOp::Acquire, 1_008), None);
        assert_eq!(find(PendingOp::Acquire, 1_039), None);
        assert_eq!(find(PendingOp::Acquire, 999), None);
        assert_eq!(find(PendingOp::Acquire, 1_049), None);
        assert_eq!(find(PendingOp::Acquire, u64::MAX), None);
    }
}
