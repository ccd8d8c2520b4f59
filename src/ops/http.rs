//! The operator endpoint (`--metrics-listen`): a small blocking HTTP/1.1
//! responder on a thread of its own, so that a scrape never runs on a shard
//! core nor waits for one (it reads what the cores published).
//!
//! It serves `GET` (and `HEAD`) of `/metrics`, `/livez` and `/readyz`, each
//! connection on a thread of its own and closed after its answer
//! (`Connection: close`). A request head must arrive whole within
//! [`IO_TIMEOUT`] and [`REQUEST_HEAD_MAX`] bytes, and the answer must be
//! taken within [`IO_TIMEOUT`], so a client that sends nothing, too much, or
//! a byte at a time is dropped. At most [`CONNECTIONS_MAX`] are served at
//! once; a new connection beyond that takes the place of another (see
//! [`place_to_take`]), never of one whose whole request has come, so that
//! connections that send nothing, trickle or do not read, however many and
//! however often reopened, never keep a probe of `/readyz` (which sends its
//! whole request at once) unanswered.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::node::shared::Shared;
use crate::ops::metrics::{self, Readiness};

/// Longest request head (request line and headers) read.
const REQUEST_HEAD_MAX: usize = 8 << 10;
/// Longest a connection may take to send its whole request head, and to
/// take the whole answer.
const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// Connections served at once, each on a thread. Many, so that a probe,
/// which is taken over only once it is the oldest connection whose request
/// has not come whole, would need this many new connections between its
/// connect and its request's arrival, which follows at once.
const CONNECTIONS_MAX: usize = 64;
/// Stack of a connection's thread: it only reads a head and writes an answer.
const CONNECTION_STACK: usize = 256 << 10;
/// Connections the kernel queues for accept (std's default is 128, which a
/// burst of connects fills, and a probe's connect is then dropped). The
/// kernel caps it at `net.core.somaxconn` (4096 since Linux 5.4).
const BACKLOG: libc::c_int = 1024;

/// Binds the endpoint; errors are for the operator.
pub fn bind(address: SocketAddr) -> Result<TcpListener, String> {
    let listener =
        crate::shard_core::listener::bind_retrying(address, "--metrics-listen", || TcpListener::bind(address))
            .map_err(|error| {
                crate::shard_core::listener::listen_error("for metrics ", address, "--metrics-listen", &error)
            })?;
    // Listening again on a listening socket sets its backlog.
    // SAFETY: a listening socket this function owns.
    if unsafe { libc::listen(listener.as_raw_fd(), BACKLOG) } != 0 {
        let error = io::Error::last_os_error();
        return Err(format!("cannot listen for metrics on {address}: {error}; check --metrics-listen"));
    }
    Ok(listener)
}

