//! One persistent connection to one node, and its two threads.
//!
//! - The **reader** thread owns the connection's life: it connects, reads and
//!   pairs replies, and when the socket breaks it takes every request in
//!   flight back to the router (which moves or retries them) and connects
//!   again: at once, then after the growing pauses of `backoff`.
//! - The **writer** thread sends what callers queued. Callers only append
//!   encoded lines to the connection's buffer under its lock, so no caller,
//!   and no async task, ever blocks on a socket, even when the server stalls.
//!   Everything queued while a write is under way goes out in the next single
//!   `write`, which is what makes pipelining from many threads cheap: on
//!   loopback a `write` costs about as much as the server's work for the
//!   requests in it, so batching matters more than the writer thread's
//!   wake-up. (Letting blocking callers write their own requests, to save
//!   that wake-up, measured two to three times slower with 64 threads.)
//! - The reader wakes the callers each read completed in one pass once it
//!   has paired the whole read, or, if the writer is idle, hands that pass
//!   to the writer: the writer is then busy while the woken callers queue
//!   their next requests, so they do not wake it one by one, and it sends
//!   them together when the pass is over. A writer busy writing (a stalled
//!   server, say) never holds up a wake-up: the reader makes those itself.
//!
//! With TLS ([`ClientBuilder::tls_ca`](crate::ClientBuilder::tls_ca)) the
//! socket's TLS state is part of the connection's state: the writer
//! encrypts each batch under the lock, as one piece, so that requests queued
//! together still leave in one `write` (and one TLS record up to 16 KiB),
//! then writes the ciphertext unlocked; the reader reads ciphertext
//! unlocked and decrypts it under the lock into its own buffer. Only the
//! writer writes once a connection is up, so the records go out in the
//! order they were sealed. A plain connection takes none of these steps.
//!
//! A request is recorded in the pairing table and appended to the output
//! buffer under the same lock, so the table's order for an (op, key) is the
//! order the lines go out on the wire.
//!
//! The reader reads with a timeout of one liveness tick; each time a read
//! times out it asks the connection's watch (`liveness`) whether a reply is
//! overdue, sends the connection's own `P` if so, and cuts the connection
//! if not even that was answered in time, as it does a broken one.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use rustls::ClientConnection;

use crate::backoff::{Jitter, reconnect_delay};
use crate::completion::{Submitted, Wakes};
use crate::config::ClientBuilder;
use crate::error::{ConnectionFailure, ProtocolError};
use crate::liveness::{Liveness, Verdict, tune_socket};
use crate::operation::{Cut, Policy, Step};
use crate::pairing::Pairing;
use crate::proto::{Decoded, ErrorCode, Op, REPLY_LINE_LEN_MAX, Reply, decode_reply};

/// Ciphertext the reader of a TLS connection asks the socket for at once:
/// the plaintext it decrypts to always fits in rustls's receive buffer.
const TLS_READ_BYTES: usize = 16 << 10;
/// Bytes the reader asks the socket for at once; a reply line of
/// [`REPLY_LINE_LEN_MAX`] always fits in the buffer with room to spare.
const READ_BUFFER_BYTES: usize = 2 * REPLY_LINE_LEN_MAX;
/// How long a closing client keeps trying to flush what was queued (the
/// releases of dropped locks) before it closes the socket.
const CLOSE_LINGER: Duration = Duration::from_secs(1);

/// What a connection's reader needs from the connection set it belongs to
/// (the router): the settings, and where requests taken back from a
/// connection, paired replies and news of the node go. The router
/// implements it; the connection knows nothing else of it.
pub(crate) trait ConnectionSet: Send + Sync + 'static {
    /// The client's settings.
    fn config(&self) -> &ClientBuilder;
    /// The retry rules requests follow.
    fn policy(&self) -> &Policy;
    /// A connection authenticated as `name`.
    fn note_name(&self, name: String);
    /// A connection just came up: the requests waiting for one go now.
    fn connection_up(&self);
    /// Sleeps for `pause`, or less if the client closes; false if it closed.
    fn sleep(&self, pause: Duration) -> bool;
    /// Takes back the requests of a connection that was cut; `answered`
    /// if it had answered anything before.
    fn cut(self: &Arc<Self>, operations: Vec<Submitted>, cut: &Cut, answered: bool);
    /// Ends requests that can go nowhere because the client is closing.
    fn abort(self: &Arc<Self>, operations: Vec<Submitted>);
    /// Learns from an `M` reply received on a connection of node `from`.
    fn note_moved(self: &Arc<Self>, from: usize, moved: Moved);
    /// Carries out `step` for `operation`, whose reply was just paired; the
    /// wake-up of a request that ends is added to `wakes`.
    fn handle(self: &Arc<Self>, operation: Submitted, step: Step, wakes: &mut Wakes);
}

