//! A record of what lock clients saw, and a checker of the promises of docs/protocol.md
//! §1 and §2 against it.
//!
//! During a run, clients note every request they send ([`History::send`]),
//! every reply ([`History::reply`]), the evidence that a node has read a
//! request ([`History::received`]), and every write they make to a fenced
//! resource ([`History::write`]); the run declares the failover windows
//! ([`History::open_window`]). Times are taken from one monotonic clock.
//! Afterwards [`check`] looks at each key on its own.
//!
//! # What the checker may conclude, and why
//!
//! The client cannot see when the server grants, releases or expires; it
//! only sees when it sent a request and when the reply came. Every rule is
//! therefore stated so that it holds for a correct server whatever the real
//! server-side times were:
//!
//! - A holder's **interval** runs from the moment its grant reply arrived to
//!   the earliest of: the moment it *sent* its release, and its lease end as
//!   the client computes it (the acquire's send time plus the lease, less a
//!   small slack for the server's millisecond clock; a successful extend moves
//!   it to the extend's send time plus the new lease). The release's *send*
//!   time, not its reply, ends the interval: a correct server may grant the
//!   next waiter as soon as the release arrives, before the release's reply
//!   reaches its sender, while the releasing client stops using the resource
//!   once it sends the release. The server's own view of the grant contains
//!   this interval, so two intervals of one key never overlap on a server that
//!   keeps mutual exclusion.
//! - **Tokens**: grant B is surely later than grant A if A's reply arrived
//!   before B's acquire was sent, or if A's interval ended before B's began;
//!   then B's token must be greater (docs/protocol.md §2, guarantee 2). No token is ever
//!   granted twice (guarantee 1).
//! - **FIFO**: two acquires of one key sent on raw connections to one node,
//!   both granted by that node, where the node had surely read the first (a
//!   later reply on its connection had arrived) before the second was sent:
//!   the first was queued first, so it was granted first, with the smaller
//!   token. Acquires through the official client are left out: it may move a
//!   request to another connection or node, which resets its place.
//! - **Answers**: every request gets exactly one reply, unless its connection
//!   was cut; a request answered `T` is never granted.
//! - **Fencing**: a write a fenced resource refused must come from a holder
//!   that no longer held the lock by the rules above (its lease ran out), or
//!   from a failover window; accepted writes of a key never go down in token.
//!
//! Failover windows (docs/protocol.md §5 allows two actives and lost grants there)
//! excuse an overlap, a token order or a FIFO order, or a refused write, when
//! the span of a holder involved (from its acquire's send to its interval's
//! end) meets a window: such findings are counted apart, by window label.
//! Duplicate tokens and broken answers are never excused.
#![allow(dead_code)]

pub mod fenced;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The server counts leases in whole milliseconds from its own clock; a
/// lease may end up to this long before the client's exact computation.
pub const LEASE_SLACK: Duration = Duration::from_millis(5);

/// Identifies one request in a [`History`].
pub type RequestId = usize;

/// A request as the client sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `A <key> <lease> <wait>`; `wait: None` waits without limit.
    Acquire { lease: Duration, wait: Option<Duration> },
    /// `R <key> <token>`.
    Release { token: u64 },
    /// `X <key> <token> <lease>`.
    Extend { token: u64, lease: Duration },
}

/// What came back for a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Granted {
        token: u64,
    },
    TimedOut,
    Released,
    /// `E R|X <key> not-holder`: the grant was already gone.
    NotHeld,
    Extended {
        token: u64,
    },
    /// `M`: the node was not active.
    Redirected,
    /// An `E` reply or a client error, as text.
    Error(String),
    /// The connection broke before a reply; no reply can follow.
    Cut,
}

/// How a request reached the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Through the official client, which picks connections and nodes itself.
    Client,
    /// On one raw connection to one node, with at most one request per
    /// (op, key) in flight on it.
    Connection { node: usize, connection: usize },
}

/// One reply, with when it arrived and which node sent it (if known).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub at: Duration,
    pub outcome: Outcome,
    pub node: Option<usize>,
}

