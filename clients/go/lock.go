package ringlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// Lock is a key this client was granted, until it is released or its lease
// runs out.
//
// Pass Token to the resource the lock protects, which should refuse any
// token lower than the highest it has seen: that keeps it safe even from a
// holder whose lease ran out unnoticed (docs/protocol.md §2).
//
// A held lock is not tied to a connection: a broken connection does not
// release it, and Release goes over any usable connection. Go has no
// destructors, so release every Lock (defer lock.Release(ctx)); one that is
// dropped is freed only when its lease runs out. A Lock is safe for use by
// many goroutines.
type Lock struct {
	client *Client
	key    string
	token  uint64
	// lease is the lease the acquire asked for, and so what AutoExtend
	// asks for at each extend.
	lease time.Duration

	mu sync.Mutex
	// leaseEnds is when the lease ends, as far as this client knows:
	// counted from when the grant arrived (later than the server's by the
	// reply's way back at most) or the last confirmed extend was sent. An
	// extend waits for a usable connection until then, as after it the
	// grant is gone anyway. Zero: not known (a Lock from LockFrom before
	// its first extend).
	leaseEnds time.Time
	// err is nil while the lock is held, then ErrReleased or an error
	// wrapping ErrLockLost.
	err error
	// watch is made on first use (Done, Context, AutoExtend), so that a
	// lock nobody watches stays small.
	watch *lockWatch
}

// lockWatch is what watches a Lock: guarded by the Lock's mu.
type lockWatch struct {
	// done is closed once the Lock's err is set.
	done chan struct{}
	// ctx is the lock's Context, made on first use; cancel ends it.
	ctx    context.Context
	cancel context.CancelCauseFunc
	// extending is set once AutoExtend started its goroutine.
	extending bool
}

// watchLocked is l.watch, made if need be, with its done channel; l.mu is
// held.
func (l *Lock) watchLocked() *lockWatch {
	if l.watch == nil {
		l.watch = &lockWatch{done: make(chan struct{})}
		if l.err != nil {
			close(l.watch.done)
		}
	}
	return l.watch
}

func newLock(c *Client, key string, token uint64, lease time.Duration, leaseEnds time.Time) *Lock {
	return &Lock{client: c, key: key, token: token, lease: lease, leaseEnds: leaseEnds}
}

func (l *Lock) knownLeaseEnd() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leaseEnds
}

// end records that the lock is no longer held, for err, and tells every
// watcher; only the first call counts.
func (l *Lock) end(err error) {
	l.mu.Lock()
	if l.err == nil {
		l.err = err
		if w := l.watch; w != nil {
			close(w.done)
			if w.cancel != nil {
				w.cancel(err)
			}
		}
	}
	l.mu.Unlock()
}

// Done returns a channel closed once the lock is no longer held: it was
// lost (an extend, by AutoExtend or by Extend, was answered not-holder, or
// the lease ran out without a confirmed extend while AutoExtend kept it)
// or released through this Lock. Err then says which. Like a session's
// Done in etcd, select on it to stop work the lock protects.
func (l *Lock) Done() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.watchLocked().done
}

// Err is nil while the lock is held (as far as this client knows), then
// ErrReleased once released through this Lock, or an error matching
// ErrLockLost (and, when the server said so, ErrNotHolder) once lost.
func (l *Lock) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Context returns a context cancelled once Done is closed, whose
// context.Cause is Err: pass it to the work the lock protects, so that it
// stops when the lock is lost.
func (l *Lock) Context() context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.watchLocked()
	if w.ctx == nil {
		w.ctx, w.cancel = context.WithCancelCause(context.Background())
		if l.err != nil {
			w.cancel(l.err)
		}
	}
	return w.ctx
}

// Locked reports whether the lock is held as far as this client knows,
// without asking the server: false once released or lost, and false once
// the lease has run out without a confirmed extend. Held asks the server.
func (l *Lock) Locked() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err == nil && (l.leaseEnds.IsZero() || time.Now().Before(l.leaseEnds))
}

// Held asks the server (an I request) whether this lock's token still
// holds the key. It changes nothing: a lock found not held is not marked
// lost (only an extend's not-holder or a lease run out does that). Errors
// as for Client.Inspect.
func (l *Lock) Held(ctx context.Context) (bool, error) {
	state, err := l.client.Inspect(ctx, l.key)
	if err != nil {
		return false, err
	}
	return state.Held && state.Token == l.token, nil
}

// AutoExtend keeps the lock until it is released: it extends the lease,
// by the lease the lock was acquired with, at about a third of it, and
// retries a failed extend on other connections every release retry
// interval (WithReleaseRetry, 200ms) while the lease lasts. The lock is
// declared lost only when the server answers not-holder (the server
// restarted, or someone released the key with this token) or the lease
// runs out without a confirmed extend: Done is closed, the lock's Context
// is cancelled, and Err says why, at once. It returns at once; calling it
// again does nothing. The extends stop once the lock is released or lost.
func (l *Lock) AutoExtend() {
	l.mu.Lock()
	w := l.watchLocked()
	if w.extending || l.err != nil || l.lease <= 0 {
		l.mu.Unlock()
		return
	}
	w.extending = true
	done := w.done
	l.mu.Unlock()
	go l.keepExtending(done)
}

