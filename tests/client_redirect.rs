//! `M` replies teach the client the active node (docs/protocol.md §4): a fake standby
//! of the test kit, which answers every `A`, `R` and `X` with
//! `M <op> <key> <addr>`, sends the client to the real server.

mod common;

use std::time::Duration;

use common::Server;
use ringlock_client::{Client, Error, ReleaseOutcome};
use ringlock_testkit::{FakeStandby, Names};

const LEASE: Duration = Duration::from_secs(60);

#[test]
fn a_standby_sends_the_client_to_the_active_which_it_then_prefers() {
    let server = Server::start(&[]);
    let standby = FakeStandby::start(Names::Active(server.addr));
    // The standby first: round-robin starts with it.
    let client = Client::connect([standby.addr.to_string(), server.addr.to_string()]).unwrap();
    assert_eq!(client.active_node(), None);

    let lock = client.acquire("redirected", LEASE, None).unwrap().expect("no wait limit");
    assert_eq!(standby.redirected(), 1, "the first acquire went to the standby and was re-sent");
    assert_eq!(client.active_node(), Some(server.addr.to_string()));
    assert_eq!(lock.release(), Ok(ReleaseOutcome::Released));

    // From now on every request goes to the active, none to the standby.
    for round in 0..50 {
        let lock = client.acquire(format!("k/{round}"), LEASE, None).unwrap().expect("no wait limit");
        lock.extend(LEASE).unwrap();
        assert_eq!(lock.release(), Ok(ReleaseOutcome::Released));
    }
    assert_eq!(standby.redirected(), 1);
}

#[test]
fn an_active_the_client_was_not_given_is_added_to_its_set() {
    let server = Server::start(&[]);
    let standby = FakeStandby::start(Names::Active(server.addr));
    let client = Client::connect([standby.addr.to_string()]).unwrap();
    assert_eq!(client.connection_count(), 2);

    let lock = client.acquire("learned", LEASE, None).unwrap().expect("no wait limit");
    assert_eq!(client.active_node(), Some(server.addr.to_string()));
    assert_eq!(client.connection_count(), 4, "two connections to the learned node as well");
    assert_eq!(lock.release(), Ok(ReleaseOutcome::Released));
    let redirected = standby.redirected();
    for round in 0..20 {
        client.try_acquire(format!("k/{round}"), LEASE).unwrap().expect("free key");
    }
    assert_eq!(standby.redirected(), redirected, "the learned active is preferred");
}

#[test]
fn with_no_active_known_requests_are_retried_then_fail() {
    let standby = FakeStandby::start(Names::NoActive);
    let client = Client::builder([standby.addr.to_string()])
        .release_retry_interval(Duration::from_millis(20))
        .release_retry_for(Duration::from_millis(300))
        .connect()
        .unwrap();
    assert_eq!(client.acquire("nowhere", LEASE, None).unwrap_err(), Error::NoActive);
    assert!(standby.redirected() > 1, "the acquire was tried again while no active was known");
    // Pings are answered by every node, active or not.
    let pong = client.ping().unwrap();
    assert_eq!(pong.role, ringlock_client::proto::Role::Standby);
    assert_eq!(pong.active, None);
}

#[test]
fn a_node_that_keeps_redirecting_is_followed_up_to_the_limit() {
    let standby = FakeStandby::start(Names::Itself);
    let client = Client::builder([standby.addr.to_string()]).redirect_limit(3).connect().unwrap();
    assert_eq!(client.acquire("loop", LEASE, None).unwrap_err(), Error::NoActive);
    assert_eq!(standby.redirected(), 4, "the first try and three redirects");
}
