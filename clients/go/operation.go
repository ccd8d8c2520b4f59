package ringlock

// One request from the moment it is submitted until its outcome is known:
// what to send, and what to do next on each event (a reply, a cut
// connection, no usable connection). The rules of docs/protocol.md §4 live here (acquires
// move to the next connection, releases are retried, M redirects) as
// methods that take the event and the time and return a step; the router
// and the connections carry the steps out.

import (
	"errors"
	"math"
	"strconv"
	"sync/atomic"
	"time"
)

// policy is the retry rules, from the client's options.
type policy struct {
	// retryInterval is the pause between two tries of a release, or of a
	// request that found no active node.
	retryInterval time.Duration
	// retryFor is how long a release, or a request that finds no active
	// node, keeps being retried.
	retryFor time.Duration
	// redirectLimit is the most M redirects one request follows.
	redirectLimit int
	// connectLimit is how long a request with no limit of its own waits
	// for a usable connection.
	connectLimit time.Duration
}

// kind is what a request asks.
type kind uint8

const (
	kindAcquire kind = iota
	kindRelease
	kindExtend
	kindPing
	kindStats
	kindInspect
)

// outcome is the end of a request, handed to whoever waits for it. It is
// copied several times on its way (into a step, through the waiter's
// channel), so it keeps what the rare requests return out of line.
type outcome struct {
	// err is nil for success; ErrTimeout for an acquire answered T.
	err error
	// token is an acquire's grant.
	token uint64
	// answer is what a ping, stats or inspect request returns; nil for
	// the others.
	answer *answer
}

// answer is what a P, S or I reply says.
type answer struct {
	// pong is a ping's answer.
	pong Pong
	// stats is an S reply's JSON, copied out of the read buffer.
	stats []byte
	// state is an I reply's key state.
	state KeyState
}

// stepKind is what the router does with a request next.
type stepKind uint8

const (
	// stepDone: the request is over; hand its outcome to its waiter.
	stepDone stepKind = iota
	// stepResend: send it again on the next usable connection.
	stepResend
	// stepRedirect: send it to the active node an M reply named.
	stepRedirect
	// stepRetryAt: send it again at a later instant.
	stepRetryAt
	// stepNoConnection: the request is over, with no usable connection
	// within its limit after waiting waited; the router names the
	// addresses and their errors.
	stepNoConnection
)

type step struct {
	kind    stepKind
	outcome outcome
	at      time.Time
	waited  time.Duration
	// shuttingDown marks a stepNoConnection of a request a stopping
	// server answered shutting-down on the way.
	shuttingDown bool
}

func done(o outcome) step {
	return step{kind: stepDone, outcome: o}
}

func failed(err error) step {
	return step{kind: stepDone, outcome: outcome{err: err}}
}

// unsent says why no connection took a request.
type unsent uint8

const (
	// unsentNoConnection: no connection is usable.
	unsentNoConnection unsent = iota
	// unsentFull: usable connections exist but each carries as many
	// requests in flight as it may.
	unsentFull
	// unsentActiveUnreachable: the active node an M reply named has no
	// usable connection.
	unsentActiveUnreachable
)

// The states of a request's waiter, in operation.state.
const (
	waiterPending uint32 = iota
	waiterDone
	waiterAbandoned
)

