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
        E::PreconditionFailed { .. } => (S3ErrorCode::PreconditionFailed, None),
        E::TooManyUploads { .. } => {
            (S3ErrorCode::Custom("TooManyUploads".into()), Some(StatusCode::SERVICE_UNAVAILABLE))
        }
        // The cluster's own trouble: the details (node ids, addresses, drive paths) go to the
        // gateway's log under the request's span (its request id); the client gets the code.
        E::DiskFull { .. } => {
            tracing::warn!("{message}");
            let code = S3ErrorCode::Custom("InsufficientStorage".into());
            return internal(code, Some(StatusCode::INSUFFICIENT_STORAGE), "the cluster is out of space");
        }
        E::Unavailable { .. }
        | E::WriteQuorum { .. }
        | E::NodeUnreachable { .. }
        | E::NodeDown { .. }
        | E::Timeout { .. }
        | E::AuthRejected { .. }
        | E::NodeNotAuthenticated { .. }
        | E::WrongCluster { .. }
        | E::MapRefresh { .. }
        | E::MapChange(_)
        | E::Pool { .. }
        | E::NoPoolForErasure { .. }
        | E::Node { .. }
        | E::Protocol { .. } => {
            tracing::warn!("{message}");
            let text = match &error {
                E::Unavailable { available, needed, .. } => {
                    format!("too few chunks of the object are reachable ({available} of {needed} needed); retry later")
                }
                E::WriteQuorum { acked, needed, .. } => {
                    format!("too few drives accepted the write ({acked} of {needed} needed); retry later")
                }
                _ => "the cluster could not serve the request; retry later".to_owned(),
            };
            return internal(S3ErrorCode::ServiceUnavailable, None, &text);
        }
        // An admin call; the gateway never makes it.
        E::Map(_)
        | E::NodeTlsConfig(_)
        | E::Codec(_)
        | E::NoSuchDrive(_)
        | E::BadGather(_)
        | E::BadBlockSize(_)
        | E::KeyRecords(_) => {
            tracing::error!("{message}");
            return internal(S3ErrorCode::InternalError, None, "internal error");
        }
    };
    let mut s3 = S3Error::with_message(code, message);
    if let Some(status) = status {
        s3.set_status_code(status);
    }
    s3
}

/// An error about the cluster itself, with a message that names no node, address or path.
fn internal(code: S3ErrorCode, status: Option<StatusCode>, text: &str) -> S3Error {
    let mut s3 = S3Error::with_message(code, format!("{text} (see the gateway log for this request id)"));
    if let Some(status) = status {
        s3.set_status_code(status);
    }
    s3
}

/// The S3 error for a request body that failed while it was read (and so aborted the write).
fn body_error(io: &std::io::Error) -> S3Error {
    // A stream read from the cluster (GET body, copy source): its failure was logged where it
    // was read.
    if io.get_ref().and_then(|inner| inner.downcast_ref::<client::Error>()).is_some() {
        return internal(
            S3ErrorCode::ServiceUnavailable,
            None,
            "reading the object from the cluster failed; retry later",
        );
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
        Some(error @ BodyError::SourceMismatch { .. }) => {
            // Every block of the source was checked against its CRC32C as it was read: a
            // whole-object mismatch means the stored checksum or the object is wrong.
            tracing::error!("copy refused: {error}");
            internal(S3ErrorCode::InternalError, None, "the copy source failed an integrity check; nothing was written")
        }
        Some(BodyError::AlreadyFailed) => {
            S3Error::with_message(S3ErrorCode::IncompleteBody, "the request body failed an earlier check")
        }
        Some(BodyError::TrailerMissing { header }) => S3Error::with_message(
            S3ErrorCode::InvalidRequest,
            format!("x-amz-trailer announced {header}, but the body's trailer did not carry it"),
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
