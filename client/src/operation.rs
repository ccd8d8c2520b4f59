//! One request from the moment it is submitted until its outcome is known:
//! what to send, and what to do next on each event (a reply, a cut
//! connection, no usable connection at all).
//!
//! This is where the rules of docs/protocol.md §4 live (acquires move to the next connection,
//! releases are retried, `M` redirects), as plain functions of the request,
//! the event and `now` that return a [`Step`]. There is no I/O here: the
//! router and the connections carry the steps out.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, ProtocolError};
use crate::pairing::Paired;
use crate::proto::{ErrorCode, Op, Reply, Request, Role, encode_request};

/// The retry rules, from the client's configuration.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Policy {
    /// Pause between two tries of a release, or of a request that found no
    /// active node.
    pub(crate) retry_interval: Duration,
    /// How long a release, or a request that finds no active node, keeps
    /// being retried.
    pub(crate) retry_for: Duration,
    /// Most `M` redirects one request follows.
    pub(crate) redirect_limit: u32,
    /// How long a request with no limit of its own waits for a usable
    /// connection.
    pub(crate) connect_limit: Duration,
}

/// What a request asks, besides its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `try_once`: the wait is the shortest the wire carries, not a limit
    /// the caller chose, so the wait for a connection is the connect limit.
    Acquire {
        lease_ms: u64,
        wait_ms: u64,
        try_once: bool,
    },
    Release {
        token: u64,
    },
    Extend {
        token: u64,
        lease_ms: u64,
    },
    Ping,
    Stats,
    Inspect,
}

/// What the active node knows of a key now: the answer to
/// [`Client::inspect`](crate::Client::inspect).
///
/// # Examples
///
/// ```no_run
/// # fn main() -> Result<(), ringlock_client::Error> {
/// let client = ringlock_client::Client::connect(["127.0.0.1:7700"])?;
/// let state = client.inspect("orders/42")?;
/// match state.token {
///     Some(token) => println!("held by token {token} for {:?} more, {} waiting", state.lease_left, state.waiters),
///     None => println!("free ({} waiting for tokens)", state.waiters),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Inspection {
    /// The fencing token of the grant holding the key, if it is held.
    pub token: Option<u64>,
    /// How long the holder's lease has left (zero if the key is free).
    pub lease_left: Duration,
    /// Acquires queued on the key.
    pub waiters: u64,
}

/// The end of a request, handed to its waiter.
#[derive(Debug)]
pub(crate) enum Outcome {
    Acquired(u64),
    TimedOut,
    Released,
    NotHeld,
    Extended,
    Pong {
        role: Role,
        epoch: u64,
        active: Option<String>,
    },
    Stats(String),
    Inspected(Inspection),
    Failed(Error),
    /// No usable connection within the request's limit, after waiting this
    /// long; the router names the addresses and their errors.
    /// `shutting_down`: a server answered the request `shutting-down` on
    /// the way, so the error says the server was stopping.
    NoConnection {
        waited: Duration,
        shutting_down: bool,
    },
}

/// Why a connection was cut, which decides the error a request reports if
/// it cannot move on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Cut {
    /// The socket failed, closed, or could not connect.
    Io,
    /// The client cut a connection that had requests in flight and read
    /// nothing for this long, not even the answer to a ping (see
    /// `liveness`): a node that vanished or a partition.
    Silent(Duration),
    /// The server answered `E - - <code>` (for example
    /// `too-many-connections`) and closes the connection.
    Refused(ErrorCode),
    /// The server broke the protocol; the client dropped the connection.
    Protocol(ProtocolError),
}

impl Cut {
    /// What a request that cannot move on after this cut reports, having
    /// waited `waited`.
    fn to_outcome(&self, waited: Duration, shutting_down: bool) -> Outcome {
        match self {
            Cut::Io | Cut::Silent(_) => Outcome::NoConnection { waited, shutting_down },
            Cut::Refused(ErrorCode::ShuttingDown) => Outcome::NoConnection { waited, shutting_down: true },
            Cut::Refused(code) => Outcome::Failed(Error::Server(*code)),
            Cut::Protocol(violation) => Outcome::Failed(Error::Protocol(violation.clone())),
        }
    }
}

/// What the router does with a request next.
#[derive(Debug)]
pub(crate) enum Step {
    /// The request is over: hand this to its waiter.
    Done(Outcome),
    /// Send it again, on the next usable connection.
    Resend,
    /// Send it to the active node the last `M` reply named.
    Redirect,
    /// Send it again at this instant.
    RetryAt(Instant),
}

/// Why no connection took a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unsent {
    /// No connection is usable.
    NoConnection,
    /// Usable connections exist but each has as many requests in flight as
    /// it may.
    Full,
    /// The active node named by an `M` reply has no usable connection.
    ActiveUnreachable,
}

