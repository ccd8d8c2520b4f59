//! The Rust client's lock promises against the real server: the three wait
//! forms, `held()` asking the server, the local view, auto-extend and its
//! lost-lock signal (flag, future, callback), a lock rebuilt from (key,
//! token), the error kinds, and `ringlock-cli run` (default lease with
//! auto-extend, a lost lock's exit status, a second Ctrl+C). A lock kept
//! through a failover is `cluster_client.rs`'s, run with the other cluster
//! tests.

mod common;

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use common::{Server, block_on, client_of, wait_until};
use ringlock_client::proto::ErrorCode;
use ringlock_client::{BadArgument, Client, Error, ReleaseOutcome};

const LEASE: Duration = Duration::from_secs(600);
/// Generous bounds for what must happen, not timings.
const PATIENCE: Duration = Duration::from_secs(60);

/// A `ringlock-cli` and everything in its process group, killed when
/// dropped (a failed test leaves nothing running).
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        // SAFETY: signalling the process group this test started.
        unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

fn cli() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ringlock-cli"))
}

/// Runs `acquire` on a thread of its own and returns its result, failing
/// the test (rather than hanging) if it never comes: an acquire queued
/// behind a holder of a long lease would not return.
fn returns<T: Send + 'static>(acquire: impl FnOnce() -> T + Send + 'static) -> T {
    let (sender, result) = mpsc::channel();
    thread::spawn(move || sender.send(acquire()));
    result.recv_timeout(PATIENCE).expect("the acquire returned")
}

/// Scenario wait-forms: try once (`try_acquire`, or a bare zero) is not
/// queued behind the holder, a duration runs out, no limit is granted once
/// the holder releases; and a try with no usable connection waits for one
/// like `try_acquire`.
#[test]
fn wait_forms() {
    let mut server = Server::start(&[]);
    let addr = server.addr.to_string();
    let client = Client::builder([addr.clone()]).connect_limit(PATIENCE).connect().unwrap();
    let holder = client.acquire("forms/held", LEASE, Some(Duration::ZERO)).unwrap().expect("a free key is granted");
    let waiter = client_of(&server);
    let trying = waiter.clone();
    assert!(returns(move || trying.try_acquire("forms/held", LEASE)).unwrap().is_none(), "held: not granted");
    let trying = waiter.clone();
    let zero = returns(move || trying.acquire("forms/held", LEASE, Some(Duration::ZERO)));
    assert!(zero.unwrap().is_none(), "a bare zero tries once");
    let trying = waiter.clone();
    let zero = returns(move || block_on(trying.acquire_async("forms/held", LEASE, Some(Duration::ZERO))));
    assert!(zero.unwrap().is_none());
    assert_eq!(waiter.inspect("forms/held").unwrap().waiters, 0, "no try left queued behind the holder");
    assert!(waiter.acquire("forms/held", LEASE, Some(Duration::from_millis(200))).unwrap().is_none(), "ran out");
    assert_eq!(
        waiter.acquire("forms/held", LEASE, Some(Duration::from_secs(86_401))).unwrap_err(),
        Error::BadArgument(BadArgument::Wait)
    );
    let queued = waiter.clone();
    let (sender, granted) = mpsc::channel();
    thread::spawn(move || sender.send(queued.acquire("forms/held", LEASE, None)));
    wait_until("the acquire with no limit to queue", || waiter.inspect("forms/held").unwrap().waiters == 1);
    let holder_token = holder.token();
    assert_eq!(holder.release(), Ok(ReleaseOutcome::Released));
    let next = granted.recv_timeout(PATIENCE).unwrap().unwrap().expect("no limit: granted after the release");
    assert!(next.token() > holder_token);
    assert_eq!(next.release(), Ok(ReleaseOutcome::Released));
    assert!(waiter.try_acquire("forms/held", LEASE).unwrap().is_some(), "a free key is taken at once");

    // With no usable connection, a try waits for one up to the connect
    // limit, not for its 1 ms.
    server.kill9();
    wait_until("the connections to be seen broken", || client.usable_connection_count() == 0);
    let trying = client.clone();
    let (sender, result) = mpsc::channel();
    thread::spawn(move || sender.send(trying.acquire("forms/restart", LEASE, Some(Duration::ZERO))));
    thread::sleep(Duration::from_millis(100));
    let _restarted = Server::start_in(server.data_dir(), &["--listen", &addr]);
    let lock = result.recv_timeout(PATIENCE).unwrap().unwrap();
    assert!(lock.is_some(), "granted once the server was back");
}

