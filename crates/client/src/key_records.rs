//! Records of the gateway's scoped access keys, stored as objects of the internal bucket
//! [`ACCESS_KEYS_BUCKET`] (erasure-coded, repaired and listed as any object), one per access
//! key id, so every gateway of the cluster sees the same keys. The record's format and the
//! sealing of its secret belong to the `access` crate; this module only stores bytes.

use futures_util::StreamExt as _;
use proto::Request;

use crate::{Client, Error, PutOptions};

/// Internal bucket of access key records. Its leading dot makes it an invalid S3 bucket name,
/// so no S3 request can reach it, and listings of buckets leave it out.
pub const ACCESS_KEYS_BUCKET: &str = ".tessera-access-keys";
/// Largest record read back; records are a few hundred bytes.
pub const KEY_RECORD_BYTES_MAX: u64 = 64 << 10;
/// Most records [`Client::access_key_records`] returns; past it the listing fails rather than
/// leave keys out.
pub const KEY_RECORDS_MAX: usize = 10_000;
/// Records read at once by [`Client::access_key_records`].
const RECORDS_IN_FLIGHT: usize = 16;

/// Access key ids are 16 to 128 ASCII letters and digits (S3's rule), which also keeps them
/// plain object keys.
fn check_id(id: &str) -> Result<(), Error> {
    if (16..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Ok(());
    }
    Err(Error::InvalidName(proto::NameError::Key { reason: format!("invalid access key id {id:?}") }))
}

impl Client {
    /// Stores the record of access key `id`, replacing any record it had.
    pub async fn put_access_key_record(&self, id: &str, record: &[u8]) -> Result<(), Error> {
        check_id(id)?;
        assert!(record.len() as u64 <= KEY_RECORD_BYTES_MAX, "an access key record is small");
        self.with_map(|c| async move {
            let create = Request::BucketCreate { bucket: ACCESS_KEYS_BUCKET.into() };
            c.bucket_call(&create, ACCESS_KEYS_BUCKET).await?;
            let mut source = record;
            // A plain object replaces no multipart pieces.
            crate::put::put(&c, ACCESS_KEYS_BUCKET, id, &mut source, &PutOptions::default()).await?;
            Ok(())
        })
        .await
    }

    /// The record of access key `id`; `None` when there is none (never created, or revoked).
    pub async fn access_key_record(&self, id: &str) -> Result<Option<Vec<u8>>, Error> {
        check_id(id)?;
        let info = match self.with_map(|c| async move { c.head_inner(ACCESS_KEYS_BUCKET, id).await }).await {
            Ok(info) => info,
            Err(Error::NotFound { .. } | Error::NoSuchBucket { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        if info.meta.size > KEY_RECORD_BYTES_MAX {
            let size = info.meta.size;
            return Err(Error::KeyRecords(format!(
                "the record of {id} has {size} bytes, at most {KEY_RECORD_BYTES_MAX}"
            )));
        }
        let mut buf = vec![0u8; info.meta.size as usize];
        let read = self.read_at(&info, 0, &mut buf).await?;
        buf.truncate(read);
        Ok(Some(buf))
    }

    /// The ids of every access key record, sorted (at most [`KEY_RECORDS_MAX`] + 1: one more
    /// than the bound says there are too many).
    pub async fn access_key_ids(&self) -> Result<Vec<String>, Error> {
        let mut ids = Vec::new();
        let mut start_after = String::new();
        loop {
            let listed = self
                .with_map(|c| {
                    let start_after = start_after.clone();
                    async move { c.list_inner(ACCESS_KEYS_BUCKET, "", &start_after, proto::LIST_LIMIT_MAX).await }
                })
                .await;
            let page = match listed {
                Ok(page) => page,
                Err(Error::NoSuchBucket { .. }) => return Ok(Vec::new()),
                Err(e) => return Err(e),
            };
            ids.extend(page.entries.into_iter().map(|entry| entry.key));
            if ids.len() > KEY_RECORDS_MAX {
                ids.truncate(KEY_RECORDS_MAX + 1);
                return Ok(ids);
            }
            match page.next_start_after {
                Some(next) => start_after = next,
                None => return Ok(ids),
            }
        }
    }

    /// Every access key record, sorted by id.
    pub async fn access_key_records(&self) -> Result<Vec<(String, Vec<u8>)>, Error> {
        let ids = self.access_key_ids().await?;
        if ids.len() > KEY_RECORDS_MAX {
            return Err(Error::KeyRecords(format!("more than {KEY_RECORDS_MAX} keys")));
        }
        let reads = futures_util::stream::iter(ids)
            .map(|id| async move {
                let record = self.access_key_record(&id).await;
                (id, record)
            })
            .buffered(RECORDS_IN_FLIGHT)
            .collect::<Vec<_>>()
            .await;
        let mut records = Vec::with_capacity(reads.len());
        for (id, record) in reads {
            // A record revoked between the listing and its read is gone: left out.
            if let Some(record) = record? {
                records.push((id, record));
            }
        }
        Ok(records)
    }

    /// Deletes the record of access key `id`; false when it had none.
    pub async fn delete_access_key_record(&self, id: &str) -> Result<bool, Error> {
        if self.access_key_record(id).await?.is_none() {
            return Ok(false);
        }
        self.with_map(|c| async move {
            crate::put::delete(&c, ACCESS_KEYS_BUCKET, id).await?;
            Ok(())
        })
        .await?;
        Ok(true)
    }
}
