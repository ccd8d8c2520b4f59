package ringlock

// One persistent connection to one node, and its two goroutines.
//
//   - The reader owns the connection's life: it connects, reads and pairs
//     replies, and when the socket breaks it hands every request in flight
//     back to the router (which moves or retries them), and connects again:
//     at once, then after the growing pauses of reconnectDelay.
//   - The writer sends what callers queued. Callers append encoded lines to
//     the connection's buffer under its lock; everything queued while a
//     write is under way goes out in the next single write, which is what
//     makes pipelining from many goroutines cheap: one system call carries
//     the requests of every caller that queued meanwhile. The writer lets
//     the goroutines ready to run queue theirs before it writes, and a
//     caller that finds flushRequests queued writes them itself, so that
//     the server starts on them while the rest are queued. Only that caller
//     can block on the socket, and only while the kernel's send buffer is
//     full (a server that stopped reading).
//
// A third goroutine, while a socket is up, watches it for silence (see
// watch): a connection with requests in flight that reads nothing for
// suspectAfter is sent P, and cut if nothing comes for pingTimeout after,
// so that a host that vanished or a partition ends or moves its requests
// within their limits rather than when the link comes back.
//
// A request is recorded in the pairing table and appended to the output
// buffer under the same lock, so the table's order for an (op, key) is the
// order the lines go out on the wire.

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// closeLinger is how long a closing client waits for the server to answer
// what it flushed (the releases of a shutting-down application) before it
// drops the socket.
const closeLinger = time.Second

// flushRequests is how many queued requests make a caller write them
// itself rather than leave them to the writer (see trySend). Measured with
// 64 goroutines on one CPU of a 2-CPU VM, where a write on loopback costs
// about 7 µs whatever it carries: at 16 the writes, twice as many, cost
// more than the overlap they buy; 32 sends the half of 64 requests in
// flight on one connection while the server answers the other half.
const flushRequests = 32

// gatherRequestsMax is the most requests the router's turn adds to one
// batch (see router.turn). Batches end at flushRequests when writes keep
// up, so it is reached only while a write is stuck or slow.
const gatherRequestsMax = 4 * flushRequests

// writerYieldsMax bounds how many times the writer lets ready goroutines
// run before it writes (see runWriter).
const writerYieldsMax = 8

// phase is where a connection is in its life.
type phase uint8

const (
	// phaseConnecting: its first connect is under way. It takes requests,
	// which go out once connected (or move on if the connect fails), so a
	// new client or a node learned from M serves at once.
	phaseConnecting phase = iota
	// phaseUp: connected.
	phaseUp
	// phaseDown: broken; left out until the reader reconnects it.
	phaseDown
	// phaseClosed: the client is closing.
	phaseClosed
)

// refusal says why a connection did not take a request.
type refusal uint8

const (
	refusedNone refusal = iota
	refusedUnusable
	refusedFull
)

type connection struct {
	// address is the node's, as the client was given it or learned it.
	address string
	// node is the node's index in the router's topology.
	node   int
	router *router

	mu    sync.Mutex
	phase phase
	conn  net.Conn
	// out holds encoded requests not yet handed to the writer.
	out []byte
	// spare is the last batch's buffer, kept to swap with out.
	spare    []byte
	inFlight pairing
	// queued counts the requests in out.
	queued int
	// gathering is set while the connection is up and out holds requests
	// no write has taken yet: the batch the router's turn joins (see
	// router.turn). A connection still connecting does not gather, so that
	// requests are not held on a connect that may fail, nor does one whose
	// batch reached gatherRequestsMax.
	gathering atomic.Bool
	// writerWoken is set while the writer has been woken and has not yet
	// found out empty, so callers wake it only once per batch.
	writerWoken bool
	// writeMu is held by whoever takes a batch from out and writes it, so
	// batches reach the socket in the order they were queued.
	writeMu sync.Mutex
	// wake has room for one signal to the writer.
	wake chan struct{}
	// dialContext is the reader's connects'; cancelDial ends the one under
	// way (see close).
	dialContext context.Context
	cancelDial  context.CancelFunc

	// failure is how the last connect failed or the last socket broke,
	// and failedAt when; both under mu.
	failure  error
	failedAt time.Time
	// replied and readError describe the socket being read; the reader
	// alone uses them.
	replied   bool
	readError error
	// reads counts the reads that returned bytes, for watch; silenced is
	// set by watch when it cuts the socket for its silence, and says why.
	reads    atomic.Uint64
	silenced atomic.Pointer[error]
}