#[test]
fn a_wait_over_a_day_is_refused_naming_the_range() {
    let server = Server::start(&[]);
    let client = client_of(&server);
    let error = client.acquire("forms/long", LEASE, Some(Duration::from_secs(86_401))).unwrap_err();
    assert_eq!(error, Error::BadArgument(BadArgument::Wait));
    let text = error.to_string();
    assert!(text.contains("1 ms") && text.contains("86400 s"), "{text}");
    assert!(client.acquire("forms/long", LEASE, Some(Duration::from_secs(86_400))).unwrap().is_some());
}

/// Scenario held-asks-server: `held` asks the server, `is_locked` is the
/// local view.
#[test]
fn held_asks_server() {
    let mut server = Server::start(&[]);
    let addr = server.addr.to_string();
    let client = client_of(&server);
    let other = client_of(&server);
    let lock = client.acquire("held/released", LEASE, None).unwrap().unwrap();
    assert!(lock.held().unwrap());
    assert!(block_on(lock.held_async()).unwrap());
    assert!(lock.is_locked());
    assert_eq!(other.release("held/released", lock.token()), Ok(ReleaseOutcome::Released));
    assert!(!lock.held().unwrap(), "released by someone else with the token");
    assert!(!block_on(lock.held_async()).unwrap());
    assert!(lock.is_locked(), "the local view cannot know");
    // Someone else's grant on the key is not this lock's.
    let _theirs = other.acquire("held/released", LEASE, None).unwrap().unwrap();
    assert!(!lock.held().unwrap());

    let short = client.acquire("held/expires", Duration::from_millis(100), None).unwrap().unwrap();
    wait_until("the local view to see the lease run out", || !short.is_locked());
    assert!(!short.is_lost(), "not auto-extended: run out, not declared lost");
    wait_until("the server to expire it", || !short.held().unwrap());

    // A restarted single node forgot the grant: held asks it and says so.
    let forgotten = client.acquire("held/restart", LEASE, None).unwrap().unwrap();
    assert!(forgotten.held().unwrap());
    server.kill9();
    let _restarted = Server::start_in(server.data_dir(), &["--listen", &addr]);
    assert!(!forgotten.held().unwrap(), "the restarted server holds no grant of it");
    assert!(forgotten.is_locked(), "the local view cannot know");
}

#[test]
fn auto_extend_keeps_a_short_lease_alive() {
    let server = Server::start(&[]);
    let client = client_of(&server);
    let lock = client.acquire("auto/alive", Duration::from_millis(300), None).unwrap().unwrap();
    lock.auto_extend();
    lock.auto_extend();
    // Many leases long, with the key wanted by someone else all along.
    let rival = client_of(&server);
    assert!(rival.acquire("auto/alive", LEASE, Some(Duration::from_secs(2))).unwrap().is_none(), "still held");
    assert!(lock.held().unwrap());
    assert!(lock.is_locked());
    assert!(!lock.is_lost());
    assert!(!lock.lost().wait_timeout(Duration::from_millis(10)));
    assert_eq!(lock.release(), Ok(ReleaseOutcome::Released));
}

#[test]
fn a_release_with_the_token_from_elsewhere_is_reported_lost() {
    let server = Server::start(&[]);
    let client = client_of(&server);
    let lock = client.acquire("auto/stolen", Duration::from_millis(600), None).unwrap().unwrap();
    let (sender, called) = mpsc::channel();
    let sender = Mutex::new(sender);
    lock.on_lost(move || sender.lock().unwrap().send(()).unwrap());
    lock.auto_extend();
    let lost = lock.lost();
    assert!(!lost.wait_timeout(Duration::from_millis(10)));
    assert_eq!(client_of(&server).release("auto/stolen", lock.token()), Ok(ReleaseOutcome::Released));
    assert!(lost.wait_timeout(PATIENCE), "the next extend found not-holder");
    assert!(lock.is_lost());
    assert!(!lock.is_locked());
    called.recv_timeout(PATIENCE).expect("the callback ran");
    block_on(lock.lost());
    let (late_sender, late) = mpsc::channel();
    lock.on_lost(move || late_sender.send(()).unwrap());
    late.try_recv().expect("a callback given after the loss runs at once");
    assert_eq!(lock.release(), Ok(ReleaseOutcome::NotHeld));
}

