//! Certificates for TLS tests of every language, made fresh for each run
//! (no private key is ever committed): `ringlock-testkit certs DIR` writes
//! them as PEM files, which `testkit/README.md` lists.
//!
//! A test CA signs a server certificate for 127.0.0.1 and `localhost`, a
//! client certificate (subject CN `alpha`), a server certificate that
//! expired, and one for another name only; a second CA, unrelated to the
//! first, is what a client that trusts the wrong CA has.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, date_time_ymd,
};

/// The client certificate's subject common name (an auth-file name, for a
/// server that lets a certificate stand for one).
pub const CLIENT_NAME: &str = "alpha";

/// The only name `wrong-name.pem` is valid for.
pub const WRONG_NAME: &str = "elsewhere.invalid";

/// How long the valid certificates last, from a day before they were made
/// (so that a clock a little behind still takes them).
const VALID_FOR_DAYS: u32 = 365;
const DAY: Duration = Duration::from_secs(24 * 60 * 60);

/// Every file [`write_all`] writes, by name: certificates (public) and keys
/// (mode 0600).
pub const FILES: [&str; 10] = [
    "ca.pem",
    "server.pem",
    "server-key.pem",
    "client.pem",
    "client-key.pem",
    "other-ca.pem",
    "expired.pem",
    "expired-key.pem",
    "wrong-name.pem",
    "wrong-name-key.pem",
];

/// A certificate and its key (for a CA, the key that signs with it).
struct Issued {
    certificate: Certificate,
    key: KeyPair,
}

/// Why the certificates could not be made or written.
#[derive(Debug)]
pub enum CertsError {
    /// rcgen refused a certificate's parameters.
    Generate(rcgen::Error),
    /// A file could not be written.
    Write { path: String, error: std::io::Error },
}

impl std::fmt::Display for CertsError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CertsError::Generate(error) => write!(formatter, "cannot make a certificate: {error}"),
            CertsError::Write { path, error } => write!(formatter, "cannot write {path}: {error}"),
        }
    }
}

impl From<rcgen::Error> for CertsError {
    fn from(error: rcgen::Error) -> CertsError {
        CertsError::Generate(error)
    }
}

/// Makes the whole set and writes it into `dir` (created if missing),
/// replacing files of the same names.
///
/// ```no_run
/// ringlock_testkit::certs::write_all(std::path::Path::new("/tmp/ringlock-certs")).unwrap();
/// ```
pub fn write_all(dir: &Path) -> Result<(), CertsError> {
    std::fs::create_dir_all(dir).map_err(|error| CertsError::Write { path: dir.display().to_string(), error })?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let valid = (now - DAY, now + DAY * VALID_FOR_DAYS);
    let ca = authority("ringlock test CA", valid)?;
    let other_ca = authority("ringlock unrelated test CA", valid)?;
    let server =
        leaf(&["127.0.0.1", "localhost"], "ringlock test server", ExtendedKeyUsagePurpose::ServerAuth, valid, &ca)?;
    let client = leaf(&[], CLIENT_NAME, ExtendedKeyUsagePurpose::ClientAuth, valid, &ca)?;
    let expired_dates = (now - DAY * 30, now - DAY);
    let expired = leaf(
        &["127.0.0.1", "localhost"],
        "ringlock expired test server",
        ExtendedKeyUsagePurpose::ServerAuth,
        expired_dates,
        &ca,
    )?;
    let wrong_name = leaf(&[WRONG_NAME], WRONG_NAME, ExtendedKeyUsagePurpose::ServerAuth, valid, &ca)?;

    write(dir, "ca.pem", &ca.certificate.pem(), false)?;
    write(dir, "other-ca.pem", &other_ca.certificate.pem(), false)?;
    for (name, pair) in [("server", &server), ("client", &client), ("expired", &expired), ("wrong-name", &wrong_name)] {
        write(dir, &format!("{name}.pem"), &pair.certificate.pem(), false)?;
        write(dir, &format!("{name}-key.pem"), &pair.key.serialize_pem(), true)?;
    }
    Ok(())
}

/// A validity period, as durations since the Unix epoch (from, until).
type Validity = (Duration, Duration);

/// Sets a certificate's validity dates.
fn set_validity(params: &mut CertificateParams, (from, until): Validity) {
    let epoch = date_time_ymd(1970, 1, 1);
    params.not_before = epoch + from;
    params.not_after = epoch + until;
}

fn authority(common_name: &str, valid: Validity) -> Result<Issued, CertsError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name = name(common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    set_validity(&mut params, valid);
    let certificate = params.self_signed(&key)?;
    Ok(Issued { certificate, key })
}

fn leaf(
    names: &[&str],
    common_name: &str,
    usage: ExtendedKeyUsagePurpose,
    valid: Validity,
    issuer: &Issued,
) -> Result<Issued, CertsError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(names.iter().map(|name| name.to_string()).collect::<Vec<_>>())?;
    params.distinguished_name = name(common_name);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![usage];
    params.use_authority_key_identifier_extension = true;
    set_validity(&mut params, valid);
    let certificate = params.signed_by(&key, &issuer.certificate, &issuer.key)?;
    Ok(Issued { certificate, key })
}

fn name(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name
}

/// Writes one file; a key only its owner may read, from its creation on.
fn write(dir: &Path, file: &str, contents: &str, secret: bool) -> Result<(), CertsError> {
    let path = dir.join(file);
    let failed = |error| CertsError::Write { path: path.display().to_string(), error };
    let mut options = OpenOptions::new();
    options.write(true).create(true).truncate(true).mode(if secret { 0o600 } else { 0o644 });
    let mut handle = options.open(&path).map_err(failed)?;
    if secret {
        // A file that existed keeps its mode through open(); set it anyway.
        use std::os::unix::fs::PermissionsExt;
        handle.set_permissions(std::fs::Permissions::from_mode(0o600)).map_err(failed)?;
    }
    handle.write_all(contents.as_bytes()).map_err(failed)
}
