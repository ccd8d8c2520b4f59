//! DNS names wherever an address is taken (`--listen`, `--peers`,
//! `--cluster-listen`, `--metrics-listen`), as Kubernetes and Compose give
//! them: replies name a node as written in `--peers`, a peer's name is
//! looked up at every connection, and only this node's own listening
//! addresses must resolve at start.

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::certs::shared_peer_certificate;
use common::netns::Network;
use common::{Conn, DataDir, Server, free_addrs, token_of, wait_until};

/// `count` different free ports on 127.0.0.1.
fn ports_free(count: usize) -> Vec<u16> {
    free_addrs(count).iter().map(SocketAddr::port).collect()
}
use ringlock_client::{Client, ReleaseOutcome};

const TIMINGS: [&str; 4] = ["--heartbeat-ms", "50", "--failover-ms", "300"];

/// Node `index` of `peers`, listening on `listen` (a name, resolved at start).
fn node(peers: &str, index: usize, listen: &str) -> Server {
    let mut args = vec!["--peers", peers, "--node", if index == 0 { "0" } else { "1" }, "--listen", listen];
    args.extend_from_slice(&TIMINGS);
    Server::start(&args)
}

/// The table version node `index` holds (the `S` reply's `"table"` field):
/// it moves past its idle value once a change has come across.
fn table_version(network: &Network, index: usize) -> u64 {
    let mut conn = Conn::from_stream(network.connect(index, SocketAddr::new(network.address(index), 7700)));
    let reply = conn.call("S");
    let field = reply.split("\"table\":").nth(1).expect("a table in S");
    let version = field.split("\"version\":").nth(1).unwrap();
    version[..version.find('}').unwrap()].parse().unwrap()
}

#[test]
fn a_cluster_given_names_serves_fails_over_and_names_its_active_as_written() {
    let ports = ports_free(4);
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
    let ports = ports_free(2);
    let peers = format!("127.0.0.1:{}@127.0.0.1:{},not-yet.invalid:7700", ports[0], ports[1]);
    let server = node(&peers, 0, &format!("127.0.0.1:{}", ports[0]));
    let mut conn = server.connect();
    wait_until("the node, alone, becomes active", || conn.call("P").starts_with("P active "));
    assert!(conn.call("A names/alone 5 0").starts_with("A names/alone "));
    wait_until("the log to say why the peer is unreachable", || {
        server.log().contains("not-yet.invalid:17700") && server.log().contains("cannot resolve the name")
    });
}

#[test]
fn a_listening_name_that_does_not_resolve_stops_the_start_naming_the_flag() {
    for (flag, value) in [
        ("--listen", "nowhere.invalid:7700"),
        ("--metrics-listen", "nowhere.invalid:9100"),
        ("--cluster-listen", "nowhere.invalid:17700"),
    ] {
        let data = DataDir::new();
        let mut command = Command::new(env!("CARGO_BIN_EXE_ringlock"));
        command.args(["--no-pin", "--shards", "1", flag, value]).arg("--data-dir").arg(&data.0);
        if flag == "--cluster-listen" {
            let ports = ports_free(2);
            command.args(["--peers", &format!("127.0.0.1:{},127.0.0.1:{}", ports[0], ports[1]), "--node", "0"]);
        } else if flag == "--metrics-listen" {
            command.args(["--listen", "127.0.0.1:0"]);
        }
        let (status, stderr) = common::run_to_exit(command, &format!("{flag} {value}"));
        assert!(!status.success(), "{flag}: {stderr}");
        assert!(stderr.contains(&format!("{flag} {value}: cannot resolve the name")), "{flag}: {stderr}");
    }
}

