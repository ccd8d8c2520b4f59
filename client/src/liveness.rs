//! Whether a connection still answers (docs/protocol.md §4, "Silent
//! connections"), as a watch with no I/O, and the socket options that let
//! the kernel give up on a vanished peer too.
//!
//! A host that lost power or sits behind a partition neither resets nor
//! closes its connections: a read on them blocks until the link comes back,
//! which can be long after every request on them should have ended. So a
//! connection with requests in flight that has read nothing for
//! `suspect_after` is suspected and sent `P`; if it still reads nothing for
//! `ping_timeout` after that, it is cut like a broken connection, and its
//! requests move to another connection or wait for one within their own
//! limits. A request thus ends within its limit plus `suspect_after +
//! ping_timeout` and a tick. A connection with nothing in flight is never
//! suspected: an idle one has no reason to answer (TCP keepalive covers it).
//!
//! The reader thread reads with a timeout of one [`tick`](Liveness::tick)
//! and asks the watch what to do each time a read times out, so a busy
//! connection costs nothing more than before: one clock reading per read,
//! taken anyway to pair the replies.

use std::time::{Duration, Instant};

/// Seconds a connection is idle before TCP keepalive probes start.
const KEEPALIVE_IDLE_S: u32 = 5;
/// Seconds between two TCP keepalive probes.
const KEEPALIVE_INTERVAL_S: u32 = 1;
/// Unanswered TCP keepalive probes before the kernel gives the connection up.
const KEEPALIVE_PROBES: u32 = 3;
/// The shortest tick, so that tiny settings do not spin the reader.
const TICK_MIN: Duration = Duration::from_millis(1);

/// What a connection does after a check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Nothing: it answered lately, or has nothing in flight, or its ping
    /// has time left.
    Quiet,
    /// Send `P`: a reply is overdue.
    Ping,
    /// Cut it: not even the ping was answered. The silence lasted this long.
    Cut(Duration),
}

/// One connection's silence watch; the connection's lock guards it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Liveness {
    suspect_after: Duration,
    ping_timeout: Duration,
    /// When the socket last gave the reader bytes.
    last_read: Instant,
    /// When the connection last went from nothing in flight to something.
    busy_since: Instant,
    /// When the watch sent `P`, while its answer (or any read) is awaited.
    pinged_at: Option<Instant>,
}

impl Liveness {
    pub(crate) fn new(suspect_after: Duration, ping_timeout: Duration, now: Instant) -> Liveness {
        Liveness { suspect_after, ping_timeout, last_read: now, busy_since: now, pinged_at: None }
    }

    /// How often a connection checks: a quarter of the shorter limit.
    pub(crate) fn tick(suspect_after: Duration, ping_timeout: Duration) -> Duration {
        (suspect_after.min(ping_timeout) / 4).max(TICK_MIN)
    }

    /// A fresh socket: nothing is overdue yet.
    pub(crate) fn reset(&mut self, now: Instant) {
        self.last_read = now;
        self.busy_since = now;
        self.pinged_at = None;
    }

    /// The socket gave the reader bytes at `now`.
    pub(crate) fn note_read(&mut self, now: Instant) {
        self.last_read = now;
    }

    /// A request went out on a connection with nothing in flight: the
    /// silence counts from now, not from the last reply of a quiet while.
    pub(crate) fn note_busy(&mut self, now: Instant) {
        self.busy_since = now;
    }

    /// What to do at `now`; `busy` if requests are in flight.
    pub(crate) fn check(&mut self, now: Instant, busy: bool) -> Verdict {
        if !busy {
            self.pinged_at = None;
            return Verdict::Quiet;
        }
        let quiet_since = self.last_read.max(self.busy_since);
        if let Some(pinged_at) = self.pinged_at {
            if self.last_read >= pinged_at {
                // It answered something since the ping: alive. Its requests
                // may wait their turn for long; a new ping comes after a new
                // silence of `suspect_after`.
                self.pinged_at = None;
            } else if now.saturating_duration_since(pinged_at) >= self.ping_timeout {
                return Verdict::Cut(now.saturating_duration_since(quiet_since));
            } else {
                return Verdict::Quiet;
            }
        }
        if now.saturating_duration_since(quiet_since) >= self.suspect_after {
            self.pinged_at = Some(now);
            return Verdict::Ping;
        }
        Verdict::Quiet
    }
}

