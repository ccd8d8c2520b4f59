//! One client connection as its event loop sees it: bytes not parsed yet,
//! replies not sent yet, and the I/O it has in flight.
//!
//! A connection ends in one of two ways. When the client stops sending (end
//! of input, or a `line-too-long`), the loop stops reading, tells every shard
//! (its queued acquires leave their queues), and closes once every shard has
//! acknowledged and every reply is sent. When the socket fails, the loop
//! drops what it had for it and closes at once.
//!
//! Its [`Phase`] says where it stands on that way, and the methods that
//! change it are the only transitions (tested below):
//!
//! ```text
//! Reading --end_input--> InputEnded          (the client half-closed)
//! Reading, InputEnded --stop_reading--> Draining   (shards told)
//! Reading, InputEnded --stop_for_shutdown--> Stopped (the server stops)
//! Stopped --stop_reading--> Draining
//! Draining --begin_close--> Closing --(no I/O in flight)--> slot freed
//! ```
//!
//! Apart from its phase, a connection is paused ([`Connection::is_paused`])
//! while it has too many requests in flight or too many replies unsent: it is
//! then neither parsed nor received, and resumes once below both limits.

use std::net::IpAddr;
use std::os::fd::RawFd;

use ringlock_proto::LINE_LEN_MAX;

/// Replies a connection may have waiting before the loop stops reading its
/// requests: a client that stops reading cannot make the server buffer
/// without bound.
pub const OUTPUT_BYTES_MAX: usize = 1 << 20;

/// Requests a connection may have in flight (parsed and not answered:
/// queued acquires, the answers held behind them, requests on their way to
/// or from another core) before the loop stops reading it. Without it, a
/// client could make the server hold requests without bound, for example
/// error answers held behind a queued acquire of the same key; with it, its
/// further requests wait in the kernel's socket buffers. It is above the
/// default --max-waiters-per-key, so a connection may still fill one key's
/// queue and be read.
pub const IN_FLIGHT_MAX: u32 = 1 << 17;

/// Buffers larger than this are given back to the allocator once empty, so
/// an idle connection costs little memory after a burst.
const BUFFER_BYTES_KEPT: usize = 64 << 10;

/// Where a connection is in its life; see the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Requests are read.
    Reading,
    /// The client sent end of input: the lines it sent before are still
    /// handled (a paused connection may hold some), then it reads no more.
    InputEnded,
    /// The server is stopping: no more requests are read, and the shards are
    /// not told (they answer what is queued `shutting-down`).
    Stopped,
    /// Reads no more; the shards were told, and the connection closes once
    /// they have acknowledged and every reply is out.
    Draining,
    /// `shutdown` was called; the slot is freed once no I/O is in flight.
    Closing,
}

/// A client connection.
#[derive(Debug)]
pub struct Connection {
    pub fd: RawFd,
    /// Changes every time the slot is reused, so late replies for a closed
    /// connection are dropped rather than sent to its successor.
    pub generation: u32,
    /// Bytes received and not parsed yet (a partial line, or more while paused).
    pub input: Vec<u8>,
    /// Replies not handed to the kernel yet.
    pub output: Vec<u8>,
    /// The buffer of the `send` in flight, and how much of it went out.
    pub sending: Vec<u8>,
    pub sent: usize,
    pub send_in_flight: bool,
    pub recv_armed: bool,
    /// Requests parsed and not answered (queued acquires included).
    pub in_flight: u32,
    /// Where the connection is in its life.
    phase: Phase,
    /// Shards that have not acknowledged yet that the connection reads no more.
    pub gone_acks: u32,
    /// Listed in the loop's set of connections with output to send.
    pub dirty: bool,
    /// The client's address, if counted for `--max-connections-per-ip`.
    pub peer_ip: Option<IpAddr>,
}

impl Connection {
    pub fn new(fd: RawFd, generation: u32, peer_ip: Option<IpAddr>) -> Connection {
        Connection {
            fd,
            generation,
            input: Vec::new(),
            output: Vec::new(),
            sending: Vec::new(),
            sent: 0,
            send_in_flight: false,
            recv_armed: false,
            in_flight: 0,
            phase: Phase::Reading,
            gone_acks: 0,
            dirty: false,
            peer_ip,
        }
    }

