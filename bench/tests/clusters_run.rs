//! `ringlock-bench run --cluster NAME=HOST:PORT ...` against two real
//! single-node servers: each key's requests go to the server the clients'
//! hash names (docs/protocol.md §4), checked key by key on each server
//! after a `hold` run; the other workloads run over both without errors.
//! Nothing here asserts a speed.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{ringlock_server, run};
use ringlock_proto::cluster_index;

/// A request line's reply from the server at `addr`.
fn call(addr: &str, line: &str) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect to the server");
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    stream.write_all(format!("{line}\n").as_bytes()).unwrap();
    let mut reply = String::new();
    BufReader::new(stream).read_line(&mut reply).unwrap();
    reply.trim_end().to_string()
}

/// A counter of the `S` reply's totals.
fn stat(addr: &str, name: &str) -> u64 {
    let reply = call(addr, "S");
    let json: serde_json::Value = serde_json::from_str(reply.strip_prefix("S ").expect("an S reply")).unwrap();
    json["total"][name].as_u64().unwrap_or_else(|| panic!("no {name} in {reply}"))
}

#[test]
fn hold_puts_every_key_on_the_cluster_its_score_names_and_only_there() {
    let (a, b) = (ringlock_server(&[]), ringlock_server(&[]));
    let (flag_a, flag_b) = (format!("a={}", a.addr), format!("b={}", b.addr));
    let keys = 300u64;
    let report = run(&[
        "--workload",
        "hold",
        "--hold-keys",
        &keys.to_string(),
        "--key-len",
        "8",
        "-c",
        "4",
        "-d",
        "8",
        "--lease",
        "600",
        "--cluster",
        &flag_a,
        "--cluster",
        &flag_b,
    ]);
    assert_eq!(report["hold"]["keys_held"], keys, "{report:#}");
    assert_eq!(report["clusters"], serde_json::json!([flag_a, flag_b]));
    let names = ["a", "b"];
    for id in 0..keys {
        let key = format!("k{id:07}");
        let (there, elsewhere) = match cluster_index(&names, key.as_bytes()) {
            Some(0) => (&a.addr, &b.addr),
            _ => (&b.addr, &a.addr),
        };
        let held = call(there, &format!("I {key}"));
        assert!(!held.starts_with(&format!("I {key} - ")), "{key} is not held where its score says: {held}");
        assert_eq!(call(elsewhere, &format!("I {key}")), format!("I {key} - 0 0"), "{key} held on the other");
    }
    let (held_a, held_b) = (stat(&a.addr, "held_keys"), stat(&b.addr, "held_keys"));
    assert_eq!(held_a + held_b, keys);
    assert!(held_a > 0 && held_b > 0, "{held_a} and {held_b}");
}

#[test]
fn uncontended_and_contended_runs_drive_both_clusters_without_errors() {
    let (a, b) = (ringlock_server(&[]), ringlock_server(&[]));
    let (flag_a, flag_b) = (format!("a={}", a.addr), format!("b={}", b.addr));
    for workload in ["uncontended", "contended"] {
        let (grants_a, grants_b) = (stat(&a.addr, "grants"), stat(&b.addr, "grants"));
        let report = run(&[
            "--workload",
            workload,
            "--duration",
            "0.3",
            "--warmup",
            "0.1",
            "-c",
            "4",
            "-d",
            "4",
            "--cluster",
            &flag_a,
            "--cluster",
            &flag_b,
        ]);
        assert_eq!(report["errors"], serde_json::json!({}), "{workload}: {report:#}");
        assert!(report["acquires"].as_u64().unwrap() > 0, "{workload}: {report:#}");
        assert!(stat(&a.addr, "grants") > grants_a && stat(&b.addr, "grants") > grants_b, "{workload}: both served");
    }
    assert_eq!(stat(&a.addr, "held_keys") + stat(&b.addr, "held_keys"), 0, "every grant was released");
}

#[test]
fn a_bad_cluster_flag_is_refused_with_a_reason() {
    for (flags, said) in [
        (vec!["--cluster", "a"], "NAME=HOST:PORT"),
        (vec!["--cluster", "a=127.0.0.1:1,127.0.0.1:2"], "one node per cluster"),
        (vec!["--cluster", "a=127.0.0.1:1", "--cluster", "a=127.0.0.1:2"], "given twice"),
        (vec!["--cluster", "a=127.0.0.1:1", "--addr", "127.0.0.1:2"], "cannot be used with"),
    ] {
        let output = std::process::Command::new(common::BENCH).arg("run").args(&flags).output().unwrap();
        assert!(!output.status.success(), "{flags:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(said), "{flags:?}: {stderr}");
    }
}
