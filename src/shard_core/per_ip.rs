//! Tables by client IP address, shared by every shard core so that they hold
//! whichever cores the connections land on: the connections open from each
//! address (`--max-connections-per-ip`), and the failed `U` lines of each
//! address (the growing delay of a guesser). They are touched only when a
//! connection is accepted or closed or a `U` fails, never per request.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Independent parts of the table, so that cores accepting at the same time
/// rarely wait for each other.
const PARTS: usize = 16;

/// Open connections per client IP address. An address is in the table only
/// while it has a connection open, so the table holds at most as many
/// entries as there are connections (`--max-connections`).
pub struct PerIpConnections {
    parts: Box<[Mutex<HashMap<IpAddr, u32>>]>,
    /// Most connections from one address; 0 = no limit (nothing is counted).
    max: u32,
}

impl PerIpConnections {
    pub fn new(max: u32) -> PerIpConnections {
        PerIpConnections { parts: (0..PARTS).map(|_| Mutex::new(HashMap::new())).collect(), max }
    }

    /// Whether connections are counted at all.
    pub fn limited(&self) -> bool {
        self.max > 0
    }

    /// Counts a new connection from `ip` and returns true, or returns false
    /// and counts nothing if `ip` has as many open as the limit allows.
    pub fn admit(&self, ip: IpAddr) -> bool {
        let mut part = self.part(ip);
        let count = part.entry(ip).or_insert(0);
        if *count >= self.max {
            return false;
        }
        *count += 1;
        true
    }

    /// A connection admitted from `ip` closed.
    pub fn release(&self, ip: IpAddr) {
        let mut part = self.part(ip);
        if let Some(count) = part.get_mut(&ip) {
            *count -= 1;
            if *count == 0 {
                part.remove(&ip);
            }
        } else {
            debug_assert!(false, "a connection from {ip} closed that was never admitted");
        }
    }

    fn part(&self, ip: IpAddr) -> std::sync::MutexGuard<'_, HashMap<IpAddr, u32>> {
        // The low bits of an address differ most between the hosts of one
        // network; which part an address lands in only spreads contention.
        let low = match ip {
            IpAddr::V4(v4) => u32::from(v4) as usize,
            IpAddr::V6(v6) => u128::from(v6) as usize,
        };
        // A panic while a part was locked leaves a consistent count behind
        // (each change is one step), so a poisoned lock is used all the same.
        self.parts[low % PARTS].lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// How long a failed `U` from an address with few recent failures waits
/// before its answer (and the close that follows), so that guessing secrets
/// costs a connection and this much time a try. The dispatcher does not
/// wait: the answer is scheduled.
pub const AUTH_DELAY_MS: u64 = 200;
/// Failures of one address within [`AUTH_FORGET_MS`] of each other that get
/// only [`AUTH_DELAY_MS`]: a client with a stale secret and a few retries.
pub const AUTH_FAILURES_FREE: u32 = 3;
/// The longest delay: the delay doubles with each failure beyond
/// [`AUTH_FAILURES_FREE`] up to this.
pub const AUTH_DELAY_MAX_MS: u64 = 10_000;
/// An address with no failure for this long starts again from nothing.
pub const AUTH_FORGET_MS: u64 = 60_000;
/// Addresses the table follows at most (in [`PARTS`] parts): beyond it the
/// address whose last failure is oldest is forgotten first.
pub const AUTH_ADDRESSES_MAX: usize = 16_384;

/// One address's recent failed `U` lines.
#[derive(Clone, Copy, Debug)]
struct Failures {
    count: u32,
    last_ms: u64,
    /// New connections from the address are refused at the door until then.
    slowed_until_ms: u64,
}

/// Failed `U` lines per client address (IPv6: per /64, the block one host
/// usually holds). Each failure beyond the first few of an address doubles
/// the delay of its `auth-failed` answer, up to [`AUTH_DELAY_MAX_MS`], and
/// while that delay runs new connections from the address are refused as
/// they are accepted, before any TLS or parsing: a guesser gets fewer and
/// fewer tries, each costing the server no more than a `P`. Other addresses
/// are never affected. The table is bounded; times are the node's
/// milliseconds ([`crate::node::shared::Shared::now_ms`]).
pub struct AuthFailures {
    parts: Box<[Mutex<HashMap<IpAddr, Failures>>]>,
    /// Connections refused at the door because their address was slowed.
    pub refused: AtomicU64,
}

/// What `/metrics` shows of the table: no address is named, so the series
/// stay few whatever the number of guessers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AuthFailureCounts {
    /// Addresses with a failure within [`AUTH_FORGET_MS`].
    pub addresses: u64,
    /// Addresses whose new connections are refused now.
    pub slowed: u64,
}

impl Default for AuthFailures {
    fn default() -> AuthFailures {
        AuthFailures::new()
    }
}

impl AuthFailures {
    pub fn new() -> AuthFailures {
        AuthFailures { parts: (0..PARTS).map(|_| Mutex::new(HashMap::new())).collect(), refused: AtomicU64::new(0) }
    }

