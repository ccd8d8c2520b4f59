//! The connection set and where each request goes: round-robin over the
//! usable connections, the active node's first once an `M` reply has named
//! it; and what happens to a request after each step (docs/protocol.md §4).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock, RwLockReadGuard};
use std::thread;
use std::time::{Duration, Instant};

use crate::completion::{Completion, Submitted, Wakes};
use crate::config::{ClientBuilder, NODES_MAX};
use crate::connection::{self, Connection, ConnectionSet, Moved, Phase, Refusal};
use crate::error::{ConnectionFailure, Error};
use crate::operation::{Cut, Kind, Outcome, Policy, Step, Unsent};
use crate::timer::Timer;

/// The nodes and their connections. Nodes are only ever added (from `M`
/// replies naming an address the client was not given), never removed, so
/// an index stays valid.
#[derive(Debug, Default)]
struct Topology {
    nodes: Vec<NodeLink>,
    /// Every node's connections, for round-robin over all of them.
    connections: Vec<Arc<Connection>>,
}

#[derive(Debug)]
struct NodeLink {
    address: Arc<str>,
    connections: Vec<Arc<Connection>>,
}

/// Everything the client's threads share.
#[derive(Debug)]
pub(crate) struct Router {
    pub(crate) config: ClientBuilder,
    pub(crate) policy: Policy,
    topology: RwLock<Topology>,
    /// The round-robin position.
    next: AtomicUsize,
    /// The active node's index plus one; 0 while no `M` has named one.
    active: AtomicUsize,
    timer: Timer,
    closed: Mutex<bool>,
    closed_wake: Condvar,
    /// The name the server last gave the client's secret.
    name: Mutex<Option<String>>,
}

/// The error of a request that found no usable connection within its
/// limit: the secret's refusal if every address refused it (the request
/// could not have gone anywhere with that secret), else the addresses and
/// their failures, auth refusals among them.
fn no_connection(waited: Duration, shutting_down: bool, addresses: Vec<ConnectionFailure>) -> Error {
    match addresses.first() {
        Some(first) if addresses.iter().all(|failure| failure.auth.is_some()) => {
            Error::Auth { address: first.address.clone(), code: first.auth.expect("checked above") }
        }
        Some(first) if addresses.iter().all(|failure| failure.tls) => {
            Error::Tls { address: first.address.clone(), message: first.message.clone() }
        }
        _ => Error::NoConnection { waited, addresses, shutting_down },
    }
}

impl Router {
    /// Builds the connection set from a validated configuration and starts
    /// its threads; connections come up in the background.
    pub(crate) fn start(config: ClientBuilder) -> Arc<Router> {
        let policy = config.policy();
        let router = Arc::new(Router {
            config,
            policy,
            topology: RwLock::new(Topology::default()),
            next: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            timer: Timer::default(),
            closed: Mutex::new(false),
            closed_wake: Condvar::new(),
            name: Mutex::new(None),
        });
        for address in router.config.addresses.clone() {
            router.add_node(&mut router.topology.write().unwrap_or_else(|poisoned| poisoned.into_inner()), &address);
        }
        let timer = router.clone();
        thread::Builder::new()
            .name("ringlock-retry".into())
            .spawn(move || timer.timer.run(|operation| timer.send(operation, &mut Wakes::default())))
            .expect("spawn the ringlock client retry thread");
        router
    }

    fn topology(&self) -> RwLockReadGuard<'_, Topology> {
        self.topology.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds a node with its connections and starts them; returns its index.
    fn add_node(self: &Arc<Self>, topology: &mut Topology, address: &str) -> usize {
        let index = topology.nodes.len();
        let address: Arc<str> = Arc::from(address);
        let connections: Vec<Arc<Connection>> = (0..self.config.connections_per_node_or_default())
            .map(|_| {
                Arc::new(Connection::new(address.clone(), index, self.config.suspect_after, self.config.ping_timeout))
            })
            .collect();
        for connection in &connections {
            topology.connections.push(connection.clone());
            connection::spawn(connection.clone(), self.clone());
        }
        topology.nodes.push(NodeLink { address, connections });
        index
    }

    /// Connections the client has, usable or not.
    pub(crate) fn connection_count(&self) -> usize {
        self.topology().connections.len()
    }

