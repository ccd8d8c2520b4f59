//! The event loop of one shard core: an io_uring ring that accepts, reads,
//! parses, runs its shard, and writes replies, with no lock on the hot path.
//!
//! One turn of the loop:
//! 1. submit what is queued and wait for completions, at most until the
//!    shard's next timer deadline (or not at all if the inbox has work);
//! 2. handle completions: new connections, received bytes (parsed in place
//!    from the provided buffer), finished sends, inbox wake-ups;
//! 3. handle the inbox: requests for this core's keys and replies for this
//!    core's connections, sent by other cores;
//! 4. advance the shard to now, so leases and waits that ran out end;
//! 5. start one `send` per connection with output, and send each other core
//!    its batch of messages from this turn.
//!
//! The socket side lives in `sockets.rs`, requests and replies in `dispatch.rs`.
//!
//! # Stopping
//! On SIGINT/SIGTERM every core stops reading requests and reports it; once
//! all have, no new request can appear anywhere, so each core answers what
//! is still queued (`E A <key> shutting-down`), reports again, and exits when
//! every core has and its replies are out (or a flush timeout passed).

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use io_uring::types::{SubmitArgs, Timespec};
use io_uring::{IoUring, cqueue};
use ringlock_proto::ErrorCode;
use ringlock_ring::{BufRing, poll_before_sleep};
use ringlock_shards::{ClientId, HotKeyCounts, Shard, ShardStats};

use crate::connection::Connection;
use crate::per_ip::PerIpConnections;
use crate::role::{ClusterLink, CoreRole, Report};
use crate::router::{Inbox, Mailbox, Message, RoutedRequest};
use crate::stats;
use crate::tokens::TokenAuthority;

/// Submission queue entries per ring.
const RING_ENTRIES: u32 = 4096;
/// Completion queue entries per ring: room for bursts of multishot completions.
pub(crate) const COMPLETION_ENTRIES: u32 = 16384;
/// Receive buffers per core, and their size.
const RECV_BUFFERS: u16 = 512;
const RECV_BUFFER_LEN: usize = 16 << 10;
pub(crate) const RECV_BUFFER_GROUP: u16 = 0;
/// How long a stopping server keeps flushing replies to slow readers.
const STOP_FLUSH_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest a stop may take, even if a core never reports (it failed).
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest sleep of an idle loop, so it notices a stop even without a wake-up.
const IDLE_WAIT_MAX: Duration = Duration::from_millis(500);
/// Longest sleep while stopping, when other cores' progress is awaited.
const STOP_WAIT_MAX: Duration = Duration::from_millis(5);
/// Pause before asking again for tokens after the epoch could not be persisted.
pub(crate) const TOKEN_RETRY_MS: u64 = 1000;
/// Shortest time between two copies of the shard's hot keys for `S` and
/// `/metrics`: a copy allocates, so it is not made every turn.
const HOT_KEYS_PUBLISH_MS: u64 = 250;

/// What a completion is for, in the top byte of its user data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    Accept = 1,
    Recv = 2,
    Send = 3,
    Wake = 4,
    Ignored = 5,
}

pub(crate) fn user_data(kind: Kind, slot: u32, generation: u32) -> u64 {
    (kind as u64) << 56 | u64::from(slot) << 32 | u64::from(generation)
}

fn split_user_data(data: u64) -> (u8, u32, u32) {
    ((data >> 56) as u8, ((data >> 32) & 0xff_ffff) as u32, data as u32)
}

/// A client id: the core in the top byte, then the connection slot and its generation.
pub(crate) fn client_id(core: usize, slot: u32, generation: u32) -> ClientId {
    ClientId((core as u64) << 56 | u64::from(slot) << 32 | u64::from(generation))
}