/// Whoever waits for a request's outcome, as far as the request's rules
/// need to know: whether they gave up. The runtime's waiter is the one-shot
/// cell of `completion`; keeping it a parameter leaves this module free of
/// threads and wake-ups.
pub(crate) trait Caller {
    /// The caller gave up waiting (its future was dropped).
    fn is_abandoned(&self) -> bool;
}

/// A request in flight, or waiting to be retried, with `W` waiting for its
/// outcome.
#[derive(Debug)]
pub(crate) struct Operation<W> {
    pub(crate) kind: Kind,
    /// The key; empty for `P` and `S`.
    pub(crate) key: Arc<[u8]>,
    started: Instant,
    /// Connections this request may still be cut off on before it stops
    /// moving from one to the next and waits for one to come back.
    /// A `u16` (a client has at most 16 × 64 connections) keeps the request
    /// small: it is moved on every hop.
    tries_left: u16,
    /// Redirects it may still follow; a `u16` for the same reason.
    redirects_left: u16,
    /// Set for releases at once, and for other requests once a node answers
    /// that no active is known: retries stop at this instant.
    retry_until: Option<Instant>,
    /// How long after `started` the caller lets this request wait for a
    /// usable connection, in milliseconds, when the caller sets it (an
    /// extend: until the end of the lease). Milliseconds in a `u32` (49
    /// days) keep the request small: it is moved on every hop.
    /// Never zero (a deadline at the start is 1 ms after it), so that the
    /// `Option` costs no space beside the `shutting_down` flag.
    connection_deadline_ms: Option<NonZeroU32>,
    /// Since when the request has been waiting for a usable connection;
    /// `None` while it is in flight or has another reason to wait.
    pub(crate) waiting_since: Option<Instant>,
    /// How long, in milliseconds, it waited for a usable connection before
    /// it last went out. A connection that takes it and closes before
    /// answering anything (a node that accepts then closes at once) does not
    /// start its wait over, so the connect limit still ends the call; one
    /// that has answered does (see [`connection_answered`](Self::connection_answered)).
    waited_before_ms: u32,
    /// A server answered it `shutting-down` (or refused a connection it was
    /// on with that code): it had no effect and is sent again within its
    /// limit, and if that runs out the error says the server was stopping.
    shutting_down: bool,
    /// Who waits for the outcome; `None` for a release in the background.
    pub(crate) completion: Option<W>,
}

impl<W: Caller> Operation<W> {
    /// A new request, to be tried on up to `tries` connections.
    pub(crate) fn new(
        kind: Kind,
        key: Arc<[u8]>,
        now: Instant,
        tries: usize,
        policy: &Policy,
        completion: Option<W>,
    ) -> Operation<W> {
        let retry_until = match kind {
            Kind::Release { .. } => Some(now + policy.retry_for),
            _ => None,
        };
        Operation {
            kind,
            key,
            started: now,
            tries_left: u16::try_from(tries).unwrap_or(u16::MAX).max(1),
            redirects_left: u16::try_from(policy.redirect_limit).unwrap_or(u16::MAX),
            retry_until,
            connection_deadline_ms: None,
            waiting_since: None,
            waited_before_ms: 0,
            shutting_down: false,
            completion,
        }
    }

    /// Lets the request wait for a usable connection until `deadline` at
    /// most, instead of the limit its kind implies.
    pub(crate) fn with_connection_deadline(mut self, deadline: Instant) -> Operation<W> {
        let after_ms = deadline.saturating_duration_since(self.started).as_millis();
        self.connection_deadline_ms = NonZeroU32::new(u32::try_from(after_ms).unwrap_or(u32::MAX).max(1));
        self
    }

    /// The last instant this request may wait for a usable connection, if
    /// it started waiting at `since`: a bounded acquire's wait, an extend's
    /// lease, a release's retry period, else the client's connect limit.
    fn connection_deadline(&self, since: Instant, policy: &Policy) -> Instant {
        if let Some(after_ms) = self.connection_deadline_ms {
            return self.started + Duration::from_millis(u64::from(after_ms.get()));
        }
        match self.kind {
            Kind::Acquire { wait_ms, try_once: false, .. } if wait_ms > 0 => {
                self.started + Duration::from_millis(wait_ms)
            }
            Kind::Release { .. } => self.retry_until.unwrap_or(since + policy.retry_for),
            _ => since + policy.connect_limit.saturating_sub(self.waited_before()),
        }
    }

    fn waited_before(&self) -> Duration {
        Duration::from_millis(u64::from(self.waited_before_ms))
    }

    /// How long it has waited for a usable connection at `now`, counting
    /// its earlier waits since a connection last answered.
    fn waited(&self, now: Instant) -> Duration {
        let current = self.waiting_since.map_or(Duration::ZERO, |since| now.saturating_duration_since(since));
        self.waited_before() + current
    }

