//! Test support: start the real `ringlock` binary on a free loopback port and
//! talk raw protocol lines to it.
#![allow(dead_code)]

pub mod certs;
pub mod netns;
pub mod peer;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a test waits for anything before it fails.
pub const PATIENCE: Duration = Duration::from_secs(20);

static NEXT_DIR: AtomicUsize = AtomicUsize::new(0);

/// `count` free loopback addresses, all different: every probing socket
/// stays open until all are picked, since the system may hand a port that
/// was just let go to the next probe.
pub fn free_addrs(count: usize) -> Vec<SocketAddr> {
    let probes: Vec<std::net::TcpListener> =
        (0..count).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    probes.iter().map(|probe| probe.local_addr().unwrap()).collect()
}

/// A data directory removed when dropped.
pub struct DataDir(pub PathBuf);

impl DataDir {
    pub fn new() -> DataDir {
        let n = NEXT_DIR.fetch_add(1, Ordering::SeqCst);
        let path = std::env::temp_dir().join(format!("ringlock-test-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        DataDir(path)
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running server process, killed when dropped.
pub struct Server {
    child: Option<Child>,
    pub addr: SocketAddr,
    pub log: Arc<Mutex<String>>,
    data_dir: Arc<DataDir>,
}

impl Server {
    /// Starts a server with its own data directory and `args`.
    pub fn start(args: &[&str]) -> Server {
        Server::start_in(Arc::new(DataDir::new()), args)
    }

    /// Starts a server on `data_dir` (shared to restart on the same epoch file).
    pub fn start_in(data_dir: Arc<DataDir>, args: &[&str]) -> Server {
        Server::try_start_in(data_dir, args).unwrap_or_else(|log| panic!("the server did not start:\n{log}"))
    }

    /// Starts a server, or gives back what it printed if it did not start.
    pub fn try_start_in(data_dir: Arc<DataDir>, args: &[&str]) -> Result<Server, String> {
        Server::try_start_with_env(data_dir, &[], args)
    }

    /// Starts a server with environment variables set for it.
    pub fn start_with_env(env: &[(&str, &str)], args: &[&str]) -> Server {
        Server::try_start_with_env(Arc::new(DataDir::new()), env, args)
            .unwrap_or_else(|log| panic!("the server did not start:\n{log}"))
    }

    /// Starts a server whose working directory is `working_dir` (made if
    /// missing), which `args` may name relative paths in (`--data-dir`).
    pub fn start_from(working_dir: Arc<DataDir>, args: &[&str]) -> Server {
        std::fs::create_dir_all(&working_dir.0).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_ringlock"));
        command.current_dir(&working_dir.0);
        Server::try_start_command(command, working_dir, &[], args)
            .unwrap_or_else(|log| panic!("the server did not start:\n{log}"))
    }

    /// Starts the server through `command` (a wrapper such as `ip netns
    /// exec NS ringlock`), given its arguments, on `data_dir`.
    pub fn start_command(command: Command, data_dir: Arc<DataDir>, args: &[&str]) -> Server {
        Server::try_start_command(command, data_dir, &[], args)
            .unwrap_or_else(|log| panic!("the server did not start:\n{log}"))
    }

    fn try_start_with_env(data_dir: Arc<DataDir>, env: &[(&str, &str)], args: &[&str]) -> Result<Server, String> {
        Server::try_start_command(Command::new(env!("CARGO_BIN_EXE_ringlock")), data_dir, env, args)
    }

    fn try_start_command(
        mut command: Command,
        data_dir: Arc<DataDir>,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> Result<Server, String> {
        command.envs(env.iter().copied());
        if !args.contains(&"--listen") {
            command.args(["--listen", "127.0.0.1:0"]);
        }
        let from_env = |name: &str| env.iter().any(|(key, _)| *key == name);
        if !args.contains(&"--shards") && !from_env("RINGLOCK_SHARDS") {
            command.args(["--shards", "1"]);
        }
        if !args.iter().any(|arg| *arg == "--cpus" || *arg == "--no-pin") && !from_env("RINGLOCK_NO_PIN") {
            command.arg("--no-pin");
        }
        if !args.contains(&"--data-dir") {
            command.arg("--data-dir").arg(&data_dir.0);
        }
        command.args(args);
        command.env_remove("RUST_LOG").stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = command.spawn().expect("start the ringlock binary");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(String::new()));
        let (address_sender, address) = std::sync::mpsc::channel();
        let log_writer = log.clone();
        std::thread::spawn(move || {
            let mut address_sender = Some(address_sender);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split("listening on ").nth(1)
                    && let Some(sender) = address_sender.take()
                {
                    let address = rest.split(|c: char| c == ';' || c.is_whitespace()).next().unwrap_or("");
                    let _ = sender.send(address.to_string());
                }
                let mut log = log_writer.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        match address.recv_timeout(PATIENCE) {
            Ok(address) => {
                let addr = address.parse().expect("a socket address in the start-up line");
                Ok(Server { child: Some(child), addr, log, data_dir })
            }
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                std::thread::sleep(Duration::from_millis(100));
                Err(log.lock().unwrap().clone())
            }
        }
    }

    pub fn data_dir(&self) -> Arc<DataDir> {
        self.data_dir.clone()
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    pub fn connect(&self) -> Conn {
        Conn::connect(self.addr)
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill").args([&format!("-{signal}"), &self.pid().to_string()]).status().unwrap();
        assert!(status.success());
    }

    /// kill -9, and waits for the process to be gone.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends SIGTERM (or SIGINT) and waits for the exit status.
    pub fn stop(&mut self, signal: &str) -> ExitStatus {
        self.signal(signal);
        self.stop_after_signal()
    }

    /// Waits for the exit status of a process already signalled.
    pub fn stop_after_signal(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "the server did not stop within {PATIENCE:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Resident memory of the process, in bytes.
    pub fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let line = status.lines().find(|line| line.starts_with("VmRSS:")).unwrap();
        let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        kib * 1024
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A raw protocol connection.
pub struct Conn {
    pub stream: TcpStream,
    buffer: Vec<u8>,
}

impl Conn {
    pub fn connect(addr: SocketAddr) -> Conn {
        Conn::from_stream(TcpStream::connect(addr).expect("connect to the server"))
    }

    /// A connection made some other way (from a chosen address, or in
    /// another network namespace).
    pub fn from_stream(stream: TcpStream) -> Conn {
        stream.set_nodelay(true).unwrap();
        stream.set_read_timeout(Some(PATIENCE)).unwrap();
        Conn { stream, buffer: Vec::new() }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send to the server");
    }

    /// Sends one request line (a newline is added).
    pub fn request(&mut self, line: &str) {
        self.send(format!("{line}\n").as_bytes());
    }

    /// The next reply line, without its newline; panics after [`PATIENCE`].
    pub fn line(&mut self) -> String {
        self.try_line(PATIENCE).expect("a reply line from the server")
    }

    /// The next line, or `None` if none arrives within `wait` or the server closed.
    pub fn try_line(&mut self, wait: Duration) -> Option<String> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(end) = self.buffer.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                return Some(String::from_utf8_lossy(&line[..line.len() - 1]).into_owned());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            self.stream.set_read_timeout(Some(left.max(Duration::from_millis(1)))).unwrap();
            let mut chunk = [0u8; 65536];
            match self.stream.read(&mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.buffer.extend_from_slice(&chunk[..n]),
                Err(error) if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    return None;
                }
                Err(_) => return None,
            }
        }
    }

    /// Sends `line` and returns the next reply.
    pub fn call(&mut self, line: &str) -> String {
        self.request(line);
        self.line()
    }

    /// Acquires `key` and returns the token, panicking on any other reply.
    /// `I key`: the token (`None` if free, or hidden from another name), the
    /// lease left and the waiters.
    pub fn inspect(&mut self, key: &str) -> (Option<u64>, u64, u64) {
        let reply = self.call(&format!("I {key}"));
        let fields: Vec<&str> = reply.split(' ').collect();
        assert_eq!(fields.len(), 5, "an I reply keeps its five fields: {reply:?}");
        assert_eq!(fields[..2], ["I", key], "{reply:?}");
        let token = (fields[2] != "-").then(|| fields[2].parse().expect("a token"));
        (token, fields[3].parse().expect("the lease left"), fields[4].parse().expect("the waiters"))
    }

    pub fn acquire(&mut self, key: &str, lease: &str, wait: &str) -> u64 {
        let reply = self.call(&format!("A {key} {lease} {wait}"));
        token_of(&reply, key)
    }

    /// True once the server has closed the connection (reads give end of file).
    pub fn closed_by_server(&mut self) -> bool {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if self.try_line(Duration::from_millis(200)).is_none() {
                let mut byte = [0u8; 1];
                self.stream.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
                match self.stream.read(&mut byte) {
                    Ok(0) => return true,
                    Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => return true,
                    Ok(_) => self.buffer.push(byte[0]),
                    Err(_) => {}
                }
            }
            if Instant::now() > deadline {
                return false;
            }
        }
    }
}

/// The token of an `A <key> <token>` reply.
pub fn token_of(reply: &str, key: &str) -> u64 {
    let fields: Vec<&str> = reply.split(' ').collect();
    assert!(fields.len() == 3 && fields[0] == "A" && fields[1] == key, "expected a grant of {key}, got {reply:?}");
    fields[2].parse().expect("a decimal token")
}

/// Polls `done` until it holds; fails the test after [`PATIENCE`].
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A field of the `S` reply's total counters.
pub fn stat(conn: &mut Conn, name: &str) -> u64 {
    let reply = conn.call("S");
    let json = reply.strip_prefix("S ").expect("an S reply");
    let total = &json[json.find("\"total\":").expect("total")..];
    let needle = format!("\"{name}\":");
    let at = total.find(&needle).unwrap_or_else(|| panic!("no {name} in {json}")) + needle.len();
    total[at..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

/// A `--peer-secret-file` in a directory of its own, removed when dropped.
pub struct SecretFile {
    _dir: DataDir,
    pub path: PathBuf,
}

impl SecretFile {
    /// A file holding `contents`, readable by its owner only.
    pub fn new(contents: &[u8]) -> SecretFile {
        SecretFile::with_mode(contents, 0o600)
    }

    /// A file holding `contents` with the permission bits `mode`.
    pub fn with_mode(contents: &[u8], mode: u32) -> SecretFile {
        use std::os::unix::fs::PermissionsExt;
        let dir = DataDir::new();
        std::fs::create_dir_all(&dir.0).unwrap();
        let path = dir.0.join("peer-secret");
        std::fs::write(&path, contents).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        SecretFile { _dir: dir, path }
    }

    pub fn arg(&self) -> &str {
        self.path.to_str().expect("a UTF-8 temporary path")
    }
}

/// The metrics address a server logged at start-up (`--metrics-listen`).
pub fn metrics_address(server: &Server) -> SocketAddr {
    let mut found = None;
    wait_until("the metrics endpoint's log line", || {
        found = server
            .log()
            .lines()
            .find_map(|line| line.split("serving /metrics, /livez and /readyz on ").nth(1))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|address| address.parse().ok());
        found.is_some()
    });
    found.unwrap()
}

/// One HTTP GET: the status code and the body.
pub fn http_get(address: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(address).expect("connect to the metrics endpoint");
    write!(stream, "GET {path} HTTP/1.1\r\nHost: ringlock\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.split(' ').nth(1).and_then(|code| code.parse().ok()).expect("a status code");
    let body = response.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default();
    (status, body)
}

/// Every sample of a `/metrics` scrape, by its name and labels as written.
pub fn scrape(address: SocketAddr) -> std::collections::HashMap<String, f64> {
    let (status, body) = http_get(address, "/metrics");
    assert_eq!(status, 200, "{body}");
    body.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("a sample line");
            (series.to_string(), value.parse().unwrap_or_else(|_| panic!("a number in {line:?}")))
        })
        .collect()
}

/// A loopback port that refuses connections for as long as the returned
/// socket lives: bound but not listening, so no other test's server can take
/// the port meanwhile (as it could a port merely freed).
pub struct RefusingPort {
    socket: std::os::fd::OwnedFd,
    pub addr: SocketAddr,
}

impl RefusingPort {
    pub fn new() -> RefusingPort {
        use std::os::fd::FromRawFd;
        // SAFETY: plain socket calls on a descriptor owned here; the address
        // structures are zeroed and sized as the calls expect.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
            let socket = std::os::fd::OwnedFd::from_raw_fd(fd);
            let mut address: libc::sockaddr_in = std::mem::zeroed();
            address.sin_family = libc::AF_INET as libc::sa_family_t;
            address.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
            let size = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            let bound = libc::bind(fd, (&raw const address).cast(), size);
            assert_eq!(bound, 0, "bind: {}", std::io::Error::last_os_error());
            let mut length = size;
            let named = libc::getsockname(fd, (&raw mut address).cast(), &mut length);
            assert_eq!(named, 0, "getsockname: {}", std::io::Error::last_os_error());
            let port = u16::from_be(address.sin_port);
            RefusingPort { socket, addr: SocketAddr::from(([127, 0, 0, 1], port)) }
        }
    }
}

impl std::fmt::Debug for RefusingPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RefusingPort({}, {:?})", self.addr, self.socket)
    }
}

/// Runs `command` (the ringlock binary, stderr piped) until it exits; one
/// still running after [`PATIENCE`] is killed and fails the test. Returns
/// its exit status and what it printed on stderr.
pub fn run_to_exit(mut command: Command, what: &str) -> (ExitStatus, String) {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the ringlock binary");
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + PATIENCE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {PATIENCE:?}:\n{}", reader.join().unwrap());
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    (status, reader.join().unwrap())
}

/// Wakes the thread that parked waiting for a future.
struct Unpark(std::thread::Thread);

impl std::task::Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// A waker that unparks this thread.
pub fn waker() -> std::task::Waker {
    std::task::Waker::from(Arc::new(Unpark(std::thread::current())))
}

/// Drives one future to completion on this thread.
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let waker = waker();
    let mut cx = std::task::Context::from_waker(&waker);
    loop {
        match future.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(output) => return output,
            std::task::Poll::Pending => std::thread::park(),
        }
    }
}

/// A Rust client of the single server `server`.
pub fn client_of(server: &Server) -> ringlock_client::Client {
    ringlock_client::Client::connect([server.addr.to_string()]).unwrap()
}
