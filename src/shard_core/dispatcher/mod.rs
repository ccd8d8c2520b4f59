//! The pure per-core dispatcher: everything a shard core decides about its
//! connections and requests, with no socket, ring or clock inside.
//!
//! The shell (the io_uring loop in `event_loop.rs` and `sockets.rs`) feeds it
//! bytes read, end of input and socket failures, bytes sent, messages from
//! other cores, the replication core's orders and the time; the dispatcher
//! parses request lines, runs the requests for its own keys on its
//! [`Shard`], routes the others to the core that owns them, and writes the
//! replies into buffers it owns. What the shell must do comes out as:
//!
//! - connections with output to send ([`Dispatcher::take_flush`]), whose
//!   bytes the shell takes with [`Dispatcher::take_output`];
//! - [`SocketEffect`]s: stop receiving, receive again, close;
//! - a batch of messages per other core ([`Dispatcher::outgoing`]);
//! - a call for fencing tokens ([`Dispatcher::take_token_call`]), and the
//!   shard's next deadline ([`Dispatcher::next_deadline_ms`]).
//!
//! # The rules it keeps
//! - Replies for one (op, key) on one connection keep request order: every
//!   keyed request, errors included, goes through its key's shard.
//! - A connection with [`IN_FLIGHT_MAX`](session::IN_FLIGHT_MAX) requests unanswered, or
//!   [`OUTPUT_BYTES_MAX`](session::OUTPUT_BYTES_MAX) bytes of replies unsent, is paused: its input is
//!   kept unparsed and its receive stopped, until it is below both again.
//! - `line-too-long` is answered, then nothing more is read, and the
//!   connection closes once its replies are out.
//! - A connection that reads no more tells every shard (its queued acquires
//!   leave their queues) and closes once all have acknowledged and every
//!   reply owed is sent; one whose socket failed closes at once.
//! - A standby checks a request fully, then answers `M`; a held core parks
//!   requests in arrival order until the hand-off ends.

mod connections;
#[cfg(test)]
mod model_tests;
mod pacing;
mod requests;
mod semi_sync;
pub(crate) mod session;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::sync::Arc;

use ringlock_proto::{ErrorCode, Reply, Role};
use ringlock_shards::{ClientId, Delta, NameId, Shard, TokenRange, TokenRangeError};

use crate::auth::AuthTable;
use crate::node::counters::RequestCounters;
use crate::node::role::{CoreRole, Restored};
use crate::shard_core::client_id::{client_id, split_client_id};
use crate::shard_core::mailbox::{CoreMessage, RoutedRequest};
use crate::shard_core::per_ip::AuthFailures;
use connections::Connections;
pub(crate) use session::{BUFFER_BYTES_KEPT, Limits};

/// What the node says of itself in `P` and `S`: read by the dispatcher from
/// outside, since it is shared by every core and the replication core.
pub(crate) trait NodeView {
    /// The role, the active's epoch, and the address clients should use.
    fn status(&self) -> (Role, u64, Option<String>);
    /// The `S` reply's JSON for the node in `role` at `epoch`.
    fn stats_json(&self, role: Role, epoch: u64) -> String;
}

/// What the shell must do with a connection's socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SocketEffect {
    /// The connection is paused: stop receiving (its requests wait in the
    /// kernel's buffers).
    StopReceiving(u32),
    /// It may be read again: receive, if no receive is armed.
    Receive(u32),
    /// Nothing more is owed (or the socket failed): shut it down, and once
    /// no I/O of it is in flight, close it and call [`Dispatcher::closed`].
    Close(u32),
}

/// Counters of what the dispatcher answered without a shard.
#[derive(Clone, Debug, Default)]
pub(crate) struct DispatchCounters {
    /// Errors found before a request reaches a shard, by code.
    pub(crate) errors: [u64; ErrorCode::ALL.len()],
    /// Replies written, by operation and result.
    pub(crate) requests: RequestCounters,
    /// Times a connection stopped being read at the in-flight limit.
    pub(crate) in_flight_pauses: u64,
    /// `U` lines whose secret named nobody.
    pub(crate) auth_failures: u64,
    /// Connections closed because a reload removed their name.
    pub(crate) auth_revocations: u64,
    /// Times the core's unsent replies went over its budget.
    pub(crate) output_squeezes: u64,
    /// Connections closed because their unsent replies made no progress
    /// for `--output-stall-ms`.
    pub(crate) output_stall_closes: u64,
}

