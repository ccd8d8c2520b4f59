//! Hostile clients on the client port's new input paths, against the real
//! server: handshakes that never end, garbage and oversized ClientHellos,
//! connections that never authenticate, floods of wrong secrets, and what a
//! bystander sees meanwhile. Certificates are made here (never committed).

mod common;
#[path = "common/tls.rs"]
mod tls_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{Conn, DataDir, PATIENCE, Server, metrics_address, scrape, wait_until};
use rustls::ClientConnection;
use rustls::pki_types::ServerName;
use tls_support::{Certificates, TlsConn, client_config};

/// `--handshake-ms` of these tests: short, so that the bound is reached soon.
const HANDSHAKE_MS: &str = "300";

fn start(certificates: &Certificates, extra: &[&str]) -> Server {
    let mut args = certificates.server_args();
    args.extend(["--metrics-listen", "127.0.0.1:0", "--handshake-ms", HANDSHAKE_MS].map(String::from));
    args.extend(extra.iter().map(|arg| arg.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::start(&args)
}

/// The first flight of a real TLS client: its ClientHello record(s).
fn client_hello(certificates: &Certificates) -> Vec<u8> {
    let config = client_config(&certificates.ca, None);
    let mut connection = ClientConnection::new(config, ServerName::try_from("localhost").unwrap()).unwrap();
    let mut hello = Vec::new();
    while connection.wants_write() {
        connection.write_tls(&mut hello).unwrap();
    }
    hello
}

/// True once the server has closed `stream` (end of file or a reset); false
/// if it is still open after [`PATIENCE`]. Whatever the server sent first
/// is returned too.
fn closed_by_server(stream: &mut TcpStream) -> (bool, Vec<u8>) {
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut received = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) => return (true, received),
            Ok(read) => received.extend_from_slice(&chunk[..read]),
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => return (true, received),
            Err(_) => return (false, received),
        }
    }
}

fn sample(metrics: std::net::SocketAddr, name: &str) -> f64 {
    scrape(metrics).get(name).copied().unwrap_or_else(|| panic!("no {name} in /metrics"))
}

#[test]
fn a_handshake_that_never_ends_is_closed_after_the_bound_and_counted() {
    let certificates = Certificates::new();
    let server = start(&certificates, &[]);
    let metrics = metrics_address(&server);
    let mut bystander = TlsConn::connect(&server, client_config(&certificates.ca, None));
    assert!(bystander.call("P").starts_with("P active "));
    // Slowloris: half a ClientHello, a byte at a time, then nothing.
    let hello = client_hello(&certificates);
    let mut slow = TcpStream::connect(server.addr).unwrap();
    slow.set_nodelay(true).unwrap();
    for byte in &hello[..hello.len() / 2] {
        if slow.write_all(std::slice::from_ref(byte)).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // A connection that says nothing at all.
    let mut silent = TcpStream::connect(server.addr).unwrap();
    assert!(closed_by_server(&mut slow).0, "the half handshake is closed");
    assert!(closed_by_server(&mut silent).0, "the silent connection is closed");
    wait_until("both counted", || sample(metrics, "ringlock_tls_handshake_timeouts_total") == 2.0);
    // A connection whose handshake ended is never closed by the bound.
    std::thread::sleep(Duration::from_millis(3 * HANDSHAKE_MS.parse::<u64>().unwrap()));
    assert!(bystander.call("A bystander/1 30 0").starts_with("A bystander/1 "));
    assert_eq!(sample(metrics, "ringlock_tls_errors_total"), 0.0, "a timeout is not a TLS error");
}

const SECRET: &str = "ops-secret-5be1c07a";

/// An auth file naming `ops` (secret [`SECRET`], every key) and `names`
/// (secrets nobody knows), in a directory of its own.
fn auth_file(names: &[&str]) -> (DataDir, String) {
    let dir = DataDir::new();
    std::fs::create_dir_all(&dir.0).unwrap();
    let digest = |secret: &str| -> String {
        ring::digest::digest(&ring::digest::SHA256, secret.as_bytes())
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let mut text = format!("ops {} *,stats\n", digest(SECRET));
    for name in names {
        text.push_str(&format!("{name} {} {name}/*\n", digest(&format!("unknown secret of {name}"))));
    }
    let path = dir.0.join("auth");
    std::fs::write(&path, text).unwrap();
    let path = path.to_str().unwrap().to_string();
    (dir, path)
}

/// A plain connection from the loopback address `from`.
fn connect_from(from: [u8; 4], to: std::net::SocketAddr) -> Conn {
    use std::os::fd::FromRawFd;
    let std::net::SocketAddr::V4(to) = to else { panic!("an IPv4 loopback address: {to}") };
    let address = |ip: [u8; 4], port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        // The octets in memory order are network byte order.
        sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(ip) },
        sin_zero: [0; 8],
    };
    let (local, remote) = (address(from, 0), address(to.ip().octets(), to.port()));
    let size = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a new socket, bound and connected with addresses that live on
    // this stack, then owned by the stream.
    let stream = unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let stream = TcpStream::from_raw_fd(fd);
        assert_eq!(libc::bind(fd, (&raw const local).cast(), size), 0, "bind: {}", std::io::Error::last_os_error());
        let connected = libc::connect(fd, (&raw const remote).cast(), size);
        assert_eq!(connected, 0, "connect: {}", std::io::Error::last_os_error());
        stream
    };
    Conn::from_stream(stream)
}

