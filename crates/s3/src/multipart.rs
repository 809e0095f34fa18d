//! Multipart uploads: Create, UploadPart, UploadPartCopy, Complete, Abort, ListParts,
//! ListMultipartUploads.

use futures_util::StreamExt as _;
use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Request, S3Response, S3Result};

use crate::body::{Expected, UploadBody, object_stream};
use crate::bucket::owner;
use crate::checksum::{ObjectChecksum, UploadChecksum};
use crate::conditional::{Conditions, copy_source_range, timestamp};
use crate::error::{invalid_argument, s3_error};
use crate::list::common_prefix;
use crate::object::{copy_source, entity_too_large, etag};

/// Largest part, as S3.
pub(crate) const PART_BYTES_MAX: u64 = 5 << 30;
/// Part numbers are 1 to this, as S3.
pub(crate) const PART_NUMBER_MAX: i32 = 10_000;
/// Parts or uploads per listing page at most, and the default, as S3.
pub(crate) const LIST_PAGE_MAX: usize = 1000;
/// Upload markers ListMultipartUploads reads at once (for each upload's checksum request).
const UPLOAD_HEADS_IN_FLIGHT: usize = 16;

fn part_number(number: i32) -> S3Result<u32> {
    if (1..=PART_NUMBER_MAX).contains(&number) {
        Ok(u32::try_from(number).expect("checked positive"))
    } else {
        Err(invalid_argument(format!("part number must be an integer between 1 and {PART_NUMBER_MAX}, not {number}")))
    }
}

fn page_size(requested: Option<i32>, what: &str) -> S3Result<usize> {
    match requested {
        None => Ok(LIST_PAGE_MAX),
        Some(n) if n < 0 => Err(invalid_argument(format!("{what} must not be negative"))),
        Some(n) => Ok(usize::try_from(n).unwrap_or(LIST_PAGE_MAX).min(LIST_PAGE_MAX)),
    }
}

pub(crate) async fn create_multipart_upload(
    client: &client::Client,
    req: S3Request<CreateMultipartUploadInput>,
) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
    let input = req.input;
    crate::bucket::check_object_acl(input.acl.as_ref())?;
    let checksum = UploadChecksum::requested(input.checksum_algorithm.as_ref(), input.checksum_type.as_ref())?;
    let mut options = crate::object::object_headers!(input).into_put_options()?;
    options.headers.extend(checksum.marker_headers());
    let upload_id = client.create_multipart(&input.bucket, &input.key, &options).await.map_err(s3_error)?;
    let (checksum_algorithm, checksum_type) = checksum.reported();
    let output = CreateMultipartUploadOutput {
        bucket: Some(input.bucket),
        key: Some(input.key),
        upload_id: Some(upload_id),
        checksum_algorithm,
        checksum_type,
        ..Default::default()
    };
    Ok(S3Response::new(output))
}

pub(crate) async fn upload_part(
    client: &client::Client,
    req: S3Request<UploadPartInput>,
) -> S3Result<S3Response<UploadPartOutput>> {
    let S3Request { input, headers, trailing_headers, extensions, .. } = req;
    let number = part_number(input.part_number)?;
    let sized = extensions.get::<crate::server::UnsizedBody>().is_none();
    if sized && input.content_length.is_some_and(|len| len as u64 > PART_BYTES_MAX) {
        return Err(entity_too_large(PART_BYTES_MAX));
    }
    let checksums = crate::object::requested_checksums!(input);
    let expected = Expected::from_request(&headers, trailing_headers.as_ref(), checksums, PART_BYTES_MAX)?;
    // The part keeps the upload's checksum (computed here when the client sent none) and the
    // one the client sent.
    let upload = upload_checksum(client, &input.bucket, &input.key, &input.upload_id).await?;
    let sent = expected.algorithm();
    let algorithms = upload.part_algorithms(sent)?;
    let at_end = client::HeadersAtEnd::default();
    let mut body = UploadBody::new(input.body, expected, &algorithms, Some(at_end.clone())).counting(&extensions);
    let part = client
        .put_part_with(&input.bucket, &input.key, &input.upload_id, number, &mut body, Some(at_end))
        .await
        .map_err(s3_error)?;
    let computed = body.verified_checksums().cloned().unwrap_or_default();
    // Reported: what the client sent, and the upload's algorithm when it declared one.
    let reported = if upload.declared { Some(upload.algorithm) } else { sent };
    let checksum = reported.map(|a| crate::checksum::only(&computed, a)).unwrap_or_default();
    let output = UploadPartOutput {
        e_tag: Some(etag(&part.etag)),
        checksum_crc32: checksum.checksum_crc32,
        checksum_crc32c: checksum.checksum_crc32c,
        checksum_crc64nvme: checksum.checksum_crc64nvme,
        checksum_sha1: checksum.checksum_sha1,
        checksum_sha256: checksum.checksum_sha256,
        ..Default::default()
    };
    Ok(S3Response::new(output))
}

