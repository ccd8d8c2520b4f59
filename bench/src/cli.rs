//! Command-line flags of `ringlock-bench`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use ringlock_proto::parse_seconds_ms;

use crate::tls::TlsArgs;
use crate::worker::Workload;

/// Load generator for ringlock, for Redis used as a lock, and for a loopback
/// echo ceiling, all driven by the same client.
///
/// Each thread runs its own io_uring loop over its connections; each
/// connection keeps a fixed number of requests in flight (closed loop), or
/// with --rate sends on a timetable (open loop, up to --depth in flight), and
/// pairs replies with requests by (op, key) for ringlock, by order for Redis
/// and echo. Nothing is allocated per request.
#[derive(Parser, Debug)]
#[command(name = "ringlock-bench", version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Runs one workload against one server and prints what it measured.
    Run(RunArgs),
    /// Runs the echo server: one io_uring thread answering each request line
    /// with a fixed line as long as ringlock's reply to it (34 bytes to an
    /// `A`, 19 to an `R`, for 16-byte keys), without parsing it: the loopback
    /// ceiling for `run --target echo`. Prints `listening on <addr>` on stderr.
    EchoServer(EchoArgs),
    /// Opens connections one after the other, each with a full TLS handshake
    /// (with --tls-ca) and one ping round trip (`P`, or Redis's PING), then
    /// closes it; reports new connections per second and the server's CPU
    /// time per connection (with --server-pid).
    ConnectRate(ConnectRateArgs),
    /// Reads the JSON of several `run --json` results and prints them side by
    /// side with the ratios ringlock/echo and ringlock/redis.
    Report(ReportArgs),
}

/// The server under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    /// ringlock's line protocol: `A key lease wait`, `R key token`.
    Ringlock,
    /// Redis as a lock: acquire is `SET key token NX PX lease`, release the
    /// compare-and-delete script by EVALSHA (or `DEL` with --redis-release del).
    Redis,
    /// `ringlock-bench echo-server`: ringlock's request lines, each answered
    /// by one fixed line, for the ceiling of this client and this loopback.
    Echo,
}

impl Target {
    pub fn name(self) -> &'static str {
        match self {
            Target::Ringlock => "ringlock",
            Target::Redis => "redis",
            Target::Echo => "echo",
        }
    }
}

