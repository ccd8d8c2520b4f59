//! Client authentication (`--auth-file`): the names clients may
//! authenticate as, the SHA-256 digests of their secrets, and their scopes.
//!
//! The file has one entry a line, fields separated by spaces; `#` starts a
//! comment line and blank lines are skipped:
//!
//! ```text
//! # name       sha256 of the secret (64 hex digits)                             scope
//! billing      9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 billing/*,stats
//! ops          60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752 *,stats
//! ```
//!
//! A scope is a comma-separated list of key prefixes ending in `*` (`*`
//! alone: every key), optionally with the word `stats`, which allows `S`.
//! `I` is allowed on keys in scope. Only digests are kept, so the file
//! gives away no secret; a `U` line's secret is hashed and compared with
//! every entry's digest in constant time, so the time taken says nothing of
//! which entry came close.

use std::sync::Arc;

use subtle::ConstantTimeEq;

/// Entries an auth file may hold.
pub const ENTRIES_MAX: usize = 10_000;
/// Prefixes one scope may list.
pub const PREFIXES_PER_SCOPE_MAX: usize = 64;
/// The longest name: names are echoed in `U <name>` like a key.
pub const NAME_LEN_MAX: usize = 250;

/// What an authenticated name may do.
#[derive(Debug, PartialEq, Eq)]
pub struct Scope {
    /// Key prefixes the name may lock and inspect; an empty prefix is every key.
    prefixes: Vec<Vec<u8>>,
    /// Whether one of them is empty (`*`): every key, with no comparison.
    every_key: bool,
    /// Whether the name may read `S`.
    stats: bool,
}

impl Scope {
    /// Whether the name may acquire, release, extend and inspect `key`.
    /// Runs for every keyed request of an authenticated connection, so
    /// `*` answers without comparing anything, and a prefix is compared
    /// byte by byte in place (a call to the C library's `memcmp` for the
    /// few bytes of a prefix cost more than the rest of the check).
    #[inline]
    pub fn allows_key(&self, key: &[u8]) -> bool {
        self.every_key
            || self
                .prefixes
                .iter()
                .any(|prefix| key.len() >= prefix.len() && key.iter().zip(prefix.iter()).all(|(a, b)| a == b))
    }

    /// Whether the name may read the node's statistics (`S`).
    pub fn allows_stats(&self) -> bool {
        self.stats
    }
}

/// Who a connection is, once authenticated: cheap to clone.
#[derive(Clone, Debug)]
pub struct Identity {
    pub name: Arc<[u8]>,
    pub scope: Arc<Scope>,
}

#[derive(Debug)]
struct Entry {
    identity: Identity,
    digest: [u8; 32],
}

/// The entries of an auth file.
#[derive(Debug, Default)]
pub struct AuthTable {
    entries: Vec<Entry>,
}

/// Why an auth file was refused, with the line that says so.
#[derive(Debug, PartialEq, Eq)]
pub struct AuthFileError {
    /// 1-based; 0 when the problem is the file as a whole.
    pub line: usize,
    pub reason: String,
}

impl std::fmt::Display for AuthFileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.line == 0 { f.write_str(&self.reason) } else { write!(f, "line {}: {}", self.line, self.reason) }
    }
}

