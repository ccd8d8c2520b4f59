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

/// Which of a peer's connections its heartbeats are taken from.
///
/// A peer may have several connections open for a moment: it restarted and
/// its old connection is not seen closed yet, or someone who can reach the
/// peer port opened one in its name. Heartbeats are taken from the newest
/// connection that sent one, so that a late heartbeat of a previous life is
/// dropped; but an older connection is heard again as soon as the newer one
/// closes or stays quiet for `quiet_ms`, so that one heartbeat sent in a
/// peer's name on a connection of its own cannot cut the real peer off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeartbeatSource {
    /// The connection heartbeats are taken from (0: none yet).
    connection: u64,
    /// When it last sent one.
    heard_ms: u64,
}

/// What to do with a heartbeat, by the connection it came on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeartbeatFrom {
    /// The connection heartbeats are taken from: take it.
    Current,
    /// Another connection, now the one heartbeats are taken from: take it
    /// whatever its incarnation (see [`super::Node::peer_reconnected`]).
    Switched,
    /// An older connection while the current one is live: drop it.
    Stale,
}

impl HeartbeatSource {
    /// A heartbeat arrived on `connection` at `now_ms`.
    pub fn heartbeat(&mut self, now_ms: u64, connection: u64, quiet_ms: u64) -> HeartbeatFrom {
        let from = if connection == self.connection {
            HeartbeatFrom::Current
        } else if connection > self.connection || now_ms >= self.heard_ms.saturating_add(quiet_ms) {
            HeartbeatFrom::Switched
        } else {
            return HeartbeatFrom::Stale;
        };
        *self = HeartbeatSource { connection, heard_ms: now_ms };
        from
    }

    /// `connection` closed: if heartbeats were taken from it, the next one
    /// from any other connection is taken.
    pub fn closed(&mut self, connection: u64) {
        if connection == self.connection {
            *self = HeartbeatSource::default();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{HeartbeatFrom, HeartbeatSource};

    const QUIET_MS: u64 = 250;

    #[test]
    fn the_newest_connection_takes_over_and_a_late_heartbeat_of_the_old_one_is_dropped() {
        let mut source = HeartbeatSource::default();
        assert_eq!(source.heartbeat(0, 3, QUIET_MS), HeartbeatFrom::Switched);
        assert_eq!(source.heartbeat(50, 3, QUIET_MS), HeartbeatFrom::Current);
        assert_eq!(source.heartbeat(100, 7, QUIET_MS), HeartbeatFrom::Switched);
        assert_eq!(source.heartbeat(120, 3, QUIET_MS), HeartbeatFrom::Stale);
        assert_eq!(source.heartbeat(150, 7, QUIET_MS), HeartbeatFrom::Current);
    }

    #[test]
    fn an_older_connection_is_heard_again_once_the_newer_one_closes() {
        let mut source = HeartbeatSource::default();
        source.heartbeat(0, 3, QUIET_MS);
        source.heartbeat(10, 9, QUIET_MS);
        assert_eq!(source.heartbeat(20, 3, QUIET_MS), HeartbeatFrom::Stale);
        source.closed(4);
        assert_eq!(source.heartbeat(30, 3, QUIET_MS), HeartbeatFrom::Stale, "another connection closed");
        source.closed(9);
        assert_eq!(source.heartbeat(40, 3, QUIET_MS), HeartbeatFrom::Switched);
        assert_eq!(source.heartbeat(90, 3, QUIET_MS), HeartbeatFrom::Current);
    }

    #[test]
    fn an_older_connection_is_heard_again_once_the_newer_one_stays_quiet() {
        let mut source = HeartbeatSource::default();
        source.heartbeat(0, 3, QUIET_MS);
        source.heartbeat(100, 9, QUIET_MS);
        assert_eq!(source.heartbeat(100 + QUIET_MS - 1, 3, QUIET_MS), HeartbeatFrom::Stale);
        assert_eq!(source.heartbeat(100 + QUIET_MS, 3, QUIET_MS), HeartbeatFrom::Switched);
        assert_eq!(source.heartbeat(100 + QUIET_MS + 1, 9, QUIET_MS), HeartbeatFrom::Switched, "a newer connection");
    }
}
