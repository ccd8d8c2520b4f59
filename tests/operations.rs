//! What operators use, on real server processes: `/metrics` counters that
//! move exactly with known traffic, `/readyz` through a promotion and a
//! stop, `I` on held, free and queued keys, the hot keys, and
//! `ringlock-cli run`.
//!
//! Every wait polls for an event with a deadline; nothing asserts a timing.

mod cluster_support;
mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use common::{Conn, Server, http_get as get, metrics_address, scrape, token_of, wait_until};

fn sample(samples: &HashMap<String, f64>, series: &str) -> f64 {
    *samples.get(series).unwrap_or_else(|| panic!("no sample {series}"))
}

#[test]
fn metrics_counters_move_exactly_with_known_traffic() {
    let server = Server::start(&["--metrics-listen", "127.0.0.1:0"]);
    let metrics = metrics_address(&server);
    let before = scrape(metrics);
    assert_eq!(sample(&before, "ringlock_build_info{version=\"0.1.0\"}"), 1.0);
    assert_eq!(sample(&before, "ringlock_role{role=\"active\"}"), 1.0);

    let mut first = server.connect();
    let mut second = server.connect();
    // An immediate grant; a queued acquire handed the key on release.
    let token = first.acquire("k", "30", "0");
    second.request("A k 30 0");
    first.request("X k 1 30"); // a token that does not hold k: not-holder
    assert_eq!(first.line(), "E X k not-holder");
    assert_eq!(first.call(&format!("R k {token}")), "R k");
    let handed = token_of(&second.line(), "k");
    assert_eq!(second.call(&format!("X k {handed} 30")), format!("X k {handed}"));
    // A grant with a short lease that expires and goes to the waiter.
    let short = first.acquire("e", "0.05", "0");
    assert!(short > 0);
    second.request("A e 30 0");
    let after_expiry = token_of(&second.line(), "e");
    // A wait that runs out while `e` is held.
    assert_eq!(first.call("A e 30 0.05"), "T e");
    // A line that names no operation, an inspection, a ping.
    assert_eq!(first.call("Q"), "E - - bad-op");
    assert!(first.call("I e").starts_with(&format!("I e {after_expiry} ")));
    assert!(first.call("P").starts_with("P active"));

    let mut after = HashMap::new();
    wait_until("the ping to be counted", || {
        after = scrape(metrics);
        sample(&after, "ringlock_requests_total{op=\"ping\",result=\"ok\"}") > 0.0
    });
    let moved = |series: &str| sample(&after, series) - sample(&before, series);
    let expected = [
        ("ringlock_requests_total{op=\"acquire\",result=\"ok\"}", 4.0),
        ("ringlock_requests_total{op=\"acquire\",result=\"timeout\"}", 1.0),
        ("ringlock_requests_total{op=\"release\",result=\"ok\"}", 1.0),
        ("ringlock_requests_total{op=\"extend\",result=\"ok\"}", 1.0),
        ("ringlock_requests_total{op=\"extend\",result=\"error\"}", 1.0),
        ("ringlock_requests_total{op=\"inspect\",result=\"ok\"}", 1.0),
        ("ringlock_requests_total{op=\"ping\",result=\"ok\"}", 1.0),
        ("ringlock_requests_total{op=\"none\",result=\"error\"}", 1.0),
        ("ringlock_errors_total{code=\"not-holder\"}", 1.0),
        ("ringlock_errors_total{code=\"bad-op\"}", 1.0),
        ("ringlock_grants_total{how=\"immediate\"}", 2.0),
        ("ringlock_grants_total{how=\"handoff\"}", 1.0),
        ("ringlock_grants_total{how=\"expiry\"}", 1.0),
        ("ringlock_grants_total{how=\"token_wait\"}", 0.0),
        ("ringlock_releases_total", 1.0),
        ("ringlock_lease_expirations_total", 1.0),
        ("ringlock_extensions_total", 1.0),
        ("ringlock_wait_timeouts_total", 1.0),
        ("ringlock_acquire_wait_seconds_count{outcome=\"granted\"}", 4.0),
        ("ringlock_acquire_wait_seconds_count{outcome=\"timed_out\"}", 1.0),
        ("ringlock_hold_seconds_count{end=\"release\"}", 1.0),
        ("ringlock_hold_seconds_count{end=\"expiry\"}", 1.0),
        ("ringlock_connections_accepted_total", 2.0),
    ];
    for (series, count) in expected {
        assert_eq!(moved(series), count, "{series}");
    }
    // The two immediate grants waited 0 s: in the first bucket (a hand-off
    // made within a millisecond of its acquire may join them).
    let first_bucket = moved("ringlock_acquire_wait_seconds_bucket{outcome=\"granted\",le=\"0.001\"}");
    assert!(first_bucket >= 2.0, "immediate grants wait 0 s: {first_bucket}");
    assert_eq!(moved("ringlock_acquire_wait_seconds_bucket{outcome=\"granted\",le=\"+Inf\"}"), 4.0);
    assert_eq!(sample(&after, "ringlock_held_keys{shard=\"0\"}"), 2.0, "k and e are held");
    assert_eq!(sample(&after, "ringlock_waiters{shard=\"0\"}"), 0.0);
    assert_eq!(sample(&after, "ringlock_connections{shard=\"0\"}"), 2.0);
}

