//! `ringlock-cli`: ringlock from the shell, for operators and scripts.
//!
//! `ping`, `stats` and `inspect` look at the nodes; `acquire` and `release`
//! hold a lock across commands of a script; `run` holds a lock while one
//! command runs, as a cluster-wide `flock` for cron jobs: it auto-extends
//! the lease, passes the fencing token to the command in `RINGLOCK_TOKEN`,
//! stops the command if the lock is lost, releases when the command ends
//! (however it ends) and exits with the command's status.
//!
//! With several clusters (`--cluster NAME=HOST:PORT,...`, repeated), each
//! key command goes to the key's cluster, chosen as every client chooses it
//! (docs/protocol.md §4, "Several clusters"), and `ping` and `stats` ask
//! every node of every cluster.

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use ringlock_client::proto::parse_seconds_ms;
use ringlock_client::{Client, ClientBuilder, Error, Lock, ReleaseOutcome, cluster_for};

/// Exit status when the lock was not obtained within `--wait` (sysexits'
/// EX_TEMPFAIL: "try again later", which cron wrappers know).
const EXIT_NOT_ACQUIRED: u8 = 75;
/// Exit status of `release` when the grant was no longer held.
const EXIT_NOT_HELD: u8 = 4;
/// Exit status for an error of the tool itself (unreachable servers...).
const EXIT_ERROR: u8 = 1;
/// Exit status of `run` when the lock was lost while the command ran.
const EXIT_LOST: u8 = 3;
/// How long `run` lets the command end after SIGTERM, on a second SIGINT,
/// before it sends SIGKILL.
const KILL_GRACE: Duration = Duration::from_secs(1);

#[derive(Parser, Debug)]
#[command(
    name = "ringlock-cli",
    version,
    about = "Talk to ringlock nodes from the shell: ping, stats, inspect, and locks for scripts"
)]
struct Cli {
    /// The nodes' client addresses, comma-separated, in any order (like the
    /// clients: requests go to the active, found through `M` replies).
    #[arg(long, env = "RINGLOCK_SERVERS", default_value = "127.0.0.1:7700", value_delimiter = ',', global = true)]
    servers: Vec<String>,

    /// One of several independent clusters, as NAME=HOST:PORT[,HOST:PORT...]
    /// (its name, then its nodes' client addresses); repeat it for each
    /// cluster, instead of --servers. A key command (inspect, acquire,
    /// release, run) goes to the key's cluster, chosen from the names as
    /// every ringlock client chooses it (docs/protocol.md §4, "Several
    /// clusters"), so give the same names as the applications do; ping and
    /// stats ask every node of every cluster, each line labelled with its
    /// cluster's name. RINGLOCK_SERVERS is ignored with --cluster.
    #[arg(long = "cluster", value_name = "NAME=HOST:PORT[,HOST:PORT...]", value_parser = cluster, global = true)]
    clusters: Vec<NamedCluster>,

    /// How long, in seconds, a request with no limit of its own (ping,
    /// stats, inspect, an acquire without --wait or with --wait 0) waits for
    /// a node to be reachable before the tool gives up.
    #[arg(long, env = "RINGLOCK_CONNECT_LIMIT", default_value = "10", value_parser = seconds, global = true)]
    connect_limit: Duration,

    /// The secret to authenticate with, for servers started with
    /// --auth-file. Without it, the secret is taken from the environment
    /// variable RINGLOCK_SECRET if it is set and not empty; prefer that: a
    /// secret on the command line shows in shell history and to anyone who
    /// can list the host's processes.
    // The client library reads RINGLOCK_SECRET itself, so that the tool
    // treats it exactly as every client does (an empty value is no secret).
    #[arg(long, value_parser = secret, global = true)]
    secret: Option<Secret>,

    /// Speak TLS to the nodes, checking their certificates against the CA
    /// certificates of this PEM file (the CA that signed the servers'
    /// --tls-cert). Without it the tool speaks plain TCP.
    #[arg(long, env = "RINGLOCK_TLS_CA", global = true)]
    tls_ca: Option<PathBuf>,