// operation is one request in flight or waiting for a retry. A connection
// or the retry timer owns it at any moment; only state is shared with the
// caller waiting on done.
type operation struct {
	kind kind
	// key is empty for P and S.
	key     string
	leaseMs uint64
	// waitMs is an acquire's wait; 0 is no limit.
	waitMs uint64
	token  uint64
	// started is set for acquires with a bounded wait, whose re-sends ask
	// only for the wait left.
	started time.Time
	// triesLeft is how many more connections the request may be cut off
	// on before it fails.
	triesLeft     int
	redirectsLeft int
	// retryUntil ends the retries, from the first time a release is cut
	// off or finds no connection, or another request is told that no
	// active is known. Zero: unset.
	retryUntil time.Time
	// tryOnce marks an acquire whose wait is only the shortest the wire
	// carries (TryAcquire): it waits for a connection as long as one with
	// no wait limit.
	tryOnce bool
	// probe marks a connection's own P (see connection.watch): nobody
	// waits for it, and it is never sent elsewhere.
	probe bool
	// connectionDeadline is the last instant the caller lets the request
	// wait for a usable connection, when the caller sets one (an extend:
	// the end of its lease). Zero: the limit its kind implies.
	connectionDeadline time.Time
	// waitingSince is when the request began waiting for a usable
	// connection; zero while it is in flight or waits for something else.
	waitingSince time.Time
	// waitedBefore is how long it waited for a usable connection before
	// it last went out. A connection that takes it and closes before
	// answering anything (a node that accepts then closes at once) does
	// not start its wait over, so the connect limit still ends the call;
	// one that has answered does (see connectionAnswered).
	waitedBefore time.Duration
	// shuttingDown is set once a server answered it shutting-down (or
	// refused a connection it was on with that code): it had no effect and
	// is sent again within its limit, and if that runs out the error says
	// the server was stopping.
	shuttingDown bool
	// done receives the outcome (capacity 1, so finishing never blocks);
	// nil when nobody waits, as for the release of an abandoned grant.
	done chan outcome
	// state is waiterPending until either the outcome is delivered
	// (waiterDone) or the caller gives up on it (waiterAbandoned).
	state atomic.Uint32
	// next links requests of the same (op, key) in a pairing's index;
	// older and newer link every request in flight on a connection in send
	// order.
	next, older, newer *operation
}

// newOperation makes a request to be tried on up to tries connections.
func newOperation(k kind, key string, tries int, p *policy, waited bool) *operation {
	o := &operation{kind: k, key: key, triesLeft: max(tries, 1), redirectsLeft: p.redirectLimit}
	if waited {
		o.done = make(chan outcome, 1)
	}
	return o
}

// op is the operation letter its reply echoes.
func (o *operation) op() byte {
	switch o.kind {
	case kindAcquire:
		return opAcquire
	case kindRelease:
		return opRelease
	case kindExtend:
		return opExtend
	case kindPing:
		return opPing
	case kindInspect:
		return opInspect
	}
	return opStats
}

// waitLeftMs is the wait left to an acquire at now, in milliseconds: 0 for
// no limit, and false once a bounded wait has run out. An acquire that
// tries once asks for its short wait whenever it goes out: it waits for a
// connection within the connect limit, not within that wait.
func (o *operation) waitLeftMs(now time.Time) (uint64, bool) {
	if o.kind != kindAcquire || o.waitMs == 0 {
		return 0, true
	}
	if o.tryOnce {
		return o.waitMs, true
	}
	waited := now.Sub(o.started)
	if waited < 0 {
		waited = 0
	}
	waitedMs := uint64(waited / time.Millisecond)
	if waitedMs >= o.waitMs {
		return 0, false
	}
	return o.waitMs - waitedMs, true
}

// expired reports whether this is an acquire whose wait ran out before it
// could be (re)sent. It then ends with no connection if it was off the wire
// for want of one (a broken connection took it back, or none was usable),
// else as timed out, as on the server.
func (o *operation) expired(now time.Time) bool {
	_, ok := o.waitLeftMs(now)
	return !ok
}

// needsClock reports whether encode reads now, so callers read the clock
// only then (it is a measurable part of a request's cost).
func (o *operation) needsClock() bool {
	return o.kind == kindAcquire && o.waitMs != 0
}

// encode appends the request line. A re-sent acquire asks only for the
// wait it has left, so moving it does not make it wait longer than asked.
func (o *operation) encode(out []byte, now time.Time) []byte {
	switch o.kind {
	case kindAcquire:
		wait, ok := o.waitLeftMs(now)
		if !ok {
			wait = 1
		}
		out = append(out, "A "...)
		out = append(out, o.key...)
		out = append(out, ' ')
		out = appendSeconds(out, o.leaseMs)
		out = append(out, ' ')
		out = appendSeconds(out, wait)
	case kindRelease:
		out = append(out, "R "...)
		out = append(out, o.key...)
		out = append(out, ' ')
		out = strconv.AppendUint(out, o.token, 10)
	case kindExtend:
		out = append(out, "X "...)
		out = append(out, o.key...)
		out = append(out, ' ')
		out = strconv.AppendUint(out, o.token, 10)
		out = append(out, ' ')
		out = appendSeconds(out, o.leaseMs)
	case kindPing:
		out = append(out, 'P')
	case kindStats:
		out = append(out, 'S')
	case kindInspect:
		out = append(out, "I "...)
		out = append(out, o.key...)
	}
	return append(out, '\n')
}