/// What an `M` reply said of the active node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Moved {
    /// The active node's address.
    To(String),
    /// No active is known (`-`).
    Unknown,
}

impl Moved {
    pub(crate) fn from_field(active: Option<&[u8]>) -> Moved {
        match active {
            Some(address) => Moved::To(String::from_utf8_lossy(address).into_owned()),
            None => Moved::Unknown,
        }
    }
}

/// Where a connection is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Its first connect is under way. It takes requests, which go out once
    /// connected (or move on if the connect fails), so a new client or a
    /// node learned from `M` serves at once.
    Connecting,
    /// Connected.
    Up,
    /// Broken; left out until the reader reconnects it.
    Down,
    /// The client is closing.
    Closed,
}

impl Phase {
    fn takes_requests(self) -> bool {
        matches!(self, Phase::Connecting | Phase::Up)
    }
}

/// Why a connection did not take a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    Unusable,
    Full,
}

/// One connection's shared state; its threads and the callers that queue
/// requests on it hold it by `Arc`.
#[derive(Debug)]
pub(crate) struct Connection {
    /// The node's address, as the client was given it or learned it.
    pub(crate) address: Arc<str>,
    /// The node's index in the router.
    pub(crate) node: usize,
    state: Mutex<State>,
    writer_wake: Condvar,
}

#[derive(Debug)]
struct State {
    phase: Phase,
    stream: Option<Arc<TcpStream>>,
    /// The socket's TLS state, on a TLS connection.
    tls: Option<Box<ClientConnection>>,
    /// The buffer of the last batch's plaintext on a TLS connection, kept to
    /// encrypt the next one into.
    sealed: Vec<u8>,
    /// Encoded requests not yet handed to the writer.
    out: Vec<u8>,
    in_flight: Pairing<Submitted>,
    /// The writer thread is waiting for work, so a caller must wake it.
    writer_idle: bool,
    /// The buffer of the last batch written, kept to swap with `out`.
    spare: Vec<u8>,
    /// Wake-ups the reader handed to the idle writer to make, before it
    /// writes what the woken callers queue.
    owed: Wakes,
    /// How the last connect failed or the last socket broke, and when.
    last_failure: Option<(Instant, ConnectionFailure)>,
    /// Whether the socket still answers.
    liveness: Liveness,
}

impl State {
    /// Whether the writer has something to send: requests, or what the TLS
    /// state has to say (a key update's answer, say).
    fn has_output(&self) -> bool {
        !self.out.is_empty() || self.tls.as_ref().is_some_and(|tls| tls.wants_write())
    }
}

