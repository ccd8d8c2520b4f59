//! The client scenarios every official client runs (`clients/scenarios.json`,
//! docs/protocol.md §4), for the Rust client: each against the real server, with its
//! faults made by the test kit driven over its control socket, as the tests
//! of the other languages' clients drive it.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use common::Server;
use common::certs::Certificates;
use ringlock_client::proto::ErrorCode;
use ringlock_client::{Client, Error, ReleaseOutcome};

const LEASE: Duration = Duration::from_secs(60);

/// A test kit serving its control protocol on a loopback port, and one
/// control connection to it.
struct Kit {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Kit {
    fn start() -> Kit {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        thread::spawn(move || ringlock_testkit::control::Kit::default().serve(&listener));
        let writer = TcpStream::connect(address).unwrap();
        Kit { reader: BufReader::new(writer.try_clone().unwrap()), writer }
    }

    /// Sends `command` and returns the fields of its `ok` reply.
    fn call(&mut self, command: &str) -> String {
        self.writer.write_all(format!("{command}\n").as_bytes()).unwrap();
        let mut reply = String::new();
        self.reader.read_line(&mut reply).unwrap();
        let reply = reply.trim_end();
        match reply.strip_prefix("ok") {
            Some(fields) => fields.trim_start().to_string(),
            None => panic!("{command}: {reply}"),
        }
    }

    /// Starts a proxy or a fake; its id and address.
    fn start_item(&mut self, command: &str) -> (String, SocketAddr) {
        let reply = self.call(command);
        let (id, address) = reply.split_once(' ').expect("an id and an address");
        (id.to_string(), address.parse().unwrap())
    }

