//! [`Lock`]: a grant held by this client, with its fencing token; extend it
//! (by hand or automatically), ask the server whether it still holds,
//! learn when it is lost, release it, or drop it to release it in the
//! background.
//!
//! Auto-extend runs on the client's own threads, with no thread per lock:
//! the timer thread sends each extend, and the reply's wake-up (a
//! [`Waker`] of the lock's, woken by the I/O thread that pairs the reply)
//! schedules the next one.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use crate::completion::Completion;
use crate::error::Error;
use crate::handle::{Handle, ReplyState, failure, inspected, instant_after, lease_ms};
use crate::operation::{Kind, Outcome};
use crate::proto::ErrorCode;
use crate::router::Router;

/// A key this client was granted, until it is released or its lease runs out.
///
/// Pass [`token`](Self::token) to the resource the lock protects, which
/// should refuse any token lower than the highest it has seen: that keeps it
/// safe even from a holder whose lease ran out unnoticed (docs/protocol.md §2).
///
/// Dropping a `Lock` releases it in the background (retried like
/// [`release`](Self::release)); call `release` to know the outcome. A held
/// lock is not tied to a connection: a broken connection does not release
/// it, and the release goes over any usable connection.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use ringlock_client::{Client, ReleaseOutcome};
///
/// # fn main() -> Result<(), ringlock_client::Error> {
/// let client = Client::connect(["127.0.0.1:7700"])?;
/// let lock = client.acquire("orders/42", Duration::from_secs(10), None)?.expect("no wait limit");
/// // A long critical section: push the lease out while still holding the key.
/// lock.extend(Duration::from_secs(10))?;
/// assert_eq!(lock.release()?, ReleaseOutcome::Released);
/// # Ok(())
/// # }
/// ```
pub struct Lock {
    /// Keeps the client open while the lock lives.
    handle: Arc<Handle>,
    key: Arc<[u8]>,
    token: u64,
    shared: Arc<Shared>,
    /// Set once `release` has taken over, so that drop does not release again.
    released: bool,
}

/// What a lock's handle, its auto-extend and its [`Lost`] futures share.
struct Shared {
    state: Mutex<State>,
    /// Wakes threads blocked in [`Lost::wait`].
    lost_wake: Condvar,
}

struct State {
    /// When the lease ends, as far as this client knows: counted from when
    /// the grant arrived (later than the server's by the reply's way back
    /// at most) or the last confirmed extend was sent. An extend waits for a
    /// usable connection until then, as after it the grant is gone anyway.
    lease_ends: Instant,
    /// The lease last asked for, which auto-extend asks for again.
    lease: Duration,
    /// The server answered `not-holder`, or the lease ended while
    /// auto-extended without a confirmed extend.
    lost: bool,
    /// Released, detached or dropped: auto-extend stops.
    ended: bool,
    auto_extending: bool,
    on_lost: Vec<Box<dyn FnOnce() + Send>>,
    lost_wakers: Vec<Waker>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Declares the lock lost, once, and tells everyone who asked.
    fn declare_lost(&self) {
        let (callbacks, wakers) = {
            let mut state = self.lock();
            if state.lost || state.ended {
                return;
            }
            state.lost = true;
            (std::mem::take(&mut state.on_lost), std::mem::take(&mut state.lost_wakers))
        };
        self.lost_wake.notify_all();
        wakers.into_iter().for_each(Waker::wake);
        callbacks.into_iter().for_each(|callback| callback());
    }

    fn end(&self) {
        let mut state = self.lock();
        state.ended = true;
        state.on_lost.clear();
    }
}

/// What a release found.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use ringlock_client::{Client, ReleaseOutcome};
///
/// # fn main() -> Result<(), ringlock_client::Error> {
/// let client = Client::connect(["127.0.0.1:7700"])?;
/// let lock = client.acquire("k", Duration::from_millis(100), None)?.expect("no wait limit");
/// std::thread::sleep(Duration::from_millis(200));
/// assert_eq!(lock.release()?, ReleaseOutcome::NotHeld, "the lease ran out first");
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReleaseOutcome {
    /// The grant was released (and the key handed to its next waiter).
    Released,
    /// Nothing was left to release: the grant had already been released (by
    /// an earlier try whose reply was lost), its lease had run out, or the
    /// server restarted. The server answered `E R <key> not-holder`.
    NotHeld,
}

