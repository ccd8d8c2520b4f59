//! The rules of docs/protocol.md §1 over the wire, against the real server process.

mod common;

use std::time::Duration;

use common::{Conn, Server, stat, token_of, wait_until};

#[test]
fn a_free_key_is_granted_and_released() {
    let server = Server::start(&[]);
    let mut conn = server.connect();
    let token = conn.acquire("alpha", "30", "0");
    assert_eq!(conn.call(&format!("R alpha {token}")), "R alpha");
    assert_eq!(conn.call(&format!("R alpha {token}")), "E R alpha not-holder", "a released grant is gone");
    wait_until("the key to leave the table", || stat(&mut conn, "keys") == 0);
}

#[test]
fn release_hands_the_key_to_the_first_waiter_with_a_greater_token() {
    let server = Server::start(&[]);
    let mut holder = server.connect();
    let mut first = server.connect();
    let mut second = server.connect();
    let token = holder.acquire("k", "30", "0");
    first.request("A k 30 0");
    wait_until("the first waiter to queue", || stat(&mut holder, "waiters") == 1);
    second.request("A k 30 0");
    wait_until("the second waiter to queue", || stat(&mut holder, "waiters") == 2);
    assert_eq!(holder.call(&format!("R k {token}")), "R k");
    let first_token = token_of(&first.line(), "k");
    assert!(first_token > token);
    assert_eq!(second.try_line(Duration::from_millis(100)), None, "the second waiter still waits");
    assert_eq!(first.call(&format!("R k {first_token}")), "R k");
    let second_token = token_of(&second.line(), "k");
    assert!(second_token > first_token);
}

#[test]
fn an_expired_lease_hands_the_key_on_and_the_old_token_is_refused() {
    let server = Server::start(&[]);
    let mut holder = server.connect();
    let mut waiter = server.connect();
    let token = holder.acquire("k", "0.2", "0");
    waiter.request("A k 30 0");
    let next = token_of(&waiter.line(), "k");
    assert!(next > token);
    assert_eq!(holder.call(&format!("R k {token}")), "E R k not-holder");
    assert_eq!(holder.call(&format!("X k {token} 10")), "E X k not-holder");
    assert!(stat(&mut holder, "expiries") >= 1);
}

#[test]
fn a_wait_that_runs_out_answers_t_and_grants_nothing() {
    let server = Server::start(&[]);
    let mut holder = server.connect();
    let mut waiter = server.connect();
    let token = holder.acquire("k", "30", "0");
    waiter.request("A k 30 0.1");
    assert_eq!(waiter.line(), "T k");
    assert_eq!(holder.call(&format!("R k {token}")), "R k");
    assert_eq!(waiter.try_line(Duration::from_millis(200)), None, "no grant after a T");
    wait_until("the key to be free", || stat(&mut holder, "keys") == 0);
}

#[test]
fn wait_zero_waits_until_the_key_is_released() {
    let server = Server::start(&[]);
    let mut holder = server.connect();
    let mut waiter = server.connect();
    let token = holder.acquire("k", "30", "0");
    waiter.request("A k 30 0");
    assert_eq!(waiter.try_line(Duration::from_millis(300)), None);
    holder.call(&format!("R k {token}"));
    token_of(&waiter.line(), "k");
}

#[test]
fn extend_keeps_the_key_past_its_first_lease() {
    let server = Server::start(&[]);
    let mut holder = server.connect();
    let mut waiter = server.connect();
    let token = holder.acquire("k", "0.3", "0");
    assert_eq!(holder.call(&format!("X k {token} 30")), format!("X k {token}"));
    waiter.request("A k 30 0.6");
    assert_eq!(waiter.line(), "T k", "the extended lease outlived the waiter's wait");
    assert_eq!(holder.call(&format!("X k {token} 0.05")), format!("X k {token}"));
    wait_until("the shortened lease to run out", || stat(&mut holder, "held_keys") == 0);
}

#[test]
fn any_connection_may_release_and_a_closed_holder_keeps_its_lock() {
    let server = Server::start(&[]);
    let mut holder = server.connect();
    let token = holder.acquire("k", "30", "0");
    drop(holder);
    let mut other = server.connect();
    wait_until("the holder's connection to close", || stat(&mut other, "connections") == 1);
    assert_eq!(stat(&mut other, "held_keys"), 1, "a connection drop does not release");
    assert_eq!(other.call(&format!("R k {token}")), "R k");
}

#[test]
fn a_waiter_whose_connection_closes_leaves_the_queue() {
    let server = Server::start(&[]);
    let mut holder = server.connect();
    let mut leaving = server.connect();
    let mut staying = server.connect();
    let token = holder.acquire("k", "30", "0");
    leaving.request("A k 30 0");
    wait_until("the first waiter to queue", || stat(&mut holder, "waiters") == 1);
    staying.request("A k 30 0");
    wait_until("the second waiter to queue", || stat(&mut holder, "waiters") == 2);
    drop(leaving);
    wait_until("the closed waiter to leave", || stat(&mut holder, "waiters") == 1);
    holder.call(&format!("R k {token}"));
    token_of(&staying.line(), "k");
}

#[test]
fn locks_are_not_reentrant() {
    let server = Server::start(&[]);
    let mut conn = server.connect();
    let token = conn.acquire("k", "30", "0");
    conn.request("A k 30 0.2");
    assert_eq!(conn.line(), "T k", "a second acquire by the holder waits like any other");
    assert_eq!(conn.call(&format!("R k {token}")), "R k");
}

