//! The client's API against the real server: grants, timeouts, extends,
//! releases (explicit, on drop, of a stale grant), cancelled async acquires,
//! argument checks, server errors, and the answer when nothing listens.

mod common;

use std::future::Future;
use std::pin::pin;
use std::task::Context;
use std::thread;
use std::time::Duration;

use common::{Server, block_on, client_of, token_of, wait_until, waker};
use ringlock_client::proto::{ErrorCode, Role};
use ringlock_client::{BadArgument, Client, Error, ReleaseOutcome};

const LEASE: Duration = Duration::from_secs(600);

#[test]
fn acquire_extend_release() {
    let server = Server::start(&[]);
    let client = client_of(&server);
    let lock = client.acquire("api/basic", LEASE, Some(Duration::from_secs(1))).unwrap().expect("free key");
    assert_eq!(lock.key(), b"api/basic");
    lock.extend(Duration::from_secs(30)).unwrap();
    let first_token = lock.token();
    assert_eq!(lock.release(), Ok(ReleaseOutcome::Released));
    let again = client.acquire("api/basic", LEASE, None).unwrap().expect("released key");
    assert!(again.token() > first_token);
}

#[test]
fn a_held_key_times_out_for_others() {
    let server = Server::start(&[]);
    let client = client_of(&server);
    let _held = client.acquire("api/held", LEASE, None).unwrap().expect("free key");
    assert!(client.try_acquire("api/held", LEASE).unwrap().is_none());
    assert!(client.acquire("api/held", LEASE, Some(Duration::from_millis(50))).unwrap().is_none());
}

#[test]
fn a_waiter_gets_the_key_when_the_holder_releases() {
    let server = Server::start(&[]);
    let client = client_of(&server);
    let holder = client.acquire("api/handoff", LEASE, None).unwrap().expect("free key");
    let holder_token = holder.token();
    let mut raw = server.connect();
    raw.request("A api/handoff 30 0");
    // The raw waiter is queued once the server counts it.
    wait_until("a waiter", || client.stats().unwrap().contains("\"waiters\":1"));
    assert_eq!(holder.release(), Ok(ReleaseOutcome::Released));
    assert!(token_of(&raw.line(), "api/handoff") > holder_token);
}

#[test]
fn dropping_a_lock_releases_it() {
    let server = Server::start(&[]);
    let client = client_of(&server);
    let lock = client.acquire("api/drop", LEASE, None).unwrap().expect("free key");
    drop(lock);
    let mut raw = server.connect();
    // Granted as soon as the background release arrives, long before the lease.
    token_of(&raw.call("A api/drop 30 20"), "api/drop");
}

#[test]
fn releasing_an_expired_grant_reports_not_held_and_extending_it_fails() {
    let server = Server::start(&[]);
    let client = client_of(&server);
    let lock = client.acquire("api/expired", Duration::from_millis(50), None).unwrap().expect("free key");
    // Someone else gets the key once the lease ran out.
    let mut raw = server.connect();
    let other = token_of(&raw.call("A api/expired 600 20"), "api/expired");
    assert!(other > lock.token());
    assert_eq!(lock.extend(LEASE), Err(Error::Server(ErrorCode::NotHolder)));
    assert_eq!(lock.release(), Ok(ReleaseOutcome::NotHeld));
    // The other holder's grant was left alone.
    assert_eq!(raw.call(&format!("R api/expired {other}")), "R api/expired");
}

#[test]
fn async_acquire_extend_release() {
    let server = Server::start(&[]);
    let client = client_of(&server);
    block_on(async {
        let lock = client.acquire_async("api/async", LEASE, None).await.unwrap().expect("free key");
        lock.extend_async(LEASE).await.unwrap();
        assert!(client.try_acquire_async("api/async", LEASE).await.unwrap().is_none());
        assert_eq!(lock.release_async().await, Ok(ReleaseOutcome::Released));
        let pong = client.ping_async().await.unwrap();
        assert_eq!(pong.role, Role::Active);
        assert!(client.stats_async().await.unwrap().starts_with('{'));
    });
}

#[test]
fn a_dropped_acquire_future_releases_the_grant_it_would_have_had() {
    let server = Server::start(&[]);
    let mut holder = server.connect();
    let holder_token = holder.acquire("api/abandoned", "600", "0");
    let client = client_of(&server);
    {
        let mut acquire = pin!(client.acquire_async("api/abandoned", LEASE, None));
        let waker = waker();
        assert!(acquire.as_mut().poll(&mut Context::from_waker(&waker)).is_pending());
        wait_until("the acquire to queue", || client.stats().unwrap().contains("\"waiters\":1"));
    }
    // The holder hands the key to the abandoned acquire, whose grant the
    // client releases at once: a third party gets it well within its lease.
    assert_eq!(holder.call(&format!("R api/abandoned {holder_token}")), "R api/abandoned");
    let mut third = server.connect();
    token_of(&third.call("A api/abandoned 30 20"), "api/abandoned");
}

