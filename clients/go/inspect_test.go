package ringlock_test

// Inspect against the real server, and against a scripted node for what
// the server cannot be made to do (a standby's redirect of I, seeing what
// was sent).

import (
	"bufio"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"ringlock.dev/ringlock"
)

func mustInspect(t *testing.T, client *ringlock.Client, key string) ringlock.KeyState {
	t.Helper()
	state, err := client.Inspect(testContext(t), key)
	if err != nil {
		t.Fatalf("inspect %s: %v", key, err)
	}
	if state.Key != key {
		t.Fatalf("inspect %s: the state of %q", key, state.Key)
	}
	return state
}

func TestInspectOfAFreeKey(t *testing.T) {
	s := newServer(t)
	client := dial(t, []string{s.addr})
	free := ringlock.KeyState{Key: "never-taken"}
	if got := mustInspect(t, client, "never-taken"); got != free {
		t.Errorf("a key never taken: %+v, want %+v", got, free)
	}
	// Released, the key is free again.
	mustRelease(t, mustAcquire(t, client, "taken-once"))
	free.Key = "taken-once"
	if got := mustInspect(t, client, "taken-once"); got != free {
		t.Errorf("a released key: %+v, want %+v", got, free)
	}
}

func TestInspectOfAHeldKey(t *testing.T) {
	s := newServer(t)
	holder := dial(t, []string{s.addr})
	observer := dial(t, []string{s.addr})
	ctx := testContext(t)
	lock, err := holder.Acquire(ctx, "held", 30*time.Second, ringlock.NoLimit)
	if err != nil {
		t.Fatal(err)
	}
	defer mustRelease(t, lock)
	state := mustInspect(t, observer, "held")
	if !state.Held || state.Token != lock.Token() || state.Waiters != 0 {
		t.Errorf("%+v, want held by token %d with no waiters", state, lock.Token())
	}
	if state.LeaseLeft <= 0 || state.LeaseLeft > 30*time.Second {
		t.Errorf("lease left %v, want within the 30s lease", state.LeaseLeft)
	}
	// An extend moves the lease's end, which inspect shows.
	if err := lock.Extend(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	state = mustInspect(t, observer, "held")
	if !state.Held || state.Token != lock.Token() || state.LeaseLeft <= 0 || state.LeaseLeft > 5*time.Second {
		t.Errorf("after extending to 5s: %+v", state)
	}
}

func TestInspectCountsQueuedAcquires(t *testing.T) {
	s := newServer(t)
	holder := dial(t, []string{s.addr})
	waiter := dial(t, []string{s.addr})
	observer := dial(t, []string{s.addr})
	first := mustAcquire(t, holder, "queued")
	const queued = 3
	ctx := testContext(t)
	grants := make(chan *ringlock.Lock, queued)
	failures := make(chan error, queued)
	for range queued {
		go func() {
			lock, err := waiter.Acquire(ctx, "queued", lease, ringlock.NoLimit)
			if err != nil {
				failures <- err
				return
			}
			grants <- lock
		}()
	}
	// The acquires queue on the server in their own time; inspect is how
	// to see them there.
	waitUntil(t, "the acquires to queue", func() bool {
		return mustInspect(t, observer, "queued").Waiters == queued
	})
	if state := mustInspect(t, observer, "queued"); !state.Held || state.Token != first.Token() {
		t.Errorf("with waiters: %+v, want still held by token %d", state, first.Token())
	}
	// Each release hands the key to the next waiter, one fewer waits.
	previous := first
	for left := queued - 1; left >= 0; left-- {
		mustRelease(t, previous)
		select {
		case previous = <-grants:
		case err := <-failures:
			t.Fatal(err)
		case <-time.After(patience):
			t.Fatal("no waiter was granted the key")
		}
		state := mustInspect(t, observer, "queued")
		if !state.Held || state.Token != previous.Token() || state.Waiters != uint64(left) {
			t.Errorf("%+v, want held by token %d with %d waiters", state, previous.Token(), left)
		}
	}
	mustRelease(t, previous)
	if state := mustInspect(t, observer, "queued"); state.Held || state.Waiters != 0 {
		t.Errorf("after the last release: %+v", state)
	}
}

// scripted is a node that answers each request line with what answer
// returns, and keeps the lines it read.
type scripted struct {
	addr     string
	listener net.Listener
	answer   func(line string) string
	mu       sync.Mutex
	lines    []string
}

func newScripted(t *testing.T, answer func(line string) string) *scripted {
	t.Helper()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := &scripted{addr: listener.Addr().String(), listener: listener, answer: answer}
	var served sync.WaitGroup
	var connsMu sync.Mutex
	var conns []net.Conn
	served.Add(1)
	go func() {
		defer served.Done()
		for {
			conn, err := listener.Accept()
			if err != nil {
				return
			}
			connsMu.Lock()
			conns = append(conns, conn)
			connsMu.Unlock()
			served.Add(1)
			go func() {
				defer served.Done()
				n.serve(conn)
			}()
		}
	}()
	t.Cleanup(func() {
		listener.Close()
		connsMu.Lock()
		for _, conn := range conns {
			conn.Close()
		}
		connsMu.Unlock()
		served.Wait()
	})
	return n
}

func (n *scripted) serve(conn net.Conn) {
	defer conn.Close()
	lines := bufio.NewScanner(conn)
	for lines.Scan() {
		n.mu.Lock()
		n.lines = append(n.lines, lines.Text())
		n.mu.Unlock()
		if _, err := conn.Write([]byte(n.answer(lines.Text()) + "\n")); err != nil {
			return
		}
	}
}

func (n *scripted) received() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.lines...)
}

