package ringlock

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"
)

// Code is an error code the server sends in an E reply (README "Error
// codes"). Codes this client does not know are kept as they came.
type Code string

// The server's error codes.
const (
	// CodeBadRequest: a known operation with missing, extra or empty fields.
	CodeBadRequest Code = "bad-request"
	// CodeNotHolder: R or X with a token that does not hold the key now
	// (already released, expired or handed on).
	CodeNotHolder Code = "not-holder"
	// CodeBadLease: a lease that is not decimal seconds, is 0, or is above
	// the server's --max-lease.
	CodeBadLease Code = "bad-lease"
	// CodeBadWait: a wait that is not decimal seconds, or is above a day.
	CodeBadWait Code = "bad-wait"
	// CodeBadToken: a token that is not a decimal u64.
	CodeBadToken Code = "bad-token"
	// CodeBadKey: a key that is empty, too long, or holds a forbidden byte.
	CodeBadKey Code = "bad-key"
	// CodeBadOp: an unknown operation or an empty line.
	CodeBadOp Code = "bad-op"
	// CodeLineTooLong: a request line over 1024 bytes; the server closes
	// the connection.
	CodeLineTooLong Code = "line-too-long"
	// CodeTooManyWaiters: the key's queue, or the shard, holds as many
	// waiters as the server allows.
	CodeTooManyWaiters Code = "too-many-waiters"
	// CodeTooManyKeys: the shard holds as many keys as the server allows.
	CodeTooManyKeys Code = "too-many-keys"
	// CodeTooManyConnections: the server refuses the connection (too many
	// in all, or from this address) and closes it.
	CodeTooManyConnections Code = "too-many-connections"
	// CodeShuttingDown: the server is stopping.
	CodeShuttingDown Code = "shutting-down"
	// CodeAuthRequired: the server has an auth file and the connection has
	// not authenticated; a client with WithSecret never sees it.
	CodeAuthRequired Code = "auth-required"
	// CodeAuthFailed: no name of the server's auth file has the client's
	// secret (or a reload removed it); the server closes the connection.
	CodeAuthFailed Code = "auth-failed"
	// CodeForbidden: the key is outside the scope of the secret's name (or
	// S without the stats right).
	CodeForbidden Code = "forbidden"
	// CodeAuthRevoked: a reload removed the connection's name; the server
	// closes the connection.
	CodeAuthRevoked Code = "auth-revoked"
	// CodeAuthDisabled: the client sent a secret to a server without an
	// auth file.
	CodeAuthDisabled Code = "auth-disabled"
)

