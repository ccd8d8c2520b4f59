//! [`Client`]: the handle applications use, with its blocking and async
//! methods, and the checks made before anything is sent.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::completion::Completion;
use crate::config::ClientBuilder;
use crate::error::{BadArgument, Error};
use crate::handle::{Handle, ceil_ms, failure, inspected, instant_after, lease_ms};
use crate::lock::{AcquireFuture, Lock, ReleaseOutcome, acquired, released};
use crate::operation::{Inspection, Kind, Outcome};
use crate::proto::{Role, WAIT_MS_MAX, is_valid_key};
use crate::router::Router;

/// A client of a ringlock server or cluster, shared by every thread and task
/// of an application.
///
/// It keeps one connection per node (two when given one address) with
/// background threads, pipelines requests from all callers over them, and
/// moves, retries and redirects requests as docs/protocol.md §4 says. Cloning is cheap
/// and clones share the connections; they close when the last clone, and
/// the last [`Lock`] and future made from it, are dropped.
///
/// Every request has a blocking method and an `_async` one. The async
/// methods queue the request at once, when called, and return a future that
/// the client's I/O threads complete; it needs no particular executor.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use ringlock_client::Client;
///
/// # fn main() -> Result<(), ringlock_client::Error> {
/// let client = Client::connect(["127.0.0.1:7700"])?;
/// if let Some(lock) = client.acquire("orders/42", Duration::from_secs(30), Some(Duration::from_secs(5)))? {
///     println!("orders/42 is ours, fencing token {}", lock.token());
///     lock.release()?;
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Client {
    handle: Arc<Handle>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("addresses", &self.handle.router().config.addresses)
            .field("connections", &self.connection_count())
            .field("usable_connections", &self.usable_connection_count())
            .field("active_node", &self.active_node())
            .finish()
    }
}

/// A node's answer to a ping.
///
/// # Examples
///
/// ```no_run
/// use ringlock_client::{Client, proto::Role};
///
/// # fn main() -> Result<(), ringlock_client::Error> {
/// let pong = Client::connect(["127.0.0.1:7700"])?.ping()?;
/// if pong.role == Role::Standby {
///     println!("a standby; the active is {:?}", pong.active);
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pong {
    /// Whether the node serves locks.
    pub role: Role,
    /// The node's current epoch (0 before it has decided anything).
    pub epoch: u64,
    /// The active node's client address, if the node knows one.
    pub active: Option<String>,
}

impl ClientBuilder {
    /// Builds the client and starts connecting in the background; requests
    /// made before a connection is up wait for it. Fails only for a bad
    /// setting: an unreachable server shows up as requests failing with
    /// [`Error::NoConnection`] (after their limit) while the client keeps
    /// reconnecting.
    ///
    /// # Examples
    ///
    /// ```
    /// use ringlock_client::{BadArgument, ClientBuilder, Error};
    ///
    /// let error = ClientBuilder::new(["127.0.0.1:7700"]).connections_per_node(0).connect().unwrap_err();
    /// assert!(matches!(error, Error::BadArgument(BadArgument::Setting(_))));
    /// ```
    pub fn connect(self) -> Result<Client, Error> {
        let config = self.secret_from_environment();
        config.validate()?;
        let config = config.load_tls()?;
        Ok(Client { handle: Handle::start(config) })
    }
}

impl Client {
    /// A client of the nodes at `addresses`, with every default setting (see
    /// [`ClientBuilder`]). Give every node of a cluster, in any order.
    ///
    /// # Examples
    ///
    /// ```
    /// use ringlock_client::Client;
    ///
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// let client = Client::connect(["127.0.0.1:7700"])?;
    /// assert_eq!(client.connection_count(), 2, "two connections to a single address");
    /// # Ok(())
    /// # }
    /// ```
    pub fn connect<I, A>(addresses: I) -> Result<Client, Error>
    where
        I: IntoIterator<Item = A>,
        A: Into<String>,
    {
        ClientBuilder::new(addresses).connect()
    }

    /// Settings for a client of the nodes at `addresses`; finish with
    /// [`ClientBuilder::connect`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use ringlock_client::Client;
    ///
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// let client = Client::builder(["127.0.0.1:7700"]).connect_timeout(Duration::from_millis(200)).connect()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder<I, A>(addresses: I) -> ClientBuilder
    where
        I: IntoIterator<Item = A>,
        A: Into<String>,
    {
        ClientBuilder::new(addresses)
    }

    fn router(&self) -> &Arc<Router> {
        self.handle.router()
    }

