//! Several clusters (docs/protocol.md §4, "Several clusters") against real
//! servers: the Rust client's `Clusters` sends each key to the server its
//! name's score chooses (checked on each server with raw `I` lines), and
//! the drain procedure moves a cluster's keys to the others without taking
//! a held key twice; `ringlock-cli --cluster` does the same from the shell.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{Conn, Server, block_on, client_of, stat, wait_until};
use ringlock_client::{Clusters, Lock, ReleaseOutcome, cluster_for};

const LEASE: Duration = Duration::from_secs(600);
const KEYS: usize = 40;

/// The token holding `key` on the server of `conn`, if any.
fn holder(conn: &mut Conn, key: &str) -> Option<u64> {
    let reply = conn.call(&format!("I {key}"));
    let token = reply.split(' ').nth(2).unwrap_or_else(|| panic!("an I reply: {reply}"));
    token.parse().ok()
}

fn keys() -> Vec<String> {
    (0..KEYS).map(|index| format!("orders/{index}")).collect()
}

#[test]
fn each_key_goes_to_the_cluster_its_score_names_and_only_there() {
    let (a, b) = (Server::start(&[]), Server::start(&[]));
    let clusters = Clusters::new([("a", client_of(&a)), ("b", client_of(&b))]).unwrap();
    let (mut on_a, mut on_b) = (a.connect(), b.connect());
    let mut locks = Vec::new();
    for key in keys() {
        let chosen = cluster_for(&["a", "b"], &key).unwrap();
        assert_eq!(clusters.name_for(&key), chosen);
        let lock = clusters.acquire(&key, LEASE, Some(Duration::from_secs(5))).unwrap().expect("a free key");
        let (there, elsewhere) = if chosen == "a" { (&mut on_a, &mut on_b) } else { (&mut on_b, &mut on_a) };
        assert_eq!(holder(there, &key), Some(lock.token()), "{key} is held on {chosen}");
        assert_eq!(holder(elsewhere, &key), None, "{key} is not held on the other cluster");
        assert_eq!(clusters.inspect(&key).unwrap().token, Some(lock.token()));
        assert!(clusters.try_acquire(&key, LEASE).unwrap().is_none(), "{key} is held already");
        locks.push(lock);
    }
    let (held_a, held_b) = (stat(&mut on_a, "held_keys"), stat(&mut on_b, "held_keys"));
    assert_eq!(held_a + held_b, KEYS as u64);
    assert!(held_a > 0 && held_b > 0, "both clusters serve some keys: {held_a} and {held_b}");
    // Releases go to the key's cluster too, by lock or by (key, token).
    for (index, lock) in locks.into_iter().enumerate() {
        let key = lock.key().to_vec();
        let outcome =
            if index % 2 == 0 { lock.release().unwrap() } else { clusters.release(&key, lock.detach()).unwrap() };
        assert_eq!(outcome, ReleaseOutcome::Released);
    }
    assert_eq!(stat(&mut on_a, "held_keys") + stat(&mut on_b, "held_keys"), 0);
}

#[test]
fn the_async_calls_and_a_lock_rebuilt_from_its_token_go_to_the_keys_cluster() {
    let (a, b) = (Server::start(&[]), Server::start(&[]));
    let clusters = Clusters::new([("a", client_of(&a)), ("b", client_of(&b))]).unwrap();
    let (mut on_a, mut on_b) = (a.connect(), b.connect());
    for key in keys().iter().take(10) {
        let lock = block_on(clusters.acquire_async(key, LEASE, None)).unwrap().expect("no wait limit");
        assert!(block_on(clusters.try_acquire_async(key, LEASE)).unwrap().is_none());
        assert_eq!(block_on(clusters.inspect_async(key)).unwrap().token, Some(lock.token()));
        let conn = if clusters.name_for(key) == "a" { &mut on_a } else { &mut on_b };
        assert_eq!(holder(conn, key), Some(lock.token()));
        let rebuilt = clusters.lock_from(key, lock.detach(), LEASE).unwrap();
        assert!(rebuilt.held().unwrap(), "the rebuilt lock asks the key's cluster");
        assert_eq!(rebuilt.release().unwrap(), ReleaseOutcome::Released);
        assert_eq!(holder(conn, key), None);
    }
}