    /// It goes out on a connection at `now`: its wait for one, if any,
    /// pauses (it is counted again if the connection closes without
    /// answering).
    pub(crate) fn went_out(&mut self, now: Instant) {
        if self.waiting_since.is_some() {
            let waited_ms = self.waited(now).as_millis();
            self.waited_before_ms = u32::try_from(waited_ms).unwrap_or(u32::MAX);
            self.waiting_since = None;
        }
    }

    /// A connection that carried it was cut after answering something (to
    /// this request or another): a server was there, so a wait for a
    /// connection after this cut is a new one and gets the whole limit.
    pub(crate) fn connection_answered(&mut self) {
        self.waited_before_ms = 0;
    }

    /// How a request whose bounded wait ran out before it could be (re)sent
    /// ends: with no connection if it was off the wire for want of one (a
    /// broken connection took it back, or none was usable), since the
    /// server then never had it or lost it; else (bounced by `M` replies)
    /// timed out, as it would have on the server.
    pub(crate) fn expired_outcome(&self, now: Instant) -> Outcome {
        match self.waiting_since {
            Some(_) => Outcome::NoConnection { waited: self.waited(now), shutting_down: self.shutting_down },
            None => Outcome::TimedOut,
        }
    }

    /// The `P` a suspected connection sends itself (see `liveness`): nobody
    /// waits for it, and it is never sent again elsewhere.
    pub(crate) fn probe(now: Instant, policy: &Policy) -> Operation<W> {
        Operation::new(Kind::Ping, Arc::from(&b""[..]), now, 1, policy, None)
    }

    /// Whether nobody waits for it any more, so sending it again is
    /// pointless: an acquire would take a place in the server's queue for a
    /// grant nobody takes. A release still goes, to free the key; a
    /// connection's own probe never goes again.
    pub(crate) fn abandoned(&self) -> bool {
        match (&self.kind, &self.completion) {
            (Kind::Release { .. }, _) => false,
            (Kind::Ping, None) => true,
            (_, completion) => completion.as_ref().is_some_and(|completion| completion.is_abandoned()),
        }
    }

    /// The wait left to an acquire at `now`, in milliseconds: `Some(0)` for
    /// no limit, `None` once a bounded wait has run out. An acquire that
    /// tries once asks for its short wait whenever it goes out: it waits for
    /// a connection within the connect limit, not within that wait.
    fn wait_left_ms(&self, now: Instant) -> Option<u64> {
        match self.kind {
            Kind::Acquire { wait_ms: 0, .. } => Some(0),
            Kind::Acquire { wait_ms, try_once: true, .. } => Some(wait_ms),
            Kind::Acquire { wait_ms, .. } => {
                let waited_ms =
                    u64::try_from(now.saturating_duration_since(self.started).as_millis()).unwrap_or(u64::MAX);
                wait_ms.checked_sub(waited_ms).filter(|&left| left > 0)
            }
            _ => Some(0),
        }
    }

    /// Whether this is an acquire whose wait ran out before it could be
    /// (re)sent; see [`expired_outcome`](Self::expired_outcome).
    pub(crate) fn expired(&self, now: Instant) -> bool {
        self.wait_left_ms(now).is_none()
    }

    /// Appends the request line. A re-sent acquire asks only for the wait it
    /// has left, so moving it does not make it wait longer than asked.
    pub(crate) fn encode(&self, now: Instant, out: &mut Vec<u8>) {
        let key = &self.key[..];
        let request = match self.kind {
            Kind::Acquire { lease_ms, .. } => {
                Request::Acquire { key, lease_ms, wait_ms: self.wait_left_ms(now).unwrap_or(1) }
            }
            Kind::Release { token } => Request::Release { key, token },
            Kind::Extend { token, lease_ms } => Request::Extend { key, token, lease_ms },
            Kind::Ping => Request::Ping,
            Kind::Stats => Request::Stats,
            Kind::Inspect => Request::Inspect { key },
        };
        encode_request(&request, out);
    }

