//! Measures one failover of a ringlock cluster as its clients see it.
//!
//! Client threads acquire and release keys of their own through one client
//! that knows every node. After a warm-up the probe sends a signal to the
//! active node's process (`kill -9` by default, or `INT` for a Ctrl+C
//! hand-off), keeps the load running until the new active has granted, and
//! prints one line of `name=value` figures:
//!
//! - `first_grant_ms`: from the signal to the first grant by the new active;
//! - `gap_ms`: from the last grant of the old active to the first grant of the
//!   new one, the time the clients saw no active;
//! - `lost`: grants of the old active whose release then found nothing (the
//!   new active never learned of them);
//! - counts of grants, timeouts and client errors, and both epochs;
//! - `lag_p50_ms`, `lag_max_ms`: the replication lag during the warm-up, how
//!   long the oldest change a standby had not applied yet had existed on the
//!   active, sampled every 5 ms through the `"table"` versions of `S`.
//!
//! Keys are named after the probe's process id, so that grants lost or left
//! behind by one run (they hold their keys until their leases end) do not
//! slow the next run down.
//!
//! A grant belongs to the new active when its token's epoch (the token's bits
//! 63..40, as the README documents) is above the epoch the active showed
//! before the signal.
//!
//! ```text
//! cargo run --release -p ringlock-client --example failover_probe -- \
//!     --addr 127.0.0.1:7700 --addr 127.0.0.1:7701 --addr 127.0.0.1:7702 --pid 12345 --signal KILL
//! ```

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use ringlock_client::{Client, ReleaseOutcome};

/// Low bits of a token that hold its sequence; the epoch is above them.
const SEQUENCE_BITS: u32 = 40;

struct Options {
    addresses: Vec<String>,
    pid: u32,
    signal: String,
    threads: usize,
    keys_per_thread: usize,
    hold: Duration,
    lease: Duration,
    warm_up: Duration,
    after: Duration,
    timeout: Duration,
}

fn options() -> Options {
    let mut options = Options {
        addresses: Vec::new(),
        pid: 0,
        signal: "KILL".to_string(),
        threads: 8,
        keys_per_thread: 8,
        hold: Duration::from_millis(5),
        lease: Duration::from_secs(5),
        warm_up: Duration::from_millis(1000),
        after: Duration::from_millis(500),
        timeout: Duration::from_secs(30),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().unwrap_or_else(|| usage(&format!("{flag} needs a value")));
        let number = || -> u64 { value.parse().unwrap_or_else(|_| usage(&format!("{flag} takes a whole number"))) };
        match flag.as_str() {
            "--addr" => options.addresses.push(value.clone()),
            "--pid" => options.pid = number() as u32,
            "--signal" => options.signal = value.clone(),
            "--threads" => options.threads = number() as usize,
            "--keys-per-thread" => options.keys_per_thread = number().max(1) as usize,
            "--hold-ms" => options.hold = Duration::from_millis(number()),
            "--lease-ms" => options.lease = Duration::from_millis(number()),
            "--warm-up-ms" => options.warm_up = Duration::from_millis(number()),
            "--after-ms" => options.after = Duration::from_millis(number()),
            "--timeout-s" => options.timeout = Duration::from_secs(number()),
            other => usage(&format!("unknown flag {other}")),
        }
    }
    if options.addresses.is_empty() || options.pid == 0 {
        usage("give every node with --addr and the active's process with --pid");
    }
    options
}

fn usage(problem: &str) -> ! {
    eprintln!("failover_probe: {problem}");
    eprintln!(
        "usage: failover_probe --addr host:port... --pid <active's pid> [--signal KILL|INT|TERM] [--threads 8] \
         [--keys-per-thread 8] [--hold-ms 5] [--lease-ms 5000] [--warm-up-ms 1000] [--after-ms 500] [--timeout-s 30]"
    );
    std::process::exit(2)
}