/// One request and everything seen about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub id: RequestId,
    pub key: String,
    pub op: Op,
    pub route: Route,
    pub sent: Duration,
    /// When the client first had evidence that the node had read it.
    pub received: Option<Duration>,
    pub replies: Vec<Reply>,
}

/// A write to a fenced resource made with a grant's token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    pub key: String,
    pub token: u64,
    pub at: Duration,
    pub accepted: bool,
}

/// A period in which docs/protocol.md §5 allows two actives and lost grants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    pub label: String,
    pub start: Duration,
    /// `None` while the window is open; [`History::record`] closes it at the
    /// end of the run.
    pub end: Option<Duration>,
}

impl Window {
    fn meets(&self, span: Span, run_end: Duration) -> bool {
        span.start <= self.end.unwrap_or(run_end) && span.end >= self.start
    }
}

#[derive(Default)]
struct Log {
    requests: Vec<Request>,
    grants: usize,
    writes: Vec<Write>,
    windows: Vec<Window>,
}

/// The shared recorder of a run; cheap to clone, safe to use from every
/// client thread.
#[derive(Clone)]
pub struct History {
    origin: Instant,
    log: Arc<Mutex<Log>>,
}

impl Default for History {
    fn default() -> History {
        History::new()
    }
}

impl History {
    pub fn new() -> History {
        History { origin: Instant::now(), log: Arc::new(Mutex::new(Log::default())) }
    }

    /// Time since the history began.
    pub fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    fn log(&self) -> MutexGuard<'_, Log> {
        // A panicking client thread must not hide what the others recorded.
        self.log.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Notes a request as sent now. Call it just before sending, so that the
    /// noted time is no later than the real one.
    pub fn send(&self, key: &str, op: Op, route: Route) -> RequestId {
        let sent = self.now();
        let mut log = self.log();
        let id = log.requests.len();
        log.requests.push(Request { id, key: key.to_string(), op, route, sent, received: None, replies: Vec::new() });
        id
    }

    /// Notes that the node has surely read request `id` (a reply to a later
    /// request on its connection arrived). Call it after reading that reply.
    pub fn received(&self, id: RequestId) {
        let at = self.now();
        let mut log = self.log();
        let request = &mut log.requests[id];
        request.received.get_or_insert(at);
    }

    /// Notes a reply to request `id`. Call it just after the reply arrived.
    pub fn reply(&self, id: RequestId, outcome: Outcome, node: Option<usize>) {
        let at = self.now();
        let mut log = self.log();
        if matches!(outcome, Outcome::Granted { .. }) {
            log.grants += 1;
        }
        log.requests[id].replies.push(Reply { at, outcome, node });
    }

    /// The first reply to request `id` other than a cut, if any came.
    pub fn outcome(&self, id: RequestId) -> Option<Outcome> {
        let log = self.log();
        log.requests[id].replies.iter().map(|reply| reply.outcome.clone()).find(|outcome| *outcome != Outcome::Cut)
    }

    /// Grant replies noted so far.
    pub fn grant_count(&self) -> usize {
        self.log().grants
    }

    /// Notes a write to a fenced resource, made now.
    pub fn write(&self, key: &str, token: u64, accepted: bool) {
        let at = self.now();
        self.log().writes.push(Write { key: key.to_string(), token, at, accepted });
    }

    /// Opens a failover window now; close it with [`close_window`](Self::close_window).
    pub fn open_window(&self, label: &str) -> usize {
        let start = self.now();
        let mut log = self.log();
        log.windows.push(Window { label: label.to_string(), start, end: None });
        log.windows.len() - 1
    }

    /// Opens a window that began at `start` (a time from [`now`](Self::now)).
    pub fn open_window_at(&self, label: &str, start: Duration) -> usize {
        let mut log = self.log();
        log.windows.push(Window { label: label.to_string(), start, end: None });
        log.windows.len() - 1
    }

    pub fn close_window(&self, window: usize) {
        let end = self.now();
        let mut log = self.log();
        let window = &mut log.windows[window];
        window.end.get_or_insert(end);
    }

    /// Requests noted so far.
    pub fn request_count(&self) -> usize {
        self.log().requests.len()
    }

