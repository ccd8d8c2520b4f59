//! The server as a process among others: one server per address, restarts
//! after kill -9, signals, and clients whose hosts vanish or crowd it.

mod common;

use std::net::{SocketAddr, TcpStream};
use std::process::{Command, ExitStatus};
use std::sync::Arc;

use common::{Conn, DataDir, PATIENCE, Server, free_addrs, stat, token_of, wait_until};

/// Loopback addresses that were free a moment ago.
fn run_to_exit(args: &[&str]) -> (ExitStatus, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ringlock"));
    command.args(args);
    common::run_to_exit(command, &format!("{args:?}, which shares an address in use"))
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
fn connections_are_spread_over_the_shard_cores_of_the_one_listening_socket() {
    let server = Server::start(&["--shards", "2"]);
    let mut conns: Vec<Conn> = (0..32).map(|_| server.connect()).collect();
    for conn in &mut conns {
        assert_pong(conn, "a new connection");
    }
    let stats = conns[0].call("S");
    let shards = &stats[stats.find("\"shards\":").expect("per-shard stats")..];
    let per_core: Vec<u64> = shards
        .split("\"connections\":")
        .skip(1)
        .map(|rest| rest.split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(per_core.iter().sum::<u64>(), 32, "{stats}");
    assert!(per_core.iter().all(|&count| count > 0), "every core takes connections: {per_core:?}");
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
    wait_until("the SIGHUP to be logged", || server.log().contains("SIGHUP: nothing to reload"));
    assert_pong(&mut server.connect(), "a new connection after SIGHUP");
    assert_eq!(conn.call(&format!("R k {token}")), "R k", "the lock held before SIGHUP is still held");
    let next = token_of(&waiter.line(), "k");
    assert!(next > token);
    assert!(server.stop("TERM").success(), "SIGTERM still stops the server with status 0");
}

// ---------------------------------------------------------------------------
// Connections per client address

/// A connection to `server` from the local address `from` (any 127.x.y.z is loopback).
fn connect_from(from: &str, server: SocketAddr) -> Conn {
    // SAFETY: plain socket calls on a descriptor we create; errors checked,
    // and the descriptor is handed to a TcpStream that owns it.
    let fd = unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0);
        let bind = |ip: std::net::Ipv4Addr, port: u16| libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr { s_addr: u32::from(ip).to_be() },
            sin_zero: [0; 8],
        };
        let local = bind(from.parse().unwrap(), 0);
        let len = size_of::<libc::sockaddr_in>() as libc::socklen_t;
        assert_eq!(libc::bind(fd, (&local as *const libc::sockaddr_in).cast(), len), 0, "bind to {from}");
        let SocketAddr::V4(remote) = server else { panic!("an IPv4 server") };
        let remote = bind(*remote.ip(), remote.port());
        assert_eq!(libc::connect(fd, (&remote as *const libc::sockaddr_in).cast(), len), 0, "connect from {from}");
        fd
    };
    // SAFETY: a connected socket nothing else owns.
    Conn::from_stream(unsafe { <TcpStream as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

fn assert_refused(conn: &mut Conn, what: &str) {
    assert_eq!(conn.try_line(PATIENCE).as_deref(), Some("E - - too-many-connections"), "{what}");
    assert!(conn.closed_by_server(), "{what}: closed after the refusal");
}

#[test]
fn connections_per_address_stop_exactly_at_the_limit_over_all_cores() {
    const LIMIT: usize = 6;
    let server = Server::start(&["--shards", "2", "--max-connections-per-ip", &LIMIT.to_string()]);
    let mut admitted: Vec<Conn> = (0..LIMIT).map(|_| server.connect()).collect();
    for (index, conn) in admitted.iter_mut().enumerate() {
        assert_pong(conn, &format!("connection {index} of {LIMIT}"));
    }
    assert_refused(&mut server.connect(), "one connection past the limit");
    // Another loopback address has a count of its own.
    let mut elsewhere: Vec<Conn> = (0..LIMIT).map(|_| connect_from("127.0.0.2", server.addr)).collect();
    for conn in &mut elsewhere {
        assert_pong(conn, "a connection from 127.0.0.2");
    }
    assert_refused(&mut connect_from("127.0.0.2", server.addr), "127.0.0.2 past its limit");
    // A core publishes its counters at the end of its turn, which may come
    // just after the refused client read its refusal.
    wait_until("both refusals counted", || stat(&mut admitted[0], "refused_per_ip") == 2);
    assert_eq!(stat(&mut admitted[0], "too-many-connections"), 2, "counted with the other refusals");

    // A closed connection frees its place, and only one.
    drop(admitted.pop());
    wait_until("the closed connection to be counted out", || {
        stat(&mut admitted[0], "connections") == (2 * LIMIT - 1) as u64
    });
    let mut again = server.connect();
    assert_pong(&mut again, "a connection in the freed place");
    assert_refused(&mut server.connect(), "past the limit again");
    wait_until("the third refusal counted", || stat(&mut again, "refused_per_ip") == 3);
    assert_eq!(stat(&mut again, "too-many-connections"), 3);
}

// ---------------------------------------------------------------------------
// Client hosts that vanish without a reset

/// Two network namespaces joined by a veth pair, made by the test for
/// itself: the server's side (10.77.0.1) and a client host's (10.77.0.2),
/// whose link can be cut so that the client vanishes without a reset.
struct VanishingHost {
    server_ns: String,
    client_ns: String,
    client_link: String,
}

impl VanishingHost {
    /// The namespaces, or `None` (and why) where they cannot be made.
    fn create() -> Result<VanishingHost, String> {
        let id = std::process::id();
        let host = VanishingHost {
            server_ns: format!("ringlock-test-{id}-s"),
            client_ns: format!("ringlock-test-{id}-c"),
            client_link: format!("rl{id}c"),
        };
        let server_link = format!("rl{id}s");
        let (s, c) = (host.server_ns.as_str(), host.client_ns.as_str());
        let steps: [&[&str]; 8] = [
            &["netns", "add", s],
            &["netns", "add", c],
            &["link", "add", &server_link, "netns", s, "type", "veth", "peer", "name", &host.client_link, "netns", c],
            &["-n", s, "addr", "add", "10.77.0.1/30", "dev", &server_link],
            &["-n", c, "addr", "add", "10.77.0.2/30", "dev", &host.client_link],
            &["-n", s, "link", "set", "lo", "up"],
            &["-n", s, "link", "set", &server_link, "up"],
            &["-n", c, "link", "set", &host.client_link, "up"],
        ];
        for step in steps {
            ip(step)?;
        }
        Ok(host)
    }

    /// Moves the calling thread into the server's namespace (threads and
    /// processes it starts from now on are there too).
    fn enter_server_side(&self) {
        enter(&self.server_ns);
    }

    /// A connection from the client host to `server` (in the server's namespace).
    fn connect(&self, server: SocketAddr) -> Conn {
        let namespace = self.client_ns.clone();
        let stream = std::thread::spawn(move || {
            enter(&namespace);
            TcpStream::connect(server).expect("connect from the client host")
        })
        .join()
        .unwrap();
        Conn::from_stream(stream)
    }

    /// Cuts the client host's link: its packets, and every packet to it, are
    /// lost, as when a host loses power.
    fn vanish(&self) {
        ip(&["-n", &self.client_ns, "link", "set", &self.client_link, "down"]).expect("cut the client host's link");
    }
}

impl Drop for VanishingHost {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.client_ns]);
        let _ = ip(&["netns", "del", &self.server_ns]);
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    let output = Command::new("ip").args(args).output().map_err(|error| format!("ip {args:?}: {error}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!("ip {args:?}: {}", String::from_utf8_lossy(&output.stderr).trim()))
    }
}

fn enter(namespace: &str) {
    let file = std::fs::File::open(format!("/run/netns/{namespace}")).expect("open the network namespace");
    // SAFETY: joining a network namespace by a descriptor we hold; only the
    // calling thread moves.
    let result = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&file), libc::CLONE_NEWNET) };
    assert_eq!(result, 0, "setns: {}", std::io::Error::last_os_error());
}

