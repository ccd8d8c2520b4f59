//! Certificates for the TLS tests, made by rcgen when a test starts and
//! written as PEM files into a directory of their own (removed with it):
//! no key is ever committed.
//!
//! - `ca.pem`: the CA; `server.pem`/`server.key`: a server certificate for
//!   `localhost` and 127.0.0.1 signed by it; `client.pem`/`client.key`: a
//!   client certificate signed by it;
//! - `other-ca.pem`: an unrelated CA, which signed nothing here;
//! - `expired.pem`/`expired.key`: a server certificate of the CA for the
//!   same names, expired since 2020;
//! - `wrong-name.pem`/`wrong-name.key`: a server certificate of the CA for
//!   `elsewhere.example` only.

use rcgen::{BasicConstraints, Certificate, CertificateParams, DnType, IsCa, KeyPair, date_time_ymd};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::DataDir;

pub struct Certificates {
    pub dir: DataDir,
    pub ca: CertificateDer<'static>,
    pub client_chain: Vec<CertificateDer<'static>>,
    pub client_key: PrivateKeyDer<'static>,
}

/// The server's names: what a test client connects to.
const SERVER_NAMES: [&str; 2] = ["localhost", "127.0.0.1"];

/// A self-signed CA named `name` (two CAs of one name would look like one
/// to a client, which would then see a bad signature, not an unknown CA).
fn new_ca(name: &str) -> (Certificate, KeyPair) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    (params.self_signed(&key).unwrap(), key)
}

impl Certificates {
    pub fn new() -> Certificates {
        let dir = DataDir::new();
        std::fs::create_dir_all(&dir.0).unwrap();
        let write = |name: &str, pem: String| std::fs::write(dir.0.join(name), pem).unwrap();
        let (ca, ca_key) = new_ca("ringlock test CA");
        let sign = |names: &[&str], edit: &dyn Fn(&mut CertificateParams)| {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(names.iter().map(ToString::to_string).collect::<Vec<_>>()).unwrap();
            edit(&mut params);
            (params.signed_by(&key, &ca, &ca_key).unwrap(), key)
        };
        let (server, server_key) = sign(&SERVER_NAMES, &|_| {});
        let (client, client_key) = sign(&["client"], &|_| {});
        let (expired, expired_key) = sign(&SERVER_NAMES, &|params| {
            params.not_before = date_time_ymd(2019, 1, 1);
            params.not_after = date_time_ymd(2020, 1, 1);
        });
        let (wrong_name, wrong_name_key) = sign(&["elsewhere.example"], &|_| {});
        let (other_ca, _) = new_ca("unrelated test CA");
        write("ca.pem", ca.pem());
        write("server.pem", server.pem());
        write("server.key", server_key.serialize_pem());
        write("client.pem", client.pem());
        write("client.key", client_key.serialize_pem());
        write("other-ca.pem", other_ca.pem());
        write("expired.pem", expired.pem());
        write("expired.key", expired_key.serialize_pem());
        write("wrong-name.pem", wrong_name.pem());
        write("wrong-name.key", wrong_name_key.serialize_pem());
        Certificates {
            ca: ca.der().clone(),
            client_chain: vec![client.der().clone()],
            client_key: PrivateKeyDer::try_from(client_key.serialize_der()).unwrap(),
            dir,
        }
    }

    /// The path of one of the files.
    pub fn path(&self, name: &str) -> String {
        self.dir.0.join(name).to_str().unwrap().to_string()
    }

    /// The server flags serving `cert`/`key` (such as `server.pem`, `server.key`).
    pub fn server_args_with(&self, cert: &str, key: &str) -> Vec<String> {
        vec!["--tls-cert".into(), self.path(cert), "--tls-key".into(), self.path(key)]
    }

    /// The server flags of TLS with the good server certificate.
    pub fn server_args(&self) -> Vec<String> {
        self.server_args_with("server.pem", "server.key")
    }
}

/// One peer certificate for a whole set of nodes, as a Kubernetes
/// StatefulSet's pods share one Secret: `peer-ca.pem`, and `peer-set.pem`/
/// `peer-set.key` of that CA naming every host of `names`, written into a
/// directory of their own (removed with the returned value).
pub fn shared_peer_certificate(names: &[&str]) -> DataDir {
    let dir = DataDir::new();
    std::fs::create_dir_all(&dir.0).unwrap();
    let (ca, ca_key) = new_ca("ringlock peer set test CA");
    let key = KeyPair::generate().unwrap();
    let params = CertificateParams::new(names.iter().map(ToString::to_string).collect::<Vec<_>>()).unwrap();
    let certificate = params.signed_by(&key, &ca, &ca_key).unwrap();
    std::fs::write(dir.0.join("peer-ca.pem"), ca.pem()).unwrap();
    std::fs::write(dir.0.join("peer-set.pem"), certificate.pem()).unwrap();
    std::fs::write(dir.0.join("peer-set.key"), key.serialize_pem()).unwrap();
    dir
}
