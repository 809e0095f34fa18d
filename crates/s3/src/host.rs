//! Virtual-hosted-style addressing: `BUCKET.DOMAIN[:PORT]` names a bucket, for `localhost` and
//! each domain the gateway was given (`tessera gateway --domain example.com`, as MinIO's
//! `MINIO_DOMAIN`); every other host (an IP address, a bare domain, a machine name) means
//! path-style `/BUCKET/KEY`.

use s3s::S3Result;
use s3s::host::{S3Host, VirtualHost};

/// The base domains whose subdomains name buckets; a host under none of them is taken as
/// path-style rather than as a bucket name (s3s's `SingleDomain` would read any unknown host
/// as a bucket).
#[derive(Debug)]
pub(crate) struct BucketHosts {
    /// Lowercase, `localhost` first.
    domains: Vec<String>,
    port: u16,
}

const LOCAL_DOMAIN: &str = "localhost";

impl BucketHosts {
    /// `localhost` and `domains` (checked by [`check_domain`]) on `port`.
    pub(crate) fn new(domains: &[String], port: u16) -> Self {
        let mut all = vec![LOCAL_DOMAIN.to_owned()];
        all.extend(domains.iter().map(|d| d.to_ascii_lowercase()).filter(|d| d != LOCAL_DOMAIN));
        Self { domains: all, port }
    }
}

impl S3Host for BucketHosts {
    fn parse_host_header<'a>(&'a self, host: &'a str) -> S3Result<VirtualHost<'a>> {
        Ok(match bucket_of_host(host, &self.domains, self.port) {
            Some(bucket) => VirtualHost::new(host).with_bucket(bucket),
            None => VirtualHost::new(host),
        })
    }
}

/// The bucket a `Host` header names, if it is `BUCKET.DOMAIN` for one of `domains` (lowercase),
/// with the gateway's `port` or without a port. Host names compare without case.
pub(crate) fn bucket_of_host<'a>(host: &'a str, domains: &[String], port: u16) -> Option<&'a str> {
    let name = match host.rsplit_once(':') {
        Some((name, p)) if p == port.to_string() => name,
        Some(_) => return None,
        None => host,
    };
    domains.iter().find_map(|domain| {
        let cut = name.len().checked_sub(domain.len() + 1)?;
        let (bucket, dot_domain) = (name.get(..cut)?, name.get(cut..)?);
        let matches = dot_domain.strip_prefix('.').is_some_and(|d| d.eq_ignore_ascii_case(domain));
        (matches && !bucket.is_empty()).then_some(bucket)
    })
}

/// Checks a base domain given to the gateway: DNS labels of letters, digits and hyphens, at
/// least one dot unless it is `localhost`; no port, no scheme.
pub(crate) fn check_domain(domain: &str) -> Result<(), String> {
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    if domain.len() > 253 || !domain.split('.').all(label_ok) {
        return Err(format!("{domain:?} is not a domain name (letters, digits, hyphens and dots; no port or scheme)"));
    }
    Ok(())
}
