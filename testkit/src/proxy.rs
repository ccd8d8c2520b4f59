//! A TCP proxy for client tests: it listens on a loopback port, forwards
//! every connection to a target, and on command cuts connections, stalls
//! them (holds the bytes it reads instead of forwarding them), black-holes
//! them (reads and drops every byte, answering nothing, as a vanished host
//! or a partition looks from the client), refuses new ones (accepts and
//! closes them at once), delays replies, or sends reply lines in reverse
//! order.
//!
//! It records every byte each connection sent towards the server, so a test
//! can wait for a request to be in flight on a connection (an event) rather
//! than sleep.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use crate::PATIENCE;

/// While replies are reordered, a connection's reply lines are held until
/// none has come for this long, then sent in reverse order.
const REORDER_QUIET: Duration = Duration::from_millis(50);

/// Which way bytes go through a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    /// From the client to the server: requests.
    Up = 0,
    /// From the server to the client: replies.
    Down = 1,
}

/// One proxied connection.
struct Link {
    id: usize,
    client: TcpStream,
    server: TcpStream,
    /// Every byte the client sent, forwarded or not.
    upstream: Mutex<Vec<u8>>,
    /// Bytes read while the direction was stalled, by direction.
    held: [Mutex<Vec<u8>>; 2],
    open: AtomicBool,
    /// Its bytes are dropped in both directions (the connection alone, or
    /// because it was open or accepted while the whole proxy was).
    blackholed: AtomicBool,
}

impl Link {
    fn destination(&self, direction: Direction) -> &TcpStream {
        match direction {
            Direction::Up => &self.server,
            Direction::Down => &self.client,
        }
    }

    fn source(&self, direction: Direction) -> &TcpStream {
        match direction {
            Direction::Up => &self.client,
            Direction::Down => &self.server,
        }
    }

    fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        let _ = self.client.shutdown(Shutdown::Both);
        let _ = self.server.shutdown(Shutdown::Both);
    }
}

struct Shared {
    target: Mutex<SocketAddr>,
    refusing: AtomicBool,
    /// Stalled directions, by [`Direction`].
    stalled: [AtomicBool; 2],
    /// Replies wait this long before they are forwarded.
    delay_ms: AtomicU64,
    /// Reply lines are sent in reverse order, a quiet moment's worth at a time.
    reordering: AtomicBool,
    /// Every connection, open or new, is black-holed.
    blackhole: AtomicBool,
    links: Mutex<Vec<Arc<Link>>>,
    /// Signalled on every change a test may wait for.
    changed: Condvar,
    accepted: AtomicUsize,
    refused: AtomicUsize,
    /// When the proxy started; attempt times are counted from it.
    started: Instant,
    /// When each connection attempt arrived, accepted or refused, in order.
    attempts: Mutex<Vec<Duration>>,
    closed: AtomicBool,
}

impl Shared {
    fn links(&self) -> MutexGuard<'_, Vec<Arc<Link>>> {
        // A failed assertion elsewhere must not turn the proxy's drop into
        // a second panic.
        self.links.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn notify(&self) {
        // Take the lock so a waiter cannot miss the signal between its check
        // and its wait.
        let _links = self.links();
        self.changed.notify_all();
    }
}

