//! Mutual TLS on the peer port (`--peer-tls-cert`, `--peer-tls-key`,
//! `--peer-tls-ca`, docs/security.md) against real server processes over
//! real sockets, with certificates made here by rcgen (none is committed).
//!
//! A 3-node cluster with peer TLS replicates and fails over after kill -9
//! of its active, the new active holding the locks. Playing node 0 against
//! a real node 1, the test shows that a peer with a certificate of another
//! CA, one whose certificate names another host, and one that speaks in
//! the clear are each refused, counted and logged, and believed in nothing
//! (node 1 learns no epoch and keeps its role), while the same frames over
//! TLS with node 0's own certificate are believed. Between real nodes, a
//! node with TLS and one without, or one whose certificate names another
//! host, do not form a cluster and each says why, once; peer TLS and the
//! peer secret together form one; the three flags come together or the
//! start stops.

mod cluster_support;
mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

use cluster_support::{Cluster, ClusterOptions, grant_token, table_version};
use common::peer::{fingerprint, frame, hello_with};
use common::{Conn, DataDir, PATIENCE, SecretFile, Server, free_addrs, metrics_address, scrape, wait_until};
use rcgen::{BasicConstraints, Certificate, CertificateParams, DnType, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

/// Heartbeat and failover periods of the nodes these tests start.
const FAST: [&str; 4] = ["--heartbeat-ms", "50", "--failover-ms", "300"];

/// The peer protocol version of a Hello.
const PEER_PROTOCOL: u32 = 5;

/// The variable that sets, for tests, how often a failure from one address
/// is logged.
const LOG_INTERVAL_ENV: &str = "RINGLOCK_TEST_PEER_FAILURE_LOG_INTERVAL_MS";

const ACTIVE: u8 = 1;
const NONE: u8 = 0xFF;

// ---------------------------------------------------------------------------
// Certificates

/// A CA made for one test, and the certificates it signs.
struct Authority {
    certificate: Certificate,
    key: KeyPair,
}

impl Authority {
    fn new(name: &str) -> Authority {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        Authority { certificate: params.self_signed(&key).unwrap(), key }
    }

    /// A node's certificate for the subject alternative names `names`, and its key.
    fn sign(&self, names: &[&str]) -> (Certificate, KeyPair) {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(ToString::to_string).collect();
        let certificate = CertificateParams::new(names).unwrap().signed_by(&key, &self.certificate, &self.key).unwrap();
        (certificate, key)
    }
}

/// The files of these tests, in a directory removed with them:
/// - `ca.pem`: the peer CA; `node-<i>.pem`/`.key`: certificates of that CA
///   for 127.0.0.1 (every node of these tests runs there);
/// - `stranger.pem`/`.key`: a certificate for 127.0.0.1 of another CA,
///   `stranger-ca.pem`;
/// - `elsewhere.pem`/`.key`: a certificate of the peer CA for another host
///   (10.9.8.7 and elsewhere.example).
struct PeerCertificates {
    dir: DataDir,
    ca: CertificateDer<'static>,
    /// The certificate chains and keys, by file stem, for the test's own TLS.
    identities: Vec<(String, CertificateDer<'static>, PrivateKeyDer<'static>)>,
}

impl PeerCertificates {
    fn new(nodes: usize) -> PeerCertificates {
        let dir = DataDir::new();
        std::fs::create_dir_all(&dir.0).unwrap();
        let authority = Authority::new("ringlock peer test CA");
        let stranger_authority = Authority::new("unrelated peer test CA");
        std::fs::write(dir.0.join("ca.pem"), authority.certificate.pem()).unwrap();
        let mut certificates =
            PeerCertificates { ca: authority.certificate.der().clone(), dir, identities: Vec::new() };
        for index in 0..nodes {
            certificates.write(&format!("node-{index}"), authority.sign(&["127.0.0.1", "localhost"]));
        }
        certificates.write("stranger", stranger_authority.sign(&["127.0.0.1", "localhost"]));
        std::fs::write(certificates.dir.0.join("stranger-ca.pem"), stranger_authority.certificate.pem()).unwrap();
        certificates.write("elsewhere", authority.sign(&["10.9.8.7", "elsewhere.example"]));
        certificates
    }

    fn write(&mut self, stem: &str, (certificate, key): (Certificate, KeyPair)) {
        std::fs::write(self.dir.0.join(format!("{stem}.pem")), certificate.pem()).unwrap();
        std::fs::write(self.dir.0.join(format!("{stem}.key")), key.serialize_pem()).unwrap();
        let key = PrivateKeyDer::try_from(key.serialize_der()).unwrap();
        self.identities.push((stem.to_string(), certificate.der().clone(), key));
    }

    fn path(&self, name: &str) -> String {
        self.dir.0.join(name).to_str().unwrap().to_string()
    }

    /// Writes `bytes` to the file `name` in one rename, as an operator's
    /// tools would replace it.
    fn replace(&self, name: &str, bytes: &[u8]) {
        let draft = self.dir.0.join(format!("{name}.draft"));
        std::fs::write(&draft, bytes).unwrap();
        std::fs::rename(&draft, self.dir.0.join(name)).unwrap();
    }

    /// The three flags of a node that shows the certificate `stem`.
    fn args(&self, stem: &str) -> Vec<String> {
        vec![
            "--peer-tls-cert".to_string(),
            self.path(&format!("{stem}.pem")),
            "--peer-tls-key".to_string(),
            self.path(&format!("{stem}.key")),
            "--peer-tls-ca".to_string(),
            self.path("ca.pem"),
        ]
    }

    /// TLS settings of the test playing a node: it trusts the peer CA and
    /// shows the certificate `stem`.
    fn client_config(&self, stem: &str) -> Arc<ClientConfig> {
        let (_, certificate, key) = self.identities.iter().find(|(name, _, _)| name == stem).unwrap();
        let mut roots = RootCertStore::empty();
        roots.add(self.ca.clone()).unwrap();
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(vec![certificate.clone()], key.clone_key())
            .unwrap();
        Arc::new(config)
    }
}

// ---------------------------------------------------------------------------
// Frames of the peer protocol (see the top of src/cluster/wire.rs)

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

// ---------------------------------------------------------------------------
// /metrics

fn counter(metrics: SocketAddr, series: &str) -> f64 {
    let samples = scrape(metrics);
    *samples.get(series).unwrap_or_else(|| panic!("no {series} in {samples:?}"))
}

fn inbound_failures(metrics: SocketAddr) -> f64 {
    counter(metrics, "ringlock_peer_auth_failures_total{direction=\"inbound\"}")
}

fn inbound_tls_errors(metrics: SocketAddr) -> f64 {
    counter(metrics, "ringlock_peer_tls_errors_total{direction=\"inbound\"}")
}

// ---------------------------------------------------------------------------
// A real node 1 with peer TLS, and the test as node 0

/// A real server as node 1 of two with peer TLS, serving alone as the
/// active (node 0 never runs: the test plays it).
struct TlsNode {
    server: Server,
    conn: Conn,
    client_0: SocketAddr,
    peer_1: SocketAddr,
    fingerprint: u64,
    metrics: SocketAddr,
    /// `P` once node 1 serves alone.
    alone: String,
    certificates: PeerCertificates,
}

impl TlsNode {
    fn start() -> TlsNode {
        let certificates = PeerCertificates::new(2);
        let addresses = free_addrs(4);
        let (client_0, client_1, peer_0, peer_1) = (addresses[0], addresses[1], addresses[2], addresses[3]);
        let peers = format!("{client_0}@{peer_0},{client_1}@{peer_1}");
        let listen = client_1.to_string();
        let tls = certificates.args("node-1");
        let mut args = vec!["--listen", &listen, "--peers", &peers, "--node", "1", "--metrics-listen", "127.0.0.1:0"];
        args.extend_from_slice(&FAST);
        args.extend(tls.iter().map(String::as_str));
        // Failures are logged once a day per address here: each case comes
        // from an address of its own, so that its line is its own.
        let server = Server::start_with_env(&[(LOG_INTERVAL_ENV, "86400000")], &args);
        let mut conn = server.connect();
        wait_until("node 1 to serve alone", || conn.call("P").starts_with("P active "));
        let alone = conn.call("P");
        let metrics = metrics_address(&server);
        let fingerprint = fingerprint(&[client_0, client_1]);
        TlsNode { server, conn, client_0, peer_1, fingerprint, metrics, alone, certificates }
    }

    fn epoch(&self) -> u64 {
        self.alone.split(' ').nth(2).unwrap().parse().unwrap()
    }

    /// An epoch above node 1's, which it would follow node 0 into.
    fn higher_epoch(&self) -> u64 {
        (self.epoch() / 16 + 1) * 16
    }

    /// Frames that would make node 1 follow node 0 if they were believed.
    fn takeover_frames(&self) -> Vec<u8> {
        let mut bytes = hello(0, 1_000_000, self.fingerprint);
        for sequence in 1..=20 {
            bytes.extend(active_heartbeat(1_000_000, sequence, self.higher_epoch()));
        }
        bytes
    }

    /// A TLS connection from 127.0.0.`host` to node 1's peer port showing
    /// the certificate `stem`.
    fn connect_tls(&self, host: u8, stem: &str) -> StreamOwned<ClientConnection, TcpStream> {
        let tcp = connect_from([127, 0, 0, host], self.peer_1);
        let name = ServerName::try_from("127.0.0.1").unwrap();
        StreamOwned::new(ClientConnection::new(self.certificates.client_config(stem), name).unwrap(), tcp)
    }

    /// Waits for the failure counters to pass `before` and the log to say
    /// `reason` for the connection from 127.0.0.`host`; then node 1 still
    /// serves alone, as before.
    fn assert_refused_and_unchanged(&mut self, before: f64, host: u8, reason: &str) -> f64 {
        let mut failures = before;
        wait_until(&format!("the failure counter to count: {reason}"), || {
            failures = inbound_failures(self.metrics);
            failures > before
        });
        let deadline = std::time::Instant::now() + PATIENCE;
        let from = format!("Some(127.0.0.{host}:");
        let logged =
            |line: &str| line.contains("peer connection refused") && line.contains(reason) && line.contains(&from);
        while !self.server.log().lines().any(logged) {
            assert!(std::time::Instant::now() < deadline, "node 1 did not log: {reason}\n{}", self.server.log());
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(self.conn.call("P"), self.alone, "node 1's role and epoch are unchanged after: {reason}");
        failures
    }
}

/// A connection to `to` from the loopback address `local` (127.0.0.x).
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
    let stream = unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let stream = TcpStream::from_raw_fd(fd);
        let bound = libc::bind(fd, (&raw const local).cast(), size);
        assert_eq!(bound, 0, "bind: {}", std::io::Error::last_os_error());
        let connected = libc::connect(fd, (&raw const remote).cast(), size);
        assert_eq!(connected, 0, "connect: {}", std::io::Error::last_os_error());
        stream
    };
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream
}

