//! `ringlock-testkit certs DIR` as other languages' tests run it: every file
//! is written, keys only their owner can read, and the certificates chain
//! as the TLS tests expect (checked by rustls's verifiers).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::SystemTime;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, RootCertStore};

/// A fresh directory under the system's temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_nanos();
        TempDir(std::env::temp_dir().join(format!("ringlock-certs-{}-{nanos}", std::process::id())))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn certificate(dir: &Path, file: &str) -> CertificateDer<'static> {
    CertificateDer::from_pem_file(dir.join(file)).unwrap_or_else(|error| panic!("{file}: {error}"))
}

fn roots(dir: &Path, file: &str) -> Arc<RootCertStore> {
    let mut store = RootCertStore::empty();
    store.add(certificate(dir, file)).unwrap();
    Arc::new(store)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    #[allow(deprecated)]
    Arc::new(rustls::crypto::ring::default_provider())
}

/// What rustls says of `file` as the certificate of a server named `name`,
/// trusting the CA in `ca`.
fn verify_server(dir: &Path, ca: &str, file: &str, name: &str) -> Result<(), rustls::Error> {
    let verifier = WebPkiServerVerifier::builder_with_provider(roots(dir, ca), provider()).build().unwrap();
    verifier
        .verify_server_cert(
            &certificate(dir, file),
            &[],
            &ServerName::try_from(name.to_string()).unwrap(),
            &[],
            UnixTime::now(),
        )
        .map(|_| ())
}

#[test]
fn certs_writes_a_set_that_chains_with_keys_only_the_owner_reads() {
    let dir = TempDir::new();
    let output = Command::new(env!("CARGO_BIN_EXE_ringlock-testkit")).arg("certs").arg(&dir.0).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));

    for file in ringlock_testkit::certs::FILES {
        let mode = std::fs::metadata(dir.0.join(file)).unwrap().permissions().mode() & 0o777;
        if file.ends_with("-key.pem") {
            assert_eq!(mode, 0o600, "{file}");
            PrivateKeyDer::from_pem_file(dir.0.join(file)).unwrap_or_else(|error| panic!("{file}: {error}"));
        } else {
            assert_eq!(mode & 0o077, 0o044, "{file}");
            certificate(&dir.0, file);
        }
    }

    // The server certificate holds for both names a test connects with.
    verify_server(&dir.0, "ca.pem", "server.pem", "127.0.0.1").unwrap();
    verify_server(&dir.0, "ca.pem", "server.pem", "localhost").unwrap();
    // Each bad one fails for its own reason.
    assert!(matches!(
        verify_server(&dir.0, "other-ca.pem", "server.pem", "127.0.0.1"),
        Err(rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer))
    ));
    assert!(matches!(
        verify_server(&dir.0, "ca.pem", "expired.pem", "127.0.0.1"),
        Err(rustls::Error::InvalidCertificate(CertificateError::Expired | CertificateError::ExpiredContext { .. }))
    ));
    let wrong = verify_server(&dir.0, "ca.pem", "wrong-name.pem", "127.0.0.1");
    assert!(
        matches!(
            wrong,
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. }
            ))
        ),
        "{wrong:?}"
    );
    verify_server(&dir.0, "ca.pem", "wrong-name.pem", ringlock_testkit::certs::WRONG_NAME).unwrap();

    // The client certificate is one a server with --tls-client-ca takes.
    let client_verifier =
        WebPkiClientVerifier::builder_with_provider(roots(&dir.0, "ca.pem"), provider()).build().unwrap();
    client_verifier.verify_client_cert(&certificate(&dir.0, "client.pem"), &[], UnixTime::now()).unwrap();
    let strangers =
        WebPkiClientVerifier::builder_with_provider(roots(&dir.0, "other-ca.pem"), provider()).build().unwrap();
    assert!(strangers.verify_client_cert(&certificate(&dir.0, "client.pem"), &[], UnixTime::now()).is_err());

    // A key matches its certificate: rustls builds a server config from them.
    let server_config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![certificate(&dir.0, "server.pem")],
            PrivateKeyDer::from_pem_file(dir.0.join("server-key.pem")).unwrap(),
        );
    assert!(server_config.is_ok());
    let mismatched = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![certificate(&dir.0, "server.pem")],
            PrivateKeyDer::from_pem_file(dir.0.join("client-key.pem")).unwrap(),
        );
    assert!(mismatched.is_err());
}

#[test]
fn certs_without_a_directory_fails_with_a_reason() {
    let output = Command::new(env!("CARGO_BIN_EXE_ringlock-testkit")).arg("certs").output().unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("certs needs one argument"));
}
