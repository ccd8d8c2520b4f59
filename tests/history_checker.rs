//! The history checker of the reliability tests, on hand-made histories
//! that break each rule once, so that a checker that cannot fail would
//! fail here.

mod history;

use std::time::Duration;

use history::fenced::{FencedResource, WriteOutcome};
use history::{History, Op, Outcome, Record, Reply, Request, RequestId, Route, Violation, Window, check};

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

const LONG_LEASE_MS: u64 = 60_000;

/// Builds records request by request, with times in milliseconds.
#[derive(Default)]
struct Builder {
    record: Record,
}

impl Builder {
    fn request(&mut self, key: &str, op: Op, route: Route, sent: u64) -> RequestId {
        let id = self.record.requests.len();
        let request =
            Request { id, key: key.to_string(), op, route, sent: ms(sent), received: None, replies: Vec::new() };
        self.record.requests.push(request);
        self.record.end = self.record.end.max(ms(sent));
        id
    }

    fn reply(&mut self, id: RequestId, at: u64, outcome: Outcome) {
        self.record.requests[id].replies.push(Reply { at: ms(at), outcome, node: None });
        self.record.end = self.record.end.max(ms(at));
    }

    fn acquire_on(&mut self, key: &str, route: Route, sent: u64, lease_ms: u64) -> RequestId {
        self.request(key, Op::Acquire { lease: ms(lease_ms), wait: Some(ms(1000)) }, route, sent)
    }

    fn acquire(&mut self, key: &str, sent: u64, lease_ms: u64) -> RequestId {
        self.acquire_on(key, Route::Client, sent, lease_ms)
    }

    fn release(&mut self, key: &str, token: u64, sent: u64, answered: u64, outcome: Outcome) -> RequestId {
        let id = self.request(key, Op::Release { token }, Route::Client, sent);
        self.reply(id, answered, outcome);
        id
    }

    /// A grant of `key` asked at `sent`, granted at `granted` with `token`,
    /// released at `released` (answered 1 ms later).
    fn holder(&mut self, key: &str, token: u64, sent: u64, granted: u64, released: u64) -> RequestId {
        let id = self.acquire(key, sent, LONG_LEASE_MS);
        self.reply(id, granted, Outcome::Granted { token });
        self.release(key, token, released, released + 1, Outcome::Released);
        id
    }

    fn window(&mut self, label: &str, start: u64, end: u64) {
        self.record.windows.push(Window { label: label.to_string(), start: ms(start), end: Some(ms(end)) });
    }

    fn write(&mut self, key: &str, token: u64, at: u64, accepted: bool) {
        self.record.writes.push(history::Write { key: key.to_string(), token, at: ms(at), accepted });
    }

    fn clone_record(&self, end: u64) -> Record {
        let mut record = self.record.clone();
        record.end = record.end.max(ms(end));
        record
    }

    fn finish(mut self, end: u64) -> Record {
        self.record.end = self.record.end.max(ms(end));
        self.record
    }
}

fn only_violation(record: &Record) -> Violation {
    let report = check(record);
    assert_eq!(report.violations.len(), 1, "one violation expected, got {:#?}", report.violations);
    report.violations[0].clone()
}

#[test]
fn a_clean_history_has_no_violation_and_is_counted() {
    let mut history = Builder::default();
    history.holder("k", 10, 0, 1, 5);
    history.holder("k", 11, 6, 7, 9);
    let timed_out = history.acquire("k", 8, 1000);
    history.reply(timed_out, 20, Outcome::TimedOut);
    history.holder("other", 3, 0, 2, 30);
    let report = check(&history.finish(40));
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert!(report.excused.is_empty());
    assert_eq!(report.counts.acquires, 4);
    assert_eq!(report.counts.grants, 3);
    assert_eq!(report.counts.timeouts, 1);
    assert_eq!(report.counts.releases, 3);
    assert_eq!(report.counts.grants_lost, 0);
}

#[test]
fn two_holders_at_once_are_an_overlap() {
    let mut history = Builder::default();
    let first = history.holder("k", 10, 0, 10, 50);
    let second = history.holder("k", 11, 20, 30, 60);
    match only_violation(&history.finish(100)) {
        Violation::Overlap { key, first: a, second: b, from, to } => {
            assert_eq!((key.as_str(), a, b), ("k", first, second));
            assert_eq!((from, to), (ms(30), ms(50)));
        }
        other => panic!("expected an overlap, got {other}"),
    }
}

