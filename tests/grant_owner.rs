//! A grant belongs to the name that took it, against the real server: with
//! `--auth-file`, `R` and `X` from another name are refused `not-holder`
//! even with the right token, and `I` shows the token to the holder's name
//! only; without one, nothing changes. In a cluster the name is replicated,
//! so that a standby that takes over refuses another name alike.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use common::peer::{fingerprint, frame, hello_with};
use common::{Conn, DataDir, PATIENCE, SecretFile, Server, free_addrs, token_of, wait_until};

const ALPHA: &str = "alpha-5d0c7e21b9a84f36";
const BETA: &str = "beta-8e4f1a93c2d75b60";
const GAMMA: &str = "gamma-0b6a2f9d4e17c385";
/// A name that may read `S`, to watch replication; it locks nothing.
const OPS: &str = "ops-63c1d8e05fa2b974";

fn sha256_hex(secret: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, secret.as_bytes()).as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// An auth file of `names` (name, secret, scope), in a directory of its own.
struct AuthFile {
    dir: DataDir,
}

impl AuthFile {
    fn new(names: &[(&str, &str, &str)]) -> AuthFile {
        let file = AuthFile { dir: DataDir::new() };
        std::fs::create_dir_all(&file.dir.0).unwrap();
        file.write(names);
        file
    }

    fn path(&self) -> String {
        self.dir.0.join("auth").to_str().unwrap().to_string()
    }

    /// Replaces the file in one rename.
    fn write(&self, names: &[(&str, &str, &str)]) {
        let text: String =
            names.iter().map(|(name, secret, scope)| format!("{name} {} {scope}\n", sha256_hex(secret))).collect();
        let draft = self.dir.0.join("auth.draft");
        std::fs::write(&draft, text).unwrap();
        std::fs::rename(&draft, self.dir.0.join("auth")).unwrap();
    }
}

fn alpha_and_beta() -> Vec<(&'static str, &'static str, &'static str)> {
    vec![("alpha", ALPHA, "*"), ("beta", BETA, "*"), ("ops", OPS, "*,stats")]
}

fn authenticated(address: SocketAddr, secret: &str, name: &str) -> Conn {
    let mut conn = Conn::connect(address);
    assert_eq!(conn.call(&format!("U {secret}")), format!("U {name}"));
    conn
}

/// Checks, on one node, that `key` is held by `holder` with `token`: the
/// other name's `R` and `X` with the token are refused and its `I` shows no
/// token; the holder's `I` shows it. Changes nothing.
fn assert_held_by(holder: &mut Conn, other: &mut Conn, key: &str, token: u64) {
    assert_eq!(other.call(&format!("R {key} {token}")), format!("E R {key} not-holder"));
    assert_eq!(other.call(&format!("X {key} {token} 60")), format!("E X {key} not-holder"));
    assert_eq!(other.call(&format!("R {key} {}", token + 1)), format!("E R {key} not-holder"), "as a wrong token");
    let (shown, lease_left_ms, _) = other.inspect(key);
    assert_eq!(shown, None, "another name sees no token of {key}");
    assert!(lease_left_ms > 0, "but sees {key} held");
    let (shown, lease_left_ms, _) = holder.inspect(key);
    assert_eq!(shown, Some(token), "the holder's name sees its token of {key}");
    assert!(lease_left_ms > 0);
}

#[test]
fn another_name_cannot_release_or_extend_a_lock_nor_read_its_token() {
    let file = AuthFile::new(&alpha_and_beta());
    // Two shards: some keys are served by the other core than the
    // connection's, and the name travels with the request.
    let server = Server::start(&["--auth-file", &file.path(), "--shards", "2"]);
    let mut alpha = authenticated(server.addr, ALPHA, "alpha");
    let mut beta = authenticated(server.addr, BETA, "beta");
    for index in 0..8 {
        let key = format!("team/{index}");
        let token = token_of(&alpha.call(&format!("A {key} 60 0")), &key);
        assert_held_by(&mut alpha, &mut beta, &key, token);
        // The holder extends and releases.
        assert_eq!(alpha.call(&format!("X {key} {token} 30")), format!("X {key} {token}"));
        assert_eq!(alpha.call(&format!("R {key} {token}")), format!("R {key}"));
        assert_eq!(beta.inspect(&key), (None, 0, 0), "free");
    }

    // The grant belongs to the name, not to the connection: alpha's other
    // connection may release it.
    let token = token_of(&alpha.call("A shared 60 0"), "shared");
    let mut alpha_again = authenticated(server.addr, ALPHA, "alpha");
    assert_eq!(alpha_again.inspect("shared").0, Some(token));
    assert_eq!(alpha_again.call(&format!("R shared {token}")), "R shared");
}

