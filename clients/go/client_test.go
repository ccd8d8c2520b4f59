package ringlock_test

// The API beyond the scenarios: arguments, errors, contexts, Close, and
// many goroutines sharing one client, against the real server.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"ringlock.dev/ringlock"
)

func TestArgumentsAreCheckedBeforeSending(t *testing.T) {
	s := newServer(t)
	client := dial(t, []string{s.addr})
	ctx := testContext(t)
	var argument *ringlock.ArgumentError
	for name, err := range map[string]error{
		"empty key": func() error { _, err := client.Acquire(ctx, "", lease, ringlock.NoLimit); return err }(),
		"dash key":  func() error { _, err := client.Acquire(ctx, "-", lease, ringlock.NoLimit); return err }(),
		"space":     func() error { _, err := client.Acquire(ctx, "two words", lease, ringlock.NoLimit); return err }(),
		"long key": func() error {
			_, err := client.Acquire(ctx, strings.Repeat("k", 251), lease, ringlock.NoLimit)
			return err
		}(),
		"lease 0":   func() error { _, err := client.Acquire(ctx, "k", 0, ringlock.NoLimit); return err }(),
		"wait < 0":  func() error { _, err := client.Acquire(ctx, "k", lease, -time.Second); return err }(),
		"wait > 1d": func() error { _, err := client.Acquire(ctx, "k", lease, 25*time.Hour); return err }(),
		"try lease": func() error { _, err := client.TryAcquire(ctx, "k", -1); return err }(),
		"no addrs":  func() error { _, err := ringlock.Dial(ctx, nil); return err }(),
		"bad addr":  func() error { _, err := ringlock.Dial(ctx, []string{"nohost"}); return err }(),
		"option": func() error {
			_, err := ringlock.Dial(ctx, []string{s.addr}, ringlock.WithConnectionsPerNode(0))
			return err
		}(),
	} {
		if !errors.As(err, &argument) {
			t.Errorf("%s: %v, want an *ArgumentError", name, err)
		}
	}
	if got := s.stat(t, "grants") + s.stat(t, "waiters"); got != 0 {
		t.Errorf("a refused argument reached the server (%d grants and waiters)", got)
	}
}

func TestServerRefusalsCarryTheirCode(t *testing.T) {
	s := newServer(t)
	client := dial(t, []string{s.addr})
	// Above the server's --max-lease (a day by default).
	_, err := client.Acquire(testContext(t), "k", 48*time.Hour, ringlock.NoLimit)
	var refused *ringlock.ServerError
	if !errors.As(err, &refused) || refused.Code != ringlock.CodeBadLease || refused.Op != "A" || refused.Key != "k" {
		t.Fatalf("%v, want a bad-lease ServerError for A k", err)
	}
}

func TestAReleaseOrExtendAfterTheLeaseRanOutIsNotHolder(t *testing.T) {
	s := newServer(t)
	client := dial(t, []string{s.addr})
	ctx := testContext(t)
	lock, err := client.Acquire(ctx, "short", 20*time.Millisecond, ringlock.NoLimit)
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the lease to run out", func() bool { return s.stat(t, "expiries") == 1 })
	if err := lock.Extend(ctx, lease); !errors.Is(err, ringlock.ErrNotHolder) {
		t.Errorf("extend: %v, want ErrNotHolder", err)
	}
	if err := lock.Release(ctx); !errors.Is(err, ringlock.ErrNotHolder) {
		t.Errorf("release: %v, want ErrNotHolder", err)
	}
}

func TestACancelledAcquireReleasesTheGrantThatArrivesAnyway(t *testing.T) {
	s := newServer(t)
	client := dial(t, []string{s.addr})
	held := mustAcquire(t, client, "abandoned")
	ctx, cancel := context.WithCancel(context.Background())
	result := make(chan error, 1)
	go func() {
		_, err := client.Acquire(ctx, "abandoned", lease, ringlock.NoLimit)
		result <- err
	}()
	waitUntil(t, "the second acquire to be queued", func() bool { return s.stat(t, "waiters") == 1 })
	cancel()
	if err := <-result; !errors.Is(err, context.Canceled) {
		t.Fatalf("%v, want context.Canceled", err)
	}
	// The queued request is granted on this release; nobody wants it, so
	// the client releases it, and the key is free again.
	mustRelease(t, held)
	waitUntil(t, "the abandoned grant to be released", func() bool { return s.stat(t, "releases") == 2 })
	again, err := client.Acquire(testContext(t), "abandoned", lease, 100*time.Millisecond)
	if err != nil {
		t.Fatalf("the key is still held: %v", err)
	}
	mustRelease(t, again)
}

