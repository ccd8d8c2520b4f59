//! The byte stream of one peer connection: plain TCP, or TLS over it with
//! `--peer-tls-cert` (see [`super::peer_tls`]).
//!
//! With TLS, a rustls connection sits between the socket and the peer
//! protocol: what is read from the socket is handed to it as ciphertext,
//! and what it has to send is written to the socket, here. Its state is
//! shared (`Rc<RefCell>`, one thread) between the stream a connection's
//! writer owns and the duplicate the refusal watcher reads (see
//! [`PeerStream::duplicate`]); each borrows it only between two awaits. The
//! read side never writes to the socket, so that two tasks never interleave
//! their bytes: what rustls has to send after a read (an alert) goes out
//! with the writer's next write.

use std::cell::RefCell;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::rc::Rc;

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use rustls::pki_types::CertificateDer;

/// Bytes asked of the socket per read when TLS decrypts them: a little
/// more than the largest TLS record, so that one read takes a whole one.
const TLS_READ_BYTES: usize = 17 << 10;

/// The first bytes a TLS connection received, kept to say what a peer that
/// does not speak TLS sent instead (see [`PeerStream::first_bytes`]).
const FIRST_BYTES_KEPT: usize = 8;

/// A peer connection's stream.
pub struct PeerStream {
    tcp: TcpStream,
    tls: Option<Rc<RefCell<TlsState>>>,
    /// Ciphertext as read from the socket (with TLS only).
    scratch: Vec<u8>,
    /// Ciphertext rustls gave to send (with TLS only).
    outgoing: Vec<u8>,
}

/// One TLS connection's state, shared by the stream and its duplicate.
struct TlsState {
    connection: rustls::Connection,
    /// Ciphertext read and not yet taken by rustls: `incoming[start..]`.
    incoming: Vec<u8>,
    start: usize,
    /// The socket reached its end (or rustls takes no more).
    ended: bool,
    first_bytes: [u8; FIRST_BYTES_KEPT],
    first_bytes_len: usize,
}

/// Why a TLS handshake (or the wait for admission) failed.
#[derive(Debug)]
pub enum TlsFailure {
    /// The socket failed.
    Io(io::Error),
    /// The peer closed the connection.
    Closed,
    /// rustls refused what the peer sent, or the peer's alert said why it
    /// refused this node.
    Tls(rustls::Error),
}

impl PeerStream {
    pub fn plain(tcp: TcpStream) -> PeerStream {
        PeerStream { tcp, tls: None, scratch: Vec::new(), outgoing: Vec::new() }
    }

    /// From now on the stream speaks TLS through `connection`, which starts
    /// its handshake ([`PeerStream::handshake`]).
    pub fn start_tls(&mut self, connection: rustls::Connection) {
        self.tls = Some(Rc::new(RefCell::new(TlsState {
            connection,
            incoming: Vec::new(),
            start: 0,
            ended: false,
            first_bytes: [0; FIRST_BYTES_KEPT],
            first_bytes_len: 0,
        })));
        self.scratch = vec![0; TLS_READ_BYTES];
    }

    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Runs the TLS handshake to its end: both sides' certificates checked.
    pub async fn handshake(&mut self) -> Result<(), TlsFailure> {
        self.pump_until(|connection| !connection.is_handshaking()).await
    }

    /// On a connection this node opened: waits until the peer has accepted
    /// this node's certificate. In TLS 1.3 the client's handshake ends
    /// before the server has checked the client's certificate; the server
    /// then sends one session ticket (see `peer_tls`), only once it has, so
    /// the ticket is the sign. It is never used to resume.
    pub async fn await_admission(&mut self) -> Result<(), TlsFailure> {
        self.pump_until(|connection| match connection {
            rustls::Connection::Client(client) => client.tls13_tickets_received() > 0,
            rustls::Connection::Server(_) => true,
        })
        .await
    }

