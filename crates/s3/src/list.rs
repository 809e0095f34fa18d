//! ListObjects (v1 and v2) and ListObjectVersions over the client's flat, sorted listing:
//! delimiter grouping into CommonPrefixes, markers and continuation tokens, URL encoding.

use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Request, S3Response, S3Result};

use crate::bucket::owner;
use crate::conditional::timestamp;
use crate::error::{invalid_argument, s3_error};
use crate::object::etag;

/// Keys (and common prefixes) per page at most, and the default, as S3.
pub(crate) const MAX_KEYS_MAX: usize = 1000;
/// Client listing calls per request at most; a page that needs more (keys collapsing into
/// common prefixes) comes back short and truncated, which S3 allows.
pub(crate) const LIST_CALLS_MAX: usize = 64;
/// Longest continuation token accepted (base64 of a resume key).
const TOKEN_BYTES_MAX: usize = 4096;

/// Anything listed by key.
pub(crate) trait Keyed {
    fn key(&self) -> &str;
}

impl Keyed for client::ListEntry {
    fn key(&self) -> &str {
        &self.key
    }
}

/// One page of a listing, grouped.
#[derive(Debug)]
pub(crate) struct Listing<T> {
    pub(crate) objects: Vec<T>,
    pub(crate) prefixes: Vec<String>,
    pub(crate) truncated: bool,
    /// Where the next page starts (exclusive): the last key or common prefix returned.
    pub(crate) next_marker: Option<String>,
}

impl<T> Default for Listing<T> {
    fn default() -> Self {
        Self { objects: Vec::new(), prefixes: Vec::new(), truncated: false, next_marker: None }
    }
}

/// What pushing one key into a [`Grouper`] did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// The page has room for more.
    More,
    /// The page is full and another item exists: it is truncated.
    Full,
}

/// Builds a page from keys in ascending order: keys that contain the delimiter after the
/// prefix collapse into one common prefix, which counts as one item.
#[derive(Debug)]
pub(crate) struct Grouper<'a, T> {
    prefix: &'a str,
    delimiter: Option<&'a str>,
    max_keys: usize,
    listing: Listing<T>,
}

impl<'a, T: Keyed> Grouper<'a, T> {
    pub(crate) fn new(prefix: &'a str, delimiter: Option<&'a str>, max_keys: usize) -> Self {
        let delimiter = delimiter.filter(|d| !d.is_empty());
        Self { prefix, delimiter, max_keys, listing: Listing::default() }
    }

    fn count(&self) -> usize {
        self.listing.objects.len() + self.listing.prefixes.len()
    }

    pub(crate) fn push(&mut self, entry: T) -> Pushed {
        if !entry.key().starts_with(self.prefix) {
            return Pushed::More;
        }
        let common = common_prefix(entry.key(), self.prefix, self.delimiter);
        if let Some(common) = common
            && self.listing.prefixes.last().is_some_and(|last| last == common)
        {
            return Pushed::More;
        }
        if self.count() >= self.max_keys {
            self.listing.truncated = true;
            return Pushed::Full;
        }
        match common {
            Some(common) => {
                self.listing.prefixes.push(common.to_owned());
                self.listing.next_marker = Some(common.to_owned());
            }
            None => {
                self.listing.next_marker = Some(entry.key().to_owned());
                self.listing.objects.push(entry);
            }
        }
        Pushed::More
    }

    /// Where to continue the scan after `last_key`: past the whole common prefix that
    /// `last_key` falls in, if it does, so its other keys are not fetched one page at a time.
    pub(crate) fn resume_after(&self, last_key: String) -> String {
        match self.listing.prefixes.last() {
            Some(common) if last_key.starts_with(common.as_str()) => past_prefix(common),
            _ => last_key,
        }
    }

    pub(crate) fn finish(self) -> Listing<T> {
        let listing = self.listing;
        assert!(listing.objects.len() + listing.prefixes.len() <= self.max_keys, "a page holds at most max-keys items");
        listing
    }
}

/// The common prefix `key` belongs to: the prefix plus everything up to and including the first
/// delimiter after it.
pub(crate) fn common_prefix<'k>(key: &'k str, prefix: &str, delimiter: Option<&str>) -> Option<&'k str> {
    let delimiter = delimiter.filter(|d| !d.is_empty())?;
    let rest = key.strip_prefix(prefix)?;
    let at = rest.find(delimiter)?;
    Some(&key[..prefix.len() + at + delimiter.len()])
}

/// A string after every key that starts with `common` (keys are UTF-8; U+10FFFF sorts last).
fn past_prefix(common: &str) -> String {
    format!("{common}\u{10FFFF}")
}

/// Where a listing that resumes after `marker` starts: a marker that is itself a common prefix
/// (as our NextMarker and tokens are) skips that whole prefix.
pub(crate) fn start_after(marker: &str, prefix: &str, delimiter: Option<&str>) -> String {
    match common_prefix(marker, prefix, delimiter) {
        Some(common) if common == marker => past_prefix(common),
        _ => marker.to_owned(),
    }
}

