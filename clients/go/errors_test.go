package ringlock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestConnectionErrorNamesEveryAddressWithItsNetError(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	timedOut := &net.OpError{Op: "dial", Net: "tcp", Err: context.DeadlineExceeded}
	err := error(&ConnectionError{Waited: 10040 * time.Millisecond, Addresses: []AddressError{
		{Address: "127.0.0.1:7700", Err: refused},
		{Address: "127.0.0.1:7701", Err: timedOut},
		{Address: "127.0.0.1:7702", Err: io.EOF},
		{Address: "127.0.0.1:7703"},
	}})
	want := "ringlock: no usable connection after 10.0 s: 127.0.0.1:7700 (connection refused), " +
		"127.0.0.1:7701 (timed out), 127.0.0.1:7702 (closed by the server), 127.0.0.1:7703 (no attempt has ended yet)"
	if err.Error() != want {
		t.Errorf("%q\nwant %q", err.Error(), want)
	}
	if !errors.Is(err, ErrNoConnection) || !errors.Is(err, syscall.ECONNREFUSED) || !errors.Is(err, io.EOF) {
		t.Errorf("errors.Is does not see through %v", err)
	}
	var opErr *net.OpError
	if !errors.As(err, &opErr) || opErr != refused {
		t.Errorf("errors.As *net.OpError: %v", opErr)
	}
	if errors.Is(err, ErrNoActive) || errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("%v matches what it is not", err)
	}
}

func TestAnAuthErrorMatchesErrAuthAlsoInsideAConnectionError(t *testing.T) {
	refused := &AuthError{Address: "127.0.0.1:7700", Code: CodeAuthFailed}
	if refused.Error() != "ringlock: 127.0.0.1:7700 refused the client's secret: auth-failed" {
		t.Errorf("%q", refused.Error())
	}
	mixed := error(&ConnectionError{Waited: time.Second, Addresses: []AddressError{
		{Address: "127.0.0.1:7700", Err: refused},
		{Address: "127.0.0.1:7701", Err: io.EOF},
	}})
	want := "ringlock: no usable connection after 1.0 s: 127.0.0.1:7700 (secret refused: auth-failed), " +
		"127.0.0.1:7701 (closed by the server)"
	if mixed.Error() != want {
		t.Errorf("%q\nwant %q", mixed.Error(), want)
	}
	if !errors.Is(mixed, ErrAuth) || !errors.Is(mixed, ErrNoConnection) || !errors.Is(refused, ErrAuth) {
		t.Errorf("errors.Is does not see the refusal in %v", mixed)
	}
	if errors.Is(&ServerError{Code: CodeForbidden}, ErrAuth) || !errors.Is(&ServerError{Code: CodeForbidden}, ErrForbidden) {
		t.Error("forbidden is a server error, not an auth error")
	}
}

func TestTheSecretComesFromTheEnvironmentUnlessGivenAndIsNeverPrinted(t *testing.T) {
	t.Setenv(SecretEnv, "from-the-environment")
	o := defaultOptions()
	o.secretFromEnvironment()
	if o.secret == nil || o.secret() != "from-the-environment" {
		t.Fatalf("the environment's secret was not taken")
	}
	o = defaultOptions()
	WithSecret("given-secret")(&o)
	o.secretFromEnvironment()
	if o.secret() != "given-secret" {
		t.Errorf("WithSecret does not win over the environment")
	}
	for _, format := range []string{"%v", "%+v", "%#v", "%s"} {
		if printed := fmt.Sprintf(format, o); strings.Contains(printed, "given-secret") {
			t.Errorf("%s prints the secret: %s", format, printed)
		}
	}
	for _, bad := range []string{"", "two words", "tab\there"} {
		o := defaultOptions()
		o.connectionsPerNode = 1
		WithSecret(bad)(&o)
		if err := o.validate(); err == nil || strings.Contains(err.Error(), bad) && bad != "" {
			t.Errorf("%q: %v, want an ArgumentError without the secret", bad, err)
		}
	}
}
