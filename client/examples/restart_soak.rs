//! The Rust client's worker for `scripts/restart-soak.sh`: `--workers`
//! threads (default 8) share one client and loop acquire (lease `--lease`,
//! wait `--wait`) then release over `--keys` keys, while the script restarts
//! the server under them. It prints `ready` once a first lock cycle went
//! through, runs until its standard input ends, and then prints one JSON
//! line of what the calls saw (the script reads it; the fields are described
//! there).
//!
//! ```text
//! cargo run --release -p ringlock-client --example restart_soak -- --addr 127.0.0.1:7700 < some-fifo
//! ```

use std::fmt::Write as _;
use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ringlock_client::{Client, Error, ReleaseOutcome};

struct Options {
    address: String,
    workers: usize,
    keys: usize,
    lease: Duration,
    wait: Duration,
}

fn options() -> Options {
    let mut options = Options {
        address: "127.0.0.1:7700".into(),
        workers: 8,
        keys: 4,
        lease: Duration::from_secs(10),
        wait: Duration::from_secs(5),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().unwrap_or_else(|| usage(&format!("{flag} needs a value")));
        let seconds = || value.parse::<f64>().map(Duration::from_secs_f64).unwrap_or_else(|_| usage("not seconds"));
        match flag.as_str() {
            "--addr" => options.address = value.clone(),
            "--workers" => options.workers = value.parse().unwrap_or_else(|_| usage("--workers takes a number")),
            "--keys" => options.keys = value.parse().unwrap_or_else(|_| usage("--keys takes a number")),
            "--lease" => options.lease = seconds(),
            "--wait" => options.wait = seconds(),
            other => usage(&format!("unknown flag {other}")),
        }
    }
    options
}

fn usage(problem: &str) -> ! {
    eprintln!("restart_soak: {problem}");
    eprintln!("usage: restart_soak [--addr host:port] [--workers 8] [--keys 4] [--lease 10] [--wait 5]");
    std::process::exit(2)
}

/// Seconds since the Unix epoch: the script lines these up with its restarts.
fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |since| since.as_secs_f64())
}

/// What one worker saw.
#[derive(Default)]
struct Tally {
    ok: u64,
    lost_by_restart: u64,
    not_granted: u64,
    failed: u64,
    /// (when, call, kind, message) of each failed call.
    failures: Vec<(f64, &'static str, String, String)>,
    /// (acquire asked at, release answered at) of each release answered
    /// not-holder: a restart must have stopped the server in between.
    lost: Vec<(f64, f64)>,
    last_answer: Option<f64>,
    /// The longest time between two answered calls: (from, to).
    stall: (f64, f64),
}

impl Tally {
    fn answered(&mut self, at: f64) {
        if let Some(last) = self.last_answer
            && at - last > self.stall.1 - self.stall.0
        {
            self.stall = (last, at);
        }
        self.last_answer = Some(at);
    }

    fn failed(&mut self, call: &'static str, error: &Error) {
        self.failed += 1;
        self.failures.push((now(), call, kind(error), error.to_string()));
    }
}

/// The error's kind, as the client's error table in clients/README.md names it.
fn kind(error: &Error) -> String {
    match error {
        Error::NoConnection { .. } => "NoConnection".into(),
        Error::NoActive => "NoActive".into(),
        Error::Server(code) => format!("Server({code})"),
        other => format!("{other:?}").split(['(', ' ', '{']).next().unwrap_or("other").to_owned(),
    }
}

fn work(client: &Client, options: &Options, index: usize, stop: &AtomicBool, ready: &AtomicBool) -> Tally {
    let keys: Vec<String> = (0..options.keys).map(|key| format!("restart-soak/{key}")).collect();
    let mut tally = Tally::default();
    let mut turn = index;
    while !stop.load(Ordering::Relaxed) {
        turn += 1;
        let key = &keys[turn % keys.len()];
        let asked_at = now();
        let lock = match client.acquire(key, options.lease, Some(options.wait)) {
            Ok(Some(lock)) => lock,
            Ok(None) => {
                tally.not_granted += 1;
                continue;
            }
            Err(error) => {
                tally.failed("acquire", &error);
                // A failure that comes at once must not spin the loop.
                thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let acquired_at = now();
        tally.ok += 1;
        tally.answered(acquired_at);
        match lock.release() {
            Ok(ReleaseOutcome::Released) => {
                tally.ok += 1;
                tally.answered(now());
                ready.store(true, Ordering::Relaxed);
            }
            Ok(ReleaseOutcome::NotHeld) => {
                let at = now();
                tally.lost_by_restart += 1;
                tally.lost.push((asked_at, at));
                tally.answered(at);
            }
            Err(error) => tally.failed("release", &error),
        }
    }
    tally
}

fn main() {
    let options = Arc::new(options());
    let client = Client::connect([options.address.clone()]).unwrap_or_else(|error| usage(&error.to_string()));
    let stop = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        thread::spawn(move || {
            // Anything until the end of input: the script closes it to stop.
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
            stop.store(true, Ordering::Relaxed);
        });
    }
    let tallies = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..options.workers)
        .map(|index| {
            let (client, options, stop, ready, tallies) =
                (client.clone(), options.clone(), stop.clone(), ready.clone(), tallies.clone());
            thread::spawn(move || {
                let tally = work(&client, &options, index, &stop, &ready);
                tallies.lock().expect("tallies").push(tally);
            })
        })
        .collect();
    while !ready.load(Ordering::Relaxed) && !stop.load(Ordering::Relaxed) {
        thread::sleep(Duration::from_millis(10));
    }
    println!("ready");
    for worker in workers {
        worker.join().expect("a worker thread panicked");
    }
    let tallies = tallies.lock().expect("tallies");
    println!("{}", report(&options, &tallies));
}

/// One JSON line: the sums over the workers, every failure and lost lock,
/// and the longest stall of any worker.
fn report(options: &Options, tallies: &[Tally]) -> String {
    let sum = |field: fn(&Tally) -> u64| tallies.iter().map(field).sum::<u64>();
    let stall = tallies.iter().map(|tally| tally.stall).max_by(|a, b| (a.1 - a.0).total_cmp(&(b.1 - b.0)));
    let (stall_from, stall_to) = stall.unwrap_or((0.0, 0.0));
    let mut json = format!(
        "{{\"client\":\"rust\",\"workers\":{},\"ok\":{},\"lost_by_restart\":{},\"not_granted\":{},\"failed\":{},\
         \"stall_s\":{:.6},\"stall_from\":{stall_from:.6},\"stall_to\":{stall_to:.6},\"failures\":[",
        options.workers,
        sum(|tally| tally.ok),
        sum(|tally| tally.lost_by_restart),
        sum(|tally| tally.not_granted),
        sum(|tally| tally.failed),
        stall_to - stall_from,
    );
    let failures = tallies.iter().flat_map(|tally| &tally.failures);
    for (index, (at, call, kind, message)) in failures.enumerate() {
        let comma = if index == 0 { "" } else { "," };
        let _ = write!(json, "{comma}[{at:.6},\"{call}\",{},{}]", quoted(kind), quoted(message));
    }
    json.push_str("],\"lost\":[");
    for (index, (acquired, answered)) in tallies.iter().flat_map(|tally| &tally.lost).enumerate() {
        let comma = if index == 0 { "" } else { "," };
        let _ = write!(json, "{comma}[{acquired:.6},{answered:.6}]");
    }
    json.push_str("]}");
    json
}

/// A JSON string.
fn quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for character in text.chars() {
        match character {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            control if u32::from(control) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(control));
            }
            other => out.push(other),
        }
    }
    out.push('"');
    out
}