#[test]
fn bad_arguments_are_refused_before_sending() {
    let server = Server::start(&[]);
    let client = client_of(&server);
    let bad = |key: &[u8], lease, wait| client.acquire(key, lease, wait).unwrap_err();
    assert_eq!(bad(b"", LEASE, None), Error::BadArgument(BadArgument::Key));
    assert_eq!(bad(b"two words", LEASE, None), Error::BadArgument(BadArgument::Key));
    assert_eq!(bad(b"line\n", LEASE, None), Error::BadArgument(BadArgument::Key));
    assert_eq!(bad(&[b'k'; 251], LEASE, None), Error::BadArgument(BadArgument::Key));
    assert_eq!(bad(b"-", LEASE, None), Error::BadArgument(BadArgument::DashKey));
    assert_eq!(bad(b"k", Duration::ZERO, None), Error::BadArgument(BadArgument::Lease));
    assert_eq!(bad(b"k", LEASE, Some(Duration::from_secs(86_401))), Error::BadArgument(BadArgument::Wait));
    let future_error = block_on(client.acquire_async("-", LEASE, None)).unwrap_err();
    assert_eq!(future_error, Error::BadArgument(BadArgument::DashKey));
    // Longest key and longest wait are fine.
    let long_key = vec![b'k'; 250];
    assert!(client.acquire(&long_key, LEASE, Some(Duration::from_secs(86_400))).unwrap().is_some());
    // Nothing invalid reached the server.
    let stats = client.stats().unwrap();
    for code in ["bad-key", "bad-lease", "bad-wait", "bad-request"] {
        assert!(stats.contains(&format!("\"{code}\":0")), "{code} in {stats}");
    }
}

#[test]
fn server_refusals_are_typed() {
    let server = Server::start(&["--max-lease", "10"]);
    let client = client_of(&server);
    assert_eq!(
        client.acquire("api/long", Duration::from_secs(11), None).unwrap_err(),
        Error::Server(ErrorCode::BadLease)
    );
    let lock = client.acquire("api/long", Duration::from_secs(10), None).unwrap().expect("free key");
    assert_eq!(lock.extend(Duration::from_secs(11)), Err(Error::Server(ErrorCode::BadLease)));
}

#[test]
fn with_nothing_listening_requests_fail_with_no_connection() {
    let port = common::RefusingPort::new();
    let client = Client::builder([port.addr.to_string()]).connect_limit(Duration::from_millis(200)).connect().unwrap();
    let refused = |error: Error| match error {
        Error::NoConnection { addresses, .. } => addresses[0].kind == std::io::ErrorKind::ConnectionRefused,
        _ => false,
    };
    assert!(refused(client.try_acquire("nowhere", LEASE).unwrap_err()));
    assert!(refused(client.ping().unwrap_err()));
}

#[test]
fn ping_names_the_active() {
    let server = Server::start(&[]);
    let client = client_of(&server);
    let pong = client.ping().unwrap();
    assert_eq!(pong.role, Role::Active);
    assert!(pong.epoch > 0);
    assert_eq!(pong.active, Some(server.addr.to_string()));
}

#[test]
fn inspect_reports_free_held_and_queued_keys_sync_and_async() {
    let server = Server::start(&[]);
    let client = client_of(&server);
    let free = client.inspect("api/inspect").unwrap();
    assert_eq!((free.token, free.lease_left, free.waiters), (None, Duration::ZERO, 0));
    let lock = client.acquire("api/inspect", LEASE, None).unwrap().expect("free key");
    let held = client.inspect("api/inspect").unwrap();
    assert_eq!((held.token, held.waiters), (Some(lock.token()), 0));
    assert!(held.lease_left > Duration::from_secs(500) && held.lease_left <= LEASE, "{held:?}");
    // A second client queues behind the holder.
    let other = client_of(&server);
    let waiting = thread::spawn(move || other.acquire("api/inspect", LEASE, None).unwrap());
    wait_until("the second acquire to queue", || client.inspect("api/inspect").unwrap().waiters == 1);
    let queued = block_on(client.inspect_async("api/inspect")).unwrap();
    assert_eq!((queued.token, queued.waiters), (Some(lock.token()), 1));
    let first = lock.token();
    assert_eq!(lock.release(), Ok(ReleaseOutcome::Released));
    let next = waiting.join().unwrap().expect("granted on release");
    assert!(next.token() > first);
    assert_eq!(client.inspect("api/inspect").unwrap().token, Some(next.token()));
}
