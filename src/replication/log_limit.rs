//! How often failed peer connections are logged: at most once per interval
//! for each address, with a count of the ones left out, so that a stranger
//! who connects in a loop (or a node with the wrong secret that retries
//! every few milliseconds) cannot fill the log. Pure: the caller gives the
//! time.
//!
//! What happens to a count left out: it is logged with the address's next
//! line, that is with the first failure from that address once its interval
//! has ended. An address whose interval has ended is forgotten when room is
//! needed for another (time alone decides, whatever it has left out); what
//! it had left out is then logged, as a count of failures from forgotten
//! addresses, on the line of the failure that needed the room. No count is
//! lost, but one is logged only when a failure comes after it.

use std::collections::HashMap;
use std::net::IpAddr;

/// A failure from one address is logged at most this often.
pub const FAILURE_LOG_INTERVAL_MS: u64 = 60_000;

/// The environment variable that sets another interval, in milliseconds,
/// read once at start. It is for tests (a test that counts log lines must
/// not depend on finishing within one interval), not for operators.
pub const FAILURE_LOG_INTERVAL_ENV: &str = "RINGLOCK_TEST_PEER_FAILURE_LOG_INTERVAL_MS";

/// Addresses whose last log time is remembered; past it, the ones whose
/// interval has run out are forgotten, and if none has, the failures of new
/// addresses share one entry (logged as such), so that many addresses cost
/// no more memory than this.
pub const FAILURE_LOG_ADDRESSES_MAX: usize = 1024;

/// The interval to use: [`FAILURE_LOG_INTERVAL_ENV`] if it holds a number
/// of milliseconds above zero, else [`FAILURE_LOG_INTERVAL_MS`]; `value` is
/// the variable's value, if it is set.
pub fn interval_ms(value: Option<&str>) -> Result<u64, String> {
    let Some(value) = value else { return Ok(FAILURE_LOG_INTERVAL_MS) };
    match value.trim().parse::<u64>() {
        Ok(interval_ms) if interval_ms > 0 => Ok(interval_ms),
        _ => Err(format!("{FAILURE_LOG_INTERVAL_ENV}={value:?} is not a number of milliseconds above zero")),
    }
}

/// The interval, said for the log: "60 s", or "250 ms".
pub fn describe_interval(interval_ms: u64) -> String {
    if interval_ms.is_multiple_of(1000) { format!("{} s", interval_ms / 1000) } else { format!("{interval_ms} ms") }
}

/// One address's (or one peer's) log times.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogLimit {
    logged_ms: Option<u64>,
    suppressed: u64,
}

impl LogLimit {
    /// A failure at `now_ms`, with one line per `interval_ms`:
    /// `Some(left out since the last line)` if it is to be logged now,
    /// `None` if it is left out.
    pub fn failure(&mut self, now_ms: u64, interval_ms: u64) -> Option<u64> {
        if !self.expired(now_ms, interval_ms) {
            self.suppressed += 1;
            return None;
        }
        self.logged_ms = Some(now_ms);
        Some(std::mem::take(&mut self.suppressed))
    }

    /// Its interval has ended: its next failure is logged.
    fn expired(&self, now_ms: u64, interval_ms: u64) -> bool {
        self.logged_ms.is_none_or(|logged_ms| now_ms >= logged_ms.saturating_add(interval_ms))
    }
}

/// What to log for one failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Logged {
    /// Failures left out since this address's last line.
    pub suppressed: u64,
    /// The address is counted with others in the shared entry (too many
    /// addresses failed within one interval to tell them apart).
    pub shared: bool,
    /// Failures left out from other addresses that were forgotten (their
    /// interval had ended) since the last line, to make room.
    pub forgotten: u64,
}

/// The log times of the addresses whose connections failed.
#[derive(Debug)]
pub struct FailureLog {
    interval_ms: u64,
    by_address: HashMap<IpAddr, LogLimit>,
    /// The entry of the addresses that did not fit.
    others: LogLimit,
    /// Left out by forgotten addresses, and not logged yet.
    forgotten: u64,
}

impl FailureLog {
    /// A log that writes one line per address and `interval_ms`.
    pub fn new(interval_ms: u64) -> FailureLog {
        FailureLog { interval_ms, by_address: HashMap::new(), others: LogLimit::default(), forgotten: 0 }
    }

    /// A failure of a connection from `address` at `now_ms`: what to log,
    /// or `None` if it is left out.
    pub fn failure(&mut self, address: Option<IpAddr>, now_ms: u64) -> Option<Logged> {
        let interval_ms = self.interval_ms;
        let Some(address) = address else {
            return self.shared_failure(now_ms);
        };
        if !self.by_address.contains_key(&address) && self.by_address.len() >= FAILURE_LOG_ADDRESSES_MAX {
            let mut forgotten = 0;
            self.by_address.retain(|_, limit| {
                let expired = limit.expired(now_ms, interval_ms);
                if expired {
                    forgotten += limit.suppressed;
                }
                !expired
            });
            self.forgotten += forgotten;
            if self.by_address.len() >= FAILURE_LOG_ADDRESSES_MAX {
                return self.shared_failure(now_ms);
            }
        }
        let limit = self.by_address.entry(address).or_default();
        let suppressed = limit.failure(now_ms, interval_ms)?;
        Some(Logged { suppressed, shared: false, forgotten: std::mem::take(&mut self.forgotten) })
    }

