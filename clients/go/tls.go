package ringlock

// TLS on the client's connections (crypto/tls): the configuration Dial
// builds from the TLS options, and the handshake every connect does before
// anything else, within the connect timeout. A *tls.Conn then stands where
// the TCP connection stood: the reader and the writer use it unchanged, and
// each batch of queued requests is one Write, so one record (dynamic record
// sizing is off, so that a batch is not cut into small records).

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"
)

// tlsVersionMin is the oldest TLS version the client offers (the server
// speaks 1.3, and 1.2 with AEAD suites).
const tlsVersionMin = tls.VersionTLS12

// buildTLS makes the TLS configuration the options ask for, reading the
// files now so that a bad one fails Dial rather than every connect; it
// leaves o.tls nil for plain TCP.
func (o *options) buildTLS() error {
	if o.tlsConfig == nil && o.tlsCA == "" {
		switch {
		case o.tlsCertFile != "" || o.tlsKeyFile != "":
			return &ArgumentError{Arg: "WithTLSCert", Reason: "needs WithTLSCA or WithTLSConfig, which turn TLS on"}
		case o.tlsServerName != "":
			return &ArgumentError{Arg: "WithTLSServerName",
				Reason: "needs WithTLSCA or WithTLSConfig, which turn TLS on"}
		}
		return nil
	}
	config := &tls.Config{}
	if o.tlsConfig != nil {
		config = o.tlsConfig.Clone()
	}
	config.MinVersion = max(config.MinVersion, tlsVersionMin)
	config.DynamicRecordSizingDisabled = true
	if o.tlsCA != "" {
		text, err := os.ReadFile(o.tlsCA)
		if err != nil {
			return &ArgumentError{Arg: "WithTLSCA", Reason: err.Error()}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(text) {
			return &ArgumentError{Arg: "WithTLSCA", Reason: fmt.Sprintf("%s holds no PEM certificate", o.tlsCA)}
		}
		config.RootCAs = pool
	}
	if o.tlsCertFile != "" || o.tlsKeyFile != "" {
		certificate, err := tls.LoadX509KeyPair(o.tlsCertFile, o.tlsKeyFile)
		if err != nil {
			return &ArgumentError{Arg: "WithTLSCert", Reason: err.Error()}
		}
		config.Certificates = append(config.Certificates, certificate)
	}
	if o.tlsServerName != "" {
		config.ServerName = o.tlsServerName
	}
	o.tls = config
	return nil
}

// handshake runs the TLS handshake on a fresh connection to address until
// deadline (or until ctx ends): the connection to use, or the error, a
// *TLSError if TLS itself failed. It closes conn on failure.
func handshake(ctx context.Context, conn net.Conn, address string, config *tls.Config,
	deadline time.Time) (net.Conn, error) {
	if config.ServerName == "" {
		// The host of the address; Go checks an IP address against the
		// certificate's IP names.
		host, _, err := net.SplitHostPort(address)
		if err != nil {
			conn.Close()
			return nil, err
		}
		config = config.Clone()
		config.ServerName = host
	}
	client := tls.Client(conn, config)
	handshakeContext, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	if err := client.HandshakeContext(handshakeContext); err != nil {
		conn.Close()
		if transportFailure(err) {
			return nil, err
		}
		return nil, &TLSError{Address: address, Err: err}
	}
	return client, nil
}

// transportFailure reports whether a handshake error came from the
// connection under TLS (closed, reset, timed out) rather than from TLS.
func transportFailure(err error) bool {
	var errno syscall.Errno
	var netError net.Error
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.As(err, &errno) || (errors.As(err, &netError) && netError.Timeout())
}

// tlsReadFailure is a read error of a TLS connection as a *TLSError if TLS
// ended it (an alert from the server, such as its refusal of a client
// without a certificate, which TLS 1.3 sends after the client's side of the
// handshake is done; or a record that does not decrypt), else err.
func tlsReadFailure(address string, err error) error {
	var opError *net.OpError
	var header tls.RecordHeaderError
	if (errors.As(err, &opError) && (opError.Op == "remote error" || opError.Op == "local error")) ||
		errors.As(err, &header) {
		return &TLSError{Address: address, Err: err}
	}
	return err
}

// describeTLS is a TLS failure in words, saying first whether the server's
// certificate was not trusted.
func describeTLS(err error) string {
	var unknown x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	var hostname x509.HostnameError
	switch {
	case errors.As(err, &unknown):
		return "the server's certificate is not trusted: " + err.Error()
	case errors.As(err, &invalid) || errors.As(err, &hostname):
		return "the server's certificate was refused: " + err.Error()
	}
	return err.Error()
}