impl Connection {
    pub(crate) fn new(address: Arc<str>, node: usize, suspect_after: Duration, ping_timeout: Duration) -> Connection {
        Connection {
            address,
            node,
            state: Mutex::new(State {
                phase: Phase::Connecting,
                stream: None,
                tls: None,
                sealed: Vec::new(),
                out: Vec::new(),
                in_flight: Pairing::new(),
                writer_idle: false,
                spare: Vec::new(),
                owed: Wakes::default(),
                last_failure: None,
                liveness: Liveness::new(suspect_after, ping_timeout, Instant::now()),
            }),
            writer_wake: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update keeps the state valid, so a panic elsewhere while
        // holding the lock does not poison the connection.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn phase(&self) -> Phase {
        self.lock().phase
    }

    /// How the last connect failed or the last socket broke, and when.
    pub(crate) fn last_failure(&self) -> Option<(Instant, ConnectionFailure)> {
        self.lock().last_failure.clone()
    }

    fn note_failure(&self, failure: ConnectionFailure) {
        self.lock().last_failure = Some((Instant::now(), failure));
    }

    /// Queues `operation` on this connection, or gives it back with the
    /// reason if the connection takes no requests now.
    pub(crate) fn try_send(
        &self,
        operation: Submitted,
        now: Instant,
        in_flight_max: usize,
    ) -> Result<(), (Submitted, Refusal)> {
        let state = self.lock();
        if !state.phase.takes_requests() {
            return Err((operation, Refusal::Unusable));
        }
        if state.in_flight.len() >= in_flight_max {
            return Err((operation, Refusal::Full));
        }
        self.queue(state, operation, now);
        Ok(())
    }

    /// Sends `operation` on this connection, whose lock `state` is.
    fn queue(&self, mut state: MutexGuard<'_, State>, mut operation: Submitted, now: Instant) {
        if state.in_flight.len() == 0 {
            state.liveness.note_busy(now);
        }
        operation.encode(now, &mut state.out);
        operation.went_out(now);
        state.in_flight.push(operation);
        // A busy writer takes it in its next batch; before the connect, the
        // writer is woken once connected.
        let wake_writer = state.stream.is_some() && std::mem::replace(&mut state.writer_idle, false);
        // Woken while this thread still held the lock, the writer could be
        // switched in only to block on it and switch back.
        drop(state);
        if wake_writer {
            self.writer_wake.notify_one();
        }
    }

    /// A read timed out at `now`: sends the connection's own `P` if a reply
    /// is overdue; the silence's length if the connection is to be cut.
    fn watch(&self, now: Instant, policy: &Policy) -> Option<Duration> {
        let mut state = self.lock();
        let busy = state.in_flight.len() > 0;
        match state.liveness.check(now, busy) {
            Verdict::Quiet => None,
            Verdict::Ping => {
                // Over the in-flight limit if need be: the probe is one line.
                self.queue(state, Submitted::probe(now, policy), now);
                None
            }
            Verdict::Cut(silence) => Some(silence),
        }
    }

    /// Writes `out` in batches until it is empty; returns the lock.
    fn write_out<'a>(&'a self, mut state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        while let Some(stream) = state.stream.clone()
            && state.has_output()
        {
            let mut batch = std::mem::take(&mut state.spare);
            std::mem::swap(&mut batch, &mut state.out);
            if state.tls.is_some() {
                // The whole batch is sealed at once, under the lock, so
                // that it leaves in one write whatever the reader does.
                let mut sealed = std::mem::take(&mut state.sealed);
                crate::tls::encrypt(state.tls.as_mut().expect("checked above"), &batch, &mut sealed);
                batch.clear();
                std::mem::swap(&mut batch, &mut sealed);
                state.sealed = sealed;
            }
            let closing = state.phase == Phase::Closed;
            drop(state);
            if closing {
                let _ = stream.set_write_timeout(Some(CLOSE_LINGER));
            }
            if (&*stream).write_all(&batch).is_err() {
                // The reader sees the socket fail and takes the requests back.
                let _ = stream.shutdown(Shutdown::Both);
            }
            batch.clear();
            state = self.lock();
            state.spare = batch;
        }
        state
    }

    /// Makes a fresh socket the connection's; false if the client closed
    /// with nothing queued. Requests queued while the first connect was under
    /// way (the release of a lock dropped with its client) still go out on
    /// it before the writer closes it.
    fn install(&self, stream: Arc<TcpStream>, tls: Option<Box<ClientConnection>>) -> bool {
        let mut state = self.lock();
        if state.phase == Phase::Closed && state.out.is_empty() {
            return false;
        }
        if state.phase != Phase::Closed {
            state.phase = Phase::Up;
        }
        state.stream = Some(stream);
        state.tls = tls;
        state.liveness.reset(Instant::now());
        // Requests queued while the first connect was under way go out now.
        self.writer_wake.notify_one();
        true
    }

    /// Marks the connection broken and takes back every request in flight
    /// and everything not yet written.
    fn take_down(&self) -> Vec<Submitted> {
        let mut state = self.lock();
        if state.phase != Phase::Closed {
            state.phase = Phase::Down;
        }
        state.stream = None;
        state.tls = None;
        state.out.clear();
        // A closing writer waiting for the first connect's outcome may go.
        self.writer_wake.notify_one();
        state.in_flight.drain()
    }

    /// Starts closing: the writer flushes what is queued and closes the
    /// socket, and the reader stops.
    pub(crate) fn close(&self) {
        let mut state = self.lock();
        state.phase = Phase::Closed;
        self.writer_wake.notify_one();
    }
}

/// Starts the connection's reader and writer threads.
pub(crate) fn spawn<S: ConnectionSet>(connection: Arc<Connection>, set: Arc<S>) {
    let writer = connection.clone();
    thread::Builder::new()
        .name(format!("ringlock-write {}", connection.address))
        .spawn(move || run_writer(&writer))
        .expect("spawn a ringlock client writer thread");
    thread::Builder::new()
        .name(format!("ringlock-read {}", connection.address))
        .spawn(move || run_reader(&connection, &set))
        .expect("spawn a ringlock client reader thread");
}

