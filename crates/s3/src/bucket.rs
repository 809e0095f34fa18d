//! ListBuckets, CreateBucket, DeleteBucket, HeadBucket, GetBucketLocation, GetBucketVersioning.

use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Request, S3Response, S3Result};

use crate::error::s3_error;

/// The one owner of everything: Tessera has a single root identity.
pub(crate) fn owner() -> Owner {
    Owner { display_name: Some("tessera".into()), id: Some("tessera".into()) }
}

/// Buckets one ListBuckets page holds at most, and unless `max-buckets` asks for fewer (S3's).
pub(crate) const LIST_BUCKETS_PAGE_MAX: i32 = 10_000;

/// ListBuckets: names in order, those starting with `prefix`, `max-buckets` at a time, each page
/// after the first continuing from a token (the last name of the page before, encoded: opaque
/// to clients, as S3's are). A `bucket-region` other than the gateway's lists nothing.
pub(crate) async fn list_buckets(
    client: &client::Client,
    req: S3Request<ListBucketsInput>,
    region: &str,
) -> S3Result<S3Response<ListBucketsOutput>> {
    let scope = req.extensions.get::<crate::keys::KeyScope>().cloned();
    let input = req.input;
    let max = input.max_buckets.unwrap_or(LIST_BUCKETS_PAGE_MAX);
    if !(1..=LIST_BUCKETS_PAGE_MAX).contains(&max) {
        return Err(S3Error::with_message(
            S3ErrorCode::InvalidArgument,
            format!("max-buckets must be from 1 to {LIST_BUCKETS_PAGE_MAX}, not {max}"),
        ));
    }
    let after = input.continuation_token.as_deref().filter(|t| !t.is_empty()).map(token_name).transpose()?;
    let prefix = input.prefix.clone().unwrap_or_default();
    let in_region = input.bucket_region.as_deref().is_none_or(|r| r == region);
    let mut names = client.buckets().await.map_err(s3_error)?;
    names.sort_by(|a, b| a.name.cmp(&b.name));
    let mut matching = names.into_iter().filter(|bucket| {
        in_region
            && bucket.name.starts_with(&prefix)
            && !bucket.name.starts_with('.')
            && scope.as_ref().is_none_or(|scope| scope.0.reaches(&bucket.name))
            && after.as_deref().is_none_or(|after| bucket.name.as_str() > after)
    });
    let page: Vec<_> = matching.by_ref().take(max as usize).collect();
    let continuation_token = match (matching.next(), page.last()) {
        (Some(_), Some(last)) => Some(name_token(&last.name)),
        _ => None,
    };
    let buckets = page
        .into_iter()
        .map(|bucket| Bucket {
            creation_date: Some(crate::conditional::timestamp(bucket.created_ms)),
            name: Some(bucket.name),
            bucket_region: Some(region.to_owned()),
        })
        .collect();
    let output =
        ListBucketsOutput { buckets: Some(buckets), owner: Some(owner()), continuation_token, prefix: input.prefix };
    Ok(S3Response::new(output))
}

/// The continuation token after bucket `name`.
fn name_token(name: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(name)
}

/// The bucket name a continuation token continues after; a token this gateway did not make
/// is refused as S3 refuses it.
fn token_name(token: &str) -> S3Result<String> {
    use base64::Engine as _;
    let name = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .filter(|name| {
            (1..=63).contains(&name.len())
                && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
        });
    name.ok_or_else(|| {
        S3Error::with_message(S3ErrorCode::InvalidArgument, "The continuation token provided is incorrect")
    })
}

