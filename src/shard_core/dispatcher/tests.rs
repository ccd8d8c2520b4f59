//! The dispatcher's rules, driven directly: bytes in, replies and effects out.

use ringlock_proto::Role;
use ringlock_shards::{Shard, ShardConfig, TokenRange, shard_of};

use super::session::{IN_FLIGHT_MAX, OUTPUT_BYTES_MAX};
use super::*;

pub(super) struct FakeView;

impl NodeView for FakeView {
    fn status(&self) -> (Role, u64, Option<String>) {
        (Role::Active, 1, Some("127.0.0.1:7700".to_string()))
    }

    fn stats_json(&self, _role: Role, _epoch: u64) -> String {
        "{}".to_string()
    }
}

/// A dispatcher for core `core` of `cores`, with a fresh shard.
pub(super) fn dispatcher(core: usize, cores: usize, role: CoreRole) -> Dispatcher {
    let shard = Shard::new(ShardConfig { hash_seed: 7, ..ShardConfig::default() }, 0);
    let settings = Settings { core, cores, lease_ms_max: 86_400_000, limits: Limits::DEFAULT };
    Dispatcher::new(settings, shard, Box::new(FakeView), role, None)
}

/// Gives the dispatcher the token ranges it calls for, of epoch 1.
pub(super) fn supply_tokens(dispatcher: &mut Dispatcher, next_sequence: &mut u64) {
    while dispatcher.take_token_call() {
        let range = TokenRange { epoch: 1, first: *next_sequence, end: *next_sequence + 1_000_000 };
        *next_sequence += 1_000_000;
        dispatcher.add_token_range(range).expect("a fresh range is taken");
    }
}

/// A single-core dispatcher with tokens, as the shell runs it.
struct Core {
    dispatcher: Dispatcher,
    sequence: u64,
    effects: Vec<SocketEffect>,
}

impl Core {
    fn new() -> Core {
        Core { dispatcher: dispatcher(0, 1, CoreRole::Active), sequence: 1, effects: Vec::new() }
    }

    fn open(&mut self) -> u32 {
        self.dispatcher.open().expect("a slot").0
    }

    /// Bytes received, then turns of the core (at the same time) until no
    /// connection has lines left for a next turn, as the shell runs them.
    fn feed(&mut self, slot: u32, bytes: &[u8]) {
        self.dispatcher.received(slot, bytes);
        supply_tokens(&mut self.dispatcher, &mut self.sequence);
        self.run_turns();
    }

    fn run_turns(&mut self) {
        while self.dispatcher.has_deferred() {
            self.dispatcher.set_now(self.dispatcher.now_ms);
            self.dispatcher.serve_deferred();
            supply_tokens(&mut self.dispatcher, &mut self.sequence);
        }
    }

    /// What the shell would send now on `slot`, as if it all went out.
    fn sent_output(&mut self, slot: u32) -> String {
        let mut flush = Vec::new();
        self.dispatcher.take_flush(&mut flush);
        let mut sending = Vec::new();
        let mut text = String::new();
        if flush.contains(&slot) && self.dispatcher.take_output(slot, &mut sending) {
            text = String::from_utf8(sending.clone()).unwrap();
            self.dispatcher.sent(slot, sending.len());
        }
        // The other listed connections stay listed for a later call.
        for other in flush.into_iter().filter(|&other| other != slot) {
            self.dispatcher.connections.list(other);
        }
        text
    }

    fn effects(&mut self) -> Vec<SocketEffect> {
        self.dispatcher.take_effects(&mut self.effects);
        std::mem::take(&mut self.effects)
    }
}