    /// The client certificate (PEM) for servers started with
    /// --tls-client-ca (mutual TLS); needs --tls-key and --tls-ca.
    #[arg(long, env = "RINGLOCK_TLS_CERT", global = true, requires = "tls_key")]
    tls_cert: Option<PathBuf>,

    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "RINGLOCK_TLS_KEY", global = true, requires = "tls_cert")]
    tls_key: Option<PathBuf>,

    /// The name the servers' certificates must carry. Default: the host
    /// part of each address of --servers or --cluster (an IP address is checked against
    /// the certificate's IP addresses).
    #[arg(long, env = "RINGLOCK_TLS_SERVER_NAME", global = true)]
    tls_server_name: Option<String>,

    #[command(subcommand)]
    command: Action,
}

#[derive(Subcommand, Debug)]
enum Action {
    /// Each node's role, epoch and the active it names.
    Ping,
    /// Each node's counters and gauges (the `S` reply), indented.
    Stats {
        /// Print the JSON on one line, as the server sends it.
        #[arg(long)]
        raw: bool,
    },
    /// Who holds KEY, the lease it has left, and how many wait for it.
    Inspect { key: String },
    /// Acquire KEY and print the token; the lock stays held after the tool
    /// exits, until `release` or the lease ends. Exits 75 if not granted
    /// within --wait.
    Acquire {
        key: String,
        /// Lease in seconds (decimal, up to 3 fractional digits).
        #[arg(long, value_parser = seconds)]
        lease: Duration,
        /// Longest wait in seconds; 0 tries once. Default: no limit.
        #[arg(long, value_parser = seconds)]
        wait: Option<Duration>,
    },
    /// Release KEY's grant with TOKEN. Exits 4 if it was no longer held.
    Release { key: String, token: u64 },
    /// Make the server running on this host from --data-dir re-read its
    /// auth file and certificates, as SIGHUP does (the process id is in the
    /// data directory's `lock` file). With --metrics, the server's
    /// --metrics-listen address, wait for the outcome: exits 0 if every
    /// reload succeeded, 1 if one was refused (the files in force stay; the
    /// server's log says why) or none was counted within 5 s.
    Reload {
        /// The server's --data-dir.
        #[arg(long)]
        data_dir: PathBuf,
        /// The server's --metrics-listen address (host:port), to report the outcome.
        #[arg(long)]
        metrics: Option<String>,
    },
    /// Hold KEY while COMMAND runs: the lease is auto-extended every third
    /// of it, COMMAND gets the fencing token in RINGLOCK_TOKEN (and the key
    /// in RINGLOCK_KEY), the lock is released when it ends, and its exit
    /// status is returned. Exits 75 without running COMMAND if the lock is
    /// not granted within --wait.
    ///
    /// SIGINT, SIGTERM and SIGHUP are passed on to COMMAND, and the tool
    /// waits for it to end. A second SIGINT (Ctrl+C again) during that wait
    /// escalates: COMMAND gets SIGTERM at once and SIGKILL 1 s later if it
    /// is still running.
    ///
    /// If the lock is lost while COMMAND runs (the server answers that the
    /// token no longer holds the key, say after a server restart, or the
    /// lease ran out with no extend confirmed), COMMAND gets SIGTERM and
    /// the tool exits 3 once it has ended.
    Run {
        /// The key to hold, the same for every host that runs the job.
        #[arg(long)]
        key: String,
        /// Lease in seconds; auto-extended every third of it while COMMAND
        /// runs, so it only bounds how long the key stays held after this
        /// host dies.
        #[arg(long, value_parser = seconds, default_value = "30")]
        lease: Duration,
        /// Longest wait for the lock in seconds; 0 tries once. Default: no limit.
        #[arg(long, value_parser = seconds)]
        wait: Option<Duration>,
        /// The command and its arguments, after `--`.
        #[arg(required = true, last = true)]
        command: Vec<String>,
    },
}

/// A secret from `--secret` or `RINGLOCK_SECRET`; its `Debug` hides it.
#[derive(Clone)]
struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

fn secret(text: &str) -> Result<Secret, String> {
    Ok(Secret(text.to_string()))
}

/// A `--cluster`: its name and its nodes' addresses.
#[derive(Clone, Debug)]
struct NamedCluster {
    name: String,
    servers: Vec<String>,
}