impl Lock {
    /// A lock of `token` on `key` whose lease, asked as `lease`, ends at
    /// `lease_ends` as far as this client knows.
    pub(crate) fn new(handle: Arc<Handle>, key: Arc<[u8]>, token: u64, lease: Duration, lease_ends: Instant) -> Lock {
        let state = State {
            lease_ends,
            lease,
            lost: false,
            ended: false,
            auto_extending: false,
            on_lost: Vec::new(),
            lost_wakers: Vec::new(),
        };
        let shared = Arc::new(Shared { state: Mutex::new(state), lost_wake: Condvar::new() });
        Lock { handle, key, token, shared, released: false }
    }

    fn lease_ends(&self) -> Instant {
        self.shared.lock().lease_ends
    }

    /// The grant's fencing token: unique, and greater than every earlier
    /// grant's token for this key.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// let client = ringlock_client::Client::connect(["127.0.0.1:7700"])?;
    /// let first = client.acquire("k", Duration::from_secs(5), None)?.unwrap();
    /// let first_token = first.token();
    /// drop(first);
    /// let second = client.acquire("k", Duration::from_secs(5), None)?.unwrap();
    /// assert!(second.token() > first_token);
    /// # Ok(())
    /// # }
    /// ```
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The key held.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// let client = ringlock_client::Client::connect(["127.0.0.1:7700"])?;
    /// let lock = client.acquire("orders/42", Duration::from_secs(5), None)?.unwrap();
    /// assert_eq!(lock.key(), b"orders/42");
    /// # Ok(())
    /// # }
    /// ```
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// Makes the lease end `lease` from when the server reads the request,
    /// sooner or later than before.
    ///
    /// # Errors
    ///
    /// `Error::Server(ErrorCode::NotHolder)` if the grant is gone (its lease
    /// ran out, or the server restarted): the lock is lost, stop using it.
    /// [`Error::BadArgument`] for a zero lease; otherwise as
    /// [`Client::acquire`](crate::Client::acquire). An extend cut by a
    /// broken connection moves to the next connection as an acquire does;
    /// with no usable connection it waits for one until the lease this
    /// client knows of ends, then fails with [`Error::NoConnection`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use ringlock_client::{Error, proto::ErrorCode};
    ///
    /// # fn main() -> Result<(), Error> {
    /// let client = ringlock_client::Client::connect(["127.0.0.1:7700"])?;
    /// let lock = client.acquire("jobs/7", Duration::from_secs(5), None)?.unwrap();
    /// match lock.extend(Duration::from_secs(30)) {
    ///     Ok(()) => {}
    ///     Err(Error::Server(ErrorCode::NotHolder)) => eprintln!("lost jobs/7"),
    ///     Err(other) => return Err(other),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn extend(&self, lease: Duration) -> Result<(), Error> {
        let kind = Kind::Extend { token: self.token, lease_ms: lease_ms(lease)? };
        let sent = Instant::now();
        let reply = self.handle.request_until(kind, self.key.clone(), Some(self.lease_ends()), extended);
        note_extend(&self.shared, reply, sent, lease)
    }

    /// [`extend`](Self::extend), as a future. The request is sent when this
    /// is called.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// # async fn run(lock: &ringlock_client::Lock) -> Result<(), ringlock_client::Error> {
    /// lock.extend_async(Duration::from_secs(30)).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn extend_async(&self, lease: Duration) -> impl Future<Output = Result<(), Error>> + Send + 'static {
        let sent = Instant::now();
        let reply = match lease_ms(lease) {
            Ok(lease_ms) => {
                let kind = Kind::Extend { token: self.token, lease_ms };
                self.handle.request_async_until(kind, self.key.clone(), Some(self.lease_ends()), extended)
            }
            Err(error) => self.handle.refused(error, extended),
        };
        let shared = self.shared.clone();
        async move { note_extend(&shared, reply.await, sent, lease) }
    }

    /// Whether the server still holds the key for this lock: asks the
    /// active node with `I <key>` and compares the holder's token with
    /// [`token`](Self::token). `false` once the lease ran out, the lock was
    /// released (by anyone with the token), or the server restarted.
    ///
    /// # Errors
    ///
    /// As [`Client::inspect`](crate::Client::inspect).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// let client = ringlock_client::Client::connect(["127.0.0.1:7700"])?;
    /// let lock = client.acquire("k", Duration::from_secs(5), None)?.unwrap();
    /// assert!(lock.held()?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn held(&self) -> Result<bool, Error> {
        let inspection = self.handle.request(Kind::Inspect, self.key.clone(), inspected)?;
        Ok(inspection.token == Some(self.token))
    }

    /// [`held`](Self::held), as a future. The request is sent when this is
    /// called.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(lock: &ringlock_client::Lock) -> Result<(), ringlock_client::Error> {
    /// if !lock.held_async().await? {
    ///     eprintln!("lost it");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn held_async(&self) -> impl Future<Output = Result<bool, Error>> + Send + 'static {
        let reply = self.handle.request_async(Kind::Inspect, self.key.clone(), inspected);
        let token = self.token;
        async move { Ok(reply.await?.token == Some(token)) }
    }

    /// This client's own view, without asking the server: `true` while the
    /// lease it knows of lasts and the lock was not found lost. `false` once
    /// the lease ran out without a confirmed extend (counted from the grant
    /// or the last confirmed extend), or the lock is lost. Use
    /// [`held`](Self::held) to ask the server.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// let client = ringlock_client::Client::connect(["127.0.0.1:7700"])?;
    /// let lock = client.acquire("k", Duration::from_millis(100), None)?.unwrap();
    /// std::thread::sleep(Duration::from_millis(150));
    /// assert!(!lock.is_locked(), "the lease ran out");
    /// # Ok(())
    /// # }
    /// ```
    pub fn is_locked(&self) -> bool {
        let state = self.shared.lock();
        !state.lost && !state.ended && Instant::now() < state.lease_ends
    }

    /// Whether the lock is known lost: the server answered `not-holder` to
    /// an extend, or, while auto-extended, the lease ended without a
    /// confirmed extend. Once lost, it stays lost.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn run(lock: &ringlock_client::Lock) {
    /// if lock.is_lost() {
    ///     eprintln!("stop: the lock is gone");
    /// }
    /// # }
    /// ```
    pub fn is_lost(&self) -> bool {
        self.shared.lock().lost
    }

    /// A future that completes when the lock is declared lost (see
    /// [`is_lost`](Self::is_lost)); it never completes for a lock released
    /// or dropped first. It also serves blocking code: [`Lost::wait`] and
    /// [`Lost::wait_timeout`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn run(client: ringlock_client::Client) -> Result<(), ringlock_client::Error> {
    /// let lock = client.acquire_async("jobs/7", Duration::from_secs(30), None).await?.unwrap();
    /// lock.auto_extend();
    /// let lost = lock.lost();
    /// // e.g. with tokio: select! { _ = lost => abort_the_work(), _ = work() => {} }
    /// # drop(lost);
    /// # Ok(())
    /// # }
    /// ```
    pub fn lost(&self) -> Lost {
        Lost { shared: self.shared.clone() }
    }

    /// Calls `callback` once when the lock is declared lost (at once if it
    /// already is). It runs on one of the client's I/O or timer threads, so
    /// it must be quick and must not block: signal something and return.
    /// A lock released or dropped first never calls it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicBool, Ordering};
    /// # fn run(lock: &ringlock_client::Lock) {
    /// let stop = Arc::new(AtomicBool::new(false));
    /// let flag = stop.clone();
    /// lock.on_lost(move || flag.store(true, Ordering::SeqCst));
    /// # }
    /// ```
    pub fn on_lost(&self, callback: impl FnOnce() + Send + 'static) {
        let mut state = self.shared.lock();
        if state.lost {
            drop(state);
            callback();
        } else if !state.ended {
            state.on_lost.push(Box::new(callback));
        }
    }

    /// Keeps the lock alive until it is released or dropped: extends it by
    /// the lease last asked for (at acquire, or by the last
    /// [`extend`](Self::extend)) each time a third of it has passed since
    /// the last confirmed extend was sent. An extend that fails for want of
    /// a connection, or with an error other than `not-holder`, is tried
    /// again every
    /// [`release_retry_interval`](crate::ClientBuilder::release_retry_interval)
    /// (on any usable connection) while the lease lasts.
    ///
    /// The lock is declared lost only when the server answers `not-holder`,
    /// or when the lease ends with no confirmed extend: then
    /// [`is_lost`](Self::is_lost) turns true, [`lost`](Self::lost) futures
    /// complete and [`on_lost`](Self::on_lost) callbacks run, at once. The
    /// extends are made by the client's own threads, none per lock. Calling
    /// it again does nothing.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// let client = ringlock_client::Client::connect(["127.0.0.1:7700"])?;
    /// let lock = client.acquire("reindex", Duration::from_secs(15), None)?.unwrap();
    /// lock.auto_extend();
    /// // ... work for as long as it takes, checking lock.is_lost() ...
    /// lock.release()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn auto_extend(&self) {
        let first = {
            let mut state = self.shared.lock();
            if state.auto_extending || state.ended || state.lost {
                return;
            }
            state.auto_extending = true;
            let lease_left = state.lease_ends.saturating_duration_since(Instant::now());
            Instant::now() + (state.lease / 3).min(lease_left)
        };
        let extender = Arc::new(Extender {
            router: Arc::downgrade(self.handle.router()),
            shared: Arc::downgrade(&self.shared),
            key: self.key.clone(),
            token: self.token,
            reply: Mutex::new(None),
        });
        extender.schedule(first);
    }

    /// Releases the grant and blocks until the server answers. The key goes
    /// to its next waiter, if any.
    ///
    /// A release cut off by a broken connection is sent again at once on
    /// another usable connection, else every 200 ms for 5 s (see
    /// [`ClientBuilder::release_retry_interval`](crate::ClientBuilder::release_retry_interval));
    /// a try that finds the grant already released answers
    /// [`ReleaseOutcome::NotHeld`].
    ///
    /// # Errors
    ///
    /// [`Error::NoConnection`] if no try got through within the retry
    /// period: the lease frees the key later. A `shutting-down` answer (a
    /// stopping server) is tried again within that period like a broken
    /// connection. [`Error::Server`] for another refusal (for example
    /// `forbidden`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// let client = ringlock_client::Client::connect(["127.0.0.1:7700"])?;
    /// let lock = client.acquire("k", Duration::from_secs(5), None)?.unwrap();
    /// lock.release()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn release(mut self) -> Result<ReleaseOutcome, Error> {
        self.released = true;
        self.shared.end();
        self.handle.request(Kind::Release { token: self.token }, self.key.clone(), released)
    }

    /// [`release`](Self::release), as a future. The request is sent when this
    /// is called, so dropping the future does not stop the release.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(lock: ringlock_client::Lock) -> Result<(), ringlock_client::Error> {
    /// lock.release_async().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn release_async(mut self) -> impl Future<Output = Result<ReleaseOutcome, Error>> + Send + 'static {
        self.released = true;
        self.shared.end();
        self.handle.request_async(Kind::Release { token: self.token }, self.key.clone(), released)
    }
}