#[test]
fn each_shard_publishes_the_turn_share_it_gives_and_the_request_cost_it_follows() {
    let server = Server::start(&["--metrics-listen", "127.0.0.1:0", "--requests-per-turn", "40"]);
    let metrics = metrics_address(&server);
    let before = scrape(metrics);
    assert_eq!(sample(&before, "ringlock_turn_share{shard=\"0\"}"), 40.0, "the flag, before any busy turn");
    assert_eq!(sample(&before, "ringlock_request_cost_seconds{shard=\"0\"}"), 0.0, "nothing measured yet");
    // Thousands of pipelined requests: many turns of a full share each, all
    // answered in order.
    let mut conn = server.connect();
    let lines: String = (0..5_000).map(|n| format!("I key-{n}\n")).collect();
    conn.send(lines.as_bytes());
    for n in 0..5_000 {
        assert_eq!(conn.line(), format!("I key-{n} - 0 0"), "a free key");
    }
    let mut after = HashMap::new();
    wait_until("a measured turn to be published", || {
        after = scrape(metrics);
        sample(&after, "ringlock_request_cost_seconds{shard=\"0\"}") > 0.0
    });
    // An inspection costs far less than the 500 ns that would lower a
    // share of 40 (20 µs a connection's part of a turn), but a busy host
    // may have stretched a turn: the share stays between 16 and the flag.
    let share = sample(&after, "ringlock_turn_share{shard=\"0\"}");
    assert!((16.0..=40.0).contains(&share), "share {share}");
}

#[test]
fn refused_connections_are_counted_by_limit() {
    let server = Server::start(&["--metrics-listen", "127.0.0.1:0", "--max-connections", "1"]);
    let metrics = metrics_address(&server);
    let mut kept = server.connect();
    assert!(kept.call("P").starts_with("P active"));
    let mut refused = server.connect();
    assert_eq!(refused.line(), "E - - too-many-connections");
    wait_until("the refusal to be counted", || {
        sample(&scrape(metrics), "ringlock_connections_refused_total{reason=\"max_connections\"}") == 1.0
    });
    let samples = scrape(metrics);
    assert_eq!(sample(&samples, "ringlock_connections_refused_total{reason=\"per_ip\"}"), 0.0);
    assert_eq!(sample(&samples, "ringlock_errors_total{code=\"too-many-connections\"}"), 1.0);
}

#[test]
fn the_endpoint_answers_health_and_refuses_what_it_does_not_serve() {
    let server = Server::start(&["--metrics-listen", "127.0.0.1:0"]);
    let metrics = metrics_address(&server);
    assert_eq!(get(metrics, "/livez"), (200, "ok\n".to_string()));
    assert_eq!(get(metrics, "/readyz"), (200, "ready\n".to_string()));
    assert_eq!(get(metrics, "/nothing").0, 404);
    let mut stream = TcpStream::connect(metrics).unwrap();
    stream.write_all(b"POST /metrics HTTP/1.1\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 405"), "{response}");
    // A request head that never ends is cut off, and the endpoint goes on.
    let mut stream = TcpStream::connect(metrics).unwrap();
    let _ = stream.write_all(&vec![b'x'; 20_000]);
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    assert!(response.is_empty() || response.starts_with("HTTP/1.1 431"), "{response}");
    assert_eq!(get(metrics, "/livez").0, 200);
}

