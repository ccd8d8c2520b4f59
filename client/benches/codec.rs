//! Micro-benchmark of the wire codec on the lines a loaded server sees: how
//! many nanoseconds one request line takes to decode and one reply line to
//! encode, with no I/O.
//!
//! Run with `cargo bench -p ringlock-client --bench codec` (add `-- --quick`
//! for a short run). Pin it with `taskset -c 1` for steadier figures.

use std::hint::black_box;
use std::time::Instant;

use ringlock_client::proto::{
    Decoded, LEASE_MS_MAX_DEFAULT, Reply, Request, decode_request, encode_reply, encode_request,
};

/// Lines per buffer: a few hundred pipelined requests, as one `recv` brings.
const LINES: usize = 512;

/// A token as long as the server's: epoch in the high bits.
const TOKEN_BASE: u64 = 1_099_511_627_776_000;

/// 16-byte keys, as the load generator writes them: `k` and 15 digits.
fn key(index: u64) -> [u8; 16] {
    let mut key = *b"k000000000000000";
    let mut value = index;
    for byte in key[1..].iter_mut().rev() {
        *byte = b'0' + (value % 10) as u8;
        value /= 10;
    }
    key
}

/// Acquires and releases, alternating, as the uncontended workload sends them.
fn request_lines() -> Vec<u8> {
    let mut buf = Vec::new();
    for index in 0..LINES as u64 / 2 {
        let key = key(index * 7919 % 10_000_000);
        encode_request(&Request::Acquire { key: &key, lease_ms: 30_000, wait_ms: 10_000 }, &mut buf);
        encode_request(&Request::Release { key: &key, token: TOKEN_BASE + index }, &mut buf);
    }
    buf
}

/// Nanoseconds per decoded line.
fn decode(rounds: usize) -> f64 {
    let buf = request_lines();
    let start = Instant::now();
    for _ in 0..rounds {
        let mut rest = black_box(&buf[..]);
        while let Decoded::Line { consumed, item } = decode_request(rest, LEASE_MS_MAX_DEFAULT) {
            black_box(item.ok());
            rest = &rest[consumed..];
        }
        assert!(rest.is_empty());
    }
    start.elapsed().as_nanos() as f64 / (rounds * LINES) as f64
}

/// Nanoseconds per encoded reply (`A <key> <token>` and `R <key>`, alternating).
fn encode(rounds: usize) -> f64 {
    let keys: Vec<[u8; 16]> = (0..LINES as u64 / 2).map(|index| key(index * 7919 % 10_000_000)).collect();
    let mut out = Vec::with_capacity(LINES * 40);
    let start = Instant::now();
    for _ in 0..rounds {
        out.clear();
        for (index, key) in black_box(&keys).iter().enumerate() {
            encode_reply(&Reply::Acquired { key, token: TOKEN_BASE + index as u64 }, &mut out);
            encode_reply(&Reply::Released { key }, &mut out);
        }
        black_box(&out);
    }
    start.elapsed().as_nanos() as f64 / (rounds * LINES) as f64
}

fn main() {
    let quick = std::env::args().any(|arg| arg == "--quick");
    let rounds = if quick { 2_000 } else { 20_000 };
    println!("ringlock-client codec micro-benchmark (one thread, no I/O)");
    println!("decode_request, A and R lines with 16-byte keys: {:.1} ns/line", decode(rounds));
    println!("encode_reply, A <key> <token> and R <key>: {:.1} ns/line", encode(rounds));
}
