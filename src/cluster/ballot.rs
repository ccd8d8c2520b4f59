//! Epochs as ballots (docs/protocol.md §2): `round * 16 + node index`, so two nodes never
//! share one, and a node that starts serving moves to a round above every
//! epoch it has persisted or seen. Pure arithmetic: persisting the epoch is
//! the node's (`node::epoch`).

use ringlock_proto::NODES_MAX;
use ringlock_shards::token::EPOCH_MAX;

/// The first epoch of `node` in a round above `highest`.
pub fn next_epoch(highest: u64, node: u64) -> Result<u64, String> {
    // Nodes a cluster may have is also the stride between one node's epochs.
    let stride = NODES_MAX as u64;
    assert!(node < stride);
    let epoch = (highest / stride + 1).checked_mul(stride).and_then(|round| round.checked_add(node));
    match epoch {
        Some(epoch) if epoch <= EPOCH_MAX => Ok(epoch),
        _ => Err(format!(
            "the epoch space is exhausted (no epoch of node {node} above {highest} is at most {EPOCH_MAX}); \
             see \"When the epoch space runs out\" in the README"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_are_ballots_above_everything_seen() {
        assert_eq!(next_epoch(0, 0), Ok(16));
        assert_eq!(next_epoch(16, 0), Ok(32));
        assert_eq!(next_epoch(16, 3), Ok(35));
        assert_eq!(next_epoch(35, 1), Ok(49));
        assert!(next_epoch(EPOCH_MAX, 0).is_err());
        assert_eq!(next_epoch(EPOCH_MAX - 16, 15), Ok(EPOCH_MAX));
        assert!(next_epoch(EPOCH_MAX - 15, 0).is_err());
        // Numbers a broken peer or file could hold never wrap to a small epoch.
        for highest in [u64::MAX, u64::MAX - 15, 1 << 60, (1 << 60) - 1] {
            for node in [0, 15] {
                let error = next_epoch(highest, node).unwrap_err();
                assert!(error.contains("exhausted"), "{highest}, {node}: {error}");
            }
        }
    }
}
