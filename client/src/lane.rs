//! Wait lanes: where threads blocked in the blocking API sleep, so that the
//! I/O side can wake every thread one read completed with one system call.
//!
//! Waking threads one by one costs more than the call: on a busy core each
//! woken thread is switched in at once, before its waker has woken the next,
//! so the waker is switched back in between every two of them, twice the
//! switches the threads need. A lane is one bit of one of [`WORD_COUNT`]
//! shared futex words; a thread waits on its word for its bit, and
//! [`Lanes::wake_all`] wakes every lane owed on a word with one
//! `FUTEX_WAKE_BITSET`, after which the woken threads run one after another.
//!
//! Lanes are handed out round-robin. With more blocked threads than lanes,
//! two threads may share one and wake each other for nothing; that costs a
//! switch, not correctness, since a waiter always checks its own outcome.
//! Elsewhere than Linux a word is a condition variable, and a wake-up wakes
//! every thread on the word.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

/// Futex words; each carries 32 lanes.
const WORD_COUNT: usize = 16;
const LANES_PER_WORD: usize = 32;

/// Each word counts the wake-ups made on it, so that a thread that is about
/// to sleep when its wake-up is made sees the count move and does not sleep.
static WORDS: [AtomicU32; WORD_COUNT] = [const { AtomicU32::new(0) }; WORD_COUNT];
static NEXT_LANE: AtomicUsize = AtomicUsize::new(0);

/// One lane: a word and a bit of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Lane {
    word: usize,
    bit: u32,
}

impl Lane {
    /// The next lane, round-robin.
    pub(crate) fn next() -> Lane {
        let lane = NEXT_LANE.fetch_add(1, Ordering::Relaxed) % (WORD_COUNT * LANES_PER_WORD);
        Lane { word: lane / LANES_PER_WORD, bit: 1 << (lane % LANES_PER_WORD) }
    }

    /// The wake-up count of the lane's word, to read before checking for
    /// the outcome and to pass to [`sleep`](Self::sleep).
    pub(crate) fn wake_count(self) -> u32 {
        WORDS[self.word].load(Ordering::Acquire)
    }

    /// Sleeps until a wake-up is made on this lane, unless one was made on
    /// its word since `wake_count` was read. May return for nothing; the
    /// caller checks its outcome again.
    pub(crate) fn sleep(self, wake_count: u32) {
        sys::wait(&WORDS[self.word], wake_count, self.bit);
    }
}

/// The lanes owed a wake-up, as a bit mask per word.
#[derive(Debug, Default)]
pub(crate) struct Lanes {
    owed: [u32; WORD_COUNT],
}

impl Lanes {
    pub(crate) fn add(&mut self, lane: Lane) {
        self.owed[lane.word] |= lane.bit;
    }

    /// Takes over the lanes `other` owes.
    pub(crate) fn append(&mut self, other: &mut Lanes) {
        for (bits, more) in self.owed.iter_mut().zip(&mut other.owed) {
            *bits |= std::mem::take(more);
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.owed.iter().all(|&bits| bits == 0)
    }

    /// Wakes every lane owed, one system call per word.
    pub(crate) fn wake_all(&mut self) {
        for (word, bits) in WORDS.iter().zip(&mut self.owed) {
            if *bits != 0 {
                word.fetch_add(1, Ordering::Release);
                sys::wake(word, std::mem::take(bits));
            }
        }
    }
}

#[cfg(target_os = "linux")]
mod sys {
    use std::ptr;
    use std::sync::atomic::AtomicU32;

    pub(super) fn wait(word: &AtomicU32, expected: u32, bits: u32) {
        // SAFETY: the word is a live, aligned `AtomicU32` in a static; the
        // call reads it and sleeps, with no timeout and no second word. Any
        // result (woken, value changed, interrupted) sends the caller back
        // to checking its outcome.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT_BITSET | libc::FUTEX_PRIVATE_FLAG,
                expected,
                ptr::null::<libc::timespec>(),
                ptr::null::<u32>(),
                bits,
            );
        }
    }

    pub(super) fn wake(word: &AtomicU32, bits: u32) {
        // SAFETY: as in `wait`; waking reads no memory but the word's address.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAKE_BITSET | libc::FUTEX_PRIVATE_FLAG,
                i32::MAX,
                ptr::null::<libc::timespec>(),
                ptr::null::<u32>(),
                bits,
            );
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod sys {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{Condvar, Mutex};

    static SLEEPERS: [(Mutex<()>, Condvar); super::WORD_COUNT] =
        [const { (Mutex::new(()), Condvar::new()) }; super::WORD_COUNT];

    fn index(word: &AtomicU32) -> usize {
        super::WORDS.iter().position(|candidate| std::ptr::eq(candidate, word)).expect("a lane word")
    }

    pub(super) fn wait(word: &AtomicU32, expected: u32, _bits: u32) {
        let (lock, sleepers) = &SLEEPERS[index(word)];
        let guard = lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if word.load(Ordering::Acquire) == expected {
            drop(sleepers.wait(guard));
        }
    }

    pub(super) fn wake(word: &AtomicU32, _bits: u32) {
        let (lock, sleepers) = &SLEEPERS[index(word)];
        // Taking the lock orders this wake-up after any waiter's check of
        // the word, so none sleeps through it.
        drop(lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
        sleepers.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use std::thread;

    #[test]
    fn lanes_are_handed_out_round_robin_over_every_bit() {
        let first = Lane::next();
        let second = Lane::next();
        let index = |lane: Lane| lane.word * LANES_PER_WORD + lane.bit.trailing_zeros() as usize;
        assert_eq!((index(first) + 1) % (WORD_COUNT * LANES_PER_WORD), index(second));
    }

    #[test]
    fn a_wake_up_made_after_the_count_was_read_is_not_slept_through() {
        let lane = Lane::next();
        let count = lane.wake_count();
        let mut owed = Lanes::default();
        owed.add(lane);
        owed.wake_all();
        assert!(owed.is_empty());
        // Returns at once: the count moved.
        lane.sleep(count);
    }

    #[test]
    fn one_wake_up_wakes_every_lane_owed() {
        let lanes: Vec<Lane> = (0..3).map(|_| Lane::next()).collect();
        let flags: Vec<Arc<AtomicBool>> = (0..3).map(|_| Arc::new(AtomicBool::new(false))).collect();
        let woken: Vec<Arc<AtomicBool>> = (0..3).map(|_| Arc::new(AtomicBool::new(false))).collect();
        let threads: Vec<_> = (0..3)
            .map(|index| {
                let (lane, flag, woken) = (lanes[index], flags[index].clone(), woken[index].clone());
                thread::spawn(move || {
                    loop {
                        let count = lane.wake_count();
                        if flag.load(Ordering::Acquire) {
                            break;
                        }
                        lane.sleep(count);
                    }
                    woken.store(true, Ordering::Release);
                })
            })
            .collect();
        let mut owed = Lanes::default();
        for index in [0, 2] {
            flags[index].store(true, Ordering::Release);
            owed.add(lanes[index]);
        }
        owed.wake_all();
        let mut threads: Vec<_> = threads.into_iter().map(Some).collect();
        for index in [0, 2] {
            threads[index].take().unwrap().join().unwrap();
        }
        assert!(woken[0].load(Ordering::Acquire) && woken[2].load(Ordering::Acquire));
        flags[1].store(true, Ordering::Release);
        owed.add(lanes[1]);
        owed.wake_all();
        threads[1].take().unwrap().join().unwrap();
    }
}