pub(crate) fn split_client_id(client: ClientId) -> (usize, u32, u32) {
    ((client.0 >> 56) as usize, ((client.0 >> 32) & 0xff_ffff) as u32, client.0 as u32)
}

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
    pub stop: AtomicBool,
    /// A stop signal came: `/readyz` answers 503 from now on (the cores may
    /// still serve, during `--drain-ms` or a hand-off).
    pub stopping: AtomicBool,
    /// Cores that read no more requests since the stop began.
    pub stopped_reading: AtomicUsize,
    /// Cores that have answered every queued acquire after all stopped reading.
    pub drained: AtomicUsize,
    /// Each core's latest counters, for `S`.
    pub stats: Vec<Mutex<stats::CoreStats>>,
    pub started: Instant,
    /// The link to the replication core, in a cluster.
    pub cluster: Option<ClusterLink>,
}

impl Shared {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }
}

/// How the ring was set up, for the start-up log line.
pub fn ring_mode_name(defer_taskrun: bool) -> &'static str {
    if defer_taskrun {
        "single-issuer + defer-taskrun"
    } else {
        "plain (this kernel refused single-issuer + defer-taskrun)"
    }
}

/// Builds a ring with `SINGLE_ISSUER | DEFER_TASKRUN` where the kernel allows,
/// and a plain one otherwise. Must run on the thread that will use it.
pub fn build_ring() -> io::Result<(IoUring, bool)> {
    let mut builder = IoUring::builder();
    builder.setup_single_issuer().setup_defer_taskrun().setup_cqsize(COMPLETION_ENTRIES);
    if let Ok(ring) = builder.build(RING_ENTRIES) {
        return Ok((ring, true));
    }
    let ring = IoUring::builder().setup_cqsize(COMPLETION_ENTRIES).build(RING_ENTRIES)?;
    Ok((ring, false))
}

/// Where a stop stands on this core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StopPhase {
    Running,
    /// Reads no more requests; reports once its batches are out.
    Reading,
    /// Reported; answers what is queued once every core has stopped reading.
    Draining,
    /// Reported drained; exits once every core has and replies are out.
    Drained,
}

/// Everything but the shard and the receive buffers, so that both can be
/// borrowed next to it.
pub(crate) struct Io {
    pub(crate) ring: IoUring,
    pub(crate) core: usize,
    pub(crate) cores: usize,
    pub(crate) shared: Arc<Shared>,
    /// This core's copy of the address `P` names.
    pub(crate) advertised: String,
    pub(crate) listener: RawFd,
    pub(crate) connections: Vec<Connection>,
    pub(crate) free_slots: Vec<u32>,
    /// Connections with output to send this turn.
    pub(crate) dirty: Vec<u32>,
    /// Paused connections to try again once their replies drain, or once
    /// their requests in flight are below the limit again.
    pub(crate) resumable: Vec<u32>,
    /// Messages for each core, sent at the end of the turn.
    pub(crate) outgoing: Vec<Vec<Message>>,
    /// Batches a full inbox refused, sent again next turn.
    pub(crate) refused: Vec<Vec<Message>>,
    pub(crate) need_tokens: bool,
    pub(crate) token_retry_at_ms: Option<u64>,
    /// Connections open on this core (not closing).
    pub(crate) open: u64,
    pub(crate) now_ms: u64,
    pub(crate) accept_armed: bool,
    pub(crate) accept_retry_at_ms: Option<u64>,
    pub(crate) stopping: bool,
    /// Counters of errors found before a request reaches a shard.
    pub(crate) errors: [u64; ErrorCode::ALL.len()],
    /// Connections refused by `--max-connections-per-ip`.
    pub(crate) refused_per_ip: u64,
    /// Connections refused by `--max-connections` or a full core.
    pub(crate) refused_max_connections: u64,
    /// Connections refused while stopping.
    pub(crate) refused_shutting_down: u64,
    /// Connections this core has served.
    pub(crate) accepted: u64,
    /// Replies written by this core, by operation and result.
    pub(crate) requests: stats::RequestCounters,
    /// Times a connection stopped being read at the in-flight limit.
    pub(crate) in_flight_pauses: u64,
    pub(crate) eventfd: RawFd,
    pub(crate) wake_buffer: Box<u64>,
    pub(crate) wake_armed: bool,
    /// What this core does with requests for its keys.
    pub(crate) role: CoreRole,
    /// The address `M` replies name (standby), if an active is known.
    pub(crate) active_address: Option<Vec<u8>>,
    /// Requests held while the role is [`CoreRole::Held`], in arrival order.
    pub(crate) parked: Vec<(ClientId, RoutedRequest)>,
    /// Reports the replication core's full queue refused, sent first next turn.
    pub(crate) reports: std::collections::VecDeque<Report>,
}

