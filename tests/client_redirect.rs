//! `M` replies teach the client the active node (SPEC §4): a fake standby,
//! a tiny TCP server in this file that answers every `A`, `R` and `X` with
//! `M <op> <key> <addr>`, sends the client to the real server.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::Duration;

use common::Server;
use ringlock_client::{Client, Error, ReleaseOutcome};

const LEASE: Duration = Duration::from_secs(60);

/// A standby that knows `active` (or no active, for `None`) and serves nothing.
struct FakeStandby {
    addr: SocketAddr,
    /// Lock requests it answered with `M`.
    redirected: Arc<AtomicUsize>,
    closed: Arc<AtomicBool>,
}

/// Whom a fake standby names as the active.
enum Names {
    Active(SocketAddr),
    NoActive,
    Itself,
}

impl FakeStandby {
    fn start(names: Names) -> FakeStandby {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let active = match names {
            Names::Active(active) => Some(active),
            Names::NoActive => None,
            Names::Itself => Some(addr),
        };
        let redirected = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicBool::new(false));
        let active = active.map_or("-".to_string(), |active| active.to_string());
        let (counter, stop) = (redirected.clone(), closed.clone());
        thread::spawn(move || {
            for stream in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let (active, counter) = (active.clone(), counter.clone());
                thread::spawn(move || serve(stream, &active, &counter));
            }
        });
        FakeStandby { addr, redirected, closed }
    }

    fn redirected(&self) -> usize {
        self.redirected.load(Ordering::SeqCst)
    }
}

impl Drop for FakeStandby {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve(stream: TcpStream, active: &str, redirected: &AtomicUsize) {
    let mut writer = stream.try_clone().unwrap();
    for line in BufReader::new(stream).lines() {
        let Ok(line) = line else { return };
        let fields: Vec<&str> = line.split(' ').collect();
        let reply = match fields[0] {
            "A" | "R" | "X" if fields.len() >= 2 => {
                redirected.fetch_add(1, Ordering::SeqCst);
                format!("M {} {} {active}\n", fields[0], fields[1])
            }
            "P" => format!("P standby 0 {active}\n"),
            "S" => "S {\"role\":\"standby\"}\n".to_string(),
            _ => "E - - bad-op\n".to_string(),
        };
        if writer.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

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