/// One page of `bucket` after `marker`, grouped.
pub(crate) async fn collect(
    client: &client::Client,
    bucket: &str,
    prefix: &str,
    delimiter: Option<&str>,
    marker: &str,
    max_keys: usize,
) -> S3Result<Listing<client::ListEntry>> {
    let mut grouper = Grouper::new(prefix, delimiter, max_keys);
    if max_keys == 0 {
        crate::bucket::require_bucket(client, bucket).await?;
        return Ok(grouper.finish());
    }
    let mut after = start_after(marker, prefix, delimiter);
    for _ in 0..LIST_CALLS_MAX {
        // One more than fits tells whether the page is truncated.
        let limit = u32::try_from(max_keys + 1).expect("max-keys is at most 1000");
        let page = client.list(bucket, prefix, &after, limit).await.map_err(s3_error)?;
        for entry in page.entries {
            if grouper.push(entry) == Pushed::Full {
                return Ok(grouper.finish());
            }
        }
        match page.next_start_after {
            Some(last) => after = grouper.resume_after(last),
            None => return Ok(grouper.finish()),
        }
    }
    // Out of calls: a short page, truncated, that resumes where the scan stopped.
    let mut listing = grouper.finish();
    listing.truncated = true;
    listing.next_marker = Some(after);
    Ok(listing)
}

/// `max-keys`: 0..=1000 (larger values are clamped, as S3), default 1000.
pub(crate) fn max_keys(requested: Option<i32>) -> S3Result<usize> {
    match requested {
        None => Ok(MAX_KEYS_MAX),
        Some(n) if n < 0 => Err(invalid_argument("max-keys must not be negative")),
        Some(n) => Ok(usize::try_from(n).unwrap_or(MAX_KEYS_MAX).min(MAX_KEYS_MAX)),
    }
}

/// A v2 continuation token: the resume key, base64url.
pub(crate) fn encode_token(resume_after: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(resume_after)
}

pub(crate) fn decode_token(token: &str) -> S3Result<String> {
    use base64::Engine as _;
    let invalid = || invalid_argument("the continuation token provided is incorrect");
    if token.len() > TOKEN_BYTES_MAX {
        return Err(invalid());
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token).map_err(|_| invalid())?;
    String::from_utf8(bytes).map_err(|_| invalid())
}

/// `encoding-type=url`, as S3 encodes names (form encoding, which MinIO matches too): letters,
/// digits, `-`, `_`, `.`, `*` and `/` stay, a space becomes `+`, every other byte `%XX`
/// (uppercase hex, `~` included). Clients decode with form decoding (botocore's
/// `unquote_plus`), so a `+` in a key must be encoded.
pub(crate) fn url_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'*' | b'/') {
            out.push(char::from(byte));
        } else if byte == b' ' {
            out.push('+');
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Applies the request's encoding type to names in the response.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Encoder {
    url: bool,
}

impl Encoder {
    pub(crate) fn new(encoding_type: Option<&EncodingType>) -> S3Result<Self> {
        match encoding_type.map(EncodingType::as_str) {
            None => Ok(Self { url: false }),
            Some(EncodingType::URL) => Ok(Self { url: true }),
            Some(other) => Err(invalid_argument(format!("invalid encoding-type {other:?}; the only one is \"url\""))),
        }
    }

    pub(crate) fn apply(self, text: String) -> String {
        if self.url { url_encode(&text) } else { text }
    }

    pub(crate) fn apply_opt(self, text: Option<String>) -> Option<String> {
        text.map(|t| self.apply(t))
    }

    pub(crate) fn prefixes(self, prefixes: Vec<String>) -> CommonPrefixList {
        prefixes.into_iter().map(|p| CommonPrefix { prefix: Some(self.apply(p)) }).collect()
    }
}

fn object(entry: client::ListEntry, encoder: Encoder, with_owner: bool) -> Object {
    Object {
        key: Some(encoder.apply(entry.key)),
        last_modified: Some(timestamp(entry.modified_ms)),
        e_tag: Some(etag(&entry.etag)),
        size: i64::try_from(entry.size).ok(),
        storage_class: Some(ObjectStorageClass::from_static(ObjectStorageClass::STANDARD)),
        owner: with_owner.then(owner),
        ..Default::default()
    }
}

fn key_count<T>(listing: &Listing<T>) -> i32 {
    i32::try_from(listing.objects.len() + listing.prefixes.len()).expect("a page holds at most 1000 items")
}

