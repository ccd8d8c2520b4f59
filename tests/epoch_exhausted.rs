//! A cluster whose epoch space is used up cannot elect an active: every
//! node that cannot serve says why, in its log, `S`, `/readyz` and
//! `/metrics`, instead of sitting silent as `standby 0 -`.

mod common;

use std::sync::Arc;

use common::{DataDir, Server, free_addrs, http_get, metrics_address, scrape, wait_until};

/// The largest epoch a token can carry (24 bits).
const EPOCH_MAX: u64 = (1 << 24) - 1;

#[test]
fn nodes_that_cannot_become_active_say_why_everywhere() {
    let ports: Vec<u16> = free_addrs(4).iter().map(|address| address.port()).collect();
    let peers = format!("127.0.0.1:{}@127.0.0.1:{},127.0.0.1:{}@127.0.0.1:{}", ports[0], ports[1], ports[2], ports[3]);
    let nodes: Vec<Server> = (0..2)
        .map(|index| {
            // An epoch file at the last epoch, as after a million promotions
            // (or a forged peer, before --peer-secret-file).
            let data = Arc::new(DataDir::new());
            std::fs::create_dir_all(&data.0).unwrap();
            std::fs::write(data.0.join("epoch"), format!("{EPOCH_MAX}\n")).unwrap();
            let listen = format!("127.0.0.1:{}", ports[2 * index]);
            let node = index.to_string();
            let args = [
                "--peers",
                &peers,
                "--node",
                &node,
                "--listen",
                &listen,
                "--metrics-listen",
                "127.0.0.1:0",
                "--heartbeat-ms",
                "50",
                "--failover-ms",
                "300",
            ];
            Server::start_in(data, &args)
        })
        .collect();

    // Node 0 wins the election and cannot promote.
    let node = &nodes[0];
    let mut conn = node.connect();
    wait_until("node 0 reports why it cannot serve in S", || conn.call("S").contains("\"blocked\""));
    let stats = conn.call("S");
    assert!(
        stats.contains(&format!("\"blocked\":{{\"reason\":\"epoch_space_exhausted\",\"highest_epoch\":{EPOCH_MAX}}}")),
        "{stats}"
    );
    assert_eq!(conn.call("P"), "P standby 0 -", "no active");
    let metrics = metrics_address(node);
    let (status, body) = http_get(metrics, "/readyz");
    assert_eq!(status, 503, "{body}");
    assert!(body.starts_with("blocked: the epoch space is exhausted"), "{body}");
    let scraped = scrape(metrics);
    assert_eq!(scraped.get("ringlock_blocked{reason=\"epoch_space_exhausted\"}"), Some(&1.0), "{scraped:?}");
    let log = node.log();
    assert!(
        log.lines().any(|line| line.contains("ERROR") && line.contains("cannot serve: the epoch space is exhausted")),
        "{log}"
    );

    // A node that can serve shows no reason.
    let single = Server::start(&["--metrics-listen", "127.0.0.1:0"]);
    let mut conn = single.connect();
    assert!(!conn.call("S").contains("\"blocked\""));
    assert_eq!(http_get(metrics_address(&single), "/readyz").0, 200);
}