#[test]
fn a_client_that_trickles_its_request_neither_delays_readyz_nor_keeps_its_connection() {
    let server = Server::start(&["--metrics-listen", "127.0.0.1:0"]);
    let metrics = metrics_address(&server);
    // A request head sent a byte every 100 ms: each read is quick, the head
    // never ends (about 100 bytes over the ten seconds it keeps trying).
    let mut slow = TcpStream::connect(metrics).unwrap();
    slow.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let trickle = std::thread::spawn(move || {
        for sent in 0..100 {
            if slow.write_all(b"x").is_err() {
                return Some(sent);
            }
            let mut byte = [0u8; 1];
            match slow.read(&mut byte) {
                Ok(0) => return Some(sent),
                Err(error) if error.kind() != std::io::ErrorKind::WouldBlock => return Some(sent),
                _ => {}
            }
        }
        None
    });
    std::thread::sleep(Duration::from_millis(300));
    // Probes are answered while the slow client is still sending.
    assert_eq!(get(metrics, "/readyz"), (200, "ready\n".to_string()));
    assert!(!trickle.is_finished(), "/readyz was answered only after the slow client gave up");
    // And the slow client is cut off, long before its head could fill the limit.
    let cut_after = trickle.join().unwrap();
    assert!(cut_after.is_some(), "the endpoint kept a connection that trickled 100 bytes");
}

/// Whether the endpoint closed `stream` (which sent nothing): a read finds
/// its end, or a reset, rather than waiting.
fn closed_by_endpoint(mut stream: &TcpStream) -> bool {
    stream.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
    !matches!(
        stream.read(&mut [0u8; 1]),
        Err(error) if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
    )
}

/// Opens a connection to `metrics`, and again each time the endpoint closes
/// it (after its 2 s for a request head), until `stop`; each sends nothing,
/// or a byte every 20 ms if `trickle`. Counts in `opened` the connections
/// opened.
fn reopen_until(metrics: SocketAddr, trickle: bool, opened: &AtomicU32, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut stream) = TcpStream::connect(metrics) else { continue };
        opened.fetch_add(1, Ordering::Relaxed);
        let _ = stream.set_read_timeout(Some(Duration::from_millis(20)));
        while !stop.load(Ordering::Relaxed) {
            if trickle && stream.write_all(b"G").is_err() {
                break;
            }
            match stream.read(&mut [0u8; 1]) {
                Err(error) if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                }
                _ => break,
            }
        }
    }
}

#[test]
fn connections_that_send_nothing_never_keep_probes_unanswered() {
    let server = Server::start(&["--metrics-listen", "127.0.0.1:0"]);
    let metrics = metrics_address(&server);
    // Three times as many silent connections as the endpoint serves at
    // once (64), all held open: a probe takes the place of the oldest.
    let silent: Vec<TcpStream> = (0..192).map(|_| TcpStream::connect(metrics).unwrap()).collect();
    for _ in 0..10 {
        assert_eq!(get(metrics, "/readyz"), (200, "ready\n".to_string()));
        assert_eq!(get(metrics, "/livez"), (200, "ok\n".to_string()));
    }
    let closed = silent.iter().filter(|stream| closed_by_endpoint(stream)).count();
    assert!(closed >= 192 - 64, "the endpoint closed {closed} of 192 silent connections");
    drop(silent);
    // Twenty loops that reopen a connection as soon as theirs is closed,
    // sending nothing, and twenty that trickle a request a byte at a time,
    // while probes come.
    let (opened, stop) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicBool::new(false)));
    let reopeners: Vec<_> = (0..40)
        .map(|each| {
            let (opened, stop) = (opened.clone(), stop.clone());
            std::thread::spawn(move || reopen_until(metrics, each % 2 == 1, &opened, &stop))
        })
        .collect();
    wait_until("forty connections opened", || opened.load(Ordering::Relaxed) >= 40);
    for _ in 0..30 {
        assert_eq!(get(metrics, "/readyz"), (200, "ready\n".to_string()));
    }
    stop.store(true, Ordering::Relaxed);
    for thread in reopeners {
        thread.join().unwrap();
    }
    // The node serves locks throughout.
    let mut conn = server.connect();
    assert!(conn.acquire("k", "5", "0") > 0);
}

