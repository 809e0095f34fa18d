//! The S3 gateway: the S3 REST API over the Tessera smart client.
//!
//! The gateway is a smart client inside: every request becomes calls on a [`client::Client`],
//! which talks to the storage nodes directly. [`s3s`] does the HTTP side (routing, SigV4 and
//! aws-chunked bodies, XML); this crate implements its `S3` trait, one module per operation
//! family (`bucket`, `object`, `list`, `multipart`), and maps every `client::Error` to an S3
//! error in one `match` (`error`). Operations not implemented answer 501 NotImplemented.
//!
//! Bodies stream both ways with bounded memory: a PUT body goes through a verifying reader
//! (Content-MD5, `x-amz-checksum-*`, the signed SHA-256, all checked at the end of the stream
//! so that a mismatch aborts the PUT before anything is committed) into `Client::put`; a GET
//! body is read in windows of whole stripes with one window in flight ahead of the socket.
//!
//! Main types: [`Gateway`], [`GatewayConfig`], [`Error`].
//!
//! ```ignore
//! let gateway = s3::Gateway::bind(client, s3::GatewayConfig {
//!     listen: "127.0.0.1:9000".parse()?,
//!     access_key: "AKIA...".into(),
//!     secret_key: "...".into(),
//!     sigv2: s3::SigV2::Refused,
//!     relayout_rate: 64 << 20,
//!     region: s3::DEFAULT_REGION.into(),
//!     metrics: true,
//!     tls: None,
//!     domains: Vec::new(),
//! }).await?;
//! gateway.serve(std::future::pending()).await?;
//! ```

mod body;
mod bucket;
mod checksum;
mod conditional;
mod error;
mod host;
mod keys;
mod list;
mod metrics;
mod multipart;
mod object;
mod relayout;
mod select;
mod server;
mod tls;

use std::net::SocketAddr;
use std::sync::Arc;

pub use body::BODY_IDLE_TIMEOUT;
pub use keys::KEY_CACHE_TTL;
pub use metrics::{GatewayMetrics, Totals};
pub use server::{CONNECTIONS_MAX, HEADER_READ_TIMEOUT, SHUTDOWN_TIMEOUT, TLS_HANDSHAKE_TIMEOUT};
pub use tls::{CertSummary, EXPIRY_WARNING, TlsError, TlsFiles, server_config};

/// What a gateway serves and whom it lets in.
#[derive(Clone)]
pub struct GatewayConfig {
    /// Address to listen on (HTTP, or HTTPS with `tls`).
    pub listen: SocketAddr,
    /// Root access key (SigV4 and SigV2); required.
    pub access_key: String,
    /// Root secret key; required.
    pub secret_key: String,
    /// Whether requests signed with Signature Version 2 are served.
    pub sigv2: SigV2,
    /// Object bytes per second the background re-layout of uploaded Parquet objects rewrites
    /// (each row group into one chunk); 0 turns it off.
    pub relayout_rate: u64,
    /// The region the gateway answers as ([`DEFAULT_REGION`] unless set): every bucket's
    /// location, and how CreateBucket of a bucket that exists answers (200 in us-east-1,
    /// `BucketAlreadyOwnedByYou` elsewhere, as S3 does).
    pub region: String,
    /// Whether the gateway counts requests, bytes and latencies for [`Gateway::metrics`]; off,
    /// nothing is counted (and the metrics show zeros).
    pub metrics: bool,
    /// Serve HTTPS with this certificate and key instead of plain HTTP.
    pub tls: Option<TlsFiles>,
    /// Base domains for virtual-hosted-style requests besides `localhost`: `BUCKET.DOMAIN`
    /// names a bucket (SDKs that default to that style, AWS SDK for JavaScript v3 and Go v2,
    /// then work against a real host name). Each must be a DNS name ([`Error::BadDomain`]).
    pub domains: Vec<String>,
}

/// The region a gateway answers as unless told otherwise: S3's default, which SDKs sign for.
pub const DEFAULT_REGION: &str = "us-east-1";

/// The gateway's policy for Signature Version 2 (HMAC-SHA1, no payload hash, no scope).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SigV2 {
    /// Refused with S3's `InvalidRequest` (the default: SigV4 only).
    #[default]
    Refused,
    /// Served, with the request's `Date` within 15 minutes of the gateway's clock.
    Allowed,
}

impl std::fmt::Debug for GatewayConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayConfig")
            .field("listen", &self.listen)
            .field("access_key", &self.access_key)
            .field("secret_key", &"<redacted>")
            .field("sigv2", &self.sigv2)
            .field("relayout_rate", &self.relayout_rate)
            .field("region", &self.region)
            .field("metrics", &self.metrics)
            .field("tls", &self.tls)
            .field("domains", &self.domains)
            .finish()
    }
}

/// Why a gateway could not start or stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the gateway needs both an access key and a secret key")]
    MissingCredentials,
    #[error("access key must be 3 to {max} printable ASCII characters without spaces", max = ACCESS_KEY_BYTES_MAX)]
    InvalidAccessKey,
    #[error("secret key must be 8 to {max} printable ASCII characters without spaces", max = SECRET_KEY_BYTES_MAX)]
    InvalidSecretKey,
    #[error("listen on {addr}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("read the listening address: {0}")]
    LocalAddr(std::io::Error),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("--domain {0}")]
    BadDomain(String),
}

