//! The peer secret (`--peer-secret-file`, docs/security.md) against real
//! server processes over real sockets. The test plays node 0 of two against
//! a real node 1 that holds the secret: without the secret, with another
//! one, with garbage, with a proof replayed from an earlier connection or
//! reflected back, nothing it sends is believed (node 1's role and epoch
//! stay as they were, while the same frames sent after a valid proof do
//! move them), and every failure is counted in `/metrics`; so is a hello
//! that does not name what its proof bound, and a challenge followed by
//! silence. A flood of connections does not take the place of a peer that
//! proved itself. Played the other way, as the node a real node dials, a
//! wrong, reflected or misdirected answer, or a refusal without a proof, is
//! believed in nothing. Nodes with and without the secret do not form a
//! cluster, and say why; without a secret a node speaks peer protocol
//! version 5, and a node of version 3 (before grants carried names) is
//! refused with both versions in the log; a cluster without it warns once
//! at start; bad secret files stop the start.
//!
//! The frames are spelled out here (see the top of src/cluster/wire.rs),
//! so that the tests do not trust the codec they check.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, ExitStatus};

use common::peer::{fingerprint, frame, hello_with};
use common::{Conn, PATIENCE, SecretFile, Server, metrics_address, scrape, wait_until};
use ring::hmac;

/// The peer protocol version of a Hello, with or without a secret: 5 since
/// grants carry the name that took them (3 before).
const PEER_PROTOCOL: u32 = 5;

/// The version a Challenge names and a proof binds: 6 (4 before names).
const SECURED_PROTOCOL: u32 = 6;

/// The secret the nodes of these tests share, as its file holds it.
const SECRET_LINE: &[u8] = b"peer-auth-test-secret-0123456789abcdef\n";

/// Heartbeat and failover periods of the nodes these tests start.
const FAST: [&str; 4] = ["--heartbeat-ms", "50", "--failover-ms", "300"];

/// The variable that sets, for tests, how often a failure from one address
/// is logged, and the interval the tests set: a day.
const LOG_INTERVAL_ENV: &str = "RINGLOCK_TEST_PEER_FAILURE_LOG_INTERVAL_MS";
const LOG_INTERVAL_MS: &str = "86400000";

const ACTIVE: u8 = 1;
const NONE: u8 = 0xFF;

/// `count` free loopback addresses, all different.
fn free_addrs(count: usize) -> Vec<SocketAddr> {
    let probes: Vec<TcpListener> = (0..count).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    probes.iter().map(|probe| probe.local_addr().unwrap()).collect()
}

// ---------------------------------------------------------------------------
// Frames and proofs of the peer protocol

fn hello(node: u8, incarnation: u64, fingerprint: u64) -> Vec<u8> {
    hello_with(PEER_PROTOCOL, 2, node, incarnation, fingerprint)
}

/// A heartbeat of an active in `epoch` that holds a table of that stream.
fn active_heartbeat(incarnation: u64, sequence: u64, epoch: u64) -> Vec<u8> {
    let mut body = incarnation.to_le_bytes().to_vec();
    body.extend_from_slice(&sequence.to_le_bytes());
    body.push(ACTIVE);
    body.extend_from_slice(&epoch.to_le_bytes());
    body.extend_from_slice(&epoch.to_le_bytes());
    body.push(NONE);
    body.push(1);
    body.push(1);
    body.extend_from_slice(&epoch.to_le_bytes());
    body.extend_from_slice(&0u64.to_le_bytes());
    body.push(NONE);
    frame(2, &body)
}

fn challenge(nonce: &[u8; 32]) -> Vec<u8> {
    let mut body = b"RLKP".to_vec();
    body.extend_from_slice(&SECURED_PROTOCOL.to_le_bytes());
    body.extend_from_slice(nonce);
    frame(12, &body)
}

fn proof_frame(node: u8, fingerprint: u64, mac: &[u8; 32]) -> Vec<u8> {
    let mut body = vec![node];
    body.extend_from_slice(&fingerprint.to_le_bytes());
    body.extend_from_slice(mac);
    frame(14, &body)
}

/// A ChallengeAnswer as read: the acceptor's nonce, node, fingerprint and mac.
struct Answer {
    nonce: [u8; 32],
    node: u8,
    fingerprint: u64,
    mac: [u8; 32],
}

fn parse_answer(bytes: &[u8; 78]) -> Answer {
    assert_eq!(&bytes[..5], &[74, 0, 0, 0, 13], "a ChallengeAnswer frame");
    Answer {
        nonce: bytes[5..37].try_into().unwrap(),
        node: bytes[37],
        fingerprint: u64::from_le_bytes(bytes[38..46].try_into().unwrap()),
        mac: bytes[46..78].try_into().unwrap(),
    }
}