impl Io {
    fn all_sent(&self) -> bool {
        self.outgoing.iter().all(Vec::is_empty) && self.refused.iter().all(Vec::is_empty)
    }

    /// Queues the deltas the shard made so far as one report, after the
    /// earlier ones.
    pub(crate) fn queue_deltas(&mut self, shard: &mut Shard) {
        if shard.has_deltas() {
            let empty = self.shared.cluster.as_ref().map(ClusterLink::delta_buffer).unwrap_or_default();
            self.reports.push_back(Report::Deltas(shard.take_deltas(empty)));
        }
    }

    /// Sends this turn's deltas and any earlier reports to the replication
    /// core, in order; what its full queue refuses waits for the next turn.
    pub(crate) fn send_reports(&mut self, shard: &mut Shard) {
        // A single node makes no deltas, so this queues nothing there.
        self.queue_deltas(shard);
        let Some(link) = &self.shared.cluster else { return };
        while let Some(report) = self.reports.pop_front() {
            if let Err(report) = link.report(report) {
                self.reports.push_front(report);
                break;
            }
        }
    }

    pub(crate) fn count_error(&mut self, code: ErrorCode) {
        if let Some(index) = code.index() {
            self.errors[index] += 1;
        }
    }
}

/// One shard core.
pub struct EventLoop {
    pub(crate) io: Io,
    pub(crate) shard: Shard,
    pub(crate) buffers: BufRing,
    pub(crate) inbox: Inbox,
    completions: Vec<(u64, i32, u32)>,
    /// The hot-key events and the time of the last copy of the hot keys.
    hot_keys_published: (u64, u64),
    /// The last copy named some key, so it is made again as they age out.
    hot_keys_listed: bool,
}

impl EventLoop {
    /// Sets up the loop of core `core` on a ring built by [`build_ring`] on
    /// this thread.
    pub fn new(
        ring: IoUring,
        core: usize,
        shared: Arc<Shared>,
        shard: Shard,
        listener: RawFd,
        inbox: Inbox,
    ) -> io::Result<EventLoop> {
        let buffers = BufRing::register(&ring, RECV_BUFFER_GROUP, RECV_BUFFERS, RECV_BUFFER_LEN)?;
        let cores = shared.mailboxes.len();
        let eventfd = inbox.eventfd;
        let advertised = shared.advertised.clone();
        // In a cluster every node starts as a standby that knows no active.
        let role = if shared.cluster.is_some() { CoreRole::Standby } else { CoreRole::Active };
        Ok(EventLoop {
            io: Io {
                ring,
                core,
                cores,
                shared,
                advertised,
                listener,
                connections: Vec::new(),
                free_slots: Vec::new(),
                dirty: Vec::new(),
                resumable: Vec::new(),
                outgoing: (0..cores).map(|_| Vec::new()).collect(),
                refused: (0..cores).map(|_| Vec::new()).collect(),
                need_tokens: false,
                token_retry_at_ms: None,
                open: 0,
                now_ms: 0,
                accept_armed: false,
                accept_retry_at_ms: None,
                stopping: false,
                errors: [0; ErrorCode::ALL.len()],
                refused_per_ip: 0,
                refused_max_connections: 0,
                refused_shutting_down: 0,
                accepted: 0,
                requests: stats::RequestCounters::default(),
                in_flight_pauses: 0,
                eventfd,
                wake_buffer: Box::new(0),
                wake_armed: false,
                role,
                active_address: None,
                parked: Vec::new(),
                reports: std::collections::VecDeque::new(),
            },
            shard,
            buffers,
            inbox,
            completions: Vec::with_capacity(COMPLETION_ENTRIES as usize),
            hot_keys_published: (0, 0),
            hot_keys_listed: false,
        })
    }