impl AuthTable {
    /// Reads an auth file's text.
    pub fn parse(text: &str) -> Result<AuthTable, AuthFileError> {
        let mut entries: Vec<Entry> = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let line_number = index + 1;
            let error = |reason: String| AuthFileError { line: line_number, reason };
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = line.split_ascii_whitespace().collect();
            let [name, digest, scope] = fields[..] else {
                return Err(error(format!(
                    "expected 3 fields (name, sha256 of the secret, scope), found {}",
                    fields.len()
                )));
            };
            if name.len() > NAME_LEN_MAX || name == "-" || name.bytes().any(|byte| byte == 0) {
                return Err(error(format!("the name {name:?} is not usable (1 to {NAME_LEN_MAX} bytes, not '-')")));
            }
            let digest = parse_digest(digest).ok_or_else(|| {
                error(format!(
                    "the second field must be the SHA-256 of the secret as 64 hex digits (for example the output of \
                     `printf %s SECRET | sha256sum`), not {} characters",
                    digest.len()
                ))
            })?;
            if entries.iter().any(|entry| entry.digest == digest) {
                return Err(error("two names share one secret; give each its own".to_string()));
            }
            let scope = parse_scope(scope).map_err(error)?;
            if entries.len() == ENTRIES_MAX {
                return Err(AuthFileError { line: 0, reason: format!("more than {ENTRIES_MAX} entries") });
            }
            // A name may have several secrets, one a line (to change its
            // secret with no client refused: add the new line, move the
            // clients, remove the old one), all with one scope.
            let identity = match entries.iter().find(|entry| &*entry.identity.name == name.as_bytes()) {
                Some(earlier) if *earlier.identity.scope == scope => earlier.identity.clone(),
                Some(_) => {
                    return Err(error(format!(
                        "the name {name:?} appears again with another scope; a name's lines (one per secret) \
                         must give the same scope"
                    )));
                }
                None => Identity { name: Arc::from(name.as_bytes()), scope: Arc::new(scope) },
            };
            entries.push(Entry { identity, digest });
        }
        Ok(AuthTable { entries })
    }

    /// Reads the auth file at `path`.
    pub fn load(path: &std::path::Path) -> Result<AuthTable, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| format!("cannot read the auth file {}: {error}", path.display()))?;
        AuthTable::parse(&text).map_err(|error| format!("the auth file {} is refused: {error}", path.display()))
    }

    /// The name whose secret this is, if any. Every entry is compared, in
    /// constant time, whatever matches.
    pub fn authenticate(&self, secret: &[u8]) -> Option<Identity> {
        let digest = ring::digest::digest(&ring::digest::SHA256, secret);
        let mut found = None;
        for entry in &self.entries {
            if bool::from(entry.digest.ct_eq(digest.as_ref())) {
                found = Some(entry.identity.clone());
            }
        }
        found
    }

    /// The entry of `name` now, for a connection authenticated before a reload.
    pub fn lookup(&self, name: &[u8]) -> Option<Identity> {
        self.entries.iter().find(|entry| &*entry.identity.name == name).map(|entry| entry.identity.clone())
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The auth file as the node's threads share it: the table in force, a
/// generation that every reload moves on (the cores compare it once a turn),
/// and the reloads' outcomes for `/metrics`.
pub struct SharedAuth {
    path: std::path::PathBuf,
    table: std::sync::Mutex<Arc<AuthTable>>,
    pub generation: std::sync::atomic::AtomicU64,
    pub reloads: std::sync::atomic::AtomicU64,
    pub reload_failures: std::sync::atomic::AtomicU64,
    /// Connections closed because they had not authenticated within `--handshake-ms`.
    pub timeouts: std::sync::atomic::AtomicU64,
}

impl SharedAuth {
    /// Loads the auth file at `path`; an error stops the start.
    pub fn load(path: &std::path::Path) -> Result<SharedAuth, String> {
        let table = AuthTable::load(path)?;
        Ok(SharedAuth {
            path: path.to_path_buf(),
            table: std::sync::Mutex::new(Arc::new(table)),
            generation: std::sync::atomic::AtomicU64::new(1),
            reloads: std::sync::atomic::AtomicU64::new(0),
            reload_failures: std::sync::atomic::AtomicU64::new(0),
            timeouts: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Reads the file again: the new table replaces the old one for every
    /// core, or, if the file is refused, the old one stays. Returns the
    /// number of entries, or why the file was refused.
    pub fn reload(&self) -> Result<usize, String> {
        use std::sync::atomic::Ordering;
        match AuthTable::load(&self.path) {
            Ok(table) => {
                let entries = table.len();
                if let Ok(mut current) = self.table.lock() {
                    *current = Arc::new(table);
                }
                self.generation.fetch_add(1, Ordering::Release);
                self.reloads.fetch_add(1, Ordering::Relaxed);
                Ok(entries)
            }
            Err(error) => {
                self.reload_failures.fetch_add(1, Ordering::Relaxed);
                Err(error)
            }
        }
    }

    /// The table in force and its generation.
    pub fn current(&self) -> (u64, Arc<AuthTable>) {
        use std::sync::atomic::Ordering;
        let generation = self.generation.load(Ordering::Acquire);
        let table = self.table.lock().map(|table| table.clone()).unwrap_or_default();
        (generation, table)
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

fn parse_digest(field: &str) -> Option<[u8; 32]> {
    if field.len() != 64 {
        return None;
    }
    let mut digest = [0u8; 32];
    for (byte, pair) in digest.iter_mut().zip(field.as_bytes().chunks(2)) {
        *byte = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(digest)
}

fn parse_scope(field: &str) -> Result<Scope, String> {
    let mut scope = Scope { prefixes: Vec::new(), every_key: false, stats: false };
    for item in field.split(',') {
        if item == "stats" {
            scope.stats = true;
        } else if let Some(prefix) = item.strip_suffix('*') {
            if prefix.contains('*') {
                return Err(format!("the scope item {item:?} has a '*' before its end"));
            }
            scope.every_key |= prefix.is_empty();
            scope.prefixes.push(prefix.as_bytes().to_vec());
        } else {
            return Err(format!(
                "the scope item {item:?} is neither a key prefix ending in '*' (such as app/* or * for every key) \
                 nor the word stats"
            ));
        }
    }
    if scope.prefixes.len() > PREFIXES_PER_SCOPE_MAX {
        return Err(format!("more than {PREFIXES_PER_SCOPE_MAX} prefixes in one scope"));
    }
    Ok(scope)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha256_hex(secret: &str) -> String {
        ring::digest::digest(&ring::digest::SHA256, secret.as_bytes())
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    fn table() -> AuthTable {
        let text = format!(
            "# teams\n\nbilling {} billing/*,shared/*\nops {} *,stats\n",
            sha256_hex("billing-secret"),
            sha256_hex("ops-secret")
        );
        AuthTable::parse(&text).unwrap()
    }

    #[test]
    fn a_secret_names_its_entry_and_nothing_else() {
        let table = table();
        assert_eq!(table.len(), 2);
        let billing = table.authenticate(b"billing-secret").unwrap();
        assert_eq!(&*billing.name, b"billing");
        assert!(table.authenticate(b"billing-secret ").is_none());
        assert!(table.authenticate(b"").is_none());
        assert!(table.authenticate(sha256_hex("ops-secret").as_bytes()).is_none(), "the digest is not the secret");
    }

    #[test]
    fn a_scope_allows_its_prefixes_and_stats_only_when_listed() {
        let table = table();
        let billing = table.lookup(b"billing").unwrap();
        assert!(billing.scope.allows_key(b"billing/invoice-1") && billing.scope.allows_key(b"shared/x"));
        assert!(!billing.scope.allows_key(b"billin") && !billing.scope.allows_key(b"ops/x"));
        assert!(!billing.scope.allows_stats());
        let ops = table.lookup(b"ops").unwrap();
        assert!(ops.scope.allows_key(b"anything") && ops.scope.allows_stats());
        assert!(table.lookup(b"nobody").is_none());
    }

    #[test]
    fn a_name_may_have_several_secrets_with_one_scope() {
        let text = format!("a {} x/*\na {} x/*\nb {} *", sha256_hex("old"), sha256_hex("new"), sha256_hex("other"));
        let table = AuthTable::parse(&text).unwrap();
        for secret in ["old", "new"] {
            let identity = table.authenticate(secret.as_bytes()).expect("either secret");
            assert_eq!(&*identity.name, b"a");
            assert!(identity.scope.allows_key(b"x/1") && !identity.scope.allows_key(b"y"));
        }
        assert_eq!(&*table.authenticate(b"other").unwrap().name, b"b");
    }

    #[test]
    fn a_bad_file_is_refused_with_its_line_and_what_to_do() {
        let digest = sha256_hex("s");
        for (text, line, words) in [
            ("a b".to_string(), 1, "expected 3 fields"),
            (format!("\n# c\na {digest} x/"), 3, "neither a key prefix"),
            ("a 1234 *".to_string(), 1, "sha256sum"),
            (format!("a {digest} *\na {} x/*", sha256_hex("t")), 2, "another scope"),
            (format!("a {digest} *\nb {digest} *"), 2, "share one secret"),
            (format!("- {digest} *"), 1, "not usable"),
            (format!("a {digest} a*b*"), 1, "before its end"),
            (format!("a {} *", "g".repeat(64)), 1, "sha256sum"),
        ] {
            let error = AuthTable::parse(&text).unwrap_err();
            assert_eq!(error.line, line, "{text:?}: {error}");
            assert!(error.reason.contains(words), "{text:?}: {error}");
        }
        assert!(AuthTable::parse("# nothing\n\n").unwrap().is_empty());
    }
}
