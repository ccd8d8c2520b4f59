//! DNS names wherever an address is taken (`--listen`, `--peers`,
//! `--cluster-listen`, `--metrics-listen`), as Kubernetes and Compose give
//! them: replies name a node as written in `--peers`, a peer's name is
//! looked up at every connection, and only this node's own listening
//! addresses must resolve at start.

mod common;

use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

use common::{Server, wait_until};
use ringlock_client::{Client, ReleaseOutcome};

/// `count` ports free on 127.0.0.1 now.
fn free_ports(count: usize) -> Vec<u16> {
    let holders: Vec<TcpListener> = (0..count).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    holders.iter().map(|holder| holder.local_addr().unwrap().port()).collect()
}

const TIMINGS: [&str; 4] = ["--heartbeat-ms", "50", "--failover-ms", "300"];

/// Node `index` of `peers`, listening on `listen` (a name, resolved at start).
fn node(peers: &str, index: usize, listen: &str) -> Server {
    let mut args = vec!["--peers", peers, "--node", if index == 0 { "0" } else { "1" }, "--listen", listen];
    args.extend_from_slice(&TIMINGS);
    Server::start(&args)
}

#[test]
fn a_cluster_given_names_serves_fails_over_and_names_its_active_as_written() {
    let ports = free_ports(4);
    let peers = format!("localhost:{}@localhost:{},LocalHost:{}@localhost:{}", ports[0], ports[1], ports[2], ports[3]);
    let named_first = format!("localhost:{}", ports[0]);
    let named_second = format!("LocalHost:{}", ports[2]);
    let mut first = node(&peers, 0, &named_first);
    let second = node(&peers, 1, &named_second);

    let mut on_second = second.connect();
    wait_until("node 1 follows node 0, named as written", || {
        on_second.call("P").starts_with("P standby ") && on_second.call("P").ends_with(&format!(" {named_first}"))
    });
    assert_eq!(on_second.call("A names/k 5 0"), format!("M A names/k {named_first}"));

    // The client is given the standby's name and follows the redirect to
    // the active's name.
    let client = Client::builder([named_second.clone()]).connect().unwrap();
    let lock = client.acquire("names/k", Duration::from_secs(5), Some(Duration::from_secs(5))).unwrap().unwrap();
    assert_eq!(lock.release(), Ok(ReleaseOutcome::Released));
    assert!(
        second.log().contains(&format!("endpoint=localhost:{}", ports[1])),
        "the log names the peer as written:\n{}",
        second.log()
    );

    first.kill9();
    wait_until("node 1 takes over and names itself as written", || {
        let ping = on_second.call("P");
        ping.starts_with("P active ") && ping.ends_with(&format!(" {named_second}"))
    });
    let lock = client.acquire("names/k", Duration::from_secs(5), Some(Duration::from_secs(5))).unwrap().unwrap();
    assert_eq!(lock.release(), Ok(ReleaseOutcome::Released));
}

#[test]
fn a_peer_whose_name_does_not_resolve_yet_is_retried_and_the_node_serves() {
    let ports = free_ports(2);
    let peers = format!("127.0.0.1:{}@127.0.0.1:{},not-yet.invalid:7700", ports[0], ports[1]);
    let server = node(&peers, 0, &format!("127.0.0.1:{}", ports[0]));
    let mut conn = server.connect();
    wait_until("the node, alone, becomes active", || conn.call("P").starts_with("P active "));
    assert!(conn.call("A names/alone 5 0").starts_with("A names/alone "));
    assert!(
        server.log().contains("not-yet.invalid:17700") && server.log().contains("cannot resolve the name"),
        "the log says why the peer is unreachable:\n{}",
        server.log()
    );
}

#[test]
fn a_listening_name_that_does_not_resolve_stops_the_start_naming_the_flag() {
    for (flag, value) in [
        ("--listen", "nowhere.invalid:7700"),
        ("--metrics-listen", "nowhere.invalid:9100"),
        ("--cluster-listen", "nowhere.invalid:17700"),
    ] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_ringlock"));
        command.args(["--no-pin", "--shards", "1", flag, value]);
        if flag == "--cluster-listen" {
            let ports = free_ports(2);
            command.args(["--peers", &format!("127.0.0.1:{},127.0.0.1:{}", ports[0], ports[1]), "--node", "0"]);
        } else if flag == "--metrics-listen" {
            command.args(["--listen", "127.0.0.1:0"]);
        }
        let (status, stderr) = common::run_to_exit(command, &format!("{flag} {value}"));
        assert!(!status.success(), "{flag}: {stderr}");
        assert!(stderr.contains(&format!("{flag} {value}: cannot resolve the name")), "{flag}: {stderr}");
    }
}
