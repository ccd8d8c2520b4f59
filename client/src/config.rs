//! The client's settings: [`ClientBuilder`], with the defaults of docs/protocol.md §4.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{BadArgument, Error};
use crate::operation::Policy;
use crate::proto::is_valid_address;
use crate::tls::TlsFiles;

/// Most nodes a client talks to: the most a ringlock cluster may have.
///
/// # Examples
///
/// ```
/// assert_eq!(ringlock_client::NODES_MAX, 16);
/// ```
pub use crate::proto::NODES_MAX;

/// Most connections the client keeps to one node.
const CONNECTIONS_PER_NODE_MAX: usize = 64;
/// Connections to each node when the client is given one address: two, so
/// that a brief cut of one does not stop service.
const CONNECTIONS_PER_NODE_SINGLE: usize = 2;
const RECONNECT_DELAY_FIRST_DEFAULT: Duration = Duration::from_millis(50);
const RECONNECT_DELAY_MAX_DEFAULT: Duration = Duration::from_secs(3);
const CONNECT_LIMIT_DEFAULT: Duration = Duration::from_secs(10);
const RELEASE_RETRY_INTERVAL_DEFAULT: Duration = Duration::from_millis(200);
const RELEASE_RETRY_FOR_DEFAULT: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(1);
/// The shortest bounded wait the protocol can express.
const TRY_ACQUIRE_WAIT_DEFAULT: Duration = Duration::from_millis(1);
const REDIRECT_LIMIT_DEFAULT: u32 = 16;
const IN_FLIGHT_PER_CONNECTION_MAX_DEFAULT: usize = 65_536;
const SUSPECT_AFTER_DEFAULT: Duration = Duration::from_secs(1);
const PING_TIMEOUT_DEFAULT: Duration = Duration::from_secs(1);
/// Longest `suspect_after` or `ping_timeout`: their sum, in milliseconds,
/// must fit `TCP_USER_TIMEOUT`.
const SILENCE_LIMIT_MAX: Duration = Duration::from_secs(3600);
/// The environment variable a client reads its secret from when
/// [`ClientBuilder::secret`] was not called, so that the secret need not
/// appear on a command line or in shell history.
pub const SECRET_ENV: &str = "RINGLOCK_SECRET";
/// Longest secret: a `U` line must fit in the server's 1024 bytes.
const SECRET_LEN_MAX: usize = 1024 - 2;

/// The client's secret. Its `Debug` shows only that there is one, so that
/// logging a client's settings never leaks it.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(pub(crate) String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Settings for a [`Client`](crate::Client), then
/// [`connect`](ClientBuilder::connect).
///
/// Every setting has the default docs/protocol.md §4 gives; change them only for a
/// reason (tests use short intervals, for example).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use ringlock_client::Client;
///
/// # fn main() -> Result<(), ringlock_client::Error> {
/// let client = Client::builder(["10.0.0.1:7700", "10.0.0.2:7700"])
///     .connect_limit(Duration::from_secs(30))
///     .connect()?;
/// assert_eq!(client.connection_count(), 2);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct ClientBuilder {
    pub(crate) addresses: Vec<String>,
    connections_per_node: Option<usize>,
    pub(crate) reconnect_delay_first: Duration,
    pub(crate) reconnect_delay_max: Duration,
    connect_limit: Duration,
    release_retry_interval: Duration,
    release_retry_for: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) try_acquire_wait: Duration,
    redirect_limit: u32,
    pub(crate) in_flight_per_connection_max: usize,
    pub(crate) suspect_after: Duration,
    pub(crate) ping_timeout: Duration,
    pub(crate) secret: Option<Secret>,
    pub(crate) tls: TlsFiles,
    /// The rustls settings built from `tls` when the client connects.
    pub(crate) tls_config: Option<Arc<rustls::ClientConfig>>,
}

