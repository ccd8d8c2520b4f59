//! The shell's state of one shard core: see [`CoreState`].

use std::net::IpAddr;
use std::os::fd::RawFd;
use std::sync::Arc;

use io_uring::{IoUring, squeue};
use ringlock_proto::Role;

use crate::node::role::Report;
use crate::node::shared::Shared;
use crate::node::stats_reply;
use crate::shard_core::dispatcher::NodeView;
use crate::shard_core::mailbox::CoreMessage;
use crate::shard_core::tls::TlsLayer;

/// One connection's socket, by the slot the dispatcher gave it: what the
/// ring does with it. Its requests and replies are the dispatcher's.
pub(crate) struct Socket {
    /// -1 once closed (the slot is then free in the dispatcher too).
    pub(crate) fd: RawFd,
    pub(crate) recv_armed: bool,
    /// The buffer of the `send` in flight, and how much of it went out.
    pub(crate) sending: Vec<u8>,
    pub(crate) sent: usize,
    pub(crate) send_in_flight: bool,
    /// The dispatcher asked for it to be closed; it is, once no I/O is in flight.
    pub(crate) closing: bool,
    /// The client's address, if known (with `--max-connections-per-ip` or
    /// an auth file); counted for the limit if it is set.
    pub(crate) peer_ip: Option<IpAddr>,
    /// The TLS layer between this socket and the dispatcher (`--tls-cert`).
    pub(crate) tls: Option<Box<TlsLayer>>,
}

impl Socket {
    pub(crate) fn closed() -> Socket {
        Socket {
            fd: -1,
            recv_armed: false,
            sending: Vec::new(),
            sent: 0,
            send_in_flight: false,
            closing: false,
            peer_ip: None,
            tls: None,
        }
    }
}

/// Everything of a shard core that the ring and the other threads touch:
/// the ring, the sockets, what other cores' full inboxes refused, the
/// reports for the replication core, accepting, and the counters of
/// connections refused at the door.
pub(crate) struct CoreState {
    pub(crate) ring: IoUring,
    pub(crate) core: usize,
    pub(crate) cores: usize,
    pub(crate) shared: Arc<Shared>,
    pub(crate) listener: RawFd,
    pub(crate) sockets: Vec<Socket>,
    /// The connections to flush this turn, kept to reuse its memory.
    pub(crate) flush: Vec<u32>,
    /// TLS sockets with ciphertext of their own to send (handshake
    /// messages, alerts), flushed with the rest at the end of the turn.
    pub(crate) tls_flush: Vec<u32>,
    /// Plaintext decrypted or to be encrypted, reused from call to call.
    pub(crate) plain: Vec<u8>,
    /// Batches a full inbox refused, sent again next turn.
    pub(crate) refused: Vec<Vec<CoreMessage>>,
    pub(crate) token_retry_at_ms: Option<u64>,
    pub(crate) now_ms: u64,
    pub(crate) accept_armed: bool,
    pub(crate) accept_retry_at_ms: Option<u64>,
    pub(crate) stopping: bool,
    /// Connections refused by `--max-connections-per-ip`.
    pub(crate) refused_per_ip: u64,
    /// Connections refused by `--max-connections` or a full core.
    pub(crate) refused_max_connections: u64,
    /// Connections refused while stopping.
    pub(crate) refused_shutting_down: u64,
    /// Errors of connections refused at the door, by code.
    pub(crate) refusal_errors: [u64; ringlock_proto::ErrorCode::ALL.len()],
    /// Connections this core has served.
    pub(crate) accepted: u64,
    /// TLS connections ended by a TLS error (a failed handshake, a bad record).
    pub(crate) tls_errors: u64,
    /// New connections that must finish their TLS handshake or authenticate
    /// by a time (`--handshake-ms`): when, and which (slot, generation).
    /// Every entry gets the same bound, so the queue is in time order.
    pub(crate) greetings: std::collections::VecDeque<(u64, u32, u32)>,
    pub(crate) eventfd: RawFd,
    pub(crate) wake_buffer: Box<u64>,
    pub(crate) wake_armed: bool,
    /// Reports the replication core's full queue refused, sent first next turn.
    pub(crate) reports: std::collections::VecDeque<Report>,
}

impl CoreState {
    pub(crate) fn push(&mut self, entry: squeue::Entry) {
        loop {
            // SAFETY: every buffer an entry points to (send buffers, the wake
            // buffer) stays alive and unmoved until its completion arrives.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                return;
            }
            // The submission queue is full: hand it to the kernel to make room.
            if let Err(error) = self.ring.submit() {
                tracing::warn!(core = self.core, "io_uring submit failed: {error}");
            }
        }
    }

    /// The socket in `slot` if it is open (the caller checked its generation).
    pub(crate) fn socket(&mut self, slot: u32) -> Option<&mut Socket> {
        self.sockets.get_mut(slot as usize).filter(|socket| socket.fd >= 0)
    }

    pub(crate) fn all_refused_sent(&self) -> bool {
        self.refused.iter().all(Vec::is_empty)
    }

    /// Sends the reports queued, in order; what the replication core's full
    /// queue refuses waits for the next turn.
    pub(crate) fn send_reports(&mut self) {
        let Some(link) = &self.shared.cluster else { return };
        while let Some(report) = self.reports.pop_front() {
            if let Err(report) = link.report(report) {
                self.reports.push_front(report);
                break;
            }
        }
    }

    pub(crate) fn count_refusal_error(&mut self, code: ringlock_proto::ErrorCode) {
        if let Some(index) = code.index() {
            self.refusal_errors[index] += 1;
        }
    }
}

/// What `P` and `S` show, read from what the node's threads share.
pub(crate) struct SharedView {
    pub(crate) shared: Arc<Shared>,
}

impl NodeView for SharedView {
    fn status(&self) -> (Role, u64, Option<String>) {
        match &self.shared.cluster {
            None => (Role::Active, self.shared.authority.epoch(), Some(self.shared.advertised.clone())),
            Some(link) => {
                let status = link.status();
                (status.role(), status.epoch, status.active_address)
            }
        }
    }

    fn stats_json(&self, role: Role, epoch: u64) -> String {
        stats_reply::json(&self.shared, role, epoch)
    }
}
