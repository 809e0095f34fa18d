//! Multipart uploads. Each part is written as an erasure-coded piece of its own (an object in the
//! internal bucket [`MULTIPART_BUCKET`]); Complete commits, under the user's key, a record that
//! lists the pieces. No byte is copied. Pieces die with the object: a commit that replaces a
//! multipart version returns its piece keys and the writer deletes them.
//!
//! Internal keys: `u/<bucket>/<upload id>` marks an upload in progress (its body is the user's
//! key, its metadata the object's); `p/<bucket>/<upload id>/<part number, 5 digits>/<attempt>`
//! is a piece, `attempt` random per UploadPart call. Every upload of a part writes a key of its
//! own, so no write ever replaces a piece: once Complete has committed an object that lists a
//! piece, that piece belongs to the object (immutable; deleted only when the object is replaced
//! or deleted), whatever UploadPart or Abort calls race with it. The newest attempt of a part
//! number is the part. Attempts nobody references are deleted by Complete and Abort; one that
//! lands after them is garbage for the collector.

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
/// Most upload markers one ListMultipartUploads scans (live uploads and the delete markers of
/// finished ones); past it the listing fails rather than silently leaving uploads out.
const UPLOAD_MARKERS_SCANNED_MAX: usize = 1_000_000;

/// One uploaded part.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartInfo {
    pub number: u32,
    pub size: u64,
    /// Hex MD5 of the part.
    pub etag: String,
    pub modified_ms: u64,
    /// The headers stored with the part (its checksums): filled by [`Client::put_part_with`]
    /// and [`Client::load_part_headers`], empty from [`Client::list_parts`].
    pub headers: Vec<(String, String)>,
    /// The internal key of the piece holding the part.
    piece_key: String,
}

/// Part headers read at once by [`Client::load_part_headers`].
const PART_HEADS_IN_FLIGHT: usize = 16;

/// How a Complete builds the object's headers ([`Client::complete_multipart_with`]): from the
/// upload's headers (as CreateMultipartUpload stored them) and each listed part, with its
/// stored headers, in part order. An error refuses the Complete (the upload stays).
pub type CompleteHeaders<'a> =
    &'a (dyn Fn(&[(String, String)], &[PartInfo]) -> Result<Vec<(String, String)>, Error> + Sync);

/// One upload in progress.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UploadInfo {
    pub key: String,
    pub upload_id: String,
    pub initiated_ms: u64,
}

/// What a Complete may replace ([`Client::complete_multipart_if`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Replacing {
    /// Whatever is there, or nothing.
    Anything,
    /// Nothing: the key has no live object (S3's `If-None-Match: *`).
    Nothing,
    /// Only a live object (`If-Match: *`).
    Existing,
    /// Only the object with this ETag, quotes allowed (S3's `If-Match`).
    ETag(String),
}

fn marker_key(bucket: &str, upload_id: &str) -> String {
    format!("u/{bucket}/{upload_id}")
}

fn piece_prefix(bucket: &str, upload_id: &str) -> String {
    format!("p/{bucket}/{upload_id}/")
}

fn part_prefix(bucket: &str, upload_id: &str, number: u32) -> String {
    format!("{}{number:05}/", piece_prefix(bucket, upload_id))
}

/// A fresh key for one upload attempt of part `number`.
fn piece_key(bucket: &str, upload_id: &str, number: u32) -> String {
    format!("{}{}", part_prefix(bucket, upload_id, number), hex::encode(rand::random::<[u8; 8]>()))
}

/// The part number of a piece key under `prefix` (`00001/<attempt>`).
fn part_number_of(piece_key: &str, prefix: &str) -> Option<u32> {
    piece_key.strip_prefix(prefix)?.split('/').next()?.parse().ok()
}

fn valid_upload_id(upload_id: &str) -> bool {
    upload_id.len() == 32 && upload_id.bytes().all(|b| b.is_ascii_hexdigit())
}

