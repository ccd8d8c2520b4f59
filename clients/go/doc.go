// Package ringlock is the Go client of ringlock, a lock server with FIFO
// hand-off, leases and fencing tokens.
//
// A Client keeps persistent connections to the nodes it is given and
// pipelines the requests of every goroutine over them. It uses the standard
// library only.
//
//	client, err := ringlock.Dial(ctx, []string{"127.0.0.1:7700"})
//	if err != nil { ... }
//	defer client.Close()
//
//	lock, err := client.Acquire(ctx, "orders/42", 30*time.Second, 5*time.Second)
//	switch {
//	case errors.Is(err, ringlock.ErrTimeout): // still held by someone else after 5 s
//	case err != nil: ...
//	default:
//		defer lock.Release(ctx)
//		write(lock.Token()) // the storage refuses tokens below the highest it saw
//	}
//
// # What the client does for you (docs/protocol.md §4)
//
//   - Connections: one per node, two when given a single address, chosen
//     round-robin a write at a time (requests queued while a connection
//     gathers its next write join it). A broken one is left out and
//     reconnected in the background: at once, then after doubling pauses
//     from 50 ms up to 3 s, each drawn between half its length and all of
//     it (WithReconnectDelayFirst, WithReconnectDelayMax).
//   - Waiting for a connection: a request that finds no usable connection
//     waits for one within its own limit (an acquire's wait, an extend's
//     lease left, a release's retry period, else WithConnectLimit, 10 s),
//     then fails with a *ConnectionError naming every address and the
//     net error of its last attempt (errors.Is(err, ErrNoConnection)).
//   - Pipelining: requests from all goroutines share the connections;
//     replies are paired with requests by (operation, key), and several
//     requests with the same (operation, key) on one connection are paired
//     in the order sent.
//   - Cut connections: an acquire (or extend, inspect, ping, stats) whose
//     connection breaks moves to the next connection with the wait it has
//     left; once cut on as many connections as the client has, it waits for
//     a connection to come back, as above. A release is sent again on
//     another connection, else retried every 200 ms for 5 s.
//   - Clusters: a standby answers lock requests with M naming the active;
//     the client re-sends the request there and prefers that node from then
//     on, adding it to its set if it was not given. While no active is known
//     (a failover), requests are retried every 200 ms for 5 s.
//   - Authentication: with a secret (WithSecret, else the environment
//     variable RINGLOCK_SECRET), every connection and every reconnect first
//     sends "U <secret>" and carries requests only once the server has
//     named the client (Client.Name); a refused secret fails the
//     connection, which is retried with the usual pauses, and requests fail
//     past their limit with an *AuthError (errors.Is(err, ErrAuth)).
//   - TLS: WithTLSCA (the CA of the server's certificate) turns it on;
//     WithTLSCert adds a client certificate for servers that require one,
//     WithTLSServerName the name to check (default: each address's host),
//     WithTLSConfig a crypto/tls configuration of your own. Every connect
//     does the handshake within the connect timeout, before the U line; a
//     failed one fails the connection like a refused connect, and requests
//     fail past their limit with a *ConnectionError whose address's error
//     is a *TLSError (errors.Is(err, ErrTLS)).
//   - Contexts: every call takes a context.Context. An acquire given up
//     through its context releases a grant that arrives anyway; a release
//     given up carries on in the background.
//
// # Errors
//
// Errors are values to test with errors.Is and errors.As: ErrTimeout (the
// wait ran out, nothing was granted), ErrNoConnection, ErrNoActive,
// ErrClosed, ErrTooManyInFlight; *ServerError for an E reply, carrying the
// server's Code, which errors.Is matches against ErrNotHolder,
// ErrTooManyWaiters, ErrShuttingDown, ErrForbidden and the other code
// sentinels; *AuthError (errors.Is(err, ErrAuth)) for a refused secret;
// *TLSError (errors.Is(err, ErrTLS)), wrapping the crypto/tls or x509
// error, for a connection that failed in TLS;
// *ArgumentError for an argument refused before sending; *ProtocolError
// for a server that broke the protocol.
//
// # Keys, leases and waits
//
// A key is 1 to 250 bytes, none of them space, tab, CR, LF or NUL. The key
// "-" is refused too: error replies write "-" for "no key", so an error
// about "-" could not be paired with its request. Leases and waits are
// rounded up to the millisecond. A wait is NoLimit (the context can still
// bound the caller's wait), TryOnce (a bare 0 too: only if the key is free
// now) or a duration up to WaitMax; the three forms are the same in every
// official client (clients/README.md).
//
// Fencing tokens increase for each key across hand-offs, lease expiry,
// failovers and restarts; tokens of different keys are unique but not
// ordered with each other.
//
// # Limits
//
//   - A server that stalls while keeping its connections open stalls the
//     requests on them: the client has no request timeout of its own beyond
//     the waits the server enforces and the callers' contexts.
//   - An acquire cut after the server granted it but before the reply
//     arrived is re-sent; the lost grant holds the key until its lease runs
//     out.
//   - Replies for one key on one connection keep their order, so a
//     TryAcquire sent behind a waiting acquire of the same key on the same
//     connection is answered only after it.
//   - Go has no destructors: a Lock that is never released is freed only
//     when its lease runs out.
//
// # Layout
//
//   - client.go: Client, Dial, Acquire (and the wait forms NoLimit and
//     TryOnce), TryAcquire, Inspect, Ping, Stats, Close.
//   - lock.go: Lock (token, extend, release, AutoExtend and its lost-lock
//     signal: Done, Context, Err; Held, Locked), LockFrom.
//   - options.go: the Option settings and their defaults.
//   - tls.go: the TLS configuration Dial builds, and the handshake of
//     every connect.
//   - errors.go: the sentinel errors and the error types.
//   - protocol.go: the wire protocol v1: request encoding, reply parsing.
//   - pairing.go: pairing replies with the requests in flight on a
//     connection by (op, key), in send order.
//   - operation.go: a request's life as a state machine with no I/O: what
//     to do on a reply, a cut connection, no connection (moves, retries,
//     redirects).
//   - router.go: the connection set, round-robin, the active node, and
//     carrying out each step of a request.
//   - connection.go: one connection's reader (connect, read, pair,
//     reconnect) and writer (batched writes) goroutines.
package ringlock
