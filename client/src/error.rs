//! What can go wrong with a request: the client's typed errors.

use std::fmt;
use std::io;
use std::time::Duration;

use crate::proto::{ErrorCode, ReplyError};

/// Why a request failed.
///
/// A timed-out acquire is not an error: [`Client::acquire`](crate::Client::acquire)
/// answers `Ok(None)`. A release whose grant was already gone is not an error
/// either: [`Lock::release`](crate::Lock::release) answers
/// [`ReleaseOutcome::NotHeld`](crate::ReleaseOutcome::NotHeld).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use ringlock_client::{BadArgument, Client, Error};
///
/// # fn main() -> Result<(), Error> {
/// // Nothing listens on port 1, but the client is built at once and connects
/// // in the background; the bad key is refused before anything is sent.
/// let client = Client::connect(["127.0.0.1:1"])?;
/// let error = client.acquire("two words", Duration::from_secs(30), None).unwrap_err();
/// assert_eq!(error, Error::BadArgument(BadArgument::Key));
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// No usable connection was left: every connection stayed broken for as
    /// long as the request could wait (its wait, lease or retry period, else
    /// the [`connect_limit`](crate::ClientBuilder::connect_limit)), or the
    /// request was cut off on as many connections as the client has. The
    /// client keeps reconnecting in the background, so a later request may
    /// succeed.
    NoConnection {
        /// How long the request waited for a usable connection.
        waited: Duration,
        /// Every address the client tried, each with the failure of its
        /// last attempt, in the order the client was given them.
        addresses: Vec<ConnectionFailure>,
        /// A server answered the request `shutting-down` (it was stopping,
        /// and the request had no effect) and no server took it again
        /// within its limit.
        shutting_down: bool,
    },
    /// No node could be found to serve the request: the nodes answered `M`
    /// with no active known for as long as releases are retried
    /// ([`release_retry_for`](crate::ClientBuilder::release_retry_for)), the
    /// active they named stayed unreachable as long, or they redirected the
    /// request more than [`redirect_limit`](crate::ClientBuilder::redirect_limit)
    /// times.
    NoActive,
    /// The client refused an argument before sending anything.
    BadArgument(BadArgument),
    /// The server answered `E` with this code; the request had no effect.
    Server(ErrorCode),
    /// The server broke the protocol; the client dropped the connection.
    Protocol(ProtocolError),
    /// Every usable connection already carries
    /// [`in_flight_per_connection_max`](crate::ClientBuilder::in_flight_per_connection_max)
    /// requests; try again once some have been answered.
    TooManyInFlight,
    /// The server refused the client's secret
    /// ([`ClientBuilder::secret`](crate::ClientBuilder::secret)): every
    /// address the request could use answered its `U` line with
    /// `auth-failed` (no name has this secret, or it was removed by a
    /// reload) or `auth-disabled` (the server has no auth file), and stayed
    /// so for as long as the request could wait. The client keeps
    /// reconnecting with its usual pauses, so a secret added to the server's
    /// auth file later is taken. A key outside the name's scope is not this
    /// error but [`Error::Server`] with [`ErrorCode::Forbidden`].
    Auth {
        /// The address that refused the secret (the first, if several did).
        address: String,
        /// [`ErrorCode::AuthFailed`] or [`ErrorCode::AuthDisabled`].
        code: ErrorCode,
    },
    /// TLS failed on every address the request could use, for as long as
    /// it could wait: the server's certificate was not trusted (signed by
    /// another CA than [`tls_ca`](crate::ClientBuilder::tls_ca), expired, or
    /// for another name), or the server refused the handshake (it wants a
    /// client certificate, or does not speak TLS). The client keeps
    /// reconnecting with its usual pauses. Nothing was sent in clear.
    Tls {
        /// The address whose handshake failed (the first, if several did).
        address: String,
        /// The TLS error, in words (rustls's).
        message: String,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoConnection { waited, addresses, shutting_down } => {
                write!(f, "no usable connection after {:.1} s", waited.as_secs_f64())?;
                if *shutting_down {
                    f.write_str(" (the server was shutting down)")?;
                }
                for (index, failure) in addresses.iter().enumerate() {
                    f.write_str(if index == 0 { ": " } else { ", " })?;
                    write!(f, "{failure}")?;
                }
                Ok(())
            }
            Error::NoActive => f.write_str("no active ringlock node could be found to serve the request"),
            Error::BadArgument(reason) => write!(f, "bad argument: {reason}"),
            Error::Server(ErrorCode::BadLease) => f.write_str(
                "the ringlock server refused the request: bad-lease (a lease is from 1 ms to the server's --max-lease, default 86400 s)",
            ),
            Error::Server(code) => write!(f, "the ringlock server refused the request: {code}"),
            Error::Protocol(violation) => write!(f, "protocol violation by the ringlock server: {violation}"),
            Error::TooManyInFlight => f.write_str("too many requests in flight on every connection; retry later"),
            Error::Auth { address, code } => write!(f, "{address} refused the client's secret: {code}"),
            Error::Tls { address, message } => write!(f, "TLS with {address} failed: {message}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Protocol(ProtocolError::Malformed(error)) => Some(error),
            _ => None,
        }
    }
}

