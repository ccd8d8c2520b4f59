//! The peer secret of `--peer-secret-file`: read once at start, checked,
//! and kept only as the HMAC key the peer connections prove it with.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Fewest bytes a peer secret may have. The bytes of the line are the key,
/// whatever they spell: 32 characters hold 128 bits of randomness even as
/// hex (4 bits a character), and `head -c 32 /dev/urandom | base64` gives 44
/// characters that hold 256.
pub const PEER_SECRET_BYTES_MIN: usize = 32;

/// Most bytes a peer secret file may hold: it is one line.
pub const PEER_SECRET_BYTES_MAX: usize = 4096;

/// How to make a good secret, for the errors.
const HOW_TO_MAKE_ONE: &str = "make one with `head -c 32 /dev/urandom | base64 > FILE` (44 characters of 32 random \
                               bytes; the bytes of the file's one line are the key, as written), give every node the \
                               same file, and `chmod 600` it";

/// A peer secret read from its file.
pub struct PeerSecret {
    /// The HMAC key the proofs are made with.
    pub key: ring::hmac::Key,
    /// The file can be read by other users than its owner (mode & 0o077):
    /// worth a warning, as ssh gives for a private key.
    pub readable_by_others: bool,
}

impl std::fmt::Debug for PeerSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerSecret(..)")
    }
}

impl PeerSecret {
    /// Reads and checks the secret in `path`; the error tells the operator
    /// what is wrong and how to make a good one.
    pub fn load(path: &Path) -> Result<PeerSecret, String> {
        let shown = path.display();
        let file = std::fs::File::open(path)
            .map_err(|error| format!("cannot read --peer-secret-file {shown}: {error}; {HOW_TO_MAKE_ONE}"))?;
        let mode = file.metadata().map(|metadata| metadata.permissions().mode()).unwrap_or(0);
        let mut bytes = Vec::new();
        file.take(PEER_SECRET_BYTES_MAX as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|error| format!("cannot read --peer-secret-file {shown}: {error}"))?;
        let secret = secret_of(&bytes).map_err(|problem| format!("--peer-secret-file {shown} {problem}"))?;
        Ok(PeerSecret { key: super::proof::key(secret), readable_by_others: mode & 0o077 != 0 })
    }
}

/// The secret in a file's bytes: its one line, without the whitespace that
/// ends it (a newline that editors add, a stray space). The error says what
/// is wrong with the file, to follow its name.
fn secret_of(bytes: &[u8]) -> Result<&[u8], String> {
    if bytes.len() > PEER_SECRET_BYTES_MAX {
        return Err(format!(
            "holds more than {PEER_SECRET_BYTES_MAX} bytes; a peer secret is one line; {HOW_TO_MAKE_ONE}"
        ));
    }
    let end = bytes.iter().rposition(|byte| !byte.is_ascii_whitespace()).map_or(0, |last| last + 1);
    let secret = &bytes[..end];
    if secret.is_empty() {
        return Err(format!("is empty; {HOW_TO_MAKE_ONE}"));
    }
    if secret.contains(&b'\n') {
        return Err(format!("holds more than one line; a peer secret is one line; {HOW_TO_MAKE_ONE}"));
    }
    if secret.len() < PEER_SECRET_BYTES_MIN {
        return Err(format!(
            "holds a secret of {} bytes, shorter than the {PEER_SECRET_BYTES_MIN} needed (a short or typed secret \
             can be guessed); {HOW_TO_MAKE_ONE}",
            secret.len()
        ));
    }
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_is_the_secret_without_its_trailing_whitespace() {
        const LINE: &[u8] = b"0123456789abcdef0123456789abcdef";
        assert_eq!(secret_of(b"0123456789abcdef0123456789abcdef\n"), Ok(LINE));
        assert_eq!(secret_of(b"0123456789abcdef0123456789abcdef \r\n\n"), Ok(LINE));
        // Leading and inner spaces belong to the secret.
        assert_eq!(secret_of(b" 0123456789 abcdef0123456789abcde"), Ok(&b" 0123456789 abcdef0123456789abcde"[..]));
        // What `head -c 32 /dev/urandom | base64` writes: 44 characters,
        // which are the key as they are (not decoded).
        let made = b"q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80=\n";
        assert_eq!(secret_of(made).map(<[u8]>::len), Ok(44));
    }

    #[test]
    fn empty_short_long_and_multi_line_files_are_refused_with_how_to_make_one() {
        let cases: [(&[u8], &str); 6] = [
            (b"", "is empty"),
            (b" \n\n", "is empty"),
            (b"0123456789abcdef0123456789abcde\n", "of 31 bytes, shorter than the 32 needed"),
            // 16 hex characters hold only 64 bits.
            (b"0123456789abcdef\n", "of 16 bytes, shorter than the 32 needed"),
            (b"0123456789abcdef0123456789abcdef\n0123456789abcdef0123456789abcdef\n", "more than one line"),
            (&[b'k'; PEER_SECRET_BYTES_MAX + 1], "more than 4096 bytes"),
        ];
        for (bytes, expected) in cases {
            let error = secret_of(bytes).unwrap_err();
            assert!(error.contains(expected), "{error}");
            assert!(error.contains("head -c 32 /dev/urandom | base64"), "{error}");
            assert!(error.contains("the bytes of the file's one line are the key"), "{error}");
        }
    }
}