fn cluster(text: &str) -> Result<NamedCluster, String> {
    let shape = || format!("expected NAME=HOST:PORT[,HOST:PORT...], not {text:?}");
    let (name, servers) = text.split_once('=').ok_or_else(shape)?;
    let servers: Vec<String> = servers.split(',').map(str::to_string).collect();
    if name.is_empty() || servers.iter().any(String::is_empty) {
        return Err(shape());
    }
    Ok(NamedCluster { name: name.to_string(), servers })
}

/// Where requests go: the nodes of one cluster, or several named clusters.
enum Place {
    Servers(Vec<String>),
    Clusters(Vec<NamedCluster>),
}

impl Place {
    fn new(servers: Vec<String>, clusters: Vec<NamedCluster>) -> Result<Place, String> {
        if clusters.is_empty() {
            return Ok(Place::Servers(servers));
        }
        let mut names: Vec<&str> = clusters.iter().map(|cluster| cluster.name.as_str()).collect();
        names.sort_unstable();
        if let Some(pair) = names.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(format!("the cluster {:?} is given twice; each --cluster needs a name of its own", pair[0]));
        }
        Ok(Place::Clusters(clusters))
    }

    /// The nodes `key`'s requests go to, and how to name them in an error.
    fn for_key(&self, key: &str) -> (Vec<String>, String) {
        match self {
            Place::Servers(servers) => (servers.clone(), format!("--servers {}", servers.join(","))),
            Place::Clusters(clusters) => {
                let names: Vec<&str> = clusters.iter().map(|cluster| cluster.name.as_str()).collect();
                let name = cluster_for(&names, key).expect("at least one --cluster");
                let chosen = clusters.iter().find(|cluster| cluster.name == name).expect("a name of the list");
                (chosen.servers.clone(), format!("--cluster {name}={}", chosen.servers.join(",")))
            }
        }
    }

    /// Every node, each with the label its lines start with (its address,
    /// after its cluster's name with several clusters) and how to name it
    /// in an error.
    fn nodes(&self) -> Vec<Node> {
        match self {
            Place::Servers(servers) => servers
                .iter()
                .map(|address| Node {
                    label: address.clone(),
                    address: address.clone(),
                    named: format!("--servers {address}"),
                })
                .collect(),
            Place::Clusters(clusters) => clusters
                .iter()
                .flat_map(|cluster| {
                    cluster.servers.iter().map(|address| Node {
                        label: format!("{} {address}", cluster.name),
                        address: address.clone(),
                        named: format!("--cluster {}={address}", cluster.name),
                    })
                })
                .collect(),
        }
    }
}

/// One node that `ping` and `stats` ask on its own.
struct Node {
    label: String,
    address: String,
    named: String,
}

/// What every client the tool makes is built with.
struct Settings {
    connect_limit: Duration,
    secret: Option<Secret>,
    tls_ca: Option<PathBuf>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_server_name: Option<String>,
}