// lastFailure is how the last connect failed or the last socket broke, and
// when; a nil error if neither happened yet.
func (c *connection) lastFailure() (time.Time, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failedAt, c.failure
}

func (c *connection) noteFailure(err error) {
	c.mu.Lock()
	c.failure, c.failedAt = err, time.Now()
	c.mu.Unlock()
}

func newConnection(address string, node int, r *router) *connection {
	c := &connection{address: address, node: node, router: r, wake: make(chan struct{}, 1)}
	c.dialContext, c.cancelDial = context.WithCancel(context.Background())
	return c
}

// start runs the connection's reader and writer goroutines.
func (c *connection) start() {
	c.router.goroutines.Add(2)
	go c.runWriter()
	go c.runReader()
}

func (c *connection) usable() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.phase == phaseUp
}

// wakeWriter signals the writer; the caller has just set c.writerWoken.
func (c *connection) wakeWriter() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// trySend queues o on this connection, or says why it took nothing.
func (c *connection) trySend(o *operation, now time.Time, inFlightMax int) refusal {
	c.mu.Lock()
	if c.phase != phaseConnecting && c.phase != phaseUp {
		c.mu.Unlock()
		return refusedUnusable
	}
	if c.inFlight.len() >= inFlightMax {
		c.mu.Unlock()
		return refusedFull
	}
	c.out = o.encode(c.out, now)
	c.queued++
	switch {
	case c.queued == 1 && c.conn != nil:
		c.gathering.Store(true)
	case c.queued == gatherRequestsMax:
		// No write has taken the batch: the socket may be stuck (a
		// server that stopped reading). The turn moves on, and this
		// connection gathers again only once a write took its queue.
		c.gathering.Store(false)
	}
	c.inFlight.push(o)
	// Before the connect, install wakes the writer once connected.
	wake := c.conn != nil && !c.writerWoken
	if wake {
		c.writerWoken = true
	}
	// Past flushRequests the caller writes what is queued itself, at once,
	// so the server works on it while the client queues the next ones: a
	// single write per round would leave one side idle while the other
	// works. The writer still sends the rest.
	flush := c.conn != nil && c.queued >= flushRequests
	c.mu.Unlock()
	if wake {
		c.wakeWriter()
	}
	// If a write is under way, the writer sends these after it.
	if flush && c.writeMu.TryLock() {
		c.writeOut(false)
		c.writeMu.Unlock()
	}
	return refusedNone
}

// install makes a fresh socket the connection's; false if the client closed
// with nothing queued. Requests queued while the first connect was under
// way (the release of a grant nobody waits for, say) still go out on it
// before the writer closes it.
func (c *connection) install(conn net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.phase == phaseClosed {
		if len(c.out) == 0 {
			return false
		}
		boundClosing(conn)
	} else {
		c.phase = phaseUp
	}
	c.conn = conn
	// Requests queued while the connect was under way go out now.
	if len(c.out) > 0 && !c.writerWoken {
		c.writerWoken = true
		c.wakeWriter()
	}
	return true
}

// takeDown marks the connection broken and takes back every request in
// flight; what was not written yet is dropped with them.
func (c *connection) takeDown() []*operation {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.phase != phaseClosed {
		c.phase = phaseDown
	}
	c.conn = nil
	c.out = c.out[:0]
	c.queued = 0
	c.gathering.Store(false)
	// A closing writer waiting for the first connect's outcome may go.
	if c.phase == phaseClosed && !c.writerWoken {
		c.writerWoken = true
		c.wakeWriter()
	}
	operations := c.inFlight.drain()
	// The connection's own pings go nowhere else.
	kept := operations[:0]
	for _, o := range operations {
		if !o.probe {
			kept = append(kept, o)
		}
	}
	return kept
}