    /// A `U` from `ip` failed at `now_ms`: returns how long its answer waits.
    pub fn failed(&self, ip: IpAddr, now_ms: u64) -> u64 {
        let ip = block(ip);
        let mut part = lock(&self.parts[part_of(ip)]);
        if !part.contains_key(&ip) && part.len() >= AUTH_ADDRESSES_MAX / PARTS {
            part.retain(|_, failures| now_ms < failures.last_ms + AUTH_FORGET_MS);
            if part.len() >= AUTH_ADDRESSES_MAX / PARTS
                && let Some(oldest) = part.iter().min_by_key(|(_, failures)| failures.last_ms).map(|(ip, _)| *ip)
            {
                part.remove(&oldest);
            }
        }
        let failures = part.entry(ip).or_insert(Failures { count: 0, last_ms: now_ms, slowed_until_ms: 0 });
        if now_ms >= failures.last_ms + AUTH_FORGET_MS {
            failures.count = 0;
        }
        failures.count = failures.count.saturating_add(1);
        failures.last_ms = now_ms;
        let delay = auth_delay_ms(failures.count);
        if failures.count > AUTH_FAILURES_FREE {
            failures.slowed_until_ms = now_ms + delay;
            if failures.count == AUTH_FAILURES_FREE + 1 {
                tracing::warn!(
                    %ip,
                    failures = failures.count,
                    "repeated wrong secrets (U) from {ip}: its answers are delayed more and more, up to {} ms, and \
                     its new connections refused meanwhile",
                    AUTH_DELAY_MAX_MS
                );
            }
        }
        delay
    }

    /// Whether new connections from `ip` are refused now.
    pub fn slowed(&self, ip: IpAddr, now_ms: u64) -> bool {
        let ip = block(ip);
        lock(&self.parts[part_of(ip)]).get(&ip).is_some_and(|failures| now_ms < failures.slowed_until_ms)
    }

    /// A new connection from a slowed address was refused.
    pub fn count_refusal(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    pub fn counts(&self, now_ms: u64) -> AuthFailureCounts {
        let mut counts = AuthFailureCounts::default();
        for part in &self.parts {
            for failures in lock(part).values() {
                counts.addresses += u64::from(now_ms < failures.last_ms + AUTH_FORGET_MS);
                counts.slowed += u64::from(now_ms < failures.slowed_until_ms);
            }
        }
        counts
    }
}

/// The delay of the `count`th failure in a row of one address.
pub fn auth_delay_ms(count: u32) -> u64 {
    if count <= AUTH_FAILURES_FREE {
        return AUTH_DELAY_MS;
    }
    let doublings = (count - AUTH_FAILURES_FREE).min(16);
    (AUTH_DELAY_MS << doublings).min(AUTH_DELAY_MAX_MS)
}

/// The address an IPv6 client is counted as: its /64.
fn block(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
    }
}

fn part_of(ip: IpAddr) -> usize {
    // The low bits of an address differ most between the hosts of one
    // network; which part an address lands in only spreads contention.
    let low = match ip {
        IpAddr::V4(v4) => u32::from(v4) as usize,
        IpAddr::V6(v6) => (u128::from(v6) >> 64) as usize,
    };
    low % PARTS
}

fn lock<T>(part: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Each change is one step, so a poisoned lock's table is consistent.
    part.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_address_is_limited_on_its_own_and_entries_leave_at_zero() {
        let table = PerIpConnections::new(2);
        let one: IpAddr = "10.0.0.1".parse().unwrap();
        let two: IpAddr = "10.0.0.2".parse().unwrap();
        assert!(table.admit(one) && table.admit(one));
        assert!(!table.admit(one), "a third connection from one address is refused");
        assert!(table.admit(two), "another address has its own count");
        table.release(one);
        assert!(table.admit(one), "a closed connection frees a place");
        table.release(one);
        table.release(one);
        table.release(two);
        assert!(table.parts.iter().all(|part| part.lock().unwrap().is_empty()), "no entry is kept at zero");
    }

    #[test]
    fn failures_slow_an_address_more_and_more_up_to_the_cap_and_no_other() {
        let table = AuthFailures::new();
        let guesser: IpAddr = "10.0.0.1".parse().unwrap();
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        let mut now = 1_000;
        for _ in 0..AUTH_FAILURES_FREE {
            assert_eq!(table.failed(guesser, now), AUTH_DELAY_MS);
            assert!(!table.slowed(guesser, now), "a few failures slow nobody");
        }
        let mut last = AUTH_DELAY_MS;
        for _ in 0..10 {
            now += 1;
            let delay = table.failed(guesser, now);
            assert!(delay >= last && delay <= AUTH_DELAY_MAX_MS, "{delay} after {last}");
            assert!(table.slowed(guesser, now) && table.slowed(guesser, now + delay - 1));
            assert!(!table.slowed(guesser, now + delay));
            last = delay;
        }
        assert_eq!(last, AUTH_DELAY_MAX_MS);
        assert!(!table.slowed(other, now), "another address is not slowed");
        assert_eq!(table.counts(now), AuthFailureCounts { addresses: 1, slowed: 1 });
        // A quiet address starts again from nothing.
        now += AUTH_FORGET_MS;
        assert_eq!(table.failed(guesser, now), AUTH_DELAY_MS);
        // IPv6 addresses of one /64 share their count.
        let (a, b): (IpAddr, IpAddr) = ("2001:db8::1".parse().unwrap(), "2001:db8::2".parse().unwrap());
        for _ in 0..=AUTH_FAILURES_FREE {
            table.failed(a, now);
        }
        assert!(table.slowed(b, now));
    }

    #[test]
    fn the_table_is_bounded_and_forgets_the_oldest_first() {
        let table = AuthFailures::new();
        for index in 0..(AUTH_ADDRESSES_MAX as u32 * 2) {
            table.failed(IpAddr::V4(index.into()), u64::from(index));
        }
        let held: usize = table.parts.iter().map(|part| part.lock().unwrap().len()).sum();
        assert!(held <= AUTH_ADDRESSES_MAX, "{held}");
        let last = AUTH_ADDRESSES_MAX as u32 * 2 - 1;
        assert!(lock(&table.parts[part_of(IpAddr::V4(last.into()))]).contains_key(&IpAddr::V4(last.into())));
    }
}
