//! How often failed peer connections are logged: at most once per interval
//! for each address, with a count of the ones left out, so that a stranger
//! who connects in a loop (or a node with the wrong secret that retries
//! every few milliseconds) cannot fill the log. Pure: the caller gives the
//! time.

use std::collections::HashMap;
use std::net::IpAddr;

/// A failure from one address is logged at most this often.
pub const FAILURE_LOG_INTERVAL_MS: u64 = 60_000;

/// Addresses whose last log time is remembered; past it, the ones whose
/// interval has run out are forgotten, and if none has, the failures of new
/// addresses share one entry (logged as such), so that many addresses cost
/// no more memory than this.
pub const FAILURE_LOG_ADDRESSES_MAX: usize = 1024;

/// One address's (or one peer's) log times.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogLimit {
    logged_ms: Option<u64>,
    suppressed: u64,
}

impl LogLimit {
    /// A failure at `now_ms`: `Some(left out since the last line)` if it is
    /// to be logged now, `None` if it is left out.
    pub fn failure(&mut self, now_ms: u64) -> Option<u64> {
        if self.logged_ms.is_some_and(|logged_ms| now_ms < logged_ms + FAILURE_LOG_INTERVAL_MS) {
            self.suppressed += 1;
            return None;
        }
        self.logged_ms = Some(now_ms);
        Some(std::mem::take(&mut self.suppressed))
    }

    fn expired(&self, now_ms: u64) -> bool {
        self.logged_ms.is_none_or(|logged_ms| now_ms >= logged_ms + FAILURE_LOG_INTERVAL_MS) && self.suppressed == 0
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
}

/// The log times of the addresses whose connections failed.
#[derive(Debug, Default)]
pub struct FailureLog {
    by_address: HashMap<IpAddr, LogLimit>,
    /// The entry of the addresses that did not fit.
    others: LogLimit,
}

impl FailureLog {
    /// A failure of a connection from `address` at `now_ms`: what to log,
    /// or `None` if it is left out.
    pub fn failure(&mut self, address: Option<IpAddr>, now_ms: u64) -> Option<Logged> {
        let Some(address) = address else {
            return self.others.failure(now_ms).map(|suppressed| Logged { suppressed, shared: true });
        };
        if !self.by_address.contains_key(&address) && self.by_address.len() >= FAILURE_LOG_ADDRESSES_MAX {
            self.by_address.retain(|_, limit| !limit.expired(now_ms));
            if self.by_address.len() >= FAILURE_LOG_ADDRESSES_MAX {
                return self.others.failure(now_ms).map(|suppressed| Logged { suppressed, shared: true });
            }
        }
        let limit = self.by_address.entry(address).or_default();
        limit.failure(now_ms).map(|suppressed| Logged { suppressed, shared: false })
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

    fn ip(last: u16) -> Option<IpAddr> {
        Some(IpAddr::from([10, 0, (last >> 8) as u8, last as u8]))
    }

    #[test]
    fn one_line_per_address_and_interval_with_the_count_left_out() {
        let mut log = FailureLog::default();
        assert_eq!(log.failure(ip(1), 0), Some(Logged { suppressed: 0, shared: false }));
        for at_ms in 1..=5 {
            assert_eq!(log.failure(ip(1), at_ms), None);
        }
        // Another address is logged at once.
        assert_eq!(log.failure(ip(2), 10), Some(Logged { suppressed: 0, shared: false }));
        assert_eq!(log.failure(ip(1), FAILURE_LOG_INTERVAL_MS - 1), None);
        assert_eq!(log.failure(ip(1), FAILURE_LOG_INTERVAL_MS), Some(Logged { suppressed: 6, shared: false }));
        assert_eq!(log.failure(ip(1), FAILURE_LOG_INTERVAL_MS + 1), None);
    }

    #[test]
    fn many_addresses_cost_a_bounded_table_and_share_one_entry() {
        let mut log = FailureLog::default();
        for index in 0..FAILURE_LOG_ADDRESSES_MAX as u16 {
            assert!(log.failure(ip(index), 0).is_some());
        }
        // One more within the interval: the shared entry, once.
        let newcomer = ip(FAILURE_LOG_ADDRESSES_MAX as u16);
        assert_eq!(log.failure(newcomer, 1), Some(Logged { suppressed: 0, shared: true }));
        assert_eq!(log.failure(ip(FAILURE_LOG_ADDRESSES_MAX as u16 + 1), 2), None);
        assert_eq!(log.len(), FAILURE_LOG_ADDRESSES_MAX);
        // Once the interval has passed, the quiet addresses are forgotten
        // and the newcomer has an entry of its own.
        assert_eq!(log.failure(newcomer, FAILURE_LOG_INTERVAL_MS), Some(Logged { suppressed: 0, shared: false }));
        assert_eq!(log.len(), 1);
    }

    #[test]
    fn a_connection_without_an_address_uses_the_shared_entry() {
        let mut log = FailureLog::default();
        assert_eq!(log.failure(None, 0), Some(Logged { suppressed: 0, shared: true }));
        assert_eq!(log.failure(None, 1), None);
    }
}
