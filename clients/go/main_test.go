package ringlock_test

import (
	"fmt"
	"os"
	"testing"
)

// addr is the address of a ringlock server that TestMain starts for the
// examples, which use it where an application would write its own
// "host:port".
var addr string

func TestMain(m *testing.M) {
	s, err := startServer()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	addr = s.addr
	code := m.Run()
	s.stop()
	os.Exit(code)
}