    /// Runs until the server stops; returns once every reply is flushed (or
    /// the flush timeout passed) and every connection is closed.
    pub fn run(mut self) -> io::Result<()> {
        self.io.now_ms = self.io.shared.now_ms();
        self.io.arm_accept();
        self.io.arm_wake();
        self.handle_effects();
        let mut phase = StopPhase::Running;
        let mut stop_started = Instant::now();
        loop {
            self.wait(phase != StopPhase::Running)?;
            self.io.now_ms = self.io.shared.now_ms();
            self.handle_completions();
            self.handle_inbox();
            // A held core lets no lease or wait run out until the hand-off ends.
            if self.io.role != CoreRole::Held {
                self.shard.advance(self.io.now_ms);
            }
            self.retry_tokens();
            self.handle_effects();
            // Grants and timeouts of this turn may have brought connections
            // below the in-flight limit: they are read again before the sleep.
            self.resume_paused();
            if phase == StopPhase::Running && self.io.shared.stop.load(Ordering::SeqCst) {
                phase = StopPhase::Reading;
                stop_started = Instant::now();
                self.io.begin_stop();
            }
            if phase == StopPhase::Draining && !self.io.parked.is_empty() {
                // Stopping after a hand-off that failed or was cut short: the
                // successor may have taken over all the same, so nothing held
                // is served here; every held request is answered
                // `shutting-down` (it had no effect), in order with the rest.
                self.refuse_parked(ErrorCode::ShuttingDown);
            }
            if phase == StopPhase::Draining && self.shard.stats().waiters > 0 {
                self.shard.fail_waiters(self.io.now_ms, ErrorCode::ShuttingDown);
                self.handle_effects();
            }
            self.io.retry_accept();
            self.io.flush();
            self.io.send_reports(&mut self.shard);
            self.buffers.publish();
            self.publish_stats();

            let cores = self.io.cores;
            match phase {
                StopPhase::Running => {}
                StopPhase::Reading => {
                    // Once this core's batches are out, every request it will
                    // ever route is in its target's inbox.
                    if self.io.all_sent() {
                        self.io.shared.stopped_reading.fetch_add(1, Ordering::SeqCst);
                        phase = StopPhase::Draining;
                    }
                }
                StopPhase::Draining => {
                    let everyone_stopped = self.io.shared.stopped_reading.load(Ordering::SeqCst) == cores;
                    if everyone_stopped
                        && self.inbox.receiver.is_empty()
                        && self.io.all_sent()
                        && self.shard.stats().waiters == 0
                    {
                        // Every reply this core owes another core is in that
                        // core's inbox now.
                        self.io.shared.drained.fetch_add(1, Ordering::SeqCst);
                        phase = StopPhase::Drained;
                    }
                }
                StopPhase::Drained => {
                    let everyone_drained = self.io.shared.drained.load(Ordering::SeqCst) == cores;
                    let flushed = self.io.connections.iter().all(|c| c.fd < 0 || c.closing || c.flushed());
                    if everyone_drained
                        && self.inbox.receiver.is_empty()
                        && self.io.all_sent()
                        && (flushed || stop_started.elapsed() > STOP_FLUSH_TIMEOUT)
                    {
                        self.io.close_all();
                        return Ok(());
                    }
                }
            }
            if phase != StopPhase::Running && stop_started.elapsed() > STOP_TIMEOUT {
                tracing::warn!(core = self.io.core, "stop timed out waiting for the other cores; exiting");
                self.io.close_all();
                return Ok(());
            }
        }
    }