#[test]
fn a_probe_is_not_the_connection_taken_over_while_older_ones_trickle() {
    let server = Server::start(&["--metrics-listen", "127.0.0.1:0"]);
    let metrics = metrics_address(&server);
    // Every place held by a connection that sent one byte of a request.
    let trickling: Vec<TcpStream> = (0..64)
        .map(|_| {
            let mut stream = TcpStream::connect(metrics).unwrap();
            stream.write_all(b"G").unwrap();
            stream
        })
        .collect();
    // A probe connects; before its request arrives, one more connection
    // comes and takes a place: the oldest trickling one's, not the probe's.
    let mut probe = TcpStream::connect(metrics).unwrap();
    let mut newer = TcpStream::connect(metrics).unwrap();
    newer.write_all(b"G").unwrap();
    wait_until("a connection closed by the endpoint", || {
        closed_by_endpoint(&probe) || trickling.iter().any(closed_by_endpoint)
    });
    assert!(closed_by_endpoint(&trickling[0]), "the oldest trickling connection was kept");
    probe.set_read_timeout(None).unwrap();
    write!(probe, "GET /readyz HTTP/1.1\r\nHost: ringlock\r\n\r\n").unwrap();
    let mut response = String::new();
    probe.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response:?}");
}

#[test]
fn a_flood_of_valid_scrapes_is_answered_whole_and_probes_still_pass() {
    let server = Server::start(&["--metrics-listen", "127.0.0.1:0"]);
    let metrics = metrics_address(&server);
    let scrapers: Vec<_> = (0..8)
        .map(|_| std::thread::spawn(move || (0..100).map(|_| get(metrics, "/metrics").0).collect::<Vec<_>>()))
        .collect();
    for _ in 0..20 {
        assert_eq!(get(metrics, "/livez").0, 200);
    }
    for scraper in scrapers {
        let statuses = scraper.join().unwrap();
        assert!(statuses.iter().all(|&status| status == 200), "{statuses:?}");
    }
    // A head of exactly the limit with no end is refused; the endpoint goes on.
    let mut stream = TcpStream::connect(metrics).unwrap();
    let _ = stream.write_all(&vec![b'x'; 8 << 10]);
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    assert!(response.starts_with("HTTP/1.1 431"), "{response}");
    assert_eq!(get(metrics, "/readyz"), (200, "ready\n".to_string()));
}

#[test]
fn readyz_fails_once_a_stop_signal_comes_and_the_node_serves_through_the_drain() {
    let mut server = Server::start(&["--metrics-listen", "127.0.0.1:0", "--drain-ms", "600000"]);
    let metrics = metrics_address(&server);
    assert_eq!(get(metrics, "/readyz").0, 200);
    server.signal("TERM");
    wait_until("/readyz to answer 503", || get(metrics, "/readyz").0 == 503);
    assert_eq!(get(metrics, "/readyz").1, "stopping\n");
    assert_eq!(get(metrics, "/livez").0, 200, "a draining node is alive");
    assert_eq!(sample(&scrape(metrics), "ringlock_ready"), 0.0);
    // Still serving locks while draining.
    let mut conn = server.connect();
    let token = conn.acquire("during-drain", "30", "0");
    assert_eq!(conn.call(&format!("R during-drain {token}")), "R during-drain");
    // A second signal ends the drain at once.
    assert!(server.stop("TERM").success());
}

