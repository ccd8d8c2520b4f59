//! TLS on the client port against the real server: certificates made here
//! (never committed), a TLS client speaking the protocol, pipelining over
//! TLS, mutual TLS, and clients that are refused.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use common::certs::Certificates;
use common::{DataDir, PATIENCE, Server, metrics_address, scrape, wait_until};
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

fn client_config(root: &CertificateDer<'static>, identity: Option<&Certificates>) -> Arc<ClientConfig> {
    let mut store = RootCertStore::empty();
    store.add(root.clone()).unwrap();
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(store);
    Arc::new(match identity {
        Some(certificates) => builder
            .with_client_auth_cert(certificates.client_chain.clone(), certificates.client_key.clone_key())
            .unwrap(),
        None => builder.with_no_client_auth(),
    })
}

/// A protocol connection over TLS.
struct TlsConn {
    stream: StreamOwned<ClientConnection, TcpStream>,
    buffer: Vec<u8>,
}

impl TlsConn {
    fn connect(server: &Server, config: Arc<ClientConfig>) -> TlsConn {
        let tcp = TcpStream::connect(server.addr).unwrap();
        tcp.set_read_timeout(Some(PATIENCE)).unwrap();
        let connection = ClientConnection::new(config, ServerName::try_from("localhost").unwrap()).unwrap();
        TlsConn { stream: StreamOwned::new(connection, tcp), buffer: Vec::new() }
    }

    fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)?;
        self.stream.flush()
    }

    /// The next reply line, or the error that ended the stream.
    fn line(&mut self) -> std::io::Result<String> {
        loop {
            if let Some(end) = self.buffer.iter().position(|&byte| byte == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                return Ok(String::from_utf8(line).unwrap().trim_end().to_string());
            }
            let mut chunk = [0u8; 4096];
            let read = self.stream.read(&mut chunk)?;
            if read == 0 {
                return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "closed"));
            }
            self.buffer.extend_from_slice(&chunk[..read]);
        }
    }

    fn call(&mut self, line: &str) -> String {
        self.send(format!("{line}\n").as_bytes()).unwrap();
        self.line().unwrap()
    }
}

