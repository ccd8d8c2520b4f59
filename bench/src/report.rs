//! What a run measured, as text or JSON, and the side-by-side report of
//! several runs with the ratios the issue asks for.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::cli::{ReportArgs, RunArgs, Target};
use crate::wire::ErrorKind;
use crate::worker::{WorkerStats, Workload};

/// Latency percentiles, in microseconds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Latency {
    pub count: u64,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl Latency {
    fn of(histogram: &Histogram<u64>) -> Latency {
        if histogram.is_empty() {
            return Latency::default();
        }
        let us = |ns: u64| ns as f64 / 1000.0;
        Latency {
            count: histogram.len(),
            mean: histogram.mean() / 1000.0,
            p50: us(histogram.value_at_quantile(0.50)),
            p90: us(histogram.value_at_quantile(0.90)),
            p99: us(histogram.value_at_quantile(0.99)),
            p999: us(histogram.value_at_quantile(0.999)),
            max: us(histogram.max()),
        }
    }
}

/// The server process over the measured time.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ServerReport {
    pub pid: u32,
    /// Percent of one core, all threads.
    pub cpu_percent: f64,
    pub rss_before_bytes: u64,
    pub rss_after_bytes: u64,
}

/// What `hold` found.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HoldReport {
    pub keys_requested: u64,
    pub keys_held: u64,
    pub fill_s: f64,
    /// Growth of the server's RSS over the fill, per held lock.
    pub bytes_per_lock: Option<f64>,
}

/// One run of one workload against one target.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunReport {
    pub label: String,
    pub target: Target,
    pub workload: Workload,
    pub connections: usize,
    pub depth: usize,
    pub threads: usize,
    pub warmup_s: f64,
    /// Measured time (for `hold`, the fill).
    pub duration_s: f64,
    pub key_space: u64,
    pub key_len: usize,
    pub hot_keys: u64,
    pub lease_s: f64,
    pub wait_s: f64,
    pub acquires: u64,
    pub releases: u64,
    /// Acquire-then-release cycles completed (a release ends one).
    pub cycles: u64,
    /// Acquires plus releases per second: the lock operations.
    pub ops_per_s: f64,
    pub acquires_per_s: f64,
    pub releases_per_s: f64,
    pub cycles_per_s: f64,
    /// From request to grant (contended: the wait; Redis: across busy retries).
    pub acquire_latency_us: Latency,
    pub release_latency_us: Latency,
    pub errors: BTreeMap<String, u64>,
    pub timeouts: BTreeMap<String, u64>,
    /// Replies the load generator read per loop turn: how much it batches.
    pub replies_per_turn: f64,
    /// The load generator's own CPU over the measured time, percent of one core.
    pub generator_cpu_percent: Option<f64>,
    pub server: Option<ServerReport>,
    /// Hand-offs counted by ringlock itself (`S`) over the measured time.
    pub server_handoffs: Option<u64>,
    pub server_handoffs_per_s: Option<f64>,
    pub hold: Option<HoldReport>,
    /// Share of the measured time some task waited for a CPU
    /// (/proc/pressure/cpu): near 0 when nothing but the benchmark ran.
    #[serde(default)]
    pub cpu_pressure_percent: Option<f64>,
    /// CPU stolen by the hypervisor, percent of one CPU.
    #[serde(default)]
    pub cpu_steal_percent: f64,
}

impl RunReport {
    pub fn new(
        args: &RunArgs,
        measured_s: f64,
        stats: &WorkerStats,
        server: Option<ServerReport>,
        generator_cpu_percent: Option<f64>,
        server_handoffs: Option<u64>,
        hold: Option<HoldReport>,
    ) -> RunReport {
        let per_s = |count: u64| if measured_s > 0.0 { count as f64 / measured_s } else { 0.0 };
        let mut errors = BTreeMap::new();
        let mut timeouts = BTreeMap::new();
        for kind in ErrorKind::all() {
            let count = stats.errors[kind.index()];
            if count > 0 {
                let map = if kind.is_timeout() { &mut timeouts } else { &mut errors };
                map.insert(kind.name().to_string(), count);
            }
        }
        let label = args.label.clone().unwrap_or_else(|| {
            format!("{}-{}x{}", args.workload.to_possible_value_name(), args.connections, args.depth)
        });
        RunReport {
            label,
            target: args.target,
            workload: args.workload,
            connections: args.connections,
            depth: args.depth,
            threads: args.threads,
            warmup_s: if args.workload == Workload::Hold { 0.0 } else { args.warmup },
            duration_s: measured_s,
            key_space: args.key_space,
            key_len: args.key_len,
            hot_keys: args.hot_keys,
            lease_s: args.lease,
            wait_s: args.wait,
            acquires: stats.acquires,
            releases: stats.releases,
            cycles: stats.releases,
            ops_per_s: per_s(stats.acquires + stats.releases),
            acquires_per_s: per_s(stats.acquires),
            releases_per_s: per_s(stats.releases),
            cycles_per_s: per_s(stats.releases),
            acquire_latency_us: Latency::of(&stats.acquire_ns),
            release_latency_us: Latency::of(&stats.release_ns),
            errors,
            timeouts,
            replies_per_turn: if stats.turns > 0 { stats.replies as f64 / stats.turns as f64 } else { 0.0 },
            generator_cpu_percent,
            server,
            server_handoffs,
            server_handoffs_per_s: server_handoffs.map(per_s),
            hold,
            cpu_pressure_percent: None,
            cpu_steal_percent: 0.0,
        }
    }

