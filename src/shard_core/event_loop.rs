//! The event loop of one shard core: an io_uring ring that accepts, reads,
//! parses, runs its shard, and writes replies, with no lock on the hot path.
//!
//! One turn of the loop ([`EventLoop::run`]):
//! 1. submit what is queued and wait for completions, at most until the
//!    shard's next timer deadline (or not at all if the inbox has work);
//! 2. handle completions: new connections, received bytes (parsed in place
//!    from the provided buffer, up to a share of requests per connection
//!    per turn; the rest waits for the next turn, which then starts without
//!    sleeping), finished sends, inbox wake-ups;
//! 3. handle the inbox: requests for this core's keys and replies for this
//!    core's connections, sent by other cores;
//! 4. advance the shard to now, so leases and waits that ran out end;
//! 5. start one `send` per connection with output, and send each other core
//!    its batch of messages from this turn; a turn that parsed requests
//!    tells the dispatcher how long it took, which sets the next turns'
//!    shares (`dispatcher/pacing.rs`).
//!
//! The loop is the shell around the core's [`Dispatcher`], which decides
//! everything about connections and requests: the loop feeds it what the
//! ring and the inbox bring and carries out what it asks (sends, receives
//! stopped or started, closes, batches for other cores, token calls). The
//! shell's state lives in `state.rs`, the socket side in `sockets.rs`, and
//! the replication core's orders and the token calls in `control.rs`.
//!
//! # Stopping
//! On SIGINT/SIGTERM every core stops reading requests and reports it; once
//! all have, no new request can appear anywhere, so each core answers what
//! is still queued (`E A <key> shutting-down`), reports again, and exits when
//! every core has and its replies are out (or a flush timeout passed).

use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use io_uring::IoUring;
use io_uring::types::{SubmitArgs, Timespec};
use ringlock_proto::ErrorCode;
use ringlock_ring::{BufRing, poll_before_sleep};
use ringlock_shards::{HotKeyCounts, Shard};

use crate::node::role::CoreRole;
use crate::node::shared::Shared;
use crate::shard_core::dispatcher::{Dispatcher, Settings, SocketEffect};
use crate::shard_core::mailbox::{CoreMessage, Inbox};
use crate::shard_core::ring::{
    COMPLETION_ENTRIES, Kind, RECV_BUFFER_GROUP, RECV_BUFFER_LEN, RECV_BUFFERS, split_user_data,
};
use crate::shard_core::state::{CoreState, SharedView};

/// How long a stopping server keeps flushing replies to slow readers.
const STOP_FLUSH_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest a stop may take, even if a core never reports (it failed).
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest sleep of an idle loop, so it notices a stop even without a wake-up.
const IDLE_WAIT_MAX: Duration = Duration::from_millis(500);
/// Longest sleep while stopping, when other cores' progress is awaited.
const STOP_WAIT_MAX: Duration = Duration::from_millis(5);
/// Shortest time between two copies of the shard's hot keys for `S` and
/// `/metrics`: a copy allocates, so it is not made every turn.
const HOT_KEYS_PUBLISH_MS: u64 = 250;

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

/// One shard core.
pub struct EventLoop {
    pub(crate) state: CoreState,
    pub(crate) dispatcher: Dispatcher,
    pub(crate) buffers: BufRing,
    /// The dispatcher's socket effects being carried out, kept to reuse its memory.
    pub(crate) socket_effects: Vec<SocketEffect>,
    pub(crate) inbox: Inbox,
    completions: Vec<(u64, i32, u32)>,
    /// The generation of the auth file in force here (see `SharedAuth`).
    auth_generation: u64,
    /// The hot-key events and the time of the last copy of the hot keys.
    hot_keys_published: (u64, u64),
    /// The last copy named some key, so it is made again as they age out.
    hot_keys_listed: bool,
    /// When this turn began, from the node's start.
    turn_started: Duration,
}

