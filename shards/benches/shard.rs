//! Micro-benchmark of one shard, with no I/O: how many acquire+release cycles
//! and hand-offs per second one core can do, how many bytes a held lock and
//! a waiter cost, and the longest single acquire while the shard's tables grow.
//!
//! Run with `cargo bench -p ringlock-shards --bench shard` (add `-- --quick`
//! for a short run). Pin it with `taskset -c 1` for steadier figures.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ringlock_shards::{ClientId, Effect, Shard, ShardConfig, TokenRange};

/// Counts live heap bytes, to measure the shard's memory per lock.
struct Counting;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(new_size, Ordering::Relaxed);
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const CLIENT: ClientId = ClientId(1);

fn shard() -> Shard {
    let mut shard = Shard::new(ShardConfig { hash_seed: 1, ..ShardConfig::default() }, 0);
    shard.add_token_range(0, TokenRange { epoch: 1, first: 0, end: 1 << 39 }).unwrap();
    shard.drain_effects().for_each(drop);
    shard
}

/// 16-byte keys, as in the figures of docs/performance.md.
fn key(index: u64) -> [u8; 16] {
    let mut key = *b"key-000000000000";
    let mut value = index;
    for byte in key[4..].iter_mut().rev() {
        *byte = b'0' + (value % 10) as u8;
        value /= 10;
    }
    key
}

/// The token of the first reply among the effects.
fn granted_token(shard: &mut Shard) -> u64 {
    let mut token = 0;
    for effect in shard.drain_effects() {
        if let Effect::Reply { reply: ringlock_shards::ShardReply::Acquired { token: t, .. }, .. } = effect {
            token = t;
        }
    }
    token
}

fn uncontended(cycles: u64, key_space: u64) -> f64 {
    let mut shard = shard();
    let keys: Vec<[u8; 16]> = (0..key_space).map(key).collect();
    let start = Instant::now();
    let mut index = 0usize;
    for cycle in 0..cycles {
        let key = &keys[index];
        index = (index + 7919) % keys.len();
        let now = cycle / 4096;
        shard.acquire(now, CLIENT, key, 30_000, 0);
        let token = granted_token(&mut shard);
        shard.release(now, CLIENT, key, token);
        shard.drain_effects().for_each(drop);
        if cycle % 4096 == 0 {
            shard.advance(now);
        }
    }
    black_box(&shard);
    cycles as f64 / start.elapsed().as_secs_f64()
}

fn contended(handoffs: u64, waiters: u64) -> f64 {
    let mut shard = shard();
    let hot = key(0);
    shard.acquire(0, ClientId(0), &hot, 30_000, 0);
    let mut token = granted_token(&mut shard);
    for client in 1..=waiters {
        shard.acquire(0, ClientId(client), &hot, 30_000, 10_000);
    }
    let start = Instant::now();
    for round in 0..handoffs {
        // Release hands the key to the first waiter; the old holder queues again.
        shard.release(0, ClientId(round % waiters), &hot, token);
        token = granted_token(&mut shard);
        shard.acquire(0, ClientId(round % waiters), &hot, 30_000, 10_000);
        shard.drain_effects().for_each(drop);
    }
    black_box(&shard);
    handoffs as f64 / start.elapsed().as_secs_f64()
}

fn bytes_per_held_lock(locks: u64) -> f64 {
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    let mut shard = shard();
    for index in 0..locks {
        shard.acquire(0, CLIENT, &key(index), 30_000, 0);
        shard.drain_effects().for_each(drop);
    }
    assert_eq!(shard.stats().held_keys, locks);
    let bytes = LIVE_BYTES.load(Ordering::Relaxed) - before;
    black_box(&shard);
    bytes as f64 / locks as f64
}

/// The longest single acquire while `keys` new keys fill an empty shard:
/// what the worst growth of its tables costs the one request that meets it.
fn longest_acquire_while_filling(keys: u64) -> Duration {
    let mut shard = shard();
    let mut longest = Duration::ZERO;
    for index in 0..keys {
        let key = key(index);
        let start = Instant::now();
        shard.acquire(0, CLIENT, &key, 30_000, 0);
        longest = longest.max(start.elapsed());
        shard.drain_effects().for_each(drop);
    }
    black_box(&shard);
    longest
}

fn bytes_per_waiter(waiters: u64) -> f64 {
    let mut shard = shard();
    // Waiters spread over 1 Ki held keys, each from its own connection, with a wait limit.
    for index in 0..1024 {
        shard.acquire(0, CLIENT, &key(index), 30_000, 0);
    }
    shard.drain_effects().for_each(drop);
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    for index in 0..waiters {
        shard.acquire(0, ClientId(index + 2), &key(index % 1024), 30_000, 10_000);
    }
    assert_eq!(shard.stats().waiters, waiters);
    let bytes = LIVE_BYTES.load(Ordering::Relaxed) - before;
    black_box(&shard);
    bytes as f64 / waiters as f64
}

fn main() {
    let quick = std::env::args().any(|arg| arg == "--quick");
    let scale = if quick { 10 } else { 1 };
    println!("ringlock-shards micro-benchmark (one thread, no I/O)");
    for key_space in [1024u64, 1 << 20] {
        let rate = uncontended(20_000_000 / scale, key_space);
        println!("uncontended acquire+release, {key_space} keys: {:.2} M cycles/s", rate / 1e6);
    }
    let rate = contended(10_000_000 / scale, 64);
    println!("contended hand-offs, 1 key, 64 waiters: {:.2} M hand-offs/s", rate / 1e6);
    let locks = 1 << 20;
    println!("memory per held lock ({locks} locks, 16-byte keys): {:.1} B", bytes_per_held_lock(locks));
    let keys = 10_000_000 / scale;
    let longest = longest_acquire_while_filling(keys);
    println!("longest acquire while filling {keys} keys: {:.2} ms", longest.as_secs_f64() * 1e3);
    let waiters = 1 << 20;
    println!("memory per waiter ({waiters} waiters on 1024 keys): {:.1} B", bytes_per_waiter(waiters));
}
