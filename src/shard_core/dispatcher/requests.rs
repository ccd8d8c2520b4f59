//! Requests and replies in the dispatcher: parsing request lines, routing
//! each request to the core that owns its key, and writing replies.

use ringlock_proto::{Decoded, ErrorCode, Op, Reply, Request, decode_request};
use ringlock_shards::{self as shards, ClientId, Key, NameId, ShardReply, shard_of};

use super::Dispatcher;
use super::session::partial_line_end;
use crate::node::role::CoreRole;
use crate::shard_core::client_id::client_id;
use crate::shard_core::mailbox::{CoreMessage, RoutedRequest};
use crate::shard_core::per_ip::AUTH_DELAY_MS;

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
    /// to write before it delivers them (see [`ringlock_shards::Shard::acquire_direct`]).
    #[inline(always)]
    fn apply_direct(self, dispatcher: &mut Dispatcher, client: ClientId, name: NameId) -> Option<Reply<'a>> {
        let (shard, now_ms) = (&mut dispatcher.shard, dispatcher.now_ms);
        debug_assert!(
            shard.effects().is_empty(),
            "a direct reply goes before every effect of its request: {:?}",
            shard.effects()
        );
        match self {
            Keyed::Acquire { key, lease_ms, wait_ms } => shard
                .acquire_direct(now_ms, client, name, key, lease_ms, wait_ms)
                .map(|token| Reply::Acquired { key, token }),
            Keyed::Release { key, token } => {
                shard.release_direct(now_ms, client, name, key, token).then_some(Reply::Released { key })
            }
            request => {
                request.apply(dispatcher, client, name);
                None
            }
        }
    }

    /// Runs the request, from `client` authenticated as `name`, on the
    /// shard that owns its key.
    #[inline(always)]
    fn apply(self, dispatcher: &mut Dispatcher, client: ClientId, name: NameId) {
        let (shard, now_ms) = (&mut dispatcher.shard, dispatcher.now_ms);
        match self {
            Keyed::Acquire { key, lease_ms, wait_ms } => shard.acquire_as(now_ms, client, name, key, lease_ms, wait_ms),
            Keyed::Release { key, token } => shard.release_as(now_ms, client, name, key, token),
            Keyed::Extend { key, token, lease_ms } => shard.extend_as(now_ms, client, name, key, token, lease_ms),
            Keyed::Inspect { key } => shard.inspect_as(now_ms, client, name, key),
            Keyed::Reject { op, key, code } => shard.reject(now_ms, client, op, key, code),
        }
    }
}

impl Dispatcher {
    /// Handles every whole request line at the front of `data`, until the
    /// connection pauses or stops reading; returns the bytes used.
    pub(super) fn parse(&mut self, slot: u32, data: &[u8]) -> usize {
        let mut offset = 0;
        loop {
            let session = &self.connections.sessions[slot as usize];
            if !session.reading() || session.is_paused() {
                if session.in_flight >= session.limits.in_flight_max {
                    self.connections.counters.in_flight_pauses += 1;
                }
                return offset;
            }
            if !self.connections.sessions[slot as usize].take_turn_share(self.turn, self.pacer.share()) {
                // Its share of this turn is used: what is left waits for
                // the next, if there is a line to parse.
                let rest = &data[offset..];
                if rest.contains(&b'\n') || rest.len() > ringlock_proto::LINE_LEN_MAX {
                    self.connections.defer(slot);
                }
                return offset;
            }
            self.turn_parsed += 1;
            match decode_request(&data[offset..], self.lease_ms_max) {
                Decoded::Incomplete => {
                    // Not a request: the share is given back.
                    self.connections.sessions[slot as usize].parsed_in_turn -= 1;
                    self.turn_parsed -= 1;
                    return offset;
                }
                Decoded::LineTooLong => {
                    self.connections.counters.count_error(ErrorCode::LineTooLong);
                    let reply = Reply::Error { op: None, key: None, code: ErrorCode::LineTooLong };
                    self.connections.counters.requests.count(&reply);
                    self.connections.write(slot, &reply);
                    self.stop_reading(slot);
                    return data.len();
                }
                Decoded::Line { consumed, item } => {
                    offset += consumed;
                    match item {
                        Ok(request) => self.request(slot, request),
                        Err(error) => match (error.op, error.key) {
                            // A keyed error goes through the key's shard, so
                            // that it keeps its place among that key's replies.
                            (Some(op @ (Op::Acquire | Op::Release | Op::Extend | Op::Inspect)), Some(key)) => {
                                self.route(slot, Keyed::Reject { op, key, code: error.code });
                            }
                            _ => {
                                self.connections.counters.count_error(error.code);
                                let reply = error.to_reply();
                                self.connections.counters.requests.count(&reply);
                                self.connections.write(slot, &reply);
                            }
                        },
                    }
                }
            }
        }
    }