/// Connects to the first address `address` resolves to that answers, with
/// TCP keepalive and `TCP_USER_TIMEOUT` of `user_timeout` on the socket.
fn connect(address: &str, timeout: Duration, user_timeout: Duration) -> io::Result<TcpStream> {
    let mut last_error = io::Error::new(io::ErrorKind::NotFound, "the address resolves to nothing");
    let candidates: Vec<SocketAddr> = address.to_socket_addrs()?.collect();
    for candidate in candidates {
        match TcpStream::connect_timeout(&candidate, timeout) {
            Ok(stream) => {
                stream.set_nodelay(true)?;
                tune_socket(&stream, user_timeout);
                return Ok(stream);
            }
            Err(error) => last_error = error,
        }
    }
    Err(last_error)
}

fn run_reader<S: ConnectionSet>(connection: &Connection, set: &Arc<S>) {
    let config = set.config();
    let mut jitter = Jitter::new();
    // Reconnect attempts since a connection last worked; the first goes at
    // once, the others after growing pauses.
    let mut attempt: u32 = 0;
    loop {
        let started = Instant::now();
        let user_timeout = config.suspect_after.saturating_add(config.ping_timeout);
        let connected = connect(&connection.address, config.connect_timeout, user_timeout).and_then(|stream| {
            let tls = match &config.tls_config {
                Some(tls) => Some(Box::new(crate::tls::handshake(
                    tls,
                    config.tls.server_name.as_deref(),
                    &connection.address,
                    &stream,
                    started + config.connect_timeout,
                )?)),
                None => None,
            };
            Ok((stream, tls))
        });
        match connected {
            Ok((stream, mut tls)) => {
                let stream = Arc::new(stream);
                if let Some(secret) = &config.secret {
                    let outcome = authenticate(
                        &stream,
                        tls.as_deref_mut(),
                        &connection.address,
                        &secret.0,
                        config.connect_timeout,
                    );
                    match outcome {
                        Ok(name) => set.note_name(name),
                        Err(failure) => {
                            // A refused secret fails the connection like a
                            // failed connect: its requests move on or wait,
                            // and the attempt count is not reset, so a wrong
                            // secret is retried with growing pauses.
                            let _ = stream.shutdown(Shutdown::Both);
                            connection.note_failure(failure);
                            let operations = connection.take_down();
                            set.cut(operations, &Cut::Io, false);
                            let pause = reconnect_delay(
                                attempt,
                                config.reconnect_delay_first,
                                config.reconnect_delay_max,
                                jitter.draw(),
                            );
                            attempt = attempt.saturating_add(1);
                            if !set.sleep(pause) {
                                break;
                            }
                            continue;
                        }
                    }
                }
                let is_tls = tls.is_some();
                // Reads wake the reader at least once a tick, to watch for
                // silence (see `liveness`).
                // This cannot fail on an open socket with a timeout above
                // zero; if it did, keepalive and TCP_USER_TIMEOUT would
                // still end a silent connection, later.
                let _ = stream.set_read_timeout(Some(Liveness::tick(config.suspect_after, config.ping_timeout)));
                if !connection.install(stream.clone(), tls) {
                    let _ = stream.shutdown(Shutdown::Both);
                    break;
                }
                set.connection_up();
                let opened = Instant::now();
                let mut session = Session::default();
                let cut = read_replies(connection, set, &stream, is_tls, &mut session);
                let _ = stream.shutdown(Shutdown::Both);
                connection.note_failure(session.failure(&connection.address, &cut));
                let operations = connection.take_down();
                set.cut(operations, &cut, session.replied);
                // A connection that answered, or stayed open for as long as
                // the longest pause, worked: the schedule starts over. One
                // closed at once after its connect (a server refusing
                // connections, a listener of a killed process) did not, or
                // the client would reconnect to it in a tight loop.
                if session.replied || opened.elapsed() >= config.reconnect_delay_max {
                    attempt = 0;
                }
            }
            Err(error) => {
                connection.note_failure(ConnectionFailure::from_io(&connection.address, &error));
                // Only a first connect has requests queued to hand back.
                let operations = connection.take_down();
                set.cut(operations, &Cut::Io, false);
            }
        }
        let pause = reconnect_delay(attempt, config.reconnect_delay_first, config.reconnect_delay_max, jitter.draw());
        attempt = attempt.saturating_add(1);
        if !set.sleep(pause) {
            break;
        }
    }
    set.abort(connection.take_down());
}