/// Reads until the node ends `stream` (closed, reset or a TLS alert);
/// fails the test if it sends plaintext first or stays open.
fn expect_ended<S: Read>(stream: &mut S) {
    let mut sink = [0u8; 256];
    let mut received = Vec::new();
    loop {
        match stream.read(&mut sink) {
            Ok(0) => return,
            // In the clear, the TLS alert that says why (one record of 7 bytes).
            Ok(count) if received.len() + count <= 7 && sink[0] == 21 => received.extend_from_slice(&sink[..count]),
            Ok(count) => panic!("the node sent {count} bytes on a connection it should drop"),
            Err(error) if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                panic!("the node did not end the connection within {PATIENCE:?}")
            }
            Err(_) => return,
        }
    }
}

#[test]
fn a_peer_without_a_certificate_of_the_ca_for_its_host_is_refused_and_believed_in_nothing() {
    let mut node = TlsNode::start();
    let takeover = node.takeover_frames();
    let mut failures = inbound_failures(node.metrics);
    assert_eq!(failures, 0.0);
    assert_eq!(inbound_tls_errors(node.metrics), 0.0);

    // A certificate for this host, signed by another CA: refused in the
    // handshake, before any frame.
    let mut stranger = node.connect_tls(2, "stranger");
    let _ = stranger.write_all(&takeover).and_then(|()| stranger.flush());
    expect_ended(&mut stranger);
    let reason = "its certificate is not signed by the CA of --peer-tls-ca";
    failures = node.assert_refused_and_unchanged(failures, 2, reason);
    assert_eq!(inbound_tls_errors(node.metrics), 1.0, "a failed handshake is a TLS error");

    // A certificate of the CA for another host: the handshake passes, the
    // hello names node 0, whose host (127.0.0.1) the certificate does not name.
    let mut elsewhere = node.connect_tls(3, "elsewhere");
    let _ = elsewhere.write_all(&takeover).and_then(|()| elsewhere.flush());
    expect_ended(&mut elsewhere);
    let reason = "does not name 127.0.0.1, the host of node 0 in --peers";
    failures = node.assert_refused_and_unchanged(failures, 3, reason);
    assert_eq!(inbound_tls_errors(node.metrics), 2.0, "a certificate for another host is refused for TLS");

    // In the clear: node 0's hello and heartbeats as a node without TLS sends them.
    let mut plain = connect_from([127, 0, 0, 4], node.peer_1);
    let _ = plain.write_all(&takeover);
    expect_ended(&mut plain);
    let reason = "it speaks the peer protocol in the clear: it was started without --peer-tls-cert";
    failures = node.assert_refused_and_unchanged(failures, 4, reason);
    assert_eq!(inbound_tls_errors(node.metrics), 3.0, "the clear connection failed its handshake");

    // Garbage where a ClientHello is due.
    let mut garbage = connect_from([127, 0, 0, 5], node.peer_1);
    let _ = garbage.write_all(&[0x5a; 64]);
    expect_ended(&mut garbage);
    failures = node.assert_refused_and_unchanged(failures, 5, "it does not speak TLS");

    // The same frames over TLS with node 0's own certificate are believed:
    // node 1 follows node 0 into its higher epoch.
    let mut valid = node.connect_tls(6, "node-0");
    valid.write_all(&takeover).unwrap();
    valid.flush().unwrap();
    let following = format!("P standby {} {}", node.higher_epoch(), node.client_0);
    let mut sequence = 20;
    wait_until("node 1 to follow node 0 over TLS with a certificate of the CA", || {
        sequence += 1;
        valid.write_all(&active_heartbeat(1_000_000, sequence, node.higher_epoch())).unwrap();
        valid.flush().unwrap();
        node.conn.call("P") == following
    });
    assert_eq!(inbound_failures(node.metrics), failures, "a valid certificate is no failure");
}