    /// Received bytes: parse whole lines, keep the rest.
    pub(super) fn input(&mut self, slot: u32, data: &[u8]) {
        let session = &mut self.connections.sessions[slot as usize];
        if !session.reading() {
            return;
        }
        if session.input.is_empty() {
            let consumed = self.parse(slot, data);
            let session = &mut self.connections.sessions[slot as usize];
            if session.reading() {
                session.input.extend_from_slice(&data[consumed..]);
            }
        } else if session.is_paused() {
            session.input.extend_from_slice(data);
        } else {
            // A partial line is waiting: complete it with the bytes up to the
            // first newline, then parse the rest in place.
            let take = partial_line_end(data);
            session.input.extend_from_slice(&data[..take]);
            let mut rest = std::mem::take(&mut session.input);
            let consumed = self.parse(slot, rest.as_slice());
            rest.consume(consumed);
            let session = &self.connections.sessions[slot as usize];
            if rest.is_empty() && session.reading() && !session.is_paused() {
                let consumed = self.parse(slot, &data[take..]);
                rest.extend_from_slice(&data[take + consumed..]);
            } else {
                rest.extend_from_slice(&data[take..]);
            }
            let session = &mut self.connections.sessions[slot as usize];
            if session.reading() {
                session.input = rest;
            }
        }
    }

    fn request(&mut self, slot: u32, request: Request<'_>) {
        if self.auth.is_some() && !self.access(slot, &request) {
            return;
        }
        let keyed = match request {
            Request::Ping => {
                let (role, epoch, active) = self.view.status();
                let reply = Reply::Pong { role, epoch, active: active.as_deref().map(str::as_bytes) };
                self.connections.counters.requests.count(&reply);
                self.connections.write(slot, &reply);
                return;
            }
            Request::Stats => {
                // In a cluster `S` shows the epoch `P` does: the active's, also on a standby.
                let (role, epoch, _) = self.view.status();
                let json = self.stats_json(role, epoch);
                let reply = Reply::Stats { json: json.as_bytes() };
                self.connections.counters.requests.count(&reply);
                self.connections.write(slot, &reply);
                self.stats = Some(json);
                return;
            }
            Request::Acquire { key, lease_ms, wait_ms } => Keyed::Acquire { key, lease_ms, wait_ms },
            Request::Release { key, token } => Keyed::Release { key, token },
            Request::Extend { key, token, lease_ms } => Keyed::Extend { key, token, lease_ms },
            Request::Inspect { key } => Keyed::Inspect { key },
            Request::Authenticate { secret } => return self.authenticate(slot, secret),
        };
        self.route(slot, keyed);
    }

    /// On a server with an auth file: whether the connection may make this
    /// request. If not, it is answered here: `auth-required` before `U`,
    /// `forbidden` outside the name's scope (a keyed one through the key's
    /// shard, so that it keeps its place among that key's replies).
    fn access(&mut self, slot: u32, request: &Request<'_>) -> bool {
        let identity = &self.connections.sessions[slot as usize].identity;
        let op = request.op();
        let code = match (request, identity) {
            (Request::Ping | Request::Authenticate { .. }, _) => return true,
            (_, None) => ErrorCode::AuthRequired,
            (Request::Stats, Some(identity)) if identity.scope.allows_stats() => return true,
            (Request::Stats, Some(_)) => ErrorCode::Forbidden,
            (_, Some(identity)) => {
                let key = request.key().expect("every other request has a key");
                if identity.scope.allows_key(key) {
                    return true;
                }
                self.route(slot, Keyed::Reject { op, key, code: ErrorCode::Forbidden });
                return false;
            }
        };
        self.connections.counters.count_error(code);
        let reply = Reply::Error { op: Some(op), key: request.key(), code };
        self.connections.counters.requests.count(&reply);
        self.connections.write(slot, &reply);
        false
    }

