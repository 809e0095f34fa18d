//! PutObject, GetObject, HeadObject, DeleteObject, DeleteObjects, CopyObject.

use std::ops::Range;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use s3s::dto::*;
use s3s::stream::{ByteStream, RemainingLength};
use s3s::{S3Error, S3ErrorCode, S3Request, S3Response, S3Result};

use crate::body::{Expected, UploadBody, WindowStream, object_stream};
use crate::bucket::{no_such_bucket, require_bucket};
use crate::checksum::{Algorithm, Kind, ObjectChecksum};
use crate::conditional::{Conditions, Precondition, content_range, evaluate, precondition_error, resolve_range};
use crate::error::{invalid_argument, s3_error};

/// Largest single PUT, as S3 (larger objects go through multipart upload).
pub(crate) const PUT_OBJECT_BYTES_MAX: u64 = 5 << 30;
/// Total bytes of user metadata (names and values), as S3.
pub(crate) const USER_META_BYTES_MAX: usize = 2048;
/// Keys per DeleteObjects request, as S3.
pub(crate) const DELETE_OBJECTS_MAX: usize = 1000;
/// Deletes of one DeleteObjects request in flight at once.
const DELETE_OBJECTS_CONCURRENCY: usize = 16;
/// Content type of objects stored without one, as S3.
const DEFAULT_CONTENT_TYPE: &str = "binary/octet-stream";

/// `aws-chunked` describes how this request's body was framed, not the object: S3 drops it
/// from the stored Content-Encoding (`gzip,aws-chunked` is stored as `gzip`).
fn without_aws_chunked(encoding: String) -> Option<String> {
    let kept: Vec<&str> = encoding
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty() && !t.eq_ignore_ascii_case("aws-chunked"))
        .collect();
    if kept.is_empty() { None } else { Some(kept.join(",")) }
}

/// The [`ObjectHeaders`] of an s3s write input (PutObject, CreateMultipartUpload, CopyObject):
/// distinct DTO types that name these fields alike.
macro_rules! object_headers {
    ($input:expr) => {
        $crate::object::ObjectHeaders {
            content_type: $input.content_type,
            cache_control: $input.cache_control,
            content_disposition: $input.content_disposition,
            content_encoding: $input.content_encoding,
            content_language: $input.content_language,
            expires: $input.expires,
            metadata: $input.metadata,
        }
    };
}
pub(crate) use object_headers;

/// The checksums an s3s upload input (PutObject, UploadPart) asks the gateway to verify.
macro_rules! requested_checksums {
    ($input:expr) => {
        s3s::dto::Checksum {
            checksum_crc32: $input.checksum_crc32,
            checksum_crc32c: $input.checksum_crc32c,
            checksum_crc64nvme: $input.checksum_crc64nvme,
            checksum_sha1: $input.checksum_sha1,
            checksum_sha256: $input.checksum_sha256,
            checksum_type: None,
        }
    };
}
pub(crate) use requested_checksums;

/// `plan_read` for a GetObject or HeadObject input (distinct DTO types, same fields).
macro_rules! read_plan_of {
    ($client:expr, $input:expr) => {
        plan_read(
            $client,
            &$input.bucket,
            &$input.key,
            $input.version_id.as_deref(),
            &Conditions {
                if_match: $input.if_match.as_ref(),
                if_none_match: $input.if_none_match.as_ref(),
                if_modified_since: $input.if_modified_since.as_ref(),
                if_unmodified_since: $input.if_unmodified_since.as_ref(),
            },
            $input.range.as_ref(),
            $input.part_number,
            $input.checksum_mode.as_ref().is_some_and(|mode| mode.as_str() == ChecksumMode::ENABLED),
        )
    };
}

/// The metadata a write stores and a read replays.
#[derive(Debug, Default)]
pub(crate) struct ObjectHeaders {
    pub(crate) content_type: Option<String>,
    pub(crate) cache_control: Option<String>,
    pub(crate) content_disposition: Option<String>,
    pub(crate) content_encoding: Option<String>,
    pub(crate) content_language: Option<String>,
    pub(crate) expires: Option<Timestamp>,
    pub(crate) metadata: Option<Metadata>,
}

