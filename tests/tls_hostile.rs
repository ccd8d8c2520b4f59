//! Hostile clients on the client port's new input paths, against the real
//! server: handshakes that never end, garbage and oversized ClientHellos,
//! connections that never authenticate, floods of wrong secrets, and what a
//! bystander sees meanwhile. Certificates are made here (never committed).

mod common;
#[path = "common/tls.rs"]
mod tls_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::{Conn, DataDir, PATIENCE, Server, metrics_address, scrape, wait_until};
use rustls::ClientConnection;
use rustls::pki_types::ServerName;
use tls_support::{Certificates, TlsConn, client_config};

/// `--handshake-ms` of these tests: short, so that the bound is reached soon.
const HANDSHAKE_MS: &str = "300";

/// A TLS server with a metrics endpoint, `--handshake-ms` [`HANDSHAKE_MS`]
/// unless `extra` says otherwise, and `extra`.
fn start(certificates: &Certificates, extra: &[&str]) -> Server {
    let mut args = certificates.server_args();
    args.extend(["--metrics-listen", "127.0.0.1:0"].map(String::from));
    if !extra.contains(&"--handshake-ms") {
        args.extend(["--handshake-ms", HANDSHAKE_MS].map(String::from));
    }
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

/// Client connections open, summed over the shard cores.
fn open_connections(metrics: std::net::SocketAddr) -> f64 {
    scrape(metrics).iter().filter(|(name, _)| name.starts_with("ringlock_connections{")).map(|(_, value)| value).sum()
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
    for guess in &mut guesses {
        assert!(guess.call("P").starts_with("P active "), "served before the first failure");
    }
    for (index, guess) in guesses.iter_mut().enumerate() {
        guess.request(&format!("U guess-{index}"));
    }
    wait_until("every guess failed", || sample(metrics, "ringlock_auth_failures_total") == 10.0);
    assert_eq!(sample(metrics, "ringlock_auth_slowed_addresses"), 1.0);
    // Meanwhile its new connections are refused at once, before any reading.
    // (Told as the answer to the `U` a client sends first.)
    let mut refused = connect_from([127, 0, 0, 1], server.addr);
    assert_eq!(refused.line(), "E U - auth-failed");
    assert!(refused.closed_by_server());
    assert_eq!(sample(metrics, "ringlock_auth_slowed_refusals_total"), 1.0);
    // Another address is served as ever, old connection and new.
    assert!(bystander.call("A bystander/1 30 0").starts_with("A bystander/1 "));
    let mut newcomer = connect_from([127, 0, 0, 3], server.addr);
    assert_eq!(newcomer.call(&format!("U {SECRET}")), "U ops");
    assert!(newcomer.call("A newcomer/1 30 0").starts_with("A newcomer/1 "));
    // Every guess is answered in the end, and counted once.
    for guess in &mut guesses {
        assert_eq!(guess.line(), "E U - auth-failed");
    }
    let samples = scrape(metrics);
    assert_eq!(samples["ringlock_auth_failures_total"], 10.0);
    assert_eq!(samples["ringlock_auth_failure_addresses"], 1.0, "one address, whatever its number of guesses");
}

/// A TLS record of `kind` around `payload`, split into records of at most
/// 16 KiB as TLS requires.
fn records(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for fragment in payload.chunks(16 << 10) {
        bytes.extend_from_slice(&[kind, 0x03, 0x01]);
        bytes.extend_from_slice(&(fragment.len() as u16).to_be_bytes());
        bytes.extend_from_slice(fragment);
    }
    bytes
}

/// A ClientHello made by hand with `extensions` empty extensions of
/// distinct, unknown types: no crypto is needed to build one.
fn client_hello_with_extensions(extensions: u16) -> Vec<u8> {
    let mut body = vec![0x03, 0x03];
    body.extend_from_slice(&[0x5a; 32]); // random
    body.push(0); // no session id
    body.extend_from_slice(&[0x00, 0x02, 0x13, 0x01]); // TLS_AES_128_GCM_SHA256
    body.extend_from_slice(&[0x01, 0x00]); // no compression
    let mut list = Vec::new();
    for index in 0..extensions {
        list.extend_from_slice(&(0x4000 + index).to_be_bytes());
        list.extend_from_slice(&[0x00, 0x00]);
    }
    body.extend_from_slice(&(list.len() as u16).to_be_bytes());
    body.extend_from_slice(&list);
    let mut handshake = vec![0x01];
    handshake.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    handshake.extend_from_slice(&body);
    records(0x16, &handshake)
}

/// A bystander that takes and releases a lock over TLS in a loop until told
/// to stop; every call must succeed. Returns its thread and its count of
/// grants so far.
fn bystander(
    server: &Server,
    certificates: &Certificates,
) -> (std::thread::JoinHandle<()>, Arc<AtomicBool>, Arc<AtomicU64>) {
    let stop = Arc::new(AtomicBool::new(false));
    let grants = Arc::new(AtomicU64::new(0));
    let mut conn = TlsConn::connect(server, client_config(&certificates.ca, None));
    let (thread_stop, thread_grants) = (stop.clone(), grants.clone());
    let thread = std::thread::spawn(move || {
        while !thread_stop.load(Ordering::SeqCst) {
            let reply = conn.call("A bystander/k 30 0");
            let token = reply.strip_prefix("A bystander/k ").unwrap_or_else(|| panic!("a grant: {reply}"));
            assert_eq!(conn.call(&format!("R bystander/k {token}")), "R bystander/k");
            thread_grants.fetch_add(1, Ordering::SeqCst);
        }
    });
    (thread, stop, grants)
}

/// Waits until the bystander got at least one more grant than `since`.
fn served_since(grants: &AtomicU64, since: u64, what: &str) {
    wait_until(what, || grants.load(Ordering::SeqCst) > since);
}

#[test]
fn garbage_and_oversized_client_hellos_are_refused_and_counted_and_others_carry_on() {
    let certificates = Certificates::new();
    let server = start(&certificates, &["--shards", "1"]);
    let metrics = metrics_address(&server);
    let (thread, stop, grants) = bystander(&server, &certificates);
    served_since(&grants, 0, "the bystander's first grant");
    let attacks: Vec<(&str, Vec<u8>)> = vec![
        ("random bytes", (0..4096u32).map(|index| (index.wrapping_mul(2_654_435_761) >> 13) as u8).collect()),
        ("an HTTP request", b"GET / HTTP/1.1\r\nHost: ringlock\r\n\r\n".to_vec()),
        ("10,000 extensions", client_hello_with_extensions(10_000)),
        ("a handshake message claiming 16 MiB", records(0x16, &[0x01, 0xff, 0xff, 0xff, 0x03, 0x03])),
        ("application data before any handshake", records(0x17, &[0x42; 512])),
    ];
    for (index, (what, bytes)) in attacks.iter().enumerate() {
        let before = grants.load(Ordering::SeqCst);
        let mut attacker = TcpStream::connect(server.addr).unwrap();
        let _ = attacker.write_all(bytes);
        let (closed, received) = closed_by_server(&mut attacker);
        assert!(closed, "{what}: the connection is closed");
        assert!(received.len() < 64, "{what}: at most an alert comes back, got {} bytes", received.len());
        wait_until(what, || sample(metrics, "ringlock_tls_errors_total") == (index + 1) as f64);
        served_since(&grants, before, what);
    }
    stop.store(true, Ordering::SeqCst);
    thread.join().expect("the bystander was served throughout");
}

#[test]
fn u_lines_of_a_megabyte_over_tls_are_refused_without_being_buffered() {
    /// Connections that each send a 1 MiB line at once: 32 MiB if the
    /// server kept what it was sent.
    const SENDERS: usize = 32;
    let certificates = Certificates::new();
    let (_dir, auth) = auth_file(&[]);
    // One core: its receive buffers (a fixed pool of 8 MiB, touched as
    // first used) are all the memory the bytes may take.
    // Senders that stay nameless: no --handshake-ms bound within the test.
    let server = start(&certificates, &["--auth-file", &auth, "--shards", "1", "--handshake-ms", "600000"]);
    let mut bystander = TlsConn::connect(&server, client_config(&certificates.ca, None));
    assert_eq!(bystander.call(&format!("U {SECRET}")), "U ops");
    let mut senders: Vec<TlsConn> =
        (0..SENDERS).map(|_| TlsConn::connect(&server, client_config(&certificates.ca, None))).collect();
    for conn in &mut senders {
        assert!(conn.call("P").starts_with("P active "), "the handshake is done");
    }
    let rss_before = server.rss_bytes();
    let threads: Vec<_> = senders
        .into_iter()
        .map(|mut conn| {
            std::thread::spawn(move || {
                let mut line = b"U ".to_vec();
                line.extend(std::iter::repeat_n(b'x', 1 << 20));
                line.push(b'\n');
                // The server reads no more after the first kilobyte: the
                // rest of the write fails or stays in the socket buffers.
                let writer = conn.send_in_background(&line);
                assert_eq!(conn.line().unwrap(), "E - - line-too-long");
                assert!(conn.line().is_err(), "then the connection is closed");
                writer.join().unwrap();
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("each sender refused and closed");
    }
    let grown = server.rss_bytes().saturating_sub(rss_before);
    assert!(grown < 16 << 20, "the lines were not kept: RSS grew by {grown} bytes for {SENDERS} MiB sent");
    assert!(bystander.call("A bystander/1 30 0").starts_with("A bystander/1 "));
}

#[test]
fn thousands_of_half_handshakes_are_all_closed_and_a_bystander_is_served_throughout() {
    const HALF_HANDSHAKES: usize = 2_000;
    let certificates = Certificates::new();
    let server = start(&certificates, &["--max-connections-per-ip", "0", "--handshake-ms", "1000"]);
    let metrics = metrics_address(&server);
    let (thread, stop, grants) = bystander(&server, &certificates);
    served_since(&grants, 0, "the bystander's first grant");
    let hello = client_hello(&certificates);
    let half = &hello[..hello.len() / 2];
    let rss_before = server.rss_bytes();
    // Two rounds: what the first leaves behind is reused by the second, so
    // nothing grows from round to round.
    let mut rss = Vec::new();
    for round in 1..=2 {
        let mut attackers: Vec<TcpStream> = Vec::with_capacity(HALF_HANDSHAKES);
        for _ in 0..HALF_HANDSHAKES {
            let mut stream = TcpStream::connect(server.addr).unwrap();
            stream.write_all(half).unwrap();
            attackers.push(stream);
        }
        let during = grants.load(Ordering::SeqCst);
        let rss_during = server.rss_bytes();
        served_since(&grants, during, "a grant while the half handshakes are open");
        for stream in &mut attackers {
            assert!(closed_by_server(stream).0, "round {round}: every half handshake is closed");
        }
        wait_until("every half handshake counted", || {
            sample(metrics, "ringlock_tls_handshake_timeouts_total") == (round * HALF_HANDSHAKES) as f64
        });
        wait_until("only the bystander left open", || open_connections(metrics) == 1.0);
        let after = grants.load(Ordering::SeqCst);
        served_since(&grants, after, "a grant after the attack");
        rss.push((rss_during, server.rss_bytes()));
    }
    stop.store(true, Ordering::SeqCst);
    thread.join().expect("the bystander was served throughout");
    let [(during_1, after_1), (during_2, after_2)] = rss[..] else { unreachable!() };
    let message = format!("RSS before {rss_before}, during/after {during_1}/{after_1}, then {during_2}/{after_2}");
    // The allocator may keep freed memory for reuse rather than give it
    // back at once, so what is asserted is that it is reused: a second
    // attack like the first takes (next to) no more.
    let attack = during_1.saturating_sub(rss_before);
    assert!(
        during_2 <= during_1 + attack / 4 && after_2 <= after_1.max(during_1) + attack / 4,
        "a second attack takes no more memory than the first: {message}"
    );
}
