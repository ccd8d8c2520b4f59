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

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use io_uring::types::{Fd, SubmitArgs, Timespec};
use io_uring::{IoUring, cqueue, opcode, squeue};
use ringlock_client::proto::{Decoded, ErrorCode, Op, Reply, Request, Role, decode_request, encode_reply};
use ringlock_shards::{ClientId, Effect, Key, Shard, ShardReply, ShardStats, shard_of};

use crate::buf_ring::BufRing;
use crate::connection::Connection;
use crate::router::{Inbox, Mailbox, Message, RoutedRequest};
use crate::stats;
use crate::tokens::TokenAuthority;

/// Submission queue entries per ring.
const RING_ENTRIES: u32 = 4096;
/// Completion queue entries per ring: room for bursts of multishot completions.
const COMPLETION_ENTRIES: u32 = 16384;
/// Receive buffers per core, and their size.
const RECV_BUFFERS: u16 = 512;
const RECV_BUFFER_LEN: usize = 16 << 10;
const RECV_BUFFER_GROUP: u16 = 0;
/// Connections per core (slot numbers have 24 bits in a client id).
const CONNECTIONS_PER_CORE_MAX: usize = 1 << 24;
/// How long a stopping server keeps flushing replies to slow readers.
const STOP_FLUSH_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest sleep of an idle loop, so it notices a stop even without a wake-up.
const IDLE_WAIT_MAX: Duration = Duration::from_millis(500);
/// Pause before accepting again after the process ran out of descriptors.
const ACCEPT_RETRY_MS: u64 = 100;

/// What a completion is for, in the top byte of its user data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Kind {
    Accept = 1,
    Recv = 2,
    Send = 3,
    Wake = 4,
    Ignored = 5,
}

fn user_data(kind: Kind, slot: u32, generation: u32) -> u64 {
    (kind as u64) << 56 | u64::from(slot) << 32 | u64::from(generation)
}

fn split_user_data(data: u64) -> (u8, u32, u32) {
    ((data >> 56) as u8, ((data >> 32) & 0xff_ffff) as u32, data as u32)
}

/// A client id: the core in the top byte, then the connection slot and its generation.
fn client_id(core: usize, slot: u32, generation: u32) -> ClientId {
    ClientId((core as u64) << 56 | u64::from(slot) << 32 | u64::from(generation))
}