// watch checks the socket conn every tick until stop closes: once requests
// are in flight and nothing was read for suspectAfter, it sends P; if
// nothing is read for pingTimeout after that, it closes the socket, which
// the reader then handles as any broken connection. It counts reads rather
// than timing them, so reading costs no clock call.
func (c *connection) watch(conn net.Conn, stop <-chan struct{}, finished chan<- struct{}) {
	defer c.router.goroutines.Done()
	defer close(finished)
	o := &c.router.options
	ticker := time.NewTicker(max(min(o.suspectAfter, o.pingTimeout)/4, time.Millisecond))
	defer ticker.Stop()
	quietSince := time.Now()
	reads := c.reads.Load()
	busy := false
	var pingedAt time.Time
	for {
		select {
		case <-stop:
			return
		case now := <-ticker.C:
			if n := c.reads.Load(); n != reads {
				reads, quietSince, pingedAt = n, now, time.Time{}
			}
			c.mu.Lock()
			inFlight := c.inFlight.len()
			c.mu.Unlock()
			if inFlight == 0 {
				busy, pingedAt = false, time.Time{}
				continue
			}
			if !busy {
				// Silence counts from when requests went out, at the
				// earliest.
				busy, quietSince = true, now
			}
			switch {
			case !pingedAt.IsZero() && now.Sub(pingedAt) >= o.pingTimeout:
				err := fmt.Errorf("no answer for %v, not even to a ping: %w",
					now.Sub(quietSince).Round(time.Millisecond), os.ErrDeadlineExceeded)
				c.silenced.Store(&err)
				conn.Close()
				return
			case pingedAt.IsZero() && now.Sub(quietSince) >= o.suspectAfter:
				pingedAt = now
				probe := c.router.newOperation(kindPing, "", false)
				probe.probe = true
				c.trySend(probe, now, o.maxInFlight)
			}
		}
	}
}

// close starts closing: the writer flushes what is queued and half-closes
// the socket, and the reader reads the last replies and stops.
func (c *connection) close() {
	c.mu.Lock()
	c.phase = phaseClosed
	c.writerWoken = true
	if c.conn != nil {
		boundClosing(c.conn)
	}
	// A connect under way ends now, unless requests are queued for it (the
	// first connect, with the release of a grant nobody waits for, say):
	// that one carries on, within the connect timeout, and they go out on
	// it (see install).
	if c.conn != nil || len(c.out) == 0 {
		c.cancelDial()
	}
	c.mu.Unlock()
	c.wakeWriter()
}

// boundClosing bounds the writes and reads left on a closing connection's
// socket: a server that stopped reading could hold a write, and with it
// Close, forever. closeGracefully shortens the read deadline once
// everything is written.
func boundClosing(conn net.Conn) {
	now := time.Now()
	_ = conn.SetWriteDeadline(now.Add(closeLinger))
	_ = conn.SetReadDeadline(now.Add(2 * closeLinger))
}

func (c *connection) runWriter() {
	defer c.router.goroutines.Done()
	for range c.wake {
		c.mu.Lock()
		queued := c.queued
		c.mu.Unlock()
		// Let the goroutines that are ready to run queue their requests
		// first, so that they go out in one write. Without this, the
		// scheduler runs a goroutine it just woke next, ahead of the rest:
		// the writer, woken by the first caller that a read completed,
		// would send that caller's request alone, and so on. One yield is
		// not always enough (a goroutine that ran meanwhile may have woken
		// more), so the writer yields again while the queue grows, and
		// writes once a yield added nothing.
		for yields := 0; queued < flushRequests && yields < writerYieldsMax; yields++ {
			runtime.Gosched()
			c.mu.Lock()
			grown := c.queued
			c.mu.Unlock()
			if grown == queued {
				break
			}
			queued = grown
		}
		c.writeMu.Lock()
		open := c.writeOut(true)
		c.writeMu.Unlock()
		if !open {
			return
		}
	}
}

// writeOut writes what is queued; the caller holds c.writeMu. As the
// writer (drain), it writes until out is empty and then marks the writer
// asleep, or, if the client is closing, closes the socket gracefully and
// returns false. Callers that flush write one batch.
func (c *connection) writeOut(drain bool) bool {
	c.mu.Lock()
	for {
		// Closing with requests queued but no socket: the first connect is
		// under way, and either installs one or takes the requests back.
		if drain && c.phase == phaseClosed && len(c.out) == 0 {
			conn := c.conn
			c.mu.Unlock()
			if conn != nil {
				closeGracefully(conn)
			}
			return false
		}
		if len(c.out) == 0 || c.conn == nil {
			if drain {
				c.writerWoken = false
			}
			c.mu.Unlock()
			return true
		}
		batch, conn := c.out, c.conn
		c.out = c.spare[:0]
		c.spare = nil
		c.queued = 0
		c.gathering.Store(false)
		c.mu.Unlock()
		if _, err := conn.Write(batch); err != nil {
			// The reader sees the socket fail and takes the requests back.
			conn.Close()
		}
		c.mu.Lock()
		c.spare = batch[:0]
		if !drain {
			c.mu.Unlock()
			return true
		}
	}
}