    /// Everything recorded, with the windows still open closed now.
    pub fn record(&self) -> Record {
        let end = self.now();
        let log = self.log();
        let mut windows = log.windows.clone();
        for window in &mut windows {
            window.end.get_or_insert(end);
        }
        Record { requests: log.requests.clone(), writes: log.writes.clone(), windows, end }
    }
}

/// A finished history, as [`check`] reads it. Tests build these by hand.
#[derive(Clone, Debug, Default)]
pub struct Record {
    pub requests: Vec<Request>,
    pub writes: Vec<Write>,
    pub windows: Vec<Window>,
    pub end: Duration,
}

/// A closed time interval, `start <= end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub start: Duration,
    pub end: Duration,
}

/// Why a holder's interval ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// It sent its release.
    Released,
    /// Its lease ran out, as the client computes it, before it released.
    LeaseRanOut,
    /// An extend found the grant gone or failed, so the client stopped.
    ExtendFailed,
    /// The run ended while it held the lock.
    RunEnded,
}

/// A grant as the client saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holding {
    pub request: RequestId,
    pub key: String,
    pub token: u64,
    /// The acquire's send time: the earliest the server can have granted it.
    pub sent: Duration,
    /// When the grant reply arrived: the start of the interval.
    pub granted: Duration,
    /// The end of the interval (may be before `granted`: an empty interval,
    /// for a grant that arrived after the lease the client computes).
    pub end: Duration,
    pub ended_by: End,
    /// The reply to its first release, if it sent one.
    pub release: Option<Outcome>,
    pub route: Route,
}

impl Holding {
    fn is_empty(&self) -> bool {
        self.end <= self.granted
    }

    /// From the acquire's send to the end of the interval: every moment at
    /// which the grant's fate was being decided.
    fn span(&self) -> Span {
        Span { start: self.sent, end: self.end.max(self.granted) }
    }
}

/// One rule broken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Two holders of `key` held it at the same time.
    Overlap { key: String, first: RequestId, second: RequestId, from: Duration, to: Duration },
    /// A surely later grant of `key` has a token that is not greater.
    TokenOrder { key: String, earlier: RequestId, earlier_token: u64, later: RequestId, later_token: u64 },
    /// One token granted to two requests.
    DuplicateToken { token: u64, first: RequestId, second: RequestId },
    /// Of two acquires queued on one node, the later one was granted first.
    FifoOrder { key: String, node: usize, queued_first: RequestId, granted_first: RequestId },
    /// A request got more than one reply.
    AnsweredTwice { request: RequestId, replies: usize },
    /// A request got no reply and its connection was not cut.
    Unanswered { request: RequestId },
    /// A request answered `T` was also granted.
    GrantAfterTimeout { request: RequestId },
    /// A fenced resource refused a write from a holder that still held the
    /// key by the client's reckoning.
    RefusedLiveHolder { key: String, token: u64, at: Duration, holder: Option<RequestId> },
    /// A fenced resource accepted a token lower than one it had accepted.
    AcceptedOutOfOrder { key: String, token: u64, after: u64 },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Overlap { key, first, second, from, to } => {
                write!(f, "{key}: holders of requests {first} and {second} overlap from {from:?} to {to:?} (run time)")
            }
            Violation::TokenOrder { key, earlier, earlier_token, later, later_token } => write!(
                f,
                "{key}: request {later} was granted token {later_token} after request {earlier} had token {earlier_token}"
            ),
            Violation::DuplicateToken { token, first, second } => {
                write!(f, "token {token} was granted to requests {first} and {second}")
            }
            Violation::FifoOrder { key, node, queued_first, granted_first } => write!(
                f,
                "{key}: node {node} granted request {granted_first} before request {queued_first}, which it had read first"
            ),
            Violation::AnsweredTwice { request, replies } => write!(f, "request {request} got {replies} replies"),
            Violation::Unanswered { request } => write!(f, "request {request} got no reply on a connection still open"),
            Violation::GrantAfterTimeout { request } => write!(f, "request {request} was answered T and granted"),
            Violation::RefusedLiveHolder { key, token, at, holder } => write!(
                f,
                "{key}: the fenced resource refused token {token} at {at:?} from a holder ({holder:?}) that still held the key"
            ),
            Violation::AcceptedOutOfOrder { key, token, after } => {
                write!(f, "{key}: the fenced resource accepted token {token} after {after}")
            }
        }
    }
}

