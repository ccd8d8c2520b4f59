//! `--min-standbys 1` closes the split-brain window of a partition: the
//! active is cut off from its standbys at a router (packets lost, no
//! reset) while a client on its own host keeps acquiring and releasing
//! keys with short leases, and a client on the other side does the same
//! with whichever node is active there; then the cut heals. Every grant is
//! recorded with the time its request left and its reply arrived; no two
//! clients may hold one key at the same time by their leases, and no key's
//! token may go down. (Without the flag the same schedule shows both; see
//! `scripts/partition-heal.sh --clients 2`.)

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Conn;
use common::netns::{Cut, Network};

const KEYS: [&str; 4] = ["k0", "k1", "k2", "k3"];
const LEASE: Duration = Duration::from_millis(400);
const LEASE_ARG: &str = "0.4";
/// Longer than any reply of a reachable node takes: a held reply is
/// answered `no-standby` within about the failover timeout (300 ms), or `M`
/// when its node steps down. A client that waits longer is cut off from
/// its node and starts again from the one on its own host.
const REPLY_WAIT: Duration = Duration::from_secs(1);
/// How long node 0 stays cut off: many failover periods.
const PARTITION: Duration = Duration::from_secs(3);

/// One grant as its client saw it.
#[derive(Clone, Debug)]
struct Grant {
    worker: usize,
    key: &'static str,
    token: u64,
    /// When the reply arrived: the client holds the key from then.
    received: Instant,
    /// Until the client sent its release, or its lease ran out counted
    /// from when it sent the acquire, whichever came first.
    end: Instant,
    /// The node that answered.
    node: SocketAddr,
}

/// Two grants of one key that break a rule, the earlier first.
type Pairs = Vec<(Grant, Grant)>;

#[derive(Default)]
struct Record {
    grants: Vec<Grant>,
    refusals: usize,
}

