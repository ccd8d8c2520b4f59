//! Lock cycles per second through one shared client: `--threads` threads
//! (default 64) each acquire a key of their own, then release it and wait
//! for the release to be acknowledged, as fast as they can.
//!
//! ```text
//! ringlock --listen 127.0.0.1:7700 --data-dir /tmp/ringlock-bench --shards 1 --cpus 1 &
//! taskset -c 0 cargo run --release -p ringlock-client --example throughput -- --addr 127.0.0.1:7700
//! ```
//!
//! Flags: `--addr <host:port>` (repeat it for a cluster), `--threads <n>`,
//! `--seconds <n>` (default 5), `--keys shared` to make all threads contend
//! for 8 keys instead of using one key each, and `--tasks <n>` to run `n`
//! async tasks on one thread (a minimal executor, no runtime) instead of
//! blocking threads: this shows what the client carries without a thread
//! switch per request.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use ringlock_client::{Client, ReleaseOutcome};

struct Options {
    addresses: Vec<String>,
    threads: usize,
    seconds: u64,
    shared_keys: bool,
    /// Async tasks on one thread instead of blocking threads.
    tasks: Option<usize>,
}

fn options() -> Options {
    let mut options = Options { addresses: Vec::new(), threads: 64, seconds: 5, shared_keys: false, tasks: None };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| usage(&format!("{flag} needs a value")));
        match flag.as_str() {
            "--addr" => options.addresses.push(value()),
            "--threads" => options.threads = value().parse().unwrap_or_else(|_| usage("--threads takes a number")),
            "--seconds" => options.seconds = value().parse().unwrap_or_else(|_| usage("--seconds takes a number")),
            "--keys" => options.shared_keys = value() == "shared",
            "--tasks" => options.tasks = Some(value().parse().unwrap_or_else(|_| usage("--tasks takes a number"))),
            other => usage(&format!("unknown flag {other}")),
        }
    }
    if options.addresses.is_empty() {
        options.addresses.push("127.0.0.1:7700".into());
    }
    options
}

fn usage(problem: &str) -> ! {
    eprintln!("throughput: {problem}");
    eprintln!("usage: throughput [--addr host:port]... [--threads 64 | --tasks n] [--seconds 5] [--keys own|shared]");
    std::process::exit(2)
}

fn main() {
    let options = options();
    let client = Client::connect(options.addresses.clone()).unwrap_or_else(|error| usage(&error.to_string()));
    // One cycle first, so the connections are up before the clock starts.
    client
        .acquire("throughput/warm-up", Duration::from_secs(30), None)
        .expect("the server answers")
        .expect("no wait limit")
        .release()
        .expect("the server answers");

    if let Some(tasks) = options.tasks {
        return run_tasks(&client, tasks, &options);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let threads: Vec<_> = (0..options.threads)
        .map(|index| {
            let (client, stop, cycles) = (client.clone(), stop.clone(), cycles.clone());
            let key =
                if options.shared_keys { format!("throughput/{}", index % 8) } else { format!("throughput/{index}") };
            thread::spawn(move || {
                let mut done = 0;
                while !stop.load(Ordering::Relaxed) {
                    let lock = client.acquire(&key, Duration::from_secs(30), None).expect("acquire").expect("no limit");
                    assert_eq!(lock.release().expect("release"), ReleaseOutcome::Released);
                    done += 1;
                }
                cycles.fetch_add(done, Ordering::Relaxed);
            })
        })
        .collect();
    thread::sleep(Duration::from_secs(options.seconds));
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        thread.join().expect("a worker thread panicked");
    }
    report(&format!("{} threads", options.threads), &options, started, cycles.load(Ordering::Relaxed));
}

fn report(who: &str, options: &Options, started: Instant, cycles: u64) {
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "{who}, {} keys, {elapsed:.1} s: {cycles} lock cycles (acquire + acknowledged release), {:.0} cycles/s",
        if options.shared_keys { "8 shared" } else { "one per worker" },
        cycles as f64 / elapsed
    );
}

/// Wakes the executor thread and marks one task as ready.
struct TaskWaker {
    index: usize,
    ready: Arc<Mutex<Vec<usize>>>,
    thread: Thread,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.ready.lock().expect("ready queue").push(self.index);
        self.thread.unpark();
    }
}

type Task = Pin<Box<dyn Future<Output = u64>>>;

/// `tasks` async tasks on this thread, each acquiring and releasing its key
/// in a loop, polled by a minimal executor.
fn run_tasks(client: &Client, tasks: usize, options: &Options) {
    let stop = Arc::new(AtomicBool::new(false));
    let mut futures: Vec<Option<Task>> = (0..tasks)
        .map(|index| {
            let (client, stop) = (client.clone(), stop.clone());
            let key =
                if options.shared_keys { format!("throughput/{}", index % 8) } else { format!("throughput/{index}") };
            let task: Task = Box::pin(async move {
                let mut done = 0;
                while !stop.load(Ordering::Relaxed) {
                    let lock = client.acquire_async(&key, Duration::from_secs(30), None).await;
                    let lock = lock.expect("acquire").expect("no limit");
                    assert_eq!(lock.release_async().await.expect("release"), ReleaseOutcome::Released);
                    done += 1;
                }
                done
            });
            Some(task)
        })
        .collect();
    let ready = Arc::new(Mutex::new((0..tasks).collect::<Vec<usize>>()));
    let wakers: Vec<Waker> = (0..tasks)
        .map(|index| Waker::from(Arc::new(TaskWaker { index, ready: ready.clone(), thread: thread::current() })))
        .collect();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(options.seconds);
    let (mut cycles, mut left) = (0, tasks);
    while left > 0 {
        if Instant::now() >= deadline {
            stop.store(true, Ordering::Relaxed);
        }
        let woken = std::mem::take(&mut *ready.lock().expect("ready queue"));
        if woken.is_empty() {
            thread::park_timeout(Duration::from_millis(10));
            continue;
        }
        for index in woken {
            let Some(future) = futures[index].as_mut() else { continue };
            if let Poll::Ready(done) = future.as_mut().poll(&mut Context::from_waker(&wakers[index])) {
                cycles += done;
                futures[index] = None;
                left -= 1;
            }
        }
    }
    report(&format!("{tasks} async tasks on one thread"), options, started, cycles);
}