#[test]
fn readyz_flips_when_a_standby_promotes() {
    // Node 1 of a two-node cluster starts alone: a standby with no table
    // (not ready) until it decides that node 0 is gone and promotes.
    let port = || format!("127.0.0.1:{}", cluster_support::free_port());
    let (clients, peer_ports): (Vec<String>, Vec<String>) = (0..2).map(|_| (port(), port())).unzip();
    let peers: Vec<String> = clients.iter().zip(&peer_ports).map(|(client, peer)| format!("{client}@{peer}")).collect();
    let peers = peers.join(",");
    let server = Server::start(&[
        "--listen",
        &clients[1],
        "--peers",
        &peers,
        "--node",
        "1",
        "--cluster-listen",
        &peer_ports[1],
        "--failover-ms",
        "6000",
        "--heartbeat-ms",
        "100",
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let metrics = metrics_address(&server);
    // Asked at once, well within the failover timeout: still a standby.
    let (status, body) = get(metrics, "/readyz");
    assert_eq!(status, 503, "a standby without a table is not ready: {body}");
    assert!(body.starts_with("catching up"), "{body}");
    let mut conn = server.connect();
    wait_until("node 1 to promote", || conn.call("P").starts_with("P active"));
    wait_until("/readyz to answer 200", || get(metrics, "/readyz").0 == 200);
    let samples = scrape(metrics);
    assert_eq!(sample(&samples, "ringlock_role{role=\"active\"}"), 1.0);
    assert_eq!(sample(&samples, "ringlock_failovers_total"), 1.0);
    assert_eq!(sample(&samples, "ringlock_replication_caught_up"), 1.0);
    assert!(sample(&samples, "ringlock_epoch") > 0.0);
}

#[test]
fn inspect_answers_for_free_held_and_queued_keys() {
    let server = Server::start(&["--shards", "2"]);
    let mut holder = server.connect();
    let mut waiter = server.connect();
    assert_eq!(holder.call("I free-key"), "I free-key - 0 0");
    let token = holder.acquire("busy", "30", "0");
    let held = holder.call("I busy");
    let fields: Vec<&str> = held.split(' ').collect();
    assert_eq!(fields[..3], ["I", "busy", &token.to_string()[..]], "{held}");
    let lease_left: u64 = fields[3].parse().unwrap();
    assert!(lease_left > 0 && lease_left <= 30_000, "{held}");
    assert_eq!(fields[4], "0");
    waiter.request("A busy 30 0");
    wait_until("the waiter to be queued", || holder.call("I busy").ends_with(" 1"));
    assert_eq!(holder.call(&format!("R busy {token}")), "R busy");
    let next = token_of(&waiter.line(), "busy");
    assert!(holder.call("I busy").starts_with(&format!("I busy {next} ")));
    // Errors name the operation; a malformed I changes nothing.
    assert_eq!(holder.call("I"), "E I - bad-request");
    assert_eq!(holder.call("I a b"), "E I a bad-request");
}

#[test]
fn a_standby_redirects_inspect_to_the_active() {
    let cluster = cluster_support::Cluster::start(cluster_support::ClusterOptions::default());
    let (active, _) = cluster.wait_single_active("one active");
    let standby = (0..cluster.nodes.len()).find(|&index| index != active).unwrap();
    let mut conn = cluster.node(standby).connect();
    let active_address = cluster.addresses()[active].clone();
    wait_until("the standby to name the active", || conn.call("I k") == format!("M I k {active_address}"));
}

#[test]
fn hot_keys_name_the_key_everyone_queues_on() {
    let server = Server::start(&["--metrics-listen", "127.0.0.1:0"]);
    let metrics = metrics_address(&server);
    let mut holder = server.connect();
    let mut waiters: Vec<Conn> = (0..3).map(|_| server.connect()).collect();
    for _ in 0..3 {
        let token = holder.acquire("queue/hot", "30", "0");
        // Queued one at a time, so that the queue's order is known.
        for (index, waiter) in waiters.iter_mut().enumerate() {
            waiter.request("A queue/hot 30 0");
            let queued = format!(" {}", index + 1);
            wait_until("the acquire to be queued", || holder.call("I queue/hot").ends_with(&queued));
        }
        assert_eq!(holder.call(&format!("R queue/hot {token}")), "R queue/hot");
        for waiter in &mut waiters {
            let token = token_of(&waiter.line(), "queue/hot");
            assert_eq!(waiter.call(&format!("R queue/hot {token}")), "R queue/hot");
        }
    }
    // 9 waits and 9 hand-offs on queue/hot, one quiet key beside it.
    holder.acquire("queue/quiet", "30", "0");
    wait_until("the hot keys to be published", || {
        let samples = scrape(metrics);
        samples.get("ringlock_hot_key_waits{key=\"queue/hot\"}") == Some(&9.0)
            && samples.get("ringlock_hot_key_handoffs{key=\"queue/hot\"}") == Some(&9.0)
    });
    let stats = holder.call("S");
    assert!(stats.contains("\"hot_keys\":{\"waits\":[{\"key\":\"queue/hot\",\"count\":9}]"), "{stats}");
    assert!(stats.contains("\"handoffs\":[{\"key\":\"queue/hot\",\"count\":9}]"), "{stats}");
}

fn cli() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ringlock-cli"))
}

#[test]
fn cli_run_passes_the_token_and_releases_when_the_command_ends() {
    let server = Server::start(&[]);
    let servers = server.addr.to_string();
    let mut conn = server.connect();
    let output = cli()
        .args(["--servers", &servers, "run", "--key", "cron/job", "--lease", "30", "--"])
        .args(["sh", "-c", "echo token=$RINGLOCK_TOKEN key=$RINGLOCK_KEY"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let token: u64 = stdout.trim().strip_prefix("token=").unwrap().split(' ').next().unwrap().parse().unwrap();
    assert!(stdout.trim().ends_with("key=cron/job"), "{stdout}");
    assert_eq!(conn.call("I cron/job"), "I cron/job - 0 0", "released on exit");
    // The next holder gets a greater token: the lock was really held.
    assert!(conn.acquire("cron/job", "30", "0") > token);
}

#[test]
fn cli_run_releases_and_returns_the_status_of_a_failing_command() {
    let server = Server::start(&[]);
    let servers = server.addr.to_string();
    let mut conn = server.connect();
    let status = cli()
        .args(["--servers", &servers, "run", "--key", "cron/failing", "--lease", "30", "--"])
        .args(["sh", "-c", "test -n \"$RINGLOCK_TOKEN\" && exit 7"])
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(7));
    assert_eq!(conn.call("I cron/failing"), "I cron/failing - 0 0", "released after a failure");
    // While someone holds the key, a run with a bounded wait does not start
    // its command and says so.
    let token = conn.acquire("cron/failing", "30", "0");
    let output = cli()
        .args(["--servers", &servers, "run", "--key", "cron/failing", "--lease", "30", "--wait", "0.05", "--"])
        .args(["sh", "-c", "echo ran"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(75), "{output:?}");
    assert!(output.stdout.is_empty(), "the command did not run");
    assert_eq!(conn.call("I cron/failing").split(' ').nth(2), Some(&token.to_string()[..]));
}

#[test]
fn cli_run_keeps_the_lock_past_its_lease_while_the_command_runs() {
    let server = Server::start(&[]);
    let servers = server.addr.to_string();
    let mut conn = server.connect();
    // The command waits until the test has seen its lease extended three
    // times (each a third of the lease apart): the lock outlived its first
    // lease, under the same token, only through the background extension.
    let flag = common::DataDir::new();
    std::fs::create_dir_all(&flag.0).unwrap();
    let go = flag.0.join("go");
    let mut child = cli()
        .args(["--servers", &servers, "run", "--key", "long/job", "--lease", "1", "--"])
        .args(["sh", "-c", &format!("while [ ! -e {} ]; do sleep 0.05; done", go.display())])
        .spawn()
        .unwrap();
    let mut first = None;
    wait_until("the run to hold the lock", || {
        let reply = conn.call("I long/job");
        first = reply.split(' ').nth(2).and_then(|token| token.parse::<u64>().ok());
        first.is_some()
    });
    let extensions = || {
        let stats = conn_stats(&server);
        stats.split("\"extends\":").nth(1).and_then(|rest| rest.split(',').next()).and_then(|n| n.parse::<u64>().ok())
    };
    wait_until("three extensions", || extensions().is_some_and(|count| count >= 3));
    assert_eq!(conn.call("I long/job").split(' ').nth(2), first.map(|token| token.to_string()).as_deref());
    std::fs::write(&go, b"").unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(conn.call("I long/job"), "I long/job - 0 0");
}

fn conn_stats(server: &Server) -> String {
    server.connect().call("S")
}

#[test]
fn cli_acquire_and_release_hold_a_lock_across_commands() {
    let server = Server::start(&[]);
    let servers = server.addr.to_string();
    let output = cli().args(["--servers", &servers, "acquire", "deploy", "--lease", "30"]).output().unwrap();
    assert!(output.status.success(), "{output:?}");
    let token: u64 = String::from_utf8(output.stdout).unwrap().trim().parse().unwrap();
    let mut conn = server.connect();
    assert!(conn.call("I deploy").starts_with(&format!("I deploy {token} ")), "held after the tool exited");
    let inspect = cli().args(["--servers", &servers, "inspect", "deploy"]).output().unwrap();
    let shown = String::from_utf8(inspect.stdout).unwrap();
    assert!(shown.starts_with(&format!("deploy held token={token} ")), "{shown}");
    let release = cli().args(["--servers", &servers, "release", "deploy", &token.to_string()]).status().unwrap();
    assert!(release.success());
    let again = cli().args(["--servers", &servers, "release", "deploy", &token.to_string()]).status().unwrap();
    assert_eq!(again.code(), Some(4), "nothing left to release");
    let ping = cli().args(["--servers", &servers, "ping"]).output().unwrap();
    assert!(String::from_utf8(ping.stdout).unwrap().starts_with(&format!("{servers} active ")));
    let stats = cli().args(["--servers", &servers, "stats"]).output().unwrap();
    assert!(String::from_utf8(stats.stdout).unwrap().contains("\n  \"role\": \"active\",\n"));
}

#[test]
fn systemd_is_told_ready_once_serving_and_stopping_on_a_signal() {
    let directory = common::DataDir::new();
    std::fs::create_dir_all(&directory.0).unwrap();
    let path = directory.0.join("notify.sock");
    let socket = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    socket.set_read_timeout(Some(common::PATIENCE)).unwrap();
    let path = path.to_str().unwrap().to_string();
    let mut server = Server::start_with_env(&[("NOTIFY_SOCKET", &path)], &[]);
    let mut buffer = [0u8; 256];
    let read = socket.recv(&mut buffer).expect("READY=1 from the server");
    let ready = String::from_utf8_lossy(&buffer[..read]).to_string();
    assert!(ready.starts_with("READY=1\nSTATUS=serving clients on "), "{ready}");
    // Ready means serving: a request is answered at once.
    assert!(server.connect().call("P").starts_with("P active"));
    server.signal("TERM");
    let read = socket.recv(&mut buffer).expect("STOPPING=1 from the server");
    assert!(String::from_utf8_lossy(&buffer[..read]).starts_with("STOPPING=1"));
    assert!(server.stop_after_signal().success());
}

#[test]
fn cli_takes_several_servers_and_uses_the_one_that_answers() {
    let server = Server::start(&[]);
    // The first address has nothing listening.
    let nobody = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let servers = format!("{nobody},{}", server.addr);
    let acquired = cli().args(["--servers", &servers, "acquire", "cli/several", "--lease", "30"]).output().unwrap();
    assert!(acquired.status.success(), "{acquired:?}");
    let token: u64 = String::from_utf8(acquired.stdout).unwrap().trim().parse().unwrap();
    let mut conn = server.connect();
    assert!(conn.call("I cli/several").starts_with(&format!("I cli/several {token} ")));
    let ran = cli().args(["--servers", &servers, "run", "--key", "cli/run", "--lease", "30", "--", "true"]).status();
    assert!(ran.unwrap().success());
    assert_eq!(conn.call("I cli/run"), "I cli/run - 0 0", "held and released by run");
    let released = cli().args(["--servers", &servers, "release", "cli/several", &token.to_string()]).status();
    assert!(released.unwrap().success());
    assert_eq!(conn.call("I cli/several"), "I cli/several - 0 0");
}

#[test]
fn cli_gives_up_after_its_connect_limit_naming_the_address_and_its_error() {
    let nobody = common::RefusingPort::new();
    let address = nobody.addr.to_string();
    let pinged = cli().args(["--servers", &address, "--connect-limit", "0.3", "ping"]).output().unwrap();
    assert_eq!(pinged.status.code(), Some(1), "{pinged:?}");
    let said = String::from_utf8_lossy(&pinged.stderr);
    assert!(said.contains("no usable connection after 0."), "{said}");
    assert!(said.contains(&format!("{address} (connection refused)")), "{said}");
}

#[test]
fn cli_authenticates_with_the_secret_from_the_environment_and_names_a_refused_one() {
    let secret = "cli-4f1a9c0e7b2d5863";
    let digest: String = ring::digest::digest(&ring::digest::SHA256, secret.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let dir = common::DataDir::new();
    std::fs::create_dir_all(&dir.0).unwrap();
    let auth = dir.0.join("auth");
    std::fs::write(&auth, format!("cron {digest} cron/*\n")).unwrap();
    let server = Server::start(&["--auth-file", auth.to_str().unwrap()]);
    let servers = server.addr.to_string();
    let acquire = ["--servers", &servers, "--connect-limit", "1", "acquire", "cron/job", "--lease", "30"];
    let output = cli().args(acquire).env("RINGLOCK_SECRET", secret).output().unwrap();
    assert!(output.status.success(), "{output:?}");
    let token = String::from_utf8(output.stdout).unwrap().trim().to_string();
    let output = cli()
        .args(["--servers", &servers, "release", "cron/job", &token])
        .env("RINGLOCK_SECRET", secret)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    // The flag wins over the environment; a refused secret is named by its
    // address and code, and never printed.
    let output =
        cli().args(["--secret", "wrong-secret-1"]).args(acquire).env("RINGLOCK_SECRET", secret).output().unwrap();
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains(&format!("{servers} refused the client's secret: auth-failed")), "{stderr}");
    assert!(!stderr.contains("wrong-secret-1") && !stderr.contains(secret), "{stderr}");
    let help = String::from_utf8(cli().arg("--help").env("RINGLOCK_SECRET", secret).output().unwrap().stdout).unwrap();
    assert!(help.contains("RINGLOCK_SECRET") && !help.contains(secret), "{help}");
}

#[test]
fn cli_reload_signals_the_server_of_a_data_dir_and_reports_what_was_taken_or_refused() {
    let secret = |text: &str| -> String {
        ring::digest::digest(&ring::digest::SHA256, text.as_bytes())
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let files = common::DataDir::new();
    std::fs::create_dir_all(&files.0).unwrap();
    let auth = files.0.join("auth");
    std::fs::write(&auth, format!("app {} *\n", secret("first-secret-31c9"))).unwrap();
    let server = Server::start(&["--auth-file", auth.to_str().unwrap(), "--metrics-listen", "127.0.0.1:0"]);
    let metrics = metrics_address(&server).to_string();
    let data_dir = server.data_dir();
    let data_dir = data_dir.0.to_str().unwrap();
    let mut conn = Conn::connect(server.addr);
    assert_eq!(conn.call("U first-secret-31c9"), "U app");

    // A second secret for the name: taken, and new connections may use it.
    std::fs::write(&auth, format!("app {} *\napp {} *\n", secret("first-secret-31c9"), secret("second-secret-7a0e")))
        .unwrap();
    let output = cli().args(["reload", "--data-dir", data_dir, "--metrics", &metrics]).output().unwrap();
    assert!(output.status.success(), "{output:?}");
    assert_eq!(String::from_utf8(output.stdout).unwrap(), "the auth file: reloaded\n");
    assert_eq!(Conn::connect(server.addr).call("U second-secret-7a0e"), "U app");

    // A file that does not parse: refused, exit 1, the one in force stays.
    std::fs::write(&auth, "app not-a-digest *\n").unwrap();
    let output = cli().args(["reload", "--data-dir", data_dir, "--metrics", &metrics]).output().unwrap();
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(String::from_utf8(output.stdout).unwrap().contains("the auth file: refused"));
    assert_eq!(Conn::connect(server.addr).call("U second-secret-7a0e"), "U app");
    assert_eq!(conn.call("P").split(' ').next(), Some("P"), "the first connection is untouched");

    // Without --metrics the signal is sent and the tool says so.
    let output = cli().args(["reload", "--data-dir", data_dir]).output().unwrap();
    assert!(output.status.success(), "{output:?}");
    assert!(String::from_utf8(output.stdout).unwrap().starts_with("SIGHUP sent to process"));

    // A data directory no server runs from is named as such.
    let idle = common::DataDir::new();
    std::fs::create_dir_all(&idle.0).unwrap();
    std::fs::write(idle.0.join("lock"), "1\n").unwrap();
    let output = cli().args(["reload", "--data-dir", idle.0.to_str().unwrap()]).output().unwrap();
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("no ringlock server runs from"), "{output:?}");
}