    /// The next step after `reply`, which the connection paired with this
    /// request by (op, key).
    pub(crate) fn on_reply(&mut self, reply: &Reply<'_>, now: Instant, policy: &Policy) -> Step {
        let outcome = match (self.kind, *reply) {
            (_, Reply::Moved { active: Some(_), .. }) => {
                if self.redirects_left == 0 {
                    return Step::Done(Outcome::Failed(Error::NoActive));
                }
                self.redirects_left -= 1;
                return Step::Redirect;
            }
            (_, Reply::Moved { active: None, .. }) => return self.retry_later(now, policy, Error::NoActive),
            // A stopping server answers what it will not serve
            // `shutting-down`: the request had no effect, and the next
            // server (a restart, or a cluster's new active) is usually there
            // well within the request's limit, so it waits for a connection
            // as if this one had broken. Only an acquire that tries once
            // has no wait to spend and reports it at once.
            (
                Kind::Acquire { try_once: false, .. } | Kind::Release { .. } | Kind::Extend { .. },
                Reply::Error { code: ErrorCode::ShuttingDown, .. },
            ) => {
                self.shutting_down = true;
                self.waiting_since.get_or_insert(now);
                return self.wait_for_connection(now, policy);
            }
            (Kind::Acquire { .. }, Reply::Acquired { token, .. }) => Outcome::Acquired(token),
            (Kind::Acquire { .. }, Reply::TimedOut { .. }) => Outcome::TimedOut,
            (Kind::Release { .. }, Reply::Released { .. }) => Outcome::Released,
            // The grant was already released, expired or handed on: nothing
            // is left to release, which is what the caller wanted.
            (Kind::Release { .. }, Reply::Error { code: ErrorCode::NotHolder, .. }) => Outcome::NotHeld,
            (Kind::Extend { token, .. }, Reply::Extended { token: received, .. }) => {
                if received == token {
                    Outcome::Extended
                } else {
                    Outcome::Failed(Error::Protocol(ProtocolError::WrongToken { sent: token, received }))
                }
            }
            (Kind::Ping, Reply::Pong { role, epoch, active }) => {
                Outcome::Pong { role, epoch, active: active.map(|address| String::from_utf8_lossy(address).into()) }
            }
            (Kind::Stats, Reply::Stats { json }) => Outcome::Stats(String::from_utf8_lossy(json).into_owned()),
            (Kind::Inspect, Reply::Inspected { token, lease_left_ms, waiters, .. }) => {
                Outcome::Inspected(Inspection { token, lease_left: Duration::from_millis(lease_left_ms), waiters })
            }
            (_, Reply::Error { code, .. }) => Outcome::Failed(Error::Server(code)),
            // Pairing by (op, key) leaves no other combination.
            (_, other) => {
                let mut line = Vec::new();
                crate::proto::encode_reply(&other, &mut line);
                line.pop();
                let line = String::from_utf8_lossy(&line).into_owned();
                Outcome::Failed(Error::Protocol(ProtocolError::Unsolicited(line)))
            }
        };
        Step::Done(outcome)
    }

    /// The next step after the connection carrying this request was cut.
    /// The server may or may not have seen the request.
    ///
    /// A request cut off on as many connections as the client has stops
    /// moving from one to the next: a server that went away (a restart, a
    /// failover) takes every connection to it down at once, so the request
    /// waits for a connection to come back, within its limit.
    pub(crate) fn on_cut(&mut self, cut: &Cut, now: Instant, policy: &Policy) -> Step {
        let waited = now.saturating_duration_since(self.started);
        match cut {
            // Off the wire for want of a connection from now on, until a
            // connection takes it again.
            Cut::Io => {
                self.waiting_since.get_or_insert(now);
            }
            // Its time on a connection that said nothing counts as time
            // without a usable one (from the start of the silence, which
            // may be a little before it went out), or a request whose only
            // limit is the connect limit would move between silent
            // connections for ever.
            Cut::Silent(silence) => {
                self.waiting_since.get_or_insert(now.checked_sub(*silence).unwrap_or(now));
            }
            // A stopping server refusing a new connection: like a connection
            // that broke, and the request remembers why.
            Cut::Refused(ErrorCode::ShuttingDown) => {
                self.shutting_down = true;
                self.waiting_since.get_or_insert(now);
            }
            Cut::Refused(_) | Cut::Protocol(_) => {}
        }
        if let Kind::Release { .. } = self.kind {
            // Send it again at once on another connection; the router falls
            // back to retrying every interval while none is usable.
            return match self.retry_until {
                Some(until) if now > until => Step::Done(cut.to_outcome(waited, self.shutting_down)),
                _ => Step::Resend,
            };
        }
        self.tries_left = self.tries_left.saturating_sub(1);
        match cut {
            _ if self.tries_left > 0 => Step::Resend,
            Cut::Io | Cut::Silent(_) | Cut::Refused(ErrorCode::ShuttingDown) => self.wait_for_connection(now, policy),
            other => Step::Done(other.to_outcome(waited, self.shutting_down)),
        }
    }

    /// The next step when no connection took the request.
    pub(crate) fn on_unsent(&mut self, unsent: Unsent, now: Instant, policy: &Policy) -> Step {
        match unsent {
            Unsent::NoConnection => self.wait_for_connection(now, policy),
            // During a failover the node an `M` named may be gone for a
            // moment: wait for the others to name the new active.
            Unsent::ActiveUnreachable => self.retry_later(now, policy, Error::NoActive),
            Unsent::Full if matches!(self.kind, Kind::Release { .. }) => {
                self.retry_later(now, policy, Error::TooManyInFlight)
            }
            Unsent::Full => Step::Done(Outcome::Failed(Error::TooManyInFlight)),
        }
    }

