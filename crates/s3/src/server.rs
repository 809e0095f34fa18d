//! The HTTP side: the s3s service (auth, host parsing) and the hyper accept loop.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use s3s::dto::*;
use s3s::service::{S3Service, S3ServiceBuilder};
use s3s::{S3, S3Request, S3Response, S3Result};

use crate::{GatewayConfig, Tessera};

/// Connections served at once; further ones wait in the listen backlog.
pub const CONNECTIONS_MAX: usize = 1024;
/// Time a client has to send a request's headers (slowloris bound).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Time a client has to finish its TLS handshake (a real one takes milliseconds); the header
/// bound starts after it, so an HTTPS connection holds its permit at most this plus
/// [`HEADER_READ_TIMEOUT`] before its first request.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Time requests in progress get to finish after shutdown is asked.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause after a failed accept.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);
/// Largest form fields of a browser POST upload (not served) s3s reads before answering.
const POST_FORM_BYTES_MAX: usize = 64 << 10;
/// Largest XML request body (CompleteMultipartUpload of 10 000 parts fits).
const XML_BODY_BYTES_MAX: usize = 4 * 1024 * 1024;

pub(crate) fn build_service(client: client::Client, config: &GatewayConfig) -> S3Service {
    let relayer = crate::relayout::Relayer::start(client.clone(), config.relayout_rate);
    let keys = crate::keys::Keys::new(client.clone(), config.access_key.clone(), config.secret_key.clone());
    let mut builder = S3ServiceBuilder::new(Tessera { client, relayer, region: config.region.clone() });
    builder.set_auth(crate::keys::Auth(keys.clone()));
    builder.set_access(crate::keys::AccessCheck(keys));
    builder.set_host(crate::host::BucketHosts::new(&config.domains, config.listen.port()));
    let mut s3_config = s3s::config::S3Config::default();
    s3_config.xml_max_body_size = XML_BODY_BYTES_MAX;
    // Browser POST uploads (PostObject) are not served (501), but s3s reads the form's file
    // into memory before any check: keep that at nothing, so an anonymous POST costs nothing.
    s3_config.post_object_max_file_size = 0;
    s3_config.form_max_fields_size = POST_FORM_BYTES_MAX;
    builder.set_config(Arc::new(s3s::config::StaticConfigProvider::new(Arc::new(s3_config))));
    builder.build()
}

/// Largest error body the gateway rewrites to add its request id; S3 error bodies are small.
const ERROR_BODY_BYTES_MAX: usize = 64 << 10;
/// How far a SigV2 request's `Date` may be from the gateway's clock, as S3 allows.
const SIGV2_CLOCK_SKEW_MAX: Duration = Duration::from_secs(15 * 60);
/// How far ahead a SigV2 presigned URL may expire: SigV4's limit (7 days), which SigV2 lacks.
const SIGV2_PRESIGNED_EXPIRY_MAX: Duration = Duration::from_secs(7 * 86_400);
/// Header that carries the request id on every answer, as S3's.
const REQUEST_ID_HEADER: &str = "x-amz-request-id";

/// Every request: a request id (in the `x-amz-request-id` header, in every error body's
/// `RequestId`, and on every log line of the request, so an operator can find what a client
/// reports), the SigV2 policy, then the s3s service.
pub(crate) async fn handle(
    service: S3Service,
    sigv2: crate::SigV2,
    metrics: crate::GatewayMetrics,
    mut request: hyper::Request<hyper::body::Incoming>,
) -> Result<s3s::HttpResponse, s3s::HttpError> {
    use tracing::Instrument as _;
    let arrived = std::time::Instant::now();
    let operation = metrics.attach(request.extensions_mut());
    let request_id = format!("{:016X}", rand::random::<u64>());
    let span = tracing::info_span!("request", id = %request_id);
    // Handlers see it as a request extension. Never as a header: SigV2 (and a SigV4 client
    // that chose to) signs every x-amz-* header, so adding one would break the signature.
    let id_value = hyper::header::HeaderValue::from_str(&request_id).expect("hex is a valid header value");
    request.extensions_mut().insert(RequestId(request_id.clone()));
    mark_unsized_body(&mut request);
    let mut response = match check_sigv2(sigv2, &request).and_then(|()| check_presigned_expiry(&request)) {
        Err((status, code, message)) => {
            tracing::info!(parent: &span, code, "refused: {message}");
            error_response(status, code, message)
        }
        Ok(()) => call_closing_on_early_error(service, request).instrument(span.clone()).await?,
    };
    response.headers_mut().insert(REQUEST_ID_HEADER, id_value);
    metrics.observe(&operation, response.status(), arrived.elapsed());
    if response.status().is_server_error() {
        tracing::warn!(parent: &span, status = %response.status(), "answered with a server error");
    }
    Ok(with_request_id_in_body(response, &request_id).await)
}