#[test]
fn an_overlap_is_found_behind_a_longer_earlier_holder() {
    // The third holder overlaps the first, not the second, which ended
    // before it: the sweep must compare with the holder that ends last.
    let mut history = Builder::default();
    history.holder("k", 10, 0, 1, 100);
    history.holder("k", 11, 0, 2, 3);
    history.holder("k", 12, 40, 50, 60);
    let report = check(&history.finish(200));
    assert_eq!(report.violations.len(), 2, "{:#?}", report.violations);
    assert!(report.violations.iter().all(|violation| matches!(violation, Violation::Overlap { .. })));
}

#[test]
fn an_overlap_inside_a_failover_window_is_excused_under_its_label() {
    let mut history = Builder::default();
    history.holder("k", 10, 0, 10, 50);
    history.holder("k", 20, 20, 30, 60);
    history.window("kill -9", 25, 40);
    let report = check(&history.finish(100));
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert_eq!(report.excused_by_label().get("kill -9"), Some(&1));
}

#[test]
fn a_window_excuses_a_holder_that_held_through_it_even_if_the_overlap_is_later() {
    // The first holder's grant was lost in the window; the second was
    // granted after it. Their overlap starts after the window ended.
    let mut history = Builder::default();
    history.holder("k", 10, 0, 10, 500);
    history.holder("k", 20, 300, 310, 320);
    history.window("kill -9", 100, 200);
    let report = check(&history.finish(600));
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert_eq!(report.excused.len(), 1);
}

#[test]
fn a_window_does_not_excuse_holders_that_both_lived_outside_it() {
    let mut history = Builder::default();
    history.holder("k", 10, 0, 10, 50);
    history.holder("k", 11, 20, 30, 60);
    history.window("pause", 70, 80);
    assert!(matches!(only_violation(&history.finish(100)), Violation::Overlap { .. }));
}

#[test]
fn the_next_grant_may_arrive_before_the_release_reply() {
    // The release reached the server at 50 and the next waiter's grant was
    // sent at once; the releasing client read its reply only at 70.
    let mut history = Builder::default();
    let first = history.acquire("k", 0, LONG_LEASE_MS);
    history.reply(first, 10, Outcome::Granted { token: 10 });
    history.release("k", 10, 50, 70, Outcome::Released);
    history.holder("k", 11, 5, 55, 80);
    let report = check(&history.finish(100));
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
}

#[test]
fn a_lease_ends_the_interval_but_not_before_it_ran_out() {
    // Lease of 100 ms asked at 0: the client counts on it until 95 (slack).
    let mut history = Builder::default();
    let first = history.acquire("k", 0, 100);
    history.reply(first, 10, Outcome::Granted { token: 10 });
    history.holder("k", 11, 20, 120, 130);
    let report = check(&history.clone_record(200));
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert_eq!(report.counts.lease_ran_out, 1);

    // A holder granted while that lease still ran overlaps it.
    let mut history = Builder::default();
    let first = history.acquire("k", 0, 100);
    history.reply(first, 10, Outcome::Granted { token: 10 });
    let second = history.holder("k", 11, 60, 70, 80);
    let violation = only_violation(&history.finish(200));
    assert!(matches!(violation, Violation::Overlap { second: s, .. } if s == second), "{violation}");
}

#[test]
fn an_extend_moves_the_lease_end_and_a_failed_one_ends_the_interval() {
    let mut history = Builder::default();
    let first = history.acquire("k", 0, 100);
    history.reply(first, 10, Outcome::Granted { token: 10 });
    let extend = history.request("k", Op::Extend { token: 10, lease: ms(200) }, Route::Client, 80);
    history.reply(extend, 81, Outcome::Extended { token: 10 });
    history.holder("k", 11, 150, 200, 210);
    assert!(matches!(only_violation(&history.clone_record(300)), Violation::Overlap { .. }));

    let mut history = Builder::default();
    let first = history.acquire("k", 0, 100);
    history.reply(first, 10, Outcome::Granted { token: 10 });
    let extend = history.request("k", Op::Extend { token: 10, lease: ms(200) }, Route::Client, 80);
    history.reply(extend, 81, Outcome::NotHeld);
    history.holder("k", 11, 150, 200, 210);
    let report = check(&history.finish(300));
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert_eq!(report.counts.grants_lost, 1, "not-holder while the lease ran");
}