/// A running proxy; it stops and cuts everything when dropped.
pub struct Proxy {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

impl Proxy {
    /// A proxy to `target` on a free loopback port.
    pub fn start(target: SocketAddr) -> Proxy {
        Proxy::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), target).expect("bind the proxy")
    }

    /// A proxy to `target` listening on `listen`. A caller that hands out
    /// ports to servers it starts later names the proxy's port itself, so
    /// that the system does not give the proxy one of those ports meanwhile.
    pub fn start_on(listen: SocketAddr, target: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind(listen)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            target: Mutex::new(target),
            refusing: AtomicBool::new(false),
            stalled: [AtomicBool::new(false), AtomicBool::new(false)],
            delay_ms: AtomicU64::new(0),
            reordering: AtomicBool::new(false),
            blackhole: AtomicBool::new(false),
            links: Mutex::new(Vec::new()),
            changed: Condvar::new(),
            accepted: AtomicUsize::new(0),
            refused: AtomicUsize::new(0),
            started: Instant::now(),
            attempts: Mutex::new(Vec::new()),
            closed: AtomicBool::new(false),
        });
        let accepting = shared.clone();
        thread::spawn(move || accept(&listener, &accepting));
        Ok(Proxy { addr, shared })
    }

    /// When each connection attempt arrived since the start, accepted or
    /// refused, in arrival order, counted from the proxy's start: what a
    /// test of a client's reconnect schedule looks at.
    pub fn attempt_times(&self) -> Vec<Duration> {
        self.shared.attempts.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Connections forwarded since the start.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Connections refused since the start.
    pub fn refused(&self) -> usize {
        self.shared.refused.load(Ordering::SeqCst)
    }

    /// Connections open now.
    pub fn open_count(&self) -> usize {
        self.open_ids().len()
    }

    /// Ids of the connections open now, oldest first.
    pub fn open_ids(&self) -> Vec<usize> {
        self.shared.links().iter().filter(|link| link.open.load(Ordering::SeqCst)).map(|link| link.id).collect()
    }

    /// Waits until `done` holds for the proxy, or says what it waited for.
    pub fn try_wait_until(&self, what: &str, mut done: impl FnMut(&Proxy) -> bool) -> Result<(), String> {
        let deadline = Instant::now() + PATIENCE;
        let mut links = self.shared.links();
        loop {
            drop(links);
            if done(self) {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("timeout waiting for {what}"));
            }
            links = self.shared.links();
            // Also wake now and then, for conditions outside the proxy.
            links = self.shared.changed.wait_timeout(links, left.min(Duration::from_millis(50))).unwrap().0;
        }
    }

    /// Waits until `done` holds for the proxy; fails the test after a while.
    pub fn wait_until(&self, what: &str, done: impl FnMut(&Proxy) -> bool) {
        self.try_wait_until(what, done).unwrap_or_else(|error| panic!("{error}"));
    }

    /// Waits until `count` connections are open.
    pub fn wait_open(&self, count: usize) {
        self.wait_until(&format!("{count} open connections"), |proxy| proxy.open_count() == count);
    }

    /// Waits until an open connection other than those in `except` has sent
    /// `needle` towards the server (forwarded or held), and returns its id.
    pub fn try_wait_upstream(&self, needle: &[u8], except: &[usize]) -> Result<usize, String> {
        let mut found = None;
        let what = format!("{:?} on the way to the server", String::from_utf8_lossy(needle));
        self.try_wait_until(&what, |proxy| {
            found = proxy.shared.links().iter().find_map(|link| {
                let sent = link.upstream.lock().unwrap();
                let open = link.open.load(Ordering::SeqCst);
                (open && !except.contains(&link.id) && contains(&sent, needle)).then_some(link.id)
            });
            found.is_some()
        })?;
        Ok(found.expect("found when the wait ended"))
    }

    /// As [`try_wait_upstream`](Self::try_wait_upstream); fails the test after a while.
    pub fn wait_upstream(&self, needle: &[u8], except: &[usize]) -> usize {
        self.try_wait_upstream(needle, except).unwrap_or_else(|error| panic!("{error}"))
    }

    /// Everything connection `id` sent towards the server.
    pub fn upstream_of(&self, id: usize) -> Vec<u8> {
        let links = self.shared.links();
        let link = links.iter().find(|link| link.id == id).expect("a known connection id");
        link.upstream.lock().unwrap().clone()
    }

    /// Cuts connection `id` (both sides closed at once); what it held is lost.
    pub fn cut(&self, id: usize) {
        let links = self.shared.links();
        links.iter().filter(|link| link.id == id).for_each(|link| link.cut());
        drop(links);
        self.shared.notify();
    }

    /// Cuts every open connection; what they held is lost.
    pub fn cut_all(&self) {
        let links = self.shared.links();
        links.iter().for_each(|link| link.cut());
        drop(links);
        self.shared.notify();
    }

    /// Holds the bytes of every connection in both directions instead of
    /// forwarding them, until [`resume`](Self::resume).
    pub fn stall(&self) {
        self.shared.stalled[Direction::Up as usize].store(true, Ordering::SeqCst);
        self.shared.stalled[Direction::Down as usize].store(true, Ordering::SeqCst);
    }

    /// Holds only the replies: requests reach the server, answers do not
    /// reach the client.
    pub fn stall_replies(&self) {
        self.shared.stalled[Direction::Down as usize].store(true, Ordering::SeqCst);
    }

    /// Forwards replies `delay` after they arrive (zero: at once).
    pub fn delay_replies(&self, delay: Duration) {
        self.shared.delay_ms.store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// While on, each connection's reply lines are held until none has come
    /// for a moment, then sent in reverse order in one write: replies come
    /// back out of the order of their requests.
    pub fn set_reordering(&self, reordering: bool) {
        self.shared.reordering.store(reordering, Ordering::SeqCst);
    }

    /// Forwards what was held and stops holding, delaying and reordering.
    pub fn resume(&self) {
        self.shared.delay_ms.store(0, Ordering::SeqCst);
        self.shared.reordering.store(false, Ordering::SeqCst);
        for direction in [Direction::Up, Direction::Down] {
            self.shared.stalled[direction as usize].store(false, Ordering::SeqCst);
            for link in self.shared.links().iter() {
                let mut held = link.held[direction as usize].lock().unwrap();
                let _ = link.destination(direction).write_all(&held);
                held.clear();
            }
        }
    }

    /// Black-holes every connection, open ones and those accepted from now
    /// on: the proxy goes on accepting connections and reading their bytes,
    /// and drops them in both directions, answering nothing, with neither a
    /// reset nor a close: what a client sees of a host that vanished or of a
    /// partition. Ended by [`lift_blackhole`](Self::lift_blackhole).
    pub fn blackhole(&self) {
        self.shared.blackhole.store(true, Ordering::SeqCst);
        self.shared.links().iter().for_each(|link| link.blackholed.store(true, Ordering::SeqCst));
    }

    /// Black-holes connection `id` alone, as [`blackhole`](Self::blackhole).
    pub fn blackhole_one(&self, id: usize) {
        let links = self.shared.links();
        links.iter().filter(|link| link.id == id).for_each(|link| link.blackholed.store(true, Ordering::SeqCst));
    }

    /// Ends the black hole: new connections are forwarded again, and every
    /// black-holed connection is cut, as the host that came back no longer
    /// knows them (the bytes dropped meanwhile left them unusable anyway).
    pub fn lift_blackhole(&self) {
        self.shared.blackhole.store(false, Ordering::SeqCst);
        let links = self.shared.links();
        links.iter().filter(|link| link.blackholed.load(Ordering::SeqCst)).for_each(|link| link.cut());
        drop(links);
        self.shared.notify();
    }

    /// Ends the black hole of connection `id` alone: it is cut.
    pub fn lift_blackhole_one(&self, id: usize) {
        let links = self.shared.links();
        links.iter().filter(|link| link.id == id && link.blackholed.load(Ordering::SeqCst)).for_each(|link| link.cut());
        drop(links);
        self.shared.notify();
    }

    /// Ids of the black-holed connections still open, oldest first.
    pub fn blackholed_ids(&self) -> Vec<usize> {
        let links = self.shared.links();
        links
            .iter()
            .filter(|link| link.open.load(Ordering::SeqCst) && link.blackholed.load(Ordering::SeqCst))
            .map(|link| link.id)
            .collect()
    }

    /// Accepts new connections and closes them at once while `refusing`.
    pub fn set_refusing(&self, refusing: bool) {
        self.shared.refusing.store(refusing, Ordering::SeqCst);
    }

    /// Forwards new connections to `target` from now on.
    pub fn set_target(&self, target: SocketAddr) {
        *self.shared.target.lock().unwrap() = target;
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
        self.cut_all();
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|window| window == needle)
}

