package ringlock

// The round-robin turn: it passes a write batch at a time, and where a
// connection gathers one.

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

func TestTheTurnStaysOnAConnectionGatheringABatchAndMovesOnOnceItIsTaken(t *testing.T) {
	r := &router{}
	connections := []*connection{{address: "a"}, {address: "b"}}
	at := func(position uint64) string { return connections[position%2].address }

	// Nothing gathered: one request at a time goes to each in turn.
	first := at(r.turn(connections))
	second := at(r.turn(connections))
	if first == second {
		t.Fatalf("two requests with nothing gathering both went to %s", first)
	}

	// The connection the last request went to gathers a batch: the
	// requests that follow join it.
	connections[r.next.Load()%2].gathering.Store(true)
	for range 5 {
		if got := at(r.turn(connections)); got != second {
			t.Fatalf("a request went to %s while %s gathered its batch", got, second)
		}
	}

	// Its write took the batch: the next request goes to the other one,
	// and requests then join that one's batch.
	connections[r.next.Load()%2].gathering.Store(false)
	third := at(r.turn(connections))
	if third == second {
		t.Fatalf("the turn stayed on %s after its batch was taken", second)
	}
	connections[r.next.Load()%2].gathering.Store(true)
	if got := at(r.turn(connections)); got != third {
		t.Fatalf("a request went to %s while %s gathered its batch", got, third)
	}
}

func TestGatheringFollowsTheConnectionsQueue(t *testing.T) {
	r := &router{options: defaultOptions()}
	c := newConnection("a", 0, r)
	ping := func() *operation { return newOperation(kindPing, "", 1, &testPolicy, false) }
	if c.trySend(ping(), time.Time{}, 8) != refusedNone || c.gathering.Load() {
		t.Fatal("a connection still connecting gathers")
	}
	c.takeDown()
	client, server := net.Pipe()
	defer client.Close()
	go func() { _, _ = io.Copy(io.Discard, server) }()
	if !c.install(client) {
		t.Fatal("the connection was not installed")
	}
	c.trySend(ping(), time.Time{}, 8)
	if !c.gathering.Load() {
		t.Fatal("the first request queued on a connection that is up does not gather")
	}
	c.writeMu.Lock()
	c.writeOut(false)
	c.writeMu.Unlock()
	if c.gathering.Load() {
		t.Fatal("still gathering once a write took the batch")
	}
	c.trySend(ping(), time.Time{}, 8)
	c.takeDown()
	if c.gathering.Load() {
		t.Fatal("still gathering once taken down")
	}
}

func TestAFullConnectionAtTheTurnPassesTheRequestOn(t *testing.T) {
	r := &router{options: defaultOptions()}
	r.options.maxInFlight = 1
	a, b := newConnection("a", 0, r), newConnection("b", 0, r)
	a.phase, b.phase = phaseUp, phaseUp
	a.inFlight.push(newOperation(kindPing, "", 1, &testPolicy, false))
	a.gathering.Store(true)
	connections := []*connection{a, b}
	o := newOperation(kindPing, "", 1, &testPolicy, false)
	if got := r.offer(connections, r.turn(connections), o, time.Time{}); got != refusedNone {
		t.Fatalf("offer: %v", got)
	}
	if b.inFlight.len() != 1 {
		t.Fatal("the request did not go to the connection after the full one")
	}
}

// stuckConn is a connection whose server stopped reading: its first write
// says so on started, and it and every later one block until the test
// closes the other end.
type stuckConn struct {
	net.Conn
	once    sync.Once
	started chan struct{}
}

func (c *stuckConn) Write(p []byte) (int, error) {
	c.once.Do(func() { close(c.started) })
	return c.Conn.Write(p)
}

// A server that stops reading one connection holds that connection's
// writer; the requests queued behind it must not draw the turn away from
// the other connection.
func TestAConnectionWhoseWriteIsStuckDoesNotDrawEveryRequest(t *testing.T) {
	var mu sync.Mutex
	var stuck *stuckConn
	var peers []net.Conn
	options := defaultOptions()
	options.connectionsPerNode = 2
	options.dial = func(ctx context.Context, address string, timeout time.Duration) (net.Conn, error) {
		client, server := net.Pipe()
		mu.Lock()
		defer mu.Unlock()
		peers = append(peers, server)
		if stuck == nil {
			// Nobody reads this one's other end.
			stuck = &stuckConn{Conn: client, started: make(chan struct{})}
			return stuck, nil
		}
		go func() { _, _ = io.Copy(io.Discard, server) }()
		return client, nil
	}
	r := newRouter([]string{"127.0.0.1:1"}, options)
	defer func() {
		mu.Lock()
		for _, peer := range peers {
			peer.Close()
		}
		mu.Unlock()
		r.close()
	}()
	connections := r.topology.Load().connections
	deadline := time.Now().Add(patience)
	for !connections[0].usable() || !connections[1].usable() {
		if time.Now().After(deadline) {
			t.Fatal("the connections did not come up")
		}
		time.Sleep(time.Millisecond)
	}
	ping := func() { r.submit(newOperation(kindPing, "", 1, &r.policy, false)) }
	// Until the stuck connection's writer is blocked in its first write
	// (and holds the write lock, so that no caller writes there itself).
	mu.Lock()
	started := stuck.started
	mu.Unlock()
	for tries := 0; ; tries++ {
		select {
		case <-started:
		default:
			if tries > 1000 || time.Now().After(deadline) {
				t.Fatal("no request went to the stuck connection")
			}
			ping()
			time.Sleep(time.Millisecond)
			continue
		}
		break
	}
	const sent = 10000
	for i := range sent {
		ping()
		if i%100 == 0 {
			time.Sleep(100 * time.Microsecond)
		}
	}
	onStuck, onOther := 0, 0
	for _, c := range connections {
		c.mu.Lock()
		if c.conn == net.Conn(stuck) {
			onStuck = c.inFlight.len()
		} else {
			onOther = c.inFlight.len()
		}
		c.mu.Unlock()
	}
	// Each request the stuck connection takes once its batch stopped
	// gathering moves the turn on to the other one.
	if onOther < (sent-gatherRequestsMax)/2 {
		t.Fatalf("of %d requests, the connection that writes took %d and the stuck one %d", sent, onOther, onStuck)
	}
}
