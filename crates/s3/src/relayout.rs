//! Background re-layout of Parquet objects uploaded through the gateway. Stock S3 clients
//! (aws-cli, boto3, s3fs, DuckDB's `COPY ... TO 's3://...'`) send a Parquet file's footer last,
//! often in parts, so the gateway cannot lay its row groups out while it writes. After a PUT or
//! CompleteMultipartUpload of a Parquet object (a `.parquet` key or a Parquet content type), it
//! queues the key; one task at a time stores the key's current version again in the aligned
//! layout ([`client::Client::relayout`]: a new version just after it, same bytes, which any
//! later write supersedes), paced to a byte rate (`client::Pace`: within each object's rewrite,
//! not only between objects). A CSV or JSON-lines object (`.csv`, `.tsv`, `.json`, `.jsonl`,
//! `.ndjson`) or a `.npy` table uploaded in parts is stored again as one piece the same way
//! ([`client::Client::consolidate`]), so that its nodes can evaluate S3 Select over it (or a
//! gather read its rows in one request per node). The
//! queue lives in memory and is bounded: a gateway that stops (or a full queue) leaves objects
//! as they were, still correct, and `tessera relayout` catches up.

use tokio::sync::mpsc;

/// Keys waiting for a re-layout; past it, offers are dropped (and logged).
const QUEUE_MAX: usize = 1024;

/// The handle the S3 handlers offer uploaded keys to.
#[derive(Clone, Debug)]
pub(crate) struct Relayer {
    queue: mpsc::Sender<(String, String)>,
}

impl Relayer {
    /// Starts the task on the current runtime; `None` when `rate` is 0 (re-layout off).
    pub(crate) fn start(client: client::Client, rate: u64) -> Option<Self> {
        if rate == 0 {
            return None;
        }
        let (queue, keys) = mpsc::channel(QUEUE_MAX);
        tokio::spawn(work(client, keys, rate));
        Some(Self { queue })
    }

    /// Queues `bucket/key` if its name says Parquet (the task checks the bytes too), or CSV,
    /// JSON lines or a `.npy` table and it was uploaded in parts.
    pub(crate) fn offer(&self, bucket: &str, key: &str, in_parts: bool) {
        let wanted = is_parquet(key) || (in_parts && query::layout::wants_one_piece(key));
        if !wanted {
            return;
        }
        if self.queue.try_send((bucket.to_owned(), key.to_owned())).is_err() {
            tracing::warn!(
                bucket,
                key,
                "the re-layout queue is full: the object stays plain (tessera relayout aligns it)"
            );
        }
    }
}

fn is_parquet(key: &str) -> bool {
    key.to_ascii_lowercase().ends_with(".parquet")
}

async fn work(client: client::Client, mut keys: mpsc::Receiver<(String, String)>, rate: u64) {
    // One rate for the whole queue, kept within each object's rewrite too.
    let pace = client::Pace::new(rate);
    while let Some((bucket, key)) = keys.recv().await {
        if let Err(e) = relayout_one(&client, &bucket, &key, &pace).await {
            tracing::warn!(bucket = %bucket, key = %key, error = %e, "re-layout failed: the object stays plain")
        }
    }
}

/// Re-lays the key's current version; the object bytes rewritten, or `None` if nothing was.
async fn relayout_one(
    client: &client::Client,
    bucket: &str,
    key: &str,
    pace: &client::Pace,
) -> Result<Option<u64>, client::Error> {
    let info = match client.head(bucket, key).await {
        Ok(info) => info,
        Err(client::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    if !info.meta.pads.is_empty() {
        return Ok(None);
    }
    if !is_parquet(key) {
        let joined = client.consolidate(&info, Some(pace)).await?;
        if let Some(joined) = &joined {
            tracing::info!(bucket, key, bytes = joined.meta.size, "stored a multipart object as one piece");
        }
        return Ok(joined.map(|j| j.meta.size));
    }
    let Some(align) = query::layout::object_alignment(client, &info).await? else {
        return Ok(None);
    };
    let relaid = client.relayout(&info, &align, Some(pace)).await?;
    if let Some(relaid) = &relaid {
        tracing::info!(
            bucket,
            key,
            bytes = relaid.meta.size,
            padding = relaid.meta.stored_size() - relaid.meta.size,
            "stored a Parquet object in the aligned layout"
        );
    }
    Ok(relaid.map(|r| r.meta.size))
}
