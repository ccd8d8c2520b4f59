//! Pairing stays right under load (docs/protocol.md §3, §4): thousands of pipelined
//! requests from many threads and tasks, many with the same (op, key), over
//! shared connections to the real server.

mod common;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::Duration;

use common::Server;
use ringlock_client::{Client, Lock, ReleaseOutcome};

/// Long enough never to run out in a passing run; short enough, with
/// [`WAIT`], that a grant lost by a pairing bug fails the test rather than
/// hanging it.
const LEASE: Duration = Duration::from_secs(60);
const WAIT: Option<Duration> = Some(common::PATIENCE);

/// A task for [`run_all`].
type Task<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Runs every future to completion on this thread, polling a future only
/// when its own waker fired: the smallest executor that shows the futures
/// need nothing but a `Waker`.
fn run_all<T>(futures: Vec<Task<T>>) -> Vec<T> {
    struct Ready {
        woken: Mutex<Vec<usize>>,
        thread: Thread,
    }
    struct TaskWaker {
        index: usize,
        ready: Arc<Ready>,
    }
    impl Wake for TaskWaker {
        fn wake(self: Arc<Self>) {
            self.ready.woken.lock().unwrap().push(self.index);
            self.ready.thread.unpark();
        }
    }

    let ready = Arc::new(Ready { woken: Mutex::new((0..futures.len()).collect()), thread: thread::current() });
    let wakers: Vec<Waker> =
        (0..futures.len()).map(|index| Waker::from(Arc::new(TaskWaker { index, ready: ready.clone() }))).collect();
    let mut futures: Vec<Option<Task<T>>> = futures.into_iter().map(Some).collect();
    let mut outputs: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    let mut left = futures.len();
    while left > 0 {
        let woken = std::mem::take(&mut *ready.woken.lock().unwrap());
        if woken.is_empty() {
            thread::park();
            continue;
        }
        for index in woken {
            let Some(future) = futures[index].as_mut() else { continue };
            if let Poll::Ready(output) = future.as_mut().poll(&mut Context::from_waker(&wakers[index])) {
                outputs[index] = Some(output);
                futures[index] = None;
                left -= 1;
            }
        }
    }
    outputs.into_iter().map(|output| output.expect("every future completed")).collect()
}

#[test]
fn many_threads_share_keys_without_mixing_up_replies() {
    const THREADS: usize = 32;
    const ROUNDS: usize = 300;
    const KEYS: usize = 8;
    let server = Server::start(&[]);
    let client = Client::connect([server.addr.to_string()]).unwrap();
    // Per key: whether this test believes someone holds it, and the last
    // token granted. A reply paired with the wrong request would show as
    // two holders at once, a token going backwards, or a failed release.
    let held: Arc<Vec<AtomicBool>> = Arc::new((0..KEYS).map(|_| AtomicBool::new(false)).collect());
    let last_token: Arc<Vec<Mutex<u64>>> = Arc::new((0..KEYS).map(|_| Mutex::new(0)).collect());
    let threads: Vec<_> = (0..THREADS)
        .map(|thread_index| {
            let (client, held, last_token) = (client.clone(), held.clone(), last_token.clone());
            thread::spawn(move || {
                for round in 0..ROUNDS {
                    let key_index = (thread_index * 7 + round) % KEYS;
                    let key = format!("shared/{key_index}");
                    let lock = client.acquire(&key, LEASE, WAIT).unwrap().expect("granted within the wait");
                    assert_eq!(lock.key(), key.as_bytes());
                    assert!(!held[key_index].swap(true, Ordering::SeqCst), "two holders of {key}");
                    {
                        let mut last = last_token[key_index].lock().unwrap();
                        assert!(lock.token() > *last, "{key}: token {} after {}", lock.token(), *last);
                        *last = lock.token();
                    }
                    if round % 5 == 0 {
                        lock.extend(LEASE).unwrap();
                    }
                    held[key_index].store(false, Ordering::SeqCst);
                    assert_eq!(lock.release(), Ok(ReleaseOutcome::Released));
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
}

#[test]
fn pipelined_acquires_of_one_key_are_paired_in_send_order() {
    const TASKS: usize = 4000;
    const KEYS: usize = 40;
    let server = Server::start(&[]);
    // One connection, so that the send order is the server's queue order
    // for every key, and replies for one key must pair in that order.
    let client = Client::builder([server.addr.to_string()]).connections_per_node(1).connect().unwrap();
    type Grant = (usize, u64);
    let futures: Vec<Task<Grant>> = (0..TASKS)
        .map(|task| {
            let key = format!("fifo/{}", task % KEYS);
            let acquire = client.acquire_async(key, LEASE, WAIT);
            let future: Task<Grant> = Box::pin(async move {
                let lock: Lock = acquire.await.unwrap().expect("granted within the wait");
                let token = lock.token();
                // Dropping the lock releases it in the background, which
                // grants the key to the next task in its queue.
                drop(lock);
                (task, token)
            });
            future
        })
        .collect();
    let grants = run_all(futures);

    let mut by_key: HashMap<usize, Vec<Grant>> = HashMap::new();
    for (task, token) in grants {
        by_key.entry(task % KEYS).or_default().push((task, token));
    }
    for (key, mut grants) in by_key {
        grants.sort_by_key(|&(task, _)| task);
        let tokens: Vec<u64> = grants.iter().map(|&(_, token)| token).collect();
        assert!(tokens.is_sorted(), "fifo/{key}: tokens out of send order: {tokens:?}");
        assert_eq!(grants.len(), TASKS / KEYS);
    }
}

#[test]
fn mixed_requests_from_tasks_and_threads_each_get_their_own_reply() {
    const TASKS: usize = 2000;
    let server = Server::start(&[]);
    // A key held elsewhere: acquires of it wait, then time out, so their
    // replies come back after replies to later requests.
    let mut holder = server.connect();
    holder.acquire("mixed/busy", "600", "0");
    let client = Client::connect([server.addr.to_string()]).unwrap();
    // Each task acquires its own key, extends it twice, pings, and releases:
    // every kind of reply, interleaved over both connections; one task in
    // ten also waits briefly for the busy key.
    let futures: Vec<Task<(usize, Vec<u8>, u64)>> = (0..TASKS)
        .map(|task| {
            let client = client.clone();
            let busy =
                (task % 10 == 0).then(|| client.acquire_async("mixed/busy", LEASE, Some(Duration::from_millis(20))));
            let future: Task<(usize, Vec<u8>, u64)> = Box::pin(async move {
                let key = format!("own/{task}");
                let lock = client.acquire_async(&key, LEASE, WAIT).await.unwrap();
                let lock = lock.expect("nobody else wants this key");
                lock.extend_async(LEASE).await.unwrap();
                let pong = client.ping_async();
                lock.extend_async(Duration::from_secs(30)).await.unwrap();
                assert_eq!(pong.await.unwrap().role, ringlock_client::proto::Role::Active);
                if let Some(busy) = busy {
                    assert!(busy.await.unwrap().is_none(), "the busy key stays held");
                }
                let (key, token) = (lock.key().to_vec(), lock.token());
                assert_eq!(lock.release_async().await, Ok(ReleaseOutcome::Released));
                (task, key, token)
            });
            future
        })
        .collect();
    let results = run_all(futures);
    let mut tokens: Vec<u64> = Vec::with_capacity(TASKS);
    for (task, key, token) in results {
        assert_eq!(key, format!("own/{task}").into_bytes());
        tokens.push(token);
    }
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), TASKS, "every grant has its own token");
}