#[test]
fn sighup_rereads_the_peer_tls_files_and_a_bad_file_keeps_the_settings_in_force() {
    let mut node = TlsNode::start();
    let reloads =
        |result: &str| counter(node.metrics, &format!("ringlock_peer_tls_reloads_total{{result=\"{result}\"}}"));
    assert_eq!((reloads("ok"), reloads("failed")), (0.0, 0.0));
    // A CA file that holds no certificate: refused, the settings in force stay.
    node.certificates.replace("ca.pem", b"not a certificate\n");
    node.server.signal("HUP");
    wait_until("the failed reload to be counted", || reloads("failed") == 1.0);
    // The log line follows the count, through the log's pipe.
    wait_until("the log to say the settings in force stay", || {
        node.server.log().contains("the peer TLS settings in force stay")
    });
    // The other CA: from now on, new connections must show its certificates.
    let stranger_ca = std::fs::read(node.certificates.path("stranger-ca.pem")).unwrap();
    node.certificates.replace("ca.pem", &stranger_ca);
    node.server.signal("HUP");
    wait_until("the good reload to be counted", || reloads("ok") == 1.0);
    let takeover = node.takeover_frames();
    let failures = inbound_failures(node.metrics);
    let mut old = node.connect_tls(7, "node-0");
    let _ = old.write_all(&takeover).and_then(|()| old.flush());
    expect_ended(&mut old);
    node.assert_refused_and_unchanged(failures, 7, "its certificate is not signed by the CA of --peer-tls-ca");
    let mut new = node.connect_tls(8, "stranger");
    new.write_all(&takeover).unwrap();
    new.flush().unwrap();
    let following = format!("P standby {} {}", node.higher_epoch(), node.client_0);
    let mut sequence = 20;
    wait_until("node 1 to follow node 0 showing a certificate of the new CA", || {
        sequence += 1;
        new.write_all(&active_heartbeat(1_000_000, sequence, node.higher_epoch())).unwrap();
        new.flush().unwrap();
        node.conn.call("P") == following
    });
}