impl ObjectHeaders {
    /// Client options for a write; refuses user metadata over [`USER_META_BYTES_MAX`].
    pub(crate) fn into_put_options(self) -> S3Result<client::PutOptions> {
        let mut user_meta: Vec<(String, String)> = self.metadata.unwrap_or_default().into_iter().collect();
        user_meta.sort();
        let meta_bytes: usize = user_meta.iter().map(|(name, value)| name.len() + value.len()).sum();
        if meta_bytes > USER_META_BYTES_MAX {
            return Err(S3Error::with_message(
                S3ErrorCode::MetadataTooLarge,
                format!("{meta_bytes} bytes of x-amz-meta-* headers; the limit is {USER_META_BYTES_MAX}"),
            ));
        }
        let expires = self.expires.map(|t| format_http_date(&t));
        let headers = [
            ("cache-control", self.cache_control),
            ("content-disposition", self.content_disposition),
            ("content-encoding", self.content_encoding.and_then(without_aws_chunked)),
            ("content-language", self.content_language),
            ("expires", expires),
        ]
        .into_iter()
        .filter_map(|(name, value)| value.map(|v| (name.to_owned(), v)))
        .collect();
        Ok(client::PutOptions { content_type: self.content_type, user_meta, headers, ..Default::default() })
    }

    /// What the object in `info` stored, as a read replays it.
    pub(crate) fn stored(info: &client::ObjectInfo) -> Self {
        let meta = &info.meta;
        let header = |name: &str| meta.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
        let content_type =
            if meta.content_type.is_empty() { DEFAULT_CONTENT_TYPE.to_owned() } else { meta.content_type.clone() };
        let metadata: Metadata = meta.user_meta.iter().cloned().collect();
        Self {
            content_type: Some(content_type),
            cache_control: header("cache-control"),
            content_disposition: header("content-disposition"),
            content_encoding: header("content-encoding"),
            content_language: header("content-language"),
            expires: header("expires").and_then(|v| Timestamp::parse(TimestampFormat::HttpDate, &v).ok()),
            metadata: (!metadata.is_empty()).then_some(metadata),
        }
    }
}

fn format_http_date(timestamp: &Timestamp) -> String {
    let mut text = Vec::new();
    // Formatting a parsed timestamp into a Vec cannot fail; an empty value is the fallback.
    let _ = timestamp.format(TimestampFormat::HttpDate, &mut text);
    String::from_utf8(text).unwrap_or_default()
}

pub(crate) fn etag(value: &str) -> ETag {
    ETag::Strong(value.to_owned())
}

/// Only the null version exists in these unversioned buckets.
pub(crate) fn check_version_id(version_id: Option<&str>) -> S3Result<()> {
    match version_id {
        None | Some("null") => Ok(()),
        Some(other) => Err(invalid_argument(format!("invalid version id {other:?}: buckets are unversioned"))),
    }
}

/// `client.head`, with `NoSuchBucket` told apart from `NoSuchKey`.
pub(crate) async fn head(client: &client::Client, bucket: &str, key: &str) -> S3Result<client::ObjectInfo> {
    match client.head(bucket, key).await {
        Ok(info) => Ok(info),
        Err(e @ client::Error::NotFound { .. }) => {
            if client.bucket_exists(bucket).await.map_err(s3_error)? {
                Err(s3_error(e))
            } else {
                Err(no_such_bucket(bucket))
            }
        }
        Err(e) => Err(s3_error(e)),
    }
}

