//! Behaviour of the gateway's pure parts: ranges, windows, preconditions, listing pages and
//! tokens, encodings, host parsing, and the verifying upload body.

use bytes::Bytes;
use s3s::dto::{ETag, ETagCondition, StreamingBlob, Timestamp};
use tokio::io::AsyncReadExt;

use crate::body::{BodyError, Expected, UploadBody, decode_content_md5, window_end};
use crate::checksum::{Algorithm, Kind, ObjectChecksum, UploadChecksum};
use crate::conditional::{Conditions, Precondition, content_range, copy_source_range, evaluate, resolve_range};
use crate::host::bucket_of_host;
use crate::list::{
    Grouper, Keyed, Listing, Pushed, common_prefix, decode_token, encode_token, start_after, url_encode,
};
use crate::multipart::page_uploads;

const MIB: u64 = 1 << 20;

// ---- GET windows ----

fn check_windows(range: std::ops::Range<u64>, stripe_bytes: u64, window_bytes: u64, expected: &[u64]) {
    let mut ends = Vec::new();
    let mut offset = range.start;
    while offset < range.end {
        offset = window_end(offset, range.end, stripe_bytes, window_bytes);
        ends.push(offset);
    }
    assert_eq!(ends, expected, "windows of {range:?}, stripe {stripe_bytes}, window {window_bytes}");
}

#[test]
fn get_windows_are_whole_stripes_and_cover_the_range_once() {
    // 4 MiB stripes, 8 MiB windows: two stripes per window.
    check_windows(0..20 * MIB, 4 * MIB, 8 * MIB, &[8 * MIB, 16 * MIB, 20 * MIB]);
    // A ranged read starts mid-stripe; the first window ends on a window boundary.
    check_windows(MIB..10 * MIB, 4 * MIB, 8 * MIB, &[8 * MIB, 10 * MIB]);
    // 3 MiB stripes: windows of two stripes (6 MiB), never more than the window size.
    check_windows(0..13 * MIB, 3 * MIB, 8 * MIB, &[6 * MIB, 12 * MIB, 13 * MIB]);
    // A stripe larger than a window: plain windows.
    check_windows(0..20 * MIB, 16 * MIB, 8 * MIB, &[8 * MIB, 16 * MIB, 20 * MIB]);
    // One byte.
    check_windows(5..6, 4 * MIB, 8 * MIB, &[6]);
}

// ---- ranges ----

#[test]
fn range_header_resolves_against_object_size() {
    let parse = |text: &str| s3s::dto::Range::parse(text).expect("valid range header");
    assert_eq!(resolve_range(None, 10).ok(), Some(None));
    assert_eq!(resolve_range(Some(&parse("bytes=0-4")), 10).ok(), Some(Some(0..5)));
    assert_eq!(resolve_range(Some(&parse("bytes=5-")), 10).ok(), Some(Some(5..10)));
    assert_eq!(resolve_range(Some(&parse("bytes=-3")), 10).ok(), Some(Some(7..10)));
    assert_eq!(resolve_range(Some(&parse("bytes=8-100")), 10).ok(), Some(Some(8..10)));
    let past_end = resolve_range(Some(&parse("bytes=10-")), 10).expect_err("starts past the end");
    assert_eq!(past_end.code(), &s3s::S3ErrorCode::InvalidRange);
    assert!(resolve_range(Some(&parse("bytes=0-0")), 0).is_err(), "no range of an empty object is satisfiable");
}

#[test]
fn content_range_names_inclusive_last_byte() {
    assert_eq!(content_range(&(0..5), 10), "bytes 0-4/10");
    assert_eq!(content_range(&(9..10), 10), "bytes 9-9/10");
}

#[test]
fn copy_source_range_needs_both_ends_inside_the_source() {
    assert_eq!(copy_source_range("bytes=0-9", 10).ok(), Some(0..10));
    assert_eq!(copy_source_range("bytes=5-5", 10).ok(), Some(5..6));
    let code = |header: &str| copy_source_range(header, 10).unwrap_err().code().clone();
    assert_eq!(code("bytes=0-10"), s3s::S3ErrorCode::InvalidRange, "outside the source");
    assert_eq!(code("bytes=20-30"), s3s::S3ErrorCode::InvalidRange);
    for malformed in ["bytes=5-", "bytes=-5", "5-6", "bytes=6-5"] {
        assert_eq!(code(malformed), s3s::S3ErrorCode::InvalidArgument, "{malformed}");
    }
}

// ---- preconditions ----