/// Counters over the whole record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub requests: usize,
    pub acquires: usize,
    pub grants: usize,
    pub timeouts: usize,
    pub releases: usize,
    pub extends: usize,
    /// Releases or extends answered `not-holder` while the client's lease
    /// still ran: grants the cluster lost.
    pub grants_lost: usize,
    /// Holders whose lease ran out, as the client computes it, before they
    /// released.
    pub lease_ran_out: usize,
    pub redirects: usize,
    pub errors: usize,
    pub cuts: usize,
    pub writes_accepted: usize,
    /// Writes refused by a fenced resource: stale holders it kept out.
    pub writes_refused: usize,
    /// Pairs of FIFO-comparable acquires checked.
    pub fifo_pairs: usize,
}

/// What [`check`] found.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Rules broken outside every failover window (or never excusable).
    pub violations: Vec<Violation>,
    /// Findings inside failover windows, with the label of a window met.
    pub excused: Vec<(String, Violation)>,
    pub counts: Counts,
}

impl Report {
    /// Excused findings by window label.
    pub fn excused_by_label(&self) -> BTreeMap<String, usize> {
        let mut by_label = BTreeMap::new();
        for (label, _) in &self.excused {
            *by_label.entry(label.clone()).or_default() += 1;
        }
        by_label
    }

    /// The first `limit` violations, one a line.
    pub fn describe_violations(&self, limit: usize) -> String {
        let mut text: Vec<String> = self.violations.iter().take(limit).map(|v| format!("  {v}")).collect();
        if self.violations.len() > limit {
            text.push(format!("  ... and {} more", self.violations.len() - limit));
        }
        text.join("\n")
    }
}

/// Where findings go: violations, or excused when a span involved meets a
/// failover window.
struct Findings<'a> {
    windows: &'a [Window],
    run_end: Duration,
    report: Report,
}

impl Findings<'_> {
    fn window_of(&self, span: Span) -> Option<&Window> {
        self.windows.iter().find(|window| window.meets(span, self.run_end))
    }

    fn in_window(&self, holding: &Holding) -> bool {
        self.window_of(holding.span()).is_some()
    }

    fn add(&mut self, violation: Violation, spans: &[Span]) {
        match spans.iter().find_map(|span| self.window_of(*span)) {
            Some(window) => self.report.excused.push((window.label.clone(), violation)),
            None => self.report.violations.push(violation),
        }
    }

    fn never_excused(&mut self, violation: Violation) {
        self.report.violations.push(violation);
    }
}

/// Checks every rule of the module documentation over `record`.
pub fn check(record: &Record) -> Report {
    let mut findings = Findings { windows: &record.windows, run_end: record.end, report: Report::default() };
    count_requests(record, &mut findings.report.counts);
    check_answers(record, &mut findings);
    let holdings = holdings(record, &mut findings.report.counts);
    let mut by_key: HashMap<&str, Vec<&Holding>> = HashMap::new();
    for holding in &holdings {
        by_key.entry(holding.key.as_str()).or_default().push(holding);
    }
    let mut keys: Vec<&str> = by_key.keys().copied().collect();
    keys.sort_unstable();
    for key in keys {
        let key_holdings = &by_key[key];
        check_overlaps(key_holdings, &mut findings);
        check_token_order(key_holdings, &mut findings);
        check_fifo(record, key_holdings, &mut findings);
    }
    check_unique_tokens(&holdings, &mut findings);
    check_writes(record, &holdings, &mut findings);
    findings.report
}