/// HMAC-SHA256 of a proof: `label 0x00 version nonce_c nonce_a node fingerprint`.
fn mac(secret: &[u8], label: &str, nonces: (&[u8; 32], &[u8; 32]), node: u8, fingerprint: u64) -> [u8; 32] {
    let mut message = label.as_bytes().to_vec();
    message.push(0);
    message.extend_from_slice(&SECURED_PROTOCOL.to_le_bytes());
    message.extend_from_slice(nonces.0);
    message.extend_from_slice(nonces.1);
    message.push(node);
    message.extend_from_slice(&fingerprint.to_le_bytes());
    let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, secret), &message);
    tag.as_ref().try_into().unwrap()
}

const CONNECTOR: &str = "ringlock/peer-proof/connector";

/// The secret as the nodes use it: the file's line without its newline.
fn secret() -> &'static [u8] {
    SECRET_LINE.trim_ascii_end()
}

/// A connection to `to` from the loopback address `local` (127.0.0.x): a
/// node logs failed connections once per interval and address, so each case
/// that must be logged comes from an address of its own.
fn connect_from(local: [u8; 4], to: SocketAddr) -> TcpStream {
    use std::os::fd::FromRawFd;
    let SocketAddr::V4(to) = to else { panic!("an IPv4 loopback address: {to}") };
    let address = |ip: [u8; 4], port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        // The octets in memory order are network byte order.
        sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(ip) },
        sin_zero: [0; 8],
    };
    let (local, remote) = (address(local, 0), address(to.ip().octets(), to.port()));
    let size = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a new socket, bound and connected with addresses that live on
    // this stack, then owned by the stream.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let stream = TcpStream::from_raw_fd(fd);
        let bound = libc::bind(fd, (&raw const local).cast(), size);
        assert_eq!(bound, 0, "bind: {}", std::io::Error::last_os_error());
        let connected = libc::connect(fd, (&raw const remote).cast(), size);
        assert_eq!(connected, 0, "connect: {}", std::io::Error::last_os_error());
        stream
    }
}

/// Reads until the node closes `stream`; fails the test if it sends more
/// than `at_most` bytes first.
fn expect_closed(stream: &mut TcpStream, at_most: usize) {
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut received = 0;
    let mut sink = [0u8; 256];
    loop {
        match stream.read(&mut sink) {
            Ok(0) => return,
            Ok(count) => received += count,
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => return,
            Err(error) => panic!("the node did not close the connection within {PATIENCE:?}: {error}"),
        }
        assert!(received <= at_most, "the node sent {received} bytes on a connection it should drop");
    }
}

// ---------------------------------------------------------------------------
// /metrics

/// `ringlock_peer_auth_failures_total` of `direction` (inbound, outbound).
fn auth_failures(metrics: SocketAddr, direction: &str) -> f64 {
    let samples = scrape(metrics);
    let series = format!("ringlock_peer_auth_failures_total{{direction=\"{direction}\"}}");
    *samples.get(&series).unwrap_or_else(|| panic!("no {series} in {samples:?}"))
}

fn inbound_failures(metrics: SocketAddr) -> f64 {
    auth_failures(metrics, "inbound")
}

// ---------------------------------------------------------------------------
// A real node 1 with the secret, and the test as node 0

/// A real server as node 1 of two, holding the secret, for a test that
/// plays node 0. Node 0 never runs, so node 1 serves alone as the active.
struct SecuredNode {
    server: Server,
    conn: Conn,
    client_0: SocketAddr,
    peer_1: SocketAddr,
    fingerprint: u64,
    metrics: SocketAddr,
    /// `P` once node 1 serves alone.
    alone: String,
    _secret: SecretFile,
}

impl SecuredNode {
    fn start() -> SecuredNode {
        let secret = SecretFile::new(SECRET_LINE);
        let addresses = free_addrs(4);
        let (client_0, client_1, peer_0, peer_1) = (addresses[0], addresses[1], addresses[2], addresses[3]);
        let peers = format!("{client_0}@{peer_0},{client_1}@{peer_1}");
        let listen = client_1.to_string();
        let mut args = vec!["--listen", &listen, "--peers", &peers, "--node", "1"];
        args.extend_from_slice(&FAST);
        args.extend_from_slice(&["--peer-secret-file", secret.arg(), "--metrics-listen", "127.0.0.1:0"]);
        // Failures from one address are logged once per interval: a day
        // here, so that counting the lines does not depend on how long the
        // test takes.
        let server = Server::start_with_env(&[(LOG_INTERVAL_ENV, LOG_INTERVAL_MS)], &args);
        let mut conn = server.connect();
        let prefix = "P active ";
        wait_until("node 1 to serve alone", || conn.call("P").starts_with(prefix));
        let alone = conn.call("P");
        let metrics = metrics_address(&server);
        let fingerprint = fingerprint(&[client_0, client_1]);
        SecuredNode { server, conn, client_0, peer_1, fingerprint, metrics, alone, _secret: secret }
    }