/// How the last attempt to use one address failed: a connect that failed,
/// or a connection that broke. Carried by [`Error::NoConnection`].
///
/// # Examples
///
/// ```
/// use std::io;
/// use std::time::Duration;
/// use ringlock_client::{ConnectionFailure, Error};
///
/// let refused = io::Error::from_raw_os_error(111);
/// let error = Error::NoConnection {
///     waited: Duration::from_secs(10),
///     addresses: vec![ConnectionFailure::from_io("127.0.0.1:7700", &refused)],
///     shutting_down: false,
/// };
/// assert_eq!(error.to_string(), "no usable connection after 10.0 s: 127.0.0.1:7700 (connection refused)");
/// if let Error::NoConnection { addresses, .. } = &error {
///     assert_eq!(addresses[0].kind, io::ErrorKind::ConnectionRefused);
///     assert_eq!(addresses[0].os_error, Some(111));
/// }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionFailure {
    /// The address as the client was given it (or learned it from `M`).
    pub address: String,
    /// The kind of the I/O error; [`io::ErrorKind::UnexpectedEof`] when the
    /// other end closed the connection, [`io::ErrorKind::NotConnected`]
    /// when no attempt had ended yet.
    pub kind: io::ErrorKind,
    /// The operating system's error number, if the error came from it.
    pub os_error: Option<i32>,
    /// What went wrong, in words (the OS error's text, lower-cased, without
    /// its number).
    pub message: String,
    /// The server's answer to the client's secret when the connection
    /// failed on it ([`ErrorCode::AuthFailed`] or
    /// [`ErrorCode::AuthDisabled`]), else `None`.
    pub auth: Option<ErrorCode>,
    /// The connection failed on TLS: a handshake or a record that one side
    /// refused ([`message`](Self::message) says why), not the network.
    pub tls: bool,
}

impl ConnectionFailure {
    /// The failure of `address` with the I/O error `error`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::io;
    /// use ringlock_client::ConnectionFailure;
    ///
    /// let failure = ConnectionFailure::from_io("db:7700", &io::Error::new(io::ErrorKind::TimedOut, "timed out"));
    /// assert_eq!(failure.to_string(), "db:7700 (timed out)");
    /// ```
    pub fn from_io(address: &str, error: &io::Error) -> ConnectionFailure {
        let text = error.to_string();
        // "Connection refused (os error 111)" reads better as "connection
        // refused": the number is kept in `os_error`.
        let text = match text.rfind(" (os error ") {
            Some(at) if text.ends_with(')') => &text[..at],
            _ => &text[..],
        };
        // The client's own connect timeout (std says "connection timed out",
        // with no OS error) reads as in the other clients; the OS's
        // ETIMEDOUT keeps its own text.
        let text =
            if error.kind() == io::ErrorKind::TimedOut && error.raw_os_error().is_none() { "timed out" } else { text };
        let mut message = String::with_capacity(text.len());
        let mut chars = text.chars();
        if let Some(first) = chars.next() {
            message.extend(first.to_lowercase());
            message.push_str(chars.as_str());
        }
        ConnectionFailure {
            address: address.to_string(),
            kind: error.kind(),
            os_error: error.raw_os_error(),
            message,
            auth: None,
            tls: is_tls_error(error),
        }
    }