/// A node's `P` reply as (role, epoch), if it answers.
fn ping(address: &str) -> Option<(String, u64)> {
    let mut stream = TcpStream::connect(address).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    stream.write_all(b"P\n").ok()?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).ok()?;
    let fields: Vec<&str> = line.split_whitespace().collect();
    (fields.len() == 4 && fields[0] == "P").then(|| Some((fields[1].to_string(), fields[2].parse().ok()?)))?
}

/// The active's address and epoch, if one of `addresses` answers `P active`.
fn find_active(addresses: &[String]) -> Option<(String, u64)> {
    addresses.iter().find_map(|address| match ping(address)? {
        (role, epoch) if role == "active" => Some((address.clone(), epoch)),
        _ => None,
    })
}

/// A connection that asks a node for its table version with `S`.
struct TableWatch {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl TableWatch {
    fn connect(address: &str) -> Option<TableWatch> {
        let writer = TcpStream::connect(address).ok()?;
        writer.set_nodelay(true).ok()?;
        writer.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
        Some(TableWatch { reader: BufReader::new(writer.try_clone().ok()?), writer })
    }

    /// The `"table":{"stream":..,"version":..}` of the node's `S` reply.
    fn version(&mut self) -> Option<(u64, u64)> {
        self.writer.write_all(b"S\n").ok()?;
        let mut line = String::new();
        self.reader.read_line(&mut line).ok()?;
        let table = &line[line.find("\"table\":")?..];
        let number = |name: &str| -> Option<u64> {
            let needle = format!("\"{name}\":");
            let at = table.find(&needle)? + needle.len();
            table[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
        };
        Some((number("stream")?, number("version")?))
    }
}

/// Replication lag samples until `stop`: how long the oldest delta a standby
/// had not applied had existed on the active, in ms (0 when it had them all).
/// The active's versions are sampled too, so this is exact to one sampling
/// period (plus an `S` round trip).
fn sample_lag(active: &str, standby: &str, stop: &AtomicBool) -> Vec<f64> {
    let (Some(mut active), Some(mut standby)) = (TableWatch::connect(active), TableWatch::connect(standby)) else {
        return Vec::new();
    };
    let started = Instant::now();
    // (when first seen, version) of the active, versions increasing.
    let mut history: Vec<(Duration, u64)> = Vec::new();
    let mut lags = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let Some((stream, version)) = active.version() else { break };
        if history.last().is_none_or(|(_, last)| version > *last) {
            history.push((started.elapsed(), version));
        }
        let Some((applied_stream, applied)) = standby.version() else { break };
        let now = started.elapsed();
        if applied_stream == stream {
            // The first active sample beyond what the standby has applied.
            let missing_since = history.iter().find(|(_, seen)| *seen > applied).map(|(at, _)| *at);
            lags.push(missing_since.map_or(0.0, |at| (now - at).as_secs_f64() * 1e3));
        }
        thread::sleep(Duration::from_millis(5));
    }
    lags
}

/// One grant a probe thread received.
struct Grant {
    /// When the grant arrived, in nanoseconds since the probe started.
    at_ns: u64,
    token: u64,
    release: Option<ReleaseOutcome>,
}

#[derive(Default)]
struct ThreadReport {
    grants: Vec<Grant>,
    timeouts: u64,
    errors: u64,
}

fn main() {
    let options = options();
    let (active, old_epoch) = find_active(&options.addresses).unwrap_or_else(|| {
        eprintln!("failover_probe: no node of {:?} answers `P active`", options.addresses);
        std::process::exit(1)
    });
    let standby = options.addresses.iter().find(|address| ping(address).is_some_and(|(role, _)| role == "standby"));
    let client = Client::connect(options.addresses.clone()).unwrap_or_else(|error| usage(&error.to_string()));
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    // When the first grant of a later epoch arrived, in ns since the start.
    let first_new_ns = Arc::new(AtomicU64::new(u64::MAX));
    let threads: Vec<_> = (0..options.threads)
        .map(|index| {
            let (client, stop, first_new_ns) = (client.clone(), stop.clone(), first_new_ns.clone());
            let (keys, hold, lease) = (options.keys_per_thread, options.hold, options.lease);
            thread::spawn(move || {
                let mut report = ThreadReport::default();
                let mut round = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("probe/{}/{index}/{}", std::process::id(), round % keys);
                    round += 1;
                    match client.acquire(&key, lease, Some(Duration::from_secs(2))) {
                        Ok(Some(lock)) => {
                            let at_ns = started.elapsed().as_nanos() as u64;
                            let token = lock.token();
                            if token >> SEQUENCE_BITS > old_epoch {
                                first_new_ns.fetch_min(at_ns, Ordering::SeqCst);
                            }
                            thread::sleep(hold);
                            let release = lock.release().ok();
                            report.errors += u64::from(release.is_none());
                            report.grants.push(Grant { at_ns, token, release });
                        }
                        Ok(None) => report.timeouts += 1,
                        Err(_) => {
                            report.errors += 1;
                            // No active for a moment: do not spin.
                            thread::sleep(Duration::from_millis(10));
                        }
                    }
                }
                report
            })
        })
        .collect();

