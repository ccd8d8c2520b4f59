//! Requests and replies on a shard core: parsing lines, routing each request
//! to the core that owns its key, and delivering replies to connections.

use ringlock_proto::{Decoded, ErrorCode, Op, Reply, Request, Role, decode_request, encode_reply};
use ringlock_shards::{ClientId, Effect, Key, Shard, ShardReply, shard_of};

use crate::core::client_id::{client_id, split_client_id};
use crate::core::connection::{IN_FLIGHT_MAX, partial_line_end};
use crate::core::mailbox::{CoreMessage, RoutedRequest};
use crate::core::state::{CoreState, live_connection};
use crate::node::role::{ClusterLink, CoreRole};
use crate::node::stats_reply;

/// A request on a key, borrowing the key from the line it was parsed from:
/// it becomes an owned [`RoutedRequest`] only if another core owns the key.
#[derive(Clone, Copy)]
pub(super) enum Keyed<'a> {
    Acquire { key: &'a [u8], lease_ms: u64, wait_ms: u64 },
    Release { key: &'a [u8], token: u64 },
    Extend { key: &'a [u8], token: u64, lease_ms: u64 },
    Inspect { key: &'a [u8] },
    Reject { op: Op, key: &'a [u8], code: ErrorCode },
}

impl<'a> Keyed<'a> {
    pub(super) fn key(self) -> &'a [u8] {
        match self {
            Keyed::Acquire { key, .. } | Keyed::Release { key, .. } | Keyed::Extend { key, .. } => key,
            Keyed::Inspect { key } | Keyed::Reject { key, .. } => key,
        }
    }

    pub(super) fn op(self) -> Op {
        match self {
            Keyed::Acquire { .. } => Op::Acquire,
            Keyed::Release { .. } => Op::Release,
            Keyed::Extend { .. } => Op::Extend,
            Keyed::Inspect { .. } => Op::Inspect,
            Keyed::Reject { op, .. } => op,
        }
    }

    pub(super) fn of(request: &'a RoutedRequest) -> Keyed<'a> {
        match request {
            RoutedRequest::Acquire { key, lease_ms, wait_ms } => {
                Keyed::Acquire { key: key.as_bytes(), lease_ms: *lease_ms, wait_ms: *wait_ms }
            }
            RoutedRequest::Release { key, token } => Keyed::Release { key: key.as_bytes(), token: *token },
            RoutedRequest::Extend { key, token, lease_ms } => {
                Keyed::Extend { key: key.as_bytes(), token: *token, lease_ms: *lease_ms }
            }
            RoutedRequest::Inspect { key } => Keyed::Inspect { key: key.as_bytes() },
            RoutedRequest::Reject { op, key, code } => Keyed::Reject { op: *op, key: key.as_bytes(), code: *code },
        }
    }

    fn to_routed(self) -> RoutedRequest {
        match self {
            Keyed::Acquire { key, lease_ms, wait_ms } => {
                RoutedRequest::Acquire { key: Key::new(key), lease_ms, wait_ms }
            }
            Keyed::Release { key, token } => RoutedRequest::Release { key: Key::new(key), token },
            Keyed::Extend { key, token, lease_ms } => RoutedRequest::Extend { key: Key::new(key), token, lease_ms },
            Keyed::Inspect { key } => RoutedRequest::Inspect { key: Key::new(key) },
            Keyed::Reject { op, key, code } => RoutedRequest::Reject { op, key: Key::new(key), code },
        }
    }

    /// [`Keyed::apply`], except that an immediate grant or a release made is
    /// not answered among the shard's effects but returned, for the caller
    /// to write before it delivers them (see [`Shard::acquire_direct`]).
    #[inline(always)]
    fn apply_direct(self, shard: &mut Shard, now_ms: u64, client: ClientId) -> Option<Reply<'a>> {
        debug_assert!(shard.effects().is_empty(), "a direct reply goes before every effect of its request");
        match self {
            Keyed::Acquire { key, lease_ms, wait_ms } => {
                shard.acquire_direct(now_ms, client, key, lease_ms, wait_ms).map(|token| Reply::Acquired { key, token })
            }
            Keyed::Release { key, token } => {
                shard.release_direct(now_ms, client, key, token).then_some(Reply::Released { key })
            }
            request => {
                request.apply(shard, now_ms, client);
                None
            }
        }
    }

    /// Runs the request on the shard that owns its key.
    #[inline(always)]
    fn apply(self, shard: &mut Shard, now_ms: u64, client: ClientId) {
        match self {
            Keyed::Acquire { key, lease_ms, wait_ms } => shard.acquire(now_ms, client, key, lease_ms, wait_ms),
            Keyed::Release { key, token } => shard.release(now_ms, client, key, token),
            Keyed::Extend { key, token, lease_ms } => shard.extend(now_ms, client, key, token, lease_ms),
            Keyed::Inspect { key } => shard.inspect(now_ms, client, key),
            Keyed::Reject { op, key, code } => shard.reject(now_ms, client, op, key, code),
        }
    }
}

impl CoreState {
    /// Handles every whole request line at the front of `data`, until the
    /// connection pauses or stops reading; returns the bytes used.
    pub(crate) fn parse(&mut self, shard: &mut Shard, slot: u32, data: &[u8]) -> usize {
        let mut offset = 0;
        loop {
            let connection = &self.connections[slot as usize];
            if !connection.reading() || connection.is_paused() {
                if connection.in_flight >= IN_FLIGHT_MAX {
                    self.in_flight_pauses += 1;
                }
                return offset;
            }
            match decode_request(&data[offset..], self.shared.lease_ms_max) {
                Decoded::Incomplete => return offset,
                Decoded::LineTooLong => {
                    self.count_error(ErrorCode::LineTooLong);
                    let reply = Reply::Error { op: None, key: None, code: ErrorCode::LineTooLong };
                    self.requests.count(&reply);
                    self.write(slot, &reply);
                    self.stop_reading(shard, slot);
                    return data.len();
                }
                Decoded::Line { consumed, item } => {
                    offset += consumed;
                    match item {
                        Ok(request) => self.request(shard, slot, request),
                        Err(error) => match (error.op, error.key) {
                            // A keyed error goes through the key's shard, so
                            // that it keeps its place among that key's replies.
                            (Some(op @ (Op::Acquire | Op::Release | Op::Extend | Op::Inspect)), Some(key)) => {
                                self.route(shard, slot, Keyed::Reject { op, key, code: error.code });
                            }
                            _ => {
                                self.count_error(error.code);
                                let reply = error.to_reply();
                                self.requests.count(&reply);
                                self.write(slot, &reply);
                            }
                        },
                    }
                }
            }
        }
    }

    /// Received bytes: parse whole lines, keep the rest.
    pub(crate) fn input(&mut self, shard: &mut Shard, slot: u32, data: &[u8]) {
        let connection = &mut self.connections[slot as usize];
        if !connection.reading() {
            return;
        }
        if connection.input.is_empty() {
            let consumed = self.parse(shard, slot, data);
            let connection = &mut self.connections[slot as usize];
            if connection.reading() {
                connection.input.extend_from_slice(&data[consumed..]);
            }
        } else if connection.is_paused() {
            connection.input.extend_from_slice(data);
        } else {
            // A partial line is waiting: complete it with the bytes up to the
            // first newline, then parse the rest in place.
            let take = partial_line_end(data);
            connection.input.extend_from_slice(&data[..take]);
            let pending = std::mem::take(&mut connection.input);
            let consumed = self.parse(shard, slot, &pending);
            let mut rest = pending;
            rest.drain(..consumed);
            let connection = &self.connections[slot as usize];
            if rest.is_empty() && connection.reading() && !connection.is_paused() {
                let consumed = self.parse(shard, slot, &data[take..]);
                rest.extend_from_slice(&data[take + consumed..]);
            } else {
                rest.extend_from_slice(&data[take..]);
            }
            let connection = &mut self.connections[slot as usize];
            if connection.reading() {
                connection.input = rest;
            }
        }
        self.pause_if_full(slot);
    }

    fn request(&mut self, shard: &mut Shard, slot: u32, request: Request<'_>) {
        let keyed = match request {
            Request::Ping => {
                let status = self.shared.cluster.as_ref().map(ClusterLink::status);
                let reply = match &status {
                    None => Reply::Pong {
                        role: Role::Active,
                        epoch: self.shared.authority.epoch(),
                        active: Some(self.advertised.as_bytes()),
                    },
                    Some(status) => Reply::Pong {
                        role: status.role(),
                        epoch: status.epoch,
                        active: status.active_address.as_deref().map(str::as_bytes),
                    },
                };
                self.requests.count(&reply);
                encode_reply(&reply, &mut self.connections[slot as usize].output);
                self.mark_dirty(slot);
                return;
            }
            Request::Stats => {
                // In a cluster `S` shows the epoch `P` does: the active's, also on a standby.
                let (role, epoch) = match &self.shared.cluster {
                    None => (Role::Active, self.shared.authority.epoch()),
                    Some(link) => {
                        let status = link.status();
                        (status.role(), status.epoch)
                    }
                };
                let json = stats_reply::json(&self.shared, role, epoch);
                let reply = Reply::Stats { json: json.as_bytes() };
                self.requests.count(&reply);
                self.write(slot, &reply);
                return;
            }
            Request::Acquire { key, lease_ms, wait_ms } => Keyed::Acquire { key, lease_ms, wait_ms },
            Request::Release { key, token } => Keyed::Release { key, token },
            Request::Extend { key, token, lease_ms } => Keyed::Extend { key, token, lease_ms },
            Request::Inspect { key } => Keyed::Inspect { key },
        };
        self.route(shard, slot, keyed);
    }

    /// Runs a request here if this core owns its key, or queues it for the
    /// core that does.
    fn route(&mut self, shard: &mut Shard, slot: u32, request: Keyed<'_>) {
        let connection = &mut self.connections[slot as usize];
        connection.in_flight += 1;
        let client = client_id(self.core, slot, connection.generation);
        let target = shard_of(request.key(), self.cores);
        if target != self.core {
            self.outgoing[target].push(CoreMessage::Request { client, request: request.to_routed() });
            return;
        }
        if self.role != CoreRole::Active {
            self.run_keyed(shard, client, request);
            self.deliver_replies(shard);
            return;
        }
        // Served here and now, the common case. A grant or a release made
        // at once is answered from the request line, before the effects
        // (a release's hand-off to the next waiter comes after it).
        if let Some(reply) = request.apply_direct(shard, self.now_ms, client) {
            self.answer_line(slot, &reply);
        }
        self.deliver_replies_asked_by(shard, Some((slot, client)));
    }

    /// Delivers the shard's replies and notes a call for tokens. The effects
    /// are read where the shard put them (see [`Shard::effects`]).
    #[inline]
    pub(super) fn deliver_replies(&mut self, shard: &mut Shard) {
        self.deliver_replies_asked_by(shard, None);
    }

    /// [`CoreState::deliver_replies`] right after the shard ran a request of the
    /// connection at `slot`, known as `client`: a reply to it goes straight
    /// to that connection, which is live, as its input is being read.
    #[inline(always)]
    fn deliver_replies_asked_by(&mut self, shard: &mut Shard, asker: Option<(u32, ClientId)>) {
        for effect in shard.effects() {
            match effect {
                Effect::Reply { client, reply } => match asker {
                    Some((slot, asker)) if asker == *client => self.answer(slot, reply),
                    _ => self.deliver(*client, reply),
                },
                Effect::NeedTokens => self.need_tokens = true,
            }
        }
        shard.clear_effects();
    }

    /// A request for one of this core's keys, as the core's role says:
    /// served, held, or (checked already) redirected to the active.
    pub(super) fn run_keyed(&mut self, shard: &mut Shard, client: ClientId, request: Keyed<'_>) {
        match (self.role, request) {
            (CoreRole::Active, request) => request.apply(shard, self.now_ms, client),
            (CoreRole::Held, request) => self.parked.push((client, request.to_routed())),
            (CoreRole::Standby, Keyed::Reject { op, key, code }) => shard.reject(self.now_ms, client, op, key, code),
            (CoreRole::Standby, request) => {
                self.deliver(client, &ShardReply::Moved { op: request.op(), key: Key::new(request.key()) })
            }
        }
    }

    /// A reply for `client`: written to its connection if it lives here and
    /// its socket still works, else queued for its core.
    pub(crate) fn deliver(&mut self, client: ClientId, reply: &ShardReply) {
        let (core, slot, generation) = split_client_id(client);
        if core != self.core {
            self.outgoing[core].push(CoreMessage::Reply { client, reply: reply.clone() });
            return;
        }
        if live_connection(&mut self.connections, slot, generation).is_some() {
            self.answer(slot, reply);
        }
    }

    /// A reply for the live connection at `slot`.
    #[inline(always)]
    fn answer(&mut self, slot: u32, reply: &ShardReply) {
        let Some(below_limit_again) = self.answering(slot) else { return };
        let reply = reply.to_wire(self.active_address.as_deref());
        self.requests.count(&reply);
        encode_reply(&reply, &mut self.connections[slot as usize].output);
        self.answered(slot, below_limit_again);
    }

    /// [`CoreState::answer`] with a reply the caller built, for the request
    /// it just ran.
    #[inline(always)]
    fn answer_line(&mut self, slot: u32, reply: &Reply<'_>) {
        let Some(below_limit_again) = self.answering(slot) else { return };
        self.requests.count(reply);
        encode_reply(reply, &mut self.connections[slot as usize].output);
        self.answered(slot, below_limit_again);
    }

    /// The first half of an answer: one request fewer in flight. `None` if
    /// the connection is closing (the answer is dropped), else whether it is
    /// back below the in-flight limit.
    #[inline(always)]
    fn answering(&mut self, slot: u32) -> Option<bool> {
        let connection = &mut self.connections[slot as usize];
        debug_assert!(connection.fd >= 0, "a reply is written to an open connection");
        debug_assert!(connection.in_flight > 0, "a reply answers a request in flight");
        connection.in_flight = connection.in_flight.saturating_sub(1);
        // A connection that stopped being read at the in-flight limit is
        // read again once it is below it.
        let below_limit_again = connection.in_flight == IN_FLIGHT_MAX - 1;
        (!connection.closing()).then_some(below_limit_again)
    }

    /// The second half of an answer, once it is written.
    #[inline(always)]
    fn answered(&mut self, slot: u32, below_limit_again: bool) {
        self.mark_dirty(slot);
        if below_limit_again {
            self.resumable.push(slot);
        }
    }

    /// Writes a reply produced on this core without a shard.
    pub(crate) fn write(&mut self, slot: u32, reply: &Reply<'_>) {
        encode_reply(reply, &mut self.connections[slot as usize].output);
        self.mark_dirty(slot);
    }

    pub(crate) fn mark_dirty(&mut self, slot: u32) {
        let connection = &mut self.connections[slot as usize];
        if !connection.dirty {
            connection.dirty = true;
            self.dirty.push(slot);
        }
    }
}
