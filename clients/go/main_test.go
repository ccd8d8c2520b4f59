package ringlock_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// addr is the address of a ringlock server that TestMain starts for the
// examples, which use it where an application would write its own
// "host:port".
var addr string

// tlsAddr is the address of a server with mutual TLS and an auth file that
// names alpha (alphaSecret), started for the TLS example; certsDir holds
// the certificates it was made with (ringlock-testkit certs).
var tlsAddr, certsDir string

func TestMain(m *testing.M) {
	s, err := startServer()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	addr = s.addr
	secured, dir, err := startTLSExampleServer()
	if err != nil {
		s.stop()
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	tlsAddr, certsDir = secured.addr, dir
	code := m.Run()
	s.stop()
	secured.stop()
	os.RemoveAll(dir)
	os.Exit(code)
}

// startTLSExampleServer makes certificates and an auth file in a new
// directory and starts a server with --tls-cert, --tls-client-ca and
// --auth-file; the server and the directory, which the caller removes.
func startTLSExampleServer() (*server, string, error) {
	kit, err := binary("ringlock-testkit", "RINGLOCK_TESTKIT_BIN")
	if err != nil {
		return nil, "", err
	}
	dir, err := os.MkdirTemp("", "ringlock-go-certs-")
	if err != nil {
		return nil, "", err
	}
	if output, err := exec.Command(kit, "certs", dir).CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, "", fmt.Errorf("ringlock-testkit certs: %v: %s", err, output)
	}
	digest := sha256.Sum256([]byte(alphaSecret))
	auth := filepath.Join(dir, "auth")
	if err := os.WriteFile(auth, []byte("alpha "+hex.EncodeToString(digest[:])+" alpha/*\n"), 0o600); err != nil {
		os.RemoveAll(dir)
		return nil, "", err
	}
	args := append(tlsArgs(dir, "server"), "--tls-client-ca", filepath.Join(dir, "ca.pem"), "--auth-file", auth)
	s, err := startServer(args...)
	if err != nil {
		os.RemoveAll(dir)
		return nil, "", err
	}
	return s, dir, nil
}