/// How long a connection waits for the answer to its `U` line beyond the
/// connect timeout: the server answers a wrong secret only after 200 ms.
const AUTH_REPLY_MARGIN: Duration = Duration::from_secs(1);

/// Sends `U <secret>` on a fresh socket, before any request, and reads the
/// answer: the name the secret belongs to, or why the connection cannot be
/// used. Nothing else is in flight yet, so the answer is the first line and
/// is read here rather than paired (`U` replies carry no key).
fn authenticate(
    stream: &TcpStream,
    tls: Option<&mut ClientConnection>,
    address: &str,
    secret: &str,
    timeout: Duration,
) -> Result<String, ConnectionFailure> {
    let io_failure = |error: &io::Error| ConnectionFailure::from_io(address, error);
    stream.set_read_timeout(Some(timeout + AUTH_REPLY_MARGIN)).map_err(|error| io_failure(&error))?;
    let mut socket = stream;
    let name = match tls {
        Some(tls) => exchange_secret(&mut rustls::Stream::new(tls, &mut socket), address, secret),
        None => exchange_secret(&mut socket, address, secret),
    }?;
    stream.set_read_timeout(None).map_err(|error| io_failure(&error))?;
    Ok(name)
}

/// Writes the `U` line on `io` and reads its answer (see [`authenticate`]).
fn exchange_secret(io: &mut (impl Read + Write), address: &str, secret: &str) -> Result<String, ConnectionFailure> {
    let io_failure = |error: &io::Error| ConnectionFailure::from_io(address, error);
    let mut line = Vec::with_capacity(secret.len() + 3);
    line.extend_from_slice(b"U ");
    line.extend_from_slice(secret.as_bytes());
    line.push(b'\n');
    io.write_all(&line).and_then(|()| io.flush()).map_err(|error| io_failure(&error))?;
    // Byte by byte, so that nothing after the answer is taken from the
    // reader (over TLS, what follows stays in the TLS state's plaintext);
    // this happens once per connection.
    let mut reply = Vec::new();
    let mut byte = [0u8; 1];
    while reply.last() != Some(&b'\n') {
        match io.read(&mut byte) {
            Ok(0) => return Err(ConnectionFailure::closed(address)),
            Ok(_) if reply.len() > REPLY_LINE_LEN_MAX => {
                return Err(protocol_failure(address, &ProtocolError::LineTooLong));
            }
            Ok(_) => reply.push(byte[0]),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(io_failure(&error)),
        }
    }
    let reply = match decode_reply(&reply) {
        Decoded::Line { item: Ok(reply), .. } => reply,
        Decoded::Line { item: Err(error), .. } => {
            return Err(protocol_failure(address, &ProtocolError::Malformed(error)));
        }
        Decoded::Incomplete | Decoded::LineTooLong => {
            return Err(protocol_failure(address, &ProtocolError::LineTooLong));
        }
    };
    match reply {
        Reply::Authenticated { name } => Ok(String::from_utf8_lossy(name).into_owned()),
        Reply::Error { op: Some(Op::Authenticate), code, .. }
            if matches!(code, ErrorCode::AuthFailed | ErrorCode::AuthDisabled) =>
        {
            Err(ConnectionFailure::auth(address, code))
        }
        Reply::Error { op: None, code, .. } => Err(refused_failure(address, code)),
        other => {
            let mut line = Vec::new();
            crate::proto::encode_reply(&other, &mut line);
            let line = String::from_utf8_lossy(line.strip_suffix(b"\n").unwrap_or(&line)).into_owned();
            Err(protocol_failure(address, &ProtocolError::Unsolicited(line)))
        }
    }
}

fn refused_failure(address: &str, code: ErrorCode) -> ConnectionFailure {
    ConnectionFailure {
        address: address.to_string(),
        kind: io::ErrorKind::ConnectionAborted,
        os_error: None,
        message: format!("the server refused the connection: {code}"),
        auth: None,
        tls: false,
    }
}

fn silent_failure(address: &str, silence: Duration) -> ConnectionFailure {
    ConnectionFailure {
        address: address.to_string(),
        kind: io::ErrorKind::TimedOut,
        os_error: None,
        message: format!("no answer for {:.1} s, not even to a ping", silence.as_secs_f64()),
        auth: None,
        tls: false,
    }
}

fn protocol_failure(address: &str, violation: &ProtocolError) -> ConnectionFailure {
    ConnectionFailure {
        address: address.to_string(),
        kind: io::ErrorKind::InvalidData,
        os_error: None,
        message: format!("dropped after a protocol violation: {violation}"),
        auth: None,
        tls: false,
    }
}

