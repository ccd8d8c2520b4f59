//! Start-up, restarts and stopping: epochs, tokens, signals, flags.

mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::{DataDir, Server, stat, token_of, wait_until};

#[test]
fn tokens_keep_increasing_across_a_restart_and_a_kill_9() {
    let data_dir = Arc::new(DataDir::new());
    let mut server = Server::start_in(data_dir.clone(), &[]);
    let mut conn = server.connect();
    let first = conn.acquire("k", "30", "0");
    let epoch_before: u64 = conn.call("P").split(' ').nth(2).unwrap().parse().unwrap();
    drop(conn);
    assert!(server.stop("TERM").success());

    let mut server = Server::start_in(data_dir.clone(), &[]);
    let mut conn = server.connect();
    let epoch_after: u64 = conn.call("P").split(' ').nth(2).unwrap().parse().unwrap();
    assert!(epoch_after > epoch_before, "a restart starts a new epoch");
    assert_eq!(stat(&mut conn, "held_keys"), 0, "a single node starts with no locks held");
    let second = conn.acquire("k", "30", "0");
    assert!(second > first, "{second} after {first}");
    // Many grants, then kill -9 with no chance to write anything more.
    let mut last = second;
    for index in 0..1000 {
        last = last.max(conn.acquire(&format!("other-{index}"), "30", "0"));
    }
    drop(conn);
    server.kill9();

    let server = Server::start_in(data_dir, &[]);
    let mut conn = server.connect();
    let third = conn.acquire("k", "30", "0");
    assert!(third > last, "{third} after {last}: tokens of a killed node are never reissued");
}

#[test]
fn sigterm_answers_queued_acquires_shutting_down_and_exits_0() {
    let mut server = Server::start(&["--shards", "2"]);
    let mut holder = server.connect();
    let token = holder.acquire("k", "30", "0");
    let mut waiters: Vec<_> = (0..4).map(|_| server.connect()).collect();
    for waiter in &mut waiters {
        waiter.request("A k 30 0");
    }
    wait_until("the waiters to queue", || stat(&mut holder, "waiters") == 4);
    let _ = token;
    let status = server.stop("TERM");
    assert!(status.success(), "exit status {status:?}");
    for waiter in &mut waiters {
        assert_eq!(waiter.line(), "E A k shutting-down");
    }
}

#[test]
fn sigint_stops_an_idle_server_with_status_0() {
    let mut server = Server::start(&[]);
    let mut conn = server.connect();
    conn.call("P");
    assert!(server.stop("INT").success());
    assert!(conn.closed_by_server());
}

#[test]
fn an_unusable_data_dir_or_address_is_a_clear_error() {
    let blocker = tempfile_path("not-a-dir");
    std::fs::write(&blocker, "a file").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_ringlock"))
        .args(["--listen", "127.0.0.1:0", "--no-pin", "--data-dir"])
        .arg(blocker.join("data"))
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--data-dir"), "{stderr}");
    std::fs::remove_file(&blocker).unwrap();

    // A port held by a socket without SO_REUSEPORT cannot be shared.
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = holder.local_addr().unwrap().to_string();
    let log = Server::try_start_in(Arc::new(DataDir::new()), &["--listen", &taken]).err().expect("the port is taken");
    assert!(log.contains("address in use; pick another --listen"), "{log}");

    let server = Server::start(&[]);
    let same_dir = Server::try_start_in(server.data_dir(), &[]);
    let log = same_dir.err().expect("a second server on the same data directory is refused");
    assert!(log.contains("in use"), "{log}");
}