// Sentinel errors, for errors.Is.
var (
	// ErrTimeout is returned by Acquire when its wait ran out (the server
	// answered T) and by TryAcquire when the key is held: nothing was
	// granted.
	ErrTimeout = errors.New("ringlock: the wait ran out; nothing was granted")

	// ErrNoConnection matches every *ConnectionError: no usable connection
	// within the request's limit. Every connection stayed broken for as long
	// as the request could wait (they are reconnected in the background), or
	// the request was cut off on them until then.
	ErrNoConnection = errors.New("ringlock: no usable connection to a server")

	// ErrNoActive means no node could be found to serve the request: the
	// nodes answered M with no active known for the whole retry period, the
	// active they named stayed unreachable as long, or they redirected the
	// request more than the redirect limit.
	ErrNoActive = errors.New("ringlock: no active node could be found to serve the request")

	// ErrClosed is returned for requests made on, or cut off by, a closed
	// Client.
	ErrClosed = errors.New("ringlock: the client is closed")

	// ErrTooManyInFlight means every usable connection already carries the
	// most requests in flight it may (WithMaxInFlight); try again later.
	ErrTooManyInFlight = errors.New("ringlock: too many requests in flight on every connection")

	// ErrNotHolder matches a *ServerError with code not-holder: a release or
	// extend whose token no longer holds the key (already released, expired,
	// or handed on). For a release it means nothing was left to release.
	ErrNotHolder = &ServerError{Code: CodeNotHolder}

	// ErrTooManyWaiters matches a *ServerError with code too-many-waiters.
	ErrTooManyWaiters = &ServerError{Code: CodeTooManyWaiters}

	// ErrTooManyKeys matches a *ServerError with code too-many-keys.
	ErrTooManyKeys = &ServerError{Code: CodeTooManyKeys}

	// ErrTooManyConnections matches a *ServerError with code
	// too-many-connections.
	ErrTooManyConnections = &ServerError{Code: CodeTooManyConnections}

	// ErrShuttingDown matches a *ServerError with code shutting-down.
	ErrShuttingDown = &ServerError{Code: CodeShuttingDown}

	// ErrForbidden matches a *ServerError with code forbidden: the key is
	// outside the scope of the name the client's secret belongs to. It is an
	// error of that request only: not retried, and the connection stays up.
	ErrForbidden = &ServerError{Code: CodeForbidden}

	// ErrAuth matches every *AuthError: the server refused the client's
	// secret (WithSecret). A *ConnectionError one of whose addresses refused
	// the secret matches it too, through that address's error.
	ErrAuth = errors.New("ringlock: the server refused the client's secret")

	// ErrTLS matches every *TLSError: TLS failed on a connection (the
	// server's certificate not trusted, expired or for another name, or the
	// server refused the client's certificate or its absence). A
	// *ConnectionError one of whose addresses failed so matches it too,
	// through that address's error.
	ErrTLS = errors.New("ringlock: TLS failed")

	// ErrBadArgument matches every *ArgumentError: an argument the client
	// refused before sending anything (a bad key, lease or wait, or a bad
	// option). Not retryable: the same call fails the same way.
	ErrBadArgument = errors.New("ringlock: bad argument")

	// ErrLockLost is what Lock.Err returns (wrapped, with the reason), and
	// the cause of the lock's Context, once the lock is lost: the server
	// answered not-holder to an extend (its lease ran out, someone released
	// it with its token, or the server restarted), or the lease ran out
	// without a confirmed extend. Stop using the protected resource.
	ErrLockLost = errors.New("ringlock: the lock was lost")

	// ErrReleased is what Lock.Err returns, and the cause of the lock's
	// Context, once the lock was released through this Lock.
	ErrReleased = errors.New("ringlock: the lock was released")
)

// TLSError is the error of one address whose connection failed in TLS: its
// handshake, or an alert that ended it. It is the error of that address in
// a *ConnectionError (so errors.Is(err, ErrTLS) matches the request's
// error), and wraps what crypto/tls said: errors.As reaches a
// *tls.CertificateVerificationError, an x509.UnknownAuthorityError, an
// x509.CertificateInvalidError (expired), an x509.HostnameError and so on.
// No request was sent in clear.
type TLSError struct {
	// Address is the address whose TLS failed.
	Address string
	// Err is the crypto/tls (or x509) error.
	Err error
}

// Error names the address and what went wrong, as in "ringlock: TLS with
// 127.0.0.1:7700 failed: the server's certificate is not trusted: tls:
// failed to verify certificate: x509: certificate signed by unknown
// authority".
func (e *TLSError) Error() string {
	return fmt.Sprintf("ringlock: TLS with %s failed: %s", e.Address, describeTLS(e.Err))
}

// Is reports whether target is ErrTLS.
func (e *TLSError) Is(target error) bool {
	return target == ErrTLS
}

// Unwrap returns the crypto/tls error.
func (e *TLSError) Unwrap() error {
	return e.Err
}

// AuthError is the error of a request (or of Dial) when the server refused
// the client's secret on every address the request could use, for as long
// as it could wait: Code is CodeAuthFailed (no name has this secret, or a
// reload removed it) or CodeAuthDisabled (the server has no auth file).
// errors.Is(err, ErrAuth) matches it. The secret is never in it.
//
// It is also each such address's error in a *ConnectionError, when another
// address failed otherwise. The client keeps reconnecting with its usual
// pauses, so a secret added to the server's auth file later is taken.
type AuthError struct {
	// Address is the address that refused the secret (the first, if
	// several did).
	Address string
	// Code is the server's answer to the secret.
	Code Code
}

