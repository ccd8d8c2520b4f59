//! Fencing tokens: an epoch in the high bits and a sequence in the low bits.
//!
//! The replication core hands each shard ranges of sequences under the current
//! epoch. A shard issues tokens only from ranges it holds, in increasing order,
//! and asks for the next range while it still has tokens left, so it never
//! stalls on a healthy node and never issues a token it was not given.

use std::collections::VecDeque;

/// Bits of a token that hold the sequence.
pub const SEQUENCE_BITS: u32 = 40;

/// The largest sequence number; a range never goes beyond it.
pub const SEQUENCE_MAX: u64 = (1 << SEQUENCE_BITS) - 1;

/// The largest epoch that fits in a token.
pub const EPOCH_MAX: u64 = (1 << (64 - SEQUENCE_BITS)) - 1;

/// The token of `sequence` in `epoch`.
#[inline]
pub const fn token(epoch: u64, sequence: u64) -> u64 {
    (epoch << SEQUENCE_BITS) | sequence
}

/// The epoch a token was issued in.
#[inline]
pub const fn token_epoch(token: u64) -> u64 {
    token >> SEQUENCE_BITS
}

/// The sequence part of a token.
#[inline]
pub const fn token_sequence(token: u64) -> u64 {
    token & SEQUENCE_MAX
}

/// Sequences `first..end` of one epoch, given to one shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenRange {
    /// The epoch of every token in the range (at least 1).
    pub epoch: u64,
    /// The first sequence of the range.
    pub first: u64,
    /// One past the last sequence of the range.
    pub end: u64,
}

impl TokenRange {
    /// Number of tokens in the range.
    pub fn len(&self) -> u64 {
        self.end.saturating_sub(self.first)
    }

    /// True if the range holds no token.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn is_valid(&self) -> bool {
        (1..=EPOCH_MAX).contains(&self.epoch) && self.first < self.end && self.end <= SEQUENCE_MAX + 1
    }
}

/// Ranges a shard may hold at once; one in use and the rest queued.
pub const TOKEN_RANGES_QUEUED_MAX: usize = 4;

/// The tokens a shard may still issue.
#[derive(Debug)]
pub struct TokenSupply {
    ranges: VecDeque<TokenRange>,
    remaining: u64,
    /// Ask for more when fewer than this many tokens are left.
    low_water: u64,
    requested: bool,
    last_issued: u64,
}

/// Why a token range was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenRangeError {
    /// Empty, epoch 0 or beyond the token layout.
    Malformed,
    /// Its first token is not above every token given before.
    NotIncreasing,
    /// The shard already holds as many ranges as it may.
    TooMany,
}

impl TokenSupply {
    /// A supply with no tokens that asks for more below `low_water` tokens left.
    pub fn new(low_water: u64) -> TokenSupply {
        TokenSupply {
            ranges: VecDeque::with_capacity(TOKEN_RANGES_QUEUED_MAX),
            remaining: 0,
            low_water,
            requested: false,
            last_issued: 0,
        }
    }

    /// Tokens left in every range held.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// The highest token issued or given up (ranges of an older epoch are
    /// dropped when a newer one arrives, so nothing below this is issued again).
    pub fn last_issued(&self) -> u64 {
        self.last_issued
    }

    /// Takes a new range. A range of a newer epoch drops what is left of older
    /// ones, so that no token of an older epoch follows one of a newer epoch.
    pub fn add(&mut self, range: TokenRange) -> Result<(), TokenRangeError> {
        if !range.is_valid() {
            return Err(TokenRangeError::Malformed);
        }
        let newest = self.ranges.back().map_or(self.last_issued, |back| token(back.epoch, back.end - 1));
        if token(range.epoch, range.first) <= newest {
            return Err(TokenRangeError::NotIncreasing);
        }
        if self.ranges.back().is_some_and(|back| back.epoch < range.epoch) {
            self.ranges.clear();
            self.remaining = 0;
        }
        if self.ranges.len() == TOKEN_RANGES_QUEUED_MAX {
            return Err(TokenRangeError::TooMany);
        }
        self.remaining += range.len();
        self.ranges.push_back(range);
        self.requested = false;
        Ok(())
    }