    /// Node 1's epoch while it serves alone.
    fn epoch(&self) -> u64 {
        self.alone.split(' ').nth(2).unwrap().parse().unwrap()
    }

    /// Frames that would make node 1 follow node 0 if they were believed:
    /// node 0's hello and heartbeats of an active in an epoch above node 1's.
    fn takeover_frames(&self) -> Vec<u8> {
        let epoch = (self.epoch() / 16 + 1) * 16;
        let mut bytes = hello(0, 1_000_000, self.fingerprint);
        for sequence in 1..=20 {
            bytes.extend(active_heartbeat(1_000_000, sequence, epoch));
        }
        bytes
    }

    /// Sends a challenge with `nonce` from 127.0.0.`host` and reads node 1's answer.
    fn challenge(&self, host: u8, nonce: &[u8; 32]) -> (TcpStream, Answer) {
        let mut stream = connect_from([127, 0, 0, host], self.peer_1);
        stream.write_all(&challenge(nonce)).unwrap();
        stream.set_read_timeout(Some(PATIENCE)).unwrap();
        let mut answer = [0u8; 78];
        stream.read_exact(&mut answer).expect("node 1 answers a challenge");
        (stream, parse_answer(&answer))
    }

    /// Node 0's valid proof for a connection with these nonces.
    fn proof(&self, connector_nonce: &[u8; 32], answer: &Answer) -> Vec<u8> {
        let mac = mac(secret(), CONNECTOR, (connector_nonce, &answer.nonce), 0, self.fingerprint);
        proof_frame(0, self.fingerprint, &mac)
    }

    /// Waits for the inbound failure counter to pass `before` and for the
    /// log to say `reason` for the connection from `from`; then node 1
    /// still serves alone, as before.
    fn assert_refused_and_unchanged(&mut self, before: f64, from: &TcpStream, reason: &str) -> f64 {
        let mut failures = before;
        wait_until(&format!("the failure counter to count: {reason}"), || {
            failures = inbound_failures(self.metrics);
            failures > before
        });
        let from = from.local_addr().unwrap().to_string();
        wait_until(&format!("node 1 to log why it refused {from}: {reason}"), || {
            self.server.log().lines().any(|line| line.contains(&from) && line.contains(reason))
        });
        assert_eq!(self.conn.call("P"), self.alone, "node 1's role and epoch are unchanged after: {reason}");
        failures
    }
}