func TestInspectRefusesABadKeyBeforeSending(t *testing.T) {
	node := newScripted(t, func(line string) string {
		return "I " + strings.TrimPrefix(line, "I ") + " - 0 0"
	})
	// One connection, so that every line sent before the last request has
	// arrived once its reply is back.
	client := dial(t, []string{node.addr}, ringlock.WithConnectionsPerNode(1))
	ctx := testContext(t)
	for _, key := range []string{"", "-", "two words", "tab\tkey", "nul\x00", strings.Repeat("k", 251)} {
		state, err := client.Inspect(ctx, key)
		var argument *ringlock.ArgumentError
		if !errors.As(err, &argument) || argument.Arg != "key" {
			t.Errorf("inspect %q: %+v, %v, want a key *ArgumentError", key, state, err)
		}
	}
	mustInspect(t, client, "good")
	if lines := node.received(); len(lines) != 1 || lines[0] != "I good" {
		t.Errorf("the node read %q, want only the good key's request", lines)
	}
}

func TestInspectFollowsAStandbysRedirect(t *testing.T) {
	s := newServer(t)
	holder := dial(t, []string{s.addr})
	lock := mustAcquire(t, holder, "redirected")
	defer mustRelease(t, lock)
	standby := newScripted(t, func(line string) string {
		if key, ok := strings.CutPrefix(line, "I "); ok {
			return "M I " + key + " " + s.addr
		}
		return "E - - bad-op"
	})
	// Only the standby is given: the client learns the active from it.
	client := dial(t, []string{standby.addr})
	state := mustInspect(t, client, "redirected")
	if !state.Held || state.Token != lock.Token() {
		t.Errorf("%+v, want held by token %d", state, lock.Token())
	}
	if lines := standby.received(); len(lines) != 1 {
		t.Errorf("the standby read %q, want the one request it redirected", lines)
	}
	// The client now sends to the active directly.
	mustInspect(t, client, "redirected")
	if lines := standby.received(); len(lines) != 1 {
		t.Errorf("the standby read %q after the redirect", lines)
	}
}

func TestInspectWithNoActiveKnownIsErrNoActive(t *testing.T) {
	standby := newScripted(t, func(line string) string {
		return "M I " + strings.TrimPrefix(line, "I ") + " -"
	})
	client := dial(t, []string{standby.addr},
		ringlock.WithReleaseRetry(20*time.Millisecond, 200*time.Millisecond))
	if _, err := client.Inspect(testContext(t), "nowhere"); !errors.Is(err, ringlock.ErrNoActive) {
		t.Fatalf("inspect with no active: %v, want ErrNoActive", err)
	}
}

func TestInspectRefusedCarriesItsCode(t *testing.T) {
	node := newScripted(t, func(line string) string {
		return "E I " + strings.TrimPrefix(line, "I ") + " bad-request"
	})
	client := dial(t, []string{node.addr})
	_, err := client.Inspect(testContext(t), "k")
	var refused *ringlock.ServerError
	if !errors.As(err, &refused) || refused.Code != ringlock.CodeBadRequest || refused.Op != "I" || refused.Key != "k" {
		t.Fatalf("%v, want a bad-request ServerError for I k", err)
	}
}

func TestInspectOfAServerWithoutItIsBadOp(t *testing.T) {
	// A server from before I answers the unknown operation this way.
	node := newScripted(t, func(string) string { return "E - - bad-op" })
	client := dial(t, []string{node.addr})
	_, err := client.Inspect(testContext(t), "k")
	var refused *ringlock.ServerError
	if !errors.As(err, &refused) || refused.Code != ringlock.CodeBadOp {
		t.Fatalf("%v, want a bad-op ServerError", err)
	}
}
