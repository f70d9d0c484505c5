//! The gateway's TLS: a certificate chain and its private key, read from PEM files the user
//! gives (`--tls-cert`, `--tls-key`), served with rustls (TLS 1.3). A gateway reachable from
//! other machines must serve it, since every request carries the bearer token.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The PEM files a gateway serves TLS with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, leaf first.
    pub cert: PathBuf,
    /// The leaf's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// A loaded certificate and key, ready to accept connections.
#[derive(Clone)]
pub struct GatewayTls(pub(crate) tokio_rustls::TlsAcceptor);

impl std::fmt::Debug for GatewayTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GatewayTls")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{0} holds no certificate (a PEM file with BEGIN CERTIFICATE is expected)")]
    NoCertificate(String),
    #[error("{0} holds no private key (a PEM file with BEGIN PRIVATE KEY is expected)")]
    NoKey(String),
    #[error("{path} is not a valid PEM file: {why}")]
    Malformed { path: String, why: String },
    #[error("the certificate and key cannot be used together: {0}")]
    Rejected(rustls::Error),
}

impl TlsFiles {
    /// Reads both files and checks that the key belongs to the certificate.
    pub fn load(&self) -> Result<GatewayTls, TlsError> {
        let certs = CertificateDer::pem_file_iter(&self.cert)
            .map_err(|e| pem_error(&self.cert, e, TlsError::NoCertificate))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| pem_error(&self.cert, e, TlsError::NoCertificate))?;
        if certs.is_empty() {
            return Err(TlsError::NoCertificate(shown(&self.cert)));
        }
        let key = PrivateKeyDer::from_pem_file(&self.key)
            .map_err(|e| pem_error(&self.key, e, TlsError::NoKey))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Rejected)?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(TlsError::Rejected)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(GatewayTls(tokio_rustls::TlsAcceptor::from(Arc::new(
            config,
        ))))
    }
}

fn shown(path: &Path) -> String {
    path.display().to_string()
}

fn pem_error(path: &Path, e: pem::Error, none: fn(String) -> TlsError) -> TlsError {
    match e {
        pem::Error::Io(source) => TlsError::Read {
            path: shown(path),
            source,
        },
        pem::Error::NoItemsFound => none(shown(path)),
        other => TlsError::Malformed {
            path: shown(path),
            why: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_empty_or_swapped_files_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let files = TlsFiles {
            cert: dir.path().join("missing.pem"),
            key: empty.clone(),
        };
        let e = files.load().unwrap_err().to_string();
        assert!(
            e.contains("cannot read") && e.contains("missing.pem"),
            "{e}"
        );
        let files = TlsFiles {
            cert: empty.clone(),
            key: empty.clone(),
        };
        let e = files.load().unwrap_err().to_string();
        assert!(
            e.contains("no certificate") && e.contains("empty.pem"),
            "{e}"
        );
    }
}