/// How the Redis target releases.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RedisReleaseArg {
    /// EVALSHA of the compare-and-delete script (loaded with SCRIPT LOAD
    /// first): deletes the key only if it still holds this acquire's token.
    Evalsha,
    /// Plain `DEL key`: cheaper, but unsafe as a lock (it may delete a lock
    /// that expired and was taken by someone else).
    Del,
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Server to drive.
    #[arg(long, value_enum, default_value = "ringlock")]
    pub target: Target,

    /// Server address.
    #[arg(long, default_value = "127.0.0.1:7700")]
    pub addr: SocketAddr,

    /// One of several independent clusters, as NAME=HOST:PORT: its name and
    /// the address of the node to drive (its active: the load generator
    /// follows no `M` redirect); repeat it for each cluster, instead of
    /// --addr. Each key's requests go to its cluster, chosen from the names
    /// as every ringlock client chooses it (docs/protocol.md §4, "Several
    /// clusters"): connection i goes to the i-th cluster (cycling, in the
    /// order given) and draws only keys of that cluster, so every request
    /// slot still has keys of its own.
    #[arg(long = "cluster", value_name = "NAME=HOST:PORT", value_parser = parse_cluster, conflicts_with = "addr")]
    pub clusters: Vec<ClusterArg>,

    /// Workload: `uncontended` (acquire then release random keys of
    /// --key-space), `contended` (--hot-keys keys shared by every lane:
    /// FIFO hand-offs and wait latency), `hold` (acquire --hold-keys
    /// distinct keys and keep them: server memory per held lock, with
    /// --server-pid).
    #[arg(long, value_enum, default_value = "uncontended")]
    pub workload: Workload,

    /// TCP connections, spread round-robin over --threads.
    #[arg(short = 'c', long, default_value_t = 16)]
    pub connections: usize,

    /// Requests in flight per connection (1 = no pipelining).
    #[arg(short = 'd', long, default_value_t = 64)]
    pub depth: usize,

    /// Measured time, in seconds (decimals allowed). For `hold`, the longest
    /// the fill may take.
    #[arg(long, default_value = "10", value_parser = parse_decimal)]
    pub duration: f64,

    /// Time run before measuring, in seconds, so connections, caches and
    /// the server's tables are warm; nothing of it is counted. Not used by `hold`.
    #[arg(long, default_value = "2", value_parser = parse_decimal)]
    pub warmup: f64,

    /// Distinct keys of `uncontended`; each request slot (connection x
    /// depth) draws at random from its own equal slice of them, so no two
    /// requests in flight share a key.
    #[arg(long, default_value_t = 10_000_000)]
    pub key_space: u64,

    /// Bytes per key: `k` and zero-padded digits.
    #[arg(long, default_value_t = 16)]
    pub key_len: usize,

    /// Hot keys of `contended`.
    #[arg(long, default_value_t = 16)]
    pub hot_keys: u64,

    /// Keys `hold` acquires and keeps, split over the connections.
    #[arg(long, default_value_t = 10_000_000)]
    pub hold_keys: u64,

    /// Lease of every acquire, in decimal seconds (Redis: PX).
    #[arg(long, default_value = "30", value_parser = parse_decimal)]
    pub lease: f64,

    /// Longest wait of every ringlock acquire, in decimal seconds (0 = no
    /// limit). Redis cannot wait: a busy key is retried after --retry-delay-ms.
    #[arg(long, default_value = "10", value_parser = parse_decimal)]
    pub wait: f64,

    /// Delay before an acquire that failed (Redis busy, or an error) is sent
    /// again, in milliseconds.
    #[arg(long, default_value = "1", value_parser = parse_decimal)]
    pub retry_delay_ms: f64,

    /// How Redis releases.
    #[arg(long, value_enum, default_value = "evalsha")]
    pub redis_release: RedisReleaseArg,

    /// Load-generator threads, each with its own io_uring loop.
    #[arg(short = 't', long, default_value_t = 1)]
    pub threads: usize,

    /// CPUs to pin the threads to, in order, such as `0` or `0,2-3`
    /// (thread i gets the i-th CPU, cycling). Default: not pinned.
    #[arg(long, value_parser = parse_cpu_list)]
    pub cpus: Option<CpuList>,

    /// Process id of the server, to report its CPU use over the measured
    /// time and its resident memory before and after (from /proc).
    #[arg(long)]
    pub server_pid: Option<u32>,

    /// After the measured time, how long requests still in flight may take
    /// to be answered (granted locks are released meanwhile), in seconds.
    #[arg(long, default_value = "3", value_parser = parse_decimal)]
    pub drain_timeout: f64,

    /// Microseconds each loop keeps polling for replies before it sleeps
    /// (default 0: it sleeps at once). A sleeping generator makes the server
    /// wake it from inside each send of replies, on the server's CPU, which
    /// a client on another host never costs it; polling spares the server
    /// that. It also makes the generator read replies in smaller batches,
    /// which lowers what it drives when it is the bottleneck (the echo
    /// target), so scripts/bench.sh leaves it off.
    #[arg(long, default_value_t = 0)]
    pub poll_us: u64,

    /// Open loop: lock operations (acquires plus releases) per second over
    /// every connection, sent on a fixed timetable whatever the replies do;
    /// such as 200000, 250k or 1.5M. Half of them are acquires, evenly
    /// spaced and dealt round-robin to the connections; each release
    /// follows its grant at once. Latency runs from each request's intended
    /// send time, so a request that waited (for one of the connection's
    /// --depth lanes, or for the generator) counts the wait. Without it the
    /// run is closed-loop: each lane sends as soon as its reply is back.
    #[arg(long, value_parser = crate::open_loop::parse_rate)]
    pub rate: Option<f64>,

    /// Open loop: a request sent later than this after its intended time,
    /// with a lane free for it, is late; more than 1 % late means the
    /// generator fell behind its schedule, in microseconds.
    #[arg(long, default_value_t = 200)]
    pub lag_tolerance_us: u64,

    /// A name for this run in reports, such as `pipelined-16x64`; runs of
    /// different targets with the same label are compared.
    #[arg(long)]
    pub label: Option<String>,

    /// Print the result as one JSON object instead of text.
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub security: TlsArgs,
}

