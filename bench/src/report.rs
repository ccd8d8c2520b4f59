//! What a run measured, as text or JSON, and the side-by-side report of
//! several runs with the ratios the issue asks for.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::cli::{ReportArgs, RunArgs, Target};
use crate::open_loop::Keeping;
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

/// How an open-loop run (`--rate`) kept to its timetable.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OpenLoopReport {
    /// The rate asked for: lock operations (acquires + releases) per second.
    pub offered_ops_per_s: f64,
    /// Lock operations answered per second over the measured time.
    pub achieved_ops_per_s: f64,
    /// Acquires the timetable placed in the measured time.
    pub intended_acquires: f64,
    /// Acquires sent from it in the measured time.
    pub sent_acquires: u64,
    /// Of those, the ones that waited for a free lane of their connection.
    pub held_acquires: u64,
    /// Of the others, the ones sent later than the tolerance.
    pub late_acquires: u64,
    /// Acquires due and still unsent when the measured time ended.
    pub unsent_at_end: u64,
    pub lag_tolerance_us: f64,
    /// Send time minus intended time of the acquires that had a free lane:
    /// the generator's own delay, included in every latency it reports.
    pub lag_us: Latency,
    pub keeping: Keeping,
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
    /// Open loop (`--rate`): the timetable; latencies then run from each
    /// request's intended send time.
    #[serde(default)]
    pub open_loop: Option<OpenLoopReport>,
    /// Several clusters (`--cluster`): their names with the address driven,
    /// `name=host:port`, in the order given; empty for one server.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<String>,
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
        let open_loop = args.rate.map(|offered_ops_per_s| {
            let schedule = &stats.schedule;
            let intended_acquires = offered_ops_per_s / 2.0 * measured_s;
            OpenLoopReport {
                offered_ops_per_s,
                achieved_ops_per_s: per_s(stats.acquires + stats.releases),
                intended_acquires,
                sent_acquires: schedule.sent,
                held_acquires: schedule.held,
                late_acquires: schedule.late,
                unsent_at_end: schedule.unsent_at_end,
                lag_tolerance_us: args.lag_tolerance_us as f64,
                lag_us: Latency::of(&schedule.lag_ns),
                keeping: Keeping::of(schedule, intended_acquires),
            }
        });
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
            clusters: args.clusters.iter().map(|cluster| format!("{}={}", cluster.name, cluster.addr)).collect(),
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
            open_loop,
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
        if !self.clusters.is_empty() {
            let _ = writeln!(out, "  clusters: {}", self.clusters.join(" "));
        }
        let _ = writeln!(
            out,
            "  ops/s {}   acquires/s {}   releases/s {}   cycles/s {}",
            thousands(self.ops_per_s),
            thousands(self.acquires_per_s),
            thousands(self.releases_per_s),
            thousands(self.cycles_per_s)
        );
        if let Some(open) = &self.open_loop {
            let _ = writeln!(
                out,
                "  open loop: offered {} ops/s, achieved {} ops/s ({:.1}%); latency from intended send times",
                thousands(open.offered_ops_per_s),
                thousands(open.achieved_ops_per_s),
                100.0 * open.achieved_ops_per_s / open.offered_ops_per_s
            );
            let _ = writeln!(
                out,
                "  schedule: {} ({} acquires intended, {} sent: {} waited for a free lane, {} later than {:.0} us; \
                 {} unsent at the end)",
                open.keeping.text(),
                thousands(open.intended_acquires),
                open.sent_acquires,
                open.held_acquires,
                open.late_acquires,
                open.lag_tolerance_us,
                open.unsent_at_end
            );
            let lag = &open.lag_us;
            let _ = writeln!(
                out,
                "  generator lag us: p50 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}",
                lag.p50, lag.p99, lag.p999, lag.max
            );
        }
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
///
/// A label may have been run in several rounds, each target once per round
/// (scripts/bench.sh alternates them). Round `i` pairs the `i`-th run of each
/// target, in the order the runs are given; a ratio is the median of the
/// rounds' ratios, and each ops/s the median of that target's runs. On a
/// shared machine two runs minutes apart can differ by 10 %, so one pair
/// says less than the median of several.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Comparison {
    pub label: String,
    pub echo_ops_per_s: Option<f64>,
    pub ringlock_ops_per_s: Option<f64>,
    pub redis_ops_per_s: Option<f64>,
    pub ringlock_vs_echo: Option<f64>,
    pub ringlock_vs_redis: Option<f64>,
    /// The ratio of each round, in the order of the rounds.
    #[serde(default)]
    pub ringlock_vs_echo_by_round: Vec<f64>,
    #[serde(default)]
    pub ringlock_vs_redis_by_round: Vec<f64>,
    pub goal_vs_echo: Option<f64>,
    pub goal_vs_redis: Option<f64>,
    pub met: Option<bool>,
}