/// Scenario single-node-restart-reports-lost: a single node killed and
/// restarted reports every auto-extended lock lost.
#[test]
fn single_node_restart_reports_lost() {
    let mut server = Server::start(&[]);
    let addr = server.addr.to_string();
    let client = Client::connect([addr.clone()]).unwrap();
    let locks: Vec<_> = (0..3)
        .map(|index| {
            let lock = client.acquire(format!("restart/{index}"), Duration::from_secs(3), None).unwrap().unwrap();
            lock.auto_extend();
            lock
        })
        .collect();
    let (sender, called) = mpsc::channel();
    for lock in &locks {
        let sender = Mutex::new(sender.clone());
        let token = lock.token();
        lock.on_lost(move || sender.lock().unwrap().send(token).unwrap());
    }
    server.kill9();
    let _restarted = Server::start_in(server.data_dir(), &["--listen", &addr]);
    for lock in &locks {
        block_on(lock.lost());
        assert!(lock.is_lost());
        assert!(!lock.is_locked());
        assert!(!lock.held().unwrap(), "the restarted node forgot the grant");
    }
    let mut tokens: Vec<u64> = (0..3).map(|_| called.recv_timeout(PATIENCE).unwrap()).collect();
    tokens.sort_unstable();
    let mut expected: Vec<u64> = locks.iter().map(|lock| lock.token()).collect();
    expected.sort_unstable();
    assert_eq!(tokens, expected, "each callback ran once");
}

/// Scenario lock-from-key-and-token: a lock taken by the CLI is rebuilt
/// from key and token, and released from Rust.
#[test]
fn lock_from_key_and_token() {
    let server = Server::start(&[]);
    let servers = server.addr.to_string();
    let output = cli().args(["--servers", &servers, "acquire", "from/cli", "--lease", "600"]).output().unwrap();
    assert!(output.status.success(), "{output:?}");
    let token: u64 = String::from_utf8(output.stdout).unwrap().trim().parse().unwrap();
    let client = client_of(&server);
    let wrong = client.lock_from("from/cli", token + 1, LEASE).unwrap();
    assert!(!wrong.held().unwrap(), "a wrong token");
    assert_eq!(wrong.release(), Ok(ReleaseOutcome::NotHeld), "a wrong token releases nothing");
    let lock = client.lock_from("from/cli", token, Duration::from_secs(1)).unwrap();
    assert_eq!(lock.token(), token);
    assert!(lock.held().unwrap());
    assert!(lock.is_locked());
    lock.extend(LEASE).unwrap();
    assert_eq!(lock.release(), Ok(ReleaseOutcome::Released));
    assert_eq!(client.inspect("from/cli").unwrap().token, None, "released from Rust");
    assert_eq!(client.lock_from("-", 1, LEASE).unwrap_err(), Error::BadArgument(BadArgument::DashKey));
    assert_eq!(client.lock_from("k", 1, Duration::ZERO).unwrap_err(), Error::BadArgument(BadArgument::Lease));
}

