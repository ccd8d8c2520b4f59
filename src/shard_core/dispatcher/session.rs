//! One client connection as the dispatcher sees it: bytes not parsed yet,
//! replies not handed to the socket yet, requests in flight, and where it
//! stands in its life. The socket itself (descriptor, I/O in flight, the
//! buffer of the send in flight) belongs to the shell.
//!
//! A connection ends in one of two ways. When the client stops sending (end
//! of input, or a `line-too-long`), the dispatcher stops reading it, tells
//! every shard (its queued acquires leave their queues), and closes it once
//! every shard has acknowledged and every reply is sent. When the socket
//! fails, what it had is dropped and it closes at once.
//!
//! Its [`Phase`] says where it stands on that way, and the methods that
//! change it are the only transitions (tested below):
//!
//! ```text
//! Free --open--> Reading
//! Reading --end_input--> InputEnded          (the client half-closed)
//! Reading, InputEnded --stop_reading--> Draining   (shards told)
//! Reading, InputEnded --stop_for_shutdown--> Stopped (the server stops)
//! Stopped --stop_reading--> Draining
//! Draining --begin_close--> Closing --free--> Free (generation + 1)
//! ```
//!
//! Apart from its phase, a connection is paused ([`Session::is_paused`])
//! while it has too many requests in flight or too many replies unsent: it is
//! then neither parsed nor received, and resumes once below both limits.

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

/// The limits that pause a connection; [`Limits::DEFAULT`] in the server,
/// smaller in tests that drive pausing often.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub in_flight_max: u32,
    pub output_bytes_max: usize,
    /// Replies unsent over all of a core's connections past which the core
    /// is squeezed: each connection is then read only while it holds less
    /// than [`SQUEEZED_OUTPUT_BYTES`], until the total is below half this.
    pub core_output_max: usize,
    /// A connection whose unsent replies make no progress for this long is
    /// closed (its client stopped reading).
    pub output_stall_ms: u64,
    /// Requests parsed from one connection in one turn of the core; the
    /// rest of what it sent waits for the next turn, after every other
    /// connection had its share.
    pub requests_per_turn: u32,
}

impl Limits {
    pub const DEFAULT: Limits = Limits {
        in_flight_max: IN_FLIGHT_MAX,
        output_bytes_max: OUTPUT_BYTES_MAX,
        core_output_max: CORE_OUTPUT_BYTES_DEFAULT,
        output_stall_ms: OUTPUT_STALL_MS_DEFAULT,
        requests_per_turn: REQUESTS_PER_TURN,
    };
}

/// [`Limits::requests_per_turn`]: twice the depth a pipelining client
/// usually keeps (the load generator's default is 64), so that such a
/// client is served in one turn, while one that sends thousands at once
/// cannot make a turn, and every other connection's wait, that long.
pub const REQUESTS_PER_TURN: u32 = 128;

/// [`Limits::core_output_max`] when the server sets none.
pub const CORE_OUTPUT_BYTES_DEFAULT: usize = 256 << 20;

/// [`Limits::output_stall_ms`] by default: a client that reads nothing for
/// half a minute while replies wait for it is taken for stuck.
pub const OUTPUT_STALL_MS_DEFAULT: u64 = 30_000;

/// Received bytes a connection may hold unparsed before its receive stops.
pub const INPUT_HELD_MAX: usize = 64 << 10;

/// What a connection may hold unsent while its core is squeezed.
pub const SQUEEZED_OUTPUT_BYTES: usize = 64 << 10;

/// Buffers larger than this are given back to the allocator once empty, so
/// an idle connection costs little memory after a burst.
pub const BUFFER_BYTES_KEPT: usize = 64 << 10;

/// Received bytes not parsed yet: parsing takes lines from the front by
/// moving a start offset, so a connection parsed a share per turn costs no
/// copy of what it still holds; the buffer is compacted only when more is
/// added and the parsed front is at least half of it.
#[derive(Debug, Default)]
pub struct Kept {
    bytes: Vec<u8>,
    start: usize,
}