/// A request extension: this PUT of an object came with `Transfer-Encoding: chunked` and no
/// length ([`mark_unsized_body`]); its `Content-Length` header is [`UNSIZED_CONTENT_LENGTH`],
/// not a length, and the body is read to its end (at most the operation's limit).
#[derive(Clone, Copy, Debug)]
pub(crate) struct UnsizedBody;

/// What [`mark_unsized_body`] puts in the `Content-Length` header (i64::MAX: s3s parses the
/// header as a signed length). Handlers that see [`UnsizedBody`] ignore it.
const UNSIZED_CONTENT_LENGTH: u64 = i64::MAX as u64;

/// Accepts a PutObject or UploadPart sent with `Transfer-Encoding: chunked` and no length (as
/// streaming HTTP clients and `curl -T -` send, with an unsigned payload): S3 answers 411
/// `MissingContentLength`; Tessera stores it whole, as Ceph RGW does (a deliberate difference:
/// accepting it loses nothing, and the body is still bounded by the operation's limit). s3s
/// asks an unsigned payload for a length, so the request gets a placeholder one and an
/// [`UnsizedBody`] mark. Not for a signed payload hash (whose check needs the real length), an
/// aws-chunked body (which carries its decoded length) or a bucket-level PUT (an XML body,
/// read whole against its length): those keep s3s's answer.
pub(crate) fn mark_unsized_body<B>(request: &mut hyper::Request<B>) {
    use hyper::header::{CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
    let headers = request.headers();
    let chunked = headers.get(TRANSFER_ENCODING).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"chunked"));
    let unsigned = headers.get("x-amz-content-sha256").is_none_or(|v| v.as_bytes() == b"UNSIGNED-PAYLOAD");
    if request.method() != hyper::Method::PUT || headers.contains_key(CONTENT_LENGTH) || !chunked || !unsigned {
        return;
    }
    let host = headers.get(HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
    let host_name = host.rsplit_once(':').map_or(host, |(name, _)| name);
    let path = request.uri().path().trim_start_matches('/');
    let key = if host_name.ends_with(".localhost") { path } else { path.split_once('/').map_or("", |(_, key)| key) };
    // Object subresources (?tagging, ?acl, ...) take XML bodies; parts and presigning do not.
    let plain = form_urlencoded::parse(request.uri().query().unwrap_or("").as_bytes()).all(|(name, _)| {
        matches!(name.as_ref(), "partNumber" | "uploadId" | "x-id") || name.to_ascii_lowercase().starts_with("x-amz-")
    });
    if key.is_empty() || !plain {
        return;
    }
    request.headers_mut().insert(CONTENT_LENGTH, hyper::header::HeaderValue::from(UNSIZED_CONTENT_LENGTH));
    request.extensions_mut().insert(UnsizedBody);
}

