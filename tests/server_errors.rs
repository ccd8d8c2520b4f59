//! Every error code over the wire, and input that must never hurt the server.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use common::{Conn, Server, stat, token_of, wait_until};

#[test]
fn malformed_requests_get_their_error_codes_and_change_nothing() {
    let server = Server::start(&["--max-lease", "60"]);
    let mut conn = server.connect();
    let cases = [
        ("", "E - - bad-op"),
        ("Q k 1 0", "E - - bad-op"),
        ("a k 1 0", "E - - bad-op"),
        ("A k 1", "E A k bad-request"),
        ("A k 1 0 9", "E A k bad-request"),
        ("R k", "E R k bad-request"),
        ("X k 1", "E X k bad-request"),
        ("P extra", "E P - bad-request"),
        ("S extra", "E S - bad-request"),
        ("A k  1 0", "E A k bad-request"),
        ("A k 0 0", "E A k bad-lease"),
        ("A k -1 0", "E A k bad-lease"),
        ("A k 1.2345 0", "E A k bad-lease"),
        ("A k .5 0", "E A k bad-lease"),
        ("A k 1e3 0", "E A k bad-lease"),
        ("A k 61 0", "E A k bad-lease"),
        ("A k 99999999999999999999999999 0", "E A k bad-lease"),
        ("A k 1 86400.001", "E A k bad-wait"),
        ("A k 1 -2", "E A k bad-wait"),
        ("A k 1 x", "E A k bad-wait"),
        ("R k abc", "E R k bad-token"),
        ("R k 18446744073709551616", "E R k bad-token"),
        ("X k 1 0", "E X k bad-lease"),
        ("X k x 1", "E X k bad-token"),
        ("R k 18446744073709551615", "E R k not-holder"),
        ("X k 5 1", "E X k not-holder"),
    ];
    for (request, expected) in cases {
        assert_eq!(conn.call(request), expected, "request {request:?}");
    }
    let long_key = "x".repeat(251);
    assert_eq!(conn.call(&format!("A {long_key} 1 0")), "E A - bad-key");
    conn.send(b"A k\tey 1 0\n");
    assert_eq!(conn.line(), "E A - bad-key");
    conn.send(b"A k\0 1 0\n");
    assert_eq!(conn.line(), "E A - bad-key");
    conn.send(b"A k 1 0\r\n");
    token_of(&conn.line(), "k");
    assert_eq!(stat(&mut conn, "keys"), 1, "only the valid request changed state");
}

#[test]
fn a_key_of_250_bytes_and_a_line_of_1024_bytes_are_fine() {
    let server = Server::start(&[]);
    let mut conn = server.connect();
    let key = "k".repeat(250);
    conn.acquire(&key, "30", "0");
    // 1024 bytes with leading zeros in the lease, then CRLF.
    let line = format!("A other {:0>width$} 0", 5, width = 1024 - "A other  0".len());
    assert_eq!(line.len(), 1024);
    conn.send(format!("{line}\r\n").as_bytes());
    token_of(&conn.line(), "other");
}

#[test]
fn a_line_too_long_closes_only_that_connection() {
    let server = Server::start(&[]);
    let mut bystander = server.connect();
    let token = bystander.acquire("k", "30", "0");
    let mut conn = server.connect();
    conn.send(&vec![b'x'; 1025]);
    assert_eq!(conn.line(), "E - - line-too-long");
    assert!(conn.closed_by_server());
    // A megabyte with no newline at all, written while the server closes.
    let mut stream = TcpStream::connect(server.addr).unwrap();
    let _ = stream.write_all(&vec![b'A'; 1 << 20]);
    let mut reader = server.connect();
    reader.request("P");
    assert!(reader.line().starts_with("P active"));
    assert_eq!(bystander.call(&format!("R k {token}")), "R k", "other connections never notice");
}