impl Comparison {
    /// The comparison of the uncontended runs labelled `label`.
    fn of(label: &str, runs: &[RunReport]) -> Comparison {
        let ops = |target: Target| -> Vec<f64> {
            runs.iter()
                .filter(|run| run.label == label && run.target == target && run.workload == Workload::Uncontended)
                .map(|run| run.ops_per_s)
                .collect()
        };
        let (echo, ringlock, redis) = (ops(Target::Echo), ops(Target::Ringlock), ops(Target::Redis));
        let by_round = |over: &[f64]| -> Vec<f64> {
            ringlock.iter().zip(over).filter(|&(_, &base)| base > 0.0).map(|(ours, base)| ours / base).collect()
        };
        let (vs_echo_by_round, vs_redis_by_round) = (by_round(&echo), by_round(&redis));
        let (vs_echo, vs_redis) = (median(&vs_echo_by_round), median(&vs_redis_by_round));
        let goal = goals(label);
        let met = goal.and_then(|(goal_echo, goal_redis)| Some(vs_echo? >= goal_echo && vs_redis? >= goal_redis));
        Comparison {
            label: label.to_string(),
            echo_ops_per_s: median(&echo),
            ringlock_ops_per_s: median(&ringlock),
            redis_ops_per_s: median(&redis),
            ringlock_vs_echo: vs_echo,
            ringlock_vs_redis: vs_redis,
            ringlock_vs_echo_by_round: vs_echo_by_round,
            ringlock_vs_redis_by_round: vs_redis_by_round,
            goal_vs_echo: goal.map(|goal| goal.0),
            goal_vs_redis: goal.map(|goal| goal.1),
            met,
        }
    }
}

/// The median of `values` (the mean of the middle two for an even count).
fn median(values: &[f64]) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    match sorted.len() {
        0 => None,
        len if len % 2 == 1 => Some(sorted[middle]),
        _ => Some((sorted[middle - 1] + sorted[middle]) / 2.0),
    }
}