#[test]
fn a_forged_peer_is_believed_in_nothing_and_counted_unless_it_proves_the_secret() {
    let mut node = SecuredNode::start();
    let mut failures = inbound_failures(node.metrics);
    assert_eq!(failures, 0.0);
    let takeover = node.takeover_frames();

    // No proof: node 0's hello and heartbeats right away.
    let mut plain = connect_from([127, 0, 0, 2], node.peer_1);
    plain.write_all(&takeover).unwrap();
    expect_closed(&mut plain, 0);
    let reason = "it sent a hello without proving it holds the peer secret";
    failures = node.assert_refused_and_unchanged(failures, &plain, reason);

    // Garbage instead of a challenge.
    let mut garbage = connect_from([127, 0, 0, 3], node.peer_1);
    let _ = garbage.write_all(&[0x5a; 45]);
    expect_closed(&mut garbage, 0);
    failures = node.assert_refused_and_unchanged(failures, &garbage, "it did not start with a challenge");

    // Another secret: a well-formed exchange with a wrong proof.
    let nonce = [0x01; 32];
    let (mut wrong, answer) = node.challenge(4, &nonce);
    assert_eq!((answer.node, answer.fingerprint), (1, node.fingerprint), "node 1 proves it is node 1");
    let other_secret = b"another-secret-of-enough-bytes-0123";
    let wrong_mac = mac(other_secret, CONNECTOR, (&nonce, &answer.nonce), 0, node.fingerprint);
    let mut bytes = proof_frame(0, node.fingerprint, &wrong_mac);
    bytes.extend(&takeover);
    let _ = wrong.write_all(&bytes);
    expect_closed(&mut wrong, 0);
    failures = node.assert_refused_and_unchanged(failures, &wrong, "its proof (as node 0) does not check");

    // Reflection: node 1's own proof sent back to it as the connector's.
    let nonce = [0x02; 32];
    let (mut reflected, answer) = node.challenge(5, &nonce);
    let mut bytes = proof_frame(answer.node, answer.fingerprint, &answer.mac);
    bytes.extend(hello(1, 1, node.fingerprint));
    let _ = reflected.write_all(&bytes);
    expect_closed(&mut reflected, 0);
    failures = node.assert_refused_and_unchanged(failures, &reflected, "its proof (as node 1) does not check");

    // Replay: a valid proof and hello of an earlier connection (which sends
    // nothing else, so it changes nothing), sent again on a new connection
    // with the same challenge. Node 1's nonce is fresh each time, so the old
    // proof does not check. (The proofs `node.proof` makes are valid: the
    // last case shows it.)
    let nonce = [0x03; 32];
    let (mut earlier, answer) = node.challenge(6, &nonce);
    let captured = node.proof(&nonce, &answer);
    let mut bytes = captured.clone();
    bytes.extend(hello(0, 1_000_000, node.fingerprint));
    earlier.write_all(&bytes).unwrap();
    let (mut replayed, fresh) = node.challenge(7, &nonce);
    assert_ne!(fresh.nonce, answer.nonce, "node 1 answers every challenge with a fresh nonce");
    let mut bytes = captured;
    bytes.extend(&takeover);
    let _ = replayed.write_all(&bytes);
    expect_closed(&mut replayed, 0);
    failures = node.assert_refused_and_unchanged(failures, &replayed, "its proof (as node 0) does not check");
    drop(earlier);

    // Failures from one address are logged once per interval (a day here),
    // and all counted.
    let mut again = connect_from([127, 0, 0, 2], node.peer_1);
    let _ = again.write_all(&[0x5a; 45]);
    expect_closed(&mut again, 0);
    wait_until("the failure counter to count a second failure from 127.0.0.2", || {
        inbound_failures(node.metrics) > failures
    });
    failures += 1.0;
    let logged = node.server.log().lines().filter(|line| line.contains("Some(127.0.0.2:")).count();
    assert_eq!(logged, 1, "one line for 127.0.0.2 in this interval:\n{}", node.server.log());
    assert!(node.server.log().contains("logged at most once every 86400 s"), "{}", node.server.log());

    // The same frames after a valid proof are believed: node 1 follows
    // node 0 into its higher epoch.
    let nonce = [0x05; 32];
    let (mut valid, answer) = node.challenge(8, &nonce);
    let mut bytes = node.proof(&nonce, &answer);
    bytes.extend(&node.takeover_frames());
    valid.write_all(&bytes).unwrap();
    let epoch = (node.epoch() / 16 + 1) * 16;
    let following = format!("P standby {epoch} {}", node.client_0);
    let mut sequence = 20;
    wait_until("node 1 to follow node 0 once it proved the secret", || {
        sequence += 1;
        valid.write_all(&active_heartbeat(1_000_000, sequence, epoch)).unwrap();
        node.conn.call("P") == following
    });
    assert_eq!(inbound_failures(node.metrics), failures, "a valid proof is no failure");
}

#[test]
fn a_hello_that_does_not_name_what_its_proof_bound_or_silence_after_a_challenge_is_dropped_and_counted() {
    let mut node = SecuredNode::start();
    let mut failures = inbound_failures(node.metrics);
    let takeover = node.takeover_frames();
    let reason = "does not name the node and --peers fingerprint its proof bound";

    // Whoever holds the secret can prove it as any node: a valid proof as
    // node 5, then node 0's hello and heartbeats.
    let nonce = [0x10; 32];
    let (mut other_node, answer) = node.challenge(10, &nonce);
    let node_5_mac = mac(secret(), CONNECTOR, (&nonce, &answer.nonce), 5, node.fingerprint);
    let mut bytes = proof_frame(5, node.fingerprint, &node_5_mac);
    bytes.extend(&takeover);
    let _ = other_node.write_all(&bytes);
    expect_closed(&mut other_node, 0);
    failures = node.assert_refused_and_unchanged(failures, &other_node, reason);

    // A valid proof for another --peers fingerprint, then a hello with this
    // cluster's.
    let nonce = [0x11; 32];
    let (mut other_cluster, answer) = node.challenge(11, &nonce);
    let other_fingerprint = node.fingerprint ^ 1;
    let other_mac = mac(secret(), CONNECTOR, (&nonce, &answer.nonce), 0, other_fingerprint);
    let mut bytes = proof_frame(0, other_fingerprint, &other_mac);
    bytes.extend(&takeover);
    let _ = other_cluster.write_all(&bytes);
    expect_closed(&mut other_cluster, 0);
    failures = node.assert_refused_and_unchanged(failures, &other_cluster, reason);

    // A challenge, then silence: dropped once the 5 s to prove it are up.
    let (mut silent, _) = node.challenge(12, &[0x12; 32]);
    expect_closed(&mut silent, 0);
    node.assert_refused_and_unchanged(failures, &silent, "no proof and hello within 5 s");
}

