package ringlock

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"strings"
	"time"
)

// Role is a node's role in its cluster, as a ping reports it.
type Role string

// The roles a node may have.
const (
	// RoleActive is a node that serves locks.
	RoleActive Role = "active"
	// RoleStandby is a node that follows the active and answers lock
	// requests with a redirect to it.
	RoleStandby Role = "standby"
)

// Pong is a node's answer to a ping.
type Pong struct {
	// Role is whether the node serves locks.
	Role Role
	// Epoch is the node's current epoch (0 before it has decided anything).
	Epoch uint64
	// Active is the client address of the active node, empty if the node
	// knows none.
	Active string
}

// KeyState is what the server knows of a key now, as Inspect reports it.
type KeyState struct {
	// Key is the key inspected.
	Key string
	// Held is whether a grant holds the key.
	Held bool
	// Token is the holder's fencing token; 0 if nobody holds the key.
	Token uint64
	// LeaseLeft is how long the holder's lease has left, to the
	// millisecond, when the server answered; 0 if nobody holds the key.
	LeaseLeft time.Duration
	// Waiters is how many acquires are queued on the key. It is 0 for a
	// free key, unless acquires wait for the server to be able to grant
	// tokens.
	Waiters uint64
}

// Client is a client of a ringlock server or cluster, safe for use by many
// goroutines at once.
//
// It keeps one connection per node (two when given one address) with
// background goroutines, pipelines the requests of all callers over them,
// and moves, retries and redirects requests as docs/protocol.md §4 says. Make one with
// Dial and share it; Close it when done.
type Client struct {
	router *router
}

