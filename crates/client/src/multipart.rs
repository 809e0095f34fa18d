//! Multipart uploads. Each part is written as an erasure-coded piece of its own (an object in the
//! internal bucket [`MULTIPART_BUCKET`]); Complete commits, under the user's key, a record that
//! lists the pieces. No byte is copied. Pieces die with the object: a commit that replaces a
//! multipart version returns its piece keys and the writer deletes them.
//!
//! Internal keys: `u/<bucket>/<upload id>` marks an upload in progress (its body is the user's
//! key, its metadata the object's); `p/<bucket>/<upload id>/<part number, 5 digits>` is a piece.

use md5::{Digest, Md5};
use proto::{ObjectMeta, PartPiece, Request};
use tokio::io::AsyncRead;

use crate::{Client, Error, ObjectInfo, PutOptions};

/// Internal bucket of pieces and upload markers. Its leading dot makes it an invalid S3 bucket
/// name, so no user request can reach it.
pub const MULTIPART_BUCKET: &str = ".tessera-multipart";
/// S3's limits: part numbers 1..=10000, every part but the last at least 5 MiB.
pub const PART_NUMBER_MAX: u32 = 10_000;
pub const PART_BYTES_MIN: u64 = 5 << 20;
/// Uploads listed per call.
const UPLOADS_LIST_MAX: u32 = 1000;

/// One uploaded part.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartInfo {
    pub number: u32,
    pub size: u64,
    /// Hex MD5 of the part.
    pub etag: String,
    pub modified_ms: u64,
}

/// One upload in progress.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UploadInfo {
    pub key: String,
    pub upload_id: String,
    pub initiated_ms: u64,
}

fn marker_key(bucket: &str, upload_id: &str) -> String {
    format!("u/{bucket}/{upload_id}")
}

fn piece_prefix(bucket: &str, upload_id: &str) -> String {
    format!("p/{bucket}/{upload_id}/")
}

fn piece_key(bucket: &str, upload_id: &str, number: u32) -> String {
    format!("{}{number:05}", piece_prefix(bucket, upload_id))
}

fn valid_upload_id(upload_id: &str) -> bool {
    upload_id.len() == 32 && upload_id.bytes().all(|b| b.is_ascii_hexdigit())
}

impl Client {
    /// Starts a multipart upload of `bucket/key`; returns its upload id.
    pub async fn create_multipart(&self, bucket: &str, key: &str, options: &PutOptions) -> Result<String, Error> {
        proto::validate_bucket(bucket)?;
        proto::validate_key(key)?;
        if !self.bucket_exists(bucket).await? {
            return Err(Error::NoSuchBucket { bucket: bucket.into() });
        }
        self.bucket_call(&Request::BucketCreate { bucket: MULTIPART_BUCKET.into() }, MULTIPART_BUCKET).await?;
        let upload_id = hex::encode(rand::random::<[u8; 16]>());
        let mut body = key.as_bytes();
        crate::put::put(self, MULTIPART_BUCKET, &marker_key(bucket, &upload_id), &mut body, options).await?;
        // A fresh marker key replaces nothing.
        Ok(upload_id)
    }

    /// Writes part `number` (1..=10000) of an upload; a second write of a number replaces it.
    pub async fn put_part(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        number: u32,
        source: &mut (dyn AsyncRead + Unpin + Send),
    ) -> Result<PartInfo, Error> {
        if !(1..=PART_NUMBER_MAX).contains(&number) {
            return Err(Error::InvalidPart { number, reason: format!("part numbers are 1 to {PART_NUMBER_MAX}") });
        }
        self.upload_marker(bucket, key, upload_id).await?;
        let options = PutOptions::default();
        let (info, _) =
            crate::put::put(self, MULTIPART_BUCKET, &piece_key(bucket, upload_id, number), source, &options).await?;
        Ok(PartInfo { number, size: info.meta.size, etag: info.meta.etag, modified_ms: info.meta.modified_ms })
    }

    /// Parts uploaded so far, by number.
    pub async fn list_parts(&self, bucket: &str, key: &str, upload_id: &str) -> Result<Vec<PartInfo>, Error> {
        self.upload_marker(bucket, key, upload_id).await?;
        let prefix = piece_prefix(bucket, upload_id);
        let mut parts = Vec::new();
        let mut start_after = String::new();
        loop {
            let page = self.list_inner(MULTIPART_BUCKET, &prefix, &start_after, proto::LIST_LIMIT_MAX).await?;
            for entry in &page.entries {
                let Ok(number) = entry.key[prefix.len()..].parse() else { continue };
                parts.push(PartInfo {
                    number,
                    size: entry.size,
                    etag: entry.etag.clone(),
                    modified_ms: entry.modified_ms,
                });
            }
            match page.next_start_after {
                Some(next) => start_after = next,
                None => return Ok(parts),
            }
        }
    }

