//! The peer transport: one TCP connection to each peer for what this node
//! sends, and the connections peers open to it for what it receives.
//!
//! Each direction has its own connection, so neither side has to decide who
//! dials whom, and a stream (a snapshot and the deltas after it) lives exactly
//! as long as one connection: when it breaks, the sender stops streaming and
//! the receiver drops the stream, and the cluster logic asks for a new
//! snapshot. Every connection starts with a [`Hello`] from the side that
//! dialled, checked by the side that accepted before any other frame counts.
//!
//! With a peer secret (`--peer-secret-file`), both sides first prove that
//! they hold it (a Challenge, its answer and a Proof: see `cluster::wire`
//! and [`super::proof`]), and nothing a connection sends is read as a frame
//! of the cluster until both proofs check: the acceptor queues no event for
//! a connection it has not admitted (see [`Admitted`]), and the connector
//! listens for a refusal only from a peer that proved itself. A connection
//! that fails is dropped, counted for `/metrics`, and logged at most once a
//! minute per address.
//!
//! With peer TLS (`--peer-tls-cert`, `--peer-tls-key`, `--peer-tls-ca`),
//! every connection is first a TLS 1.3 handshake in which both ends show a
//! certificate of the peer CA (see [`super::peer_tls`] and
//! [`super::stream`]); the connector checks that the acceptor's names the
//! host it dialled, and the acceptor, once the hello says which node the
//! connector is, that the connector's names that node's host. The peer
//! secret's exchange, if any, and every frame then run inside TLS. A
//! failed handshake is dropped, counted and logged as a failed proof is.
//!
//! The tasks here only move bytes. What they read becomes a [`PeerEvent`] in a
//! queue the replication loop drains; what the loop sends goes into the
//! peer's [`Outbox`], which the peer's writer task empties.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use glommio::net::{TcpListener, TcpStream};
use ring::hmac;
use ring::rand::SystemRandom;
use rustls::pki_types::ServerName;

use crate::address::Endpoint;
use crate::cluster::wire::{
    self, CHALLENGE_ANSWER_FRAME_BYTES, CHALLENGE_FRAME_BYTES, Frame, HELLO_FRAME_BYTES, HELLO_REFUSED_FRAME_BYTES,
    Hello, PROOF_FRAME_BYTES, PROTOCOL_VERSION, Proof, Refusal, WireError,
};
use crate::node::shared::Shared;

use super::log_limit::{self, FailureLog, LogLimit};
use super::peer_tls::{self, PeerTls};
use super::proof::{self, Nonces, Side};
use super::stream::{PeerStream, TlsFailure};

/// Bytes waiting for one peer before its connection is dropped: a peer that
/// reads nothing for this long is paused or gone, and will start over from a
/// snapshot when it comes back.
pub const OUTBOX_BYTES_MAX: usize = 512 << 20;

/// Events read and not yet handled by the replication loop, before readers
/// wait for it (the sockets then push back on the senders).
pub const EVENTS_QUEUED_MAX: usize = 65_536;

/// Frame bytes read and not yet handled by the replication loop, before
/// readers wait for it: frames go up to a megabyte, so a count alone would
/// let peers queue gigabytes. A busy stream brings a few hundred kilobytes
/// a turn.
pub const EVENTS_BYTES_MAX: usize = 8 << 20;

/// Bytes asked of the socket per read.
const READ_CHUNK_BYTES: usize = 64 << 10;

/// Inbound connections that have not said hello yet. One more takes the
/// place of the oldest that has not sent a whole hello (see
/// [`Unintroduced::make_room`]).
const UNINTRODUCED_MAX: usize = 64;

/// Bytes written to a peer under one stall timeout.
const WRITE_PIECE_BYTES: usize = 256 << 10;

/// How long a new inbound connection may take to say who it is (with a
/// peer secret: to prove it, then say it).
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// The most bytes an inbound connection may have to show waiting, whole,
/// to keep its place among the [`Unintroduced`]: its Proof, the longest of
/// the frames it can owe.
const INTRODUCTION_PEEK_BYTES_MAX: usize = PROOF_FRAME_BYTES;

const _: () = assert!(HELLO_FRAME_BYTES <= INTRODUCTION_PEEK_BYTES_MAX);
const _: () = assert!(CHALLENGE_FRAME_BYTES <= INTRODUCTION_PEEK_BYTES_MAX);

/// The longest frame read before a connection is admitted: the
/// ChallengeAnswer a connector reads.
const FIRST_FRAME_BYTES_MAX: usize = CHALLENGE_ANSWER_FRAME_BYTES;

const _: () = assert!(INTRODUCTION_PEEK_BYTES_MAX <= FIRST_FRAME_BYTES_MAX);

/// What happened on a connection from a peer.
#[derive(Debug)]
pub enum PeerEvent {
    /// Peer `from` opened a connection (after a valid hello); every frame
    /// of an older connection from it is out of date.
    Opened { from: usize, connection: u64 },
    /// A frame from peer `from`.
    Frame { from: usize, connection: u64, frame: Frame },
    /// The connection ended (closed, reset, or a frame that could not be read).
    Closed { from: usize, connection: u64 },
    /// Peer `from` refused this node's hello on the connection this node
    /// opened to it: their settings disagree.
    Refused { from: usize, refusal: Refusal },
}

/// Events from every inbound connection, in arrival order, with the bytes
/// of their frames counted so that readers wait while too many are queued.
#[derive(Debug, Default)]
pub struct EventQueue {
    events: VecDeque<(PeerEvent, usize)>,
    bytes: usize,
}

impl EventQueue {
    /// Queues `event`, which took `bytes` of the wire.
    pub fn push(&mut self, event: PeerEvent, bytes: usize) {
        self.bytes += bytes;
        self.events.push_back((event, bytes));
    }

    /// The oldest event.
    pub fn pop(&mut self) -> Option<PeerEvent> {
        let (event, bytes) = self.events.pop_front()?;
        self.bytes -= bytes;
        Some(event)
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Readers wait before they queue more.
    pub fn is_full(&self) -> bool {
        self.events.len() >= EVENTS_QUEUED_MAX || self.bytes >= EVENTS_BYTES_MAX
    }
}

/// What the replication loop queued for one peer.
#[derive(Debug, Default)]
pub struct Outbox {
    buffer: Vec<u8>,
    connected: bool,
    /// Grows with every new connection to the peer.
    generation: u64,
    /// The writer is sending bytes taken from `buffer`.
    writing: bool,
    /// Drop the connection (the buffer overflowed).
    reset: bool,
    waker: Option<Waker>,
}

impl Outbox {
    /// A new connection to the peer starts, with nothing queued.
    fn open(&mut self) {
        self.buffer.clear();
        self.connected = true;
        self.generation += 1;
        self.reset = false;
    }

    /// The connection ended: what is queued is dropped with it.
    fn close(&mut self) {
        self.connected = false;
        self.reset = false;
        self.buffer = Vec::new();
    }

    /// The current connection, if there is one.
    pub fn connection(&self) -> Option<u64> {
        self.connected.then_some(self.generation)
    }

    /// Queues encoded frames; dropped if the peer is not connected (the
    /// cluster logic copes with lost messages). Returns false if the peer's
    /// connection had to be dropped because it reads too slowly.
    pub fn push(&mut self, bytes: &[u8]) -> bool {
        if !self.connected || self.reset {
            return self.connected;
        }
        if self.buffer.len() + bytes.len() > OUTBOX_BYTES_MAX {
            self.reset = true;
            self.buffer = Vec::new();
            self.wake();
            return false;
        }
        self.buffer.extend_from_slice(bytes);
        self.wake();
        true
    }

    /// Bytes queued and not yet taken by the writer.
    pub fn queued_bytes(&self) -> usize {
        self.buffer.len()
    }

    /// Nothing is left to send.
    pub fn is_flushed(&self) -> bool {
        !self.connected || (self.buffer.is_empty() && !self.writing)
    }

