//! One client connection as its event loop sees it: bytes not parsed yet,
//! replies not sent yet, and the I/O it has in flight.

use std::os::fd::RawFd;

/// Replies a connection may have waiting before the loop stops reading its
/// requests: a client that stops reading cannot make the server buffer
/// without bound.
pub const OUTPUT_BYTES_MAX: usize = 1 << 20;

/// Unparsed bytes kept for a connection whose reading is paused; beyond it
/// the loop stops receiving from that socket until the replies drain.
pub const INPUT_BYTES_MAX: usize = 64 << 10;

/// Requests of one connection the shards have not answered yet; beyond it the
/// loop stops reading that connection (queued acquires count until granted).
pub const REQUESTS_IN_FLIGHT_MAX: u32 = 65_536;

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
    /// Requests parsed but not answered.
    pub in_flight: u32,
    /// Whether requests are still read (false after `line-too-long` or end of input).
    pub reading: bool,
    /// The shards were told the connection is gone.
    pub gone: bool,
    /// `shutdown` was called; the slot is freed once no I/O is in flight.
    pub closing: bool,
    /// Listed in the loop's set of connections with output to send.
    pub dirty: bool,
}

impl Connection {
    pub fn new(fd: RawFd, generation: u32) -> Connection {
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
            gone: false,
            closing: false,
            dirty: false,
        }
    }

    /// Whether the loop should stop parsing requests for now.
    pub fn is_paused(&self) -> bool {
        self.output.len() + self.sending.len() >= OUTPUT_BYTES_MAX || self.in_flight >= REQUESTS_IN_FLIGHT_MAX
    }

    /// Whether the loop should stop receiving bytes for now.
    pub fn input_full(&self) -> bool {
        self.input.len() >= INPUT_BYTES_MAX
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
}
