//! The open-loop schedule of `run --rate`: when each request is meant to be
//! sent, whether the load generator kept to it, and what it reports.
//!
//! A closed loop sends a connection's next request only when a reply frees
//! a slot, so a slow reply delays the requests behind it and is counted
//! once instead of once per delayed request (coordinated omission). Here
//! the requests follow a fixed timetable instead, and each latency runs
//! from the request's *intended* send time, so time a request spent waiting
//! to be sent (for a free slot of its connection, or for the generator
//! itself) counts in its latency, as a user's request would feel it.
//!
//! The timetable: the run's acquires are evenly spaced, `1 / cycles_per_s`
//! apart, and dealt round-robin to the connections, so that connection `c`
//! of `n` sends its `k`-th acquire at `start + (k * n + c) / cycles_per_s`.
//! Each acquire's release follows its grant at once, as a lock user does;
//! its intended time is the moment the grant was read.
//!
//! Nothing here reads a clock or touches a socket: the worker passes `now`.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Longest schedule lag a histogram holds, in nanoseconds (a minute).
const LAG_NS_MAX: u64 = 60_000_000_000;

/// Share of the sends (or of the schedule) that may miss before a run is
/// said to have fallen behind: 1 %.
const BEHIND_FRACTION: f64 = 0.01;

/// One connection's share of the run's timetable.
#[derive(Clone, Debug)]
pub struct Schedule {
    /// Intended time of the run's first acquire, nanoseconds on the worker's clock.
    start_ns: u64,
    /// Nanoseconds between two acquires of the whole run.
    interval_ns: f64,
    connections: u64,
    connection: u64,
    /// The connection's next slot not yet sent.
    next_slot: u64,
    /// Slots intended up to this time found every lane of the connection busy.
    held_through_ns: Option<u64>,
}

impl Schedule {
    /// The slots of `connection` (of `connections`) in a timetable of
    /// `cycles_per_s` acquires per second over all connections, from `start_ns` on.
    pub fn new(start_ns: u64, cycles_per_s: f64, connections: u64, connection: u64) -> Schedule {
        assert!(cycles_per_s > 0.0 && cycles_per_s.is_finite(), "a schedule needs a positive rate");
        assert!(connection < connections, "connection {connection} of {connections}");
        Schedule {
            start_ns,
            interval_ns: 1e9 / cycles_per_s,
            connections,
            connection,
            next_slot: 0,
            held_through_ns: None,
        }
    }

    /// Intended send time of the connection's `slot`-th acquire.
    pub fn intended_ns(&self, slot: u64) -> u64 {
        let global = slot as f64 * self.connections as f64 + self.connection as f64;
        self.start_ns + (global * self.interval_ns) as u64
    }

    /// Intended send time of the next slot not yet sent.
    pub fn next_due_ns(&self) -> u64 {
        self.intended_ns(self.next_slot)
    }

    /// Slots due at `now_ns` and not yet sent.
    pub fn backlog(&self, now_ns: u64) -> u64 {
        if now_ns < self.next_due_ns() {
            return 0;
        }
        // The last slot intended at or before `now_ns`, by division, then
        // corrected for rounding either way.
        let elapsed = (now_ns - self.start_ns) as f64;
        let per_connection = self.interval_ns * self.connections as f64;
        let offset = self.connection as f64 * self.interval_ns;
        let mut last = ((elapsed - offset) / per_connection).floor().max(0.0) as u64;
        while self.intended_ns(last + 1) <= now_ns {
            last += 1;
        }
        while last > 0 && self.intended_ns(last) > now_ns {
            last -= 1;
        }
        (last + 1).saturating_sub(self.next_slot)
    }

    /// Notes that at `now_ns` the connection had slots due and no free lane:
    /// those slots wait for the server, not for the generator.
    pub fn hold(&mut self, now_ns: u64) {
        self.held_through_ns = Some(self.held_through_ns.map_or(now_ns, |held| held.max(now_ns)));
    }