pub(crate) async fn put_object(
    client: &client::Client,
    req: S3Request<PutObjectInput>,
) -> S3Result<S3Response<PutObjectOutput>> {
    let S3Request { input, headers, trailing_headers, extensions, .. } = req;
    let sized = extensions.get::<crate::server::UnsizedBody>().is_none();
    if sized && input.content_length.is_some_and(|len| len as u64 > PUT_OBJECT_BYTES_MAX) {
        return Err(entity_too_large(PUT_OBJECT_BYTES_MAX));
    }
    crate::bucket::check_object_acl(input.acl.as_ref())?;
    check_write_conditions(client, &input.bucket, &input.key, input.if_match.as_ref(), input.if_none_match.as_ref())
        .await?;
    let mut options = object_headers!(input).into_put_options()?;
    options.condition = write_condition(input.if_none_match.as_ref());
    let checksums = requested_checksums!(input);
    let expected = Expected::from_request(&headers, trailing_headers.as_ref(), checksums, PUT_OBJECT_BYTES_MAX)?;
    // The object keeps the checksum the client sent, else the default one the gateway computes.
    let also: &[Algorithm] = if expected.algorithm().is_some() { &[] } else { &[Algorithm::DEFAULT] };
    let at_end = client::HeadersAtEnd::default();
    options.headers_at_end = Some(at_end.clone());
    let mut body = UploadBody::new(input.body, expected, also, Some(at_end)).counting(&extensions);
    let info = client.put(&input.bucket, &input.key, &mut body, &options).await.map_err(s3_error)?;
    let checksum = ObjectChecksum::stored(&info.meta.headers).map(|c| c.dto()).unwrap_or_default();
    let output = PutObjectOutput {
        e_tag: Some(etag(&info.meta.etag)),
        size: i64::try_from(info.meta.size).ok(),
        checksum_crc32: checksum.checksum_crc32,
        checksum_crc32c: checksum.checksum_crc32c,
        checksum_crc64nvme: checksum.checksum_crc64nvme,
        checksum_sha1: checksum.checksum_sha1,
        checksum_sha256: checksum.checksum_sha256,
        checksum_type: checksum.checksum_type,
        ..Default::default()
    };
    Ok(S3Response::new(output))
}

pub(crate) fn entity_too_large(max: u64) -> S3Error {
    S3Error::with_message(S3ErrorCode::EntityTooLarge, format!("the body is larger than the maximum of {max} bytes"))
}

/// The commit condition of a write: `If-None-Match: *` is checked again by every drive at
/// commit time, so of two concurrent creators exactly one succeeds.
pub(crate) fn write_condition(if_none_match: Option<&ETagCondition>) -> client::CommitCondition {
    match if_none_match {
        Some(ETagCondition::Any) => client::CommitCondition::IfAbsent,
        _ => client::CommitCondition::None,
    }
}

/// Conditional writes: `If-None-Match: *` (create only) and `If-Match: ETAG` (replace only
/// that version), checked before the upload so that a write bound to fail sends no bytes.
/// `If-None-Match: *` is checked again atomically at commit ([`write_condition`]); `If-Match`
/// is not (a concurrent writer can slip in between; see ARCHITECTURE.md).
async fn check_write_conditions(
    client: &client::Client,
    bucket: &str,
    key: &str,
    if_match: Option<&ETagCondition>,
    if_none_match: Option<&ETagCondition>,
) -> S3Result<()> {
    if if_match.is_none() && if_none_match.is_none() {
        return Ok(());
    }
    let current = match client.head(bucket, key).await {
        Ok(info) => Some(info),
        Err(client::Error::NotFound { .. }) => None,
        Err(e) => return Err(s3_error(e)),
    };
    let conditions = Conditions { if_match, if_none_match, ..Default::default() };
    let failed = match &current {
        Some(info) => evaluate(&conditions, &info.meta.etag, info.meta.modified_ms) != Precondition::Proceed,
        None if if_match.is_some() => {
            return Err(S3Error::with_message(S3ErrorCode::NoSuchKey, format!("no such object {bucket}/{key}")));
        }
        None => false,
    };
    if failed {
        return Err(S3Error::with_message(
            S3ErrorCode::PreconditionFailed,
            "at least one of the preconditions you specified did not hold",
        ));
    }
    Ok(())
}

/// What a GET or HEAD answers with, before the body.
struct ReadPlan {
    info: client::ObjectInfo,
    /// `None`: the whole object.
    range: Option<Range<u64>>,
    headers: ObjectHeaders,
    /// What `x-amz-checksum-mode: ENABLED` returns: the stored checksum of the bytes read, for
    /// the whole object or a part (none for a byte range).
    checksum: Checksum,
}