/// Starts a server in the server's namespace, with a client host that holds
/// a connection and a wait-forever acquire on it, and a bystander on the
/// server's own host that holds the key.
fn server_with_a_waiting_client_host(flags: &[&str]) -> Option<(VanishingHost, Server, Conn, Conn, u64)> {
    let host = match VanishingHost::create() {
        Ok(host) => host,
        // Only a test run without root may skip: as root (this project's CI
        // machines), namespaces that cannot be made are a failure, so that
        // the test cannot pass without testing anything.
        // SAFETY: geteuid has no preconditions.
        Err(why) if unsafe { libc::geteuid() } != 0 => {
            eprintln!("SKIPPED: this test needs network namespaces and veth links (root, iproute2): {why}");
            return None;
        }
        Err(why) => panic!("running as root, yet no network namespace could be made: {why}"),
    };
    host.enter_server_side();
    let mut args = vec!["--shards", "2", "--listen", "10.77.0.1:0"];
    args.extend_from_slice(flags);
    let server = Server::start(&args);
    let mut bystander = server.connect();
    let token = bystander.acquire("k", "60", "0");
    let mut client = host.connect(server.addr);
    assert_pong(&mut client, "the client host");
    client.request("A k 60 0");
    wait_until("the client host's acquire to queue", || stat(&mut bystander, "waiters") == 1);
    Some((host, server, bystander, client, token))
}

