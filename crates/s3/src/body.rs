//! Bodies: the verifying reader a PUT streams into the client, and the windowed stream a GET
//! sends from the client. Both keep memory per request bounded whatever the object size.

use std::future::Future as _;
use std::io;
use std::ops::Range;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::{Stream, TryStreamExt};
use s3s::checksum::ChecksumHasher;
use s3s::crypto::{self, Checksum as _};

use crate::checksum::{Algorithm, decode_digest};
use s3s::dto::{Checksum, StreamingBlob};
use s3s::{S3Error, S3ErrorCode, TrailingHeaders};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::mpsc;
use tokio_util::io::StreamReader;

/// Bytes a GET reads from the cluster per step (rounded to whole stripes when a stripe is
/// smaller). One window is in the channel and one being read: ≤ 2 windows per GET, plus the
/// one hyper is writing.
pub(crate) const GET_WINDOW_BYTES: u64 = 8 << 20;
/// Windows queued ahead of the socket per GET.
const WINDOWS_QUEUED_MAX: usize = 1;
/// A PUT body that sends nothing for this long is abandoned (the write aborts).
pub const BODY_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Why a request body was refused; travels inside the `io::Error` the client sees, so that the
/// aborted write maps to the right S3 error.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    #[error("Content-MD5 mismatch")]
    ContentMd5Mismatch,
    #[error("{algorithm} checksum mismatch")]
    ChecksumMismatch { algorithm: &'static str },
    #[error("the copy source's bytes do not match its stored {algorithm} checksum")]
    SourceMismatch { algorithm: &'static str },
    #[error("the body already failed its checks")]
    AlreadyFailed,
    #[error("the {header} trailer was announced but not sent")]
    TrailerMissing { header: &'static str },
    #[error("x-amz-content-sha256 mismatch")]
    Sha256Mismatch,
    #[error("aws-chunked signature mismatch")]
    SignatureMismatch,
    #[error("body larger than {max} bytes")]
    TooLarge { max: u64 },
    #[error("no body bytes for {0:?}")]
    Idle(std::time::Duration),
    #[error("{0}")]
    Incomplete(String),
}

/// What a request body must match, from its headers.
#[derive(Default)]
pub(crate) struct Expected {
    /// Decoded Content-MD5.
    pub(crate) content_md5: Option<[u8; 16]>,
    /// `x-amz-checksum-*` headers (base64).
    pub(crate) checksums: Checksum,
    /// The checksum announced in `x-amz-trailer`, and where it will arrive.
    pub(crate) trailer: Option<(Algorithm, TrailingHeaders)>,
    /// Largest body accepted.
    pub(crate) bytes_max: u64,
}

impl Expected {
    /// Reads Content-MD5 and `x-amz-trailer`; `checksums` are the typed header values.
    pub(crate) fn from_request(
        headers: &hyper::HeaderMap,
        trailing: Option<&TrailingHeaders>,
        checksums: Checksum,
        bytes_max: u64,
    ) -> Result<Self, S3Error> {
        let content_md5 = match headers.get("content-md5") {
            None => None,
            Some(value) => Some(decode_content_md5(value.as_bytes()).ok_or_else(|| {
                S3Error::with_message(S3ErrorCode::InvalidDigest, "the Content-MD5 you specified is not valid")
            })?),
        };
        // Two algorithms at once, or a value that is not the base64 of a digest of the
        // algorithm's size, are refused before the body is read, as S3 answers them (a wrong
        // but well-formed value is BadDigest at the end).
        if Algorithm::ALL.iter().filter(|a| a.field(&checksums).is_some()).count() > 1 {
            return Err(S3Error::with_message(
                S3ErrorCode::InvalidRequest,
                "Expecting a single x-amz-checksum- header. Multiple checksum Types are not allowed.",
            ));
        }
        for algorithm in Algorithm::ALL {
            if let Some(value) = algorithm.field(&checksums)
                && decode_digest(value).is_none_or(|digest| digest.len() != algorithm.digest_bytes())
            {
                return Err(S3Error::with_message(
                    S3ErrorCode::InvalidRequest,
                    format!("Value for {} header is invalid.", algorithm.header()),
                ));
            }
        }
        let trailer = match (headers.get("x-amz-trailer"), trailing) {
            (Some(name), Some(handle)) => {
                let name = name.to_str().unwrap_or_default();
                Algorithm::from_header(name).map(|algorithm| (algorithm, handle.clone()))
            }
            _ => None,
        };
        Ok(Self { content_md5, checksums, trailer, bytes_max })
    }

    /// The flexible checksum the client sends, in a header or announced as a trailer.
    pub(crate) fn algorithm(&self) -> Option<Algorithm> {
        Algorithm::sent(&self.checksums).or(self.trailer.as_ref().map(|(algorithm, _)| *algorithm))
    }
}

/// Content-MD5 is the base64 of the 16-byte digest.
pub(crate) fn decode_content_md5(value: &[u8]) -> Option<[u8; 16]> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD.decode(value.trim_ascii()).ok()?;
    bytes.try_into().ok()
}

/// A PUT body as an `AsyncRead` that checks, at its end, every digest the request announced.
/// A mismatch (or a body that ends early) is a read error, so the client aborts the write and
/// nothing becomes visible.
pub(crate) struct UploadBody {
    inner: Option<Box<dyn AsyncRead + Send + Unpin>>,
    md5: Option<crypto::Md5>,
    hasher: Option<ChecksumHasher>,
    expected: Expected,
    received: u64,
    /// The checksums computed over a body that ended cleanly and matched.
    verified: Option<Checksum>,
    /// Where the computed checksums go, as headers, when the body ends cleanly.
    at_end: Option<client::HeadersAtEnd>,
    /// Counts the bytes received, for the metrics.
    counted: Option<prometheus_client::metrics::counter::Counter>,
    /// The bytes come from the cluster (a copy's source), not from the client: no idle
    /// timeout (the reads have their own), and a mismatch is the cluster's fault.
    from_cluster: bool,
    /// A check failed: every later read fails too, so nothing can read past a failure.
    failed: bool,
    /// Fires when the sender stalls; reset by every read that makes progress.
    idle: Pin<Box<tokio::time::Sleep>>,
}

impl UploadBody {
    /// `body` is `None` for an empty body. Computes, besides what `expected` names, every
    /// algorithm in `also`, and leaves the checksums in `at_end` once the body has ended and
    /// matched (the write stores them).
    pub(crate) fn new(
        body: Option<StreamingBlob>,
        expected: Expected,
        also: &[Algorithm],
        at_end: Option<client::HeadersAtEnd>,
    ) -> Self {
        let inner = body.map(|blob| {
            Box::new(StreamReader::new(blob.map_err(stream_error as fn(_) -> _))) as Box<dyn AsyncRead + Send + Unpin>
        });
        Self::build(inner, expected, also, at_end, false)
    }

    /// [`UploadBody::new`] over bytes read from the cluster (a copy's source): checked against
    /// `expected` (the source's stored checksum), hashed for the copy's.
    pub(crate) fn copy_source(
        source: Box<dyn AsyncRead + Send + Unpin>,
        expected: Expected,
        also: &[Algorithm],
        at_end: Option<client::HeadersAtEnd>,
    ) -> Self {
        Self::build(Some(source), expected, also, at_end, true)
    }

    fn build(
        inner: Option<Box<dyn AsyncRead + Send + Unpin>>,
        expected: Expected,
        also: &[Algorithm],
        at_end: Option<client::HeadersAtEnd>,
        from_cluster: bool,
    ) -> Self {
        let mut hasher = ChecksumHasher::default();
        for algorithm in Algorithm::ALL {
            let announced = expected.trailer.as_ref().is_some_and(|(a, _)| *a == algorithm);
            if announced || algorithm.field(&expected.checksums).is_some() || also.contains(&algorithm) {
                algorithm.enable(&mut hasher);
            }
        }
        let md5 = expected.content_md5.map(|_| crypto::Md5::new());
        let idle = Box::pin(tokio::time::sleep(BODY_IDLE_TIMEOUT));
        Self {
            inner,
            md5,
            hasher: Some(hasher),
            expected,
            received: 0,
            verified: None,
            at_end,
            counted: None,
            from_cluster,
            failed: false,
            idle,
        }
    }

    /// Counts the body's bytes in the gateway's metrics the request carries.
    pub(crate) fn counting(mut self, extensions: &hyper::http::Extensions) -> Self {
        self.counted = extensions.get::<crate::metrics::ObjectBytes>().map(|bytes| bytes.received.clone());
        self
    }

    /// The flexible checksums of the body, once it was read to its end and matched.
    pub(crate) fn verified_checksums(&self) -> Option<&Checksum> {
        self.verified.as_ref()
    }

    fn update(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.received += bytes.len() as u64;
        if let Some(counted) = &self.counted {
            counted.inc_by(bytes.len() as u64);
        }
        if self.received > self.expected.bytes_max {
            return Err(io::Error::other(BodyError::TooLarge { max: self.expected.bytes_max }));
        }
        if let Some(md5) = &mut self.md5 {
            md5.update(bytes);
        }
        if let Some(hasher) = &mut self.hasher {
            hasher.update(bytes);
        }
        Ok(())
    }

    /// Compares every announced digest with the computed one.
    fn finish(&mut self) -> Result<(), BodyError> {
        if let (Some(md5), Some(expected)) = (self.md5.take(), self.expected.content_md5)
            && md5.finalize().as_ref() != expected
        {
            return Err(BodyError::ContentMd5Mismatch);
        }
        let Some(hasher) = self.hasher.take() else { return Ok(()) };
        let computed = hasher.finalize();
        for algorithm in Algorithm::ALL {
            if let Some(expected) = algorithm.field(&self.expected.checksums)
                && algorithm.field(&computed) != Some(expected)
            {
                return Err(BodyError::ChecksumMismatch { algorithm: algorithm.name() });
            }
        }
        if let Some((algorithm, trailers)) = &self.expected.trailer {
            let sent =
                trailers.read(|map| map.get(algorithm.header()).and_then(|v| v.to_str().ok()).map(str::to_owned));
            // Announced in `x-amz-trailer` but not sent: refused, as S3 refuses it.
            let Some(Some(sent)) = sent else {
                return Err(BodyError::TrailerMissing { header: algorithm.header() });
            };
            if algorithm.field(&computed).map(String::as_str) != Some(sent.trim()) {
                return Err(BodyError::ChecksumMismatch { algorithm: algorithm.name() });
            }
        }
        if let Some(at_end) = &self.at_end {
            at_end.set(crate::checksum::headers_of(&computed));
        }
        self.verified = Some(computed);
        Ok(())
    }
}

impl AsyncRead for UploadBody {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.failed {
            return Poll::Ready(Err(io::Error::other(BodyError::AlreadyFailed)));
        }
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        let result = this.read_checked(cx, buf);
        if matches!(result, Poll::Ready(Err(_))) {
            this.failed = true;
        }
        result
    }
}