fn count_requests(record: &Record, counts: &mut Counts) {
    counts.requests = record.requests.len();
    for request in &record.requests {
        match request.op {
            Op::Acquire { .. } => counts.acquires += 1,
            Op::Release { .. } => counts.releases += 1,
            Op::Extend { .. } => counts.extends += 1,
        }
        for reply in &request.replies {
            match reply.outcome {
                Outcome::Granted { .. } => counts.grants += 1,
                Outcome::TimedOut => counts.timeouts += 1,
                Outcome::Redirected => counts.redirects += 1,
                Outcome::Error(_) => counts.errors += 1,
                Outcome::Cut => counts.cuts += 1,
                Outcome::Released | Outcome::NotHeld | Outcome::Extended { .. } => {}
            }
        }
    }
}

fn check_answers(record: &Record, findings: &mut Findings) {
    for request in &record.requests {
        let replies = &request.replies;
        if replies.is_empty() {
            findings.never_excused(Violation::Unanswered { request: request.id });
            continue;
        }
        // A cut after a reply is the connection ending later, not a reply.
        let answers = replies.iter().filter(|reply| reply.outcome != Outcome::Cut).count();
        if answers > 1 {
            findings.never_excused(Violation::AnsweredTwice { request: request.id, replies: answers });
        }
        let timed_out = replies.iter().any(|reply| reply.outcome == Outcome::TimedOut);
        let granted = replies.iter().any(|reply| matches!(reply.outcome, Outcome::Granted { .. }));
        if timed_out && granted {
            findings.never_excused(Violation::GrantAfterTimeout { request: request.id });
        }
    }
}

/// The grants of the record with their intervals.
fn holdings(record: &Record, counts: &mut Counts) -> Vec<Holding> {
    // Releases and extends of each grant, in send order (ids are in send order).
    let mut follow_ups: HashMap<(&str, u64), Vec<&Request>> = HashMap::new();
    for request in &record.requests {
        if let Op::Release { token } | Op::Extend { token, .. } = request.op {
            follow_ups.entry((request.key.as_str(), token)).or_default().push(request);
        }
    }
    let mut holdings = Vec::new();
    for request in &record.requests {
        let Op::Acquire { lease, .. } = request.op else { continue };
        let Some((granted, token)) = request.replies.iter().find_map(|reply| match reply.outcome {
            Outcome::Granted { token } => Some((reply.at, token)),
            _ => None,
        }) else {
            continue;
        };
        let mut lease_end = lease_end(request.sent, lease);
        let mut end = None;
        let mut release = None;
        for follow_up in follow_ups.get(&(request.key.as_str(), token)).into_iter().flatten() {
            if follow_up.sent < granted {
                continue;
            }
            let outcome = follow_up.replies.iter().map(|reply| reply.outcome.clone()).find(|o| *o != Outcome::Cut);
            let lease_running = follow_up.sent < lease_end;
            if matches!(outcome, Some(Outcome::NotHeld)) && lease_running {
                counts.grants_lost += 1;
            }
            match follow_up.op {
                Op::Release { .. } => {
                    if follow_up.sent < lease_end {
                        end = Some((follow_up.sent, End::Released));
                    }
                    release = Some(outcome.unwrap_or(Outcome::Cut));
                    break;
                }
                Op::Extend { lease, .. } => {
                    if !lease_running {
                        continue;
                    }
                    if matches!(outcome, Some(Outcome::Extended { .. })) {
                        lease_end = self::lease_end(follow_up.sent, lease);
                    } else {
                        end = Some((follow_up.sent, End::ExtendFailed));
                        break;
                    }
                }
                Op::Acquire { .. } => unreachable!("only releases and extends are follow-ups"),
            }
        }
        let (end, ended_by) = match end {
            Some(end) => end,
            None if lease_end < record.end => (lease_end, End::LeaseRanOut),
            None => (record.end, End::RunEnded),
        };
        if ended_by == End::LeaseRanOut {
            counts.lease_ran_out += 1;
        }
        holdings.push(Holding {
            request: request.id,
            key: request.key.clone(),
            token,
            sent: request.sent,
            granted,
            end,
            ended_by,
            release,
            route: request.route,
        });
    }
    holdings
}

fn lease_end(sent: Duration, lease: Duration) -> Duration {
    (sent + lease).saturating_sub(LEASE_SLACK)
}

