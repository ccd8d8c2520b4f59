//! What cluster nodes say to each other over the peer transport.
//!
//! These are the small control messages of the cluster protocol. The lock
//! table itself (snapshots and the delta stream) travels beside them and is
//! described to the node only by [`TableVersion`]s. Encoding them on the wire
//! is the transport's job; every field here is bounded (indexes below 16,
//! plain integers), so a fixed-size encoding fits.

/// How far one replicated table goes: the delta stream of one active, named
/// by the epoch in which that node became active (a ballot, so no two streams
/// share a name), and the number of deltas of that stream it contains.
///
/// A new active starts a new stream at version 0 with the table it holds;
/// moving to a higher epoch while staying active (demotion of a rival,
/// sequence space used up) keeps the stream going.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TableVersion {
    /// The epoch in which the active that produces the stream became active.
    pub stream: u64,
    /// Deltas of the stream applied.
    pub version: u64,
}

/// A node's role as its heartbeats announce it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerRole {
    /// Serves locks (or is handing them off, see [`Heartbeat::handing_off_to`]).
    Active,
    /// Follows an active, or knows none yet, or is becoming active.
    Standby,
    /// Has stopped for good (this incarnation); peers treat it as dead at once.
    Leaving,
}

/// Sent to every peer every `heartbeat_ms`, and at once on a change of role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heartbeat {
    /// Grows across restarts of the sender, so that a restarted node is told
    /// apart from a late message of its previous life.
    pub incarnation: u64,
    /// Grows with every heartbeat of one incarnation; an older one arriving
    /// late (reordered) is ignored.
    pub sequence: u64,
    /// The sender's role.
    pub role: PeerRole,
    /// Active: the epoch its tokens are in. Standby: the epoch of the active
    /// it follows, 0 if it knows none (the `P` reply shows it).
    pub epoch: u64,
    /// The highest epoch the sender has issued, persisted or seen, so that
    /// every node learns the cluster's highest epoch.
    pub epoch_seen: u64,
    /// The active the sender follows (standby only).
    pub following: Option<usize>,
    /// The sender holds a complete table. An active always does, and says
    /// false here only while `--min-standbys` blocks it (too few caught-up
    /// standbys): a rival active that is not blocked then wins, and
    /// standbys follow that one.
    pub caught_up: bool,
    /// The table the sender holds: the active's own stream, or the stream a
    /// standby has applied; `None` for an empty standby.
    pub table: Option<TableVersion>,
    /// An active that is handing its role to this node: it is not a rival.
    pub handing_off_to: Option<usize>,
}

/// One message of the cluster protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerMessage {
    /// Liveness, role, epoch and table of the sender.
    Heartbeat(Heartbeat),
    /// A standby asks the active for a full snapshot followed by its delta
    /// stream. Repeated if nothing arrives; the active may keep a transfer
    /// already on its way.
    SnapshotRequest,
    /// The active asks this node to take over. It has stopped serving, and
    /// `table` is its final state: the successor promotes once it has applied
    /// that much of the stream.
    HandOff {
        /// The active's stream and its final version.
        table: TableVersion,
        /// The highest epoch the active knows, for the successor's new epoch.
        epoch_seen: u64,
    },
    /// The successor is active in `epoch` with the state of `table`.
    HandOffDone {
        /// The hand-off answered (as in [`PeerMessage::HandOff`]).
        table: TableVersion,
        /// The successor's new epoch.
        epoch: u64,
    },
    /// The node will not take over (it follows someone else, is stopping, or
    /// could not catch up in time); the active resumes at once.
    HandOffRefused {
        /// The hand-off refused (as in [`PeerMessage::HandOff`]).
        table: TableVersion,
    },
}

impl PeerMessage {
    /// Every epoch the message carries (a table's stream names one).
    pub fn epochs(&self) -> [Option<u64>; 3] {
        let stream = |table: &TableVersion| Some(table.stream);
        match self {
            PeerMessage::Heartbeat(heartbeat) => {
                [Some(heartbeat.epoch), Some(heartbeat.epoch_seen), heartbeat.table.as_ref().and_then(stream)]
            }
            PeerMessage::SnapshotRequest => [None; 3],
            PeerMessage::HandOff { table, epoch_seen } => [stream(table), Some(*epoch_seen), None],
            PeerMessage::HandOffDone { table, epoch } => [stream(table), Some(*epoch), None],
            PeerMessage::HandOffRefused { table } => [stream(table), None, None],
        }
    }

    /// The highest epoch the message tells of.
    pub fn epoch_max(&self) -> u64 {
        match self {
            PeerMessage::Heartbeat(heartbeat) => heartbeat.epoch.max(heartbeat.epoch_seen),
            PeerMessage::SnapshotRequest | PeerMessage::HandOffRefused { .. } => 0,
            PeerMessage::HandOff { epoch_seen, .. } => *epoch_seen,
            PeerMessage::HandOffDone { epoch, .. } => *epoch,
        }
    }
}