    fn shared_failure(&mut self, now_ms: u64) -> Option<Logged> {
        let suppressed = self.others.failure(now_ms, self.interval_ms)?;
        Some(Logged { suppressed, shared: true, forgotten: std::mem::take(&mut self.forgotten) })
    }

    /// Addresses remembered now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_address.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERVAL_MS: u64 = FAILURE_LOG_INTERVAL_MS;

    fn ip(last: u16) -> Option<IpAddr> {
        Some(IpAddr::from([10, 0, (last >> 8) as u8, last as u8]))
    }

    fn logged(suppressed: u64, shared: bool, forgotten: u64) -> Option<Logged> {
        Some(Logged { suppressed, shared, forgotten })
    }

    #[test]
    fn one_line_per_address_and_interval_with_the_count_left_out() {
        let mut log = FailureLog::new(INTERVAL_MS);
        assert_eq!(log.failure(ip(1), 0), logged(0, false, 0));
        for at_ms in 1..=5 {
            assert_eq!(log.failure(ip(1), at_ms), None);
        }
        // Another address is logged at once.
        assert_eq!(log.failure(ip(2), 10), logged(0, false, 0));
        assert_eq!(log.failure(ip(1), INTERVAL_MS - 1), None);
        // The first failure after the interval is logged with the count.
        assert_eq!(log.failure(ip(1), INTERVAL_MS), logged(6, false, 0));
        assert_eq!(log.failure(ip(1), INTERVAL_MS + 1), None);
    }

    #[test]
    fn the_interval_is_the_one_given() {
        let mut log = FailureLog::new(250);
        assert_eq!(log.failure(ip(1), 1_000), logged(0, false, 0));
        assert_eq!(log.failure(ip(1), 1_249), None);
        assert_eq!(log.failure(ip(1), 1_250), logged(1, false, 0));
    }

    #[test]
    fn many_addresses_cost_a_bounded_table_and_share_one_entry() {
        let mut log = FailureLog::new(INTERVAL_MS);
        for index in 0..FAILURE_LOG_ADDRESSES_MAX as u16 {
            assert!(log.failure(ip(index), 0).is_some());
        }
        // One more within the interval: the shared entry, once.
        let newcomer = ip(FAILURE_LOG_ADDRESSES_MAX as u16);
        assert_eq!(log.failure(newcomer, 1), logged(0, true, 0));
        assert_eq!(log.failure(ip(FAILURE_LOG_ADDRESSES_MAX as u16 + 1), 2), None);
        assert_eq!(log.len(), FAILURE_LOG_ADDRESSES_MAX);
        // Once the interval has passed, the quiet addresses are forgotten
        // and the newcomer has an entry of its own.
        assert_eq!(log.failure(newcomer, INTERVAL_MS), logged(0, false, 0));
        assert_eq!(log.len(), 1);
    }

    #[test]
    fn addresses_that_keep_failing_are_forgotten_by_time_alone_and_their_counts_logged() {
        // Every address of a full table fails again within its interval, so
        // each has failures left out. Once their intervals end, a new
        // address still finds room, and what they left out is logged on
        // its line.
        let mut log = FailureLog::new(INTERVAL_MS);
        for index in 0..FAILURE_LOG_ADDRESSES_MAX as u16 {
            assert!(log.failure(ip(index), 0).is_some());
            assert_eq!(log.failure(ip(index), 1), None);
            assert_eq!(log.failure(ip(index), 2), None);
        }
        let newcomer = ip(FAILURE_LOG_ADDRESSES_MAX as u16);
        assert_eq!(log.failure(newcomer, INTERVAL_MS - 1), logged(0, true, 0), "no interval has ended yet");
        let forgotten = 2 * FAILURE_LOG_ADDRESSES_MAX as u64;
        assert_eq!(log.failure(newcomer, INTERVAL_MS), logged(0, false, forgotten));
        assert_eq!(log.len(), 1);
        // Each count is logged once.
        assert_eq!(log.failure(ip(0), INTERVAL_MS), logged(0, false, 0));
    }

    #[test]
    fn a_connection_without_an_address_uses_the_shared_entry() {
        let mut log = FailureLog::new(INTERVAL_MS);
        assert_eq!(log.failure(None, 0), logged(0, true, 0));
        assert_eq!(log.failure(None, 1), None);
    }

    #[test]
    fn the_interval_comes_from_the_environment_only_if_it_is_a_number_above_zero() {
        assert_eq!(interval_ms(None), Ok(FAILURE_LOG_INTERVAL_MS));
        assert_eq!(interval_ms(Some("3600000")), Ok(3_600_000));
        for bad in ["", "0", "-1", "1m"] {
            let error = interval_ms(Some(bad)).unwrap_err();
            assert!(error.contains(FAILURE_LOG_INTERVAL_ENV), "{error}");
        }
        assert_eq!(describe_interval(60_000), "60 s");
        assert_eq!(describe_interval(250), "250 ms");
    }
}