    /// Waits for a usable connection within the request's limit: tried
    /// again after the retry interval, or at once when a connection comes
    /// up (the router hurries requests with `waiting_since` set); past the
    /// limit it ends with no connection.
    fn wait_for_connection(&mut self, now: Instant, policy: &Policy) -> Step {
        let since = *self.waiting_since.get_or_insert(now);
        let deadline = self.connection_deadline(since, policy);
        if now >= deadline {
            return Step::Done(Outcome::NoConnection { waited: self.waited(now), shutting_down: self.shutting_down });
        }
        Step::RetryAt((now + policy.retry_interval).min(deadline))
    }

    /// Retry after the interval while within the retry period, which starts
    /// now if it has not started yet; else fail with `error`.
    fn retry_later(&mut self, now: Instant, policy: &Policy, error: Error) -> Step {
        let until = *self.retry_until.get_or_insert(now + policy.retry_for);
        let at = now + policy.retry_interval;
        if at <= until { Step::RetryAt(at) } else { Step::Done(Outcome::Failed(error)) }
    }
}

/// Replies name the operation and the key they answer, which is all that
/// pairs them with their request.
impl<W> Paired for Operation<W> {
    fn op(&self) -> Op {
        match self.kind {
            Kind::Acquire { .. } => Op::Acquire,
            Kind::Release { .. } => Op::Release,
            Kind::Extend { .. } => Op::Extend,
            Kind::Ping => Op::Ping,
            Kind::Stats => Op::Stats,
            Kind::Inspect => Op::Inspect,
        }
    }