    /// Whether requests are still read (and parsed).
    pub fn reading(&self) -> bool {
        matches!(self.phase, Phase::Reading | Phase::InputEnded)
    }

    /// Whether the client sent end of input while requests are still read.
    pub fn input_ended(&self) -> bool {
        self.phase == Phase::InputEnded
    }

    pub fn closing(&self) -> bool {
        self.phase == Phase::Closing
    }

    /// The client sent end of input.
    pub fn end_input(&mut self) {
        if self.phase == Phase::Reading {
            self.phase = Phase::InputEnded;
        }
    }

    /// Reads no more requests, and drops the input kept. True the first time,
    /// when the shards are to be told (and then acknowledge, `gone_acks`).
    pub fn stop_reading(&mut self) -> bool {
        self.input = Vec::new();
        match self.phase {
            Phase::Reading | Phase::InputEnded | Phase::Stopped => {
                self.phase = Phase::Draining;
                true
            }
            Phase::Draining | Phase::Closing => false,
        }
    }

    /// The server stops: no more requests are read, and the input kept is dropped.
    pub fn stop_for_shutdown(&mut self) {
        self.input = Vec::new();
        if self.reading() {
            self.phase = Phase::Stopped;
        }
    }

    /// Starts closing; false if it already is.
    pub fn begin_close(&mut self) -> bool {
        if self.phase == Phase::Closing {
            return false;
        }
        self.phase = Phase::Closing;
        true
    }

    /// Whether the loop should stop parsing (and receiving) for now.
    pub fn is_paused(&self) -> bool {
        self.in_flight >= IN_FLIGHT_MAX || self.output.len() + self.sending.len() >= OUTPUT_BYTES_MAX
    }

    /// Takes the output for a `send`, if there is any and none is in flight.
    pub fn start_send(&mut self) -> Option<(*const u8, u32)> {
        if self.send_in_flight || self.output.is_empty() || self.closing() {
            return None;
        }
        std::mem::swap(&mut self.output, &mut self.sending);
        self.sent = 0;
        self.send_in_flight = true;
        Some(self.unsent())
    }

    /// The part of the buffer in flight the kernel has not taken yet.
    pub fn unsent(&self) -> (*const u8, u32) {
        let rest = &self.sending[self.sent..];
        (rest.as_ptr(), rest.len().min(u32::MAX as usize) as u32)
    }

    /// Records that the kernel took `bytes`; true if more of the buffer is left.
    pub fn sent_bytes(&mut self, bytes: usize) -> bool {
        self.sent += bytes;
        if self.sent < self.sending.len() {
            return true;
        }
        self.sending.clear();
        self.sent = 0;
        self.send_in_flight = false;
        if self.sending.capacity() > BUFFER_BYTES_KEPT {
            self.sending = Vec::new();
        }
        if self.output.is_empty() && self.output.capacity() > BUFFER_BYTES_KEPT {
            self.output = Vec::new();
        }
        false
    }

    /// True once every reply produced has been sent.
    pub fn flushed(&self) -> bool {
        self.output.is_empty() && !self.send_in_flight
    }

    /// True once nothing more can be owed to the client: it reads no more,
    /// every shard acknowledged, every reply arrived and went out.
    pub fn finished(&self) -> bool {
        matches!(self.phase, Phase::Draining | Phase::Closing)
            && self.gone_acks == 0
            && self.in_flight == 0
            && self.flushed()
    }
}

