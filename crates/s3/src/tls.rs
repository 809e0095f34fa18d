//! HTTPS for the gateway: a certificate chain and its private key from PEM files, served with
//! rustls (ring provider, TLS 1.2 and 1.3, HTTP/1.1 by ALPN).
//!
//! Everything that can be wrong with the files is found at start, each as one line of error:
//! a missing or unreadable file, a file without a certificate or key, a certificate that has
//! expired or is not valid yet, a key that does not belong to the certificate. A certificate
//! that expires within [`EXPIRY_WARNING`] starts with a warning. The files are read once: a
//! renewed certificate takes a restart.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A certificate that expires sooner than this starts the gateway with a warning.
pub const EXPIRY_WARNING: Duration = Duration::from_secs(14 * 24 * 3600);

/// Where the gateway's certificate chain (leaf first) and its private key are, both PEM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Why the certificate or key cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("read the TLS certificate {path}: {source}")]
    ReadCert { path: PathBuf, source: std::io::Error },
    #[error("the TLS certificate file {path} holds no PEM certificate")]
    NoCert { path: PathBuf },
    #[error("the TLS certificate {path} cannot be parsed: {reason}")]
    BadCert { path: PathBuf, reason: String },
    #[error("the TLS certificate {path} expired on {when}")]
    Expired { path: PathBuf, when: String },
    #[error("the TLS certificate {path} is not valid before {when}")]
    NotYetValid { path: PathBuf, when: String },
    #[error("read the TLS key {path}: {source}")]
    ReadKey { path: PathBuf, source: std::io::Error },
    #[error("the TLS key file {path} holds no PEM private key: {reason}")]
    NoKey { path: PathBuf, reason: String },
    #[error("the TLS key {key} does not belong to the certificate {cert}")]
    Mismatch { cert: PathBuf, key: PathBuf },
    #[error("the TLS certificate {cert} and key {key} cannot be served: {reason}")]
    Unusable { cert: PathBuf, key: PathBuf, reason: String },
}

/// What the gateway tells about the certificate it serves.
#[derive(Clone, Debug)]
pub struct CertSummary {
    /// The leaf certificate's subject.
    pub subject: String,
    /// When the leaf certificate expires.
    pub not_after: SystemTime,
}

/// Reads and checks the files; the server configuration to serve them with.
/// The rustls configuration of `files` (checked as the gateway checks them at start), for
/// another listener of the same process to serve with the gateway's certificate (the console).
pub fn server_config(files: &TlsFiles) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    load(files, SystemTime::now()).map(|(config, _)| config)
}

pub(crate) fn load(files: &TlsFiles, now: SystemTime) -> Result<(Arc<rustls::ServerConfig>, CertSummary), TlsError> {
    let cert_pem =
        std::fs::read(&files.cert).map_err(|source| TlsError::ReadCert { path: files.cert.clone(), source })?;
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::BadCert { path: files.cert.clone(), reason: e.to_string() })?;
    let Some(leaf) = chain.first() else {
        return Err(TlsError::NoCert { path: files.cert.clone() });
    };
    let summary = check_validity(&files.cert, leaf, now)?;
    let key_pem = std::fs::read(&files.key).map_err(|source| TlsError::ReadKey { path: files.key.clone(), source })?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| TlsError::NoKey { path: files.key.clone(), reason: e.to_string() })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Unusable { cert: files.cert.clone(), key: files.key.clone(), reason: e.to_string() })?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => {
                TlsError::Mismatch { cert: files.cert.clone(), key: files.key.clone() }
            }
            other => TlsError::Unusable { cert: files.cert.clone(), key: files.key.clone(), reason: other.to_string() },
        })?;
    // HTTP/1.1 only (the server serves TLS connections with `http1_only` too): the gateway's
    // answers use `Connection: close`, which HTTP/2 forbids, and S3 clients speak HTTP/1.1.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((Arc::new(config), summary))
}

/// The leaf's validity against `now`.
fn check_validity(path: &Path, leaf: &CertificateDer<'_>, now: SystemTime) -> Result<CertSummary, TlsError> {
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref())
        .map_err(|e| TlsError::BadCert { path: path.to_owned(), reason: e.to_string() })?;
    let validity = cert.validity();
    let at = |secs: i64| UNIX_EPOCH + Duration::from_secs(secs.max(0).unsigned_abs());
    let (not_before, not_after) = (at(validity.not_before.timestamp()), at(validity.not_after.timestamp()));
    if now > not_after {
        return Err(TlsError::Expired { path: path.to_owned(), when: httpdate::fmt_http_date(not_after) });
    }
    if now < not_before {
        return Err(TlsError::NotYetValid { path: path.to_owned(), when: httpdate::fmt_http_date(not_before) });
    }
    Ok(CertSummary { subject: cert.subject().to_string(), not_after })
}