#[test]
fn keepalive_closes_the_idle_connection_of_a_vanished_host_and_drops_its_waiter() {
    let flags = [
        "--keepalive-idle-s",
        "1",
        "--keepalive-interval-s",
        "1",
        "--keepalive-probes",
        "2",
        "--tcp-user-timeout-ms",
        "0",
    ];
    let Some((host, _server, mut bystander, _client, token)) = server_with_a_waiting_client_host(&flags) else {
        return;
    };
    assert_eq!(stat(&mut bystander, "connections"), 2);
    // Nothing is left to send to the client host: only keepalive can find
    // out that it is gone.
    host.vanish();
    wait_until("the vanished host's connection to close", || stat(&mut bystander, "connections") == 1);
    assert_eq!(stat(&mut bystander, "waiters"), 0, "its wait-forever acquire left the queue");
    assert_eq!(bystander.call(&format!("R k {token}")), "R k", "released to nobody");
    bystander.acquire("k", "60", "0");
}

#[test]
fn user_timeout_closes_a_vanished_host_that_replies_cannot_reach() {
    let flags = ["--keepalive-idle-s", "0", "--tcp-user-timeout-ms", "1500"];
    let Some((host, _server, mut bystander, _client, token)) = server_with_a_waiting_client_host(&flags) else {
        return;
    };
    host.vanish();
    // The release grants k to the vanished host; the grant is never
    // acknowledged, and the user timeout ends the connection.
    assert_eq!(bystander.call(&format!("R k {token}")), "R k");
    wait_until("the vanished host's connection to close", || stat(&mut bystander, "connections") == 1);
}

/// A server given a subset of the CPUs (as a container's cpuset, or
/// `taskset`, gives it) pins its shard cores to those by default, not to
/// CPUs 0, 1, ... where it may not run.
#[test]
fn shard_cores_pin_by_default_to_the_cpus_the_process_is_given() {
    let allowed = std::fs::read_to_string("/proc/self/status").unwrap();
    let list = allowed.lines().find_map(|line| line.strip_prefix("Cpus_allowed_list:")).unwrap().trim().to_string();
    let last: usize = list.rsplit([',', '-']).next().unwrap().parse().unwrap();
    if last == 0 {
        eprintln!("SKIPPED: one CPU only, so every default is CPU 0");
        return;
    }
    let data = common::DataDir::new();
    let mut child = Command::new("taskset")
        .args(["-c", &last.to_string(), env!("CARGO_BIN_EXE_ringlock"), "--shards", "1", "--listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(&data.0)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start ringlock under taskset");
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let started = std::io::BufRead::lines(stderr).map_while(Result::ok).find(|line| line.contains("listening on"));
    let _ = child.kill();
    let _ = child.wait();
    let started = started.expect("the server starts on the CPU it is given");
    assert!(started.contains(&format!("pinned=Some([{last}])")), "{started}");
}
