package ringlock

// The connection set: round-robin over every connection, the active node's
// first once an M reply has named it, and carrying out each step of a
// request (docs/protocol.md §4).

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// topology is the nodes and their connections. It is never changed in
// place: adding a node (learned from an M reply) stores a new one, so
// senders read it without a lock, and a node's index stays valid.
type topology struct {
	nodes []*node
	// connections is every node's connections, for round-robin.
	connections []*connection
}

type node struct {
	address     string
	connections []*connection
}

// router is everything the client's goroutines share.
type router struct {
	options options
	policy  policy

	topology atomic.Pointer[topology]
	// adding serializes the nodes added from M replies, and Close.
	adding sync.Mutex
	// next is the round-robin position.
	next atomic.Uint64
	// active is the active node's index plus one; 0 while none is known.
	active atomic.Int64

	closed atomic.Bool
	// done is closed when the client closes, to end reconnect pauses.
	done       chan struct{}
	goroutines sync.WaitGroup

	// retries holds the requests waiting for a retry, with their timers.
	retriesMu sync.Mutex
	retries   map[*operation]*time.Timer

	// firstConnects counts the connections whose first connect is over;
	// ready is closed when one succeeded or all have failed.
	firstMu       sync.Mutex
	firstConnects int
	firstUp       bool
	firstError    error
	readyClosed   bool
	ready         chan struct{}

	// name is the name the server gave the client's secret when a
	// connection last authenticated.
	name atomic.Pointer[string]
}

func newRouter(addresses []string, o options) *router {
	r := &router{
		options: o,
		policy: policy{retryInterval: o.releaseRetryInterval, retryFor: o.releaseRetryFor, redirectLimit: o.redirectLimit,
			connectLimit: o.connectLimit},
		done:    make(chan struct{}),
		retries: make(map[*operation]*time.Timer),
		ready:   make(chan struct{}),
	}
	t := &topology{}
	r.adding.Lock()
	for _, address := range addresses {
		t = r.withNode(t, address)
	}
	r.topology.Store(t)
	for _, c := range t.connections {
		c.start()
	}
	r.adding.Unlock()
	return r
}

// withNode returns t plus a node at address, with its connections made but
// not started: the caller stores the topology first and then starts them,
// as a connection whose first connect fails at once counts the topology's
// connections. The caller holds r.adding.
func (r *router) withNode(t *topology, address string) *topology {
	index := len(t.nodes)
	n := &node{address: address}
	for range r.options.connectionsPerNode {
		c := newConnection(address, index, r)
		n.connections = append(n.connections, c)
	}
	grown := &topology{
		nodes:       append(t.nodes[:len(t.nodes):len(t.nodes)], n),
		connections: append(t.connections[:len(t.connections):len(t.connections)], n.connections...),
	}
	return grown
}

// dial connects to address within the connect timeout, or until ctx ends;
// with TLS, the handshake is part of the connect, within the same timeout.
func (r *router) dial(ctx context.Context, address string) (net.Conn, error) {
	deadline := time.Now().Add(r.options.connectTimeout)
	conn, err := r.options.dial(ctx, address, r.options.connectTimeout)
	if err == nil {
		tuneSocket(conn, r.options.suspectAfter+r.options.pingTimeout)
	}
	if err != nil || r.options.tls == nil {
		return conn, err
	}
	return handshake(ctx, conn, address, r.options.tls, deadline)
}

// firstConnectDone records how a connection's first connect went.
func (r *router) firstConnectDone(up bool, err error) {
	r.firstMu.Lock()
	defer r.firstMu.Unlock()
	r.firstConnects++
	if err != nil {
		r.firstError = err
	}
	if r.readyClosed {
		return
	}
	if up || r.firstConnects == len(r.topology.Load().connections) {
		r.firstUp = up
		r.readyClosed = true
		close(r.ready)
	}
}