    /// The run as a few lines for a person.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} {} [{}]: {} connections x {} in flight, {} thread(s), {:.2} s measured",
            self.target.name(),
            self.workload.to_possible_value_name(),
            self.label,
            self.connections,
            self.depth,
            self.threads,
            self.duration_s
        );
        let _ = writeln!(
            out,
            "  ops/s {}   acquires/s {}   releases/s {}   cycles/s {}",
            thousands(self.ops_per_s),
            thousands(self.acquires_per_s),
            thousands(self.releases_per_s),
            thousands(self.cycles_per_s)
        );
        for (name, latency) in [("acquire", &self.acquire_latency_us), ("release", &self.release_latency_us)] {
            if latency.count > 0 {
                let _ = writeln!(
                    out,
                    "  {name} latency us: p50 {:.1}  p90 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}  (mean {:.1}, n {})",
                    latency.p50, latency.p90, latency.p99, latency.p999, latency.max, latency.mean, latency.count
                );
            }
        }
        let list = |map: &BTreeMap<String, u64>| {
            if map.is_empty() {
                "none".to_string()
            } else {
                map.iter().map(|(kind, count)| format!("{kind} {count}")).collect::<Vec<_>>().join(", ")
            }
        };
        let _ = writeln!(out, "  errors: {}   timeouts: {}", list(&self.errors), list(&self.timeouts));
        if let (Some(handoffs), Some(per_s)) = (self.server_handoffs, self.server_handoffs_per_s) {
            let _ = writeln!(out, "  server hand-offs: {handoffs} ({}/s)", thousands(per_s));
        }
        if let Some(server) = &self.server {
            let _ = writeln!(
                out,
                "  server pid {}: cpu {:.0}%  rss {} -> {}",
                server.pid,
                server.cpu_percent,
                mib(server.rss_before_bytes),
                mib(server.rss_after_bytes)
            );
        }
        if let Some(hold) = &self.hold {
            let per_lock = hold.bytes_per_lock.map_or("unknown (pass --server-pid)".into(), |b| format!("{b:.1} B"));
            let _ = writeln!(
                out,
                "  held {} of {} keys in {:.2} s; server memory per held lock {per_lock}",
                hold.keys_held, hold.keys_requested, hold.fill_s
            );
        }
        let cpu = self.generator_cpu_percent.map_or("?".into(), |cpu| format!("{cpu:.0}%"));
        let _ = writeln!(out, "  load generator: cpu {cpu}, {:.1} replies per loop turn", self.replies_per_turn);
        let pressure = self.cpu_pressure_percent.map_or("?".into(), |p| format!("{p:.1}%"));
        let _ = writeln!(
            out,
            "  machine: cpu pressure {pressure}, steal {:.1}% (both near 0 when nothing else ran)",
            self.cpu_steal_percent
        );
        out
    }
}

trait PossibleValueName {
    fn to_possible_value_name(&self) -> String;
}

impl<T: clap::ValueEnum> PossibleValueName for T {
    fn to_possible_value_name(&self) -> String {
        self.to_possible_value().map_or_else(String::new, |value| value.get_name().to_string())
    }
}

fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

/// The goals of issue 5 for a label that scripts/bench.sh uses:
/// (ringlock/echo at least, ringlock/redis at least).
fn goals(label: &str) -> Option<(f64, f64)> {
    match label {
        "pipelined-16x64" | "pipelined-64x64" => Some((0.75, 5.0)),
        "unpipelined-64x1" => Some((0.90, 1.0)),
        _ => None,
    }
}

