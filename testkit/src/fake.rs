//! A fake standby: a node that serves no lock and answers every lock
//! request with `M <op> <key> <active>`, as a standby of a cluster does, so
//! that a test can check that a client follows redirects (docs/protocol.md §4).

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

/// Whom a fake standby names as the active.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Names {
    /// This address.
    Active(SocketAddr),
    /// No active is known (`-`).
    NoActive,
    /// The fake itself, as a node that wrongly believes it is not active would.
    Itself,
}

struct Shared {
    /// The address `M` and `P` replies name, or `-`.
    active: Mutex<String>,
    redirected: AtomicUsize,
    accepted: AtomicUsize,
    closed: AtomicBool,
}

/// A running fake standby; it stops accepting when dropped.
pub struct FakeStandby {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

impl FakeStandby {
    /// A fake standby on a free loopback port, naming `names`.
    pub fn start(names: Names) -> FakeStandby {
        FakeStandby::try_start(names).expect("bind the fake standby")
    }

    /// As [`start`](Self::start), with the bind error.
    pub fn try_start(names: Names) -> std::io::Result<FakeStandby> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            active: Mutex::new(String::new()),
            redirected: AtomicUsize::new(0),
            accepted: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
        });
        let fake = FakeStandby { addr, shared };
        fake.set_names(names);
        let shared = fake.shared.clone();
        thread::spawn(move || {
            for stream in listener.incoming() {
                if shared.closed.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                shared.accepted.fetch_add(1, Ordering::SeqCst);
                let shared = shared.clone();
                thread::spawn(move || serve(stream, &shared));
            }
        });
        Ok(fake)
    }

    /// Names another active from now on.
    pub fn set_names(&self, names: Names) {
        let active = match names {
            Names::Active(active) => active.to_string(),
            Names::NoActive => "-".to_string(),
            Names::Itself => self.addr.to_string(),
        };
        *self.shared.active.lock().unwrap() = active;
    }

    /// Lock requests it answered with `M`.
    pub fn redirected(&self) -> usize {
        self.shared.redirected.load(Ordering::SeqCst)
    }

    /// Connections accepted since the start.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for FakeStandby {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve(stream: TcpStream, shared: &Shared) {
    let Ok(mut writer) = stream.try_clone() else { return };
    for line in BufReader::new(stream).lines() {
        let Ok(line) = line else { return };
        let fields: Vec<&str> = line.split(' ').collect();
        let active = shared.active.lock().unwrap().clone();
        let reply = match fields[0] {
            "A" | "R" | "X" | "I" if fields.len() >= 2 => {
                shared.redirected.fetch_add(1, Ordering::SeqCst);
                format!("M {} {} {active}\n", fields[0], fields[1])
            }
            "P" => format!("P standby 0 {active}\n"),
            "S" => "S {\"role\":\"standby\"}\n".to_string(),
            _ => "E - - bad-op\n".to_string(),
        };
        if writer.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}