impl ReadPlan {
    fn bytes(&self) -> Range<u64> {
        self.range.clone().unwrap_or(0..self.info.meta.size)
    }

    fn content_range(&self) -> Option<String> {
        self.range.as_ref().map(|r| content_range(r, self.info.meta.size))
    }

    fn parts_count(&self) -> Option<i32> {
        let parts = self.info.meta.parts.len();
        (parts > 0).then(|| i32::try_from(parts).unwrap_or(i32::MAX))
    }
}

/// Head, preconditions, range (or part number) of a GET or HEAD.
async fn plan_read(
    client: &client::Client,
    bucket: &str,
    key: &str,
    version_id: Option<&str>,
    conditions: &Conditions<'_>,
    range: Option<&s3s::dto::Range>,
    part_number: Option<i32>,
    checksum_mode: bool,
) -> S3Result<ReadPlan> {
    check_version_id(version_id)?;
    let info = head(client, bucket, key).await?;
    let outcome = evaluate(conditions, &info.meta.etag, info.meta.modified_ms);
    if let Some(error) = precondition_error(outcome, &info.meta.etag, info.meta.modified_ms) {
        return Err(error);
    }
    let range = match (part_number, range) {
        (Some(_), Some(_)) => return Err(invalid_argument("pass a Range or a partNumber, not both")),
        (Some(number), None) => part_range(&info, number)?,
        (None, range) => resolve_range(range, info.meta.size)?,
    };
    let headers = ObjectHeaders::stored(&info);
    let checksum = match (checksum_mode, part_number, range.is_some()) {
        (false, _, _) => None,
        (true, Some(number), _) => part_checksum(client, &info, number).await?,
        (true, None, false) => ObjectChecksum::stored(&info.meta.headers),
        (true, None, true) => None,
    };
    let checksum = checksum.map(|c| c.dto()).unwrap_or_default();
    Ok(ReadPlan { info, range, headers, checksum })
}

/// The checksum of part `number` (valid: `part_range` accepted it): the object's own for a
/// single-piece object, else the one stored with the part, of the object's algorithm.
async fn part_checksum(
    client: &client::Client,
    info: &client::ObjectInfo,
    number: i32,
) -> S3Result<Option<ObjectChecksum>> {
    let stored = ObjectChecksum::stored(&info.meta.headers);
    let (Some(object), Some(part)) = (stored.as_ref(), info.meta.parts.get((number - 1) as usize)) else {
        return Ok(stored);
    };
    let headers = client.part_headers(part).await.map_err(s3_error)?;
    let value = headers.into_iter().find(|(name, _)| name == object.algorithm.header()).map(|(_, value)| value);
    Ok(value.map(|value| ObjectChecksum { algorithm: object.algorithm, value, kind: object.kind }))
}

/// The bytes of part `number` of a multipart object; part 1 of a single-piece object is all of it.
/// A part read is a ranged read (206 with its Content-Range, as S3 and MinIO answer), except of
/// an empty part, which has no byte range to name.
fn part_range(info: &client::ObjectInfo, number: i32) -> S3Result<Option<Range<u64>>> {
    let meta = &info.meta;
    if !(1..=10_000).contains(&number) {
        return Err(invalid_argument("Part number must be an integer between 1 and 10000, inclusive"));
    }
    let index = (number - 1) as usize;
    // Past the object's parts: S3's 416 `InvalidPartNumber`, never the whole object.
    let past_end = || {
        let mut error = S3Error::with_message(
            S3ErrorCode::Custom("InvalidPartNumber".into()),
            "The requested partnumber is not satisfiable",
        );
        error.set_status_code(hyper::StatusCode::RANGE_NOT_SATISFIABLE);
        error
    };
    if meta.parts.is_empty() {
        return match index {
            0 if meta.size == 0 => Ok(None),
            0 => Ok(Some(0..meta.size)),
            _ => Err(past_end()),
        };
    }
    let part = meta.parts.get(index).ok_or_else(past_end)?;
    let start: u64 = meta.parts[..index].iter().map(|p| p.size).sum();
    if part.size == 0 {
        return Ok(None);
    }
    Ok(Some(start..start + part.size))
}