fn seconds(text: &str) -> Result<Duration, String> {
    parse_seconds_ms(text.as_bytes())
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is not decimal seconds (digits, optionally `.` and 1 to 3 digits)"))
}

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    // --servers from the environment gives way to --cluster; both on the
    // command line is a mistake.
    if !cli.clusters.is_empty() && matches.value_source("servers") == Some(ValueSource::CommandLine) {
        eprintln!("ringlock-cli: --cluster cannot be used with --servers: give each cluster's nodes in its --cluster");
        return ExitCode::from(EXIT_ERROR);
    }
    match run(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("ringlock-cli: {error}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

fn connect(servers: &[String], settings: &Settings, place: &str) -> Result<Client, String> {
    let mut builder = ClientBuilder::new(servers.iter().map(String::as_str)).connect_limit(settings.connect_limit);
    if let Some(Secret(secret)) = &settings.secret {
        builder = builder.secret(secret.as_str());
    }
    if let Some(ca) = &settings.tls_ca {
        builder = builder.tls_ca(ca);
    }
    if let (Some(cert), Some(key)) = (&settings.tls_cert, &settings.tls_key) {
        builder = builder.tls_cert(cert).tls_key(key);
    }
    if let Some(name) = &settings.tls_server_name {
        builder = builder.tls_server_name(name);
    }
    builder.connect().map_err(|error| format!("cannot use {place}: {error}"))
}

/// What an error of the client means for the operator.
fn explain(place: &str, error: Error) -> String {
    match error {
        error @ Error::NoConnection { .. } => {
            format!("{error}; is ringlock running at {place}?")
        }
        error @ Error::Auth { .. } => {
            format!("{error}; check --secret or RINGLOCK_SECRET against the server's auth file")
        }
        error @ Error::Tls { .. } => {
            format!(
                "{error}; check --tls-ca (and --tls-cert/--tls-key, --tls-server-name) against the servers' TLS files"
            )
        }
        Error::NoActive => {
            "the nodes know no active node yet (a cluster starting or failing over); try again".to_string()
        }
        other => other.to_string(),
    }
}

fn run(cli: Cli) -> Result<ExitCode, String> {
    let place = Place::new(cli.servers, cli.clusters)?;
    let nodes = place.nodes();
    let limit = &Settings {
        connect_limit: cli.connect_limit,
        secret: cli.secret,
        tls_ca: cli.tls_ca,
        tls_cert: cli.tls_cert,
        tls_key: cli.tls_key,
        tls_server_name: cli.tls_server_name,
    };
    match cli.command {
        Action::Ping => per_node(&nodes, limit, |label, client| {
            let pong = client.ping()?;
            println!("{label} {} {} {}", pong.role, pong.epoch, pong.active.as_deref().unwrap_or("-"));
            Ok(())
        }),
        Action::Stats { raw } => per_node(&nodes, limit, |label, client| {
            let json = client.stats()?;
            if nodes.len() > 1 || matches!(place, Place::Clusters(_)) {
                println!("# {label}");
            }
            println!("{}", if raw { json } else { indent_json(&json) });
            Ok(())
        }),
        Action::Reload { data_dir, metrics } => reload(&data_dir, metrics.as_deref()),
        Action::Inspect { key } => {
            let (servers, named) = place.for_key(&key);
            let client = connect(&servers, limit, &named)?;
            let state = client.inspect(&key).map_err(|error| explain(&named, error))?;
            match state.token {
                Some(token) => println!(
                    "{key} held token={token} lease_left={:.3}s waiters={}",
                    state.lease_left.as_secs_f64(),
                    state.waiters
                ),
                None => println!("{key} free waiters={}", state.waiters),
            }
            Ok(ExitCode::SUCCESS)
        }
        Action::Acquire { key, lease, wait } => {
            let (servers, named) = place.for_key(&key);
            let client = connect(&servers, limit, &named)?;
            match acquire(&client, &key, lease, wait).map_err(|error| explain(&named, error))? {
                Some(lock) => {
                    println!("{}", lock.detach());
                    Ok(ExitCode::SUCCESS)
                }
                None => {
                    eprintln!("ringlock-cli: {key} was not granted within --wait");
                    Ok(ExitCode::from(EXIT_NOT_ACQUIRED))
                }
            }
        }
        Action::Release { key, token } => {
            let (servers, named) = place.for_key(&key);
            let client = connect(&servers, limit, &named)?;
            match client.release(&key, token).map_err(|error| explain(&named, error))? {
                ReleaseOutcome::Released => Ok(ExitCode::SUCCESS),
                ReleaseOutcome::NotHeld => {
                    eprintln!("ringlock-cli: {key} was not held by token {token} (released, expired or handed on)");
                    Ok(ExitCode::from(EXIT_NOT_HELD))
                }
            }
        }
        Action::Run { key, lease, wait, command } => {
            let (servers, named) = place.for_key(&key);
            run_holding(&servers, &named, limit, &key, lease, wait, &command)
        }
    }
}

/// `--wait 0` tries once, as the client's `Some(Duration::ZERO)` does.
fn acquire(client: &Client, key: &str, lease: Duration, wait: Option<Duration>) -> Result<Option<Lock>, Error> {
    client.acquire(key, lease, wait)
}

/// Runs `action` against each node on its own, so that every node answers
/// for itself (a client of several nodes would ask any one of them). Each
/// node comes with the label its lines start with.
fn per_node(
    nodes: &[Node],
    limit: &Settings,
    action: impl Fn(&str, &Client) -> Result<(), Error>,
) -> Result<ExitCode, String> {
    let mut failed = 0;
    for Node { label, address, named } in nodes {
        let client = connect(std::slice::from_ref(address), limit, named)?;
        if let Err(error) = action(label, &client) {
            eprintln!("ringlock-cli: {label}: {}", explain(named, error));
            failed += 1;
        }
    }
    if failed == nodes.len() { Ok(ExitCode::from(EXIT_ERROR)) } else { Ok(ExitCode::SUCCESS) }
}

/// `run`: see [`Action::Run`].
/// The reload counters of a server's /metrics: (what, ok, failed) for the
/// auth file, the client port's TLS files and the peer TLS files.
fn reload_counts(metrics: &str) -> Result<Vec<(&'static str, f64, f64)>, String> {
    use std::io::{Read, Write};
    let mut stream =
        std::net::TcpStream::connect(metrics).map_err(|error| format!("cannot reach --metrics {metrics}: {error}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).map_err(|error| error.to_string())?;
    stream
        .write_all(format!("GET /metrics HTTP/1.1\r\nHost: {metrics}\r\nConnection: close\r\n\r\n").as_bytes())
        .map_err(|error| format!("cannot ask {metrics} for /metrics: {error}"))?;
    let mut body = String::new();
    stream.read_to_string(&mut body).map_err(|error| format!("cannot read /metrics from {metrics}: {error}"))?;
    let value = |name: &str, result: &str| {
        let prefix = format!("{name}{{result=\"{result}\"}} ");
        body.lines().find_map(|line| line.strip_prefix(&prefix)).and_then(|v| v.trim().parse().ok()).unwrap_or(0.0)
    };
    Ok([
        ("the auth file", "ringlock_auth_reloads_total"),
        ("the client port's TLS files", "ringlock_tls_reloads_total"),
        ("the peer TLS files", "ringlock_peer_tls_reloads_total"),
    ]
    .into_iter()
    .map(|(what, name)| (what, value(name, "ok"), value(name, "failed")))
    .collect())
}

/// `reload`: SIGHUP to the server of `data_dir`, and with `metrics` its outcome.
fn reload(data_dir: &std::path::Path, metrics: Option<&str>) -> Result<ExitCode, String> {
    use std::os::fd::AsRawFd;
    let path = data_dir.join("lock");
    let file = std::fs::File::open(&path)
        .map_err(|error| format!("cannot read {}: {error}; is --data-dir the server's?", path.display()))?;
    // SAFETY: flock on a descriptor we own; taking it means no server holds it.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Err(format!("no ringlock server runs from {} (its lock is free)", data_dir.display()));
    }
    let text = std::fs::read_to_string(&path).map_err(|error| format!("cannot read {}: {error}", path.display()))?;
    let pid: i32 = text.trim().parse().map_err(|_| {
        format!(
            "{} names no process ({:?}); a server older than this tool? send it SIGHUP yourself",
            path.display(),
            text.trim()
        )
    })?;
    let before = metrics.map(reload_counts).transpose()?;
    // SAFETY: sending a signal to a process id.
    if unsafe { libc::kill(pid, libc::SIGHUP) } != 0 {
        return Err(format!("cannot signal process {pid}: {}", std::io::Error::last_os_error()));
    }
    let (Some(metrics), Some(before)) = (metrics, before) else {
        println!("SIGHUP sent to process {pid}; its log and /metrics say whether the files were taken");
        return Ok(ExitCode::SUCCESS);
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let after = reload_counts(metrics)?;
        let changed: Vec<_> = before
            .iter()
            .zip(&after)
            .filter(|((_, ok, failed), (_, ok_now, failed_now))| ok_now > ok || failed_now > failed)
            .map(|((what, _, failed), (_, _, failed_now))| (*what, failed_now > failed))
            .collect();
        if !changed.is_empty() {
            for (what, refused) in &changed {
                if *refused {
                    println!("{what}: refused; the ones in force stay (the server's log says why)");
                } else {
                    println!("{what}: reloaded");
                }
            }
            let refused = changed.iter().any(|(_, refused)| *refused);
            return Ok(if refused { ExitCode::from(EXIT_ERROR) } else { ExitCode::SUCCESS });
        }
        if std::time::Instant::now() > deadline {
            return Err(format!(
                "process {pid} counted no reload within 5 s: it may have nothing to reload (no --auth-file, \
                 --tls-cert or --peer-tls-cert), or is not the server of --metrics {metrics}"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn run_holding(
    servers: &[String],
    named: &str,
    limit: &Settings,
    key: &str,
    lease: Duration,
    wait: Option<Duration>,
    command: &[String],
) -> Result<ExitCode, String> {
    // Signals wait in this process's mask from now on: a Ctrl+C or a
    // SIGTERM from cron goes to the command, and this process stays to
    // release the lock once the command has ended.
    let signals = block_stop_signals();
    let client = connect(servers, limit, named)?;
    let Some(lock) = acquire(&client, key, lease, wait).map_err(|error| explain(named, error))? else {
        eprintln!("ringlock-cli: {key} was not granted within --wait; {} not run", command[0]);
        return Ok(ExitCode::from(EXIT_NOT_ACQUIRED));
    };
    let mut child = match spawn_command(command, key, lock.token()) {
        Ok(child) => child,
        Err(error) => {
            let _ = lock.release();
            return Err(format!("cannot run {:?}: {error}", command[0]));
        }
    };
    let pid = child.id() as i32;
    let done = Mutex::new(false);
    let lost = Arc::new(AtomicBool::new(false));
    let (flag, key_text, program) = (lost.clone(), key.to_string(), command[0].clone());
    // Runs on a client thread: quick, and it does not block.
    lock.on_lost(move || {
        eprintln!("ringlock-cli: lost the lock on {key_text} (not held any more, or its lease ran out unextended): stopping {program}");
        flag.store(true, Ordering::SeqCst);
        // SAFETY: signalling the command this process started.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    });
    lock.auto_extend();
    std::thread::scope(|scope| {
        // Passes stop signals on to the command.
        scope.spawn(|| forward_signals(&signals, pid, &done));
        let status = child.wait();
        *done.lock().unwrap() = true;
        // Wakes the signal thread, which checks `done` between waits.
        // SAFETY: sending a signal this process has blocked to itself.
        unsafe { libc::kill(std::process::id() as i32, libc::SIGUSR1) };
        status
    })
    .map_err(|error| format!("cannot wait for {:?}: {error}", command[0]))
    .map(|status| {
        let lost = lost.load(Ordering::SeqCst) || lock.is_lost();
        release_after(lock, lost, key, &command[0]);
        if lost { ExitCode::from(EXIT_LOST) } else { exit_code_of(status) }
    })
}

/// Starts the command with the lock's token and key in its environment.
fn spawn_command(command: &[String], key: &str, token: u64) -> std::io::Result<std::process::Child> {
    let mut builder = Command::new(&command[0]);
    builder.args(&command[1..]).env("RINGLOCK_TOKEN", token.to_string()).env("RINGLOCK_KEY", key);
    // SAFETY: only async-signal-safe calls between fork and exec:
    // the command starts with no signal blocked, as a shell would run it.
    unsafe {
        use std::os::unix::process::CommandExt;
        builder.pre_exec(|| {
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            Ok(())
        });
    }
    builder.spawn()
}

/// Releases the lock once the command ended, and says so if it was lost
/// without this process knowing.
fn release_after(lock: Lock, lost: bool, key: &str, program: &str) {
    match lock.release() {
        Ok(ReleaseOutcome::Released) => {}
        Ok(ReleaseOutcome::NotHeld) if lost => {}
        Ok(ReleaseOutcome::NotHeld) => {
            eprintln!("ringlock-cli: {key} was no longer held when {program} ended (its lease ran out)")
        }
        Err(error) => eprintln!("ringlock-cli: cannot release {key}: {error}; its lease will free it"),
    }
}

/// The command's exit code, or 128 plus the signal that ended it, as a shell says.
fn exit_code_of(status: std::process::ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    let code = match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => i32::from(EXIT_ERROR),
    };
    ExitCode::from(u8::try_from(code).unwrap_or(EXIT_ERROR))
}

/// Blocks SIGINT, SIGTERM, SIGHUP and SIGUSR1 in this thread (and so in the
/// threads it starts) and returns the set, for [`forward_signals`].
fn block_stop_signals() -> libc::sigset_t {
    // SAFETY: building a signal set and changing this thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGUSR1] {
            libc::sigaddset(&mut set, signal);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Sends each stop signal this process receives to the command, until it
/// has ended (SIGUSR1 from the main thread says so). A second SIGINT
/// escalates: SIGTERM now, SIGKILL after [`KILL_GRACE`].
fn forward_signals(signals: &libc::sigset_t, pid: i32, done: &Mutex<bool>) {
    let mut interrupts = 0;
    let mut kill_at: Option<std::time::Instant> = None;
    loop {
        let signal = match kill_at {
            None => {
                let mut signal: libc::c_int = 0;
                // SAFETY: waiting for signals this process has blocked.
                if unsafe { libc::sigwait(signals, &mut signal) } != 0 {
                    return;
                }
                Some(signal)
            }
            Some(at) => {
                let left = at.saturating_duration_since(std::time::Instant::now());
                let timeout =
                    libc::timespec { tv_sec: left.as_secs() as libc::time_t, tv_nsec: left.subsec_nanos().into() };
                // SAFETY: waiting for signals this process has blocked, with a timeout.
                let signal = unsafe { libc::sigtimedwait(signals, std::ptr::null_mut(), &timeout) };
                (signal > 0).then_some(signal)
            }
        };
        if *done.lock().unwrap() {
            return;
        }
        match signal {
            None if kill_at.is_some_and(|at| std::time::Instant::now() < at) => {}
            None => {
                // The grace ran out and the command still runs.
                // SAFETY: signalling the command this process started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                kill_at = None;
            }
            Some(libc::SIGUSR1) => {}
            Some(libc::SIGINT) if interrupts >= 1 => {
                eprintln!("ringlock-cli: second interrupt: SIGTERM now, SIGKILL in {} s", KILL_GRACE.as_secs());
                // SAFETY: signalling the command this process started.
                unsafe { libc::kill(pid, libc::SIGTERM) };
                kill_at.get_or_insert_with(|| std::time::Instant::now() + KILL_GRACE);
            }
            Some(signal) => {
                interrupts += usize::from(signal == libc::SIGINT);
                // SAFETY: signalling the command this process started.
                unsafe { libc::kill(pid, signal) };
            }
        }
    }
}

/// Indents one line of JSON, two spaces a level, leaving strings untouched.
fn indent_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len() * 2);
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    let newline = |out: &mut String, depth: usize| {
        out.push('\n');
        out.extend(std::iter::repeat_n("  ", depth));
    };
    let mut characters = json.chars().peekable();
    while let Some(character) = characters.next() {
        if in_string {
            out.push(character);
            match (escaped, character) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match character {
            '"' => {
                in_string = true;
                out.push(character);
            }
            '{' | '[' => {
                out.push(character);
                // An empty object or list stays on its line.
                if matches!(characters.peek(), Some('}' | ']')) {
                    out.push(characters.next().unwrap_or_default());
                } else {
                    depth += 1;
                    newline(&mut out, depth);
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(character);
            }
            ',' => {
                out.push(character);
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            character => out.push(character),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_indented_and_strings_are_kept() {
        let json = r#"{"role":"active","keys":[],"hot":{"waits":[{"key":"a,{b}\"","count":2}]}}"#;
        let expected = "{\n  \"role\": \"active\",\n  \"keys\": [],\n  \"hot\": {\n    \"waits\": [\n      {\n        \
                        \"key\": \"a,{b}\\\"\",\n        \"count\": 2\n      }\n    ]\n  }\n}";
        assert_eq!(indent_json(json), expected);
    }

    #[test]
    fn seconds_follow_the_protocol() {
        assert_eq!(seconds("2.5"), Ok(Duration::from_millis(2500)));
        assert!(seconds("1e3").is_err());
    }
}
