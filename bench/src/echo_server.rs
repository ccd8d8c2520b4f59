//! `ringlock-bench echo-server`: the loopback ceiling.
//!
//! A server that does the least a line server can: one io_uring loop on one
//! thread, multishot accept, multishot receive into provided buffers,
//! `SINGLE_ISSUER | DEFER_TASKRUN` (the fastest setup measured in
//! shared/MEASURED.md), one fixed reply line for each request line, sent with
//! one `send` per connection per turn, and the same short poll before
//! sleeping as ringlock's loop (`--poll-us`). It parses nothing and keeps no
//! locks: what is left of ringlock's work once parsing, the lock table and
//! tokens are taken away. The same load generator drives it, so its figures
//! are the ceiling of this machine's loopback for this client.
//!
//! Its replies are as long as ringlock's, so that both targets move the same
//! bytes: to a line that starts with `A` a fixed line as long as ringlock's
//! `A <key> <token>` with a 16-byte key (34 bytes), to one that starts with
//! `R` one as long as `R <key>` (19), and to any other a fixed error line. It
//! reads no more of a line than its first byte and its end.

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use io_uring::types::{Fd, SubmitArgs, Timespec};
use io_uring::{IoUring, cqueue, opcode, squeue};

use ringlock_ring::{BufRing, poll_before_sleep};

const RECV_BUFFERS: u16 = 512;
const RECV_BUFFER_LEN: usize = 16 << 10;
const KIND_ACCEPT: u64 = 1;
const KIND_RECV: u64 = 2;
const KIND_SEND: u64 = 3;

struct Connection {
    fd: RawFd,
    /// The first byte of a line whose end has not arrived yet.
    line_op: Option<u8>,
    out: Vec<u8>,
    sending: Vec<u8>,
    sent: usize,
    send_in_flight: bool,
    recv_armed: bool,
    closing: bool,
    dirty: bool,
}

/// The echo server's loop and its connections.
pub struct EchoServer {
    ring: IoUring,
    buffers: BufRing,
    listener: TcpListener,
    connections: Vec<Connection>,
    free: Vec<u32>,
    dirty: Vec<u32>,
    completions: Vec<(u64, i32, u32)>,
    /// How long the loop polls before it sleeps.
    poll: Duration,
}

impl EchoServer {
    /// Binds `listen` and sets up the ring, on the thread that will run it.
    /// The loop polls for `poll` before each sleep.
    pub fn bind(listen: SocketAddr, poll: Duration) -> io::Result<(EchoServer, SocketAddr)> {
        let listener = TcpListener::bind(listen)
            .map_err(|error| io::Error::new(error.kind(), format!("cannot bind {listen}: {error}")))?;
        let local = listener.local_addr()?;
        let mut builder = IoUring::builder();
        builder.setup_single_issuer().setup_defer_taskrun().setup_cqsize(16384);
        let ring = match builder.build(4096) {
            Ok(ring) => ring,
            Err(_) => IoUring::builder().setup_cqsize(16384).build(4096)?,
        };
        let buffers = BufRing::register(&ring, 0, RECV_BUFFERS, RECV_BUFFER_LEN)?;
        let server = EchoServer {
            ring,
            buffers,
            listener,
            connections: Vec::new(),
            free: Vec::new(),
            dirty: Vec::new(),
            completions: Vec::with_capacity(16384),
            poll,
        };
        Ok((server, local))
    }

    /// Serves until the process is killed.
    pub fn run(mut self) -> io::Result<()> {
        self.arm_accept();
        loop {
            if !self.poll() {
                let timespec = Timespec::new().sec(1);
                let args = SubmitArgs::new().timespec(&timespec);
                match self.ring.submitter().submit_with_args(1, &args) {
                    Ok(_) => {}
                    Err(error) if matches!(error.raw_os_error(), Some(libc::ETIME | libc::EINTR | libc::EBUSY)) => {}
                    Err(error) => return Err(error),
                }
            }
            self.serve();
        }
    }

