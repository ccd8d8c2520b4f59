//! A shard core's part in a cluster: whether it serves its keys, holds their
//! requests during a hand-off, or redirects them to the active node, and what
//! it reports to the replication core (its deltas, and that it is holding).
//!
//! The replication core decides; it tells each core with a [`Control`]
//! message through the core's inbox, so the change lands between two requests
//! and in order with them. A single node is always [`CoreRole::Active`] and
//! reports nothing.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use ringlock_proto::Role;
use ringlock_shards::{Delta, Key};

/// What a core does with requests for its keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoreRole {
    /// Serves them.
    Active,
    /// Keeps them unanswered and lets no lease or wait run out, until the
    /// replication core says how the hand-off ended.
    Held,
    /// Checks them and answers `M` with the active's address.
    Standby,
}

/// A grant to install on a core that becomes active: key, token, the lease
/// left in milliseconds, and the name that took it.
pub type Restored = (Key, u64, u64, ringlock_shards::NameId);

/// An order from the replication core to one shard core.
#[derive(Debug)]
pub enum Control {
    /// Serve from now on, with the tokens of the authority's current epoch
    /// only (a fresh range replaces what the core still holds). `restore`
    /// are the replicated grants of this core's keys, for a node that was
    /// not active before.
    Activate { restore: Vec<Restored> },
    /// Stop serving: held requests and queued acquires are answered `M` with
    /// `active`, the table is dropped, new requests are redirected.
    Follow { active: Option<String> },
    /// Hold requests, then report [`Report::Held`] after every delta so far.
    Hold,
    /// Serve the held requests and carry on (a hand-off failed).
    Resume,
    /// `--min-standbys`: enough caught-up standbys have applied the core's
    /// [`Report::Deltas`] up to number `reports` (counted from 1), so the
    /// replies of the grants they carry may go.
    Acknowledged { reports: u64 },
    /// `--min-standbys`: whether the node may grant (it has had enough
    /// caught-up standbys lately); if not, acquires and extends are refused
    /// `no-standby`.
    Granting(bool),
}

/// What a shard core tells the replication core, in order.
#[derive(Debug)]
pub enum Report {
    /// Changes of the core's table, in the order they happened. Each
    /// core's reports of deltas are numbered from 1 by their order.
    Deltas { core: usize, deltas: Vec<Delta> },
    /// The core holds its requests; every delta it made is reported before this.
    Held { core: usize },
}

/// What `P` and `S` show of the node's role.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeStatus {
    pub active: bool,
    /// The epoch of the active's tokens (this node's, or the followed active's), 0 if none.
    pub epoch: u64,
    /// The address clients should use, if an active is known.
    pub active_address: Option<String>,
}

impl NodeStatus {
    pub fn role(&self) -> Role {
        if self.active { Role::Active } else { Role::Standby }
    }
}

/// Emptied delta buffers kept for reuse, at most this many.
pub const SPARE_DELTA_BUFFERS_MAX: usize = 256;

/// A buffer that grew beyond this many deltas (a burst) is freed rather than
/// kept, so that a quiet node does not hold the memory of its busiest moment.
const SPARE_DELTA_CAPACITY_MAX: usize = 16_384;

/// What the shard cores share with the replication core.
pub struct ClusterLink {
    reports: Sender<Report>,
    /// Delta buffers the replication core has emptied, for the shards to fill
    /// again: a shard then writes its deltas into memory that is already
    /// mapped and sized, instead of growing a new buffer every turn and
    /// leaving its free to another thread.
    spare_sender: Sender<Vec<Delta>>,
    spare: Receiver<Vec<Delta>>,
    /// Written by the replication core on every change of role, read by `P` and `S`.
    pub status: Mutex<NodeStatus>,
    /// Set on SIGINT/SIGTERM: the replication core hands the active role
    /// over (if this node has it) and then ends.
    pub stop: AtomicBool,
    /// The table this node holds, for `S`: the stream (the epoch its active
    /// started in, 0 for none) and how many of its deltas are applied. The
    /// same numbers on the active and a standby mean the standby is caught up.
    pub table_stream: AtomicU64,
    pub table_version: AtomicU64,
    /// Whether this node holds a complete table (always, when active), for `/readyz`.
    pub caught_up: AtomicBool,
    /// Times this node became active (a new stream: start, failover or
    /// hand-off), for `/metrics`.
    pub activations: AtomicU64,
    /// Deltas a standby has yet to apply (see `Node::replication_lag`);
    /// [`LAG_UNKNOWN`] when there is nothing to compare.
    pub replication_lag: AtomicU64,
    /// Peer connections dropped before they proved the peer secret, for
    /// `/metrics`: those this node accepted (a stranger, a node without the
    /// secret or with another one), and those it opened (the node it dialled
    /// did not prove it).
    pub peer_auth_failures_inbound: AtomicU64,
    pub peer_auth_failures_outbound: AtomicU64,
    /// Why this node cannot serve when it should (`None`: nothing stops
    /// it), for `S`, `/readyz` and `/metrics`; written by the replication core.
    pub blocked: Mutex<Option<crate::cluster::Blocked>>,
    /// `--min-standbys`: with more than 0, the cores hold the replies of
    /// grants and extends until the replication core acknowledges them.
    pub min_standbys: usize,
}