/// Starts node `index` of the two-node cluster `peers` with `extra` flags
/// and a metrics endpoint, failures logged once a minute per address.
fn start_node(listen: SocketAddr, peers: &str, index: &str, extra: &[String]) -> Server {
    let listen = listen.to_string();
    let mut args = vec!["--listen", &listen, "--peers", peers, "--node", index, "--metrics-listen", "127.0.0.1:0"];
    args.extend_from_slice(&FAST);
    args.extend(extra.iter().map(String::as_str));
    Server::start(&args)
}

/// The client and peer addresses of a two-node cluster, and its `--peers`.
fn two_nodes() -> ([SocketAddr; 2], String) {
    let addresses = free_addrs(4);
    let peers = format!("{}@{},{}@{}", addresses[0], addresses[2], addresses[1], addresses[3]);
    ([addresses[0], addresses[1]], peers)
}

/// How many lines of `log` contain `text`.
fn lines_with(log: &str, text: &str) -> usize {
    log.lines().filter(|line| line.contains(text)).count()
}

#[test]
fn a_node_with_peer_tls_and_a_node_without_do_not_form_a_cluster_and_each_says_why_once() {
    let certificates = PeerCertificates::new(2);
    let (clients, peers) = two_nodes();
    let secured = start_node(clients[0], &peers, "0", &certificates.args("node-0"));
    let plain = start_node(clients[1], &peers, "1", &[]);
    let metrics = metrics_address(&secured);
    let refused_plain = "it speaks the peer protocol in the clear";
    let refused_tls = "it speaks TLS: it was started with --peer-tls-cert";
    let dialled_plain = "TLS with the peer failed: it closed the connection during the TLS handshake";
    wait_until("the TLS node to refuse the plain node's connections", || secured.log().contains(refused_plain));
    wait_until("the plain node to refuse the TLS node's connections", || plain.log().contains(refused_tls));
    wait_until("the TLS node to say the plain node closed its handshakes", || secured.log().contains(dialled_plain));
    // Each retries every 50 ms; each failure is counted, and logged once a
    // minute per address (or per peer, for the connections a node opens).
    wait_until("the TLS node to count many refusals", || inbound_failures(metrics) >= 5.0);
    wait_until("the TLS node to count many of its own connections that failed", || {
        counter(metrics, "ringlock_peer_auth_failures_total{direction=\"outbound\"}") >= 5.0
    });
    for (server, text) in [(&secured, refused_plain), (&plain, refused_tls), (&secured, dialled_plain)] {
        assert_eq!(lines_with(&server.log(), text), 1, "logged once: {text}\n{}", server.log());
    }
    // Neither follows the other.
    for (server, own, other) in [(&secured, clients[0], clients[1]), (&plain, clients[1], clients[0])] {
        let ping = server.connect().call("P");
        assert!(!ping.ends_with(&other.to_string()), "{own} follows {other}: {ping}");
    }
    // A cluster with peer TLS warns of no unauthenticated peer port.
    assert!(!secured.log().contains("the peer port has no authentication"), "{}", secured.log());
    assert!(plain.log().contains("the peer port has no authentication"), "{}", plain.log());
}