impl DispatchCounters {
    pub(crate) fn count_error(&mut self, code: ErrorCode) {
        if let Some(index) = code.index() {
            self.errors[index] += 1;
        }
    }
}

/// Where a dispatcher runs and the limits it keeps.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settings {
    /// This core's index, and how many shard cores the node has.
    pub(crate) core: usize,
    pub(crate) cores: usize,
    /// `--max-lease`, in milliseconds.
    pub(crate) lease_ms_max: u64,
    pub(crate) limits: Limits,
}

/// One core's dispatcher; see the module documentation.
pub(crate) struct Dispatcher {
    core: usize,
    cores: usize,
    lease_ms_max: u64,
    shard: Shard,
    view: Box<dyn NodeView>,
    now_ms: u64,
    connections: Connections,
    need_tokens: bool,
    role: CoreRole,
    /// Requests held while the role is [`CoreRole::Held`], in arrival order.
    parked: Vec<(ClientId, NameId, RoutedRequest)>,
    /// The auth file in force, if the server has one: every request but `P`
    /// and `U` then needs an authenticated name whose scope allows it.
    auth: Option<Arc<AuthTable>>,
    /// Failed `U` lines whose answer waits out its delay
    /// ([`AUTH_DELAY_MS`](crate::shard_core::per_ip::AUTH_DELAY_MS), more for an address that failed often):
    /// when, and for which connection, in time order.
    auth_failed: VecDeque<(u64, u32, u32)>,
    /// When connections are next checked for stalled unsent replies.
    next_stall_check_ms: u64,
    /// Failed `U` lines per client address, shared by the cores: a
    /// failure's delay grows with its address's (see `AuthFailures`).
    auth_failures: Option<Arc<AuthFailures>>,
    /// The last `S` reply's JSON, kept with the turn, role and epoch it was
    /// built for: every `S` of the same turn shares it (the counters it
    /// shows are published once a turn), so that a flood of `S` costs a
    /// copy each rather than a walk over every core's counters each.
    stats: Option<StatsJson>,
    /// The number of this turn (see [`Dispatcher::set_now`]).
    turn: u64,
    /// Requests parsed in this turn, over all connections.
    turn_parsed: u32,
    /// Each connection's share of a turn, from what requests cost.
    pacer: pacing::Pacer,
    /// With `--min-standbys`: the replies held until standbys have the
    /// change they report (see `semi_sync.rs`). `None`: replies go at once.
    semi_sync: Option<Box<semi_sync::SemiSync>>,
}

/// A built `S` reply body and what it was built for.
pub(crate) struct StatsJson {
    turn: u64,
    role: Role,
    epoch: u64,
    pub(crate) json: String,
}

impl StatsJson {
    pub(crate) fn as_bytes(&self) -> &[u8] {
        self.json.as_bytes()
    }
}

/// How often connections are checked for unsent replies that stall.
const STALL_CHECK_MS: u64 = 1_000;

impl Dispatcher {
    /// The dispatcher of core `settings.core`, serving `shard` in `role`.
    pub(crate) fn new(
        settings: Settings,
        shard: Shard,
        view: Box<dyn NodeView>,
        role: CoreRole,
        auth: Option<Arc<AuthTable>>,
    ) -> Dispatcher {
        let Settings { core, cores, lease_ms_max, limits } = settings;
        let mut dispatcher = Dispatcher {
            core,
            cores,
            lease_ms_max,
            now_ms: shard.now_ms(),
            shard,
            view,
            connections: Connections::new(core, cores, limits),
            need_tokens: false,
            role,
            parked: Vec::new(),
            auth,
            auth_failed: VecDeque::new(),
            next_stall_check_ms: 0,
            auth_failures: None,
            stats: None,
            turn: 1,
            turn_parsed: 0,
            pacer: pacing::Pacer::new(limits.requests_per_turn),
            semi_sync: None,
        };
        // A new shard's first effect is its call for tokens.
        dispatcher.deliver_replies();
        dispatcher
    }

