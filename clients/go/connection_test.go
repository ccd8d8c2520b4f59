package ringlock

// A connection still in its first connect when the client closes: the
// requests queued on it (the release of a grant nobody waits for any more,
// say) go out once the connect completes, and end if it fails.

import (
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"
)

// patience bounds every wait of these tests, so that a broken one fails
// instead of hanging; it is never what a test asserts.
const patience = 20 * time.Second

// heldDial stands in for dialTCP: a connect says it started, then waits
// until the test lets it go (or the client cancels it), and connects, or
// fails if told to.
type heldDial struct {
	started     chan struct{}
	startedOnce sync.Once
	goOn        chan struct{}
	fail        bool
}

func newHeldDial(fail bool) *heldDial {
	return &heldDial{started: make(chan struct{}), goOn: make(chan struct{}), fail: fail}
}

func (d *heldDial) dial(ctx context.Context, address string, timeout time.Duration) (net.Conn, error) {
	d.startedOnce.Do(func() { close(d.started) })
	select {
	case <-d.goOn:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if d.fail {
		return nil, errors.New("refused by the test")
	}
	return dialTCP(ctx, address, timeout)
}

// await fails the test if ch is not closed or sent to within patience.
func await[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case value := <-ch:
		return value
	case <-time.After(patience):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// closeDuringTheFirstConnect starts a router of one connection whose
// first connect d holds, queues o on it, and closes the router; it returns
// the connection once Close has closed it, with the connect still held,
// and a channel closed when Close has returned.
func closeDuringTheFirstConnect(t *testing.T, address string, d *heldDial, o *operation) (*connection, <-chan struct{}) {
	t.Helper()
	options := defaultOptions()
	options.connectionsPerNode = 1
	options.dial = d.dial
	r := newRouter([]string{address}, options)
	await(t, d.started, "the first connect")
	r.submit(o)
	// A request waiting for its retry: Close ends it once it has closed
	// every connection, which tells the test Close got that far.
	marker := newOperation(kindPing, "", 1, &r.policy, true)
	r.schedule(marker, time.Now().Add(time.Hour))
	closed := make(chan struct{})
	go func() {
		r.close()
		close(closed)
	}()
	if result := await(t, marker.done, "Close to end the request waiting for a retry"); !errors.Is(result.err, ErrClosed) {
		t.Fatalf("the request waiting for a retry: %v, want ErrClosed", result.err)
	}
	return r.topology.Load().connections[0], closed
}

func TestAReleaseQueuedDuringTheFirstConnectGoesOutThoughTheClientCloses(t *testing.T) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close()
	received := make(chan string, 1)
	go func() {
		conn, err := listener.Accept()
		if err != nil {
			received <- "(no connection)"
			return
		}
		defer conn.Close()
		_ = conn.SetReadDeadline(time.Now().Add(patience))
		data, _ := io.ReadAll(conn)
		received <- string(data)
	}()
	release := newOperation(kindRelease, "k", 1, &testPolicy, false)
	release.token = 7
	held := newHeldDial(false)
	_, closed := closeDuringTheFirstConnect(t, listener.Addr().String(), held, release)
	close(held.goOn)
	await(t, closed, "Close to return")
	// Ends the Accept if the client never connected.
	listener.Close()
	if got := await(t, received, "the listener"); got != "R k 7\n" {
		t.Fatalf("the server received %q, want the release", got)
	}
}

func TestAFirstConnectThatFailsAfterCloseEndsTheReleaseQueuedOnIt(t *testing.T) {
	release := newOperation(kindRelease, "k", 1, &testPolicy, true)
	release.token = 7
	held := newHeldDial(true)
	c, closed := closeDuringTheFirstConnect(t, "127.0.0.1:7700", held, release)
	// The writer took the close in and waits for the connect's outcome (no
	// event says so: this polls).
	deadline := time.Now().Add(patience)
	for {
		c.mu.Lock()
		waiting := !c.writerWoken
		c.mu.Unlock()
		if waiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the closing writer did not wait for the first connect's outcome")
		}
		runtime.Gosched()
	}
	close(held.goOn)
	// Close returns once the connection's goroutines have ended: the
	// writer too, though it waited for the connect.
	await(t, closed, "Close to return")
	if result := await(t, release.done, "the release's outcome"); !errors.Is(result.err, ErrClosed) {
		t.Fatalf("the release: %v, want ErrClosed", result.err)
	}
}
