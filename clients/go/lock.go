package ringlock

import (
	"context"
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

	// leaseEnds is when the lease ends, as far as this client knows:
	// counted from when the grant arrived (later than the server's by the
	// reply's way back at most) or the last confirmed extend was sent. An
	// extend waits for a usable connection until then, as after it the
	// grant is gone anyway.
	leaseMu   sync.Mutex
	leaseEnds time.Time
}

func (l *Lock) knownLeaseEnd() time.Time {
	l.leaseMu.Lock()
	defer l.leaseMu.Unlock()
	return l.leaseEnds
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
// release carries on in the background.
//
// errors.Is(err, ErrNotHolder) means nothing was left to release: the
// grant was already released (perhaps by an earlier try whose reply was
// lost), its lease ran out, or the server restarted. Callers that only
// want the key freed can treat it as success. ErrNoConnection means no try
// got through within the retry period: the lease frees the key later.
func (l *Lock) Release(ctx context.Context) error {
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
// or the server restarted): the lock is lost, stop using it. An extend cut
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
		return err
	}
	l.leaseMu.Lock()
	l.leaseEnds = sent.Add(lease)
	l.leaseMu.Unlock()
	return nil
}
