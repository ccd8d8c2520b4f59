//! The reconnect schedule of a broken connection (docs/protocol.md §4): at
//! once, then after doubling delays from a first delay up to a cap, each
//! drawn at random in its upper half so that many clients cut at the same
//! moment do not come back at the same moment.
//!
//! [`reconnect_delay`] is a pure function of the attempt number and a random
//! draw; the connection's reader thread counts the attempts and draws.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// The pause before reconnect attempt `attempt` (0 for the first attempt
/// after a connection broke or a connect failed), given `draw` in `[0, 1)`.
///
/// Attempt 0 goes at once. Attempt `n` ≥ 1 waits a delay drawn in
/// `[d/2, d]`, where `d` is `first` doubled `n - 1` times and capped at
/// `max`: with the defaults (50 ms, 3 s), 25-50 ms, 50-100 ms, 100-200 ms,
/// … and 1.5-3 s from the eighth attempt on. No delay exceeds `max`.
pub(crate) fn reconnect_delay(attempt: u32, first: Duration, max: Duration, draw: f64) -> Duration {
    if attempt == 0 {
        return Duration::ZERO;
    }
    // 2^31 times any first delay is beyond any sensible cap; the shift
    // stays in range and the multiplication saturates.
    let doubled = first.saturating_mul(1u32 << (attempt - 1).min(31));
    let ceiling = doubled.min(max);
    let draw = if draw.is_finite() { draw.clamp(0.0, 1.0) } else { 0.0 };
    ceiling / 2 + (ceiling / 2).mul_f64(draw)
}

/// A small random source for the jitter: a xorshift generator seeded from
/// the standard library's per-process random hash keys, so that the client
/// needs no dependency and two connections do not draw the same sequence.
#[derive(Debug)]
pub(crate) struct Jitter {
    state: u64,
}

impl Jitter {
    pub(crate) fn new() -> Jitter {
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u64(0x5eed);
        // Xorshift must not start from zero.
        Jitter { state: hasher.finish() | 1 }
    }

    /// A number in `[0, 1)`.
    pub(crate) fn draw(&mut self) -> f64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        // The top 53 bits make an evenly spread double in [0, 1).
        (self.state >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIRST: Duration = Duration::from_millis(50);
    const MAX: Duration = Duration::from_secs(3);

    #[test]
    fn the_first_attempt_goes_at_once() {
        assert_eq!(reconnect_delay(0, FIRST, MAX, 0.0), Duration::ZERO);
        assert_eq!(reconnect_delay(0, FIRST, MAX, 0.99), Duration::ZERO);
    }

    #[test]
    fn delays_double_from_the_first_within_their_upper_half() {
        let mut ceiling = FIRST;
        for attempt in 1..=6 {
            assert_eq!(reconnect_delay(attempt, FIRST, MAX, 0.0), ceiling / 2, "attempt {attempt}, lowest draw");
            assert_eq!(reconnect_delay(attempt, FIRST, MAX, 1.0), ceiling, "attempt {attempt}, highest draw");
            let middle = reconnect_delay(attempt, FIRST, MAX, 0.5);
            assert!(middle > ceiling / 2 && middle < ceiling, "attempt {attempt}: {middle:?}");
            ceiling *= 2;
        }
        assert_eq!(reconnect_delay(2, FIRST, MAX, 1.0), Duration::from_millis(100));
    }

    #[test]
    fn delays_stop_growing_at_the_cap() {
        assert_eq!(reconnect_delay(7, FIRST, MAX, 1.0), MAX, "50 ms doubled six times is 3.2 s, capped");
        assert_eq!(reconnect_delay(7, FIRST, MAX, 0.0), MAX / 2);
        for attempt in [8, 20, 40, u32::MAX] {
            assert_eq!(reconnect_delay(attempt, FIRST, MAX, 1.0), MAX, "attempt {attempt}");
            assert!(reconnect_delay(attempt, FIRST, MAX, 0.3) >= MAX / 2, "attempt {attempt}");
        }
    }

    #[test]
    fn a_draw_out_of_range_stays_within_the_delay() {
        assert_eq!(reconnect_delay(1, FIRST, MAX, 7.0), FIRST);
        assert_eq!(reconnect_delay(1, FIRST, MAX, -1.0), FIRST / 2);
        assert_eq!(reconnect_delay(1, FIRST, MAX, f64::NAN), FIRST / 2);
    }

    #[test]
    fn draws_fall_in_the_unit_interval_and_differ() {
        let mut jitter = Jitter::new();
        let draws: Vec<f64> = (0..1000).map(|_| jitter.draw()).collect();
        assert!(draws.iter().all(|draw| (0.0..1.0).contains(draw)));
        assert!(draws.iter().any(|&draw| draw < 0.5) && draws.iter().any(|&draw| draw >= 0.5));
    }
}