#[test]
fn a_node_whose_certificate_names_another_host_is_refused_both_ways() {
    let certificates = PeerCertificates::new(2);
    let (clients, peers) = two_nodes();
    let good = start_node(clients[0], &peers, "0", &certificates.args("node-0"));
    let misnamed = start_node(clients[1], &peers, "1", &certificates.args("elsewhere"));
    let metrics = metrics_address(&good);
    // Node 0 dials node 1, whose certificate does not name 127.0.0.1.
    wait_until("node 0 to refuse node 1's certificate as the server", || {
        good.log().contains("TLS with the peer failed: its certificate does not name the host of its peer address")
    });
    // Node 1 dials node 0: its certificate checks against the CA, but its
    // hello names node 1, whose host it does not name.
    wait_until("node 0 to refuse node 1's certificate as the client", || {
        good.log().contains("does not name 127.0.0.1, the host of node 1 in --peers")
    });
    wait_until("node 0 to count both", || {
        inbound_failures(metrics) >= 1.0
            && counter(metrics, "ringlock_peer_tls_errors_total{direction=\"outbound\"}") >= 1.0
    });
    let ping = misnamed.connect().call("P");
    assert!(!ping.ends_with(&clients[0].to_string()), "node 1 follows node 0 with a misnamed certificate: {ping}");
    let ping = good.connect().call("P");
    assert!(!ping.ends_with(&clients[1].to_string()), "node 0 follows node 1: {ping}");
}

