//! What a [`Client`](crate::Client), its [`Lock`](crate::Lock)s and its
//! futures share: the router, closed when the last of them goes, and the
//! two ways to wait for a request's outcome: blocking the calling thread,
//! or a future that the I/O threads complete through the task's
//! [`Waker`](std::task::Waker), so that it runs under any executor.
//!
//! The public API sits on top of this module: `client` and `lock` turn
//! arguments into requests and outcomes into results, and neither needs
//! the other's internals.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::completion::Completion;
use crate::config::ClientBuilder;
use crate::error::{BadArgument, Error, ProtocolError};
use crate::operation::{Inspection, Kind, Outcome};
use crate::router::Router;

/// The client's router, closed when the last clone of the client, lock and
/// future holding it goes.
#[derive(Debug)]
pub(crate) struct Handle {
    router: Arc<Router>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.router.close();
    }
}

impl Handle {
    /// Starts the router of a validated configuration.
    pub(crate) fn start(config: ClientBuilder) -> Arc<Handle> {
        Arc::new(Handle { router: Router::start(config) })
    }

    pub(crate) fn router(&self) -> &Arc<Router> {
        &self.router
    }

    /// Sends a request and blocks for its reply, turned into `T` by `map`.
    pub(crate) fn request<T>(
        &self,
        kind: Kind,
        key: Arc<[u8]>,
        map: fn(Outcome) -> Result<T, Error>,
    ) -> Result<T, Error> {
        self.request_until(kind, key, None, map)
    }

    /// [`request`](Self::request), waiting for a usable connection until
    /// `connection_deadline` if given, instead of the limit its kind implies.
    pub(crate) fn request_until<T>(
        &self,
        kind: Kind,
        key: Arc<[u8]>,
        connection_deadline: Option<Instant>,
        map: fn(Outcome) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let completion = Completion::for_this_thread();
        self.router.submit_until(kind, key, Some(completion.clone()), connection_deadline);
        map(completion.wait())
    }

    /// Sends a request and returns the future of its reply.
    pub(crate) fn request_async<T>(
        self: &Arc<Self>,
        kind: Kind,
        key: Arc<[u8]>,
        map: fn(Outcome) -> Result<T, Error>,
    ) -> ReplyFuture<T> {
        self.request_async_until(kind, key, None, map)
    }

    /// [`request_async`](Self::request_async), waiting for a usable
    /// connection until `connection_deadline` if given.
    pub(crate) fn request_async_until<T>(
        self: &Arc<Self>,
        kind: Kind,
        key: Arc<[u8]>,
        connection_deadline: Option<Instant>,
        map: fn(Outcome) -> Result<T, Error>,
    ) -> ReplyFuture<T> {
        let completion = Completion::new();
        self.router.submit_until(kind, key, Some(completion.clone()), connection_deadline);
        ReplyFuture { _handle: self.clone(), state: ReplyState::Waiting(completion), map }
    }

    /// A future that fails at once with `error`, for requests refused
    /// before sending.
    pub(crate) fn refused<T>(self: &Arc<Self>, error: Error, map: fn(Outcome) -> Result<T, Error>) -> ReplyFuture<T> {
        ReplyFuture { _handle: self.clone(), state: ReplyState::Refused(error), map }
    }
}

/// Where a future of a request is.
#[derive(Debug)]
pub(crate) enum ReplyState {
    Waiting(Arc<Completion>),
    /// Refused before anything was sent (a bad argument).
    Refused(Error),
    Done,
}

impl ReplyState {
    /// Polls for the outcome, or the refusal, once; `self` is `Done` after
    /// it is ready.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<Outcome, Error>> {
        match std::mem::replace(self, ReplyState::Done) {
            ReplyState::Waiting(completion) => match completion.poll(cx) {
                Poll::Ready(outcome) => Poll::Ready(Ok(outcome)),
                Poll::Pending => {
                    *self = ReplyState::Waiting(completion);
                    Poll::Pending
                }
            },
            ReplyState::Refused(error) => Poll::Ready(Err(error)),
            ReplyState::Done => panic!("a ringlock future was polled after it completed"),
        }
    }
}

/// A request's reply, turned into `T` by `map`. It owns no I/O: the request
/// was queued when the future was made.
#[derive(Debug)]
pub(crate) struct ReplyFuture<T> {
    /// Keeps the client open while the reply is awaited.
    _handle: Arc<Handle>,
    state: ReplyState,
    map: fn(Outcome) -> Result<T, Error>,
}

impl<T> Future for ReplyFuture<T> {
    type Output = Result<T, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let map = self.map;
        self.state.poll(cx).map(|outcome| outcome.and_then(map))
    }
}

/// The error an outcome stands for: its own, or a protocol violation for an
/// outcome that cannot answer the request (pairing by (op, key) rules it out).
pub(crate) fn failure(outcome: Outcome) -> Error {
    match outcome {
        Outcome::Failed(error) => error,
        other => {
            debug_assert!(false, "an outcome that does not answer its request: {other:?}");
            Error::Protocol(ProtocolError::Unsolicited(format!("{other:?}")))
        }
    }
}

pub(crate) fn inspected(outcome: Outcome) -> Result<Inspection, Error> {
    match outcome {
        Outcome::Inspected(inspection) => Ok(inspection),
        other => Err(failure(other)),
    }
}

/// A lease in whole milliseconds, rounded up so it is never shorter than asked.
pub(crate) fn lease_ms(lease: Duration) -> Result<u64, Error> {
    match ceil_ms(lease) {
        0 => Err(Error::BadArgument(BadArgument::Lease)),
        ms => Ok(ms),
    }
}

/// `duration` after `now`, or a century after it if that does not fit.
pub(crate) fn instant_after(now: Instant, duration: Duration) -> Instant {
    now.checked_add(duration).or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 86_400))).unwrap_or(now)
}

/// `duration` in whole milliseconds, rounded up.
pub(crate) fn ceil_ms(duration: Duration) -> u64 {
    let ms = duration.as_millis() + u128::from(!duration.subsec_nanos().is_multiple_of(1_000_000));
    u64::try_from(ms).unwrap_or(u64::MAX)
}
