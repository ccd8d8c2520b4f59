//! What a node knows of one peer: its last heartbeat and when it arrived.

use super::message::{Heartbeat, PeerRole};

/// One peer as seen from this node.
#[derive(Clone, Copy, Debug, Default)]
pub struct PeerView {
    /// When its last accepted heartbeat arrived (this node's clock).
    pub heard_ms: Option<u64>,
    /// Its last accepted heartbeat.
    pub last: Option<Heartbeat>,
    /// It reconnected since: its next heartbeat is taken whatever its
    /// incarnation and sequence (see [`super::Node::peer_reconnected`]).
    pub reconnected: bool,
}

impl PeerView {
    /// Takes `heartbeat` unless it is older than the last one taken (a
    /// reordered message of the same incarnation, or one from an earlier
    /// incarnation). Returns whether it was taken. A late heartbeat of the
    /// same incarnation still shows that the peer is live: it arrived now.
    pub fn accept(&mut self, now_ms: u64, heartbeat: Heartbeat) -> bool {
        if !std::mem::take(&mut self.reconnected)
            && let Some(last) = self.last
            && (heartbeat.incarnation, heartbeat.sequence) <= (last.incarnation, last.sequence)
        {
            if heartbeat.incarnation == last.incarnation {
                self.heard_ms = Some(now_ms);
            }
            return false;
        }
        self.last = Some(heartbeat);
        self.heard_ms = Some(now_ms);
        true
    }

    /// A heartbeat arrived within `failover_ms` and the peer is not leaving.
    pub fn is_live(&self, now_ms: u64, failover_ms: u64) -> bool {
        let fresh = self.heard_ms.is_some_and(|heard_ms| now_ms < heard_ms + failover_ms);
        fresh && self.last.is_some_and(|last| last.role != PeerRole::Leaving)
    }

    /// The last heartbeat of a live peer.
    pub fn live(&self, now_ms: u64, failover_ms: u64) -> Option<&Heartbeat> {
        if self.is_live(now_ms, failover_ms) { self.last.as_ref() } else { None }
    }
}