pub(crate) async fn get_object(
    client: &client::Client,
    req: S3Request<GetObjectInput>,
) -> S3Result<S3Response<GetObjectOutput>> {
    let input = &req.input;
    let plan = read_plan_of!(client, input).await?;
    let bytes = plan.bytes();
    let mut inner = object_stream(client.clone(), plan.info.clone(), bytes.clone());
    // The first window before the status line: a cluster that cannot serve the object answers
    // 503 rather than a body cut short.
    let first = match inner.next().await {
        Some(Ok(window)) => Some(window),
        Some(Err(e)) => return Err(s3_error(client::Error::Source(e))),
        None => None,
    };
    let sent = req.extensions.get::<crate::metrics::ObjectBytes>().map(|bytes| bytes.sent.clone());
    let body = GetBody { first, inner, remaining: bytes.end - bytes.start, sent };
    let meta = &plan.info.meta;
    let output = GetObjectOutput {
        body: Some(StreamingBlob::new(body)),
        content_length: i64::try_from(plan.bytes().end - plan.bytes().start).ok(),
        content_range: plan.content_range(),
        accept_ranges: Some("bytes".into()),
        e_tag: Some(etag(&meta.etag)),
        last_modified: Some(crate::conditional::timestamp(meta.modified_ms)),
        parts_count: plan.parts_count(),
        content_type: plan.headers.content_type,
        cache_control: plan.headers.cache_control,
        content_disposition: plan.headers.content_disposition,
        content_encoding: plan.headers.content_encoding,
        content_language: plan.headers.content_language,
        expires: plan.headers.expires,
        metadata: plan.headers.metadata,
        checksum_crc32: plan.checksum.checksum_crc32,
        checksum_crc32c: plan.checksum.checksum_crc32c,
        checksum_crc64nvme: plan.checksum.checksum_crc64nvme,
        checksum_sha1: plan.checksum.checksum_sha1,
        checksum_sha256: plan.checksum.checksum_sha256,
        checksum_type: plan.checksum.checksum_type,
        ..Default::default()
    };
    Ok(S3Response::new(output))
}

pub(crate) async fn head_object(
    client: &client::Client,
    req: S3Request<HeadObjectInput>,
) -> S3Result<S3Response<HeadObjectOutput>> {
    let input = req.input;
    let plan = read_plan_of!(client, input).await?;
    let bytes = plan.bytes();
    let meta = &plan.info.meta;
    // s3s applies the response-* overrides to GET only; HEAD gets them here.
    let output = HeadObjectOutput {
        content_length: i64::try_from(bytes.end - bytes.start).ok(),
        content_range: plan.content_range(),
        accept_ranges: Some("bytes".into()),
        e_tag: Some(etag(&meta.etag)),
        last_modified: Some(crate::conditional::timestamp(meta.modified_ms)),
        parts_count: plan.parts_count(),
        content_type: input.response_content_type.or(plan.headers.content_type),
        cache_control: input.response_cache_control.or(plan.headers.cache_control),
        content_disposition: input.response_content_disposition.or(plan.headers.content_disposition),
        content_encoding: input.response_content_encoding.or(plan.headers.content_encoding),
        content_language: input.response_content_language.or(plan.headers.content_language),
        expires: input.response_expires.or(plan.headers.expires),
        metadata: plan.headers.metadata,
        checksum_crc32: plan.checksum.checksum_crc32,
        checksum_crc32c: plan.checksum.checksum_crc32c,
        checksum_crc64nvme: plan.checksum.checksum_crc64nvme,
        checksum_sha1: plan.checksum.checksum_sha1,
        checksum_sha256: plan.checksum.checksum_sha256,
        checksum_type: plan.checksum.checksum_type,
        ..Default::default()
    };
    let mut response = S3Response::new(output);
    if plan.range.is_some() {
        response.status = Some(hyper::StatusCode::PARTIAL_CONTENT);
    }
    Ok(response)
}

