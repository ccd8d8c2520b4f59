//! The futures of the async API. They own no I/O: the request is queued when
//! the future is made, and the reader thread that pairs the reply completes
//! it and wakes the task through the [`Waker`](std::task::Waker) it left, so
//! they run under any executor.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::client::Client;
use crate::completion::Completion;
use crate::error::Error;
use crate::lock::Lock;
use crate::operation::{Kind, Outcome};

/// Where a future is.
#[derive(Debug)]
enum State {
    Waiting(Arc<Completion>),
    /// Refused before anything was sent (a bad argument).
    Refused(Error),
    Done,
}

/// A request's reply, turned into `T` by `map`.
#[derive(Debug)]
pub(crate) struct ReplyFuture<T> {
    /// Keeps the client open while the reply is awaited.
    _client: Client,
    state: State,
    map: fn(Outcome) -> Result<T, Error>,
}

impl<T> ReplyFuture<T> {
    pub(crate) fn waiting(client: Client, completion: Arc<Completion>, map: fn(Outcome) -> Result<T, Error>) -> Self {
        ReplyFuture { _client: client, state: State::Waiting(completion), map }
    }

    pub(crate) fn refused(client: Client, error: Error, map: fn(Outcome) -> Result<T, Error>) -> Self {
        ReplyFuture { _client: client, state: State::Refused(error), map }
    }
}

impl<T> Future for ReplyFuture<T> {
    type Output = Result<T, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match std::mem::replace(&mut self.state, State::Done) {
            State::Waiting(completion) => match completion.poll(cx) {
                Poll::Ready(outcome) => Poll::Ready((self.map)(outcome)),
                Poll::Pending => {
                    self.state = State::Waiting(completion);
                    Poll::Pending
                }
            },
            State::Refused(error) => Poll::Ready(Err(error)),
            State::Done => panic!("a ringlock future was polled after it completed"),
        }
    }
}

/// An acquire's reply: a [`Lock`], `None` if the wait ran out, or an error.
///
/// Dropping it before it completes abandons the acquire; a grant that
/// arrives anyway is released at once, so no lock leaks from a cancelled
/// task.
#[derive(Debug)]
pub(crate) struct AcquireFuture {
    client: Client,
    key: Arc<[u8]>,
    /// The lease asked for.
    lease: Duration,
    state: State,
}

impl AcquireFuture {
    pub(crate) fn waiting(
        client: Client,
        key: Arc<[u8]>,
        lease: Duration,
        completion: Arc<Completion>,
    ) -> AcquireFuture {
        AcquireFuture { client, key, lease, state: State::Waiting(completion) }
    }

    pub(crate) fn refused(client: Client, error: Error) -> AcquireFuture {
        AcquireFuture { client, key: Arc::from(&b""[..]), lease: Duration::ZERO, state: State::Refused(error) }
    }
}

/// What an acquire's outcome means to its caller. A grant's lease is counted
/// from now, as its reply has just arrived: the acquire may have waited in
/// the key's queue, or for a connection, for longer than the lease.
pub(crate) fn acquired(
    client: &Client,
    key: Arc<[u8]>,
    lease: Duration,
    outcome: Outcome,
) -> Result<Option<Lock>, Error> {
    match outcome {
        Outcome::Acquired(token) => {
            let lease_ends = crate::client::instant_after(Instant::now(), lease);
            Ok(Some(Lock::new(client.clone(), key, token, lease, lease_ends)))
        }
        Outcome::TimedOut => Ok(None),
        other => Err(crate::client::failure(other)),
    }
}

impl Future for AcquireFuture {
    type Output = Result<Option<Lock>, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match std::mem::replace(&mut self.state, State::Done) {
            State::Waiting(completion) => match completion.poll(cx) {
                Poll::Ready(outcome) => Poll::Ready(acquired(&self.client, self.key.clone(), self.lease, outcome)),
                Poll::Pending => {
                    self.state = State::Waiting(completion);
                    Poll::Pending
                }
            },
            State::Refused(error) => Poll::Ready(Err(error)),
            State::Done => panic!("a ringlock future was polled after it completed"),
        }
    }
}

impl Drop for AcquireFuture {
    fn drop(&mut self) {
        if let State::Waiting(completion) = &self.state
            && let Some(Outcome::Acquired(token)) = completion.abandon()
        {
            self.client.router().submit(Kind::Release { token }, self.key.clone(), None);
        }
    }
}