/// Whether `run` is shown in the latency table: every run of the other
/// workloads, and of the uncontended rounds of one label and target the one
/// with the median ops/s (the lower of the middle two for an even count).
fn is_shown(run: &RunReport, runs: &[RunReport]) -> bool {
    if run.workload != Workload::Uncontended {
        return true;
    }
    let mut same: Vec<&RunReport> = runs
        .iter()
        .filter(|other| other.workload == run.workload && other.label == run.label && other.target == run.target)
        .collect();
    same.sort_by(|a, b| a.ops_per_s.total_cmp(&b.ops_per_s));
    std::ptr::eq(same[(same.len() - 1) / 2], run)
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
    let comparisons: Vec<Comparison> = labels.iter().map(|label| Comparison::of(label, &runs)).collect();

    let mut out = String::new();
    let rounds = comparisons.iter().map(|comparison| comparison.ringlock_vs_echo_by_round.len()).max().unwrap_or(0);
    write_uncontended(&mut out, &comparisons, rounds);
    write_latency(&mut out, &runs, rounds);
    write_contended(&mut out, &runs);
    write_hold(&mut out, &runs);

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

/// The uncontended table: each target's ops/s and the ratios to their goals.
fn write_uncontended(out: &mut String, comparisons: &[Comparison], rounds: usize) {
    let ratio_text = |ratio: Option<f64>, goal: Option<f64>| match (ratio, goal) {
        (Some(ratio), Some(goal)) => format!("{ratio:.3} ({} {goal})", if ratio >= goal { ">=" } else { "< goal" }),
        (Some(ratio), None) => format!("{ratio:.3}"),
        _ => "-".into(),
    };
    let ops_text = |ops: Option<f64>| ops.map_or("-".into(), thousands);
    let rounds_text = |ratios: &[f64]| ratios.iter().map(|ratio| format!("{ratio:.3}")).collect::<Vec<_>>().join(", ");
    out.push_str("Uncontended acquire+release, lock ops/s (acquires + releases per second)");
    if rounds > 1 {
        out.push_str(": medians of the rounds, each ratio the median of the rounds' ratios");
    }
    out.push_str("\n\n");
    out.push_str(
        "| run | echo ceiling | ringlock | redis | ringlock/echo | ringlock/redis | ringlock/echo by round |\n\
         |---|---:|---:|---:|---:|---:|---|\n",
    );
    for comparison in comparisons {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            comparison.label,
            ops_text(comparison.echo_ops_per_s),
            ops_text(comparison.ringlock_ops_per_s),
            ops_text(comparison.redis_ops_per_s),
            ratio_text(comparison.ringlock_vs_echo, comparison.goal_vs_echo),
            ratio_text(comparison.ringlock_vs_redis, comparison.goal_vs_redis),
            rounds_text(&comparison.ringlock_vs_echo_by_round),
        );
    }
}

/// Latency percentiles and CPU of the runs shown (the median round's).
fn write_latency(out: &mut String, runs: &[RunReport], rounds: usize) {
    out.push_str("\nLatency (us) and CPU");
    if rounds > 1 {
        out.push_str(": of the uncontended rounds, the one with the median ops/s");
    }
    out.push_str("\n\n");
    out.push_str(
        "| run | target | acquire p50 | p90 | p99 | p99.9 | max | release p50 | p99 | p99.9 | server cpu | bench cpu | cpu pressure | cpu steal | errors, timeouts |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for run in runs.iter().filter(|run| is_shown(run, runs)) {
        let (a, r) = (&run.acquire_latency_us, &run.release_latency_us);
        let cpu = |cpu: Option<f64>| cpu.map_or("-".into(), |cpu| format!("{cpu:.0}%"));
        let mut problems: Vec<String> = run.errors.iter().map(|(kind, count)| format!("{kind} {count}")).collect();
        problems.extend(run.timeouts.iter().map(|(kind, count)| format!("{kind} {count}")));
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} | {} | {:.1}% | {} |",
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
            run.cpu_steal_percent,
            if problems.is_empty() { "none".into() } else { problems.join(", ") }
        );
    }
}