/// A GET body: the window stream with its exact length, so hyper sends Content-Length.
struct GetBody {
    /// The window read before the response started.
    first: Option<Bytes>,
    inner: WindowStream,
    remaining: u64,
    /// Counts the bytes sent, for the metrics.
    sent: Option<prometheus_client::metrics::counter::Counter>,
}

impl Stream for GetBody {
    type Item = Result<Bytes, s3s::StdError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(bytes) = this.first.take() {
            this.remaining = this.remaining.saturating_sub(bytes.len() as u64);
            if let Some(sent) = &this.sent {
                sent.inc_by(bytes.len() as u64);
            }
            return Poll::Ready(Some(Ok(bytes)));
        }
        match this.inner.poll_next_unpin(cx) {
            Poll::Ready(Some(Ok(bytes))) => {
                this.remaining = this.remaining.saturating_sub(bytes.len() as u64);
                if let Some(sent) = &this.sent {
                    sent.inc_by(bytes.len() as u64);
                }
                Poll::Ready(Some(Ok(bytes)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Box::new(e)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl ByteStream for GetBody {
    fn remaining_length(&self) -> RemainingLength {
        RemainingLength::new_exact(usize::try_from(self.remaining).unwrap_or(usize::MAX))
    }
}

pub(crate) async fn delete_object(
    client: &client::Client,
    req: S3Request<DeleteObjectInput>,
) -> S3Result<S3Response<DeleteObjectOutput>> {
    let input = req.input;
    check_version_id(input.version_id.as_deref())?;
    delete_one(client, &input.bucket, &input.key).await?;
    Ok(S3Response::new(DeleteObjectOutput::default()))
}

/// Deletes `bucket/key`; an absent key is success, as in S3.
async fn delete_one(client: &client::Client, bucket: &str, key: &str) -> S3Result<()> {
    match client.delete(bucket, key).await {
        Ok(()) => Ok(()),
        Err(client::Error::NotFound { .. }) => require_bucket(client, bucket).await,
        Err(e) => Err(s3_error(e)),
    }
}

pub(crate) async fn delete_objects(
    client: &client::Client,
    req: S3Request<DeleteObjectsInput>,
) -> S3Result<S3Response<DeleteObjectsOutput>> {
    let input = req.input;
    let objects = input.delete.objects;
    if objects.len() > DELETE_OBJECTS_MAX {
        return Err(S3Error::with_message(
            S3ErrorCode::MalformedXML,
            format!("{} keys in one DeleteObjects; the limit is {DELETE_OBJECTS_MAX}", objects.len()),
        ));
    }
    require_bucket(client, &input.bucket).await?;
    let bucket = input.bucket.as_str();
    let results: Vec<(ObjectIdentifier, S3Result<()>)> = futures_util::stream::iter(objects)
        .map(|object| async move {
            let result = match check_version_id(object.version_id.as_deref()) {
                Ok(()) => delete_one(client, bucket, &object.key).await,
                Err(e) => Err(e),
            };
            (object, result)
        })
        .buffered(DELETE_OBJECTS_CONCURRENCY)
        .collect()
        .await;
    let quiet = input.delete.quiet.unwrap_or(false);
    let mut deleted = Vec::new();
    let mut errors = Vec::new();
    for (object, result) in results {
        match result {
            Ok(()) if quiet => {}
            Ok(()) => deleted.push(DeletedObject {
                key: Some(object.key),
                version_id: object.version_id,
                ..Default::default()
            }),
            Err(e) => errors.push(s3s::dto::Error {
                code: Some(e.code().as_str().to_owned()),
                message: e.message().map(str::to_owned),
                key: Some(object.key),
                version_id: object.version_id,
            }),
        }
    }
    Ok(S3Response::new(DeleteObjectsOutput { deleted: Some(deleted), errors: Some(errors), request_charged: None }))
}

/// Source of a copy: bucket, key, its current version after the copy-source preconditions.
pub(crate) async fn copy_source(
    client: &client::Client,
    source: &CopySource,
    conditions: &Conditions<'_>,
) -> S3Result<client::ObjectInfo> {
    let CopySource::Bucket { bucket, key, version_id } = source else {
        return Err(S3Error::with_message(S3ErrorCode::NotImplemented, "copy sources must be BUCKET/KEY"));
    };
    check_version_id(version_id.as_deref())?;
    let info = head(client, bucket, key).await?;
    // A copy is never "not modified": every failed precondition is a 412.
    if evaluate(conditions, &info.meta.etag, info.meta.modified_ms) != Precondition::Proceed {
        return Err(S3Error::with_message(
            S3ErrorCode::PreconditionFailed,
            "at least one of the x-amz-copy-source-if-* preconditions did not hold",
        ));
    }
    Ok(info)
}

pub(crate) async fn copy_object(
    client: &client::Client,
    req: S3Request<CopyObjectInput>,
) -> S3Result<S3Response<CopyObjectOutput>> {
    let input = req.input;
    crate::bucket::check_object_acl(input.acl.as_ref())?;
    let conditions = Conditions {
        if_match: input.copy_source_if_match.as_ref(),
        if_none_match: input.copy_source_if_none_match.as_ref(),
        if_modified_since: input.copy_source_if_modified_since.as_ref(),
        if_unmodified_since: input.copy_source_if_unmodified_since.as_ref(),
    };
    let source = copy_source(client, &input.copy_source, &conditions).await?;
    let replace = match input.metadata_directive.as_ref().map(MetadataDirective::as_str) {
        None | Some(MetadataDirective::COPY) => false,
        Some(MetadataDirective::REPLACE) => true,
        Some(other) => return Err(invalid_argument(format!("unknown x-amz-metadata-directive {other:?}"))),
    };
    if !replace && source.meta.bucket == input.bucket && source.meta.key == input.key {
        return Err(S3Error::with_message(
            S3ErrorCode::InvalidRequest,
            "this copy request is illegal because it is trying to copy an object to itself without changing \
             the object's metadata (use x-amz-metadata-directive: REPLACE)",
        ));
    }
    let headers = if replace {
        object_headers!(input)
    } else {
        let mut stored = ObjectHeaders::stored(&source);
        stored.content_type = (!source.meta.content_type.is_empty()).then(|| source.meta.content_type.clone());
        stored
    };
    let mut options = headers.into_put_options()?;
    // The copy gets a checksum computed over the bytes copied: the source's algorithm when its
    // checksum is of the whole object (then also checked against it), else the one asked for
    // or the default.
    let whole = ObjectChecksum::stored(&source.meta.headers).filter(|c| c.kind == Kind::FullObject);
    let algorithm = match (&input.checksum_algorithm, &whole) {
        (Some(asked), _) => Algorithm::of_dto(asked)?,
        (None, Some(whole)) => whole.algorithm,
        (None, None) => Algorithm::DEFAULT,
    };
    let mut expected = Expected { bytes_max: u64::MAX, ..Default::default() };
    if let Some(whole) = whole.filter(|whole| whole.algorithm == algorithm) {
        expected.checksums = algorithm.only(whole.value);
    }
    let size = source.meta.size;
    let reader = tokio_util::io::StreamReader::new(object_stream(client.clone(), source, 0..size));
    let at_end = client::HeadersAtEnd::default();
    options.headers_at_end = Some(at_end.clone());
    let mut body = UploadBody::copy_source(Box::new(reader), expected, &[algorithm], Some(at_end));
    let info = client.put(&input.bucket, &input.key, &mut body, &options).await.map_err(s3_error)?;
    let checksum = ObjectChecksum::stored(&info.meta.headers).map(|c| c.dto()).unwrap_or_default();
    let result = CopyObjectResult {
        e_tag: Some(etag(&info.meta.etag)),
        last_modified: Some(crate::conditional::timestamp(info.meta.modified_ms)),
        checksum_crc32: checksum.checksum_crc32,
        checksum_crc32c: checksum.checksum_crc32c,
        checksum_crc64nvme: checksum.checksum_crc64nvme,
        checksum_sha1: checksum.checksum_sha1,
        checksum_sha256: checksum.checksum_sha256,
        checksum_type: checksum.checksum_type,
    };
    Ok(S3Response::new(CopyObjectOutput { copy_object_result: Some(result), ..Default::default() }))
}
