package ringlock

import (
	"errors"
	"math"
	"testing"
	"time"
)

var testPolicy = policy{retryInterval: 200 * time.Millisecond, retryFor: 5 * time.Second, redirectLimit: 2,
	connectLimit: 10 * time.Second}

func acquireOperation(waitMs uint64, tries int, started time.Time) *operation {
	o := newOperation(kindAcquire, "k", tries, &testPolicy, false)
	o.leaseMs = 30000
	o.waitMs = waitMs
	o.started = started
	return o
}

func line(o *operation, now time.Time) string {
	return string(o.encode(nil, now))
}

func TestEncodesEachKind(t *testing.T) {
	now := time.Now()
	if got := line(acquireOperation(2000, 1, now), now); got != "A k 30 2\n" {
		t.Error(got)
	}
	release := newOperation(kindRelease, "k", 1, &testPolicy, false)
	release.token = 5
	if got := line(release, now); got != "R k 5\n" {
		t.Error(got)
	}
	extend := newOperation(kindExtend, "k", 1, &testPolicy, false)
	extend.token, extend.leaseMs = 5, 1500
	if got := line(extend, now); got != "X k 5 1.5\n" {
		t.Error(got)
	}
	if got := line(newOperation(kindPing, "", 1, &testPolicy, false), now); got != "P\n" {
		t.Error(got)
	}
	if got := line(newOperation(kindStats, "", 1, &testPolicy, false), now); got != "S\n" {
		t.Error(got)
	}
	if got := line(newOperation(kindInspect, "orders/42", 1, &testPolicy, false), now); got != "I orders/42\n" {
		t.Error(got)
	}
}

func TestAnInspectReplyIsTheKeyState(t *testing.T) {
	now := time.Now()
	for text, want := range map[string]KeyState{
		"I k 17592186044416 1500 3": {Key: "k", Held: true, Token: 17592186044416, LeaseLeft: 1500 * time.Millisecond, Waiters: 3},
		"I k - 0 0":                 {Key: "k"},
		"I k - 0 2":                 {Key: "k", Waiters: 2},
		// Beyond what a Duration holds: the longest one.
		"I k 7 18446744073709551615 0": {Key: "k", Held: true, Token: 7, LeaseLeft: math.MaxInt64},
	} {
		r, err := parseReply([]byte(text))
		if err != nil {
			t.Fatalf("%q: %v", text, err)
		}
		inspect := newOperation(kindInspect, "k", 1, &testPolicy, false)
		s := inspect.onReply(&r, now, &testPolicy)
		if s.kind != stepDone || s.outcome.err != nil || s.outcome.answer.state != want {
			t.Errorf("%q: %+v, want %+v", text, s, want)
		}
	}
}

func TestAnInspectFollowsRedirectsAndReportsRefusals(t *testing.T) {
	now := time.Now()
	inspect := newOperation(kindInspect, "k", 1, &testPolicy, false)
	moved, _ := parseReply([]byte("M I k 10.0.0.2:7700"))
	if s := inspect.onReply(&moved, now, &testPolicy); s.kind != stepRedirect {
		t.Fatalf("M I with an active: %+v", s)
	}
	nobody, _ := parseReply([]byte("M I k -"))
	if s := inspect.onReply(&nobody, now, &testPolicy); s.kind != stepRetryAt {
		t.Fatalf("M I with no active: %+v", s)
	}
	refused, _ := parseReply([]byte("E I k bad-request"))
	s := inspect.onReply(&refused, now, &testPolicy)
	var server *ServerError
	if s.kind != stepDone || !errors.As(s.outcome.err, &server) || server.Op != "I" || server.Key != "k" ||
		server.Code != CodeBadRequest {
		t.Fatalf("E I: %+v", s)
	}
	// Cut off, it moves to the next connection like an acquire.
	moving := newOperation(kindInspect, "k", 2, &testPolicy, false)
	if s := moving.onCut(ErrNoConnection, now, &testPolicy); s.kind != stepResend {
		t.Fatalf("cut: %+v", s)
	}
	if s := moving.onCut(ErrNoConnection, now, &testPolicy); s.kind != stepRetryAt {
		t.Fatalf("cut twice: %+v, want it to wait for a connection", s)
	}
}

func TestAResentAcquireAsksForTheWaitItHasLeft(t *testing.T) {
	now := time.Now()
	acquire := acquireOperation(2000, 2, now)
	if got := line(acquire, now.Add(750*time.Millisecond)); got != "A k 30 1.25\n" {
		t.Error(got)
	}
	if acquire.expired(now.Add(1999 * time.Millisecond)) {
		t.Error("expired before its wait ran out")
	}
	if !acquire.expired(now.Add(2000 * time.Millisecond)) {
		t.Error("not expired once its wait ran out")
	}
	forever := acquireOperation(0, 2, time.Time{})
	if forever.expired(now.Add(100000 * time.Second)) {
		t.Error("a wait without limit expired")
	}
	if got := line(forever, now); got != "A k 30 0\n" {
		t.Error(got)
	}
}