    /// Submits and sleeps until a completion, the next deadline, or a wake-up.
    fn wait(&mut self, stopping: bool) -> io::Result<()> {
        // How long an idle loop keeps asking for completions before it
        // sleeps (see `ringlock_ring::poll_before_sleep`): under load the next requests arrive
        // within microseconds of the last replies. The cost is at most this
        // much spinning before each sleep.
        const POLL_BEFORE_SLEEP: Duration = Duration::from_micros(30);
        let asleep = &self.inbox.asleep;
        asleep.store(true, Ordering::SeqCst);
        let busy = !self.inbox.receiver.is_empty()
            || !self.io.ring.completion().is_empty()
            || self.io.refused.iter().any(|batch| !batch.is_empty())
            || !self.io.reports.is_empty();
        if !busy && !stopping {
            // The sends of this turn go out first.
            let receiver = &self.inbox.receiver;
            match poll_before_sleep(&mut self.io.ring, POLL_BEFORE_SLEEP, || !receiver.is_empty()) {
                Ok(true) => {
                    asleep.store(false, Ordering::SeqCst);
                    return Ok(());
                }
                Ok(false) => {}
                Err(error) => {
                    asleep.store(false, Ordering::SeqCst);
                    return Err(error);
                }
            }
        }
        let mut wait = if busy { Duration::ZERO } else { IDLE_WAIT_MAX };
        if stopping {
            wait = wait.min(STOP_WAIT_MAX);
        }
        let now = self.io.shared.now_ms();
        let deadlines = [self.shard.next_deadline_ms(), self.io.accept_retry_at_ms, self.io.token_retry_at_ms];
        for deadline in deadlines.into_iter().flatten() {
            wait = wait.min(Duration::from_millis(deadline.saturating_sub(now)));
        }
        // Even a zero timeout asks for completions, which a defer-taskrun
        // ring only posts when asked.
        let timespec = Timespec::from(wait);
        let args = SubmitArgs::new().timespec(&timespec);
        let result = self.io.ring.submitter().submit_with_args(1, &args);
        asleep.store(false, Ordering::SeqCst);
        match result {
            Ok(_) => Ok(()),
            Err(error) if matches!(error.raw_os_error(), Some(libc::ETIME | libc::EINTR | libc::EBUSY)) => Ok(()),
            Err(error) => Err(error),
        }
    }

    fn handle_completions(&mut self) {
        let mut completions = std::mem::take(&mut self.completions);
        completions.extend(self.io.ring.completion().map(|cqe| (cqe.user_data(), cqe.result(), cqe.flags())));
        for &(data, result, flags) in &completions {
            let (kind, slot, generation) = split_user_data(data);
            match kind {
                k if k == Kind::Accept as u8 => self.io.accepted(result, flags),
                k if k == Kind::Recv as u8 => self.received(slot, generation, result, flags),
                k if k == Kind::Send as u8 => self.sent(slot, generation, result),
                k if k == Kind::Wake as u8 => {
                    self.io.wake_armed = false;
                    self.io.arm_wake();
                }
                _ => {}
            }
        }
        completions.clear();
        self.completions = completions;
    }

    fn received(&mut self, slot: u32, generation: u32, result: i32, flags: u32) {
        let buffer = cqueue::buffer_select(flags);
        let Some(connection) = self.io.connection(slot, generation) else {
            if let Some(id) = buffer {
                self.buffers.push(id);
            }
            return;
        };
        if !cqueue::more(flags) {
            connection.recv_armed = false;
        }
        if let Some(id) = buffer {
            if result > 0 {
                let data = self.buffers.get(id, result as usize);
                self.io.input(&mut self.shard, slot, data);
            }
            self.buffers.push(id);
        }
        match result {
            0 => {
                // End of input: answer what was sent, then close.
                self.io.connections[slot as usize].eof = true;
                self.io.finish_input(&mut self.shard, slot);
            }
            error if error < 0 && error != -libc::ENOBUFS && error != -libc::ECANCELED => {
                self.io.kill(&mut self.shard, slot);
            }
            _ => {}
        }
        self.handle_effects();
        self.io.maybe_rearm_recv(slot);
        self.io.maybe_finish(slot);
    }