impl Lock {
    /// Gives up this handle without releasing the grant, and returns its
    /// token: the key stays held until someone releases it with the token
    /// (see [`Client::release`](crate::Client::release)) or its lease runs
    /// out. For a lock that must outlive this process, such as
    /// `ringlock-cli acquire` in a script.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// let client = ringlock_client::Client::connect(["127.0.0.1:7700"])?;
    /// let token = client.acquire("deploy", Duration::from_secs(600), None)?.unwrap().detach();
    /// // ... later, maybe from another process:
    /// client.release("deploy", token)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn detach(mut self) -> u64 {
        self.released = true;
        self.shared.end();
        self.token
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        if !self.released {
            self.shared.end();
            self.handle.router().submit(Kind::Release { token: self.token }, self.key.clone(), None);
        }
    }
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock").field("key", &String::from_utf8_lossy(&self.key)).field("token", &self.token).finish()
    }
}

/// An acquire's reply: a [`Lock`], `None` if the wait ran out, or an error.
/// It owns no I/O: the acquire was queued when the future was made.
///
/// Dropping it before it completes abandons the acquire; a grant that
/// arrives anyway is released at once, so no lock leaks from a cancelled
/// task.
#[derive(Debug)]
pub(crate) struct AcquireFuture {
    handle: Arc<Handle>,
    key: Arc<[u8]>,
    /// The lease asked for.
    lease: Duration,
    state: ReplyState,
}