/// The bytes at the front of `data` that complete a partial line kept from
/// earlier input: up to and including the first newline, or as much as a
/// line may hold (so that a line too long is found without waiting for it
/// all). What follows is parsed in place.
pub fn partial_line_end(data: &[u8]) -> usize {
    let bound = data.len().min(LINE_LEN_MAX + 2);
    data[..bound].iter().position(|&byte| byte == b'\n').map_or(bound, |at| at + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connection() -> Connection {
        Connection::new(3, 0, None)
    }

    #[test]
    fn a_client_that_half_closes_is_drained_then_closed() {
        let mut connection = connection();
        assert!(connection.reading() && !connection.input_ended());
        connection.end_input();
        assert_eq!(connection.phase, Phase::InputEnded);
        assert!(connection.reading(), "the lines sent before end of input are still handled");
        assert!(connection.stop_reading(), "the shards are told once");
        assert_eq!(connection.phase, Phase::Draining);
        assert!(!connection.stop_reading(), "and only once");
        assert!(!connection.reading() && !connection.input_ended());
        assert!(connection.finished(), "no acknowledgement or reply owed");
        assert!(connection.begin_close());
        assert!(!connection.begin_close(), "closing starts once");
        assert!(connection.closing() && !connection.reading());
        assert!(!connection.stop_reading());
        connection.end_input();
        assert_eq!(connection.phase, Phase::Closing, "end of input changes nothing once closing");
    }

    #[test]
    fn a_connection_finishes_once_acknowledged_answered_and_flushed() {
        let mut connection = connection();
        connection.in_flight = 2;
        connection.output.extend_from_slice(b"A k 1\n");
        assert!(!connection.finished(), "still reading");
        connection.stop_reading();
        connection.gone_acks = 1;
        assert!(!connection.finished());
        connection.gone_acks = 0;
        connection.in_flight = 0;
        assert!(!connection.finished(), "a reply is not sent yet");
        let (_, len) = connection.start_send().expect("output to send");
        assert!(!connection.finished(), "a send is in flight");
        assert!(!connection.sent_bytes(len as usize));
        assert!(connection.finished());
    }

    #[test]
    fn a_stopping_server_reads_no_more_and_tells_the_shards_only_on_a_later_stop() {
        let mut connection = connection();
        connection.input.extend_from_slice(b"A k");
        connection.stop_for_shutdown();
        assert_eq!(connection.phase, Phase::Stopped);
        assert!(connection.input.is_empty() && !connection.reading() && !connection.finished());
        connection.end_input();
        assert_eq!(connection.phase, Phase::Stopped);
        assert!(connection.stop_reading(), "a socket that fails while stopping still tells the shards");
        let mut draining = self::connection();
        draining.stop_reading();
        draining.stop_for_shutdown();
        assert_eq!(draining.phase, Phase::Draining);
    }

    #[test]
    fn a_connection_pauses_at_either_limit_and_resumes_below_both() {
        let mut connection = connection();
        assert!(!connection.is_paused());
        connection.in_flight = IN_FLIGHT_MAX;
        assert!(connection.is_paused());
        connection.in_flight -= 1;
        assert!(!connection.is_paused());
        connection.output.resize(OUTPUT_BYTES_MAX - 1, b'x');
        assert!(!connection.is_paused());
        connection.output.push(b'\n');
        assert!(connection.is_paused());
        connection.start_send().expect("output to send");
        assert!(connection.is_paused(), "bytes in flight count too");
        let (_, len) = connection.unsent();
        connection.sent_bytes(len as usize);
        assert!(!connection.is_paused());
    }

    #[test]
    fn a_send_the_kernel_takes_in_parts_goes_on_from_where_it_stopped() {
        let mut connection = connection();
        connection.output.extend_from_slice(b"A k 1\nR k\n");
        let (_, len) = connection.start_send().expect("output to send");
        assert_eq!(len, 10);
        assert!(connection.start_send().is_none(), "one send at a time");
        connection.output.extend_from_slice(b"P\n");
        assert!(connection.sent_bytes(4));
        assert_eq!(connection.unsent().1, 6);
        assert!(!connection.sent_bytes(6));
        assert!(!connection.flushed(), "the output queued meanwhile is next");
        assert_eq!(connection.start_send().map(|(_, len)| len), Some(2));
    }

    #[test]
    fn a_partial_line_is_completed_up_to_its_newline_within_the_line_limit() {
        assert_eq!(partial_line_end(b" 30 0\nA b 1 0\n"), 6);
        assert_eq!(partial_line_end(b"\n"), 1);
        assert_eq!(partial_line_end(b"more of it"), 10);
        assert_eq!(partial_line_end(b""), 0);
        let long = vec![b'k'; LINE_LEN_MAX + 10];
        assert_eq!(partial_line_end(&long), LINE_LEN_MAX + 2);
    }
}
