//! Polling a ring for completions for a moment before sleeping on it.
//!
//! On one host, the kernel wakes a task that sleeps on its ring from inside
//! the `send` of whoever sent it data, on the sender's CPU: over loopback,
//! each side pays for waking the other. A loop that keeps asking for
//! completions for a few microseconds before it sleeps is usually awake when
//! the next data arrives under load, which spares the sender that wake-up.
//! The shard loop, the load generator and its echo server all do this.

use std::io;
use std::time::{Duration, Instant};

use io_uring::{EnterFlags, IoUring};

/// Submits what is queued, then asks `ring` for completions without waiting
/// (which also runs a defer-taskrun ring's deferred work) until some are
/// there, `ready()` says the caller has other work, or `poll` has passed.
/// Returns whether the loop has something to do: `false` means it may sleep.
/// An interrupted or busy `io_uring_enter` (`EINTR`, `EBUSY`) ends the poll
/// as if nothing came, since the sleep after it asks again.
pub fn poll_before_sleep(ring: &mut IoUring, poll: Duration, ready: impl FnMut() -> bool) -> io::Result<bool> {
    match poll_until_ready(ring, poll, ready) {
        Err(error) if matches!(error.raw_os_error(), Some(libc::EINTR | libc::EBUSY)) => Ok(false),
        polled => polled,
    }
}

/// [`poll_before_sleep`] with every error of `io_uring_enter` passed on.
fn poll_until_ready(ring: &mut IoUring, poll: Duration, mut ready: impl FnMut() -> bool) -> io::Result<bool> {
    ring.submit()?;
    let poll_end = Instant::now() + poll;
    while Instant::now() < poll_end {
        // SAFETY: no submissions, no completions to wait for and no argument:
        // the kernel touches nothing but the ring itself.
        unsafe { ring.submitter().enter::<libc::sigset_t>(0, 0, EnterFlags::GETEVENTS.bits(), None) }?;
        if !ring.completion().is_empty() || ready() {
            return Ok(true);
        }
    }
    Ok(false)
}