fn accept(listener: &TcpListener, shared: &Arc<Shared>) {
    let mut next_id = 0;
    for client in listener.incoming() {
        if shared.closed.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        let arrived = shared.started.elapsed();
        shared.attempts.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(arrived);
        if shared.refusing.load(Ordering::SeqCst) {
            shared.refused.fetch_add(1, Ordering::SeqCst);
            let _ = client.shutdown(Shutdown::Both);
            shared.notify();
            continue;
        }
        let target = *shared.target.lock().unwrap();
        let Ok(server) = TcpStream::connect(target) else {
            let _ = client.shutdown(Shutdown::Both);
            shared.notify();
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        // Replies are read with a timeout, so that lines held for reordering
        // go out once the server has been quiet for a moment.
        let _ = server.set_read_timeout(Some(REORDER_QUIET));
        let link = Arc::new(Link {
            id: next_id,
            client,
            server,
            upstream: Mutex::new(Vec::new()),
            held: [Mutex::new(Vec::new()), Mutex::new(Vec::new())],
            open: AtomicBool::new(true),
            blackholed: AtomicBool::new(shared.blackhole.load(Ordering::SeqCst)),
        });
        next_id += 1;
        shared.links().push(link.clone());
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        shared.notify();
        for direction in [Direction::Up, Direction::Down] {
            let link = link.clone();
            let shared = shared.clone();
            thread::spawn(move || forward(&link, direction, &shared));
        }
    }
}

fn forward(link: &Link, direction: Direction, shared: &Shared) {
    let mut buffer = [0u8; 65536];
    // Reply lines held for reordering, and the start of an unfinished one.
    let mut reordered: Vec<Vec<u8>> = Vec::new();
    let mut partial: Vec<u8> = Vec::new();
    loop {
        let read = match link.source(direction).read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => read,
            Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                // The server was quiet for a moment: what is held for
                // reordering goes out, last line first.
                let reverse = shared.reordering.load(Ordering::SeqCst);
                if !reordered.is_empty() && !send(link, direction, shared, &take_lines(&mut reordered, reverse)) {
                    break;
                }
                continue;
            }
            Err(_) => break,
        };
        if !link.open.load(Ordering::SeqCst) {
            break;
        }
        let bytes = &buffer[..read];
        if direction == Direction::Up {
            link.upstream.lock().unwrap().extend_from_slice(bytes);
        }
        if link.blackholed.load(Ordering::SeqCst) {
            // Read and dropped: nothing goes on, nothing comes back.
            shared.notify();
            continue;
        }
        if direction == Direction::Down {
            let delay_ms = shared.delay_ms.load(Ordering::SeqCst);
            if delay_ms > 0 {
                thread::sleep(Duration::from_millis(delay_ms));
            }
            if shared.reordering.load(Ordering::SeqCst) || !reordered.is_empty() || !partial.is_empty() {
                partial.extend_from_slice(bytes);
                while let Some(end) = partial.iter().position(|&byte| byte == b'\n') {
                    reordered.push(partial.drain(..=end).collect());
                }
                // Reordering ended: what is held goes out as it came.
                if !shared.reordering.load(Ordering::SeqCst)
                    && !send(link, direction, shared, &take_lines(&mut reordered, false))
                {
                    break;
                }
                shared.notify();
                continue;
            }
        }
        if !send(link, direction, shared, bytes) {
            break;
        }
        shared.notify();
    }
    link.cut();
    shared.notify();
}

/// The held lines as one buffer, last first if `reverse`; `lines` is left empty.
fn take_lines(lines: &mut Vec<Vec<u8>>, reverse: bool) -> Vec<u8> {
    if reverse { lines.drain(..).rev().flatten().collect() } else { lines.drain(..).flatten().collect() }
}

/// Forwards `bytes`, or holds them while the direction is stalled (held
/// bytes go out first, in order); false if the destination is gone.
fn send(link: &Link, direction: Direction, shared: &Shared, bytes: &[u8]) -> bool {
    // Check and write under the lock that `resume` flushes held bytes under.
    let mut held = link.held[direction as usize].lock().unwrap();
    if shared.stalled[direction as usize].load(Ordering::SeqCst) || !held.is_empty() {
        held.extend_from_slice(bytes);
        true
    } else {
        link.destination(direction).write_all(bytes).is_ok()
    }
}