/// CreateBucket. Of a bucket that exists (every bucket is the one owner's): in us-east-1 S3
/// answers 200 and leaves the bucket as it is, in other regions `BucketAlreadyOwnedByYou`.
pub(crate) async fn create_bucket(
    client: &client::Client,
    req: S3Request<CreateBucketInput>,
    region: &str,
) -> S3Result<S3Response<CreateBucketOutput>> {
    let input = req.input;
    // Buckets behave as S3's default since 2023, Object Ownership "BucketOwnerEnforced": ACLs
    // are disabled, so only `private` is accepted and any grant is refused as S3 refuses it.
    let grants = [
        &input.grant_full_control,
        &input.grant_read,
        &input.grant_read_acp,
        &input.grant_write,
        &input.grant_write_acp,
    ];
    let acl_refused = input.acl.as_ref().is_some_and(|acl| acl.as_str() != BucketCannedACL::PRIVATE);
    if acl_refused || grants.iter().any(|grant| grant.is_some()) {
        let mut error = S3Error::with_message(
            S3ErrorCode::Custom("InvalidBucketAclWithObjectOwnership".into()),
            "Bucket cannot have ACLs set with ObjectOwnership's BucketOwnerEnforced setting",
        );
        error.set_status_code(hyper::StatusCode::BAD_REQUEST);
        return Err(error);
    }
    if client.bucket_exists(&input.bucket).await.map_err(s3_error)? {
        if region == crate::DEFAULT_REGION {
            return Ok(S3Response::new(CreateBucketOutput { location: Some(format!("/{}", input.bucket)) }));
        }
        return Err(S3Error::with_message(
            S3ErrorCode::BucketAlreadyOwnedByYou,
            format!("bucket {} already exists and is yours", input.bucket),
        ));
    }
    client.make_bucket(&input.bucket).await.map_err(s3_error)?;
    let output = CreateBucketOutput { location: Some(format!("/{}", input.bucket)) };
    Ok(S3Response::new(output))
}

pub(crate) async fn delete_bucket(
    client: &client::Client,
    req: S3Request<DeleteBucketInput>,
) -> S3Result<S3Response<DeleteBucketOutput>> {
    let bucket = &req.input.bucket;
    if !client.bucket_exists(bucket).await.map_err(s3_error)? {
        return Err(no_such_bucket(bucket));
    }
    client.remove_bucket(bucket).await.map_err(s3_error)?;
    Ok(S3Response::new(DeleteBucketOutput {}))
}

pub(crate) async fn head_bucket(
    client: &client::Client,
    req: S3Request<HeadBucketInput>,
) -> S3Result<S3Response<HeadBucketOutput>> {
    require_bucket(client, &req.input.bucket).await?;
    Ok(S3Response::new(HeadBucketOutput::default()))
}

pub(crate) async fn get_bucket_location(
    client: &client::Client,
    req: S3Request<GetBucketLocationInput>,
    region: &str,
) -> S3Result<S3Response<GetBucketLocationOutput>> {
    require_bucket(client, &req.input.bucket).await?;
    // No constraint means us-east-1 (S3's answer there).
    let location_constraint =
        (region != crate::DEFAULT_REGION).then(|| BucketLocationConstraint::from(region.to_owned()));
    Ok(S3Response::new(GetBucketLocationOutput { location_constraint }))
}

pub(crate) async fn get_bucket_versioning(
    client: &client::Client,
    req: S3Request<GetBucketVersioningInput>,
) -> S3Result<S3Response<GetBucketVersioningOutput>> {
    require_bucket(client, &req.input.bucket).await?;
    // Buckets are unversioned: an empty configuration, as S3 answers for a bucket never versioned.
    Ok(S3Response::new(GetBucketVersioningOutput::default()))
}

/// Objects follow the bucket's "BucketOwnerEnforced" ownership: ACLs other than `private` and
/// `bucket-owner-full-control` are refused with S3's `AccessControlListNotSupported`.
pub(crate) fn check_object_acl(acl: Option<&ObjectCannedACL>) -> S3Result<()> {
    match acl.map(ObjectCannedACL::as_str) {
        None | Some(ObjectCannedACL::PRIVATE | ObjectCannedACL::BUCKET_OWNER_FULL_CONTROL) => Ok(()),
        Some(_) => {
            let mut error = S3Error::with_message(
                S3ErrorCode::Custom("AccessControlListNotSupported".into()),
                "The bucket does not allow ACLs",
            );
            error.set_status_code(hyper::StatusCode::BAD_REQUEST);
            Err(error)
        }
    }
}

/// `NoSuchBucket` unless `bucket` exists.
pub(crate) async fn require_bucket(client: &client::Client, bucket: &str) -> S3Result<()> {
    if client.bucket_exists(bucket).await.map_err(s3_error)? { Ok(()) } else { Err(no_such_bucket(bucket)) }
}

pub(crate) fn no_such_bucket(bucket: &str) -> S3Error {
    S3Error::with_message(S3ErrorCode::NoSuchBucket, format!("the bucket {bucket} does not exist"))
}
