//! Seeded model test: random pipelined requests over several connections on
//! two cores, cut into random chunks, with random sends (whole or partial),
//! random delivery of the batches between cores, time steps, ends of input
//! and failed sockets; small limits, so that pausing happens all the time.
//!
//! After every step it checks the caps (requests in flight, output held);
//! on every reply line, that it is the next one its connection awaits for
//! that (op, key) and of the expected kind; at the end, that every request
//! of a connection still open was answered exactly once and that every
//! connection that ended was closed. A failure prints its seed.

use std::collections::{HashMap, VecDeque};

use super::session::Limits;
use super::tests::{dispatcher, supply_tokens};
use super::*;
use crate::cluster::sim_rng::SimRng;

const SEEDS: u64 = 300;
const STEPS: usize = 600;
const CORES: usize = 2;
const CLIENTS: usize = 5;
const KEYS: [&str; 4] = ["a", "b", "c", "d"];
const LIMITS: Limits = Limits { in_flight_max: 6, output_bytes_max: 200, requests_per_turn: 3, ..Limits::DEFAULT };
/// The longest reply line in this test (a grant: op, key, a 20-digit token).
const REPLY_LINE_MAX: usize = 32;

/// What a request's reply must be.
#[derive(Clone, Debug, PartialEq)]
enum Expect {
    /// `A key token` or `T key` (a valid acquire).
    GrantOrTimeout,
    /// `R key`, or `E R key not-holder` if its lease ran out first.
    Released,
    /// `I key …`.
    Inspected,
    /// `P …`.
    Pong,
    /// This exact line.
    Line(String),
}

struct Client {
    core: usize,
    slot: u32,
    /// Bytes written and not yet taken by the server's socket.
    pending: Vec<u8>,
    /// Bytes of a reply line not whole yet.
    partial: Vec<u8>,
    /// The replies awaited, by (op, key), in request order.
    awaited: HashMap<(u8, String), VecDeque<Expect>>,
    /// Grants seen and not released yet: (key, token).
    held: Vec<(String, u64)>,
    receiving: bool,
    /// The send the shell has in flight for it: bytes, and how many went out.
    sending: Vec<u8>,
    sent: usize,
    ended: bool,
    failed: bool,
    closed: bool,
}

struct Model {
    rng: SimRng,
    seed: u64,
    now_ms: u64,
    cores: Vec<Dispatcher>,
    sequence: u64,
    clients: Vec<Client>,
    /// Batches on their way from one core to another, in order.
    wires: HashMap<(usize, usize), VecDeque<Vec<CoreMessage>>>,
    /// Reply lines checked, and times a connection was paused.
    replies: u64,
    pauses: u64,
}

impl Model {
    fn new(seed: u64) -> Model {
        let mut cores: Vec<Dispatcher> = (0..CORES)
            .map(|core| {
                let mut dispatcher = dispatcher(core, CORES, CoreRole::Active);
                dispatcher.connections.limits = LIMITS;
                dispatcher
            })
            .collect();
        let mut sequence = 1;
        for core in &mut cores {
            supply_tokens(core, &mut sequence);
        }
        let clients = (0..CLIENTS)
            .map(|index| {
                let core = index % CORES;
                let (slot, _) = cores[core].open().expect("a slot");
                Client {
                    core,
                    slot,
                    pending: Vec::new(),
                    partial: Vec::new(),
                    awaited: HashMap::new(),
                    held: Vec::new(),
                    receiving: true,
                    sending: Vec::new(),
                    sent: 0,
                    ended: false,
                    failed: false,
                    closed: false,
                }
            })
            .collect();
        Model {
            rng: SimRng::new(seed),
            seed,
            now_ms: 0,
            cores,
            sequence,
            clients,
            wires: HashMap::new(),
            replies: 0,
            pauses: 0,
        }
    }

    fn fail(&self, what: String) -> ! {
        panic!("seed {}: {what}", self.seed)
    }

