//! The connections of one core as the dispatcher keeps them: their sessions
//! by slot, which have output for the shell to send, what the shell must do
//! with their sockets, and the batches of messages for other cores.
//!
//! It is kept apart from the shard so that the shard's effects can be read
//! in place while replies are written here.

use ringlock_proto::{Reply, encode_reply};
use ringlock_shards::{ClientId, ShardReply};

use super::session::{INPUT_HELD_MAX, Limits, Session};
use super::{DispatchCounters, SocketEffect};
use crate::shard_core::client_id::split_client_id;
use crate::shard_core::mailbox::CoreMessage;

/// Connections per core (slot numbers have 24 bits in a client id).
pub(crate) const CONNECTIONS_PER_CORE_MAX: usize = 1 << 24;

pub(super) struct Connections {
    pub(super) core: usize,
    pub(super) sessions: Vec<Session>,
    free_slots: Vec<u32>,
    /// Connections open and not closing.
    pub(super) open: u64,
    /// Connections with output for the shell to send.
    pub(super) flush: Vec<u32>,
    /// Paused connections to try again once their replies drain, or once
    /// their requests in flight are below the limit again.
    pub(super) resumable: Vec<u32>,
    /// Connections that used their requests of a turn with lines left, in
    /// the order they did: parsed on in the next turn.
    pub(super) deferred: Vec<u32>,
    pub(super) effects: Vec<SocketEffect>,
    /// Messages for each core, taken by the shell at the end of the turn.
    pub(super) outgoing: Vec<Vec<CoreMessage>>,
    /// The address `M` replies name (standby), if an active is known.
    pub(super) active_address: Option<Vec<u8>>,
    /// Set once the server stops: connections then stay open until the core
    /// exits, so the `shutting-down` answers still on their way reach them.
    pub(super) stopping: bool,
    pub(super) counters: DispatchCounters,
    pub(super) limits: Limits,
    /// Replies written and not sent yet, over every connection.
    pub(super) output_total: usize,
    /// Over [`Limits::core_output_max`] (until below half of it again).
    pub(super) squeezed: bool,
}

impl Connections {
    pub(super) fn new(core: usize, cores: usize, limits: Limits) -> Connections {
        Connections {
            core,
            sessions: Vec::new(),
            free_slots: Vec::new(),
            open: 0,
            flush: Vec::new(),
            resumable: Vec::new(),
            deferred: Vec::new(),
            effects: Vec::new(),
            outgoing: (0..cores).map(|_| Vec::new()).collect(),
            active_address: None,
            stopping: false,
            counters: DispatchCounters::default(),
            limits,
            output_total: 0,
            squeezed: false,
        }
    }

    /// Writes `reply` into the output of `slot`, counting it against the
    /// core's budget of replies held for clients (see [`Connections::squeeze`]).
    #[inline(always)]
    fn encode(&mut self, slot: u32, reply: &Reply<'_>) {
        let added = encode_counted(&mut self.sessions[slot as usize].output, reply);
        self.written(added);
    }

    /// `added` bytes of replies were written.
    #[inline(always)]
    fn written(&mut self, added: usize) {
        self.output_total += added;
        if !self.squeezed && self.output_total >= self.limits.core_output_max {
            self.squeeze(true);
        }
    }

    /// Replies held for clients went out, or were dropped with their
    /// connection: `bytes` fewer count against the budget.
    pub(super) fn output_gone(&mut self, bytes: usize) {
        self.output_total = self.output_total.saturating_sub(bytes);
        if self.squeezed && self.output_total < self.limits.core_output_max / 2 {
            self.squeeze(false);
        }
    }

    /// Squeezes every connection while the replies held for clients
    /// (written and not sent) are over the core's budget, until they are
    /// below half of it: each connection is then read only while it holds
    /// less than [`SQUEEZED_OUTPUT_BYTES`](super::session::SQUEEZED_OUTPUT_BYTES),
    /// so the clients that read least stop being read first, and a flood of
    /// requests whose replies nobody reads costs the budget, plus that much
    /// per connection, at most.
    fn squeeze(&mut self, squeeze: bool) {
        self.squeezed = squeeze;
        if squeeze {
            self.counters.output_squeezes += 1;
        }
        for slot in 0..self.sessions.len() as u32 {
            let session = &mut self.sessions[slot as usize];
            if !session.is_open() {
                continue;
            }
            session.squeezed = squeeze;
            if !squeeze && !session.receiving && session.reading() {
                self.resumable.push(slot);
            }
        }
    }

    /// A new connection's slot and generation, or `None` if none is left.
    pub(super) fn open(&mut self) -> Option<(u32, u32)> {
        if self.stopping || (self.free_slots.is_empty() && self.sessions.len() >= CONNECTIONS_PER_CORE_MAX) {
            return None;
        }
        let slot = self.free_slots.pop().unwrap_or_else(|| {
            self.sessions.push(Session::free());
            (self.sessions.len() - 1) as u32
        });
        let session = &mut self.sessions[slot as usize];
        session.open(self.limits);
        session.squeezed = self.squeezed;
        self.open += 1;
        Some((slot, session.generation))
    }