    /// Acquires `key` for `lease`, waiting in its queue as `wait` says, and
    /// blocks until the server answers. The three wait forms:
    ///
    /// * `None`: no limit; waits in the key's queue until granted.
    /// * `Some(Duration::ZERO)`: try once, exactly as
    ///   [`try_acquire`](Self::try_acquire): granted only if the key is free
    ///   (never queued behind the holder longer than the server's timer
    ///   tick); with no usable connection it waits for one up to the
    ///   [`connect_limit`](ClientBuilder::connect_limit).
    /// * `Some(d)`: waits up to `d` in the queue, from 1 ms to 24 h (a
    ///   duration under 1 ms counts as 1 ms); over 24 h is
    ///   [`Error::BadArgument`] with [`BadArgument::Wait`], whose message
    ///   names the range.
    ///
    /// Returns the [`Lock`], or `Ok(None)` if the wait ran out with nothing
    /// granted. The lease is counted from the grant and rounded up to a
    /// millisecond; so is the wait. Locks are not
    /// re-entrant: a second acquire of a key this client holds waits behind
    /// the holder.
    ///
    /// If the connection carrying the acquire breaks, it moves to the next
    /// connection with the wait it has left. If no connection is usable (a
    /// server restarting, say), it waits for one within its wait, or within
    /// the [`connect_limit`](ClientBuilder::connect_limit) if it has no wait
    /// limit, and then fails with [`Error::NoConnection`]. An acquire cut
    /// after the server granted it leaves that grant to run out its lease.
    ///
    /// # Errors
    ///
    /// [`Error::BadArgument`] for an invalid key (see
    /// [`is_valid_key`](crate::proto::is_valid_key); the key `-` is refused
    /// too, see [`BadArgument::DashKey`]), a zero lease or a wait over a day;
    /// [`Error::Server`] if the server refused the request (for example
    /// `bad-lease` beyond its `--max-lease`, or `too-many-waiters`);
    /// [`Error::NoConnection`], [`Error::NoActive`], [`Error::Protocol`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use ringlock_client::Client;
    ///
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// let client = Client::connect(["127.0.0.1:7700"])?;
    /// match client.acquire("reports/daily", Duration::from_secs(60), Some(Duration::from_millis(500)))? {
    ///     Some(lock) => println!("acquired with token {}", lock.token()),
    ///     None => println!("someone else holds it"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn acquire(
        &self,
        key: impl AsRef<[u8]>,
        lease: Duration,
        wait: Option<Duration>,
    ) -> Result<Option<Lock>, Error> {
        self.acquire_blocking(key.as_ref(), lease, wait, false)
    }

    /// [`acquire`](Self::acquire), or [`try_acquire`](Self::try_acquire)
    /// when `try_once`.
    fn acquire_blocking(
        &self,
        key: &[u8],
        lease: Duration,
        wait: Option<Duration>,
        try_once: bool,
    ) -> Result<Option<Lock>, Error> {
        let (wait, try_once) = self.wait_form(wait, try_once);
        let (key, kind) = acquire_request(key, lease, wait, try_once)?;
        let completion = Completion::for_this_thread();
        self.router().submit(kind, key.clone(), Some(completion.clone()));
        acquired(&self.handle, key, lease, completion.wait())
    }

    /// The wait and try-once flag an acquire sends: a zero wait is a try.
    fn wait_form(&self, wait: Option<Duration>, try_once: bool) -> (Option<Duration>, bool) {
        match wait {
            Some(Duration::ZERO) => (Some(self.router().config.try_acquire_wait), true),
            _ => (wait, try_once),
        }
    }

    /// A [`Lock`] for a grant taken elsewhere, from its key and fencing
    /// token (another process's, say: `ringlock-cli acquire` prints both).
    /// Nothing is sent: the lock can then [`release`](Lock::release),
    /// [`extend`](Lock::extend), [`held`](Lock::held) and
    /// [`auto_extend`](Lock::auto_extend) as one this client acquired.
    /// `lease` is what is left of its lease as far as the caller knows
    /// (this client's [`Lock::is_locked`] counts it from now), and the lease
    /// auto-extend asks for. Dropping the lock releases it, as any lock;
    /// [`Lock::detach`] gives it up without releasing.
    ///
    /// # Errors
    ///
    /// [`Error::BadArgument`] for a key the protocol cannot carry or a zero
    /// lease.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// let client = ringlock_client::Client::connect(["127.0.0.1:7700"])?;
    /// let lock = client.lock_from("deploy", 17_592_186_044_416, Duration::from_secs(30))?;
    /// if lock.held()? {
    ///     lock.release()?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn lock_from(&self, key: impl AsRef<[u8]>, token: u64, lease: Duration) -> Result<Lock, Error> {
        let key = checked_key(key.as_ref())?;
        lease_ms(lease)?;
        Ok(Lock::new(self.handle.clone(), key, token, lease, instant_after(Instant::now(), lease)))
    }

    /// Acquires `key` for `lease` only if it is free, or becomes free within
    /// the shortest wait the protocol can express (1 ms, see
    /// [`ClientBuilder::try_acquire_wait`]); `Ok(None)` if not.
    ///
    /// With no usable connection it waits for one up to the
    /// [`connect_limit`](ClientBuilder::connect_limit), as its own wait is
    /// too short to cover a reconnect.
    ///
    /// Replies for one key on one connection keep their order, so a try
    /// behind another acquire of the same key from this client on the same
    /// connection waits for that one to be answered first.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use ringlock_client::Client;
    ///
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// let client = Client::connect(["127.0.0.1:7700"])?;
    /// let first = client.try_acquire("cron/cleanup", Duration::from_secs(30))?;
    /// assert!(first.is_some());
    /// assert!(client.try_acquire("cron/cleanup", Duration::from_secs(30))?.is_none(), "held by `first`");
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_acquire(&self, key: impl AsRef<[u8]>, lease: Duration) -> Result<Option<Lock>, Error> {
        self.acquire_blocking(key.as_ref(), lease, Some(self.router().config.try_acquire_wait), true)
    }

    /// [`acquire`](Self::acquire), as a future. The request is sent when this
    /// is called; dropping the future before it completes abandons the
    /// acquire, and a grant that arrives anyway is released at once.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use ringlock_client::Client;
    ///
    /// # async fn run() -> Result<(), ringlock_client::Error> {
    /// let client = Client::connect(["127.0.0.1:7700"])?;
    /// if let Some(lock) = client.acquire_async("orders/42", Duration::from_secs(30), None).await? {
    ///     lock.release_async().await?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn acquire_async(
        &self,
        key: impl AsRef<[u8]>,
        lease: Duration,
        wait: Option<Duration>,
    ) -> impl Future<Output = Result<Option<Lock>, Error>> + Send + 'static {
        self.acquire_future(key.as_ref(), lease, wait, false)
    }

    /// [`acquire_async`](Self::acquire_async), or
    /// [`try_acquire_async`](Self::try_acquire_async) when `try_once`.
    fn acquire_future(&self, key: &[u8], lease: Duration, wait: Option<Duration>, try_once: bool) -> AcquireFuture {
        let (wait, try_once) = self.wait_form(wait, try_once);
        match acquire_request(key, lease, wait, try_once) {
            Ok((key, kind)) => {
                let completion = Completion::new();
                self.router().submit(kind, key.clone(), Some(completion.clone()));
                AcquireFuture::waiting(self.handle.clone(), key, lease, completion)
            }
            Err(error) => AcquireFuture::refused(self.handle.clone(), error),
        }
    }

    /// [`try_acquire`](Self::try_acquire), as a future.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use ringlock_client::Client;
    ///
    /// # async fn run(client: Client) -> Result<(), ringlock_client::Error> {
    /// if let Some(lock) = client.try_acquire_async("cron/cleanup", Duration::from_secs(30)).await? {
    ///     // ... the critical section, then `lock` is released when dropped.
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_acquire_async(
        &self,
        key: impl AsRef<[u8]>,
        lease: Duration,
    ) -> impl Future<Output = Result<Option<Lock>, Error>> + Send + 'static {
        self.acquire_future(key.as_ref(), lease, Some(self.router().config.try_acquire_wait), true)
    }

    /// Pings a node (round-robin, the active first once known): its role,
    /// epoch and the active it knows. Every node answers, active or not.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// let client = ringlock_client::Client::connect(["127.0.0.1:7700"])?;
    /// println!("epoch {}", client.ping()?.epoch);
    /// # Ok(())
    /// # }
    /// ```
    pub fn ping(&self) -> Result<Pong, Error> {
        self.handle.request(Kind::Ping, Arc::from(&b""[..]), pong)
    }

    /// [`ping`](Self::ping), as a future.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: ringlock_client::Client) -> Result<(), ringlock_client::Error> {
    /// let pong = client.ping_async().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn ping_async(&self) -> impl Future<Output = Result<Pong, Error>> + Send + 'static {
        self.handle.request_async(Kind::Ping, Arc::from(&b""[..]), pong)
    }

    /// Who holds `key` now, how long its lease has left and how many
    /// acquires wait for it (`I <key>`). It changes nothing on the server.
    ///
    /// # Errors
    ///
    /// [`Error::BadArgument`] for a key the protocol cannot carry; otherwise
    /// as [`ping`](Self::ping).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// let client = ringlock_client::Client::connect(["127.0.0.1:7700"])?;
    /// if client.inspect("orders/42")?.token.is_none() {
    ///     println!("nobody holds orders/42");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn inspect(&self, key: impl AsRef<[u8]>) -> Result<Inspection, Error> {
        let key = checked_key(key.as_ref())?;
        self.handle.request(Kind::Inspect, key, inspected)
    }

    /// [`inspect`](Self::inspect), as a future.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: ringlock_client::Client) -> Result<(), ringlock_client::Error> {
    /// let waiters = client.inspect_async("orders/42").await?.waiters;
    /// # Ok(())
    /// # }
    /// ```
    pub fn inspect_async(
        &self,
        key: impl AsRef<[u8]>,
    ) -> impl Future<Output = Result<Inspection, Error>> + Send + 'static {
        match checked_key(key.as_ref()) {
            Ok(key) => self.handle.request_async(Kind::Inspect, key, inspected),
            Err(error) => self.handle.refused(error, inspected),
        }
    }

    /// Releases the grant of `key` with `token`, known from an earlier
    /// acquire (possibly by another process, as `ringlock-cli acquire`
    /// prints it). Retried like [`Lock::release`].
    ///
    /// # Errors
    ///
    /// [`Error::BadArgument`] for a key the protocol cannot carry; otherwise
    /// as [`Lock::release`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use ringlock_client::ReleaseOutcome;
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// let client = ringlock_client::Client::connect(["127.0.0.1:7700"])?;
    /// let outcome = client.release("cron/cleanup", 17_592_186_044_416)?;
    /// assert!(matches!(outcome, ReleaseOutcome::Released | ReleaseOutcome::NotHeld));
    /// # Ok(())
    /// # }
    /// ```
    pub fn release(&self, key: impl AsRef<[u8]>, token: u64) -> Result<ReleaseOutcome, Error> {
        let key = checked_key(key.as_ref())?;
        self.handle.request(Kind::Release { token }, key, released)
    }

    /// A node's counters and gauges, as the one line of JSON of its `S`
    /// reply (docs/protocol.md lists the fields).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// let client = ringlock_client::Client::connect(["127.0.0.1:7700"])?;
    /// let json = client.stats()?;
    /// assert!(json.starts_with('{'));
    /// # Ok(())
    /// # }
    /// ```
    pub fn stats(&self) -> Result<String, Error> {
        self.handle.request(Kind::Stats, Arc::from(&b""[..]), stats)
    }

    /// [`stats`](Self::stats), as a future.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: ringlock_client::Client) -> Result<(), ringlock_client::Error> {
    /// let json = client.stats_async().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn stats_async(&self) -> impl Future<Output = Result<String, Error>> + Send + 'static {
        self.handle.request_async(Kind::Stats, Arc::from(&b""[..]), stats)
    }

    /// Connections the client keeps, usable or not: one per node, or two
    /// when it was given one address (see
    /// [`ClientBuilder::connections_per_node`]), plus those of nodes learned
    /// from `M` replies.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// let client = ringlock_client::Client::connect(["10.0.0.1:7700", "10.0.0.2:7700", "10.0.0.3:7700"])?;
    /// assert_eq!(client.connection_count(), 3);
    /// # Ok(())
    /// # }
    /// ```
    pub fn connection_count(&self) -> usize {
        self.router().connection_count()
    }

    /// Connections that are connected now; the others are being connected
    /// or wait to be reconnected. For health checks.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// let client = ringlock_client::Client::connect(["127.0.0.1:7700"])?;
    /// if client.usable_connection_count() == 0 {
    ///     eprintln!("ringlock unreachable; the client keeps reconnecting");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn usable_connection_count(&self) -> usize {
        self.router().usable_connection_count()
    }

    /// The address of the node an `M` reply last named as active, which the
    /// client now prefers; `None` before any `M` reply, or after a node said
    /// it knows no active.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// let client = ringlock_client::Client::connect(["127.0.0.1:7700"])?;
    /// assert_eq!(client.active_node(), None, "no M reply yet");
    /// # Ok(())
    /// # }
    /// ```
    pub fn active_node(&self) -> Option<String> {
        self.router().active_address()
    }

    /// The name the server gave the client's secret
    /// ([`ClientBuilder::secret`]) when a connection last authenticated;
    /// `None` without a secret, or before any connection has authenticated.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// let client = ringlock_client::Client::builder(["127.0.0.1:7700"]).secret("0kq3…").connect()?;
    /// client.ping()?;
    /// println!("authenticated as {:?}", client.name());
    /// # Ok(())
    /// # }
    /// ```
    pub fn name(&self) -> Option<String> {
        self.router().name()
    }

    /// Requests waiting for their next try (releases that found no usable
    /// connection, requests waiting for an active node). For monitoring.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// let client = ringlock_client::Client::connect(["127.0.0.1:7700"])?;
    /// assert_eq!(client.retry_count(), 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn retry_count(&self) -> usize {
        self.router().retry_count()
    }
}