func TestAnAcquireMovesOnUntilItWasCutOnEveryConnectionThenWaitsForOne(t *testing.T) {
	now := time.Now()
	acquire := acquireOperation(2000, 3, now)
	for range 2 {
		if s := acquire.onCut(ErrNoConnection, now, &testPolicy); s.kind != stepResend {
			t.Fatalf("%+v", s)
		}
	}
	if s := acquire.onCut(ErrNoConnection, now, &testPolicy); s.kind != stepRetryAt || !acquire.waitingSince.Equal(now) {
		t.Fatalf("%+v", s)
	}
	late := now.Add(2 * time.Second)
	if s := acquire.onCut(ErrNoConnection, late, &testPolicy); s.kind != stepNoConnection || s.waited != 2*time.Second {
		t.Fatalf("cut past its wait: %+v", s)
	}
	refused := acquireOperation(2000, 1, now)
	s := refused.onCut(&ServerError{Code: CodeTooManyConnections, Op: "-"}, now, &testPolicy)
	if s.kind != stepDone || !errors.Is(s.outcome.err, ErrTooManyConnections) {
		t.Fatalf("%+v", s)
	}
}

func TestGoingOutOnConnectionsClosedBeforeAnsweringDoesNotStartTheWaitOver(t *testing.T) {
	start := time.Now()
	ping := newOperation(kindPing, "", 2, &testPolicy, false)
	now := start
	s := ping.onUnsent(unsentNoConnection, now, &testPolicy)
	for s.kind != stepNoConnection {
		switch s.kind {
		case stepRetryAt:
			now = s.at
		case stepResend:
		default:
			t.Fatalf("%+v", s)
		}
		// A connection comes up, takes it and closes at once.
		ping.goOut(now)
		now = now.Add(time.Millisecond)
		s = ping.onCut(ErrNoConnection, now, &testPolicy)
	}
	if s.waited < testPolicy.connectLimit-time.Second || now.Sub(start) > 2*testPolicy.connectLimit {
		t.Errorf("gave up after %v, having waited %v; want about the connect limit", now.Sub(start), s.waited)
	}

	// Cut from a connection that had answered: a new wait, with the whole limit.
	inspect := newOperation(kindInspect, "k", 1, &testPolicy, false)
	if s := inspect.onUnsent(unsentNoConnection, start, &testPolicy); s.kind != stepRetryAt {
		t.Fatalf("%+v", s)
	}
	sent := start.Add(9 * time.Second)
	inspect.goOut(sent)
	inspect.connectionAnswered()
	if s := inspect.onCut(ErrNoConnection, sent, &testPolicy); s.kind != stepRetryAt {
		t.Fatalf("%+v", s)
	}
	if s := inspect.onUnsent(unsentNoConnection, sent.Add(9*time.Second), &testPolicy); s.kind != stepRetryAt {
		t.Errorf("a new wait after a connection answered: %+v", s)
	}
}

func TestAnAcquireThatTriesOnceNeverRunsOutOfItsWaitOffTheWire(t *testing.T) {
	now := time.Now()
	once := acquireOperation(1, 2, now)
	once.tryOnce = true
	later := now.Add(5 * time.Second)
	if once.expired(later) {
		t.Error("a try expired: it waits for a connection within the connect limit")
	}
	if got := line(once, later); got != "A k 30 0.001\n" {
		t.Errorf("%q: a try asks for its short wait whenever it goes out", got)
	}
}

func TestABoundedAcquireWhoseWaitRanOutAfterACutWaitsAsForAConnection(t *testing.T) {
	now := time.Now()
	acquire := acquireOperation(2000, 2, now)
	cutAt := now.Add(1500 * time.Millisecond)
	if s := acquire.onCut(ErrNoConnection, cutAt, &testPolicy); s.kind != stepResend {
		t.Fatalf("%+v", s)
	}
	if !acquire.expired(now.Add(2*time.Second)) || !acquire.waitingSince.Equal(cutAt) {
		t.Errorf("expired %v, waiting since %v", acquire.expired(now.Add(2*time.Second)), acquire.waitingSince)
	}
}

// waitOut drives o through "no connection" events at each retry instant
// from start; how long it waited when it gave up.
func waitOut(t *testing.T, o *operation, start time.Time) time.Duration {
	t.Helper()
	now := start
	for {
		s := o.onUnsent(unsentNoConnection, now, &testPolicy)
		switch {
		case s.kind == stepNoConnection:
			if s.waited != now.Sub(start) {
				t.Fatalf("waited %v, want %v", s.waited, now.Sub(start))
			}
			return s.waited
		case s.kind != stepRetryAt || !s.at.After(now) || s.at.After(now.Add(testPolicy.retryInterval)):
			t.Fatalf("%+v: want a retry within the retry interval", s)
		}
		now = s.at
	}
}

