package ringlock

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"strings"
	"time"
)

// Defaults, from docs/protocol.md §4.
const (
	// connectionsPerSingleNode is the connections to a node when the client
	// is given one address: two, so a brief cut of one does not stop service.
	connectionsPerSingleNode = 2
	connectionsPerNodeMax    = 64
	reconnectDelayFirstDef   = 50 * time.Millisecond
	reconnectDelayMaxDefault = 3 * time.Second
	connectLimitDefault      = 10 * time.Second
	releaseRetryIntervalDef  = 200 * time.Millisecond
	releaseRetryForDefault   = 5 * time.Second
	connectTimeoutDefault    = time.Second
	tryAcquireWaitDefault    = time.Millisecond
	redirectLimitDefault     = 16
	maxInFlightDefault       = 65536
	suspectAfterDefault      = time.Second
	pingTimeoutDefault       = time.Second
	retryIntervalShortest    = time.Millisecond
	connectTimeoutShortest   = time.Millisecond
	reconnectDelayShortest   = time.Millisecond
	// secretLenMax is the longest secret: a U line must fit in the
	// server's 1024 bytes.
	secretLenMax = 1022
)

// SecretEnv is the environment variable Dial takes the client's secret from
// when it is given no WithSecret, so that the secret need not appear in
// code, on a command line or in shell history.
const SecretEnv = "RINGLOCK_SECRET"

// secret holds the client's secret behind a function, so that printing
// the options with fmt, with any verb, shows a function's address and never
// the secret.
type secret func() string

// newSecret keeps value for the options.
func newSecret(value string) secret {
	return func() string { return value }
}

// options is every setting of a Client.
type options struct {
	connectionsPerNode int
	// connectionsPerNodeSet tells Dial not to pick the default.
	connectionsPerNodeSet bool
	reconnectDelayFirst   time.Duration
	reconnectDelayMax     time.Duration
	connectLimit          time.Duration
	releaseRetryInterval  time.Duration
	releaseRetryFor       time.Duration
	connectTimeout        time.Duration
	tryAcquireWait        time.Duration
	redirectLimit         int
	maxInFlight           int
	// suspectAfter and pingTimeout: a connection with requests in flight
	// that read nothing for suspectAfter is sent P, and cut if it reads
	// nothing for pingTimeout after (see connection.watch).
	suspectAfter time.Duration
	pingTimeout  time.Duration
	// secret is sent as U on every connection first; nil for none.
	secret secret
	// secretSet tells Dial not to read SecretEnv.
	secretSet bool
	// The TLS options as given, and the configuration Dial builds from
	// them (buildTLS); tls is nil for plain TCP.
	tlsCA         string
	tlsCertFile   string
	tlsKeyFile    string
	tlsServerName string
	tlsConfig     *tls.Config
	tls           *tls.Config
	// dial connects to a node: dialTCP, but for tests that hold a connect.
	dial func(ctx context.Context, address string, timeout time.Duration) (net.Conn, error)
}

func defaultOptions() options {
	return options{
		reconnectDelayFirst:  reconnectDelayFirstDef,
		reconnectDelayMax:    reconnectDelayMaxDefault,
		connectLimit:         connectLimitDefault,
		releaseRetryInterval: releaseRetryIntervalDef,
		releaseRetryFor:      releaseRetryForDefault,
		connectTimeout:       connectTimeoutDefault,
		tryAcquireWait:       tryAcquireWaitDefault,
		redirectLimit:        redirectLimitDefault,
		maxInFlight:          maxInFlightDefault,
		suspectAfter:         suspectAfterDefault,
		pingTimeout:          pingTimeoutDefault,
		dial:                 dialTCP,
	}
}