fn pong(outcome: Outcome) -> Result<Pong, Error> {
    match outcome {
        Outcome::Pong { role, epoch, active } => Ok(Pong { role, epoch, active }),
        other => Err(failure(other)),
    }
}

fn stats(outcome: Outcome) -> Result<String, Error> {
    match outcome {
        Outcome::Stats(json) => Ok(json),
        other => Err(failure(other)),
    }
}

/// Checks a key for sending: valid, and not `-` (see [`BadArgument::DashKey`]).
pub(crate) fn checked_key(key: &[u8]) -> Result<Arc<[u8]>, Error> {
    if !is_valid_key(key) {
        return Err(Error::BadArgument(BadArgument::Key));
    }
    if key == b"-" {
        return Err(Error::BadArgument(BadArgument::DashKey));
    }
    Ok(Arc::from(key))
}

/// The wire's wait: 0 for no limit, else at least 1 ms and at most a day.
/// (A zero `Some` is a try, turned into the try's wait before this.)
fn wait_ms(wait: Option<Duration>) -> Result<u64, Error> {
    match wait {
        None => Ok(0),
        Some(wait) => match ceil_ms(wait).max(1) {
            ms if ms > WAIT_MS_MAX => Err(Error::BadArgument(BadArgument::Wait)),
            ms => Ok(ms),
        },
    }
}