#[derive(Args, Debug, Clone)]
pub struct ConnectRateArgs {
    /// Server to drive: ringlock or redis.
    #[arg(long, value_enum, default_value = "ringlock")]
    pub target: Target,

    /// Server address.
    #[arg(long, default_value = "127.0.0.1:7700")]
    pub addr: SocketAddr,

    /// Threads, each opening one connection at a time.
    #[arg(short = 't', long, default_value_t = 4)]
    pub threads: usize,

    /// CPUs to pin the threads to, as for `run`.
    #[arg(long, value_parser = parse_cpu_list)]
    pub cpus: Option<CpuList>,

    /// Measured time, in seconds.
    #[arg(long, default_value = "5", value_parser = parse_decimal)]
    pub duration: f64,

    /// Time run before measuring, in seconds.
    #[arg(long, default_value = "1", value_parser = parse_decimal)]
    pub warmup: f64,

    /// Process id of the server, to report its CPU time per connection.
    #[arg(long)]
    pub server_pid: Option<u32>,

    /// A name for this run in reports.
    #[arg(long)]
    pub label: Option<String>,

    /// Print the result as one JSON object instead of text.
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub security: TlsArgs,
}

#[derive(Args, Debug, Clone)]
pub struct EchoArgs {
    /// Address to listen on (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:7710")]
    pub listen: SocketAddr,

    /// CPU to pin the server thread to. Default: not pinned.
    #[arg(long)]
    pub cpu: Option<usize>,

    /// Microseconds the loop keeps polling for completions before it sleeps,
    /// as ringlock's shard loop does (30): a loop that is awake when the next
    /// requests arrive spares the load generator the wake-up. 0 sleeps at once.
    #[arg(long, default_value_t = 30)]
    pub poll_us: u64,
}

#[derive(Args, Debug, Clone)]
pub struct ReportArgs {
    /// JSON files written by `run --json`.
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,

    /// Where to write all runs and the comparisons as one JSON document.
    #[arg(long)]
    pub out: Option<PathBuf>,

    /// The command that produced the runs, recorded in --out.
    #[arg(long)]
    pub command: Option<String>,
}

/// A `--cluster`: its name and the address driven.
#[derive(Clone, Debug)]
pub struct ClusterArg {
    pub name: String,
    pub addr: SocketAddr,
}

fn parse_cluster(text: &str) -> Result<ClusterArg, String> {
    let shape = || format!("expected NAME=HOST:PORT, not {text:?}");
    let (name, addr) = text.split_once('=').ok_or_else(shape)?;
    if name.is_empty() {
        return Err(shape());
    }
    if addr.contains(',') {
        return Err(format!(
            "{text:?}: the load generator drives one node per cluster (it follows no M redirect): give its active's address"
        ));
    }
    let addr = addr.parse().map_err(|error| format!("{text:?}: {addr:?} is not an IP address and port: {error}"))?;
    Ok(ClusterArg { name: name.to_string(), addr })
}

fn parse_decimal(text: &str) -> Result<f64, String> {
    parse_seconds_ms(text.as_bytes())
        .map(|ms| ms as f64 / 1000.0)
        .ok_or_else(|| format!("expected a decimal number such as 10 or 0.5 (at most 3 decimals), not {text:?}"))
}

pub use ringlock_ring::{CpuList, parse_cpu_list};