impl UploadBody {
    fn read_checked(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self;
        let before = buf.filled().len();
        if let Some(inner) = &mut this.inner {
            if Pin::new(inner).poll_read(cx, buf)?.is_pending() {
                if !this.from_cluster && this.idle.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Err(io::Error::other(BodyError::Idle(BODY_IDLE_TIMEOUT))));
                }
                return Poll::Pending;
            }
            let deadline = tokio::time::Instant::now() + BODY_IDLE_TIMEOUT;
            this.idle.as_mut().reset(deadline);
        }
        let filled = buf.filled().len() - before;
        if filled == 0 {
            // End of the body: everything was hashed, and s3s has checked the SHA-256 and
            // chunk signatures by now.
            if this.verified.is_none() {
                let from_cluster = this.from_cluster;
                this.finish().map_err(|error| match error {
                    BodyError::ChecksumMismatch { algorithm } if from_cluster => {
                        io::Error::other(BodyError::SourceMismatch { algorithm })
                    }
                    other => io::Error::other(other),
                })?;
            }
            return Poll::Ready(Ok(()));
        }
        this.update(&buf.filled()[before..])?;
        Poll::Ready(Ok(()))
    }
}

/// s3s's body errors are private types; their messages name the failure.
fn stream_error(error: s3s::StdError) -> io::Error {
    let text = error.to_string();
    let body = if text.contains("Sha256Mismatch") {
        BodyError::Sha256Mismatch
    } else if text.contains("SignatureMismatch") {
        BodyError::SignatureMismatch
    } else {
        BodyError::Incomplete(text)
    };
    io::Error::other(body)
}