// onReply is the next step after r, which the connection paired with this
// request by (op, key).
func (o *operation) onReply(r *reply, now time.Time, p *policy) step {
	switch {
	case r.kind == 'M' && r.address != nil:
		if o.redirectsLeft == 0 {
			return failed(ErrNoActive)
		}
		o.redirectsLeft--
		return step{kind: stepRedirect}
	case r.kind == 'M':
		return o.retryLater(now, p, ErrNoActive)
	case r.kind == 'E' && r.code == CodeShuttingDown && o.retriesShuttingDown():
		// A stopping server answers what it will not serve shutting-down:
		// the request had no effect, and the next server (a restart, or a
		// cluster's new active) is usually there well within the request's
		// limit, so it waits for a connection as if this one had broken.
		if now.IsZero() {
			now = time.Now()
		}
		o.shuttingDown = true
		return o.waitForConnection(now, p)
	case r.kind == 'E':
		return failed(&ServerError{Code: r.code, Op: opName(o.op()), Key: o.key})
	}
	switch o.kind {
	case kindAcquire:
		if r.kind == 'A' {
			return done(outcome{token: r.token})
		}
		if r.kind == 'T' {
			return failed(ErrTimeout)
		}
	case kindRelease:
		if r.kind == 'R' {
			return done(outcome{})
		}
	case kindExtend:
		if r.kind == 'X' {
			if r.token != o.token {
				return failed(&ProtocolError{Reason: "extend of token " + strconv.FormatUint(o.token, 10) +
					" answered with token " + strconv.FormatUint(r.token, 10)})
			}
			return done(outcome{})
		}
	case kindPing:
		if r.kind == 'P' {
			pong := Pong{Role: r.role, Epoch: r.epoch}
			if r.address != nil {
				pong.Active = string(r.address)
			}
			return done(outcome{answer: &answer{pong: pong}})
		}
	case kindStats:
		if r.kind == 'S' {
			return done(outcome{answer: &answer{stats: append([]byte(nil), r.json...)}})
		}
	case kindInspect:
		if r.kind == 'I' {
			return done(outcome{answer: &answer{state: KeyState{Key: o.key, Token: r.token, Held: r.held,
				LeaseLeft: durationOfMs(r.leaseLeftMs), Waiters: r.waiters}}})
		}
	}
	// Pairing by (op, key) leaves no other combination.
	return failed(&ProtocolError{Reason: "a reply of the wrong kind for " + opName(o.op())})
}

// retriesShuttingDown reports whether a shutting-down answer sends the
// request again within its limit: every acquire, release and extend but
// an acquire that tries once, which has no wait to spend.
func (o *operation) retriesShuttingDown() bool {
	switch o.kind {
	case kindAcquire:
		return !o.tryOnce
	case kindRelease, kindExtend:
		return true
	}
	return false
}

// onCut is the next step after the connection carrying this request was
// cut; cause is the error to report if it cannot move on. The server may or
// may not have seen the request.
func (o *operation) onCut(cause error, now time.Time, p *policy) step {
	if cause == errShuttingDownCut {
		o.shuttingDown = true
	}
	if o.waitingSince.IsZero() && errors.Is(cause, ErrNoConnection) {
		// Off the wire for want of a connection from now on, until a
		// connection takes it again.
		o.waitingSince = now
	}
	if o.kind == kindRelease {
		// Send it again at once on another connection; the router falls
		// back to retrying every interval while none is usable.
		if o.retryUntil.IsZero() {
			o.retryUntil = now.Add(p.retryFor)
		} else if now.After(o.retryUntil) {
			if errors.Is(cause, ErrNoConnection) {
				firstCut := o.retryUntil.Add(-p.retryFor)
				return step{kind: stepNoConnection, waited: now.Sub(firstCut), shuttingDown: o.shuttingDown}
			}
			return failed(cause)
		}
		return step{kind: stepResend}
	}
	o.triesLeft--
	switch {
	case o.triesLeft > 0:
		return step{kind: stepResend}
	case errors.Is(cause, ErrNoConnection):
		// Cut on as many connections as the client has: a server that
		// went away (a restart, a failover) takes every connection to it
		// down at once, so the request waits for one to come back.
		return o.waitForConnection(now, p)
	}
	return failed(cause)
}

