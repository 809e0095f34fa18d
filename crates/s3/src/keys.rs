//! Who may do what: the root credentials, which may do anything, and the cluster's scoped
//! access keys (crate `access`), looked up through a short-lived cache and checked against
//! every request's operation and bucket (and a copy's source bucket).

use std::sync::Arc;
use std::time::{Duration, Instant};

use access::{AccessKey, Action, KeyStore, Secret};
use s3s::access::{S3Access, S3AccessContext};
use s3s::auth::{S3Auth, SecretKey};
use s3s::path::S3Path;
use s3s::{S3Error, S3ErrorCode, S3Result};

/// How long a gateway trusts what it looked up about a scoped key, found or not: a revoked key
/// is refused at most this long after `tessera key revoke`, a new key works at once (a key
/// nobody asked for before is not cached).
pub const KEY_CACHE_TTL: Duration = Duration::from_secs(5);
/// Keys (found or not) the cache holds; S3-FIFO keeps one-off unknown ids from pushing out
/// keys in use. Only ids of the shape `access` makes are looked up and cached (20 bytes each).
const KEY_CACHE_ENTRIES: usize = 4096;
/// Lookups of keys in the cluster at once (each a quorum read); more requests wait. Requests
/// for one key share its lookup.
const LOOKUPS_IN_FLIGHT_MAX: usize = 32;

/// A request extension the access check adds for a scoped key: ListBuckets shows its buckets
/// only.
#[derive(Clone, Debug)]
pub(crate) struct KeyScope(pub(crate) Arc<AccessKey>);

#[derive(Clone)]
struct Cached {
    fetched: Instant,
    key: Option<Arc<(AccessKey, Secret)>>,
}

/// The root credentials and the scoped keys, shared by the auth and the access check.
pub(crate) struct Keys {
    root_access_key: String,
    root_secret_key: String,
    store: KeyStore,
    cache: quick_cache::sync::Cache<String, Cached>,
    lookups: tokio::sync::Semaphore,
}

impl Keys {
    pub(crate) fn new(client: client::Client, root_access_key: String, root_secret_key: String) -> Arc<Self> {
        Arc::new(Self {
            root_access_key,
            root_secret_key,
            store: KeyStore::new(client),
            cache: quick_cache::sync::Cache::new(KEY_CACHE_ENTRIES),
            lookups: tokio::sync::Semaphore::new(LOOKUPS_IN_FLIGHT_MAX),
        })
    }

    /// The scoped key `id`; `None` when the cluster has no such key.
    async fn scoped(&self, id: &str) -> S3Result<Option<Arc<(AccessKey, Secret)>>> {
        if !access::is_key_id(id) {
            return Ok(None); // no key of ours: nothing to ask, nothing to cache
        }
        if let Some(cached) = self.cache.get(id) {
            if cached.fetched.elapsed() < KEY_CACHE_TTL {
                return Ok(cached.key);
            }
            // Stale: dropped, so that one request looks the key up while the others wait.
            self.cache.remove_if(id, |entry| entry.fetched == cached.fetched);
        }
        let guard = match self.cache.get_value_or_guard_async(id).await {
            Ok(cached) => return Ok(cached.key), // another request's lookup just ended
            Err(guard) => guard,
        };
        let _permit = self.lookups.acquire().await.expect("the semaphore is never closed");
        // The entry's age counts from before the lookup: a key revoked during it is refused
        // at most KEY_CACHE_TTL after the revocation.
        let started = Instant::now();
        let key = match self.store.find(id).await {
            Ok(found) => found.map(Arc::new),
            Err(access::Error::Cluster(e)) => {
                tracing::warn!(access_key = id, "cannot look up the access key: {e}");
                return Err(S3Error::with_message(
                    S3ErrorCode::ServiceUnavailable,
                    "The access key cannot be looked up now; retry later.",
                ));
            }
            Err(e) => {
                // A record that does not open was edited or damaged: refused, and said loudly.
                tracing::error!(access_key = id, "refusing the access key: {e}");
                None
            }
        };
        let _ = guard.insert(Cached { fetched: started, key: key.clone() });
        Ok(key)
    }
}

