//! ListBuckets, CreateBucket, DeleteBucket, HeadBucket, GetBucketLocation, GetBucketVersioning.

use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Request, S3Response, S3Result};

use crate::error::s3_error;

/// The one owner of everything: Tessera has a single root identity.
pub(crate) fn owner() -> Owner {
    Owner { display_name: Some("tessera".into()), id: Some("tessera".into()) }
}

pub(crate) async fn list_buckets(
    client: &client::Client,
    req: S3Request<ListBucketsInput>,
) -> S3Result<S3Response<ListBucketsOutput>> {
    let prefix = req.input.prefix.unwrap_or_default();
    let entries = client.buckets().await.map_err(s3_error)?;
    let buckets = entries
        .into_iter()
        .filter(|bucket| bucket.name.starts_with(&prefix) && !bucket.name.starts_with('.'))
        .map(|bucket| Bucket {
            creation_date: Some(crate::conditional::timestamp(bucket.created_ms)),
            name: Some(bucket.name),
            bucket_region: None,
        })
        .collect();
    let output = ListBucketsOutput { buckets: Some(buckets), owner: Some(owner()), ..Default::default() };
    Ok(S3Response::new(output))
}

pub(crate) async fn create_bucket(
    client: &client::Client,
    req: S3Request<CreateBucketInput>,
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
) -> S3Result<S3Response<GetBucketLocationOutput>> {
    require_bucket(client, &req.input.bucket).await?;
    // No constraint means us-east-1, the region SDKs sign for by default.
    Ok(S3Response::new(GetBucketLocationOutput { location_constraint: None }))
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