    // ----- inputs from the shell -----

    /// A new turn of the core, at `now_ms`: nothing in the dispatcher reads
    /// a clock. Each connection may have its share of requests parsed per
    /// turn: [`Limits::requests_per_turn`], or fewer while requests are
    /// costly (see `pacing.rs` and [`Dispatcher::turn_ended`]).
    pub(crate) fn set_now(&mut self, now_ms: u64) {
        self.now_ms = now_ms;
        self.turn += 1;
        self.turn_parsed = 0;
    }

    /// The turn begun by the last [`Dispatcher::set_now`] took `elapsed_ns`
    /// in all, replies sent: the next turns' shares follow what its
    /// requests cost.
    pub(crate) fn turn_ended(&mut self, elapsed_ns: u64) {
        self.pacer.turn_ended(elapsed_ns, self.turn_parsed);
    }

    /// Whether this turn parsed requests enough for its length to count
    /// in the shares (see [`Dispatcher::turn_ended`]); the shell reads the
    /// clock only then.
    pub(crate) fn turn_counts(&self) -> bool {
        pacing::Pacer::counts(self.turn_parsed)
    }

    /// Requests parsed in this turn so far, over all connections.
    #[cfg(test)]
    pub(crate) fn turn_parsed(&self) -> u32 {
        self.turn_parsed
    }

    /// Requests a connection may have parsed per turn now, and the average
    /// cost of a request in nanoseconds that share follows.
    pub(crate) fn pacing(&self) -> (u32, u64) {
        (self.pacer.share(), self.pacer.cost_ns())
    }

    /// A new connection: its slot and generation, or `None` if the core has
    /// no slot left or the server is stopping. The shell receives on it.
    pub(crate) fn open(&mut self) -> Option<(u32, u32)> {
        self.connections.open()
    }

    /// Bytes received on the connection at `slot`: whole lines are parsed
    /// (unless it is paused), the rest is kept.
    pub(crate) fn received(&mut self, slot: u32, data: &[u8]) {
        self.input(slot, data);
        self.connections.settle(slot);
    }

    /// The client sent end of input: what it sent before is answered, then
    /// the connection closes.
    pub(crate) fn input_ended(&mut self, slot: u32) {
        self.connections.sessions[slot as usize].end_input();
        self.finish_input(slot);
        self.connections.settle(slot);
    }

    /// The socket failed: nothing more can be sent, so it closes now.
    pub(crate) fn failed(&mut self, slot: u32) {
        self.stop_reading(slot);
        let dropped = std::mem::take(&mut self.connections.sessions[slot as usize].output).len();
        self.connections.output_gone(dropped);
        self.connections.begin_close(slot);
    }

    /// Hands the connection's output to the shell for a send (see
    /// [`Session::take_output`]). False if there is none.
    pub(crate) fn take_output(&mut self, slot: u32, into: &mut Vec<u8>) -> bool {
        // The bytes are the shell's to send now, but still count against the
        // output limits until sent.
        let session = &mut self.connections.sessions[slot as usize];
        let waited = session.unsent > 0;
        if !session.take_output(into) {
            return false;
        }
        if !waited {
            session.last_progress_ms = self.now_ms;
        }
        true
    }

    /// The shell sent `bytes` of the output it took.
    pub(crate) fn sent(&mut self, slot: u32, bytes: usize) {
        let session = &mut self.connections.sessions[slot as usize];
        if !session.is_open() {
            return;
        }
        let unsent = session.unsent;
        session.sent(bytes);
        if bytes > 0 {
            session.last_progress_ms = self.now_ms;
        }
        let gone = unsent - session.unsent;
        self.connections.output_gone(gone);
        if !self.connections.resumable.is_empty() {
            self.resume_paused();
        }
        let session = &mut self.connections.sessions[slot as usize];
        if session.unsent > 0 {
            return;
        }
        // Everything taken went out: what was written meanwhile is next, and
        // a connection paused by its output may be read again.
        let resume = session.reading() && (!session.input.is_empty() || !session.receiving);
        if !session.output.is_empty() {
            self.connections.list(slot);
        }
        if resume {
            self.connections.resumable.push(slot);
            self.resume_paused();
        }
        self.connections.settle(slot);
    }