/// What the reader learned about one socket while it read from it.
#[derive(Debug, Default)]
struct Session {
    /// At least one reply was paired.
    replied: bool,
    /// The error that ended the reading, if the socket failed rather than
    /// closed.
    error: Option<io::Error>,
}

impl Session {
    /// How the socket ended, as the failure of `address`.
    fn failure(&self, address: &str, cut: &Cut) -> ConnectionFailure {
        match (cut, &self.error) {
            (Cut::Io, Some(error)) => ConnectionFailure::from_io(address, error),
            (Cut::Io, None) => ConnectionFailure::closed(address),
            (Cut::Silent(silence), _) => silent_failure(address, *silence),
            (Cut::Refused(code), _) => refused_failure(address, *code),
            (Cut::Protocol(violation), _) => protocol_failure(address, violation),
        }
    }
}

/// What the reader does with one reply line after pairing it.
struct Answered {
    operation: Submitted,
    step: Step,
    moved: Option<Moved>,
}

/// Reads and pairs replies until the socket breaks or the server breaks
/// the protocol; returns why it stopped.
fn read_replies<S: ConnectionSet>(
    connection: &Connection,
    set: &Arc<S>,
    stream: &TcpStream,
    tls: bool,
    session: &mut Session,
) -> Cut {
    let mut buffer = vec![0u8; READ_BUFFER_BYTES];
    let mut ciphertext = if tls { vec![0u8; TLS_READ_BYTES] } else { Vec::new() };
    let mut filled = 0;
    let mut paired: Vec<Answered> = Vec::new();
    let mut wakes = Wakes::default();
    loop {
        let read = if tls {
            read_decrypted(connection, stream, &mut ciphertext, &mut buffer[filled..])
        } else {
            (&*stream).read(&mut buffer[filled..])
        };
        let read = match read {
            Ok(0) => return Cut::Io,
            Ok(read) => read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            // The read timed out: a tick of the silence watch.
            Err(error) if matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                if let Some(silence) = connection.watch(Instant::now(), set.policy()) {
                    return Cut::Silent(silence);
                }
                continue;
            }
            Err(error) => {
                session.error = Some(error);
                return Cut::Io;
            }
        };
        filled += read;
        let (consumed, stop) = pair_lines(connection, set, &buffer[..filled], session, &mut paired);
        session.replied |= !paired.is_empty();
        act_and_wake(connection, set, &mut paired, &mut wakes);
        if let Some(cut) = stop {
            return cut;
        }
        buffer.copy_within(consumed..filled, 0);
        filled -= consumed;
    }
}

/// Pairs every whole reply line of `buffer` with its operation, under the
/// connection's lock, into `paired`; returns the bytes consumed, and why to
/// stop reading if the server broke the protocol or refused the connection.
fn pair_lines<S: ConnectionSet>(
    connection: &Connection,
    set: &Arc<S>,
    buffer: &[u8],
    session: &mut Session,
    paired: &mut Vec<Answered>,
) -> (usize, Option<Cut>) {
    let now = Instant::now();
    let mut consumed = 0;
    let mut state = connection.lock();
    state.liveness.note_read(now);
    loop {
        let (line_len, reply) = match decode_reply(&buffer[consumed..]) {
            Decoded::Incomplete => return (consumed, None),
            Decoded::LineTooLong => return (consumed, Some(Cut::Protocol(ProtocolError::LineTooLong))),
            Decoded::Line { item: Err(error), .. } => {
                return (consumed, Some(Cut::Protocol(ProtocolError::Malformed(error))));
            }
            Decoded::Line { consumed: line_len, item: Ok(reply) } => (line_len, reply),
        };
        let Some(op) = reply.op() else {
            // `E - - <code>`: the server could not read a line as a
            // request, or refuses the connection; it closes it.
            let Reply::Error { code, .. } = reply else { unreachable!("only E replies lack an op") };
            if code != ErrorCode::AuthRevoked {
                return (consumed, Some(Cut::Refused(code)));
            }
            // A reload removed the client's name: a broken connection like
            // any other, reconnected with the secret (which then fails if it
            // was removed), and its requests move on or wait.
            session.error =
                Some(io::Error::new(io::ErrorKind::ConnectionAborted, "the server revoked the secret's name"));
            return (consumed, Some(Cut::Io));
        };
        let Some(mut operation) = state.in_flight.take(op, reply.key().unwrap_or(b"")) else {
            let line = &buffer[consumed..consumed + line_len];
            let line = String::from_utf8_lossy(line.strip_suffix(b"\n").unwrap_or(line));
            return (consumed, Some(Cut::Protocol(ProtocolError::Unsolicited(line.trim_end().to_string()))));
        };
        let moved = match reply {
            Reply::Moved { active, .. } => Some(Moved::from_field(active)),
            _ => None,
        };
        let step = operation.on_reply(&reply, now, set.policy());
        paired.push(Answered { operation, step, moved });
        consumed += line_len;
    }
}

