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
//! The tasks here only move bytes. What they read becomes a [`PeerEvent`] in a
//! queue the replication loop drains; what the loop sends goes into the
//! peer's [`Outbox`], which the peer's writer task empties.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::Duration;

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::{TcpListener, TcpStream};

use crate::cluster::wire::{
    self, Frame, HELLO_FRAME_BYTES, HELLO_REFUSED_FRAME_BYTES, Hello, PROTOCOL_VERSION, Refusal,
};

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

/// How long a new inbound connection may take to say who it is.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

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
}

/// Who this node is, for its hellos and to check the peers'.
#[derive(Clone, Copy, Debug)]
pub struct Identity {
    pub me: usize,
    pub nodes: usize,
    /// [`wire::peers_fingerprint`] of this node's `--peers`.
    pub peers_fingerprint: u64,
}

/// Accepts peer connections for as long as the executor runs.
pub async fn accept(listener: TcpListener, identity: Identity, events: Events) {
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
                let introduction = Introduction::register(&unintroduced, &stream);
                let task = read(stream, next_connection, identity, events.clone(), introduction);
                glommio::spawn_local(task).detach();
            }
            Err(error) => {
                tracing::warn!(%error, "cannot accept a peer connection");
                glommio::timer::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// The inbound connections that have not said hello yet, oldest first,
/// each by its id and its socket.
#[derive(Default)]
struct Unintroduced {
    next_id: u64,
    waiting: VecDeque<(u64, RawFd)>,
}

impl Unintroduced {
    /// Makes room for one more: if [`UNINTRODUCED_MAX`] are waiting, shuts
    /// the oldest that has not sent a whole hello (its read ends, and its
    /// task with it). A peer sends its hello as soon as it connects, so
    /// connections that send nothing or trickle, however many and however
    /// often reopened, never keep it out: it would have to be the oldest
    /// of them. False if every waiting one has its whole hello in its socket.
    fn make_room(&mut self) -> bool {
        if self.waiting.len() < UNINTRODUCED_MAX {
            return true;
        }
        let Some(oldest) = self.waiting.iter().position(|&(_, fd)| !hello_waiting(fd)) else {
            return false;
        };
        let (_, fd) = self.waiting.remove(oldest).expect("a position in the queue");
        // SAFETY: the fd is open: an entry leaves the queue in the same
        // synchronous drop as its stream, on this thread (see Introduction),
        // and this runs on this thread too. Its task logs the take-over.
        unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
        true
    }
}

/// Whether a whole, well-formed hello waits to be read on `fd`, looked at
/// without reading it and without waiting (40 bytes of anything else do
/// not protect a connection from being taken over).
fn hello_waiting(fd: RawFd) -> bool {
    let mut hello = [0u8; HELLO_FRAME_BYTES];
    // SAFETY: a peek into a local buffer of this length.
    let peeked = unsafe { libc::recv(fd, hello.as_mut_ptr().cast(), hello.len(), libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    usize::try_from(peeked).is_ok_and(|peeked| peeked == HELLO_FRAME_BYTES)
        && matches!(wire::decode(&hello), Ok(Some((Frame::Hello(_), _))))
}

/// A connection's entry among the [`Unintroduced`], removed when it has
/// said hello (or failed to) or when its task ends, before its stream is
/// dropped, so that the queue never holds a closed descriptor.
struct Introduction {
    queue: Rc<RefCell<Unintroduced>>,
    id: u64,
}

impl Introduction {
    fn register(queue: &Rc<RefCell<Unintroduced>>, stream: &TcpStream) -> Introduction {
        let mut unintroduced = queue.borrow_mut();
        let id = unintroduced.next_id;
        unintroduced.next_id += 1;
        unintroduced.waiting.push_back((id, stream.as_raw_fd()));
        Introduction { queue: queue.clone(), id }
    }
}

impl Introduction {
    /// Ends the wait for the hello; false if a newer connection took this
    /// one's place meanwhile (and shut it).
    fn end(self) -> bool {
        let mut queue = self.queue.borrow_mut();
        let before = queue.waiting.len();
        queue.waiting.retain(|&(id, _)| id != self.id);
        queue.waiting.len() < before
    }
}

impl Drop for Introduction {
    fn drop(&mut self) {
        self.queue.borrow_mut().waiting.retain(|&(id, _)| id != self.id);
    }
}

/// Reads one inbound connection: its hello, then frames until it ends.
async fn read(mut stream: TcpStream, connection: u64, identity: Identity, events: Events, introduction: Introduction) {
    let peer_address = stream.peer_addr().ok();
    let hello = glommio::timer::timeout(HELLO_TIMEOUT, async { Ok(read_hello(&mut stream).await) }).await;
    if !introduction.end() {
        tracing::warn!(
            peer = ?peer_address,
            "peer connection closed: it had not sent a hello when {UNINTRODUCED_MAX} newer connections waited for \
             theirs"
        );
        return;
    }
    let checked = match hello {
        Ok(Ok(hello)) => check_hello(&hello, identity),
        Ok(Err(reason)) => Err(HelloError::Unreadable(reason)),
        Err(_) => Err(HelloError::Unreadable(format!("no hello within {} s", HELLO_TIMEOUT.as_secs()))),
    };
    let from = match checked {
        Ok(from) => from,
        Err(HelloError::Unreadable(reason)) => {
            tracing::warn!(peer = ?peer_address, "peer connection refused: {reason}");
            return;
        }
        Err(HelloError::Refused(refusal, reason)) => {
            // A ringlock node of this version with other settings: say so
            // loudly here, and tell it, so that neither serves as active.
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
    events.borrow_mut().push(PeerEvent::Opened { from, connection }, 0);
    let mut buffer = ReadBuffer::new();
    loop {
        while events.borrow().is_full() {
            glommio::timer::sleep(Duration::from_millis(1)).await;
        }
        match next_frame(&mut stream, &mut buffer).await {
            Ok(Some((frame, bytes))) => events.borrow_mut().push(PeerEvent::Frame { from, connection, frame }, bytes),
            Ok(None) => break,
            Err(reason) => {
                tracing::warn!(peer = from, address = ?peer_address, "peer connection dropped: {reason}");
                break;
            }
        }
    }
    events.borrow_mut().push(PeerEvent::Closed { from, connection }, 0);
}

/// Why a hello was not taken.
enum HelloError {
    /// Not a hello of this protocol version: the connection is just closed.
    Unreadable(String),
    /// A well-formed hello of a node with other settings, which is told why.
    Refused(Refusal, String),
}

/// Reads exactly one hello frame: a connection that has not said who it is
/// gets no more buffer than that.
async fn read_hello(stream: &mut TcpStream) -> Result<Hello, String> {
    let mut bytes = [0u8; HELLO_FRAME_BYTES];
    let mut filled = 0;
    while filled < HELLO_FRAME_BYTES {
        match stream.read(&mut bytes[filled..]).await {
            Ok(0) if filled == 0 => return Err("closed before its hello".to_string()),
            Ok(0) => return Err("closed in the middle of a frame, before its hello was whole".to_string()),
            Ok(count) => filled += count,
            Err(error) => return Err(format!("read failed before its hello: {error}")),
        }
        // The length prefix alone can tell that this is no hello.
        let announced = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
        if filled >= 4 && announced != HELLO_FRAME_BYTES - 4 {
            return Err(format!(
                "unreadable frame: it did not start with a hello (a frame of {announced} bytes announced, a hello has {})",
                HELLO_FRAME_BYTES - 4
            ));
        }
    }
    match wire::decode(&bytes) {
        Ok(Some((Frame::Hello(hello), _))) => Ok(hello),
        Ok(_) => Err("it did not start with a hello".to_string()),
        Err(error) => Err(format!("unreadable hello: {error}")),
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

/// The next frame of a connection and its bytes; `Ok(None)` when it closed cleanly.
async fn next_frame(stream: &mut TcpStream, buffer: &mut ReadBuffer) -> Result<Option<(Frame, usize)>, String> {
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
        let read = stream.read(&mut bytes[filled..]).await;
        match read {
            Ok(0) => {
                bytes.truncate(filled);
                return if filled == 0 { Ok(None) } else { Err("closed in the middle of a frame".to_string()) };
            }
            Ok(count) => bytes.truncate(filled + count),
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
                "node {} was started with another --peers list (other client addresses or another order); give every \
                 node the same --peers, in the same order",
                hello.node
            ),
        ));
    }
    Ok(hello.node)
}

/// Keeps a connection to peer `to` open and sends what its outbox gets.
/// `hello` is read at each connection, so it carries the node's latest role.
pub async fn write(to: usize, address: SocketAddr, links: PeerLinks, retry: Duration, stall: Duration) {
    let PeerLinks { events, outboxes, hello } = links;
    let outbox = &outboxes[to];
    loop {
        let mut stream = connect(to, address, retry, stall).await;
        let _ = stream.set_nodelay(true);
        watch_for_refusal(&stream, to, events.clone());
        let mut chunk = Vec::new();
        wire::encode(&Frame::Hello(hello.get()), &mut chunk);
        outbox.borrow_mut().open();
        tracing::info!(peer = to, %address, "connected to peer");
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

/// Connects to peer `to`, trying again every `retry` until it answers; logs
/// once that it is unreachable.
async fn connect(to: usize, address: SocketAddr, retry: Duration, stall: Duration) -> TcpStream {
    let mut logged_down = false;
    loop {
        match TcpStream::connect_timeout(address, stall).await {
            Ok(stream) => return stream,
            Err(error) => {
                if !logged_down {
                    tracing::info!(peer = to, %address, %error, "peer unreachable; retrying");
                    logged_down = true;
                }
                glommio::timer::sleep(retry).await;
            }
        }
    }
}

/// Writes `chunk` piece by piece, each within `stall`: the bound is on
/// progress, so a peer that reads steadily but slower than this node writes
/// is slow, not gone (the outbox bound deals with slow).
async fn write_chunk(stream: &mut TcpStream, chunk: &[u8], stall: Duration) -> glommio::Result<(), ()> {
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
/// keeps the stream; the watcher reads a duplicate of its descriptor.
fn watch_for_refusal(stream: &TcpStream, to: usize, events: Events) {
    use std::os::fd::{AsRawFd, FromRawFd};
    // SAFETY: duplicating a descriptor the stream owns; the copy is owned
    // by the watcher's stream, which closes it.
    let fd = unsafe { libc::dup(stream.as_raw_fd()) };
    if fd < 0 {
        return;
    }
    // SAFETY: `fd` is a fresh descriptor of a connected TCP socket.
    let mut watched = unsafe { TcpStream::from_raw_fd(fd) };
    glommio::spawn_local(async move {
        let mut bytes = [0u8; HELLO_REFUSED_FRAME_BYTES];
        let mut filled = 0;
        while filled < bytes.len() {
            match watched.read(&mut bytes[filled..]).await {
                Ok(0) | Err(_) => return,
                Ok(count) => filled += count,
            }
        }
        match wire::decode(&bytes) {
            Ok(Some((Frame::HelloRefused(refusal), _))) => {
                events.borrow_mut().push(PeerEvent::Refused { from: to, refusal }, 0)
            }
            _ => tracing::warn!(peer = to, "a peer sent something other than a refusal on this node's connection"),
        }
    })
    .detach();
}
