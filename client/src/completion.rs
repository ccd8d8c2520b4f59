//! The one-shot cell that carries a request's outcome from the I/O threads to
//! whoever waits for it: a blocked thread (blocking API) or a task's
//! [`Waker`] (async API), so that futures complete under any executor.
//!
//! A blocked thread waits on the cell's own condition variable rather than
//! with `thread::park`, whose single token per thread it would share with
//! whatever else parks that thread (an executor's `block_on`, for one) and
//! could swallow its wake-up.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use crate::operation::Outcome;

/// One request's outcome, delivered once by the I/O side and taken once by
/// the caller.
#[derive(Debug)]
pub(crate) struct Completion {
    state: Mutex<State>,
    /// Signalled when the outcome arrives for a [`Waiter::Thread`].
    arrived: Condvar,
}

#[derive(Debug)]
struct State {
    outcome: Option<Outcome>,
    waiter: Waiter,
    /// The caller is gone (a dropped future); an outcome that arrives now is
    /// handed back to the I/O side to clean up.
    abandoned: bool,
}

#[derive(Debug)]
enum Waiter {
    Nobody,
    /// A thread blocks in [`Completion::wait`].
    Thread,
    Task(Waker),
}

impl Completion {
    pub(crate) fn new() -> Arc<Completion> {
        Arc::new(Completion {
            state: Mutex::new(State { outcome: None, waiter: Waiter::Nobody, abandoned: false }),
            arrived: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock leaves a valid state (every update
        // is one assignment), so poisoning is ignored.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Delivers the outcome and wakes the waiter. If the caller has given up,
    /// the outcome comes back so that the I/O side can undo it (release a
    /// grant nobody will use).
    pub(crate) fn complete(&self, outcome: Outcome) -> Result<(), Outcome> {
        let mut state = self.lock();
        if state.abandoned {
            return Err(outcome);
        }
        debug_assert!(state.outcome.is_none(), "a request completed twice");
        state.outcome = Some(outcome);
        let waiter = std::mem::replace(&mut state.waiter, Waiter::Nobody);
        // Wake after unlocking, so the woken thread does not block on the lock.
        drop(state);
        match waiter {
            Waiter::Nobody => {}
            Waiter::Thread => self.arrived.notify_one(),
            Waiter::Task(waker) => waker.wake(),
        }
        Ok(())
    }

    /// Blocks the calling thread until the outcome arrives.
    pub(crate) fn wait(&self) -> Outcome {
        let mut state = self.lock();
        loop {
            if let Some(outcome) = state.outcome.take() {
                return outcome;
            }
            state.waiter = Waiter::Thread;
            // Wake-ups may be spurious; the loop checks the outcome again.
            state = self.arrived.wait(state).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    /// The outcome if it has arrived; otherwise registers the task's waker.
    pub(crate) fn poll(&self, cx: &mut Context<'_>) -> Poll<Outcome> {
        let mut state = self.lock();
        if let Some(outcome) = state.outcome.take() {
            return Poll::Ready(outcome);
        }
        match &mut state.waiter {
            Waiter::Task(waker) if waker.will_wake(cx.waker()) => {}
            waiter => *waiter = Waiter::Task(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// The caller gives up waiting. Returns an outcome that had already
    /// arrived and was not taken, for the caller to clean up; any later one
    /// goes back to the I/O side from [`complete`](Self::complete).
    pub(crate) fn abandon(&self) -> Option<Outcome> {
        let mut state = self.lock();
        state.abandoned = true;
        state.waiter = Waiter::Nobody;
        state.outcome.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;
    use std::thread;

    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn blocking_wait_gets_an_outcome_from_another_thread() {
        let completion = Completion::new();
        let sender = completion.clone();
        let thread = thread::spawn(move || sender.complete(Outcome::Released).unwrap());
        assert!(matches!(completion.wait(), Outcome::Released));
        thread.join().unwrap();
    }

    #[test]
    fn a_blocking_wait_leaves_the_thread_s_park_token_alone() {
        // An unpark meant for something else on this thread must neither be
        // taken for the outcome nor be swallowed by the wait.
        let completion = Completion::new();
        let sender = completion.clone();
        let waiter = thread::current();
        let thread = thread::spawn(move || {
            waiter.unpark();
            sender.complete(Outcome::Released).unwrap();
        });
        assert!(matches!(completion.wait(), Outcome::Released));
        thread.join().unwrap();
        // The token is still there, so this returns at once; were it
        // swallowed, it would sleep out the whole (generous) timeout.
        let parked = std::time::Instant::now();
        thread::park_timeout(std::time::Duration::from_secs(60));
        assert!(parked.elapsed() < std::time::Duration::from_secs(30), "the wait swallowed the park token");
    }

    #[test]
    fn poll_registers_the_waker_and_is_woken_once() {
        let completion = Completion::new();
        let counter = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(counter.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(completion.poll(&mut cx).is_pending());
        assert!(completion.poll(&mut cx).is_pending());
        assert_eq!(counter.0.load(Ordering::SeqCst), 0);
        completion.complete(Outcome::Acquired(7)).unwrap();
        assert_eq!(counter.0.load(Ordering::SeqCst), 1);
        assert!(matches!(completion.poll(&mut cx), Poll::Ready(Outcome::Acquired(7))));
    }

    #[test]
    fn an_outcome_after_abandon_comes_back() {
        let completion = Completion::new();
        assert!(completion.abandon().is_none());
        assert!(matches!(completion.complete(Outcome::Acquired(9)), Err(Outcome::Acquired(9))));
    }

    #[test]
    fn abandon_returns_an_outcome_not_taken() {
        let completion = Completion::new();
        completion.complete(Outcome::Acquired(3)).unwrap();
        assert!(matches!(completion.abandon(), Some(Outcome::Acquired(3))));
    }
}