#[test]
fn a_megabyte_without_a_newline_gets_line_too_long() {
    let server = Server::start(&[]);
    let mut conn = server.connect();
    let big = vec![b'A'; 1 << 20];
    // The server stops reading after the limit, so the write may not finish.
    let mut stream = conn.stream.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = stream.write_all(&big);
    });
    assert_eq!(conn.line(), "E - - line-too-long");
    assert!(conn.closed_by_server());
    writer.join().unwrap();
}

#[test]
fn binary_garbage_is_answered_and_harms_nobody() {
    let server = Server::start(&["--shards", "2"]);
    let mut bystander = server.connect();
    let token = bystander.acquire("k", "30", "0");
    let mut conn = server.connect();
    // A deterministic pseudo-random stream of bytes with newlines now and then.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut garbage = Vec::new();
    let mut lines = 0;
    for _ in 0..200_000 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let byte = (state >> 24) as u8;
        if byte < 4 || garbage.len() % 500 == 499 {
            garbage.push(b'\n');
            lines += 1;
        } else {
            garbage.push(byte);
        }
    }
    garbage.push(b'\n');
    lines += 1;
    conn.send(&garbage);
    let mut answered = 0;
    while answered < lines {
        let reply = conn.line();
        assert!(
            reply.starts_with("E ")
                || reply.starts_with("A ")
                || reply.starts_with("R ")
                || reply.starts_with("X ")
                || reply.starts_with("T ")
                || reply.starts_with("P ")
                || reply.starts_with("S "),
            "{reply:?}"
        );
        answered += 1;
    }
    assert_eq!(bystander.call(&format!("R k {token}")), "R k");
}

#[test]
fn limits_answer_too_many_keys_waiters_and_connections() {
    let server = Server::start(&[
        "--max-keys",
        "2",
        "--max-keys-per-connection",
        "0",
        "--max-waiters-per-key",
        "1",
        "--max-connections",
        "3",
    ]);
    let mut conn = server.connect();
    let mut other = server.connect();
    conn.acquire("a", "30", "0");
    conn.acquire("b", "30", "0");
    assert_eq!(conn.call("A c 30 0"), "E A c too-many-keys");
    other.request("A a 30 0");
    wait_until("the waiter to queue", || stat(&mut conn, "waiters") == 1);
    assert_eq!(conn.call("A a 30 0"), "E A a too-many-waiters");
    let mut third = server.connect();
    assert!(third.call("P").starts_with("P active"));
    let mut fourth = Conn::connect(server.addr);
    assert_eq!(fourth.line(), "E - - too-many-connections");
    assert!(fourth.closed_by_server());
    drop(third);
    wait_until("a connection slot to free up", || stat(&mut conn, "connections") == 2);
    let mut fifth = server.connect();
    assert!(fifth.call("P").starts_with("P active"), "a freed slot is usable again");
}

#[test]
fn a_client_that_never_reads_cannot_make_the_server_buffer_without_bound() {
    let server = Server::start(&[]);
    let before = server.rss_bytes();
    let mut stuck = TcpStream::connect(server.addr).unwrap();
    stuck.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    // 100k pipelined stats requests, never read: each answer is over a
    // kilobyte, so answering them all would take more than 100 MB.
    let requests = b"S\n".repeat(100_000);
    let writer = std::thread::spawn(move || {
        let _ = stuck.write_all(&requests);
        stuck
    });
    let mut other = server.connect();
    let token = other.acquire("k", "30", "0");
    assert_eq!(other.call(&format!("R k {token}")), "R k", "other clients are served meanwhile");
    let stuck = writer.join().unwrap();
    let after = server.rss_bytes();
    // The server keeps at most about a megabyte of replies and 64 KiB of
    // requests for a connection it cannot write to.
    assert!(after < before + (8 << 20), "RSS grew from {before} to {after} bytes");
    drop(stuck);
    wait_until("the stuck connection to close", || stat(&mut other, "connections") == 1);
}

