//! `--min-standbys`: a two-node cluster on loopback grants as usual while
//! its standby applies every grant; without the standby, the active stops
//! granting (`no-standby`) within about the failover timeout, holders can
//! still release, and grants resume once the standby is back. The flag is
//! refused where it cannot hold.

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Conn, DataDir, Server, free_addrs, http_get, metrics_address, run_to_exit, scrape, token_of, wait_until};

const FAILOVER_MS: &str = "300";

struct Pair {
    peers: String,
    clients: Vec<SocketAddr>,
    data: Vec<Arc<DataDir>>,
}

impl Pair {
    fn new() -> Pair {
        let addresses = free_addrs(4);
        let clients = vec![addresses[0], addresses[2]];
        let peers = format!("{}@{},{}@{}", addresses[0], addresses[1], addresses[2], addresses[3]);
        Pair { peers, clients, data: vec![Arc::new(DataDir::new()), Arc::new(DataDir::new())] }
    }

    fn start(&self, index: usize) -> Server {
        let (node, listen) = (index.to_string(), self.clients[index].to_string());
        let args = [
            "--peers",
            &self.peers,
            "--node",
            &node,
            "--listen",
            &listen,
            "--metrics-listen",
            "127.0.0.1:0",
            "--heartbeat-ms",
            "50",
            "--failover-ms",
            FAILOVER_MS,
            "--min-standbys",
            "1",
        ];
        Server::start_in(self.data[index].clone(), &args)
    }
}

/// Acquires `key` on `conn` (no wait), trying again while the active has
/// no caught-up standby yet; the token.
fn acquire_once_standby_is_there(conn: &mut Conn, key: &str) -> u64 {
    let mut reply = String::new();
    wait_until(&format!("a grant of {key}"), || {
        reply = conn.call(&format!("A {key} 30 0"));
        !reply.ends_with("no-standby")
    });
    token_of(&reply, key)
}

#[test]
fn with_a_standby_grants_flow_and_without_one_acquires_are_refused_no_standby() {
    let pair = Pair::new();
    let node_0 = pair.start(0);
    let mut node_1 = pair.start(1);
    let mut conn = Conn::connect(pair.clients[0]);
    wait_until("node 0 is active", || conn.call("P").starts_with("P active "));

    // Grants, releases and a FIFO hand-off to a waiter, each answered once
    // the standby has applied it.
    let held = acquire_once_standby_is_there(&mut conn, "held");
    let first = conn.acquire("k", "30", "0");
    let mut waiter = Conn::connect(pair.clients[0]);
    waiter.request("A k 30 10");
    assert_eq!(waiter.try_line(Duration::from_millis(100)), None, "queued behind the holder");
    assert_eq!(conn.call(&format!("R k {first}")), "R k");
    let handed = token_of(&waiter.line(), "k");
    assert!(handed > first);
    let extended = conn.call(&format!("X held {held} 30"));
    assert_eq!(extended, format!("X held {held}"));
    let mut standby = Conn::connect(pair.clients[1]);
    let inspect = standby.call("I k");
    assert!(inspect.starts_with("M I k "), "node 1 is the standby: {inspect}");

    // The standby dies: within about the failover timeout the active
    // refuses new acquires with the clear code, and says why everywhere.
    node_1.kill9();
    let killed = Instant::now();
    let mut index = 0;
    let refused_after = loop {
        index += 1;
        let key = format!("after-{index}");
        let reply = conn.call(&format!("A {key} 30 0"));
        if reply == format!("E A {key} no-standby") {
            break killed.elapsed();
        }
        assert!(reply.starts_with(&format!("A {key} ")), "a grant before the refusal: {reply}");
        assert!(killed.elapsed() < common::PATIENCE, "still granting {:?} after the standby died", killed.elapsed());
        std::thread::sleep(Duration::from_millis(10));
    };
    println!(
        "acquires refused no-standby {refused_after:?} after the standby was killed (--failover-ms {FAILOVER_MS})"
    );
    assert_eq!(waiter.call("A other 30 5"), "E A other no-standby");
    assert_eq!(conn.call(&format!("X held {held} 30")), "E X held no-standby", "no extend without a standby");
    // The holders keep what they hold, and can release it.
    assert_eq!(conn.call(&format!("R held {held}")), "R held");
    assert_eq!(waiter.call(&format!("R k {handed}")), "R k");
    let stats = conn.call("S");
    assert!(stats.contains("\"blocked\":{\"reason\":\"no_standby\",\"min_standbys\":1}"), "{stats}");
    let metrics = metrics_address(&node_0);
    let (status, body) = http_get(metrics, "/readyz");
    assert_eq!(status, 503, "{body}");
    assert!(body.starts_with("blocked: --min-standbys 1"), "{body}");
    assert_eq!(scrape(metrics).get("ringlock_blocked{reason=\"no_standby\"}"), Some(&1.0));
    assert!(node_0.log().lines().any(|line| line.contains("ERROR") && line.contains("cannot serve: --min-standbys")));

    // The standby comes back and catches up: grants resume.
    let _node_1 = pair.start(1);
    let again = acquire_once_standby_is_there(&mut conn, "again");
    assert!(again > handed);
    assert!(!conn.call("S").contains("\"blocked\""));
    assert_eq!(http_get(metrics, "/readyz").0, 200);
}

#[test]
fn min_standbys_is_refused_on_a_single_node_and_at_the_number_of_peers() {
    let addresses = free_addrs(4);
    let run = |args: &[String]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_ringlock"));
        command.args(args).args(["--data-dir", &DataDir::new().0.to_string_lossy(), "--no-pin"]);
        run_to_exit(command, "ringlock with a wrong --min-standbys")
    };
    let single = run(&["--listen".into(), addresses[0].to_string(), "--min-standbys".into(), "1".into()]);
    assert!(!single.0.success());
    assert!(single.1.contains("--min-standbys 1 needs standbys"), "{}", single.1);
    let peers = format!("{}@{},{}@{}", addresses[0], addresses[1], addresses[2], addresses[3]);
    let too_many = run(&["--peers".into(), peers, "--node".into(), "0".into(), "--min-standbys".into(), "2".into()]);
    assert!(!too_many.0.success());
    assert!(too_many.1.contains("--min-standbys 2 needs that many standbys"), "{}", too_many.1);
}
