//! CPU time and resident memory of a process, read from /proc: the server
//! under test (`--server-pid`) and the load generator itself.

use std::io;
use std::time::Instant;

/// One reading of a process.
#[derive(Clone, Copy, Debug)]
pub struct ProcSample {
    /// User plus system CPU time of all its threads, in clock ticks.
    pub cpu_ticks: u64,
    pub rss_bytes: u64,
    pub at: Instant,
}

/// Reads `/proc/<pid>` (`pid` may be `self`).
pub fn sample(pid: &str) -> io::Result<ProcSample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let bad = || io::Error::new(io::ErrorKind::InvalidData, format!("cannot read /proc/{pid}/stat"));
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')').ok_or_else(bad)? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of stat(5) (utime, stime); the first field here is the 3rd.
    let utime: u64 = fields.get(11).and_then(|field| field.parse().ok()).ok_or_else(bad)?;
    let stime: u64 = fields.get(12).and_then(|field| field.parse().ok()).ok_or_else(bad)?;
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm"))?;
    let resident_pages: u64 = statm.split_whitespace().nth(1).and_then(|field| field.parse().ok()).ok_or_else(bad)?;
    Ok(ProcSample { cpu_ticks: utime + stime, rss_bytes: resident_pages * page_size(), at: Instant::now() })
}

/// CPU used between two samples, in percent of one core.
pub fn cpu_percent(before: &ProcSample, after: &ProcSample) -> f64 {
    let seconds = after.at.duration_since(before.at).as_secs_f64();
    if seconds <= 0.0 {
        return 0.0;
    }
    let ticks = after.cpu_ticks.saturating_sub(before.cpu_ticks) as f64;
    100.0 * ticks / clock_ticks_per_second() / seconds
}

/// Machine-wide signs that something besides this benchmark ran: CPU
/// pressure (time some runnable task waited for a CPU) and hypervisor steal.
#[derive(Clone, Copy, Debug)]
pub struct MachineSample {
    pub pressure_some_us: Option<u64>,
    pub steal_ticks: u64,
    pub at: Instant,
}

/// Reads /proc/pressure/cpu and /proc/stat.
pub fn machine_sample() -> MachineSample {
    let pressure_some_us = std::fs::read_to_string("/proc/pressure/cpu").ok().and_then(|text| {
        let line = text.lines().find(|line| line.starts_with("some"))?;
        line.split_whitespace().find_map(|field| field.strip_prefix("total=")?.parse().ok())
    });
    // The `cpu` line: user nice system idle iowait irq softirq steal ...
    let steal_ticks = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|text| text.lines().next()?.split_whitespace().nth(8)?.parse().ok())
        .unwrap_or(0);
    MachineSample { pressure_some_us, steal_ticks, at: Instant::now() }
}

/// Percent of the time between two samples that some task waited for a
/// CPU, and percent of one CPU stolen by the hypervisor.
pub fn machine_busy(before: &MachineSample, after: &MachineSample) -> (Option<f64>, f64) {
    let seconds = after.at.duration_since(before.at).as_secs_f64().max(1e-9);
    let pressure = match (before.pressure_some_us, after.pressure_some_us) {
        (Some(before), Some(after)) => Some(100.0 * after.saturating_sub(before) as f64 / 1e6 / seconds),
        _ => None,
    };
    let steal =
        100.0 * after.steal_ticks.saturating_sub(before.steal_ticks) as f64 / clock_ticks_per_second() / seconds;
    (pressure, steal)
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 { size as u64 } else { 4096 }
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let before = sample("self").unwrap();
        let mut spin = 0u64;
        let started = Instant::now();
        while started.elapsed().as_millis() < 50 {
            spin = spin.wrapping_add(std::hint::black_box(1));
        }
        let after = sample("self").unwrap();
        assert!(after.rss_bytes > 0);
        assert!(cpu_percent(&before, &after) >= 0.0);
    }
}