// Error names the address and the code, as in "ringlock: 127.0.0.1:7700
// refused the client's secret: auth-failed".
func (e *AuthError) Error() string {
	return fmt.Sprintf("ringlock: %s refused the client's secret: %s", e.Address, e.Code)
}

// Is reports whether target is ErrAuth.
func (e *AuthError) Is(target error) bool {
	return target == ErrAuth
}

// errRevoked is a connection's error once a reload removed its name.
var errRevoked = errors.New("the server revoked the secret's name")

// errShuttingDownRefusal is a connection's error once a stopping server
// refused it (E - - shutting-down).
var errShuttingDownRefusal = errors.New("the server was shutting down")

// errShuttingDownCut is what the requests of a connection a stopping server
// refused are cut with: like a broken connection (it matches
// ErrNoConnection), and they note that the server was stopping.
var errShuttingDownCut = fmt.Errorf("%w: the server was shutting down", ErrNoConnection)

// ServerError is an E reply: the server refused the request, which had no
// effect. errors.Is(err, ErrNotHolder) and the other code sentinels match
// any ServerError with the same Code.
type ServerError struct {
	// Code is the server's error code.
	Code Code
	// Op is the refused request's operation ("A", "R", "X", "P", "S", "I"), or
	// "-" when the server refused the whole connection (E - - code).
	Op string
	// Key is the refused request's key; empty for P, S and "-".
	Key string
}

// Error names the request and the code, and for bad-lease and bad-wait
// the range the server accepts.
func (e *ServerError) Error() string {
	code := string(e.Code)
	switch e.Code {
	case CodeBadLease:
		code += " (a lease is above 0 and at most the server's --max-lease, default 86400 s)"
	case CodeBadWait:
		code += " (a wait is at most 86400 s)"
	}
	if e.Op == "" || e.Op == "-" {
		return fmt.Sprintf("ringlock: the server refused: %s", code)
	}
	if e.Key == "" {
		return fmt.Sprintf("ringlock: the server refused %s: %s", e.Op, code)
	}
	return fmt.Sprintf("ringlock: the server refused %s %q: %s", e.Op, e.Key, code)
}

// Is reports whether target is a *ServerError with the same code, so that
// the code sentinels match whatever request was refused.
func (e *ServerError) Is(target error) bool {
	other, ok := target.(*ServerError)
	return ok && other.Code == e.Code
}

// ConnectionError is the error of a request that found no usable
// connection within its limit: an Acquire its wait, an Extend the lease it
// has left, a Release its retry period, else the client's connect limit
// (WithConnectLimit). errors.Is(err, ErrNoConnection) matches it.
//
// It wraps the error of each address's last attempt (a *net.OpError for a
// failed connect or a broken socket), so that errors.Is(err,
// syscall.ECONNREFUSED) and errors.As(err, &opErr) with a *net.OpError
// work through it.
type ConnectionError struct {
	// Waited is how long the request waited for a usable connection.
	Waited time.Duration
	// Addresses holds every address the client tried, each with the error
	// of its last attempt, in the order the client was given them.
	Addresses []AddressError
	// ShuttingDown is set when a server answered the request
	// shutting-down (it was stopping; the request had no effect) and no
	// server took it again within its limit.
	ShuttingDown bool
}

// AddressError is the error of the last attempt to use one address: a
// connect that failed, or a connection that broke.
type AddressError struct {
	// Address is the node's address, as the client was given it or learned
	// it from an M reply.
	Address string
	// Err is what the attempt failed with: a *net.OpError, io.EOF if the
	// server closed the connection, or nil if no attempt has ended yet.
	Err error
}