    /// The shell closed the socket the dispatcher asked it to close: the
    /// slot is free for another connection.
    pub(crate) fn closed(&mut self, slot: u32) {
        self.connections.free(slot);
        if !self.connections.resumable.is_empty() {
            self.resume_paused();
        }
    }

    /// A message from another core (not an adoption or a control, which
    /// the shell handles).
    pub(crate) fn handle_message(&mut self, message: CoreMessage) {
        match message {
            CoreMessage::Request { client, name, request } => {
                self.run_keyed(client, name, requests::Keyed::of(&request));
                self.deliver_replies();
            }
            CoreMessage::Reply { client, reply } => self.connections.deliver(client, &reply),
            CoreMessage::ClientGone(client) => {
                let removed = self.shard.client_gone(self.now_ms, client) + self.drop_held(client);
                self.deliver_replies();
                let (core, ..) = split_client_id(client);
                self.connections.outgoing[core].push(CoreMessage::GoneAck { client, removed });
            }
            CoreMessage::GoneAck { client, removed } => self.gone_acknowledged(client, removed),
            CoreMessage::Control(_) | CoreMessage::Adopt { .. } => {
                debug_assert!(false, "the shell handles controls and adoptions");
            }
        }
    }

    /// Runs the shard's timers up to now: leases and waits that ran out end.
    /// A held core lets none run out until the hand-off ends.
    pub(crate) fn advance(&mut self) {
        if self.role != CoreRole::Held {
            self.shard.advance(self.now_ms);
            self.deliver_replies();
        }
        self.answer_failed_auth();
        self.close_stalled();
    }

    /// Closes the connections whose unsent replies made no progress for
    /// [`Limits::output_stall_ms`]: their clients stopped reading, and the
    /// replies they hold are memory nobody will take. Checked at most once
    /// a second, and only while replies wait unsent.
    fn close_stalled(&mut self) {
        if self.connections.output_total == 0 || self.now_ms < self.next_stall_check_ms {
            return;
        }
        self.next_stall_check_ms = self.now_ms + STALL_CHECK_MS;
        let stall_ms = self.connections.limits.output_stall_ms;
        for slot in 0..self.connections.sessions.len() as u32 {
            let session = &self.connections.sessions[slot as usize];
            if session.is_open()
                && !session.closing()
                && session.unsent > 0
                && self.now_ms.saturating_sub(session.last_progress_ms) >= stall_ms
            {
                self.connections.counters.output_stall_closes += 1;
                self.failed(slot);
            }
        }
    }

    /// A reload of the auth file: connections whose name is gone are
    /// answered `E - - auth-revoked` and closed once their replies are out;
    /// the others take their name's new scope. Locks are untouched.
    pub(crate) fn set_auth(&mut self, auth: Option<Arc<AuthTable>>) {
        for slot in 0..self.connections.sessions.len() as u32 {
            let session = &mut self.connections.sessions[slot as usize];
            let Some(identity) = &session.identity else { continue };
            if !session.reading() {
                continue;
            }
            match auth.as_ref().and_then(|table| table.lookup(&identity.name)) {
                Some(identity) => session.identity = Some(identity),
                None => {
                    session.identity = None;
                    session.name = ringlock_shards::NameId::NONE;
                    self.connections.counters.auth_revocations += 1;
                    let reply = Reply::Error { op: None, key: None, code: ErrorCode::AuthRevoked };
                    self.connections.write(slot, &reply);
                    self.stop_reading(slot);
                    self.connections.settle(slot);
                }
            }
        }
        self.auth = auth;
    }

    /// The table of failed `U` lines per address the cores share.
    pub(crate) fn set_auth_failures(&mut self, table: Arc<AuthFailures>) {
        self.auth_failures = Some(table);
    }

    /// The client address of the connection at `slot`, for its failed `U` lines.
    pub(crate) fn set_peer_ip(&mut self, slot: u32, ip: Option<std::net::IpAddr>) {
        self.connections.sessions[slot as usize].peer_ip = ip;
    }

