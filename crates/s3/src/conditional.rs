//! Conditional requests (If-Match and friends, RFC 9110 section 13.2.2 order) and byte ranges.

use std::ops::Range;
use std::time::{Duration, UNIX_EPOCH};

use s3s::dto::{ETagCondition, Timestamp};
use s3s::{S3Error, S3ErrorCode};

/// The precondition headers of a GET, HEAD or copy source.
#[derive(Debug, Default)]
pub(crate) struct Conditions<'a> {
    pub(crate) if_match: Option<&'a ETagCondition>,
    pub(crate) if_none_match: Option<&'a ETagCondition>,
    pub(crate) if_modified_since: Option<&'a Timestamp>,
    pub(crate) if_unmodified_since: Option<&'a Timestamp>,
}

/// What the preconditions say about a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Precondition {
    Proceed,
    /// 304 for GET and HEAD.
    NotModified,
    /// 412.
    Failed,
}

/// Evaluates `conditions` against an object with `etag` (unquoted) last modified at
/// `modified_ms`. If-Match beats If-Unmodified-Since, If-None-Match beats If-Modified-Since.
pub(crate) fn evaluate(conditions: &Conditions<'_>, etag: &str, modified_ms: u64) -> Precondition {
    // HTTP dates have whole seconds: compare at that precision.
    let modified = http_time(modified_ms);
    if let Some(condition) = conditions.if_match {
        if !matches(condition, etag) {
            return Precondition::Failed;
        }
    } else if let Some(since) = conditions.if_unmodified_since
        && modified > *since
    {
        return Precondition::Failed;
    }
    if let Some(condition) = conditions.if_none_match {
        if matches(condition, etag) {
            return Precondition::NotModified;
        }
    } else if let Some(since) = conditions.if_modified_since
        && modified <= *since
    {
        return Precondition::NotModified;
    }
    Precondition::Proceed
}

fn matches(condition: &ETagCondition, etag: &str) -> bool {
    match condition {
        ETagCondition::Any => true,
        // Weak comparison: S3 ETags are never weak, and clients copy them back as they got them.
        ETagCondition::ETag(tag) => tag.value().trim_matches('"') == etag,
    }
}

/// The error a failed precondition answers with.
pub(crate) fn precondition_error(outcome: Precondition, etag: &str, modified_ms: u64) -> Option<S3Error> {
    match outcome {
        Precondition::Proceed => None,
        Precondition::Failed => Some(S3Error::with_message(
            S3ErrorCode::PreconditionFailed,
            "at least one of the preconditions you specified did not hold",
        )),
        Precondition::NotModified => {
            let mut error = S3Error::new(S3ErrorCode::NotModified);
            let mut headers = hyper::HeaderMap::new();
            if let Ok(value) = format!("\"{etag}\"").parse() {
                headers.insert(hyper::header::ETAG, value);
            }
            if let Ok(value) = format_http_date(modified_ms).parse() {
                headers.insert(hyper::header::LAST_MODIFIED, value);
            }
            error.set_headers(headers);
            Some(error)
        }
    }
}

/// `modified_ms` as a timestamp with millisecond precision (listings, Last-Modified).
pub(crate) fn timestamp(modified_ms: u64) -> Timestamp {
    Timestamp::from(UNIX_EPOCH + Duration::from_millis(modified_ms))
}

/// `modified_ms` truncated to whole seconds, as HTTP dates carry it.
fn http_time(modified_ms: u64) -> Timestamp {
    Timestamp::from(UNIX_EPOCH + Duration::from_secs(modified_ms / 1000))
}

fn format_http_date(modified_ms: u64) -> String {
    let mut text = Vec::new();
    // Formatting a valid timestamp into a Vec cannot fail; an empty header is the fallback.
    let _ = http_time(modified_ms).format(s3s::dto::TimestampFormat::HttpDate, &mut text);
    String::from_utf8(text).unwrap_or_default()
}

/// The byte range a Range header asks for in an object of `size` bytes: `None` for the whole
/// object, `InvalidRange` (416) when it does not overlap the object.
pub(crate) fn resolve_range(range: Option<&s3s::dto::Range>, size: u64) -> Result<Option<Range<u64>>, S3Error> {
    let Some(range) = range else { return Ok(None) };
    match range.check(size) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(_) => {
            let mut error = S3Error::with_message(
                S3ErrorCode::InvalidRange,
                format!("the range {} is not satisfiable for an object of {size} bytes", range.to_header_string()),
            );
            let mut headers = hyper::HeaderMap::new();
            if let Ok(value) = format!("bytes */{size}").parse() {
                headers.insert(hyper::header::CONTENT_RANGE, value);
            }
            error.set_headers(headers);
            Err(error)
        }
    }
}

/// `Content-Range` of a non-empty `range` of an object of `size` bytes.
pub(crate) fn content_range(range: &Range<u64>, size: u64) -> String {
    assert!(range.start < range.end && range.end <= size, "a satisfiable range");
    format!("bytes {}-{}/{size}", range.start, range.end - 1)
}

/// `x-amz-copy-source-range: bytes=FIRST-LAST` against a source of `size` bytes.
pub(crate) fn copy_source_range(header: &str, size: u64) -> Result<Range<u64>, S3Error> {
    match s3s::dto::Range::parse(header.trim()) {
        Ok(s3s::dto::Range::Int { first, last: Some(last) }) if first <= last && last < size => Ok(first..last + 1),
        // Well formed but not inside the source: S3's 416.
        Ok(s3s::dto::Range::Int { first, last: Some(last) }) if first <= last => Err(S3Error::with_message(
            S3ErrorCode::InvalidRange,
            format!("the x-amz-copy-source-range {header:?} is not inside the source object of {size} bytes"),
        )),
        _ => Err(S3Error::with_message(
            S3ErrorCode::InvalidArgument,
            format!(
                "the x-amz-copy-source-range {header:?} must be bytes=first-last, the zero-based offsets of the first \
                 and last bytes to copy"
            ),
        )),
    }
}
