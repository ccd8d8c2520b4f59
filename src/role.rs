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

use crossbeam_channel::{Sender, TrySendError};
use ringlock_client::proto::Role;
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

/// A grant to install on a core that becomes active: key, token, and the
/// lease left in milliseconds.
pub type Restored = (Key, u64, u64);

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
}

/// What a shard core tells the replication core, in order.
#[derive(Debug)]
pub enum Report {
    /// Changes of the core's table, in the order they happened.
    Deltas(Vec<Delta>),
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

/// What the shard cores share with the replication core.
pub struct ClusterLink {
    reports: Sender<Report>,
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
}

impl ClusterLink {
    pub fn new(reports: Sender<Report>) -> ClusterLink {
        ClusterLink {
            reports,
            status: Mutex::new(NodeStatus::default()),
            stop: AtomicBool::new(false),
            table_stream: AtomicU64::new(0),
            table_version: AtomicU64::new(0),
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

    pub fn status(&self) -> NodeStatus {
        self.status.lock().map(|status| status.clone()).unwrap_or_default()
    }
}
