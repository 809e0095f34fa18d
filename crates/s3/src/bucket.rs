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
    if let Some(acl) = &input.acl
        && !matches!(acl.as_str(), BucketCannedACL::PRIVATE | BucketCannedACL::PUBLIC_READ)
    {
        return Err(S3Error::with_message(
            S3ErrorCode::NotImplemented,
            format!("canned ACL {:?} is not supported (private and public-read are accepted)", acl.as_str()),
        ));
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

/// `NoSuchBucket` unless `bucket` exists.
pub(crate) async fn require_bucket(client: &client::Client, bucket: &str) -> S3Result<()> {
    if client.bucket_exists(bucket).await.map_err(s3_error)? { Ok(()) } else { Err(no_such_bucket(bucket)) }
}

pub(crate) fn no_such_bucket(bucket: &str) -> S3Error {
    S3Error::with_message(S3ErrorCode::NoSuchBucket, format!("the bucket {bucket} does not exist"))
}
