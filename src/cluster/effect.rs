//! What the cluster logic asks the replication core to do.

use super::message::PeerMessage;

/// One action for the caller of [`Node`](super::Node), drained with
/// [`Node::poll_effect`](super::Node::poll_effect) in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Send `message` to peer `to`. Best effort: the logic copes with loss.
    Send {
        /// The peer's index.
        to: usize,
        /// What to send.
        message: PeerMessage,
    },
    /// Persist `epoch` with fsync (the store keeps the highest), then call
    /// [`Node::epoch_persisted`](super::Node::epoch_persisted).
    PersistEpoch {
        /// The epoch to persist.
        epoch: u64,
    },
    /// Serve locks from now on, handing token ranges to the shards under
    /// `epoch` only. A new `stream` means a new activation: number the deltas
    /// from 0 again and drop every replication stream to standbys (they ask for
    /// a snapshot). The same `stream` with a higher epoch means "keep serving,
    /// but every token from now on is in the new epoch". Also ends a hold.
    Activate {
        /// The epoch of every token from now on; persisted already.
        epoch: u64,
        /// The stream the deltas belong to (see [`TableVersion`](super::TableVersion)).
        stream: u64,
    },
    /// Be a standby: answer lock requests `M` with the address of `active`
    /// (`-` if none), including requests held by a hand-off and acquires
    /// queued while this node was active; accept replication from `active`
    /// only; stop streaming to standbys.
    Follow {
        /// The active to follow, if one is known.
        active: Option<usize>,
    },
    /// Send `to` a full snapshot of the table followed by the delta stream
    /// (or keep the one already on its way), then keep streaming to it.
    SendSnapshot {
        /// The standby that asked.
        to: usize,
    },
    /// Hold every client request (answer nothing, grant nothing, let no
    /// lease expire into a grant), wait until every shard has stopped and its
    /// deltas are in the stream, then call
    /// [`Node::clients_held`](super::Node::clients_held) with the final
    /// version. Either a hand-off starts (then `Follow` or `Resume` ends the
    /// hold), or the node learned of an epoch above its own and must move
    /// above it before it grants again (then `Activate` ends the hold, one
    /// fsync later).
    Hold,
    /// The hand-off failed and this node stays active: serve the held
    /// requests and carry on as before.
    Resume,
    /// Stop the process now; the last `Send`s before it should be flushed.
    /// Comes only once every epoch the node asked to persist is persisted.
    Exit {
        /// Why, which says how to answer what is left.
        reason: ExitReason,
    },
}

/// Why a node exits after [`Node::stop_requested`](super::Node::stop_requested).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitReason {
    /// The successor is active with every held lock; held requests were
    /// answered `M` by the `Follow` before this.
    HandedOff,
    /// The node was a standby (or became one while stopping): nothing to hand over.
    Standby,
    /// Active with no live, caught-up standby to hand over to: the plain
    /// shutdown of docs/protocol.md §3 (queued acquires get `E A <key> shutting-down`).
    NoSuccessor,
    /// The hand-off got no answer in time (or was refused): the plain shutdown.
    HandOffFailed,
}