pub(crate) async fn upload_part_copy(
    client: &client::Client,
    req: S3Request<UploadPartCopyInput>,
) -> S3Result<S3Response<UploadPartCopyOutput>> {
    let input = req.input;
    let number = part_number(input.part_number)?;
    let conditions = Conditions {
        if_match: input.copy_source_if_match.as_ref(),
        if_none_match: input.copy_source_if_none_match.as_ref(),
        if_modified_since: input.copy_source_if_modified_since.as_ref(),
        if_unmodified_since: input.copy_source_if_unmodified_since.as_ref(),
    };
    let source = copy_source(client, &input.copy_source, &conditions).await?;
    let size = source.meta.size;
    let range = match &input.copy_source_range {
        Some(header) => copy_source_range(header, size)?,
        None => 0..size,
    };
    if range.end - range.start > PART_BYTES_MAX {
        return Err(entity_too_large(PART_BYTES_MAX));
    }
    let upload = upload_checksum(client, &input.bucket, &input.key, &input.upload_id).await?;
    let reader = tokio_util::io::StreamReader::new(object_stream(client.clone(), source, range));
    let at_end = client::HeadersAtEnd::default();
    let mut body = UploadBody::copy_source(
        Box::new(reader),
        Expected { bytes_max: PART_BYTES_MAX, ..Default::default() },
        &[upload.algorithm],
        Some(at_end.clone()),
    );
    let part = client
        .put_part_with(&input.bucket, &input.key, &input.upload_id, number, &mut body, Some(at_end))
        .await
        .map_err(s3_error)?;
    let computed = body.verified_checksums().cloned().unwrap_or_default();
    let checksum =
        if upload.declared { crate::checksum::only(&computed, upload.algorithm) } else { Checksum::default() };
    let result = CopyPartResult {
        e_tag: Some(etag(&part.etag)),
        last_modified: Some(timestamp(part.modified_ms)),
        checksum_crc32: checksum.checksum_crc32,
        checksum_crc32c: checksum.checksum_crc32c,
        checksum_crc64nvme: checksum.checksum_crc64nvme,
        checksum_sha1: checksum.checksum_sha1,
        checksum_sha256: checksum.checksum_sha256,
    };
    Ok(S3Response::new(UploadPartCopyOutput { copy_part_result: Some(result), ..Default::default() }))
}

