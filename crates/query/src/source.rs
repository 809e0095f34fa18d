//! The client's own reads of row groups no node evaluates: the smart client's ranged read,
//! which decodes around missing or corrupt chunks.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use client::{Client, ObjectInfo};
use futures_util::future::BoxFuture;
use pushdown::ByteSource;

use crate::QueryCounters;

#[derive(Debug)]
pub(crate) struct ClientSource {
    pub(crate) client: Client,
    pub(crate) objects: Vec<ObjectInfo>,
    pub(crate) counters: Arc<QueryCounters>,
}

/// Bytes one read of a client source asks for at most: a Parquet column chunk can be large,
/// and the buffer is allocated whole.
const READ_BYTES_MAX: u64 = 1 << 30;

impl ByteSource for ClientSource {
    fn read(&self, object: usize, range: Range<u64>) -> BoxFuture<'static, Result<Bytes, String>> {
        let client = self.client.clone();
        let info = self.objects.get(object).cloned();
        let counters = Arc::clone(&self.counters);
        Box::pin(async move {
            let info = info.ok_or("no such object in the query")?;
            let len = range.end.saturating_sub(range.start);
            if len > READ_BYTES_MAX || range.end > info.meta.size {
                return Err(format!(
                    "bytes {range:?} of {}/{} ({} bytes)",
                    info.meta.bucket, info.meta.key, info.meta.size
                ));
            }
            let mut buf = vec![0u8; len as usize];
            let read = client.read_at(&info, range.start, &mut buf).await.map_err(|e| e.to_string())?;
            if read != buf.len() {
                return Err(format!("short read of {}/{}: {read} of {len} bytes", info.meta.bucket, info.meta.key));
            }
            counters.client_read_bytes.fetch_add(len, Ordering::Relaxed);
            Ok(Bytes::from(buf))
        })
    }
}
