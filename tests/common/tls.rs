//! TLS test support, for the test files that include it with
//! `#[path = "common/tls.rs"] mod tls_support;` next to `mod common;`:
//! certificates made at run time with rcgen (never committed), rustls
//! client settings, and a protocol connection over TLS.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

use rcgen::{BasicConstraints, Certificate, CertificateParams, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

use crate::common::{DataDir, PATIENCE, Server};

/// A certificate authority made for one test.
pub struct Ca {
    certificate: Certificate,
    key: KeyPair,
}

/// A client's certificate chain and key, for mutual TLS.
pub struct ClientIdentity {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

impl Ca {
    pub fn new() -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        Ca { certificate: params.self_signed(&key).unwrap(), key }
    }

    pub fn der(&self) -> CertificateDer<'static> {
        self.certificate.der().clone()
    }

    pub fn pem(&self) -> String {
        self.certificate.pem()
    }

    /// A server certificate for `localhost` and 127.0.0.1, and its key, as PEM.
    pub fn server_pem(&self) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let certificate = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .unwrap()
            .signed_by(&key, &self.certificate, &self.key)
            .unwrap();
        (certificate.pem(), key.serialize_pem())
    }

    /// A client certificate whose subject alternative names are the DNS
    /// names `names`.
    pub fn client(&self, names: &[&str]) -> ClientIdentity {
        let key = KeyPair::generate().unwrap();
        let names = names.iter().map(|name| name.to_string()).collect::<Vec<_>>();
        let certificate = CertificateParams::new(names).unwrap().signed_by(&key, &self.certificate, &self.key).unwrap();
        ClientIdentity {
            chain: vec![certificate.der().clone()],
            key: PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
        }
    }
}

/// A CA, a server certificate for `localhost` and 127.0.0.1, and a client
/// certificate named `client`, the CA's and the server's as PEM files
/// (`ca.pem`, `server.pem`, `server.key`) in a directory of their own.
pub struct Certificates {
    pub dir: DataDir,
    pub authority: Ca,
    pub ca: CertificateDer<'static>,
    pub client: ClientIdentity,
}

impl Certificates {
    pub fn new() -> Certificates {
        let dir = DataDir::new();
        std::fs::create_dir_all(&dir.0).unwrap();
        let authority = Ca::new();
        let (server, server_key) = authority.server_pem();
        std::fs::write(dir.0.join("ca.pem"), authority.pem()).unwrap();
        std::fs::write(dir.0.join("server.pem"), server).unwrap();
        std::fs::write(dir.0.join("server.key"), server_key).unwrap();
        let client = authority.client(&["client"]);
        Certificates { ca: authority.der(), client, authority, dir }
    }

    pub fn path(&self, name: &str) -> String {
        self.dir.0.join(name).to_str().unwrap().to_string()
    }

    /// Writes `text` to the file `name` of the directory in one rename, as
    /// an operator's tools would replace it.
    pub fn replace(&self, name: &str, text: &str) {
        let draft = self.dir.0.join(format!("{name}.draft"));
        std::fs::write(&draft, text).unwrap();
        std::fs::rename(&draft, self.dir.0.join(name)).unwrap();
    }

    pub fn server_args(&self) -> Vec<String> {
        vec!["--tls-cert".into(), self.path("server.pem"), "--tls-key".into(), self.path("server.key")]
    }
}

/// Client settings that trust `root` only, with a client certificate if given.
pub fn client_config(root: &CertificateDer<'static>, identity: Option<&ClientIdentity>) -> Arc<ClientConfig> {
    let mut store = RootCertStore::empty();
    store.add(root.clone()).unwrap();
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(store);
    Arc::new(match identity {
        Some(identity) => builder.with_client_auth_cert(identity.chain.clone(), identity.key.clone_key()).unwrap(),
        None => builder.with_no_client_auth(),
    })
}

/// A protocol connection over TLS.
pub struct TlsConn {
    pub stream: StreamOwned<ClientConnection, TcpStream>,
    buffer: Vec<u8>,
}

impl TlsConn {
    pub fn connect(server: &Server, config: Arc<ClientConfig>) -> TlsConn {
        TlsConn::connect_to(server.addr, config)
    }

    pub fn connect_to(addr: SocketAddr, config: Arc<ClientConfig>) -> TlsConn {
        let tcp = TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(PATIENCE)).unwrap();
        let connection = ClientConnection::new(config, ServerName::try_from("localhost").unwrap()).unwrap();
        TlsConn { stream: StreamOwned::new(connection, tcp), buffer: Vec::new() }
    }

    pub fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)?;
        self.stream.flush()
    }

    /// Sends `bytes` from another thread, encrypted here first, so that
    /// this one can read meanwhile even if the server stops reading: the
    /// write's outcome is left to that thread (ignored).
    pub fn send_in_background(&mut self, bytes: &[u8]) -> std::thread::JoinHandle<()> {
        let connection = &mut self.stream.conn;
        connection.set_buffer_limit(None);
        connection.writer().write_all(bytes).unwrap();
        let mut ciphertext = Vec::new();
        while connection.wants_write() {
            connection.write_tls(&mut ciphertext).unwrap();
        }
        let mut socket = self.stream.sock.try_clone().unwrap();
        std::thread::spawn(move || {
            let _ = socket.write_all(&ciphertext);
        })
    }

    /// The next reply line, or the error that ended the stream.
    pub fn line(&mut self) -> std::io::Result<String> {
        loop {
            if let Some(end) = self.buffer.iter().position(|&byte| byte == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                return Ok(String::from_utf8(line).unwrap().trim_end().to_string());
            }
            let mut chunk = [0u8; 4096];
            let read = self.stream.read(&mut chunk)?;
            if read == 0 {
                return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "closed"));
            }
            self.buffer.extend_from_slice(&chunk[..read]);
        }
    }

    pub fn call(&mut self, line: &str) -> String {
        self.send(format!("{line}\n").as_bytes()).unwrap();
        self.line().unwrap()
    }

    /// The reply to `line`, or the error that ended the stream (a refused
    /// handshake shows here).
    pub fn try_call(&mut self, line: &str) -> std::io::Result<String> {
        self.send(format!("{line}\n").as_bytes())?;
        self.line()
    }
}