#[test]
fn peer_tls_and_the_peer_secret_together_form_a_cluster_that_replicates() {
    let certificates = PeerCertificates::new(2);
    let secret = SecretFile::new(b"peer-tls-test-secret-0123456789abcdef\n");
    let (clients, peers) = two_nodes();
    let with = |stem: &str| {
        let mut args = certificates.args(stem);
        args.extend(["--peer-secret-file".to_string(), secret.arg().to_string()]);
        args
    };
    let nodes =
        [start_node(clients[0], &peers, "0", &with("node-0")), start_node(clients[1], &peers, "1", &with("node-1"))];
    let mut standby = nodes[1].connect();
    let following = format!(" {}", clients[0]);
    wait_until("node 1 to follow node 0", || {
        let ping = standby.call("P");
        ping.starts_with("P standby") && ping.ends_with(&following)
    });
    let mut active = nodes[0].connect();
    let (_, since) = table_version(&mut active).unwrap();
    let token = grant_token(&active.call("A both/k 60 0"), "both/k").expect("a grant on node 0");
    let mut target = None;
    wait_until("node 0 to count the grant in its table version", || {
        target = table_version(&mut active).filter(|(_, version)| *version > since);
        target.is_some()
    });
    let (stream, version) = target.unwrap();
    wait_until("node 1 to apply the grant", || {
        table_version(&mut standby)
            .is_some_and(|(applied_stream, applied)| applied_stream == stream && applied >= version)
    });
    assert!(token > 0);
    for node in &nodes {
        assert!(node.log().contains("peer connections run over mutual TLS"), "{}", node.log());
        assert!(!node.log().contains("peer connection refused"), "{}", node.log());
    }
}

