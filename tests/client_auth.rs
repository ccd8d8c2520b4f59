//! Client authentication against the real server: `--auth-file`, `U`,
//! scopes, a failed `U`, reloads by SIGHUP, and hostile input on the path.

mod common;

use std::io::Write;

use common::{Conn, DataDir, Server, metrics_address, scrape, stat, token_of, wait_until};

const BILLING: &str = "billing-3b1f0c9a52d84e7f";
const OPS: &str = "ops-7c2e94d1a0b35f68";

fn sha256_hex(secret: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, secret.as_bytes()).as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// An auth file in a directory of its own.
struct AuthFile {
    dir: DataDir,
}

impl AuthFile {
    fn new(text: &str) -> AuthFile {
        let file = AuthFile { dir: DataDir::new() };
        std::fs::create_dir_all(&file.dir.0).unwrap();
        file.write(text);
        file
    }

    fn path(&self) -> String {
        self.dir.0.join("auth").to_str().unwrap().to_string()
    }

    /// Replaces the file's text in one rename, as an operator's tools would.
    fn write(&self, text: &str) {
        let draft = self.dir.0.join("auth.draft");
        std::fs::write(&draft, text).unwrap();
        std::fs::rename(&draft, self.dir.0.join("auth")).unwrap();
    }
}

fn two_teams() -> String {
    format!(
        "# name, sha256 of the secret, scope\nbilling {} billing/*,shared/*\n\nops {} *,stats\n",
        sha256_hex(BILLING),
        sha256_hex(OPS)
    )
}

fn authenticated(server: &Server, secret: &str, name: &str) -> Conn {
    let mut conn = server.connect();
    assert_eq!(conn.call(&format!("U {secret}")), format!("U {name}"));
    conn
}

#[test]
fn nothing_but_ping_is_served_before_u_and_scopes_hold_after() {
    let file = AuthFile::new(&two_teams());
    let server = Server::start(&["--auth-file", &file.path()]);
    let mut conn = server.connect();
    assert!(conn.call("P").starts_with("P active "), "P needs no name");
    assert_eq!(conn.call("A billing/1 30 0"), "E A billing/1 auth-required");
    assert_eq!(conn.call("R billing/1 5"), "E R billing/1 auth-required");
    assert_eq!(conn.call("I billing/1"), "E I billing/1 auth-required");
    assert_eq!(conn.call("S"), "E S - auth-required");
    assert_eq!(conn.call("U"), "E U - bad-request");
    assert_eq!(conn.call(&format!("U {BILLING}")), "U billing");
    let token = token_of(&conn.call("A billing/1 30 0"), "billing/1");
    assert!(conn.call("A shared/x 30 0").starts_with("A shared/x "));
    assert_eq!(conn.call("A ops/1 30 0"), "E A ops/1 forbidden");
    assert_eq!(conn.call("I ops/1"), "E I ops/1 forbidden");
    assert_eq!(conn.call("R ops/1 5"), "E R ops/1 forbidden");
    assert_eq!(conn.call("S"), "E S - forbidden");
    assert!(conn.call("I billing/1").starts_with(&format!("I billing/1 {token} ")));
    // Another connection of another name: everything, statistics included.
    let mut ops = authenticated(&server, OPS, "ops");
    assert!(ops.call("A ops/1 30 0").starts_with("A ops/1 "));
    assert_eq!(stat(&mut ops, "held_keys"), 3, "only the allowed acquires took keys");
    assert_eq!(conn.call(&format!("R billing/1 {token}")), "R billing/1");
}

#[test]
fn a_forbidden_key_keeps_its_place_behind_a_queued_acquire_of_it() {
    let audit = "audit-41c9e0b27d5a8f36";
    let file = AuthFile::new(&format!("{}audit {} audit/*\n", two_teams(), sha256_hex(audit)));
    let server = Server::start(&["--auth-file", &file.path()]);
    let mut ops = authenticated(&server, OPS, "ops");
    let token = token_of(&ops.call("A billing/k 30 0"), "billing/k");
    let mut conn = authenticated(&server, BILLING, "billing");
    // The first acquire queues behind ops' grant; the connection then
    // becomes a name without billing/*, so its second acquire is forbidden,
    // and that answer waits behind the first, as any answer on the key does.
    conn.request("A billing/k 30 0");
    assert_eq!(conn.call(&format!("U {audit}")), "U audit");
    conn.request("A billing/k 30 0");
    assert_eq!(conn.call("A audit/1 30 0").split(' ').next(), Some("A"), "other keys are answered meanwhile");
    assert_eq!(ops.call(&format!("R billing/k {token}")), "R billing/k");
    assert!(conn.line().starts_with("A billing/k "), "the queued acquire first");
    assert_eq!(conn.line(), "E A billing/k forbidden");
}

#[test]
fn a_wrong_secret_is_answered_after_a_delay_then_the_connection_closes() {
    let file = AuthFile::new(&two_teams());
    let server = Server::start(&["--auth-file", &file.path(), "--metrics-listen", "127.0.0.1:0"]);
    let metrics = metrics_address(&server);
    let mut conn = server.connect();
    conn.send(b"U not-a-secret\nP\nA billing/1 30 0\n");
    assert_eq!(conn.line(), "E U - auth-failed");
    assert!(conn.closed_by_server(), "nothing after the failed U is read");
    // The digest of a secret is not a secret.
    let mut conn = server.connect();
    conn.request(&format!("U {}", sha256_hex(BILLING)));
    assert_eq!(conn.line(), "E U - auth-failed");
    assert_eq!(scrape(metrics)["ringlock_auth_failures_total"], 2.0);
    // The server is none the worse.
    authenticated(&server, BILLING, "billing");
}