    /// Mutual TLS with an auth file: the handshake ended with a client
    /// certificate that gives `names`. The first that names an entry of the
    /// auth file authenticates the connection as that name, as a `U` line
    /// would but with no reply; none leaves it unauthenticated.
    pub(crate) fn authenticate_certificate(&mut self, slot: u32, names: &[String]) {
        let Some(table) = &self.auth else { return };
        if let Some(identity) = names.iter().find_map(|name| table.lookup(name.as_bytes())) {
            // The name's number, which its grants record (as for `U`); with
            // none left (see `node::names`) the connection stays
            // unauthenticated.
            let Some(name) = crate::node::names::intern(&identity.name) else {
                tracing::error!(
                    names = crate::node::names::NAMES_MAX,
                    "a client certificate names an entry this process has no number left for; restart to let it in"
                );
                return;
            };
            let session = &mut self.connections.sessions[slot as usize];
            session.identity = Some(identity);
            session.name = name;
        }
    }

    /// A connection that has not authenticated within `--handshake-ms`:
    /// answered `E - - auth-required` and closed once its replies are out.
    /// False (nothing done) if it has authenticated or reads no more.
    pub(crate) fn close_unauthenticated(&mut self, slot: u32) -> bool {
        let session = &self.connections.sessions[slot as usize];
        if self.auth.is_none() || session.identity.is_some() || !session.reading() {
            return false;
        }
        self.connections.counters.count_error(ErrorCode::AuthRequired);
        let reply = Reply::Error { op: None, key: None, code: ErrorCode::AuthRequired };
        self.connections.write(slot, &reply);
        self.stop_reading(slot);
        self.connections.settle(slot);
        true
    }

    /// Parses on, with this turn's shares, what connections kept when they
    /// used their share of an earlier turn, in the order they did.
    pub(crate) fn serve_deferred(&mut self) {
        let mut deferred = std::mem::take(&mut self.connections.deferred);
        for &slot in &deferred {
            self.connections.sessions[slot as usize].deferred = false;
        }
        for &slot in &deferred {
            self.parse_kept(slot);
        }
        deferred.clear();
        if self.connections.deferred.is_empty() {
            // Keep the list's memory.
            self.connections.deferred = deferred;
        }
    }

    /// Whether some connection has lines waiting for the next turn: the
    /// shell then does not sleep.
    pub(crate) fn has_deferred(&self) -> bool {
        !self.connections.deferred.is_empty()
    }

    /// Parses what a connection kept (unless it is paused or reads no
    /// more), ends its input if the client did, and settles it.
    fn parse_kept(&mut self, slot: u32) {
        let session = &mut self.connections.sessions[slot as usize];
        if !session.is_open() || session.closing() || session.is_paused() {
            return;
        }
        if session.reading() && !session.input.is_empty() {
            let mut input = std::mem::take(&mut session.input);
            let consumed = self.parse(slot, input.as_slice());
            let session = &mut self.connections.sessions[slot as usize];
            if session.reading() {
                input.consume(consumed);
                session.input = input;
            }
        }
        if self.connections.sessions[slot as usize].input_ended() {
            self.finish_input(slot);
        }
        self.connections.settle(slot);
    }

    /// Parses what paused connections kept, now that they are below their
    /// limits again.
    pub(crate) fn resume_paused(&mut self) {
        while let Some(slot) = self.connections.resumable.pop() {
            self.parse_kept(slot);
        }
    }

    // ----- tokens -----

    /// Whether the shard asked for tokens and may have them now (only an
    /// active core issues tokens); the call is taken.
    pub(crate) fn take_token_call(&mut self) -> bool {
        let call = self.need_tokens && self.role == CoreRole::Active;
        if call {
            self.need_tokens = false;
        }
        call
    }

    /// A token range from the authority; waiting acquires may be granted.
    pub(crate) fn add_token_range(&mut self, range: TokenRange) -> Result<(), TokenRangeError> {
        let added = self.shard.add_token_range(self.now_ms, range);
        self.deliver_replies();
        added
    }

    /// The authority could not give tokens: the shard may ask again.
    pub(crate) fn token_request_lost(&mut self) {
        self.shard.token_request_lost();
        self.deliver_replies();
    }

    // ----- the node's role -----