/// The id of the request being served (a request extension).
#[derive(Clone, Debug)]
pub(crate) struct RequestId(#[allow(dead_code)] pub(crate) String);

/// Whether a request signed with Signature Version 2 may go on: refused unless the gateway
/// allows SigV2, and then only with a `Date` within [`SIGV2_CLOCK_SKEW_MAX`] (so a captured
/// request cannot be replayed forever).
fn check_sigv2<B>(
    sigv2: crate::SigV2,
    request: &hyper::Request<B>,
) -> Result<(), (hyper::StatusCode, &'static str, String)> {
    let headers = request.headers();
    let auth = headers.get(hyper::header::AUTHORIZATION).and_then(|v| v.to_str().ok()).unwrap_or("");
    let query = request.uri().query().unwrap_or("");
    let header_v2 = auth.starts_with("AWS ");
    // Names as s3s reads them: percent-decoded (`%41WSAccessKeyId` is `AWSAccessKeyId`). Either
    // name makes it a SigV2 presigned request; SigV4 names its fields `X-Amz-*`.
    let params: Vec<(String, String)> =
        form_urlencoded::parse(query.as_bytes()).map(|(name, value)| (name.into_owned(), value.into_owned())).collect();
    let param = |wanted: &str| params.iter().find(|(name, _)| name == wanted).map(|(_, value)| value.as_str());
    let presigned_v2 = param("AWSAccessKeyId").is_some() || param("Signature").is_some();
    if !header_v2 && !presigned_v2 {
        return Ok(());
    }
    if sigv2 == crate::SigV2::Refused {
        return Err((
            hyper::StatusCode::BAD_REQUEST,
            "InvalidRequest",
            "The authorization mechanism you have provided is not supported. Please use AWS4-HMAC-SHA256. \
             (This gateway serves SigV2 only when started with --allow-sigv2; boto3 presigns with SigV4 given \
             Config(signature_version='s3v4').)"
                .into(),
        ));
    }
    if !header_v2 {
        // Presigned SigV2 URLs carry their own expiry, which s3s checks; past it, and no further
        // ahead than SigV4 allows (7 days), so a leaked URL cannot serve for ever.
        let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
        let expires = param("Expires").and_then(|e| e.parse::<u64>().ok());
        if expires.is_some_and(|e| e > now_s.saturating_add(SIGV2_PRESIGNED_EXPIRY_MAX.as_secs())) {
            return Err((
                hyper::StatusCode::FORBIDDEN,
                "AccessDenied",
                format!(
                    "SigV2 presigned URLs may expire at most {} days ahead",
                    SIGV2_PRESIGNED_EXPIRY_MAX.as_secs() / 86_400
                ),
            ));
        }
        return Ok(());
    }
    let date = headers.get("x-amz-date").or_else(|| headers.get(hyper::header::DATE)).and_then(|v| v.to_str().ok());
    let Some(date) = date.and_then(|d| httpdate::parse_http_date(d).ok()) else {
        return Err((
            hyper::StatusCode::FORBIDDEN,
            "AccessDenied",
            "AWS authentication requires a valid Date or x-amz-date header".into(),
        ));
    };
    let now = std::time::SystemTime::now();
    let skew = now.duration_since(date).or_else(|_| date.duration_since(now)).unwrap_or_default();
    if skew > SIGV2_CLOCK_SKEW_MAX {
        return Err((
            hyper::StatusCode::FORBIDDEN,
            "RequestTimeTooSkewed",
            format!("The difference between the request time and the current time is too large ({}s)", skew.as_secs()),
        ));
    }
    Ok(())
}

/// Longest a SigV4 presigned URL may be valid for, as S3: a week.
const PRESIGNED_EXPIRES_MAX_S: i64 = 604_800;

/// A SigV4 presigned URL's `X-Amz-Expires`, checked as S3 checks it before the signature:
/// not a number, negative, or above a week is 400 `AuthorizationQueryParametersError` (s3s
/// takes any 32-bit value, so a URL presigned for years would work). An expired URL is s3s's
/// 403 `AccessDenied` ("Request has expired"), as S3.
pub(crate) fn check_presigned_expiry<B>(
    request: &hyper::Request<B>,
) -> Result<(), (hyper::StatusCode, &'static str, String)> {
    let query = request.uri().query().unwrap_or("");
    if !query.contains("X-Amz-Expires") {
        return Ok(());
    }
    let Some((_, value)) = form_urlencoded::parse(query.as_bytes()).find(|(name, _)| name == "X-Amz-Expires") else {
        return Ok(());
    };
    let refused =
        |message: &str| Err((hyper::StatusCode::BAD_REQUEST, "AuthorizationQueryParametersError", message.to_owned()));
    match value.parse::<i64>() {
        Err(_) => refused("X-Amz-Expires should be a number"),
        Ok(seconds) if seconds < 0 => refused("X-Amz-Expires must be non-negative"),
        Ok(seconds) if seconds > PRESIGNED_EXPIRES_MAX_S => {
            refused("X-Amz-Expires must be less than a week (in seconds) that is 604800")
        }
        Ok(_) => Ok(()),
    }
}

/// An S3 error answer built here (before s3s sees the request); `message` names no input.
fn error_response(status: hyper::StatusCode, code: &str, message: String) -> s3s::HttpResponse {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code><Message>{message}</Message></Error>"
    );
    let mut response = hyper::Response::new(s3s::Body::from(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/xml"));
    response
}

/// Adds `<RequestId>` to an XML error body that lacks one (s3s writes none).
async fn with_request_id_in_body(response: s3s::HttpResponse, request_id: &str) -> s3s::HttpResponse {
    let is_xml = response.headers().get(hyper::header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().ends_with(b"xml"));
    if !(response.status().is_client_error() || response.status().is_server_error()) || !is_xml {
        return response;
    }
    let (mut parts, mut body) = response.into_parts();
    let Ok(bytes) = body.store_all_limited(ERROR_BODY_BYTES_MAX).await else {
        // Not a small error document: send it as it was (the header still carries the id).
        return hyper::Response::from_parts(parts, body);
    };
    let text = String::from_utf8_lossy(&bytes);
    let text = if text.contains("<RequestId>") || !text.contains("</Error>") {
        text.into_owned()
    } else {
        text.replacen("</Error>", &format!("<RequestId>{request_id}</RequestId></Error>"), 1)
    };
    parts.headers.remove(hyper::header::CONTENT_LENGTH);
    hyper::Response::from_parts(parts, s3s::Body::from(text))
}

/// An error answered before the request body was read leaves that body on the wire, so the
/// connection cannot carry another request: say so with `Connection: close`, or clients that
/// pool connections (botocore with `Expect: 100-continue`) read a stale answer on reuse.
async fn call_closing_on_early_error(
    service: S3Service,
    request: hyper::Request<hyper::body::Incoming>,
) -> Result<s3s::HttpResponse, s3s::HttpError> {
    use hyper::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
    let headers = request.headers();
    let has_body = headers.contains_key(TRANSFER_ENCODING)
        || headers.get(CONTENT_LENGTH).is_some_and(|len| len.as_bytes() != b"0");
    let mut response = hyper::service::Service::call(&service, request).await?;
    if has_body && (response.status().is_client_error() || response.status().is_server_error()) {
        response.headers_mut().insert(CONNECTION, hyper::header::HeaderValue::from_static("close"));
    }
    Ok(response)
}

pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    tls: Option<crate::SharedAcceptor>,
    service: S3Service,
    sigv2: crate::SigV2,
    metrics: crate::GatewayMetrics,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let mut http = ConnBuilder::new(TokioExecutor::new());
    http.http1().timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    // Dropped at shutdown: connections still in their TLS handshake stop there (hyper's
    // graceful shutdown only reaches connections it serves).
    let (stop_handshakes, handshakes_stopped) = tokio::sync::watch::channel(());
    let permits = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS_MAX));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = Arc::clone(&permits).acquire_owned() => permit.expect("the semaphore is never closed"),
            () = shutdown.as_mut() => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // One failed accept (the peer left, descriptors ran out for a moment) does
                    // not stop the gateway; the pause keeps a persistent failure from spinning.
                    tracing::warn!("accept a connection: {e}");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            },
            () = shutdown.as_mut() => break,
        };
        // Small responses (errors, XML) go out at once rather than after Nagle's delay.
        let _ = stream.set_nodelay(true); // best effort: the connection works either way
        let service = service.clone();
        let for_requests = metrics.clone();
        let handler =
            hyper::service::service_fn(move |request| handle(service.clone(), sigv2, for_requests.clone(), request));
        // Counted from here: shutdown waits for connections still in their TLS handshake too.
        let watcher = graceful.watcher();
        // The certificate served now (a reload swaps it for the connections after).
        let tls = tls.as_ref().map(|shared| shared.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone());
        let (http, mut stopped) = (http.clone(), handshakes_stopped.clone());
        let metrics = metrics.clone();
        metrics.connection_opened();
        tokio::spawn(async move {
            let served = match tls {
                None => watcher.watch(http.serve_connection(TokioIo::new(stream), handler).into_owned()).await,
                // The handshake runs here, not in the accept loop, under its own bound: a client
                // that stalls in it holds only its own connection.
                Some(acceptor) => {
                    let handshake = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream));
                    tokio::select! {
                        done = handshake => match done {
                            // HTTP/1.1 only, as ALPN says (`tls::load`), even to a client that
                            // starts HTTP/2 without negotiating it.
                            Ok(Ok(stream)) => {
                                let http = http.http1_only();
                                watcher.watch(http.serve_connection(TokioIo::new(stream), handler).into_owned()).await
                            }
                            Ok(Err(e)) => Err(format!("TLS handshake: {e}").into()),
                            Err(_) => Err(format!("TLS handshake not done within {TLS_HANDSHAKE_TIMEOUT:?}").into()),
                        },
                        _ = stopped.changed() => Err("shutdown during the TLS handshake".into()),
                    }
                }
            };
            if let Err(e) = served {
                tracing::debug!("connection from {peer}: {e}");
            }
            metrics.connection_closed();
            drop(permit);
        });
    }
    drop(stop_handshakes);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(SHUTDOWN_TIMEOUT) => {
            tracing::warn!("requests still running {SHUTDOWN_TIMEOUT:?} after shutdown; closing them");
        }
    }
}

