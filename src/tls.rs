//! TLS settings of the client port (`--tls-cert`, `--tls-key`,
//! `--tls-client-ca`): the rustls server configuration every shard core's
//! connections share. rustls runs with the `ring` provider, the crate the
//! peer proof and the auth file already use (docs/security.md says why).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

/// The rustls configuration of the client port, from PEM files: the
/// server's certificate chain and key, and, for mutual TLS, the CA that
/// client certificates must chain to. TLS 1.3 and 1.2 (AEAD suites only:
/// the provider offers no other).
pub fn server_config(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<Arc<ServerConfig>, String> {
    let chain = read_certificates(cert, "--tls-cert")?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|error| format!("cannot read a private key from {} (--tls-key): {error}", key.display()))?;
    // rustls marks the ring provider deprecated because it has no
    // post-quantum key exchange (X25519MLKEM768 needs aws-lc-rs); it is kept
    // for now because it builds with only a C compiler (docs/security.md).
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|error| format!("TLS settings refused: {error}"))?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for certificate in read_certificates(ca, "--tls-client-ca")? {
                roots
                    .add(certificate)
                    .map_err(|error| format!("{} (--tls-client-ca) holds an unusable CA: {error}", ca.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|error| format!("cannot check client certificates with {}: {error}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder.with_single_cert(chain, key).map_err(|error| {
        format!("the certificate of --tls-cert and the key of --tls-key do not make a usable pair: {error}")
    })?;
    Ok(Arc::new(config))
}

pub(crate) fn read_certificates(path: &Path, flag: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certificates = CertificateDer::pem_file_iter(path)
        .and_then(|certificates| certificates.collect::<Result<Vec<_>, _>>())
        .map_err(|error| format!("cannot read certificates from {} ({flag}): {error}", path.display()))?;
    if certificates.is_empty() {
        return Err(format!("{} ({flag}) holds no PEM certificate", path.display()));
    }
    Ok(certificates)
}

/// The client port's TLS as the node's threads share it: the configuration
/// new connections take (SIGHUP replaces it, see [`SharedTls::reload`]),
/// the files it came from, and counters for `/metrics`.
pub struct SharedTls {
    cert: PathBuf,
    key: PathBuf,
    client_ca: Option<PathBuf>,
    /// The configuration new connections take, and its reload counts.
    pub config: Reloadable<Arc<ServerConfig>>,
    /// Connections closed because their handshake did not end within `--handshake-ms`.
    pub handshake_timeouts: AtomicU64,
}

/// Settings read from files that SIGHUP may replace, shared by the node's
/// threads, with the counts of reloads taken and refused for `/metrics`.
pub struct Reloadable<T> {
    value: Mutex<T>,
    pub reloads: AtomicU64,
    pub reload_failures: AtomicU64,
}

impl<T: Clone> Reloadable<T> {
    pub fn new(value: T) -> Reloadable<T> {
        Reloadable { value: Mutex::new(value), reloads: AtomicU64::new(0), reload_failures: AtomicU64::new(0) }
    }

    /// The settings in force.
    pub fn current(&self) -> T {
        self.value.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Puts `read` in force if the files were read, and counts the outcome;
    /// on a refusal the settings in force stay and the reason is returned.
    pub fn replace(&self, read: Result<T, String>) -> Result<(), String> {
        match read {
            Ok(value) => {
                *self.value.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = value;
                self.reloads.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(error) => {
                self.reload_failures.fetch_add(1, Ordering::Relaxed);
                Err(error)
            }
        }
    }
}

impl SharedTls {
    /// Reads the files; an error stops the start.
    pub fn load(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<SharedTls, String> {
        let config = server_config(cert, key, client_ca)?;
        Ok(SharedTls {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            client_ca: client_ca.map(Path::to_path_buf),
            config: Reloadable::new(config),
            handshake_timeouts: AtomicU64::new(0),
        })
    }

    /// The configuration a new connection starts with. Connections keep
    /// the one they started with for their whole life.
    pub fn current(&self) -> Arc<ServerConfig> {
        self.config.current()
    }

    /// Reads `--tls-cert`, `--tls-key` and `--tls-client-ca` again: new
    /// connections use what they hold from now on, or, if any of them is
    /// refused, the configuration in force stays. Returns why on refusal.
    pub fn reload(&self) -> Result<(), String> {
        self.config.replace(server_config(&self.cert, &self.key, self.client_ca.as_deref()))
    }

    pub fn cert_path(&self) -> &Path {
        &self.cert
    }
}
