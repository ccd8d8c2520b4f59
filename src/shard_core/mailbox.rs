//! Messages between shard cores: requests for a key another core owns, and
//! the replies coming back, over bounded queues with an eventfd wake-up.
//!
//! Each core collects what it has for every other core during one loop turn
//! and sends it as one batch at the end of the turn, so a target is woken at
//! most once per turn per sender, and only if it is asleep.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use ringlock_proto::{ErrorCode, Op};
use ringlock_shards::{ClientId, Key, NameId, ShardReply};

/// Batches a core's inbox may hold before senders must keep theirs.
pub const INBOX_BATCHES_MAX: usize = 4096;

/// A request routed to the core that owns its key.
#[derive(Debug)]
pub enum RoutedRequest {
    /// `A key lease wait`.
    Acquire { key: Key, lease_ms: u64, wait_ms: u64 },
    /// `R key token`.
    Release { key: Key, token: u64 },
    /// `X key token lease`.
    Extend { key: Key, token: u64, lease_ms: u64 },
    /// `I key`.
    Inspect { key: Key },
    /// A request on a valid key that failed to parse; its error keeps its
    /// place among the replies for the same (op, key).
    Reject { op: Op, key: Key, code: ErrorCode },
}

/// One message between cores.
#[derive(Debug)]
pub enum CoreMessage {
    /// A request from `client`, a connection of the sending core,
    /// authenticated as `name`.
    Request { client: ClientId, name: NameId, request: RoutedRequest },
    /// A reply for `client`, a connection of the receiving core.
    Reply { client: ClientId, reply: ShardReply },
    /// The connection reads no more: its queued requests leave their queues.
    ClientGone(ClientId),
    /// Answer to [`CoreMessage::ClientGone`]: the shard dropped `removed` of the
    /// client's requests unanswered. It follows every reply the shard sent the
    /// client before, so once every shard has acknowledged, nothing more comes.
    GoneAck { client: ClientId, removed: u32 },
    /// From the replication core: a change of this core's role.
    Control(crate::node::role::Control),
    /// A connection another core accepted and admitted (it counts in the
    /// connection limits already), for this core to serve.
    Adopt { fd: RawFd, peer_ip: Option<std::net::IpAddr> },
}

/// The sending side of one core's inbox.
#[derive(Clone)]
pub struct Mailbox {
    sender: Sender<Vec<CoreMessage>>,
    eventfd: RawFd,
    asleep: std::sync::Arc<AtomicBool>,
}

/// The receiving side, owned by the core's event loop.
pub struct Inbox {
    pub receiver: Receiver<Vec<CoreMessage>>,
    pub eventfd: RawFd,
    pub asleep: std::sync::Arc<AtomicBool>,
}

/// A core's inbox and the mailbox others use to reach it.
pub fn inbox() -> std::io::Result<(Mailbox, Inbox)> {
    // SAFETY: eventfd creates a new descriptor; checked below.
    let eventfd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if eventfd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let (sender, receiver) = crossbeam_channel::bounded(INBOX_BATCHES_MAX);
    let asleep = std::sync::Arc::new(AtomicBool::new(false));
    Ok((Mailbox { sender, eventfd, asleep: asleep.clone() }, Inbox { receiver, eventfd, asleep }))
}

impl Mailbox {
    /// Sends a batch; gives it back if the inbox is full, for a later turn.
    pub fn send(&self, batch: Vec<CoreMessage>) -> Result<(), Vec<CoreMessage>> {
        match self.sender.try_send(batch) {
            Ok(()) => {
                self.wake();
                Ok(())
            }
            Err(TrySendError::Full(batch)) => Err(batch),
            // The target core has exited (the server is stopping, or it
            // failed): its connections are closed, so nobody awaits the batch.
            Err(TrySendError::Disconnected(_)) => Ok(()),
        }
    }

    /// Wakes the target if it is asleep (or about to be).
    pub fn wake(&self) {
        if self.asleep.swap(false, Ordering::SeqCst) {
            let one: u64 = 1;
            // SAFETY: writing 8 bytes to an eventfd we own.
            unsafe {
                libc::write(self.eventfd, (&one as *const u64).cast(), 8);
            }
        }
    }
}