#[test]
fn u_on_a_server_without_an_auth_file_says_so() {
    let server = Server::start(&[]);
    let mut conn = server.connect();
    assert_eq!(conn.call("U anything"), "E U - auth-disabled");
    assert!(conn.call("A k 30 0").starts_with("A k "), "the connection carries on");
}

#[test]
fn a_reload_revokes_removed_names_only_and_a_bad_file_keeps_the_old_one() {
    let file = AuthFile::new(&two_teams());
    let server = Server::start(&["--auth-file", &file.path(), "--metrics-listen", "127.0.0.1:0"]);
    let metrics = metrics_address(&server);
    let mut billing = authenticated(&server, BILLING, "billing");
    let mut ops = authenticated(&server, OPS, "ops");
    let held = token_of(&billing.call("A billing/held 60 0"), "billing/held");
    billing.request("A billing/held 60 0");

    // A file that does not parse: nothing changes.
    file.write("billing not-a-digest *\n");
    server.signal("HUP");
    wait_until("the failed reload is counted", || {
        scrape(metrics).get("ringlock_auth_reloads_total{result=\"failed\"}") == Some(&1.0)
    });
    assert!(billing.call("A shared/a 30 0").starts_with("A shared/a "), "the old file stays in force");
    // The log line follows the count, through the log's pipe.
    wait_until("the log to say the files in force stay", || server.log().contains("the auth file in force stays"));

    // billing is removed, ops keeps its name with a narrower scope.
    let new_ops = "ops2-5d1e8a7f3b2c9e40";
    file.write(&format!("ops {} ops/*\nnew {} new/*\n", sha256_hex(OPS), sha256_hex(new_ops)));
    server.signal("HUP");
    assert_eq!(billing.line(), "E - - auth-revoked");
    assert!(billing.closed_by_server());
    assert_eq!(ops.call("S"), "E S - forbidden", "ops took its new scope");
    assert!(ops.call("A ops/z 30 0").starts_with("A ops/z "));
    assert_eq!(ops.call("I billing/held"), "E I billing/held forbidden");
    let mut new = authenticated(&server, new_ops, "new");
    assert!(new.call("A new/1 30 0").starts_with("A new/1 "));
    let mut late = server.connect();
    late.request(&format!("U {BILLING}"));
    assert_eq!(late.line(), "E U - auth-failed", "a removed secret no longer works");
    // The revoked connection's lock is untouched: its lease holds it.
    file.write(&format!("ops {} *,stats\n", sha256_hex(OPS)));
    server.signal("HUP");
    assert_eq!(new.line(), "E - - auth-revoked");
    // Held still; ops, another name, is not shown billing's token.
    let inspected = ops.call("I billing/held");
    assert!(inspected.starts_with("I billing/held - ") && !inspected.contains(" - 0 "), "{inspected} (token {held})");
    let samples = scrape(metrics);
    assert_eq!(samples["ringlock_auth_revoked_total"], 2.0);
    assert_eq!(samples["ringlock_auth_reloads_total{result=\"ok\"}"], 2.0);
}

#[test]
fn hostile_u_lines_cost_one_connection_each_and_bystanders_carry_on() {
    let file = AuthFile::new(&two_teams());
    let server = Server::start(&["--auth-file", &file.path()]);
    let mut bystander = authenticated(&server, OPS, "ops");
    // A U line of 1 MB is a line too long like any other.
    let mut conn = server.connect();
    let mut line = b"U ".to_vec();
    line.extend(std::iter::repeat_n(b'x', 1 << 20));
    line.push(b'\n');
    // The server stops reading after the first kilobyte: the rest of the
    // write may fail, which is the point.
    let mut writer = conn.stream.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        let _ = writer.write_all(&line);
    });
    assert_eq!(conn.line(), "E - - line-too-long");
    sender.join().unwrap();
    assert!(conn.closed_by_server());
    // Bytes a secret cannot hold.
    let mut conn = server.connect();
    conn.send(b"U a\tb\n");
    assert_eq!(conn.line(), "E U - bad-request");
    // Many wrong secrets at once, each on its own connection: every one is
    // answered and closed, and the bystander is served meanwhile.
    let mut guessers: Vec<Conn> = (0..200).map(|_| server.connect()).collect();
    for (index, guesser) in guessers.iter_mut().enumerate() {
        guesser.send(format!("U guess-{index}\n").as_bytes());
    }
    assert!(bystander.call("A bystander/1 30 0").starts_with("A bystander/1 "));
    for guesser in &mut guessers {
        assert_eq!(guesser.line(), "E U - auth-failed");
        assert!(guesser.closed_by_server());
    }
    assert!(bystander.call("P").starts_with("P active"));
}

#[test]
fn a_bad_auth_file_stops_the_start_with_its_line() {
    let file = AuthFile::new("ops 1234 *\n");
    let data = std::sync::Arc::new(DataDir::new());
    let error = Server::try_start_in(data, &["--auth-file", &file.path()]).err().expect("the start fails");
    assert!(error.contains("line 1") && error.contains("sha256sum"), "{error}");
    let missing = Server::try_start_in(std::sync::Arc::new(DataDir::new()), &["--auth-file", "/nonexistent/auth"]);
    assert!(missing.err().expect("the start fails").contains("cannot read the auth file"));
}
