package ringlock_test

// Silent connections (docs/protocol.md §4, issue 35 item 1): a node whose
// host vanished or a partition (no reset, no close), played by the test
// kit's black hole. A request ends or moves within its own limit plus the
// suspicion grace, never only when the link comes back: each test lifts the
// black hole only after the call returned, and the call's context (the
// outer deadline) fails the test instead if the client waits for the link.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"ringlock.dev/ringlock"
)

// outerDeadline ends a call the client failed to end itself.
const outerDeadline = 20 * time.Second

func TestSilentAddressAcquireIsGrantedElsewhereOrFails(t *testing.T) {
	s := newServer(t)
	k := newKit(t)
	dark, darkAddress := k.start("proxy %s", s.addr)
	_, goodAddress := k.start("proxy %s", s.addr)
	// Short limits, so that the acquire on the black-holed connection can
	// still be granted elsewhere within its wait; a failure is accepted too.
	client := dial(t, []string{darkAddress, goodAddress},
		ringlock.WithSuspectAfter(200*time.Millisecond), ringlock.WithPingTimeout(200*time.Millisecond))
	for range 2 {
		if _, err := client.Ping(testContext(t)); err != nil {
			t.Fatal(err)
		}
	}
	k.call("wait-open %s 1", dark)
	k.call("blackhole %s on", dark)
	lifted := false
	defer func() {
		if !lifted {
			k.call("blackhole %s off", dark)
		}
	}()
	// One call after the other, each its own write: the turn goes round
	// the two connections, so some of them go out on the black-holed one.
	errs := make([]error, 4)
	for i := range errs {
		ctx, cancel := context.WithTimeout(context.Background(), outerDeadline)
		_, errs[i] = client.Acquire(ctx, fmt.Sprintf("silent-%d", i), lease, time.Second)
		cancel()
	}
	// The client cut the black-holed connection (suspected only with a
	// request in flight) and connected again.
	k.call("wait-accepted %s 2", dark)
	granted := 0
	for _, err := range errs {
		switch {
		case err == nil:
			granted++
		case !errors.Is(err, ringlock.ErrNoConnection):
			t.Errorf("acquire on a black-holed address: %v, want a grant or ErrNoConnection", err)
		}
	}
	if granted == 0 {
		t.Error("the acquire on the good connection was not granted")
	}
	k.call("blackhole %s off", dark)
	lifted = true
	if _, err := client.Ping(testContext(t)); err != nil {
		t.Fatal(err)
	}
}

func TestSilentSingleAddressAcquireFailsThenTheClientReconnects(t *testing.T) {
	s := newServer(t)
	k := newKit(t)
	proxy, address := k.start("proxy %s", s.addr)
	client := dial(t, []string{address})
	if _, err := client.Ping(testContext(t)); err != nil {
		t.Fatal(err)
	}
	k.call("wait-open %s 2", proxy)
	k.call("blackhole %s on", proxy)
	lifted := false
	defer func() {
		if !lifted {
			k.call("blackhole %s off", proxy)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), outerDeadline)
	defer cancel()
	_, err := client.Acquire(ctx, "silent-single", lease, time.Second)
	if !errors.Is(err, ringlock.ErrNoConnection) {
		t.Fatalf("acquire on a black-holed address: %v, want ErrNoConnection", err)
	}
	k.call("blackhole %s off", proxy)
	lifted = true
	pong, err := client.Ping(testContext(t))
	if err != nil || pong.Role != "active" {
		t.Fatalf("ping once the link was back: %v, %v", pong, err)
	}
	lock, err := client.Acquire(testContext(t), "silent-single", lease, 5*time.Second)
	if err != nil {
		t.Fatalf("acquire once the link was back: %v", err)
	}
	if err := lock.Release(testContext(t)); err != nil {
		t.Fatal(err)
	}
}

// A connection whose request waits its turn in the server's queue reads
// nothing for a while: it is pinged, answers, and stays up.
func TestSilentWaitingAcquireKeepsItsAnsweringConnection(t *testing.T) {
	s := newServer(t)
	k := newKit(t)
	proxy, address := k.start("proxy %s", s.addr)
	holder := dial(t, []string{s.addr})
	if _, err := holder.Acquire(testContext(t), "silent-busy", 1500*time.Millisecond, ringlock.NoLimit); err != nil {
		t.Fatal(err)
	}
	client := dial(t, []string{address},
		ringlock.WithSuspectAfter(200*time.Millisecond), ringlock.WithPingTimeout(200*time.Millisecond))
	k.call("wait-open %s 2", proxy)
	// Granted once the holder's lease runs out, after several pings.
	lock, err := client.Acquire(testContext(t), "silent-busy", lease, 10*time.Second)
	if err != nil {
		t.Fatalf("acquire behind a holder: %v", err)
	}
	if accepted := k.count("accepted %s", proxy); accepted != 2 {
		t.Errorf("%d connections accepted, want the first 2 only: an answering connection was cut", accepted)
	}
	k.call("wait-upstream %s - P", proxy)
	if err := lock.Release(testContext(t)); err != nil {
		t.Fatal(err)
	}
}