#[test]
fn ten_thousand_connections_opened_and_dropped_leave_nothing_behind() {
    let server = Server::start(&["--shards", "2"]);
    let mut conn = server.connect();
    for round in 0..10 {
        let batch: Vec<TcpStream> = (0..1000).map(|_| TcpStream::connect(server.addr).unwrap()).collect();
        if round % 2 == 0 {
            for mut stream in &batch {
                let _ = stream.write_all(b"A shared 30 0\n");
            }
        }
        drop(batch);
    }
    wait_until("every dropped connection to close", || stat(&mut conn, "connections") == 1);
    wait_until("their waiters to leave", || stat(&mut conn, "waiters") == 0);
    assert!(conn.call("P").starts_with("P active"));
}

#[test]
fn queued_acquires_do_not_block_the_same_connections_later_requests() {
    let server = Server::start(&[]);
    let mut other = server.connect();
    other.acquire("busy", "60", "0");
    let mut conn = server.connect();
    let mine = conn.acquire("mine", "60", "0");
    let mut batch = "A busy 60 0\n".repeat(70_000);
    batch.push_str(&format!("R mine {mine}\n"));
    let mut writer = conn.stream.try_clone().unwrap();
    let sender = std::thread::spawn(move || writer.write_all(batch.as_bytes()).unwrap());
    // 65536 acquires queue; the refusals of the rest wait behind them (same
    // key, same connection), and the release is answered meanwhile.
    assert_eq!(conn.line(), "R mine");
    sender.join().unwrap();
    assert_eq!(stat(&mut other, "waiters"), 65_536);
}

#[test]
fn a_connection_at_its_quota_is_refused_new_keys_and_queues_while_other_connections_go_on() {
    let server = Server::start(&["--shards", "1", "--max-keys-per-connection", "3"]);
    assert!(server.log().contains("each connection may hold plus wait on at most 3 keys"), "{}", server.log());
    let mut filler = server.connect();
    let mut other = server.connect();
    let first = filler.acquire("f/1", "60", "1");
    filler.acquire("f/2", "60", "1");
    // A place in a queue counts as much as a held key.
    let other_token = other.acquire("o/1", "60", "1");
    filler.request("A o/1 60 0");
    wait_until("the filler's acquire to be queued", || other.inspect("o/1").2 == 1);

    assert_eq!(filler.call("A f/3 60 1"), "E A f/3 too-many-keys");
    assert_eq!(other.call("A o/2 60 1").split(' ').next(), Some("A"), "another connection goes on");
    other.acquire("held-by-other", "60", "1");
    assert_eq!(filler.call("A held-by-other 60 1"), "E A held-by-other too-many-waiters");

    // What the connection took and lets go of is its own again, whoever
    // releases it: a release (here from the other connection, with the
    // token), a grant that turns a place in a queue into a held key (no
    // change), a lease that runs out.
    assert_eq!(other.call(&format!("R f/1 {first}")), "R f/1");
    filler.acquire("f/short", "0.2", "1");
    assert_eq!(other.call(&format!("R o/1 {other_token}")), "R o/1");
    assert!(token_of(&filler.line(), "o/1") > other_token);
    assert_eq!(filler.call("A f/3 60 1"), "E A f/3 too-many-keys");
    wait_until("f/short's lease to run out", || other.inspect("f/short") == (None, 0, 0));
    filler.acquire("f/3", "60", "1");
    assert_eq!(filler.call("A f/4 60 1"), "E A f/4 too-many-keys");

    // The grants outlive the connection; a new connection has a count of
    // its own.
    drop(filler);
    let mut again = server.connect();
    for key in ["f/4", "f/5", "f/6"] {
        again.acquire(key, "60", "1");
    }
    assert_eq!(again.call("A f/7 60 1"), "E A f/7 too-many-keys");
    for key in ["f/2", "o/1", "f/3"] {
        assert!(other.inspect(key).0.is_some(), "{key} is still held");
    }
}

#[test]
fn a_per_connection_quota_of_0_is_none() {
    let server = Server::start(&["--shards", "1", "--max-keys-per-connection", "0"]);
    let mut conn = server.connect();
    for index in 0..5 {
        conn.acquire(&format!("k/{index}"), "60", "1");
    }
    assert!(server.log().contains("no per-connection quota"), "{}", server.log());
}