fn token_of(reply: &str) -> u64 {
    reply.trim_end().rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn pipelined_lines_split_anywhere_are_answered_in_order() {
    let mut core = Core::new();
    let slot = core.open();
    let lines = b"A a 30 0\nA b 30 0\nP\nZ\n";
    for chunk in lines.chunks(3) {
        core.feed(slot, chunk);
    }
    let output = core.sent_output(slot);
    let replies: Vec<&str> = output.lines().collect();
    assert_eq!(replies.len(), 4, "{output}");
    assert!(replies[0].starts_with("A a ") && replies[1].starts_with("A b "));
    assert_eq!(replies[2], "P active 1 127.0.0.1:7700");
    assert_eq!(replies[3], "E - - bad-op");
}

#[test]
fn a_keyed_error_waits_behind_a_queued_acquire_of_the_same_key() {
    let mut core = Core::new();
    let holder = core.open();
    let waiter = core.open();
    core.feed(holder, b"A k 30 0\n");
    let token = token_of(&core.sent_output(holder));
    core.feed(waiter, b"A k 30 0\nA k 0 1\nA other 30 0\n");
    let early = core.sent_output(waiter);
    assert!(early.starts_with("A other "), "only the other key is answered while k is queued: {early:?}");
    core.feed(holder, format!("R k {token}\n").as_bytes());
    assert_eq!(core.sent_output(holder), "R k\n");
    let later = core.sent_output(waiter);
    let replies: Vec<&str> = later.lines().collect();
    assert!(replies[0].starts_with("A k ") && token_of(replies[0]) > token, "{later:?}");
    assert_eq!(replies[1], "E A k bad-lease", "the error keeps its place behind the grant");
}

#[test]
fn a_connection_that_stops_reading_its_replies_is_paused_then_resumed() {
    let mut core = Core::new();
    let slot = core.open();
    assert!(core.effects().is_empty(), "a new connection is received by the shell already");
    // Pings whose replies nobody sends: the output limit pauses the connection.
    let pings = b"P\n".repeat(OUTPUT_BYTES_MAX / 20 + 1000);
    core.feed(slot, &pings);
    // (Fed at once, more than a connection may hold unparsed: its receive
    // stops for that first, then for the output.)
    assert_eq!(core.effects().last(), Some(&SocketEffect::StopReceiving(slot)));
    assert!(!core.dispatcher.wants_input(slot));
    let kept = core.dispatcher.connections.sessions[slot as usize].input.len();
    assert!(kept > 0, "the lines after the limit are kept unparsed");
    // The replies go out: the kept lines are parsed and reading starts again.
    let mut answered = core.sent_output(slot).lines().count();
    core.run_turns();
    assert_eq!(core.effects(), [SocketEffect::Receive(slot)]);
    answered += core.sent_output(slot).lines().count();
    assert_eq!(answered, pings.len() / 2, "every ping is answered once");
    assert!(core.dispatcher.wants_input(slot));
}

#[test]
fn a_connection_at_the_in_flight_limit_is_paused_until_answers_bring_it_below() {
    let mut core = Core::new();
    let holder = core.open();
    let slot = core.open();
    core.feed(holder, b"A k 30 0\n");
    let token = token_of(&core.sent_output(holder));
    // Keyed errors behind a queued acquire stay in flight until it is answered.
    let mut lines = b"A k 30 0\n".to_vec();
    lines.extend(b"A k 0 0\n".repeat(IN_FLIGHT_MAX as usize + 10));
    core.feed(slot, &lines);
    // (Fed at once, more than a connection may hold unparsed: its receive
    // stops for that first, then for the requests in flight.)
    assert_eq!(core.effects().last(), Some(&SocketEffect::StopReceiving(slot)));
    assert_eq!(core.dispatcher.connections.sessions[slot as usize].in_flight, IN_FLIGHT_MAX);
    assert!(core.dispatcher.counters().in_flight_pauses > 0);
    assert!(core.sent_output(slot).is_empty(), "nothing can be answered before the queued acquire");
    core.feed(holder, format!("R k {token}\n").as_bytes());
    core.dispatcher.resume_paused();
    core.run_turns();
    let output = core.sent_output(slot);
    assert!(output.starts_with("A k "), "{}", &output[..40]);
    let errors = output.lines().filter(|line| *line == "E A k bad-lease").count();
    assert_eq!(errors + 1, output.lines().count());
    assert_eq!(core.effects(), [SocketEffect::Receive(slot)], "below the limit again, it is received again");
    assert!(errors >= IN_FLIGHT_MAX as usize - 1);
}

#[test]
fn a_line_too_long_is_answered_then_the_connection_reads_no_more_and_closes() {
    let mut core = Core::new();
    let slot = core.open();
    let mut line = vec![b'A'; 2000];
    line.extend_from_slice(b"\nP\n");
    core.feed(slot, &line);
    assert!(core.effects().is_empty(), "not closed before the reply is out");
    core.feed(slot, b"P\n");
    assert_eq!(core.sent_output(slot), "E - - line-too-long\n", "nothing after it is read");
    assert_eq!(core.effects(), [SocketEffect::Close(slot)]);
    assert_eq!(core.dispatcher.open_connections(), 0);
    core.dispatcher.closed(slot);
    assert!(!core.dispatcher.is_live(slot, 0));
}

#[test]
fn end_of_input_answers_what_came_before_and_drops_the_queued_acquires() {
    let mut core = Core::new();
    let holder = core.open();
    let slot = core.open();
    core.feed(holder, b"A k 30 0\n");
    core.sent_output(holder);
    core.feed(slot, b"A k 30 0\nP\n");
    core.dispatcher.input_ended(slot);
    assert!(core.effects().is_empty(), "the ping's reply is still owed");
    assert_eq!(core.sent_output(slot), "P active 1 127.0.0.1:7700\n");
    assert_eq!(core.effects(), [SocketEffect::Close(slot)]);
    assert_eq!(core.dispatcher.shard().queue_len(b"k"), 0, "the queued acquire left with its connection");
}

#[test]
fn a_failed_socket_closes_at_once_and_late_replies_to_it_are_dropped() {
    let mut core = Core::new();
    let holder = core.open();
    let slot = core.open();
    core.feed(holder, b"A k 0.05 0\n");
    core.sent_output(holder);
    core.feed(slot, b"A k 30 0\n");
    let generation = core.dispatcher.generation(slot);
    core.dispatcher.failed(slot);
    assert_eq!(core.effects(), [SocketEffect::Close(slot)]);
    core.dispatcher.closed(slot);
    let (reused, new_generation) = core.dispatcher.open().unwrap();
    assert_eq!(reused, slot);
    assert_ne!(new_generation, generation);
    core.dispatcher.set_now(100);
    core.dispatcher.advance();
    assert!(core.sent_output(slot).is_empty(), "the old connection's grant does not reach the new one");
    assert_eq!(core.dispatcher.shard().holder_token(b"k"), None, "the dropped waiter was not granted");
}

#[test]
fn requests_for_another_core_go_there_and_its_replies_come_back() {
    let mut cores: Vec<Dispatcher> = (0..2).map(|core| dispatcher(core, 2, CoreRole::Active)).collect();
    let mut sequence = 1;
    let key = (0..).map(|i| format!("key{i}")).find(|key| shard_of(key.as_bytes(), 2) == 1).unwrap();
    let (slot, _) = cores[0].open().unwrap();
    cores[0].received(slot, format!("A {key} 30 0\n").as_bytes());
    let batch = std::mem::take(&mut cores[0].outgoing()[1]);
    assert!(matches!(batch.as_slice(), [CoreMessage::Request { .. }]));
    for message in batch {
        cores[1].handle_message(message);
    }
    supply_tokens(&mut cores[1], &mut sequence);
    let replies = std::mem::take(&mut cores[1].outgoing()[0]);
    for message in replies {
        cores[0].handle_message(message);
    }
    let mut sending = Vec::new();
    assert!(cores[0].take_output(slot, &mut sending));
    assert!(String::from_utf8(sending).unwrap().starts_with(&format!("A {key} ")));
    // End of input: the other core is told, and the connection closes only
    // once it has acknowledged.
    let unsent = cores[0].connections.sessions[slot as usize].unsent;
    cores[0].sent(slot, unsent);
    cores[0].input_ended(slot);
    let mut effects = Vec::new();
    cores[0].take_effects(&mut effects);
    assert!(effects.is_empty(), "the other core has not acknowledged");
    let gone = std::mem::take(&mut cores[0].outgoing()[1]);
    assert!(matches!(gone.as_slice(), [CoreMessage::ClientGone(_)]));
    for message in gone {
        cores[1].handle_message(message);
    }
    for message in std::mem::take(&mut cores[1].outgoing()[0]) {
        cores[0].handle_message(message);
    }
    cores[0].take_effects(&mut effects);
    assert_eq!(effects, [SocketEffect::Close(slot)]);
}

#[test]
fn a_standby_checks_then_redirects_and_a_held_core_parks_in_order() {
    let mut core = Core { dispatcher: dispatcher(0, 1, CoreRole::Standby), sequence: 1, effects: Vec::new() };
    core.dispatcher.follow(Some("10.0.0.2:7700".to_string()));
    let slot = core.open();
    core.feed(slot, b"A k 30 0\nA k 0 0\nR k x\n");
    assert_eq!(core.sent_output(slot), "M A k 10.0.0.2:7700\nE A k bad-lease\nE R k bad-token\n");
    core.dispatcher.activate(Vec::new());
    supply_tokens(&mut core.dispatcher, &mut core.sequence);
    core.dispatcher.serve_held();
    core.dispatcher.hold();
    core.feed(slot, b"A k 30 0\nA j 30 0\n");
    assert!(core.sent_output(slot).is_empty(), "a held core answers nothing");
    core.dispatcher.serve_held();
    let output = core.sent_output(slot);
    let replies: Vec<&str> = output.lines().collect();
    assert!(replies[0].starts_with("A k ") && replies[1].starts_with("A j "), "{output}");
}

/// A view whose `S` body counts how often it was built.
struct CountingView(std::sync::Arc<std::sync::atomic::AtomicU64>);

impl NodeView for CountingView {
    fn status(&self) -> (Role, u64, Option<String>) {
        FakeView.status()
    }

    fn stats_json(&self, _role: Role, _epoch: u64) -> String {
        let built = self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        format!("{{\"built\":{built}}}")
    }
}

#[test]
fn stats_replies_of_one_turn_share_one_body_and_the_next_turn_builds_anew() {
    let built = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let shard = Shard::new(ShardConfig { hash_seed: 7, ..ShardConfig::default() }, 0);
    let settings = Settings { core: 0, cores: 1, lease_ms_max: 86_400_000, limits: Limits::DEFAULT };
    let view = Box::new(CountingView(built.clone()));
    let mut core = Core {
        dispatcher: Dispatcher::new(settings, shard, view, CoreRole::Active, None),
        sequence: 1,
        effects: Vec::new(),
    };
    let (first, second) = (core.open(), core.open());
    core.dispatcher.set_now(5);
    core.feed(first, b"S\nS\n");
    core.feed(second, b"S\n");
    assert_eq!(core.sent_output(first), "S {\"built\":1}\nS {\"built\":1}\n");
    assert_eq!(core.sent_output(second), "S {\"built\":1}\n");
    core.dispatcher.set_now(5);
    core.feed(second, b"S\n");
    assert_eq!(core.sent_output(second), "S {\"built\":2}\n", "a new turn, even in the same millisecond");
}

#[test]
fn a_connection_gets_a_share_of_requests_per_turn_and_the_rest_waits_for_the_next_turns() {
    let mut core = Core::new();
    let (busy, other) = (core.open(), core.open());
    let share = Limits::DEFAULT.requests_per_turn as usize;
    core.dispatcher.set_now(1);
    // Fed straight to the dispatcher, as one turn of the shell would.
    core.dispatcher.received(busy, &b"P\n".repeat(2 * share + 44));
    core.dispatcher.received(other, b"P\n");
    assert_eq!(core.sent_output(busy).lines().count(), share, "one share in the first turn");
    assert_eq!(core.sent_output(other).lines().count(), 1, "the other connection is served in the same turn");
    assert!(core.dispatcher.has_deferred(), "the shell must not sleep");
    core.dispatcher.set_now(1);
    core.dispatcher.serve_deferred();
    assert_eq!(core.sent_output(busy).lines().count(), share);
    core.dispatcher.set_now(2);
    core.dispatcher.serve_deferred();
    assert_eq!(core.sent_output(busy).lines().count(), 44);
    assert!(!core.dispatcher.has_deferred());

    // A client that sends its lines and closes its side gets every answer
    // before the connection closes, however many turns they take.
    core.dispatcher.received(busy, &b"P\n".repeat(3 * share));
    core.dispatcher.input_ended(busy);
    assert!(!core.effects().contains(&SocketEffect::Close(busy)), "not closed with lines left");
    let mut answered = core.sent_output(busy).lines().count();
    while core.dispatcher.has_deferred() {
        core.dispatcher.set_now(3);
        core.dispatcher.serve_deferred();
        answered += core.sent_output(busy).lines().count();
    }
    assert_eq!(answered, 3 * share);
    assert_eq!(core.effects(), [SocketEffect::Close(busy)]);
}

#[test]
fn turns_whose_requests_cost_more_give_each_connection_a_smaller_share_until_they_cost_less() {
    let mut core = Core::new();
    let busy = core.open();
    let full = Limits::DEFAULT.requests_per_turn as usize;
    let parse_turn = |core: &mut Core, elapsed_ns_per_request: u64| {
        core.dispatcher.set_now(1);
        core.dispatcher.serve_deferred();
        let parsed = core.dispatcher.turn_parsed();
        core.dispatcher.turn_ended(u64::from(parsed) * elapsed_ns_per_request);
        core.sent_output(busy).lines().count()
    };
    core.dispatcher.set_now(1);
    core.dispatcher.received(busy, &b"P\n".repeat(100 * full));
    assert_eq!(core.sent_output(busy).lines().count(), full, "no turn measured yet: the whole share");
    core.dispatcher.turn_ended(full as u64 * 100);
    assert_eq!(parse_turn(&mut core, 100), full, "requests of 100 ns keep it");
    // Requests of 2 µs each: the share falls to what fits in the
    // connection's part of a turn, as the average follows them.
    let mut shares = Vec::new();
    for _ in 0..40 {
        shares.push(parse_turn(&mut core, 2_000));
    }
    assert!(shares.windows(2).all(|pair| pair[1] <= pair[0]), "{shares:?}");
    assert_eq!(*shares.last().unwrap() as u64, (pacing::CONNECTION_TURN_NS / 2_000).max(pacing::SHARE_MIN as u64));
    assert_eq!(core.dispatcher.pacing().0 as usize, *shares.last().unwrap());
    // They get cheap again: the whole share is back.
    for _ in 0..60 {
        parse_turn(&mut core, 100);
    }
    assert_eq!(parse_turn(&mut core, 100), full);
}

// ----- `--min-standbys`: replies held until standbys have the change -----

impl Core {
    fn semi_sync() -> Core {
        let mut core = Core::new();
        core.dispatcher.hold_grants_until_acknowledged();
        core
    }

    /// The end of the turn: the shard's deltas leave in the next report.
    fn report(&mut self) -> u64 {
        self.dispatcher.deltas_reported();
        self.dispatcher.semi_sync.as_deref().map(|sync| sync.reported).unwrap()
    }
}

#[test]
fn semi_sync_a_grant_is_answered_once_its_report_is_acknowledged() {
    let mut core = Core::semi_sync();
    let slot = core.open();
    core.feed(slot, b"A k 30 0\n");
    assert_eq!(core.sent_output(slot), "", "the grant waits for a standby");
    assert_eq!(core.dispatcher.held_replies(), 1);
    let report = core.report();
    core.dispatcher.acknowledged(report - 1);
    assert_eq!(core.sent_output(slot), "", "an earlier report does not carry it");
    core.dispatcher.acknowledged(report);
    let reply = core.sent_output(slot);
    assert!(reply.starts_with("A k "), "{reply}");
    assert_eq!(core.dispatcher.held_replies(), 0);
}

#[test]
fn semi_sync_a_held_grant_holds_its_connections_later_replies_only() {
    let mut core = Core::semi_sync();
    let (holder, other) = (core.open(), core.open());
    core.feed(holder, b"A a 30 0\n");
    let acknowledged = core.report();
    core.dispatcher.acknowledged(acknowledged);
    let token = token_of(&core.sent_output(holder));
    core.feed(holder, format!("A b 30 0\nR a {token}\n").as_bytes());
    core.feed(other, b"I z\n");
    assert_eq!(core.sent_output(holder), "", "the release waits behind the held grant");
    assert_eq!(core.sent_output(other), "I z - 0 0\n", "another connection is not held");
    let report = core.report();
    core.dispatcher.acknowledged(report);
    let replies = core.sent_output(holder);
    let lines: Vec<&str> = replies.lines().collect();
    assert_eq!(lines.len(), 2, "{replies}");
    assert!(lines[0].starts_with("A b "), "{replies}");
    assert_eq!(lines[1], "R a");
}

#[test]
fn semi_sync_without_standbys_acquires_and_extends_are_refused_and_holders_release() {
    let mut core = Core::semi_sync();
    let (holder, waiter) = (core.open(), core.open());
    core.feed(holder, b"A k 30 0\n");
    let report = core.report();
    core.dispatcher.acknowledged(report);
    let token = token_of(&core.sent_output(holder));
    core.feed(waiter, b"A k 30 10\n");
    assert_eq!(core.sent_output(waiter), "", "queued behind the holder");
    core.feed(holder, b"A held 30 0\n");
    assert_eq!(core.sent_output(holder), "", "a grant waits for a standby");
    core.dispatcher.set_granting(false);
    assert_eq!(core.sent_output(waiter), "E A k no-standby\n", "a queued acquire is answered");
    assert_eq!(core.sent_output(holder), "E A held no-standby\n", "a held grant is answered");
    core.feed(waiter, b"A other 30 0\n");
    assert_eq!(core.sent_output(waiter), "E A other no-standby\n");
    core.feed(holder, format!("X k {token} 30\nR k {token}\n").as_bytes());
    assert_eq!(core.sent_output(holder), "E X k no-standby\nR k\n");
    core.dispatcher.set_granting(true);
    core.feed(waiter, b"A k 30 0\n");
    let report = core.report();
    core.dispatcher.acknowledged(report);
    assert!(core.sent_output(waiter).starts_with("A k "));
}

#[test]
fn semi_sync_a_node_that_steps_down_redirects_the_grants_it_held() {
    let mut core = Core::semi_sync();
    let slot = core.open();
    core.feed(slot, b"A k 30 0\n");
    core.feed(slot, b"I k\n");
    assert_eq!(core.sent_output(slot), "", "the inspection waits behind the held grant");
    core.dispatcher.follow(Some("10.0.0.2:7700".to_string()));
    let output = core.sent_output(slot);
    let lines: Vec<&str> = output.lines().collect();
    assert_eq!(lines[0], "M A k 10.0.0.2:7700", "{output}");
    assert!(lines[1].starts_with("I k "), "the inspection behind it follows: {output}");
}

#[test]
fn semi_sync_a_connection_that_ends_drops_its_held_replies_and_closes() {
    let mut core = Core::semi_sync();
    let slot = core.open();
    core.feed(slot, b"A k 30 0\n");
    core.effects();
    core.dispatcher.input_ended(slot);
    assert!(core.effects().contains(&SocketEffect::Close(slot)), "nothing is owed once the held reply is dropped");
    assert_eq!(core.dispatcher.held_replies(), 0);
}