/// The bytes `range` of the object in `info`, read from the cluster one window at a time by a
/// task that stays at most [`WINDOWS_QUEUED_MAX`] windows ahead of the consumer and stops
/// when the consumer is dropped.
pub(crate) fn object_stream(client: client::Client, info: client::ObjectInfo, range: Range<u64>) -> WindowStream {
    let (tx, rx) = mpsc::channel(WINDOWS_QUEUED_MAX);
    let stripe_bytes = u64::from(info.meta.k) * u64::from(info.meta.chunk_bytes);
    // In the request's span, so a failure it logs carries the request id.
    let span = tracing::Span::current();
    let task = async move {
        let mut offset = range.start;
        while offset < range.end {
            let end = window_end(offset, range.end, stripe_bytes, GET_WINDOW_BYTES);
            let item = read_window(&client, &info, offset, end).await;
            let failed = item.is_err();
            if tx.send(item).await.is_err() || failed {
                return; // the consumer went away, or was told why the body stops here
            }
            offset = end;
        }
    };
    tokio::spawn(tracing::Instrument::instrument(task, span));
    WindowStream { rx }
}

async fn read_window(client: &client::Client, info: &client::ObjectInfo, offset: u64, end: u64) -> io::Result<Bytes> {
    let len = usize::try_from(end - offset).expect("a window is at most GET_WINDOW_BYTES");
    let mut buf = vec![0u8; len];
    match client.read_at(info, offset, &mut buf).await {
        Ok(read) if read == len => Ok(Bytes::from(buf)),
        Ok(read) => {
            let meta = &info.meta;
            tracing::warn!("{}/{}: read {read} of {len} bytes at {offset}; response cut short", meta.bucket, meta.key);
            Err(io::Error::new(io::ErrorKind::UnexpectedEof, "object shorter than its metadata says"))
        }
        Err(e) => {
            // After the first window the status line is out: the body is cut short, which the
            // HTTP client sees as a short read against Content-Length.
            tracing::warn!("{}/{}: read at {offset} failed: {e}", info.meta.bucket, info.meta.key);
            Err(io::Error::other(e))
        }
    }
}

/// End of the window that starts at `offset`: the next multiple of the largest whole number of
/// stripes that fits in `window_bytes` (or of `window_bytes` when a stripe is larger), at most
/// `end`. Windows after the first are then stripe-aligned, so no stripe is read twice.
pub(crate) fn window_end(offset: u64, end: u64, stripe_bytes: u64, window_bytes: u64) -> u64 {
    assert!(window_bytes > 0 && offset < end, "a window of a non-empty range");
    let step = if stripe_bytes == 0 || stripe_bytes > window_bytes {
        window_bytes
    } else {
        window_bytes / stripe_bytes * stripe_bytes
    };
    let next = (offset / step + 1).saturating_mul(step);
    let window = next.min(end);
    assert!(window > offset && window - offset <= window_bytes);
    window
}

/// The receiving end of [`object_stream`].
pub(crate) struct WindowStream {
    rx: mpsc::Receiver<io::Result<Bytes>>,
}

impl Stream for WindowStream {
    type Item = io::Result<Bytes>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().rx.poll_recv(cx)
    }
}