    /// The slot of a connection the shell closed is free again.
    pub(super) fn free(&mut self, slot: u32) {
        debug_assert!(self.sessions[slot as usize].closing(), "the shell closes what it was told to");
        let session = &self.sessions[slot as usize];
        let held = session.unsent + session.output.len();
        self.output_gone(held);
        self.sessions[slot as usize].free_slot();
        self.free_slots.push(slot);
    }

    /// Whether `slot` holds the connection of `generation`, not yet closed.
    pub(super) fn is_live(&self, slot: u32, generation: u32) -> bool {
        self.sessions.get(slot as usize).is_some_and(|s| s.is_open() && s.generation == generation)
    }

    /// Tells the shell what changed for `slot`: its receive stopped at a
    /// limit or started again below it, or its close once nothing is owed.
    pub(super) fn settle(&mut self, slot: u32) {
        let session = &mut self.sessions[slot as usize];
        if !session.is_open() || session.closing() {
            return;
        }
        if session.is_paused() || session.input.len() >= INPUT_HELD_MAX {
            if session.receiving {
                session.receiving = false;
                self.effects.push(SocketEffect::StopReceiving(slot));
            }
        } else if session.wants_input() && !session.receiving {
            session.receiving = true;
            self.effects.push(SocketEffect::Receive(slot));
        }
        if !self.stopping && session.finished() {
            self.begin_close(slot);
        }
    }

    /// Lists `slot` to be parsed on in the next turn (once).
    pub(super) fn defer(&mut self, slot: u32) {
        let session = &mut self.sessions[slot as usize];
        if !session.deferred {
            session.deferred = true;
            self.deferred.push(slot);
        }
    }

    pub(super) fn begin_close(&mut self, slot: u32) {
        if self.sessions[slot as usize].begin_close() {
            self.open -= 1;
            self.effects.push(SocketEffect::Close(slot));
        }
    }

    /// A reply for `client`: written to its connection if it lives here and
    /// is open, else queued for its core.
    pub(super) fn deliver(&mut self, client: ClientId, reply: &ShardReply) {
        let (core, slot, generation) = split_client_id(client);
        if core != self.core {
            self.outgoing[core].push(CoreMessage::Reply { client, reply: reply.clone() });
            return;
        }
        if self.is_live(slot, generation) {
            self.answer(slot, reply);
        }
    }

    /// A reply for the live connection at `slot`.
    #[inline(always)]
    pub(super) fn answer(&mut self, slot: u32, reply: &ShardReply) {
        let Some(below_limit_again) = self.answering(slot) else { return };
        let reply = reply.to_wire(self.active_address.as_deref());
        self.counters.requests.count(&reply);
        let added = encode_counted(&mut self.sessions[slot as usize].output, &reply);
        self.written(added);
        self.answered(slot, below_limit_again);
    }

    /// [`Connections::answer`] with a reply the caller built, for the
    /// request it just ran.
    #[inline(always)]
    pub(super) fn answer_line(&mut self, slot: u32, reply: &Reply<'_>) {
        let Some(below_limit_again) = self.answering(slot) else { return };
        self.counters.requests.count(reply);
        self.encode(slot, reply);
        self.answered(slot, below_limit_again);
    }

    /// The first half of an answer: one request fewer in flight. `None` if
    /// the connection is closing (the answer is dropped), else whether it is
    /// back below the in-flight limit.
    #[inline(always)]
    fn answering(&mut self, slot: u32) -> Option<bool> {
        let session = &mut self.sessions[slot as usize];
        debug_assert!(session.is_open(), "a reply is written to an open connection");
        debug_assert!(session.in_flight > 0, "a reply answers a request in flight");
        session.in_flight = session.in_flight.saturating_sub(1);
        // A connection that stopped being read at the in-flight limit is
        // read again once it is below it.
        let below_limit_again = session.in_flight == session.limits.in_flight_max - 1;
        (!session.closing()).then_some(below_limit_again)
    }

    /// The second half of an answer, once it is written.
    #[inline(always)]
    fn answered(&mut self, slot: u32, below_limit_again: bool) {
        self.list(slot);
        if below_limit_again {
            self.resumable.push(slot);
        }
    }

    /// Writes a reply produced on this core without a shard.
    pub(super) fn write(&mut self, slot: u32, reply: &Reply<'_>) {
        self.encode(slot, reply);
        self.list(slot);
    }

    /// Lists `slot` among the connections with output to send.
    pub(super) fn list(&mut self, slot: u32) {
        let session = &mut self.sessions[slot as usize];
        if !session.listed {
            session.listed = true;
            self.flush.push(slot);
        }
    }
}

/// Writes `reply` at the end of `output`; the bytes it took.
#[inline(always)]
fn encode_counted(output: &mut Vec<u8>, reply: &Reply<'_>) -> usize {
    let before = output.len();
    encode_reply(reply, output);
    output.len() - before
}
