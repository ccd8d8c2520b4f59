//! The state of one shard core beside its shard: see [`CoreState`].

use std::os::fd::RawFd;
use std::sync::Arc;

use io_uring::{IoUring, squeue};
use ringlock_proto::ErrorCode;
use ringlock_shards::{ClientId, Shard};

use crate::core::connection::Connection;
use crate::core::mailbox::{CoreMessage, RoutedRequest};
use crate::node::counters::RequestCounters;
use crate::node::role::{ClusterLink, CoreRole, Report};
use crate::node::shared::Shared;

/// Everything of a shard core but its shard and its receive buffers (so that
/// both can be borrowed next to it): the ring, the connections, what is
/// queued for other cores and the replication core, the core's role, and
/// its counters.
pub(crate) struct CoreState {
    pub(crate) ring: IoUring,
    pub(crate) core: usize,
    pub(crate) cores: usize,
    pub(crate) shared: Arc<Shared>,
    /// This core's copy of the address `P` names.
    pub(crate) advertised: String,
    pub(crate) listener: RawFd,
    pub(crate) connections: Vec<Connection>,
    pub(crate) free_slots: Vec<u32>,
    /// Connections with output to send this turn.
    pub(crate) dirty: Vec<u32>,
    /// Paused connections to try again once their replies drain, or once
    /// their requests in flight are below the limit again.
    pub(crate) resumable: Vec<u32>,
    /// Messages for each core, sent at the end of the turn.
    pub(crate) outgoing: Vec<Vec<CoreMessage>>,
    /// Batches a full inbox refused, sent again next turn.
    pub(crate) refused: Vec<Vec<CoreMessage>>,
    pub(crate) need_tokens: bool,
    pub(crate) token_retry_at_ms: Option<u64>,
    /// Connections open on this core (not closing).
    pub(crate) open: u64,
    pub(crate) now_ms: u64,
    pub(crate) accept_armed: bool,
    pub(crate) accept_retry_at_ms: Option<u64>,
    pub(crate) stopping: bool,
    /// Counters of errors found before a request reaches a shard.
    pub(crate) errors: [u64; ErrorCode::ALL.len()],
    /// Connections refused by `--max-connections-per-ip`.
    pub(crate) refused_per_ip: u64,
    /// Connections refused by `--max-connections` or a full core.
    pub(crate) refused_max_connections: u64,
    /// Connections refused while stopping.
    pub(crate) refused_shutting_down: u64,
    /// Connections this core has served.
    pub(crate) accepted: u64,
    /// Replies written by this core, by operation and result.
    pub(crate) requests: RequestCounters,
    /// Times a connection stopped being read at the in-flight limit.
    pub(crate) in_flight_pauses: u64,
    pub(crate) eventfd: RawFd,
    pub(crate) wake_buffer: Box<u64>,
    pub(crate) wake_armed: bool,
    /// What this core does with requests for its keys.
    pub(crate) role: CoreRole,
    /// The address `M` replies name (standby), if an active is known.
    pub(crate) active_address: Option<Vec<u8>>,
    /// Requests held while the role is [`CoreRole::Held`], in arrival order.
    pub(crate) parked: Vec<(ClientId, RoutedRequest)>,
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

    pub(crate) fn connection(&mut self, slot: u32, generation: u32) -> Option<&mut Connection> {
        live_connection(&mut self.connections, slot, generation)
    }

    pub(crate) fn all_sent(&self) -> bool {
        self.outgoing.iter().all(Vec::is_empty) && self.refused.iter().all(Vec::is_empty)
    }

    /// Queues the deltas the shard made so far as one report, after the
    /// earlier ones.
    pub(crate) fn queue_deltas(&mut self, shard: &mut Shard) {
        if shard.has_deltas() {
            let empty = self.shared.cluster.as_ref().map(ClusterLink::delta_buffer).unwrap_or_default();
            self.reports.push_back(Report::Deltas(shard.take_deltas(empty)));
        }
    }

    /// Sends this turn's deltas and any earlier reports to the replication
    /// core, in order; what its full queue refuses waits for the next turn.
    pub(crate) fn send_reports(&mut self, shard: &mut Shard) {
        // A single node makes no deltas, so this queues nothing there.
        self.queue_deltas(shard);
        let Some(link) = &self.shared.cluster else { return };
        while let Some(report) = self.reports.pop_front() {
            if let Err(report) = link.report(report) {
                self.reports.push_front(report);
                break;
            }
        }
    }

    pub(crate) fn count_error(&mut self, code: ErrorCode) {
        if let Some(index) = code.index() {
            self.errors[index] += 1;
        }
    }
}

/// The connection in `slot` if it is still the one of `generation` and open;
/// a free function so that callers can borrow other fields of [`CoreState`] beside it.
pub(crate) fn live_connection(connections: &mut [Connection], slot: u32, generation: u32) -> Option<&mut Connection> {
    connections.get_mut(slot as usize).filter(|c| c.generation == generation && c.fd >= 0)
}