    /// The next token, or `None` if the shard holds no range.
    #[inline]
    pub fn next_token(&mut self) -> Option<u64> {
        let range = self.ranges.front_mut()?;
        let issued = token(range.epoch, range.first);
        range.first += 1;
        if range.first == range.end {
            self.ranges.pop_front();
        }
        self.remaining -= 1;
        assert!(issued > self.last_issued, "tokens must increase within a shard");
        self.last_issued = issued;
        Some(issued)
    }

    /// True once per shortage: the caller should ask for a range now.
    #[inline]
    pub fn should_request(&mut self) -> bool {
        if self.remaining < self.low_water && !self.requested && self.ranges.len() < TOKEN_RANGES_QUEUED_MAX {
            self.requested = true;
            return true;
        }
        false
    }

    /// Forgets that a range was asked for, so the next shortage asks again
    /// (after the replication core lost the request, for example in a failover).
    pub fn request_lost(&mut self) {
        self.requested = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_splits_epoch_and_sequence() {
        let t = token(3, 17);
        assert_eq!(token_epoch(t), 3);
        assert_eq!(token_sequence(t), 17);
        assert!(token(2, SEQUENCE_MAX) < token(3, 0));
        assert_eq!(token_epoch(token(EPOCH_MAX, SEQUENCE_MAX)), EPOCH_MAX);
    }

    #[test]
    fn issues_only_from_ranges_in_order() {
        let mut supply = TokenSupply::new(2);
        assert_eq!(supply.next_token(), None);
        assert!(supply.should_request());
        assert!(!supply.should_request(), "one request per shortage");
        supply.add(TokenRange { epoch: 1, first: 10, end: 12 }).unwrap();
        supply.add(TokenRange { epoch: 1, first: 20, end: 21 }).unwrap();
        assert_eq!(supply.remaining(), 3);
        assert_eq!(supply.next_token(), Some(token(1, 10)));
        assert_eq!(supply.next_token(), Some(token(1, 11)));
        assert!(supply.should_request());
        assert_eq!(supply.next_token(), Some(token(1, 20)));
        assert_eq!(supply.next_token(), None);
    }

    #[test]
    fn refuses_ranges_that_do_not_increase_or_are_malformed() {
        let mut supply = TokenSupply::new(1);
        supply.add(TokenRange { epoch: 2, first: 5, end: 9 }).unwrap();
        assert_eq!(supply.add(TokenRange { epoch: 2, first: 8, end: 20 }), Err(TokenRangeError::NotIncreasing));
        assert_eq!(supply.add(TokenRange { epoch: 1, first: 100, end: 200 }), Err(TokenRangeError::NotIncreasing));
        assert_eq!(supply.add(TokenRange { epoch: 0, first: 1, end: 2 }), Err(TokenRangeError::Malformed));
        assert_eq!(supply.add(TokenRange { epoch: 3, first: 2, end: 2 }), Err(TokenRangeError::Malformed));
        assert_eq!(
            supply.add(TokenRange { epoch: 3, first: 0, end: SEQUENCE_MAX + 2 }),
            Err(TokenRangeError::Malformed)
        );
    }

    #[test]
    fn a_newer_epoch_drops_older_ranges() {
        let mut supply = TokenSupply::new(1);
        supply.add(TokenRange { epoch: 1, first: 0, end: 100 }).unwrap();
        assert_eq!(supply.next_token(), Some(token(1, 0)));
        supply.add(TokenRange { epoch: 2, first: 0, end: 10 }).unwrap();
        assert_eq!(supply.remaining(), 10);
        assert_eq!(supply.next_token(), Some(token(2, 0)));
        assert_eq!(supply.add(TokenRange { epoch: 1, first: 500, end: 600 }), Err(TokenRangeError::NotIncreasing));
    }
}