fn start(certificates: &Certificates, extra: &[String]) -> Server {
    let mut args = certificates.server_args();
    args.extend_from_slice(extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::start(&args)
}

#[test]
fn locks_are_taken_and_released_over_tls_and_pipelined_replies_all_arrive() {
    let certificates = Certificates::new();
    let server = start(&certificates, &[]);
    let mut conn = TlsConn::connect(&server, client_config(&certificates.ca, None));
    assert!(conn.call("P").starts_with("P active "));
    let reply = conn.call("A tls/1 30 0");
    let token: u64 = reply.strip_prefix("A tls/1 ").expect("a grant").parse().unwrap();
    assert_eq!(conn.call(&format!("R tls/1 {token}")), "R tls/1");
    // A thousand requests in one write: every reply comes back.
    let mut batch = String::new();
    for index in 0..1000 {
        batch.push_str(&format!("A pipelined/{index} 30 0\n"));
    }
    conn.send(batch.as_bytes()).unwrap();
    let mut granted = std::collections::HashSet::new();
    for _ in 0..1000 {
        let line = conn.line().unwrap();
        let key = line.split(' ').nth(1).unwrap().to_string();
        assert!(line.starts_with("A pipelined/"), "{line}");
        assert!(granted.insert(key), "one reply per request");
    }
}

#[test]
fn a_client_that_does_not_speak_tls_is_dropped_and_others_carry_on() {
    let certificates = Certificates::new();
    let server = start(&certificates, &["--metrics-listen".to_string(), "127.0.0.1:0".to_string()]);
    let metrics = metrics_address(&server);
    let mut bystander = TlsConn::connect(&server, client_config(&certificates.ca, None));
    assert!(bystander.call("P").starts_with("P active "));
    // Plain protocol lines instead of a ClientHello.
    let mut plain = TcpStream::connect(server.addr).unwrap();
    plain.set_read_timeout(Some(PATIENCE)).unwrap();
    plain.write_all(b"P\nA k 30 0\n").unwrap();
    let mut received = Vec::new();
    let _ = plain.read_to_end(&mut received);
    assert!(!String::from_utf8_lossy(&received).contains("P active"), "no plaintext reply: {received:?}");
    // A ClientHello with garbage after its header.
    let mut garbage = TcpStream::connect(server.addr).unwrap();
    garbage.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut hello = vec![0x16, 0x03, 0x01, 0x40, 0x00];
    hello.extend(std::iter::repeat_n(0xAB, 0x4000));
    let _ = garbage.write_all(&hello);
    let mut sink = Vec::new();
    let _ = garbage.read_to_end(&mut sink);
    assert!(bystander.call("A still-served 30 0").starts_with("A still-served "));
    wait_until("both failed handshakes counted", || scrape(metrics)["ringlock_tls_errors_total"] == 2.0);
}

#[test]
fn a_close_notify_ends_the_input_and_bytes_after_it_are_dropped() {
    let certificates = Certificates::new();
    // One shard core: a core stuck on the closed connection would stall the bystander.
    let server = start(&certificates, &["--shards".to_string(), "1".to_string()]);
    let mut bystander = TlsConn::connect(&server, client_config(&certificates.ca, None));
    assert!(bystander.call("P").starts_with("P active "));
    let mut closing = TlsConn::connect(&server, client_config(&certificates.ca, None));
    assert!(closing.call("A closing/held 30 0").starts_with("A closing/held "));
    closing.send(b"P\n").unwrap();
    closing.stream.conn.send_close_notify();
    closing.stream.flush().unwrap();
    // Raw bytes after the close_notify, in a write of their own.
    let _ = closing.stream.sock.write_all(b"\x17\x03\x03\x00\x05hello");
    // What came before the close_notify is answered, then the server closes.
    assert!(closing.line().unwrap().starts_with("P active "));
    let end = closing.line().expect_err("the server closes after its replies");
    assert_eq!(end.kind(), std::io::ErrorKind::UnexpectedEof, "{end}");
    assert!(bystander.call("I closing/held").starts_with("I closing/held "), "the core serves on");
}

#[test]
fn a_certificate_from_another_ca_is_refused_by_the_client() {
    let certificates = Certificates::new();
    let other = Certificates::new();
    let server = start(&certificates, &[]);
    let mut conn = TlsConn::connect(&server, client_config(&other.ca, None));
    let error = conn.send(b"P\n").and_then(|()| conn.line()).expect_err("the handshake fails");
    assert!(error.to_string().contains("invalid peer certificate"), "{error}");
}

#[test]
fn mutual_tls_serves_a_client_with_a_certificate_of_the_ca_only() {
    let certificates = Certificates::new();
    let server = start(&certificates, &["--tls-client-ca".to_string(), certificates.path("ca.pem")]);
    let mut with = TlsConn::connect(&server, client_config(&certificates.ca, Some(&certificates)));
    assert!(with.call("A mtls/1 30 0").starts_with("A mtls/1 "));
    let mut without = TlsConn::connect(&server, client_config(&certificates.ca, None));
    assert!(without.send(b"P\n").and_then(|()| without.line()).is_err(), "no certificate, no service");
    let stranger = Certificates::new();
    let mut foreign = TlsConn::connect(&server, client_config(&certificates.ca, Some(&stranger)));
    assert!(foreign.send(b"P\n").and_then(|()| foreign.line()).is_err(), "a certificate of another CA");
    assert!(with.call("P").starts_with("P active "), "the served client carries on");
}

#[test]
fn bad_tls_files_stop_the_start_with_the_flag_that_named_them() {
    let certificates = Certificates::new();
    let data = Arc::new(DataDir::new());
    let error = Server::try_start_in(
        data,
        &["--tls-cert", &certificates.path("server.key"), "--tls-key", &certificates.path("server.key")],
    )
    .err()
    .expect("a key is not a certificate");
    assert!(error.contains("--tls-cert"), "{error}");
    let error = Server::try_start_in(Arc::new(DataDir::new()), &["--tls-cert", &certificates.path("server.pem")])
        .err()
        .expect("a certificate without its key");
    assert!(error.contains("--tls-key"), "{error}");
}