    /// Takes the next slot if it is due at `now_ns`.
    pub fn take_due(&mut self, now_ns: u64) -> Option<Slot> {
        let intended_ns = self.next_due_ns();
        if intended_ns > now_ns {
            return None;
        }
        self.next_slot += 1;
        Some(Slot { intended_ns, held: self.held_through_ns.is_some_and(|held| intended_ns <= held) })
    }
}

/// A slot of the timetable taken to be sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    pub intended_ns: u64,
    /// It came due while every lane of its connection was busy: it waited
    /// for a reply, which its latency counts, and not for the generator.
    pub held: bool,
}

/// How one worker kept to its timetable over the measured time.
#[derive(Clone, Debug)]
pub struct ScheduleStats {
    /// Acquires sent from the timetable.
    pub sent: u64,
    /// Of those, the ones that had waited for a free lane.
    pub held: u64,
    /// Of the others, the ones sent more than the tolerance after their time.
    pub late: u64,
    /// Send time minus intended time of the sends that had a free lane: the
    /// generator's own delay, which inflates every latency it measures.
    pub lag_ns: Histogram<u64>,
    /// Slots due and not sent when the measured time ended.
    pub unsent_at_end: u64,
}

impl ScheduleStats {
    pub fn new() -> ScheduleStats {
        ScheduleStats {
            sent: 0,
            held: 0,
            late: 0,
            lag_ns: Histogram::new_with_bounds(1, LAG_NS_MAX, 3).expect("valid histogram bounds"),
            unsent_at_end: 0,
        }
    }

    pub fn reset(&mut self) {
        self.sent = 0;
        self.held = 0;
        self.late = 0;
        self.lag_ns.reset();
        self.unsent_at_end = 0;
    }

    /// Counts one slot sent at `now_ns`.
    pub fn record(&mut self, slot: Slot, now_ns: u64, tolerance_ns: u64) {
        self.sent += 1;
        if slot.held {
            self.held += 1;
            return;
        }
        let lag_ns = now_ns.saturating_sub(slot.intended_ns);
        self.lag_ns.saturating_record(lag_ns.max(1));
        if lag_ns > tolerance_ns {
            self.late += 1;
        }
    }

    /// Adds another worker's figures to these.
    pub fn add(&mut self, other: &ScheduleStats) {
        self.sent += other.sent;
        self.held += other.held;
        self.late += other.late;
        self.lag_ns.add(&other.lag_ns).expect("histograms of equal bounds");
        self.unsent_at_end += other.unsent_at_end;
    }
}

impl Default for ScheduleStats {
    fn default() -> ScheduleStats {
        ScheduleStats::new()
    }
}

/// Whether a run kept to its timetable, and if not, which side did not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Keeping {
    /// Requests went out on time: the latencies are the server's and the
    /// network's (plus the generator's lag, reported beside them).
    OnSchedule,
    /// More than 1 % of the sends that had a free lane went out later than
    /// the tolerance: the generator itself could not keep up (its CPU, or
    /// its timer), so the offered load was lower and burstier than asked.
    GeneratorBehind,
    /// More than 1 % of the requests waited for a free lane, or were still
    /// unsent at the end: the server answers slower than the offered rate
    /// (saturation). Their waits are in the latencies.
    ServerBehind,
}

impl Keeping {
    /// Judges a run from its counts: `intended` is the number of acquires the
    /// timetable placed in the measured time.
    pub fn of(stats: &ScheduleStats, intended: f64) -> Keeping {
        let free = stats.sent.saturating_sub(stats.held);
        if stats.late as f64 > BEHIND_FRACTION * free.max(1) as f64 {
            return Keeping::GeneratorBehind;
        }
        let waited = (stats.held + stats.unsent_at_end) as f64;
        if waited > BEHIND_FRACTION * intended.max(1.0) {
            return Keeping::ServerBehind;
        }
        Keeping::OnSchedule
    }

    pub fn text(self) -> &'static str {
        match self {
            Keeping::OnSchedule => "on schedule",
            Keeping::GeneratorBehind => "GENERATOR BEHIND its schedule",
            Keeping::ServerBehind => "server behind the offered rate",
        }
    }
}

