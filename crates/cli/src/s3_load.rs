//! The S3 side of `tessera bench`: PUT and GET over HTTP with SigV4 presigned URLs (rusty-s3)
//! and a pooled hyper client, so Tessera's gateway and any other S3 server (MinIO) are measured
//! by the same client.

use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;
use rusty_s3::{Bucket, Credentials, S3Action, UrlStyle};

/// How long a signed URL is valid; each request signs its own.
const SIGNATURE_TTL: Duration = Duration::from_secs(3600);

/// An S3 endpoint, bucket and credentials.
pub(crate) struct S3Target {
    bucket: Bucket,
    credentials: Credentials,
    /// HTTP or HTTPS, as the endpoint says.
    http: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl S3Target {
    /// `ca_bundle`: PEM certificates to trust for an https endpoint instead of the system's.
    pub(crate) fn new(
        endpoint: &str,
        bucket: &str,
        access_key: &str,
        secret_key: &str,
        ca_bundle: Option<&std::path::Path>,
    ) -> anyhow::Result<Self> {
        let url: url::Url = endpoint.parse().with_context(|| format!("parse S3 endpoint {endpoint:?}"))?;
        if !matches!(url.scheme(), "http" | "https") {
            bail!("S3 endpoint {endpoint:?}: the scheme must be http or https");
        }
        let bucket = Bucket::new(url, UrlStyle::Path, bucket.to_owned(), "us-east-1")
            .map_err(|e| anyhow::anyhow!("S3 endpoint {endpoint:?}: {e}"))?;
        let http = Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_max_idle_per_host(256)
            .build(https_connector(ca_bundle)?);
        Ok(Self { bucket, credentials: Credentials::new(access_key, secret_key), http })
    }

    /// Creates the bucket; one that exists already is fine.
    pub(crate) async fn make_bucket(&self) -> anyhow::Result<()> {
        let url = self.bucket.create_bucket(&self.credentials).sign(SIGNATURE_TTL);
        let response = self.send(hyper::Method::PUT, url, Bytes::new()).await?;
        let status = response.status();
        let body = response.into_body().collect().await.context("read CreateBucket response")?.to_bytes();
        if status.is_success() || (status == 409 && String::from_utf8_lossy(&body).contains("BucketAlreadyOwnedByYou"))
        {
            return Ok(());
        }
        bail!("CreateBucket answered {status}: {}", String::from_utf8_lossy(&body));
    }

    pub(crate) async fn put(&self, key: &str, body: Bytes) -> anyhow::Result<()> {
        let url = self.bucket.put_object(Some(&self.credentials), key).sign(SIGNATURE_TTL);
        let response = self.send(hyper::Method::PUT, url, body).await?;
        let status = response.status();
        let body = response.into_body().collect().await.context("read PutObject response")?.to_bytes();
        if !status.is_success() {
            bail!("PutObject {key} answered {status}: {}", String::from_utf8_lossy(&body));
        }
        Ok(())
    }

    /// Reads the object into `buf`; fails if it does not fit.
    pub(crate) async fn get(&self, key: &str, buf: &mut [u8]) -> anyhow::Result<usize> {
        let url = self.bucket.get_object(Some(&self.credentials), key).sign(SIGNATURE_TTL);
        let response = self.send(hyper::Method::GET, url, Bytes::new()).await?;
        let status = response.status();
        let mut body = response.into_body();
        if !status.is_success() {
            let text = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
            bail!("GetObject {key} answered {status}: {}", String::from_utf8_lossy(&text));
        }
        let mut filled = 0;
        while let Some(frame) = body.frame().await {
            let frame = frame.context("read GetObject body")?;
            if let Some(data) = frame.data_ref() {
                let Some(target) = buf.get_mut(filled..filled + data.len()) else {
                    bail!("GetObject {key} returned more than {} bytes", buf.len());
                };
                target.copy_from_slice(data);
                filled += data.len();
            }
        }
        Ok(filled)
    }

    async fn send(
        &self,
        method: hyper::Method,
        url: url::Url,
        body: Bytes,
    ) -> anyhow::Result<hyper::Response<hyper::body::Incoming>> {
        let request = hyper::Request::builder()
            .method(method)
            .uri(url.as_str())
            .body(Full::new(body))
            .context("build an HTTP request")?;
        self.http.request(request).await.with_context(|| format!("HTTP request to {}", url.host_str().unwrap_or("?")))
    }
}

/// A connector for http:// and https:// URLs: TLS (ring provider, HTTP/1.1) trusting the
/// certificates of `ca_bundle`, or the system's when there is none.
fn https_connector(ca_bundle: Option<&std::path::Path>) -> anyhow::Result<HttpsConnector<HttpConnector>> {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let config = match ca_bundle {
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(path).with_context(|| format!("read {}", path.display()))? {
                let cert = cert.with_context(|| format!("{} holds a malformed PEM certificate", path.display()))?;
                roots.add(cert).with_context(|| format!("a certificate of {}", path.display()))?;
            }
            if roots.is_empty() {
                bail!("{} holds no PEM certificate", path.display());
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            let mut roots = rustls::RootCertStore::empty();
            let (added, _) = roots.add_parsable_certificates(native.certs);
            if added == 0 {
                tracing::warn!("no system CA certificates found; https endpoints will fail (give --ca-bundle)");
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
    };
    Ok(hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config).https_or_http().enable_http1().build())
}