/// Overlapping intervals of one key. Only non-empty intervals can overlap.
/// Sweeping by start, each interval is compared with the one that ends last
/// among those before it, once among the holders outside every window (a
/// violation if it is outside too) and once among all (an excused finding
/// otherwise): at most one finding per interval.
fn check_overlaps(holdings: &[&Holding], findings: &mut Findings) {
    let mut sorted: Vec<&Holding> = holdings.iter().copied().filter(|holding| !holding.is_empty()).collect();
    sorted.sort_by_key(|holding| (holding.granted, holding.end));
    let mut latest_outside: Option<&Holding> = None;
    let mut latest: Option<&Holding> = None;
    for holding in sorted {
        let outside = !findings.in_window(holding);
        let before = match (latest_outside, latest) {
            (Some(before), _) if outside && holding.granted < before.end => Some(before),
            (_, Some(before)) if holding.granted < before.end => Some(before),
            _ => None,
        };
        if let Some(before) = before {
            let violation = Violation::Overlap {
                key: holding.key.clone(),
                first: before.request,
                second: holding.request,
                from: holding.granted,
                to: before.end.min(holding.end),
            };
            findings.add(violation, &[before.span(), holding.span()]);
        }
        if latest.is_none_or(|before| holding.end > before.end) {
            latest = Some(holding);
        }
        if outside && latest_outside.is_none_or(|before| holding.end > before.end) {
            latest_outside = Some(holding);
        }
    }
}

/// Surely ordered grants of one key with tokens out of order. For each
/// grant, the greatest token among the grants surely before it is found
/// through a sorted prefix maximum, by each of the two orders; as for
/// overlaps, once among the holders outside every window and once among all.
fn check_token_order(holdings: &[&Holding], findings: &mut Findings) {
    let outside: Vec<&Holding> = holdings.iter().copied().filter(|holding| !findings.in_window(holding)).collect();
    let orders_outside = SureOrders::new(&outside);
    let orders = SureOrders::new(holdings);
    for later in holdings {
        let earlier = if findings.in_window(later) { None } else { orders_outside.greatest_before(later) };
        let earlier = earlier.filter(|earlier| earlier.token >= later.token).or_else(|| orders.greatest_before(later));
        if let Some(earlier) = earlier
            && earlier.token >= later.token
            && earlier.request != later.request
        {
            let violation = Violation::TokenOrder {
                key: later.key.clone(),
                earlier: earlier.request,
                earlier_token: earlier.token,
                later: later.request,
                later_token: later.token,
            };
            findings.add(violation, &[earlier.span(), later.span()]);
        }
    }
}

/// The grants surely before a grant, by the two orders of the module
/// documentation.
struct SureOrders<'a> {
    /// Grants by the time their reply arrived, to compare with a later
    /// acquire's send time.
    by_reply: PrefixMax<'a>,
    /// Non-empty grants by the end of their interval, to compare with a later
    /// interval's start.
    by_end: PrefixMax<'a>,
}

impl<'a> SureOrders<'a> {
    fn new(holdings: &[&'a Holding]) -> SureOrders<'a> {
        SureOrders {
            by_reply: PrefixMax::new(holdings.iter().map(|holding| (holding.granted, *holding))),
            by_end: PrefixMax::new(
                holdings.iter().filter(|holding| !holding.is_empty()).map(|holding| (holding.end, *holding)),
            ),
        }
    }

    /// The grant with the greatest token among those surely before `later`.
    fn greatest_before(&self, later: &Holding) -> Option<&'a Holding> {
        let by_reply = self.by_reply.before(later.sent);
        let by_end = if later.is_empty() { None } else { self.by_end.before(later.granted) };
        match (by_reply, by_end) {
            (Some(a), Some(b)) => Some(if b.token > a.token { b } else { a }),
            (a, b) => a.or(b),
        }
    }
}

/// Holdings sorted by a time, with the holding of the greatest token among
/// each prefix.
struct PrefixMax<'a> {
    times: Vec<Duration>,
    best: Vec<&'a Holding>,
}