#[test]
fn a_later_grant_with_a_smaller_token_breaks_token_order() {
    // Reply of the first before the second was asked.
    let mut history = Builder::default();
    history.holder("k", 10, 0, 10, 20);
    history.holder("k", 9, 30, 40, 50);
    assert!(matches!(
        only_violation(&history.finish(60)),
        Violation::TokenOrder { earlier_token: 10, later_token: 9, .. }
    ));

    // Asked before the first was granted, but granted after the first
    // interval ended.
    let mut history = Builder::default();
    history.holder("k", 10, 0, 10, 20);
    history.holder("k", 9, 5, 30, 40);
    assert!(matches!(
        only_violation(&history.finish(60)),
        Violation::TokenOrder { earlier_token: 10, later_token: 9, .. }
    ));
}

#[test]
fn grants_with_no_sure_order_may_have_any_tokens() {
    // The second was asked before the first was granted, and was granted
    // (at 8) and released (at 9) before the first's grant arrived: it is the
    // earlier one, and its token is smaller. Nothing is wrong.
    let mut history = Builder::default();
    history.holder("k", 7, 0, 10, 20);
    history.holder("k", 6, 5, 8, 9);
    let report = check(&history.finish(30));
    assert!(report.violations.is_empty(), "{:#?}", report.violations);

    // The same with tokens swapped: the second is surely earlier, so its
    // token must be the smaller one.
    let mut history = Builder::default();
    history.holder("k", 6, 0, 10, 20);
    history.holder("k", 7, 5, 8, 9);
    assert!(matches!(only_violation(&history.finish(30)), Violation::TokenOrder { later_token: 6, .. }));
}

#[test]
fn a_token_granted_twice_is_never_excused() {
    let mut history = Builder::default();
    history.holder("a", 42, 0, 1, 2);
    history.holder("b", 42, 0, 1, 2);
    history.window("partition", 0, 10);
    assert!(matches!(only_violation(&history.finish(10)), Violation::DuplicateToken { token: 42, .. }));
}

#[test]
fn waiters_read_in_order_by_one_node_are_granted_in_that_order() {
    let route = |connection| Route::Connection { node: 0, connection };
    let mut history = Builder::default();
    let holder = history.acquire_on("q", route(0), 0, LONG_LEASE_MS);
    history.reply(holder, 1, Outcome::Granted { token: 10 });
    history.record.requests[holder].received = Some(ms(1));
    let first = history.acquire_on("q", route(1), 2, LONG_LEASE_MS);
    history.record.requests[first].received = Some(ms(3));
    let second = history.acquire_on("q", route(2), 4, LONG_LEASE_MS);
    history.record.requests[second].received = Some(ms(5));
    history.release("q", 10, 6, 7, Outcome::Released);
    // The node granted the second waiter first.
    history.reply(second, 8, Outcome::Granted { token: 11 });
    history.release("q", 11, 9, 10, Outcome::Released);
    history.reply(first, 11, Outcome::Granted { token: 12 });
    history.release("q", 12, 12, 13, Outcome::Released);
    let report = check(&history.clone_record(20));
    assert_eq!(report.counts.fifo_pairs, 3);
    assert_eq!(report.violations.len(), 1, "{:#?}", report.violations);
    assert!(matches!(
        report.violations[0],
        Violation::FifoOrder { node: 0, queued_first, granted_first, .. } if queued_first == first && granted_first == second
    ));

    // Had the node read the first waiter only after the second was sent,
    // either order would do.
    history.record.requests[first].received = Some(ms(4));
    let report = check(&history.clone_record(20));
    assert!(report.violations.is_empty(), "{:#?}", report.violations);

    // Waiters on different nodes are not compared either.
    history.record.requests[first].received = Some(ms(3));
    history.record.requests[second].route = Route::Connection { node: 1, connection: 2 };
    let report = check(&history.finish(20));
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
}

