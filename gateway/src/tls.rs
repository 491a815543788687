//! The gateway's own TLS (`DELTA_GATEWAY_TLS_CERT`, `DELTA_GATEWAY_TLS_KEY`): bearer tokens and
//! stream tickets must not cross a network in clear (issue 14, finding 10).
//!
//! The files are read once at start, and every problem is a start-up error that names the file
//! and says what to do (exit 64), never a panic. The handshake itself happens in the accept loop
//! ([`crate::serve`]), inside the connection's slot and under the header-read timeout: a client
//! that opens TCP and never finishes a handshake holds a slot no longer than one that never sends
//! its headers.
//!
//! rustls with the ring provider, as everywhere in the workspace (no aws-lc, no OpenSSL): TLS 1.2
//! and 1.3, ALPN `http/1.1` (the gateway speaks HTTP/1 only).

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A server TLS configuration, ready for the accept loop.
pub type ServerConfig = Arc<rustls::ServerConfig>;

/// Reads a PEM certificate chain (the server's certificate first, then its intermediates) and
/// its PEM private key (PKCS#8, PKCS#1 or SEC1), and checks that they belong together. The error
/// names the file at fault and what to do, never the key's contents.
pub fn load(cert_file: &Path, key_file: &Path) -> Result<ServerConfig, String> {
    let cert_bytes = std::fs::read(cert_file).map_err(|e| {
        format!(
            "{}: cannot read the TLS certificate chain (DELTA_GATEWAY_TLS_CERT): {e}; give a PEM file readable by the gateway",
            cert_file.display()
        )
    })?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| {
            format!(
                "{}: not a PEM certificate chain (DELTA_GATEWAY_TLS_CERT): {e}; give the server's certificate, then its intermediates, each `-----BEGIN CERTIFICATE-----`",
                cert_file.display()
            )
        })?;
    if chain.is_empty() {
        return Err(format!(
            "{}: holds no `-----BEGIN CERTIFICATE-----` block (DELTA_GATEWAY_TLS_CERT); give the server's certificate chain in PEM",
            cert_file.display()
        ));
    }
    let key_bytes = std::fs::read(key_file).map_err(|e| {
        format!(
            "{}: cannot read the TLS private key (DELTA_GATEWAY_TLS_KEY): {e}; give a PEM file readable by the gateway (and by nobody else)",
            key_file.display()
        )
    })?;
    // The key's own parse error could quote what it read: say only what was expected.
    let key = PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|_| {
        format!(
            "{}: holds no PEM private key (DELTA_GATEWAY_TLS_KEY); give the certificate's key as `-----BEGIN PRIVATE KEY-----` (PKCS#8), `RSA PRIVATE KEY` or `EC PRIVATE KEY`",
            key_file.display()
        )
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("cannot set up TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| {
            format!(
                "{} and {}: the certificate and the key do not make a usable pair ({e}); give the key that belongs to the chain's first certificate",
                cert_file.display(),
                key_file.display()
            )
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreadable_or_malformed_files_are_named_and_explained() {
        let dir = tempfile::tempdir().expect("tmp");
        let missing = dir.path().join("missing.pem");
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "not a certificate\n").expect("write");
        let e = load(&missing, &garbage).expect_err("missing cert");
        assert!(
            e.contains("missing.pem") && e.contains("DELTA_GATEWAY_TLS_CERT"),
            "{e}"
        );
        let e = load(&garbage, &garbage).expect_err("no certificate");
        assert!(
            e.contains("garbage.pem") && e.contains("BEGIN CERTIFICATE"),
            "{e}"
        );
    }
}