pub(crate) async fn list_objects(
    client: &client::Client,
    req: S3Request<ListObjectsInput>,
) -> S3Result<S3Response<ListObjectsOutput>> {
    let input = req.input;
    let encoder = Encoder::new(input.encoding_type.as_ref())?;
    let max_keys = max_keys(input.max_keys)?;
    let prefix = input.prefix.unwrap_or_default();
    let marker = input.marker.unwrap_or_default();
    let delimiter = input.delimiter.filter(|d| !d.is_empty());
    let listing = collect(client, &input.bucket, &prefix, delimiter.as_deref(), &marker, max_keys).await?;
    let output = ListObjectsOutput {
        name: Some(input.bucket),
        prefix: Some(encoder.apply(prefix)),
        marker: Some(encoder.apply(marker)),
        max_keys: i32::try_from(max_keys).ok(),
        is_truncated: Some(listing.truncated),
        next_marker: encoder.apply_opt(listing.next_marker.filter(|_| listing.truncated)),
        delimiter: encoder.apply_opt(delimiter),
        encoding_type: input.encoding_type,
        common_prefixes: Some(encoder.prefixes(listing.prefixes)),
        contents: Some(listing.objects.into_iter().map(|e| object(e, encoder, true)).collect()),
        ..Default::default()
    };
    Ok(S3Response::new(output))
}

pub(crate) async fn list_objects_v2(
    client: &client::Client,
    req: S3Request<ListObjectsV2Input>,
) -> S3Result<S3Response<ListObjectsV2Output>> {
    let input = req.input;
    let encoder = Encoder::new(input.encoding_type.as_ref())?;
    let max_keys = max_keys(input.max_keys)?;
    let prefix = input.prefix.unwrap_or_default();
    let delimiter = input.delimiter.filter(|d| !d.is_empty());
    let marker = match &input.continuation_token {
        Some(token) => decode_token(token)?,
        None => input.start_after.clone().unwrap_or_default(),
    };
    let listing = collect(client, &input.bucket, &prefix, delimiter.as_deref(), &marker, max_keys).await?;
    let with_owner = input.fetch_owner.unwrap_or(false);
    let output = ListObjectsV2Output {
        name: Some(input.bucket),
        prefix: Some(encoder.apply(prefix)),
        max_keys: i32::try_from(max_keys).ok(),
        key_count: Some(key_count(&listing)),
        continuation_token: input.continuation_token,
        next_continuation_token: listing.next_marker.as_deref().filter(|_| listing.truncated).map(encode_token),
        is_truncated: Some(listing.truncated),
        start_after: encoder.apply_opt(input.start_after),
        delimiter: encoder.apply_opt(delimiter),
        encoding_type: input.encoding_type,
        common_prefixes: Some(encoder.prefixes(listing.prefixes)),
        contents: Some(listing.objects.into_iter().map(|e| object(e, encoder, with_owner)).collect()),
        ..Default::default()
    };
    Ok(S3Response::new(output))
}

/// Buckets are unversioned: every object is its only ("null") version.
pub(crate) async fn list_object_versions(
    client: &client::Client,
    req: S3Request<ListObjectVersionsInput>,
) -> S3Result<S3Response<ListObjectVersionsOutput>> {
    let input = req.input;
    let encoder = Encoder::new(input.encoding_type.as_ref())?;
    let max_keys = max_keys(input.max_keys)?;
    let prefix = input.prefix.unwrap_or_default();
    let delimiter = input.delimiter.filter(|d| !d.is_empty());
    let key_marker = input.key_marker.unwrap_or_default();
    if input.version_id_marker.as_deref().is_some_and(|v| !v.is_empty()) && key_marker.is_empty() {
        return Err(S3Error::with_message(
            S3ErrorCode::InvalidArgument,
            "a version-id-marker cannot be specified without a key-marker",
        ));
    }
    let listing = collect(client, &input.bucket, &prefix, delimiter.as_deref(), &key_marker, max_keys).await?;
    let versions = listing
        .objects
        .into_iter()
        .map(|entry| ObjectVersion {
            key: Some(encoder.apply(entry.key)),
            version_id: Some("null".into()),
            is_latest: Some(true),
            last_modified: Some(timestamp(entry.modified_ms)),
            e_tag: Some(etag(&entry.etag)),
            size: i64::try_from(entry.size).ok(),
            storage_class: Some(ObjectVersionStorageClass::from_static(ObjectVersionStorageClass::STANDARD)),
            owner: Some(owner()),
            ..Default::default()
        })
        .collect();
    let next_key_marker = listing.next_marker.filter(|_| listing.truncated);
    let output = ListObjectVersionsOutput {
        name: Some(input.bucket),
        prefix: Some(encoder.apply(prefix)),
        key_marker: Some(encoder.apply(key_marker)),
        version_id_marker: input.version_id_marker,
        max_keys: i32::try_from(max_keys).ok(),
        is_truncated: Some(listing.truncated),
        next_version_id_marker: next_key_marker.as_ref().map(|_| "null".to_owned()),
        next_key_marker: encoder.apply_opt(next_key_marker),
        delimiter: encoder.apply_opt(delimiter),
        encoding_type: input.encoding_type,
        common_prefixes: Some(encoder.prefixes(listing.prefixes)),
        versions: Some(versions),
        delete_markers: Some(Vec::new()),
        request_charged: None,
    };
    Ok(S3Response::new(output))
}