    /// Submits, then asks for completions for up to `poll` before the loop
    /// sleeps, as ringlock's shard loop does; true once there are some.
    fn poll(&mut self) -> bool {
        !self.poll.is_zero() && poll_before_sleep(&mut self.ring, self.poll, || false).unwrap_or(false)
    }

    /// Handles the completions in the ring, then sends what they produced.
    fn serve(&mut self) {
        let mut completions = std::mem::take(&mut self.completions);
        completions.extend(self.ring.completion().map(|cqe| (cqe.user_data(), cqe.result(), cqe.flags())));
        for &(data, result, flags) in &completions {
            let index = (data & 0xffff_ffff) as usize;
            match data >> 32 {
                KIND_ACCEPT => self.accepted(result, flags),
                KIND_RECV => self.received(index, result, flags),
                KIND_SEND => self.sent(index, result),
                _ => {}
            }
        }
        completions.clear();
        self.completions = completions;
        self.buffers.publish();
        self.flush();
    }

    fn push(&mut self, entry: squeue::Entry) {
        loop {
            // SAFETY: send buffers stay alive and unmoved until their
            // completion (a connection slot is reused only after it).
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                return;
            }
            let _ = self.ring.submit();
        }
    }

    fn arm_accept(&mut self) {
        let entry = opcode::AcceptMulti::new(Fd(self.listener.as_raw_fd()))
            .flags(libc::SOCK_CLOEXEC)
            .build()
            .user_data(KIND_ACCEPT << 32);
        self.push(entry);
    }

    fn arm_recv(&mut self, index: usize) {
        let connection = &mut self.connections[index];
        connection.recv_armed = true;
        let entry = opcode::RecvMulti::new(Fd(connection.fd), 0).build().user_data(KIND_RECV << 32 | index as u64);
        self.push(entry);
    }

    fn accepted(&mut self, result: i32, flags: u32) {
        if !cqueue::more(flags) {
            self.arm_accept();
        }
        if result < 0 {
            return;
        }
        let fd = result;
        ringlock_ring::set_nodelay(fd);
        let connection = Connection {
            fd,
            line_op: None,
            out: Vec::with_capacity(64 << 10),
            sending: Vec::with_capacity(64 << 10),
            sent: 0,
            send_in_flight: false,
            recv_armed: false,
            closing: false,
            dirty: false,
        };
        let index = match self.free.pop() {
            Some(index) => {
                self.connections[index as usize] = connection;
                index as usize
            }
            None => {
                self.connections.push(connection);
                self.connections.len() - 1
            }
        };
        self.arm_recv(index);
    }

    fn received(&mut self, index: usize, result: i32, flags: u32) {
        let more = cqueue::more(flags);
        let buffer = cqueue::buffer_select(flags);
        if result > 0 {
            let id = buffer.expect("a multishot recv result names its buffer");
            let connection = &mut self.connections[index];
            answer(self.buffers.get(id, result as usize), &mut connection.line_op, &mut connection.out);
            self.buffers.push(id);
            if !connection.out.is_empty() && !connection.dirty {
                connection.dirty = true;
                self.dirty.push(index as u32);
            }
        } else if let Some(id) = buffer {
            self.buffers.push(id);
        }
        let connection = &mut self.connections[index];
        if !more {
            connection.recv_armed = false;
        }
        if result == 0 || (result < 0 && result != -libc::ENOBUFS) {
            connection.closing = true;
        } else if !more {
            self.arm_recv(index);
        }
        self.maybe_close(index);
    }

    fn sent(&mut self, index: usize, result: i32) {
        let connection = &mut self.connections[index];
        if result < 0 {
            connection.send_in_flight = false;
            connection.closing = true;
            return self.maybe_close(index);
        }
        connection.sent += result as usize;
        if connection.sent < connection.sending.len() {
            let rest = &connection.sending[connection.sent..];
            let entry = opcode::Send::new(Fd(connection.fd), rest.as_ptr(), rest.len() as u32)
                .flags(libc::MSG_NOSIGNAL)
                .build()
                .user_data(KIND_SEND << 32 | index as u64);
            return self.push(entry);
        }
        connection.sending.clear();
        connection.send_in_flight = false;
        if !connection.out.is_empty() && !connection.dirty {
            connection.dirty = true;
            self.dirty.push(index as u32);
        }
        self.maybe_close(index);
    }

    fn flush(&mut self) {
        let mut dirty = std::mem::take(&mut self.dirty);
        for &index in &dirty {
            let connection = &mut self.connections[index as usize];
            connection.dirty = false;
            if connection.send_in_flight || connection.out.is_empty() || connection.closing {
                continue;
            }
            std::mem::swap(&mut connection.out, &mut connection.sending);
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
        self.dirty = dirty;
    }

    /// Frees a closing connection's slot once none of its I/O is in flight.
    fn maybe_close(&mut self, index: usize) {
        let connection = &mut self.connections[index];
        if connection.closing && !connection.recv_armed && !connection.send_in_flight && connection.fd >= 0 {
            // SAFETY: a descriptor this connection owns, with no I/O on it.
            unsafe { libc::close(connection.fd) };
            connection.fd = -1;
            connection.out.clear();
            self.free.push(index as u32);
        } else if connection.closing && connection.recv_armed && connection.fd >= 0 {
            // SAFETY: ends the multishot receive so the slot can be freed.
            unsafe { libc::shutdown(connection.fd, libc::SHUT_RDWR) };
        }
    }
}