/// SigV4/SigV2 secrets: the root's, or a scoped key's. An unknown access key gets S3's
/// `InvalidAccessKeyId` (s3s's `SimpleAuth` answers `NotSignedUp`).
pub(crate) struct Auth(pub(crate) Arc<Keys>);

#[async_trait::async_trait]
impl S3Auth for Auth {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        let keys = &self.0;
        if access_key == keys.root_access_key {
            return Ok(SecretKey::from(keys.root_secret_key.as_str()));
        }
        match keys.scoped(access_key).await? {
            Some(found) => Ok(SecretKey::from(found.1.expose())),
            None => Err(s3s::s3_error!(
                InvalidAccessKeyId,
                "The AWS access key Id you provided does not exist in our records."
            )),
        }
    }
}

/// The access check s3s runs after the signature: records the operation for the metrics,
/// refuses anonymous requests (there is no anonymous access), lets the root do anything and a
/// scoped key what its permission allows in its buckets.
pub(crate) struct AccessCheck(pub(crate) Arc<Keys>);

#[async_trait::async_trait]
impl S3Access for AccessCheck {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        let operation = cx.s3_op().name().to_owned();
        let operation = operation.as_str();
        crate::metrics::record_operation(cx, operation);
        let Some(id) = cx.credentials().map(|credentials| credentials.access_key.clone()) else {
            return Err(s3s::s3_error!(AccessDenied, "Signature is required"));
        };
        if id == self.0.root_access_key {
            return Ok(());
        }
        let Some(found) = self.0.scoped(&id).await? else {
            return Err(s3s::s3_error!(
                InvalidAccessKeyId,
                "The AWS access key Id you provided does not exist in our records."
            ));
        };
        let key = &found.0;
        let action = Action::of_s3_operation(operation);
        let bucket = match cx.s3_path() {
            S3Path::Root => None,
            S3Path::Bucket { bucket } | S3Path::Object { bucket, .. } => Some(bucket.to_string()),
        };
        if !key.allows(bucket.as_deref(), action) {
            return Err(refused(key, operation, bucket.as_deref()));
        }
        if matches!(operation, "CopyObject" | "UploadPartCopy") {
            // The source is read: the key must reach its bucket too. A header s3s cannot parse
            // fails the request later; refusing it here names the key's scope instead.
            let source =
                cx.headers().get("x-amz-copy-source").and_then(|v| v.to_str().ok()).and_then(copy_source_bucket);
            match source {
                Some(source) if key.allows(Some(&source), Action::Read) => {}
                source => return Err(refused(key, "read the copy source", source.as_deref())),
            }
        }
        let scope = KeyScope(Arc::new(key.clone()));
        cx.extensions_mut().insert(scope);
        Ok(())
    }
}

fn refused(key: &AccessKey, what: &str, bucket: Option<&str>) -> S3Error {
    let place = bucket.map_or_else(String::new, |b| format!(" in bucket {b:?}"));
    let message = format!(
        "Access Denied: access key {} ({} on buckets {}) may not {what}{place}",
        key.id, key.permission, key.buckets
    );
    S3Error::with_message(S3ErrorCode::AccessDenied, message)
}

/// The bucket of an `x-amz-copy-source` header (`bucket/key` or `/bucket/key`, URL-encoded,
/// maybe with `?versionId=`).
fn copy_source_bucket(header: &str) -> Option<String> {
    let path = header.split_once('?').map_or(header, |(path, _)| path);
    let path = path.strip_prefix('/').unwrap_or(path);
    let (bucket, _key) = path.split_once('/')?;
    let decoded: String = form_urlencoded::parse(format!("b={bucket}").as_bytes()).next()?.1.into_owned();
    (!decoded.is_empty()).then_some(decoded)
}

#[cfg(test)]
mod tests {
    #[test]
    fn copy_sources_name_their_bucket() {
        use super::copy_source_bucket as bucket;
        assert_eq!(bucket("photos/a/b.jpg").as_deref(), Some("photos"));
        assert_eq!(bucket("/photos/a%2Fb.jpg?versionId=3").as_deref(), Some("photos"));
        assert_eq!(bucket("ph%6ftos/key").as_deref(), Some("photos"));
        assert_eq!(bucket("no-key"), None);
        assert_eq!(bucket("/"), None);
    }
}