/// Longest access key accepted.
pub const ACCESS_KEY_BYTES_MAX: usize = 128;
/// Longest secret key accepted.
pub const SECRET_KEY_BYTES_MAX: usize = 128;

/// A bound S3 gateway, ready to serve.
pub struct Gateway {
    listener: tokio::net::TcpListener,
    service: s3s::service::S3Service,
    sigv2: SigV2,
    metrics: GatewayMetrics,
    tls: Option<(TlsReloader, CertSummary)>,
}

/// Reloads a gateway's certificate and key from their files (`tessera gateway` on SIGHUP): new
/// connections get the new certificate, connections already open keep theirs. A certificate
/// that does not load leaves the served one as it was.
#[derive(Clone)]
pub struct TlsReloader {
    files: TlsFiles,
    acceptor: SharedAcceptor,
}

/// The acceptor new connections take (one read per connection).
pub(crate) type SharedAcceptor = Arc<std::sync::RwLock<tokio_rustls::TlsAcceptor>>;

impl TlsReloader {
    /// Loads the files again (with every check made at start) and serves them from now on.
    pub fn reload(&self) -> Result<CertSummary, TlsError> {
        let (server_config, summary) = tls::load(&self.files, std::time::SystemTime::now())?;
        *self.acceptor.write().unwrap_or_else(std::sync::PoisonError::into_inner) =
            tokio_rustls::TlsAcceptor::from(server_config);
        Ok(summary)
    }
}

impl std::fmt::Debug for TlsReloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsReloader").field("files", &self.files).finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway").field("listener", &self.listener).finish_non_exhaustive()
    }
}

impl Gateway {
    /// Checks the credentials (and the TLS certificate and key) and binds the listening socket.
    pub async fn bind(client: client::Client, config: GatewayConfig) -> Result<Self, Error> {
        validate_credentials(&config.access_key, &config.secret_key)?;
        for domain in &config.domains {
            host::check_domain(domain).map_err(Error::BadDomain)?;
        }
        let tls = match &config.tls {
            Some(files) => {
                let (server_config, summary) = tls::load(files, std::time::SystemTime::now())?;
                let acceptor = Arc::new(std::sync::RwLock::new(tokio_rustls::TlsAcceptor::from(server_config)));
                Some((TlsReloader { files: files.clone(), acceptor }, summary))
            }
            None => None,
        };
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|source| Error::Bind { addr: config.listen, source })?;
        let metrics = GatewayMetrics::new(client.clone(), config.metrics);
        let service = server::build_service(client, &config);
        Ok(Self { listener, service, sigv2: config.sigv2, metrics, tls })
    }

    /// The address the gateway listens on (useful with port 0).
    pub fn local_addr(&self) -> Result<SocketAddr, Error> {
        self.listener.local_addr().map_err(Error::LocalAddr)
    }

    /// The certificate served, when the gateway serves HTTPS.
    pub fn certificate(&self) -> Option<&CertSummary> {
        self.tls.as_ref().map(|(_, summary)| summary)
    }

    /// What reloads the certificate while the gateway serves, when it serves HTTPS.
    pub fn tls_reloader(&self) -> Option<TlsReloader> {
        self.tls.as_ref().map(|(reloader, _)| reloader.clone())
    }

    /// Serves HTTP (HTTPS with a certificate) until `shutdown` completes, then lets requests in
    /// progress finish for up to [`SHUTDOWN_TIMEOUT`].
    pub async fn serve(self, shutdown: impl std::future::Future<Output = ()>) {
        let tls = self.tls.map(|(reloader, _)| reloader.acceptor);
        server::serve(self.listener, tls, self.service, self.sigv2, self.metrics, shutdown).await;
    }

    /// The gateway's metrics, to serve on another address ([`GatewayMetrics::render`]).
    pub fn metrics(&self) -> GatewayMetrics {
        self.metrics.clone()
    }
}

fn validate_credentials(access_key: &str, secret_key: &str) -> Result<(), Error> {
    if access_key.is_empty() || secret_key.is_empty() {
        return Err(Error::MissingCredentials);
    }
    let printable = |s: &str| s.bytes().all(|b| b.is_ascii_graphic());
    if access_key.len() < 3 || access_key.len() > ACCESS_KEY_BYTES_MAX || !printable(access_key) {
        return Err(Error::InvalidAccessKey);
    }
    if secret_key.len() < 8 || secret_key.len() > SECRET_KEY_BYTES_MAX || !printable(secret_key) {
        return Err(Error::InvalidSecretKey);
    }
    Ok(())
}

/// The `S3` implementation: a smart client and nothing else.
#[derive(Clone, Debug)]
struct Tessera {
    client: client::Client,
    relayer: Option<relayout::Relayer>,
    region: String,
}

impl Tessera {
    /// Offers an uploaded key (`in_parts`: by a multipart upload) to the background re-layout,
    /// if it runs.
    fn uploaded(&self, bucket: &str, key: &str, in_parts: bool) {
        if let Some(relayer) = &self.relayer {
            relayer.offer(bucket, key, in_parts);
        }
    }
}

#[cfg(test)]
mod tests;