// waitReady waits until a connection is up or every first connect failed;
// the error of the last failed connect if none is up.
func (r *router) waitReady(ctx context.Context) error {
	select {
	case <-r.ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	r.firstMu.Lock()
	defer r.firstMu.Unlock()
	if r.firstUp {
		return nil
	}
	return r.firstError
}

// submit starts a request and returns it.
func (r *router) submit(o *operation) {
	at := o.started
	if o.needsClock() && at.IsZero() {
		at = time.Now()
		o.started = at
	}
	r.sendAt(o, at)
}

// newOperation makes a request tried on as many connections as the client
// has. One that a caller waits for comes from a pool: at a few hundred
// thousand requests a second, allocating each with its channel made the
// garbage collector a fifth of the client's work.
func (r *router) newOperation(k kind, key string, waited bool) *operation {
	tries := len(r.topology.Load().connections)
	if !waited {
		return newOperation(k, key, tries, &r.policy, false)
	}
	o := operationPool.Get().(*operation)
	o.kind, o.key, o.triesLeft, o.redirectsLeft = k, key, max(tries, 1), r.policy.redirectLimit
	return o
}

var operationPool = sync.Pool{New: func() any { return newOperation(0, "", 1, &policy{}, true) }}

// recycle returns o to the pool once its outcome was received, when
// nothing else refers to it any more.
func recycle(o *operation) {
	done := o.done
	*o = operation{done: done}
	operationPool.Put(o)
}

// handle carries out s for o.
func (r *router) handle(o *operation, s step) {
	switch s.kind {
	case stepDone:
		r.finish(o, s.outcome)
	case stepResend:
		r.send(o)
	case stepRedirect:
		r.sendToActive(o)
	case stepRetryAt:
		r.schedule(o, s.at)
	case stepNoConnection:
		r.finish(o, outcome{err: r.noConnectionOf(s.waited, s.shuttingDown)})
	}
}

// connectionError is the error of a request that found no usable
// connection within its limit after waiting waited: every node's address
// with the error of its last attempt (the latest among its connections).
func (r *router) connectionError(waited time.Duration) *ConnectionError {
	t := r.topology.Load()
	e := &ConnectionError{Waited: waited, Addresses: make([]AddressError, 0, len(t.nodes))}
	for _, n := range t.nodes {
		var latest time.Time
		var last error
		for _, c := range n.connections {
			at, err := c.lastFailure()
			if err != nil && at.After(latest) {
				latest, last = at, err
			}
		}
		e.Addresses = append(e.Addresses, AddressError{Address: n.address, Err: last})
	}
	return e
}

// noConnection is the error of a request that found no usable connection
// within its limit: the secret's refusal if every address refused it (the
// request could not have gone anywhere with that secret), else every
// address with the error of its last attempt, refusals among them.
func (r *router) noConnection(waited time.Duration) error {
	failed := r.connectionError(waited)
	var first *AuthError
	for _, address := range failed.Addresses {
		var refused *AuthError
		if !errors.As(address.Err, &refused) {
			return failed
		}
		if first == nil {
			first = refused
		}
	}
	if first == nil {
		return failed
	}
	return first
}

// noConnectionOf is noConnection for a request that a stopping server may
// have answered shutting-down on the way, which its error then says.
func (r *router) noConnectionOf(waited time.Duration, shuttingDown bool) error {
	err := r.noConnection(waited)
	if failed, ok := err.(*ConnectionError); ok && shuttingDown {
		failed.ShuttingDown = true
	}
	return err
}

// expire ends an acquire whose wait ran out before it could be (re)sent:
// with no connection if it was waiting for one, else timed out, as it
// would have on the server.
func (r *router) expire(o *operation, at time.Time) {
	if !o.waitingSince.IsZero() {
		r.finish(o, outcome{err: r.noConnectionOf(o.waited(at), o.shuttingDown)})
		return
	}
	r.finish(o, outcome{err: ErrTimeout})
}

// connectionUp sends at once the requests waiting for a usable connection:
// one just came up.
func (r *router) connectionUp() {
	r.retriesMu.Lock()
	defer r.retriesMu.Unlock()
	for o, timer := range r.retries {
		// The timer's function sends it; stopped before it ran, it is set
		// to run now.
		if !o.waitingSince.IsZero() && timer.Stop() {
			timer.Reset(0)
		}
	}
}

// abandoned reports whether nobody waits for o any more and sending it
// again is pointless. A release still goes: the key should be freed.
func abandoned(o *operation) bool {
	return o.kind != kindRelease && o.done != nil && o.state.Load() == waiterAbandoned
}

// now reads the clock if o needs it.
func now(o *operation) time.Time {
	if o.needsClock() {
		return time.Now()
	}
	return time.Time{}
}

// send sends o on the next usable connection, the active node's first.
func (r *router) send(o *operation) {
	r.sendAt(o, now(o))
}

// sendAt is send with the time read by the caller if o needs it.
func (r *router) sendAt(o *operation, at time.Time) {
	if r.closed.Load() {
		r.finish(o, outcome{err: ErrClosed})
		return
	}
	if abandoned(o) {
		return
	}
	if o.expired(at) {
		r.expire(o, at)
		return
	}
	// Its wait paused before it is offered: once a connection took it, a
	// cut may set it again at any moment on the connection's reader.
	waitingSince, waitedBefore := o.goOut(at)
	// active before topology: noteMoved stores a grown topology before
	// naming a new node active, so the topology read after holds it.
	active := r.active.Load() - 1
	t := r.topology.Load()
	first := t.connections
	if active >= 0 {
		first = t.nodes[active].connections
	}
	start := r.turn(first)
	full := false
	if active >= 0 {
		switch r.offer(first, start, o, at) {
		case refusedNone:
			return
		case refusedFull:
			full = true
		}
	}
	switch r.offer(t.connections, start, o, at) {
	case refusedNone:
		return
	case refusedFull:
		full = true
	}
	o.stayBack(waitingSince, waitedBefore)
	why := unsentNoConnection
	if full {
		why = unsentFull
	}
	r.handle(o, o.onUnsent(why, time.Now(), &r.policy))
}

// sendToActive sends o on the active node's connections only, after an M
// reply.
func (r *router) sendToActive(o *operation) {
	if r.closed.Load() {
		r.finish(o, outcome{err: ErrClosed})
		return
	}
	if abandoned(o) {
		return
	}
	at := now(o)
	if o.expired(at) {
		r.expire(o, time.Now())
		return
	}
	why := unsentActiveUnreachable
	if active := r.active.Load() - 1; active >= 0 {
		connections := r.topology.Load().nodes[active].connections
		waitingSince, waitedBefore := o.goOut(at)
		switch r.offer(connections, r.turn(connections), o, at) {
		case refusedNone:
			return
		case refusedFull:
			why = unsentFull
		}
		o.stayBack(waitingSince, waitedBefore)
	}
	r.handle(o, o.onUnsent(why, time.Now(), &r.policy))
}

// turn is the round-robin position to offer a request from, when it goes
// to connections first. The turn passes a write at a time, not a request
// at a time: a request joins the batch the connection at the position is
// gathering for its next write, and only a request that finds none moves
// the position on. Under load from many goroutines each write then
// carries about as many requests as one connection's would, instead of
// each connection's writes carrying a share of them (a write on loopback
// costs several microseconds whatever it carries); one request at a time
// still goes to each connection in turn. A batch stops gathering at
// gatherRequestsMax, so a connection whose write is stuck does not draw
// every request: it then takes one each time the turn comes round.
func (r *router) turn(connections []*connection) uint64 {
	at := r.next.Load()
	if connections[at%uint64(len(connections))].gathering.Load() {
		return at
	}
	return r.next.Add(1)
}

// offer offers o to connections round-robin from start; refusedFull if none
// took it and some refused only for being full.
func (r *router) offer(connections []*connection, start uint64, o *operation, at time.Time) refusal {
	worst := refusedUnusable
	count := uint64(len(connections))
	for offset := range count {
		switch connections[(start+offset)%count].trySend(o, at, r.options.maxInFlight) {
		case refusedNone:
			return refusedNone
		case refusedFull:
			worst = refusedFull
		}
	}
	return worst
}

// schedule sends o again at the instant at.
func (r *router) schedule(o *operation, at time.Time) {
	r.retriesMu.Lock()
	if r.closed.Load() {
		r.retriesMu.Unlock()
		r.finish(o, outcome{err: ErrClosed})
		return
	}
	r.retries[o] = time.AfterFunc(time.Until(at), func() {
		r.retriesMu.Lock()
		_, waiting := r.retries[o]
		delete(r.retries, o)
		r.retriesMu.Unlock()
		// Close took it if it is gone.
		if waiting {
			r.send(o)
		}
	})
	r.retriesMu.Unlock()
}

// finish hands the outcome to whoever waits for it. A grant nobody waits
// for any more (its caller gave up) is released at once.
func (r *router) finish(o *operation, result outcome) {
	if o.done == nil {
		return
	}
	if o.state.CompareAndSwap(waiterPending, waiterDone) {
		o.done <- result
		return
	}
	if o.kind == kindAcquire && result.err == nil && !r.closed.Load() {
		release := r.newOperation(kindRelease, o.key, false)
		release.token = result.token
		r.submit(release)
	}
}

// cut takes back the requests of a connection that was cut; cause is what
// they report if they cannot move on, and answered tells whether the
// connection had answered anything.
func (r *router) cut(operations []*operation, cause error, answered bool) {
	if r.closed.Load() {
		r.abort(operations)
		return
	}
	at := time.Now()
	for _, o := range operations {
		if answered {
			o.connectionAnswered()
		}
		r.handle(o, o.onCut(cause, at, &r.policy))
	}
}

// abort ends requests that can go nowhere because the client is closing.
func (r *router) abort(operations []*operation) {
	for _, o := range operations {
		r.finish(o, outcome{err: ErrClosed})
	}
}

// noteMoved learns from an M reply received from node from; active is the
// address it named, empty for "-".
func (r *router) noteMoved(from int, active string) {
	if active == "" {
		// The node we preferred no longer knows an active: spread requests
		// again until some node names one.
		r.active.CompareAndSwap(int64(from)+1, 0)
		return
	}
	index := findNode(r.topology.Load(), active)
	if index < 0 {
		r.adding.Lock()
		t := r.topology.Load()
		// Another reader may have added it meanwhile.
		index = findNode(t, active)
		if index < 0 && len(t.nodes) < nodesMax && !r.closed.Load() {
			index = len(t.nodes)
			grown := r.withNode(t, active)
			r.topology.Store(grown)
			for _, c := range grown.nodes[index].connections {
				c.start()
			}
		}
		r.adding.Unlock()
	}
	if index >= 0 {
		r.active.Store(int64(index) + 1)
	}
}

// findNode is the index of the node with this address, by the same text or
// the same IP and port; -1 if none.
func findNode(t *topology, address string) int {
	for index, n := range t.nodes {
		if n.address == address {
			return index
		}
	}
	wanted, err := netip.ParseAddrPort(address)
	if err != nil {
		return -1
	}
	for index, n := range t.nodes {
		if known, err := netip.ParseAddrPort(n.address); err == nil && known == wanted {
			return index
		}
	}
	return -1
}

// sleep pauses for d, or less if the client closes; false if it closed.
func (r *router) sleep(d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-r.done:
		return false
	}
}

// close closes every connection, fails the requests waiting for a retry,
// and waits for the connections' goroutines to end.
func (r *router) close() {
	r.adding.Lock()
	if r.closed.Swap(true) {
		r.adding.Unlock()
		return
	}
	t := r.topology.Load()
	r.adding.Unlock()
	close(r.done)
	for _, c := range t.connections {
		c.close()
	}
	r.retriesMu.Lock()
	waiting := make([]*operation, 0, len(r.retries))
	for o, timer := range r.retries {
		timer.Stop()
		waiting = append(waiting, o)
	}
	clear(r.retries)
	r.retriesMu.Unlock()
	r.abort(waiting)
	r.goroutines.Wait()
}