pub(crate) async fn complete_multipart_upload(
    client: &client::Client,
    req: S3Request<CompleteMultipartUploadInput>,
) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
    let input = req.input;
    let listed = input.multipart_upload.and_then(|upload| upload.parts).unwrap_or_default();
    if listed.is_empty() {
        return Err(S3Error::with_message(S3ErrorCode::MalformedXML, "the request lists no parts"));
    }
    let mut parts = Vec::with_capacity(listed.len());
    let mut listed_checksums = Vec::with_capacity(listed.len());
    for part in listed {
        let (Some(number), Some(tag)) = (part.part_number, part.e_tag.as_ref()) else {
            return Err(S3Error::with_message(S3ErrorCode::MalformedXML, "every part needs a PartNumber and an ETag"));
        };
        parts.push((part_number(number)?, tag.value().to_owned()));
        listed_checksums.push((
            number,
            Checksum {
                checksum_crc32: part.checksum_crc32,
                checksum_crc32c: part.checksum_crc32c,
                checksum_crc64nvme: part.checksum_crc64nvme,
                checksum_sha1: part.checksum_sha1,
                checksum_sha256: part.checksum_sha256,
                checksum_type: None,
            },
        ));
    }
    let whole = crate::object::requested_checksums!(input);
    // `If-None-Match: *` and `If-Match: ETAG`, as for a conditional PUT (any other
    // If-None-Match is refused: S3 accepts only `*` on writes).
    let replacing = match (&input.if_match, &input.if_none_match) {
        (Some(_), Some(_)) => {
            return Err(invalid_argument("If-Match and If-None-Match cannot both be given"));
        }
        (Some(ETagCondition::ETag(tag)), None) => client::Replacing::ETag(tag.value().to_owned()),
        (Some(ETagCondition::Any), None) => client::Replacing::Existing,
        (None, Some(ETagCondition::Any)) => client::Replacing::Nothing,
        (None, Some(_)) => {
            return Err(S3Error::with_message(S3ErrorCode::NotImplemented, "If-None-Match on a write takes only *"));
        }
        (None, None) => client::Replacing::Anything,
    };
    // The object's checksum, from its parts' (checked against the request's) before the commit.
    // A refusal travels out of the client as an error of its own, with the S3 error kept here.
    let refused = std::sync::Mutex::new(None);
    let object_headers = |upload: &[(String, String)], stored: &[client::PartInfo]| {
        completed_headers(upload, stored, &listed_checksums, &whole, input.checksum_type.as_ref()).map_err(|e| {
            let message = e.message().unwrap_or_default().to_owned();
            *refused.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(e);
            client::Error::InvalidPart { number: 0, reason: message }
        })
    };
    let completed = client
        .complete_multipart_with(&input.bucket, &input.key, &input.upload_id, &parts, &replacing, &object_headers)
        .await;
    let info = match completed {
        Ok(info) => info,
        Err(e) => {
            let refusal = refused.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
            return Err(refusal.unwrap_or_else(|| s3_error(e)));
        }
    };
    let checksum = ObjectChecksum::stored(&info.meta.headers).map(|c| c.dto()).unwrap_or_default();
    let output = CompleteMultipartUploadOutput {
        location: Some(format!("/{}/{}", input.bucket, input.key)),
        bucket: Some(input.bucket),
        key: Some(input.key),
        e_tag: Some(etag(&info.meta.etag)),
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

/// The checksum an upload was created with.
async fn upload_checksum(
    client: &client::Client,
    bucket: &str,
    key: &str,
    upload_id: &str,
) -> S3Result<UploadChecksum> {
    let headers = client.upload_headers(bucket, key, upload_id).await.map_err(s3_error)?;
    Ok(UploadChecksum::of_upload(&headers))
}

/// The headers of a completed object: the upload's, less its checksum request, plus the
/// object's checksum made from its parts'. Refuses a part whose listed checksum differs from
/// the stored one (`InvalidPart`), a whole-object checksum that differs from the computed one
/// (`BadDigest`), and a checksum type other than the upload's (`InvalidRequest`).
fn completed_headers(
    upload: &[(String, String)],
    stored: &[client::PartInfo],
    listed: &[(i32, Checksum)],
    whole: &Checksum,
    checksum_type: Option<&ChecksumType>,
) -> S3Result<Vec<(String, String)>> {
    let checksum = UploadChecksum::of_upload(upload);
    for ((number, listed), part) in listed.iter().zip(stored) {
        crate::checksum::check_listed_part(*number, listed, &part.headers)?;
    }
    let mut headers = UploadChecksum::object_headers(upload);
    let object = checksum.combine(stored.iter().map(|p| (p.size, p.headers.as_slice())));
    if let Some(kind) = checksum_type
        && checksum.declared
        && !kind.as_str().eq_ignore_ascii_case(checksum.reported().1.as_ref().map_or("", |k| k.as_str()))
    {
        return Err(S3Error::with_message(
            S3ErrorCode::InvalidRequest,
            format!(
                "The upload was created using the {} checksum type; the request names {}",
                checksum.reported().1.as_ref().map_or("", |k| k.as_str()),
                kind.as_str()
            ),
        ));
    }
    if let Some(algorithm) = crate::checksum::Algorithm::sent(whole) {
        let expected = algorithm.field(whole).map(|v| v.trim().split('-').next().unwrap_or_default().to_owned());
        let computed = object
            .as_ref()
            .filter(|o| o.algorithm == algorithm)
            .map(|o| o.value.split('-').next().unwrap_or_default().to_owned());
        if expected != computed {
            return Err(S3Error::with_message(
                S3ErrorCode::BadDigest,
                format!("the {} you specified did not match the calculated checksum", algorithm.name()),
            ));
        }
    }
    if let Some(object) = object {
        headers.extend(object.headers());
    }
    Ok(headers)
}

pub(crate) async fn abort_multipart_upload(
    client: &client::Client,
    req: S3Request<AbortMultipartUploadInput>,
) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
    let input = req.input;
    client.abort_multipart(&input.bucket, &input.key, &input.upload_id).await.map_err(s3_error)?;
    Ok(S3Response::new(AbortMultipartUploadOutput::default()))
}