    /// The peer's own certificate, once the handshake checked it.
    pub fn peer_certificate(&self) -> Option<CertificateDer<'static>> {
        let state = self.tls.as_ref()?.borrow();
        state.connection.peer_certificates()?.first().map(|certificate| certificate.clone().into_owned())
    }

    /// The first bytes the peer sent on a TLS connection, as they came.
    pub fn first_bytes(&self) -> Vec<u8> {
        self.tls.as_ref().map_or_else(Vec::new, |state| {
            let state = state.borrow();
            state.first_bytes[..state.first_bytes_len].to_vec()
        })
    }

    /// Reads plaintext into `buffer`: `Ok(0)` at the end of the stream.
    pub async fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        let Some(tls) = self.tls.clone() else {
            return self.tcp.read(buffer).await;
        };
        loop {
            {
                let mut state = tls.borrow_mut();
                match state.connection.reader().read(buffer) {
                    Ok(count) => return Ok(count),
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                    // An end without close_notify (a node that was killed,
                    // or stopped) ends the stream as a plain one ends: the
                    // frames are length-prefixed, so a cut frame still shows.
                    Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                    Err(error) => return Err(error),
                }
                if state.has_incoming() || state.ended {
                    state.feed().map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))?;
                    continue;
                }
            }
            self.fill(&tls).await?;
        }
    }

    /// Writes all of `bytes` (with TLS: encrypted, with whatever rustls
    /// had waiting to send).
    pub async fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        let Some(tls) = self.tls.clone() else {
            return self.tcp.write_all(bytes).await;
        };
        let mut rest = bytes;
        loop {
            if !rest.is_empty() {
                let written = tls.borrow_mut().connection.writer().write(rest)?;
                rest = &rest[written..];
            }
            self.flush(&tls).await?;
            if rest.is_empty() {
                return Ok(());
            }
        }
    }

    /// Shuts the socket down. No close_notify is sent: it could wait on a
    /// peer that reads nothing, and the end of the socket ends the stream
    /// just as well (see [`PeerStream::read`]).
    pub async fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.tcp.shutdown(how).await.map_err(io::Error::from)
    }

    pub async fn close(self) -> io::Result<()> {
        let mut tcp = self.tcp;
        tcp.close().await
    }

    /// A second stream on a duplicate of the socket's descriptor, sharing
    /// the TLS state, for a task that only reads (see the top of this
    /// file). `None` if the descriptor cannot be duplicated.
    pub fn duplicate(&self) -> Option<PeerStream> {
        // SAFETY: duplicating a descriptor the stream owns; the copy is
        // owned by the new stream, which closes it.
        let fd = unsafe { libc::dup(self.tcp.as_raw_fd()) };
        if fd < 0 {
            return None;
        }
        // SAFETY: `fd` is a fresh descriptor of a connected TCP socket.
        let tcp = unsafe { TcpStream::from_raw_fd(fd) };
        let scratch = if self.tls.is_some() { vec![0; TLS_READ_BYTES] } else { Vec::new() };
        Some(PeerStream { tcp, tls: self.tls.clone(), scratch, outgoing: Vec::new() })
    }

    /// Feeds rustls until `done` says so, writing what it has to send
    /// (its handshake messages, an alert that says why it failed).
    async fn pump_until(&mut self, done: impl Fn(&rustls::Connection) -> bool) -> Result<(), TlsFailure> {
        let Some(tls) = self.tls.clone() else {
            return Ok(());
        };
        loop {
            self.flush(&tls).await.map_err(TlsFailure::Io)?;
            let fed = {
                let mut state = tls.borrow_mut();
                if done(&state.connection) {
                    return Ok(());
                }
                if state.ended && !state.has_incoming() {
                    return Err(TlsFailure::Closed);
                }
                state.has_incoming().then(|| state.feed())
            };
            match fed {
                Some(Ok(())) => {}
                Some(Err(error)) => {
                    // The alert that tells the peer why, if the socket takes it.
                    let _ = self.flush(&tls).await;
                    return Err(TlsFailure::Tls(error));
                }
                None => self.fill(&tls).await.map_err(TlsFailure::Io)?,
            }
        }
    }

    /// Reads ciphertext from the socket into the shared state.
    async fn fill(&mut self, tls: &Rc<RefCell<TlsState>>) -> io::Result<()> {
        let count = self.tcp.read(&mut self.scratch).await?;
        let mut state = tls.borrow_mut();
        if count == 0 {
            state.ended = true;
            return Ok(());
        }
        let kept = state.first_bytes_len;
        if kept < FIRST_BYTES_KEPT {
            let more = (FIRST_BYTES_KEPT - kept).min(count);
            state.first_bytes[kept..kept + more].copy_from_slice(&self.scratch[..more]);
            state.first_bytes_len += more;
        }
        state.incoming.extend_from_slice(&self.scratch[..count]);
        Ok(())
    }

    /// Writes what rustls has to send.
    async fn flush(&mut self, tls: &Rc<RefCell<TlsState>>) -> io::Result<()> {
        loop {
            self.outgoing.clear();
            {
                let mut state = tls.borrow_mut();
                while state.connection.wants_write() {
                    state.connection.write_tls(&mut self.outgoing)?;
                }
            }
            if self.outgoing.is_empty() {
                return Ok(());
            }
            self.tcp.write_all(&self.outgoing).await?;
        }
    }
}

impl AsRawFd for PeerStream {
    fn as_raw_fd(&self) -> RawFd {
        self.tcp.as_raw_fd()
    }
}

impl TlsState {
    fn has_incoming(&self) -> bool {
        self.start < self.incoming.len()
    }

    /// Hands rustls what it takes of the ciphertext read (at the end of the
    /// socket, the end), and has it process that.
    fn feed(&mut self) -> Result<(), rustls::Error> {
        let mut rest = &self.incoming[self.start..];
        let taken = self.connection.read_tls(&mut rest).map_err(|error| rustls::Error::General(error.to_string()))?;
        self.start += taken;
        if taken == 0 {
            // The end of the socket, or rustls takes no more after the
            // peer's close_notify: what follows is dropped.
            self.start = self.incoming.len();
            self.ended = true;
        }
        if self.start == self.incoming.len() {
            self.incoming.clear();
            self.start = 0;
        }
        self.connection.process_new_packets()?;
        Ok(())
    }
}
