//! The one-shot cell that carries a request's outcome from the I/O threads to
//! whoever waits for it: a blocked thread (blocking API) or a task's
//! [`Waker`] (async API), so that futures complete under any executor.
//!
//! A blocked thread sleeps on a wait lane of its own (see `lane`) rather
//! than with `thread::park`, whose single token per thread it would share
//! with whatever else parks that thread (an executor's `block_on`, for one)
//! and could swallow its wake-up. A thread keeps one cell, and one lane, for
//! all its blocking requests (it has one in flight at a time), so a blocking
//! request allocates nothing.
//!
//! Delivering an outcome and waking its waiter are two steps: the I/O side
//! stores the outcomes of everything one read completed and owes the
//! wake-ups ([`Wakes`]), which it then makes together, holding no lock, with
//! one system call per lane word. A thread woken earlier would be switched
//! in at once on a busy core, and its waker switched back in before the
//! next wake-up.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use crate::lane::{Lane, Lanes};
use crate::operation::{Caller, Operation, Outcome};

/// A request whose caller waits on a [`Completion`]: what the router, the
/// connections and the timer carry.
pub(crate) type Submitted = Operation<Arc<Completion>>;

/// One request's outcome, delivered once by the I/O side and taken once by
/// the caller.
#[derive(Debug)]
pub(crate) struct Completion {
    state: Mutex<State>,
    /// Where a blocked thread waits; only cells for blocking requests have one.
    lane: Option<Lane>,
    /// A thread's reusable cell is lent to one blocking request at a time;
    /// this marks it lent. A request abandoned while lent (a panic between
    /// sending and waiting) keeps it, and the thread takes a fresh cell.
    lent: AtomicBool,
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

/// The wake-ups owed by one pass of the I/O side, made by
/// [`wake_all`](Self::wake_all) or, at the latest, when dropped, so that none
/// is ever lost.
#[derive(Debug, Default)]
pub(crate) struct Wakes {
    lanes: Lanes,
    tasks: Vec<Waker>,
}

impl Wakes {
    pub(crate) fn is_empty(&self) -> bool {
        self.lanes.is_empty() && self.tasks.is_empty()
    }

    /// Takes over every wake-up `other` owes.
    pub(crate) fn append(&mut self, other: &mut Wakes) {
        self.lanes.append(&mut other.lanes);
        self.tasks.append(&mut other.tasks);
    }

    /// Wakes every blocked thread owed, then every task.
    pub(crate) fn wake_all(&mut self) {
        self.lanes.wake_all();
        for waker in self.tasks.drain(..) {
            waker.wake();
        }
    }
}

impl Drop for Wakes {
    fn drop(&mut self) {
        self.wake_all();
    }
}

thread_local! {
    /// The calling thread's cell for its blocking requests.
    static BLOCKING: RefCell<Option<Arc<Completion>>> = const { RefCell::new(None) };
}

impl Completion {
    /// A cell for an async request.
    pub(crate) fn new() -> Arc<Completion> {
        Completion::with_lane(None)
    }

    fn with_lane(lane: Option<Lane>) -> Arc<Completion> {
        Arc::new(Completion {
            state: Mutex::new(State { outcome: None, waiter: Waiter::Nobody, abandoned: false }),
            lane,
            lent: AtomicBool::new(false),
        })
    }