pub(crate) async fn list_parts(
    client: &client::Client,
    req: S3Request<ListPartsInput>,
) -> S3Result<S3Response<ListPartsOutput>> {
    let input = req.input;
    let max_parts = page_size(input.max_parts, "max-parts")?;
    let marker = input.part_number_marker.unwrap_or(0).max(0);
    let all = client.list_parts(&input.bucket, &input.key, &input.upload_id).await.map_err(s3_error)?;
    let mut after: Vec<client::PartInfo> =
        all.into_iter().filter(|p| i64::from(p.number) > i64::from(marker)).collect();
    after.sort_by_key(|p| p.number);
    let truncated = after.len() > max_parts;
    after.truncate(max_parts);
    // The parts' checksums, for an upload created with an algorithm: one head per part listed.
    let upload = upload_checksum(client, &input.bucket, &input.key, &input.upload_id).await?;
    if upload.declared {
        client.load_part_headers(&mut after).await.map_err(s3_error)?;
    }
    let (checksum_algorithm, checksum_type) = upload.reported();
    let next_marker = after.last().filter(|_| truncated).and_then(|p| i32::try_from(p.number).ok());
    let parts = after
        .into_iter()
        .map(|p| {
            // Only the upload's algorithm is reported (a part of an undeclared upload keeps the
            // default CRC64NVME too, which S3 does not list).
            let checksum = if upload.declared {
                let value = p.headers.iter().find(|(name, _)| name == upload.algorithm.header());
                value.map(|(_, value)| upload.algorithm.only(value.clone())).unwrap_or_default()
            } else {
                Checksum::default()
            };
            Part {
                part_number: i32::try_from(p.number).ok(),
                e_tag: Some(etag(&p.etag)),
                size: i64::try_from(p.size).ok(),
                last_modified: Some(timestamp(p.modified_ms)),
                checksum_crc32: checksum.checksum_crc32,
                checksum_crc32c: checksum.checksum_crc32c,
                checksum_crc64nvme: checksum.checksum_crc64nvme,
                checksum_sha1: checksum.checksum_sha1,
                checksum_sha256: checksum.checksum_sha256,
            }
        })
        .collect();
    let owner = owner();
    let output = ListPartsOutput {
        bucket: Some(input.bucket),
        key: Some(input.key),
        upload_id: Some(input.upload_id),
        part_number_marker: Some(marker),
        next_part_number_marker: next_marker,
        max_parts: i32::try_from(max_parts).ok(),
        is_truncated: Some(truncated),
        parts: Some(parts),
        initiator: Some(Initiator { display_name: owner.display_name.clone(), id: owner.id.clone() }),
        owner: Some(owner),
        storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
        checksum_algorithm,
        checksum_type,
        ..Default::default()
    };
    Ok(S3Response::new(output))
}