    // Replication lag under this load, during the warm-up.
    let warm = Arc::new(AtomicBool::new(false));
    let lag_sampler = standby.cloned().map(|standby| {
        let warm = warm.clone();
        thread::spawn(move || sample_lag(&active, &standby, &warm))
    });
    thread::sleep(options.warm_up);
    warm.store(true, Ordering::Relaxed);
    let mut lags = lag_sampler.map(|sampler| sampler.join().expect("the lag sampler")).unwrap_or_default();
    lags.sort_by(f64::total_cmp);
    let signal_ns = started.elapsed().as_nanos() as u64;
    let status = Command::new("kill").args(["-s", &options.signal, &options.pid.to_string()]).status();
    if !status.is_ok_and(|status| status.success()) {
        eprintln!("failover_probe: kill -s {} {} failed", options.signal, options.pid);
        std::process::exit(1);
    }
    let deadline = Instant::now() + options.timeout;
    while first_new_ns.load(Ordering::SeqCst) == u64::MAX && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(1));
    }
    thread::sleep(options.after);
    stop.store(true, Ordering::Relaxed);
    let reports: Vec<ThreadReport> = threads.into_iter().map(|thread| thread.join().expect("a probe thread")).collect();

    let first_new_ns = first_new_ns.load(Ordering::SeqCst);
    if first_new_ns == u64::MAX {
        eprintln!("failover_probe: no grant of an epoch above {old_epoch} within {:?}", options.timeout);
        std::process::exit(1);
    }
    let grants = || reports.iter().flat_map(|report| &report.grants);
    let is_old = |grant: &&Grant| grant.token >> SEQUENCE_BITS <= old_epoch;
    let last_old_ns = grants().filter(is_old).map(|grant| grant.at_ns).max().unwrap_or(signal_ns);
    let old_grants = grants().filter(is_old).count();
    let lost = grants().filter(is_old).filter(|grant| grant.release == Some(ReleaseOutcome::NotHeld)).count();
    let new_epoch = grants().map(|grant| grant.token >> SEQUENCE_BITS).max().unwrap_or(old_epoch);
    let milliseconds = |ns: u64| ns as f64 / 1e6;
    println!(
        "signal={} first_grant_ms={:.1} gap_ms={:.1} lost={lost} old_grants={old_grants} new_grants={} timeouts={} \
         errors={} old_epoch={old_epoch} new_epoch={new_epoch} lag_p50_ms={:.1} lag_max_ms={:.1} lag_samples={}",
        options.signal,
        milliseconds(first_new_ns.saturating_sub(signal_ns)),
        milliseconds(first_new_ns.saturating_sub(last_old_ns)),
        grants().count() - old_grants,
        reports.iter().map(|report| report.timeouts).sum::<u64>(),
        reports.iter().map(|report| report.errors).sum::<u64>(),
        lags.get(lags.len() / 2).copied().unwrap_or(f64::NAN),
        lags.last().copied().unwrap_or(f64::NAN),
        lags.len(),
    );
}