// validate reports the first setting out of its range.
func (o *options) validate() error {
	switch {
	case o.connectionsPerNode < 1 || o.connectionsPerNode > connectionsPerNodeMax:
		return &ArgumentError{Arg: "WithConnectionsPerNode", Reason: fmt.Sprintf("1 to %d", connectionsPerNodeMax)}
	case o.reconnectDelayFirst < reconnectDelayShortest:
		return &ArgumentError{Arg: "WithReconnectDelayFirst", Reason: "at least 1ms"}
	case o.reconnectDelayMax < o.reconnectDelayFirst:
		return &ArgumentError{Arg: "WithReconnectDelayMax", Reason: "at least the first delay"}
	case o.connectLimit < 0:
		return &ArgumentError{Arg: "WithConnectLimit", Reason: "at least 0"}
	case o.releaseRetryInterval < retryIntervalShortest || o.releaseRetryFor < 0:
		return &ArgumentError{Arg: "WithReleaseRetry", Reason: "an interval of at least 1ms and a period of at least 0"}
	case o.connectTimeout < connectTimeoutShortest:
		return &ArgumentError{Arg: "WithConnectTimeout", Reason: "at least 1ms"}
	case o.tryAcquireWait < time.Millisecond || o.tryAcquireWait > WaitMax:
		return &ArgumentError{Arg: "WithTryAcquireWait", Reason: "1ms to 24h (0 on the wire would mean no limit)"}
	case o.redirectLimit < 0:
		return &ArgumentError{Arg: "WithRedirectLimit", Reason: "at least 0"}
	case o.maxInFlight < 1:
		return &ArgumentError{Arg: "WithMaxInFlight", Reason: "at least 1"}
	case o.suspectAfter < time.Millisecond:
		return &ArgumentError{Arg: "WithSuspectAfter", Reason: "at least 1ms"}
	case o.pingTimeout < time.Millisecond:
		return &ArgumentError{Arg: "WithPingTimeout", Reason: "at least 1ms"}
	case o.secret != nil && (o.secret() == "" || len(o.secret()) > secretLenMax ||
		strings.ContainsAny(o.secret(), " \t\r\n\x00")):
		return &ArgumentError{Arg: "WithSecret",
			Reason: fmt.Sprintf("1 to %d bytes, none of them space, tab, CR, LF or NUL", secretLenMax)}
	}
	return nil
}

// An Option changes a setting of Dial. Every setting has the default docs/protocol.md §4
// gives; change one only for a reason (tests use short intervals, say).
type Option func(*options)

// WithConnectionsPerNode sets the connections kept to each node, 1 to 64.
// Default: 2 when the client is given one address, so a brief cut of one
// does not stop service, else 1.
func WithConnectionsPerNode(n int) Option {
	return func(o *options) {
		o.connectionsPerNode = n
		o.connectionsPerNodeSet = true
	}
}

// WithReconnectDelayFirst sets the first pause of the reconnect schedule.
// Default: 50ms.
//
// A connection that broke, or whose connect failed, is tried again at once,
// then after doubling pauses from this one up to WithReconnectDelayMax. Each
// pause is drawn at random between half its nominal length and all of it,
// so that clients cut at the same moment do not all come back at the same
// moment. The schedule starts over once a connection has answered a request
// or stayed open for the longest pause. A broken connection carries no
// request meanwhile.
func WithReconnectDelayFirst(d time.Duration) Option {
	return func(o *options) { o.reconnectDelayFirst = d }
}

// WithReconnectDelayMax sets the longest pause of the reconnect schedule
// (see WithReconnectDelayFirst). Default: 3s.
func WithReconnectDelayMax(d time.Duration) Option {
	return func(o *options) { o.reconnectDelayMax = d }
}

// WithConnectLimit sets how long a request with no limit of its own waits
// for a usable connection before it fails with a *ConnectionError: an
// Acquire with no wait limit, a TryAcquire, a Ping, an Inspect, a Stats.
// Default: 10s.
//
// Requests with a limit of their own wait within it instead: an Acquire its
// wait, an Extend the lease it has left, a Release its retry period.
func WithConnectLimit(d time.Duration) Option {
	return func(o *options) { o.connectLimit = d }
}

// WithSuspectAfter sets how long a connection with requests in flight may
// read nothing before it is suspected and sent a P. Default: 1s.
//
// With WithPingTimeout it bounds what a host that vanished or a partition
// (no reset, no close) costs a request: the connection is cut, as a broken
// one, about suspectAfter + pingTimeout after it went silent (plus up to
// three checks, each a quarter of the shorter of the two), and its
// requests move to another connection or wait for one within their own
// limits, rather than until the link comes back. Sockets also use TCP
// keepalive and, on Linux, TCP_USER_TIMEOUT of suspectAfter + pingTimeout.
func WithSuspectAfter(d time.Duration) Option {
	return func(o *options) { o.suspectAfter = d }
}

// WithPingTimeout sets how long a suspected connection (see
// WithSuspectAfter) may go on reading nothing after its P before it is cut.
// Default: 1s.
func WithPingTimeout(d time.Duration) Option {
	return func(o *options) { o.pingTimeout = d }
}

