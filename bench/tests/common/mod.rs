//! Test support: real server processes for `ringlock-bench` to drive, and
//! running it.
//!
//! The ringlock binary is the one cargo built beside `ringlock-bench`
//! (`cargo test --workspace` and scripts/test.sh build both), or the one
//! `RINGLOCK_BIN` names.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

pub const BENCH: &str = env!("CARGO_BIN_EXE_ringlock-bench");
/// How long a server may take to say where it listens.
const START_PATIENCE: Duration = Duration::from_secs(20);

/// A server process, killed when dropped.
pub struct ServerProcess {
    child: Child,
    pub addr: String,
    _data_dir: Option<TempDir>,
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct TempDir(pub PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts `command` and waits for its `listening on <addr>` line on stderr.
fn start(mut command: Command, data_dir: Option<TempDir>) -> ServerProcess {
    command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).env_remove("RUST_LOG");
    let mut child = command.spawn().unwrap_or_else(|error| panic!("cannot start {command:?}: {error}"));
    let stderr = child.stderr.take().expect("piped stderr");
    let (sender, address) = mpsc::channel();
    std::thread::spawn(move || {
        let mut sender = Some(sender);
        // Read to the end, so the server never blocks on a full pipe.
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some(rest) = line.split("listening on ").nth(1)
                && let Some(sender) = sender.take()
            {
                let addr = rest.split(|c: char| c == ';' || c.is_whitespace()).next().unwrap_or("");
                let _ = sender.send(addr.to_string());
            }
        }
    });
    match address.recv_timeout(START_PATIENCE) {
        Ok(addr) => ServerProcess { child, addr, _data_dir: data_dir },
        Err(_) => {
            let _ = child.kill();
            panic!("{command:?} did not say where it listens");
        }
    }
}

pub fn echo_server() -> ServerProcess {
    let mut command = Command::new(BENCH);
    command.args(["echo-server", "--listen", "127.0.0.1:0", "--poll-us", "0"]);
    start(command, None)
}

/// A ringlock server on one shard with `extra` flags.
pub fn ringlock_server(extra: &[&str]) -> ServerProcess {
    let binary = std::env::var_os("RINGLOCK_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(BENCH).parent().expect("the bench binary's folder").join("ringlock"));
    assert!(
        binary.exists(),
        "{} is missing: build it first (cargo build -p ringlock, or test with --workspace), or set RINGLOCK_BIN",
        binary.display()
    );
    let data_dir = temp_dir("data");
    std::fs::create_dir_all(&data_dir).expect("a data directory");
    let mut command = Command::new(binary);
    command.args(["--listen", "127.0.0.1:0", "--shards", "1", "--no-pin", "--data-dir"]).arg(&data_dir).args(extra);
    start(command, Some(TempDir(data_dir)))
}

/// Runs `ringlock-bench run --json` with `args` and returns its report.
pub fn run(args: &[&str]) -> Value {
    let output = Command::new(BENCH).arg("run").args(args).arg("--json").output().expect("run ringlock-bench");
    assert!(
        output.status.success(),
        "ringlock-bench run {args:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("one JSON report on stdout")
}

static NEXT_DIR: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A fresh folder in the temporary directory, of this process only.
pub fn temp_dir(what: &str) -> PathBuf {
    let n = NEXT_DIR.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let path = std::env::temp_dir().join(format!("ringlock-bench-test-{what}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    std::fs::create_dir_all(&path).expect("a temporary folder");
    path
}

/// Runs `ringlock-bench <command> --json` with `args` and returns its report.
pub fn run_command(command: &str, args: &[&str]) -> Value {
    let output = Command::new(BENCH).arg(command).args(args).arg("--json").output().expect("run ringlock-bench");
    assert!(
        output.status.success(),
        "ringlock-bench {command} {args:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("one JSON report on stdout")
}