// closeGracefully sends a FIN, so that the server reads everything flushed
// and answers it, and bounds how long the reader waits for those answers.
func closeGracefully(conn net.Conn) {
	switch conn := conn.(type) {
	case *net.TCPConn:
		_ = conn.CloseWrite()
	case *tls.Conn:
		// close_notify: the server answers what came before it, then closes.
		_ = conn.CloseWrite()
	}
	_ = conn.SetReadDeadline(time.Now().Add(closeLinger))
}

func (c *connection) runReader() {
	defer c.router.goroutines.Done()
	defer c.cancelDial()
	r := c.router
	first := true
	// attempt counts the reconnects since a connection last worked; the
	// first goes at once, the others after growing pauses.
	attempt := 0
	for {
		conn, err := r.dial(c.dialContext, c.address)
		if err == nil && r.options.secret != nil {
			// A refused secret fails the connection like a failed connect
			// (below): its requests move on or wait, and the attempt count
			// is not reset, so a wrong secret is retried with growing
			// pauses.
			if err = c.authenticate(conn); err != nil {
				conn.Close()
				if r.options.tls != nil {
					err = tlsReadFailure(c.address, err)
				}
			}
		}
		if err == nil {
			if !c.install(conn) {
				conn.Close()
				break
			}
			if first {
				r.firstConnectDone(true, nil)
				first = false
			}
			r.connectionUp()
			opened := time.Now()
			c.replied, c.readError = false, nil
			stop, finished := make(chan struct{}), make(chan struct{})
			r.goroutines.Add(1)
			go c.watch(conn, stop, finished)
			cause := c.readReplies(conn)
			close(stop)
			<-finished
			conn.Close()
			if silence := c.silenced.Swap(nil); silence != nil {
				c.readError = *silence
			}
			if c.readError != nil && r.options.tls != nil {
				c.readError = tlsReadFailure(c.address, c.readError)
			}
			switch {
			case c.readError != nil:
				c.noteFailure(c.readError)
			case cause == ErrNoConnection:
				c.noteFailure(io.EOF)
			default:
				c.noteFailure(cause)
			}
			r.cut(c.takeDown(), cause, c.replied)
			// A connection that answered, or stayed open for as long as
			// the longest pause, worked: the schedule starts over. One
			// closed at once after its connect (a server refusing
			// connections, a listener of a killed process) did not, or
			// the client would reconnect to it in a tight loop.
			if c.replied || time.Since(opened) >= r.options.reconnectDelayMax {
				attempt = 0
			}
		} else {
			c.noteFailure(err)
			if first {
				r.firstConnectDone(false, err)
				first = false
			}
			// Only a first connect has requests queued to hand back.
			r.cut(c.takeDown(), ErrNoConnection, false)
		}
		pause := reconnectDelay(attempt, r.options.reconnectDelayFirst, r.options.reconnectDelayMax, rand.Float64())
		attempt++
		if !r.sleep(pause) {
			break
		}
	}
	r.abort(c.takeDown())
}

// authReplyMargin is how long a connection waits for the answer to its U
// line beyond the connect timeout: the server answers a wrong secret only
// after 200 ms.
const authReplyMargin = time.Second

// authenticate sends "U <secret>" on a fresh socket, before any request, and
// reads the answer: nil once authenticated (the name is recorded), else why
// the connection cannot be used (an *AuthError if the server refused the
// secret). Nothing else is in flight yet, so the answer is the first line
// and is read here rather than paired (U replies carry no key).
func (c *connection) authenticate(conn net.Conn) error {
	r := c.router
	if err := conn.SetDeadline(time.Now().Add(r.options.connectTimeout + authReplyMargin)); err != nil {
		return err
	}
	if _, err := conn.Write(appendAuth(nil, r.options.secret())); err != nil {
		return err
	}
	// Byte by byte, so that nothing after the answer is taken from the
	// reader; this happens once per connection.
	var line []byte
	var one [1]byte
	for len(line) == 0 || line[len(line)-1] != '\n' {
		if len(line) > replyLineLenMax {
			return protocolError("reply line too long", nil)
		}
		if _, err := io.ReadFull(conn, one[:]); err != nil {
			return err
		}
		line = append(line, one[0])
	}
	if err := conn.SetDeadline(time.Time{}); err != nil {
		return err
	}
	name, code, err := parseAuthAnswer(bytes.TrimRight(line, "\r\n"))
	switch {
	case err != nil:
		return err
	case code == CodeAuthFailed || code == CodeAuthDisabled:
		return &AuthError{Address: c.address, Code: code}
	case code != "":
		return &ServerError{Code: code, Op: "-"}
	}
	r.name.Store(&name)
	return nil
}