impl Kept {
    /// The bytes not parsed yet.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[self.start..]
    }

    pub fn len(&self) -> usize {
        self.bytes.len() - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first `count` bytes were parsed.
    pub fn consume(&mut self, count: usize) {
        self.start += count;
        debug_assert!(self.start <= self.bytes.len());
        if self.start == self.bytes.len() {
            self.bytes.clear();
            self.start = 0;
        }
    }

    pub fn extend_from_slice(&mut self, data: &[u8]) {
        if self.start > 0 && self.start >= self.bytes.len() / 2 {
            self.bytes.drain(..self.start);
            self.start = 0;
        }
        self.bytes.extend_from_slice(data);
    }
}

/// Where a connection is in its life; see the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The slot holds no connection.
    Free,
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
    /// The shell was told to close it; the slot is freed once it has.
    Closing,
}

/// A client connection's state in the dispatcher.
#[derive(Debug)]
pub struct Session {
    /// Changes every time the slot is reused, so late replies for a closed
    /// connection are dropped rather than sent to its successor.
    pub generation: u32,
    /// Bytes received and not parsed yet (a partial line, or more while
    /// paused or waiting for the next turn).
    pub input: Kept,
    /// Replies not handed to the shell yet.
    pub output: Vec<u8>,
    /// Bytes handed to the shell that it has not reported sent.
    pub unsent: usize,
    /// Requests parsed and not answered (queued acquires included).
    pub in_flight: u32,
    /// Where the connection is in its life.
    phase: Phase,
    /// Shards that have not acknowledged yet that the connection reads no more.
    pub gone_acks: u32,
    /// Listed among the connections with output for the shell to send.
    pub listed: bool,
    /// Whether the shell was last told to receive (true) or to stop (false).
    pub receiving: bool,
    pub limits: Limits,
    /// Who the connection authenticated as (`U`), on a server with `--auth-file`.
    pub identity: Option<crate::auth::Identity>,
    /// The number of the identity's name, which its grants record
    /// ([`NameId::NONE`] until `U`, and without `--auth-file`).
    pub name: ringlock_shards::NameId,
    /// The client's address, on a server with `--auth-file`.
    pub peer_ip: Option<std::net::IpAddr>,
    /// Whether its core holds too many unsent replies (see
    /// [`Limits::core_output_max`]): it is then paused at a smaller output.
    pub squeezed: bool,
    /// When its unsent replies last made progress (or started to wait).
    pub last_progress_ms: u64,
    /// The turn its requests were last parsed in, and how many then.
    pub parsed_turn: u64,
    pub parsed_in_turn: u32,
    /// It used its requests of a turn with whole lines left in `input`,
    /// and is listed to be parsed on in the next turn.
    pub deferred: bool,
}

impl Session {
    /// An empty slot.
    pub fn free() -> Session {
        Session {
            generation: 0,
            input: Kept::default(),
            output: Vec::new(),
            unsent: 0,
            in_flight: 0,
            phase: Phase::Free,
            gone_acks: 0,
            listed: false,
            receiving: false,
            limits: Limits::DEFAULT,
            identity: None,
            name: ringlock_shards::NameId::NONE,
            peer_ip: None,
            squeezed: false,
            last_progress_ms: 0,
            parsed_turn: 0,
            parsed_in_turn: 0,
            deferred: false,
        }
    }

    /// Starts a new connection in this (free) slot, keeping its generation.
    pub fn open(&mut self, limits: Limits) {
        debug_assert_eq!(self.phase, Phase::Free, "a connection opens in a free slot");
        *self =
            Session { generation: self.generation, phase: Phase::Reading, receiving: true, limits, ..Session::free() };
    }

    /// Frees the slot, so that a late reply for this connection is dropped.
    pub fn free_slot(&mut self) {
        *self = Session { generation: self.generation.wrapping_add(1), ..Session::free() };
    }