impl<'a> PrefixMax<'a> {
    fn new(items: impl Iterator<Item = (Duration, &'a Holding)>) -> PrefixMax<'a> {
        let mut items: Vec<(Duration, &Holding)> = items.collect();
        items.sort_by_key(|(time, _)| *time);
        let mut best: Vec<&Holding> = Vec::with_capacity(items.len());
        for (_, holding) in &items {
            let greatest = match best.last() {
                Some(last) if last.token >= holding.token => *last,
                _ => *holding,
            };
            best.push(greatest);
        }
        PrefixMax { times: items.into_iter().map(|(time, _)| time).collect(), best }
    }

    /// The holding with the greatest token among those strictly before `at`.
    fn before(&self, at: Duration) -> Option<&'a Holding> {
        let count = self.times.partition_point(|time| *time < at);
        count.checked_sub(1).map(|last| self.best[last])
    }
}

/// FIFO among acquires on raw connections to one node that were both
/// granted by it (see the module documentation).
fn check_fifo(record: &Record, holdings: &[&Holding], findings: &mut Findings) {
    let mut by_node: BTreeMap<usize, Vec<&Holding>> = BTreeMap::new();
    for holding in holdings {
        if let Route::Connection { node, .. } = holding.route {
            by_node.entry(node).or_default().push(holding);
        }
    }
    for (node, mut queued) in by_node {
        queued.sort_by_key(|holding| holding.sent);
        for (index, first) in queued.iter().enumerate() {
            let Some(read) = record.requests[first.request].received else { continue };
            for second in &queued[index + 1..] {
                if read >= second.sent {
                    continue;
                }
                findings.report.counts.fifo_pairs += 1;
                if first.token > second.token {
                    let violation = Violation::FifoOrder {
                        key: first.key.clone(),
                        node,
                        queued_first: first.request,
                        granted_first: second.request,
                    };
                    findings.add(violation, &[first.span(), second.span()]);
                }
            }
        }
    }
}

fn check_unique_tokens(holdings: &[Holding], findings: &mut Findings) {
    let mut seen: HashMap<u64, RequestId> = HashMap::new();
    for holding in holdings {
        if let Some(first) = seen.insert(holding.token, holding.request) {
            findings.never_excused(Violation::DuplicateToken { token: holding.token, first, second: holding.request });
        }
    }
}

/// Accepted writes in token order per key, and every refused write
/// explained by a lease that ran out or a failover window.
fn check_writes(record: &Record, holdings: &[Holding], findings: &mut Findings) {
    let by_grant: HashMap<(&str, u64), &Holding> =
        holdings.iter().map(|holding| ((holding.key.as_str(), holding.token), holding)).collect();
    let mut last_accepted: HashMap<&str, u64> = HashMap::new();
    for write in &record.writes {
        let key = write.key.as_str();
        if write.accepted {
            findings.report.counts.writes_accepted += 1;
            if let Some(&after) = last_accepted.get(key)
                && write.token < after
            {
                findings.never_excused(Violation::AcceptedOutOfOrder {
                    key: key.to_string(),
                    token: write.token,
                    after,
                });
            }
            last_accepted.insert(key, write.token);
            continue;
        }
        findings.report.counts.writes_refused += 1;
        let Some(holder) = by_grant.get(&(key, write.token)) else {
            findings.never_excused(Violation::RefusedLiveHolder {
                key: key.to_string(),
                token: write.token,
                at: write.at,
                holder: None,
            });
            continue;
        };
        if write.at >= holder.end {
            // Its interval had ended (the lease ran out, or an extend found
            // the grant gone) and it wrote all the same: fencing kept out a
            // stale holder, which is its job.
            continue;
        }
        // The holder of the newer token that the resource had accepted is
        // involved too: its grant may be the one made in a window.
        let mut spans = vec![holder.span()];
        if let Some(newer) = last_accepted.get(key).and_then(|token| by_grant.get(&(key, *token))) {
            spans.push(newer.span());
        }
        let violation = Violation::RefusedLiveHolder {
            key: key.to_string(),
            token: write.token,
            at: write.at,
            holder: Some(holder.request),
        };
        findings.add(violation, &spans);
    }
}