impl AcquireFuture {
    pub(crate) fn waiting(
        handle: Arc<Handle>,
        key: Arc<[u8]>,
        lease: Duration,
        completion: Arc<Completion>,
    ) -> AcquireFuture {
        AcquireFuture { handle, key, lease, state: ReplyState::Waiting(completion) }
    }

    pub(crate) fn refused(handle: Arc<Handle>, error: Error) -> AcquireFuture {
        AcquireFuture { handle, key: Arc::from(&b""[..]), lease: Duration::ZERO, state: ReplyState::Refused(error) }
    }
}

/// What an acquire's outcome means to its caller. A grant's lease is counted
/// from now, as its reply has just arrived: the acquire may have waited in
/// the key's queue, or for a connection, for longer than the lease.
pub(crate) fn acquired(
    handle: &Arc<Handle>,
    key: Arc<[u8]>,
    lease: Duration,
    outcome: Outcome,
) -> Result<Option<Lock>, Error> {
    match outcome {
        Outcome::Acquired(token) => {
            let lease_ends = instant_after(Instant::now(), lease);
            Ok(Some(Lock::new(handle.clone(), key, token, lease, lease_ends)))
        }
        Outcome::TimedOut => Ok(None),
        other => Err(failure(other)),
    }
}

impl Future for AcquireFuture {
    type Output = Result<Option<Lock>, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        this.state.poll(cx).map(|outcome| acquired(&this.handle, this.key.clone(), this.lease, outcome?))
    }
}