impl Client {
    /// Starts a multipart upload of `bucket/key`; returns its upload id.
    pub async fn create_multipart(&self, bucket: &str, key: &str, options: &PutOptions) -> Result<String, Error> {
        self.with_map(|c| async move { c.create_multipart_once(bucket, key, options).await }).await
    }

    async fn create_multipart_once(&self, bucket: &str, key: &str, options: &PutOptions) -> Result<String, Error> {
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

    /// Writes part `number` (1..=10000) of an upload; a later write of the same number wins
    /// (its piece is newer), without touching the earlier piece.
    pub async fn put_part(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        number: u32,
        source: &mut (dyn AsyncRead + Unpin + Send),
    ) -> Result<PartInfo, Error> {
        self.put_part_with(bucket, key, upload_id, number, source, None).await
    }

    /// [`Client::put_part`], storing with the part the headers its source leaves in
    /// `headers_at_end` when it ends (the part's checksums).
    pub async fn put_part_with(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        number: u32,
        source: &mut (dyn AsyncRead + Unpin + Send),
        headers_at_end: Option<crate::HeadersAtEnd>,
    ) -> Result<PartInfo, Error> {
        if !(1..=PART_NUMBER_MAX).contains(&number) {
            return Err(Error::InvalidPart { number, reason: format!("part numbers are 1 to {PART_NUMBER_MAX}") });
        }
        // The marker check reads nothing from `source`: it may run again with a newer map.
        // Then, like `Client::put`, `put::put` plans again if a node shows a newer map early.
        let mut client = self.current();
        let first = client.upload_marker(bucket, key, upload_id).await;
        let marker = if self.refreshed_after(&client, first.is_err()).await {
            client = self.current();
            client.upload_marker(bucket, key, upload_id).await?
        } else {
            first?
        };
        let result = async {
            let piece = piece_key(bucket, upload_id, number);
            // One object's parts share one k+m: the upload's marker's (pools may differ).
            let erasure = cluster::ErasureConfig::new(usize::from(marker.k), usize::from(marker.m))?;
            let options = PutOptions { headers_at_end: headers_at_end.clone(), ..PutOptions::default() };
            let (info, _) =
                crate::put::put_in(&client, MULTIPART_BUCKET, &piece, source, &options, Some(erasure)).await?;
            Ok(PartInfo {
                number,
                size: info.meta.size,
                etag: info.meta.etag,
                modified_ms: info.meta.modified_ms,
                headers: info.meta.headers,
                piece_key: piece,
            })
        }
        .await;
        self.refreshed_after(&client, false).await;
        result
    }

    /// Parts uploaded so far, by number (the newest upload of each number).
    pub async fn list_parts(&self, bucket: &str, key: &str, upload_id: &str) -> Result<Vec<PartInfo>, Error> {
        self.with_map(|c| async move { c.list_parts_once(bucket, key, upload_id).await }).await
    }

    async fn list_parts_once(&self, bucket: &str, key: &str, upload_id: &str) -> Result<Vec<PartInfo>, Error> {
        self.upload_marker(bucket, key, upload_id).await?;
        let newest = self.newest_pieces(bucket, upload_id).await?;
        Ok(newest
            .into_iter()
            .map(|(number, entry)| PartInfo {
                number,
                size: entry.size,
                etag: entry.etag,
                modified_ms: entry.modified_ms,
                headers: Vec::new(),
                piece_key: entry.key,
            })
            .collect())
    }

    /// Reads the stored headers of each of `parts` (from [`Client::list_parts`]), a bounded
    /// number at once. A part whose piece is gone meanwhile (the upload completed or was
    /// aborted) keeps none.
    pub async fn load_part_headers(&self, parts: &mut [PartInfo]) -> Result<(), Error> {
        use futures_util::StreamExt as _;
        let keys: Vec<String> = parts.iter().map(|part| part.piece_key.clone()).collect();
        let heads: Vec<Result<Vec<(String, String)>, Error>> = futures_util::stream::iter(keys)
            .map(|piece_key| async move { self.piece_headers(&piece_key).await })
            .buffered(PART_HEADS_IN_FLIGHT)
            .collect()
            .await;
        for (part, headers) in parts.iter_mut().zip(heads) {
            part.headers = headers?;
        }
        Ok(())
    }

    /// The headers stored with one part of a multipart object (its checksums); none if its
    /// piece is gone (the object was replaced meanwhile).
    pub async fn part_headers(&self, part: &PartPiece) -> Result<Vec<(String, String)>, Error> {
        self.piece_headers(&part.piece_key).await
    }

    async fn piece_headers(&self, piece_key: &str) -> Result<Vec<(String, String)>, Error> {
        match self.with_map(|c| async move { c.head_inner(MULTIPART_BUCKET, piece_key).await }).await {
            Ok(info) => Ok(info.meta.headers),
            Err(Error::NotFound { .. }) => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// The headers CreateMultipartUpload stored for an upload (those its object will have).
    pub async fn upload_headers(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
    ) -> Result<Vec<(String, String)>, Error> {
        self.with_map(|c| async move { Ok(c.upload_marker(bucket, key, upload_id).await?.headers) }).await
    }

    /// Every piece of an upload: `(part number, listing entry)`, all attempts.
    async fn pieces(&self, bucket: &str, upload_id: &str) -> Result<Vec<(u32, crate::ListEntry)>, Error> {
        let prefix = piece_prefix(bucket, upload_id);
        let mut pieces = Vec::new();
        let mut start_after = String::new();
        loop {
            let page = self.list_inner(MULTIPART_BUCKET, &prefix, &start_after, proto::LIST_LIMIT_MAX).await?;
            for entry in page.entries {
                if let Some(number) = part_number_of(&entry.key, &prefix) {
                    pieces.push((number, entry));
                }
            }
            match page.next_start_after {
                Some(next) => start_after = next,
                None => return Ok(pieces),
            }
        }
    }

    /// The newest piece of each part number, by number.
    async fn newest_pieces(
        &self,
        bucket: &str,
        upload_id: &str,
    ) -> Result<std::collections::BTreeMap<u32, crate::ListEntry>, Error> {
        let mut newest = std::collections::BTreeMap::new();
        for (number, entry) in self.pieces(bucket, upload_id).await? {
            match newest.get(&number) {
                Some(current) if newest_of(current, &entry) => {}
                _ => {
                    newest.insert(number, entry);
                }
            }
        }
        Ok(newest)
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
        self.complete_multipart_if(bucket, key, upload_id, parts, &Replacing::Anything).await
    }

    /// [`Client::complete_multipart`] only if the object it would replace is as `replacing`
    /// says (S3's `If-None-Match: *` and `If-Match` on CompleteMultipartUpload), else
    /// [`Error::PreconditionFailed`] ([`Error::NotFound`] for an ETag and no object), and the
    /// upload stays. Absence is checked again by every drive at commit; an ETag only before
    /// (a concurrent writer can slip in between, as for a conditional PUT). A retried Complete
    /// of an upload that is already complete succeeds whatever the condition: its object is
    /// the one the condition was checked against the first time.
    pub async fn complete_multipart_if(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        parts: &[(u32, String)],
        replacing: &Replacing,
    ) -> Result<ObjectInfo, Error> {
        self.complete_multipart_with(bucket, key, upload_id, parts, replacing, &|upload, _| Ok(upload.to_vec())).await
    }

    /// [`Client::complete_multipart_if`], with the object's headers built by `headers` from
    /// the upload's and its parts' (a checksum of the parts' checksums), before the commit.
    pub async fn complete_multipart_with(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        parts: &[(u32, String)],
        replacing: &Replacing,
        headers: CompleteHeaders<'_>,
    ) -> Result<ObjectInfo, Error> {
        self.with_map(
            |c| async move { c.complete_multipart_once(bucket, key, upload_id, parts, replacing, headers).await },
        )
        .await
    }

    async fn complete_multipart_once(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        parts: &[(u32, String)],
        replacing: &Replacing,
        headers: CompleteHeaders<'_>,
    ) -> Result<ObjectInfo, Error> {
        let marker = match self.upload_marker(bucket, key, upload_id).await {
            Ok(marker) => marker,
            // A retried Complete whose first answer was lost: the object is already there.
            Err(Error::NoSuchUpload { .. }) => return self.completed_object(bucket, key, upload_id, parts).await,
            Err(e) => return Err(e),
        };
        let condition = match replacing {
            Replacing::Anything => proto::CommitCondition::None,
            Replacing::Nothing => proto::CommitCondition::IfAbsent,
            Replacing::Existing | Replacing::ETag(_) => {
                let current = match self.head_inner(bucket, key).await {
                    Ok(info) => info,
                    Err(Error::NotFound { .. }) => {
                        return Err(Error::NotFound { bucket: bucket.to_owned(), key: key.to_owned() });
                    }
                    Err(e) => return Err(e),
                };
                if let Replacing::ETag(expected) = replacing
                    && current.meta.etag != expected.trim_matches('"')
                {
                    return Err(Error::PreconditionFailed { bucket: bucket.to_owned(), key: key.to_owned() });
                }
                proto::CommitCondition::None
            }
        };
        if parts.is_empty() {
            return Err(Error::InvalidPart { number: 0, reason: "a multipart upload needs at least one part".into() });
        }
        if parts.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(Error::InvalidPartOrder);
        }
        let newest = self.newest_pieces(bucket, upload_id).await?;
        let mut pieces = Vec::with_capacity(parts.len());
        let mut listed = Vec::with_capacity(parts.len());
        // The record's k+m describes its pieces: they must share one.
        let mut erasure: Option<(u8, u8)> = None;
        for (number, etag) in parts {
            let Some(entry) = newest.get(number) else {
                return Err(Error::InvalidPart { number: *number, reason: "it was not uploaded".into() });
            };
            let mut info = match self.head_inner(MULTIPART_BUCKET, &entry.key).await {
                Ok(info) => info,
                Err(Error::NotFound { .. }) => {
                    return Err(Error::InvalidPart { number: *number, reason: "it was not uploaded".into() });
                }
                Err(e) => return Err(e),
            };
            if info.meta.etag != etag.trim_matches('"') {
                return Err(Error::InvalidPart { number: *number, reason: format!("its ETag is {}", info.meta.etag) });
            }
            let (k, m) = (info.meta.k, info.meta.m);
            if let Some((first_k, first_m)) = erasure.filter(|&first| first != (k, m)) {
                let reason = format!(
                    "it is stored {k}+{m}, the other parts {first_k}+{first_m} (moved between pools of another k+m); upload it again"
                );
                return Err(Error::InvalidPart { number: *number, reason });
            }
            erasure = Some((k, m));
            listed.push(PartInfo {
                number: *number,
                size: info.meta.size,
                etag: info.meta.etag.clone(),
                modified_ms: info.meta.modified_ms,
                headers: std::mem::take(&mut info.meta.headers),
                piece_key: entry.key.clone(),
            });
            pieces.push(piece_of(*number, info.meta));
        }
        // Sizes only once every part is known to exist: a missing part is the likelier mistake.
        if let Some(small) = pieces[..pieces.len() - 1].iter().find(|p| p.size < PART_BYTES_MIN) {
            return Err(Error::EntityTooSmall { number: small.number, size: small.size });
        }
        let object_headers = headers(&marker.headers, &listed)?;
        let etag = multipart_etag(&pieces);
        let size = pieces.iter().map(|p| p.size).sum();
        let (k, m) = erasure.expect("at least one part");
        let only = Some(cluster::ErasureConfig::new(usize::from(k), usize::from(m))?);
        let (info, replaced) = crate::put::commit_without_data(self, bucket, key, condition, only, |meta| {
            meta.size = size;
            meta.etag = etag;
            (meta.k, meta.m) = (k, m);
            meta.content_type = marker.content_type.clone();
            meta.user_meta = marker.user_meta.clone();
            meta.headers = object_headers;
            meta.parts = pieces;
            Ok(())
        })
        .await?;
        // The upload is over: drop its marker and every piece the object does not use.
        let used: Vec<String> = info.meta.parts.iter().map(|p| p.piece_key.clone()).collect();
        self.drop_upload(bucket, upload_id, &used).await;
        delete_pieces(self, &replaced).await;
        Ok(info)
    }

    /// The object a finished upload completed, if `parts` are exactly its parts: what a retried
    /// Complete answers. `NoSuchUpload` otherwise.
    async fn completed_object(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        parts: &[(u32, String)],
    ) -> Result<ObjectInfo, Error> {
        let no_such = || Error::NoSuchUpload { upload_id: upload_id.to_owned() };
        let info = match self.head_inner(bucket, key).await {
            Ok(info) => info,
            Err(Error::NotFound { .. }) => return Err(no_such()),
            Err(e) => return Err(e),
        };
        let prefix = piece_prefix(bucket, upload_id);
        let same = info.meta.parts.len() == parts.len()
            && info.meta.parts.iter().zip(parts).all(|(piece, (number, etag))| {
                piece.piece_key.starts_with(&prefix) && piece.number == *number && piece.etag == etag.trim_matches('"')
            });
        if same { Ok(info) } else { Err(no_such()) }
    }

    /// Abandons an upload and deletes its pieces, except those an object completed from it
    /// uses (an Abort after a Complete whose marker delete failed): then it only drops the
    /// marker and answers `NoSuchUpload`, as S3 does for a completed upload.
    pub async fn abort_multipart(&self, bucket: &str, key: &str, upload_id: &str) -> Result<(), Error> {
        self.with_map(|c| async move { c.abort_multipart_once(bucket, key, upload_id).await }).await
    }

    async fn abort_multipart_once(&self, bucket: &str, key: &str, upload_id: &str) -> Result<(), Error> {
        self.upload_marker(bucket, key, upload_id).await?;
        let prefix = piece_prefix(bucket, upload_id);
        let used: Vec<String> = match self.head_inner(bucket, key).await {
            Ok(info) => info.meta.parts.into_iter().map(|p| p.piece_key).filter(|k| k.starts_with(&prefix)).collect(),
            Err(Error::NotFound { .. }) => Vec::new(),
            // Unsure whether the object uses the pieces: delete nothing.
            Err(e) => return Err(e),
        };
        self.drop_upload(bucket, upload_id, &used).await;
        if used.is_empty() { Ok(()) } else { Err(Error::NoSuchUpload { upload_id: upload_id.to_owned() }) }
    }

    /// Aborts every upload, in every bucket, initiated before `initiated_before_ms` (Unix ms):
    /// abandoned uploads and their pieces go (pieces a completed object uses stay, as with
    /// [`Client::abort_multipart`]). Returns how many uploads were aborted; an upload that
    /// fails to abort is logged and left for the next call.
    pub async fn expire_multipart_uploads(&self, initiated_before_ms: u64) -> Result<usize, Error> {
        let mut aborted = 0;
        for bucket in self.list_buckets().await? {
            for upload in self.list_multipart_uploads(&bucket, "").await? {
                if upload.initiated_ms >= initiated_before_ms {
                    continue;
                }
                match self.abort_multipart(&bucket, &upload.key, &upload.upload_id).await {
                    Ok(()) | Err(Error::NoSuchUpload { .. }) => {
                        aborted += 1;
                        tracing::info!(bucket, key = %upload.key, upload_id = %upload.upload_id, initiated_ms = upload.initiated_ms, "abandoned multipart upload aborted");
                    }
                    Err(e) => {
                        tracing::warn!(bucket, key = %upload.key, error = %e, "could not abort an expired multipart upload; will retry")
                    }
                }
            }
        }
        Ok(aborted)
    }

    /// Every upload in progress in `bucket` whose key starts with `prefix`, by key then
    /// initiation time. Reads every page of markers (finished uploads leave delete markers that
    /// fill pages without live entries), up to [`UPLOAD_MARKERS_SCANNED_MAX`].
    pub async fn list_multipart_uploads(&self, bucket: &str, prefix: &str) -> Result<Vec<UploadInfo>, Error> {
        self.with_map(|c| async move { c.list_multipart_uploads_once(bucket, prefix).await }).await
    }

    async fn list_multipart_uploads_once(&self, bucket: &str, prefix: &str) -> Result<Vec<UploadInfo>, Error> {
        proto::validate_bucket(bucket)?;
        let marker_prefix = format!("u/{bucket}/");
        let mut markers = Vec::new();
        let mut start_after = String::new();
        loop {
            let page =
                match self.list_inner(MULTIPART_BUCKET, &marker_prefix, &start_after, proto::LIST_LIMIT_MAX).await {
                    Err(Error::NoSuchBucket { .. }) => return Ok(Vec::new()),
                    other => other?,
                };
            markers.extend(page.entries);
            if markers.len() > UPLOAD_MARKERS_SCANNED_MAX {
                return Err(Error::TooManyUploads { bucket: bucket.to_owned(), max: UPLOAD_MARKERS_SCANNED_MAX });
            }
            match page.next_start_after {
                Some(next) => start_after = next,
                None => break,
            }
        }
        let mut uploads = Vec::new();
        for entry in markers {
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

    /// Aborts every upload of `bucket`, which was just removed: no object of it can use their
    /// pieces (the bucket was empty, and a completion since would have kept it), so every
    /// piece goes with its marker. Best effort: what fails is logged, and the gateway's expiry
    /// of abandoned uploads takes it later.
    pub(crate) async fn abort_uploads_of_removed(&self, bucket: &str) {
        let uploads = match self.list_multipart_uploads(bucket, "").await {
            Ok(uploads) => uploads,
            Err(e) => {
                tracing::warn!(bucket, error = %e, "bucket removed; its multipart uploads could not be listed and are left to expire");
                return;
            }
        };
        for upload in &uploads {
            self.drop_upload(bucket, &upload.upload_id, &[]).await;
        }
        if !uploads.is_empty() {
            tracing::info!(bucket, aborted = uploads.len(), "bucket removed with its multipart uploads in progress");
        }
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

    /// Deletes an upload's marker and its pieces except the piece keys in `keep`. Best effort:
    /// a failure leaves garbage, never a visible object.
    async fn drop_upload(&self, bucket: &str, upload_id: &str, keep: &[String]) {
        let mut garbage = vec![marker_key(bucket, upload_id)];
        if let Ok(pieces) = self.pieces(bucket, upload_id).await {
            garbage.extend(pieces.into_iter().map(|(_, entry)| entry.key).filter(|key| !keep.contains(key)));
        }
        delete_pieces(self, &garbage).await;
    }
}

/// Whether `current` is newer than `other` (two uploads of one part number).
fn newest_of(current: &crate::ListEntry, other: &crate::ListEntry) -> bool {
    current.version >= other.version
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

pub(crate) fn piece_of(number: u32, meta: ObjectMeta) -> PartPiece {
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
    if piece.set_idx as usize >= client.topo.map.sets.len() {
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
        pads: Vec::new(),
    };
    let placement =
        cluster::Placement { set_idx: piece.set_idx as usize, rotation: usize::from(piece.rotation), n: meta.n() };
    let drives =
        client.set_drives(&placement).iter().map(|d| (client.node_id(d.node_idx).to_owned(), d.drive_idx)).collect();
    Ok(ObjectInfo { meta, placement, drives, meta_positions: Vec::new() })
}
