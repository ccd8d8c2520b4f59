//! The client's connection set against the real server (docs/protocol.md §4): two
//! connections for one address, acquires that survive a cut connection,
//! reconnection after a restart, releases retried after a cut, refused
//! connections. Faults come from the test kit's proxy (`testkit/`).

mod common;

use std::thread;
use std::time::Duration;

use common::{Conn, Server, token_of, wait_until};
use ringlock_client::{Client, Error, ReleaseOutcome};
use ringlock_testkit::Proxy;

const LONG_LEASE: Duration = Duration::from_secs(600);

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|window| window == needle)
}

/// A field of the `total` object of an `S` reply's JSON.
fn total_field(json: &str, name: &str) -> u64 {
    let total = &json[json.find("\"total\":").expect("a total object")..];
    let needle = format!("\"{name}\":");
    let at = total.find(&needle).unwrap_or_else(|| panic!("no {name} in {json}")) + needle.len();
    total[at..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

#[test]
fn one_address_gives_two_connections_used_round_robin() {
    let server = Server::start(&[]);
    let proxy = Proxy::start(server.addr);
    let client = Client::connect([proxy.addr.to_string()]).unwrap();
    assert_eq!(client.connection_count(), 2);
    proxy.wait_open(2);
    wait_until("both connections usable", || client.usable_connection_count() == 2);

    // Consecutive requests alternate between the two connections.
    for _ in 0..4 {
        client.ping().unwrap();
    }
    let ids = proxy.open_ids();
    assert_eq!(ids.len(), 2);
    for id in ids {
        let sent = proxy.upstream_of(id);
        assert_eq!(sent, b"P\nP\n", "connection {id} carried {:?}", String::from_utf8_lossy(&sent));
    }
    assert_eq!(proxy.accepted(), 2, "no connection beyond the two");

    // The server sees the same two (its counters are published once per
    // loop turn, so wait for them).
    wait_until("the server to count two connections", || total_field(&client.stats().unwrap(), "connections") == 2);
}

/// The server's queued acquires and open connections, from one `S` reply
/// (both are published together, once per loop turn).
fn waiters_and_connections(observer: &mut Conn) -> (u64, u64) {
    let json = observer.call("S");
    (total_field(&json, "waiters"), total_field(&json, "connections"))
}

#[test]
fn an_acquire_survives_a_cut_connection() {
    let server = Server::start(&[]);
    let mut holder = server.connect();
    let holder_token = holder.acquire("survivor", "600", "0");
    let mut observer = server.connect();

    let proxy = Proxy::start(server.addr);
    let client = Client::connect([proxy.addr.to_string()]).unwrap();
    let waiter = {
        let client = client.clone();
        thread::spawn(move || client.acquire("survivor", LONG_LEASE, None))
    };

    // The acquire waits in the key's queue on one connection: cut that one.
    // The server must have queued it first (the holder, the observer and
    // the client's two connections are open then): the proxy forwards a
    // request before the test sees it, and an acquire still unread at the
    // release would be granted the freed key on the cut connection.
    let first = proxy.wait_upstream(b"A survivor ", &[]);
    wait_until("the acquire to be queued", || waiters_and_connections(&mut observer) == (1, 4));
    // The client reconnects at once; refused by the proxy, the reconnect
    // does not bring the server's connection count back up while the test
    // waits for it to fall.
    proxy.set_refusing(true);
    proxy.cut(first);
    // It moves to the other connection and queues there again.
    let second = proxy.wait_upstream(b"A survivor ", &[first]);
    assert_ne!(first, second);
    // Release only once the server has read the end of the cut connection,
    // which takes that connection's acquire out of the queue; before, the
    // release would hand the key to it. Either way the grant would go to a
    // connection that is gone, nobody could claim it, and the moved acquire
    // would wait behind it for its whole lease. One waiter and one
    // connection fewer means the one queued is the moved acquire.
    wait_until("the cut to reach the server and the acquire to move", || {
        waiters_and_connections(&mut observer) == (1, 3)
    });

    assert_eq!(holder.call(&format!("R survivor {holder_token}")), "R survivor");
    let lock = waiter.join().unwrap().expect("no error").expect("no wait limit");
    assert!(lock.token() > holder_token, "a later grant has a greater token");
    assert_eq!(total_field(&observer.call("S"), "handoffs"), 1, "the moved acquire was handed the key from the queue");
    assert_eq!(lock.release(), Ok(ReleaseOutcome::Released));
}

#[test]
fn an_acquire_cut_on_every_connection_waits_for_one_to_come_back() {
    let server = Server::start(&[]);
    let proxy = Proxy::start(server.addr);
    let client = Client::connect([proxy.addr.to_string()]).unwrap();
    proxy.wait_open(2);
    // Held by the proxy, the acquires cut with their connections never
    // reach the server, which could otherwise grant one of them on a
    // connection already gone.
    proxy.stall();
    let waiter = {
        let client = client.clone();
        thread::spawn(move || client.acquire("cut-twice", LONG_LEASE, Some(Duration::from_secs(20))))
    };
    let first = proxy.wait_upstream(b"A cut-twice ", &[]);
    proxy.cut(first);
    let second = proxy.wait_upstream(b"A cut-twice ", &[first]);
    proxy.cut(second);
    // Two registered connections, two cuts: the acquire waits for a
    // connection to come back, and is sent on it.
    let third = proxy.wait_upstream(b"A cut-twice ", &[first, second]);
    assert!(third > second, "sent on a new connection");
    proxy.resume();
    let lock = waiter.join().unwrap().expect("no error").expect("granted within the wait");
    assert_eq!(lock.release(), Ok(ReleaseOutcome::Released));
}

#[test]
fn an_acquire_with_no_connection_fails_after_its_wait_naming_the_address_and_its_os_error() {
    let port = common::RefusingPort::new();
    let address = port.addr.to_string();
    let client = Client::connect([address.clone()]).unwrap();
    let started = std::time::Instant::now();
    let error = client.acquire("nowhere", LONG_LEASE, Some(Duration::from_millis(600))).unwrap_err();
    let waited_for = started.elapsed();
    assert!(waited_for >= Duration::from_millis(600), "the acquire waited its whole wait: {waited_for:?}");
    let Error::NoConnection { waited, addresses, .. } = &error else { panic!("{error:?}") };
    // Counted from the first failed connect, not from the call: at most
    // the call's time, and no lower bound that a slow connect could break.
    assert!(*waited <= waited_for, "{waited:?} waited, within a call of {waited_for:?}");
    assert_eq!(addresses.len(), 1);
    assert_eq!(addresses[0].address, address);
    assert_eq!(addresses[0].kind, std::io::ErrorKind::ConnectionRefused);
    assert_eq!(addresses[0].os_error, Some(111), "ECONNREFUSED");
    let text = error.to_string();
    assert!(text.starts_with("no usable connection after 0."), "{text}");
    assert!(text.ends_with(&format!(": {address} (connection refused)")), "{text}");
}

#[test]
fn the_client_reconnects_after_a_server_restart() {
    let mut server = Server::start(&[]);
    let addr = server.addr.to_string();
    let client = Client::builder([addr.clone()]).connect_limit(Duration::from_millis(500)).connect().unwrap();
    let old = client.acquire("restart", LONG_LEASE, None).unwrap().expect("free key");
    let old_token = old.token();

    server.kill9();
    wait_until("both connections to be seen broken", || client.usable_connection_count() == 0);
    // Nothing to connect to for the connect limit: the try waits that
    // long, then fails naming the address.
    let error = client.try_acquire("restart", LONG_LEASE).unwrap_err();
    assert!(matches!(&error, Error::NoConnection { addresses, .. } if addresses[0].address == addr), "{error:?}");

    let _restarted = Server::start_in(server.data_dir(), &["--listen", &addr]);
    wait_until("both connections to come back", || client.usable_connection_count() == 2);
    let new = client.try_acquire("restart", LONG_LEASE).unwrap().expect("a restarted server holds no lock");
    assert!(new.token() > old_token, "the new epoch's tokens exceed the old ones");
    assert_eq!(old.release(), Ok(ReleaseOutcome::NotHeld), "the old grant died with the old process");
    assert_eq!(new.release(), Ok(ReleaseOutcome::Released));
}

#[test]
fn a_release_cut_mid_flight_is_retried_and_frees_the_key() {
    let server = Server::start(&[]);
    let proxy = Proxy::start(server.addr);
    let client = Client::connect([proxy.addr.to_string()]).unwrap();
    let lock = client.acquire("cut-release", LONG_LEASE, None).unwrap().expect("free key");

    // The release reaches the proxy, which holds it; then every connection
    // is cut and the release is lost with them.
    proxy.stall();
    let releaser = thread::spawn(move || lock.release());
    proxy.wait_upstream(b"R cut-release ", &[]);
    proxy.cut_all();
    proxy.resume();

    // Retried every 200 ms, and at once when a connection is back.
    assert_eq!(releaser.join().unwrap(), Ok(ReleaseOutcome::Released));
    let reached = proxy.wait_upstream(b"R cut-release ", &[]);
    assert!(contains(&proxy.upstream_of(reached), b"R cut-release "));
    let mut other = server.connect();
    let reply = other.call("A cut-release 30 0.001");
    token_of(&reply, "cut-release");
}

#[test]
fn a_release_whose_reply_was_lost_is_retried_and_reports_not_held() {
    let server = Server::start(&[]);
    let proxy = Proxy::start(server.addr);
    let client = Client::connect([proxy.addr.to_string()]).unwrap();
    let lock = client.acquire("lost-reply", LONG_LEASE, None).unwrap().expect("free key");

    // The release reaches the server, but its reply is held by the proxy.
    proxy.stall_replies();
    let releaser = thread::spawn(move || lock.release());
    proxy.wait_upstream(b"R lost-reply ", &[]);
    // The server did release: another connection gets the key (it waits
    // for it if the release is not processed yet).
    let mut other = server.connect();
    let other_token = token_of(&other.call("A lost-reply 600 20"), "lost-reply");
    proxy.cut_all();
    proxy.resume();

    // The retry finds the key held by someone else's grant: nothing of ours
    // was left to release, and the other grant is untouched.
    assert_eq!(releaser.join().unwrap(), Ok(ReleaseOutcome::NotHeld));
    assert_eq!(other.call(&format!("R lost-reply {other_token}")), "R lost-reply");
}

#[test]
fn requests_fail_while_connections_are_refused_and_work_once_accepted() {
    let server = Server::start(&[]);
    let proxy = Proxy::start(server.addr);
    let client = Client::builder([proxy.addr.to_string()]).connect_limit(Duration::from_millis(300)).connect().unwrap();
    wait_until("both connections usable", || client.usable_connection_count() == 2);

    proxy.set_refusing(true);
    proxy.cut_all();
    proxy.wait_until("two reconnects refused", |proxy| proxy.refused() >= 2);
    wait_until("both connections broken", || client.usable_connection_count() == 0);
    let error = client.try_acquire("refused", LONG_LEASE).unwrap_err();
    let Error::NoConnection { addresses, .. } = &error else { panic!("{error:?}") };
    assert_eq!(addresses[0].address, proxy.addr.to_string());
    assert!(error.to_string().ends_with("(closed by the server)"), "the proxy closes what it accepts: {error}");

    proxy.set_refusing(false);
    wait_until("both connections back", || client.usable_connection_count() == 2);
    let lock = client.try_acquire("refused", LONG_LEASE).unwrap().expect("free key");
    assert_eq!(lock.release(), Ok(ReleaseOutcome::Released));
}

#[test]
fn dropping_the_client_closes_its_connections() {
    let server = Server::start(&[]);
    let proxy = Proxy::start(server.addr);
    let client = Client::connect([proxy.addr.to_string()]).unwrap();
    proxy.wait_open(2);
    let lock = client.acquire("closing", LONG_LEASE, None).unwrap().expect("free key");
    drop(client);
    proxy.wait_open(2);
    // The lock keeps the client's connections open; dropping it sends its
    // release, and then they close.
    drop(lock);
    proxy.wait_open(0);
    let mut other = server.connect();
    // The release may still be on its way to the server: wait for it.
    token_of(&other.call("A closing 30 20"), "closing");
}

/// Runs `call` on its own thread and gives its result, or fails the test if
/// it has not returned within `limit` (a hang must fail, not block the run).
fn within<T: Send + 'static>(limit: Duration, call: impl FnOnce() -> T + Send + 'static) -> T {
    let (sender, receiver) = std::sync::mpsc::channel();
    thread::spawn(move || {
        let _ = sender.send(call());
    });
    receiver.recv_timeout(limit).expect("the call returned")
}

#[test]
fn a_ping_to_a_node_that_accepts_then_closes_fails_within_the_connect_limit() {
    let server = Server::start(&[]);
    let proxy = Proxy::start(server.addr);
    // Every connection is accepted and closed at once, before it answers:
    // the ping goes out on each and is cut, which must not start its wait
    // for a connection over.
    proxy.set_refusing(true);
    let address = proxy.addr.to_string();
    let client = Client::builder([address.clone()])
        .connect_limit(Duration::from_secs(1))
        .reconnect_delay_max(Duration::from_millis(200))
        .connect()
        .unwrap();
    let error = within(Duration::from_secs(60), move || client.ping()).unwrap_err();
    assert!(matches!(&error, Error::NoConnection { addresses, .. } if addresses[0].address == address), "{error:?}");
    assert!(proxy.refused() >= 1, "the proxy turned connections away");
}

#[test]
fn a_dropped_acquire_future_is_never_sent() {
    let server = Server::start(&[]);
    let proxy = Proxy::start(server.addr);
    proxy.set_refusing(true);
    let client =
        Client::builder([proxy.addr.to_string()]).reconnect_delay_max(Duration::from_millis(200)).connect().unwrap();
    let abandoned = client.acquire_async("abandoned", LONG_LEASE, Some(Duration::from_secs(60)));
    wait_until("the acquire to wait for a connection", || client.retry_count() == 1);
    drop(abandoned);
    proxy.set_refusing(false);
    proxy.wait_open(2);
    wait_until("both connections usable", || client.usable_connection_count() == 2);
    // Sent at once when a connection came up, or dropped then: either way
    // it no longer waits.
    wait_until("the acquire to leave the retry queue", || client.retry_count() == 0);
    // A request behind it on each connection: once both are answered,
    // anything the client sent before them has reached the server.
    client.ping().unwrap();
    client.ping().unwrap();
    for id in proxy.open_ids() {
        let sent = proxy.upstream_of(id);
        assert!(!contains(&sent, b"A abandoned "), "connection {id} carried {:?}", String::from_utf8_lossy(&sent));
    }
    let mut observer = server.connect();
    assert_eq!(observer.call("I abandoned"), "I abandoned - 0 0", "nobody holds or waits for the key");
}

#[test]
fn an_extend_of_a_grant_that_waited_longer_than_its_lease_waits_for_a_connection() {
    let server = Server::start(&[]);
    let mut holder = server.connect();
    // The holder's lease runs out 8 s from now, and only then is the key
    // granted to the acquire below, whose 5 s lease starts with the grant.
    holder.acquire("late-grant", "8", "0");
    let proxy = Proxy::start(server.addr);
    let client =
        Client::builder([proxy.addr.to_string()]).reconnect_delay_max(Duration::from_millis(200)).connect().unwrap();
    let lock = client.acquire("late-grant", Duration::from_secs(5), None).unwrap().expect("granted once free");

    // No connection: the extend waits for one within the lease it has left.
    proxy.set_refusing(true);
    proxy.cut_all();
    wait_until("both connections to be seen broken", || client.usable_connection_count() == 0);
    let extender = thread::spawn(move || lock.extend(Duration::from_secs(5)).map(|()| lock));
    wait_until("the extend to wait for a connection, or to end", || {
        client.retry_count() == 1 || extender.is_finished()
    });
    proxy.set_refusing(false);
    let lock = extender.join().unwrap().expect("extended once a connection came back");
    assert_eq!(lock.release(), Ok(ReleaseOutcome::Released));
}
