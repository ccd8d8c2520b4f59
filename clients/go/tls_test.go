package ringlock_test

// TLS beyond the shared scenarios: server certificates that expired or
// name another host, the server-name option, a configuration of one's
// own, a secret over TLS and its reconnects, and options refused by Dial.
// Against the real server, with certificates from ringlock-testkit certs.

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"ringlock.dev/ringlock"
)

func TestTLSExpiredCertificateIsRefused(t *testing.T) {
	certs := makeCerts(t)
	s := newServer(t, tlsArgs(certs, "expired")...)
	started := time.Now()
	client, err := ringlock.Dial(testContext(t), []string{s.addr}, ringlock.WithTLSCA(filepath.Join(certs, "ca.pem")))
	if err == nil {
		client.Close()
		t.Fatal("Dial took an expired certificate")
	}
	assertTLSFailure(t, err, s.addr, time.Since(started), "expired")
	var invalid x509.CertificateInvalidError
	if !errors.As(err, &invalid) || invalid.Reason != x509.Expired {
		t.Errorf("err = %v, want one that wraps an x509.CertificateInvalidError for expiry", err)
	}
}

func TestTLSCertificateForAnotherNameIsRefusedUnlessThatNameIsAsked(t *testing.T) {
	certs := makeCerts(t)
	s := newServer(t, tlsArgs(certs, "wrong-name")...)
	ca := ringlock.WithTLSCA(filepath.Join(certs, "ca.pem"))
	started := time.Now()
	client, err := ringlock.Dial(testContext(t), []string{s.addr}, ca)
	if err == nil {
		client.Close()
		t.Fatal("Dial took a certificate for another name")
	}
	assertTLSFailure(t, err, s.addr, time.Since(started), "127.0.0.1")
	var hostname x509.HostnameError
	if !errors.As(err, &hostname) {
		t.Errorf("err = %v, want one that wraps an x509.HostnameError", err)
	}
	named := dial(t, []string{s.addr}, ca, ringlock.WithTLSServerName("elsewhere.invalid"))
	cycle(t, named, "tls/named")
}

func TestTLSConfigOfOnesOwn(t *testing.T) {
	certs := makeCerts(t)
	s := newServer(t, tlsArgs(certs, "server")...)
	text, err := os.ReadFile(filepath.Join(certs, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(text)
	config := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}
	client := dial(t, []string{s.addr}, ringlock.WithTLSConfig(config))
	cycle(t, client, "tls/own-config")
	if config.ServerName != "" || config.DynamicRecordSizingDisabled {
		t.Error("Dial changed the caller's configuration instead of a clone")
	}
	// The options apply on top of it: here a CA that does not sign the
	// server's certificate.
	_, err = ringlock.Dial(testContext(t), []string{s.addr}, ringlock.WithTLSConfig(config),
		ringlock.WithTLSCA(filepath.Join(certs, "other-ca.pem")))
	if !errors.Is(err, ringlock.ErrTLS) {
		t.Errorf("err = %v, want ErrTLS", err)
	}
}

func TestTLSWithSecretAuthenticatesOnEveryConnect(t *testing.T) {
	certs := makeCerts(t)
	file := newAuthFile(t, map[string]string{"alpha": alphaSecret})
	s := newServer(t, append(tlsArgs(certs, "server"), "--auth-file", file.path)...)
	client := dial(t, []string{s.addr}, ringlock.WithTLSCA(filepath.Join(certs, "ca.pem")),
		ringlock.WithSecret(alphaSecret))
	cycle(t, client, "alpha/tls")
	if name := client.Name(); name != "alpha" {
		t.Fatalf("name %q, want alpha", name)
	}
	s.kill()
	waitUntil(t, "the client to see its connections broken", func() bool {
		return ringlock.UsableConnections(client) == 0
	})
	path, err := binary("ringlock", "RINGLOCK_BIN")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.launch(path, s.addr); err != nil {
		t.Fatal(err)
	}
	// Granted only once a new connection did the handshake and sent U:
	// the server answers auth-required to anything else.
	lock, err := client.Acquire(testContext(t), "alpha/tls-again", lease, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	mustRelease(t, lock)
}

func TestTLSOptionsAreCheckedByDial(t *testing.T) {
	certs := makeCerts(t)
	address := []string{"127.0.0.1:1"}
	for _, test := range []struct {
		name    string
		options []ringlock.Option
		arg     string
	}{
		{"a certificate without TLS on", []ringlock.Option{ringlock.WithTLSCert(filepath.Join(certs, "client.pem"),
			filepath.Join(certs, "client-key.pem"))}, "WithTLSCert"},
		{"a server name without TLS on", []ringlock.Option{ringlock.WithTLSServerName("localhost")}, "WithTLSServerName"},
		{"a CA file that is missing", []ringlock.Option{ringlock.WithTLSCA(filepath.Join(certs, "missing.pem"))},
			"WithTLSCA"},
		{"a CA file without a certificate", []ringlock.Option{ringlock.WithTLSCA(filepath.Join(certs, "server-key.pem"))},
			"WithTLSCA"},
		{"a key that is not the certificate's", []ringlock.Option{ringlock.WithTLSCA(filepath.Join(certs, "ca.pem")),
			ringlock.WithTLSCert(filepath.Join(certs, "client.pem"), filepath.Join(certs, "server-key.pem"))},
			"WithTLSCert"},
	} {
		_, err := ringlock.Dial(testContext(t), address, test.options...)
		var argument *ringlock.ArgumentError
		if !errors.As(err, &argument) || argument.Arg != test.arg {
			t.Errorf("%s: err = %v, want an *ArgumentError for %s", test.name, err, test.arg)
		} else if strings.TrimSpace(argument.Reason) == "" {
			t.Errorf("%s: no reason given", test.name)
		}
	}
}