    /// The failure of `address` whose server refused the client's secret
    /// with `code`.
    pub(crate) fn auth(address: &str, code: ErrorCode) -> ConnectionFailure {
        ConnectionFailure {
            address: address.to_string(),
            kind: io::ErrorKind::PermissionDenied,
            os_error: None,
            message: format!("secret refused: {code}"),
            auth: Some(code),
            tls: false,
        }
    }

    /// The failure of `address` whose connection the other end closed.
    pub(crate) fn closed(address: &str) -> ConnectionFailure {
        ConnectionFailure {
            address: address.to_string(),
            kind: io::ErrorKind::UnexpectedEof,
            os_error: None,
            message: "closed by the server".to_string(),
            auth: None,
            tls: false,
        }
    }

    /// An address none of whose attempts has ended yet (a connect still
    /// under way).
    pub(crate) fn pending(address: &str) -> ConnectionFailure {
        ConnectionFailure {
            address: address.to_string(),
            kind: io::ErrorKind::NotConnected,
            os_error: None,
            message: "no attempt has ended yet".to_string(),
            auth: None,
            tls: false,
        }
    }
}

impl fmt::Display for ConnectionFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.address, self.message)
    }
}

/// An argument the client refuses before sending anything.
///
/// # Examples
///
/// ```
/// use ringlock_client::{BadArgument, Client, Error};
///
/// let error = Client::connect(Vec::<String>::new()).unwrap_err();
/// assert_eq!(error, Error::BadArgument(BadArgument::NoAddresses));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BadArgument {
    /// The key is empty, longer than [`KEY_LEN_MAX`](crate::proto::KEY_LEN_MAX)
    /// bytes, or holds a space, tab, CR, LF or NUL
    /// (see [`is_valid_key`](crate::proto::is_valid_key)).
    Key,
    /// The key is `-`. The protocol allows it, but an `E` reply writes `-` in
    /// the key position for "no key", so an error about the key `-` could not
    /// be told apart from an error about an unreadable line, and the client
    /// could not pair it with its request.
    DashKey,
    /// The lease is zero; a lease must be at least one millisecond.
    Lease,
    /// The wait is longer than [`WAIT_MS_MAX`](crate::proto::WAIT_MS_MAX)
    /// milliseconds (a day); a wait runs from 1 ms to 24 h. Use
    /// `Some(Duration::ZERO)` to try once, `None` to wait without limit.
    Wait,
    /// The client was given no address.
    NoAddresses,
    /// The client was given more addresses than a cluster may have nodes
    /// ([`NODES_MAX`](crate::NODES_MAX)).
    TooManyAddresses,
    /// An address is empty, `-`, or holds a space, tab, CR, LF or NUL, so no
    /// server could name it in an `M` reply.
    Address(String),
    /// A builder setting is out of its range; the text says which.
    Setting(&'static str),
    /// A TLS file ([`tls_ca`](crate::ClientBuilder::tls_ca),
    /// [`tls_cert`](crate::ClientBuilder::tls_cert),
    /// [`tls_key`](crate::ClientBuilder::tls_key)) cannot be read or used;
    /// the text names it and says why.
    Tls(String),
}

impl fmt::Display for BadArgument {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BadArgument::Key => f.write_str("a key is 1 to 250 bytes, none of them space, tab, CR, LF or NUL"),
            BadArgument::DashKey => f.write_str("the key `-` is reserved: error replies use it for \"no key\""),
            BadArgument::Lease => f.write_str("the lease must be at least 1 ms"),
            BadArgument::Wait => f.write_str(
                "the wait must be from 1 ms to 86400 s (24 h); use Some(Duration::ZERO) to try once, None to wait without limit",
            ),
            BadArgument::NoAddresses => f.write_str("give the client at least one server address"),
            BadArgument::TooManyAddresses => write!(f, "give the client at most {} addresses", crate::NODES_MAX),
            BadArgument::Address(address) => write!(f, "{address:?} is not a server address (host:port)"),
            BadArgument::Setting(what) => f.write_str(what),
            BadArgument::Tls(why) => f.write_str(why),
        }
    }
}