#[test]
fn connections_that_never_prove_the_secret_do_not_keep_out_a_real_peer_that_proved_it() {
    let mut node = SecuredNode::start();
    // Node 0 starts its exchange first and proves the secret; its hello
    // comes later (in a later segment, as it may on a real network).
    let nonce = [0xEE; 32];
    let (mut valid, answer) = node.challenge(9, &nonce);
    valid.write_all(&node.proof(&nonce, &answer)).unwrap();
    // Then twice as many connections as may wait for their introduction,
    // all held open and all newer than node 0's: a third send nothing, a
    // third the first 15 bytes of a challenge, a third a whole challenge and
    // then nothing (answered, they owe a proof that never comes). Room is
    // made for each by shutting the oldest that has not sent what it owes.
    let waiting: Vec<TcpStream> = (0..128u8)
        .map(|index| {
            let mut stream = TcpStream::connect(node.peer_1).unwrap();
            // The node may close one as soon as it reads it.
            let _ = match index % 3 {
                1 => stream.write_all(&challenge(&[index; 32])[..15]),
                2 => stream.write_all(&challenge(&[index; 32])),
                _ => Ok(()),
            };
            stream
        })
        .collect();
    // Once a connection opened after all of them is answered, node 1 has
    // accepted every one of them (and made room for each).
    wait_until("node 1 to answer a challenge sent after the flood", || {
        let mut marker = TcpStream::connect(node.peer_1).unwrap();
        marker.write_all(&challenge(&[0xAA; 32])).unwrap();
        marker.set_read_timeout(Some(PATIENCE)).unwrap();
        marker.read_exact(&mut [0u8; 78]).is_ok()
    });
    wait_until("node 1 to count the connections the flood took over", || inbound_failures(node.metrics) >= 1.0);
    // Node 0 finishes its exchange with its hello, and beats: node 1 hears it.
    valid.write_all(&hello(0, 1_000_000, node.fingerprint)).unwrap();
    let epoch = (node.epoch() / 16 + 1) * 16;
    let following = format!("P standby {epoch} {}", node.client_0);
    let mut sequence = 0;
    wait_until("node 1 to follow node 0, which proved the secret before the flood", || {
        sequence += 1;
        valid.write_all(&active_heartbeat(1_000_000, sequence, epoch)).unwrap();
        node.conn.call("P") == following
    });
    drop(waiting);
}

/// Starts node `index` of the two-node cluster `peers`, with `extra` flags.
fn start_node(listen: SocketAddr, peers: &str, index: &str, extra: &[&str]) -> Server {
    let listen = listen.to_string();
    let mut args = vec!["--listen", &listen, "--peers", peers, "--node", index];
    args.extend_from_slice(&FAST);
    args.extend_from_slice(extra);
    Server::start(&args)
}

#[test]
fn a_node_with_the_secret_and_a_node_without_do_not_form_a_cluster_and_say_why() {
    let secret = SecretFile::new(SECRET_LINE);
    let addresses = free_addrs(4);
    let (client_0, client_1, peer_0, peer_1) = (addresses[0], addresses[1], addresses[2], addresses[3]);
    let peers = format!("{client_0}@{peer_0},{client_1}@{peer_1}");
    let secured =
        start_node(client_0, &peers, "0", &["--peer-secret-file", secret.arg(), "--metrics-listen", "127.0.0.1:0"]);
    let plain = start_node(client_1, &peers, "1", &[]);
    let metrics = metrics_address(&secured);
    // Each dials the other: the secured node refuses the plain node's hello,
    // and the plain node cannot read the secured node's challenge.
    wait_until("the secured node to refuse the node without the secret", || {
        secured.log().contains("it sent a hello without proving it holds the peer secret")
    });
    wait_until("the node without the secret to say it was asked for one", || {
        plain.log().contains("it asks this node to prove it holds a peer secret")
    });
    wait_until("the secured node to count the refusals", || inbound_failures(metrics) >= 1.0);
    wait_until("the secured node to count its own connections that failed", || {
        auth_failures(metrics, "outbound") >= 1.0
    });
    wait_until("the secured node to say its peer did not prove the secret", || {
        secured.log().contains("the peer did not prove it holds the peer secret")
    });
    // Neither follows the other: each knows no active but, at most, itself.
    for (server, own, other) in [(&secured, client_0, client_1), (&plain, client_1, client_0)] {
        let ping = server.connect().call("P");
        assert!(!ping.ends_with(&other.to_string()), "{own} follows {other}: {ping}");
    }
}