#[test]
fn cluster_flags_are_checked_and_a_taken_peer_port_is_a_clear_error() {
    let run = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_ringlock")).args(args).output().unwrap();
        assert!(!output.status.success(), "{args:?} must not start");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let peers = "127.0.0.1:1,127.0.0.1:2";
    assert!(run(&["--peers", peers, "--node", "5"]).contains("--node 5"));
    assert!(run(&["--peers", peers, "--node", "0", "--heartbeat-ms", "900"]).contains("--failover-ms"));
    assert!(run(&["--node", "0"]).contains("--node needs --peers"));

    // The peer port is bound at start: a taken one stops the start with a hint.
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = holder.local_addr().unwrap();
    let client = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let data_dir = DataDir::new();
    let peers = format!("{client}@{taken},127.0.0.1:1@127.0.0.1:2");
    let log = run(&["--peers", &peers, "--node", "0", "--no-pin", "--data-dir", data_dir.0.to_str().unwrap()]);
    assert!(log.contains(&format!("cannot listen for peers on {taken}")), "{log}");
    assert!(log.contains("pick another --cluster-listen"), "{log}");

    // A cluster of one is a single node.
    let data_dir = Arc::new(DataDir::new());
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let server = Server::try_start_in(data_dir, &["--peers", &free, "--node", "0", "--listen", &free])
        .unwrap_or_else(|log| panic!("a one-node --peers starts:\n{log}"));
    assert_eq!(server.addr.to_string(), free);
}

#[test]
fn help_explains_every_flag() {
    let output = Command::new(env!("CARGO_BIN_EXE_ringlock")).arg("--help").output().unwrap();
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for flag in [
        "--listen",
        "--shards",
        "--cpus",
        "--no-pin",
        "--replication-cpu",
        "--data-dir",
        "--max-connections",
        "--max-connections-per-ip",
        "--keepalive-idle-s",
        "--keepalive-interval-s",
        "--keepalive-probes",
        "--tcp-user-timeout-ms",
        "--max-keys",
        "--max-keys-per-connection",
        "--max-waiters-per-key",
        "--max-lease",
        "--log-level",
        "--peers",
        "--node",
        "--heartbeat-ms",
        "--failover-ms",
        "--cluster-listen",
        "--metrics-listen",
        "--drain-ms",
        "RINGLOCK_LISTEN",
        "RINGLOCK_METRICS_LISTEN",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help:\n{help}");
    }
}

#[test]
fn flags_can_come_from_the_environment() {
    let data_dir = Arc::new(DataDir::new());
    let output = Command::new(env!("CARGO_BIN_EXE_ringlock"))
        .env("RINGLOCK_SHARDS", "0")
        .arg("--data-dir")
        .arg(&data_dir.0)
        .output()
        .unwrap();
    assert!(!output.status.success(), "RINGLOCK_SHARDS=0 is refused like --shards 0");
    assert!(String::from_utf8_lossy(&output.stderr).contains("shards"));
}

#[test]
fn a_server_configured_by_environment_variables_obeys_them() {
    let server = Server::start_with_env(
        &[("RINGLOCK_SHARDS", "3"), ("RINGLOCK_NO_PIN", "true"), ("RINGLOCK_MAX_LEASE", "1")],
        &[],
    );
    let mut conn = server.connect();
    assert_eq!(conn.call("A k 2 0"), "E A k bad-lease", "RINGLOCK_MAX_LEASE=1 caps leases at 1 s");
    conn.acquire("k", "1", "0");
    let stats = conn.call("S");
    assert_eq!(
        stats.matches("\"grants\":").count(),
        4,
        "RINGLOCK_SHARDS=3 (not the 2 online CPUs) gives three shards plus the total: {stats}"
    );
}

#[test]
fn a_lease_counts_from_the_grant_after_a_hand_off() {
    let server = Server::start(&[]);
    let mut holder = server.connect();
    let mut waiter = server.connect();
    let token = holder.acquire("k", "30", "0");
    waiter.request("A k 0.3 0");
    wait_until("the waiter to queue", || stat(&mut holder, "waiters") == 1);
    // The waiter waits longer than its own lease: counted from the request,
    // that lease would be over before the grant.
    std::thread::sleep(Duration::from_millis(500));
    holder.call(&format!("R k {token}"));
    let next = token_of(&waiter.line(), "k");
    assert_eq!(holder.call(&format!("X k {next} 30")), format!("X k {next}"), "still held right after the grant");
}

