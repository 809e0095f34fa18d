//! The S3 side of `tessera bench`: PUT and GET over HTTP with SigV4 presigned URLs (rusty-s3)
//! and a pooled hyper client, so Tessera's gateway and any other S3 server (MinIO) are measured
//! by the same client.

use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use rusty_s3::{Bucket, Credentials, S3Action, UrlStyle};

/// How long a signed URL is valid; each request signs its own.
const SIGNATURE_TTL: Duration = Duration::from_secs(3600);

/// An S3 endpoint, bucket and credentials.
pub(crate) struct S3Target {
    bucket: Bucket,
    credentials: Credentials,
    http: Client<HttpConnector, Full<Bytes>>,
}

impl S3Target {
    pub(crate) fn new(endpoint: &str, bucket: &str, access_key: &str, secret_key: &str) -> anyhow::Result<Self> {
        let url: url::Url = endpoint.parse().with_context(|| format!("parse S3 endpoint {endpoint:?}"))?;
        let bucket = Bucket::new(url, UrlStyle::Path, bucket.to_owned(), "us-east-1")
            .map_err(|e| anyhow::anyhow!("S3 endpoint {endpoint:?}: {e}"))?;
        let http = Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_max_idle_per_host(256)
            .build(HttpConnector::new());
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
