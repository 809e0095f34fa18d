//! `client::Error` to S3 error code and HTTP status, in one `match`.

use hyper::StatusCode;
use s3s::{S3Error, S3ErrorCode};

use crate::body::BodyError;

/// The S3 error for a failed client call. Node trouble is logged at WARN here, where the error
/// is handled; a broken invariant (bad cluster map, codec misuse) at ERROR.
pub(crate) fn s3_error(error: client::Error) -> S3Error {
    use client::Error as E;
    let message = error.to_string();
    let (code, status) = match &error {
        // `proto::NameError` is beyond this crate's arrows; its two variants differ in wording.
        E::InvalidName(_) if message.starts_with("invalid bucket name") => (S3ErrorCode::InvalidBucketName, None),
        E::InvalidName(_) if message.contains("the limit is") => (S3ErrorCode::KeyTooLongError, None),
        E::InvalidName(_) => (S3ErrorCode::InvalidArgument, None),
        E::NoSuchBucket { .. } => (S3ErrorCode::NoSuchBucket, None),
        E::BucketNotEmpty { .. } => (S3ErrorCode::BucketNotEmpty, None),
        E::NotFound { .. } => (S3ErrorCode::NoSuchKey, None),
        E::NoSuchUpload { .. } => (S3ErrorCode::NoSuchUpload, None),
        E::InvalidPart { .. } => (S3ErrorCode::InvalidPart, None),
        E::InvalidPartOrder => (S3ErrorCode::InvalidPartOrder, None),
        E::EntityTooSmall { .. } => (S3ErrorCode::EntityTooSmall, None),
        E::RangeNotSatisfiable { .. } => (S3ErrorCode::InvalidRange, None),
        E::ObjectTooLarge { .. } => (S3ErrorCode::EntityTooLarge, None),
        E::Source(io) => return body_error(io),
        E::DiskFull { .. } => {
            tracing::warn!("{message}");
            (S3ErrorCode::Custom("InsufficientStorage".into()), Some(StatusCode::INSUFFICIENT_STORAGE))
        }
        E::Unavailable { .. }
        | E::WriteQuorum { .. }
        | E::NodeUnreachable { .. }
        | E::NodeDown { .. }
        | E::Timeout { .. }
        | E::AuthRejected { .. }
        | E::Node { .. }
        | E::Protocol { .. } => {
            tracing::warn!("{message}");
            (S3ErrorCode::ServiceUnavailable, None)
        }
        E::Map(_) | E::Codec(_) => {
            tracing::error!("{message}");
            (S3ErrorCode::InternalError, None)
        }
    };
    let mut s3 = S3Error::with_message(code, message);
    if let Some(status) = status {
        s3.set_status_code(status);
    }
    s3
}

/// The S3 error for a request body that failed while it was read (and so aborted the write).
fn body_error(io: &std::io::Error) -> S3Error {
    // A stream read from the cluster (GET body, copy source): its failure was logged where it
    // was read.
    if let Some(source) = io.get_ref().and_then(|inner| inner.downcast_ref::<client::Error>()) {
        return S3Error::with_message(S3ErrorCode::ServiceUnavailable, format!("read from the cluster: {source}"));
    }
    let body = io.get_ref().and_then(|inner| inner.downcast_ref::<BodyError>());
    match body {
        Some(BodyError::ContentMd5Mismatch) => S3Error::with_message(
            S3ErrorCode::BadDigest,
            "the Content-MD5 you specified did not match what we received",
        ),
        Some(BodyError::ChecksumMismatch { algorithm }) => S3Error::with_message(
            S3ErrorCode::BadDigest,
            format!("the {algorithm} you specified did not match the calculated checksum"),
        ),
        Some(BodyError::Sha256Mismatch) => {
            let mut error = S3Error::with_message(
                S3ErrorCode::Custom("XAmzContentSHA256Mismatch".into()),
                "the provided x-amz-content-sha256 does not match what was computed",
            );
            error.set_status_code(StatusCode::BAD_REQUEST);
            error
        }
        Some(BodyError::SignatureMismatch) => S3Error::with_message(
            S3ErrorCode::SignatureDoesNotMatch,
            "a chunk signature of the aws-chunked body does not match",
        ),
        Some(BodyError::TooLarge { max }) => S3Error::with_message(
            S3ErrorCode::EntityTooLarge,
            format!("the body is larger than the maximum of {max} bytes"),
        ),
        Some(BodyError::Idle(timeout)) => S3Error::with_message(
            S3ErrorCode::RequestTimeout,
            format!("no body bytes arrived for {timeout:?}; the upload was abandoned"),
        ),
        Some(BodyError::Incomplete(reason)) => {
            S3Error::with_message(S3ErrorCode::IncompleteBody, format!("the request body ended early: {reason}"))
        }
        None => S3Error::with_message(S3ErrorCode::IncompleteBody, format!("read the request body: {io}")),
    }
}

/// `InvalidArgument` with a message.
pub(crate) fn invalid_argument(message: impl Into<String>) -> S3Error {
    S3Error::with_message(S3ErrorCode::InvalidArgument, message.into())
}