    /// A random request from client `index`: its line and what it awaits.
    fn write_request(&mut self, index: usize) {
        let key = KEYS[self.rng.below(KEYS.len() as u64) as usize].to_string();
        let (line, op, expect) = match self.rng.below(10) {
            0..=3 => {
                let lease_ms = 1 + self.rng.below(120);
                let wait_ms = self.rng.below(4) * 30;
                let line = format!("A {key} 0.{lease_ms:03} 0.{wait_ms:03}\n");
                (line, b'A', Expect::GrantOrTimeout)
            }
            4 => (format!("A {key} 0 1\n"), b'A', Expect::Line(format!("E A {key} bad-lease"))),
            5 => (format!("R {key} x\n"), b'R', Expect::Line(format!("E R {key} bad-token"))),
            6 => match self.clients[index].held.pop() {
                Some((key, token)) => (format!("R {key} {token}\n"), b'R', Expect::Released),
                None => (format!("X {key} 1 1\n"), b'X', Expect::Line(format!("E X {key} not-holder"))),
            },
            7 => (format!("I {key}\n"), b'I', Expect::Inspected),
            8 => ("P\n".to_string(), b'P', Expect::Pong),
            _ => ("Q\n".to_string(), b'-', Expect::Line("E - - bad-op".to_string())),
        };
        let key = match op {
            b'P' | b'-' => "-".to_string(),
            _ => line.trim_end().split(' ').nth(1).unwrap().to_string(),
        };
        let client = &mut self.clients[index];
        client.pending.extend_from_slice(line.as_bytes());
        client.awaited.entry((op, key)).or_default().push_back(expect);
    }

    /// The server's socket takes some of what client `index` wrote.
    fn deliver_to_server(&mut self, index: usize) {
        let client = &self.clients[index];
        if !client.receiving || client.pending.is_empty() || client.closed || client.failed {
            return;
        }
        let take = 1 + self.rng.below(client.pending.len() as u64) as usize;
        let (core, slot) = (client.core, client.slot);
        let bytes: Vec<u8> = self.clients[index].pending.drain(..take).collect();
        self.cores[core].received(slot, &bytes);
    }

    /// The shell starts the sends the cores listed.
    fn flush(&mut self, core: usize) {
        let mut flush = Vec::new();
        self.cores[core].take_flush(&mut flush);
        for slot in flush {
            let Some(index) = self.clients.iter().position(|c| c.core == core && c.slot == slot && !c.closed) else {
                continue;
            };
            if !self.clients[index].sending.is_empty() {
                // A send in flight: the next follows once it completes.
                continue;
            }
            let mut sending = Vec::new();
            if self.cores[core].take_output(slot, &mut sending) {
                self.clients[index].sending = sending;
                self.clients[index].sent = 0;
            }
        }
    }

    /// Part or all of client `index`'s send in flight completes.
    fn complete_send(&mut self, index: usize) {
        let client = &self.clients[index];
        if client.sending.is_empty() || client.closed {
            return;
        }
        let left = client.sending.len() - client.sent;
        let bytes = 1 + self.rng.below(left as u64) as usize;
        let (core, slot) = (client.core, client.slot);
        let chunk = self.clients[index].sending[client.sent..client.sent + bytes].to_vec();
        self.clients[index].sent += bytes;
        if self.clients[index].sent == self.clients[index].sending.len() {
            self.clients[index].sending.clear();
            self.clients[index].sent = 0;
        }
        self.cores[core].sent(slot, bytes);
        if !self.clients[index].failed {
            self.read_replies(index, &chunk);
        }
        if self.clients[index].sending.is_empty() {
            // The shell starts the next send at once when there is output.
            self.flush(core);
        }
    }

