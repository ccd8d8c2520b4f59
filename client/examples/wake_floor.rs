//! The ceiling of any blocking client on one CPU: how many times per second
//! `--threads` threads (default 64) can block and be woken, with no network
//! and no lock server, only the hand-offs a blocking call needs.
//!
//! Each worker thread posts a request to a queue and blocks; one thread,
//! standing for the client's I/O thread, takes every posted request in one
//! batch and wakes each poster, as replies arriving together would. Then the
//! worker posts again. A lock cycle of the blocking API is two such round
//! trips (acquire, then release with its acknowledgement), so half the rate
//! printed here bounds the lock cycles/s any blocking client can reach with
//! this many threads on this CPU, however fast its I/O and its server.
//!
//! ```text
//! taskset -c 0 cargo run --release -p ringlock-client --example wake_floor -- --threads 64 --seconds 4
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

/// One worker's place: its thread, and whether its request is answered.
#[derive(Default)]
struct Slot {
    thread: OnceLock<Thread>,
    answered: AtomicBool,
}

struct Shared {
    slots: Vec<Slot>,
    posted: Mutex<Vec<usize>>,
    waker: OnceLock<Thread>,
    /// Whether the waker may be parked (so a poster must unpark it).
    waker_asleep: AtomicBool,
    stop: AtomicBool,
    round_trips: AtomicU64,
}

fn main() {
    let mut threads = 64usize;
    let mut seconds = 4u64;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().and_then(|value| value.parse::<u64>().ok());
        match (flag.as_str(), value) {
            ("--threads", Some(value)) if value > 0 => threads = value as usize,
            ("--seconds", Some(value)) if value > 0 => seconds = value,
            _ => {
                eprintln!("usage: wake_floor [--threads 64] [--seconds 4]");
                std::process::exit(2);
            }
        }
    }
    let shared = Arc::new(Shared {
        slots: (0..threads).map(|_| Slot::default()).collect(),
        posted: Mutex::new(Vec::with_capacity(threads)),
        waker: OnceLock::new(),
        waker_asleep: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        round_trips: AtomicU64::new(0),
    });

    let waker = {
        let shared = shared.clone();
        thread::spawn(move || wake(&shared, threads))
    };
    let workers: Vec<_> = (0..threads)
        .map(|index| {
            let shared = shared.clone();
            thread::spawn(move || work(&shared, index))
        })
        .collect();

    thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    let first = shared.round_trips.load(Ordering::Relaxed);
    thread::sleep(Duration::from_secs(seconds));
    let count = shared.round_trips.load(Ordering::Relaxed) - first;
    let elapsed = start.elapsed().as_secs_f64();
    shared.stop.store(true, Ordering::SeqCst);
    for worker in workers {
        worker.thread().unpark();
        worker.join().expect("a worker panicked");
    }
    waker.join().expect("the waker panicked");
    let rate = count as f64 / elapsed;
    println!(
        "{threads} threads, {elapsed:.1} s: {rate:.0} block-and-wake round trips/s, \
         so at most {:.0} blocking lock cycles/s on this CPU",
        rate / 2.0
    );
}

/// The I/O thread's part: answer every posted request, one batch at a time.
fn wake(shared: &Shared, threads: usize) {
    shared.waker.set(thread::current()).expect("one waker");
    let mut batch = Vec::with_capacity(threads);
    while !shared.stop.load(Ordering::Relaxed) {
        std::mem::swap(&mut batch, &mut *shared.posted.lock().expect("queue"));
        if batch.is_empty() {
            shared.waker_asleep.store(true, Ordering::SeqCst);
            // A post after the swap must not be slept through.
            if shared.posted.lock().expect("queue").is_empty() {
                thread::park_timeout(Duration::from_millis(10));
            }
            shared.waker_asleep.store(false, Ordering::SeqCst);
            continue;
        }
        for index in batch.drain(..) {
            let slot = &shared.slots[index];
            slot.answered.store(true, Ordering::Release);
            if let Some(thread) = slot.thread.get() {
                thread.unpark();
            }
        }
    }
}

/// A blocking caller: post, block until answered, count, again.
fn work(shared: &Shared, index: usize) {
    let slot = &shared.slots[index];
    slot.thread.set(thread::current()).expect("one thread per slot");
    while !shared.stop.load(Ordering::Relaxed) {
        shared.posted.lock().expect("queue").push(index);
        if shared.waker_asleep.load(Ordering::SeqCst)
            && let Some(waker) = shared.waker.get()
        {
            waker.unpark();
        }
        while !slot.answered.swap(false, Ordering::Acquire) {
            thread::park_timeout(Duration::from_millis(10));
            if shared.stop.load(Ordering::Relaxed) {
                return;
            }
        }
        shared.round_trips.fetch_add(1, Ordering::Relaxed);
    }
}
