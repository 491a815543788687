//! Certificates made at test time: a certificate authority of the test's own, and a server
//! certificate it signs for `127.0.0.1` and `localhost`, as PEM files in a directory.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// The PEM files: `ca.pem` (what clients trust), `server.pem` and `server-key.pem`.
#[derive(Clone, Debug)]
pub struct TestCertificates {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestCertificates {
    /// A new authority and server certificate, written into `dir`.
    pub fn make(dir: &Path) -> TestCertificates {
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "delta test CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca_params.self_signed(&ca_key).expect("CA certificate");
        let issuer = Issuer::new(ca_params, ca_key);

        let key = KeyPair::generate().expect("server key");
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .expect("server params");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &issuer).expect("server certificate");

        let files = TestCertificates {
            ca: dir.join("ca.pem"),
            cert: dir.join("server.pem"),
            key: dir.join("server-key.pem"),
        };
        std::fs::write(&files.ca, ca_cert.pem()).expect("write ca.pem");
        std::fs::write(&files.cert, cert.pem()).expect("write server.pem");
        std::fs::write(&files.key, key.serialize_pem()).expect("write server-key.pem");
        files
    }

    /// The gateway's side, for [`delta_launcher::GatewaySpec::tls`].
    pub fn gateway(&self) -> delta_launcher::GatewayTls {
        delta_launcher::GatewayTls {
            cert: self.cert.clone(),
            key: self.key.clone(),
            ca: self.ca.clone(),
        }
    }

    /// The server side, for [`delta_launcher::servers::ServerOptions::tls`].
    pub fn server(&self) -> delta_launcher::Tls {
        delta_launcher::Tls {
            cert: self.cert.clone(),
            key: self.key.clone(),
        }
    }
}
