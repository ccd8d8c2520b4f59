//! `ringlock-bench connect-rate`: how many new connections a server takes
//! per second, each opened (with a full TLS handshake under --tls-ca: no
//! session is resumed), used for one ping round trip (`P`, or Redis's
//! `PING`) and closed; and, with --server-pid, the server's CPU time per
//! connection, which is the handshake's cost on the server whichever side
//! is the bottleneck.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::cli::{ConnectRateArgs, Target};
use crate::proc_sample;
use crate::tls::{self, Opened, Security};

const OPEN_TIMEOUT: Duration = Duration::from_secs(5);
const WARMUP: u8 = 0;
const MEASURE: u8 = 1;
const STOP: u8 = 2;

/// What one connect-rate run measured.
#[derive(Debug, serde::Serialize)]
pub struct ConnectRateReport {
    pub label: Option<String>,
    pub target: Target,
    pub tls: bool,
    pub threads: usize,
    pub measured_s: f64,
    pub connections: u64,
    pub connections_per_s: f64,
    pub errors: u64,
    /// The server's CPU use over the measured time, in percent of one CPU.
    pub server_cpu_percent: Option<f64>,
    /// The server's CPU time per connection, in microseconds.
    pub server_cpu_us_per_connection: Option<f64>,
    pub cpu_pressure_percent: Option<f64>,
    pub cpu_steal_percent: f64,
}

impl ConnectRateReport {
    pub fn text(&self) -> String {
        let mut text = format!(
            "{} connect-rate{}: {:.0} connections/s ({} in {:.1} s, {} errors)",
            self.target.name(),
            if self.tls { " (TLS)" } else { "" },
            self.connections_per_s,
            self.connections,
            self.measured_s,
            self.errors
        );
        if let (Some(cpu), Some(per)) = (self.server_cpu_percent, self.server_cpu_us_per_connection) {
            text.push_str(&format!("; server CPU {cpu:.0} %, {per:.1} us per connection"));
        }
        text
    }
}

/// One connection's life: open, ping, close.
fn one_connection(target: Target, addr: std::net::SocketAddr, security: &Security) -> io::Result<()> {
    let mut opened = tls::open(addr, security, OPEN_TIMEOUT)?;
    opened.stream.set_read_timeout(Some(OPEN_TIMEOUT))?;
    let (ping, pong): (&[u8], &[u8]) = match target {
        Target::Redis => (b"*1\r\n$4\r\nPING\r\n", b"+PONG"),
        _ => (b"P\n", b"P "),
    };
    opened.write_all(ping)?;
    let reply = opened.read_line()?;
    if !reply.starts_with(pong) {
        return Err(io::Error::new(io::ErrorKind::InvalidData, String::from_utf8_lossy(&reply).into_owned()));
    }
    close(opened);
    Ok(())
}

/// Says goodbye as TLS wants, then resets the socket rather than leave it
/// in TIME_WAIT: tens of thousands of those would use up the local ports.
fn close(mut opened: Opened) {
    if let Some(tls) = opened.tls.as_mut() {
        tls.send_close_notify();
        let _ = tls.write_tls(&mut opened.stream);
    }
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: a socket this function owns, and a linger value that lives
    // across the call.
    unsafe {
        libc::setsockopt(
            opened.stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

pub fn run(args: &ConnectRateArgs) -> Result<ConnectRateReport, String> {
    if args.target == Target::Echo {
        return Err("connect-rate drives ringlock or redis".into());
    }
    if args.threads == 0 {
        return Err("--threads must be at least 1".into());
    }
    let security = args.security.security(args.addr)?;
    if security.secret.is_some() && args.target != Target::Ringlock {
        return Err("--secret (or RINGLOCK_SECRET) is for the ringlock target only".into());
    }
    // One connection first, so that a wrong address or CA fails at once.
    one_connection(args.target, args.addr, &security).map_err(|error| format!("{}: {error}", args.addr))?;
    let phase = Arc::new(AtomicU8::new(WARMUP));
    let counted = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    for thread in 0..args.threads {
        let (phase, counted, errors, security) = (phase.clone(), counted.clone(), errors.clone(), security.clone());
        let cpu = args.cpus.as_ref().filter(|cpus| !cpus.0.is_empty()).map(|cpus| cpus.0[thread % cpus.0.len()]);
        let (target, addr) = (args.target, args.addr);
        threads.push(std::thread::spawn(move || {
            if let Some(cpu) = cpu {
                core_affinity::set_for_current(core_affinity::CoreId { id: cpu });
            }
            loop {
                let now = phase.load(Ordering::Relaxed);
                if now == STOP {
                    break;
                }
                let outcome = one_connection(target, addr, &security);
                if phase.load(Ordering::Relaxed) == MEASURE && now == MEASURE {
                    match outcome {
                        Ok(()) => counted.fetch_add(1, Ordering::Relaxed),
                        Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                    };
                }
            }
        }));
    }
    std::thread::sleep(Duration::from_secs_f64(args.warmup));
    let server_pid = args.server_pid.map(|pid| pid.to_string());
    let sample = || server_pid.as_deref().and_then(|pid| proc_sample::sample(pid).ok());
    let machine_before = proc_sample::machine_sample();
    let server_before = sample();
    phase.store(MEASURE, Ordering::Relaxed);
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(args.duration));
    let connections = counted.load(Ordering::Relaxed);
    let measured_s = start.elapsed().as_secs_f64();
    let server_after = sample();
    let machine_after = proc_sample::machine_sample();
    phase.store(STOP, Ordering::Relaxed);
    for thread in threads {
        thread.join().map_err(|_| "a connect-rate thread panicked".to_string())?;
    }
    let server_cpu_percent = match (&server_before, &server_after) {
        (Some(before), Some(after)) => Some(proc_sample::cpu_percent(before, after)),
        _ => None,
    };
    let (pressure, steal) = proc_sample::machine_busy(&machine_before, &machine_after);
    Ok(ConnectRateReport {
        label: args.label.clone(),
        target: args.target,
        tls: security.tls.is_some(),
        threads: args.threads,
        measured_s,
        connections,
        connections_per_s: connections as f64 / measured_s,
        errors: errors.load(Ordering::Relaxed),
        server_cpu_percent,
        server_cpu_us_per_connection: server_cpu_percent
            .filter(|_| connections > 0)
            .map(|cpu| cpu / 100.0 * measured_s * 1e6 / connections as f64),
        cpu_pressure_percent: pressure,
        cpu_steal_percent: steal,
    })
}
