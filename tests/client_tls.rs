//! The Rust client (sync and async) and ringlock-cli over TLS, against the
//! real server with certificates made by the test: expired and wrong-name
//! server certificates are refused with `Error::Tls`, a server name can be
//! given, a secret goes over TLS, and nothing is sent in clear to a server
//! whose handshake fails.

mod common;

use std::io::Read;
use std::net::TcpListener;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use common::Server;
use common::certs::Certificates;
use futures_lite::future::block_on;
use ringlock_client::proto::Role;
use ringlock_client::{BadArgument, Client, ClientBuilder, Error, ReleaseOutcome};

const LEASE: Duration = Duration::from_secs(60);
const WAIT: Option<Duration> = Some(Duration::from_secs(1));

fn tls_server(certificates: &Certificates, cert: &str, key: &str) -> Server {
    let args = certificates.server_args_with(cert, key);
    Server::start(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

fn trusting(server: &Server, certificates: &Certificates) -> ClientBuilder {
    Client::builder([server.addr.to_string()]).tls_ca(certificates.path("ca.pem"))
}

/// The TLS error of an acquire with a wait of 1 s; it must come within the
/// wait's order of magnitude, not hang.
fn tls_error(client: &Client, key: &str) -> (String, String) {
    let started = Instant::now();
    let error = client.acquire(key, LEASE, WAIT).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10), "not a hang: {:?}", started.elapsed());
    match error {
        Error::Tls { address, message } => (address, message),
        other => panic!("a TLS error: {other:?}"),
    }
}

#[test]
fn an_expired_server_certificate_is_refused() {
    let certificates = Certificates::new();
    let server = tls_server(&certificates, "expired.pem", "expired.key");
    let client = trusting(&server, &certificates).connect().unwrap();
    let (address, message) = tls_error(&client, "tls/expired");
    assert_eq!(address, server.addr.to_string());
    assert!(message.contains("certificate expired"), "{message}");
}

#[test]
fn a_server_certificate_for_another_name_is_refused_unless_that_name_is_given() {
    let certificates = Certificates::new();
    let server = tls_server(&certificates, "wrong-name.pem", "wrong-name.key");
    let client = trusting(&server, &certificates).connect().unwrap();
    let (_, message) = tls_error(&client, "tls/wrong-name");
    assert!(message.contains("not valid for name \"127.0.0.1\""), "{message}");
    // The same certificate, with the name it does carry.
    let named = trusting(&server, &certificates).tls_server_name("elsewhere.example").connect().unwrap();
    let lock = named.acquire("tls/named", LEASE, WAIT).unwrap().expect("granted");
    assert_eq!(lock.release(), Ok(ReleaseOutcome::Released));
}

#[test]
fn the_localhost_name_of_the_certificate_is_checked_for_a_localhost_address() {
    let certificates = Certificates::new();
    let server = tls_server(&certificates, "server.pem", "server.key");
    let address = format!("localhost:{}", server.addr.port());
    let client = Client::builder([address]).tls_ca(certificates.path("ca.pem")).connect().unwrap();
    client.ping().unwrap();
}

#[test]
fn the_async_client_locks_over_tls_with_many_requests_in_flight() {
    let certificates = Certificates::new();
    let server = tls_server(&certificates, "server.pem", "server.key");
    let client = trusting(&server, &certificates).connect().unwrap();
    block_on(async {
        let mut acquires = Vec::new();
        for index in 0..200 {
            acquires.push(client.acquire_async(format!("async-tls/{index}"), LEASE, None));
        }
        let mut locks = Vec::new();
        for acquire in acquires {
            locks.push(acquire.await.unwrap().expect("no wait limit"));
        }
        for lock in locks {
            lock.extend_async(LEASE).await.unwrap();
            assert_eq!(lock.release_async().await, Ok(ReleaseOutcome::Released));
        }
        assert_eq!(client.ping_async().await.unwrap().role, Role::Active);
    });
}