#[test]
fn every_request_is_answered_exactly_once() {
    let mut history = Builder::default();
    let twice = history.acquire("a", 0, 100);
    history.reply(twice, 1, Outcome::TimedOut);
    history.reply(twice, 2, Outcome::TimedOut);
    let never = history.acquire("b", 0, 100);
    let cut = history.acquire("c", 0, 100);
    history.reply(cut, 3, Outcome::Cut);
    let answered_then_cut = history.acquire("d", 0, 100);
    history.reply(answered_then_cut, 3, Outcome::TimedOut);
    history.reply(answered_then_cut, 4, Outcome::Cut);
    history.window("kill -9", 0, 10);
    let report = check(&history.finish(10));
    assert_eq!(
        report.violations,
        vec![Violation::AnsweredTwice { request: twice, replies: 2 }, Violation::Unanswered { request: never }]
    );
}

#[test]
fn a_request_answered_t_is_never_granted() {
    let mut history = Builder::default();
    let request = history.acquire("k", 0, 100);
    history.reply(request, 10, Outcome::TimedOut);
    history.reply(request, 20, Outcome::Granted { token: 5 });
    let report = check(&history.finish(30));
    assert!(report.violations.contains(&Violation::GrantAfterTimeout { request }), "{:#?}", report.violations);
}

#[test]
fn the_fenced_resource_refuses_lower_tokens_and_notes_every_write() {
    let history = History::new();
    let resource = FencedResource::new(history.clone());
    assert_eq!(resource.write("k", 5), WriteOutcome::Accepted);
    assert_eq!(resource.write("k", 7), WriteOutcome::Accepted);
    assert_eq!(resource.write("k", 7), WriteOutcome::Accepted, "the current holder writes again");
    assert_eq!(resource.write("k", 6), WriteOutcome::Refused { highest: 7 });
    assert_eq!(resource.write("other", 1), WriteOutcome::Accepted);
    let record = history.record();
    let decided: Vec<(u64, bool)> = record.writes.iter().map(|write| (write.token, write.accepted)).collect();
    assert_eq!(decided, vec![(5, true), (7, true), (7, true), (6, false), (1, true)]);
}

#[test]
fn a_refused_write_is_fine_after_the_lease_and_a_violation_before_it() {
    let mut history = Builder::default();
    let stale = history.acquire("k", 0, 100);
    history.reply(stale, 10, Outcome::Granted { token: 10 });
    history.holder("k", 11, 100, 110, 120);
    history.write("k", 10, 20, true);
    history.write("k", 11, 115, true);
    // The first holder wakes after its lease and is kept out.
    history.write("k", 10, 130, false);
    let report = check(&history.clone_record(200));
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert_eq!((report.counts.writes_accepted, report.counts.writes_refused), (2, 1));

    // A refusal while the lease still ran means two holders at once.
    history.write("k", 10, 50, false);
    assert!(matches!(
        only_violation(&history.finish(200)),
        Violation::RefusedLiveHolder { token: 10, holder: Some(0), .. }
    ));
}

#[test]
fn a_resource_that_accepts_out_of_order_is_caught() {
    let mut history = Builder::default();
    history.holder("k", 10, 0, 1, 2);
    history.holder("k", 11, 3, 4, 5);
    history.write("k", 11, 4, true);
    history.write("k", 10, 6, true);
    history.window("partition", 0, 10);
    assert!(matches!(only_violation(&history.finish(10)), Violation::AcceptedOutOfOrder { token: 10, after: 11, .. }));
}

#[test]
fn the_recorder_keeps_times_in_order_and_closes_open_windows() {
    let history = History::new();
    let window = history.open_window("pause");
    let id =
        history.send("k", Op::Acquire { lease: ms(1000), wait: None }, Route::Connection { node: 1, connection: 0 });
    history.received(id);
    history.reply(id, Outcome::Granted { token: 3 }, Some(1));
    history.close_window(window);
    history.open_window("partition");
    let record = history.record();
    let request = &record.requests[id];
    assert!(request.sent <= request.received.unwrap());
    assert!(request.received.unwrap() <= request.replies[0].at);
    assert_eq!(request.replies[0].node, Some(1));
    assert!(record.windows.iter().all(|window| window.end.is_some_and(|end| end <= record.end)));
    assert_eq!(record.windows.len(), 2);
}