#[test]
fn a_waiter_granted_later_holds_under_its_own_name() {
    let file = AuthFile::new(&alpha_and_beta());
    let server = Server::start(&["--auth-file", &file.path()]);
    let mut alpha = authenticated(server.addr, ALPHA, "alpha");
    let mut beta = authenticated(server.addr, BETA, "beta");
    let first = token_of(&alpha.call("A k 60 0"), "k");
    beta.request("A k 60 0");
    wait_until("beta's acquire to be queued", || alpha.inspect("k").2 == 1);
    assert_eq!(alpha.call(&format!("R k {first}")), "R k");
    let second = token_of(&beta.line(), "k");
    assert!(second > first);
    assert_held_by(&mut beta, &mut alpha, "k", second);
    assert_eq!(beta.call(&format!("R k {second}")), "R k");
}

#[test]
fn a_reload_that_reorders_and_removes_names_leaves_every_grant_with_its_name() {
    let file = AuthFile::new(&alpha_and_beta());
    let server = Server::start(&["--auth-file", &file.path()]);
    let mut alpha = authenticated(server.addr, ALPHA, "alpha");
    let mut beta = authenticated(server.addr, BETA, "beta");
    let alphas = token_of(&alpha.call("A of-alpha 60 0"), "of-alpha");
    let betas = token_of(&beta.call("A of-beta 60 0"), "of-beta");
    // A new name first, beta gone, alpha last: numbers given by position
    // would now name other teams.
    file.write(&[("gamma", GAMMA, "*"), ("ops", OPS, "*,stats"), ("alpha", ALPHA, "*")]);
    server.signal("HUP");
    assert_eq!(beta.line(), "E - - auth-revoked");
    assert!(beta.closed_by_server());
    let mut gamma = authenticated(server.addr, GAMMA, "gamma");
    assert_held_by(&mut alpha, &mut gamma, "of-alpha", alphas);
    // Beta's grant stays beta's: nobody else may release it.
    assert_eq!(gamma.call(&format!("R of-beta {betas}")), "E R of-beta not-holder");
    assert_eq!(alpha.call(&format!("R of-beta {betas}")), "E R of-beta not-holder");
    assert_eq!(alpha.inspect("of-beta").0, None);
    assert_eq!(alpha.call(&format!("R of-alpha {alphas}")), "R of-alpha");
}

#[test]
fn without_an_auth_file_any_connection_with_the_token_releases_and_sees_it() {
    let server = Server::start(&[]);
    let mut first = server.connect();
    let mut second = server.connect();
    let token = token_of(&first.call("A k 60 0"), "k");
    assert_eq!(second.inspect("k").0, Some(token));
    assert_eq!(second.call(&format!("X k {token} 30")), format!("X k {token}"));
    assert_eq!(second.call(&format!("R k {token}")), "R k");
}

// ---------------------------------------------------------------------------
// Two nodes

const FAST: [&str; 4] = ["--heartbeat-ms", "50", "--failover-ms", "300"];