    /// Serves from now on, after restoring the replicated grants. Tokens of
    /// the current epoch replace whatever the shard holds, so the shell
    /// supplies a range before it serves the held requests.
    pub(crate) fn activate(&mut self, restore: Vec<Restored>) {
        for (key, token, lease_ms, name) in restore {
            debug_assert_eq!(ringlock_shards::shard_of(key.as_bytes(), self.cores), self.core);
            if !self.shard.restore_as(self.now_ms, key.as_bytes(), token, lease_ms, name) {
                tracing::warn!(core = self.core, "a replicated grant could not be restored (table full)");
            }
        }
        self.role = CoreRole::Active;
        self.connections.active_address = None;
        self.need_tokens = true;
        self.deliver_replies();
    }

    /// Stops serving: held requests and queued acquires are answered `M`
    /// with `active`, the table is dropped, new requests are redirected.
    pub(crate) fn follow(&mut self, active: Option<String>) {
        self.role = CoreRole::Standby;
        self.connections.active_address = active.map(String::into_bytes);
        for (client, name, request) in std::mem::take(&mut self.parked) {
            self.run_keyed(client, name, requests::Keyed::of(&request));
        }
        self.release_held(None);
        self.shard.step_down(self.now_ms);
        self.deliver_replies();
    }

    /// Holds requests (a hand-off starts).
    pub(crate) fn hold(&mut self) {
        if self.role == CoreRole::Active {
            self.role = CoreRole::Held;
        }
    }

    /// Serves again, starting with the requests held meanwhile, in order.
    pub(crate) fn serve_held(&mut self) {
        if self.role == CoreRole::Held {
            self.role = CoreRole::Active;
        }
        for (client, name, request) in std::mem::take(&mut self.parked) {
            self.run_keyed(client, name, requests::Keyed::of(&request));
        }
        self.deliver_replies();
    }

    /// The deltas the shard made since the last call, in a buffer that was
    /// `empty`; `None` if it made none.
    pub(crate) fn take_deltas(&mut self, empty: impl FnOnce() -> Vec<Delta>) -> Option<Vec<Delta>> {
        self.shard.has_deltas().then(|| self.shard.take_deltas(empty()))
    }

    // ----- stopping -----

    /// The server stops: no more requests are read or connections opened.
    pub(crate) fn stop(&mut self) {
        self.connections.stopping = true;
        for session in &mut self.connections.sessions {
            session.stop_for_shutdown();
        }
    }

    /// Once every core reads no more: answers every request still queued or
    /// held `shutting-down`.
    pub(crate) fn refuse_queued(&mut self) {
        if !self.parked.is_empty() {
            // Stopping after a hand-off that failed or was cut short: the
            // successor may have taken over all the same, so nothing held
            // is served here; every held request is answered
            // `shutting-down` (it had no effect), in order with the rest.
            self.refuse_parked(ErrorCode::ShuttingDown);
        }
        self.release_held(Some(ErrorCode::ShuttingDown));
        if self.shard.stats().waiters > 0 {
            self.shard.fail_waiters(self.now_ms, ErrorCode::ShuttingDown);
            self.deliver_replies();
        }
    }

    /// Answers every held request `E <op> <key> <code>`, behind the earlier
    /// requests of the same connection and key.
    pub(crate) fn refuse_parked(&mut self, code: ErrorCode) {
        for (client, _, request) in std::mem::take(&mut self.parked) {
            let keyed = requests::Keyed::of(&request);
            self.shard.reject(self.now_ms, client, keyed.op(), keyed.key(), code);
        }
        self.deliver_replies();
    }

    // ----- outputs to the shell -----

    /// The connections with output to send, swapped into `into` (emptied
    /// first), so that the list keeps its memory from turn to turn.
    pub(crate) fn take_flush(&mut self, into: &mut Vec<u32>) {
        into.clear();
        std::mem::swap(&mut self.connections.flush, into);
        for &slot in into.iter() {
            self.connections.sessions[slot as usize].listed = false;
        }
    }

    /// The socket effects decided since the last call, in order, swapped
    /// into `into` (emptied first).
    pub(crate) fn take_effects(&mut self, into: &mut Vec<SocketEffect>) {
        into.clear();
        std::mem::swap(&mut self.connections.effects, into);
    }