fn at(secs: u64) -> Timestamp {
    Timestamp::from(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
}

fn tag(value: &str) -> ETagCondition {
    ETagCondition::ETag(ETag::Strong(value.to_owned()))
}

fn check_precondition(conditions: Conditions<'_>, expected: Precondition) {
    // Object: etag "abc", modified at 1000.5 s.
    assert_eq!(evaluate(&conditions, "abc", 1_000_500), expected, "{conditions:?}");
}

#[test]
fn preconditions_follow_rfc_9110_order() {
    let (same, other, any) = (tag("abc"), tag("xyz"), ETagCondition::Any);
    let (before, at_modification, after) = (at(999), at(1000), at(1001));
    check_precondition(Conditions::default(), Precondition::Proceed);
    check_precondition(Conditions { if_match: Some(&same), ..Default::default() }, Precondition::Proceed);
    check_precondition(Conditions { if_match: Some(&any), ..Default::default() }, Precondition::Proceed);
    check_precondition(Conditions { if_match: Some(&other), ..Default::default() }, Precondition::Failed);
    check_precondition(Conditions { if_none_match: Some(&same), ..Default::default() }, Precondition::NotModified);
    check_precondition(Conditions { if_none_match: Some(&other), ..Default::default() }, Precondition::Proceed);
    // Dates compare at whole seconds: modified at 1000.5 s is not modified since 1000 s.
    check_precondition(
        Conditions { if_modified_since: Some(&at_modification), ..Default::default() },
        Precondition::NotModified,
    );
    check_precondition(Conditions { if_modified_since: Some(&before), ..Default::default() }, Precondition::Proceed);
    check_precondition(Conditions { if_unmodified_since: Some(&before), ..Default::default() }, Precondition::Failed);
    check_precondition(Conditions { if_unmodified_since: Some(&after), ..Default::default() }, Precondition::Proceed);
    // If-Match beats If-Unmodified-Since; If-None-Match beats If-Modified-Since.
    check_precondition(
        Conditions { if_match: Some(&same), if_unmodified_since: Some(&before), ..Default::default() },
        Precondition::Proceed,
    );
    check_precondition(
        Conditions { if_none_match: Some(&other), if_modified_since: Some(&after), ..Default::default() },
        Precondition::Proceed,
    );
    // A failed If-Match wins over a matching If-None-Match.
    check_precondition(
        Conditions { if_match: Some(&other), if_none_match: Some(&same), ..Default::default() },
        Precondition::Failed,
    );
}

// ---- listing ----

#[derive(Debug)]
struct Key(&'static str);

impl Keyed for Key {
    fn key(&self) -> &str {
        self.0
    }
}

/// Pushes `keys` (sorted) into a page; returns its keys, prefixes, truncation and marker.
fn group(
    keys: &[&'static str],
    prefix: &str,
    delimiter: Option<&str>,
    max_keys: usize,
) -> (Vec<&'static str>, Vec<String>, bool, Option<String>) {
    let mut grouper = Grouper::new(prefix, delimiter, max_keys);
    for key in keys {
        if grouper.push(Key(key)) == Pushed::Full {
            break;
        }
    }
    let Listing { objects, prefixes, truncated, next_marker } = grouper.finish();
    (objects.iter().map(|k| k.0).collect(), prefixes, truncated, next_marker)
}

#[test]
fn delimiter_groups_keys_into_common_prefixes_counted_once() {
    let keys = ["a/1", "a/2", "b", "c/x/1", "c/y", "d"];
    let (objects, prefixes, truncated, _) = group(&keys, "", Some("/"), 1000);
    assert_eq!(objects, ["b", "d"]);
    assert_eq!(prefixes, ["a/", "c/"]);
    assert!(!truncated);
    // Under a prefix the next delimiter counts.
    let (objects, prefixes, _, _) = group(&keys[3..5], "c/", Some("/"), 1000);
    assert_eq!(objects, ["c/y"]);
    assert_eq!(prefixes, ["c/x/"]);
    // No delimiter: flat.
    let (objects, prefixes, _, _) = group(&keys, "", None, 1000);
    assert_eq!(objects.len(), 6);
    assert!(prefixes.is_empty());
}

#[test]
fn page_is_truncated_only_when_another_item_exists() {
    let keys = ["a/1", "a/2", "b", "c/1"];
    // Three items exist (a/, b, c/): max 2 truncates after b.
    let (objects, prefixes, truncated, marker) = group(&keys, "", Some("/"), 2);
    assert_eq!((objects, prefixes, truncated), (vec!["b"], vec!["a/".to_owned()], true));
    assert_eq!(marker.as_deref(), Some("b"));
    // Exactly max items: not truncated, even with more keys in the last prefix.
    let (_, prefixes, truncated, _) = group(&["a/1", "b/1", "b/2"], "", Some("/"), 2);
    assert_eq!(prefixes, ["a/", "b/"]);
    assert!(!truncated);
    // A common prefix as the last item is the marker.
    let (_, _, truncated, marker) = group(&keys, "", Some("/"), 1);
    assert!(truncated);
    assert_eq!(marker.as_deref(), Some("a/"));
}

#[test]
fn marker_that_is_a_common_prefix_skips_the_whole_prefix() {
    let skip = start_after("a/", "", Some("/"));
    assert!(skip.as_str() > "a/zzzz" && skip.starts_with("a/"));
    assert!(skip.as_str() < "b");
    // A plain key, or a marker inside a prefix, resumes right after it.
    assert_eq!(start_after("a/1", "", Some("/")), "a/1");
    assert_eq!(start_after("a/", "", None), "a/");
    assert_eq!(common_prefix("photos/2024/x.jpg", "photos/", Some("/")), Some("photos/2024/"));
    assert_eq!(common_prefix("photos/x.jpg", "photos/", Some("/")), None);
    assert_eq!(common_prefix("x--y--z", "", Some("--")), Some("x--"));
}

#[test]
fn continuation_token_round_trips_and_garbage_is_refused() {
    for key in ["", "a/", "ключ with spaces+plus/and\u{10FFFF}"] {
        assert_eq!(decode_token(&encode_token(key)).ok().as_deref(), Some(key));
    }
    assert!(decode_token("not base64!").is_err());
    assert!(decode_token(&"A".repeat(10_000)).is_err());
    assert!(decode_token(&encode_token_bytes(&[0xff, 0xfe])).is_err(), "not UTF-8");
}

fn encode_token_bytes(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

#[test]
fn url_encoding_keeps_slashes_and_unreserved_characters_only() {
    assert_eq!(url_encode("a/b-c_d.e*f"), "a/b-c_d.e*f");
    assert_eq!(url_encode("a b+c&d~e%f"), "a+b%2Bc%26d%7Ee%25f");
    assert_eq!(url_encode("é"), "%C3%A9");
    assert_eq!(url_encode("\u{1}"), "%01");
}

#[test]
fn multipart_upload_pages_follow_key_and_upload_id_markers() {
    let upload = |key: &str, id: &str| client::UploadInfo { key: key.into(), upload_id: id.into(), initiated_ms: 0 };
    let all = || vec![upload("a", "1"), upload("a", "2"), upload("b", "3"), upload("d/1", "4"), upload("d/2", "5")];
    let ids =
        |page: &crate::multipart::UploadPage| page.uploads.iter().map(|u| u.upload_id.clone()).collect::<Vec<_>>();
    let page = page_uploads(all(), "", None, "", None, 2);
    assert_eq!(ids(&page), ["1", "2"]);
    assert_eq!(page.next, Some(("a".into(), "2".into())));
    let page = page_uploads(all(), "", None, "a", Some("1"), 2);
    assert_eq!(ids(&page), ["2", "3"]);
    let page = page_uploads(all(), "", None, "a", None, 10);
    assert_eq!(ids(&page), ["3", "4", "5"]);
    assert!(!page.truncated && page.next.is_none());
    let page = page_uploads(all(), "", Some("/"), "", None, 10);
    assert_eq!(page.prefixes, ["d/"]);
    let page = page_uploads(all(), "", Some("/"), "d/", None, 10);
    assert!(page.uploads.is_empty() && page.prefixes.is_empty());
}

// ---- hosts, credentials, digests ----

#[test]
fn only_subdomains_of_the_gateway_domains_are_virtual_hosted_buckets() {
    let local = ["localhost".to_owned()];
    assert_eq!(bucket_of_host("photos.localhost:9000", &local, 9000), Some("photos"));
    assert_eq!(bucket_of_host("photos.localhost", &local, 9000), Some("photos"));
    assert_eq!(bucket_of_host("photos.LocalHost", &local, 9000), Some("photos"));
    assert_eq!(bucket_of_host("photos.localhost:9001", &local, 9000), None, "another port");
    assert_eq!(bucket_of_host("localhost:9000", &local, 9000), None);
    assert_eq!(bucket_of_host("127.0.0.1:9000", &local, 9000), None);
    assert_eq!(bucket_of_host("storage.example.com:9000", &local, 9000), None);
    assert_eq!(bucket_of_host(".localhost:9000", &local, 9000), None);
    let both = ["localhost".to_owned(), "s3.example.com".to_owned()];
    assert_eq!(bucket_of_host("photos.s3.example.com", &both, 443), Some("photos"));
    assert_eq!(bucket_of_host("my.dotted.bucket.s3.example.com:443", &both, 443), Some("my.dotted.bucket"));
    assert_eq!(bucket_of_host("s3.example.com", &both, 443), None, "the domain itself is path-style");
    assert_eq!(bucket_of_host("photos.xs3.example.com", &both, 443), None, "a label must end at the dot");
    assert_eq!(bucket_of_host("photos.example.com", &both, 443), None);
}

#[test]
fn gateway_domains_must_be_dns_names() {
    use crate::host::check_domain;
    for good in ["example.com", "s3.example.com", "localhost", "a-b.c0"] {
        assert!(check_domain(good).is_ok(), "{good}");
    }
    for bad in ["", "example.com:9000", "http://example.com", "-a.com", "a..com", "exa mple.com", "*.example.com"] {
        assert!(check_domain(bad).is_err(), "{bad}");
    }
}

#[test]
fn gateway_refuses_missing_or_malformed_credentials() {
    use crate::{Error, validate_credentials};
    assert!(matches!(validate_credentials("", "secret-key"), Err(Error::MissingCredentials)));
    assert!(matches!(validate_credentials("AKIA", ""), Err(Error::MissingCredentials)));
    assert!(matches!(validate_credentials("a b", "secretkey"), Err(Error::InvalidAccessKey)));
    assert!(matches!(validate_credentials("AKIA", "short"), Err(Error::InvalidSecretKey)));
    assert!(validate_credentials("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY").is_ok());
}

#[test]
fn content_md5_header_must_be_base64_of_16_bytes() {
    assert_eq!(decode_content_md5(b"XrY7u+Ae7tCTyyK7j1rNww=="), Some(md5_of(b"hello world")));
    assert_eq!(decode_content_md5(b" XrY7u+Ae7tCTyyK7j1rNww== "), Some(md5_of(b"hello world")));
    assert_eq!(decode_content_md5(b"aGVsbG8="), None, "5 bytes");
    assert_eq!(decode_content_md5(b"%%%"), None);
}

fn md5_of(data: &[u8]) -> [u8; 16] {
    use s3s::crypto::Checksum as _;
    s3s::crypto::Md5::checksum(data).as_ref().try_into().expect("16 bytes")
}

fn blob(chunks: &[&'static [u8]]) -> StreamingBlob {
    let items: Vec<Result<Bytes, std::io::Error>> = chunks.iter().map(|c| Ok(Bytes::from_static(c))).collect();
    StreamingBlob::wrap(futures_util::stream::iter(items))
}

/// Reads a whole upload body; returns the bytes or the body error that aborted it.
async fn read_upload(chunks: &[&'static [u8]], expected: Expected) -> Result<Vec<u8>, String> {
    let mut body = UploadBody::new(Some(blob(chunks)), expected, &[], None);
    let mut out = Vec::new();
    match body.read_to_end(&mut out).await {
        Ok(_) => Ok(out),
        Err(e) => {
            let inner = e.get_ref().and_then(|inner| inner.downcast_ref::<BodyError>());
            Err(inner.map_or_else(|| e.to_string(), ToString::to_string))
        }
    }
}

fn expect_bytes_max(bytes_max: u64) -> Expected {
    Expected { bytes_max, ..Default::default() }
}

#[tokio::test]
async fn upload_body_passes_bytes_through_and_checks_content_md5_at_the_end() {
    let chunks: &[&'static [u8]] = &[b"hello ", b"world"];
    let good = Expected { content_md5: Some(md5_of(b"hello world")), ..expect_bytes_max(1 << 20) };
    assert_eq!(read_upload(chunks, good).await.as_deref(), Ok(&b"hello world"[..]));
    let bad = Expected { content_md5: Some(md5_of(b"hello there")), ..expect_bytes_max(1 << 20) };
    assert_eq!(read_upload(chunks, bad).await, Err(BodyError::ContentMd5Mismatch.to_string()));
}

#[tokio::test]
async fn upload_body_checks_flexible_checksum_headers() {
    use s3s::crypto::Checksum as _;
    let crc = |data: &[u8]| {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(s3s::crypto::Crc32::checksum(data))
    };
    let expect = |value: String| Expected {
        checksums: s3s::dto::Checksum { checksum_crc32: Some(value), ..Default::default() },
        ..expect_bytes_max(1 << 20)
    };
    let mut body = UploadBody::new(Some(blob(&[b"abc"])), expect(crc(b"abc")), &[], None);
    let mut out = Vec::new();
    body.read_to_end(&mut out).await.expect("matching CRC32");
    assert_eq!(body.verified_checksums().and_then(|c| c.checksum_crc32.clone()), Some(crc(b"abc")));
    assert_eq!(
        read_upload(&[b"abc"], expect(crc(b"abd"))).await,
        Err(BodyError::ChecksumMismatch { algorithm: "CRC32" }.to_string())
    );
}

#[tokio::test]
async fn upload_body_longer_than_its_limit_fails() {
    assert_eq!(
        read_upload(&[b"0123", b"4567"], expect_bytes_max(6)).await,
        Err(BodyError::TooLarge { max: 6 }.to_string())
    );
    assert_eq!(read_upload(&[b"0123", b"45"], expect_bytes_max(6)).await.map(|b| b.len()), Ok(6));
}

#[tokio::test]
async fn empty_upload_body_reads_as_zero_bytes() {
    let mut body = UploadBody::new(None, Expected { content_md5: Some(md5_of(b"")), ..expect_bytes_max(0) }, &[], None);
    let mut out = Vec::new();
    body.read_to_end(&mut out).await.expect("an empty body with the MD5 of nothing");
    assert!(out.is_empty());
}

#[test]
fn aws_chunked_framing_is_not_stored_as_content_encoding() {
    let stored = |encoding: &str| {
        let headers =
            crate::object::ObjectHeaders { content_encoding: Some(encoding.to_owned()), ..Default::default() };
        let options = headers.into_put_options().unwrap();
        options.headers.into_iter().find(|(name, _)| name == "content-encoding").map(|(_, value)| value)
    };
    assert_eq!(stored("aws-chunked"), None);
    assert_eq!(stored("gzip,aws-chunked"), Some("gzip".to_owned()));
    assert_eq!(stored("gzip, br"), Some("gzip,br".to_owned()));
}

// ---- requests the gateway looks at before s3s ----

fn put_request(uri: &str, host: &str, headers: &[(&str, &str)]) -> hyper::Request<()> {
    let mut builder = hyper::Request::builder().method("PUT").uri(uri).header("host", host);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(()).unwrap()
}

#[test]
fn only_unsized_unsigned_object_puts_get_a_placeholder_length() {
    let chunked = [("transfer-encoding", "chunked"), ("x-amz-content-sha256", "UNSIGNED-PAYLOAD")];
    let marked = |mut request: hyper::Request<()>| {
        crate::server::mark_unsized_body(&mut request);
        let mark = request.extensions().get::<crate::server::UnsizedBody>().is_some();
        assert_eq!(mark, request.headers().contains_key("content-length"), "a mark and a placeholder go together");
        mark
    };
    assert!(marked(put_request("/b/k", "127.0.0.1:9000", &chunked)));
    assert!(marked(put_request("/b/dir/k?partNumber=2&uploadId=ab", "127.0.0.1:9000", &chunked)));
    assert!(marked(put_request("/k", "b.localhost:9000", &chunked)), "virtual-hosted: the path is the key");
    assert!(marked(put_request("/b/k?X-Amz-Expires=60&X-Amz-Signature=00", "[::1]:9000", &chunked[..1])));
    assert!(!marked(put_request("/b", "127.0.0.1:9000", &chunked)), "CreateBucket reads an XML body whole");
    assert!(!marked(put_request("/", "b.localhost", &chunked)));
    assert!(!marked(put_request("/b/k?tagging", "127.0.0.1:9000", &chunked)), "object subresources are XML");
    let signed = [("transfer-encoding", "chunked"), ("x-amz-content-sha256", "ab12")];
    assert!(!marked(put_request("/b/k", "127.0.0.1:9000", &signed)), "a signed hash needs the real length");
    let sized = [("content-length", "5"), ("x-amz-content-sha256", "UNSIGNED-PAYLOAD")];
    let mut request = put_request("/b/k", "127.0.0.1:9000", &sized);
    crate::server::mark_unsized_body(&mut request);
    assert!(request.extensions().get::<crate::server::UnsizedBody>().is_none());
    assert_eq!(request.headers()["content-length"], "5");
    let mut get = put_request("/b/k", "127.0.0.1:9000", &chunked);
    *get.method_mut() = hyper::Method::GET;
    assert!(!marked(get));
}

#[test]
fn presigned_validity_is_zero_to_a_week() {
    let check = |query: &str| {
        let request = hyper::Request::builder().uri(format!("/b/k?{query}")).body(()).unwrap();
        crate::server::check_presigned_expiry(&request)
            .map_err(|(status, code, message)| (status.as_u16(), code, message))
    };
    assert!(check("X-Amz-Expires=0").is_ok());
    assert!(check("X-Amz-Expires=604800&X-Amz-Signature=00").is_ok());
    assert!(check("partNumber=1").is_ok(), "not presigned");
    for (query, message) in [
        ("X-Amz-Expires=604801", "less than a week"),
        ("X-Amz-Expires=-1", "non-negative"),
        ("X-Amz-Expires=%2D5", "non-negative"),
        ("X-Amz-Expires=soon", "a number"),
    ] {
        let (status, code, text) = check(query).unwrap_err();
        assert_eq!((status, code), (400, "AuthorizationQueryParametersError"), "{query}");
        assert!(text.contains(message), "{query}: {text}");
    }
}

#[test]
fn a_malformed_checksum_value_is_refused_before_the_body() {
    let headers = hyper::HeaderMap::new();
    let with = |set: fn(&mut s3s::dto::Checksum, String), value: &str| {
        let mut checksums = s3s::dto::Checksum::default();
        set(&mut checksums, value.to_owned());
        Expected::from_request(&headers, None, checksums, 1 << 20).map(|_| ()).map_err(|e| e.code().clone())
    };
    let crc32: fn(&mut s3s::dto::Checksum, String) = |c, v| c.checksum_crc32 = Some(v);
    let crc64: fn(&mut s3s::dto::Checksum, String) = |c, v| c.checksum_crc64nvme = Some(v);
    let sha256: fn(&mut s3s::dto::Checksum, String) = |c, v| c.checksum_sha256 = Some(v);
    assert!(with(crc32, "AAAAAA==").is_ok(), "well formed (wrong or not: that is checked at the end)");
    assert!(with(crc64, "AAAAAAAAAAA=").is_ok());
    assert!(with(sha256, &format!("{}=", "A".repeat(43))).is_ok());
    for (set, value) in
        [(crc32, "not base64!"), (crc32, ""), (crc32, "AAAAAAAAAAA="), (crc64, "AAAAAA=="), (sha256, "AAAAAA==")]
    {
        assert_eq!(with(set, value), Err(s3s::S3ErrorCode::InvalidRequest), "{value:?}");
    }
    let two = s3s::dto::Checksum {
        checksum_crc32: Some("AAAAAA==".into()),
        checksum_crc32c: Some("AAAAAA==".into()),
        ..Default::default()
    };
    let refused = Expected::from_request(&headers, None, two, 1 << 20).map(|_| ()).map_err(|e| e.code().clone());
    assert_eq!(refused, Err(s3s::S3ErrorCode::InvalidRequest), "two algorithms at once");
}

// ---- flexible checksums kept with objects and parts ----

fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    (0..len)
        .map(|_| {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) as u8
        })
        .collect()
}

/// Every checksum of `data`, as a part stores them.
fn part_headers(data: &[u8]) -> Vec<(String, String)> {
    let mut hasher = s3s::checksum::ChecksumHasher::default();
    for algorithm in Algorithm::ALL {
        algorithm.enable(&mut hasher);
    }
    hasher.update(data);
    crate::checksum::headers_of(&hasher.finalize())
}

fn upload(algorithm: Option<&str>, kind: Option<&str>) -> s3s::S3Result<UploadChecksum> {
    let algorithm = algorithm.map(|a| s3s::dto::ChecksumAlgorithm::from(a.to_owned()));
    let kind = kind.map(|k| s3s::dto::ChecksumType::from(k.to_owned()));
    UploadChecksum::requested(algorithm.as_ref(), kind.as_ref())
}

#[test]
fn a_full_object_crc_combined_from_parts_is_the_crc_of_the_whole_object() {
    let data = pseudo_random(300_001, 7);
    let whole = part_headers(&data);
    // Splits with empty, one-byte and uneven parts.
    let splits: [&[usize]; 4] =
        [&[0, 300_001], &[0, 1, 300_001], &[0, 100_000, 100_000, 299_999, 300_001], &[0, 65_536, 131_072, 300_001]];
    for (algorithm, kind) in [("CRC32", "FULL_OBJECT"), ("CRC32C", "FULL_OBJECT"), ("CRC64NVME", "FULL_OBJECT")] {
        let checksum = upload(Some(algorithm), Some(kind)).expect("a CRC may be full-object");
        for split in splits {
            let parts: Vec<(u64, Vec<(String, String)>)> =
                split.windows(2).map(|w| ((w[1] - w[0]) as u64, part_headers(&data[w[0]..w[1]]))).collect();
            let combined = checksum.combine(parts.iter().map(|(size, headers)| (*size, headers.as_slice())));
            let combined = combined.expect("every part has the checksum");
            let expected = whole.iter().find(|(name, _)| name == checksum.algorithm.header()).expect("computed");
            assert_eq!(
                (combined.value.as_str(), combined.kind),
                (expected.1.as_str(), Kind::FullObject),
                "{algorithm} {split:?}"
            );
            let stored = ObjectChecksum::stored(&combined.headers()).expect("stored as headers");
            assert_eq!(stored, combined);
        }
    }
}

#[test]
fn a_composite_checksum_is_the_checksum_of_the_parts_checksums_with_the_part_count() {
    let parts = [pseudo_random(1000, 1), pseudo_random(10, 2), pseudo_random(0, 3)];
    for algorithm in ["CRC32", "CRC32C", "SHA1", "SHA256"] {
        let checksum = upload(Some(algorithm), None).expect("composite is these algorithms' default");
        assert_eq!(checksum.kind, Kind::Composite);
        let headers: Vec<_> = parts.iter().map(|p| part_headers(p)).collect();
        let combined = checksum
            .combine(parts.iter().zip(&headers).map(|(p, h)| (p.len() as u64, h.as_slice())))
            .expect("every part has the checksum");
        let mut concatenated = Vec::new();
        for h in &headers {
            let value = &h.iter().find(|(name, _)| name == checksum.algorithm.header()).expect("stored").1;
            concatenated.extend(crate::checksum::decode_digest(value).expect("base64"));
        }
        let of_digests = part_headers(&concatenated);
        let expected = &of_digests.iter().find(|(name, _)| name == checksum.algorithm.header()).expect("computed").1;
        assert_eq!(combined.value, format!("{expected}-3"), "{algorithm}");
        assert_eq!(ObjectChecksum::stored(&combined.headers()).map(|c| c.kind), Some(Kind::Composite));
    }
}

#[test]
fn an_object_has_no_checksum_when_a_part_lacks_its_algorithm() {
    let checksum = upload(Some("SHA256"), None).expect("valid");
    let with = part_headers(b"abc");
    let without: Vec<(String, String)> = with.iter().filter(|(n, _)| !n.ends_with("sha256")).cloned().collect();
    assert_eq!(checksum.combine([(3, with.as_slice()), (3, without.as_slice())].into_iter()), None);
}

#[test]
fn create_multipart_checksum_requests_are_checked_as_s3_checks_them() {
    let ok = |a, k| upload(a, k).map(|c| (c.algorithm, c.kind, c.declared)).map_err(|e| e.code().clone());
    use s3s::S3ErrorCode::InvalidRequest;
    assert_eq!(ok(None, None), Ok((Algorithm::Crc64Nvme, Kind::FullObject, false)));
    assert_eq!(ok(Some("CRC32"), None), Ok((Algorithm::Crc32, Kind::Composite, true)));
    assert_eq!(ok(Some("crc32c"), Some("FULL_OBJECT")), Ok((Algorithm::Crc32c, Kind::FullObject, true)));
    assert_eq!(ok(Some("CRC64NVME"), None), Ok((Algorithm::Crc64Nvme, Kind::FullObject, true)));
    assert_eq!(ok(Some("SHA256"), Some("COMPOSITE")), Ok((Algorithm::Sha256, Kind::Composite, true)));
    assert_eq!(ok(Some("SHA1"), Some("FULL_OBJECT")), Err(InvalidRequest), "SHA is composite only");
    assert_eq!(ok(Some("CRC64NVME"), Some("COMPOSITE")), Err(InvalidRequest), "CRC64NVME is full-object only");
    assert_eq!(ok(None, Some("COMPOSITE")), Err(InvalidRequest), "a type needs an algorithm");
    assert_eq!(ok(Some("MD5"), None), Err(InvalidRequest));
    assert_eq!(ok(Some("CRC32"), Some("PARTIAL")), Err(InvalidRequest));
}

#[test]
fn an_upload_keeps_its_checksum_request_on_its_marker_only() {
    let declared = upload(Some("CRC32C"), Some("FULL_OBJECT")).expect("valid");
    let mut marker = vec![("cache-control".to_owned(), "no-cache".to_owned())];
    marker.extend(declared.marker_headers());
    assert_eq!(UploadChecksum::of_upload(&marker), declared);
    assert_eq!(UploadChecksum::object_headers(&marker), vec![("cache-control".to_owned(), "no-cache".to_owned())]);
    let default = upload(None, None).expect("valid");
    assert!(default.marker_headers().is_empty());
    assert_eq!(UploadChecksum::of_upload(&[]), default);
    assert_eq!(default.reported(), (None, None), "S3 lists no algorithm for an upload created without one");
}

#[test]
fn a_part_computes_its_uploads_algorithm_and_refuses_another() {
    let crc32 = upload(Some("CRC32"), None).expect("valid");
    assert_eq!(crc32.part_algorithms(None).expect("computed here"), vec![Algorithm::Crc32]);
    assert_eq!(crc32.part_algorithms(Some(Algorithm::Crc32)).expect("the same"), vec![Algorithm::Crc32]);
    assert_eq!(
        crc32.part_algorithms(Some(Algorithm::Sha256)).map_err(|e| e.code().clone()),
        Err(s3s::S3ErrorCode::InvalidRequest)
    );
    let default = upload(None, None).expect("valid");
    assert_eq!(
        default.part_algorithms(Some(Algorithm::Sha1)).expect("kept too"),
        vec![Algorithm::Crc64Nvme, Algorithm::Sha1]
    );
}

#[test]
fn a_listed_part_checksum_must_match_the_stored_one() {
    let stored = part_headers(b"part one");
    let crc32 = stored.iter().find(|(n, _)| n == "x-amz-checksum-crc32").expect("stored").1.clone();
    let listed = |value: &str| s3s::dto::Checksum { checksum_crc32: Some(value.to_owned()), ..Default::default() };
    assert!(crate::checksum::check_listed_part(1, &listed(&crc32), &stored).is_ok());
    assert!(crate::checksum::check_listed_part(1, &s3s::dto::Checksum::default(), &stored).is_ok());
    let wrong = crate::checksum::check_listed_part(1, &listed("AAAAAA=="), &stored).map_err(|e| e.code().clone());
    assert_eq!(wrong, Err(s3s::S3ErrorCode::InvalidPart));
    let missing = crate::checksum::check_listed_part(1, &listed(&crc32), &[]).map_err(|e| e.code().clone());
    assert_eq!(missing, Err(s3s::S3ErrorCode::InvalidPart));
}

#[tokio::test]
async fn an_upload_body_leaves_its_checksums_for_the_commit_only_when_it_ends_cleanly() {
    let at_end = client::HeadersAtEnd::default();
    let mut body = UploadBody::new(
        Some(blob(&[b"ab", b"c"])),
        expect_bytes_max(1 << 20),
        &[Algorithm::Crc64Nvme],
        Some(at_end.clone()),
    );
    let mut out = Vec::new();
    body.read_to_end(&mut out).await.expect("no expectations");
    let stored = part_headers(b"abc");
    let crc64 = stored.iter().find(|(n, _)| n == "x-amz-checksum-crc64nvme").expect("computed").clone();
    assert_eq!(at_end.get(), vec![crc64]);
    // A body that fails its check leaves nothing.
    let at_end = client::HeadersAtEnd::default();
    let bad = Expected { content_md5: Some(md5_of(b"abd")), ..expect_bytes_max(1 << 20) };
    let mut body = UploadBody::new(Some(blob(&[b"abc"])), bad, &[Algorithm::Crc32], Some(at_end.clone()));
    assert!(body.read_to_end(&mut Vec::new()).await.is_err());
    assert!(at_end.get().is_empty());
}

#[tokio::test]
async fn an_upload_body_that_failed_a_check_fails_every_later_read() {
    let at_end = client::HeadersAtEnd::default();
    let bad = Expected { content_md5: Some(md5_of(b"other")), ..expect_bytes_max(1 << 20) };
    let mut body = UploadBody::new(Some(blob(&[b"abc"])), bad, &[Algorithm::Crc32], Some(at_end.clone()));
    let mut out = Vec::new();
    assert!(body.read_to_end(&mut out).await.is_err(), "the MD5 does not match");
    // A reader that ignores the error and reads on must not see a clean end of the body.
    let again = body.read(&mut [0u8; 16]).await.map_err(|e| e.to_string());
    assert_eq!(again, Err(BodyError::AlreadyFailed.to_string()));
    assert!(at_end.get().is_empty(), "no checksum is left for a commit");
}
