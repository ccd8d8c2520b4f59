//! One client connection as its event loop sees it: bytes not parsed yet,
//! replies not sent yet, and the I/O it has in flight.
//!
//! A connection ends in one of two ways. When the client stops sending (end
//! of input, or a `line-too-long`), the loop stops reading, tells every shard
//! (its queued acquires leave their queues), and closes once every shard has
//! acknowledged and every reply is sent. When the socket fails, the loop
//! drops what it had for it and closes at once.

use std::net::IpAddr;
use std::os::fd::RawFd;

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
    /// Whether requests are still read.
    pub reading: bool,
    /// The client sent end of input; what it sent before is still answered.
    pub eof: bool,
    /// The shards were told that the connection reads no more.
    pub gone: bool,
    /// Shards that have not acknowledged that yet.
    pub gone_acks: u32,
    /// `shutdown` was called; the slot is freed once no I/O is in flight.
    pub closing: bool,
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
            reading: true,
            eof: false,
            gone: false,
            gone_acks: 0,
            closing: false,
            dirty: false,
            peer_ip,
        }
    }

    /// Whether the loop should stop parsing (and receiving) for now.
    pub fn is_paused(&self) -> bool {
        self.in_flight >= IN_FLIGHT_MAX || self.output.len() + self.sending.len() >= OUTPUT_BYTES_MAX
    }

    /// Takes the output for a `send`, if there is any and none is in flight.
    pub fn start_send(&mut self) -> Option<(*const u8, u32)> {
        if self.send_in_flight || self.output.is_empty() || self.closing {
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
        !self.reading && self.gone && self.gone_acks == 0 && self.in_flight == 0 && self.flushed()
    }
}