// WithReleaseRetry sets how a release that found no usable connection is
// retried: every interval (default 200ms) for period (default 5s), after
// which it fails with ErrNoConnection and the lease frees the key later. A
// release cut off by a broken connection is first sent again at once on
// another connection, if one is usable.
//
// The same interval and period bound the retries of any request while the
// nodes know no active (a failover), after which it fails with ErrNoActive.
func WithReleaseRetry(interval, period time.Duration) Option {
	return func(o *options) {
		o.releaseRetryInterval = interval
		o.releaseRetryFor = period
	}
}

// WithConnectTimeout sets the longest wait for a TCP connection to be
// established. Default: 1s.
func WithConnectTimeout(d time.Duration) Option {
	return func(o *options) { o.connectTimeout = d }
}

// WithTryAcquireWait sets the wait TryAcquire asks for. Default: 1ms, the
// shortest the protocol can express (0 on the wire means no limit).
func WithTryAcquireWait(d time.Duration) Option {
	return func(o *options) { o.tryAcquireWait = d }
}

// WithRedirectLimit sets the most M redirects one request follows before it
// fails with ErrNoActive, so two confused nodes cannot bounce a request
// forever. Default: 16.
func WithRedirectLimit(n int) Option {
	return func(o *options) { o.redirectLimit = n }
}

// WithMaxInFlight sets the most requests in flight on one connection; past
// it on every connection, requests fail with ErrTooManyInFlight. Default:
// 65536.
func WithMaxInFlight(n int) Option {
	return func(o *options) { o.maxInFlight = n }
}

// WithSecret sets the secret the client authenticates with, for servers
// started with --auth-file. Without it, Dial takes the environment variable
// RINGLOCK_SECRET (SecretEnv) if it is set and not empty.
//
// With a secret, every connection, and every reconnect, first sends
// "U <secret>" and carries requests only once the server has answered with
// the name the secret belongs to (Client.Name). A refused secret fails that
// connection, which is retried with the usual pauses; requests waiting for a
// connection fail past their limit with an *AuthError (errors.Is(err,
// ErrAuth)). The secret never appears in errors or in printed options.
func WithSecret(s string) Option {
	return func(o *options) {
		o.secretSet = true
		o.secret = newSecret(s)
	}
}

// secretFromEnvironment takes the secret from SecretEnv if none was set.
func (o *options) secretFromEnvironment() {
	if !o.secretSet {
		if value := os.Getenv(SecretEnv); value != "" {
			o.secret = newSecret(value)
		}
	}
}

// WithTLSCA turns TLS on, for servers started with --tls-cert: the server's
// certificate must chain to a CA of the PEM file at path, and hold the
// name the client connects to (see WithTLSServerName). Dial reads the file
// and fails with an *ArgumentError if it holds no certificate.
//
// Every connect, and every reconnect, does the TLS handshake (TLS 1.2 or
// 1.3) within the connect timeout, before anything else (the U line of
// WithSecret included). A handshake that fails fails that connection like
// a refused connect: it is retried with the usual pauses, and requests
// waiting for a connection fail past their limit with a *ConnectionError
// whose address's error is a *TLSError: errors.Is(err, ErrTLS) matches it,
// and errors.As reaches the crypto/tls or x509 error it wraps.
func WithTLSCA(path string) Option {
	return func(o *options) { o.tlsCA = path }
}

// WithTLSCert sets the client certificate (PEM files: the certificate
// chain and its private key), for servers started with --tls-client-ca,
// which refuse clients without one. It needs WithTLSCA or WithTLSConfig.
func WithTLSCert(certPath, keyPath string) Option {
	return func(o *options) {
		o.tlsCertFile = certPath
		o.tlsKeyFile = keyPath
	}
}

// WithTLSServerName sets the name the server's certificate must hold.
// Default: the host of each address (an IP address is checked against the
// certificate's IP names). It needs WithTLSCA or WithTLSConfig.
func WithTLSServerName(name string) Option {
	return func(o *options) { o.tlsServerName = name }
}

// WithTLSConfig turns TLS on with a configuration of your own (cloned at
// Dial, so later changes to it are not seen). WithTLSCA, WithTLSCert and
// WithTLSServerName, if given too, apply on top of it; the client raises
// its MinVersion to TLS 1.2 if lower, and turns dynamic record sizing off
// so that a batch of requests goes out in one record.
func WithTLSConfig(config *tls.Config) Option {
	return func(o *options) { o.tlsConfig = config }
}