/// How the server broke the protocol. The client drops the connection that
/// did it, since it can no longer pair replies with requests on it, and
/// moves the requests in flight to another connection.
///
/// # Examples
///
/// ```
/// use ringlock_client::{Error, ProtocolError};
/// use ringlock_client::proto::ReplyError;
///
/// let error = Error::Protocol(ProtocolError::Malformed(ReplyError::BadNumber));
/// assert!(error.to_string().contains("not a decimal u64"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtocolError {
    /// A line that is not a valid reply.
    Malformed(ReplyError),
    /// A reply line longer than [`REPLY_LINE_LEN_MAX`](crate::proto::REPLY_LINE_LEN_MAX).
    LineTooLong,
    /// A reply that answers no request in flight on its connection (the
    /// line, lossily decoded).
    Unsolicited(String),
    /// An `X` reply with a token other than the one extended.
    WrongToken {
        /// The token the client extended.
        sent: u64,
        /// The token in the reply.
        received: u64,
    },
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolError::Malformed(error) => write!(f, "{error}"),
            ProtocolError::LineTooLong => f.write_str("reply line too long"),
            ProtocolError::Unsolicited(line) => write!(f, "reply {line:?} answers no request in flight"),
            ProtocolError::WrongToken { sent, received } => {
                write!(f, "extend of token {sent} answered with token {received}")
            }
        }
    }
}

/// Whether `error` is a refusal of the TLS handshake or of the TLS
/// records (a rustls error inside the I/O error).
fn is_tls_error(error: &io::Error) -> bool {
    error.get_ref().is_some_and(|inner| inner.is::<rustls::Error>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_connection_names_every_address_with_its_os_error() {
        let refused = io::Error::from_raw_os_error(libc_econnrefused());
        let timed_out = io::Error::new(io::ErrorKind::TimedOut, "connection timed out");
        let error = Error::NoConnection {
            waited: Duration::from_millis(10_040),
            addresses: vec![
                ConnectionFailure::from_io("127.0.0.1:7700", &refused),
                ConnectionFailure::from_io("127.0.0.1:7701", &timed_out),
                ConnectionFailure::closed("127.0.0.1:7702"),
            ],
            shutting_down: false,
        };
        assert_eq!(
            error.to_string(),
            "no usable connection after 10.0 s: 127.0.0.1:7700 (connection refused), \
             127.0.0.1:7701 (timed out), 127.0.0.1:7702 (closed by the server)"
        );
        let Error::NoConnection { addresses, .. } = error else { unreachable!() };
        assert_eq!(addresses[0].kind, io::ErrorKind::ConnectionRefused);
        assert_eq!(addresses[0].os_error, Some(libc_econnrefused()));
        assert_eq!(addresses[1].os_error, None);
    }

    #[test]
    fn no_connection_says_when_the_server_was_shutting_down() {
        let refused = io::Error::from_raw_os_error(libc_econnrefused());
        let error = Error::NoConnection {
            waited: Duration::from_millis(5_000),
            addresses: vec![ConnectionFailure::from_io("127.0.0.1:7700", &refused)],
            shutting_down: true,
        };
        assert_eq!(
            error.to_string(),
            "no usable connection after 5.0 s (the server was shutting down): 127.0.0.1:7700 (connection refused)"
        );
    }

    /// ECONNREFUSED on Linux.
    fn libc_econnrefused() -> i32 {
        111
    }

    #[test]
    fn messages_name_the_problem() {
        assert!(Error::Server(ErrorCode::TooManyKeys).to_string().ends_with("too-many-keys"));
        assert!(Error::BadArgument(BadArgument::DashKey).to_string().contains("`-`"));
        let wrong = Error::Protocol(ProtocolError::WrongToken { sent: 1, received: 2 });
        assert_eq!(
            wrong.to_string(),
            "protocol violation by the ringlock server: extend of token 1 answered with token 2"
        );
    }

    #[test]
    fn malformed_reply_is_the_source() {
        use std::error::Error as _;
        let error = Error::Protocol(ProtocolError::Malformed(ReplyError::BadRole));
        assert_eq!(error.source().map(|source| source.to_string()), Some(ReplyError::BadRole.to_string()));
        let no_connection = Error::NoConnection { waited: Duration::ZERO, addresses: Vec::new(), shutting_down: false };
        assert!(no_connection.source().is_none());
    }
}