#[test]
fn a_node_without_a_secret_speaks_the_peer_protocol_of_version_5_both_ways() {
    // The Hello keeps the layout it had before the peer secret; it names
    // version 5. The test plays node 0 against a real node 1 without a secret.
    let addresses = free_addrs(4);
    let (client_0, client_1, peer_0, peer_1) = (addresses[0], addresses[1], addresses[2], addresses[3]);
    let node_0 = TcpListener::bind(peer_0).unwrap();
    let peers = format!("{client_0}@{peer_0},{client_1}@{peer_1}");
    let node_1 = start_node(client_1, &peers, "1", &[]);
    let fingerprint = fingerprint(&[client_0, client_1]);
    // Node 1 dials node 0 and says hello first.
    let (mut dialled, _) = node_0.accept().unwrap();
    dialled.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut hello_1 = [0u8; 40];
    dialled.read_exact(&mut hello_1).unwrap();
    assert_eq!(&hello_1[..9], &[36, 0, 0, 0, 1, b'R', b'L', b'K', b'P'], "a hello first: {hello_1:?}");
    assert_eq!(u32::from_le_bytes(hello_1[9..13].try_into().unwrap()), 5, "version 5: {hello_1:?}");
    assert_eq!((hello_1[13], hello_1[14]), (2, 1), "node 1 of 2");
    assert_eq!(u64::from_le_bytes(hello_1[32..40].try_into().unwrap()), fingerprint);
    // Node 0's hello and heartbeats are believed: node 1 follows.
    let mut conn = node_1.connect();
    wait_until("node 1 to serve alone", || conn.call("P").starts_with("P active "));
    let epoch: u64 = conn.call("P").split(' ').nth(2).unwrap().parse().unwrap();
    let epoch = (epoch / 16 + 1) * 16;
    let mut stream = TcpStream::connect(peer_1).unwrap();
    stream.write_all(&hello(0, 1_000_000, fingerprint)).unwrap();
    let following = format!("P standby {epoch} {client_0}");
    let mut sequence = 0;
    wait_until("node 1 to follow node 0, which spoke version 5", || {
        sequence += 1;
        stream.write_all(&active_heartbeat(1_000_000, sequence, epoch)).unwrap();
        conn.call("P") == following
    });
}

/// How many lines of `log` give the warning of a peer port without a secret.
fn unauthenticated_warnings(log: &str) -> usize {
    log.lines().filter(|line| line.contains("WARN") && line.contains("the peer port has no authentication")).count()
}

#[test]
fn a_cluster_without_a_secret_warns_once_at_start_and_a_single_node_does_not() {
    let addresses = free_addrs(4);
    let (client_0, client_1, peer_0, peer_1) = (addresses[0], addresses[1], addresses[2], addresses[3]);
    let peers = format!("{client_0}@{peer_0},{client_1}@{peer_1}");
    let nodes = [start_node(client_0, &peers, "0", &[]), start_node(client_1, &peers, "1", &[])];
    let mut conn = nodes[1].connect();
    let following = format!(" {client_0}");
    wait_until("node 1 to follow node 0", || {
        let ping = conn.call("P");
        ping.starts_with("P standby") && ping.ends_with(&following)
    });
    for node in &nodes {
        let log = node.log();
        assert_eq!(unauthenticated_warnings(&log), 1, "one warning per node:\n{log}");
        assert!(log.contains("anyone who reaches") && log.contains("take the active role"), "{log}");
    }
    let single = Server::start(&[]);
    assert_eq!(unauthenticated_warnings(&single.log()), 0, "{}", single.log());
    // A single node given a secret says that it applies in a cluster only.
    let secret = SecretFile::new(SECRET_LINE);
    let single = Server::start(&["--peer-secret-file", secret.arg()]);
    assert!(single.log().contains("--peer-secret-file applies in a cluster"), "{}", single.log());
}

/// Runs the server with `args` and `env`, expecting it to exit before it
/// serves; returns its exit status and what it printed.
fn run_until_exit(args: &[&str], env: &[(&str, &str)]) -> (ExitStatus, String) {
    let data = common::DataDir::new();
    let mut command = Command::new(env!("CARGO_BIN_EXE_ringlock"));
    command
        .args(["--listen", "127.0.0.1:0", "--shards", "1", "--no-pin", "--data-dir"])
        .arg(&data.0)
        .args(args)
        .envs(env.iter().copied())
        .env_remove("RUST_LOG");
    common::run_to_exit(command, &format!("the server with {args:?}"))
}