/// Parses a rate such as `200000`, `2.5e5`, `250k` or `1.5M` (per second).
pub fn parse_rate(text: &str) -> Result<f64, String> {
    let (digits, unit) = match text.strip_suffix(['k', 'K']) {
        Some(digits) => (digits, 1e3),
        None => match text.strip_suffix('M') {
            Some(digits) => (digits, 1e6),
            None => (text, 1.0),
        },
    };
    match digits.parse::<f64>() {
        Ok(value) if value.is_finite() && value > 0.0 => Ok(value * unit),
        _ => Err(format!("expected a positive rate such as 200000, 250k or 1.5M, not {text:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_evenly_spaced_and_dealt_round_robin() {
        // 1000 acquires per second over 4 connections: one every 1 ms,
        // connection 1 gets the 2nd, 6th, 10th...
        let schedule = Schedule::new(5_000, 1_000.0, 4, 1);
        assert_eq!(schedule.intended_ns(0), 5_000 + 1_000_000);
        assert_eq!(schedule.intended_ns(1), 5_000 + 5_000_000);
        assert_eq!(schedule.intended_ns(2), 5_000 + 9_000_000);
        // Over every connection, the slots of the first 10 ms are the ten
        // multiples of 1 ms, each once.
        let mut all: Vec<u64> = (0..4)
            .flat_map(|connection| {
                let schedule = Schedule::new(0, 1_000.0, 4, connection);
                (0..3).map(move |slot| schedule.intended_ns(slot)).filter(|&t| t < 10_000_000)
            })
            .collect();
        all.sort();
        assert_eq!(all, (0..10).map(|i| i * 1_000_000).collect::<Vec<_>>());
    }

    #[test]
    fn a_long_schedule_does_not_drift() {
        // A rate whose interval is not a whole number of nanoseconds.
        let schedule = Schedule::new(0, 3_000_000.0, 7, 3);
        let slot = 3_000_000 * 60 / 7;
        let expected = (slot as f64 * 7.0 + 3.0) * (1e9 / 3_000_000.0);
        assert!((schedule.intended_ns(slot) as f64 - expected).abs() <= 1.0);
    }

    #[test]
    fn take_due_gives_each_slot_once_and_only_when_due() {
        let mut schedule = Schedule::new(0, 1_000.0, 2, 0);
        assert_eq!(schedule.take_due(0), Some(Slot { intended_ns: 0, held: false }));
        assert_eq!(schedule.take_due(1_999_999), None);
        assert_eq!(schedule.next_due_ns(), 2_000_000);
        // Late: every slot due by 6.5 ms comes out, in order, then nothing.
        let taken: Vec<u64> = std::iter::from_fn(|| schedule.take_due(6_500_000)).map(|s| s.intended_ns).collect();
        assert_eq!(taken, vec![2_000_000, 4_000_000, 6_000_000]);
        assert_eq!(schedule.take_due(6_500_000), None);
    }

    #[test]
    fn slots_due_while_the_connection_was_full_are_held() {
        let mut schedule = Schedule::new(0, 1_000.0, 1, 0);
        assert!(!schedule.take_due(0).unwrap().held);
        // At 2.5 ms slots 1 and 2 are due and no lane is free.
        schedule.hold(2_500_000);
        assert_eq!(schedule.take_due(3_100_000), Some(Slot { intended_ns: 1_000_000, held: true }));
        assert_eq!(schedule.take_due(3_100_000), Some(Slot { intended_ns: 2_000_000, held: true }));
        // Slot 3 came due after the connection was last seen full.
        assert_eq!(schedule.take_due(3_100_000), Some(Slot { intended_ns: 3_000_000, held: false }));
    }

    #[test]
    fn backlog_counts_the_due_slots_not_sent() {
        let mut schedule = Schedule::new(1_000, 1_000.0, 3, 2);
        // Connection 2's slots: 1_000 + 2 ms, + 5 ms, + 8 ms, ...
        assert_eq!(schedule.backlog(0), 0);
        assert_eq!(schedule.backlog(2_000_999), 0);
        assert_eq!(schedule.backlog(2_001_000), 1);
        assert_eq!(schedule.backlog(8_001_000), 3);
        schedule.take_due(8_001_000);
        assert_eq!(schedule.backlog(8_001_000), 2);
        for now in (0..40_000_000).step_by(123_457) {
            let fresh = Schedule::new(1_000, 1_000.0, 3, 2);
            let by_hand = (0..20).filter(|&slot| fresh.intended_ns(slot) <= now).count() as u64;
            assert_eq!(fresh.backlog(now), by_hand, "at {now}");
        }
    }

    #[test]
    fn the_lag_of_free_sends_is_recorded_and_late_ones_counted() {
        let mut stats = ScheduleStats::new();
        stats.record(Slot { intended_ns: 1_000, held: false }, 1_050, 100);
        stats.record(Slot { intended_ns: 1_000, held: false }, 2_000, 100);
        stats.record(Slot { intended_ns: 1_000, held: true }, 90_000, 100);
        assert_eq!((stats.sent, stats.held, stats.late), (3, 1, 1));
        // The held send is not the generator's lag.
        assert_eq!(stats.lag_ns.len(), 2);
        assert_eq!(stats.lag_ns.max(), stats.lag_ns.highest_equivalent(1_000));
    }

    #[test]
    fn merged_stats_give_the_percentiles_of_all_sends() {
        let (mut first, mut second, mut together) = (ScheduleStats::new(), ScheduleStats::new(), ScheduleStats::new());
        for lag in 1..=1_000u64 {
            let slot = Slot { intended_ns: 0, held: false };
            let half = if lag % 2 == 0 { &mut first } else { &mut second };
            half.record(slot, lag * 1_000, 500_000);
            together.record(slot, lag * 1_000, 500_000);
        }
        second.unsent_at_end = 7;
        first.add(&second);
        assert_eq!((first.sent, first.late, first.unsent_at_end), (1_000, 500, 7));
        for quantile in [0.5, 0.9, 0.99, 0.999, 1.0] {
            assert_eq!(first.lag_ns.value_at_quantile(quantile), together.lag_ns.value_at_quantile(quantile));
        }
        assert_eq!(first.lag_ns.value_at_quantile(0.99), first.lag_ns.highest_equivalent(990_000));
    }

    #[test]
    fn keeping_names_the_side_that_fell_behind() {
        let mut stats = ScheduleStats::new();
        stats.sent = 10_000;
        assert_eq!(Keeping::of(&stats, 10_000.0), Keeping::OnSchedule);
        stats.late = 100;
        assert_eq!(Keeping::of(&stats, 10_000.0), Keeping::OnSchedule);
        stats.late = 101;
        assert_eq!(Keeping::of(&stats, 10_000.0), Keeping::GeneratorBehind);
        stats.late = 0;
        stats.held = 101;
        assert_eq!(Keeping::of(&stats, 10_000.0), Keeping::ServerBehind);
        stats.held = 50;
        stats.unsent_at_end = 60;
        assert_eq!(Keeping::of(&stats, 10_000.0), Keeping::ServerBehind);
        // The generator's lateness is judged first: a late generator also
        // leaves requests unsent.
        stats.late = 5_000;
        assert_eq!(Keeping::of(&stats, 10_000.0), Keeping::GeneratorBehind);
        // Nothing sent at all is not "on schedule".
        assert_eq!(
            Keeping::of(&ScheduleStats { unsent_at_end: 50, ..ScheduleStats::new() }, 50.0),
            Keeping::ServerBehind
        );
    }

    #[test]
    fn rates_read_plain_scientific_and_suffixed() {
        assert_eq!(parse_rate("200000"), Ok(200_000.0));
        assert_eq!(parse_rate("2.5e5"), Ok(250_000.0));
        assert_eq!(parse_rate("250k"), Ok(250_000.0));
        assert_eq!(parse_rate("1.5M"), Ok(1_500_000.0));
        for bad in ["", "0", "-5", "fast", "1.5m", "inf", "NaN"] {
            assert!(parse_rate(bad).is_err(), "{bad:?}");
        }
    }
}
