//! The operator endpoint (`--metrics-listen`): a small blocking HTTP/1.1
//! responder on a thread of its own, so that a scrape never runs on a shard
//! core nor waits for one (it reads what the cores published).
//!
//! It serves `GET` (and `HEAD`) of `/metrics`, `/livez` and `/readyz`, each
//! connection on a thread of its own (at most [`CONNECTIONS_MAX`] at once;
//! more are closed at once) and closed after its answer (`Connection:
//! close`). A request head must arrive whole within [`IO_TIMEOUT`] and
//! [`REQUEST_HEAD_MAX`] bytes, so a client that sends nothing, too much, or
//! a byte at a time is dropped, and never keeps a probe of `/readyz` waiting.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::node::shared::Shared;
use crate::ops::metrics::{self, Readiness};

/// Longest request head (request line and headers) read.
const REQUEST_HEAD_MAX: usize = 8 << 10;
/// Longest a connection may take to send its whole request head, and to
/// take each part of the answer.
const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// Connections served at once; one more is closed without an answer.
const CONNECTIONS_MAX: usize = 16;

/// Binds the endpoint; errors are for the operator.
pub fn bind(address: SocketAddr) -> Result<TcpListener, String> {
    crate::core::listener::bind_retrying(address, "--metrics-listen", || TcpListener::bind(address))
        .map_err(|error| crate::core::listener::listen_error("for metrics ", address, "--metrics-listen", &error))
}

/// Serves the endpoint on a new thread until the process exits. The thread
/// must be started after the signals are blocked, so that it inherits the
/// mask and the signals go to the thread that waits for them.
pub fn spawn(listener: TcpListener, shared: Arc<Shared>) -> Result<(), String> {
    std::thread::Builder::new()
        .name("ringlock-metrics".to_string())
        .spawn(move || {
            let serving = Arc::new(AtomicUsize::new(0));
            for stream in listener.incoming() {
                match stream {
                    Ok(stream) => serve_apart(stream, &shared, &serving),
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

/// Serves `stream` on a thread of its own, or closes it if
/// [`CONNECTIONS_MAX`] are being served.
fn serve_apart(stream: TcpStream, shared: &Arc<Shared>, serving: &Arc<AtomicUsize>) {
    if serving.fetch_add(1, Ordering::AcqRel) >= CONNECTIONS_MAX {
        serving.fetch_sub(1, Ordering::AcqRel);
        tracing::debug!("metrics endpoint: {CONNECTIONS_MAX} connections served already; closing a new one");
        return;
    }
    let (shared, done) = (shared.clone(), serving.clone());
    let spawned = std::thread::Builder::new().name("ringlock-metrics-conn".to_string()).spawn(move || {
        if let Err(error) = serve(stream, &shared) {
            tracing::debug!("metrics endpoint: {error}");
        }
        done.fetch_sub(1, Ordering::AcqRel);
    });
    if let Err(error) = spawned {
        serving.fetch_sub(1, Ordering::AcqRel);
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

fn serve(mut stream: TcpStream, shared: &Shared) -> io::Result<()> {
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let head = match read_head(&mut stream, Instant::now() + IO_TIMEOUT)? {
        Some(head) => head,
        None => {
            let response = text("431 Request Header Fields Too Large", "request head too large\n");
            return write_response(&mut stream, &response, true);
        }
    };
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
            other => text("503 Service Unavailable", format!("{}\n", other.as_str())),
        },
        ("GET" | "HEAD", _) => text("404 Not Found", "not found: try /metrics, /livez or /readyz\n"),
        _ => text("405 Method Not Allowed", "only GET and HEAD are served\n"),
    };
    write_response(&mut stream, &response, method != "HEAD")
}

/// Reads up to the blank line that ends the request head; `None` if it is
/// longer than [`REQUEST_HEAD_MAX`]; an error if it is not whole by `deadline`.
fn read_head(stream: &mut TcpStream, deadline: Instant) -> io::Result<Option<Vec<u8>>> {
    let mut head = Vec::with_capacity(1024);
    let mut buffer = [0u8; 1024];
    loop {
        if head.windows(4).any(|window| window == b"\r\n\r\n") || head.windows(2).any(|window| window == b"\n\n") {
            return Ok(Some(head));
        }
        if head.len() > REQUEST_HEAD_MAX {
            return Ok(None);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "the request head did not arrive in time"));
        }
        stream.set_read_timeout(Some(left))?;
        let read = stream.read(&mut buffer)?;
        if read == 0 {
            // The client closed early: answer what it sent, if anything.
            return Ok(Some(head));
        }
        head.extend_from_slice(&buffer[..read]);
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
    stream.write_all(&out)?;
    stream.flush()
}
