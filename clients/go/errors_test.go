package ringlock

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
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