/// The `"table": {"stream": .., "version": ..}` of an `S` reply.
fn table_version(conn: &mut Conn) -> Option<(u64, u64)> {
    let reply = conn.call("S");
    let table = &reply[reply.find("\"table\":")?..];
    let number = |name: &str| -> Option<u64> {
        let needle = format!("\"{name}\":");
        let at = table.find(&needle)? + needle.len();
        table[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
    };
    Some((number("stream")?, number("version")?))
}

#[test]
fn after_a_failover_the_new_active_still_refuses_another_names_release() {
    let file = AuthFile::new(&alpha_and_beta());
    let addresses = free_addrs(4);
    let (client_0, client_1, peer_0, peer_1) = (addresses[0], addresses[1], addresses[2], addresses[3]);
    let peers = format!("{client_0}@{peer_0},{client_1}@{peer_1}");
    let auth = file.path();
    let start = |listen: SocketAddr, index: &str| {
        let listen = listen.to_string();
        let mut args = vec!["--listen", &listen, "--peers", &peers, "--node", index, "--auth-file", &auth];
        args.extend_from_slice(&FAST);
        Server::start(&args)
    };
    let mut node_0 = start(client_0, "0");
    let node_1 = start(client_1, "1");
    let mut ops_0 = authenticated(client_0, OPS, "ops");
    wait_until("node 0 to become the active", || ops_0.call("P").starts_with("P active "));
    let mut ops_1 = authenticated(client_1, OPS, "ops");
    wait_until("node 1 to follow node 0", || ops_1.call("P") == format!("P standby {} {client_0}", epoch(&mut ops_0)));

    let mut alpha = authenticated(client_0, ALPHA, "alpha");
    let mut beta = authenticated(client_0, BETA, "beta");
    let (_, since) = table_version(&mut ops_0).expect("the active's table version");
    let owned = token_of(&alpha.call("A owned 120 0"), "owned");
    // A key handed from alpha to a queued beta: beta's grant, replicated
    // as beta's.
    let first = token_of(&alpha.call("A handed 120 0"), "handed");
    beta.request("A handed 120 0");
    wait_until("beta's acquire to be queued", || alpha.inspect("handed").2 == 1);
    assert_eq!(alpha.call(&format!("R handed {first}")), "R handed");
    let handed = token_of(&beta.line(), "handed");
    // Four deltas: two grants, a release, the hand-off's grant. The active
    // counts them once its replication core has taken them in.
    let mut table = None;
    wait_until("node 0 to count the four deltas", || {
        table = table_version(&mut ops_0).filter(|&(_, version)| version >= since + 4);
        table.is_some()
    });
    let (stream, version) = table.unwrap();
    wait_until("node 1 to apply them", || {
        table_version(&mut ops_1)
            .is_some_and(|(applied_stream, applied)| applied_stream == stream && applied >= version)
    });

    node_0.kill9();
    wait_until("node 1 to take over", || ops_1.call("P").starts_with("P active "));
    let mut alpha = authenticated(client_1, ALPHA, "alpha");
    let mut beta = authenticated(client_1, BETA, "beta");
    assert_held_by(&mut alpha, &mut beta, "owned", owned);
    assert_held_by(&mut beta, &mut alpha, "handed", handed);
    assert_eq!(alpha.call(&format!("R owned {owned}")), "R owned");
    assert_eq!(beta.call(&format!("R handed {handed}")), "R handed");
    drop(node_1);
}

/// The epoch of a `P active <epoch>` reply on `conn`.
fn epoch(conn: &mut Conn) -> u64 {
    let reply = conn.call("P");
    reply.split(' ').nth(2).and_then(|epoch| epoch.parse().ok()).unwrap_or_else(|| panic!("a P reply: {reply:?}"))
}

/// Sends `bytes` to a peer port and reads until the node closes the
/// connection; returns the local address the node saw.
fn send_and_expect_close(to: SocketAddr, bytes: &[u8]) -> SocketAddr {
    let mut stream = TcpStream::connect(to).unwrap();
    let local = stream.local_addr().unwrap();
    stream.write_all(bytes).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut sink = [0u8; 64];
    loop {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => return local,
            Ok(_) => {}
        }
    }
}

