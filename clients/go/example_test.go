package ringlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"ringlock.dev/ringlock"
)

// Hold a key, hand its fencing token to the protected resource, release.
func Example() {
	ctx := context.Background()
	// One address: the client keeps two connections to it.
	client, err := ringlock.Dial(ctx, []string{addr})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	// Hold orders/42 for at most 30 s, waiting at most 5 s for it.
	lock, err := client.Acquire(ctx, "orders/42", 30*time.Second, 5*time.Second)
	if errors.Is(err, ringlock.ErrTimeout) {
		fmt.Println("still held by someone else after 5 s")
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	// The storage refuses tokens below the highest it has seen.
	fmt.Println("holding", lock.Key(), "with a token:", lock.Token() > 0)
	if err := lock.Release(ctx); err != nil {
		log.Fatal(err)
	}
	// Output: holding orders/42 with a token: true
}

// Give every node of a cluster, in any order: the client learns the active
// node from the standbys' redirects.
func ExampleDial_cluster() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	client, err := ringlock.Dial(ctx, []string{"10.0.0.1:7700", "10.0.0.2:7700", "10.0.0.3:7700"},
		ringlock.WithConnectTimeout(500*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
}

// Take a key only if nobody holds it now.
func ExampleClient_TryAcquire() {
	ctx := context.Background()
	client, err := ringlock.Dial(ctx, []string{addr})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	first, err := client.TryAcquire(ctx, "cron/cleanup", time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	defer first.Release(ctx)

	_, err = client.TryAcquire(ctx, "cron/cleanup", time.Minute)
	fmt.Println("second try:", errors.Is(err, ringlock.ErrTimeout))
	// Output: second try: true
}

// A context bounds how long the caller waits; a grant that arrives after
// it gave up is released by the client.
func ExampleClient_Acquire_context() {
	client, err := ringlock.Dial(context.Background(), []string{addr})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	holder, err := client.Acquire(context.Background(), "reports/daily", time.Minute, ringlock.NoLimit)
	if err != nil {
		log.Fatal(err)
	}
	defer holder.Release(context.Background())

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = client.Acquire(ctx, "reports/daily", time.Minute, ringlock.NoLimit)
	fmt.Println(errors.Is(err, context.DeadlineExceeded))
	// Output: true
}

// A long critical section pushes its lease out while it still holds the key.
func ExampleLock_Extend() {
	ctx := context.Background()
	client, err := ringlock.Dial(ctx, []string{addr})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	lock, err := client.Acquire(ctx, "jobs/7", 10*time.Second, ringlock.NoLimit)
	if err != nil {
		log.Fatal(err)
	}
	defer lock.Release(ctx)
	switch err := lock.Extend(ctx, time.Minute); {
	case errors.Is(err, ringlock.ErrNotHolder):
		fmt.Println("lost jobs/7: stop using it")
	case err != nil:
		log.Fatal(err)
	default:
		fmt.Println("jobs/7 is ours for another minute")
	}
	// Output: jobs/7 is ours for another minute
}

// A release that finds nothing to release is told apart from a failure.
func ExampleLock_Release() {
	ctx := context.Background()
	client, err := ringlock.Dial(ctx, []string{addr})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	lock, err := client.Acquire(ctx, "invoice-42", 30*time.Second, ringlock.NoLimit)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("first release:", lock.Release(ctx))
	err = lock.Release(ctx)
	fmt.Println("second release, nothing left:", errors.Is(err, ringlock.ErrNotHolder))
	var refused *ringlock.ServerError
	if errors.As(err, &refused) {
		fmt.Println("code:", refused.Code)
	}
	// Output:
	// first release: <nil>
	// second release, nothing left: true
	// code: not-holder
}

// Ask a node for its role and the active node it knows.
func ExampleClient_Ping() {
	ctx := context.Background()
	client, err := ringlock.Dial(ctx, []string{addr})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	pong, err := client.Ping(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(pong.Role, pong.Active == addr)
	// Output: active true
}

// See who holds a key and how many wait for it, without taking it.
func ExampleClient_Inspect() {
	ctx := context.Background()
	client, err := ringlock.Dial(ctx, []string{addr})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	state, err := client.Inspect(ctx, "imports/nightly")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("held:", state.Held, "waiters:", state.Waiters)

	lock, err := client.Acquire(ctx, "imports/nightly", 30*time.Second, ringlock.NoLimit)
	if err != nil {
		log.Fatal(err)
	}
	defer lock.Release(ctx)
	state, err = client.Inspect(ctx, "imports/nightly")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("held:", state.Held, "by our token:", state.Token == lock.Token(),
		"lease left within 30 s:", state.LeaseLeft <= 30*time.Second)
	// Output:
	// held: false waiters: 0
	// held: true by our token: true lease left within 30 s: true
}

// A client of a server started with --auth-file authenticates every
// connection with its secret; here the secret comes from the environment,
// where RINGLOCK_SECRET would be read without the option, too.
func ExampleWithSecret() {
	ctx := context.Background()
	client, err := ringlock.Dial(ctx, []string{"127.0.0.1:7700"}, ringlock.WithSecret(os.Getenv("BILLING_RINGLOCK_SECRET")))
	if errors.Is(err, ringlock.ErrAuth) {
		log.Fatal(err) // ringlock: 127.0.0.1:7700 refused the client's secret: auth-failed
	}
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	fmt.Println("authenticated as", client.Name())
}

// A client of a server started with --tls-cert, --tls-client-ca (mutual
// TLS) and --auth-file: it checks the server's certificate against the CA,
// shows its own, and sends its secret inside TLS. An application would
// leave WithSecret out and set RINGLOCK_SECRET.
func ExampleWithTLSCA() {
	ctx := context.Background()
	client, err := ringlock.Dial(ctx, []string{tlsAddr},
		ringlock.WithTLSCA(filepath.Join(certsDir, "ca.pem")),
		ringlock.WithTLSCert(filepath.Join(certsDir, "client.pem"), filepath.Join(certsDir, "client-key.pem")),
		ringlock.WithSecret(alphaSecret))
	if errors.Is(err, ringlock.ErrTLS) {
		log.Fatal(err) // names the address and what crypto/tls said
	}
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	lock, err := client.Acquire(ctx, "alpha/orders/42", 30*time.Second, 5*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("held over TLS as", client.Name())
	if err := lock.Release(ctx); err != nil {
		log.Fatal(err)
	}
	// Output: held over TLS as alpha
}

// Keep a lock for a long job: AutoExtend extends its lease at a third of
// it, and the lock's Context ends at once if the lock is lost (the server
// restarted, say), so that the job stops writing.
func ExampleLock_AutoExtend() {
	ctx := context.Background()
	client, err := ringlock.Dial(ctx, []string{addr})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	lock, err := client.Acquire(ctx, "jobs/nightly", 300*time.Millisecond, ringlock.NoLimit)
	if err != nil {
		log.Fatal(err)
	}
	lock.AutoExtend()
	work := lock.Context()
	select {
	case <-work.Done(): // lost: stop writing
		fmt.Println("lost:", context.Cause(work))
	case <-time.After(time.Second): // three leases of work
		fmt.Println("still held after three leases:", lock.Locked())
	}
	if err := lock.Release(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println(lock.Err())
	// Output:
	// still held after three leases: true
	// ringlock: the lock was released
}

// Release a lock another process took, given its key and token (as
// ringlock-cli acquire prints them).
func ExampleClient_LockFrom() {
	ctx := context.Background()
	client, err := ringlock.Dial(ctx, []string{addr})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	taken, err := client.Acquire(ctx, "deploy", time.Minute, ringlock.TryOnce)
	if err != nil {
		log.Fatal(err)
	}
	key, token := taken.Key(), taken.Token() // handed to another process

	lock, err := client.LockFrom(key, token, time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	held, err := lock.Held(ctx)
	fmt.Println("held:", held, err)
	fmt.Println("released:", lock.Release(ctx))
	// Output:
	// held: true <nil>
	// released: <nil>
}
