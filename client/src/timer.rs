//! The retry timer: requests waiting for their next try (releases that found
//! no usable connection, requests waiting for an active node to be known).
//!
//! One thread per client sleeps until the earliest deadline and hands each
//! due request back to the router. It also runs the client's own timed work
//! (the next extend of auto-extended locks, see `lock`) as short calls.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use crate::completion::Submitted;

/// Requests by the instant of their next try.
#[derive(Debug, Default)]
pub(crate) struct Timer {
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// A min-heap through the reversed order of [`Scheduled`].
    queue: BinaryHeap<Scheduled>,
    /// Breaks ties between equal instants in the order scheduled.
    serial: u64,
    closed: bool,
}

#[derive(Debug)]
struct Scheduled {
    at: Instant,
    serial: u64,
    due: Due,
}

/// What comes due: a request for the router, or a call the timer thread
/// makes itself.
enum Due {
    Operation(Submitted),
    Call(Box<dyn FnOnce() + Send>),
}

impl std::fmt::Debug for Due {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Due::Operation(operation) => operation.fmt(f),
            Due::Call(_) => f.write_str("Call"),
        }
    }
}

impl Scheduled {
    fn waits_for_connection(&self) -> bool {
        matches!(&self.due, Due::Operation(operation) if operation.waiting_since.is_some())
    }
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.serial) == (other.at, other.serial)
    }
}

impl Eq for Scheduled {}

impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Scheduled {
    /// Earliest first out of the max-heap.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.serial).cmp(&(self.at, self.serial))
    }
}

impl Timer {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Schedules `operation` for `at`; gives it back if the client is closing.
    pub(crate) fn schedule(&self, at: Instant, operation: Submitted) -> Result<(), Submitted> {
        match self.push(at, Due::Operation(operation)) {
            Ok(()) => Ok(()),
            Err(Due::Operation(operation)) => Err(operation),
            Err(Due::Call(_)) => unreachable!("pushed an operation"),
        }
    }

    /// Makes `call` on the timer thread at `at`; it must not block. Returns
    /// false, dropping it, if the client is closing.
    pub(crate) fn schedule_call(&self, at: Instant, call: Box<dyn FnOnce() + Send>) -> bool {
        self.push(at, Due::Call(call)).is_ok()
    }

    fn push(&self, at: Instant, due: Due) -> Result<(), Due> {
        let mut state = self.lock();
        if state.closed {
            return Err(due);
        }
        let serial = state.serial;
        state.serial += 1;
        let earliest = state.queue.peek().is_none_or(|first| at < first.at);
        state.queue.push(Scheduled { at, serial, due });
        if earliest {
            self.wake.notify_one();
        }
        Ok(())
    }

    /// Requests waiting now.
    pub(crate) fn len(&self) -> usize {
        self.lock().queue.iter().filter(|scheduled| matches!(scheduled.due, Due::Operation(_))).count()
    }

    /// Makes every request that waits for a usable connection due at once
    /// (a connection just came up), keeping their order; the others keep
    /// their instants.
    pub(crate) fn hurry_connection_waiters(&self, now: Instant) {
        let mut state = self.lock();
        if !state.queue.iter().any(|scheduled| scheduled.waits_for_connection() && scheduled.at > now) {
            return;
        }
        let mut queue = std::mem::take(&mut state.queue).into_vec();
        for scheduled in &mut queue {
            if scheduled.waits_for_connection() {
                scheduled.at = scheduled.at.min(now);
            }
        }
        state.queue = BinaryHeap::from(queue);
        self.wake.notify_one();
    }

    /// Stops the timer and gives back every request still waiting; calls
    /// still waiting are dropped.
    pub(crate) fn close(&self) -> Vec<Submitted> {
        let queue = {
            let mut state = self.lock();
            state.closed = true;
            self.wake.notify_one();
            std::mem::take(&mut state.queue)
        };
        queue
            .into_iter()
            .filter_map(|scheduled| match scheduled.due {
                Due::Operation(operation) => Some(operation),
                Due::Call(_) => None,
            })
            .collect()
    }