    fn wake(&mut self) {
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
    }
}

/// The peers' outboxes, by index (this node's own entry stays unused).
pub type Outboxes = Rc<Vec<RefCell<Outbox>>>;

/// The events of every peer connection, shared by the tasks and the loop.
pub type Events = Rc<RefCell<EventQueue>>;

/// What the replication loop shares with the peer tasks.
#[derive(Clone)]
pub struct PeerLinks {
    pub events: Events,
    pub outboxes: Outboxes,
    /// The hello each new outbound connection starts with.
    pub hello: Rc<Cell<Hello>>,
    /// Who this node is, and how its peers prove they belong.
    pub gate: Rc<Gate>,
}

/// Who this node is, for its hellos and to check the peers'.
#[derive(Clone, Copy, Debug)]
pub struct Identity {
    pub me: usize,
    pub nodes: usize,
    /// [`wire::peers_fingerprint`] of this node's `--peers`.
    pub peers_fingerprint: u64,
}

/// Which way a peer connection goes, for the failure counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    /// Opened by a peer (or whoever reached the peer port).
    Inbound,
    /// Opened by this node to a peer.
    Outbound,
}

/// Who this node is and what a peer connection must show before its frames
/// count: shared by the acceptor's and the connectors' tasks.
pub struct Gate {
    pub identity: Identity,
    /// The peer secret's key; `None` without `--peer-secret-file`, when a
    /// hello alone admits a peer.
    key: Option<hmac::Key>,
    random: SystemRandom,
    /// When inbound failures were last logged, by address.
    failures: RefCell<FailureLog>,
    /// A failure is logged at most once per this, per address or peer.
    log_interval_ms: u64,
    shared: Arc<Shared>,
    started: Instant,
    /// How long a peer connection may stay silent (nothing read, or what
    /// was sent unacknowledged) before it is taken for dead: see [`Silence`].
    silence: Silence,
    /// With peer TLS, the name each node's certificate must hold (the host
    /// of its peer address in `--peers`), by node index; empty without.
    peer_names: Vec<ServerName<'static>>,
}

/// How the peer connections notice a link that went silent, as when a
/// switch or a route between two nodes fails without a reset. Heartbeats
/// flow both ways every `--heartbeat-ms`, so a connection with nothing to
/// read for `stall`, or with bytes unacknowledged for `stall`
/// (TCP_USER_TIMEOUT), is dead; it is closed and a new one is opened, by
/// connection attempts of `attempt` each. Without this, TCP would keep the
/// old connection and send again at its own doubling intervals, so that two
/// nodes could take seconds after a partition heals to hear each other,
/// while an isolated active went on granting in its old epoch.
#[derive(Clone, Copy, Debug)]
pub struct Silence {
    /// No frame read, or bytes sent and not acknowledged, for this long.
    pub stall: Duration,
    /// One connection attempt (a fresh SYN each) lasts at most this long:
    /// half of `--failover-ms`, from 250 ms to 1 s, so that it spans a
    /// round trip on any network a cluster runs over.
    pub attempt: Duration,
    /// Pause between attempts.
    pub retry: Duration,
}

impl Silence {
    pub fn new(heartbeat_ms: u64, failover_ms: u64) -> Silence {
        Silence {
            stall: Duration::from_millis(failover_ms.max(1000)),
            attempt: Duration::from_millis((failover_ms / 2).clamp(250, 1000)),
            retry: Duration::from_millis(heartbeat_ms.clamp(20, 500)),
        }
    }
}

/// Makes the kernel drop a peer connection whose sent bytes stay
/// unacknowledged for `stall` (TCP_USER_TIMEOUT), instead of retransmitting
/// for about 15 minutes.
fn drop_when_unacknowledged(stream: &TcpStream, stall: Duration) {
    let milliseconds = stall.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: setsockopt on a socket this stream owns, with a c_int option
    // value of the size passed.
    let result = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_USER_TIMEOUT,
            (&milliseconds as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if result != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "cannot set TCP_USER_TIMEOUT on a peer connection");
    }
}

impl Gate {
    pub fn new(
        identity: Identity,
        key: Option<hmac::Key>,
        shared: Arc<Shared>,
        silence: Silence,
        peer_names: Vec<ServerName<'static>>,
    ) -> Gate {
        // Read once, here: tests set it so that counting log lines does not
        // depend on how long they take (see `log_limit`).
        let variable = std::env::var(log_limit::FAILURE_LOG_INTERVAL_ENV).ok();
        let log_interval_ms = log_limit::interval_ms(variable.as_deref()).unwrap_or_else(|error| {
            tracing::warn!("{error}; failed peer connections are logged once a minute per address");
            log_limit::FAILURE_LOG_INTERVAL_MS
        });
        Gate {
            identity,
            key,
            random: SystemRandom::new(),
            failures: RefCell::new(FailureLog::new(log_interval_ms)),
            log_interval_ms,
            shared,
            started: Instant::now(),
            silence,
            peer_names,
        }
    }

    /// The peer TLS settings, with `--peer-tls-cert`.
    fn peer_tls(&self) -> Option<&PeerTls> {
        self.shared.peer_tls.as_ref()
    }

    /// Whether a connection must prove something before its hello counts.
    fn secured(&self) -> bool {
        self.key.is_some() || self.peer_tls().is_some()
    }