    fn key(&self) -> &[u8] {
        &self.key
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A caller that waits, or gave up when it holds `true`.
    #[derive(Debug)]
    struct TestCaller(bool);

    impl Caller for TestCaller {
        fn is_abandoned(&self) -> bool {
            self.0
        }
    }

    type Operation = super::Operation<TestCaller>;

    const POLICY: Policy = Policy {
        retry_interval: Duration::from_millis(200),
        retry_for: Duration::from_secs(5),
        redirect_limit: 2,
        connect_limit: Duration::from_secs(10),
    };

    fn operation(kind: Kind, now: Instant, tries: usize) -> Operation {
        Operation::new(kind, Arc::from(&b"k"[..]), now, tries, &POLICY, None)
    }

    fn line(operation: &Operation, now: Instant) -> String {
        let mut out = Vec::new();
        operation.encode(now, &mut out);
        String::from_utf8(out).unwrap()
    }

    const ACQUIRE: Kind = Kind::Acquire { lease_ms: 30_000, wait_ms: 2_000, try_once: false };

    #[test]
    fn encodes_each_kind() {
        let now = Instant::now();
        assert_eq!(line(&operation(ACQUIRE, now, 1), now), "A k 30 2\n");
        assert_eq!(line(&operation(Kind::Release { token: 5 }, now, 1), now), "R k 5\n");
        assert_eq!(line(&operation(Kind::Extend { token: 5, lease_ms: 1_500 }, now, 1), now), "X k 5 1.5\n");
        let ping = Operation::new(Kind::Ping, Arc::from(&b""[..]), now, 1, &POLICY, None);
        assert_eq!(line(&ping, now), "P\n");
    }

    #[test]
    fn a_resent_acquire_asks_for_the_wait_it_has_left() {
        let now = Instant::now();
        let acquire = operation(ACQUIRE, now, 2);
        assert_eq!(line(&acquire, now + Duration::from_millis(750)), "A k 30 1.25\n");
        assert!(!acquire.expired(now + Duration::from_millis(1_999)));
        assert!(acquire.expired(now + Duration::from_millis(2_000)));
        let forever = operation(Kind::Acquire { lease_ms: 1_000, wait_ms: 0, try_once: false }, now, 2);
        assert!(!forever.expired(now + Duration::from_secs(100_000)));
        assert_eq!(line(&forever, now + Duration::from_secs(100)), "A k 1 0\n");
    }

    #[test]
    fn an_acquire_moves_on_until_it_was_cut_on_every_connection_then_waits_for_one() {
        let now = Instant::now();
        let mut acquire = operation(ACQUIRE, now, 3);
        assert!(matches!(acquire.on_cut(&Cut::Io, now, &POLICY), Step::Resend));
        assert!(matches!(acquire.on_cut(&Cut::Io, now, &POLICY), Step::Resend));
        assert!(matches!(acquire.on_cut(&Cut::Io, now, &POLICY), Step::RetryAt(_)));
        assert_eq!(acquire.waiting_since, Some(now));
        let late = now + Duration::from_secs(2);
        assert!(matches!(acquire.on_cut(&Cut::Io, late, &POLICY), Step::Done(Outcome::NoConnection { .. })));
        let mut refused = operation(ACQUIRE, now, 1);
        let step = refused.on_cut(&Cut::Refused(ErrorCode::TooManyConnections), now, &POLICY);
        assert!(matches!(step, Step::Done(Outcome::Failed(Error::Server(ErrorCode::TooManyConnections)))));
    }

    /// Drives `operation` through "no connection" events at each retry
    /// instant from `start`; the time it waited when it gave up.
    fn wait_out(operation: &mut Operation, start: Instant) -> Duration {
        let mut now = start;
        loop {
            match operation.on_unsent(Unsent::NoConnection, now, &POLICY) {
                Step::RetryAt(at) => {
                    assert!(at > now && at <= now + POLICY.retry_interval, "polled every retry interval at most");
                    now = at;
                }
                Step::Done(Outcome::NoConnection { waited, .. }) => {
                    assert_eq!(waited, now - start);
                    return waited;
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn a_request_with_no_connection_waits_within_its_own_limit() {
        let now = Instant::now();
        assert_eq!(wait_out(&mut operation(ACQUIRE, now, 2), now), Duration::from_secs(2), "the acquire's wait");
        let forever = Kind::Acquire { lease_ms: 1_000, wait_ms: 0, try_once: false };
        assert_eq!(wait_out(&mut operation(forever, now, 2), now), POLICY.connect_limit, "no wait: the connect limit");
        let once = Kind::Acquire { lease_ms: 1_000, wait_ms: 1, try_once: true };
        assert_eq!(wait_out(&mut operation(once, now, 2), now), POLICY.connect_limit, "try once: the connect limit");
        assert_eq!(wait_out(&mut operation(Kind::Inspect, now, 2), now), POLICY.connect_limit);
        let extend = operation(Kind::Extend { token: 5, lease_ms: 1_000 }, now, 2);
        let mut extend = extend.with_connection_deadline(now + Duration::from_millis(700));
        assert_eq!(wait_out(&mut extend, now), Duration::from_millis(700), "the extend's lease left");
        let started_late = now + Duration::from_millis(500);
        assert_eq!(wait_out(&mut operation(ACQUIRE, now, 2), started_late), Duration::from_millis(1_500));
    }

    #[test]
    fn going_out_on_connections_closed_before_answering_does_not_start_the_wait_over() {
        let start = Instant::now();
        let mut ping = Operation::new(Kind::Ping, Arc::from(&b""[..]), start, 2, &POLICY, None);
        let mut now = start;
        let mut step = ping.on_unsent(Unsent::NoConnection, now, &POLICY);
        let outcome = loop {
            match step {
                Step::RetryAt(at) => now = at,
                Step::Resend => {}
                Step::Done(outcome) => break outcome,
                other => panic!("{other:?}"),
            }
            // A connection comes up, takes it and closes at once.
            ping.went_out(now);
            now += Duration::from_millis(1);
            step = ping.on_cut(&Cut::Io, now, &POLICY);
        };
        assert!(
            matches!(outcome, Outcome::NoConnection { waited, .. } if waited >= POLICY.connect_limit - Duration::from_secs(1))
        );
        assert!(now - start < POLICY.connect_limit * 2, "ended within about its limit: {:?}", now - start);

        // Cut from a connection that had answered: a new wait, with the whole limit.
        let mut inspect = operation(Kind::Inspect, start, 1);
        assert!(matches!(inspect.on_unsent(Unsent::NoConnection, start, &POLICY), Step::RetryAt(_)));
        let sent = start + Duration::from_secs(9);
        inspect.went_out(sent);
        inspect.connection_answered();
        assert!(matches!(inspect.on_cut(&Cut::Io, sent, &POLICY), Step::RetryAt(_)));
        let step = inspect.on_unsent(Unsent::NoConnection, sent + Duration::from_secs(9), &POLICY);
        assert!(matches!(step, Step::RetryAt(_)), "{step:?}");
    }

    #[test]
    fn an_acquire_that_tries_once_never_runs_out_of_its_wait_off_the_wire() {
        let now = Instant::now();
        let once = operation(Kind::Acquire { lease_ms: 30_000, wait_ms: 1, try_once: true }, now, 2);
        let later = now + Duration::from_secs(5);
        assert!(!once.expired(later), "it waits for a connection within the connect limit");
        assert_eq!(line(&once, later), "A k 30 0.001\n", "and tries once whenever it goes out");
    }

    #[test]
    fn a_bounded_acquire_whose_wait_ran_out_after_a_cut_reports_no_connection() {
        let now = Instant::now();
        let mut acquire = operation(ACQUIRE, now, 2);
        let cut_at = now + Duration::from_millis(1_500);
        assert!(matches!(acquire.on_cut(&Cut::Io, cut_at, &POLICY), Step::Resend));
        let later = now + Duration::from_secs(2);
        assert!(acquire.expired(later));
        let outcome = acquire.expired_outcome(later);
        assert!(matches!(outcome, Outcome::NoConnection { waited, .. } if waited == later - cut_at), "{outcome:?}");
    }

    #[test]
    fn a_bounded_acquire_that_ran_out_waiting_for_a_connection_reports_no_connection() {
        let now = Instant::now();
        let mut acquire = operation(ACQUIRE, now, 2);
        let later = now + Duration::from_secs(2);
        assert!(matches!(acquire.expired_outcome(later), Outcome::TimedOut), "not waiting: the server's timeout");
        assert!(matches!(acquire.on_unsent(Unsent::NoConnection, now, &POLICY), Step::RetryAt(_)));
        assert!(
            matches!(acquire.expired_outcome(later), Outcome::NoConnection { waited, .. } if waited == later - now)
        );
    }

    #[test]
    fn full_connections_fail_at_once_but_a_release_retries() {
        let now = Instant::now();
        let step = operation(ACQUIRE, now, 2).on_unsent(Unsent::Full, now, &POLICY);
        assert!(matches!(step, Step::Done(Outcome::Failed(Error::TooManyInFlight))));
        let step = operation(Kind::Release { token: 5 }, now, 2).on_unsent(Unsent::Full, now, &POLICY);
        assert!(matches!(step, Step::RetryAt(_)));
    }

    #[test]
    fn a_release_is_retried_every_interval_for_the_retry_period() {
        let start = Instant::now();
        let mut release = operation(Kind::Release { token: 5 }, start, 1);
        assert!(matches!(release.on_cut(&Cut::Io, start, &POLICY), Step::Resend));
        let mut now = start;
        let mut retries = 0;
        loop {
            match release.on_unsent(Unsent::NoConnection, now, &POLICY) {
                Step::RetryAt(at) => {
                    assert_eq!(at, now + POLICY.retry_interval);
                    now = at;
                    retries += 1;
                }
                Step::Done(Outcome::NoConnection { .. }) => break,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(retries, 25, "5 s every 200 ms");
        assert!(matches!(release.on_cut(&Cut::Io, now + Duration::from_millis(1), &POLICY), Step::Done(_)));
    }

    #[test]
    fn replies_end_requests() {
        let now = Instant::now();
        let reply = |kind, reply: Reply<'_>| operation(kind, now, 1).on_reply(&reply, now, &POLICY);
        assert!(matches!(reply(ACQUIRE, Reply::Acquired { key: b"k", token: 9 }), Step::Done(Outcome::Acquired(9))));
        assert!(matches!(reply(ACQUIRE, Reply::TimedOut { key: b"k" }), Step::Done(Outcome::TimedOut)));
        let error = Reply::Error { op: Some(Op::Acquire), key: Some(b"k"), code: ErrorCode::TooManyWaiters };
        assert!(matches!(reply(ACQUIRE, error), Step::Done(Outcome::Failed(Error::Server(ErrorCode::TooManyWaiters)))));
        let release = Kind::Release { token: 9 };
        assert!(matches!(reply(release, Reply::Released { key: b"k" }), Step::Done(Outcome::Released)));
        let not_holder = Reply::Error { op: Some(Op::Release), key: Some(b"k"), code: ErrorCode::NotHolder };
        assert!(matches!(reply(release, not_holder), Step::Done(Outcome::NotHeld)));
        let extend = Kind::Extend { token: 9, lease_ms: 1_000 };
        assert!(matches!(reply(extend, Reply::Extended { key: b"k", token: 9 }), Step::Done(Outcome::Extended)));
        let wrong = reply(extend, Reply::Extended { key: b"k", token: 8 });
        assert!(matches!(
            wrong,
            Step::Done(Outcome::Failed(Error::Protocol(ProtocolError::WrongToken { sent: 9, received: 8 })))
        ));
        let not_holder = Reply::Error { op: Some(Op::Extend), key: Some(b"k"), code: ErrorCode::NotHolder };
        assert!(matches!(reply(extend, not_holder), Step::Done(Outcome::Failed(Error::Server(ErrorCode::NotHolder)))));
    }

    #[test]
    fn shutting_down_is_retried_within_the_limit_except_by_a_try_once_acquire() {
        let start = Instant::now();
        let shutting_down = |op| Reply::Error { op: Some(op), key: Some(b"k"), code: ErrorCode::ShuttingDown };
        let mut acquire = operation(Kind::Acquire { lease_ms: 10_000, wait_ms: 5_000, try_once: false }, start, 2);
        let step = acquire.on_reply(&shutting_down(Op::Acquire), start, &POLICY);
        assert!(matches!(step, Step::RetryAt(at) if at == start + POLICY.retry_interval), "{step:?}");
        let mut buffer = Vec::new();
        acquire.encode(start + Duration::from_secs(2), &mut buffer);
        assert_eq!(buffer, b"A k 10 3\n", "sent again with the wait it has left");
        let late = start + Duration::from_secs(5);
        let step = acquire.on_unsent(Unsent::NoConnection, late, &POLICY);
        assert!(matches!(step, Step::Done(Outcome::NoConnection { shutting_down: true, .. })), "{step:?}");
        let try_once = Kind::Acquire { lease_ms: 10_000, wait_ms: 1, try_once: true };
        let step = operation(try_once, start, 2).on_reply(&shutting_down(Op::Acquire), start, &POLICY);
        assert!(matches!(step, Step::Done(Outcome::Failed(Error::Server(ErrorCode::ShuttingDown)))), "{step:?}");
        let mut release = operation(Kind::Release { token: 9 }, start, 2);
        assert!(matches!(release.on_reply(&shutting_down(Op::Release), start, &POLICY), Step::RetryAt(_)));
        let step = release.on_unsent(Unsent::NoConnection, start + POLICY.retry_for, &POLICY);
        assert!(matches!(step, Step::Done(Outcome::NoConnection { shutting_down: true, .. })), "{step:?}");
        let mut refused = operation(ACQUIRE, start, 1);
        let step = refused.on_cut(&Cut::Refused(ErrorCode::ShuttingDown), start, &POLICY);
        assert!(matches!(step, Step::RetryAt(_)), "a stopping server's refusal waits for a connection: {step:?}");
    }

    #[test]
    fn time_on_a_silent_connection_counts_against_the_connect_limit() {
        let start = Instant::now();
        let mut ping = Operation::new(Kind::Ping, Arc::from(&b""[..]), start, 1, &POLICY, None);
        let silence = Duration::from_secs(2);
        let mut now = start;
        let mut rounds = 0;
        let outcome = loop {
            // It goes out on a connection that turns out silent, and is cut.
            ping.went_out(now);
            now += silence;
            rounds += 1;
            match ping.on_cut(&Cut::Silent(silence), now, &POLICY) {
                Step::RetryAt(_) => {}
                Step::Done(outcome) => break outcome,
                other => panic!("{other:?}"),
            }
        };
        assert!(
            matches!(outcome, Outcome::NoConnection { waited, .. } if waited >= POLICY.connect_limit),
            "{outcome:?}"
        );
        assert_eq!(rounds, 5, "the connect limit of 10 s after five silences of 2 s");
    }

    #[test]
    fn a_probe_cut_off_is_never_sent_again_but_a_release_is() {
        let now = Instant::now();
        let mut probe = Operation::probe(now, &POLICY);
        assert_eq!(line(&probe, now), "P\n");
        assert!(probe.abandoned());
        assert!(probe.completion.is_none());
        let step = probe.on_cut(&Cut::Io, now, &POLICY);
        assert!(!matches!(step, Step::Done(_)), "the router drops it when it would go again: {step:?}");
        assert!(!operation(Kind::Release { token: 5 }, now, 1).abandoned());
    }

    #[test]
    fn only_a_request_whose_caller_gave_up_is_abandoned_and_a_release_never_is() {
        let now = Instant::now();
        let acquire = Kind::Acquire { lease_ms: 1_000, wait_ms: 0, try_once: false };
        let request = |kind, caller| Operation::new(kind, Arc::from(&b"k"[..]), now, 1, &POLICY, caller);
        assert!(!request(acquire, Some(TestCaller(false))).abandoned());
        assert!(request(acquire, Some(TestCaller(true))).abandoned());
        assert!(request(Kind::Inspect, Some(TestCaller(true))).abandoned());
        assert!(
            !request(Kind::Release { token: 7 }, Some(TestCaller(true))).abandoned(),
            "a release still frees the key"
        );
        assert!(!request(Kind::Release { token: 7 }, None).abandoned());
        assert!(!request(acquire, None).abandoned(), "only a connection's own ping goes without a caller");
        assert!(Operation::probe(now, &POLICY).abandoned());
    }

    #[test]
    fn redirects_are_followed_up_to_the_limit() {
        let now = Instant::now();
        let mut acquire = operation(ACQUIRE, now, 1);
        let moved = Reply::Moved { op: Op::Acquire, key: b"k", active: Some(b"10.0.0.2:7700") };
        assert!(matches!(acquire.on_reply(&moved, now, &POLICY), Step::Redirect));
        assert!(matches!(acquire.on_reply(&moved, now, &POLICY), Step::Redirect));
        assert!(matches!(acquire.on_reply(&moved, now, &POLICY), Step::Done(Outcome::Failed(Error::NoActive))));
    }

    #[test]
    fn no_active_known_is_retried_for_the_retry_period() {
        let start = Instant::now();
        let mut acquire = operation(Kind::Acquire { lease_ms: 1_000, wait_ms: 0, try_once: false }, start, 1);
        let moved = Reply::Moved { op: Op::Acquire, key: b"k", active: None };
        assert!(matches!(acquire.on_reply(&moved, start, &POLICY), Step::RetryAt(_)));
        let late = start + POLICY.retry_for;
        assert!(matches!(acquire.on_reply(&moved, late, &POLICY), Step::Done(Outcome::Failed(Error::NoActive))));
        let mut acquire = operation(ACQUIRE, start, 1);
        assert!(matches!(acquire.on_unsent(Unsent::ActiveUnreachable, start, &POLICY), Step::RetryAt(_)));
    }
}
