//! TLS to the server: the rustls settings built once from the builder's
//! files ([`ClientBuilder::tls_ca`](crate::ClientBuilder::tls_ca) and the
//! rest), the name each address is checked against, and the handshake a
//! fresh socket goes through before it carries anything.
//!
//! rustls runs with the `ring` provider, as the server does
//! (docs/security.md says why). Each connection has its own
//! [`ClientConnection`], kept in the connection's state: the reader decrypts
//! into its buffer, and the writer encrypts each batch of requests at once,
//! so that a batch goes out as one TLS record (up to 16 KiB of requests).

use std::io::{self, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore};

/// The TLS settings of a client, as given to the builder.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TlsFiles {
    pub(crate) ca: Option<PathBuf>,
    pub(crate) cert: Option<PathBuf>,
    pub(crate) key: Option<PathBuf>,
    pub(crate) server_name: Option<String>,
}

impl TlsFiles {
    /// Whether any TLS setting was given.
    pub(crate) fn any(&self) -> bool {
        self.ca.is_some() || self.cert.is_some() || self.key.is_some() || self.server_name.is_some()
    }

    /// The setting that is missing for the others to make sense, if one is.
    pub(crate) fn incomplete(&self) -> Option<&'static str> {
        if self.any() && self.ca.is_none() {
            return Some("TLS needs tls_ca, the PEM file of the CA that signed the server's certificate");
        }
        if self.cert.is_some() != self.key.is_some() {
            return Some("a client certificate needs both tls_cert and tls_key");
        }
        if self.server_name.as_deref().is_some_and(|name| ServerName::try_from(name).is_err()) {
            return Some("tls_server_name must be a DNS name or an IP address");
        }
        None
    }

    /// The rustls settings every connection of the client shares, or why
    /// the files cannot be used.
    pub(crate) fn config(&self) -> Result<Arc<ClientConfig>, String> {
        let ca = self.ca.as_deref().ok_or("TLS needs tls_ca")?;
        let mut roots = RootCertStore::empty();
        for certificate in read_certificates(ca, "tls_ca")? {
            roots
                .add(certificate)
                .map_err(|error| format!("{} (tls_ca) holds an unusable CA: {error}", ca.display()))?;
        }
        // rustls marks the ring provider deprecated for its lack of a
        // post-quantum key exchange; the server uses it too (docs/security.md).
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|error| format!("TLS settings refused: {error}"))?
            .with_root_certificates(roots);
        let config = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let chain = read_certificates(cert, "tls_cert")?;
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|error| format!("cannot read a private key from {} (tls_key): {error}", key.display()))?;
                builder.with_client_auth_cert(chain, key).map_err(|error| {
                    format!("the certificate of tls_cert and the key of tls_key do not make a usable pair: {error}")
                })?
            }
            _ => builder.with_no_client_auth(),
        };
        Ok(Arc::new(config))
    }
}

fn read_certificates(path: &Path, setting: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certificates = CertificateDer::pem_file_iter(path)
        .and_then(|certificates| certificates.collect::<Result<Vec<_>, _>>())
        .map_err(|error| format!("cannot read certificates from {} ({setting}): {error}", path.display()))?;
    if certificates.is_empty() {
        return Err(format!("{} ({setting}) holds no PEM certificate", path.display()));
    }
    Ok(certificates)
}

/// The host part of `host:port` (`[v6]:port` gives `v6`): the name the
/// server's certificate is checked against by default.
pub(crate) fn host_of(address: &str) -> &str {
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    host.strip_prefix('[').and_then(|host| host.strip_suffix(']')).unwrap_or(host)
}

/// Runs the TLS handshake on a fresh socket within `deadline`; the
/// connection state ready to carry requests, or the I/O error (a rustls
/// error inside one for a refused handshake, see
/// [`ConnectionFailure::from_io`](crate::ConnectionFailure::from_io)).
pub(crate) fn handshake(
    config: &Arc<ClientConfig>,
    server_name: Option<&str>,
    address: &str,
    stream: &TcpStream,
    deadline: Instant,
) -> io::Result<ClientConnection> {
    let name = server_name.unwrap_or_else(|| host_of(address));
    let name = ServerName::try_from(name.to_string()).map_err(|error| {
        io::Error::new(io::ErrorKind::InvalidInput, format!("{name:?} cannot name a TLS server: {error}"))
    })?;
    let mut tls = ClientConnection::new(config.clone(), name).map_err(io::Error::other)?;
    // The writer encrypts whole batches: no cap on what it may queue.
    tls.set_buffer_limit(None);
    let mut socket = stream;
    while tls.is_handshaking() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "the TLS handshake timed out"));
        }
        stream.set_read_timeout(Some(left))?;
        stream.set_write_timeout(Some(left))?;
        match tls.complete_io(&mut socket) {
            Ok(_) => {}
            Err(error) if matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "the TLS handshake timed out"));
            }
            Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "closed by the server during the TLS handshake (does it serve TLS?)",
                ));
            }
            Err(error) => return Err(error),
        }
    }
    // Whatever the handshake left to send (the client's Finished) goes now.
    while tls.wants_write() {
        tls.write_tls(&mut socket)?;
    }
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    Ok(tls)
}

/// Encrypts `plaintext` into `ciphertext` (cleared first) with whatever
/// else the TLS state has to send.
pub(crate) fn encrypt(tls: &mut ClientConnection, plaintext: &[u8], ciphertext: &mut Vec<u8>) {
    if !plaintext.is_empty() {
        // No buffer limit is set, so the whole batch is taken.
        let _ = tls.writer().write_all(plaintext);
    }
    ciphertext.clear();
    while tls.wants_write() {
        if tls.write_tls(ciphertext).is_err() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_of_an_address_is_its_name_or_ip() {
        assert_eq!(host_of("db.example:7700"), "db.example");
        assert_eq!(host_of("127.0.0.1:7700"), "127.0.0.1");
        assert_eq!(host_of("[::1]:7700"), "::1");
        assert_eq!(host_of("db"), "db");
    }

    #[test]
    fn settings_without_a_ca_or_with_half_a_client_certificate_are_refused() {
        let mut files = TlsFiles::default();
        assert_eq!(files.incomplete(), None, "no TLS at all");
        files.cert = Some("c.pem".into());
        assert!(files.incomplete().unwrap().contains("tls_ca"));
        files.ca = Some("ca.pem".into());
        assert!(files.incomplete().unwrap().contains("tls_key"));
        files.key = Some("c.key".into());
        assert_eq!(files.incomplete(), None);
        files.server_name = Some("not a name".into());
        assert!(files.incomplete().unwrap().contains("tls_server_name"));
    }

    #[test]
    fn a_missing_ca_file_is_named() {
        let files = TlsFiles { ca: Some("/nonexistent/ca.pem".into()), ..TlsFiles::default() };
        let error = files.config().unwrap_err();
        assert!(error.contains("/nonexistent/ca.pem") && error.contains("tls_ca"), "{error}");
    }
}