    /// The calling thread's cell, for one blocking request: send it, then
    /// [`wait`](Self::wait) for the outcome before asking for the cell again.
    pub(crate) fn for_this_thread() -> Arc<Completion> {
        let lend = |slot: &RefCell<Option<Arc<Completion>>>| {
            let mut slot = slot.borrow_mut();
            let completion = match &*slot {
                Some(completion) if !completion.lent.load(Ordering::Relaxed) => completion.clone(),
                _ => slot.insert(Completion::with_lane(Some(Lane::next()))).clone(),
            };
            completion.lent.store(true, Ordering::Relaxed);
            completion
        };
        // While the thread's locals are being torn down, a fresh cell serves.
        BLOCKING.try_with(lend).unwrap_or_else(|_| Completion::with_lane(Some(Lane::next())))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock leaves a valid state (every update
        // is one assignment), so poisoning is ignored.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Delivers the outcome, and adds the waiter's wake-up to `wakes`. If the
    /// caller has given up, the outcome comes back so that the I/O side can
    /// undo it (release a grant nobody will use).
    pub(crate) fn complete(&self, outcome: Outcome, wakes: &mut Wakes) -> Result<(), Outcome> {
        let mut state = self.lock();
        if state.abandoned {
            return Err(outcome);
        }
        debug_assert!(state.outcome.is_none(), "a request completed twice");
        state.outcome = Some(outcome);
        match std::mem::replace(&mut state.waiter, Waiter::Nobody) {
            Waiter::Nobody => {}
            Waiter::Thread => wakes.lanes.add(self.lane.expect("only a cell with a lane has a thread waiting")),
            Waiter::Task(waker) => wakes.tasks.push(waker),
        }
        Ok(())
    }

    /// Blocks the calling thread until the outcome arrives. Only for a cell
    /// from [`for_this_thread`](Self::for_this_thread).
    pub(crate) fn wait(&self) -> Outcome {
        let lane = self.lane.expect("a blocking wait on a cell with a lane");
        loop {
            // Read before checking, so that a wake-up made after the check
            // stops the sleep below.
            let wake_count = lane.wake_count();
            {
                let mut state = self.lock();
                if let Some(outcome) = state.outcome.take() {
                    self.lent.store(false, Ordering::Relaxed);
                    return outcome;
                }
                state.waiter = Waiter::Thread;
            }
            // Wake-ups may be for nothing, or owed to an earlier request
            // that used this cell; the loop checks the outcome again.
            lane.sleep(wake_count);
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

impl Caller for Arc<Completion> {
    fn is_abandoned(&self) -> bool {
        self.lock().abandoned
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::thread;

    struct CountingWaker(AtomicUsize);

    impl std::task::Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Completes `completion` and makes the wake-up at once.
    fn complete(completion: &Completion, outcome: Outcome) -> Result<(), Outcome> {
        completion.complete(outcome, &mut Wakes::default())
    }

    #[test]
    fn blocking_wait_gets_an_outcome_from_another_thread() {
        let completion = Completion::for_this_thread();
        let sender = completion.clone();
        let thread = thread::spawn(move || complete(&sender, Outcome::Released).unwrap());
        assert!(matches!(completion.wait(), Outcome::Released));
        thread.join().unwrap();
    }

    #[test]
    fn a_thread_reuses_its_cell_once_the_outcome_is_taken() {
        let first = Completion::for_this_thread();
        let lent_meanwhile = Completion::for_this_thread();
        assert!(!Arc::ptr_eq(&first, &lent_meanwhile), "a cell still lent is not lent twice");
        complete(&lent_meanwhile, Outcome::Released).unwrap();
        assert!(matches!(lent_meanwhile.wait(), Outcome::Released));
        let again = Completion::for_this_thread();
        assert!(Arc::ptr_eq(&again, &lent_meanwhile), "the cell is lent again once its outcome is taken");
        let elsewhere = thread::spawn(|| Arc::as_ptr(&Completion::for_this_thread()) as usize).join().unwrap();
        assert_ne!(elsewhere, Arc::as_ptr(&again) as usize, "each thread has its own cell");
    }

    #[test]
    fn a_sleeping_thread_is_woken_by_the_owed_wake_up() {
        let completion = Completion::for_this_thread();
        let sender = completion.clone();
        let thread = thread::spawn(move || {
            let mut wakes = Wakes::default();
            // Give the waiter time to fall asleep, so that only the wake-up
            // made below can end its wait.
            thread::sleep(std::time::Duration::from_millis(20));
            sender.complete(Outcome::Released, &mut wakes).unwrap();
            thread::sleep(std::time::Duration::from_millis(20));
            wakes.wake_all();
        });
        assert!(matches!(completion.wait(), Outcome::Released));
        thread.join().unwrap();
    }

    #[test]
    fn a_stale_wake_up_does_not_end_the_next_wait() {
        let completion = Completion::for_this_thread();
        // The thread was about to sleep when the outcome arrived; it takes
        // the outcome before the wake-up owed to it is made.
        completion.lock().waiter = Waiter::Thread;
        let mut late = Wakes::default();
        completion.complete(Outcome::Released, &mut late).unwrap();
        assert!(!late.lanes.is_empty());
        assert!(matches!(completion.wait(), Outcome::Released));
        let next = Completion::for_this_thread();
        assert!(Arc::ptr_eq(&next, &completion));
        let sender = next.clone();
        let thread = thread::spawn(move || {
            late.wake_all();
            thread::sleep(std::time::Duration::from_millis(20));
            complete(&sender, Outcome::NotHeld).unwrap();
        });
        assert!(matches!(next.wait(), Outcome::NotHeld), "the late wake-up is not taken for this outcome");
        thread.join().unwrap();
    }

    #[test]
    fn a_blocking_wait_leaves_the_thread_s_park_token_alone() {
        // An unpark meant for something else on this thread must neither be
        // taken for the outcome nor be swallowed by the wait.
        let completion = Completion::for_this_thread();
        let sender = completion.clone();
        let waiter = thread::current();
        let thread = thread::spawn(move || {
            waiter.unpark();
            complete(&sender, Outcome::Released).unwrap();
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
        let mut wakes = Wakes::default();
        completion.complete(Outcome::Acquired(7), &mut wakes).unwrap();
        assert_eq!(counter.0.load(Ordering::SeqCst), 0, "not before wake_all");
        wakes.wake_all();
        assert_eq!(counter.0.load(Ordering::SeqCst), 1);
        drop(wakes);
        assert_eq!(counter.0.load(Ordering::SeqCst), 1, "each wake-up is made once");
        assert!(matches!(completion.poll(&mut cx), Poll::Ready(Outcome::Acquired(7))));
    }

    #[test]
    fn dropping_wakes_makes_the_wake_ups_owed() {
        let completion = Completion::new();
        let counter = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(counter.clone());
        assert!(completion.poll(&mut Context::from_waker(&waker)).is_pending());
        let mut wakes = Wakes::default();
        completion.complete(Outcome::Released, &mut wakes).unwrap();
        drop(wakes);
        assert_eq!(counter.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn an_outcome_after_abandon_comes_back() {
        let completion = Completion::new();
        assert!(completion.abandon().is_none());
        assert!(matches!(complete(&completion, Outcome::Acquired(9)), Err(Outcome::Acquired(9))));
    }

    #[test]
    fn abandon_returns_an_outcome_not_taken() {
        let completion = Completion::new();
        complete(&completion, Outcome::Acquired(3)).unwrap();
        assert!(matches!(completion.abandon(), Some(Outcome::Acquired(3))));
    }
}
