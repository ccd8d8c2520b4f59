//! Connections open from each client IP address, shared by every shard core
//! so that `--max-connections-per-ip` holds whichever cores the connections
//! land on. It is touched only when a connection is accepted or closed,
//! never per request.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;

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
}
