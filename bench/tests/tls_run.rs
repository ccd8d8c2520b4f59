//! `ringlock-bench run` and `connect-rate` over TLS and with a secret,
//! against the real ringlock binary with certificates made here by rcgen
//! (never committed). These check that the runs work and count, never a
//! speed.

mod common;

use common::{ringlock_server, run_command, temp_dir};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use serde_json::Value;

/// A CA and a server certificate for 127.0.0.1 in a folder of their own:
/// (the folder, the CA's path, the server's flags).
fn certificates() -> (common::TempDir, String, Vec<String>) {
    let dir = temp_dir("tls");
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.distinguished_name.push(DnType::CommonName, "ringlock-bench test CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let server_key = KeyPair::generate().unwrap();
    let server =
        CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap().signed_by(&server_key, &ca, &ca_key).unwrap();
    let path = |name: &str| dir.join(name).to_str().unwrap().to_string();
    std::fs::write(path("ca.pem"), ca.pem()).unwrap();
    std::fs::write(path("server.pem"), server.pem()).unwrap();
    std::fs::write(path("server.key"), server_key.serialize_pem()).unwrap();
    let flags = vec!["--tls-cert".to_string(), path("server.pem"), "--tls-key".to_string(), path("server.key")];
    let ca = path("ca.pem");
    (common::TempDir(dir), ca, flags)
}

fn number(report: &Value, name: &str) -> f64 {
    report[name].as_f64().unwrap_or_else(|| panic!("{name} is not a number in {report:#}"))
}

/// A closed-loop run that locked and released, without an error.
fn assert_locked(report: &Value) {
    let (acquires, releases) = (number(report, "acquires"), number(report, "releases"));
    assert!(acquires > 0.0, "nothing acquired: {report:#}");
    let lanes = number(report, "connections") * number(report, "depth");
    assert!((acquires - releases).abs() <= lanes, "acquires {acquires}, releases {releases}");
    assert_eq!(report["errors"], serde_json::json!({}), "errors: {report:#}");
}

const SHORT: [&str; 4] = ["--duration", "0.5", "--warmup", "0.2"];

#[test]
fn a_pipelined_run_over_tls_locks_and_releases() {
    let (_dir, ca, flags) = certificates();
    let server = ringlock_server(&flags.iter().map(String::as_str).collect::<Vec<_>>());
    let mut args = vec!["--addr", &server.addr, "-c", "2", "-d", "16", "--tls-ca", &ca];
    args.extend(SHORT);
    assert_locked(&run_command("run", &args));
}

#[test]
fn a_run_with_a_secret_authenticates_every_connection() {
    let dir = common::TempDir(temp_dir("auth"));
    let secret = "bench-test-secret-6c1e";
    let digest: String = ring_digest(secret);
    let auth = dir.0.join("auth");
    std::fs::write(&auth, format!("bench {digest} *\n")).unwrap();
    let server = ringlock_server(&["--auth-file", auth.to_str().unwrap()]);
    let mut args = vec!["--addr", &server.addr, "-c", "2", "-d", "4", "--secret", secret];
    args.extend(SHORT);
    assert_locked(&run_command("run", &args));
    // Without the secret every request is refused: the run fails or counts errors.
    let output = std::process::Command::new(common::BENCH)
        .args(["run", "--addr", &server.addr, "-c", "1", "-d", "1"])
        .args(SHORT)
        .env_remove("RINGLOCK_SECRET")
        .args(["--json"])
        .output()
        .unwrap();
    let refused = !output.status.success()
        || serde_json::from_slice::<Value>(&output.stdout)
            .map(|report| report["errors"] != serde_json::json!({}))
            .unwrap_or(true);
    assert!(refused, "a run without the secret was served: {}", String::from_utf8_lossy(&output.stdout));
}

#[test]
fn connect_rate_counts_full_tls_connections() {
    let (_dir, ca, flags) = certificates();
    let server = ringlock_server(&flags.iter().map(String::as_str).collect::<Vec<_>>());
    let report = run_command(
        "connect-rate",
        &["--addr", &server.addr, "--threads", "1", "--duration", "0.5", "--warmup", "0.1", "--tls-ca", &ca],
    );
    assert!(number(&report, "connections") > 0.0, "{report:#}");
    assert_eq!(number(&report, "errors"), 0.0, "{report:#}");
    assert_eq!(report["tls"], true);
}

#[test]
fn a_run_against_a_certificate_of_another_ca_fails_at_once() {
    let (_dir, _, flags) = certificates();
    let (_other_dir, other_ca, _) = certificates();
    let server = ringlock_server(&flags.iter().map(String::as_str).collect::<Vec<_>>());
    let output = std::process::Command::new(common::BENCH)
        .args(["run", "--addr", &server.addr, "-c", "1", "-d", "1", "--tls-ca", &other_ca])
        .args(SHORT)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("invalid peer certificate"), "{stderr}");
}

/// The SHA-256 of `secret` in hex, as the auth file holds it.
fn ring_digest(secret: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, secret.as_bytes())
        .as_ref()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}