    fn read_replies(&mut self, index: usize, bytes: &[u8]) {
        self.clients[index].partial.extend_from_slice(bytes);
        while let Some(end) = self.clients[index].partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.clients[index].partial.drain(..=end).collect();
            let line = String::from_utf8(line).unwrap().trim_end().to_string();
            self.check_reply(index, &line);
        }
    }

    fn check_reply(&mut self, index: usize, line: &str) {
        self.replies += 1;
        let fields: Vec<&str> = line.split(' ').collect();
        let (op, key) = match fields[0] {
            "A" | "T" => (b'A', fields[1]),
            "E" if fields[1] == "-" => (b'-', "-"),
            "E" => (fields[1].as_bytes()[0], fields[2]),
            "P" => (b'P', "-"),
            other => (other.as_bytes()[0], fields[1]),
        };
        let ended = self.clients[index].ended;
        let Some(queue) = self.clients[index].awaited.get_mut(&(op, key.to_string())) else {
            self.fail(format!("client {index}: reply {line:?} to nothing awaited"));
        };
        loop {
            let Some(expect) = queue.pop_front() else {
                self.fail(format!("client {index}: reply {line:?} to nothing awaited"));
            };
            let matches = match &expect {
                Expect::GrantOrTimeout => fields[0] == "A" || fields[0] == "T",
                Expect::Released => line == format!("R {key}") || line == format!("E R {key} not-holder"),
                Expect::Inspected => fields[0] == "I",
                Expect::Pong => fields[0] == "P",
                Expect::Line(expected) => line == expected,
            };
            if matches {
                break;
            }
            // A connection that ended has its queued acquires dropped
            // unanswered; nothing else may be skipped.
            if !(ended && expect == Expect::GrantOrTimeout) {
                self.fail(format!("client {index}: reply {line:?} where {expect:?} was next for its (op, key)"));
            }
        }
        if fields[0] == "A" {
            // Clients read at their own pace, so grants are seen out of the
            // order they were made: token order is the shard model's to check.
            let token: u64 = fields[2].parse().unwrap();
            self.clients[index].held.push((key.to_string(), token));
        }
    }

    fn apply_effects(&mut self, core: usize) {
        let mut effects = Vec::new();
        self.cores[core].take_effects(&mut effects);
        for effect in effects {
            let slot = match effect {
                SocketEffect::StopReceiving(slot) | SocketEffect::Receive(slot) | SocketEffect::Close(slot) => slot,
            };
            let Some(index) = self.clients.iter().position(|c| c.core == core && c.slot == slot && !c.closed) else {
                self.fail(format!("effect {effect:?} for no connection"));
            };
            match effect {
                SocketEffect::StopReceiving(_) => {
                    self.pauses += 1;
                    self.clients[index].receiving = false;
                }
                SocketEffect::Receive(_) => self.clients[index].receiving = true,
                SocketEffect::Close(_) => {
                    let client = &self.clients[index];
                    if !client.ended && !client.failed {
                        self.fail(format!("client {index} closed while it still reads"));
                    }
                    if !client.failed && (!client.sending.is_empty() || !client.pending.is_empty() && !client.ended) {
                        self.fail(format!("client {index} closed with replies unsent"));
                    }
                    self.clients[index].closed = true;
                    self.clients[index].sending.clear();
                    self.cores[core].closed(slot);
                }
            }
        }
    }

    fn move_batches(&mut self, from: usize) {
        for to in 0..CORES {
            let batch = std::mem::take(&mut self.cores[from].outgoing()[to]);
            if !batch.is_empty() {
                self.wires.entry((from, to)).or_default().push_back(batch);
            }
        }
    }

    fn deliver_batch(&mut self, from: usize, to: usize) {
        if let Some(batch) = self.wires.get_mut(&(from, to)).and_then(VecDeque::pop_front) {
            for message in batch {
                self.cores[to].handle_message(message);
            }
            supply_tokens(&mut self.cores[to], &mut self.sequence);
        }
    }

    fn check_caps(&self) {
        for core in &self.cores {
            for (slot, session) in core.connections.sessions.iter().enumerate() {
                if session.in_flight > LIMITS.in_flight_max {
                    self.fail(format!("slot {slot}: {} requests in flight", session.in_flight));
                }
                let held = session.output.len() + session.unsent;
                let bound = LIMITS.output_bytes_max + (LIMITS.in_flight_max as usize + 2) * REPLY_LINE_MAX;
                if held > bound {
                    self.fail(format!("slot {slot}: {held} bytes of output held"));
                }
            }
        }
    }

    fn step(&mut self) {
        let index = self.rng.below(CLIENTS as u64) as usize;
        let core = self.rng.below(CORES as u64) as usize;
        match self.rng.below(100) {
            0..=29 => {
                if !self.clients[index].ended && !self.clients[index].failed {
                    for _ in 0..1 + self.rng.below(4) {
                        self.write_request(index);
                    }
                }
            }
            30..=49 => self.deliver_to_server(index),
            50..=64 => self.complete_send(index),
            65..=71 => self.flush(core),
            72..=81 => self.move_batches(core),
            82..=89 => self.deliver_batch(core, (core + 1) % CORES),
            90..=96 => {
                self.now_ms += self.rng.below(40);
                for core in &mut self.cores {
                    core.set_now(self.now_ms);
                    core.advance();
                }
            }
            97..=98 => {
                // End of input, once what the client wrote is all taken.
                let client = &self.clients[index];
                let (core, slot) = (client.core, client.slot);
                if !client.ended && !client.failed && client.pending.is_empty() && client.receiving {
                    self.clients[index].ended = true;
                    self.cores[core].input_ended(slot);
                }
            }
            _ => {
                let client = &self.clients[index];
                let (core, slot, live) = (client.core, client.slot, !client.failed && !client.closed);
                if live && self.rng.below(4) == 0 {
                    self.clients[index].failed = true;
                    self.cores[core].failed(slot);
                }
            }
        }
        for core in 0..CORES {
            supply_tokens(&mut self.cores[core], &mut self.sequence);
            self.cores[core].resume_paused();
            self.cores[core].serve_deferred();
            self.apply_effects(core);
        }
        self.check_caps();
    }

    /// Lets time pass and every byte and batch move until nothing is left.
    fn settle(&mut self) {
        for round in 0..10_000 {
            let mut moved = false;
            for index in 0..CLIENTS {
                while self.clients[index].receiving
                    && !self.clients[index].pending.is_empty()
                    && !self.clients[index].closed
                {
                    self.deliver_to_server(index);
                    moved = true;
                    for core in 0..CORES {
                        self.apply_effects(core);
                    }
                }
            }
            for core in 0..CORES {
                self.flush(core);
                self.move_batches(core);
            }
            for from in 0..CORES {
                for to in 0..CORES {
                    while self.wires.get(&(from, to)).is_some_and(|wire| !wire.is_empty()) {
                        self.deliver_batch(from, to);
                        moved = true;
                    }
                }
            }
            for index in 0..CLIENTS {
                while !self.clients[index].sending.is_empty() && !self.clients[index].closed {
                    self.complete_send(index);
                    moved = true;
                }
            }
            self.now_ms += 50;
            for core in 0..CORES {
                self.cores[core].set_now(self.now_ms);
                self.cores[core].advance();
                supply_tokens(&mut self.cores[core], &mut self.sequence);
                self.cores[core].resume_paused();
                self.cores[core].serve_deferred();
                self.apply_effects(core);
            }
            self.check_caps();
            let awaited = self.clients.iter().any(|c| !c.failed && c.awaited.values().any(|q| !q.is_empty()));
            if !moved && !awaited && round > 10 {
                break;
            }
        }
        for (index, client) in self.clients.iter().enumerate() {
            if client.failed || client.ended {
                if !client.closed {
                    self.fail(format!("client {index} ended and was never closed"));
                }
                continue;
            }
            for ((op, key), queue) in &client.awaited {
                if !queue.is_empty() {
                    self.fail(format!("client {index}: {queue:?} never answered for ({}, {key})", *op as char));
                }
            }
        }
    }
}

#[test]
fn random_pipelined_requests_over_cores_keep_order_caps_and_answers() {
    let (mut replies, mut pauses) = (0, 0);
    for seed in 0..SEEDS {
        let mut model = Model::new(seed);
        for _ in 0..STEPS {
            model.step();
        }
        model.settle();
        replies += model.replies;
        pauses += model.pauses;
    }
    // The runs did check something, and drove connections into their limits.
    assert!(replies > SEEDS * 100, "only {replies} replies checked");
    assert!(pauses > SEEDS, "only {pauses} pauses");
}