impl ClientBuilder {
    /// Settings for a client of the nodes at `addresses` (`host:port`, as
    /// the servers' `--peers` or `--listen` name them, so that `M` replies
    /// can be matched with them), with every default.
    ///
    /// # Examples
    ///
    /// ```
    /// use ringlock_client::ClientBuilder;
    ///
    /// let builder = ClientBuilder::new(["127.0.0.1:7700"]);
    /// ```
    pub fn new<I, A>(addresses: I) -> ClientBuilder
    where
        I: IntoIterator<Item = A>,
        A: Into<String>,
    {
        ClientBuilder {
            addresses: addresses.into_iter().map(Into::into).collect(),
            connections_per_node: None,
            reconnect_delay_first: RECONNECT_DELAY_FIRST_DEFAULT,
            reconnect_delay_max: RECONNECT_DELAY_MAX_DEFAULT,
            connect_limit: CONNECT_LIMIT_DEFAULT,
            release_retry_interval: RELEASE_RETRY_INTERVAL_DEFAULT,
            release_retry_for: RELEASE_RETRY_FOR_DEFAULT,
            connect_timeout: CONNECT_TIMEOUT_DEFAULT,
            try_acquire_wait: TRY_ACQUIRE_WAIT_DEFAULT,
            redirect_limit: REDIRECT_LIMIT_DEFAULT,
            in_flight_per_connection_max: IN_FLIGHT_PER_CONNECTION_MAX_DEFAULT,
            suspect_after: SUSPECT_AFTER_DEFAULT,
            ping_timeout: PING_TIMEOUT_DEFAULT,
            secret: None,
            tls: TlsFiles::default(),
            tls_config: None,
        }
    }

    /// Connections to keep to each node, 1 to 64. Default: 2 when the client
    /// is given one address, so that a brief cut of one does not stop
    /// service, else 1.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// let client = ringlock_client::Client::builder(["127.0.0.1:7700"]).connections_per_node(4).connect()?;
    /// assert_eq!(client.connection_count(), 4);
    /// # Ok(())
    /// # }
    /// ```
    pub fn connections_per_node(mut self, connections: usize) -> ClientBuilder {
        self.connections_per_node = Some(connections);
        self
    }

    /// The first pause of the reconnect schedule. Default: 50 ms.
    ///
    /// A connection that broke, or whose connect failed, is tried again at
    /// once, then after doubling pauses from this one up to
    /// [`reconnect_delay_max`](Self::reconnect_delay_max). Each pause is
    /// drawn at random between half its nominal length and all of it, so
    /// that clients cut at the same moment do not all come back at the same
    /// moment. The schedule starts over once a connection has answered a
    /// request or stayed open for `reconnect_delay_max`. A broken connection
    /// carries no request meanwhile.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let builder = ringlock_client::Client::builder(["127.0.0.1:7700"]).reconnect_delay_first(Duration::from_millis(20));
    /// ```
    pub fn reconnect_delay_first(mut self, delay: Duration) -> ClientBuilder {
        self.reconnect_delay_first = delay;
        self
    }

    /// The longest pause of the reconnect schedule (see
    /// [`reconnect_delay_first`](Self::reconnect_delay_first)). Default: 3 s.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let builder = ringlock_client::Client::builder(["127.0.0.1:7700"]).reconnect_delay_max(Duration::from_secs(1));
    /// ```
    pub fn reconnect_delay_max(mut self, delay: Duration) -> ClientBuilder {
        self.reconnect_delay_max = delay;
        self
    }

    /// How long a request with no limit of its own waits for a usable
    /// connection before it fails with [`Error::NoConnection`]: an acquire
    /// with no wait limit, [`Client::try_acquire`](crate::Client::try_acquire),
    /// a ping, an inspect, a stats request. Default: 10 s.
    ///
    /// Requests with a limit of their own wait within it instead: an acquire
    /// its wait, an extend the lease it has left, a release its
    /// [`release_retry_for`](Self::release_retry_for).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let builder = ringlock_client::Client::builder(["127.0.0.1:7700"]).connect_limit(Duration::from_secs(2));
    /// ```
    pub fn connect_limit(mut self, limit: Duration) -> ClientBuilder {
        self.connect_limit = limit;
        self
    }