/// The contended runs: grants, hand-offs and waits on a few hot keys.
fn write_contended(out: &mut String, runs: &[RunReport]) {
    let contended: Vec<&RunReport> = runs.iter().filter(|run| run.workload == Workload::Contended).collect();
    if contended.is_empty() {
        return;
    }
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

/// The hold runs: memory per held lock.
fn write_hold(out: &mut String, runs: &[RunReport]) {
    let held: Vec<&RunReport> = runs.iter().filter(|run| run.hold.is_some()).collect();
    if held.is_empty() {
        return;
    }
    out.push_str("\nHold: acquire distinct keys and keep them\n\n");
    out.push_str(
        "| target | keys held | key bytes | fill s | acquires/s | server RSS before | after | bytes per held lock |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for run in held {
        let hold = run.hold.as_ref().expect("filtered");
        let (before, after) =
            run.server.as_ref().map_or(("-".into(), "-".into()), |s| (mib(s.rss_before_bytes), mib(s.rss_after_bytes)));
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

    fn run(label: &str, target: Target, ops_per_s: f64) -> RunReport {
        RunReport {
            label: label.into(),
            target,
            workload: Workload::Uncontended,
            connections: 16,
            depth: 64,
            threads: 1,
            warmup_s: 0.0,
            duration_s: 1.0,
            key_space: 1 << 20,
            key_len: 16,
            hot_keys: 0,
            lease_s: 30.0,
            wait_s: 0.0,
            acquires: 0,
            releases: 0,
            cycles: 0,
            ops_per_s,
            acquires_per_s: ops_per_s / 2.0,
            releases_per_s: ops_per_s / 2.0,
            cycles_per_s: ops_per_s / 2.0,
            acquire_latency_us: Latency::default(),
            release_latency_us: Latency::default(),
            errors: BTreeMap::new(),
            timeouts: BTreeMap::new(),
            replies_per_turn: 0.0,
            generator_cpu_percent: None,
            server: None,
            server_handoffs: None,
            server_handoffs_per_s: None,
            hold: None,
            cpu_pressure_percent: None,
            cpu_steal_percent: 0.0,
            open_loop: None,
            clusters: Vec::new(),
        }
    }

    #[test]
    fn median_of_odd_even_and_no_values() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }

    #[test]
    fn rounds_pair_runs_in_order_and_report_the_median_ratio() {
        let label = "pipelined-16x64";
        // Ran as: echo, ringlock, redis, then redis, ringlock, echo, then again.
        let runs = vec![
            run(label, Target::Echo, 10.0),
            run(label, Target::Ringlock, 7.0),
            run(label, Target::Redis, 1.0),
            run(label, Target::Redis, 1.2),
            run(label, Target::Ringlock, 7.2),
            run(label, Target::Echo, 8.0),
            run(label, Target::Echo, 9.0),
            run(label, Target::Ringlock, 6.0),
            run(label, Target::Redis, 1.1),
        ];
        let comparison = Comparison::of(label, &runs);
        // Round ratios 0.7, 0.9 and 0.667: the median is the first round's,
        // not the ratio of the medians (7.0 / 9.0).
        let by_round = &comparison.ringlock_vs_echo_by_round;
        assert_eq!(by_round.len(), 3);
        assert!((by_round[0] - 0.7).abs() < 1e-9 && (by_round[1] - 0.9).abs() < 1e-9);
        assert_eq!(comparison.ringlock_vs_echo, Some(by_round[0]));
        assert_eq!(comparison.echo_ops_per_s, Some(9.0));
        assert_eq!(comparison.ringlock_ops_per_s, Some(7.0));
        assert_eq!(comparison.ringlock_vs_redis, Some(6.0));
        assert_eq!(comparison.met, Some(false));
        // The latency table shows each target's median run only.
        let shown: Vec<f64> = runs.iter().filter(|run| is_shown(run, &runs)).map(|run| run.ops_per_s).collect();
        assert_eq!(shown, vec![7.0, 9.0, 1.1]);
    }

    #[test]
    fn one_round_is_the_plain_ratio() {
        let label = "unpipelined-64x1";
        let runs = vec![run(label, Target::Echo, 200.0), run(label, Target::Ringlock, 190.0)];
        let comparison = Comparison::of(label, &runs);
        assert_eq!(comparison.ringlock_vs_echo, Some(0.95));
        assert_eq!(comparison.ringlock_vs_redis, None);
        assert_eq!(comparison.met, None);
    }

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(999.4), "999");
        assert_eq!(thousands(1000.0), "1,000");
        assert_eq!(thousands(4_600_000.0), "4,600,000");
    }
}
