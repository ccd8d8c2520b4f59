//! TLS and authentication for the load generator: the rustls settings of
//! `--tls-ca`/`--tls-cert`/`--tls-key`/`--tls-server-name`, the blocking
//! opening of a connection (TCP, TLS handshake, `U` line), and the sealing
//! and opening of records for the io_uring loop, which sends a whole batch
//! of pipelined requests as one piece of ciphertext.
//!
//! rustls with the ring provider, as the server and the Rust client use.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::client::Resumption;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore};

/// What every connection of a run is opened with.
#[derive(Clone, Debug, Default)]
pub struct Security {
    pub tls: Option<Tls>,
    /// Sent as `U <secret>` (ringlock only) before any request.
    pub secret: Option<String>,
}

#[derive(Clone, Debug)]
pub struct Tls {
    pub config: Arc<ClientConfig>,
    pub server_name: ServerName<'static>,
}

/// The TLS flags of a command.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct TlsArgs {
    /// Speak TLS, checking the server's certificate against the CA
    /// certificates of this PEM file. Without it, plain TCP.
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,

    /// Client certificate (PEM), for a server that asks for one (mutual
    /// TLS); needs --tls-key.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// Private key (PEM) of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// The name the server's certificate must carry. Default: the IP
    /// address of --addr.
    #[arg(long)]
    pub tls_server_name: Option<String>,

    /// Secret sent as `U <secret>` on every ringlock connection before any
    /// request, for a server started with --auth-file. Default: the
    /// environment variable RINGLOCK_SECRET, if set and not empty.
    #[arg(long)]
    pub secret: Option<String>,
}

impl TlsArgs {
    /// The settings these flags give, for a server at `addr`.
    pub fn security(&self, addr: SocketAddr) -> Result<Security, String> {
        let secret =
            self.secret.clone().or_else(|| std::env::var("RINGLOCK_SECRET").ok().filter(|secret| !secret.is_empty()));
        let Some(ca) = &self.tls_ca else {
            if self.tls_cert.is_some() || self.tls_server_name.is_some() {
                return Err("--tls-cert and --tls-server-name need --tls-ca".into());
            }
            return Ok(Security { tls: None, secret });
        };
        let mut roots = RootCertStore::empty();
        for certificate in read_certificates(ca)? {
            roots.add(certificate).map_err(|error| format!("{}: unusable CA: {error}", ca.display()))?;
        }
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|error| error.to_string())?
            .with_root_certificates(roots);
        let mut config = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|error| format!("{}: no private key: {error}", key.display()))?;
                builder.with_client_auth_cert(read_certificates(cert)?, key).map_err(|error| error.to_string())?
            }
            _ => builder.with_no_client_auth(),
        };
        // Every connection makes a full handshake (what connect-rate measures).
        config.resumption = Resumption::disabled();
        let name = self.tls_server_name.clone().unwrap_or_else(|| addr.ip().to_string());
        let server_name =
            ServerName::try_from(name.clone()).map_err(|error| format!("--tls-server-name {name:?}: {error}"))?;
        Ok(Security { tls: Some(Tls { config: Arc::new(config), server_name }), secret })
    }
}

fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certificates = CertificateDer::pem_file_iter(path)
        .and_then(|certificates| certificates.collect::<Result<Vec<_>, _>>())
        .map_err(|error| format!("{}: {error}", path.display()))?;
    if certificates.is_empty() {
        return Err(format!("{}: no PEM certificate", path.display()));
    }
    Ok(certificates)
}

/// A connection opened with blocking calls: the socket and, with TLS, its
/// TLS state past the handshake.
pub struct Opened {
    pub stream: TcpStream,
    pub tls: Option<Box<ClientConnection>>,
}

impl Opened {
    /// Writes `bytes` (encrypted with TLS) and waits until they are sent.
    pub fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        match &mut self.tls {
            Some(tls) => {
                tls.writer().write_all(bytes)?;
                while tls.wants_write() {
                    tls.write_tls(&mut self.stream)?;
                }
                Ok(())
            }
            None => self.stream.write_all(bytes),
        }
    }

    /// Reads some bytes (decrypted with TLS); 0 at the end of the stream.
    pub fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        match &mut self.tls {
            Some(tls) => rustls::Stream::new(tls.as_mut(), &mut self.stream).read(out),
            None => self.stream.read(out),
        }
    }

    /// Reads up to and including the next `\n`, byte by byte over plain TCP
    /// so that nothing after it is taken from the socket (over TLS the rest
    /// stays in the TLS state).
    pub fn read_line(&mut self) -> io::Result<Vec<u8>> {
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while line.last() != Some(&b'\n') {
            if self.read(&mut byte)? == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed by the server"));
            }
            line.push(byte[0]);
            if line.len() > 1 << 20 {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "reply line too long"));
            }
        }
        Ok(line)
    }
}

/// Connects to `addr`, runs the TLS handshake and sends the secret as
/// `security` says, each step within `timeout`.
pub fn open(addr: SocketAddr, security: &Security, timeout: Duration) -> io::Result<Opened> {
    let stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let tls = match &security.tls {
        Some(settings) => {
            let mut tls = ClientConnection::new(settings.config.clone(), settings.server_name.clone())
                .map_err(io::Error::other)?;
            // The io_uring loop seals whole batches: no cap on them.
            tls.set_buffer_limit(None);
            let mut socket = &stream;
            while tls.is_handshaking() {
                tls.complete_io(&mut socket)?;
            }
            while tls.wants_write() {
                tls.write_tls(&mut socket)?;
            }
            Some(Box::new(tls))
        }
        None => None,
    };
    let mut opened = Opened { stream, tls };
    if let Some(secret) = &security.secret {
        opened.write_all(format!("U {secret}\n").as_bytes())?;
        let reply = opened.read_line()?;
        if !reply.starts_with(b"U ") {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("the secret was refused: {}", String::from_utf8_lossy(&reply).trim_end()),
            ));
        }
    }
    opened.stream.set_read_timeout(None)?;
    opened.stream.set_write_timeout(None)?;
    Ok(opened)
}

/// Encrypts `plaintext` and whatever else the TLS state has to send into
/// `ciphertext` (appended): a batch sealed at once.
pub fn seal(tls: &mut ClientConnection, plaintext: &[u8], ciphertext: &mut Vec<u8>) -> io::Result<()> {
    if !plaintext.is_empty() {
        tls.writer().write_all(plaintext)?;
    }
    while tls.wants_write() {
        tls.write_tls(ciphertext)?;
    }
    Ok(())
}

/// Decrypts the ciphertext `data` and appends its plaintext to `plaintext`.
pub fn open_records(tls: &mut ClientConnection, mut data: &[u8], plaintext: &mut Vec<u8>) -> io::Result<()> {
    while !data.is_empty() {
        tls.read_tls(&mut data)?;
        tls.process_new_packets().map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))?;
        match tls.reader().read_to_end(plaintext) {
            Ok(_) => {}
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}