/// Acts on the paired replies with the connection unlocked, as moving
/// requests locks other connections; then wakes every caller this read
/// completed, in one pass (see `completion`), through an idle writer if
/// there is one (see the module's comment).
fn act_and_wake<S: ConnectionSet>(
    connection: &Connection,
    set: &Arc<S>,
    paired: &mut Vec<Answered>,
    wakes: &mut Wakes,
) {
    for Answered { operation, step, moved } in paired.drain(..) {
        if let Some(moved) = moved {
            set.note_moved(connection.node, moved);
        }
        set.handle(operation, step, wakes);
    }
    if wakes.is_empty() {
        return;
    }
    let mut state = connection.lock();
    if state.writer_idle {
        state.owed.append(wakes);
        state.writer_idle = false;
        drop(state);
        connection.writer_wake.notify_one();
    } else {
        drop(state);
        wakes.wake_all();
    }
}

/// Reads from a TLS connection's socket until its TLS state has plaintext,
/// and moves as much of it as fits into `out`; 0 once the server closed.
fn read_decrypted(
    connection: &Connection,
    stream: &TcpStream,
    ciphertext: &mut [u8],
    out: &mut [u8],
) -> io::Result<usize> {
    loop {
        {
            let mut state = connection.lock();
            let Some(tls) = state.tls.as_mut() else { return Ok(0) };
            match tls.reader().read(out) {
                Ok(read) => return Ok(read),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Err(error) => return Err(error),
            }
        }
        let read = match (&*stream).read(ciphertext) {
            Ok(0) => return Ok(0),
            Ok(read) => read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        let mut state = connection.lock();
        let Some(tls) = state.tls.as_mut() else { return Ok(0) };
        let mut unread = &ciphertext[..read];
        while !unread.is_empty() {
            tls.read_tls(&mut unread)?;
            // A refused record or an alert (a server that wants a client
            // certificate says so here): a TLS failure of the connection.
            tls.process_new_packets().map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))?;
        }
        // Something for the server (a key update's answer): the writer sends it.
        if tls.wants_write() && std::mem::replace(&mut state.writer_idle, false) {
            drop(state);
            connection.writer_wake.notify_one();
        }
    }
}

fn run_writer(connection: &Connection) {
    let mut state = connection.lock();
    let mut owed = Wakes::default();
    loop {
        // Wake-ups first: the requests of the callers woken go out in the
        // next write.
        if !state.owed.is_empty() {
            owed.append(&mut state.owed);
            drop(state);
            owed.wake_all();
            state = connection.lock();
            continue;
        }
        // Closing with requests queued but no socket: the first connect is
        // under way, and either installs one or takes the requests back.
        if state.phase == Phase::Closed && state.out.is_empty() {
            let stream = state.stream.clone();
            // A TLS connection says it is closing, as TLS wants.
            let mut close_notify = Vec::new();
            if let Some(tls) = state.tls.as_mut() {
                tls.send_close_notify();
                crate::tls::encrypt(tls, &[], &mut close_notify);
            }
            drop(state);
            if let Some(stream) = stream {
                if !close_notify.is_empty() {
                    let _ = stream.set_write_timeout(Some(CLOSE_LINGER));
                    let _ = (&*stream).write_all(&close_notify);
                }
                close_gracefully(&stream);
            }
            return;
        }
        if state.has_output() && state.stream.is_some() {
            state = connection.write_out(state);
            continue;
        }
        state.writer_idle = true;
        state = connection.writer_wake.wait(state).unwrap_or_else(|poisoned| poisoned.into_inner());
        state.writer_idle = false;
    }
}