    /// Counts a connection refused for TLS: a failed handshake, or a
    /// certificate that does not name the peer's host.
    fn count_tls_error(&self, direction: Direction) {
        if let Some(peer_tls) = self.peer_tls() {
            let counter = match direction {
                Direction::Inbound => &peer_tls.errors_inbound,
                Direction::Outbound => &peer_tls.errors_outbound,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Counts a connection dropped before it proved the peer secret (or,
    /// with peer TLS, its certificate).
    fn count_failure(&self, direction: Direction) {
        if let Some(link) = &self.shared.cluster {
            let counter: &AtomicU64 = match direction {
                Direction::Inbound => &link.peer_auth_failures_inbound,
                Direction::Outbound => &link.peer_auth_failures_outbound,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts an inbound connection that did not prove the peer secret (or
    /// its certificate), and logs why, at most once per interval for its
    /// address.
    fn inbound_failed(&self, address: Option<SocketAddr>, reason: &str) {
        self.count_failure(Direction::Inbound);
        let what = match (self.key.is_some(), self.peer_tls().is_some()) {
            (true, true) => "its certificate and the peer secret",
            (false, true) => "its certificate",
            _ => "the peer secret",
        };
        self.log_limited(
            address,
            &format!(
                "peer connection refused before it proved {what}: {reason}; nothing it sent was read as a frame of \
                 the cluster"
            ),
        );
    }

    /// Logs `message` about a connection from `address`, at most once per
    /// interval for that address.
    fn log_limited(&self, address: Option<SocketAddr>, message: &str) {
        let logged = self.failures.borrow_mut().failure(address.map(|address| address.ip()), self.now_ms());
        if let Some(logged) = logged {
            let shared = if logged.shared { " (logged for many addresses at once)" } else { "" };
            let forgotten = if logged.forgotten > 0 {
                format!(
                    "; {} failures from other addresses were left out since their last lines (they had no failure \
                     after their interval)",
                    logged.forgotten
                )
            } else {
                String::new()
            };
            tracing::warn!(
                peer = ?address,
                left_out = logged.suppressed,
                "{message}; such failures from this address are logged at most once every {}{shared}{forgotten}",
                log_limit::describe_interval(self.log_interval_ms)
            );
        }
    }
}

/// Accepts peer connections for as long as the executor runs.
pub async fn accept(listener: TcpListener, gate: Rc<Gate>, events: Events) {
    let mut next_connection = 0u64;
    let unintroduced = Rc::new(RefCell::new(Unintroduced::default()));
    loop {
        // A flood of connects keeps accept ready: let the replication loop
        // and the connections' tasks run between them.
        glommio::yield_if_needed().await;
        match listener.accept().await {
            Ok(stream) => {
                if !unintroduced.borrow_mut().make_room() {
                    tracing::warn!(
                        peer = ?stream.peer_addr().ok(),
                        "peer connection refused: {UNINTRODUCED_MAX} connections have their hello waiting to be read"
                    );
                    continue;
                }
                next_connection += 1;
                let _ = stream.set_nodelay(true);
                drop_when_unacknowledged(&stream, gate.silence.stall);
                let expecting = match (gate.peer_tls().is_some(), gate.key.is_some()) {
                    (true, _) => Expecting::TlsRecord,
                    (false, true) => Expecting::Challenge,
                    (false, false) => Expecting::Hello,
                };
                let introduction = Introduction::register(&unintroduced, &stream, expecting);
                let task = read(stream, next_connection, gate.clone(), events.clone(), introduction);
                glommio::spawn_local(task).detach();
            }
            Err(error) => {
                tracing::warn!(%error, "cannot accept a peer connection");
                glommio::timer::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// What an inbound connection that is not admitted yet must send next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expecting {
    /// Its Hello (no peer secret).
    Hello,
    /// Its Challenge (with a peer secret, before this node answered it).
    Challenge,
    /// Its Proof (with a peer secret, once this node answered). The Hello
    /// that follows is not waited for here: it may come in a later segment,
    /// and once the proof checks the connection leaves the waiting list.
    Proof,
    /// With peer TLS, a whole TLS record of its handshake (its ClientHello
    /// at first, its certificate and Finished once answered); once the
    /// handshake has checked its certificate it leaves the waiting list.
    TlsRecord,
}

/// The inbound connections that have not said hello yet, oldest first,
/// each by its id, its socket and what it must send next.
#[derive(Default)]
struct Unintroduced {
    next_id: u64,
    waiting: VecDeque<(u64, RawFd, Expecting)>,
}

impl Unintroduced {
    /// Makes room for one more: if [`UNINTRODUCED_MAX`] are waiting, shuts
    /// the oldest that has not sent the whole of what it must send next
    /// (its read ends, and its task with it). A peer sends its hello (with
    /// a peer secret: its challenge, and its proof as soon as it is
    /// answered) at once, so connections that send nothing or trickle,
    /// however many and however often reopened, never keep it out: it would
    /// have to be the oldest of them. (With a peer secret it is exposed for
    /// the round trip between its challenge and its proof, when it owes a
    /// proof it cannot have sent yet.) False if every waiting one has what
    /// it must send next whole in its socket.
    fn make_room(&mut self) -> bool {
        if self.waiting.len() < UNINTRODUCED_MAX {
            return true;
        }
        let Some(oldest) = self.waiting.iter().position(|&(_, fd, expecting)| !expected_frames_waiting(fd, expecting))
        else {
            return false;
        };
        let (_, fd, _) = self.waiting.remove(oldest).expect("a position in the queue");
        // SAFETY: the fd is open: an entry leaves the queue in the same
        // synchronous drop as its stream, on this thread (see Introduction),
        // and this runs on this thread too. Its task logs the take-over.
        unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
        true
    }
}

/// Whether the whole, well-formed frames a connection must send next wait
/// to be read on `fd`, looked at without reading them and without waiting
/// (as many bytes of anything else do not protect a connection from being
/// taken over; a proof is not checked here, only its form).
fn expected_frames_waiting(fd: RawFd, expecting: Expecting) -> bool {
    let wanted = match expecting {
        Expecting::Hello => HELLO_FRAME_BYTES,
        Expecting::Challenge => CHALLENGE_FRAME_BYTES,
        Expecting::Proof => PROOF_FRAME_BYTES,
        Expecting::TlsRecord => return tls_record_waiting(fd),
    };
    let mut bytes = [0u8; INTRODUCTION_PEEK_BYTES_MAX];
    // SAFETY: a peek into a local buffer of at least this length.
    let peeked = unsafe { libc::recv(fd, bytes.as_mut_ptr().cast(), wanted, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    if usize::try_from(peeked).ok() != Some(wanted) {
        return false;
    }
    let frame = |at: usize| wire::decode(&bytes[at..wanted]).ok().flatten().map(|(frame, _)| frame);
    match expecting {
        Expecting::Hello => matches!(frame(0), Some(Frame::Hello(_))),
        Expecting::Challenge => matches!(frame(0), Some(Frame::Challenge { .. })),
        Expecting::Proof => matches!(frame(0), Some(Frame::Proof(_))),
        Expecting::TlsRecord => false,
    }
}

/// The largest TLS record: 2^14 bytes of plaintext and what encryption adds.
const TLS_RECORD_BYTES_MAX: usize = (1 << 14) + 256;

/// Whether a whole TLS record waits to be read on `fd`: its header (a
/// content type of TLS 1.2 or 1.3, version 3.x, a length no record
/// exceeds) and as many bytes as it announces, looked at without reading.
fn tls_record_waiting(fd: RawFd) -> bool {
    let mut header = [0u8; 5];
    // SAFETY: a peek into a local buffer of this length.
    let peeked = unsafe { libc::recv(fd, header.as_mut_ptr().cast(), 5, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    if peeked != 5 || !(20..=23).contains(&header[0]) || header[1] != 3 {
        return false;
    }
    let length = usize::from(u16::from_be_bytes([header[3], header[4]]));
    let mut waiting: libc::c_int = 0;
    // SAFETY: FIONREAD writes the bytes waiting into the c_int given.
    let asked = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut waiting) };
    asked == 0 && length <= TLS_RECORD_BYTES_MAX && usize::try_from(waiting).is_ok_and(|waiting| waiting >= 5 + length)
}

/// A connection's entry among the [`Unintroduced`], removed when it has
/// proved the peer secret, when it has said hello (or failed to) or when
/// its task ends, before its stream is dropped, so that the queue never
/// holds a closed descriptor.
struct Introduction {
    queue: Rc<RefCell<Unintroduced>>,
    id: u64,
    /// It left the queue once its proof checked (see [`Introduction::proved`]).
    proved: Cell<bool>,
}

impl Introduction {
    fn register(queue: &Rc<RefCell<Unintroduced>>, stream: &TcpStream, expecting: Expecting) -> Introduction {
        let mut unintroduced = queue.borrow_mut();
        let id = unintroduced.next_id;
        unintroduced.next_id += 1;
        unintroduced.waiting.push_back((id, stream.as_raw_fd(), expecting));
        Introduction { queue: queue.clone(), id, proved: Cell::new(false) }
    }

    /// The connection must now send `expecting` to keep its place.
    fn expect(&self, expecting: Expecting) {
        let mut queue = self.queue.borrow_mut();
        if let Some(entry) = queue.waiting.iter_mut().find(|(id, _, _)| *id == self.id) {
            entry.2 = expecting;
        }
    }

    /// The connection proved that it holds the peer secret (or, with peer
    /// TLS, its handshake checked its certificate): it leaves the queue, so
    /// that no newer connection can take its place. Whoever reaches this
    /// point holds the secret (or a certificate), so it is no flood; its Hello
    /// was sent with its proof, and [`HELLO_TIMEOUT`] still bounds the wait.
    /// False if a newer connection took its place before its proof was read.
    fn proved(&self) -> bool {
        if self.proved.get() {
            // Proved before (its TLS handshake, then the peer secret).
            return true;
        }
        let mut queue = self.queue.borrow_mut();
        let before = queue.waiting.len();
        queue.waiting.retain(|&(id, _, _)| id != self.id);
        let was_waiting = queue.waiting.len() < before;
        self.proved.set(was_waiting);
        was_waiting
    }

    /// Ends the wait for the hello; false if a newer connection took this
    /// one's place meanwhile (and shut it).
    fn end(self) -> bool {
        let mut queue = self.queue.borrow_mut();
        let before = queue.waiting.len();
        queue.waiting.retain(|&(id, _, _)| id != self.id);
        queue.waiting.len() < before || self.proved.get()
    }
}

impl Drop for Introduction {
    fn drop(&mut self) {
        self.queue.borrow_mut().waiting.retain(|&(id, _, _)| id != self.id);
    }
}

/// A connection from a peer that said who it is and, with a peer secret,
/// proved it: made only by [`read`] once the introduction passed, and the
/// only way to queue events for a connection.
struct Admitted {
    from: usize,
    connection: u64,
}

impl Admitted {
    fn push(&self, events: &Events, event: impl FnOnce(usize, u64) -> PeerEvent, bytes: usize) {
        events.borrow_mut().push(event(self.from, self.connection), bytes);
    }
}

/// Reads one inbound connection: its introduction (with a peer secret, the
/// exchange of proofs; then its hello), then frames until it ends.
async fn read(stream: TcpStream, connection: u64, gate: Rc<Gate>, events: Events, introduction: Introduction) {
    let peer_address = stream.peer_addr().ok();
    let mut stream = PeerStream::plain(stream);
    let introduced =
        glommio::timer::timeout(HELLO_TIMEOUT, async { Ok(introduce(&mut stream, &gate, &introduction).await) }).await;
    let secured = gate.secured();
    let handshake_done = introduction.proved.get();
    if !introduction.end() {
        if gate.peer_tls().is_some() {
            let reason = format!(
                "it had not sent the next records of its TLS handshake when {UNINTRODUCED_MAX} newer connections \
                 waited for their turn"
            );
            gate.inbound_failed(peer_address, &reason);
        } else if secured {
            let reason = format!(
                "it had not sent its challenge, or its proof once answered, when {UNINTRODUCED_MAX} newer \
                 connections waited for their turn"
            );
            gate.inbound_failed(peer_address, &reason);
        } else {
            tracing::warn!(
                peer = ?peer_address,
                "peer connection closed: it had not sent a hello when {UNINTRODUCED_MAX} newer connections waited \
                 for theirs"
            );
        }
        return;
    }
    let checked = match introduced {
        Ok(Ok(hello)) => check_hello(&hello, gate.identity),
        Ok(Err(failure)) => Err(failure),
        Err(_) if gate.peer_tls().is_some() => {
            let unfinished = match (handshake_done, gate.key.is_some()) {
                (false, _) => "its TLS handshake",
                (true, true) => "its proof and hello",
                (true, false) => "its hello",
            };
            Err(HelloError::Unproven(format!("it did not finish {unfinished} within {} s", HELLO_TIMEOUT.as_secs())))
        }
        Err(_) if secured => {
            Err(HelloError::Unproven(format!("no proof and hello within {} s", HELLO_TIMEOUT.as_secs())))
        }
        Err(_) => Err(HelloError::Unreadable(format!("no hello within {} s", HELLO_TIMEOUT.as_secs()))),
    };
    let from = match checked {
        Ok(from) => from,
        Err(HelloError::Unproven(reason)) => {
            gate.inbound_failed(peer_address, &reason);
            return;
        }
        Err(HelloError::Unreadable(reason)) => {
            tracing::warn!(peer = ?peer_address, "peer connection refused: {reason}");
            return;
        }
        Err(HelloError::OtherSecurity(reason)) => {
            // A node with the secret (or TLS) tries again every few milliseconds.
            gate.log_limited(peer_address, &format!("peer connection refused: {reason}"));
            return;
        }
        Err(HelloError::Refused(refusal, reason)) => {
            // A ringlock node of this version with other settings (which,
            // with a peer secret, proved it holds the secret): say so loudly
            // here, and tell it, so that neither serves as active.
            tracing::error!(peer = ?peer_address, "peer connection refused: {reason}");
            let mut bytes = Vec::with_capacity(HELLO_REFUSED_FRAME_BYTES);
            wire::encode(&Frame::HelloRefused(refusal), &mut bytes);
            let _ = glommio::timer::timeout(HELLO_TIMEOUT, async {
                stream.write_all(&bytes).await.map_err(glommio::GlommioError::from)
            })
            .await;
            let _ = stream.shutdown(std::net::Shutdown::Write).await;
            return;
        }
    };
    let admitted = Admitted { from, connection };
    admitted.push(&events, |from, connection| PeerEvent::Opened { from, connection }, 0);
    let mut buffer = ReadBuffer::new();
    loop {
        while events.borrow().is_full() {
            glommio::timer::sleep(Duration::from_millis(1)).await;
        }
        match next_frame(&mut stream, &mut buffer, gate.silence.stall).await {
            Ok(Some((frame, bytes))) => {
                admitted.push(&events, |from, connection| PeerEvent::Frame { from, connection, frame }, bytes)
            }
            Ok(None) => break,
            Err(reason) => {
                tracing::warn!(peer = from, address = ?peer_address, "peer connection dropped: {reason}");
                break;
            }
        }
    }
    admitted.push(&events, |from, connection| PeerEvent::Closed { from, connection }, 0);
}

/// Why an inbound connection was not admitted.
enum HelloError {
    /// With a peer secret: it did not prove it holds the secret (no proof,
    /// a wrong one, garbage, a timeout). Counted, and logged rate-limited.
    Unproven(String),
    /// Not a hello of this protocol version: the connection is just closed.
    Unreadable(String),
    /// Without a peer secret (or TLS): a Challenge (or a ClientHello) of a
    /// node that has one (logged rate-limited, since that node keeps trying).
    OtherSecurity(String),
    /// A well-formed hello of a node with other settings, which is told why.
    Refused(Refusal, String),
}

/// The first frame of the other handshake (with or without a peer secret),
/// told apart by its length and type byte when it comes instead of the
/// frame expected, and what it means.
struct OtherHandshake {
    frame_bytes: usize,
    type_byte: u8,
    meaning: &'static str,
}

impl OtherHandshake {
    /// Whether a first frame that announced `announced` bytes, of type
    /// `type_byte` if it came, is this one.
    fn is(&self, announced: usize, type_byte: Option<u8>) -> bool {
        announced == self.frame_bytes - 4 && type_byte == Some(self.type_byte)
    }
}

/// The type byte of a Challenge.
const CHALLENGE_TYPE_BYTE: u8 = 12;
/// The type byte of a Hello.
const HELLO_TYPE_BYTE: u8 = 1;

/// A node without a peer secret is sent a Challenge.
const CHALLENGE_WITHOUT_SECRET: OtherHandshake = OtherHandshake {
    frame_bytes: CHALLENGE_FRAME_BYTES,
    type_byte: CHALLENGE_TYPE_BYTE,
    meaning: "it asks this node to prove it holds a peer secret: it was started with --peer-secret-file, and this node \
     without; give every node the same --peer-secret-file",
};

/// A node with a peer secret is sent a Hello first.
const HELLO_WITHOUT_PROOF: OtherHandshake = OtherHandshake {
    frame_bytes: HELLO_FRAME_BYTES,
    type_byte: HELLO_TYPE_BYTE,
    meaning: "it sent a hello without proving it holds the peer secret: it was started without --peer-secret-file (or is \
     not a ringlock node of this version); give every node the same --peer-secret-file",
};

/// What a node without peer TLS that is sent a ClientHello, or a node
/// with a peer secret and without TLS sent one instead of a challenge, is
/// told.
const SPEAKS_TLS: &str = "it speaks TLS: it was started with --peer-tls-cert, --peer-tls-key and --peer-tls-ca, and \
                          this node without; give every node the same peer TLS flags";

/// Reads what an inbound connection must send before its frames count:
/// with peer TLS, first a TLS handshake that checks its certificate; then
/// (inside TLS, if any) what [`introduce_peer`] reads; with peer TLS, the
/// certificate must name the host of the node the hello names.
async fn introduce(stream: &mut PeerStream, gate: &Gate, introduction: &Introduction) -> Result<Hello, HelloError> {
    let Some(peer_tls) = gate.peer_tls() else {
        return introduce_peer(stream, gate, introduction).await;
    };
    let connection = rustls::ServerConnection::new(peer_tls.current().server)
        .map_err(|error| HelloError::Unproven(format!("cannot start TLS: {error}")))?;
    stream.start_tls(rustls::Connection::Server(connection));
    if let Err(failure) = stream.handshake().await {
        gate.count_tls_error(Direction::Inbound);
        return Err(HelloError::Unproven(describe_inbound_tls_failure(&failure, &stream.first_bytes())));
    }
    if !introduction.proved() {
        return Err(HelloError::Unproven("taken over".to_string()));
    }
    let hello = introduce_peer(stream, gate, introduction).await?;
    let Some(name) = gate.peer_names.get(hello.node) else {
        return Err(HelloError::Unproven(format!("its hello names node {}, which --peers does not list", hello.node)));
    };
    if !stream.peer_certificate().is_some_and(|certificate| peer_tls::names_host(&certificate, name)) {
        gate.count_tls_error(Direction::Inbound);
        return Err(HelloError::Unproven(format!(
            "its certificate (signed by the CA of --peer-tls-ca) does not name {}, the host of node {} in --peers: \
             it is another host's certificate, or it was made for another name",
            name.to_str(),
            hello.node
        )));
    }
    Ok(hello)
}

/// Why an inbound TLS handshake failed, for the log. `first_bytes` are
/// the first the connection sent, which tell a node without TLS.
fn describe_inbound_tls_failure(failure: &TlsFailure, first_bytes: &[u8]) -> String {
    let in_the_clear = |frame_bytes: usize, type_byte: u8| {
        first_bytes.len() >= 5
            && first_bytes[..4] == ((frame_bytes - 4) as u32).to_le_bytes()
            && first_bytes[4] == type_byte
    };
    if in_the_clear(HELLO_FRAME_BYTES, HELLO_TYPE_BYTE) || in_the_clear(CHALLENGE_FRAME_BYTES, CHALLENGE_TYPE_BYTE) {
        return "it speaks the peer protocol in the clear: it was started without --peer-tls-cert, --peer-tls-key and \
                --peer-tls-ca; give every node the same peer TLS flags"
            .to_string();
    }
    describe_tls_failure(failure, "the TLS handshake")
}

/// What a failed TLS handshake (or wait for admission) means, for the log.
fn describe_tls_failure(failure: &TlsFailure, during: &str) -> String {
    use rustls::{CertificateError, Error};
    match failure {
        TlsFailure::Io(error)
            if matches!(error.kind(), std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe) =>
        {
            format!("it closed the connection during {during}")
        }
        TlsFailure::Io(error) => format!("the socket failed during {during}: {error}"),
        TlsFailure::Closed => format!("it closed the connection during {during}"),
        TlsFailure::Tls(Error::NoCertificatesPresented) => {
            "it showed no certificate: it was not started with --peer-tls-cert".to_string()
        }
        TlsFailure::Tls(Error::InvalidCertificate(
            CertificateError::UnknownIssuer | CertificateError::BadSignature,
        )) => "its certificate is not signed by the CA of --peer-tls-ca (another CA, or self-signed)".to_string(),
        TlsFailure::Tls(Error::InvalidCertificate(CertificateError::NotValidForName))
        | TlsFailure::Tls(Error::InvalidCertificate(CertificateError::NotValidForNameContext { .. })) => {
            "its certificate does not name the host of its peer address in --peers".to_string()
        }
        TlsFailure::Tls(Error::InvalidCertificate(error)) => format!("its certificate is refused: {error:?}"),
        TlsFailure::Tls(Error::AlertReceived(alert)) => format!(
            "it refused this node's certificate or TLS (alert {alert:?}): check that every node's certificate is \
             signed by the CA of the others' --peer-tls-ca and names its host in --peers"
        ),
        TlsFailure::Tls(Error::InvalidMessage(_)) => {
            format!("it does not speak TLS (no TLS record where one was due, during {during})")
        }
        TlsFailure::Tls(error) => format!("TLS failed during {during}: {error}"),
    }
}

/// Reads what an inbound connection must send, after its TLS handshake if
/// any, before its frames count: without a peer secret its hello; with
/// one, its challenge, then (once answered with this node's proof) its
/// proof, checked, and its hello, which must name what the proof bound.
async fn introduce_peer(
    stream: &mut PeerStream,
    gate: &Gate,
    introduction: &Introduction,
) -> Result<Hello, HelloError> {
    let Some(key) = &gate.key else {
        return match read_first_frame(stream, HELLO_FRAME_BYTES).await {
            Ok(Frame::Hello(hello)) => Ok(hello),
            Ok(_) => Err(HelloError::Unreadable("it did not start with a hello".to_string())),
            Err(FirstFrameError::Announced { announced, type_byte, .. })
                if CHALLENGE_WITHOUT_SECRET.is(announced, type_byte) =>
            {
                Err(HelloError::OtherSecurity(CHALLENGE_WITHOUT_SECRET.meaning.to_string()))
            }
            Err(FirstFrameError::SpeaksTls) => Err(HelloError::OtherSecurity(SPEAKS_TLS.to_string())),
            Err(error) => Err(HelloError::Unreadable(error.describe("hello", None))),
        };
    };
    let unproven = |error: FirstFrameError, what: &str, other: Option<&OtherHandshake>| {
        HelloError::Unproven(error.describe(what, other))
    };
    let connector_nonce = match read_first_frame(stream, CHALLENGE_FRAME_BYTES).await {
        Ok(Frame::Challenge { nonce }) => nonce,
        Ok(_) => return Err(HelloError::Unproven("it did not start with a challenge".to_string())),
        Err(error) => return Err(unproven(error, "challenge", Some(&HELLO_WITHOUT_PROOF))),
    };
    let Some(acceptor_nonce) = proof::fresh_nonce(&gate.random) else {
        return Err(HelloError::Unproven("the system's random source failed; no nonce to answer with".to_string()));
    };
    let nonces = Nonces { connector: connector_nonce, acceptor: acceptor_nonce };
    let identity = gate.identity;
    let own_proof = proof::prove(key, Side::Acceptor, &nonces, identity.me, identity.peers_fingerprint);
    let mut answer = Vec::with_capacity(CHALLENGE_ANSWER_FRAME_BYTES);
    wire::encode(&Frame::ChallengeAnswer { nonce: acceptor_nonce, proof: own_proof }, &mut answer);
    introduction.expect(Expecting::Proof);
    if let Err(error) = stream.write_all(&answer).await {
        return Err(HelloError::Unproven(format!("cannot answer its challenge: {error}")));
    }
    let proof = match read_first_frame(stream, PROOF_FRAME_BYTES).await {
        Ok(Frame::Proof(proof)) => proof,
        Ok(_) => return Err(HelloError::Unproven("it did not send its proof after this node's answer".to_string())),
        Err(error) => return Err(unproven(error, "proof", None)),
    };
    if !proof::verify(key, Side::Connector, &nonces, &proof) {
        return Err(HelloError::Unproven(format!(
            "its proof (as node {}) does not check: it holds another peer secret, or sent a proof made for another \
             connection",
            proof.node
        )));
    }
    if !introduction.proved() {
        // A newer connection took this one's place (and shut it) while its
        // proof waited; `read` says so.
        return Err(HelloError::Unproven("taken over".to_string()));
    }
    let hello = match read_first_frame(stream, HELLO_FRAME_BYTES).await {
        Ok(Frame::Hello(hello)) => hello,
        Ok(_) => return Err(HelloError::Unproven("it did not send its hello after its proof".to_string())),
        Err(error) => return Err(unproven(error, "hello", None)),
    };
    if hello.node != proof.node || hello.peers_fingerprint != proof.peers_fingerprint {
        return Err(HelloError::Unproven(format!(
            "its hello (node {}) does not name the node and --peers fingerprint its proof bound (node {})",
            hello.node, proof.node
        )));
    }
    Ok(hello)
}

/// Why the first frame of a stage of the introduction was not read.
enum FirstFrameError {
    /// Closed before its first byte.
    Closed,
    /// Closed before the frame was whole.
    ClosedMidFrame,
    /// The socket failed.
    Failed(std::io::Error),
    /// The length prefix is not that of the frame expected (`expected`
    /// bytes after the prefix); the type byte, if it came with it.
    Announced { announced: usize, expected: usize, type_byte: Option<u8> },
    /// The frame does not decode.
    Unreadable(WireError),
    /// A TLS record came instead (a node with peer TLS).
    SpeaksTls,
}

impl FirstFrameError {
    /// The reason to log, for a connection that was to send `what`.
    fn describe(&self, what: &str, other: Option<&OtherHandshake>) -> String {
        match self {
            FirstFrameError::Closed => format!("closed before its {what}"),
            FirstFrameError::ClosedMidFrame => format!("closed in the middle of a frame, before its {what} was whole"),
            FirstFrameError::Failed(error) => format!("read failed before its {what}: {error}"),
            FirstFrameError::Announced { announced, expected, type_byte } => match other {
                Some(other) if other.is(*announced, *type_byte) => other.meaning.to_string(),
                _ => format!(
                    "unreadable frame: it did not start with a {what} (a frame of {announced} bytes announced, a \
                     {what} has {expected})"
                ),
            },
            FirstFrameError::Unreadable(error) => format!("unreadable {what}: {error}"),
            FirstFrameError::SpeaksTls => SPEAKS_TLS.to_string(),
        }
    }
}

/// Reads exactly one frame of `frame_bytes` (length prefix included): a
/// connection that has not been admitted gets no more buffer than that.
async fn read_first_frame(stream: &mut PeerStream, frame_bytes: usize) -> Result<Frame, FirstFrameError> {
    assert!(frame_bytes <= FIRST_FRAME_BYTES_MAX, "a first frame of {frame_bytes} bytes");
    let mut bytes = [0u8; FIRST_FRAME_BYTES_MAX];
    let mut filled = 0;
    while filled < frame_bytes {
        match stream.read(&mut bytes[filled..frame_bytes]).await {
            Ok(0) if filled == 0 => return Err(FirstFrameError::Closed),
            Ok(0) => return Err(FirstFrameError::ClosedMidFrame),
            Ok(count) => filled += count,
            Err(error) => return Err(FirstFrameError::Failed(error)),
        }
        // A TLS handshake record (type 22, version 3.x) announces 790 bytes
        // and more, which no first frame has.
        if filled >= 2 && bytes[..2] == [22, 3] {
            return Err(FirstFrameError::SpeaksTls);
        }
        // The length prefix alone can tell that this is not the frame
        // expected; if it is that of the other handshake's first frame, the
        // type byte is waited for, which tells that frame from garbage.
        let announced = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
        let other_handshake = [HELLO_FRAME_BYTES - 4, CHALLENGE_FRAME_BYTES - 4].contains(&announced);
        if filled >= 4 && announced != frame_bytes - 4 && (filled > 4 || !other_handshake) {
            let type_byte = (filled > 4).then_some(bytes[4]);
            return Err(FirstFrameError::Announced { announced, expected: frame_bytes - 4, type_byte });
        }
    }
    match wire::decode(&bytes[..frame_bytes]) {
        Ok(Some((frame, _))) => Ok(frame),
        Ok(None) => Err(FirstFrameError::ClosedMidFrame),
        Err(error) => Err(FirstFrameError::Unreadable(error)),
    }
}

/// What a connection read and has not decoded yet: `bytes[start..]`.
/// Decoded frames only move `start`, so a read of many small frames costs one
/// compaction (before the next read), not one shift of the buffer per frame.
struct ReadBuffer {
    bytes: Vec<u8>,
    start: usize,
}

impl ReadBuffer {
    fn new() -> ReadBuffer {
        ReadBuffer { bytes: Vec::with_capacity(READ_CHUNK_BYTES), start: 0 }
    }

    /// Moves the undecoded bytes to the front.
    fn compact(&mut self) {
        if self.start > 0 {
            self.bytes.drain(..self.start);
            self.start = 0;
        }
    }
}

/// The next frame of a connection and its bytes; `Ok(None)` when it closed
/// cleanly. A connection that sends nothing for `stall` (a peer sends a
/// heartbeat every `--heartbeat-ms`) is taken for dead: an error.
async fn next_frame(
    stream: &mut PeerStream,
    buffer: &mut ReadBuffer,
    stall: Duration,
) -> Result<Option<(Frame, usize)>, String> {
    loop {
        match wire::decode(&buffer.bytes[buffer.start..]) {
            Ok(Some((frame, used))) => {
                buffer.start += used;
                return Ok(Some((frame, used)));
            }
            Ok(None) => {}
            Err(error) => return Err(format!("unreadable frame: {error}")),
        }
        buffer.compact();
        let bytes = &mut buffer.bytes;
        let filled = bytes.len();
        // Room for a good read; a frame is at most FRAME_LEN_MAX, so the
        // buffer never grows past about that much more.
        bytes.resize(filled + READ_CHUNK_BYTES, 0);
        let read = glommio::timer::timeout(stall, async {
            stream.read(&mut bytes[filled..]).await.map_err(glommio::GlommioError::from)
        })
        .await;
        match read {
            Ok(0) => {
                bytes.truncate(filled);
                return if filled == 0 { Ok(None) } else { Err("closed in the middle of a frame".to_string()) };
            }
            Ok(count) => bytes.truncate(filled + count),
            Err(glommio::GlommioError::TimedOut(_)) => {
                bytes.truncate(filled);
                return Err(format!("nothing read for {} ms: the link is taken for dead", stall.as_millis()));
            }
            Err(error) => {
                bytes.truncate(filled);
                return Err(format!("read failed: {error}"));
            }
        }
    }
}

fn check_hello(hello: &Hello, identity: Identity) -> Result<usize, HelloError> {
    if hello.version != PROTOCOL_VERSION {
        return Err(HelloError::Unreadable(format!(
            "it speaks peer protocol {}, this node {PROTOCOL_VERSION}",
            hello.version
        )));
    }
    if hello.nodes != identity.nodes {
        return Err(HelloError::Refused(
            Refusal::Nodes,
            format!(
                "its --peers lists {} nodes, this node's {}; give every node the same --peers",
                hello.nodes, identity.nodes
            ),
        ));
    }
    if hello.node == identity.me {
        return Err(HelloError::Refused(
            Refusal::SameNode,
            format!(
                "it says it is node {}, which is this node; check --node, and give every node the same --peers",
                hello.node
            ),
        ));
    }
    if hello.peers_fingerprint != identity.peers_fingerprint {
        return Err(HelloError::Refused(
            Refusal::PeerList,
            format!(
                "node {} was started with another --peers list (other client addresses, written otherwise, or \
                 another order: names and addresses count as written); give every node the same --peers, in the \
                 same order",
                hello.node
            ),
        ));
    }
    Ok(hello.node)
}

/// Keeps a connection to peer `to` open and sends what its outbox gets.
/// `hello` is read at each connection, so it carries the node's latest role.
pub async fn write(to: usize, endpoint: Endpoint, links: PeerLinks) {
    let PeerLinks { events, outboxes, hello, gate } = links;
    let Silence { stall, retry, attempt } = gate.silence;
    let outbox = &outboxes[to];
    let mut failures_logged = LogLimit::default();
    let mut peer = PeerAddresses::new(endpoint.clone());
    loop {
        let (tcp, address) = connect(to, &mut peer, retry, attempt).await;
        let _ = tcp.set_nodelay(true);
        drop_when_unacknowledged(&tcp, stall);
        let mut stream = PeerStream::plain(tcp);
        let mut chunk = Vec::new();
        let secured =
            glommio::timer::timeout(stall, async { Ok(secure(&mut stream, to, &gate, &mut chunk).await) }).await;
        let failure = match secured {
            Ok(Ok(())) => None,
            Ok(Err(failure)) => Some(failure),
            Err(_) => Some(format!(
                "no {} within {} ms",
                if stream.is_tls() {
                    "TLS handshake, or no answer to this node's challenge,"
                } else {
                    "answer to this node's challenge"
                },
                stall.as_millis()
            )),
        };
        if let Some(reason) = failure {
            gate.count_failure(Direction::Outbound);
            if let Some(left_out) = failures_logged.failure(gate.now_ms(), gate.log_interval_ms) {
                tracing::warn!(
                    peer = to,
                    %address,
                    left_out,
                    "peer connection dropped: {reason}; trying again (logged at most once every {})",
                    log_limit::describe_interval(gate.log_interval_ms)
                );
            }
            let _ = stream.shutdown(std::net::Shutdown::Both).await;
            let _ = stream.close().await;
            glommio::timer::sleep(retry).await;
            continue;
        }
        // The peer has proved it holds the secret and its certificate (or
        // none is asked for): only now is a refusal it sends believed.
        watch_for_refusal(&stream, to, events.clone());
        wire::encode(&Frame::Hello(hello.get()), &mut chunk);
        outbox.borrow_mut().open();
        tracing::info!(peer = to, %endpoint, %address, "connected to peer");
        loop {
            if !chunk.is_empty() {
                outbox.borrow_mut().writing = true;
                let written = write_chunk(&mut stream, &chunk, stall).await;
                outbox.borrow_mut().writing = false;
                if let Err(error) = written {
                    tracing::info!(peer = to, %error, "peer connection lost");
                    break;
                }
                chunk.clear();
            }
            if next_chunk(outbox, &mut chunk).await == Next::Reset {
                tracing::warn!(peer = to, "peer reads too slowly; dropping its connection to start over");
                break;
            }
        }
        outbox.borrow_mut().close();
        // Shutting the socket down also ends the refusal watcher's read
        // on its duplicate descriptor.
        let _ = stream.shutdown(std::net::Shutdown::Both).await;
        let _ = stream.close().await;
        glommio::timer::sleep(retry).await;
    }
}

/// On a connection this node opened to peer `to`, before its hello: with
/// peer TLS, the handshake (the peer's certificate must name its host in
/// `--peers`) and the wait for the peer to admit this node's certificate;
/// with a peer secret, the exchange of proofs, whose own proof goes into
/// `chunk` to be sent with the hello. The error says why the peer is not
/// believed.
async fn secure(stream: &mut PeerStream, to: usize, gate: &Gate, chunk: &mut Vec<u8>) -> Result<(), String> {
    if let Some(peer_tls) = gate.peer_tls() {
        let name = gate.peer_names[to].clone();
        let connection = rustls::ClientConnection::new(peer_tls.current().client, name)
            .map_err(|error| format!("TLS with the peer failed: cannot start TLS: {error}"))?;
        stream.start_tls(rustls::Connection::Client(connection));
        let secured = match stream.handshake().await {
            Ok(()) => stream.await_admission().await.map_err(|failure| (failure, "the wait for it to admit this node")),
            Err(failure) => Err((failure, "the TLS handshake")),
        };
        if let Err((failure, during)) = secured {
            gate.count_tls_error(Direction::Outbound);
            let closed = match &failure {
                TlsFailure::Closed => true,
                TlsFailure::Io(error) => {
                    matches!(error.kind(), std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe)
                }
                TlsFailure::Tls(_) => false,
            };
            let reason = match failure {
                _ if closed => format!(
                    "it closed the connection during {during}: it runs without --peer-tls-cert (its log says so), or \
                     refused this node's certificate"
                ),
                failure => describe_tls_failure(&failure, during),
            };
            return Err(format!("TLS with the peer failed: {reason}"));
        }
    }
    if let Some(key) = &gate.key {
        let proof = prove_to(stream, to, gate, key)
            .await
            .map_err(|reason| format!("the peer did not prove it holds the peer secret: {reason}"))?;
        wire::encode(&Frame::Proof(proof), chunk);
    }
    Ok(())
}

/// What a peer that closes the connection without answering the
/// challenge most likely is.
const ANSWER_WITHOUT_SECRET: &str = "it closed the connection without answering the challenge: it runs without \
                                     --peer-secret-file (its log says so), or is not a ringlock node of this version";

/// On a connection this node opened to peer `to`: sends a challenge, checks
/// that the answer proves `to` holds the peer secret, and returns this
/// node's own proof, to be sent with its hello.
async fn prove_to(stream: &mut PeerStream, to: usize, gate: &Gate, key: &hmac::Key) -> Result<Proof, String> {
    let connector_nonce =
        proof::fresh_nonce(&gate.random).ok_or("the system's random source failed; no nonce to challenge with")?;
    let mut challenge = Vec::with_capacity(CHALLENGE_FRAME_BYTES);
    wire::encode(&Frame::Challenge { nonce: connector_nonce }, &mut challenge);
    stream.write_all(&challenge).await.map_err(|error| format!("cannot send the challenge: {error}"))?;
    let (acceptor_nonce, answer) = match read_first_frame(stream, CHALLENGE_ANSWER_FRAME_BYTES).await {
        Ok(Frame::ChallengeAnswer { nonce, proof }) => (nonce, proof),
        Ok(_) => return Err("it answered the challenge with another frame".to_string()),
        Err(FirstFrameError::Closed) => return Err(ANSWER_WITHOUT_SECRET.to_string()),
        Err(FirstFrameError::Failed(error)) if error.kind() == std::io::ErrorKind::ConnectionReset => {
            return Err(ANSWER_WITHOUT_SECRET.to_string());
        }
        Err(error) => return Err(error.describe("answer to the challenge", None)),
    };
    let nonces = Nonces { connector: connector_nonce, acceptor: acceptor_nonce };
    if !proof::verify(key, Side::Acceptor, &nonces, &answer) {
        return Err("its answer does not check: it holds another peer secret, or is not a ringlock node".to_string());
    }
    let identity = gate.identity;
    if answer.node != to {
        return Err(format!("it proves it is node {}, not node {to}; give every node the same --peers", answer.node));
    }
    if answer.peers_fingerprint != identity.peers_fingerprint {
        return Err(
            "it was started with another --peers list (entries count as written); give every node the same --peers, \
             in the same order"
                .to_string(),
        );
    }
    Ok(proof::prove(key, Side::Connector, &nonces, identity.me, identity.peers_fingerprint))
}

/// A peer's name is looked up again at most this often...
const LOOKUP_INTERVAL: Duration = Duration::from_secs(1);
/// ...and a lookup that takes longer than this is not waited for: the last
/// addresses that the name gave are tried meanwhile.
const LOOKUP_WAIT: Duration = Duration::from_secs(1);

/// Where a peer is: its `--peers` entry, and what its name last resolved to.
struct PeerAddresses {
    endpoint: Endpoint,
    known: Vec<SocketAddr>,
    looked_up: Option<Instant>,
}

impl PeerAddresses {
    fn new(endpoint: Endpoint) -> PeerAddresses {
        let known = endpoint.ip_address().into_iter().collect();
        PeerAddresses { endpoint, known, looked_up: None }
    }

    /// The addresses to try now. A name is looked up again (on a blocking
    /// thread, off the event loop) at most every [`LOOKUP_INTERVAL`], so a
    /// peer that came back with another IP is found; a lookup that fails or
    /// is slow leaves the addresses that worked before.
    async fn now(&mut self) -> Result<Vec<SocketAddr>, String> {
        if self.endpoint.ip_address().is_some() {
            return Ok(self.known.clone());
        }
        let due = self.looked_up.is_none_or(|at| at.elapsed() >= LOOKUP_INTERVAL);
        let mut failure = None;
        if due {
            self.looked_up = Some(Instant::now());
            let endpoint = self.endpoint.clone();
            let lookup = glommio::timer::timeout(LOOKUP_WAIT, async {
                Ok(glommio::executor().spawn_blocking(move || endpoint.resolve()).await)
            })
            .await;
            match lookup {
                Ok(Ok(addresses)) => self.known = addresses,
                Ok(Err(error)) => failure = Some(format!("cannot resolve the name: {error}")),
                Err(_) => failure = Some(format!("the name's lookup took over {} ms", LOOKUP_WAIT.as_millis())),
            }
        }
        match failure {
            Some(failure) if self.known.is_empty() => Err(failure),
            _ if self.known.is_empty() => Err("cannot resolve the name yet".to_string()),
            _ => Ok(self.known.clone()),
        }
    }
}

/// Connects to a peer, by attempts of `attempt` each, `retry` apart, until
/// it answers, and gives the address it reached; logs once that it is
/// unreachable (until it is reached again). Short attempts send a fresh SYN
/// each, so that a peer is reached soon after a partition heals rather than
/// at the next of TCP's doubling SYN retransmissions.
async fn connect(to: usize, peer: &mut PeerAddresses, retry: Duration, attempt: Duration) -> (TcpStream, SocketAddr) {
    let mut logged_down = false;
    loop {
        let failure = match peer.now().await {
            Ok(addresses) => {
                let mut last = None;
                for address in addresses {
                    match TcpStream::connect_timeout(address, attempt).await {
                        Ok(stream) => return (stream, address),
                        Err(error) => last = Some(format!("{address}: {error}")),
                    }
                }
                last.unwrap_or_default()
            }
            Err(failure) => failure,
        };
        if !logged_down {
            tracing::info!(peer = to, endpoint = %peer.endpoint, error = %failure, "peer unreachable; retrying");
            logged_down = true;
        }
        glommio::timer::sleep(retry).await;
    }
}

/// Writes `chunk` piece by piece, each within `stall`: the bound is on
/// progress, so a peer that reads steadily but slower than this node writes
/// is slow, not gone (the outbox bound deals with slow).
async fn write_chunk(stream: &mut PeerStream, chunk: &[u8], stall: Duration) -> glommio::Result<(), ()> {
    for piece in chunk.chunks(WRITE_PIECE_BYTES) {
        glommio::timer::timeout(stall, async { stream.write_all(piece).await.map_err(glommio::GlommioError::from) })
            .await?;
    }
    Ok(())
}

/// What the writer does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    /// Write the chunk it was given.
    Write,
    /// Drop the connection: the peer reads too slowly.
    Reset,
}

/// Waits until the outbox has bytes, and swaps them into `chunk`, or until
/// the connection is to be reset.
async fn next_chunk(outbox: &RefCell<Outbox>, chunk: &mut Vec<u8>) -> Next {
    futures_lite::future::poll_fn(|context| {
        let mut outbox = outbox.borrow_mut();
        if outbox.reset {
            return Poll::Ready(Next::Reset);
        }
        if outbox.buffer.is_empty() {
            outbox.waker = Some(context.waker().clone());
            return Poll::Pending;
        }
        std::mem::swap(&mut outbox.buffer, chunk);
        Poll::Ready(Next::Write)
    })
    .await
}

/// Watches a connection this node opened for the one frame the peer may
/// send on it, a refusal of this node's hello, and reports it. The writer
/// keeps the stream; the watcher reads a duplicate of its descriptor (with
/// TLS, sharing its TLS state). A TLS error shuts the socket, so that the
/// writer starts over.
fn watch_for_refusal(stream: &PeerStream, to: usize, events: Events) {
    let Some(mut watched) = stream.duplicate() else {
        return;
    };
    glommio::spawn_local(async move {
        let mut bytes = [0u8; HELLO_REFUSED_FRAME_BYTES];
        let mut filled = 0;
        while filled < bytes.len() {
            match watched.read(&mut bytes[filled..]).await {
                Ok(0) => return,
                Err(error) => {
                    if watched.is_tls() {
                        tracing::info!(peer = to, %error, "peer connection lost");
                        let _ = watched.shutdown(std::net::Shutdown::Both).await;
                    }
                    return;
                }
                Ok(count) => filled += count,
            }
        }
        match wire::decode(&bytes) {
            Ok(Some((Frame::HelloRefused(refusal), _))) => {
                events.borrow_mut().push(PeerEvent::Refused { from: to, refusal }, 0)
            }
            // A TLS alert record, sent in the clear by a node with peer TLS
            // that could not read this node's hello: that node logs why.
            _ if bytes[..2] == [21, 3] => {}
            _ => tracing::warn!(peer = to, "a peer sent something other than a refusal on this node's connection"),
        }
    })
    .detach();
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    use super::*;
    use crate::cluster::PeerRole;
    use crate::cluster::wire::{MAC_BYTES, NONCE_BYTES};

    fn encoded(frame: &Frame) -> Vec<u8> {
        let mut bytes = Vec::new();
        wire::encode(frame, &mut bytes);
        bytes
    }

    fn challenge() -> Vec<u8> {
        encoded(&Frame::Challenge { nonce: [7; NONCE_BYTES] })
    }

    fn proof() -> Vec<u8> {
        encoded(&Frame::Proof(Proof { node: 0, peers_fingerprint: 1, mac: [9; MAC_BYTES] }))
    }

    fn hello() -> Vec<u8> {
        let hello = Hello {
            version: PROTOCOL_VERSION,
            nodes: 2,
            node: 0,
            incarnation: 1,
            epoch: 0,
            role: PeerRole::Standby,
            peers_fingerprint: 1,
        };
        encoded(&Frame::Hello(hello))
    }

    /// Inbound connections as the acceptor sees them: the node's end of a
    /// socket pair (whose descriptor the queue holds) and the peer's end.
    struct Waiting {
        unintroduced: Unintroduced,
        sockets: Vec<(UnixStream, UnixStream)>,
    }

    impl Waiting {
        /// `UNINTRODUCED_MAX` connections, oldest first: the first ones
        /// expect and have sent what `first` says, the others expect a
        /// hello and have sent nothing.
        fn new(first: &[(Expecting, &[u8])]) -> Waiting {
            let mut waiting = Waiting { unintroduced: Unintroduced::default(), sockets: Vec::new() };
            for index in 0..UNINTRODUCED_MAX {
                let (expecting, sent) = first.get(index).copied().unwrap_or((Expecting::Hello, &[]));
                waiting.arrive(expecting, sent);
            }
            waiting
        }

        /// A new connection, which expects `expecting` and has sent `sent`.
        fn arrive(&mut self, expecting: Expecting, sent: &[u8]) {
            let (node_end, mut peer_end) = UnixStream::pair().unwrap();
            peer_end.write_all(sent).unwrap();
            let id = self.unintroduced.next_id;
            self.unintroduced.next_id += 1;
            self.unintroduced.waiting.push_back((id, node_end.as_raw_fd(), expecting));
            self.sockets.push((node_end, peer_end));
        }

        fn ids(&self) -> Vec<u64> {
            self.unintroduced.waiting.iter().map(|&(id, _, _)| id).collect()
        }

        /// Whether the node's end of connection `index` was shut.
        fn was_shut(&mut self, index: usize) -> bool {
            let peer_end = &mut self.sockets[index].1;
            peer_end.set_nonblocking(true).unwrap();
            matches!(peer_end.read(&mut [0u8; 1]), Ok(0))
        }
    }

    #[test]
    fn room_is_made_by_shutting_the_oldest_that_has_not_sent_what_it_owes() {
        // The oldest two have sent, whole, the frames they owe; the third
        // has sent half a challenge, the fourth a proof without its last
        // byte: the third goes, the oldest that owes something.
        let (challenge, proof) = (challenge(), proof());
        let mut waiting = Waiting::new(&[
            (Expecting::Challenge, &challenge),
            (Expecting::Proof, &proof),
            (Expecting::Challenge, &challenge[..20]),
            (Expecting::Proof, &proof[..proof.len() - 1]),
        ]);
        assert!(waiting.unintroduced.make_room());
        let mut expected: Vec<u64> = (0..UNINTRODUCED_MAX as u64).collect();
        expected.remove(2);
        assert_eq!(waiting.ids(), expected);
        assert!(waiting.was_shut(2));
        assert!(!waiting.was_shut(0) && !waiting.was_shut(1) && !waiting.was_shut(3));
        // Next time, the proof without its last byte.
        waiting.arrive(Expecting::Hello, &[]);
        assert!(waiting.unintroduced.make_room());
        assert!(waiting.was_shut(3));
        assert_eq!(waiting.ids()[..3], [0, 1, 4]);
    }

    #[test]
    fn a_proof_keeps_its_place_before_its_hello_arrives() {
        // The Hello is sent with the proof but may come in a later segment:
        // a whole proof alone is what the connection owes.
        let proof = proof();
        let mut waiting = Waiting::new(&[(Expecting::Proof, &proof)]);
        assert!(waiting.unintroduced.make_room());
        assert_eq!(waiting.ids()[0], 0);
        assert_eq!(waiting.ids()[1], 2);
        assert!(waiting.was_shut(1) && !waiting.was_shut(0));
    }

    #[test]
    fn bytes_of_the_wrong_frame_do_not_keep_a_place() {
        // As many bytes as the frame owed, but not that frame: garbage
        // where a hello is owed, a challenge (and a byte) where a proof is.
        let garbage = [b'x'; HELLO_FRAME_BYTES];
        let mut challenge_and_more = challenge();
        challenge_and_more.push(0);
        assert_eq!(challenge_and_more.len(), PROOF_FRAME_BYTES);
        let hello = hello();
        let mut waiting = Waiting::new(&[
            (Expecting::Hello, &garbage),
            (Expecting::Proof, &challenge_and_more),
            (Expecting::Hello, &hello),
        ]);
        assert!(waiting.unintroduced.make_room());
        waiting.arrive(Expecting::Hello, &[]);
        assert!(waiting.unintroduced.make_room());
        assert!(waiting.was_shut(0) && waiting.was_shut(1) && !waiting.was_shut(2));
        assert_eq!(waiting.ids()[0], 2);
    }

    #[test]
    fn with_peer_tls_a_connection_keeps_its_place_only_with_a_whole_tls_record_waiting() {
        // A handshake record of 40 bytes: its header and 40 bytes whole, a
        // byte short, and a peer hello in the clear instead.
        let mut record = vec![22, 3, 1, 0, 40];
        record.extend([0x42; 40]);
        let hello = hello();
        let mut waiting = Waiting::new(&[
            (Expecting::TlsRecord, &record),
            (Expecting::TlsRecord, &record[..record.len() - 1]),
            (Expecting::TlsRecord, &hello),
        ]);
        assert!(waiting.unintroduced.make_room());
        assert!(waiting.was_shut(1) && !waiting.was_shut(0));
        waiting.arrive(Expecting::Hello, &[]);
        assert!(waiting.unintroduced.make_room());
        assert!(waiting.was_shut(2) && !waiting.was_shut(0));
        assert_eq!(waiting.ids()[0], 0);
    }

    #[test]
    fn no_room_when_every_waiting_connection_has_sent_what_it_owes() {
        let hello = hello();
        let all: Vec<(Expecting, &[u8])> = vec![(Expecting::Hello, &hello); UNINTRODUCED_MAX];
        let mut waiting = Waiting::new(&all);
        assert!(!waiting.unintroduced.make_room());
        assert_eq!(waiting.ids().len(), UNINTRODUCED_MAX);
        assert!(!waiting.was_shut(0));
    }
}