    /// Completes an upload from `parts` (number, etag; quotes allowed), ascending, each but the
    /// last at least 5 MiB. The object's bytes stay in the pieces: nothing is copied.
    pub async fn complete_multipart(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        parts: &[(u32, String)],
    ) -> Result<ObjectInfo, Error> {
        let marker = self.upload_marker(bucket, key, upload_id).await?;
        if parts.is_empty() {
            return Err(Error::InvalidPart { number: 0, reason: "a multipart upload needs at least one part".into() });
        }
        if parts.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(Error::InvalidPartOrder);
        }
        let mut pieces = Vec::with_capacity(parts.len());
        for (number, etag) in parts {
            let info = match self.head_inner(MULTIPART_BUCKET, &piece_key(bucket, upload_id, *number)).await {
                Ok(info) => info,
                Err(Error::NotFound { .. }) => {
                    return Err(Error::InvalidPart { number: *number, reason: "it was not uploaded".into() });
                }
                Err(e) => return Err(e),
            };
            if info.meta.etag != etag.trim_matches('"') {
                return Err(Error::InvalidPart { number: *number, reason: format!("its ETag is {}", info.meta.etag) });
            }
            pieces.push(piece_of(*number, info.meta));
        }
        // Sizes only once every part is known to exist: a missing part is the likelier mistake.
        if let Some(small) = pieces[..pieces.len() - 1].iter().find(|p| p.size < PART_BYTES_MIN) {
            return Err(Error::EntityTooSmall { number: small.number, size: small.size });
        }
        let etag = multipart_etag(&pieces);
        let size = pieces.iter().map(|p| p.size).sum();
        let (info, replaced) = crate::put::commit_without_data(self, bucket, key, |meta| {
            meta.size = size;
            meta.etag = etag;
            meta.content_type = marker.content_type.clone();
            meta.user_meta = marker.user_meta.clone();
            meta.headers = marker.headers.clone();
            meta.parts = pieces;
            Ok(())
        })
        .await?;
        // The upload is over: drop its marker and every piece the object does not use.
        let used: Vec<u32> = parts.iter().map(|(number, _)| *number).collect();
        self.drop_upload(bucket, upload_id, &used).await;
        delete_pieces(self, &replaced).await;
        Ok(info)
    }

    /// Abandons an upload and deletes its pieces.
    pub async fn abort_multipart(&self, bucket: &str, key: &str, upload_id: &str) -> Result<(), Error> {
        self.upload_marker(bucket, key, upload_id).await?;
        self.drop_upload(bucket, upload_id, &[]).await;
        Ok(())
    }

    /// Uploads in progress in `bucket` whose key starts with `prefix` (at most 1000), by key.
    pub async fn list_multipart_uploads(&self, bucket: &str, prefix: &str) -> Result<Vec<UploadInfo>, Error> {
        proto::validate_bucket(bucket)?;
        let marker_prefix = format!("u/{bucket}/");
        let page = match self.list_inner(MULTIPART_BUCKET, &marker_prefix, "", UPLOADS_LIST_MAX).await {
            Err(Error::NoSuchBucket { .. }) => return Ok(Vec::new()),
            other => other?,
        };
        let mut uploads = Vec::new();
        for entry in page.entries {
            let upload_id = entry.key[marker_prefix.len()..].to_owned();
            let Ok(info) = self.head_inner(MULTIPART_BUCKET, &entry.key).await else { continue };
            let mut key = vec![0u8; info.meta.size as usize];
            self.read_at(&info, 0, &mut key).await?;
            let Ok(key) = String::from_utf8(key) else { continue };
            if key.starts_with(prefix) {
                uploads.push(UploadInfo { key, upload_id, initiated_ms: entry.modified_ms });
            }
        }
        uploads.sort_by(|a, b| (&a.key, a.initiated_ms).cmp(&(&b.key, b.initiated_ms)));
        Ok(uploads)
    }

    /// The marker of an upload of `bucket/key`, or `NoSuchUpload`.
    async fn upload_marker(&self, bucket: &str, key: &str, upload_id: &str) -> Result<ObjectMeta, Error> {
        proto::validate_bucket(bucket)?;
        proto::validate_key(key)?;
        let no_such = || Error::NoSuchUpload { upload_id: upload_id.to_owned() };
        if !valid_upload_id(upload_id) {
            return Err(no_such());
        }
        let info = match self.head_inner(MULTIPART_BUCKET, &marker_key(bucket, upload_id)).await {
            Ok(info) => info,
            Err(Error::NotFound { .. } | Error::NoSuchBucket { .. }) => return Err(no_such()),
            Err(e) => return Err(e),
        };
        let mut stored_key = vec![0u8; info.meta.size as usize];
        self.read_at(&info, 0, &mut stored_key).await?;
        if stored_key != key.as_bytes() {
            return Err(no_such());
        }
        Ok(info.meta)
    }

    /// Deletes an upload's marker and its pieces except `keep`. Best effort: a failure leaves
    /// garbage, never a visible object.
    async fn drop_upload(&self, bucket: &str, upload_id: &str, keep: &[u32]) {
        let mut garbage = vec![marker_key(bucket, upload_id)];
        let prefix = piece_prefix(bucket, upload_id);
        let mut start_after = String::new();
        loop {
            let Ok(page) = self.list_inner(MULTIPART_BUCKET, &prefix, &start_after, proto::LIST_LIMIT_MAX).await else {
                break;
            };
            for entry in page.entries {
                let number = entry.key[prefix.len()..].parse::<u32>().unwrap_or(0);
                if !keep.contains(&number) {
                    garbage.push(entry.key);
                }
            }
            match page.next_start_after {
                Some(next) => start_after = next,
                None => break,
            }
        }
        delete_pieces(self, &garbage).await;
    }
}