impl EventLoop {
    /// Sets up the loop of core `core` on a ring built by [`build_ring`](super::build_ring) on
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
        // In a cluster every node starts as a standby that knows no active.
        let role = if shared.cluster.is_some() { CoreRole::Standby } else { CoreRole::Active };
        let view = Box::new(SharedView { shared: shared.clone() });
        let (auth_generation, auth) = match &shared.auth {
            Some(auth) => {
                let (generation, table) = auth.current();
                (generation, Some(table))
            }
            None => (0, None),
        };
        let settings = Settings { core, cores, lease_ms_max: shared.lease_ms_max, limits: shared.connection_limits };
        let mut dispatcher = Dispatcher::new(settings, shard, view, role, auth);
        dispatcher.set_auth_failures(shared.auth_failures.clone());
        if shared.cluster.as_ref().is_some_and(|link| link.min_standbys > 0) {
            dispatcher.hold_grants_until_acknowledged();
        }
        Ok(EventLoop {
            state: CoreState {
                ring,
                core,
                cores,
                shared,
                listener,
                sockets: Vec::new(),
                flush: Vec::new(),
                tls_flush: Vec::new(),
                plain: Vec::new(),
                refused: (0..cores).map(|_| Vec::new()).collect(),
                token_retry_at_ms: None,
                now_ms: 0,
                accept_armed: false,
                accept_retry_at_ms: None,
                stopping: false,
                refused_per_ip: 0,
                refused_max_connections: 0,
                refused_shutting_down: 0,
                refusal_errors: [0; ErrorCode::ALL.len()],
                accepted: 0,
                tls_errors: 0,
                greetings: std::collections::VecDeque::new(),
                eventfd,
                wake_buffer: Box::new(0),
                wake_armed: false,
                reports: std::collections::VecDeque::new(),
            },
            dispatcher,
            buffers,
            socket_effects: Vec::new(),
            inbox,
            completions: Vec::with_capacity(COMPLETION_ENTRIES as usize),
            auth_generation,
            hot_keys_published: (0, 0),
            hot_keys_listed: false,
            turn_started: Duration::ZERO,
        })
    }

    /// Runs until the server stops; returns once every reply is flushed (or
    /// the flush timeout passed) and every connection is closed.
    pub fn run(mut self) -> io::Result<()> {
        self.set_now();
        self.state.arm_accept();
        self.state.arm_wake();
        self.supply_tokens();
        // Before the first turn, so that /metrics shows this core's settings.
        self.publish_stats();
        let mut phase = StopPhase::Running;
        let mut stop_started = Instant::now();
        loop {
            self.wait(phase != StopPhase::Running)?;
            self.serve();
            if phase == StopPhase::Running && self.state.shared.stop.load(Ordering::SeqCst) {
                phase = StopPhase::Reading;
                stop_started = Instant::now();
                self.state.stop_accepting();
                self.dispatcher.stop();
            }
            if phase == StopPhase::Draining {
                self.dispatcher.refuse_queued();
                self.apply_socket_effects();
            }
            self.end_turn();
            self.pace();
            match self.next_stop_phase(phase, stop_started) {
                Some(next) => phase = next,
                None => {
                    self.state.close_all();
                    return Ok(());
                }
            }
        }
    }

    /// Steps 2 to 4 of a turn: what the ring and the inbox brought, the
    /// shard advanced to now, and what that made possible.
    fn serve(&mut self) {
        self.set_now();
        self.reload_auth();
        self.handle_completions();
        self.handle_inbox();
        // Connections that used their share of the last turn with lines
        // left go on now, each with this turn's share.
        self.dispatcher.serve_deferred();
        self.dispatcher.advance();
        self.expire_greetings();
        self.retry_tokens();
        self.supply_tokens();
        // Grants and timeouts of this turn may have brought connections
        // below the in-flight limit: they are read again before the sleep.
        self.dispatcher.resume_paused();
        self.apply_socket_effects();
    }

    /// Takes a reloaded auth file, once a turn at most (one atomic read).
    fn reload_auth(&mut self) {
        let Some(auth) = &self.state.shared.auth else { return };
        if auth.generation.load(std::sync::atomic::Ordering::Acquire) == self.auth_generation {
            return;
        }
        let (generation, table) = auth.current();
        self.auth_generation = generation;
        self.dispatcher.set_auth(Some(table));
        self.apply_socket_effects();
    }

    /// Reads the clock once for the turn, for the shell and the dispatcher.
    fn set_now(&mut self) {
        self.turn_started = self.state.shared.started.elapsed();
        self.state.now_ms = self.turn_started.as_millis() as u64;
        self.dispatcher.set_now(self.state.now_ms);
    }

    /// Tells the dispatcher how long a turn that parsed requests took, for
    /// the next turns' shares (a second clock read, only in turns that
    /// count).
    fn pace(&mut self) {
        if !self.dispatcher.turn_counts() {
            return;
        }
        let elapsed = self.state.shared.started.elapsed().saturating_sub(self.turn_started);
        self.dispatcher.turn_ended(elapsed.as_nanos() as u64);
    }

    /// Step 5 of a turn: sends, batches for other cores, reports for the
    /// replication core, receive buffers given back, counters published.
    fn end_turn(&mut self) {
        self.state.retry_accept();
        self.flush();
        // A single node makes no deltas, so this queues nothing there.
        self.queue_deltas();
        self.state.send_reports();
        self.buffers.publish();
        self.publish_stats();
    }

    /// Where the stop stands after this turn; `None` once the loop may exit
    /// (or the stop took too long).
    fn next_stop_phase(&mut self, phase: StopPhase, stop_started: Instant) -> Option<StopPhase> {
        let cores = self.state.cores;
        let shared = &self.state.shared;
        let next = match phase {
            StopPhase::Running => StopPhase::Running,
            // Once this core's batches are out, every request it will ever
            // route is in its target's inbox.
            StopPhase::Reading if self.state.all_refused_sent() && self.dispatcher.outgoing_empty() => {
                shared.stopped_reading.fetch_add(1, Ordering::SeqCst);
                StopPhase::Draining
            }
            StopPhase::Draining
                if shared.stopped_reading.load(Ordering::SeqCst) == cores
                    && self.inbox.receiver.is_empty()
                    && self.state.all_refused_sent()
                    && self.dispatcher.outgoing_empty()
                    && self.dispatcher.shard().stats().waiters == 0 =>
            {
                // Every reply this core owes another core is in that core's
                // inbox now.
                shared.drained.fetch_add(1, Ordering::SeqCst);
                StopPhase::Drained
            }
            StopPhase::Drained => {
                let everyone_drained = shared.drained.load(Ordering::SeqCst) == cores;
                let flushed = self.dispatcher.all_flushed();
                if everyone_drained
                    && self.inbox.receiver.is_empty()
                    && self.state.all_refused_sent()
                    && self.dispatcher.outgoing_empty()
                    && (flushed || stop_started.elapsed() > STOP_FLUSH_TIMEOUT)
                {
                    return None;
                }
                StopPhase::Drained
            }
            phase => phase,
        };
        if next != StopPhase::Running && stop_started.elapsed() > STOP_TIMEOUT {
            tracing::warn!(core = self.state.core, "stop timed out waiting for the other cores; exiting");
            return None;
        }
        Some(next)
    }

    /// Step 3 of a turn: what other cores and the replication core sent.
    fn handle_inbox(&mut self) {
        while let Ok(batch) = self.inbox.receiver.try_recv() {
            for message in batch {
                match message {
                    CoreMessage::Control(control) => self.control(control),
                    CoreMessage::Adopt { fd, peer_ip } => self.adopt(fd, peer_ip),
                    message => self.dispatcher.handle_message(message),
                }
                self.supply_tokens();
            }
        }
        self.dispatcher.resume_paused();
        self.apply_socket_effects();
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
            || self.dispatcher.has_deferred()
            || !self.state.ring.completion().is_empty()
            || !self.state.all_refused_sent()
            || !self.state.reports.is_empty();
        if !busy && !stopping {
            // The sends of this turn go out first.
            let receiver = &self.inbox.receiver;
            match poll_before_sleep(&mut self.state.ring, POLL_BEFORE_SLEEP, || !receiver.is_empty()) {
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
        let now = self.state.shared.now_ms();
        let deadlines = [
            self.dispatcher.next_deadline_ms(),
            self.state.accept_retry_at_ms,
            self.state.token_retry_at_ms,
            self.state.greetings.front().map(|&(at, ..)| at),
        ];
        for deadline in deadlines.into_iter().flatten() {
            wait = wait.min(Duration::from_millis(deadline.saturating_sub(now)));
        }
        // Even a zero timeout asks for completions, which a defer-taskrun
        // ring only posts when asked.
        let timespec = Timespec::from(wait);
        let args = SubmitArgs::new().timespec(&timespec);
        let result = self.state.ring.submitter().submit_with_args(1, &args);
        asleep.store(false, Ordering::SeqCst);
        match result {
            Ok(_) => Ok(()),
            Err(error) if matches!(error.raw_os_error(), Some(libc::ETIME | libc::EINTR | libc::EBUSY)) => Ok(()),
            Err(error) => Err(error),
        }
    }

    fn handle_completions(&mut self) {
        let mut completions = std::mem::take(&mut self.completions);
        completions.extend(self.state.ring.completion().map(|cqe| (cqe.user_data(), cqe.result(), cqe.flags())));
        for &(data, result, flags) in &completions {
            let (kind, slot, generation) = split_user_data(data);
            match kind {
                k if k == Kind::Accept as u8 => self.accepted(result, flags),
                k if k == Kind::Recv as u8 => self.received(slot, generation, result, flags),
                k if k == Kind::Send as u8 => self.sent(slot, generation, result),
                k if k == Kind::Wake as u8 => {
                    self.state.wake_armed = false;
                    self.state.arm_wake();
                }
                _ => {}
            }
        }
        completions.clear();
        self.completions = completions;
    }

    fn publish_stats(&mut self) {
        let mut stats = self.dispatcher.shard().stats().clone();
        let counters = self.dispatcher.counters();
        for ((sum, count), refused) in stats.errors.iter_mut().zip(counters.errors).zip(self.state.refusal_errors) {
            *sum += count + refused;
        }
        let (requests, in_flight_pauses) = (counters.requests, counters.in_flight_pauses);
        let (auth_failures, auth_revocations) = (counters.auth_failures, counters.auth_revocations);
        let (output_squeezes, output_stall_closes) = (counters.output_squeezes, counters.output_stall_closes);
        let hot_keys = self.hot_keys_to_publish();
        if let Ok(mut published) = self.state.shared.stats[self.state.core].lock() {
            published.shard = stats;
            published.connections = self.dispatcher.open_connections();
            published.refused_per_ip = self.state.refused_per_ip;
            published.refused_max_connections = self.state.refused_max_connections;
            published.refused_shutting_down = self.state.refused_shutting_down;
            published.accepted = self.state.accepted;
            published.in_flight_pauses = in_flight_pauses;
            published.requests = requests;
            published.auth_failures = auth_failures;
            published.auth_revocations = auth_revocations;
            published.output_squeezes = output_squeezes;
            published.output_stall_closes = output_stall_closes;
            published.tls_errors = self.state.tls_errors;
            (published.turn_share, published.request_cost_ns) = self.dispatcher.pacing();
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
        let events = self.dispatcher.shard().hot_key_events();
        let now_ms = self.state.now_ms;
        if now_ms < published_ms + HOT_KEYS_PUBLISH_MS || (events == events_published && !self.hot_keys_listed) {
            return None;
        }
        let (waits, handoffs) = self.dispatcher.shard_mut().hot_keys(now_ms);
        self.hot_keys_listed = !waits.is_empty() || !handoffs.is_empty();
        self.hot_keys_published = (events, now_ms);
        Some((waits, handoffs))
    }
}