#[test]
fn a_missing_empty_or_short_secret_file_stops_the_start_and_says_how_to_make_one() {
    let addresses = free_addrs(4);
    let peers = format!("{}@{},{}@{}", addresses[0], addresses[2], addresses[1], addresses[3]);
    let cluster = ["--peers", &peers, "--node", "0"];
    let empty = SecretFile::new(b"\n");
    let short = SecretFile::new(b"0123456789abcdef0123456789abcde\n");
    let missing = empty.path.with_file_name("no-such-secret");
    let missing = missing.to_str().unwrap();
    let cases = [
        (missing, "cannot read --peer-secret-file"),
        (empty.arg(), "is empty"),
        (short.arg(), "holds a secret of 31 bytes, shorter than the 32 needed"),
    ];
    for (file, expected) in cases {
        for through_env in [false, true] {
            let (status, log) = if through_env {
                run_until_exit(&cluster, &[("RINGLOCK_PEER_SECRET_FILE", file)])
            } else {
                let mut args = cluster.to_vec();
                args.extend(["--peer-secret-file", file]);
                run_until_exit(&args, &[])
            };
            assert!(!status.success(), "{file}: exit status {status}");
            assert!(log.contains(expected), "{file}: {log}");
            assert!(log.contains("head -c 32 /dev/urandom | base64"), "{file}: {log}");
        }
    }
}

#[test]
fn a_secret_file_that_others_can_read_is_a_warning_not_a_refusal() {
    let secret = SecretFile::with_mode(SECRET_LINE, 0o644);
    let addresses = free_addrs(4);
    let peers = format!("{}@{},{}@{}", addresses[0], addresses[2], addresses[1], addresses[3]);
    let node = start_node(addresses[0], &peers, "0", &["--peer-secret-file", secret.arg()]);
    let log = node.log();
    assert!(log.contains("can be read by other users than its owner; `chmod 600` it"), "{log}");
    assert_eq!(unauthenticated_warnings(&log), 0, "{log}");
}

// ---------------------------------------------------------------------------
// The connecting side: a real node dials the test, which plays the acceptor

const ACCEPTOR: &str = "ringlock/peer-proof/acceptor";

/// What the played acceptor sends in answer to the challenge with this nonce.
type AnswerTo<'a> = Box<dyn Fn(&[u8; 32]) -> Vec<u8> + 'a>;

fn challenge_answer(nonce: &[u8; 32], node: u8, fingerprint: u64, mac: &[u8; 32]) -> Vec<u8> {
    let mut body = nonce.to_vec();
    body.push(node);
    body.extend_from_slice(&fingerprint.to_le_bytes());
    body.extend_from_slice(mac);
    frame(13, &body)
}