    /// The messages for each core from this turn, for the shell to send.
    pub(crate) fn outgoing(&mut self) -> &mut [Vec<CoreMessage>] {
        &mut self.connections.outgoing
    }

    /// The next time the dispatcher has something to do: the shard's next
    /// timer, or a failed `U` to answer.
    pub(crate) fn next_deadline_ms(&self) -> Option<u64> {
        let auth = self.auth_failed.front().map(|&(at, ..)| at);
        let stall = (self.connections.output_total > 0).then_some(self.next_stall_check_ms.max(self.now_ms + 1));
        [self.shard.next_deadline_ms(), auth, stall].into_iter().flatten().min()
    }

    // ----- queries -----

    /// Whether `slot` holds the connection of `generation`, not yet closed.
    pub(crate) fn is_live(&self, slot: u32, generation: u32) -> bool {
        self.connections.is_live(slot, generation)
    }

    pub(crate) fn generation(&self, slot: u32) -> u32 {
        self.connections.sessions[slot as usize].generation
    }

    /// Whether the shell should have a receive armed on `slot`.
    pub(crate) fn wants_input(&self, slot: u32) -> bool {
        self.connections.sessions[slot as usize].wants_input()
    }

    /// Whether every open connection's replies are out (or it is closing).
    pub(crate) fn all_flushed(&self) -> bool {
        self.connections.sessions.iter().all(|s| !s.is_open() || s.closing() || s.flushed())
    }

    /// Whether nothing is left in the batches for other cores.
    pub(crate) fn outgoing_empty(&self) -> bool {
        self.connections.outgoing.iter().all(Vec::is_empty)
    }

    /// Connections open and not closing.
    pub(crate) fn open_connections(&self) -> u64 {
        self.connections.open
    }

    pub(crate) fn counters(&self) -> &DispatchCounters {
        &self.connections.counters
    }

    pub(crate) fn shard(&self) -> &Shard {
        &self.shard
    }

    pub(crate) fn shard_mut(&mut self) -> &mut Shard {
        &mut self.shard
    }

    /// The `S` body for `role` at `epoch`: the one built earlier in this
    /// turn if there is one, else a new one. The caller puts it back in
    /// [`Dispatcher::stats`].
    fn stats_json(&mut self, role: Role, epoch: u64) -> StatsJson {
        match self.stats.take() {
            Some(built) if built.turn == self.turn && built.role == role && built.epoch == epoch => built,
            _ => StatsJson { turn: self.turn, role, epoch, json: self.view.stats_json(role, epoch) },
        }
    }

    // ----- connection life -----

    /// End of input: once the lines already received are handled, read no more.
    fn finish_input(&mut self, slot: u32) {
        let session = &self.connections.sessions[slot as usize];
        // A paused connection still has whole lines to handle; the resume
        // after its replies drain comes back here, as does the next turn
        // of one that used its share of this one.
        if session.reading() && !session.is_paused() && !session.deferred {
            self.stop_reading(slot);
        }
    }

    /// The connection reads no more requests: every shard drops its queued
    /// acquires and acknowledges, and the connection closes once the replies
    /// still owed are out.
    fn stop_reading(&mut self, slot: u32) {
        let session = &mut self.connections.sessions[slot as usize];
        if !session.stop_reading() {
            return;
        }
        let client = client_id(self.core, slot, session.generation);
        session.gone_acks = (self.cores - 1) as u32;
        let removed = self.shard.client_gone(self.now_ms, client) + self.drop_held(client);
        let session = &mut self.connections.sessions[slot as usize];
        session.in_flight = session.in_flight.saturating_sub(removed);
        for target in (0..self.cores).filter(|&target| target != self.core) {
            self.connections.outgoing[target].push(CoreMessage::ClientGone(client));
        }
        self.deliver_replies();
    }

    /// A shard dropped `removed` requests of a connection that reads no more.
    fn gone_acknowledged(&mut self, client: ClientId, removed: u32) {
        let (_, slot, generation) = split_client_id(client);
        if !self.is_live(slot, generation) {
            return;
        }
        let session = &mut self.connections.sessions[slot as usize];
        session.in_flight = session.in_flight.saturating_sub(removed);
        session.gone_acks = session.gone_acks.saturating_sub(1);
        self.connections.settle(slot);
    }
}