/// A client on host `host` that acquires (no wait) and releases keys
/// through the node at `home` (on its host), following `M` to the active,
/// until `stop`.
fn worker(
    network: Arc<Network>,
    host: usize,
    worker: usize,
    home: SocketAddr,
    stop: Arc<AtomicBool>,
    record: Arc<Mutex<Record>>,
) {
    let mut target = home;
    let mut conn: Option<Conn> = None;
    let mut random = 0x9e37_79b9_7f4a_7c15u64 ^ (worker as u64 + 1);
    let mut next = move || {
        random ^= random << 13;
        random ^= random >> 7;
        random ^= random << 17;
        random
    };
    while !stop.load(Ordering::SeqCst) {
        let stream = match conn.as_mut() {
            Some(stream) => stream,
            None => {
                let address = target;
                conn = Some(Conn::from_stream(network.connect(host, address)));
                conn.as_mut().unwrap()
            }
        };
        let key = KEYS[(next() % KEYS.len() as u64) as usize];
        let sent = Instant::now();
        stream.request(&format!("A {key} {LEASE_ARG} 0"));
        let Some(reply) = stream.try_line(REPLY_WAIT) else {
            (conn, target) = (None, home);
            continue;
        };
        let fields: Vec<&str> = reply.split(' ').collect();
        match fields.as_slice() {
            ["A", granted, token] if *granted == key => {
                let received = Instant::now();
                let token: u64 = token.parse().unwrap();
                // Mostly short holds; now and then one past the lease.
                let hold = if next() % 5 == 0 {
                    LEASE + Duration::from_millis(100)
                } else {
                    Duration::from_millis(next() % 60)
                };
                std::thread::sleep(hold);
                let release_sent = Instant::now();
                stream.request(&format!("R {key} {token}"));
                let end = release_sent.min(sent + LEASE);
                record.lock().unwrap().grants.push(Grant { worker, key, token, received, end, node: target });
                if stream.try_line(REPLY_WAIT).is_none() {
                    (conn, target) = (None, home);
                }
            }
            ["M", _, _, active] => {
                if let Ok(active) = active.parse() {
                    target = active;
                }
                conn = None;
                std::thread::sleep(Duration::from_millis(10));
            }
            ["E", "A", _, "no-standby"] => {
                record.lock().unwrap().refusals += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            _ => panic!("worker {worker}: unexpected reply {reply:?}"),
        }
    }
}

/// Pairs of grants of one key held by two clients at once, and grants
/// whose token is not above every earlier grant of the key (by arrival).
fn violations(grants: &[Grant]) -> (Pairs, Pairs) {
    let mut by_key: HashMap<&str, Vec<&Grant>> = HashMap::new();
    for grant in grants {
        by_key.entry(grant.key).or_default().push(grant);
    }
    let (mut overlaps, mut decreases) = (Vec::new(), Vec::new());
    for grants in by_key.values_mut() {
        grants.sort_by_key(|grant| grant.received);
        for (index, later) in grants.iter().enumerate() {
            for earlier in &grants[..index] {
                if earlier.received < later.end && later.received < earlier.end {
                    overlaps.push(((*earlier).clone(), (*later).clone()));
                }
            }
            if let Some(highest) = grants[..index].iter().max_by_key(|grant| grant.token)
                && later.token <= highest.token
            {
                decreases.push(((*highest).clone(), (*later).clone()));
            }
        }
    }
    (overlaps, decreases)
}

fn a_partition_with_min_standbys_gives_no_overlapping_holds(nodes: usize) {
    let Some(network) = Network::create(nodes) else { return };
    let network = Arc::new(network);
    let (addresses, servers) = network.start_nodes(&["--min-standbys", "1"]);
    let logs = || {
        servers.iter().enumerate().map(|(index, node)| format!("--- node {index}:\n{}", node.log())).collect::<String>()
    };

    // Node 0 is active and grants: a standby has caught up.
    let mut on_0 = Conn::from_stream(network.connect(0, addresses[0]));
    let deadline = Instant::now() + common::PATIENCE;
    while !on_0.call("A ready 1 0").starts_with("A ready ") {
        assert!(Instant::now() < deadline, "node 0 never granted\n{}", logs());
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut on_1 = Conn::from_stream(network.connect(1, addresses[1]));
    let deadline = Instant::now() + common::PATIENCE;
    while !on_1.call("P").starts_with("P standby ") {
        assert!(Instant::now() < deadline, "node 1 never followed\n{}", logs());
        std::thread::sleep(Duration::from_millis(20));
    }

    let stop = Arc::new(AtomicBool::new(false));
    let record = Arc::new(Mutex::new(Record::default()));
    // Two clients on node 0's host, two on node 1's.
    let workers: Vec<_> = [(0, 0), (0, 1), (1, 2), (1, 3)]
        .into_iter()
        .map(|(host, index)| {
            let (network, stop, record) = (network.clone(), stop.clone(), record.clone());
            let home = addresses[host];
            std::thread::spawn(move || worker(network, host, index, home, stop, record))
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let cut = Instant::now();
    network.cut(0, Cut::Link);
    std::thread::sleep(PARTITION);
    network.heal(0, Cut::Link);
    let healed = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::SeqCst);
    for worker in workers {
        worker.join().expect("a worker failed");
    }

    let record = record.lock().unwrap();
    let grants = &record.grants;
    let (overlaps, decreases) = violations(grants);
    let during = grants.iter().filter(|grant| grant.received > cut && grant.received < healed);
    let granted_by_0_during = during.clone().filter(|grant| grant.node == addresses[0]).count();
    let granted_elsewhere_during = during.filter(|grant| grant.node != addresses[0]).count();
    println!(
        "{nodes} nodes, --min-standbys 1, {PARTITION:?} cut: {} grants ({granted_by_0_during} by node 0 and \
         {granted_elsewhere_during} by another node during the cut), {} no-standby refusals, {} overlapping holds, \
         {} token decreases",
        grants.len(),
        record.refusals,
        overlaps.len(),
        decreases.len()
    );
    assert!(
        overlaps.is_empty(),
        "two clients held a key at once: {:?}\n{}",
        &overlaps[..overlaps.len().min(5)],
        logs()
    );
    assert!(decreases.is_empty(), "a key's token went down: {:?}\n{}", &decreases[..decreases.len().min(5)], logs());
    assert!(
        grants.iter().any(|grant| grant.received < cut && grant.worker < 2),
        "node 0's clients were granted before the cut"
    );
    assert!(grants.iter().any(|grant| grant.received > healed), "grants go on after the heal\n{}", logs());
    assert!(record.refusals > 0, "node 0, cut off, refused acquires no-standby");
    if nodes >= 3 {
        assert!(granted_elsewhere_during > 0, "the side with a standby granted during the cut\n{}", logs());
    }
    drop(servers);
}

#[test]
fn two_nodes_cut_apart_with_min_standbys_never_hold_a_key_twice() {
    a_partition_with_min_standbys_gives_no_overlapping_holds(2);
}

#[test]
fn three_nodes_with_the_active_cut_off_and_min_standbys_never_hold_a_key_twice() {
    a_partition_with_min_standbys_gives_no_overlapping_holds(3);
}