func TestARequestWithNoConnectionWaitsWithinItsOwnLimit(t *testing.T) {
	now := time.Now()
	if got := waitOut(t, acquireOperation(2000, 2, now), now); got != 2*time.Second {
		t.Errorf("an acquire waits its wait: %v", got)
	}
	if got := waitOut(t, acquireOperation(0, 2, now), now); got != testPolicy.connectLimit {
		t.Errorf("an acquire with no wait limit waits the connect limit: %v", got)
	}
	once := acquireOperation(1, 2, now)
	once.tryOnce = true
	if got := waitOut(t, once, now); got != testPolicy.connectLimit {
		t.Errorf("a try waits the connect limit: %v", got)
	}
	if got := waitOut(t, newOperation(kindPing, "", 2, &testPolicy, false), now); got != testPolicy.connectLimit {
		t.Errorf("a ping waits the connect limit: %v", got)
	}
	extend := newOperation(kindExtend, "k", 2, &testPolicy, false)
	extend.connectionDeadline = now.Add(700 * time.Millisecond)
	if got := waitOut(t, extend, now); got != 700*time.Millisecond {
		t.Errorf("an extend waits the lease it has left: %v", got)
	}
	if got := waitOut(t, acquireOperation(2000, 2, now), now.Add(500*time.Millisecond)); got != 1500*time.Millisecond {
		t.Errorf("an acquire's wait counts from its start: %v", got)
	}
	if s := acquireOperation(2000, 2, now).onUnsent(unsentFull, now, &testPolicy); s.kind != stepDone ||
		s.outcome.err != ErrTooManyInFlight {
		t.Fatalf("%+v", s)
	}
}

func TestAReleaseIsRetriedEveryIntervalForTheRetryPeriod(t *testing.T) {
	start := time.Now()
	release := newOperation(kindRelease, "k", 1, &testPolicy, false)
	if s := release.onCut(ErrNoConnection, start, &testPolicy); s.kind != stepResend {
		t.Fatalf("%+v", s)
	}
	now, retries := start, 0
	for {
		s := release.onUnsent(unsentNoConnection, now, &testPolicy)
		if s.kind == stepNoConnection {
			break
		}
		if s.kind != stepRetryAt || !s.at.Equal(now.Add(testPolicy.retryInterval)) {
			t.Fatalf("%+v", s)
		}
		now = s.at
		retries++
	}
	if retries != 25 {
		t.Fatalf("%d retries, want 25 (5 s every 200 ms)", retries)
	}
	if s := release.onCut(ErrNoConnection, now.Add(time.Millisecond), &testPolicy); s.kind != stepNoConnection {
		t.Fatalf("a release cut after its retry period: %+v", s)
	}
}

func TestRepliesEndRequests(t *testing.T) {
	now := time.Now()
	onReply := func(o *operation, text string) step {
		r, err := parseReply([]byte(text))
		if err != nil {
			t.Fatalf("%q: %v", text, err)
		}
		return o.onReply(&r, now, &testPolicy)
	}
	if s := onReply(acquireOperation(0, 1, now), "A k 9"); s.kind != stepDone || s.outcome.err != nil || s.outcome.token != 9 {
		t.Errorf("A: %+v", s)
	}
	if s := onReply(acquireOperation(0, 1, now), "T k"); s.outcome.err != ErrTimeout {
		t.Errorf("T: %+v", s)
	}
	s := onReply(acquireOperation(0, 1, now), "E A k too-many-waiters")
	var server *ServerError
	if !errors.As(s.outcome.err, &server) || server.Code != CodeTooManyWaiters || server.Op != "A" || server.Key != "k" {
		t.Errorf("E: %+v", s)
	}
	release := newOperation(kindRelease, "k", 1, &testPolicy, false)
	if s := onReply(release, "R k"); s.kind != stepDone || s.outcome.err != nil {
		t.Errorf("R: %+v", s)
	}
	if s := onReply(release, "E R k not-holder"); !errors.Is(s.outcome.err, ErrNotHolder) {
		t.Errorf("E R not-holder: %+v", s)
	}
	extend := newOperation(kindExtend, "k", 1, &testPolicy, false)
	extend.token = 9
	if s := onReply(extend, "X k 9"); s.kind != stepDone || s.outcome.err != nil {
		t.Errorf("X: %+v", s)
	}
	var protocol *ProtocolError
	if s := onReply(extend, "X k 8"); !errors.As(s.outcome.err, &protocol) {
		t.Errorf("X with another token: %+v", s)
	}
	ping := newOperation(kindPing, "", 1, &testPolicy, false)
	s = onReply(ping, "P active 16 127.0.0.1:7700")
	if s.outcome.err != nil || s.outcome.answer.pong != (Pong{Role: RoleActive, Epoch: 16, Active: "127.0.0.1:7700"}) {
		t.Errorf("P: %+v", s)
	}
}

