//! Mutual TLS on the peer port (`--peer-tls-cert`, `--peer-tls-key`,
//! `--peer-tls-ca`): the rustls settings of both ends of every peer
//! connection, read from the files at start and again on SIGHUP, and the
//! check that a certificate names a peer's host.
//!
//! Every node has one certificate, which it shows both as the server (to a
//! node that dials it) and as the client (to the node it dials); the CA of
//! `--peer-tls-ca` must have signed the other end's, and it must name the
//! host of that node's peer address in `--peers`. TLS 1.3 only: every node
//! runs this code, so nothing older is needed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use rustls::client::Resumption;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::{StoresServerSessions, WebPkiClientVerifier};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::tls::read_certificates;

/// The settings a new peer connection takes: the server's (for connections
/// this node accepts) and the client's (for those it opens).
#[derive(Clone)]
pub struct PeerTlsConfigs {
    pub server: Arc<ServerConfig>,
    pub client: Arc<ClientConfig>,
}

/// Reads the three files and makes both ends' settings; the error names
/// the flag of the file at fault.
pub fn configs(cert: &Path, key: &Path, ca: &Path) -> Result<PeerTlsConfigs, String> {
    let chain = read_certificates(cert, "--peer-tls-cert")?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|error| format!("cannot read a private key from {} (--peer-tls-key): {error}", key.display()))?;
    let mut roots = RootCertStore::empty();
    for certificate in read_certificates(ca, "--peer-tls-ca")? {
        roots
            .add(certificate)
            .map_err(|error| format!("{} (--peer-tls-ca) holds an unusable CA: {error}", ca.display()))?;
    }
    let roots = Arc::new(roots);
    // The same provider as the client port (src/tls.rs says why `ring`).
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
        .build()
        .map_err(|error| format!("cannot check peer certificates with {}: {error}", ca.display()))?;
    let mismatch = |error: rustls::Error| {
        format!("the certificate of --peer-tls-cert and the key of --peer-tls-key do not make a usable pair: {error}")
    };
    let mut server = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|error| format!("peer TLS settings refused: {error}"))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain.clone(), key.clone_key())
        .map_err(mismatch)?;
    // One ticket, sent once the client's certificate checked, tells the
    // node that dialled that it was admitted (see
    // `PeerStream::await_admission`); none is ever used to resume, so that
    // every connection checks both certificates afresh.
    server.send_tls13_tickets = 1;
    server.session_storage = Arc::new(TicketsNeverResume);
    let mut client = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|error| format!("peer TLS settings refused: {error}"))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(mismatch)?;
    client.resumption = Resumption::disabled();
    Ok(PeerTlsConfigs { server: Arc::new(server), client: Arc::new(client) })
}

/// Session storage that issues tickets and never resumes with them.
#[derive(Debug)]
struct TicketsNeverResume;

impl StoresServerSessions for TicketsNeverResume {
    fn put(&self, _key: Vec<u8>, _value: Vec<u8>) -> bool {
        true
    }

    fn get(&self, _key: &[u8]) -> Option<Vec<u8>> {
        None
    }

    fn take(&self, _key: &[u8]) -> Option<Vec<u8>> {
        None
    }

    fn can_cache(&self) -> bool {
        true
    }
}

/// The name a peer's certificate must hold: the host of its peer address
/// in `--peers` (a DNS name, or an IP address as an IP SAN).
pub fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    ServerName::try_from(host.to_string())
        .map_err(|_| format!("{host} cannot be a certificate's name (a DNS name or an IP address)"))
}

/// Whether `certificate` (already checked against the CA) names `host`.
pub fn names_host(certificate: &CertificateDer<'_>, host: &ServerName<'_>) -> bool {
    webpki::EndEntityCert::try_from(certificate)
        .is_ok_and(|certificate| certificate.verify_is_valid_for_subject_name(host).is_ok())
}

/// Peer TLS as the node's threads share it: the settings new connections
/// take (SIGHUP replaces them, see [`PeerTls::reload`]), the files they
/// came from, and counters for `/metrics`.
pub struct PeerTls {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
    /// The settings new connections take, and their reload counts.
    pub configs: crate::tls::Reloadable<PeerTlsConfigs>,
    /// Peer connections refused for TLS (a failed handshake, or a
    /// certificate that does not name the peer's host), by direction:
    /// accepted by this node, or opened by it.
    pub errors_inbound: AtomicU64,
    pub errors_outbound: AtomicU64,
}

impl PeerTls {
    /// Reads the files; an error stops the start.
    pub fn load(cert: &Path, key: &Path, ca: &Path) -> Result<PeerTls, String> {
        Ok(PeerTls {
            configs: crate::tls::Reloadable::new(configs(cert, key, ca)?),
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            ca: ca.to_path_buf(),
            errors_inbound: AtomicU64::new(0),
            errors_outbound: AtomicU64::new(0),
        })
    }

    /// The settings a new connection starts with; open connections keep
    /// theirs.
    pub fn current(&self) -> PeerTlsConfigs {
        self.configs.current()
    }

    /// Reads the three files again: new peer connections use them from now
    /// on, or, if any is refused, the settings in force stay. Returns why
    /// on refusal.
    pub fn reload(&self) -> Result<(), String> {
        self.configs.replace(configs(&self.cert, &self.key, &self.ca))
    }

    pub fn cert_path(&self) -> &Path {
        &self.cert
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_names_the_hosts_of_its_subject_alternative_names_only() {
        let key = rcgen::KeyPair::generate().unwrap();
        let names = vec!["ringlock-0.ringlock".to_string(), "10.0.0.1".to_string()];
        let certificate = rcgen::CertificateParams::new(names).unwrap().self_signed(&key).unwrap();
        let der = certificate.der();
        for host in ["ringlock-0.ringlock", "10.0.0.1"] {
            assert!(names_host(der, &server_name(host).unwrap()), "{host}");
        }
        for host in ["ringlock-1.ringlock", "10.0.0.2", "127.0.0.1", "::1"] {
            assert!(!names_host(der, &server_name(host).unwrap()), "{host}");
        }
        assert!(server_name("bad name").is_err());
    }
}