fn tempfile_path(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("ringlock-test-{}-{name}", std::process::id()))
}

#[test]
fn a_stop_finishes_while_clients_close_and_others_do_not_read() {
    let mut server = Server::start(&["--shards", "2"]);
    // Slow readers on every core: many stats requests, never read.
    let mut slow: Vec<std::net::TcpStream> = Vec::new();
    for _ in 0..4 {
        let mut stream = std::net::TcpStream::connect(server.addr).unwrap();
        std::io::Write::write_all(&mut stream, &b"S\n".repeat(3000)).unwrap();
        slow.push(stream);
    }
    let idle: Vec<_> = (0..8).map(|_| server.connect()).collect();
    let mut conn = server.connect();
    conn.acquire("k", "30", "0");
    server.signal("TERM");
    // Connections closing during the stop must not keep any core waiting.
    drop(idle);
    let status = server.stop_after_signal();
    assert!(status.success(), "exit status {status:?}");
    drop(slow);
}

#[test]
fn requests_sent_before_end_of_input_are_all_answered() {
    let server = Server::start(&["--shards", "2"]);
    let mut conn = server.connect();
    let mut batch = String::new();
    for index in 0..50 {
        batch.push_str(&format!("A half-{index} 30 0\n"));
    }
    conn.send(batch.as_bytes());
    conn.stream.shutdown(std::net::Shutdown::Write).unwrap();
    let mut replies = Vec::new();
    while let Some(line) = conn.try_line(common::PATIENCE) {
        replies.push(line);
    }
    assert_eq!(replies.len(), 50, "every request before the half-close is answered: {replies:?}");
    for (index, reply) in replies.iter().enumerate() {
        assert!(reply.starts_with("A half-"), "reply {index}: {reply}");
    }
}

#[test]
fn a_new_epoch_file_is_logged_with_its_absolute_path_and_an_existing_one_is_not() {
    let data_dir = Arc::new(DataDir::new());
    let mut server = Server::start_in(data_dir.clone(), &[]);
    let path = std::fs::canonicalize(&data_dir.0).unwrap().join("epoch");
    let warning = server.log().lines().find(|line| line.contains("no epoch file")).map(str::to_string);
    let warning = warning.unwrap_or_else(|| panic!("a new epoch file is logged:\n{}", server.log()));
    assert!(warning.contains("WARN") && warning.contains(&path.display().to_string()), "{warning}");
    assert!(server.stop("TERM").success());
    let server = Server::start_in(data_dir, &[]);
    assert!(!server.log().contains("no epoch file"), "the same directory again:\n{}", server.log());
}

#[test]
fn a_new_epoch_file_under_a_relative_data_dir_is_logged_with_its_absolute_path() {
    let working_dir = Arc::new(DataDir::new());
    let server = Server::start_from(working_dir.clone(), &["--data-dir", "state"]);
    let path = std::fs::canonicalize(&working_dir.0).unwrap().join("state").join("epoch");
    let warning = server.log().lines().find(|line| line.contains("no epoch file")).map(str::to_string);
    let warning = warning.unwrap_or_else(|| panic!("a new epoch file is logged:\n{}", server.log()));
    assert!(warning.contains(&path.display().to_string()), "the absolute path {}:\n{warning}", path.display());
}

#[test]
fn an_epoch_file_out_of_range_stops_the_start_with_the_recovery_named() {
    for (text, expected) in [("18446744073709551615", "from 0 to 16777215"), ("16777215", "epoch space is exhausted")] {
        let data_dir = Arc::new(DataDir::new());
        std::fs::create_dir_all(&data_dir.0).unwrap();
        std::fs::write(data_dir.0.join("epoch"), text).unwrap();
        let log = Server::try_start_in(data_dir.clone(), &[]).err().expect("the server refuses to start");
        assert!(log.contains(expected) && log.contains("When the epoch space runs out"), "{text}:\n{log}");
        assert_eq!(std::fs::read_to_string(data_dir.0.join("epoch")).unwrap().trim(), text, "the epoch is kept");
    }
}