/// Every operation the gateway implements; the trait's defaults answer 501 for the rest.
#[async_trait::async_trait]
impl S3 for Tessera {
    async fn list_buckets(&self, req: S3Request<ListBucketsInput>) -> S3Result<S3Response<ListBucketsOutput>> {
        crate::bucket::list_buckets(&self.client, req, &self.region).await
    }

    async fn create_bucket(&self, req: S3Request<CreateBucketInput>) -> S3Result<S3Response<CreateBucketOutput>> {
        crate::bucket::create_bucket(&self.client, req, &self.region).await
    }

    async fn delete_bucket(&self, req: S3Request<DeleteBucketInput>) -> S3Result<S3Response<DeleteBucketOutput>> {
        crate::bucket::delete_bucket(&self.client, req).await
    }

    async fn head_bucket(&self, req: S3Request<HeadBucketInput>) -> S3Result<S3Response<HeadBucketOutput>> {
        crate::bucket::head_bucket(&self.client, req).await
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        crate::bucket::get_bucket_location(&self.client, req, &self.region).await
    }

    async fn get_bucket_versioning(
        &self,
        req: S3Request<GetBucketVersioningInput>,
    ) -> S3Result<S3Response<GetBucketVersioningOutput>> {
        crate::bucket::get_bucket_versioning(&self.client, req).await
    }

