//! [`Lock`]: a grant held by this client, with its fencing token; extend it,
//! release it, or drop it to release it in the background.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::client::{Client, failure, instant_after, lease_ms};
use crate::error::Error;
use crate::operation::{Kind, Outcome};

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
    client: Client,
    key: Arc<[u8]>,
    token: u64,
    /// When the lease ends, as far as this client knows: counted from when
    /// the grant arrived (later than the server's by the reply's way back
    /// at most) or the last confirmed extend was sent. An extend waits for a
    /// usable connection until then, as after it the grant is gone anyway.
    lease_ends: Arc<Mutex<Instant>>,
    /// Set once `release` has taken over, so that drop does not release again.
    released: bool,
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
    pub(crate) fn new(client: Client, key: Arc<[u8]>, token: u64, lease_ends: Instant) -> Lock {
        Lock { client, key, token, lease_ends: Arc::new(Mutex::new(lease_ends)), released: false }
    }

    fn lease_ends(&self) -> Instant {
        *self.lease_ends.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
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
    /// [`Client::acquire`]. An extend cut by a broken connection moves to the
    /// next connection as an acquire does; with no usable connection it
    /// waits for one until the lease this client knows of ends, then fails
    /// with [`Error::NoConnection`].
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
        self.client.request_until(kind, self.key.clone(), Some(self.lease_ends()), extended)?;
        extend_known_lease(&self.lease_ends, instant_after(sent, lease));
        Ok(())
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
                self.client.request_async_until(kind, self.key.clone(), Some(self.lease_ends()), extended)
            }
            Err(error) => self.client.refused(error, extended),
        };
        let lease_ends = self.lease_ends.clone();
        async move {
            reply.await?;
            extend_known_lease(&lease_ends, instant_after(sent, lease));
            Ok(())
        }
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
    /// period: the lease frees the key later. [`Error::Server`] for another
    /// refusal (for example `shutting-down`).
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
        self.client.request(Kind::Release { token: self.token }, self.key.clone(), released)
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
        self.client.request_async(Kind::Release { token: self.token }, self.key.clone(), released)
    }
}

impl Lock {
    /// Gives up this handle without releasing the grant, and returns its
    /// token: the key stays held until someone releases it with the token
    /// (see [`Client::release`]) or its lease runs out. For a lock that must
    /// outlive this process, such as `ringlock-cli acquire` in a script.
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
        self.token
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        if !self.released {
            self.client.router().submit(Kind::Release { token: self.token }, self.key.clone(), None);
        }
    }
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock").field("key", &String::from_utf8_lossy(&self.key)).field("token", &self.token).finish()
    }
}

/// Records a confirmed extend. The lease now ends `ends`; an extend may
/// shorten it, so this is not a maximum.
fn extend_known_lease(lease_ends: &Mutex<Instant>, ends: Instant) {
    *lease_ends.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = ends;
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