#[test]
fn a_cluster_with_peer_tls_fails_over_after_kill_9_and_the_new_active_holds_the_locks() {
    let certificates = PeerCertificates::new(3);
    let options = ClusterOptions {
        node_args: (0..3).map(|index| certificates.args(&format!("node-{index}"))).collect(),
        ..ClusterOptions::default()
    };
    let mut cluster = Cluster::start(options);
    let first_epoch = cluster.wait_active(0, "node 0 to become the active over peer TLS");
    let mut conn = cluster.node(0).connect();
    let (_, since) = table_version(&mut conn).unwrap();
    let held: Vec<(String, u64)> = (0..8)
        .map(|index| {
            let key = format!("tls/{index}");
            let reply = cluster.call(&mut conn, &format!("A {key} 120 0"));
            (key.clone(), grant_token(&reply, &key).unwrap_or_else(|| panic!("a grant of {key}, not {reply:?}")))
        })
        .collect();
    // The active publishes its table version once per turn: wait for it
    // to count the 8 grants, then for each standby to apply that version.
    let mut target = None;
    cluster.wait_for("node 0 to count the grants in its table version", |_| {
        target = table_version(&mut conn).filter(|(_, version)| *version >= since + 8);
        target.is_some()
    });
    let (stream, version) = target.unwrap();
    for standby in [1, 2] {
        let mut conn = cluster.node(standby).connect();
        cluster.wait_for(&format!("node {standby} to apply the grants over TLS"), |_| {
            table_version(&mut conn)
                .is_some_and(|(applied_stream, applied)| applied_stream == stream && applied >= version)
        });
    }
    cluster.node_mut(0).kill9();
    let second_epoch = cluster.wait_active(1, "node 1 to take over after kill -9 of node 0");
    assert!(second_epoch > first_epoch, "epoch {second_epoch} after {first_epoch}");
    let mut conn = cluster.node(1).connect();
    for (key, token) in &held {
        assert_eq!(cluster.call(&mut conn, &format!("A {key} 30 0.1")), format!("T {key}"), "{key} is still held");
        assert_eq!(
            cluster.call(&mut conn, &format!("R {key} {token}")),
            format!("R {key}"),
            "{key}'s token releases it"
        );
    }
    // Node 2 follows the new active over TLS.
    let active = cluster.node(1).client.to_string();
    cluster.wait_for("node 2 to follow node 1", |pings| {
        pings[2].as_ref().is_some_and(|ping| !ping.is_active() && ping.active.as_deref() == Some(active.as_str()))
    });
    for node in cluster.nodes.iter().filter(|node| node.is_running()) {
        assert!(!node.log().contains("peer connection refused"), "node {}:\n{}", node.index, node.log());
    }
}

/// Runs the server with `args`, expecting it to exit before it serves.
fn run_until_exit(args: &[&str]) -> (std::process::ExitStatus, String) {
    let data = DataDir::new();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_ringlock"));
    command
        .args(["--listen", "127.0.0.1:0", "--shards", "1", "--no-pin", "--data-dir"])
        .arg(&data.0)
        .args(args)
        .env_remove("RUST_LOG");
    common::run_to_exit(command, &format!("the server with {args:?}"))
}

#[test]
fn the_three_flags_come_together_and_bad_files_stop_the_start() {
    let certificates = PeerCertificates::new(1);
    let (_, peers) = two_nodes();
    let all = certificates.args("node-0");
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let mut args = vec!["--peers", &peers, "--node", "0"];
    args.extend_from_slice(&all[..4]);
    let (status, log) = run_until_exit(&args);
    assert!(!status.success() && log.contains("--peer-tls-ca missing"), "{status}: {log}");
    // A key that is not the certificate's.
    let wrong_key = certificates.path("stranger.key");
    let mut args = vec!["--peers", &peers, "--node", "0"];
    args.extend_from_slice(&[all[0], all[1], all[2], &wrong_key, all[4], all[5]]);
    let (status, log) = run_until_exit(&args);
    assert!(!status.success() && log.contains("do not make a usable pair"), "{status}: {log}");
    // A CA file that holds no certificate.
    let not_a_ca = certificates.path("node-0.key");
    let mut args = vec!["--peers", &peers, "--node", "0"];
    args.extend_from_slice(&[all[0], all[1], all[2], all[3], all[4], &not_a_ca]);
    let (status, log) = run_until_exit(&args);
    assert!(!status.success() && log.contains("(--peer-tls-ca) holds no PEM certificate"), "{status}: {log}");
}