#[test]
fn a_node_of_the_peer_protocol_before_names_is_refused_with_both_versions_logged() {
    // Grants carry names from peer protocol version 5 on (6 with a peer
    // secret); a node of versions 3 and 4 would misread them. The test
    // plays such a node 0 against a real node 1, without and with a secret.
    let secret = SecretFile::new(b"grant-owner-test-secret-0123456789abcdef\n");
    for secured in [false, true] {
        let addresses = free_addrs(4);
        let (client_0, client_1, peer_0, peer_1) = (addresses[0], addresses[1], addresses[2], addresses[3]);
        let peers = format!("{client_0}@{peer_0},{client_1}@{peer_1}");
        let listen = client_1.to_string();
        let mut args = vec!["--listen", &listen, "--peers", &peers, "--node", "1"];
        args.extend_from_slice(&FAST);
        if secured {
            args.extend_from_slice(&["--peer-secret-file", secret.arg()]);
        }
        let node_1 = Server::start(&args);
        let (old, expected) = if secured {
            let mut challenge = b"RLKP".to_vec();
            challenge.extend_from_slice(&4u32.to_le_bytes());
            challenge.extend_from_slice(&[7; 32]);
            (frame(12, &challenge), "challenge names protocol version 4; this node's peer secret speaks 6")
        } else {
            let hello = hello_with(3, 2, 0, 1, fingerprint(&[client_0, client_1]));
            (hello, "peer speaks protocol version 3; this node speaks 5")
        };
        let from = send_and_expect_close(peer_1, &old).to_string();
        wait_until(&format!("node 1 to log why it refused {from}: {expected}"), || {
            node_1.log().lines().any(|line| line.contains(&from) && line.contains(expected))
        });
        let mut conn = node_1.connect();
        wait_until("node 1 to serve alone, having believed nothing of it", || conn.call("P").starts_with("P active "));
    }
}

#[test]
fn a_name_at_its_quota_is_refused_new_keys_and_queues_while_other_names_go_on() {
    let file = AuthFile::new(&alpha_and_beta());
    let server = Server::start(&["--auth-file", &file.path(), "--shards", "1", "--max-keys-per-name", "3"]);
    assert!(server.log().contains("each name may hold plus wait on at most 3 keys"), "{}", server.log());
    let mut alpha = authenticated(server.addr, ALPHA, "alpha");
    let mut beta = authenticated(server.addr, BETA, "beta");
    let first = alpha.acquire("alpha/1", "60", "1");
    alpha.acquire("alpha/2", "60", "1");
    // A place in a queue counts as much as a held key.
    let beta_token = beta.acquire("beta/1", "60", "1");
    alpha.request("A beta/1 60 0");
    wait_until("alpha's acquire to be queued", || beta.inspect("beta/1").2 == 1);

    assert_eq!(alpha.call("A alpha/3 60 1"), "E A alpha/3 too-many-keys");
    assert_eq!(beta.call("A beta/2 60 1").split(' ').next(), Some("A"), "another name goes on");
    beta.acquire("held-by-beta", "60", "1");
    assert_eq!(alpha.call("A held-by-beta 60 1"), "E A held-by-beta too-many-waiters");

    // What the name lets go of is its own again: a release, a grant that
    // turns a place in a queue into a held key (no change), a lease that
    // runs out.
    assert_eq!(alpha.call(&format!("R alpha/1 {first}")), "R alpha/1");
    alpha.acquire("alpha/short", "0.2", "1");
    assert_eq!(beta.call(&format!("R beta/1 {beta_token}")), "R beta/1");
    let handed = token_of(&alpha.line(), "beta/1");
    assert!(handed > beta_token);
    assert_eq!(alpha.call("A alpha/3 60 1"), "E A alpha/3 too-many-keys");
    wait_until("alpha/short's lease to run out", || beta.inspect("alpha/short") == (None, 0, 0));
    alpha.acquire("alpha/3", "60", "1");
    assert_eq!(alpha.call("A alpha/4 60 1"), "E A alpha/4 too-many-keys");
}

#[test]
fn with_an_auth_file_the_per_connection_quota_does_not_apply() {
    let file = AuthFile::new(&alpha_and_beta());
    let server = Server::start(&["--auth-file", &file.path(), "--shards", "1", "--max-keys-per-connection", "2"]);
    assert!(!server.log().contains("each connection may hold"), "{}", server.log());
    let mut alpha = authenticated(server.addr, ALPHA, "alpha");
    for index in 0..5 {
        alpha.acquire(&format!("alpha/{index}"), "60", "1");
    }
}

#[test]
fn without_an_auth_file_the_per_name_quota_does_not_apply() {
    let server = Server::start(&["--shards", "1", "--max-keys-per-name", "2"]);
    let mut conn = server.connect();
    for index in 0..5 {
        conn.acquire(&format!("k/{index}"), "60", "1");
    }
}