/// Appends one reply for every line that `data` ends (see the module
/// documentation). `op` is the first byte of the line in progress, if it has
/// one: a line may start in one read and end in another.
fn answer(data: &[u8], op: &mut Option<u8>, out: &mut Vec<u8>) {
    let mut start = 0;
    while let Some(len) = data[start..].iter().position(|&byte| byte == b'\n') {
        let line_op = op.take().or_else(|| data.get(start).copied().filter(|&byte| byte != b'\n'));
        out.extend_from_slice(match line_op {
            Some(b'A') => ACQUIRED_REPLY,
            Some(b'R') => RELEASED_REPLY,
            _ => OTHER_REPLY,
        });
        start += len + 1;
    }
    if start < data.len() && op.is_none() {
        *op = Some(data[start]);
    }
}

/// The replies, as long as ringlock's with the 16-byte keys of
/// scripts/bench.sh and a token of a ringlock in its first epoch (2^44 and
/// up, 14 digits): `A <key> <token>` and `R <key>`.
const ACQUIRED_REPLY: &[u8] = b"A k000000000000001 17592186044539\n";
const RELEASED_REPLY: &[u8] = b"R k000000000000001\n";
const OTHER_REPLY: &[u8] = b"E - - bad-op\n";

/// The token the load generator takes an `A` reply of the echo server to grant.
pub const ECHO_TOKEN: u64 = 17_592_186_044_539;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_as_long_as_ringlocks() {
        let mut out = Vec::new();
        answer(b"A k1 30 10\nR key2 17592186044539\nP\nA k3 3", &mut None, &mut out);
        assert_eq!(out, [ACQUIRED_REPLY, RELEASED_REPLY, OTHER_REPLY].concat());
        assert_eq!(ACQUIRED_REPLY.len(), "A  \n".len() + 16 + ECHO_TOKEN.to_string().len());
        assert_eq!(RELEASED_REPLY.len(), "R \n".len() + 16);
    }

    #[test]
    fn lines_split_across_reads_are_answered_once_whole() {
        let stream = b"A key1 30 10\nR key1 17592186044539\n\nS\nA key2 30 10\nR key2 17592186044539\n";
        let mut whole = Vec::new();
        answer(stream, &mut None, &mut whole);
        assert_eq!(
            whole,
            [ACQUIRED_REPLY, RELEASED_REPLY, OTHER_REPLY, OTHER_REPLY, ACQUIRED_REPLY, RELEASED_REPLY].concat()
        );
        for first in 0..stream.len() {
            for second in first..stream.len() {
                let (mut op, mut out) = (None, Vec::new());
                for piece in [&stream[..first], &stream[first..second], &stream[second..]] {
                    answer(piece, &mut op, &mut out);
                }
                assert_eq!(out, whole, "split at {first} and {second}");
                assert_eq!(op, None);
            }
        }
    }
}