    fn sent(&mut self, slot: u32, generation: u32, result: i32) {
        let Some(connection) = self.io.connection(slot, generation) else { return };
        if result < 0 {
            connection.send_in_flight = false;
            self.io.kill(&mut self.shard, slot);
        } else if connection.sent_bytes(result as usize) {
            let (pointer, len) = connection.unsent();
            let fd = connection.fd;
            self.io.push(crate::sockets::send_entry(fd, pointer, len, slot, generation));
        } else {
            let paused = connection.reading && (!connection.input.is_empty() || !connection.recv_armed);
            self.io.mark_dirty(slot);
            if paused {
                self.io.resumable.push(slot);
                self.resume_paused();
            }
        }
        self.io.maybe_finish(slot);
    }

    /// Parses what paused connections kept, now that their replies drained.
    pub(crate) fn resume_paused(&mut self) {
        while let Some(slot) = self.io.resumable.pop() {
            let connection = &mut self.io.connections[slot as usize];
            if connection.fd < 0 || connection.closing || connection.is_paused() {
                continue;
            }
            if connection.reading && !connection.input.is_empty() {
                let input = std::mem::take(&mut connection.input);
                let consumed = self.io.parse(&mut self.shard, slot, &input);
                let connection = &mut self.io.connections[slot as usize];
                if connection.reading {
                    let mut rest = input;
                    rest.drain(..consumed);
                    connection.input = rest;
                }
            }
            if self.io.connections[slot as usize].eof {
                self.io.finish_input(&mut self.shard, slot);
            }
            self.handle_effects();
            self.io.maybe_rearm_recv(slot);
            self.io.maybe_finish(slot);
        }
    }

    /// After the epoch could not be persisted, asks for tokens again now and then.
    fn retry_tokens(&mut self) {
        if let Some(at) = self.io.token_retry_at_ms
            && self.io.now_ms >= at
        {
            self.io.token_retry_at_ms = None;
            self.shard.token_request_lost();
        }
    }

    fn publish_stats(&mut self) {
        let mut stats = self.shard.stats().clone();
        for (sum, count) in stats.errors.iter_mut().zip(self.io.errors) {
            *sum += count;
        }
        let hot_keys = self.hot_keys_to_publish();
        if let Ok(mut published) = self.io.shared.stats[self.io.core].lock() {
            published.shard = stats;
            published.connections = self.io.open;
            published.refused_per_ip = self.io.refused_per_ip;
            published.refused_max_connections = self.io.refused_max_connections;
            published.refused_shutting_down = self.io.refused_shutting_down;
            published.accepted = self.io.accepted;
            published.in_flight_pauses = self.io.in_flight_pauses;
            published.requests = self.io.requests;
            if let Some((waits, handoffs)) = hot_keys {
                published.hot_waits = waits;
                published.hot_handoffs = handoffs;
            }
        }
    }

    /// A fresh copy of the shard's hot keys, if they may have changed (or
    /// aged out) and the last copy is old enough.
    fn hot_keys_to_publish(&mut self) -> Option<(HotKeyCounts, HotKeyCounts)> {
        let (events_published, published_ms) = self.hot_keys_published;
        let events = self.shard.hot_key_events();
        let now_ms = self.io.now_ms;
        if now_ms < published_ms + HOT_KEYS_PUBLISH_MS || (events == events_published && !self.hot_keys_listed) {
            return None;
        }
        let (waits, handoffs) = self.shard.hot_keys(now_ms);
        self.hot_keys_listed = !waits.is_empty() || !handoffs.is_empty();
        self.hot_keys_published = (events, now_ms);
        Some((waits, handoffs))
    }
}

/// Gathers every core's counters.
pub fn total_stats(shared: &Shared) -> (Vec<stats::CoreStats>, ShardStats) {
    let cores: Vec<stats::CoreStats> =
        shared.stats.iter().map(|core| core.lock().map(|c| c.clone()).unwrap_or_default()).collect();
    let mut total = ShardStats::default();
    for core in &cores {
        total.add(&core.shard);
    }
    (cores, total)
}