    /// Connections that are connected now.
    pub(crate) fn usable_connection_count(&self) -> usize {
        self.topology().connections.iter().filter(|connection| connection.phase() == Phase::Up).count()
    }

    /// The address of the node an `M` reply last named as active.
    pub(crate) fn active_address(&self) -> Option<String> {
        let active = self.active.load(Ordering::Relaxed).checked_sub(1)?;
        Some(self.topology().nodes[active].address.to_string())
    }

    /// Requests waiting for a retry.
    pub(crate) fn retry_count(&self) -> usize {
        self.timer.len()
    }

    /// Makes `call` on the timer thread at `at` (it must not block); false,
    /// dropping it, if the client is closing.
    pub(crate) fn schedule_call(&self, at: Instant, call: Box<dyn FnOnce() + Send>) -> bool {
        self.timer.schedule_call(at, call)
    }

    /// Starts a request.
    pub(crate) fn submit(self: &Arc<Self>, kind: Kind, key: Arc<[u8]>, completion: Option<Arc<Completion>>) {
        self.submit_owing(kind, key, completion, &mut Wakes::default());
    }

    /// Starts a request that waits for a usable connection until
    /// `connection_deadline` at most, if given (an extend: until its lease
    /// ends), instead of the limit its kind implies.
    pub(crate) fn submit_until(
        self: &Arc<Self>,
        kind: Kind,
        key: Arc<[u8]>,
        completion: Option<Arc<Completion>>,
        connection_deadline: Option<Instant>,
    ) {
        let Some(deadline) = connection_deadline else {
            return self.submit(kind, key, completion);
        };
        let now = Instant::now();
        let operation = Submitted::new(kind, key, now, self.connection_count(), &self.policy, completion)
            .with_connection_deadline(deadline);
        self.send_at(operation, now, &mut Wakes::default());
    }

    /// [`submit`](Self::submit), adding the wake-up of a request that ends
    /// at once (no connection, say) to `wakes`.
    fn submit_owing(
        self: &Arc<Self>,
        kind: Kind,
        key: Arc<[u8]>,
        completion: Option<Arc<Completion>>,
        wakes: &mut Wakes,
    ) {
        let tries = self.connection_count();
        let now = Instant::now();
        let operation = Submitted::new(kind, key, now, tries, &self.policy, completion);
        self.send_at(operation, now, wakes);
    }

    /// Sends again on the next usable connection, the active node's first;
    /// drops it if its caller gave up meanwhile (a new request was just
    /// handed over, so [`send_at`](Self::send_at) does not ask).
    pub(crate) fn send(self: &Arc<Self>, operation: Submitted, wakes: &mut Wakes) {
        if operation.abandoned() {
            return;
        }
        self.send_at(operation, Instant::now(), wakes);
    }