func TestAnEndedContextSendsNothing(t *testing.T) {
	s := newServer(t)
	client := dial(t, []string{s.addr})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := client.Acquire(ctx, "k", lease, ringlock.NoLimit); !errors.Is(err, context.Canceled) {
		t.Fatalf("%v, want context.Canceled", err)
	}
	if grants := s.stat(t, "grants"); grants != 0 {
		t.Fatalf("%d grants", grants)
	}
}

func TestPingAndStats(t *testing.T) {
	s := newServer(t)
	client := dial(t, []string{s.addr})
	ctx := testContext(t)
	pong, err := client.Ping(ctx)
	if err != nil || pong.Role != ringlock.RoleActive || pong.Active != s.addr || pong.Epoch == 0 {
		t.Fatalf("%+v %v", pong, err)
	}
	cycle(t, client, "counted")
	raw, err := client.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var stats struct {
		Role  string `json:"role"`
		Total struct {
			Grants uint64 `json:"grants"`
		} `json:"total"`
	}
	if err := json.Unmarshal(raw, &stats); err != nil || stats.Role != "active" || stats.Total.Grants != 1 {
		t.Fatalf("%s: %+v %v", raw, stats, err)
	}
}

func TestDialFailsWhenNoNodeAnswersWithTheNetError(t *testing.T) {
	address := refusingAddress(t)
	_, err := ringlock.Dial(testContext(t), []string{address})
	if !errors.Is(err, ringlock.ErrNoConnection) {
		t.Fatalf("%v, want ErrNoConnection", err)
	}
	assertRefused(t, err, address)
}

// assertRefused checks that err is a *ConnectionError naming address, whose
// last attempt was refused, with the net error reachable through it.
func assertRefused(t *testing.T, err error, address string) {
	t.Helper()
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("errors.Is(%v, ECONNREFUSED) is false", err)
	}
	var opErr *net.OpError
	if !errors.As(err, &opErr) || opErr.Op != "dial" {
		t.Errorf("errors.As(%v, *net.OpError): %v", err, opErr)
	}
	var connectionError *ringlock.ConnectionError
	if !errors.As(err, &connectionError) || len(connectionError.Addresses) != 1 ||
		connectionError.Addresses[0].Address != address {
		t.Fatalf("%#v, want a *ConnectionError naming %s", err, address)
	}
	if want := address + " (connection refused)"; !strings.HasSuffix(err.Error(), want) {
		t.Errorf("%q does not end with %q", err.Error(), want)
	}
}

func TestRequestsAfterCloseFail(t *testing.T) {
	s := newServer(t)
	client := dial(t, []string{s.addr})
	lock := mustAcquire(t, client, "closing")
	client.Close()
	client.Close()
	ctx := testContext(t)
	if _, err := client.Acquire(ctx, "k", lease, ringlock.NoLimit); !errors.Is(err, ringlock.ErrClosed) {
		t.Errorf("acquire: %v, want ErrClosed", err)
	}
	if err := lock.Release(ctx); !errors.Is(err, ringlock.ErrClosed) {
		t.Errorf("release: %v, want ErrClosed", err)
	}
	if _, err := client.Ping(ctx); !errors.Is(err, ringlock.ErrClosed) {
		t.Errorf("ping: %v, want ErrClosed", err)
	}
}

// TestManyGoroutinesShareOneClient runs goroutines that take turns on a few
// keys: each grant must find its key free (mutual exclusion through the
// pipelined, shared connections), and each key's tokens must grow.
func TestManyGoroutinesShareOneClient(t *testing.T) {
	s := newServer(t)
	client := dial(t, []string{s.addr})
	ctx := testContext(t)
	const keys, goroutines, cycles = 4, 32, 40
	var holders [keys]atomic.Int32
	var lastTokens [keys]atomic.Uint64
	var failures sync.Map
	var running sync.WaitGroup
	for g := range goroutines {
		running.Add(1)
		go func() {
			defer running.Done()
			for c := range cycles {
				index := (g + c) % keys
				lock, err := client.Acquire(ctx, fmt.Sprintf("shared-%d", index), lease, ringlock.NoLimit)
				if err != nil {
					failures.Store(fmt.Sprintf("%d/%d acquire", g, c), err)
					return
				}
				if !holders[index].CompareAndSwap(0, 1) {
					failures.Store(fmt.Sprintf("%d/%d", g, c), "two holders of "+lock.Key())
				}
				if previous := lastTokens[index].Swap(lock.Token()); previous >= lock.Token() {
					failures.Store(fmt.Sprintf("%d/%d token", g, c), fmt.Sprintf("%d after %d", lock.Token(), previous))
				}
				holders[index].Store(0)
				if err := lock.Release(ctx); err != nil {
					failures.Store(fmt.Sprintf("%d/%d release", g, c), err)
					return
				}
			}
		}()
	}
	running.Wait()
	failures.Range(func(what, why any) bool {
		t.Errorf("%s: %v", what, why)
		return true
	})
}