#[test]
fn a_connection_that_does_not_authenticate_in_time_is_told_and_closed() {
    let (_dir, auth) = auth_file(&[]);
    let server =
        Server::start(&["--auth-file", &auth, "--handshake-ms", HANDSHAKE_MS, "--metrics-listen", "127.0.0.1:0"]);
    let metrics = metrics_address(&server);
    let mut authenticated = server.connect();
    assert_eq!(authenticated.call(&format!("U {SECRET}")), "U ops");
    let mut idle = server.connect();
    let mut pinging = server.connect();
    assert!(pinging.call("P").starts_with("P active "), "P needs no name");
    assert_eq!(idle.line(), "E - - auth-required");
    assert!(idle.closed_by_server());
    assert_eq!(pinging.line(), "E - - auth-required", "P alone does not keep a connection open");
    assert!(pinging.closed_by_server());
    assert_eq!(sample(metrics, "ringlock_auth_timeouts_total"), 2.0);
    assert!(authenticated.call("A k 30 0").starts_with("A k "), "an authenticated connection stays");
}

#[test]
fn an_address_that_keeps_guessing_is_slowed_and_refused_and_no_other_is() {
    let (_dir, auth) = auth_file(&[]);
    let server = Server::start(&["--auth-file", &auth, "--metrics-listen", "127.0.0.1:0"]);
    let metrics = metrics_address(&server);
    let mut bystander = connect_from([127, 0, 0, 2], server.addr);
    assert_eq!(bystander.call(&format!("U {SECRET}")), "U ops");
    // Ten wrong secrets at once from 127.0.0.1: the first few are answered
    // after the usual delay, the later ones ever later.
    let mut guesses: Vec<Conn> = (0..10).map(|_| connect_from([127, 0, 0, 1], server.addr)).collect();
    for (index, guess) in guesses.iter_mut().enumerate() {
        guess.request(&format!("U guess-{index}"));
    }
    assert_eq!(guesses[0].line(), "E U - auth-failed");
    wait_until("the guesser is slowed", || sample(metrics, "ringlock_auth_slowed_addresses") == 1.0);
    // Meanwhile its new connections are refused at once, before any reading.
    let mut refused = connect_from([127, 0, 0, 1], server.addr);
    assert_eq!(refused.line(), "E - - auth-failed");
    assert!(refused.closed_by_server());
    assert_eq!(sample(metrics, "ringlock_auth_slowed_refusals_total"), 1.0);
    // Another address is served as ever, old connection and new.
    assert!(bystander.call("A bystander/1 30 0").starts_with("A bystander/1 "));
    let mut newcomer = connect_from([127, 0, 0, 3], server.addr);
    assert_eq!(newcomer.call(&format!("U {SECRET}")), "U ops");
    assert!(newcomer.call("A newcomer/1 30 0").starts_with("A newcomer/1 "));
    // Every guess is answered in the end, and counted once.
    for guess in &mut guesses[1..] {
        assert_eq!(guess.line(), "E U - auth-failed");
    }
    let samples = scrape(metrics);
    assert_eq!(samples["ringlock_auth_failures_total"], 10.0);
    assert_eq!(samples["ringlock_auth_failure_addresses"], 1.0, "one address, whatever its number of guesses");
}