// Error names the address and what went wrong, in words: the OS error's
// text ("connection refused"), "timed out", or "closed by the server".
func (e AddressError) Error() string {
	return e.Address + " (" + describeConnectError(e.Err) + ")"
}

// Unwrap returns the attempt's error.
func (e AddressError) Unwrap() error {
	return e.Err
}

// Error says how long the request waited and names every address with the
// error of its last attempt, as in "ringlock: no usable connection after
// 10.0 s: 127.0.0.1:7700 (connection refused), 127.0.0.1:7701 (timed out)".
func (e *ConnectionError) Error() string {
	var text strings.Builder
	fmt.Fprintf(&text, "ringlock: no usable connection after %.1f s", e.Waited.Seconds())
	if e.ShuttingDown {
		text.WriteString(" (the server was shutting down)")
	}
	for index, address := range e.Addresses {
		if index == 0 {
			text.WriteString(": ")
		} else {
			text.WriteString(", ")
		}
		text.WriteString(address.Error())
	}
	return text.String()
}

// Is reports whether target is ErrNoConnection.
func (e *ConnectionError) Is(target error) bool {
	return target == ErrNoConnection
}

// Unwrap returns the error of each address's last attempt, for errors.Is
// and errors.As.
func (e *ConnectionError) Unwrap() []error {
	errs := make([]error, 0, len(e.Addresses))
	for _, address := range e.Addresses {
		if address.Err != nil {
			errs = append(errs, address.Err)
		}
	}
	return errs
}

// errNotConnectedYet is the error of an address none of whose attempts has
// ended yet (a connect still under way).
var errNotConnectedYet = errors.New("no attempt has ended yet")

// describeConnectError is err in a few words: an OS error by its text, a
// timeout as such, a closed connection as closed by the server.
func describeConnectError(err error) string {
	var errno syscall.Errno
	var netError net.Error
	var authError *AuthError
	var tlsError *TLSError
	switch {
	case err == nil:
		return errNotConnectedYet.Error()
	case errors.As(err, &tlsError):
		return "TLS: " + describeTLS(tlsError.Err)
	case errors.As(err, &authError):
		return "secret refused: " + string(authError.Code)
	case errors.Is(err, io.EOF):
		return "closed by the server"
	case errors.As(err, &errno):
		return errno.Error()
	case errors.As(err, &netError) && netError.Timeout():
		return "timed out"
	}
	return err.Error()
}

// ArgumentError is an argument the client refused before sending anything.
type ArgumentError struct {
	// Arg names the argument: "key", "lease", "wait", "addrs" or an option.
	Arg string
	// Reason says what a valid value is.
	Reason string
}

// Error names the argument and the rule it broke.
func (e *ArgumentError) Error() string {
	return fmt.Sprintf("ringlock: bad %s: %s", e.Arg, e.Reason)
}

// Is reports whether target is ErrBadArgument.
func (e *ArgumentError) Is(target error) bool {
	return target == ErrBadArgument
}

// ProtocolError means a server broke the protocol. The client drops that
// connection, since it can no longer pair replies with requests on it; the
// requests it carried move to another connection, and this error is
// reported only if they cannot.
type ProtocolError struct {
	// Line is the offending reply line (cut to 200 bytes), if there was one.
	Line string
	// Reason says what was wrong with it.
	Reason string
}

// Error names the violation.
func (e *ProtocolError) Error() string {
	if e.Line == "" {
		return fmt.Sprintf("ringlock: protocol violation by the server: %s", e.Reason)
	}
	return fmt.Sprintf("ringlock: protocol violation by the server: %s: %q", e.Reason, e.Line)
}

// protocolError builds a ProtocolError quoting at most 200 bytes of line.
func protocolError(reason string, line []byte) *ProtocolError {
	const quotedMax = 200
	if len(line) > quotedMax {
		line = line[:quotedMax]
	}
	return &ProtocolError{Line: string(line), Reason: reason}
}