// Dial makes a client of the nodes at addrs ("host:port", as the servers'
// --listen or --peers name them, so that redirects can be matched with
// them). Give every node of a cluster, in any order.
//
// Connections are made and kept up in the background. Dial waits until one
// of them is up, or every first try failed, or ctx ends; it fails with a
// *ConnectionError (errors.Is(err, ErrNoConnection)) naming every address
// and its error if no node could be reached. After that, a broken
// connection is left out and reconnected at once, then after doubling
// pauses from 50ms up to 3s, each drawn between half its length and all of
// it (WithReconnectDelayFirst); ctx is not used after Dial returns.
func Dial(ctx context.Context, addrs []string, opts ...Option) (*Client, error) {
	if len(addrs) == 0 {
		return nil, &ArgumentError{Arg: "addrs", Reason: "give at least one server address"}
	}
	if len(addrs) > nodesMax {
		return nil, &ArgumentError{Arg: "addrs", Reason: fmt.Sprintf("give at most %d addresses", nodesMax)}
	}
	for _, address := range addrs {
		if err := checkAddress(address); err != nil {
			return nil, err
		}
	}
	o := defaultOptions()
	for _, option := range opts {
		option(&o)
	}
	o.secretFromEnvironment()
	if !o.connectionsPerNodeSet {
		o.connectionsPerNode = 1
		if len(addrs) == 1 {
			o.connectionsPerNode = connectionsPerSingleNode
		}
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	if err := o.buildTLS(); err != nil {
		return nil, err
	}
	started := time.Now()
	c := &Client{router: newRouter(addrs, o)}
	if err := c.router.waitReady(ctx); err != nil {
		if ctx.Err() != nil {
			c.router.close()
			return nil, err
		}
		failed := c.router.noConnection(time.Since(started))
		c.router.close()
		return nil, failed
	}
	return c, nil
}

// Name is the name the server gave the client's secret (WithSecret) when a
// connection last authenticated; empty without a secret.
func (c *Client) Name() string {
	if name := c.router.name.Load(); name != nil {
		return *name
	}
	return ""
}

// checkAddress refuses an address no server could name in an M reply.
func checkAddress(address string) error {
	if address == "" || address == "-" || strings.ContainsAny(address, " \t\r\n\x00") {
		return &ArgumentError{Arg: "addrs", Reason: fmt.Sprintf("%q is not a server address (host:port)", address)}
	}
	if _, _, err := net.SplitHostPort(address); err != nil {
		return &ArgumentError{Arg: "addrs", Reason: fmt.Sprintf("%q is not a server address (host:port)", address)}
	}
	return nil
}

// Close closes the connections, after the server has answered what was
// already sent (for at most a second), and fails requests still waiting
// with ErrClosed. Requests queued on a connection still making its first
// connect go out once it is made (within the connect timeout). Locks still
// held stay held until their leases run out. Close returns once the
// client's goroutines have ended; it always returns nil, and closing twice
// does nothing.
func (c *Client) Close() error {
	c.router.close()
	return nil
}

// leaseRange names the leases the client accepts; the server refuses a
// lease above its --max-lease with bad-lease.
const leaseRange = "1ms to the server's --max-lease (default 24h)"

// checkLease turns a lease into milliseconds, refusing one under 1ms.
func checkLease(lease time.Duration) (uint64, error) {
	if lease <= 0 {
		return 0, &ArgumentError{Arg: "lease", Reason: fmt.Sprintf("%v is outside %s", lease, leaseRange)}
	}
	return millisecondsUp(lease), nil
}

// The wait forms of Acquire, the same three in every official client
// (clients/README.md): NoLimit waits in the key's queue for as long as it
// takes, TryOnce takes the key only if it is free now (asking the server
// for the shortest wait the protocol can express, 1ms, so the acquire is
// never queued behind the holder longer than the server's timer tick), and
// any duration from 1ms to WaitMax waits up to that long.
const (
	// NoLimit is the wait of an acquire that waits without limit (0 on the
	// wire). It is the largest Duration, so it is never computed by
	// accident from a deadline that has passed.
	NoLimit time.Duration = math.MaxInt64
	// TryOnce is the wait of an acquire that takes the key only if it is
	// free: Acquire with TryOnce is TryAcquire. A bare 0 means the same,
	// as in every official client.
	TryOnce time.Duration = 0
)

// waitRange names the waits Acquire accepts, for its *ArgumentError.
const waitRange = "TryOnce (0), 1ms to 24h, or NoLimit"

// Acquire acquires key for lease, waiting in the key's queue as wait says:
// NoLimit (without limit), TryOnce (only if the key is free now, as
// TryAcquire), or a duration up to WaitMax. It blocks until the server
// answers or ctx ends.
//
// It returns the Lock, or ErrTimeout if the wait ran out with nothing
// granted. The lease is counted from the grant and rounded up to a
// millisecond, and so is the wait. Locks are not re-entrant: a second
// acquire of a key this client holds waits behind the holder.
//
// If ctx ends first, Acquire returns ctx.Err() and gives the request up:
// a grant that arrives for it anyway is released at once. The request
// stays queued on the server until then, or until its wait runs out.
//
// If the connection carrying the acquire breaks, it moves to the next
// connection with the wait it has left. If no connection is usable (a
// server restarting, say), it waits for one within its wait, or within the
// connect limit (WithConnectLimit, 10s) if it has no wait limit or tries
// once, and then fails with a *ConnectionError, which errors.Is matches
// with ErrNoConnection. An acquire cut after the server granted it leaves
// that grant to run out its lease.
//
// Errors: an *ArgumentError (errors.Is ErrBadArgument) for a bad key (1 to
// 250 bytes, no space, tab, CR, LF or NUL, and not "-"), a lease under
// 1ms, or a wait that is negative or over 24h and not NoLimit; a
// *ServerError if the server refused the request (bad-lease beyond its
// --max-lease, too-many-waiters...); ErrNoConnection, ErrNoActive,
// ErrTooManyInFlight, ErrClosed, a *ProtocolError.
func (c *Client) Acquire(ctx context.Context, key string, lease, wait time.Duration) (*Lock, error) {
	switch {
	case wait == NoLimit:
		return c.acquire(ctx, key, lease, 0, false)
	case wait == TryOnce:
		return c.TryAcquire(ctx, key, lease)
	case wait < 0 || wait > WaitMax:
		return nil, &ArgumentError{Arg: "wait", Reason: fmt.Sprintf("%v is outside %s", wait, waitRange)}
	}
	return c.acquire(ctx, key, lease, wait, false)
}

// TryAcquire acquires key for lease only if it is free now: it asks for the
// shortest wait (1ms, see WithTryAcquireWait) and returns ErrTimeout if the
// key is held. With no usable connection it waits for one up to the connect
// limit, as its own wait is too short to cover a reconnect. Errors as for
// Acquire.
func (c *Client) TryAcquire(ctx context.Context, key string, lease time.Duration) (*Lock, error) {
	return c.acquire(ctx, key, lease, c.router.options.tryAcquireWait, true)
}

func (c *Client) acquire(ctx context.Context, key string, lease, wait time.Duration, tryOnce bool) (*Lock, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	leaseMs, err := checkLease(lease)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	o := c.router.newOperation(kindAcquire, key, true)
	o.leaseMs = leaseMs
	o.waitMs = millisecondsUp(wait)
	o.tryOnce = tryOnce
	o.started = time.Now()
	result, err := c.request(ctx, o)
	if err != nil {
		return nil, err
	}
	// The lease is counted from the grant's arrival: the acquire may have
	// waited in the key's queue, or for a connection, longer than the lease.
	return newLock(c, key, result.token, lease, time.Now().Add(lease)), nil
}

// request submits o and waits for its outcome or for ctx to end; the
// outcome's error, if it has one.
func (c *Client) request(ctx context.Context, o *operation) (outcome, error) {
	c.router.submit(o)
	var result outcome
	if ctx.Done() == nil {
		// A context that never ends spares the select.
		result = <-o.done
	} else {
		select {
		case result = <-o.done:
		case <-ctx.Done():
			if o.state.CompareAndSwap(waiterPending, waiterAbandoned) {
				// Not recycled: the router still holds it.
				return outcome{}, ctx.Err()
			}
			// The outcome came first and is on its way.
			result = <-o.done
		}
	}
	recycle(o)
	return result, result.err
}

// errNoAnswer is what a ping, stats or inspect request that succeeded
// without an answer reports; only P, S and I replies end one with success,
// and each carries its answer, so it cannot happen.
var errNoAnswer = &ProtocolError{Reason: "a request ended without its reply's answer"}

// Ping asks a node for its role, its epoch and the active node it knows.
// It goes to the active node if one is known, else to the next connection
// round-robin; every node answers, active or not.
func (c *Client) Ping(ctx context.Context) (Pong, error) {
	if err := ctx.Err(); err != nil {
		return Pong{}, err
	}
	result, err := c.request(ctx, c.router.newOperation(kindPing, "", true))
	if err != nil {
		return Pong{}, err
	}
	if result.answer == nil {
		return Pong{}, errNoAnswer
	}
	return result.answer.pong, nil
}

// Stats returns a node's counters and gauges, as one JSON object (README
// "Protocol"). Like Ping, it goes to the active node if one is known.
func (c *Client) Stats(ctx context.Context) (json.RawMessage, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	result, err := c.request(ctx, c.router.newOperation(kindStats, "", true))
	if err != nil {
		return nil, err
	}
	if result.answer == nil {
		return nil, errNoAnswer
	}
	return json.RawMessage(result.answer.stats), nil
}

// Inspect asks who holds key now, how long its lease has left and how many
// acquires wait for it (the I request). It changes nothing on the server,
// and the answer may be out of date by the time it returns: to take a key,
// acquire it rather than inspect it first.
//
// Like an acquire, it is answered by the active node (a standby's redirect
// is followed) and moves to the next connection if its own breaks.
//
// Errors: an *ArgumentError for a bad key (as for Acquire), before
// anything is sent; a *ServerError if the server refused it (code bad-op
// from a server older than I, which also drops the connections it went
// on); ErrNoConnection, ErrNoActive, ErrTooManyInFlight, ErrClosed, a
// *ProtocolError; ctx.Err() if ctx ends first.
func (c *Client) Inspect(ctx context.Context, key string) (KeyState, error) {
	if err := checkKey(key); err != nil {
		return KeyState{}, err
	}
	if err := ctx.Err(); err != nil {
		return KeyState{}, err
	}
	result, err := c.request(ctx, c.router.newOperation(kindInspect, key, true))
	if err != nil {
		return KeyState{}, err
	}
	if result.answer == nil {
		return KeyState{}, errNoAnswer
	}
	return result.answer.state, nil
}