    fn count(&mut self, command: &str) -> usize {
        self.call(command).split(' ').next().unwrap().parse().unwrap()
    }
}

fn client_of(addresses: &[SocketAddr]) -> Client {
    Client::connect(addresses.iter().map(ToString::to_string)).unwrap()
}

/// A server, a kit with a proxy to it, and a client given the proxy's
/// address; the proxy's id.
fn through_a_proxy() -> (Server, Kit, String, Client) {
    let server = Server::start(&[]);
    let mut kit = Kit::start();
    let (proxy, address) = kit.start_item(&format!("proxy {}", server.addr));
    let client = client_of(&[address]);
    (server, kit, proxy, client)
}

fn cycle(client: &Client, key: &str) {
    let lock = client.acquire(key, LEASE, None).unwrap().expect("no wait limit");
    assert_eq!(lock.release(), Ok(ReleaseOutcome::Released));
}

#[test]
fn every_scenario_of_the_list_has_a_test_here() {
    let list = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/clients/scenarios.json")).unwrap();
    // The lock scenarios (wait forms, held, lock from a token, a lost lock,
    // error kinds) are in client_locks.rs, the failover in cluster_client.rs.
    let mut this = std::fs::read_to_string(file!()).unwrap();
    for other in ["client_locks.rs", "cluster_client.rs"] {
        this += &std::fs::read_to_string(format!("{}/tests/{other}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    }
    let ids: Vec<&str> = list.split("\"id\": \"").skip(1).map(|rest| rest.split('"').next().unwrap()).collect();
    assert!(ids.len() >= 10, "the list holds the scenarios: {ids:?}");
    for id in ids {
        let test = format!("fn {}()", id.replace('-', "_"));
        assert!(this.contains(&test), "no test for the scenario {id:?} (expected `{test}`)");
    }
}

#[test]
fn one_address_two_connections() {
    let (_server, mut kit, proxy, client) = through_a_proxy();
    client.ping().unwrap();
    kit.call(&format!("wait-open {proxy} 2"));
    assert_eq!(kit.count(&format!("accepted {proxy}")), 2);
}

#[test]
fn round_robin() {
    let server = Server::start(&[]);
    let mut kit = Kit::start();
    let (first, first_address) = kit.start_item(&format!("proxy {}", server.addr));
    let (second, second_address) = kit.start_item(&format!("proxy {}", server.addr));
    let client = client_of(&[first_address, second_address]);
    for round in 0..8 {
        cycle(&client, &format!("spread-{round}"));
    }
    kit.call(&format!("wait-upstream {first} - spread-"));
    kit.call(&format!("wait-upstream {second} - spread-"));
}

#[test]
fn cut_node_left_out_and_reconnected() {
    let server = Server::start(&[]);
    let mut kit = Kit::start();
    let (first, first_address) = kit.start_item(&format!("proxy {}", server.addr));
    let (_, second_address) = kit.start_item(&format!("proxy {}", server.addr));
    let client = client_of(&[first_address, second_address]);
    // Two addresses: one connection to each.
    kit.call(&format!("wait-open {first} 1"));
    kit.call(&format!("refuse {first} on"));
    kit.call(&format!("cut {first}"));
    for round in 0..20 {
        cycle(&client, &format!("left-out-{round}"));
    }
    let accepted = kit.count(&format!("accepted {first}"));
    kit.call(&format!("refuse {first} off"));
    kit.call(&format!("wait-accepted {first} {}", accepted + 1));
    kit.call(&format!("wait-open {first} 1"));
    for round in 0..4 {
        cycle(&client, &format!("back-{round}"));
    }
}

#[test]
fn pipelined_pairing_out_of_order() {
    let (_server, mut kit, proxy, client) = through_a_proxy();
    client.ping().unwrap();
    kit.call(&format!("reorder {proxy} on"));
    let locks: Vec<_> = thread::scope(|scope| {
        let handles: Vec<_> = (0..16)
            .map(|index| {
                let client = &client;
                scope.spawn(move || client.acquire(format!("pair-{index}"), LEASE, None).unwrap().unwrap())
            })
            .collect();
        handles.into_iter().map(|handle| handle.join().unwrap()).collect()
    });
    kit.call(&format!("resume {proxy}"));
    for (index, lock) in locks.into_iter().enumerate() {
        assert_eq!(lock.key(), format!("pair-{index}").as_bytes());
        assert_eq!(lock.release(), Ok(ReleaseOutcome::Released), "the token of pair-{index} is its own");
    }
}

#[test]
fn same_key_in_send_order() {
    let (server, _kit, _proxy, client) = through_a_proxy();
    let first = client.acquire("same", LEASE, None).unwrap().unwrap();
    let first_token = first.token();
    let second = thread::scope(|scope| {
        let waiting = scope.spawn(|| client.acquire("same", LEASE, None).unwrap().unwrap());
        // The second acquire is queued behind the first until it is released.
        wait_until_queued(&server, "same");
        assert_eq!(first.release(), Ok(ReleaseOutcome::Released));
        waiting.join().unwrap()
    });
    assert!(second.token() > first_token, "{} after {first_token}", second.token());
}

/// Waits until the server has one acquire of `key` queued.
fn wait_until_queued(server: &Server, key: &str) {
    let mut observer = server.connect();
    common::wait_until(&format!("an acquire of {key} to be queued"), || common::stat(&mut observer, "waiters") == 1);
}

#[test]
fn acquire_moves_on_cut() {
    let (_server, mut kit, proxy, client) = through_a_proxy();
    client.ping().unwrap();
    kit.call(&format!("wait-open {proxy} 2"));
    kit.call(&format!("stall {proxy}"));
    let lock = thread::scope(|scope| {
        let acquiring = scope.spawn(|| client.acquire("moved", LEASE, None));
        let connection = kit.call(&format!("wait-upstream {proxy} - A moved "));
        kit.call(&format!("cut {proxy} {connection}"));
        kit.call(&format!("resume {proxy}"));
        acquiring.join().unwrap()
    });
    let lock = lock.unwrap().expect("no wait limit");
    assert!(client.acquire("moved", LEASE, Some(Duration::from_millis(100))).unwrap().is_none(), "held once");
    assert_eq!(lock.release(), Ok(ReleaseOutcome::Released));
}

#[test]
fn no_connection_left() {
    let server = Server::start(&[]);
    let mut kit = Kit::start();
    let (proxy, address) = kit.start_item(&format!("proxy {}", server.addr));
    let client = client_of(&[address]);
    client.ping().unwrap();
    // A connection still being accepted when refusing starts would be
    // forwarded after the cut.
    kit.call(&format!("wait-open {proxy} 2"));
    kit.call(&format!("refuse {proxy} on"));
    kit.call(&format!("cut {proxy}"));
    kit.call(&format!("wait-open {proxy} 0"));
    let started = Instant::now();
    let error = client.acquire("nowhere", LEASE, Some(Duration::from_secs(1))).unwrap_err();
    let elapsed = started.elapsed();
    // Generous bounds: only failing at once, or hanging, breaks them.
    assert!(elapsed >= Duration::from_millis(900), "it waited for a connection within its wait: {elapsed:?}");
    assert!(elapsed < Duration::from_secs(10), "not a hang: {elapsed:?}");
    let Error::NoConnection { waited, addresses, .. } = &error else { panic!("{error:?}") };
    assert!(*waited <= elapsed, "{waited:?}");
    assert_eq!(addresses.len(), 1);
    assert_eq!(addresses[0].address, address.to_string());
    let text = error.to_string();
    assert!(text.starts_with("no usable connection after "), "{text}");
    assert!(text.ends_with(&format!(": {address} (closed by the server)")), "{text}");
}

#[test]
fn restart_within_wait() {
    let mut server = Server::start(&[]);
    let listen = server.addr.to_string();
    let client = client_of(&[server.addr]);
    let before = client.acquire("restarted", LEASE, None).unwrap().expect("free key").detach();
    server.kill9();
    common::wait_until("the client to see its connections broken", || client.usable_connection_count() == 0);
    let lock = thread::scope(|scope| {
        let acquiring = scope.spawn(|| client.acquire("other", LEASE, Some(Duration::from_secs(20))));
        // The acquire waits for a connection (the client counts it among
        // the requests waiting for their next try); the server comes back
        // within about 100 ms of the kill.
        common::wait_until("the acquire to wait for a connection", || client.retry_count() == 1);
        let restarted = Server::start_in(server.data_dir(), &["--listen", &listen]);
        let lock = acquiring.join().unwrap();
        (lock, restarted)
    });
    let (lock, _restarted) = lock;
    let lock = lock.expect("no error").expect("granted within the wait");
    assert!(lock.token() > before, "a new epoch's token: {} after {before}", lock.token());
    assert_eq!(lock.release(), Ok(ReleaseOutcome::Released));
}

#[test]
fn shutting_down_retried() {
    let mut server = Server::start(&[]);
    let listen = server.addr.to_string();
    let mut holder = server.connect();
    holder.acquire("stopping", "60", "0");
    let client = client_of(&[server.addr]);
    let (lock, _restarted) = thread::scope(|scope| {
        let acquiring = scope.spawn(|| client.acquire("stopping", LEASE, Some(Duration::from_secs(20))));
        common::wait_until("the acquire to be queued", || holder.call("I stopping").rsplit(' ').next() == Some("1"));
        // The stopping server answers the queued acquire `shutting-down`,
        // which had no effect: the client sends it again to the next server.
        assert!(server.stop("TERM").success());
        let restarted = Server::start_in(server.data_dir(), &["--listen", &listen]);
        (acquiring.join().unwrap(), restarted)
    });
    let lock = lock.expect("no error").expect("granted by the restarted server within the wait");
    assert_eq!(lock.release(), Ok(ReleaseOutcome::Released));
}

#[test]
fn connect_backoff() {
    let server = Server::start(&[]);
    let mut kit = Kit::start();
    let (proxy, address) = kit.start_item(&format!("proxy {}", server.addr));
    kit.call(&format!("refuse {proxy} on"));
    let _client = Client::builder([address.to_string()])
        .connections_per_node(1)
        .reconnect_delay_max(Duration::from_secs(1))
        .connect()
        .unwrap();
    kit.call(&format!("wait-attempts {proxy} 9"));
    let reply = kit.call(&format!("attempts {proxy}"));
    let times: Vec<f64> = reply.split(' ').skip(1).map(|time| time.parse().unwrap()).collect();
    let gaps: Vec<f64> = times.windows(2).take(8).map(|pair| (pair[1] - pair[0]) / 1000.0).collect();
    // Loose bounds, on purpose: only a wrong schedule breaks them.
    assert!(gaps[0] < 0.5, "the first retry goes at once: {gaps:?}");
    let first: f64 = gaps[..3].iter().sum::<f64>() / 3.0;
    let last: f64 = gaps[5..].iter().sum::<f64>() / 3.0;
    assert!(last > 2.0 * first, "the gaps grow: {gaps:?}");
    assert!(gaps[5..].iter().any(|&gap| gap >= 0.3), "they grow to the cap's order: {gaps:?}");
    assert!(gaps.iter().all(|&gap| gap <= 2.5), "none beyond the cap: {gaps:?}");
}

#[test]
fn release_retried() {
    let (_server, mut kit, proxy, client) = through_a_proxy();
    let lock = client.acquire("retried", LEASE, None).unwrap().unwrap();
    kit.call(&format!("stall {proxy}"));
    let released = thread::scope(|scope| {
        let releasing = scope.spawn(|| lock.release());
        // The release is on its way; every connection is cut under it, and
        // the client reconnects within its 5 s of retries.
        kit.call(&format!("wait-upstream {proxy} - R retried "));
        kit.call(&format!("cut {proxy}"));
        kit.call(&format!("resume {proxy}"));
        releasing.join().unwrap()
    });
    assert_eq!(released, Ok(ReleaseOutcome::Released));
    let again = client.acquire("retried", LEASE, Some(Duration::from_millis(100))).unwrap();
    assert!(again.is_some(), "the key is free at once after the release");
}

#[test]
fn redirect_followed() {
    let server = Server::start(&[]);
    let mut kit = Kit::start();
    let (fake, fake_address) = kit.start_item(&format!("fake {}", server.addr));
    let client = client_of(&[fake_address, server.addr]);
    cycle(&client, "redirected-0");
    let redirected = kit.count(&format!("redirected {fake}"));
    for round in 1..20 {
        cycle(&client, &format!("redirected-{round}"));
    }
    assert_eq!(kit.count(&format!("redirected {fake}")), redirected, "the client sends to the active only");
}

#[test]
fn redirect_to_no_active() {
    let mut kit = Kit::start();
    let (_, fake_address) = kit.start_item("fake -");
    let client = Client::builder([fake_address.to_string()])
        .release_retry_interval(Duration::from_millis(20))
        .release_retry_for(Duration::from_millis(300))
        .connect()
        .unwrap();
    assert_eq!(client.acquire("nowhere", LEASE, Some(Duration::from_millis(500))).unwrap_err(), Error::NoActive);
}

#[test]
fn timeout_is_not_a_grant() {
    let server = Server::start(&[]);
    let holder = client_of(&[server.addr]);
    let other = client_of(&[server.addr]);
    let held = holder.acquire("contended", LEASE, None).unwrap().unwrap();
    assert!(other.acquire("contended", LEASE, Some(Duration::from_millis(200))).unwrap().is_none());
    assert_eq!(held.release(), Ok(ReleaseOutcome::Released), "still held by the first client");
}

#[test]
fn delayed_replies() {
    let (_server, mut kit, proxy, client) = through_a_proxy();
    kit.call(&format!("delay {proxy} 300"));
    let lock = client.acquire("slow", LEASE, None).unwrap().unwrap();
    lock.extend(LEASE).unwrap();
    assert_eq!(lock.release(), Ok(ReleaseOutcome::Released));
}

/// How long a call on a black-holed connection may take before the test
/// calls it a hang: the client must end it within its wait plus
/// `suspect_after + ping_timeout` and a tick, never only when the link
/// comes back. Generous on purpose: not a timing assertion.
const OUTER_DEADLINE: Duration = Duration::from_secs(20);

/// Runs `call` on a thread of its own and returns its result, or fails the
/// test if it has not returned within [`OUTER_DEADLINE`].
fn within_outer_deadline<T: Send + 'static>(what: &str, call: impl FnOnce() -> T + Send + 'static) -> T {
    let (sender, receiver) = std::sync::mpsc::channel();
    thread::spawn(move || {
        let _ = sender.send(call());
    });
    receiver.recv_timeout(OUTER_DEADLINE).unwrap_or_else(|_| panic!("{what} still blocked after {OUTER_DEADLINE:?}"))
}

/// Polls `future` on this thread until it is ready (the client's futures
/// need no reactor).
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    struct Unpark(thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let mut future = std::pin::pin!(future);
    let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    loop {
        match future.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(output) => return output,
            std::task::Poll::Pending => thread::park(),
        }
    }
}

/// The client's own failure of a call whose only node is black-holed: no
/// connection, naming the address and the silence that got it cut.
fn assert_cut_for_silence(error: &Error, address: SocketAddr) {
    let Error::NoConnection { addresses, .. } = error else { panic!("no connection, not {error:?}") };
    assert_eq!(addresses.len(), 1, "{error}");
    assert_eq!(addresses[0].address, address.to_string());
    assert_eq!(addresses[0].kind, std::io::ErrorKind::TimedOut, "{error}");
    assert!(addresses[0].message.ends_with("not even to a ping"), "{error}");
}

/// A server, a kit with a proxy to it, and a client (default settings)
/// given the proxy's address, both of whose connections the proxy has
/// black-holed; the proxy's id and address.
fn black_holed_single_node() -> (Server, Kit, String, SocketAddr, Client) {
    let server = Server::start(&[]);
    let mut kit = Kit::start();
    let (proxy, address) = kit.start_item(&format!("proxy {}", server.addr));
    let client = client_of(&[address]);
    client.ping().unwrap();
    kit.call(&format!("wait-open {proxy} 2"));
    kit.call(&format!("blackhole {proxy} on"));
    (server, kit, proxy, address, client)
}

/// The scenario of a host that vanished: the only node's connections are
/// black-holed (they accept bytes and answer nothing, with neither a close
/// nor a reset), with the default `suspect_after` and `ping_timeout`.
#[test]
fn silent_connection_suspected() {
    let (_server, mut kit, proxy, address, client) = black_holed_single_node();
    let acquiring = client.clone();
    let outcome = within_outer_deadline("an acquire with a wait of 1 s on a black-holed node", move || {
        acquiring.acquire("silent/single", LEASE, Some(Duration::from_secs(1)))
    });
    assert_cut_for_silence(&outcome.unwrap_err(), address);
    // The client cut the connection the acquire was on and connected again
    // (into the black hole: the proxy takes every new connection in too).
    kit.call(&format!("wait-accepted {proxy} 3"));
    // The link comes back: the proxy cuts what it black-holed, the client
    // reconnects and serves again.
    kit.call(&format!("blackhole {proxy} off"));
    let lock = client.acquire("silent/single", LEASE, Some(Duration::from_secs(5))).unwrap().expect("granted");
    assert_eq!(lock.release(), Ok(ReleaseOutcome::Released));
}

#[test]
fn an_async_acquire_on_a_black_holed_node_fails_within_its_wait_and_the_grace() {
    let (_server, mut kit, proxy, address, client) = black_holed_single_node();
    let acquiring = client.clone();
    let outcome = within_outer_deadline("an async acquire on a black-holed node", move || {
        block_on(acquiring.acquire_async("silent/async", LEASE, Some(Duration::from_secs(1))))
    });
    assert_cut_for_silence(&outcome.unwrap_err(), address);
    kit.call(&format!("blackhole {proxy} off"));
    let lock = block_on(client.acquire_async("silent/async", LEASE, Some(Duration::from_secs(5))));
    assert_eq!(lock.unwrap().expect("granted").release(), Ok(ReleaseOutcome::Released));
}

/// A request whose only limit is the connect limit (a ping) moves from
/// silent connection to silent connection, and fails once its time on them
/// adds up to that limit.
#[test]
fn a_ping_on_a_black_holed_node_fails_within_the_connect_limit() {
    let server = Server::start(&[]);
    let mut kit = Kit::start();
    let (proxy, address) = kit.start_item(&format!("proxy {}", server.addr));
    let client = Client::builder([address.to_string()])
        .suspect_after(Duration::from_millis(200))
        .ping_timeout(Duration::from_millis(200))
        .connect_limit(Duration::from_secs(2))
        .connect()
        .unwrap();
    client.ping().unwrap();
    kit.call(&format!("wait-open {proxy} 2"));
    kit.call(&format!("blackhole {proxy} on"));
    let pinging = client.clone();
    let pinged = within_outer_deadline("a ping on a black-holed node", move || pinging.ping());
    assert_cut_for_silence(&pinged.unwrap_err(), address);
    kit.call(&format!("blackhole {proxy} off"));
    assert_eq!(client.ping().unwrap().role, ringlock_client::proto::Role::Active);
}

/// Two proxies to one server, the first black-holed once the client's
/// connection to each is open; the client's settings make a silent
/// connection cost about half a second.
fn one_proxy_black_holed() -> (Server, Kit, String, Client) {
    let server = Server::start(&[]);
    let mut kit = Kit::start();
    let (dark, dark_address) = kit.start_item(&format!("proxy {}", server.addr));
    let (_, good_address) = kit.start_item(&format!("proxy {}", server.addr));
    let client = Client::builder([dark_address.to_string(), good_address.to_string()])
        .suspect_after(Duration::from_millis(200))
        .ping_timeout(Duration::from_millis(200))
        .connect()
        .unwrap();
    client.ping().unwrap();
    client.ping().unwrap();
    kit.call(&format!("wait-open {dark} 1"));
    kit.call(&format!("blackhole {dark} on"));
    (server, kit, dark, client)
}

#[test]
fn an_acquire_on_a_black_holed_connection_moves_to_the_other_and_is_granted() {
    let (_server, mut kit, dark, client) = one_proxy_black_holed();
    // One after the other, so that round-robin puts some on each connection.
    let acquiring = client.clone();
    let outcomes = within_outer_deadline("acquires beside a black-holed connection", move || {
        (0..4)
            .map(|index| acquiring.acquire(format!("silent/moved-{index}"), LEASE, Some(Duration::from_secs(5))))
            .collect::<Vec<_>>()
    });
    // The client cut the black-holed connection (it is suspected only with
    // a request in flight) and connected again.
    kit.call(&format!("wait-accepted {dark} 2"));
    for (index, outcome) in outcomes.into_iter().enumerate() {
        let lock = outcome.unwrap().unwrap_or_else(|| panic!("silent/moved-{index} granted within its wait"));
        assert_eq!(lock.release(), Ok(ReleaseOutcome::Released), "silent/moved-{index} was held once");
    }
    kit.call(&format!("blackhole {dark} off"));
}

#[test]
fn a_release_in_flight_on_a_black_holed_connection_completes_elsewhere() {
    let server = Server::start(&[]);
    let mut kit = Kit::start();
    let (dark, dark_address) = kit.start_item(&format!("proxy {}", server.addr));
    let (_, good_address) = kit.start_item(&format!("proxy {}", server.addr));
    let client = Client::builder([dark_address.to_string(), good_address.to_string()])
        .suspect_after(Duration::from_millis(200))
        .ping_timeout(Duration::from_millis(200))
        .connect()
        .unwrap();
    let locks: Vec<_> =
        (0..4).map(|index| client.acquire(format!("silent/released-{index}"), LEASE, None).unwrap().unwrap()).collect();
    kit.call(&format!("wait-open {dark} 1"));
    kit.call(&format!("blackhole {dark} on"));
    let outcomes = within_outer_deadline("releases beside a black-holed connection", move || {
        locks.into_iter().map(|lock| lock.release()).collect::<Vec<_>>()
    });
    kit.call(&format!("wait-accepted {dark} 2"));
    // Released, not "nothing left": each reached the server while it held the key.
    assert_eq!(outcomes, vec![Ok(ReleaseOutcome::Released); 4]);
    let other = client_of(&[server.addr]);
    for index in 0..4 {
        assert!(other.inspect(format!("silent/released-{index}")).unwrap().token.is_none(), "released-{index} is free");
    }
    kit.call(&format!("blackhole {dark} off"));
}

/// A request waiting its turn reads nothing for a while: its connection is
/// pinged, answers, and stays up.
#[test]
fn a_waiting_acquire_keeps_its_answering_connection() {
    let server = Server::start(&[]);
    let mut kit = Kit::start();
    let holder = client_of(&[server.addr]);
    // Held for 1.5 s: the acquire below waits that long, silent, behind it.
    holder.acquire("silent/busy", Duration::from_millis(1_500), None).unwrap().unwrap().detach();
    let (proxy_id, proxy_address) = kit.start_item(&format!("proxy {}", server.addr));
    let client = Client::builder([proxy_address.to_string()])
        .suspect_after(Duration::from_millis(200))
        .ping_timeout(Duration::from_millis(200))
        .connect()
        .unwrap();
    kit.call(&format!("wait-open {proxy_id} 2"));
    let lock = client.acquire("silent/busy", LEASE, Some(Duration::from_secs(10))).unwrap();
    let lock = lock.expect("granted once the holder's lease ran out, after several pings");
    assert_eq!(kit.count(&format!("accepted {proxy_id}")), 2, "an answering connection was cut");
    kit.call(&format!("wait-upstream {proxy_id} - P"));
    assert_eq!(lock.release(), Ok(ReleaseOutcome::Released));
}

/// Secrets of two names made for the authentication scenarios; never used
/// outside these tests.
const ALPHA_SECRET: &str = "alpha-5e0c1b7a9d2f4836";
const BETA_SECRET: &str = "beta-8a4d2c6e1f0b9357";

fn sha256_hex(secret: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, secret.as_bytes()).as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// An auth file in a temporary directory of its own.
struct AuthFile(common::DataDir);

impl AuthFile {
    /// `alpha` may lock `alpha/*`, `beta` `beta/*`.
    fn alpha_and_beta() -> AuthFile {
        let file = AuthFile(common::DataDir::new());
        std::fs::create_dir_all(&file.0.0).unwrap();
        file.write(&[("alpha", ALPHA_SECRET), ("beta", BETA_SECRET)]);
        file
    }

    fn path(&self) -> String {
        self.0.0.join("auth").to_str().unwrap().to_string()
    }

    /// Replaces the file with `names` (each may lock `<name>/*`), in one
    /// rename so that a reload never reads half a file.
    fn write(&self, names: &[(&str, &str)]) {
        let text: String =
            names.iter().map(|(name, secret)| format!("{name} {} {name}/*\n", sha256_hex(secret))).collect();
        let draft = self.0.0.join("auth.draft");
        std::fs::write(&draft, text).unwrap();
        std::fs::rename(&draft, self.0.0.join("auth")).unwrap();
    }
}

fn client_with_secret(address: SocketAddr, secret: &str) -> Client {
    Client::builder([address.to_string()]).secret(secret).connect().unwrap()
}

#[test]
fn auth_ok() {
    let file = AuthFile::alpha_and_beta();
    let server = Server::start(&["--auth-file", &file.path()]);
    let client = client_with_secret(server.addr, ALPHA_SECRET);
    cycle(&client, "alpha/ok");
    assert_eq!(client.name().as_deref(), Some("alpha"));
}

#[test]
fn auth_wrong() {
    let file = AuthFile::alpha_and_beta();
    let server = Server::start(&["--auth-file", &file.path()]);
    let client = client_with_secret(server.addr, "not-the-secret");
    let started = Instant::now();
    let error = client.acquire("alpha/wrong", LEASE, Some(Duration::from_secs(1))).unwrap_err();
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(10), "not a hang: {elapsed:?}");
    assert_eq!(error, Error::Auth { address: server.addr.to_string(), code: ErrorCode::AuthFailed });
    let text = error.to_string();
    assert!(text.contains(&server.addr.to_string()) && text.contains("auth-failed"), "{text}");
    assert!(!text.contains("not-the-secret"), "the secret stays out of errors: {text}");
    assert_eq!(client.name(), None);
}

#[test]
fn auth_forbidden_key() {
    let file = AuthFile::alpha_and_beta();
    let server = Server::start(&["--auth-file", &file.path()]);
    let client = client_with_secret(server.addr, ALPHA_SECRET);
    let error = client.acquire("beta/theirs", LEASE, Some(Duration::from_secs(1))).unwrap_err();
    assert_eq!(error, Error::Server(ErrorCode::Forbidden));
    cycle(&client, "alpha/mine");
    assert_eq!(client.usable_connection_count(), 2, "the forbidden key broke no connection");
}

#[test]
fn auth_revoked_on_reload() {
    let file = AuthFile::alpha_and_beta();
    let server = Server::start(&["--auth-file", &file.path()]);
    let alpha = client_with_secret(server.addr, ALPHA_SECRET);
    let beta = client_with_secret(server.addr, BETA_SECRET);
    cycle(&alpha, "alpha/before");
    cycle(&beta, "beta/before");
    common::wait_until("both of alpha's connections up", || alpha.usable_connection_count() == 2);
    file.write(&[("beta", BETA_SECRET)]);
    server.signal("HUP");
    // The server closes alpha's connections; the client reconnects, and its
    // secret is refused from then on.
    common::wait_until("alpha's connections revoked", || alpha.usable_connection_count() == 0);
    let error = alpha.acquire("alpha/after", LEASE, Some(Duration::from_secs(1))).unwrap_err();
    assert_eq!(error, Error::Auth { address: server.addr.to_string(), code: ErrorCode::AuthFailed });
    cycle(&beta, "beta/after");
}

#[test]
fn auth_reconnect() {
    let file = AuthFile::alpha_and_beta();
    let mut server = Server::start(&["--auth-file", &file.path()]);
    let listen = server.addr.to_string();
    let client = client_with_secret(server.addr, ALPHA_SECRET);
    cycle(&client, "alpha/before");
    server.kill9();
    common::wait_until("the client to see its connections broken", || client.usable_connection_count() == 0);
    let _restarted = Server::start_in(server.data_dir(), &["--listen", &listen, "--auth-file", &file.path()]);
    // Granted only if the new connections authenticated: the server answers
    // auth-required to anything else.
    let lock = client.acquire("alpha/after", LEASE, Some(Duration::from_secs(5))).unwrap().expect("granted");
    assert_eq!(lock.release(), Ok(ReleaseOutcome::Released));
}

/// A server serving the test certificates' `server.pem` on its client port
/// (and `extra` flags).
fn tls_server(certificates: &Certificates, extra: &[&str]) -> Server {
    let mut args = certificates.server_args();
    args.extend(extra.iter().map(ToString::to_string));
    Server::start(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

#[test]
fn tls_connect() {
    let certificates = Certificates::new();
    let server = tls_server(&certificates, &[]);
    let client = Client::builder([server.addr.to_string()]).tls_ca(certificates.path("ca.pem")).connect().unwrap();
    let lock = client.acquire("tls/one", LEASE, None).unwrap().expect("no wait limit");
    lock.extend(LEASE).unwrap();
    assert_eq!(lock.release(), Ok(ReleaseOutcome::Released));
    // 64 callers at once: their requests share the two TLS connections.
    thread::scope(|scope| {
        for caller in 0..64 {
            let client = &client;
            scope.spawn(move || cycle(client, &format!("tls/pipelined-{caller}")));
        }
    });
    assert_eq!(client.usable_connection_count(), 2);
}

#[test]
fn tls_mtls() {
    let certificates = Certificates::new();
    let server = tls_server(&certificates, &["--tls-client-ca", &certificates.path("ca.pem")]);
    let with = Client::builder([server.addr.to_string()])
        .tls_ca(certificates.path("ca.pem"))
        .tls_cert(certificates.path("client.pem"))
        .tls_key(certificates.path("client.key"))
        .connect()
        .unwrap();
    cycle(&with, "mtls/with");
    let without = Client::builder([server.addr.to_string()]).tls_ca(certificates.path("ca.pem")).connect().unwrap();
    let started = Instant::now();
    let error = without.acquire("mtls/without", LEASE, Some(Duration::from_secs(1))).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10), "not a hang: {:?}", started.elapsed());
    let Error::Tls { address, message } = &error else { panic!("a TLS error: {error:?}") };
    assert_eq!(address, &server.addr.to_string());
    assert!(message.to_lowercase().contains("certificate"), "{message}");
    assert!(error.to_string().contains(&server.addr.to_string()), "{error}");
    cycle(&with, "mtls/still");
}

#[test]
fn tls_wrong_ca() {
    let certificates = Certificates::new();
    let server = tls_server(&certificates, &[]);
    let client =
        Client::builder([server.addr.to_string()]).tls_ca(certificates.path("other-ca.pem")).connect().unwrap();
    let started = Instant::now();
    let error = client.acquire("tls/untrusted", LEASE, Some(Duration::from_secs(1))).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10), "not a hang: {:?}", started.elapsed());
    let Error::Tls { address, message } = &error else { panic!("a TLS error: {error:?}") };
    assert_eq!(address, &server.addr.to_string());
    assert!(message.contains("invalid peer certificate") && message.contains("UnknownIssuer"), "{message}");
    // The server saw no request: the key was never granted.
    let trusting = Client::builder([server.addr.to_string()]).tls_ca(certificates.path("ca.pem")).connect().unwrap();
    assert!(trusting.inspect("tls/untrusted").unwrap().token.is_none(), "never granted");
}