/// Serves the endpoint on a new thread until the process exits. The thread
/// must be started after the signals are blocked, so that it inherits the
/// mask and the signals go to the thread that waits for them.
pub fn spawn(listener: TcpListener, shared: Arc<Shared>) -> Result<(), String> {
    std::thread::Builder::new()
        .name("ringlock-metrics".to_string())
        .spawn(move || {
            let served = Arc::new(Served::default());
            for stream in listener.incoming() {
                match stream {
                    Ok(stream) => serve_apart(stream, &shared, &served),
                    // Out of descriptors, or a connection reset before it
                    // was taken: try again after a moment.
                    Err(error) => {
                        tracing::warn!("metrics endpoint cannot accept: {error}");
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        })
        .map(|_| ())
        .map_err(|error| format!("cannot start the metrics thread: {error}"))
}

/// The connections being served, oldest first.
#[derive(Default)]
struct Served {
    slots: Mutex<Slots>,
}

#[derive(Default)]
struct Slots {
    /// Ids are never reused, so a slot taken over is never mistaken for a
    /// newer one.
    next_id: u64,
    entries: Vec<Slot>,
}

struct Slot {
    id: u64,
    /// A handle on the connection's socket, to shut it when it is taken over.
    stream: TcpStream,
    /// Whether its whole request has come and is being answered.
    answering: bool,
}

/// A connection's place among the served ones, given up when dropped.
struct Place {
    served: Arc<Served>,
    id: u64,
}

impl Served {
    fn slots(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for `stream`: a free one, or else the one [`place_to_take`]
    /// names, whose connection is shut. `None` if there is none to take.
    fn admit(self: &Arc<Self>, stream: &TcpStream) -> io::Result<Option<Place>> {
        let handle = stream.try_clone()?;
        let mut slots = self.slots();
        if slots.entries.len() >= CONNECTIONS_MAX {
            let Some(taken) = place_to_take(&slots.entries) else {
                return Ok(None);
            };
            let taken = slots.entries.remove(taken);
            // Its thread's read or write fails at once, and the thread ends.
            let _ = taken.stream.shutdown(Shutdown::Both);
            tracing::debug!(
                "metrics endpoint: {CONNECTIONS_MAX} connections served; closing the oldest that {}",
                if taken.answering { "does not take its answer" } else { "has not sent a whole request" }
            );
        }
        let id = slots.next_id;
        slots.next_id += 1;
        slots.entries.push(Slot { id, stream: handle, answering: false });
        Ok(Some(Place { served: self.clone(), id }))
    }
}

/// The place a new connection takes when all are taken (`entries` are
/// oldest first): the oldest whose request has not come whole (a client
/// that sends nothing or trickles), or else the oldest being answered (a
/// client that does not take its answer; a probe takes its answer at once).
/// A connection whose whole request head waits to be read is never taken:
/// its thread answers it as soon as it runs.
fn place_to_take(entries: &[Slot]) -> Option<usize> {
    let unfinished = |slot: &Slot| !slot.answering && !head_waiting(&slot.stream);
    entries.iter().position(unfinished).or_else(|| entries.iter().position(|slot| slot.answering))
}

/// Longest request head [`head_waiting`] looks for; a probe's is a few
/// hundred bytes.
const HEAD_PEEK_MAX: usize = 1 << 10;

/// Whether a whole request head waits to be read on `stream` (one of at most
/// [`HEAD_PEEK_MAX`] bytes), looked at without reading it, without waiting
/// and without changing the socket's blocking mode, which its serving
/// thread shares.
fn head_waiting(stream: &TcpStream) -> bool {
    let mut head = [0u8; HEAD_PEEK_MAX];
    // SAFETY: a peek into a local buffer of this length, on a socket
    // `stream` owns.
    let peeked = unsafe {
        libc::recv(stream.as_raw_fd(), head.as_mut_ptr().cast(), head.len(), libc::MSG_PEEK | libc::MSG_DONTWAIT)
    };
    usize::try_from(peeked).is_ok_and(|peeked| head_ends(&head[..peeked], 0))
}

impl Place {
    /// Its whole request has come; false if a new connection took its
    /// place meanwhile (and shut it).
    fn answering(&self) -> bool {
        let mut slots = self.served.slots();
        let slot = slots.entries.iter_mut().find(|slot| slot.id == self.id);
        slot.map(|slot| slot.answering = true).is_some()
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.served.slots().entries.retain(|slot| slot.id != self.id);
    }
}

/// Serves `stream` on a thread of its own, in a place [`Served::admit`] gives.
fn serve_apart(stream: TcpStream, shared: &Arc<Shared>, served: &Arc<Served>) {
    let place = match served.admit(&stream) {
        Ok(Some(place)) => place,
        Ok(None) => {
            tracing::debug!("metrics endpoint: {CONNECTIONS_MAX} connections being answered; closing a new one");
            return;
        }
        Err(error) => {
            tracing::warn!("metrics endpoint cannot keep a connection: {error}");
            return;
        }
    };
    let shared = shared.clone();
    let spawned = std::thread::Builder::new()
        .name("ringlock-metrics-conn".to_string())
        .stack_size(CONNECTION_STACK)
        .spawn(move || {
            if let Err(error) = serve(stream, &shared, &place) {
                tracing::debug!("metrics endpoint: {error}");
            }
        });
    if let Err(error) = spawned {
        tracing::warn!("metrics endpoint cannot start a thread for a connection: {error}");
    }
}

/// One response: status line, content type, body.
struct Response {
    status: &'static str,
    content_type: &'static str,
    body: String,
}

fn text(status: &'static str, body: impl Into<String>) -> Response {
    Response { status, content_type: "text/plain; charset=utf-8", body: body.into() }
}

/// What arrived of a request head.
enum Head {
    /// The head up to and including the blank line that ends it.
    Whole(Vec<u8>),
    /// [`REQUEST_HEAD_MAX`] bytes and no end.
    TooLarge,
    /// The client closed first, having sent this much.
    Cut(Vec<u8>),
}

fn serve(mut stream: TcpStream, shared: &Shared, place: &Place) -> io::Result<()> {
    let head = match read_head(&mut stream, Instant::now() + IO_TIMEOUT)? {
        Head::Whole(head) => head,
        // Answer what a client that closed early sent, if anything.
        Head::Cut(head) if !head.is_empty() => head,
        Head::Cut(_) => return Ok(()),
        Head::TooLarge if !place.answering() => return Ok(()),
        Head::TooLarge => {
            let response = text("431 Request Header Fields Too Large", "request head too large\n");
            return write_response(&mut stream, &response, true);
        }
    };
    // A connection taken over (its read ended) is not answered.
    if !place.answering() {
        return Ok(());
    }
    let request_line = head.split(|&byte| byte == b'\n').next().unwrap_or_default();
    let request_line = String::from_utf8_lossy(request_line);
    let mut parts = request_line.trim_end().split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let response = match (method, path) {
        ("GET" | "HEAD", "/metrics") => Response {
            status: "200 OK",
            content_type: "text/plain; version=0.0.4; charset=utf-8",
            body: metrics::render(shared),
        },
        ("GET" | "HEAD", "/livez") => text("200 OK", "ok\n"),
        ("GET" | "HEAD", "/readyz") => match metrics::readiness(shared) {
            Readiness::Ready => text("200 OK", "ready\n"),
            other => text("503 Service Unavailable", format!("{}\n", other.describe())),
        },
        ("GET" | "HEAD", _) => text("404 Not Found", "not found: try /metrics, /livez or /readyz\n"),
        _ => text("405 Method Not Allowed", "only GET and HEAD are served\n"),
    };
    write_response(&mut stream, &response, method != "HEAD")
}

/// Whether `head` ends with the blank line that ends a request head, looked
/// for from `from` on (where the last read started, less three bytes for a
/// terminator split across reads), so each byte is looked at about once.
fn head_ends(head: &[u8], from: usize) -> bool {
    let tail = &head[from.saturating_sub(3)..];
    tail.windows(4).any(|window| window == b"\r\n\r\n") || tail.windows(2).any(|window| window == b"\n\n")
}

/// Reads the request head, at most [`REQUEST_HEAD_MAX`] bytes of it; an
/// error if it is not whole by `deadline`.
fn read_head(stream: &mut TcpStream, deadline: Instant) -> io::Result<Head> {
    let mut head = Vec::with_capacity(1024);
    let mut buffer = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "the request head did not arrive in time"));
        }
        stream.set_read_timeout(Some(left))?;
        let room = buffer.len().min(REQUEST_HEAD_MAX - head.len());
        let read = match stream.read(&mut buffer[..room]) {
            Ok(0) => return Ok(Head::Cut(head)),
            Ok(read) => read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        let from = head.len();
        head.extend_from_slice(&buffer[..read]);
        if head_ends(&head, from) {
            return Ok(Head::Whole(head));
        }
        if head.len() == REQUEST_HEAD_MAX {
            return Ok(Head::TooLarge);
        }
    }
}

fn write_response(stream: &mut TcpStream, response: &Response, with_body: bool) -> io::Result<()> {
    let mut out = format!(
        "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        response.status,
        response.content_type,
        response.body.len()
    )
    .into_bytes();
    if with_body {
        out.extend_from_slice(response.body.as_bytes());
    }
    write_all_by(stream, &out, Instant::now() + IO_TIMEOUT)
}

/// Writes all of `bytes` by `deadline`, however slowly the client reads.
fn write_all_by(stream: &mut TcpStream, mut bytes: &[u8], deadline: Instant) -> io::Result<()> {
    while !bytes.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "the client did not take the answer in time"));
        }
        stream.set_write_timeout(Some(left))?;
        match stream.write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(written) => bytes = &bytes[written..],
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_ends_at_a_blank_line_even_split_across_reads() {
        assert!(head_ends(b"GET / HTTP/1.1\r\n\r\n", 0));
        assert!(head_ends(b"GET / HTTP/1.1\n\n", 0));
        assert!(!head_ends(b"GET / HTTP/1.1\r\nHost: x\r\n", 0));
        // The last read brought only the final "\n".
        let head = b"GET / HTTP/1.1\r\n\r\n";
        assert!(head_ends(head, head.len() - 1));
        assert!(head_ends(b"GET /\n\n", 6));
    }

    /// A served connection's slot, and its client's end.
    fn slot(listener: &TcpListener, id: u64, sent: &[u8], answering: bool) -> (Slot, TcpStream) {
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        client.write_all(sent).unwrap();
        let (stream, _) = listener.accept().unwrap();
        // Wait until what was sent can be peeked.
        let mut peeked = vec![0u8; sent.len()];
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        while !sent.is_empty() && stream.peek(&mut peeked).unwrap() < sent.len() {}
        (Slot { id, stream, answering }, client)
    }

    #[test]
    fn the_place_taken_is_the_oldest_without_a_whole_request_then_the_oldest_answering() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let whole = b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n";
        let (answering, _a) = slot(&listener, 0, b"", true);
        let (waiting, _b) = slot(&listener, 1, whole, false);
        let (part, _c) = slot(&listener, 2, b"GET /re", false);
        let (silent, _d) = slot(&listener, 3, b"", false);
        let mut entries = vec![answering, waiting, part, silent];
        // A trickling client, older than a silent one, goes first; a whole
        // request waiting to be read is never taken.
        assert_eq!(place_to_take(&entries).map(|at| entries[at].id), Some(2));
        entries.remove(2);
        assert_eq!(place_to_take(&entries).map(|at| entries[at].id), Some(3));
        entries.remove(2);
        // Only one being answered and one with its request waiting: the first.
        assert_eq!(place_to_take(&entries).map(|at| entries[at].id), Some(0));
        entries.remove(0);
        assert_eq!(place_to_take(&entries), None);
    }
}