/// Turns on TCP keepalive (idle 5 s, then a probe a second, given up after
/// 3) and, on Linux, `TCP_USER_TIMEOUT` of `user_timeout` (data the peer
/// does not acknowledge for that long fails the socket). These are the
/// kernel's own checks, under the client's: they also end an idle
/// connection to a vanished host. An option the system refuses is skipped.
#[cfg(target_os = "linux")]
pub(crate) fn tune_socket(stream: &std::net::TcpStream, user_timeout: Duration) {
    use std::os::fd::AsRawFd;

    let user_timeout_ms = u32::try_from(user_timeout.as_millis()).unwrap_or(u32::MAX).max(1);
    let options = [
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, KEEPALIVE_IDLE_S),
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, KEEPALIVE_INTERVAL_S),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, KEEPALIVE_PROBES),
        (libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, user_timeout_ms),
    ];
    let fd = stream.as_raw_fd();
    for (level, option, value) in options {
        let value = libc::c_int::try_from(value).unwrap_or(libc::c_int::MAX);
        // SAFETY: `fd` is the open socket `stream` owns for the whole call;
        // the option value is a live `c_int` whose size is passed with it.
        unsafe {
            libc::setsockopt(
                fd,
                level,
                option,
                std::ptr::from_ref(&value).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
}

/// Elsewhere than Linux the client relies on its own watch alone.
#[cfg(not(target_os = "linux"))]
pub(crate) fn tune_socket(_stream: &std::net::TcpStream, _user_timeout: Duration) {}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn watch(now: Instant) -> Liveness {
        Liveness::new(SECOND, SECOND, now)
    }

    #[test]
    fn a_busy_silent_connection_is_pinged_then_cut() {
        let start = Instant::now();
        let mut liveness = watch(start);
        assert_eq!(liveness.check(start + SECOND / 2, true), Verdict::Quiet);
        assert_eq!(liveness.check(start + SECOND, true), Verdict::Ping);
        assert_eq!(liveness.check(start + SECOND * 3 / 2, true), Verdict::Quiet, "the ping has time left");
        assert_eq!(liveness.check(start + SECOND * 2, true), Verdict::Cut(SECOND * 2));
    }

    #[test]
    fn an_idle_connection_is_never_suspected() {
        let start = Instant::now();
        let mut liveness = watch(start);
        assert_eq!(liveness.check(start + SECOND * 100, false), Verdict::Quiet);
        // Busy from now on: the silence counts from the first request.
        liveness.note_busy(start + SECOND * 100);
        assert_eq!(liveness.check(start + SECOND * 100 + SECOND / 2, true), Verdict::Quiet);
        assert_eq!(liveness.check(start + SECOND * 101, true), Verdict::Ping);
    }

    #[test]
    fn an_answered_ping_keeps_the_connection_and_starts_a_new_watch() {
        let start = Instant::now();
        let mut liveness = watch(start);
        assert_eq!(liveness.check(start + SECOND, true), Verdict::Ping);
        liveness.note_read(start + SECOND + SECOND / 10);
        assert_eq!(liveness.check(start + SECOND * 2, true), Verdict::Quiet, "answered");
        // A request waiting its turn: one ping per `suspect_after` of silence.
        let again = start + SECOND * 2 + SECOND / 10;
        assert_eq!(liveness.check(again, true), Verdict::Ping);
        assert_eq!(liveness.check(again + SECOND, true), Verdict::Cut(SECOND * 2));
    }

    #[test]
    fn nothing_left_in_flight_forgets_the_ping() {
        let start = Instant::now();
        let mut liveness = watch(start);
        assert_eq!(liveness.check(start + SECOND, true), Verdict::Ping);
        assert_eq!(liveness.check(start + SECOND * 3 / 2, false), Verdict::Quiet);
        liveness.reset(start + SECOND * 3);
        assert_eq!(liveness.check(start + SECOND * 7 / 2, true), Verdict::Quiet, "a fresh socket");
    }

    #[test]
    fn the_tick_is_a_quarter_of_the_shorter_limit() {
        assert_eq!(Liveness::tick(SECOND, SECOND * 2), SECOND / 4);
        assert_eq!(Liveness::tick(SECOND, SECOND / 2), SECOND / 8);
        assert_eq!(Liveness::tick(Duration::from_micros(1), SECOND), TICK_MIN);
    }

    #[test]
    fn socket_options_are_set_on_a_real_socket() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        tune_socket(&stream, SECOND * 2);
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            let get = |level, option| {
                let mut value: libc::c_int = 0;
                let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
                // SAFETY: a live socket, a live `c_int` and its size.
                let rc = unsafe {
                    libc::getsockopt(
                        stream.as_raw_fd(),
                        level,
                        option,
                        std::ptr::from_mut(&mut value).cast(),
                        &raw mut len,
                    )
                };
                assert_eq!(rc, 0);
                value
            };
            assert_eq!(get(libc::SOL_SOCKET, libc::SO_KEEPALIVE), 1);
            assert_eq!(get(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE), 5);
            assert_eq!(get(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT), 2_000);
        }
    }
}
