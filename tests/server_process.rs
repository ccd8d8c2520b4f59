//! The server as a process among others: one server per address, restarts
//! after kill -9, and signals.

mod common;

use std::net::{SocketAddr, TcpListener};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Conn, DataDir, PATIENCE, Server, stat, token_of, wait_until};

/// Loopback addresses that were free a moment ago.
fn free_addrs(count: usize) -> Vec<SocketAddr> {
    let holders: Vec<TcpListener> = (0..count).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    holders.iter().map(|holder| holder.local_addr().unwrap()).collect()
}

/// Runs the server binary with `args` and waits for it to exit; a server
/// still running after [`PATIENCE`] is killed and fails the test.
fn run_to_exit(args: &[&str]) -> (ExitStatus, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ringlock"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the ringlock binary");
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        text
    });
    let deadline = Instant::now() + PATIENCE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?} still runs after {PATIENCE:?}: it shares an address in use:\n{}", reader.join().unwrap());
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    (status, reader.join().unwrap())
}

fn assert_pong(conn: &mut Conn, what: &str) {
    conn.request("P");
    let reply = conn.try_line(PATIENCE);
    assert!(reply.as_deref().is_some_and(|reply| reply.starts_with("P active ")), "{what}: got {reply:?}");
}

// ---------------------------------------------------------------------------
// One server per address

#[test]
fn a_second_server_on_a_client_address_in_use_exits_with_an_error_naming_the_flag() {
    let server = Server::start(&["--shards", "2"]);
    let mut conn = server.connect();
    let token = conn.acquire("k", "30", "0");
    let other_dir = DataDir::new();
    let listen = server.addr.to_string();
    let (status, log) =
        run_to_exit(&["--listen", &listen, "--shards", "2", "--no-pin", "--data-dir", other_dir.0.to_str().unwrap()]);
    assert_eq!(status.code(), Some(1), "the second server fails:\n{log}");
    assert!(log.contains(&format!("cannot listen on {listen}: address in use; pick another --listen")), "{log}");
    // Every new connection still reaches the first server, which alone grants k.
    for index in 0..20 {
        let mut other = server.connect();
        assert_eq!(other.call("A k 30 0.001"), "T k", "connection {index} reaches the server that holds k");
    }
    assert_eq!(conn.call(&format!("R k {token}")), "R k");
}

#[test]
fn a_second_node_on_a_peer_address_in_use_exits_with_an_error_naming_the_flag() {
    let [client, peer, other_client, other_peer, second_client] = free_addrs(5)[..] else { unreachable!() };
    let peers = format!("{client}@{peer},{other_client}@{other_peer}");
    let _node = Server::start(&["--peers", &peers, "--node", "0", "--listen", &client.to_string()]);
    // A second node with its own client address but the same peer address.
    let data_dir = DataDir::new();
    let second = format!("{second_client}@{peer},{other_client}@{other_peer}");
    let (status, log) =
        run_to_exit(&["--peers", &second, "--node", "0", "--no-pin", "--data-dir", data_dir.0.to_str().unwrap()]);
    assert_eq!(status.code(), Some(1), "the second node fails:\n{log}");
    assert!(log.contains(&format!("cannot listen for peers on {peer}: address in use; pick another --cluster-listen")));
}

#[test]
fn fifty_restarts_right_after_kill_9_each_serve_their_first_connection() {
    let data_dir = Arc::new(DataDir::new());
    let mut server = Server::start_in(data_dir.clone(), &["--shards", "2"]);
    let listen = server.addr.to_string();
    let mut last_token = 0;
    for incarnation in 0..50 {
        // The first connection of this incarnation: a reset here means that a
        // listener of the killed process took it.
        let mut conn = Conn::connect(server.addr);
        conn.request("A k 30 0");
        let reply = conn.try_line(PATIENCE).unwrap_or_else(|| {
            panic!("incarnation {incarnation}: the first connection got no reply (reset or closed)")
        });
        let token = token_of(&reply, "k");
        assert!(token > last_token, "incarnation {incarnation}: token {token} after {last_token}");
        last_token = token;
        server.kill9();
        server = Server::start_in(data_dir.clone(), &["--shards", "2", "--listen", &listen]);
    }
}

#[test]
fn a_cluster_node_restarted_right_after_kill_9_gets_its_peer_address_back() {
    let [client, peer, other_client, other_peer] = free_addrs(4)[..] else { unreachable!() };
    let peers = format!("{client}@{peer},{other_client}@{other_peer}");
    let data_dir = Arc::new(DataDir::new());
    let args = ["--peers", &peers, "--node", "0", "--listen", &client.to_string(), "--shards", "2"];
    let mut node = Server::start_in(data_dir.clone(), &args);
    for incarnation in 0..20 {
        let mut conn = node.connect();
        conn.request("P");
        let reply = conn.try_line(PATIENCE);
        assert!(reply.as_deref().is_some_and(|reply| reply.starts_with("P ")), "incarnation {incarnation}: {reply:?}");
        node.kill9();
        // Only the peer listener of the killed node can hold the peer
        // address here; the start fails if it is not given back.
        node = Server::try_start_in(data_dir.clone(), &args)
            .unwrap_or_else(|log| panic!("incarnation {}: the node did not start:\n{log}", incarnation + 1));
    }
}

// ---------------------------------------------------------------------------
// Signals

#[test]
fn sighup_is_logged_and_the_server_keeps_serving_with_its_locks() {
    let mut server = Server::start(&["--shards", "2"]);
    let mut conn = server.connect();
    let token = conn.acquire("k", "30", "0");
    let mut waiter = server.connect();
    waiter.request("A k 30 0");
    wait_until("the waiter to queue", || stat(&mut conn, "waiters") == 1);
    server.signal("HUP");
    wait_until("the SIGHUP to be logged", || server.log().contains("SIGHUP ignored"));
    assert_pong(&mut server.connect(), "a new connection after SIGHUP");
    assert_eq!(conn.call(&format!("R k {token}")), "R k", "the lock held before SIGHUP is still held");
    let next = token_of(&waiter.line(), "k");
    assert!(next > token);
    assert!(server.stop("TERM").success(), "SIGTERM still stops the server with status 0");
}