/// Most bytes per held lock the issue allows (16-byte keys).
const HOLD_BYTES_PER_LOCK_GOAL: f64 = 160.0;

/// One line of the throughput comparison.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Comparison {
    pub label: String,
    pub echo_ops_per_s: Option<f64>,
    pub ringlock_ops_per_s: Option<f64>,
    pub redis_ops_per_s: Option<f64>,
    pub ringlock_vs_echo: Option<f64>,
    pub ringlock_vs_redis: Option<f64>,
    pub goal_vs_echo: Option<f64>,
    pub goal_vs_redis: Option<f64>,
    pub met: Option<bool>,
}

/// Everything one run of scripts/bench.sh measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Summary {
    pub command: Option<String>,
    pub generated_unix_s: u64,
    pub host: BTreeMap<String, String>,
    pub comparisons: Vec<Comparison>,
    pub hold_bytes_per_lock_goal: f64,
    pub runs: Vec<RunReport>,
}

/// `ringlock-bench report`.
pub fn report(args: &ReportArgs) -> Result<String, String> {
    let mut runs = Vec::with_capacity(args.runs.len());
    for path in &args.runs {
        runs.push(read_run(path)?);
    }
    let mut labels: Vec<String> = Vec::new();
    for run in &runs {
        if matches!(run.workload, Workload::Uncontended) && !labels.contains(&run.label) {
            labels.push(run.label.clone());
        }
    }
    let find = |label: &str, target: Target| runs.iter().find(|run| run.label == label && run.target == target);
    let mut comparisons = Vec::new();
    for label in &labels {
        let ops = |target| find(label, target).map(|run| run.ops_per_s);
        let (echo, ringlock, redis) = (ops(Target::Echo), ops(Target::Ringlock), ops(Target::Redis));
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        };
        let (vs_echo, vs_redis) = (ratio(ringlock, echo), ratio(ringlock, redis));
        let goal = goals(label);
        let met = goal.and_then(|(goal_echo, goal_redis)| Some(vs_echo? >= goal_echo && vs_redis? >= goal_redis));
        comparisons.push(Comparison {
            label: label.clone(),
            echo_ops_per_s: echo,
            ringlock_ops_per_s: ringlock,
            redis_ops_per_s: redis,
            ringlock_vs_echo: vs_echo,
            ringlock_vs_redis: vs_redis,
            goal_vs_echo: goal.map(|goal| goal.0),
            goal_vs_redis: goal.map(|goal| goal.1),
            met,
        });
    }

    let mut out = String::new();
    let ratio_text = |ratio: Option<f64>, goal: Option<f64>| match (ratio, goal) {
        (Some(ratio), Some(goal)) => format!("{ratio:.3} ({} {goal})", if ratio >= goal { ">=" } else { "< goal" }),
        (Some(ratio), None) => format!("{ratio:.3}"),
        _ => "-".into(),
    };
    let ops_text = |ops: Option<f64>| ops.map_or("-".into(), thousands);
    out.push_str("Uncontended acquire+release, lock ops/s (acquires + releases per second)\n\n");
    out.push_str(
        "| run | echo ceiling | ringlock | redis | ringlock/echo | ringlock/redis |\n|---|---:|---:|---:|---:|---:|\n",
    );
    for comparison in &comparisons {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            comparison.label,
            ops_text(comparison.echo_ops_per_s),
            ops_text(comparison.ringlock_ops_per_s),
            ops_text(comparison.redis_ops_per_s),
            ratio_text(comparison.ringlock_vs_echo, comparison.goal_vs_echo),
            ratio_text(comparison.ringlock_vs_redis, comparison.goal_vs_redis),
        );
    }

    out.push_str("\nLatency (us) and CPU\n\n");
    out.push_str(
        "| run | target | acquire p50 | p90 | p99 | p99.9 | max | release p50 | p99 | p99.9 | server cpu | bench cpu | cpu pressure | errors, timeouts |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for run in &runs {
        let (a, r) = (&run.acquire_latency_us, &run.release_latency_us);
        let cpu = |cpu: Option<f64>| cpu.map_or("-".into(), |cpu| format!("{cpu:.0}%"));
        let mut problems: Vec<String> = run.errors.iter().map(|(kind, count)| format!("{kind} {count}")).collect();
        problems.extend(run.timeouts.iter().map(|(kind, count)| format!("{kind} {count}")));
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} | {} | {} |",
            run.label,
            run.target.name(),
            a.p50,
            a.p90,
            a.p99,
            a.p999,
            a.max,
            r.p50,
            r.p99,
            r.p999,
            cpu(run.server.as_ref().map(|server| server.cpu_percent)),
            cpu(run.generator_cpu_percent),
            run.cpu_pressure_percent.map_or("-".into(), |pressure| format!("{pressure:.1}%")),
            if problems.is_empty() { "none".into() } else { problems.join(", ") }
        );
    }

    let contended: Vec<&RunReport> = runs.iter().filter(|run| run.workload == Workload::Contended).collect();
    if !contended.is_empty() {
        out.push_str("\nContended: every lane cycles on a few hot keys\n\n");
        out.push_str(
            "| run | target | hot keys | lanes | grants/s | hand-offs/s (server) | wait p50 us | wait p99 us | wait p99.9 us | busy retries |\n\
             |---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for run in contended {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {} |",
                run.label,
                run.target.name(),
                run.hot_keys,
                run.connections * run.depth,
                thousands(run.acquires_per_s),
                run.server_handoffs_per_s.map_or("-".into(), thousands),
                run.acquire_latency_us.p50,
                run.acquire_latency_us.p99,
                run.acquire_latency_us.p999,
                run.errors.get("busy").copied().unwrap_or(0)
            );
        }
    }

    let held: Vec<&RunReport> = runs.iter().filter(|run| run.hold.is_some()).collect();
    if !held.is_empty() {
        out.push_str("\nHold: acquire distinct keys and keep them\n\n");
        out.push_str(
            "| target | keys held | key bytes | fill s | acquires/s | server RSS before | after | bytes per held lock |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for run in held {
            let hold = run.hold.as_ref().expect("filtered");
            let (before, after) = run
                .server
                .as_ref()
                .map_or(("-".into(), "-".into()), |s| (mib(s.rss_before_bytes), mib(s.rss_after_bytes)));
            let per_lock = hold.bytes_per_lock.map_or("-".into(), |bytes| {
                if run.target == Target::Ringlock {
                    let verdict = if bytes <= HOLD_BYTES_PER_LOCK_GOAL { "<=" } else { "> goal" };
                    format!("{bytes:.1} ({verdict} {HOLD_BYTES_PER_LOCK_GOAL})")
                } else {
                    format!("{bytes:.1}")
                }
            });
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.2} | {} | {before} | {after} | {per_lock} |",
                run.target.name(),
                thousands(hold.keys_held as f64),
                run.key_len,
                hold.fill_s,
                thousands(run.acquires_per_s)
            );
        }
    }

    if let Some(path) = &args.out {
        let summary = Summary {
            command: args.command.clone(),
            generated_unix_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |elapsed| elapsed.as_secs()),
            host: host_facts(),
            comparisons,
            hold_bytes_per_lock_goal: HOLD_BYTES_PER_LOCK_GOAL,
            runs,
        };
        let json = serde_json::to_string_pretty(&summary).map_err(|error| error.to_string())?;
        std::fs::write(path, json + "\n").map_err(|error| format!("cannot write {}: {error}", path.display()))?;
    }
    Ok(out)
}

fn read_run(path: &Path) -> Result<RunReport, String> {
    let text = std::fs::read_to_string(path).map_err(|error| format!("cannot read {}: {error}", path.display()))?;
    serde_json::from_str(&text).map_err(|error| format!("{} is not a run's JSON: {error}", path.display()))
}

fn host_facts() -> BTreeMap<String, String> {
    let mut facts = BTreeMap::new();
    if let Ok(release) = std::fs::read_to_string("/proc/sys/kernel/osrelease") {
        facts.insert("kernel".into(), release.trim().to_string());
    }
    facts.insert("cpus".into(), std::thread::available_parallelism().map_or(0, usize::from).to_string());
    if let Ok(cpuinfo) = std::fs::read_to_string("/proc/cpuinfo")
        && let Some(model) = cpuinfo.lines().find(|line| line.starts_with("model name"))
        && let Some((_, name)) = model.split_once(':')
    {
        facts.insert("cpu_model".into(), name.trim().to_string());
    }
    facts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(999.4), "999");
        assert_eq!(thousands(1000.0), "1,000");
        assert_eq!(thousands(4_600_000.0), "4,600,000");
    }
}