// answered is one paired reply, acted on once the connection is unlocked.
type answered struct {
	operation *operation
	step      step
	// moved is set for an M reply; active is its address (nil for "-").
	moved  bool
	active string
}

// readReplies reads and pairs replies until the socket breaks or the server
// breaks the protocol; it returns the error a request cut off here reports
// if it cannot move on.
func (c *connection) readReplies(conn net.Conn) error {
	r := c.router
	buffer := make([]byte, 2*replyLineLenMax)
	filled := 0
	var replies []answered
	var parsed reply
	for {
		read, err := conn.Read(buffer[filled:])
		if read > 0 {
			c.reads.Add(1)
		}
		if read == 0 && err != nil {
			if err != io.EOF {
				c.readError = err
			}
			return ErrNoConnection
		}
		filled += read
		// Only an M reply needs the time; most reads have none.
		var now time.Time
		consumed := 0
		var stop error
		c.mu.Lock()
		for {
			end := bytes.IndexByte(buffer[consumed:filled], '\n')
			if end < 0 {
				if filled-consumed > replyLineLenMax {
					stop = protocolError("reply line too long", nil)
				}
				break
			}
			line := buffer[consumed : consumed+end]
			if n := len(line); n > 0 && line[n-1] == '\r' {
				line = line[:n-1]
			}
			if len(line) > replyLineLenMax {
				stop = protocolError("reply line too long", nil)
				break
			}
			if parseReplyInto(line, &parsed) != nil {
				stop = protocolError("malformed reply", line)
				break
			}
			if parsed.op == 0 {
				// E - - code: the server could not read a line as a
				// request, or refuses the connection; it closes it.
				stop = &ServerError{Code: parsed.code, Op: "-"}
				if parsed.code == CodeAuthRevoked {
					// A reload removed the secret's name: a broken
					// connection like any other, reconnected with the
					// secret (refused then, if it was removed).
					c.readError, stop = errRevoked, ErrNoConnection
				}
				if parsed.code == CodeShuttingDown {
					// A stopping server refusing a new connection: a
					// broken connection, whose requests wait for the next
					// server within their limits.
					c.readError, stop = errShuttingDownRefusal, errShuttingDownCut
				}
				break
			}
			o := c.inFlight.take(parsed.op, parsed.key)
			if o == nil {
				stop = protocolError("a reply that answers no request in flight", line)
				break
			}
			if parsed.kind == 'M' && now.IsZero() {
				now = time.Now()
			}
			a := answered{operation: o, step: o.onReply(&parsed, now, &r.policy)}
			if parsed.kind == 'M' {
				a.moved = true
				a.active = string(parsed.address)
			}
			replies = append(replies, a)
			consumed += end + 1
		}
		c.mu.Unlock()
		// Act on the replies with the connection unlocked, as moving
		// requests locks other connections.
		handed := len(replies)
		if handed > 0 {
			c.replied = true
		}
		for i := range replies {
			if replies[i].moved {
				r.noteMoved(c.node, replies[i].active)
			}
			r.handle(replies[i].operation, replies[i].step)
			replies[i] = answered{}
		}
		replies = replies[:0]
		if stop != nil {
			return stop
		}
		if err != nil {
			if err != io.EOF {
				c.readError = err
			}
			return ErrNoConnection
		}
		filled = copy(buffer, buffer[consumed:filled])
		if handed > 0 {
			// Let the callers just woken run, and queue and send their
			// next requests, before reading again: by then more replies
			// have come in, so the next read carries more of them and
			// fewer reads find nothing (each such read costs a system
			// call and a wait in the poller).
			runtime.Gosched()
		}
	}
}

// dialTCP connects to address within timeout, or until ctx ends (the
// client closes).
func dialTCP(ctx context.Context, address string, timeout time.Duration) (net.Conn, error) {
	dialer := net.Dialer{Timeout: timeout}
	conn, err := dialer.DialContext(ctx, "tcp", address)
	if err != nil {
		return nil, err
	}
	// Requests are small and latency matters; Go sets TCP_NODELAY by
	// default, said here so that nobody turns it off unawares.
	if tcp, ok := conn.(*net.TCPConn); ok {
		if err := tcp.SetNoDelay(true); err != nil {
			conn.Close()
			return nil, err
		}
	}
	return conn, nil
}
