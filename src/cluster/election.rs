//! Who promotes when no active is left (docs/protocol.md §5): the highest-priority live
//! node among those that hold a complete table; only if none does, the
//! highest-priority live node. This is how "highest priority" and "never
//! active with an empty table while a live peer has the state" fit together.

/// A live node that could promote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// Its index; lower is higher priority.
    pub index: usize,
    /// It holds a complete table.
    pub caught_up: bool,
}

/// The candidate that should promote, if there is any.
pub fn winner(candidates: impl IntoIterator<Item = Candidate>) -> Option<usize> {
    // Caught up first, then priority: the smallest key wins.
    candidates.into_iter().min_by_key(|candidate| (!candidate.caught_up, candidate.index)).map(|winner| winner.index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidates(list: &[(usize, bool)]) -> Vec<Candidate> {
        list.iter().map(|&(index, caught_up)| Candidate { index, caught_up }).collect()
    }

    #[test]
    fn the_highest_priority_caught_up_node_wins() {
        assert_eq!(winner(candidates(&[(0, false), (2, true), (1, true)])), Some(1));
        assert_eq!(winner(candidates(&[(3, true), (0, false)])), Some(3));
    }

    #[test]
    fn only_if_none_is_caught_up_the_highest_priority_node_wins() {
        assert_eq!(winner(candidates(&[(2, false), (1, false)])), Some(1));
        assert_eq!(winner(candidates(&[])), None);
    }
}