/// Ends the connection once the server has read everything written: a FIN
/// first, so the releases just flushed are read, then, after a moment for
/// the server to act on them, the whole socket.
fn close_gracefully(stream: &TcpStream) {
    let _ = stream.shutdown(Shutdown::Write);
    thread::sleep(CLOSE_LINGER);
    let _ = stream.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;
    use crate::operation::{Kind, Policy};

    const POLICY: Policy = Policy {
        retry_interval: Duration::from_millis(200),
        retry_for: Duration::from_secs(5),
        redirect_limit: 2,
        connect_limit: Duration::from_secs(10),
    };

    /// A connection in its first connect, with its writer running and a
    /// release queued.
    fn connecting_with_a_release() -> (Arc<Connection>, thread::JoinHandle<()>) {
        let connection =
            Arc::new(Connection::new(Arc::from("test"), 0, Duration::from_secs(1), Duration::from_secs(1)));
        let writer = connection.clone();
        let writer = thread::spawn(move || run_writer(&writer));
        let now = Instant::now();
        let release = Submitted::new(Kind::Release { token: 7 }, Arc::from(&b"k"[..]), now, 1, &POLICY, None);
        connection.try_send(release, now, 16).unwrap();
        (connection, writer)
    }

    #[test]
    fn a_release_queued_before_the_first_connect_goes_out_though_the_client_closed() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (connection, writer) = connecting_with_a_release();
        connection.close();
        let stream = Arc::new(TcpStream::connect(listener.local_addr().unwrap()).unwrap());
        assert!(connection.install(stream, None), "the socket is taken to flush the release");
        let (mut server, _) = listener.accept().unwrap();
        let mut received = String::new();
        server.read_to_string(&mut received).unwrap();
        assert_eq!(received, "R k 7\n");
        writer.join().unwrap();
        assert_eq!(connection.phase(), Phase::Closed);
    }

    #[test]
    fn a_closing_connection_whose_first_connect_fails_gives_its_requests_back_and_ends() {
        let (connection, writer) = connecting_with_a_release();
        connection.close();
        assert_eq!(connection.take_down().len(), 1);
        writer.join().unwrap();
    }

    /// What `authenticate` makes of the server's answer `answer` (sent
    /// once the `U` line has arrived; `None`: the server closes instead).
    fn authenticate_against(answer: Option<&'static str>) -> (String, Result<String, ConnectionFailure>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        let serving = thread::spawn(move || {
            let mut line = Vec::new();
            let mut byte = [0u8; 1];
            while line.last() != Some(&b'\n') {
                server.read_exact(&mut byte).unwrap();
                line.push(byte[0]);
            }
            if let Some(answer) = answer {
                server.write_all(answer.as_bytes()).unwrap();
            }
            String::from_utf8(line).unwrap()
        });
        let outcome = authenticate(&client, None, "db:7700", "s3cret", Duration::from_secs(1));
        (serving.join().unwrap(), outcome)
    }

    #[test]
    fn authenticate_sends_the_secret_first_and_reads_the_name_or_the_refusal() {
        let (sent, outcome) = authenticate_against(Some("U billing\n"));
        assert_eq!(sent, "U s3cret\n");
        assert_eq!(outcome, Ok("billing".to_string()));
        let (_, outcome) = authenticate_against(Some("E U - auth-failed\n"));
        assert_eq!(outcome, Err(ConnectionFailure::auth("db:7700", ErrorCode::AuthFailed)));
        let (_, outcome) = authenticate_against(Some("E U - auth-disabled\r\n"));
        assert_eq!(outcome.unwrap_err().auth, Some(ErrorCode::AuthDisabled));
        let (_, outcome) = authenticate_against(Some("E - - too-many-connections\n"));
        let failure = outcome.unwrap_err();
        assert_eq!(
            (failure.auth, failure.message.as_str()),
            (None, "the server refused the connection: too-many-connections")
        );
        let (_, outcome) = authenticate_against(Some("A k 1\n"));
        assert_eq!(outcome.unwrap_err().kind, io::ErrorKind::InvalidData);
        let (_, outcome) = authenticate_against(None);
        assert_eq!(outcome, Err(ConnectionFailure::closed("db:7700")));
    }

    #[test]
    fn moved_reads_the_address_field() {
        assert_eq!(Moved::from_field(Some(b"10.0.0.2:7700")), Moved::To("10.0.0.2:7700".into()));
        assert_eq!(Moved::from_field(None), Moved::Unknown);
    }

    #[test]
    fn a_client_closed_with_nothing_queued_refuses_a_new_socket() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let connection = Connection::new(Arc::from("test"), 0, Duration::from_secs(1), Duration::from_secs(1));
        connection.close();
        let stream = Arc::new(TcpStream::connect(listener.local_addr().unwrap()).unwrap());
        assert!(!connection.install(stream, None));
    }
}