#[test]
fn a_secret_is_sent_over_tls() {
    let certificates = Certificates::new();
    let secret = "tls-secret-3b8e0d5a1c7f9264";
    let digest: String = ring::digest::digest(&ring::digest::SHA256, secret.as_bytes())
        .as_ref()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    let auth = common::DataDir::new();
    std::fs::create_dir_all(&auth.0).unwrap();
    let auth_file = auth.0.join("auth");
    std::fs::write(&auth_file, format!("ops {digest} *\n")).unwrap();
    let mut args = certificates.server_args();
    args.extend(["--auth-file".to_string(), auth_file.to_str().unwrap().to_string()]);
    let server = Server::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let client = trusting(&server, &certificates).secret(secret).connect().unwrap();
    let lock = client.acquire("tls/authenticated", LEASE, WAIT).unwrap().expect("granted");
    assert_eq!(client.name().as_deref(), Some("ops"));
    assert_eq!(lock.release(), Ok(ReleaseOutcome::Released));
}

#[test]
fn a_server_that_fails_the_handshake_never_sees_a_request_in_clear() {
    // A listener that records what the client sends, then closes.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let recording = thread::spawn(move || {
        let (mut socket, _) = listener.accept().unwrap();
        socket.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        let mut received = Vec::new();
        let mut chunk = [0u8; 4096];
        while let Ok(read) = socket.read(&mut chunk) {
            if read == 0 {
                break;
            }
            received.extend_from_slice(&chunk[..read]);
        }
        received
    });
    let certificates = Certificates::new();
    let client = Client::builder([address.to_string()])
        .tls_ca(certificates.path("ca.pem"))
        .connections_per_node(1)
        .connect()
        .unwrap();
    let error = client.acquire("in-clear/never", LEASE, WAIT).unwrap_err();
    assert!(matches!(error, Error::NoConnection { .. } | Error::Tls { .. }), "{error:?}");
    let received = recording.join().unwrap();
    assert_eq!(received.first(), Some(&0x16), "a TLS handshake record first: {received:?}");
    let text = String::from_utf8_lossy(&received);
    assert!(!text.contains("in-clear/never"), "no request in clear: {text}");
}

#[test]
fn unusable_tls_settings_are_refused_by_connect() {
    let certificates = Certificates::new();
    let without_ca = Client::builder(["127.0.0.1:1"]).tls_cert(certificates.path("client.pem")).connect();
    assert!(matches!(without_ca, Err(Error::BadArgument(BadArgument::Setting(why))) if why.contains("tls_ca")));
    let missing = Client::builder(["127.0.0.1:1"]).tls_ca(certificates.path("absent.pem")).connect();
    let Err(Error::BadArgument(BadArgument::Tls(why))) = missing else { panic!("{missing:?}") };
    assert!(why.contains("absent.pem"), "{why}");
    let not_a_key = Client::builder(["127.0.0.1:1"])
        .tls_ca(certificates.path("ca.pem"))
        .tls_cert(certificates.path("client.pem"))
        .tls_key(certificates.path("client.pem"))
        .connect();
    let Err(Error::BadArgument(BadArgument::Tls(why))) = not_a_key else { panic!("{not_a_key:?}") };
    assert!(why.contains("tls_key"), "{why}");
}

fn cli() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ringlock-cli"))
}

#[test]
fn ringlock_cli_acquires_and_releases_over_tls_and_names_a_tls_failure() {
    let certificates = Certificates::new();
    let server = tls_server(&certificates, "server.pem", "server.key");
    let servers = server.addr.to_string();
    let acquired = cli()
        .args(["--servers", &servers, "--tls-ca", &certificates.path("ca.pem")])
        .args(["acquire", "cli/tls", "--lease", "30", "--wait", "5"])
        .output()
        .unwrap();
    assert!(acquired.status.success(), "{acquired:?}");
    let token = String::from_utf8(acquired.stdout).unwrap().trim().to_string();
    assert!(token.parse::<u64>().is_ok(), "a token: {token}");
    // The CA from the environment this time.
    let released = cli()
        .env("RINGLOCK_TLS_CA", certificates.path("ca.pem"))
        .args(["--servers", &servers, "release", "cli/tls", &token])
        .output()
        .unwrap();
    assert!(released.status.success(), "{released:?}");
    let inspected = trusting(&server, &certificates).connect().unwrap().inspect("cli/tls").unwrap();
    assert_eq!(inspected.token, None, "released");
    let refused = cli()
        .args(["--servers", &servers, "--tls-ca", &certificates.path("other-ca.pem"), "--connect-limit", "1"])
        .arg("ping")
        .output()
        .unwrap();
    assert!(!refused.status.success(), "{refused:?}");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("TLS") && stderr.contains(&servers), "{stderr}");
}