fn split_client_id(client: ClientId) -> (usize, u32, u32) {
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
    pub stop: AtomicBool,
    /// Cores that have answered their queued acquires since the stop began.
    pub drained: AtomicUsize,
    /// Each core's latest counters, for `S`.
    pub stats: Vec<Mutex<stats::CoreStats>>,
    pub started: Instant,
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

/// Everything but the shard and the receive buffers, so that both can be
/// borrowed next to it.
struct Io {
    ring: IoUring,
    core: usize,
    cores: usize,
    shared: Arc<Shared>,
    listener: RawFd,
    connections: Vec<Connection>,
    free_slots: Vec<u32>,
    /// Connections with output to send this turn.
    dirty: Vec<u32>,
    /// Paused connections to try again once their replies drain.
    resumable: Vec<u32>,
    /// Messages for each core, sent at the end of the turn.
    outgoing: Vec<Vec<Message>>,
    /// Batches a full inbox refused, sent again next turn.
    refused: Vec<Vec<Message>>,
    need_tokens: bool,
    /// Connections open on this core (not closing).
    open: u64,
    now_ms: u64,
    accept_armed: bool,
    accept_retry_at_ms: Option<u64>,
    stopping: bool,
    /// Counters of errors found before a request reaches a shard.
    errors: [u64; ErrorCode::ALL.len()],
    eventfd: RawFd,
    wake_buffer: Box<u64>,
    wake_armed: bool,
}

/// One shard core.
pub struct EventLoop {
    io: Io,
    shard: Shard,
    buffers: BufRing,
    inbox: Inbox,
    completions: Vec<(u64, i32, u32)>,
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
        Ok(EventLoop {
            io: Io {
                ring,
                core,
                cores,
                shared,
                listener,
                connections: Vec::new(),
                free_slots: Vec::new(),
                dirty: Vec::new(),
                resumable: Vec::new(),
                outgoing: (0..cores).map(|_| Vec::new()).collect(),
                refused: (0..cores).map(|_| Vec::new()).collect(),
                need_tokens: false,
                open: 0,
                now_ms: 0,
                accept_armed: false,
                accept_retry_at_ms: None,
                stopping: false,
                errors: [0; ErrorCode::ALL.len()],
                eventfd,
                wake_buffer: Box::new(0),
                wake_armed: false,
            },
            shard,
            buffers,
            inbox,
            completions: Vec::with_capacity(COMPLETION_ENTRIES as usize),
        })
    }

    /// Runs until the server stops; returns once every reply is flushed (or
    /// the flush timeout passed) and every connection is closed.
    pub fn run(mut self) -> io::Result<()> {
        self.io.now_ms = self.io.shared.now_ms();
        self.io.arm_accept();
        self.io.arm_wake();
        self.handle_effects();
        let mut stop_started: Option<Instant> = None;
        let mut drained_reported = false;
        loop {
            self.wait()?;
            self.io.now_ms = self.io.shared.now_ms();
            self.handle_completions();
            self.handle_inbox();
            self.shard.advance(self.io.now_ms);
            self.handle_effects();

            if self.io.shared.stop.load(Ordering::SeqCst) {
                if stop_started.is_none() {
                    stop_started = Some(Instant::now());
                    self.io.begin_stop();
                }
                // Acquires routed here before their core saw the stop may
                // still arrive: answer those too.
                if self.shard.stats().waiters > 0 {
                    self.shard.fail_waiters(self.io.now_ms, ErrorCode::ShuttingDown);
                    self.handle_effects();
                }
            }
            self.io.retry_accept();
            self.io.flush();
            self.buffers.publish();
            self.publish_stats();

            if let Some(started) = stop_started {
                let sent_all = self.io.outgoing.iter().all(Vec::is_empty) && self.io.refused.iter().all(Vec::is_empty);
                if sent_all && !drained_reported {
                    // Every reply this core owes another core is in that
                    // core's inbox now.
                    drained_reported = true;
                    self.io.shared.drained.fetch_add(1, Ordering::SeqCst);
                }
                let everyone_drained = self.io.shared.drained.load(Ordering::SeqCst) == self.io.cores;
                let flushed = self.io.connections.iter().all(|c| c.closing || c.flushed());
                if everyone_drained
                    && self.inbox.receiver.is_empty()
                    && sent_all
                    && (flushed || started.elapsed() > STOP_FLUSH_TIMEOUT)
                {
                    self.io.close_all();
                    return Ok(());
                }
            }
        }
    }

    /// Submits and sleeps until a completion, the next deadline, or a wake-up.
    fn wait(&mut self) -> io::Result<()> {
        let asleep = &self.inbox.asleep;
        asleep.store(true, Ordering::SeqCst);
        let busy = !self.inbox.receiver.is_empty()
            || self.io.shared.stop.load(Ordering::SeqCst)
            || !self.io.ring.completion().is_empty();
        let result = if busy {
            asleep.store(false, Ordering::SeqCst);
            // A zero timeout still asks for completions, which a
            // defer-taskrun ring only posts when asked.
            let timespec = Timespec::new();
            let args = SubmitArgs::new().timespec(&timespec);
            self.io.ring.submitter().submit_with_args(1, &args)
        } else {
            let now = self.io.shared.now_ms();
            let mut wait = IDLE_WAIT_MAX;
            let deadlines = [self.shard.next_deadline_ms(), self.io.accept_retry_at_ms];
            for deadline in deadlines.into_iter().flatten() {
                wait = wait.min(Duration::from_millis(deadline.saturating_sub(now)));
            }
            let timespec = Timespec::from(wait);
            let args = SubmitArgs::new().timespec(&timespec);
            let result = self.io.ring.submitter().submit_with_args(1, &args);
            asleep.store(false, Ordering::SeqCst);
            result
        };
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
        let more = cqueue::more(flags);
        let buffer = cqueue::buffer_select(flags);
        let Some(connection) = self.io.connection(slot, generation) else {
            if let Some(id) = buffer {
                self.buffers.push(id);
            }
            return;
        };
        if !more {
            connection.recv_armed = false;
        }
        if result > 0 {
            let id = buffer.expect("a multishot recv result names its buffer");
            let data = self.buffers.get(id, result as usize);
            self.io.input(&mut self.shard, slot, data);
            self.buffers.push(id);
        } else if let Some(id) = buffer {
            self.buffers.push(id);
        }
        let connection = &mut self.io.connections[slot as usize];
        if result == 0 || (result < 0 && result != -libc::ENOBUFS && result != -libc::ECANCELED) {
            // End of input or a socket error: answer nothing more, send what is
            // ready, then close.
            connection.reading = false;
            self.io.client_gone(&mut self.shard, slot);
        }
        self.handle_effects();
        self.io.maybe_rearm_recv(slot);
        self.io.maybe_finish(slot);
    }

    fn sent(&mut self, slot: u32, generation: u32, result: i32) {
        let Some(connection) = self.io.connection(slot, generation) else { return };
        if result < 0 {
            connection.send_in_flight = false;
            connection.reading = false;
            connection.output.clear();
            connection.sending.clear();
            self.io.client_gone(&mut self.shard, slot);
            self.io.begin_close(slot);
        } else if connection.sent_bytes(result as usize) {
            let (pointer, len) = connection.unsent();
            let fd = connection.fd;
            self.io.push(send_entry(fd, pointer, len, slot, generation));
        } else {
            self.io.mark_dirty(slot);
            self.io.resumable.push(slot);
        }
        self.resume_paused();
        self.io.maybe_finish(slot);
    }

    /// Parses what paused connections kept, now that their replies drained.
    fn resume_paused(&mut self) {
        while let Some(slot) = self.io.resumable.pop() {
            let connection = &mut self.io.connections[slot as usize];
            if connection.closing || connection.is_paused() {
                continue;
            }
            if !connection.input.is_empty() && connection.reading {
                let input = std::mem::take(&mut connection.input);
                let consumed = self.io.parse(&mut self.shard, slot, &input);
                let connection = &mut self.io.connections[slot as usize];
                let mut rest = input;
                rest.drain(..consumed);
                if connection.input.is_empty() {
                    connection.input = rest;
                } else {
                    rest.extend_from_slice(&connection.input);
                    connection.input = rest;
                }
            }
            self.handle_effects();
            self.io.maybe_rearm_recv(slot);
        }
    }

    fn handle_inbox(&mut self) {
        while let Ok(batch) = self.inbox.receiver.try_recv() {
            for message in batch {
                match message {
                    Message::Request { client, request } => {
                        let now = self.io.now_ms;
                        apply(&mut self.shard, now, client, &request);
                    }
                    Message::Reply { client, reply } => self.io.deliver(client, &reply),
                    Message::ClientGone(client) => self.shard.client_gone(self.io.now_ms, client),
                }
                self.handle_effects();
            }
        }
        self.resume_paused();
    }

    /// Routes the shard's effects: replies to connections here or to their
    /// core, token requests to the authority.
    fn handle_effects(&mut self) {
        loop {
            for effect in self.shard.drain_effects() {
                match effect {
                    Effect::Reply { client, reply } => self.io.deliver(client, &reply),
                    // Single node: nobody to replicate to (the shard is set not
                    // to produce deltas).
                    Effect::Delta(_) => {}
                    Effect::NeedTokens => self.io.need_tokens = true,
                }
            }
            if !std::mem::take(&mut self.io.need_tokens) {
                return;
            }
            match self.io.shared.authority.take_range() {
                Ok(range) => {
                    if let Err(error) = self.shard.add_token_range(self.io.now_ms, range) {
                        tracing::error!(core = self.io.core, ?error, "token range refused");
                        self.shard.token_request_lost();
                    }
                }
                Err(error) => {
                    // Without a persisted epoch no token may be issued: acquires
                    // wait, and the operator is told why.
                    tracing::error!(core = self.io.core, "cannot get tokens: {error}");
                    return;
                }
            }
        }
    }

    fn publish_stats(&mut self) {
        let mut stats = self.shard.stats().clone();
        for (sum, count) in stats.errors.iter_mut().zip(self.io.errors) {
            *sum += count;
        }
        if let Ok(mut published) = self.io.shared.stats[self.io.core].lock() {
            published.shard = stats;
            published.connections = self.io.open;
        }
    }
}