// autoExtendDivisor: AutoExtend extends the lease when 1/autoExtendDivisor
// of it has passed since the grant or the last confirmed extend.
const autoExtendDivisor = 3

// keepExtending is AutoExtend's goroutine.
func (l *Lock) keepExtending(done <-chan struct{}) {
	period := l.lease / autoExtendDivisor
	retry := l.client.router.options.releaseRetryInterval
	timer := time.NewTimer(period)
	defer timer.Stop()
	for {
		select {
		case <-done:
			return
		case <-timer.C:
		}
		ends := l.knownLeaseEnd()
		ctx, cancel := context.Background(), context.CancelFunc(func() {})
		if !ends.IsZero() {
			// No extend is worth waiting for once the lease has ended.
			ctx, cancel = context.WithDeadline(ctx, ends)
		}
		err := l.Extend(ctx, l.lease)
		cancel()
		switch {
		case err == nil:
			timer.Reset(period)
		case errors.Is(err, ErrNotHolder), errors.Is(err, ErrClosed):
			l.end(fmt.Errorf("%w: %w", ErrLockLost, err))
			return
		case !ends.IsZero() && !time.Now().Add(retry).Before(ends):
			l.end(fmt.Errorf("%w: the lease ran out without a confirmed extend: %w", ErrLockLost, err))
			return
		default:
			timer.Reset(retry)
		}
	}
}

// Key is the key held.
func (l *Lock) Key() string {
	return l.key
}

// Token is the grant's fencing token: unique, and greater than every
// earlier grant's token for this key, across hand-offs, lease expiry,
// failovers and restarts. Tokens of different keys are not ordered.
func (l *Lock) Token() uint64 {
	return l.token
}

// String shows the key and the token.
func (l *Lock) String() string {
	return strconv.Quote(l.key) + "@" + strconv.FormatUint(l.token, 10)
}

// Release releases the grant and waits until the server answers or ctx
// ends. The key goes to its next waiter, if any.
//
// A release cut off by a broken connection is sent again at once on
// another usable connection, else every 200ms for 5s (see
// WithReleaseRetry). If ctx ends first, Release returns ctx.Err() but the
// release carries on in the background. From the call on, Locked is false,
// Done is closed and Err is ErrReleased (AutoExtend stops).
//
// errors.Is(err, ErrNotHolder) means nothing was left to release: the
// grant was already released (perhaps by an earlier try whose reply was
// lost), its lease ran out, or the server restarted. Callers that only
// want the key freed can treat it as success. ErrNoConnection means no try
// got through within the retry period: the lease frees the key later.
func (l *Lock) Release(ctx context.Context) error {
	l.end(ErrReleased)
	o := l.client.router.newOperation(kindRelease, l.key, true)
	o.token = l.token
	_, err := l.client.request(ctx, o)
	return err
}

// Extend makes the lease end lease from when the server reads the request,
// sooner or later than before, and waits until the server answers or ctx
// ends.
//
// errors.Is(err, ErrNotHolder) means the grant is gone (its lease ran out,
// or the server restarted): the lock is lost, stop using it; Done is then
// closed and Err matches ErrLockLost. An extend cut
// by a broken connection moves to the next connection as an acquire does;
// with no usable connection it waits for one until the lease this client
// knows of ends, then fails with a *ConnectionError. Other errors as for
// Client.Acquire.
func (l *Lock) Extend(ctx context.Context, lease time.Duration) error {
	leaseMs, err := checkLease(lease)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	o := l.client.router.newOperation(kindExtend, l.key, true)
	o.token = l.token
	o.leaseMs = leaseMs
	o.connectionDeadline = l.knownLeaseEnd()
	sent := time.Now()
	if _, err = l.client.request(ctx, o); err != nil {
		if errors.Is(err, ErrNotHolder) {
			l.end(fmt.Errorf("%w: %w", ErrLockLost, err))
		}
		return err
	}
	l.mu.Lock()
	l.leaseEnds = sent.Add(lease)
	l.mu.Unlock()
	return nil
}

// LockFrom makes a Lock for a grant another process (or an earlier run)
// took, given its key and token (ringlock-cli acquire prints both): it can
// be released, extended, asked Held and kept by AutoExtend, which extends
// by lease. Nothing is sent: the lease it has left is not known, so Locked
// reports true until a release, an extend or the end of a lease this
// client confirmed says otherwise; Held asks the server. Errors: an
// *ArgumentError for a bad key, or a lease under 0 (0: none, so
// AutoExtend does nothing).
func (c *Client) LockFrom(key string, token uint64, lease time.Duration) (*Lock, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	if lease < 0 {
		return nil, &ArgumentError{Arg: "lease", Reason: fmt.Sprintf("%v is outside %s, or 0 for none", lease, leaseRange)}
	}
	return newLock(c, key, token, lease, time.Time{}), nil
}