func TestShuttingDownIsRetriedWithinTheLimitExceptByATryOnceAcquire(t *testing.T) {
	start := time.Now()
	onReply := func(o *operation, text string, now time.Time) step {
		r, err := parseReply([]byte(text))
		if err != nil {
			t.Fatalf("%q: %v", text, err)
		}
		return o.onReply(&r, now, &testPolicy)
	}
	acquire := acquireOperation(5000, 2, start)
	if s := onReply(acquire, "E A k shutting-down", start); s.kind != stepRetryAt || !s.at.Equal(start.Add(testPolicy.retryInterval)) {
		t.Fatalf("an acquire answered shutting-down: %+v", s)
	}
	if got := line(acquire, start.Add(2*time.Second)); got != "A k 30 3\n" {
		t.Errorf("sent again with the wait it has left: %q", got)
	}
	if s := acquire.onUnsent(unsentNoConnection, start.Add(5*time.Second), &testPolicy); s.kind != stepNoConnection || !s.shuttingDown {
		t.Errorf("an acquire whose wait ran out after shutting-down: %+v", s)
	}
	tryOnce := acquireOperation(1, 2, start)
	tryOnce.tryOnce = true
	if s := onReply(tryOnce, "E A k shutting-down", start); !errors.Is(s.outcome.err, ErrShuttingDown) {
		t.Errorf("a try-once acquire answered shutting-down: %+v", s)
	}
	release := newOperation(kindRelease, "k", 1, &testPolicy, false)
	if s := onReply(release, "E R k shutting-down", start); s.kind != stepRetryAt {
		t.Errorf("a release answered shutting-down: %+v", s)
	}
	if s := release.onUnsent(unsentNoConnection, start.Add(testPolicy.retryFor), &testPolicy); s.kind != stepNoConnection || !s.shuttingDown {
		t.Errorf("a release whose retry window ran out after shutting-down: %+v", s)
	}
	refused := acquireOperation(5000, 1, start)
	if s := refused.onCut(errShuttingDownCut, start, &testPolicy); s.kind != stepRetryAt || !refused.shuttingDown {
		t.Errorf("an acquire on a connection a stopping server refused: %+v", s)
	}
	text := (&ConnectionError{Waited: 5 * time.Second, ShuttingDown: true}).Error()
	if text != "ringlock: no usable connection after 5.0 s (the server was shutting down)" {
		t.Errorf("%q", text)
	}
}

func TestRedirectsAreFollowedUpToTheLimit(t *testing.T) {
	now := time.Now()
	acquire := acquireOperation(2000, 1, now)
	moved, _ := parseReply([]byte("M A k 10.0.0.2:7700"))
	for range testPolicy.redirectLimit {
		if s := acquire.onReply(&moved, now, &testPolicy); s.kind != stepRedirect {
			t.Fatalf("%+v", s)
		}
	}
	if s := acquire.onReply(&moved, now, &testPolicy); s.outcome.err != ErrNoActive {
		t.Fatalf("%+v", s)
	}
}

func TestNoActiveKnownIsRetriedForTheRetryPeriod(t *testing.T) {
	start := time.Now()
	acquire := acquireOperation(0, 1, time.Time{})
	moved, _ := parseReply([]byte("M A k -"))
	if s := acquire.onReply(&moved, start, &testPolicy); s.kind != stepRetryAt {
		t.Fatalf("%+v", s)
	}
	if s := acquire.onReply(&moved, start.Add(testPolicy.retryFor), &testPolicy); s.outcome.err != ErrNoActive {
		t.Fatalf("%+v", s)
	}
	other := acquireOperation(2000, 1, start)
	if s := other.onUnsent(unsentActiveUnreachable, start, &testPolicy); s.kind != stepRetryAt {
		t.Fatalf("%+v", s)
	}
}

func TestFindNodeByTextOrByAddress(t *testing.T) {
	topology := &topology{nodes: []*node{{address: "10.0.0.1:7700"}, {address: "db.example:7700"}, {address: "[::1]:7700"}}}
	for address, want := range map[string]int{
		"10.0.0.1:7700": 0, "db.example:7700": 1, "[0:0:0:0:0:0:0:1]:7700": 2, "10.0.0.1:7701": -1,
		"other.example:7700": -1,
	} {
		if got := findNode(topology, address); got != want {
			t.Errorf("%s: %d, want %d", address, got, want)
		}
	}
}