impl Drop for AcquireFuture {
    fn drop(&mut self) {
        if let ReplyState::Waiting(completion) = &self.state
            && let Some(Outcome::Acquired(token)) = completion.abandon()
        {
            self.handle.router().submit(Kind::Release { token }, self.key.clone(), None);
        }
    }
}

/// Records an extend's reply. A confirmed extend makes the lease end
/// `lease` after `sent` (an extend may shorten it, so this is not a
/// maximum); `not-holder` declares the lock lost.
fn note_extend(shared: &Shared, reply: Result<(), Error>, sent: Instant, lease: Duration) -> Result<(), Error> {
    match &reply {
        Ok(()) => {
            let mut state = shared.lock();
            state.lease_ends = instant_after(sent, lease);
            state.lease = lease;
        }
        Err(Error::Server(ErrorCode::NotHolder)) => shared.declare_lost(),
        Err(_) => {}
    }
    reply
}

/// A future that completes when its lock is declared lost; see
/// [`Lock::lost`]. It holds neither the lock nor the client open.
pub struct Lost {
    shared: Arc<Shared>,
}

impl Lost {
    /// Blocks the calling thread until the lock is lost.
    pub fn wait(&self) {
        let mut state = self.shared.lock();
        while !state.lost {
            state = self.shared.lost_wake.wait(state).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    /// Blocks the calling thread until the lock is lost or `timeout` has
    /// passed; whether it is lost.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        let deadline = instant_after(Instant::now(), timeout);
        let mut state = self.shared.lock();
        while !state.lost {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            state = self.shared.lost_wake.wait_timeout(state, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
        true
    }
}

impl Future for Lost {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut state = self.shared.lock();
        if state.lost {
            return Poll::Ready(());
        }
        if !state.lost_wakers.iter().any(|waker| waker.will_wake(cx.waker())) {
            state.lost_wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

impl fmt::Debug for Lost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lost").field("lost", &self.shared.lock().lost).finish()
    }
}

/// One auto-extended lock's extends. It holds the lock and the client only
/// weakly, so a dropped lock or closed client stops it.
struct Extender {
    router: Weak<Router>,
    shared: Weak<Shared>,
    key: Arc<[u8]>,
    token: u64,
    /// The extend in flight: its cell, when it was sent, the lease asked.
    reply: Mutex<Option<(Arc<Completion>, Instant, Duration)>>,
}

impl Extender {
    /// Sends the next extend at `at`, on the timer thread.
    fn schedule(self: Arc<Self>, at: Instant) {
        let Some(router) = self.router.upgrade() else { return };
        router.schedule_call(at, Box::new(move || self.send()));
    }

    /// Sends an extend now, unless the lock has ended or its lease has.
    fn send(self: Arc<Self>) {
        let (Some(router), Some(shared)) = (self.router.upgrade(), self.shared.upgrade()) else { return };
        let (lease, lease_ends) = {
            let state = shared.lock();
            if state.ended || state.lost {
                return;
            }
            (state.lease, state.lease_ends)
        };
        let now = Instant::now();
        if now >= lease_ends {
            shared.declare_lost();
            return;
        }
        let Ok(lease_ms) = lease_ms(lease) else { return };
        let completion = Completion::new();
        *self.reply.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some((completion.clone(), now, lease));
        router.submit_until(
            Kind::Extend { token: self.token, lease_ms },
            self.key.clone(),
            Some(completion),
            Some(lease_ends),
        );
        self.poll_reply();
    }

    /// Takes the extend's outcome if it has come, and acts on it; else
    /// leaves this extender's waker for it.
    fn poll_reply(self: Arc<Self>) {
        let waker = Waker::from(self.clone());
        let outcome = {
            let mut reply = self.reply.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let Some((completion, sent, lease)) = reply.as_ref() else { return };
            match completion.poll(&mut Context::from_waker(&waker)) {
                Poll::Ready(outcome) => {
                    let taken = (outcome, *sent, *lease);
                    *reply = None;
                    taken
                }
                Poll::Pending => return,
            }
        };
        let (outcome, sent, lease) = outcome;
        let Some(shared) = self.shared.upgrade() else { return };
        let Some(retry_interval) = self.router.upgrade().map(|router| router.policy.retry_interval) else { return };
        match note_extend(&shared, extended(outcome), sent, lease) {
            Ok(()) => self.schedule(instant_after(sent, lease / 3)),
            Err(Error::Server(ErrorCode::NotHolder)) => {}
            Err(_) => {
                let lease_ends = shared.lock().lease_ends;
                self.schedule(instant_after(Instant::now(), retry_interval).min(lease_ends));
            }
        }
    }
}

impl Wake for Extender {
    fn wake(self: Arc<Self>) {
        self.poll_reply();
    }
}

fn extended(outcome: Outcome) -> Result<(), Error> {
    match outcome {
        Outcome::Extended => Ok(()),
        other => Err(failure(other)),
    }
}

pub(crate) fn released(outcome: Outcome) -> Result<ReleaseOutcome, Error> {
    match outcome {
        Outcome::Released => Ok(ReleaseOutcome::Released),
        Outcome::NotHeld => Ok(ReleaseOutcome::NotHeld),
        other => Err(failure(other)),
    }
}