    pub fn is_open(&self) -> bool {
        self.phase != Phase::Free
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

    /// Whether the shell should have a receive armed for it: not while it
    /// is paused, nor while it still holds [`INPUT_HELD_MAX`] bytes it has
    /// not parsed (so a client that sends far more than its replies let it
    /// be answered waits in its own socket buffer, not in this memory).
    pub fn wants_input(&self) -> bool {
        self.phase == Phase::Reading && !self.is_paused() && self.input.len() < INPUT_HELD_MAX
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
        self.input = Kept::default();
        match self.phase {
            Phase::Reading | Phase::InputEnded | Phase::Stopped => {
                self.phase = Phase::Draining;
                true
            }
            Phase::Free | Phase::Draining | Phase::Closing => false,
        }
    }

    /// The server stops: no more requests are read, and the input kept is dropped.
    pub fn stop_for_shutdown(&mut self) {
        self.input = Kept::default();
        if self.reading() {
            self.phase = Phase::Stopped;
        }
    }

    /// Starts closing; false if it already is (or the slot is free).
    pub fn begin_close(&mut self) -> bool {
        if matches!(self.phase, Phase::Closing | Phase::Free) {
            return false;
        }
        self.phase = Phase::Closing;
        true
    }

    /// Counts one request parsed in `turn`; false, counting nothing, if the
    /// connection has had its `share` of that turn.
    pub fn take_turn_share(&mut self, turn: u64, share: u32) -> bool {
        if self.parsed_turn != turn {
            self.parsed_turn = turn;
            self.parsed_in_turn = 0;
        }
        if self.parsed_in_turn >= share {
            return false;
        }
        self.parsed_in_turn += 1;
        true
    }

    /// Whether the dispatcher should stop parsing (and receiving) for now.
    pub fn is_paused(&self) -> bool {
        let output = self.output.len() + self.unsent;
        self.in_flight >= self.limits.in_flight_max
            || output >= self.limits.output_bytes_max
            || (self.squeezed && output >= SQUEEZED_OUTPUT_BYTES)
    }

    /// Hands the output to the shell: swapped with `into` (emptied first),
    /// so no byte is copied. False if there was none.
    pub fn take_output(&mut self, into: &mut Vec<u8>) -> bool {
        into.clear();
        if self.output.is_empty() || self.closing() {
            return false;
        }
        std::mem::swap(&mut self.output, into);
        self.unsent += into.len();
        if self.output.capacity() > BUFFER_BYTES_KEPT {
            // The buffer taken in exchange stays with the session; a large
            // one is not kept for an idle connection.
            self.output = Vec::new();
        }
        true
    }

    /// The shell sent `bytes` of what it took.
    pub fn sent(&mut self, bytes: usize) {
        debug_assert!(bytes <= self.unsent, "the shell sends only what it took");
        self.unsent = self.unsent.saturating_sub(bytes);
        if self.output.is_empty() && self.output.capacity() > BUFFER_BYTES_KEPT {
            self.output = Vec::new();
        }
    }

    /// True once every reply produced has been sent.
    pub fn flushed(&self) -> bool {
        self.output.is_empty() && self.unsent == 0
    }

    /// True once nothing more can be owed to the client: it reads no more,
    /// every shard acknowledged, every reply arrived and went out.
    pub fn finished(&self) -> bool {
        self.phase == Phase::Draining && self.gone_acks == 0 && self.in_flight == 0 && self.flushed()
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

    fn session() -> Session {
        let mut session = Session::free();
        session.open(Limits::DEFAULT);
        session
    }

    #[test]
    fn a_client_that_half_closes_is_drained_then_closed() {
        let mut session = session();
        assert!(session.reading() && !session.input_ended());
        session.end_input();
        assert_eq!(session.phase, Phase::InputEnded);
        assert!(session.reading(), "the lines sent before end of input are still handled");
        assert!(!session.wants_input(), "nothing more arrives after end of input");
        assert!(session.stop_reading(), "the shards are told once");
        assert_eq!(session.phase, Phase::Draining);
        assert!(!session.stop_reading(), "and only once");
        assert!(!session.reading() && !session.input_ended());
        assert!(session.finished(), "no acknowledgement or reply owed");
        assert!(session.begin_close());
        assert!(!session.begin_close(), "closing starts once");
        assert!(session.closing() && !session.reading());
        assert!(!session.stop_reading());
        session.end_input();
        assert_eq!(session.phase, Phase::Closing, "end of input changes nothing once closing");
    }

    #[test]
    fn a_freed_slot_opens_with_a_new_generation() {
        let mut session = session();
        let generation = session.generation;
        session.output.extend_from_slice(b"A k 1\n");
        session.begin_close();
        session.free_slot();
        assert!(!session.is_open() && session.output.is_empty());
        assert_eq!(session.generation, generation.wrapping_add(1));
        assert!(!session.begin_close(), "a free slot does not close");
        session.open(Limits::DEFAULT);
        assert!(session.reading() && session.receiving);
        assert_eq!(session.generation, generation.wrapping_add(1));
    }

    #[test]
    fn a_connection_finishes_once_acknowledged_answered_and_flushed() {
        let mut session = session();
        session.in_flight = 2;
        session.output.extend_from_slice(b"A k 1\n");
        assert!(!session.finished(), "still reading");
        session.stop_reading();
        session.gone_acks = 1;
        assert!(!session.finished());
        session.gone_acks = 0;
        session.in_flight = 0;
        assert!(!session.finished(), "a reply is not sent yet");
        let mut sending = Vec::new();
        assert!(session.take_output(&mut sending));
        assert!(!session.finished(), "a send is in flight");
        session.sent(sending.len());
        assert!(session.finished());
    }

    #[test]
    fn kept_input_is_taken_from_the_front_and_compacted_only_when_more_comes() {
        let mut kept = Kept::default();
        kept.extend_from_slice(b"P\nP\nA k");
        kept.consume(2);
        assert_eq!(kept.as_slice(), b"P\nA k");
        kept.extend_from_slice(b" 30 0\n");
        assert_eq!(kept.as_slice(), b"P\nA k 30 0\n");
        kept.consume(2);
        kept.consume(9);
        assert!(kept.is_empty());
        assert_eq!((kept.bytes.len(), kept.start), (0, 0), "emptied, it starts over");
    }

    #[test]
    fn a_stopping_server_reads_no_more_and_tells_the_shards_only_on_a_later_stop() {
        let mut session = session();
        session.input.extend_from_slice(b"A k");
        session.stop_for_shutdown();
        assert_eq!(session.phase, Phase::Stopped);
        assert!(session.input.is_empty() && !session.reading() && !session.finished());
        session.end_input();
        assert_eq!(session.phase, Phase::Stopped);
        assert!(session.stop_reading(), "a socket that fails while stopping still tells the shards");
        let mut draining = self::session();
        draining.stop_reading();
        draining.stop_for_shutdown();
        assert_eq!(draining.phase, Phase::Draining);
    }

    #[test]
    fn a_connection_pauses_at_either_limit_and_resumes_below_both() {
        let mut session = session();
        assert!(!session.is_paused());
        session.in_flight = IN_FLIGHT_MAX;
        assert!(session.is_paused() && !session.wants_input());
        session.in_flight -= 1;
        assert!(!session.is_paused() && session.wants_input());
        session.output.resize(OUTPUT_BYTES_MAX - 1, b'x');
        assert!(!session.is_paused());
        session.output.push(b'\n');
        assert!(session.is_paused());
        let mut sending = Vec::new();
        assert!(session.take_output(&mut sending));
        assert!(session.is_paused(), "bytes handed to the shell and not sent count too");
        session.sent(sending.len() - 1);
        assert!(!session.is_paused());
    }

    #[test]
    fn output_goes_to_the_shell_by_swapping_buffers() {
        let mut session = session();
        let mut sending = Vec::with_capacity(64);
        assert!(!session.take_output(&mut sending), "no output yet");
        session.output.extend_from_slice(b"A k 1\nR k\n");
        assert!(session.take_output(&mut sending));
        assert_eq!(sending, b"A k 1\nR k\n");
        assert_eq!(session.unsent, 10);
        assert!(session.output.is_empty() && session.output.capacity() >= 64, "the shell's buffer is reused");
        session.output.extend_from_slice(b"P\n");
        session.sent(4);
        assert_eq!(session.unsent, 6);
        session.sent(6);
        assert!(!session.flushed(), "the output queued meanwhile is next");
        assert!(session.take_output(&mut sending));
        assert_eq!(sending, b"P\n");
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
