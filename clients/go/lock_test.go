package ringlock_test

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"ringlock.dev/ringlock"
)

// rawLine sends one request line on a new connection of its own and
// returns the reply line, without its newline.
func rawLine(t *testing.T, address, line string) string {
	t.Helper()
	conn, err := net.DialTimeout("tcp", address, patience)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(patience))
	if _, err := conn.Write([]byte(line + "\n")); err != nil {
		t.Fatal(err)
	}
	reply, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatalf("%q: %v", line, err)
	}
	return strings.TrimRight(reply, "\r\n")
}

// rawAcquire takes key on a connection of its own (no client) and returns
// the grant's token.
func rawAcquire(t *testing.T, address, key string) uint64 {
	t.Helper()
	reply := rawLine(t, address, "A "+key+" 30 0")
	fields := strings.Fields(reply)
	if len(fields) != 3 || fields[0] != "A" || fields[1] != key {
		t.Fatalf("A %s: %q", key, reply)
	}
	token, err := strconv.ParseUint(fields[2], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return token
}

// waitDone waits for a lock's Done, failing the test after patience.
func waitDone(t *testing.T, lock *ringlock.Lock) {
	t.Helper()
	select {
	case <-lock.Done():
	case <-time.After(patience):
		t.Fatalf("%s: Done not closed", lock)
	}
}

// returns runs call on a goroutine of its own and returns its result,
// failing the test (rather than hanging) if it never comes: an acquire
// queued behind a holder of a long lease would not return.
func returns[T any](t *testing.T, call func() T) T {
	t.Helper()
	result := make(chan T, 1)
	go func() { result <- call() }()
	select {
	case value := <-result:
		return value
	case <-time.After(patience):
		t.Fatal("the call did not return")
		panic("unreachable")
	}
}

// Scenario wait-forms: TryOnce (and a bare 0, the same) is not queued
// behind the holder, a duration runs out, NoLimit is granted once the
// holder releases; anything else is refused naming the range.
func waitForms(t *testing.T) {
	s := newServer(t)
	holderClient := dial(t, []string{s.addr})
	client := dial(t, []string{s.addr})
	ctx := testContext(t)
	holder := mustAcquire(t, holderClient, "forms")
	tries := map[string]func() error{
		"TryOnce":    func() error { _, err := client.Acquire(ctx, "forms", lease, ringlock.TryOnce); return err },
		"bare 0":     func() error { _, err := client.Acquire(ctx, "forms", lease, 0); return err },
		"TryAcquire": func() error { _, err := client.TryAcquire(ctx, "forms", lease); return err },
	}
	for name, try := range tries {
		if err := returns(t, try); !errors.Is(err, ringlock.ErrTimeout) {
			t.Errorf("%s while held: %v, want ErrTimeout", name, err)
		}
	}
	if state, err := client.Inspect(ctx, "forms"); err != nil || state.Waiters != 0 {
		t.Fatalf("after the tries: %+v, %v; want no waiter left", state, err)
	}
	if _, err := client.Acquire(ctx, "forms", lease, 200*time.Millisecond); !errors.Is(err, ringlock.ErrTimeout) {
		t.Errorf("200ms while held: %v, want ErrTimeout", err)
	}
	for _, wait := range []time.Duration{-time.Millisecond, ringlock.WaitMax + time.Millisecond} {
		_, err := client.Acquire(ctx, "forms", lease, wait)
		if !errors.Is(err, ringlock.ErrBadArgument) || !strings.Contains(err.Error(), "TryOnce (0), 1ms to 24h, or NoLimit") {
			t.Errorf("wait %v: %v, want ErrBadArgument naming the range", wait, err)
		}
	}
	// NoLimit waits behind the holder for as long as it takes.
	type result struct {
		lock *ringlock.Lock
		err  error
	}
	granted := make(chan result, 1)
	go func() {
		lock, err := client.Acquire(ctx, "forms", lease, ringlock.NoLimit)
		granted <- result{lock, err}
	}()
	waitUntil(t, "the NoLimit acquire queued", func() bool {
		state, err := client.Inspect(ctx, "forms")
		return err == nil && state.Waiters == 1
	})
	mustRelease(t, holder)
	next := <-granted
	if next.err != nil {
		t.Fatalf("NoLimit acquire: %v", next.err)
	}
	if next.lock.Token() <= holder.Token() {
		t.Errorf("token %d after %d", next.lock.Token(), holder.Token())
	}
	mustRelease(t, next.lock)
	// TryOnce takes a free key.
	lock, err := client.Acquire(ctx, "forms", lease, ringlock.TryOnce)
	if err != nil {
		t.Fatalf("TryOnce on a free key: %v", err)
	}
	mustRelease(t, lock)
}

// AutoExtend keeps a lock past its lease; Release ends Done and the
// lock's Context with ErrReleased.
func TestAutoExtendKeepsTheLock(t *testing.T) {
	s := newServer(t)
	client := dial(t, []string{s.addr})
	ctx := testContext(t)
	lock, err := client.Acquire(ctx, "kept", 300*time.Millisecond, ringlock.NoLimit)
	if err != nil {
		t.Fatal(err)
	}
	lock.AutoExtend()
	work := lock.Context()
	// Three leases: without the extends the grant would be gone.
	time.Sleep(900 * time.Millisecond)
	held, err := lock.Held(ctx)
	if err != nil || !held || !lock.Locked() || lock.Err() != nil {
		t.Fatalf("after three leases: held %v (%v), locked %v, err %v", held, err, lock.Locked(), lock.Err())
	}
	mustRelease(t, lock)
	waitDone(t, lock)
	if !errors.Is(lock.Err(), ringlock.ErrReleased) || !errors.Is(context.Cause(work), ringlock.ErrReleased) {
		t.Fatalf("after release: err %v, context cause %v", lock.Err(), context.Cause(work))
	}
	if lock.Locked() {
		t.Fatal("Locked after release")
	}
}

// Scenario single-node-restart-reports-lost: a single node killed and
// restarted has forgotten its grants; every auto-extended holder learns
// it lost its lock.
func singleNodeRestartReportsLost(t *testing.T) {
	s := newServer(t)
	client := dial(t, []string{s.addr})
	ctx := testContext(t)
	locks := make([]*ringlock.Lock, 4)
	for index := range locks {
		lock, err := client.Acquire(ctx, "restart-"+strconv.Itoa(index), 3*time.Second, ringlock.NoLimit)
		if err != nil {
			t.Fatal(err)
		}
		lock.AutoExtend()
		locks[index] = lock
	}
	contexts := make([]context.Context, len(locks))
	for index, lock := range locks {
		contexts[index] = lock.Context()
	}
	s.kill()
	s.restart(t)
	for index, lock := range locks {
		waitDone(t, lock)
		if !errors.Is(lock.Err(), ringlock.ErrLockLost) || !errors.Is(context.Cause(contexts[index]), ringlock.ErrLockLost) {
			t.Errorf("%s: err %v, context cause %v; want ErrLockLost", lock, lock.Err(), context.Cause(contexts[index]))
		}
		if lock.Locked() {
			t.Errorf("%s: Locked after it was lost", lock)
		}
		if held, err := lock.Held(ctx); err != nil || held {
			t.Errorf("%s: Held after the restart: %v, %v", lock, held, err)
		}
	}
}

// A release with the token from another connection is seen by the
// auto-extending holder as a lost lock, answered not-holder.
func TestReleaseElsewhereReportsLost(t *testing.T) {
	s := newServer(t)
	client := dial(t, []string{s.addr})
	lock, err := client.Acquire(testContext(t), "taken-away", 600*time.Millisecond, ringlock.NoLimit)
	if err != nil {
		t.Fatal(err)
	}
	lock.AutoExtend()
	if reply := rawLine(t, s.addr, "R taken-away "+strconv.FormatUint(lock.Token(), 10)); reply != "R taken-away" {
		t.Fatalf("raw release: %q", reply)
	}
	waitDone(t, lock)
	if !errors.Is(lock.Err(), ringlock.ErrLockLost) || !errors.Is(lock.Err(), ringlock.ErrNotHolder) {
		t.Fatalf("err %v, want ErrLockLost from not-holder", lock.Err())
	}
}

// Scenario held-asks-server: Held asks the server with I; Locked is the
// local view, false once the lease ran out unextended.
func heldAsksServer(t *testing.T) {
	s := newServer(t)
	client := dial(t, []string{s.addr})
	ctx := testContext(t)
	lock := mustAcquire(t, client, "asked")
	if held, err := lock.Held(ctx); err != nil || !held {
		t.Fatalf("Held of a fresh lock: %v, %v", held, err)
	}
	if reply := rawLine(t, s.addr, "R asked "+strconv.FormatUint(lock.Token(), 10)); reply != "R asked" {
		t.Fatalf("raw release: %q", reply)
	}
	if held, err := lock.Held(ctx); err != nil || held {
		t.Fatalf("Held after a release elsewhere: %v, %v", held, err)
	}
	if !lock.Locked() {
		t.Error("the local view cannot know of the release elsewhere")
	}
	// Another holder now: its token is not this lock's.
	other := mustAcquire(t, client, "asked")
	if held, err := lock.Held(ctx); err != nil || held {
		t.Fatalf("Held while another grant holds the key: %v, %v", held, err)
	}
	mustRelease(t, other)

	// A restarted single node forgot the grant: Held asks it and says so.
	forgotten := mustAcquire(t, client, "restart")
	s.kill()
	s.restart(t)
	if held, err := forgotten.Held(ctx); err != nil || held {
		t.Fatalf("Held after the restart: %v, %v", held, err)
	}
	if !forgotten.Locked() {
		t.Error("the local view cannot know of the restart")
	}

	short, err := client.Acquire(ctx, "short-lived", 100*time.Millisecond, ringlock.NoLimit)
	if err != nil {
		t.Fatal(err)
	}
	if !short.Locked() {
		t.Fatal("not Locked right after the grant")
	}
	waitUntil(t, "the lease ran out locally", func() bool { return !short.Locked() })
	waitUntil(t, "the server to expire it", func() bool {
		held, err := short.Held(ctx)
		return err == nil && !held
	})
}

// Scenario lock-from-key-and-token: a grant taken with raw protocol lines
// is extended, asked and released through LockFrom.
func lockFromKeyAndToken(t *testing.T) {
	s := newServer(t)
	client := dial(t, []string{s.addr})
	ctx := testContext(t)
	token := rawAcquire(t, s.addr, "elsewhere")
	wrong, err := client.LockFrom("elsewhere", token+1, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if held, err := wrong.Held(ctx); err != nil || held {
		t.Fatalf("Held of a wrong token: %v, %v", held, err)
	}
	if err := wrong.Release(ctx); !errors.Is(err, ringlock.ErrNotHolder) {
		t.Fatalf("Release of a wrong token: %v, want ErrNotHolder", err)
	}
	lock, err := client.LockFrom("elsewhere", token, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if lock.Token() != token || lock.Key() != "elsewhere" || !lock.Locked() {
		t.Fatalf("LockFrom: %s, locked %v", lock, lock.Locked())
	}
	if held, err := lock.Held(ctx); err != nil || !held {
		t.Fatalf("Held: %v, %v", held, err)
	}
	if err := lock.Extend(ctx, 20*time.Second); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	mustRelease(t, lock)
	if state, err := client.Inspect(ctx, "elsewhere"); err != nil || state.Held {
		t.Fatalf("after the release: %+v, %v", state, err)
	}
	if _, err := client.LockFrom("two words", 1, time.Second); !errors.Is(err, ringlock.ErrBadArgument) {
		t.Fatalf("LockFrom with a bad key: %v", err)
	}
	if _, err := client.LockFrom("elsewhere", token, -time.Second); !errors.Is(err, ringlock.ErrBadArgument) {
		t.Fatalf("LockFrom with a negative lease: %v", err)
	}
}

// Scenario error-kinds: each kind of error matches its sentinel or type,
// and range errors name the range.
func errorKinds(t *testing.T) {
	s := newServer(t, "--max-lease", "60")
	client := dial(t, []string{s.addr})
	ctx := testContext(t)

	// Bad arguments, before anything is sent, naming the range.
	_, err := client.Acquire(ctx, "k", 0, ringlock.NoLimit)
	var argument *ringlock.ArgumentError
	if !errors.Is(err, ringlock.ErrBadArgument) || !errors.As(err, &argument) || !strings.Contains(err.Error(), "1ms to the server's --max-lease") {
		t.Errorf("lease 0: %v", err)
	}
	_, err = client.Acquire(ctx, "k", lease, -time.Second)
	if !errors.Is(err, ringlock.ErrBadArgument) || !strings.Contains(err.Error(), "1ms to 24h") {
		t.Errorf("a negative wait: %v", err)
	}
	// A lease beyond the server's limit: the server's bad-lease, named.
	_, err = client.Acquire(ctx, "k", 2*time.Minute, ringlock.NoLimit)
	var serverError *ringlock.ServerError
	if !errors.As(err, &serverError) || serverError.Code != ringlock.CodeBadLease || !strings.Contains(err.Error(), "--max-lease") {
		t.Errorf("a lease over --max-lease: %v", err)
	}
	// Timeout.
	holder := mustAcquire(t, client, "k")
	if _, err := client.Acquire(ctx, "k", lease, 50*time.Millisecond); !errors.Is(err, ringlock.ErrTimeout) {
		t.Errorf("a wait that runs out: %v", err)
	}
	// Not holder, once the grant is gone.
	stale, err := client.LockFrom("k", holder.Token(), lease)
	if err != nil {
		t.Fatal(err)
	}
	mustRelease(t, holder)
	if err := stale.Extend(ctx, lease); !errors.Is(err, ringlock.ErrNotHolder) {
		t.Errorf("extend after release: %v", err)
	}
	if err := stale.Release(ctx); !errors.Is(err, ringlock.ErrNotHolder) {
		t.Errorf("release after release: %v", err)
	}
	// No connection: a *ConnectionError naming the address, wrapping the
	// net error (Dial waits for a first connection, so it is the call that
	// fails).
	address := refusingAddress(t)
	_, err = ringlock.Dial(ctx, []string{address}, ringlock.WithConnectLimit(300*time.Millisecond))
	if !errors.Is(err, ringlock.ErrNoConnection) {
		t.Fatalf("%v, want ErrNoConnection", err)
	}
	assertRefused(t, err, address)
}

// An acquire queued when the server stops is answered shutting-down, which
// it waits out like a broken connection: with no server back within the
// connect limit, it fails with a *ConnectionError that says the server was
// shutting down.
func TestAnAcquireQueuedWhenTheServerStopsWaitsForTheNextWithinItsLimit(t *testing.T) {
	s := newServer(t)
	client := dial(t, []string{s.addr}, ringlock.WithConnectLimit(time.Second))
	ctx := testContext(t)
	blocker := mustAcquire(t, client, "queued")
	var wg sync.WaitGroup
	wg.Add(1)
	var queuedErr error
	go func() {
		defer wg.Done()
		_, queuedErr = client.Acquire(ctx, "queued", lease, ringlock.NoLimit)
	}()
	waitUntil(t, "the acquire queued", func() bool {
		state, err := client.Inspect(ctx, "queued")
		return err == nil && state.Waiters == 1
	})
	_ = blocker
	s.terminate(t)
	wg.Wait()
	var failed *ringlock.ConnectionError
	if !errors.As(queuedErr, &failed) || !failed.ShuttingDown ||
		!strings.Contains(queuedErr.Error(), "(the server was shutting down)") {
		t.Errorf("queued acquire at shutdown, no server back: %v", queuedErr)
	}
}

// Scenario failover-keeps-auto-extended-lock: a kill -9 of the active
// does not lose an auto-extended lock whose lease is many failover
// timeouts long; its extends go on at the new active, which takes its old
// token.
func failoverKeepsAutoExtendedLock(t *testing.T) {
	const failoverLease = 3 * time.Second
	c := newCluster(t, 3)
	active := c.waitSingleActive("an active node")
	holder := dial(t, c.addrs)
	rival := dial(t, c.addrs)
	ctx := testContext(t)
	_, since := c.table(active)
	lock, err := holder.Acquire(ctx, "failover/kept", failoverLease, ringlock.NoLimit)
	if err != nil {
		t.Fatal(err)
	}
	lock.AutoExtend()
	token := lock.Token()
	c.waitReplicated(active, since)
	c.kill(active)
	if next := c.waitSingleActive("a standby to take over"); next == active {
		t.Fatalf("node %d is still the active", next)
	}
	// Longer than the lease: granted unless the extends reach the new active.
	if taken, err := rival.Acquire(ctx, "failover/kept", lease, failoverLease*3/2); !errors.Is(err, ringlock.ErrTimeout) {
		t.Fatalf("the rival's acquire: %v, %v; want ErrTimeout (the key stays held)\n%s", taken, err, c.logs())
	}
	select {
	case <-lock.Done():
		t.Fatalf("reported lost: %v", lock.Err())
	default:
	}
	if lock.Err() != nil || !lock.Locked() {
		t.Fatalf("err %v, locked %v", lock.Err(), lock.Locked())
	}
	if held, err := lock.Held(ctx); err != nil || !held {
		t.Fatalf("Held on the new active: %v, %v", held, err)
	}
	if err := lock.Extend(ctx, failoverLease); err != nil {
		t.Fatalf("Extend on the new active: %v", err)
	}
	if lock.Token() != token {
		t.Fatalf("token %d, was %d", lock.Token(), token)
	}
	mustRelease(t, lock)
	after, err := rival.TryAcquire(ctx, "failover/kept", lease)
	if err != nil {
		t.Fatalf("TryAcquire once released: %v", err)
	}
	if after.Token() <= token {
		t.Errorf("the new active's token %d after %d", after.Token(), token)
	}
	mustRelease(t, after)
}

// Extends that reach the server but whose answers never come: the lease
// ends without a confirmed extend, so the lock is lost, then and there.
func TestUnansweredExtendsLoseTheLockAtTheLeaseEnd(t *testing.T) {
	s := newServer(t)
	k := newKit(t)
	proxy, address := k.start("proxy %s", s.addr)
	client := dial(t, []string{address})
	lock, err := client.Acquire(testContext(t), "unanswered", 600*time.Millisecond, ringlock.NoLimit)
	if err != nil {
		t.Fatal(err)
	}
	lock.AutoExtend()
	k.call("stall-replies %s", proxy)
	waitDone(t, lock)
	if !errors.Is(lock.Err(), ringlock.ErrLockLost) || errors.Is(lock.Err(), ringlock.ErrNotHolder) || lock.Locked() {
		t.Fatalf("err %v, locked %v; want ErrLockLost from the lease's end", lock.Err(), lock.Locked())
	}
	k.call("resume %s", proxy)
}
