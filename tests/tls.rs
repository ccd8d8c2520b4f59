//! TLS on the client port against the real server: certificates made here
//! (never committed), a TLS client speaking the protocol, pipelining over
//! TLS, mutual TLS, and clients that are refused.

mod common;

#[path = "common/tls.rs"]
mod tls_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use common::{DataDir, PATIENCE, Server, metrics_address, scrape, wait_until};
use tls_support::{Certificates, TlsConn, client_config};

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
    let mut with = TlsConn::connect(&server, client_config(&certificates.ca, Some(&certificates.client)));
    assert!(with.call("A mtls/1 30 0").starts_with("A mtls/1 "));
    let mut without = TlsConn::connect(&server, client_config(&certificates.ca, None));
    assert!(without.send(b"P\n").and_then(|()| without.line()).is_err(), "no certificate, no service");
    let stranger = Certificates::new();
    let mut foreign = TlsConn::connect(&server, client_config(&certificates.ca, Some(&stranger.client)));
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

#[test]
fn sighup_rotates_the_certificate_for_new_connections_and_a_broken_file_keeps_the_old() {
    let certificates = Certificates::new();
    let server = start(&certificates, &["--metrics-listen".to_string(), "127.0.0.1:0".to_string()]);
    let metrics = metrics_address(&server);
    let old_ca = client_config(&certificates.ca, None);
    let mut live = TlsConn::connect(&server, old_ca.clone());
    let token: u64 = live.call("A rotate/held 60 0").strip_prefix("A rotate/held ").unwrap().parse().unwrap();
    // A new CA and a server certificate of it replace the files.
    let new_authority = tls_support::Ca::new();
    let (new_cert, new_key) = new_authority.server_pem();
    certificates.replace("server.key", &new_key);
    certificates.replace("server.pem", &new_cert);
    server.signal("HUP");
    wait_until("the reload", || scrape(metrics).get("ringlock_tls_reloads_total{result=\"ok\"}") == Some(&1.0));
    wait_until("the log to say the files were reloaded", || {
        server.log().contains("TLS certificate, key and client CA reloaded")
    });
    let new_ca = client_config(&new_authority.der(), None);
    let mut fresh = TlsConn::connect(&server, new_ca.clone());
    assert!(fresh.call("P").starts_with("P active "), "a client of the new CA connects");
    let mut stale = TlsConn::connect(&server, old_ca);
    let error = stale.try_call("P").expect_err("a client that trusts only the old CA");
    assert!(error.to_string().contains("invalid peer certificate"), "{error}");
    assert_eq!(live.call(&format!("R rotate/held {token}")), "R rotate/held", "the open connection carries on");
    // A certificate file that does not parse: the settings in force stay.
    certificates.replace("server.pem", "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n");
    server.signal("HUP");
    wait_until("the failed reload", || {
        scrape(metrics).get("ringlock_tls_reloads_total{result=\"failed\"}") == Some(&1.0)
    });
    // The log line follows the count, through the log's pipe.
    wait_until("the log to say the files in force stay", || server.log().contains("the TLS settings in force stay"));
    let mut after = TlsConn::connect(&server, new_ca);
    assert!(after.call("P").starts_with("P active "), "still the new certificate");
    assert!(live.call("P").starts_with("P active "));
    assert!(fresh.call("P").starts_with("P active "));
}

/// An auth file of `names` (scope `<name>/*`, secret `secret-of-<name>`;
/// `admin` may lock every key) in the certificates' directory; returns its
/// path.
fn write_auth_file(certificates: &Certificates, names: &[&str]) -> String {
    let mut text = String::new();
    for name in names {
        let digest: String = ring::digest::digest(&ring::digest::SHA256, format!("secret-of-{name}").as_bytes())
            .as_ref()
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        let scope = if *name == "admin" { "*".to_string() } else { format!("{name}/*") };
        text.push_str(&format!("{name} {digest} {scope}\n"));
    }
    certificates.replace("auth", &text);
    certificates.path("auth")
}

#[test]
fn a_client_certificate_naming_an_auth_entry_authenticates_the_connection() {
    let certificates = Certificates::new();
    let auth = write_auth_file(&certificates, &["billing", "ops", "admin"]);
    let server =
        start(&certificates, &["--tls-client-ca".into(), certificates.path("ca.pem"), "--auth-file".into(), auth]);
    let billing_certificate = certificates.authority.client(&["billing"]);
    let mut billing = TlsConn::connect(&server, client_config(&certificates.ca, Some(&billing_certificate)));
    // No U: the certificate's name is the connection's, and its grants are
    // that name's: another name cannot release them with the token.
    let granted = billing.call("A billing/1 30 0");
    assert!(granted.starts_with("A billing/1 "), "{granted}");
    let token = granted.rsplit(' ').next().unwrap();
    let nameless = certificates.authority.client(&["nobody"]);
    let mut other = TlsConn::connect(&server, client_config(&certificates.ca, Some(&nameless)));
    assert_eq!(other.call("U secret-of-admin"), "U admin");
    assert_eq!(other.call(&format!("R billing/1 {token}")), "E R billing/1 not-holder");
    assert_eq!(other.call("I billing/1").split(' ').nth(2), Some("-"), "the token is hidden from admin");
    assert_eq!(billing.call(&format!("R billing/1 {token}")), "R billing/1");
    assert!(billing.call("A billing/1 30 0").starts_with("A billing/1 "));
    assert_eq!(billing.call("A ops/1 30 0"), "E A ops/1 forbidden", "with the name's scope");
    // U still works, and switches names.
    assert_eq!(billing.call("U secret-of-ops"), "U ops");
    assert!(billing.call("A ops/1 30 0").starts_with("A ops/1 "));
    // A certificate of the CA that names no entry: served, but nameless.
    let stranger_certificate = certificates.authority.client(&["stranger", "*.billing"]);
    let mut stranger = TlsConn::connect(&server, client_config(&certificates.ca, Some(&stranger_certificate)));
    assert_eq!(stranger.call("A billing/2 30 0"), "E A billing/2 auth-required");
    assert_eq!(stranger.call("U secret-of-billing"), "U billing");
    assert!(stranger.call("A billing/2 30 0").starts_with("A billing/2 "));
    // The second name of a certificate counts when the first names nobody.
    let second = certificates.authority.client(&["nobody", "ops"]);
    let mut second = TlsConn::connect(&server, client_config(&certificates.ca, Some(&second)));
    assert!(second.call("A ops/2 30 0").starts_with("A ops/2 "));
    // A reload that removes the name revokes the connection it named, and
    // the next connection with that certificate is nameless.
    let mut named = TlsConn::connect(&server, client_config(&certificates.ca, Some(&billing_certificate)));
    assert!(named.call("A billing/3 30 0").starts_with("A billing/3 "));
    write_auth_file(&certificates, &["ops"]);
    server.signal("HUP");
    assert_eq!(named.line().unwrap(), "E - - auth-revoked");
    let mut again = TlsConn::connect(&server, client_config(&certificates.ca, Some(&billing_certificate)));
    assert_eq!(again.call("A billing/4 30 0"), "E A billing/4 auth-required");
    assert!(second.call("A ops/3 30 0").starts_with("A ops/3 "), "ops keeps its name");
}
