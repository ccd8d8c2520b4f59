//! The settings of one cluster member: who it is, how many peers there are,
//! and the two timings of docs/protocol.md §5 (heartbeat period and failover timeout).

use ringlock_proto::NODES_MAX;

/// Default period between two heartbeats to every peer (`--heartbeat-ms`).
pub const HEARTBEAT_MS_DEFAULT: u64 = 100;

/// Default time without a heartbeat after which a peer is dead (`--failover-ms`).
pub const FAILOVER_MS_DEFAULT: u64 = 1000;

/// A hand-off never waits less than this for its answer (docs/protocol.md §5).
pub const HANDOFF_TIMEOUT_MS_MIN: u64 = 1000;

/// The settings of one [`Node`](super::Node).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    /// This node's index in `--peers`; 0 is the highest priority.
    pub me: usize,
    /// Nodes in `--peers`, this one included.
    pub nodes: usize,
    /// Period between two heartbeats to every peer.
    pub heartbeat_ms: u64,
    /// A peer is live if a heartbeat from it arrived within this time.
    pub failover_ms: u64,
    /// `--min-standbys`: caught-up standbys that must have applied a grant
    /// or an extend before its reply is sent, and without which the active
    /// stops granting after `failover_ms` (0: off, replication is
    /// asynchronous). Below `nodes`.
    pub min_standbys: usize,
}

impl ClusterConfig {
    /// Node `me` of `nodes` with the default timings; errors say which flag to fix.
    pub fn new(me: usize, nodes: usize) -> Result<ClusterConfig, String> {
        let config = ClusterConfig {
            me,
            nodes,
            heartbeat_ms: HEARTBEAT_MS_DEFAULT,
            failover_ms: FAILOVER_MS_DEFAULT,
            min_standbys: 0,
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks the settings; errors say which flag to fix.
    pub fn validate(&self) -> Result<(), String> {
        if self.nodes == 0 || self.nodes > NODES_MAX {
            return Err(format!("--peers lists {} nodes; a cluster has 1 to {NODES_MAX}", self.nodes));
        }
        if self.me >= self.nodes {
            return Err(format!(
                "--node {} is not in --peers, which lists {} nodes (indexes 0 to {})",
                self.me,
                self.nodes,
                self.nodes - 1
            ));
        }
        if self.heartbeat_ms == 0 {
            return Err("--heartbeat-ms must be at least 1".to_string());
        }
        // Below two heartbeats per failover period, one late heartbeat would
        // make a healthy peer look dead.
        if self.failover_ms < 2 * self.heartbeat_ms {
            return Err(format!(
                "--failover-ms {} must be at least twice --heartbeat-ms {}",
                self.failover_ms, self.heartbeat_ms
            ));
        }
        if self.min_standbys >= self.nodes {
            return Err(format!(
                "--min-standbys {} needs that many standbys besides the active, but --peers lists {} nodes; give \
                 at most {}",
                self.min_standbys,
                self.nodes,
                self.nodes - 1
            ));
        }
        Ok(())
    }

    /// How long a hand-off waits for its answer: max(1 s, 2 × failover).
    pub fn handoff_timeout_ms(&self) -> u64 {
        HANDOFF_TIMEOUT_MS_MIN.max(2 * self.failover_ms)
    }

    /// How long a standby waits for a snapshot it asked for before asking
    /// again (the request or the snapshot may have been lost with a connection).
    pub fn snapshot_retry_ms(&self) -> u64 {
        2 * self.failover_ms
    }

    /// A gap between two inputs longer than this means the node itself was
    /// stopped or starved (SIGSTOP, a long GC-like stall of the host), not
    /// that its peers died.
    pub fn stall_ms(&self) -> u64 {
        2 * self.heartbeat_ms
    }

    /// A peer's newest connection that sent no heartbeat for this long no
    /// longer hides its older ones (see [`super::peer::HeartbeatSource`]):
    /// long enough for a real peer's next heartbeat, short enough that the
    /// heartbeats it hid are missed for well under the failover timeout.
    pub fn heartbeat_quiet_ms(&self) -> u64 {
        (self.failover_ms / 4).max(self.heartbeat_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_limits_are_named_in_errors() {
        let config = ClusterConfig::new(2, 3).unwrap();
        assert_eq!((config.heartbeat_ms, config.failover_ms), (100, 1000));
        assert_eq!(config.handoff_timeout_ms(), 2000);
        assert!(ClusterConfig::new(3, 3).unwrap_err().contains("--node 3"));
        assert!(ClusterConfig::new(0, 17).unwrap_err().contains("1 to 16"));
        let fast = ClusterConfig { me: 0, nodes: 2, heartbeat_ms: 10, failover_ms: 30, min_standbys: 0 };
        assert_eq!(fast.handoff_timeout_ms(), 1000, "never below one second");
        let tight = ClusterConfig { failover_ms: 15, ..fast };
        assert!(tight.validate().unwrap_err().contains("twice --heartbeat-ms"));
    }
}
