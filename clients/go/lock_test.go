package ringlock_test

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
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

// Scenario wait-forms: NoLimit, TryOnce (and a bare 0, the same) and a
// duration mean the same in every client; anything else is refused naming
// the range.
func TestWaitForms(t *testing.T) {
	s := newServer(t)
	client := dial(t, []string{s.addr})
	ctx := testContext(t)
	holder := mustAcquire(t, client, "forms")
	for name, wait := range map[string]time.Duration{"TryOnce": ringlock.TryOnce, "bare 0": 0, "50ms": 50 * time.Millisecond} {
		if _, err := client.Acquire(ctx, "forms", lease, wait); !errors.Is(err, ringlock.ErrTimeout) {
			t.Errorf("%s while held: %v, want ErrTimeout", name, err)
		}
	}
	for _, wait := range []time.Duration{-time.Millisecond, ringlock.WaitMax + time.Millisecond} {
		_, err := client.Acquire(ctx, "forms", lease, wait)
		if !errors.Is(err, ringlock.ErrBadArgument) || !strings.Contains(err.Error(), "NoLimit") {
			t.Errorf("wait %v: %v, want ErrBadArgument naming the range", wait, err)
		}
	}
	// NoLimit waits behind the holder for as long as it takes.
	granted := make(chan error, 1)
	go func() {
		lock, err := client.Acquire(ctx, "forms", lease, ringlock.NoLimit)
		if err == nil {
			err = lock.Release(ctx)
		}
		granted <- err
	}()
	waitUntil(t, "the NoLimit acquire queued", func() bool {
		state, err := client.Inspect(ctx, "forms")
		return err == nil && state.Waiters == 1
	})
	mustRelease(t, holder)
	if err := <-granted; err != nil {
		t.Fatalf("NoLimit acquire: %v", err)
	}
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
func TestSingleNodeRestartReportsLost(t *testing.T) {
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
func TestHeldAsksTheServer(t *testing.T) {
	s := newServer(t)
	client := dial(t, []string{s.addr})
	ctx := testContext(t)
	lock := mustAcquire(t, client, "asked")
	if held, err := lock.Held(ctx); err != nil || !held {
		t.Fatalf("Held of a fresh lock: %v, %v", held, err)
	}
	rawLine(t, s.addr, "R asked "+strconv.FormatUint(lock.Token(), 10))
	if held, err := lock.Held(ctx); err != nil || held {
		t.Fatalf("Held after a release elsewhere: %v, %v", held, err)
	}
	// Another holder now: its token is not this lock's.
	other := mustAcquire(t, client, "asked")
	if held, err := lock.Held(ctx); err != nil || held {
		t.Fatalf("Held while another grant holds the key: %v, %v", held, err)
	}
	mustRelease(t, other)

	short, err := client.Acquire(ctx, "short-lived", 100*time.Millisecond, ringlock.NoLimit)
	if err != nil {
		t.Fatal(err)
	}
	if !short.Locked() {
		t.Fatal("not Locked right after the grant")
	}
	waitUntil(t, "the lease ran out locally", func() bool { return !short.Locked() })
	if held, err := short.Held(ctx); err != nil || held {
		t.Fatalf("Held after the lease ran out: %v, %v", held, err)
	}
}

// Scenario lock-from-key-and-token: a grant taken with raw protocol lines
// is extended, asked and released through LockFrom.
func TestLockFromKeyAndToken(t *testing.T) {
	s := newServer(t)
	client := dial(t, []string{s.addr})
	ctx := testContext(t)
	token := rawAcquire(t, s.addr, "elsewhere")
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
	if _, err := client.LockFrom("two words", 1, 0); !errors.Is(err, ringlock.ErrBadArgument) {
		t.Fatalf("LockFrom with a bad key: %v", err)
	}
}

// Scenario error-kinds: each kind of error matches its sentinel, and
// range errors name the range.
func TestErrorKinds(t *testing.T) {
	s := newServer(t)
	client := dial(t, []string{s.addr})
	ctx := testContext(t)

	// Bad argument, before anything is sent.
	_, err := client.Acquire(ctx, "k", 0, ringlock.NoLimit)
	var argument *ringlock.ArgumentError
	if !errors.Is(err, ringlock.ErrBadArgument) || !errors.As(err, &argument) || !strings.Contains(err.Error(), "1ms") {
		t.Errorf("lease 0: %v", err)
	}
	// A lease beyond the server's limit: the server's bad-lease, named.
	_, err = client.Acquire(ctx, "k", 48*time.Hour, ringlock.NoLimit)
	if !errors.Is(err, &ringlock.ServerError{Code: ringlock.CodeBadLease}) || !strings.Contains(err.Error(), "--max-lease") {
		t.Errorf("a 48h lease: %v", err)
	}
	// Timeout.
	holder := mustAcquire(t, client, "k")
	if _, err := client.Acquire(ctx, "k", lease, 20*time.Millisecond); !errors.Is(err, ringlock.ErrTimeout) {
		t.Errorf("a wait that runs out: %v", err)
	}
	// Not holder.
	mustRelease(t, holder)
	if err := holder.Extend(ctx, lease); !errors.Is(err, ringlock.ErrNotHolder) {
		t.Errorf("extend after release: %v", err)
	}
	if err := holder.Release(ctx); !errors.Is(err, ringlock.ErrNotHolder) {
		t.Errorf("second release: %v", err)
	}
	// Shutting down: an acquire queued when the server stops.
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
	if err := s.command.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if !errors.Is(queuedErr, ringlock.ErrShuttingDown) {
		t.Errorf("queued acquire at shutdown: %v", queuedErr)
	}
	// Connection errors (ErrNoConnection wrapping the net error) are
	// TestDialFailsWhenNoNodeAnswersWithTheNetError's.
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