/// Three nodes addressed only by names, as Docker Compose and Kubernetes
/// give them: each host in its own network namespace with its own
/// `/etc/hosts` naming the nodes (deploy/compose.yaml's set-up, where no
/// container engine runs). The active is killed and a standby takes over;
/// then a node comes back under the same name with a new IP, and the
/// active finds it there.
#[test]
fn nodes_known_only_by_name_fail_over_and_find_a_node_that_came_back_with_a_new_ip() {
    let Some(mut network) = Network::create(3) else { return };
    let hosts = |network: &Network| {
        (0..3).map(|index| format!("{} ringlock-{index}\n", network.address(index))).collect::<String>()
            + "127.0.0.1 localhost\n"
    };
    for index in 0..3 {
        network.write_hosts(index, &hosts(&network));
    }
    let peers = "ringlock-0:7700,ringlock-1:7700,ringlock-2:7700";
    let start = |network: &Network, index: usize, data_dir: Arc<DataDir>| {
        let command = network.command(index, env!("CARGO_BIN_EXE_ringlock"));
        let node = index.to_string();
        let mut args = vec!["--peers", peers, "--node", &node, "--listen", "0.0.0.0:7700"];
        args.extend_from_slice(&["--cluster-listen", "0.0.0.0:17700"]);
        args.extend_from_slice(&TIMINGS);
        Server::start_command(command, data_dir, &args)
    };
    let data: Vec<Arc<DataDir>> = (0..3).map(|_| Arc::new(DataDir::new())).collect();
    let mut nodes: Vec<Server> = (0..3).map(|index| start(&network, index, data[index].clone())).collect();
    let ping = |network: &Network, index: usize| {
        let mut conn = Conn::from_stream(network.connect(index, SocketAddr::new(network.address(index), 7700)));
        conn.call("P")
    };
    let cli = |network: &Network, index: usize, args: &[&str]| {
        let mut command = network.command(index, env!("CARGO_BIN_EXE_ringlock-cli"));
        command.args(["--servers", peers, "--connect-limit", "10"]).args(args);
        let output = command.output().expect("run ringlock-cli");
        assert!(output.status.success(), "ringlock-cli {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap()
    };
    wait_until("ringlock-1 and ringlock-2 follow ringlock-0, by name", || {
        ping(&network, 1).ends_with(" ringlock-0:7700") && ping(&network, 2).ends_with(" ringlock-0:7700")
    });

    // A client on ringlock-2's host, given only names, takes a lock, and
    // it reaches ringlock-1 before the active dies.
    let idle = table_version(&network, 1);
    let token = cli(&network, 2, &["acquire", "names/held", "--lease", "60"]);
    let token = token.trim().to_string();
    assert!(token.parse::<u64>().is_ok(), "a token: {token:?}");
    wait_until("ringlock-1 holds the grant", || table_version(&network, 1) > idle);

    nodes[0].kill9();
    wait_until("ringlock-1 takes over", || {
        let reply = ping(&network, 1);
        reply.starts_with("P active ") && reply.ends_with(" ringlock-1:7700")
    });

    // ringlock-2 comes back with another IP under the same name; the hosts
    // files everywhere say so, as a DNS server would.
    nodes[2].kill9();
    let moved = network.readdress(2, 9);
    for index in 0..3 {
        network.write_hosts(index, &hosts(&network));
    }
    assert_eq!(network.address(2), moved);
    nodes[2] = start(&network, 2, data[2].clone());
    // It hears the active only over the connection the active opens to it,
    // at the name's new address.
    wait_until("ringlock-1 finds ringlock-2 at its new IP", || ping(&network, 2).ends_with(" ringlock-1:7700"));
    assert!(
        nodes[1].log().contains(&format!("{moved}:17700")),
        "the active logs the address the name gave:\n{}",
        nodes[1].log()
    );

    // The lock outlived the failover, and is released through the moved node.
    cli(&network, 2, &["release", "names/held", &token]);
}

/// The Kubernetes manifest's peer TLS: every pod shows one certificate that
/// names all of them (`ringlock-N.ringlock-peers`), since a StatefulSet's
/// pods share one Secret. Three nodes known only by those names, in their
/// own network namespaces, form a cluster over mutual TLS, and a standby
/// takes over when the active is killed.
#[test]
fn nodes_sharing_one_peer_certificate_that_names_them_all_form_a_cluster_and_fail_over() {
    let Some(network) = Network::create(3) else { return };
    let name = |index: usize| format!("ringlock-{index}.ringlock-peers");
    let hosts = (0..3).map(|index| format!("{} {}\n", network.address(index), name(index))).collect::<String>()
        + "127.0.0.1 localhost\n";
    for index in 0..3 {
        network.write_hosts(index, &hosts);
    }
    let names: Vec<String> = (0..3).map(name).collect();
    let certificates = shared_peer_certificate(&names.iter().map(String::as_str).collect::<Vec<_>>());
    let file = |stem: &str| certificates.0.join(stem).to_str().unwrap().to_string();
    let (cert, key, ca) = (file("peer-set.pem"), file("peer-set.key"), file("peer-ca.pem"));
    let peers = names.iter().map(|name| format!("{name}:7700")).collect::<Vec<_>>().join(",");
    let mut nodes: Vec<Server> = (0..3)
        .map(|index| {
            let command = network.command(index, env!("CARGO_BIN_EXE_ringlock"));
            let node = index.to_string();
            let mut args = vec!["--peers", &peers, "--node", &node, "--listen", "0.0.0.0:7700"];
            args.extend_from_slice(&["--cluster-listen", "0.0.0.0:17700"]);
            args.extend_from_slice(&["--peer-tls-cert", &cert, "--peer-tls-key", &key, "--peer-tls-ca", &ca]);
            args.extend_from_slice(&TIMINGS);
            Server::start_command(command, Arc::new(DataDir::new()), &args)
        })
        .collect();
    let ping = |index: usize| {
        let mut conn = Conn::from_stream(network.connect(index, SocketAddr::new(network.address(index), 7700)));
        conn.call("P")
    };
    let call = |index: usize, line: &str| {
        let mut conn = Conn::from_stream(network.connect(index, SocketAddr::new(network.address(index), 7700)));
        conn.call(line)
    };
    let active_0 = format!(" {}:7700", names[0]);
    wait_until("both standbys follow ringlock-0 over peer TLS", || {
        ping(1).ends_with(&active_0) && ping(2).ends_with(&active_0)
    });
    let idle = table_version(&network, 1);
    let token = token_of(&call(0, "A names/tls 60000 0"), "names/tls");
    wait_until("ringlock-1 holds the grant", || table_version(&network, 1) > idle);

    nodes[0].kill9();
    let active_1 = format!(" {}:7700", names[1]);
    wait_until("ringlock-1 takes over", || {
        let reply = ping(1);
        reply.starts_with("P active ") && reply.ends_with(&active_1)
    });
    // The lock came across over the encrypted stream: the new active knows
    // its holder's token.
    assert_eq!(call(1, &format!("R names/tls {token}")), "R names/tls");
    for node in &nodes[1..] {
        let log = node.log();
        let refusals = log.lines().filter(|line| line.contains("WARN") && line.contains("certificate"));
        assert_eq!(refusals.count(), 0, "no peer certificate refused:\n{log}");
    }
}