    /// [`send`](Self::send), at `now` (read once per request, as the clock
    /// is a measurable part of a request's cost).
    fn send_at(self: &Arc<Self>, operation: Submitted, now: Instant, wakes: &mut Wakes) {
        if operation.expired(now) {
            let outcome = operation.expired_outcome(now);
            return self.finish(operation, outcome, wakes);
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let topology = self.topology();
        let mut full = false;
        let mut operation = operation;
        if let Some(active) = self.active.load(Ordering::Relaxed).checked_sub(1) {
            match self.offer(&topology.nodes[active].connections, start, operation, now) {
                Ok(()) => return,
                Err((back, refusal)) => {
                    operation = back;
                    full |= refusal == Refusal::Full;
                }
            }
        }
        match self.offer(&topology.connections, start, operation, now) {
            Ok(()) => {}
            Err((mut operation, refusal)) => {
                drop(topology);
                full |= refusal == Refusal::Full;
                let unsent = if full { Unsent::Full } else { Unsent::NoConnection };
                let step = operation.on_unsent(unsent, now, &self.policy);
                self.handle(operation, step, wakes);
            }
        }
    }

    /// Sends on the active node's connections only, after an `M` reply.
    fn send_to_active(self: &Arc<Self>, mut operation: Submitted, wakes: &mut Wakes) {
        if operation.abandoned() {
            return;
        }
        let now = Instant::now();
        if operation.expired(now) {
            let outcome = operation.expired_outcome(now);
            return self.finish(operation, outcome, wakes);
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let topology = self.topology();
        let refusal = match self.active.load(Ordering::Relaxed).checked_sub(1) {
            Some(active) => match self.offer(&topology.nodes[active].connections, start, operation, now) {
                Ok(()) => return,
                Err((back, refusal)) => {
                    operation = back;
                    refusal
                }
            },
            None => Refusal::Unusable,
        };
        drop(topology);
        let unsent = if refusal == Refusal::Full { Unsent::Full } else { Unsent::ActiveUnreachable };
        let step = operation.on_unsent(unsent, now, &self.policy);
        self.handle(operation, step, wakes);
    }

    /// Offers `operation` to `connections` round-robin from `start`; gives
    /// it back if none took it, with `Full` if any refused only for being full.
    fn offer(
        &self,
        connections: &[Arc<Connection>],
        start: usize,
        mut operation: Submitted,
        now: Instant,
    ) -> Result<(), (Submitted, Refusal)> {
        let mut worst = Refusal::Unusable;
        for offset in 0..connections.len() {
            let connection = &connections[(start + offset) % connections.len()];
            match connection.try_send(operation, now, self.config.in_flight_per_connection_max) {
                Ok(()) => return Ok(()),
                Err((back, refusal)) => {
                    operation = back;
                    if refusal == Refusal::Full {
                        worst = Refusal::Full;
                    }
                }
            }
        }
        Err((operation, worst))
    }

    /// Hands the outcome to whoever waits for it, owing its wake-up. A
    /// grant nobody waits for any more (its future was dropped) is released
    /// at once.
    fn finish(self: &Arc<Self>, operation: Submitted, outcome: Outcome, wakes: &mut Wakes) {
        let Some(completion) = operation.completion else { return };
        let outcome = match outcome {
            Outcome::NoConnection { waited, shutting_down } => {
                Outcome::Failed(no_connection(waited, shutting_down, self.connection_failures()))
            }
            other => other,
        };
        if let Err(Outcome::Acquired(token)) = completion.complete(outcome, wakes) {
            self.submit_owing(Kind::Release { token }, operation.key, None, wakes);
        }
    }

    /// The name the server last gave the client's secret.
    pub(crate) fn name(&self) -> Option<String> {
        self.name.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Every node's address with the failure of its last attempt (the
    /// latest among its connections), in the order the nodes were given or
    /// learned.
    fn connection_failures(&self) -> Vec<ConnectionFailure> {
        self.topology()
            .nodes
            .iter()
            .map(|node| {
                node.connections
                    .iter()
                    .filter_map(|connection| connection.last_failure())
                    .max_by_key(|(at, _)| *at)
                    .map(|(_, failure)| failure)
                    .unwrap_or_else(|| ConnectionFailure::pending(&node.address))
            })
            .collect()
    }

    pub(crate) fn is_closed(&self) -> bool {
        *self.closed.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Closes the client: connections flush what is queued and close, and
    /// requests waiting for a retry end with [`Error::NoConnection`].
    pub(crate) fn close(self: &Arc<Self>) {
        *self.closed.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = true;
        self.closed_wake.notify_all();
        for connection in &self.topology().connections {
            connection.close();
        }
        let waiting = self.timer.close();
        self.abort(waiting);
    }
}

impl ConnectionSet for Router {
    fn config(&self) -> &ClientBuilder {
        &self.config
    }

    fn policy(&self) -> &Policy {
        &self.policy
    }

    fn note_name(&self, name: String) {
        *self.name.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(name);
    }

    fn connection_up(&self) {
        self.timer.hurry_connection_waiters(Instant::now());
    }

    fn sleep(&self, pause: Duration) -> bool {
        let closed = self.closed.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (closed, _) = self
            .closed_wake
            .wait_timeout_while(closed, pause, |closed| !*closed)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        !*closed
    }

    fn cut(self: &Arc<Self>, operations: Vec<Submitted>, cut: &Cut, answered: bool) {
        if self.is_closed() {
            return self.abort(operations);
        }
        let now = Instant::now();
        let mut wakes = Wakes::default();
        for mut operation in operations {
            // Nobody waits for it (a dropped future, or the connection's own
            // probe): it would be dropped when sent again anyway.
            if operation.abandoned() {
                continue;
            }
            if answered {
                operation.connection_answered();
            }
            let step = operation.on_cut(cut, now, &self.policy);
            self.handle(operation, step, &mut wakes);
        }
    }

    fn abort(self: &Arc<Self>, operations: Vec<Submitted>) {
        let mut wakes = Wakes::default();
        for operation in operations {
            self.finish(operation, Outcome::NoConnection { waited: Duration::ZERO, shutting_down: false }, &mut wakes);
        }
    }

    fn note_moved(self: &Arc<Self>, from: usize, moved: Moved) {
        match moved {
            Moved::Unknown => {
                // The node we preferred no longer knows an active: spread
                // requests again until some node names one.
                let _ = self.active.compare_exchange(from + 1, 0, Ordering::Relaxed, Ordering::Relaxed);
            }
            Moved::To(address) => {
                let found = find_node(&self.topology(), &address);
                let index = match found {
                    Some(index) => Some(index),
                    None => {
                        let mut topology = self.topology.write().unwrap_or_else(|poisoned| poisoned.into_inner());
                        // Another reader may have added it meanwhile.
                        match find_node(&topology, &address) {
                            Some(index) => Some(index),
                            None if topology.nodes.len() < NODES_MAX && !self.is_closed() => {
                                Some(self.add_node(&mut topology, &address))
                            }
                            None => None,
                        }
                    }
                };
                if let Some(index) = index {
                    self.active.store(index + 1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Carries out `step` for `operation`; the wake-up of a request that
    /// ends is added to `wakes`, for the caller to make once it holds no lock.
    fn handle(self: &Arc<Self>, operation: Submitted, step: Step, wakes: &mut Wakes) {
        match step {
            Step::Done(outcome) => self.finish(operation, outcome, wakes),
            Step::Resend => self.send(operation, wakes),
            Step::Redirect => self.send_to_active(operation, wakes),
            Step::RetryAt(at) => {
                if let Err(operation) = self.timer.schedule(at, operation) {
                    self.finish(
                        operation,
                        Outcome::NoConnection { waited: Duration::ZERO, shutting_down: false },
                        wakes,
                    );
                }
            }
        }
    }
}

/// The node with this address: the same text, or the same socket address.
fn find_node(topology: &Topology, address: &str) -> Option<usize> {
    topology.nodes.iter().position(|node| &*node.address == address).or_else(|| {
        let wanted: SocketAddr = address.parse().ok()?;
        topology.nodes.iter().position(|node| node.address.parse::<SocketAddr>().ok() == Some(wanted))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::ErrorCode;

    #[test]
    fn the_secret_s_refusal_is_the_error_only_when_every_address_refused_it() {
        let refused = |address| ConnectionFailure::auth(address, ErrorCode::AuthFailed);
        let waited = Duration::from_secs(1);
        let all = no_connection(waited, false, vec![refused("a:1"), refused("b:1")]);
        assert_eq!(all, Error::Auth { address: "a:1".into(), code: ErrorCode::AuthFailed });
        let mixed = vec![refused("a:1"), ConnectionFailure::closed("b:1")];
        assert_eq!(
            no_connection(waited, false, mixed.clone()),
            Error::NoConnection { waited, addresses: mixed, shutting_down: false }
        );
        assert_eq!(
            no_connection(waited, false, Vec::new()),
            Error::NoConnection { waited, addresses: Vec::new(), shutting_down: false }
        );
    }

    fn topology(addresses: &[&str]) -> Topology {
        Topology {
            nodes: addresses
                .iter()
                .map(|address| NodeLink { address: Arc::from(*address), connections: Vec::new() })
                .collect(),
            connections: Vec::new(),
        }
    }

    #[test]
    fn nodes_are_found_by_text_or_by_socket_address() {
        let topology = topology(&["10.0.0.1:7700", "db.example:7700", "[::1]:7700"]);
        assert_eq!(find_node(&topology, "10.0.0.1:7700"), Some(0));
        assert_eq!(find_node(&topology, "db.example:7700"), Some(1));
        assert_eq!(find_node(&topology, "[0:0:0:0:0:0:0:1]:7700"), Some(2));
        assert_eq!(find_node(&topology, "10.0.0.1:7701"), None);
        assert_eq!(find_node(&topology, "other.example:7700"), None);
    }
}