/// Runs a routed request on the shard that owns its key.
fn apply(shard: &mut Shard, now_ms: u64, client: ClientId, request: &RoutedRequest) {
    match request {
        RoutedRequest::Acquire { key, lease_ms, wait_ms } => {
            shard.acquire(now_ms, client, key.as_bytes(), *lease_ms, *wait_ms)
        }
        RoutedRequest::Release { key, token } => shard.release(now_ms, client, key.as_bytes(), *token),
        RoutedRequest::Extend { key, token, lease_ms } => {
            shard.extend(now_ms, client, key.as_bytes(), *token, *lease_ms)
        }
        RoutedRequest::Reject { op, key, code } => shard.reject(now_ms, client, *op, key.as_bytes(), *code),
    }
}

fn send_entry(fd: RawFd, pointer: *const u8, len: u32, slot: u32, generation: u32) -> squeue::Entry {
    opcode::Send::new(Fd(fd), pointer, len).flags(libc::MSG_NOSIGNAL).build().user_data(user_data(
        Kind::Send,
        slot,
        generation,
    ))
}

impl Io {
    fn push(&mut self, entry: squeue::Entry) {
        loop {
            // SAFETY: every buffer an entry points to (send buffers, the wake
            // buffer) stays alive and unmoved until its completion arrives.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                return;
            }
            if let Err(error) = self.ring.submit() {
                tracing::warn!(core = self.core, "io_uring submit failed: {error}");
            }
        }
    }

    fn connection(&mut self, slot: u32, generation: u32) -> Option<&mut Connection> {
        self.connections.get_mut(slot as usize).filter(|c| c.generation == generation && c.fd >= 0)
    }

    fn arm_accept(&mut self) {
        if self.accept_armed || self.stopping {
            return;
        }
        let entry = opcode::AcceptMulti::new(Fd(self.listener)).flags(libc::SOCK_CLOEXEC).build().user_data(user_data(
            Kind::Accept,
            0,
            0,
        ));
        self.push(entry);
        self.accept_armed = true;
    }

    fn retry_accept(&mut self) {
        if let Some(at) = self.accept_retry_at_ms
            && self.now_ms >= at
        {
            self.accept_retry_at_ms = None;
            self.arm_accept();
        }
    }

    fn arm_wake(&mut self) {
        if self.wake_armed {
            return;
        }
        let entry = opcode::Read::new(Fd(self.eventfd), (&mut *self.wake_buffer as *mut u64).cast(), 8)
            .build()
            .user_data(user_data(Kind::Wake, 0, 0));
        self.push(entry);
        self.wake_armed = true;
    }

    fn accepted(&mut self, result: i32, flags: u32) {
        if !cqueue::more(flags) {
            self.accept_armed = false;
        }
        if result < 0 {
            if !self.stopping && !self.accept_armed {
                if matches!(-result, libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) {
                    tracing::warn!(core = self.core, "cannot accept: {}", io::Error::from_raw_os_error(-result));
                    self.accept_retry_at_ms = Some(self.now_ms + ACCEPT_RETRY_MS);
                } else {
                    self.arm_accept();
                }
            }
            return;
        }
        let fd = result;
        if !self.accept_armed && !self.stopping {
            self.arm_accept();
        }
        let admitted = self.shared.connections.fetch_add(1, Ordering::SeqCst) < self.shared.max_connections;
        if !admitted
            || self.stopping
            || self.free_slots.is_empty() && self.connections.len() >= CONNECTIONS_PER_CORE_MAX
        {
            self.shared.connections.fetch_sub(1, Ordering::SeqCst);
            let code = if self.stopping { ErrorCode::ShuttingDown } else { ErrorCode::TooManyConnections };
            self.count_error(code);
            refuse(fd, code);
            return;
        }
        let one: libc::c_int = 1;
        // SAFETY: setting an option on a socket we own; failure is harmless.
        unsafe {
            libc::setsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_NODELAY,
                (&one as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
        let slot = match self.free_slots.pop() {
            Some(slot) => {
                let generation = self.connections[slot as usize].generation;
                self.connections[slot as usize] = Connection::new(fd, generation);
                slot
            }
            None => {
                self.connections.push(Connection::new(fd, 0));
                (self.connections.len() - 1) as u32
            }
        };
        self.open += 1;
        self.arm_recv(slot);
    }

    fn arm_recv(&mut self, slot: u32) {
        let connection = &mut self.connections[slot as usize];
        connection.recv_armed = true;
        let entry = opcode::RecvMulti::new(Fd(connection.fd), RECV_BUFFER_GROUP).build().user_data(user_data(
            Kind::Recv,
            slot,
            connection.generation,
        ));
        self.push(entry);
    }

    /// Re-arms a connection's receive if it ended (out of buffers, or paused)
    /// and the connection may read again.
    fn maybe_rearm_recv(&mut self, slot: u32) {
        let connection = &self.connections[slot as usize];
        if connection.recv_armed || connection.closing || connection.fd < 0 {
            return;
        }
        if !connection.reading && connection.gone {
            return;
        }
        if connection.input_full() {
            return;
        }
        self.arm_recv(slot);
    }

    /// Received bytes: parse whole lines from `data`, keep the rest.
    fn input(&mut self, shard: &mut Shard, slot: u32, data: &[u8]) {
        let connection = &mut self.connections[slot as usize];
        if !connection.reading {
            return;
        }
        if connection.input.is_empty() {
            let consumed = self.parse(shard, slot, data);
            self.connections[slot as usize].input.extend_from_slice(&data[consumed..]);
        } else {
            connection.input.extend_from_slice(data);
            let input = std::mem::take(&mut connection.input);
            let consumed = self.parse(shard, slot, &input);
            let mut rest = input;
            rest.drain(..consumed);
            self.connections[slot as usize].input = rest;
        }
        let connection = &mut self.connections[slot as usize];
        if connection.input_full() && connection.recv_armed {
            // Paused with a full input buffer: stop receiving until replies drain.
            let entry = opcode::AsyncCancel::new(user_data(Kind::Recv, slot, connection.generation))
                .build()
                .user_data(user_data(Kind::Ignored, slot, 0));
            self.push(entry);
        }
    }

    /// Handles every whole request line at the front of `data`, until the
    /// connection pauses; returns the bytes used.
    fn parse(&mut self, shard: &mut Shard, slot: u32, data: &[u8]) -> usize {
        let mut offset = 0;
        loop {
            let connection = &self.connections[slot as usize];
            if !connection.reading || connection.is_paused() {
                return offset;
            }
            match decode_request(&data[offset..], self.shared.lease_ms_max) {
                Decoded::Incomplete => return offset,
                Decoded::LineTooLong => {
                    self.count_error(ErrorCode::LineTooLong);
                    self.write(slot, &Reply::Error { op: None, key: None, code: ErrorCode::LineTooLong });
                    self.connections[slot as usize].reading = false;
                    self.client_gone(shard, slot);
                    return data.len();
                }
                Decoded::Line { consumed, item } => {
                    offset += consumed;
                    match item {
                        Ok(request) => self.request(shard, slot, request),
                        Err(error) => match (error.op, error.key) {
                            (Some(op @ (Op::Acquire | Op::Release | Op::Extend)), Some(key)) => {
                                let routed = RoutedRequest::Reject { op, key: Key::new(key), code: error.code };
                                self.route(shard, slot, key, routed);
                            }
                            _ => {
                                self.count_error(error.code);
                                self.write(slot, &error.to_reply());
                            }
                        },
                    }
                }
            }
        }
    }

    fn request(&mut self, shard: &mut Shard, slot: u32, request: Request<'_>) {
        let (key, routed) = match request {
            Request::Ping => {
                let epoch = self.shared.authority.epoch();
                let shared = self.shared.clone();
                let active = Some(shared.advertised.as_bytes());
                self.write(slot, &Reply::Pong { role: Role::Active, epoch, active });
                return;
            }
            Request::Stats => {
                let json = stats::json(&self.shared, Role::Active);
                self.write(slot, &Reply::Stats { json: json.as_bytes() });
                return;
            }
            Request::Acquire { key, lease_ms, wait_ms } => {
                (key, RoutedRequest::Acquire { key: Key::new(key), lease_ms, wait_ms })
            }
            Request::Release { key, token } => (key, RoutedRequest::Release { key: Key::new(key), token }),
            Request::Extend { key, token, lease_ms } => {
                (key, RoutedRequest::Extend { key: Key::new(key), token, lease_ms })
            }
        };
        self.route(shard, slot, key, routed);
    }

    /// Runs a request here if this core owns its key, or queues it for the
    /// core that does.
    fn route(&mut self, shard: &mut Shard, slot: u32, key: &[u8], request: RoutedRequest) {
        if self.stopping {
            let op = match &request {
                RoutedRequest::Acquire { .. } => Op::Acquire,
                RoutedRequest::Release { .. } => Op::Release,
                RoutedRequest::Extend { .. } => Op::Extend,
                RoutedRequest::Reject { op, .. } => *op,
            };
            self.count_error(ErrorCode::ShuttingDown);
            self.write(slot, &Reply::Error { op: Some(op), key: Some(key), code: ErrorCode::ShuttingDown });
            return;
        }
        let connection = &mut self.connections[slot as usize];
        connection.in_flight += 1;
        let client = client_id(self.core, slot, connection.generation);
        let target = shard_of(key, self.cores);
        if target == self.core {
            apply(shard, self.now_ms, client, &request);
            for effect in shard.drain_effects() {
                match effect {
                    Effect::Reply { client, reply } => self.deliver(client, &reply),
                    Effect::Delta(_) => {}
                    Effect::NeedTokens => self.need_tokens = true,
                }
            }
        } else {
            self.outgoing[target].push(Message::Request { client, request });
        }
    }

    /// A reply for `client`: written to its connection if it lives here and
    /// is still open, else queued for its core.
    fn deliver(&mut self, client: ClientId, reply: &ShardReply) {
        let (core, slot, generation) = split_client_id(client);
        if core != self.core {
            self.outgoing[core].push(Message::Reply { client, reply: reply.clone() });
            return;
        }
        let Some(connection) = self.connection(slot, generation) else { return };
        connection.in_flight -= 1;
        let was_paused = connection.in_flight + 1 >= crate::connection::REQUESTS_IN_FLIGHT_MAX;
        if connection.closing || connection.gone && !connection.reading {
            return;
        }
        encode_reply(&reply.to_wire(), &mut connection.output);
        self.mark_dirty(slot);
        if was_paused {
            self.resumable.push(slot);
        }
    }

    /// Writes a reply produced on this core without a shard.
    fn write(&mut self, slot: u32, reply: &Reply<'_>) {
        let connection = &mut self.connections[slot as usize];
        encode_reply(reply, &mut connection.output);
        self.mark_dirty(slot);
    }

    fn mark_dirty(&mut self, slot: u32) {
        let connection = &mut self.connections[slot as usize];
        if !connection.dirty {
            connection.dirty = true;
            self.dirty.push(slot);
        }
    }

    fn count_error(&mut self, code: ErrorCode) {
        if let Some(index) = ErrorCode::ALL.iter().position(|known| *known == code) {
            self.errors[index] += 1;
        }
    }

    /// Starts the sends of this turn and hands other cores their batches.
    fn flush(&mut self) {
        let mut dirty = std::mem::take(&mut self.dirty);
        for &slot in &dirty {
            let connection = &mut self.connections[slot as usize];
            connection.dirty = false;
            let generation = connection.generation;
            let fd = connection.fd;
            if let Some((pointer, len)) = connection.start_send() {
                self.push(send_entry(fd, pointer, len, slot, generation));
            }
            self.maybe_finish(slot);
        }
        dirty.clear();
        self.dirty = dirty;
        for target in 0..self.cores {
            if target == self.core {
                continue;
            }
            let mut batch = std::mem::take(&mut self.refused[target]);
            if batch.is_empty() {
                batch = std::mem::take(&mut self.outgoing[target]);
            } else {
                batch.append(&mut self.outgoing[target]);
            }
            if batch.is_empty() {
                continue;
            }
            if let Err(batch) = self.shared.mailboxes[target].send(batch) {
                self.refused[target] = batch;
            }
        }
    }

    /// Tells every shard that the connection's queued requests are gone.
    fn client_gone(&mut self, shard: &mut Shard, slot: u32) {
        let connection = &mut self.connections[slot as usize];
        if connection.gone {
            return;
        }
        connection.gone = true;
        let client = client_id(self.core, slot, connection.generation);
        for target in 0..self.cores {
            if target == self.core {
                shard.client_gone(self.now_ms, client);
            } else {
                self.outgoing[target].push(Message::ClientGone(client));
            }
        }
    }

    /// Closes a connection that reads no more once its replies are out, and
    /// frees its slot once no I/O of it is in flight.
    fn maybe_finish(&mut self, slot: u32) {
        let connection = &self.connections[slot as usize];
        if connection.fd < 0 {
            return;
        }
        if !connection.closing && !connection.reading && connection.flushed() {
            self.begin_close(slot);
        }
        let connection = &mut self.connections[slot as usize];
        if connection.closing && !connection.recv_armed && !connection.send_in_flight {
            // SAFETY: closing a descriptor this connection owns, with no I/O on it.
            unsafe { libc::close(connection.fd) };
            connection.fd = -1;
            connection.generation = connection.generation.wrapping_add(1);
            connection.input = Vec::new();
            connection.output = Vec::new();
            connection.sending = Vec::new();
            self.free_slots.push(slot);
            self.shared.connections.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn begin_close(&mut self, slot: u32) {
        let connection = &mut self.connections[slot as usize];
        if connection.closing || connection.fd < 0 {
            return;
        }
        connection.closing = true;
        connection.reading = false;
        self.open -= 1;
        // Shutting the socket down ends the multishot receive, so the
        // descriptor can be closed once its completions are in.
        // SAFETY: a socket this connection owns.
        unsafe { libc::shutdown(connection.fd, libc::SHUT_RDWR) };
        debug_assert!(connection.gone, "the shards hear of a closing connection first");
    }

    /// The server is stopping: accept no more connections.
    fn begin_stop(&mut self) {
        self.stopping = true;
        // SAFETY: shutting down our listening socket ends its multishot accept.
        unsafe { libc::shutdown(self.listener, libc::SHUT_RDWR) };
    }

    fn close_all(&mut self) {
        for connection in &mut self.connections {
            if connection.fd >= 0 {
                // SAFETY: descriptors this loop owns; the ring is dropped next.
                unsafe { libc::close(connection.fd) };
                connection.fd = -1;
            }
        }
        // SAFETY: our listening socket.
        unsafe { libc::close(self.listener) };
    }
}

/// Answers a connection the server cannot take, and closes it.
fn refuse(fd: RawFd, code: ErrorCode) {
    let mut line = Vec::with_capacity(48);
    encode_reply(&Reply::Error { op: None, key: None, code }, &mut line);
    // SAFETY: a fresh socket we own; a short non-blocking send either fits in
    // its empty buffer or is dropped, and the socket is closed right after.
    unsafe {
        libc::send(fd, line.as_ptr().cast(), line.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL);
        libc::close(fd);
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