/// [`ClusterLink::replication_lag`] when there is nothing to compare.
pub const LAG_UNKNOWN: u64 = u64::MAX;

impl ClusterLink {
    pub fn new(reports: Sender<Report>, min_standbys: usize) -> ClusterLink {
        let (spare_sender, spare) = crossbeam_channel::bounded(SPARE_DELTA_BUFFERS_MAX);
        ClusterLink {
            reports,
            spare_sender,
            spare,
            status: Mutex::new(NodeStatus::default()),
            stop: AtomicBool::new(false),
            table_stream: AtomicU64::new(0),
            table_version: AtomicU64::new(0),
            caught_up: AtomicBool::new(false),
            activations: AtomicU64::new(0),
            replication_lag: AtomicU64::new(LAG_UNKNOWN),
            peer_auth_failures_inbound: AtomicU64::new(0),
            peer_auth_failures_outbound: AtomicU64::new(0),
            blocked: Mutex::new(None),
            min_standbys,
        }
    }

    /// Sends a report, or gives it back if the queue is full.
    pub fn report(&self, report: Report) -> Result<(), Report> {
        match self.reports.try_send(report) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(report)) => Err(report),
            // The replication core has stopped: the process is exiting.
            Err(TrySendError::Disconnected(_)) => Ok(()),
        }
    }

    /// An empty delta buffer to fill, reused if one is spare.
    pub fn delta_buffer(&self) -> Vec<Delta> {
        self.spare.try_recv().unwrap_or_default()
    }

    /// Gives an emptied delta buffer back for reuse; dropped if enough are spare.
    pub fn recycle(&self, mut buffer: Vec<Delta>) {
        if buffer.capacity() == 0 || buffer.capacity() > SPARE_DELTA_CAPACITY_MAX {
            return;
        }
        buffer.clear();
        let _ = self.spare_sender.try_send(buffer);
    }

    /// Why this node cannot serve, if it should and cannot.
    pub fn blocked(&self) -> Option<crate::cluster::Blocked> {
        self.blocked.lock().map(|blocked| *blocked).unwrap_or(None)
    }

    pub fn status(&self) -> NodeStatus {
        self.status.lock().map(|status| status.clone()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link() -> ClusterLink {
        let (reports, _) = crossbeam_channel::bounded(1);
        ClusterLink::new(reports, 0)
    }

    fn grant(token: u64) -> Delta {
        Delta::Grant { key: Key::new(b"k"), token, lease_ms: 10, name: ringlock_shards::NameId::NONE }
    }

    #[test]
    fn a_recycled_delta_buffer_comes_back_empty_with_its_memory() {
        let link = link();
        let mut buffer = link.delta_buffer();
        assert_eq!(buffer.capacity(), 0, "nothing to reuse yet");
        buffer.extend((1..=100).map(grant));
        let capacity = buffer.capacity();
        link.recycle(buffer);
        let reused = link.delta_buffer();
        assert!(reused.is_empty());
        assert_eq!(reused.capacity(), capacity);
        assert_eq!(link.delta_buffer().capacity(), 0, "each buffer is handed out once");
    }

    #[test]
    fn burst_sized_buffers_and_the_surplus_are_freed_not_kept() {
        let link = link();
        link.recycle(Vec::with_capacity(SPARE_DELTA_CAPACITY_MAX + 1));
        assert_eq!(link.delta_buffer().capacity(), 0);
        for _ in 0..SPARE_DELTA_BUFFERS_MAX + 10 {
            link.recycle(Vec::with_capacity(8));
        }
        let kept = std::iter::from_fn(|| Some(link.delta_buffer())).take_while(|b| b.capacity() > 0).count();
        assert_eq!(kept, SPARE_DELTA_BUFFERS_MAX);
    }
}