#[test]
fn pipelined_replies_come_back_as_they_are_ready() {
    let server = Server::start(&[]);
    let mut holder = server.connect();
    let token = holder.acquire("busy", "30", "0");
    let mut conn = server.connect();
    // One write, three requests: the first waits, the others complete first.
    conn.send(b"A busy 30 0\nA free 30 0\nP\n");
    let free = conn.line();
    token_of(&free, "free");
    assert!(conn.line().starts_with("P active "));
    holder.call(&format!("R busy {token}"));
    token_of(&conn.line(), "busy");
}

#[test]
fn replies_for_one_key_keep_request_order_on_a_connection() {
    let server = Server::start(&[]);
    let mut holder = server.connect();
    let token = holder.acquire("k", "30", "0");
    let mut conn = server.connect();
    // The second acquire's wait runs out first, and the third is malformed,
    // but their answers wait behind the first acquire of the same key.
    conn.send(b"A k 30 0\nA k 30 0.1\nA k 0 0\n");
    assert_eq!(conn.try_line(Duration::from_millis(400)), None);
    holder.call(&format!("R k {token}"));
    token_of(&conn.line(), "k");
    assert_eq!(conn.line(), "T k");
    assert_eq!(conn.line(), "E A k bad-lease");
}

#[test]
fn a_release_is_answered_before_the_grant_it_hands_to_the_same_connection() {
    let server = Server::start(&[]);
    let mut conn = server.connect();
    let token = conn.acquire("k", "30", "0");
    conn.request("A k 30 0");
    wait_until("the second acquire to queue", || stat(&mut server.connect(), "waiters") == 1);
    // The release is answered first, then the grant it handed on.
    conn.request(&format!("R k {token}"));
    assert_eq!(conn.line(), "R k");
    let next = token_of(&conn.line(), "k");
    assert!(next > token);
    assert_eq!(conn.call(&format!("R k {next}")), "R k");
}

#[test]
fn one_connection_reaches_keys_on_every_shard() {
    let server = Server::start(&["--shards", "2"]);
    let mut conn = server.connect();
    let mut tokens = Vec::new();
    for index in 0..64 {
        tokens.push(conn.acquire(&format!("key-{index}"), "30", "0"));
    }
    // Each core publishes its counters at the end of its loop turn.
    wait_until("both shards' counters", || stat(&mut conn, "grants") == 64);
    let stats = conn.call("S");
    let shards = &stats[stats.find("\"shards\":[").unwrap()..];
    let grants: Vec<u64> = shards
        .match_indices("\"grants\":")
        .map(|(at, needle)| {
            shards[at + needle.len()..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
        })
        .collect();
    assert_eq!(grants.len(), 2, "{stats}");
    assert!(grants.iter().all(|&count| count > 0), "keys on both shards: {grants:?}");
    assert_eq!(grants.iter().sum::<u64>(), 64);
    // Hand-off across shards: a waiter on another connection of another core.
    let mut waiter = server.connect();
    waiter.request("A key-7 30 0");
    wait_until("the waiter to queue", || stat(&mut conn, "waiters") == 1);
    conn.call(&format!("R key-7 {}", tokens[7]));
    assert!(token_of(&waiter.line(), "key-7") > tokens[7]);
    for (index, token) in tokens.iter().enumerate() {
        if index != 7 {
            assert_eq!(conn.call(&format!("R key-{index} {token}")), format!("R key-{index}"));
        }
    }
}

#[test]
fn ping_and_stats_describe_the_node() {
    let server = Server::start(&[]);
    let mut conn = server.connect();
    let pong = conn.call("P");
    let fields: Vec<&str> = pong.split(' ').collect();
    assert_eq!(fields.len(), 4, "{pong}");
    assert_eq!((fields[0], fields[1]), ("P", "active"));
    assert!(fields[2].parse::<u64>().unwrap() > 0);
    assert_eq!(fields[3], server.addr.to_string());
    let stats = conn.call("S");
    for field in [
        "\"role\":\"active\"",
        "\"grants\"",
        "\"releases\"",
        "\"extends\"",
        "\"expiries\"",
        "\"timeouts\"",
        "\"handoffs\"",
        "\"held_keys\"",
        "\"waiters\"",
        "\"connections\"",
        "\"not-holder\"",
    ] {
        assert!(stats.contains(field), "{field} missing in {stats}");
    }
}

#[test]
fn many_clients_and_pipelined_requests_are_all_answered() {
    let server = Server::start(&["--shards", "2"]);
    let threads: Vec<_> = (0..8)
        .map(|thread| {
            let addr = server.addr;
            std::thread::spawn(move || {
                let mut conn = Conn::connect(addr);
                let mut batch = String::new();
                for index in 0..500 {
                    batch.push_str(&format!("A t{thread}-{index} 30 0\n"));
                }
                conn.send(batch.as_bytes());
                let mut releases = String::new();
                for _ in 0..500 {
                    let reply = conn.line();
                    let fields: Vec<&str> = reply.split(' ').collect();
                    assert_eq!(fields[0], "A", "{reply}");
                    releases.push_str(&format!("R {} {}\n", fields[1], fields[2]));
                }
                conn.send(releases.as_bytes());
                for _ in 0..500 {
                    assert!(conn.line().starts_with("R t"));
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let mut conn = server.connect();
    wait_until("every release to be counted", || stat(&mut conn, "releases") == 4000);
    assert_eq!(stat(&mut conn, "grants"), 4000);
    assert_eq!(stat(&mut conn, "keys"), 0);
}
