//! How many requests one connection may have parsed in a turn of its core.
//!
//! A turn parses each connection's share, runs it, and only then sends
//! every reply, so a share that takes long makes every other client's reply
//! of that turn wait. The share is counted in requests but meant in time:
//! the pacer keeps an average of what a request cost in the core's recent
//! turns (the shell reports each turn's length; nothing here reads a clock)
//! and gives each connection as many requests as fit in
//! [`CONNECTION_TURN_NS`], from [`SHARE_MIN`] up to `--requests-per-turn`.
//!
//! Pipelined locks on keys that stay in the processor's caches cost under
//! two hundred nanoseconds each, turn included, and keep the whole share. A client
//! that adds new keys to a table of millions as fast as it can costs
//! several times that (each key misses the caches, the memory behind it is
//! new), and gets a smaller share, so that a bystander's request waits
//! for about the same time as before the table grew.

/// Time one connection's share of a turn is meant to take.
pub(crate) const CONNECTION_TURN_NS: u64 = 20_000;

/// The smallest share, whatever requests cost: enough to keep a
/// pipelining client's requests flowing.
pub(crate) const SHARE_MIN: u32 = 16;

/// Turns that parsed fewer requests than this say little about what a
/// request costs (the turn's own work dominates), and are not counted.
const MEASURED_MIN: u32 = SHARE_MIN;

/// The newest turn weighs 1/2^`NEWEST_SHIFT` in the average.
const NEWEST_SHIFT: u32 = 3;

/// A turn's cost per request counts for at most this much: twice what
/// gives the smallest share. A turn the host paused (another process ran,
/// a page was faulted in from far away) moves the average a little, not
/// to thousands of times what requests cost.
const SAMPLE_MAX_NS: u64 = 2 * CONNECTION_TURN_NS / SHARE_MIN as u64;

/// The average cost of a request and the share it gives.
#[derive(Debug)]
pub(crate) struct Pacer {
    /// Nanoseconds a request cost in recent turns (0: none measured yet).
    cost_ns: u64,
    /// `--requests-per-turn`: the share when requests are cheap.
    share_max: u32,
    share: u32,
}

impl Pacer {
    pub(crate) fn new(share_max: u32) -> Pacer {
        let share_max = share_max.max(1);
        Pacer { cost_ns: 0, share_max, share: share_max }
    }

    /// Whether a turn that parsed `parsed` requests is counted, so whether
    /// its length is worth reading a clock for.
    pub(crate) fn counts(parsed: u32) -> bool {
        parsed >= MEASURED_MIN
    }

    /// A turn that parsed `parsed` requests took `elapsed_ns` in all.
    pub(crate) fn turn_ended(&mut self, elapsed_ns: u64, parsed: u32) {
        if !Pacer::counts(parsed) {
            return;
        }
        let sample = (elapsed_ns / u64::from(parsed)).min(SAMPLE_MAX_NS);
        self.cost_ns = if self.cost_ns == 0 {
            sample
        } else {
            self.cost_ns - (self.cost_ns >> NEWEST_SHIFT) + (sample >> NEWEST_SHIFT)
        };
        let fits = CONNECTION_TURN_NS / self.cost_ns.max(1);
        self.share = fits.clamp(u64::from(SHARE_MIN.min(self.share_max)), u64::from(self.share_max)) as u32;
    }

    /// Requests one connection may have parsed in the next turn.
    pub(crate) fn share(&self) -> u32 {
        self.share
    }

    /// The average cost of a request, in nanoseconds (0 before any busy turn).
    pub(crate) fn cost_ns(&self) -> u64 {
        self.cost_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cheap_requests_keep_the_whole_share() {
        let mut pacer = Pacer::new(128);
        assert_eq!(pacer.share(), 128, "before any turn");
        for _ in 0..100 {
            pacer.turn_ended(128 * 100, 128);
        }
        assert_eq!(pacer.cost_ns(), 100);
        assert_eq!(pacer.share(), 128);
    }

    #[test]
    fn costly_requests_get_what_fits_in_the_connection_turn_then_the_share_grows_back() {
        let mut pacer = Pacer::new(128);
        for _ in 0..100 {
            pacer.turn_ended(40 * 500, 40);
        }
        assert_eq!(pacer.share() as u64, CONNECTION_TURN_NS / 500);
        // Requests get cheap again: the average follows within tens of turns.
        for _ in 0..60 {
            let share = pacer.share();
            pacer.turn_ended(u64::from(share) * 150, share);
        }
        assert_eq!(pacer.share(), 128);
    }

    #[test]
    fn the_share_never_falls_below_the_minimum_nor_rises_above_the_flag() {
        let mut pacer = Pacer::new(128);
        for _ in 0..100 {
            pacer.turn_ended(16 * 10_000_000, 16);
        }
        assert_eq!(pacer.share(), SHARE_MIN, "requests of 10 ms");
        let mut pacer = Pacer::new(4);
        pacer.turn_ended(16 * 10_000_000, 16);
        assert_eq!(pacer.share(), 4, "a flag below the minimum wins");
        pacer.turn_ended(0, 1000);
        assert_eq!(pacer.share(), 4);
    }

    #[test]
    fn a_turn_the_host_paused_moves_the_share_for_a_few_turns_only() {
        let mut pacer = Pacer::new(128);
        pacer.turn_ended(128 * 100, 128);
        // 16 requests in a turn stretched to 5 ms.
        pacer.turn_ended(5_000_000, 16);
        assert!(pacer.share() > 2 * SHARE_MIN, "share {}", pacer.share());
        let mut turns = 0;
        while pacer.share() < 128 {
            let share = pacer.share();
            pacer.turn_ended(u64::from(share) * 100, share);
            turns += 1;
        }
        assert!(turns <= 16, "{turns} turns");
    }

    #[test]
    fn turns_of_few_requests_do_not_move_the_average() {
        let mut pacer = Pacer::new(128);
        pacer.turn_ended(64 * 300, 64);
        // One request in a turn of its own carries the turn's fixed work.
        for _ in 0..100 {
            pacer.turn_ended(20_000, 1);
        }
        assert_eq!(pacer.cost_ns(), 300);
        assert_eq!(pacer.share() as u64, CONNECTION_TURN_NS / 300);
    }
}