pub(crate) async fn list_multipart_uploads(
    client: &client::Client,
    req: S3Request<ListMultipartUploadsInput>,
) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
    let input = req.input;
    // `encoding-type=url` encodes the delimiter, markers, prefixes and keys, as S3 does.
    let encoder = crate::list::Encoder::new(input.encoding_type.as_ref())?;
    let max_uploads = page_size(input.max_uploads, "max-uploads")?;
    let prefix = input.prefix.unwrap_or_default();
    let delimiter = input.delimiter.filter(|d| !d.is_empty());
    let key_marker = input.key_marker.unwrap_or_default();
    let upload_id_marker = input.upload_id_marker.filter(|_| !key_marker.is_empty());
    crate::bucket::require_bucket(client, &input.bucket).await?;
    let all = client.list_multipart_uploads(&input.bucket, &prefix).await.map_err(s3_error)?;
    let page = page_uploads(all, &prefix, delimiter.as_deref(), &key_marker, upload_id_marker.as_deref(), max_uploads);
    // Each upload's checksum request is on its marker: one head per upload listed.
    let ids: Vec<(String, String)> = page.uploads.iter().map(|u| (u.key.clone(), u.upload_id.clone())).collect();
    let checksums: Vec<S3Result<UploadChecksum>> = futures_util::stream::iter(ids)
        .map(|(key, upload_id)| {
            let bucket = input.bucket.as_str();
            async move { upload_checksum(client, bucket, &key, &upload_id).await }
        })
        .buffered(UPLOAD_HEADS_IN_FLIGHT)
        .collect()
        .await;
    let mut reported = Vec::with_capacity(checksums.len());
    for checksum in checksums {
        reported.push(match checksum {
            Ok(checksum) => checksum.reported(),
            // Completed or aborted since the listing: listed without a checksum.
            Err(e) if *e.code() == S3ErrorCode::NoSuchUpload => (None, None),
            Err(e) => return Err(e),
        });
    }
    let owner = owner();
    let uploads = page
        .uploads
        .into_iter()
        .zip(reported)
        .map(|(u, (checksum_algorithm, checksum_type))| MultipartUpload {
            checksum_algorithm,
            checksum_type,
            key: Some(encoder.apply(u.key)),
            upload_id: Some(u.upload_id),
            initiated: Some(timestamp(u.initiated_ms)),
            initiator: Some(Initiator { display_name: owner.display_name.clone(), id: owner.id.clone() }),
            owner: Some(owner.clone()),
            storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
        })
        .collect();
    let output = ListMultipartUploadsOutput {
        bucket: Some(input.bucket),
        prefix: Some(encoder.apply(prefix)),
        delimiter: encoder.apply_opt(delimiter),
        key_marker: Some(encoder.apply(key_marker)),
        upload_id_marker,
        max_uploads: i32::try_from(max_uploads).ok(),
        is_truncated: Some(page.truncated),
        next_key_marker: encoder.apply_opt(page.next.as_ref().map(|(key, _)| key.clone())),
        next_upload_id_marker: page.next.map(|(_, id)| id),
        common_prefixes: Some(encoder.prefixes(page.prefixes)),
        uploads: Some(uploads),
        encoding_type: input.encoding_type,
        request_charged: None,
    };
    Ok(S3Response::new(output))
}

/// One page of uploads.
#[derive(Debug, Default)]
pub(crate) struct UploadPage {
    pub(crate) uploads: Vec<client::UploadInfo>,
    pub(crate) prefixes: Vec<String>,
    pub(crate) truncated: bool,
    /// Key and upload id markers of the next page.
    pub(crate) next: Option<(String, String)>,
}

/// Uploads (sorted by key, then initiation) after the markers, grouped by delimiter.
pub(crate) fn page_uploads(
    all: Vec<client::UploadInfo>,
    prefix: &str,
    delimiter: Option<&str>,
    key_marker: &str,
    upload_id_marker: Option<&str>,
    max_uploads: usize,
) -> UploadPage {
    // A key marker that is a common prefix (our own NextKeyMarker) skips the whole prefix.
    let skipped = common_prefix(key_marker, prefix, delimiter).filter(|common| *common == key_marker);
    let after_key =
        |u: &client::UploadInfo| u.key.as_str() > key_marker && !skipped.is_some_and(|c| u.key.starts_with(c));
    let start = match upload_id_marker {
        Some(id) => all
            .iter()
            .position(|u| u.key == key_marker && u.upload_id == id)
            .map_or_else(|| all.iter().position(after_key).unwrap_or(all.len()), |at| at + 1),
        None => all.iter().position(after_key).unwrap_or(all.len()),
    };
    let mut page = UploadPage::default();
    for upload in all.into_iter().skip(start) {
        let common = common_prefix(&upload.key, prefix, delimiter).map(str::to_owned);
        if common.is_some() && page.prefixes.last() == common.as_ref() {
            continue;
        }
        if page.uploads.len() + page.prefixes.len() >= max_uploads {
            page.truncated = true;
            break;
        }
        match common {
            Some(common) => {
                page.next = Some((common.clone(), String::new()));
                page.prefixes.push(common);
            }
            None => {
                page.next = Some((upload.key.clone(), upload.upload_id.clone()));
                page.uploads.push(upload);
            }
        }
    }
    if !page.truncated {
        page.next = None;
    }
    page
}