/// Deletes internal objects (pieces, markers); logs instead of failing. Pieces are never
/// multipart themselves, so their deletion replaces no further pieces.
pub(crate) async fn delete_pieces(client: &Client, keys: &[String]) {
    for key in keys {
        match crate::put::delete(client, MULTIPART_BUCKET, key).await {
            Ok(replaced) => debug_assert!(replaced.is_empty(), "a piece is never a multipart object"),
            Err(Error::NotFound { .. }) => {}
            Err(e) => tracing::warn!(key, error = %e, "could not delete a multipart piece; it stays as garbage"),
        }
    }
}

fn piece_of(number: u32, meta: ObjectMeta) -> PartPiece {
    PartPiece {
        number,
        piece_key: meta.key,
        version: meta.version,
        size: meta.size,
        etag: meta.etag,
        set_idx: meta.set_idx,
        rotation: meta.rotation,
        crcs: meta.crcs,
    }
}

/// S3's multipart ETag: MD5 of the parts' binary MD5s, then `-` and the part count.
fn multipart_etag(pieces: &[PartPiece]) -> String {
    let mut md5 = Md5::new();
    for piece in pieces {
        md5.update(hex::decode(&piece.etag).expect("piece ETags are hex MD5s we computed"));
    }
    format!("{}-{}", hex::encode(md5.finalize()), pieces.len())
}

/// The `ObjectInfo` of one part's piece, for reading it like a single-piece object.
pub(crate) fn piece_info(client: &Client, object: &ObjectMeta, piece: &PartPiece) -> Result<ObjectInfo, Error> {
    if piece.set_idx as usize >= client.inner.map.sets.len() {
        return Err(Error::Protocol {
            node: String::from("metadata"),
            source: proto::Error::Invalid {
                what: "part piece",
                reason: format!("erasure set {} is not in the cluster map", piece.set_idx),
            },
        });
    }
    let meta = ObjectMeta {
        format: object.format,
        bucket: MULTIPART_BUCKET.to_owned(),
        key: piece.piece_key.clone(),
        version: piece.version,
        deleted: false,
        size: piece.size,
        etag: piece.etag.clone(),
        content_type: String::new(),
        user_meta: Vec::new(),
        headers: Vec::new(),
        modified_ms: object.modified_ms,
        k: object.k,
        m: object.m,
        chunk_bytes: object.chunk_bytes,
        block_bytes: object.block_bytes,
        set_idx: piece.set_idx,
        rotation: piece.rotation,
        crcs: piece.crcs.clone(),
        parts: Vec::new(),
    };
    let placement =
        cluster::Placement { set_idx: piece.set_idx as usize, rotation: usize::from(piece.rotation), n: meta.n() };
    let drives =
        client.set_drives(&placement).iter().map(|d| (client.node_id(d.node_idx).to_owned(), d.drive_idx)).collect();
    Ok(ObjectInfo { meta, placement, drives, meta_positions: Vec::new() })
}
