//! Client library and wire protocol of ringlock, a lock server with FIFO
//! hand-off, leases and fencing tokens.
//!
//! A [`Client`] keeps persistent connections to the nodes it is given and
//! pipelines the requests of every thread and task over them. It depends on
//! no async runtime: background threads do the I/O, the blocking methods
//! block the calling thread, and the `_async` methods return futures that
//! those threads complete through the task's `Waker`, so they work under
//! tokio, glommio, async-std, smol or a hand-written executor alike.
//!
//! # Blocking use
//!
//! ```no_run
//! use std::time::Duration;
//! use ringlock_client::{Client, ReleaseOutcome};
//!
//! # fn main() -> Result<(), ringlock_client::Error> {
//! // One address: the client keeps two connections to it.
//! let client = Client::connect(["127.0.0.1:7700"])?;
//!
//! // Hold `orders/42` for at most 30 s, waiting at most 5 s for it.
//! match client.acquire("orders/42", Duration::from_secs(30), Some(Duration::from_secs(5)))? {
//!     Some(lock) => {
//!         // Hand the fencing token to the protected resource with every write.
//!         println!("token {}", lock.token());
//!         assert_eq!(lock.release()?, ReleaseOutcome::Released);
//!     }
//!     None => println!("still held by someone else after 5 s"),
//! }
//!
//! // Only if it is free now; the lock is released when dropped.
//! if let Some(_lock) = client.try_acquire("cron/cleanup", Duration::from_secs(60))? {
//!     // ... the critical section ...
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Async use
//!
//! The futures need no reactor, so any executor drives them; here a
//! minimal one, to show that nothing else is needed:
//!
//! ```no_run
//! use std::future::Future;
//! use std::sync::Arc;
//! use std::task::{Context, Poll, Wake, Waker};
//! use std::time::Duration;
//! use ringlock_client::Client;
//!
//! struct Unpark(std::thread::Thread);
//!
//! impl Wake for Unpark {
//!     fn wake(self: Arc<Self>) {
//!         self.0.unpark();
//!     }
//! }
//!
//! fn block_on<F: Future>(future: F) -> F::Output {
//!     let mut future = std::pin::pin!(future);
//!     let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
//!     let mut cx = Context::from_waker(&waker);
//!     loop {
//!         match future.as_mut().poll(&mut cx) {
//!             Poll::Ready(output) => return output,
//!             Poll::Pending => std::thread::park(),
//!         }
//!     }
//! }
//!
//! # fn main() -> Result<(), ringlock_client::Error> {
//! let client = Client::connect(["10.0.0.1:7700", "10.0.0.2:7700"])?;
//! block_on(async {
//!     let lock = client.acquire_async("orders/42", Duration::from_secs(30), None).await?.expect("no wait limit");
//!     lock.extend_async(Duration::from_secs(60)).await?;
//!     lock.release_async().await?;
//!     Ok(())
//! })
//! # }
//! ```
//!
//! # What the client does for you (docs/protocol.md §4)
//!
//! - **Connections.** One per node, two when given a single address; chosen
//!   round-robin. A broken one is left out and reconnected in the
//!   background: at once, then after doubling pauses from 50 ms up to 3 s,
//!   each drawn between half its length and all of it
//!   ([`ClientBuilder::reconnect_delay_first`]).
//! - **Waiting for a connection.** A request that finds no usable connection
//!   waits for one within its own limit (an acquire's wait, an extend's lease
//!   left, a release's retry period, else
//!   [`ClientBuilder::connect_limit`], 10 s), then fails with
//!   [`Error::NoConnection`], naming every address and the failure of its
//!   last attempt.
//! - **Silent connections.** A connection with requests in flight that has
//!   read nothing for 1 s is sent `P`, and cut if nothing comes within 1 s
//!   more ([`ClientBuilder::suspect_after`],
//!   [`ClientBuilder::ping_timeout`]); its requests move on as from a broken
//!   one. A vanished host or a partition (no reset, no close) thus costs a
//!   request about 2 s beyond its own limit, never the time until the link
//!   comes back. Sockets use TCP keepalive and `TCP_USER_TIMEOUT`.
//! - **Pipelining.** Requests from all callers share the connections; replies
//!   are paired with requests by (operation, key), and several requests with
//!   the same (operation, key) on one connection are paired in the order sent.
//! - **Cut connections.** An acquire (or extend, ping, stats) whose connection
//!   breaks moves to the next connection, with the wait it has left; once cut
//!   on as many connections as the client has, it waits for a connection to
//!   come back, as above. A release is sent again on another connection,
//!   else retried every 200 ms for 5 s.
//! - **Clusters.** A standby answers lock requests with `M` naming the
//!   active; the client re-sends the request there and prefers that node from
//!   then on. A node it was not given is added to the set. While no active is
//!   known (a failover), requests are retried every 200 ms for 5 s.
//! - **Authentication.** With a secret ([`ClientBuilder::secret`], or the
//!   environment variable `RINGLOCK_SECRET`), every connection and every
//!   reconnect first sends `U <secret>` and carries requests only once the
//!   server has named the client ([`Client::name`]); a refused secret fails
//!   the connection, which is retried with the usual pauses, and requests
//!   fail past their limit with [`Error::Auth`].
//! - **TLS.** With a server CA ([`ClientBuilder::tls_ca`], and
//!   [`tls_cert`](ClientBuilder::tls_cert)/[`tls_key`](ClientBuilder::tls_key)
//!   for mutual TLS), every connection runs a TLS handshake within the
//!   connect timeout before anything else; a refused handshake fails the
//!   connection, which is retried with the usual pauses, and requests fail
//!   past their limit with [`Error::Tls`].
//! - **Cancellation.** Dropping a [`Lock`] releases it in the background;
//!   dropping an acquire future releases a grant that arrives after all.
//!
//! Every default can be changed with [`ClientBuilder`].
//!
//! # Keys, leases and waits
//!
//! A key is 1 to 250 bytes, none of them space, tab, CR, LF or NUL, given as
//! `&str`, `&[u8]` or anything `AsRef<[u8]>`; it is checked before sending.
//! The key `-` is refused too ([`BadArgument::DashKey`]): error replies write
//! `-` for "no key", so an error about `-` could not be paired with its
//! request. Leases and waits are [`Duration`](std::time::Duration)s rounded
//! up to the millisecond; a wait of `None` waits without limit.
//!
//! Fencing tokens increase for each key across hand-offs, lease expiry,
//! failovers and restarts; tokens of different keys are unique but not
//! ordered with each other.
//!
//! # Limits
//!
//! - Beyond the silence watch, the client has no request timeout of its own:
//!   a request on a node that answers its pings waits within the limits the
//!   server enforces (an acquire with no wait limit, for as long as it takes).
//! - An acquire cut after the server granted it but before the reply arrived
//!   is re-sent; the lost grant holds the key until its lease runs out.
//! - Replies for one key on one connection keep their order, so a
//!   [`Client::try_acquire`] sent behind a waiting acquire of the same key on
//!   the same connection is answered only after it.
//!
//! # Layout
//!
//! Three layers, each importing only its own and those below it
//! (`scripts/module-cycles.py`, run by CI, checks that no two modules import
//! each other, directly or round a cycle).
//!
//! **The protocol core**: no sockets, no threads, no clock of its own; plain
//! functions of the request, the event and `now`, tested as such.
//! - [`proto`]: the wire protocol v1, the `ringlock-proto` crate re-exported,
//!   shared by client, server, load generator and fuzz targets.
//! - `error.rs`: [`Error`], [`BadArgument`], [`ProtocolError`],
//!   [`ConnectionFailure`].
//! - `operation.rs`: a request's life as a state machine: what to do on a
//!   reply, a cut connection, no connection (moves, retries, redirects), and
//!   the retry rules (`Policy`, from the [`ClientBuilder`] settings). Who
//!   waits for the outcome is a type parameter.
//! - `pairing.rs`: pairing replies with the requests in flight on a
//!   connection by (op, key), in send order.
//! - `backoff.rs`: the reconnect schedule, a pure function of the attempt
//!   number and a random draw.
//! - `liveness.rs`: the silence watch of a connection, and the socket
//!   options that back it.
//!
//! **The runtime**: the threads, sockets and wake-ups that carry the core's
//! steps out.
//! - `config.rs`: [`ClientBuilder`] and the defaults.
//! - `lane.rs`: the futex lanes blocked threads sleep on, so that one system
//!   call wakes every thread a read completed.
//! - `completion.rs`: the one-shot cell between the I/O threads and a waiting
//!   thread or task, and `Submitted`, an operation whose caller waits on one.
//! - `timer.rs`: the retry thread.
//! - `tls.rs`: the TLS client settings and handshake.
//! - `connection.rs`: one connection's reader thread (connect, read, pair,
//!   reconnect) and writer thread (batched writes); it reaches the router
//!   only through the `ConnectionSet` trait.
//! - `router.rs`: the connection set, round-robin, the active node, and
//!   carrying out each step of a request.
//!
//! **The public API**: what applications call.
//! - `handle.rs`: what a client, its locks and futures share (the router,
//!   closed when the last goes), and waiting for a request's outcome,
//!   blocking or as a future.
//! - `lock.rs`: [`Lock`] (token, extend, release, release on drop),
//!   [`ReleaseOutcome`], and the future of an acquire.
//! - `client.rs`: [`Client`], its methods and the checks made before sending.
//! - `clusters.rs`: [`Clusters`], several named clusters' clients, each key
//!   sent to the one [`cluster_for`] chooses.

#![warn(missing_docs)]

mod backoff;
mod client;
mod clusters;
mod completion;
mod config;
mod connection;
mod error;
mod handle;
mod lane;
mod liveness;
mod lock;
mod operation;
mod pairing;
mod router;
mod timer;
mod tls;

// The README's examples compile (those marked `ignore` use names of the
// reader's program).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExamples;

#[doc(inline)]
pub use ringlock_proto as proto;

pub use client::{Client, Pong};
pub use clusters::{CLUSTERS_MAX, Clusters, cluster_for};
pub use config::{ClientBuilder, NODES_MAX, SECRET_ENV};
pub use error::{BadArgument, ConnectionFailure, Error, ProtocolError};
pub use lock::{Lock, Lost, ReleaseOutcome};
pub use operation::Inspection;
