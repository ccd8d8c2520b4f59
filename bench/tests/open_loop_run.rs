//! `ringlock-bench run --rate` against real server processes: the built-in
//! echo server and the ringlock binary. These check the report's shape and
//! its inner consistency, never a speed: the machine may be busy.
//!
//! The ringlock binary is the one cargo built beside `ringlock-bench`
//! (`cargo test --workspace` and scripts/test.sh build both), or the one
//! `RINGLOCK_BIN` names.

mod common;

use std::process::Command;

use common::{BENCH, echo_server, ringlock_server, run};
use serde_json::Value;

fn number(report: &Value, path: &[&str]) -> f64 {
    let mut value = report;
    for name in path {
        value = &value[name];
    }
    value.as_f64().unwrap_or_else(|| panic!("{path:?} is not a number in {report:#}"))
}

/// Percentiles of one latency object are in order, and it counted something.
fn assert_ordered(report: &Value, name: &str) {
    let at = |field: &str| number(report, &[name, field]);
    assert!(at("count") > 0.0, "{name} counted nothing: {report:#}");
    let percentiles = [at("p50"), at("p90"), at("p99"), at("p999"), at("max")];
    assert!(percentiles[0] > 0.0, "{name}: {percentiles:?}");
    assert!(percentiles.windows(2).all(|pair| pair[0] <= pair[1]), "{name} out of order: {percentiles:?}");
}

/// What every open-loop report must say, whatever the target.
fn assert_consistent_open_loop(report: &Value, rate: f64) {
    let open = &report["open_loop"];
    assert!(open.is_object(), "no open_loop section: {report:#}");
    let duration = number(report, &["duration_s"]);
    assert_eq!(number(open, &["offered_ops_per_s"]), rate);
    // The timetable places rate / 2 acquires per second, each then released.
    let intended = number(open, &["intended_acquires"]);
    assert!((intended - rate / 2.0 * duration).abs() <= 1.0 + rate * 1e-6, "intended {intended}");

    let achieved = number(open, &["achieved_ops_per_s"]);
    assert!(achieved > 0.0, "nothing answered: {report:#}");
    assert_eq!(achieved, number(report, &["ops_per_s"]));
    let (acquires, releases) = (number(report, &["acquires"]), number(report, &["releases"]));
    assert!(((acquires + releases) / duration - achieved).abs() <= achieved * 1e-9 + 1e-9);
    // Each release follows a grant: within the lanes in flight at either end.
    let lanes = number(report, &["connections"]) * number(report, &["depth"]);
    assert!((acquires - releases).abs() <= lanes, "acquires {acquires}, releases {releases}");
    // Generous: a busy machine may stall the generator or the server for a
    // while, after which it catches up; the count must still be of the order
    // of rate x duration, not of a closed loop's unbounded rate.
    let expected = rate * duration;
    assert!(
        acquires + releases >= 0.2 * expected && acquires + releases <= 2.0 * expected,
        "{} operations for {expected} intended",
        acquires + releases
    );

    let sent = number(open, &["sent_acquires"]);
    let (held, late) = (number(open, &["held_acquires"]), number(open, &["late_acquires"]));
    assert!(sent > 0.0 && held <= sent && late <= sent - held, "sent {sent}, held {held}, late {late}");
    assert!(
        ["on-schedule", "generator-behind", "server-behind"].contains(&open["keeping"].as_str().unwrap_or("")),
        "keeping: {}",
        open["keeping"]
    );
    if number(open, &["lag_us", "count"]) > 0.0 {
        assert_ordered(open, "lag_us");
    }
    assert_ordered(report, "acquire_latency_us");
    assert_ordered(report, "release_latency_us");
    assert_eq!(report["errors"], serde_json::json!({}), "errors: {report:#}");
}

#[test]
fn open_loop_against_the_echo_server_reports_a_consistent_run() {
    let server = echo_server();
    let rate = 20_000.0;
    let report = run(&[
        "--target",
        "echo",
        "--addr",
        &server.addr,
        "--rate",
        "20k",
        "-c",
        "4",
        "-d",
        "8",
        "--duration",
        "1",
        "--warmup",
        "0.2",
    ]);
    assert_eq!(report["target"], "echo");
    assert_consistent_open_loop(&report, rate);
}

#[test]
fn open_loop_against_ringlock_reports_a_consistent_run_for_both_workloads() {
    let server = ringlock_server(&[]);
    let rate = 10_000.0;
    let report = run(&[
        "--target",
        "ringlock",
        "--addr",
        &server.addr,
        "--rate",
        "10000",
        "-c",
        "4",
        "-d",
        "8",
        "--duration",
        "1",
        "--warmup",
        "0.2",
        "--key-space",
        "100000",
    ]);
    assert_eq!(report["target"], "ringlock");
    assert_consistent_open_loop(&report, rate);

    let report = run(&[
        "--target",
        "ringlock",
        "--addr",
        &server.addr,
        "--workload",
        "contended",
        "--hot-keys",
        "4",
        "--rate",
        "5000",
        "-c",
        "4",
        "-d",
        "4",
        "--duration",
        "1",
        "--warmup",
        "0.2",
    ]);
    assert_eq!(report["workload"], "contended");
    assert_consistent_open_loop(&report, 5_000.0);
}

#[test]
fn a_closed_loop_run_has_no_open_loop_section_and_hold_refuses_a_rate() {
    let server = echo_server();
    let report =
        run(&["--target", "echo", "--addr", &server.addr, "-c", "2", "-d", "2", "--duration", "0.3", "--warmup", "0"]);
    assert!(report["open_loop"].is_null(), "{report:#}");
    assert!(number(&report, &["ops_per_s"]) > 0.0);

    let output = Command::new(BENCH)
        .args(["run", "--target", "ringlock", "--addr", &server.addr, "--workload", "hold", "--rate", "1000"])
        .output()
        .expect("run ringlock-bench");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--rate"), "{}", String::from_utf8_lossy(&output.stderr));
}