    /// `U <secret>`: the connection is now the name the secret belongs to,
    /// or, for a wrong secret, reads no more and is answered `auth-failed`
    /// after [`AUTH_DELAY_MS`] (longer for an address that failed
    /// often, see `AuthFailures`), then closed.
    fn authenticate(&mut self, slot: u32, secret: &[u8]) {
        let found = match &self.auth {
            None => Err(ErrorCode::AuthDisabled),
            Some(table) => table.authenticate(secret).ok_or(ErrorCode::AuthFailed),
        };
        match found {
            Ok(identity) => {
                // The name's number, which its grants record. Numbers run
                // out only after tens of thousands of names (see
                // `node::names`); past that a new name is refused.
                let Some(name) = crate::node::names::intern(&identity.name) else {
                    tracing::error!(
                        names = crate::node::names::NAMES_MAX,
                        "a client authenticated under a name this process has no number left for; restart to \
                         let it in"
                    );
                    self.connections.counters.count_error(ErrorCode::AuthFailed);
                    let reply = Reply::Error { op: Some(Op::Authenticate), key: None, code: ErrorCode::AuthFailed };
                    self.connections.counters.requests.count(&reply);
                    self.connections.write(slot, &reply);
                    self.stop_reading(slot);
                    return;
                };
                let reply = Reply::Authenticated { name: &identity.name };
                self.connections.counters.requests.count(&reply);
                self.connections.write(slot, &reply);
                let session = &mut self.connections.sessions[slot as usize];
                session.identity = Some(identity);
                session.name = name;
            }
            Err(ErrorCode::AuthFailed) => {
                self.connections.counters.auth_failures += 1;
                self.connections.counters.count_error(ErrorCode::AuthFailed);
                let session = &mut self.connections.sessions[slot as usize];
                session.identity = None;
                // The answer owed keeps the connection open until it is sent.
                session.in_flight += 1;
                let generation = session.generation;
                let delay = match (&self.auth_failures, session.peer_ip) {
                    (Some(table), Some(ip)) => table.failed(ip, self.now_ms),
                    _ => AUTH_DELAY_MS,
                };
                self.stop_reading(slot);
                let at = self.now_ms + delay;
                let place = self.auth_failed.partition_point(|&(other, ..)| other <= at);
                self.auth_failed.insert(place, (at, slot, generation));
            }
            Err(code) => {
                self.connections.counters.count_error(code);
                let reply = Reply::Error { op: Some(Op::Authenticate), key: None, code };
                self.connections.counters.requests.count(&reply);
                self.connections.write(slot, &reply);
            }
        }
    }

    /// Answers the failed `U` lines whose delay is over.
    pub(super) fn answer_failed_auth(&mut self) {
        while let Some(&(at, slot, generation)) = self.auth_failed.front() {
            if at > self.now_ms {
                break;
            }
            self.auth_failed.pop_front();
            if !self.connections.is_live(slot, generation) {
                continue;
            }
            let reply = Reply::Error { op: Some(Op::Authenticate), key: None, code: ErrorCode::AuthFailed };
            self.connections.answer_line(slot, &reply);
            self.connections.settle(slot);
        }
    }

    /// Runs a request here if this core owns its key, or queues it for the
    /// core that does.
    fn route(&mut self, slot: u32, request: Keyed<'_>) {
        let session = &mut self.connections.sessions[slot as usize];
        session.in_flight += 1;
        let client = client_id(self.core, slot, session.generation);
        let name = session.name;
        let target = shard_of(request.key(), self.cores);
        if target != self.core {
            let request = request.to_routed();
            self.connections.outgoing[target].push(CoreMessage::Request { client, name, request });
            return;
        }
        if self.role != CoreRole::Active || self.semi_sync.is_some() {
            self.run_keyed(client, name, request);
            self.deliver_replies();
            return;
        }
        // Served here and now, the common case. A grant or a release made
        // at once is answered from the request line, before the effects
        // (a release's hand-off to the next waiter comes after it).
        if let Some(reply) = request.apply_direct(self, client, name) {
            self.connections.answer_line(slot, &reply);
        }
        self.deliver_replies_asked_by(Some((slot, client)));
    }

    /// Delivers the shard's replies and notes a call for tokens. The effects
    /// are read where the shard put them (see [`ringlock_shards::Shard::effects`]).
    #[inline]
    pub(super) fn deliver_replies(&mut self) {
        self.deliver_replies_asked_by(None);
    }

    /// [`Dispatcher::deliver_replies`] right after the shard ran a request of
    /// the connection at `slot`, known as `client`: a reply to it goes
    /// straight to that connection, which is live, as its input is being read.
    #[inline(always)]
    fn deliver_replies_asked_by(&mut self, asker: Option<(u32, ClientId)>) {
        if self.semi_sync.is_some() {
            return self.deliver_or_hold();
        }
        for effect in self.shard.effects() {
            match effect {
                shards::Effect::Reply { client, reply } => match asker {
                    Some((slot, asker)) if asker == *client => self.connections.answer(slot, reply),
                    _ => self.connections.deliver(*client, reply),
                },
                shards::Effect::NeedTokens => self.need_tokens = true,
            }
        }
        self.shard.clear_effects();
    }

    /// A request for one of this core's keys, from `client` authenticated
    /// as `name`, as the core's role says: served, held, or (checked
    /// already) redirected to the active.
    pub(super) fn run_keyed(&mut self, client: ClientId, name: NameId, request: Keyed<'_>) {
        match (self.role, request) {
            (CoreRole::Active, request @ (Keyed::Acquire { .. } | Keyed::Extend { .. })) if self.refuses_grants() => {
                self.shard.reject(self.now_ms, client, request.op(), request.key(), ErrorCode::NoStandby)
            }
            (CoreRole::Active, request) => request.apply(self, client, name),
            (CoreRole::Held, request) => self.parked.push((client, name, request.to_routed())),
            (CoreRole::Standby, Keyed::Reject { op, key, code }) => {
                self.shard.reject(self.now_ms, client, op, key, code)
            }
            (CoreRole::Standby, request) => {
                self.connections.deliver(client, &ShardReply::Moved { op: request.op(), key: Key::new(request.key()) })
            }
        }
    }
}