/// Scenario error-kinds: each kind of error of clients/README.md's table,
/// matched by its variant.
#[test]
fn error_kinds() {
    let server = Server::start(&["--max-lease", "60"]);
    let lease = Duration::from_secs(30);
    let client = client_of(&server);
    // Bad arguments, refused before sending, naming the range.
    let error = client.acquire("errors/k", Duration::ZERO, None).unwrap_err();
    assert_eq!(error, Error::BadArgument(BadArgument::Lease));
    assert!(error.to_string().contains("at least 1 ms"), "{error}");
    let error = client.acquire("errors/k", lease, Some(Duration::from_secs(86_401))).unwrap_err();
    assert_eq!(error, Error::BadArgument(BadArgument::Wait));
    assert!(error.to_string().contains("from 1 ms to 86400 s"), "{error}");
    // A lease above the server's limit: its bad-lease, naming the limit.
    let error = client.acquire("errors/k", Duration::from_secs(120), None).unwrap_err();
    assert_eq!(error, Error::Server(ErrorCode::BadLease));
    assert!(error.to_string().contains("--max-lease"), "{error}");
    // Timeout: not an error, no grant.
    let holder = client.acquire("errors/k", lease, None).unwrap().unwrap();
    assert!(client.acquire("errors/k", lease, Some(Duration::from_millis(50))).unwrap().is_none());
    // Not holder, once the grant is gone.
    let stale = client.lock_from("errors/k", holder.token(), lease).unwrap();
    assert_eq!(holder.release(), Ok(ReleaseOutcome::Released));
    assert_eq!(stale.extend(lease), Err(Error::Server(ErrorCode::NotHolder)));
    assert_eq!(stale.release(), Ok(ReleaseOutcome::NotHeld), "nothing left to release");
    // No connection: the address and the OS error.
    let refusing = common::RefusingPort::new();
    let unreachable =
        Client::builder([refusing.addr.to_string()]).connect_limit(Duration::from_millis(300)).connect().unwrap();
    let error = unreachable.ping().unwrap_err();
    let Error::NoConnection { addresses, .. } = &error else { panic!("a connection error: {error:?}") };
    assert_eq!(addresses.len(), 1);
    assert_eq!(addresses[0].address, refusing.addr.to_string());
    assert_eq!(addresses[0].kind, std::io::ErrorKind::ConnectionRefused);
    assert_eq!(addresses[0].os_error, Some(libc::ECONNREFUSED));
    assert!(error.to_string().contains(&format!("{} (connection refused)", refusing.addr)), "{error}");
}

#[test]
fn cli_run_needs_no_lease_and_keeps_the_lock_while_the_command_runs() {
    let server = Server::start(&[]);
    let servers = server.addr.to_string();
    let client = client_of(&server);
    let mut run =
        cli().args(["--servers", &servers, "run", "--key", "cli/default", "--", "sleep", "3"]).spawn().unwrap();
    wait_until("the run to hold the key", || client.inspect("cli/default").unwrap().token.is_some());
    let lease_left = client.inspect("cli/default").unwrap().lease_left;
    assert!(lease_left > Duration::from_secs(3) && lease_left <= Duration::from_secs(30), "{lease_left:?}");
    assert!(run.wait().unwrap().success());
    assert_eq!(client.inspect("cli/default").unwrap().token, None, "released when the command ended");
}

#[test]
fn cli_run_stops_the_command_and_exits_3_when_the_lock_is_lost() {
    let server = Server::start(&[]);
    let servers = server.addr.to_string();
    let client = client_of(&server);
    let run = cli()
        .args(["--servers", &servers, "run", "--key", "cli/lost", "--lease", "0.6", "--", "sleep", "600"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("the run to hold the key", || client.inspect("cli/lost").unwrap().token.is_some());
    let token = client.inspect("cli/lost").unwrap().token.unwrap();
    assert_eq!(client.release("cli/lost", token), Ok(ReleaseOutcome::Released));
    let output = run.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("lost the lock on cli/lost"), "{stderr}");
}

#[test]
fn a_second_interrupt_kills_a_command_that_ignores_the_first() {
    let server = Server::start(&[]);
    let servers = server.addr.to_string();
    let client = client_of(&server);
    let dir = common::DataDir::new();
    std::fs::create_dir_all(&dir.0).unwrap();
    let ready = dir.0.join("ready");
    // A command that ignores SIGINT and SIGTERM: only SIGKILL ends it.
    let script = format!("trap '' INT TERM; touch {}; while :; do sleep 0.05; done", ready.display());
    let mut run = Reaped(
        cli()
            .args(["--servers", &servers, "run", "--key", "cli/stubborn", "--", "sh", "-c", &script])
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap(),
    );
    let run = &mut run.0;
    wait_until("the command to start", || ready.exists());
    let pid = run.id() as i32;
    // SAFETY: signalling the process this test started.
    unsafe { libc::kill(pid, libc::SIGINT) };
    thread::sleep(Duration::from_millis(200));
    assert!(run.try_wait().unwrap().is_none(), "the first interrupt is only passed on, and ignored");
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGINT) };
    let status = run.wait().unwrap();
    assert_eq!(status.code(), Some(128 + libc::SIGKILL), "{status:?}");
    let mut stderr = String::new();
    std::io::Read::read_to_string(run.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(stderr.contains("second interrupt"), "{stderr}");
    assert_eq!(client.inspect("cli/stubborn").unwrap().token, None, "released after the kill");
}