    /// Runs the timer until [`close`](Self::close), handing each request to
    /// `fire` and making each call when its instant comes (without the
    /// timer's lock held).
    pub(crate) fn run(&self, mut fire: impl FnMut(Submitted)) {
        let mut state = self.lock();
        loop {
            if state.closed {
                return;
            }
            let now = Instant::now();
            match state.queue.peek().map(|first| first.at) {
                Some(at) if at <= now => {
                    let scheduled = state.queue.pop().expect("peeked");
                    drop(state);
                    match scheduled.due {
                        Due::Operation(operation) => fire(operation),
                        Due::Call(call) => call(),
                    }
                    state = self.lock();
                }
                Some(at) => {
                    state = self.wake.wait_timeout(state, at - now).unwrap_or_else(|poisoned| poisoned.into_inner()).0;
                }
                None => state = self.wake.wait(state).unwrap_or_else(|poisoned| poisoned.into_inner()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operation::{Kind, Policy};
    use std::sync::Arc;
    use std::sync::mpsc;
    use std::time::Duration;

    fn release(token: u64, now: Instant) -> Submitted {
        let policy = Policy {
            retry_interval: Duration::from_millis(1),
            retry_for: Duration::from_secs(1),
            redirect_limit: 1,
            connect_limit: Duration::from_secs(1),
        };
        Submitted::new(Kind::Release { token }, Arc::from(&b"k"[..]), now, 1, &policy, None)
    }

    fn token(operation: &Submitted) -> u64 {
        let Kind::Release { token } = operation.kind else { panic!() };
        token
    }

    #[test]
    fn fires_in_order_of_instant_then_of_scheduling() {
        let timer = Arc::new(Timer::default());
        let now = Instant::now();
        for (token, delay_ms) in [(1, 30), (2, 10), (3, 10), (4, 0)] {
            timer.schedule(now + Duration::from_millis(delay_ms), release(token, now)).unwrap();
        }
        let (sender, fired) = mpsc::channel();
        let runner = timer.clone();
        let thread = std::thread::spawn(move || runner.run(|operation| sender.send(token(&operation)).unwrap()));
        let order: Vec<u64> = (0..4).map(|_| fired.recv().unwrap()).collect();
        assert_eq!(order, [4, 2, 3, 1]);
        assert!(timer.close().is_empty());
        thread.join().unwrap();
    }

    #[test]
    fn a_connection_coming_up_hurries_only_the_requests_waiting_for_one() {
        let timer = Arc::new(Timer::default());
        let now = Instant::now();
        let mut waiting = release(1, now);
        waiting.waiting_since = Some(now);
        timer.schedule(now + Duration::from_secs(60), waiting).unwrap();
        timer.schedule(now + Duration::from_secs(60), release(2, now)).unwrap();
        timer.hurry_connection_waiters(Instant::now());
        let (sender, fired) = mpsc::channel();
        let runner = timer.clone();
        let thread = std::thread::spawn(move || runner.run(|operation| sender.send(token(&operation)).unwrap()));
        assert_eq!(fired.recv_timeout(Duration::from_secs(20)), Ok(1));
        assert!(fired.recv_timeout(Duration::from_millis(50)).is_err(), "the other keeps its instant");
        assert_eq!(timer.close().iter().map(token).collect::<Vec<_>>(), [2]);
        thread.join().unwrap();
    }

    #[test]
    fn calls_are_made_in_turn_with_requests_and_dropped_at_close() {
        let timer = Arc::new(Timer::default());
        let now = Instant::now();
        let (sender, fired) = mpsc::channel();
        let call_sender = sender.clone();
        assert!(timer.schedule_call(now + Duration::from_millis(5), Box::new(move || call_sender.send(0).unwrap())));
        timer.schedule(now, release(1, now)).unwrap();
        let never = sender.clone();
        assert!(timer.schedule_call(now + Duration::from_secs(3600), Box::new(move || never.send(9).unwrap())));
        assert_eq!(timer.len(), 1, "calls are not requests waiting for a retry");
        let runner = timer.clone();
        let thread = std::thread::spawn(move || runner.run(|operation| sender.send(token(&operation)).unwrap()));
        let order: Vec<u64> = (0..2).map(|_| fired.recv_timeout(Duration::from_secs(20)).unwrap()).collect();
        assert_eq!(order, [1, 0]);
        assert!(timer.close().is_empty(), "the pending call is dropped, not given back");
        thread.join().unwrap();
        assert!(!timer.schedule_call(now, Box::new(|| {})), "refused once closed");
    }

    #[test]
    fn close_gives_back_what_waits_and_refuses_more() {
        let timer = Timer::default();
        let now = Instant::now();
        timer.schedule(now + Duration::from_secs(60), release(1, now)).unwrap();
        assert_eq!(timer.len(), 1);
        let back = timer.close();
        assert_eq!(back.iter().map(token).collect::<Vec<_>>(), [1]);
        assert!(timer.schedule(now, release(2, now)).is_err());
    }
}
