//! Virtual-hosted-style addressing: `BUCKET.localhost[:PORT]` names a bucket; every other host
//! (an IP address, `localhost`, a machine name) means path-style `/BUCKET/KEY`.

use s3s::S3Result;
use s3s::host::{S3Host, VirtualHost};

/// The base domain is `localhost`; a host that does not end in it is taken as path-style rather
/// than as a bucket name (s3s's `SingleDomain` would read any unknown host as a bucket).
#[derive(Debug)]
pub(crate) struct LocalHost {
    with_port: String,
}

const BASE_DOMAIN: &str = "localhost";

impl LocalHost {
    pub(crate) fn new(port: u16) -> Self {
        Self { with_port: format!("{BASE_DOMAIN}:{port}") }
    }
}

impl S3Host for LocalHost {
    fn parse_host_header<'a>(&'a self, host: &'a str) -> S3Result<VirtualHost<'a>> {
        Ok(match bucket_of_host(host, &self.with_port) {
            Some(bucket) => VirtualHost::new(host).with_bucket(bucket),
            None => VirtualHost::new(host),
        })
    }
}

/// The bucket a `Host` header names, if it is `BUCKET.localhost` (with the gateway's port or
/// without a port).
pub(crate) fn bucket_of_host<'a>(host: &'a str, base_with_port: &str) -> Option<&'a str> {
    let bucket = host
        .strip_suffix(base_with_port)
        .or_else(|| host.strip_suffix(BASE_DOMAIN))
        .and_then(|rest| rest.strip_suffix('.'))?;
    (!bucket.is_empty()).then_some(bucket)
}