// onUnsent is the next step when no connection took the request.
func (o *operation) onUnsent(why unsent, now time.Time, p *policy) step {
	switch {
	case why == unsentNoConnection:
		return o.waitForConnection(now, p)
	case why == unsentActiveUnreachable:
		// During a failover the node an M named may be gone for a moment:
		// wait for the others to name the new active.
		return o.retryLater(now, p, ErrNoActive)
	case o.kind == kindRelease:
		return o.retryLater(now, p, ErrTooManyInFlight)
	}
	return failed(ErrTooManyInFlight)
}

// connectionDeadline is the last instant the request may wait for a
// usable connection, having begun to wait at since: a bounded acquire's
// wait, an extend's lease, a release's retry period, else the connect
// limit.
func (o *operation) connectionDeadlineFrom(since time.Time, p *policy) time.Time {
	switch {
	case !o.connectionDeadline.IsZero():
		return o.connectionDeadline
	case o.kind == kindAcquire && o.waitMs != 0 && !o.tryOnce:
		return o.started.Add(durationOfMs(o.waitMs))
	case o.kind == kindRelease:
		if o.retryUntil.IsZero() {
			o.retryUntil = since.Add(p.retryFor)
		}
		return o.retryUntil
	}
	return since.Add(p.connectLimit - o.waitedBefore)
}

// waited is how long it has waited for a usable connection at now,
// counting its earlier waits since a connection last answered.
func (o *operation) waited(now time.Time) time.Duration {
	if o.waitingSince.IsZero() {
		return o.waitedBefore
	}
	return o.waitedBefore + now.Sub(o.waitingSince)
}

// goOut pauses its wait for a connection, if any, as it is offered to the
// connections at now (zero: the clock is read only if it was waiting); it
// gives back what stayBack needs to undo that if none takes it.
func (o *operation) goOut(now time.Time) (since time.Time, before time.Duration) {
	since, before = o.waitingSince, o.waitedBefore
	if !since.IsZero() {
		if now.IsZero() {
			now = time.Now()
		}
		o.waitedBefore = o.waited(now)
		o.waitingSince = time.Time{}
	}
	return since, before
}

// stayBack undoes goOut: no connection took it.
func (o *operation) stayBack(since time.Time, before time.Duration) {
	o.waitingSince, o.waitedBefore = since, before
}

// connectionAnswered notes that a connection that carried it was cut after
// answering something (to this request or another): a server was there,
// so a wait for a connection after this cut is a new one and gets the
// whole limit.
func (o *operation) connectionAnswered() {
	o.waitedBefore = 0
}

// waitForConnection waits for a usable connection within the request's
// limit: tried again after the retry interval, or at once when a
// connection comes up (the router hurries requests with waitingSince set);
// past the limit it ends with no connection.
func (o *operation) waitForConnection(now time.Time, p *policy) step {
	if o.waitingSince.IsZero() {
		o.waitingSince = now
	}
	deadline := o.connectionDeadlineFrom(o.waitingSince, p)
	if !now.Before(deadline) {
		return step{kind: stepNoConnection, waited: o.waited(now), shuttingDown: o.shuttingDown}
	}
	at := now.Add(p.retryInterval)
	if at.After(deadline) {
		at = deadline
	}
	return step{kind: stepRetryAt, at: at}
}

// retryLater retries after the interval while within the retry period,
// which starts now if it has not started yet; else fails with err.
func (o *operation) retryLater(now time.Time, p *policy, err error) step {
	if o.retryUntil.IsZero() {
		o.retryUntil = now.Add(p.retryFor)
	}
	at := now.Add(p.retryInterval)
	if at.After(o.retryUntil) {
		return failed(err)
	}
	return step{kind: stepRetryAt, at: at}
}

// durationOfMs is ms milliseconds as a Duration, the longest Duration if
// it does not fit (about 292 years).
func durationOfMs(ms uint64) time.Duration {
	if ms > uint64(math.MaxInt64/int64(time.Millisecond)) {
		return math.MaxInt64
	}
	return time.Duration(ms) * time.Millisecond
}