    async fn put_object(&self, req: S3Request<PutObjectInput>) -> S3Result<S3Response<PutObjectOutput>> {
        let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
        let response = crate::object::put_object(&self.client, req).await?;
        self.uploaded(&bucket, &key, false);
        Ok(response)
    }

    async fn get_object(&self, req: S3Request<GetObjectInput>) -> S3Result<S3Response<GetObjectOutput>> {
        crate::object::get_object(&self.client, req).await
    }

    async fn head_object(&self, req: S3Request<HeadObjectInput>) -> S3Result<S3Response<HeadObjectOutput>> {
        crate::object::head_object(&self.client, req).await
    }

    async fn select_object_content(
        &self,
        req: S3Request<SelectObjectContentInput>,
    ) -> S3Result<S3Response<SelectObjectContentOutput>> {
        crate::select::select_object_content(&self.client, req).await
    }

    async fn delete_object(&self, req: S3Request<DeleteObjectInput>) -> S3Result<S3Response<DeleteObjectOutput>> {
        crate::object::delete_object(&self.client, req).await
    }

    async fn delete_objects(&self, req: S3Request<DeleteObjectsInput>) -> S3Result<S3Response<DeleteObjectsOutput>> {
        crate::object::delete_objects(&self.client, req).await
    }

    async fn copy_object(&self, req: S3Request<CopyObjectInput>) -> S3Result<S3Response<CopyObjectOutput>> {
        crate::object::copy_object(&self.client, req).await
    }

    async fn list_objects(&self, req: S3Request<ListObjectsInput>) -> S3Result<S3Response<ListObjectsOutput>> {
        crate::list::list_objects(&self.client, req).await
    }

    async fn list_objects_v2(&self, req: S3Request<ListObjectsV2Input>) -> S3Result<S3Response<ListObjectsV2Output>> {
        crate::list::list_objects_v2(&self.client, req).await
    }

    async fn list_object_versions(
        &self,
        req: S3Request<ListObjectVersionsInput>,
    ) -> S3Result<S3Response<ListObjectVersionsOutput>> {
        crate::list::list_object_versions(&self.client, req).await
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        crate::multipart::create_multipart_upload(&self.client, req).await
    }

    async fn upload_part(&self, req: S3Request<UploadPartInput>) -> S3Result<S3Response<UploadPartOutput>> {
        crate::multipart::upload_part(&self.client, req).await
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        crate::multipart::upload_part_copy(&self.client, req).await
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
        let response = crate::multipart::complete_multipart_upload(&self.client, req).await?;
        self.uploaded(&bucket, &key, true);
        Ok(response)
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        crate::multipart::abort_multipart_upload(&self.client, req).await
    }

    async fn list_parts(&self, req: S3Request<ListPartsInput>) -> S3Result<S3Response<ListPartsOutput>> {
        crate::multipart::list_parts(&self.client, req).await
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        crate::multipart::list_multipart_uploads(&self.client, req).await
    }
}