func TestARedirectToANodeNotGivenAddsIt(t *testing.T) {
	s := newServer(t)
	k := newKit(t)
	fake, fakeAddress := k.start("fake %s", s.addr)
	// Only the standby is given; the active is learned from its M reply.
	client := dial(t, []string{fakeAddress})
	cycle(t, client, "learned-0")
	redirected := k.count("redirected %s", fake)
	if redirected == 0 {
		t.Fatal("the fake redirected nothing")
	}
	for round := 1; round < 10; round++ {
		cycle(t, client, fmt.Sprintf("learned-%d", round))
	}
	if now := k.count("redirected %s", fake); now != redirected {
		t.Fatalf("the fake redirected %d requests, then %d: the learned active should be preferred", redirected, now)
	}
	pong, err := client.Ping(testContext(t))
	if err != nil || pong.Role != ringlock.RoleActive {
		t.Fatalf("a ping goes to the learned active: %+v %v", pong, err)
	}
}

func TestCloseEndsRequestsAStalledServerHolds(t *testing.T) {
	_, k, proxy, client := throughAProxy(t)
	ctx := testContext(t)
	if _, err := client.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	k.call("stall %s", proxy)
	acquired := make(chan error, 1)
	go func() {
		_, err := client.Acquire(ctx, "stalled", lease, ringlock.NoLimit)
		acquired <- err
	}()
	k.call("wait-upstream %s - A stalled ", proxy)
	client.Close()
	if err := <-acquired; !errors.Is(err, ringlock.ErrClosed) {
		t.Fatalf("%v, want ErrClosed", err)
	}
}

// A node that accepts connections and closes them at once, before
// answering (a refusing proxy, a load balancer with no backend): a ping
// goes out on each such connection and is cut, which must not start its
// wait for a connection over, or it would never end.
func TestAPingToANodeThatAcceptsThenClosesFailsWithinTheConnectLimit(t *testing.T) {
	s := newServer(t)
	k := newKit(t)
	proxy, address := k.start("proxy %s", s.addr)
	k.call("refuse %s on", proxy)
	client := dial(t, []string{address}, ringlock.WithConnectLimit(time.Second),
		ringlock.WithReconnectDelayMax(200*time.Millisecond))
	// testContext's patience is the outer limit: a hang ends with the
	// context's error, not ErrNoConnection.
	_, err := client.Ping(testContext(t))
	var connectionError *ringlock.ConnectionError
	if !errors.Is(err, ringlock.ErrNoConnection) || !errors.As(err, &connectionError) ||
		connectionError.Addresses[0].Address != address {
		t.Fatalf("ping through a node that accepts then closes: %v, want a *ConnectionError naming %s", err, address)
	}
}

// The lease of a grant that waited in the key's queue for longer than the
// lease is counted from the grant, so an extend still has the lease's time
// to wait for a connection.
func TestAnExtendOfAGrantThatWaitedLongerThanItsLeaseWaitsForAConnection(t *testing.T) {
	s := newServer(t)
	k := newKit(t)
	proxy, address := k.start("proxy %s", s.addr)
	ctx := testContext(t)
	// The holder's lease runs out 8s from now, and only then is the key
	// granted to the acquire below, whose 5s lease starts with the grant.
	holder := dial(t, []string{s.addr})
	if _, err := holder.Acquire(ctx, "late-grant", 8*time.Second, ringlock.NoLimit); err != nil {
		t.Fatal(err)
	}
	client := dial(t, []string{address}, ringlock.WithReconnectDelayMax(200*time.Millisecond))
	lock, err := client.Acquire(ctx, "late-grant", 5*time.Second, ringlock.NoLimit)
	if err != nil {
		t.Fatal(err)
	}
	// No connection: the extend waits for one within the lease it has left.
	k.call("refuse %s on", proxy)
	k.call("cut %s", proxy)
	waitUntil(t, "both connections to be seen broken", func() bool {
		return ringlock.UsableConnections(client) == 0
	})
	extended := make(chan error, 1)
	go func() { extended <- lock.Extend(ctx, 5*time.Second) }()
	waitUntil(t, "the extend to wait for a connection, or to end", func() bool {
		return ringlock.RequestsWaitingForConnection(client) == 1 || len(extended) == 1
	})
	k.call("refuse %s off", proxy)
	if err := <-extended; err != nil {
		t.Fatalf("extend once a connection came back: %v", err)
	}
	mustRelease(t, lock)
}