/// docs/protocol.md §4: drain a cluster before taking it out of the list.
/// Keys are held on both clusters; b's holders release until its `S` shows
/// no held keys; a `Clusters` without b then sends b's keys to a, where they
/// are free, while a's keys stay held by their holders.
#[test]
fn a_drained_cluster_leaves_the_list_and_its_keys_go_to_the_others() {
    let (a, b) = (Server::start(&[]), Server::start(&[]));
    let both = Clusters::new([("a", client_of(&a)), ("b", client_of(&b))]).unwrap();
    let locks: Vec<Lock> =
        keys().iter().map(|key| both.acquire(key, LEASE, None).unwrap().expect("no limit")).collect();
    let (on_a, on_b): (Vec<Lock>, Vec<Lock>) = locks.into_iter().partition(|lock| both.name_for(lock.key()) == "a");
    assert!(!on_a.is_empty() && !on_b.is_empty());
    // Drain b: its holders release (new work under its keys has stopped).
    let mut b_stats = b.connect();
    let moved: Vec<Vec<u8>> = on_b.iter().map(|lock| lock.key().to_vec()).collect();
    for lock in on_b {
        assert_eq!(lock.release().unwrap(), ReleaseOutcome::Released);
    }
    wait_until("b shows no held keys", || stat(&mut b_stats, "held_keys") == 0);
    let only_a = Clusters::new([("a", client_of(&a))]).unwrap();
    let mut a_conn = a.connect();
    for key in &moved {
        assert_eq!(only_a.name_for(key), "a");
        let lock = only_a.try_acquire(key, LEASE).unwrap().expect("a drained key is free on a");
        let key_text = std::str::from_utf8(key).unwrap();
        assert_eq!(holder(&mut a_conn, key_text), Some(lock.token()), "taken on a");
        lock.detach();
    }
    assert_eq!(stat(&mut b_stats, "held_keys"), 0, "nothing went to b");
    for lock in &on_a {
        assert!(only_a.try_acquire(lock.key(), LEASE).unwrap().is_none(), "a's keys stay held by their holders");
    }
    assert_eq!(stat(&mut a_conn, "held_keys"), (on_a.len() + moved.len()) as u64);
}

fn cli() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ringlock-cli"))
}

#[test]
fn cli_sends_each_key_to_its_cluster_and_asks_every_node_of_every_cluster() {
    let (a, b) = (Server::start(&[]), Server::start(&[]));
    let flags = ["--cluster".to_string(), format!("a={}", a.addr), "--cluster".to_string(), format!("b={}", b.addr)];
    let (mut on_a, mut on_b) = (a.connect(), b.connect());
    for key in keys().iter().take(12) {
        let acquired = cli().args(&flags).args(["acquire", key, "--lease", "600"]).output().unwrap();
        assert!(acquired.status.success(), "{acquired:?}");
        let token: u64 = String::from_utf8(acquired.stdout).unwrap().trim().parse().unwrap();
        let chosen = cluster_for(&["a", "b"], key).unwrap();
        let (there, elsewhere) = if chosen == "a" { (&mut on_a, &mut on_b) } else { (&mut on_b, &mut on_a) };
        assert_eq!(holder(there, key), Some(token), "{key} held on {chosen}");
        assert_eq!(holder(elsewhere, key), None);
        let shown = cli().args(&flags).args(["inspect", key]).output().unwrap();
        assert!(String::from_utf8(shown.stdout).unwrap().starts_with(&format!("{key} held token={token} ")));
        let released = cli().args(&flags).args(["release", key, &token.to_string()]).status().unwrap();
        assert!(released.success());
        assert_eq!(holder(there, key), None);
    }
    let ran = cli().args(&flags).args(["run", "--key", "cli/run", "--lease", "30", "--", "true"]).status().unwrap();
    assert!(ran.success());
    // RINGLOCK_SERVERS from the environment gives way to --cluster.
    let ping = cli().env("RINGLOCK_SERVERS", "127.0.0.1:1").args(&flags).arg("ping").output().unwrap();
    let ping = String::from_utf8(ping.stdout).unwrap();
    assert!(ping.contains(&format!("a {} active ", a.addr)), "{ping}");
    assert!(ping.contains(&format!("b {} active ", b.addr)), "{ping}");
    let stats = cli().args(&flags).args(["stats", "--raw"]).output().unwrap();
    let stats = String::from_utf8(stats.stdout).unwrap();
    assert!(stats.contains(&format!("# a {}\n{{", a.addr)), "{stats}");
    assert!(stats.contains(&format!("# b {}\n{{", b.addr)), "{stats}");
}

#[test]
fn cli_names_the_cluster_of_a_node_it_cannot_reach() {
    let server = Server::start(&[]);
    let nobody = common::RefusingPort::new();
    let (up, down) = (format!("up={}", server.addr), format!("down={}", nobody.addr));
    let ping = cli().args(["--cluster", &up, "--cluster", &down, "--connect-limit", "0.3", "ping"]).output().unwrap();
    assert!(ping.status.success(), "one node answered: {ping:?}");
    assert!(String::from_utf8(ping.stdout).unwrap().starts_with(&format!("up {} active ", server.addr)));
    let said = String::from_utf8(ping.stderr).unwrap();
    assert!(said.contains(&format!("is ringlock running at --cluster {down}?")), "{said}");
}

#[test]
fn cli_refuses_a_bad_cluster_flag_and_one_given_with_servers() {
    for (flags, said) in [
        (vec!["--cluster", "a"], "NAME=HOST:PORT"),
        (vec!["--cluster", "=127.0.0.1:1"], "NAME=HOST:PORT"),
        (vec!["--cluster", "a=127.0.0.1:1", "--cluster", "a=127.0.0.1:2"], "twice"),
        (vec!["--cluster", "a=127.0.0.1:1", "--servers", "127.0.0.1:2"], "cannot be used with"),
    ] {
        let output = cli().args(&flags).arg("ping").output().unwrap();
        assert!(!output.status.success(), "{flags:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(said), "{flags:?}: {stderr}");
    }
}