fn acquire_request(
    key: &[u8],
    lease: Duration,
    wait: Option<Duration>,
    try_once: bool,
) -> Result<(Arc<[u8]>, Kind), Error> {
    let key = checked_key(key)?;
    let kind = Kind::Acquire { lease_ms: lease_ms(lease)?, wait_ms: wait_ms(wait)?, try_once };
    Ok((key, kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_shared_across_threads() {
        fn shared<T: Send + Sync>() {}
        shared::<Client>();
        shared::<Lock>();
        shared::<Error>();
    }

    #[test]
    fn keys_are_checked_before_sending() {
        assert!(checked_key(b"orders/42").is_ok());
        assert_eq!(checked_key(b"").unwrap_err(), Error::BadArgument(BadArgument::Key));
        assert_eq!(checked_key(b"a b").unwrap_err(), Error::BadArgument(BadArgument::Key));
        assert_eq!(checked_key(&[b'k'; 251]).unwrap_err(), Error::BadArgument(BadArgument::Key));
        assert_eq!(checked_key(b"-").unwrap_err(), Error::BadArgument(BadArgument::DashKey));
        assert!(checked_key(b"--").is_ok());
    }

    #[test]
    fn durations_round_up_to_milliseconds() {
        assert_eq!(lease_ms(Duration::from_secs(30)), Ok(30_000));
        assert_eq!(lease_ms(Duration::from_nanos(1)), Ok(1));
        assert_eq!(lease_ms(Duration::from_micros(1_500)), Ok(2));
        assert_eq!(lease_ms(Duration::ZERO), Err(Error::BadArgument(BadArgument::Lease)));
        assert_eq!(lease_ms(Duration::MAX), Ok(u64::MAX));
        assert_eq!(wait_ms(None), Ok(0));
        assert_eq!(wait_ms(Some(Duration::from_nanos(1))), Ok(1), "a wait under 1 ms is the shortest bounded wait");
        assert_eq!(wait_ms(Some(Duration::from_secs(86_400))), Ok(86_400_000));
        assert_eq!(wait_ms(Some(Duration::from_millis(86_400_001))), Err(Error::BadArgument(BadArgument::Wait)));
    }
}