    /// Pause between two tries of a release that found no usable connection.
    /// Default: 200 ms. A release cut off by a broken connection is first
    /// re-sent at once on another connection, if one is usable.
    ///
    /// The same pause spaces the tries of a request that a node answered with
    /// `M` and no active known (a failover in progress).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let builder = ringlock_client::Client::builder(["127.0.0.1:7700"]).release_retry_interval(Duration::from_millis(50));
    /// ```
    pub fn release_retry_interval(mut self, interval: Duration) -> ClientBuilder {
        self.release_retry_interval = interval;
        self
    }

    /// How long a release keeps being retried before it gives up with
    /// [`Error::NoConnection`] (the lease frees the key later anyway).
    /// Default: 5 s.
    ///
    /// The same period bounds the retries of a request while no active node
    /// is known, after which it fails with [`Error::NoActive`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let builder = ringlock_client::Client::builder(["127.0.0.1:7700"]).release_retry_for(Duration::from_secs(10));
    /// ```
    pub fn release_retry_for(mut self, period: Duration) -> ClientBuilder {
        self.release_retry_for = period;
        self
    }

    /// Longest wait for a TCP connection to be established. Default: 1 s.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let builder = ringlock_client::Client::builder(["127.0.0.1:7700"]).connect_timeout(Duration::from_millis(250));
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.connect_timeout = timeout;
        self
    }

    /// The wait [`Client::try_acquire`](crate::Client::try_acquire), and an
    /// acquire with a wait of `Some(Duration::ZERO)`, ask for. Default: 1 ms, the shortest the protocol can express (a wait of
    /// 0 means "no limit").
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let builder = ringlock_client::Client::builder(["127.0.0.1:7700"]).try_acquire_wait(Duration::from_millis(5));
    /// ```
    pub fn try_acquire_wait(mut self, wait: Duration) -> ClientBuilder {
        self.try_acquire_wait = wait;
        self
    }

    /// Most `M` redirects one request follows before it fails with
    /// [`Error::NoActive`]; this stops two confused nodes from bouncing a
    /// request forever. Default: 16.
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = ringlock_client::Client::builder(["127.0.0.1:7700"]).redirect_limit(4);
    /// ```
    pub fn redirect_limit(mut self, redirects: u32) -> ClientBuilder {
        self.redirect_limit = redirects;
        self
    }

    /// Most requests in flight on one connection, at least 1; beyond it the
    /// connection takes no more, and when every connection is full a request
    /// fails with [`Error::TooManyInFlight`]. Default: 65536. This bounds the
    /// client's memory when a server stalls.
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = ringlock_client::Client::builder(["127.0.0.1:7700"]).in_flight_per_connection_max(1024);
    /// ```
    pub fn in_flight_per_connection_max(mut self, requests: usize) -> ClientBuilder {
        self.in_flight_per_connection_max = requests;
        self
    }

    /// How long a connection with requests in flight may read nothing before
    /// it is suspected and sent `P`. Default: 1 s.
    ///
    /// A host that lost power, or a partition, neither resets nor closes a
    /// connection, so without this a request on it would wait until the
    /// link came back. A suspected connection that still reads nothing for
    /// [`ping_timeout`](Self::ping_timeout) is cut like a broken one: its
    /// acquires move to another connection with the wait they have left
    /// (or fail with [`Error::NoConnection`] once it has run out), its
    /// releases are sent again elsewhere. A silent node thus costs a request
    /// at most `suspect_after + ping_timeout` and a tick (a quarter of the
    /// shorter of the two) beyond its own limit. A request waiting its turn
    /// on a live connection costs one `P` per `suspect_after`. Sockets also
    /// get TCP keepalive and, on Linux, `TCP_USER_TIMEOUT` of
    /// `suspect_after + ping_timeout`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let builder = ringlock_client::Client::builder(["127.0.0.1:7700"])
    ///     .suspect_after(Duration::from_millis(500))
    ///     .ping_timeout(Duration::from_millis(500));
    /// ```
    pub fn suspect_after(mut self, silence: Duration) -> ClientBuilder {
        self.suspect_after = silence;
        self
    }

    /// How long a suspected connection (see
    /// [`suspect_after`](Self::suspect_after)) has to answer anything after
    /// its `P` before it is cut. Default: 1 s.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let builder = ringlock_client::Client::builder(["127.0.0.1:7700"]).ping_timeout(Duration::from_millis(300));
    /// ```
    pub fn ping_timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.ping_timeout = timeout;
        self
    }

    /// The secret to authenticate every connection with, for servers started
    /// with `--auth-file` (docs/security.md). Without this call the client
    /// takes the environment variable `RINGLOCK_SECRET` if it is set and not
    /// empty, which keeps the secret off command lines and out of shell
    /// history; with neither, it sends no secret.
    ///
    /// With a secret, each connection, and each reconnect, first sends
    /// `U <secret>` and carries requests only once the server has answered
    /// with the name the secret belongs to ([`Client::name`](crate::Client::name)).
    /// A refused secret fails that connection, which is then retried with
    /// the usual pauses; requests waiting for a connection fail past their
    /// limit with [`Error::Auth`]. The secret never appears in `Debug` output
    /// or in errors.
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = ringlock_client::Client::builder(["127.0.0.1:7700"]).secret("0kq3…");
    /// assert!(!format!("{builder:?}").contains("0kq3"));
    /// ```
    pub fn secret(mut self, secret: impl Into<String>) -> ClientBuilder {
        self.secret = Some(Secret(secret.into()));
        self
    }

    /// Speaks TLS to every node, checking its certificate against the CA
    /// certificates of the PEM file `path` (the CA that signed the servers'
    /// `--tls-cert`). Without this call the client speaks plain TCP; the
    /// other TLS settings need it, and there is no fallback to the
    /// platform's roots: a ringlock server's certificate comes from the
    /// deployment's own CA (docs/security.md).
    ///
    /// Each connection, and each reconnect, runs a TLS handshake (TLS 1.3 or
    /// 1.2, rustls with the ring provider) within the
    /// [`connect_timeout`](Self::connect_timeout), before the secret's `U`
    /// line and any request. A handshake the client refuses (a certificate
    /// of another CA, expired, or for another name) or that the server
    /// refuses (it wants a client certificate) fails that connection, which
    /// is retried with the usual pauses; requests waiting for a connection
    /// fail past their limit with [`Error::Tls`], which names the address
    /// and the TLS error. The files are read by [`connect`](Self::connect),
    /// which fails with [`BadArgument::Tls`] if one cannot be used.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// let client = ringlock_client::Client::builder(["db.example:7700"]).tls_ca("/etc/ringlock/ca.pem").connect()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn tls_ca(mut self, path: impl Into<PathBuf>) -> ClientBuilder {
        self.tls.ca = Some(path.into());
        self
    }

    /// The client's certificate chain (PEM), for servers started with
    /// `--tls-client-ca` (mutual TLS); needs [`tls_key`](Self::tls_key) and
    /// [`tls_ca`](Self::tls_ca).
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = ringlock_client::Client::builder(["127.0.0.1:7700"])
    ///     .tls_ca("ca.pem")
    ///     .tls_cert("client.pem")
    ///     .tls_key("client.key");
    /// ```
    pub fn tls_cert(mut self, path: impl Into<PathBuf>) -> ClientBuilder {
        self.tls.cert = Some(path.into());
        self
    }

    /// The private key (PEM) of [`tls_cert`](Self::tls_cert).
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = ringlock_client::Client::builder(["127.0.0.1:7700"]).tls_ca("ca.pem").tls_cert("c.pem").tls_key("c.key");
    /// ```
    pub fn tls_key(mut self, path: impl Into<PathBuf>) -> ClientBuilder {
        self.tls.key = Some(path.into());
        self
    }

    /// The name every server's certificate must carry. Default: the host
    /// part of each address (`db.example` of `db.example:7700`); an IP
    /// address is checked against the certificate's IP addresses. Set it
    /// when the nodes are reached by addresses their certificates do not
    /// name; needs [`tls_ca`](Self::tls_ca).
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = ringlock_client::Client::builder(["10.0.0.5:7700"]).tls_ca("ca.pem").tls_server_name("locks.internal");
    /// ```
    pub fn tls_server_name(mut self, name: impl Into<String>) -> ClientBuilder {
        self.tls.server_name = Some(name.into());
        self
    }

    /// Reads the TLS files, if TLS was asked for.
    pub(crate) fn load_tls(mut self) -> Result<ClientBuilder, Error> {
        if self.tls.ca.is_some() {
            let config = self.tls.config().map_err(|reason| Error::BadArgument(BadArgument::Tls(reason)))?;
            self.tls_config = Some(config);
        }
        Ok(self)
    }

    /// Takes the secret from `RINGLOCK_SECRET` if none was set.
    pub(crate) fn secret_from_environment(mut self) -> ClientBuilder {
        if self.secret.is_none()
            && let Ok(secret) = std::env::var(SECRET_ENV)
            && !secret.is_empty()
        {
            self.secret = Some(Secret(secret));
        }
        self
    }

    /// Connections per node, as set or by default.
    pub(crate) fn connections_per_node_or_default(&self) -> usize {
        self.connections_per_node.unwrap_or(if self.addresses.len() == 1 { CONNECTIONS_PER_NODE_SINGLE } else { 1 })
    }

    /// The retry rules of the requests.
    pub(crate) fn policy(&self) -> Policy {
        Policy {
            retry_interval: self.release_retry_interval,
            retry_for: self.release_retry_for,
            redirect_limit: self.redirect_limit,
            connect_limit: self.connect_limit,
        }
    }

    /// Checks every setting, naming the first one out of range.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        let bad = |what| Err(Error::BadArgument(BadArgument::Setting(what)));
        if self.addresses.is_empty() {
            return Err(Error::BadArgument(BadArgument::NoAddresses));
        }
        if self.addresses.len() > NODES_MAX {
            return Err(Error::BadArgument(BadArgument::TooManyAddresses));
        }
        if let Some(address) = self.addresses.iter().find(|address| !is_valid_address(address.as_bytes())) {
            return Err(Error::BadArgument(BadArgument::Address(address.clone())));
        }
        if !(1..=CONNECTIONS_PER_NODE_MAX).contains(&self.connections_per_node_or_default()) {
            return bad("connections_per_node must be 1 to 64");
        }
        if self.reconnect_delay_first.is_zero() {
            return bad("reconnect_delay_first must be above zero");
        }
        if self.reconnect_delay_max < self.reconnect_delay_first {
            return bad("reconnect_delay_max must be at least reconnect_delay_first");
        }
        if self.release_retry_interval.is_zero() {
            return bad("release_retry_interval must be above zero");
        }
        if self.connect_timeout.is_zero() {
            return bad("connect_timeout must be above zero");
        }
        if self.try_acquire_wait.is_zero() || self.try_acquire_wait > Duration::from_secs(86_400) {
            return bad("try_acquire_wait must be above zero and at most 86400 s");
        }
        if self.in_flight_per_connection_max == 0 {
            return bad("in_flight_per_connection_max must be at least 1");
        }
        if self.suspect_after.is_zero() || self.suspect_after > SILENCE_LIMIT_MAX {
            return bad("suspect_after must be above zero and at most 3600 s");
        }
        if self.ping_timeout.is_zero() || self.ping_timeout > SILENCE_LIMIT_MAX {
            return bad("ping_timeout must be above zero and at most 3600 s");
        }
        if let Some(Secret(secret)) = &self.secret
            && (secret.is_empty()
                || secret.len() > SECRET_LEN_MAX
                || secret.bytes().any(|byte| matches!(byte, b' ' | b'\t' | b'\r' | b'\n' | 0)))
        {
            return bad("the secret must be 1 to 1022 bytes, none of them space, tab, CR, LF or NUL");
        }
        if let Some(what) = self.tls.incomplete() {
            return bad(what);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_gets_two_connections() {
        assert_eq!(ClientBuilder::new(["a:1"]).connections_per_node_or_default(), 2);
        assert_eq!(ClientBuilder::new(["a:1", "b:1"]).connections_per_node_or_default(), 1);
        assert_eq!(ClientBuilder::new(["a:1"]).connections_per_node(3).connections_per_node_or_default(), 3);
    }

    #[test]
    fn defaults_are_the_spec_s() {
        let builder = ClientBuilder::new(["a:1"]);
        let policy = builder.policy();
        assert_eq!(builder.reconnect_delay_first, Duration::from_millis(50));
        assert_eq!(builder.reconnect_delay_max, Duration::from_secs(3));
        assert_eq!(policy.connect_limit, Duration::from_secs(10));
        assert_eq!(policy.retry_interval, Duration::from_millis(200));
        assert_eq!(policy.retry_for, Duration::from_secs(5));
        assert_eq!(builder.suspect_after, Duration::from_secs(1));
        assert_eq!(builder.ping_timeout, Duration::from_secs(1));
        assert!(builder.validate().is_ok());
    }

    #[test]
    fn validation_names_the_bad_setting() {
        let no_addresses = ClientBuilder::new(Vec::<String>::new()).validate();
        assert_eq!(no_addresses, Err(Error::BadArgument(BadArgument::NoAddresses)));
        let spaced = ClientBuilder::new(["a :1"]).validate();
        assert_eq!(spaced, Err(Error::BadArgument(BadArgument::Address("a :1".into()))));
        let many = ClientBuilder::new((0..17).map(|n| format!("h{n}:1"))).validate();
        assert_eq!(many, Err(Error::BadArgument(BadArgument::TooManyAddresses)));
        assert!(ClientBuilder::new(["a:1"]).connections_per_node(0).validate().is_err());
        assert!(ClientBuilder::new(["a:1"]).reconnect_delay_first(Duration::ZERO).validate().is_err());
        let inverted = ClientBuilder::new(["a:1"]).reconnect_delay_max(Duration::from_millis(10));
        assert!(inverted.validate().is_err(), "a cap below the first delay");
        assert!(ClientBuilder::new(["a:1"]).in_flight_per_connection_max(0).validate().is_err());
        assert!(ClientBuilder::new(["a:1"]).suspect_after(Duration::ZERO).validate().is_err());
        assert!(ClientBuilder::new(["a:1"]).ping_timeout(Duration::from_secs(3601)).validate().is_err());
        assert!(ClientBuilder::new(["a:1"]).ping_timeout(Duration::from_millis(1)).validate().is_ok());
        assert!(ClientBuilder::new(["a:1"]).secret("two words").validate().is_err());
        assert!(ClientBuilder::new(["a:1"]).secret("").validate().is_err());
        assert!(ClientBuilder::new(["a:1"]).secret("x".repeat(1023)).validate().is_err());
        assert!(ClientBuilder::new(["a:1"]).secret("x".repeat(1022)).validate().is_ok());
    }

    #[test]
    fn debug_output_hides_the_secret() {
        let builder = ClientBuilder::new(["a:1"]).secret("hunter2-9f8e7d");
        let debug = format!("{builder:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(debug.contains("<redacted>"), "{debug}");
    }
}