#[test]
fn a_node_believes_nothing_from_a_peer_it_dialled_that_does_not_prove_the_secret() {
    // A real node 1 with the secret dials node 0, which the test plays: it
    // accepts node 1's connections and answers each challenge wrongly.
    let secret_file = SecretFile::new(SECRET_LINE);
    let addresses = free_addrs(4);
    let (client_0, client_1, peer_0, peer_1) = (addresses[0], addresses[1], addresses[2], addresses[3]);
    let acceptor = TcpListener::bind(peer_0).unwrap();
    let peers = format!("{client_0}@{peer_0},{client_1}@{peer_1}");
    let listen = client_1.to_string();
    // Node 1 waits max(--failover-ms, 1 s) for each answer: 3 s leaves the
    // test time to answer on a shared machine.
    let mut args = vec!["--listen", &listen, "--peers", &peers, "--node", "1"];
    args.extend_from_slice(&["--heartbeat-ms", "50", "--failover-ms", "3000"]);
    args.extend_from_slice(&["--peer-secret-file", secret_file.arg(), "--metrics-listen", "127.0.0.1:0"]);
    // Every failure logged (node 1 retries every 50 ms), so that each case
    // can be told by its line.
    let node_1 = Server::start_with_env(&[(LOG_INTERVAL_ENV, "1")], &args);
    let mut conn = node_1.connect();
    wait_until("node 1 to serve alone", || conn.call("P").starts_with("P active "));
    let alone = conn.call("P");
    let metrics = metrics_address(&node_1);
    let fingerprint = fingerprint(&[client_0, client_1]);

    // Node 1's next connection to node 0 that still waits for its answer
    // (one that node 1 gave up on while the test was busy is skipped), and
    // the nonce of its challenge.
    let next_challenge = || loop {
        let (mut stream, _) = acceptor.accept().unwrap();
        stream.set_read_timeout(Some(PATIENCE)).unwrap();
        let mut bytes = [0u8; 45];
        stream.read_exact(&mut bytes).expect("node 1 starts with a challenge");
        assert_eq!(&bytes[..13], &[41, 0, 0, 0, 12, b'R', b'L', b'K', b'P', 6, 0, 0, 0], "a challenge: {bytes:?}");
        stream.set_nonblocking(true).unwrap();
        let given_up = matches!(stream.peek(&mut [0u8; 1]), Ok(0));
        stream.set_nonblocking(false).unwrap();
        if !given_up {
            let nonce: [u8; 32] = bytes[13..].try_into().unwrap();
            break (stream, nonce);
        }
    };
    let acceptor_nonce = [0x21; 32];
    let other_secret = b"another-secret-of-enough-bytes-0123456789";
    let cases: Vec<(&str, AnswerTo<'_>, &str)> = vec![
        (
            "an answer made with another secret",
            Box::new(|nonce| {
                let mac = mac(other_secret, ACCEPTOR, (nonce, &acceptor_nonce), 0, fingerprint);
                challenge_answer(&acceptor_nonce, 0, fingerprint, &mac)
            }),
            "its answer does not check",
        ),
        (
            "node 1's own answer to the same challenge, reflected",
            Box::new(|nonce| {
                let mut own = connect_from([127, 0, 0, 20], peer_1);
                own.write_all(&challenge(nonce)).unwrap();
                own.set_read_timeout(Some(PATIENCE)).unwrap();
                let mut answer = vec![0u8; 78];
                own.read_exact(&mut answer).expect("node 1 answers a challenge");
                answer
            }),
            "it proves it is node 1, not node 0",
        ),
        (
            "a valid proof of another node",
            Box::new(|nonce| {
                let mac = mac(secret(), ACCEPTOR, (nonce, &acceptor_nonce), 5, fingerprint);
                challenge_answer(&acceptor_nonce, 5, fingerprint, &mac)
            }),
            "it proves it is node 5, not node 0",
        ),
        (
            "a valid proof for another --peers list",
            Box::new(|nonce| {
                let mac = mac(secret(), ACCEPTOR, (nonce, &acceptor_nonce), 0, fingerprint ^ 1);
                challenge_answer(&acceptor_nonce, 0, fingerprint ^ 1, &mac)
            }),
            "it was started with another --peers list",
        ),
        (
            "a refusal of node 1's hello instead of a proof",
            Box::new(|_| frame(11, &[3])),
            "a frame of 2 bytes announced",
        ),
    ];
    for (case, answer, reason) in cases {
        let before = auth_failures(metrics, "outbound");
        let (mut stream, nonce) = next_challenge();
        let _ = stream.write_all(&answer(&nonce));
        // Node 1 closes without sending its proof or its hello.
        expect_closed(&mut stream, 0);
        wait_until(&format!("node 1 to count the connection to {case}"), || {
            auth_failures(metrics, "outbound") > before
        });
        wait_until(&format!("node 1 to log why it dropped the connection to {case}: {reason}"), || {
            node_1
                .log()
                .lines()
                .any(|line| line.contains("did not prove it holds the peer secret") && line.contains(reason))
        });
        assert_eq!(conn.call("P"), alone, "node 1's role and epoch are unchanged after {case}");
    }
    assert!(
        !node_1.log().contains("peer refuses this node"),
        "a refusal without a proof was believed:\n{}",
        node_1.log()
    );

    // A valid answer: node 1 sends its proof, as node 1, and its hello.
    let (mut stream, nonce) = next_challenge();
    let mac_0 = mac(secret(), ACCEPTOR, (&nonce, &acceptor_nonce), 0, fingerprint);
    stream.write_all(&challenge_answer(&acceptor_nonce, 0, fingerprint, &mac_0)).unwrap();
    let mut proof_and_hello = [0u8; 86];
    stream.read_exact(&mut proof_and_hello).expect("node 1's proof and hello");
    let mac_1 = mac(secret(), CONNECTOR, (&nonce, &acceptor_nonce), 1, fingerprint);
    assert_eq!(proof_and_hello[..46], proof_frame(1, fingerprint, &mac_1)[..], "node 1's proof");
    assert_eq!(proof_and_hello[46..55], [36, 0, 0, 0, 1, b'R', b'L', b'K', b'P'], "then its hello");
}
