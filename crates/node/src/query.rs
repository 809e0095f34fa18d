//! Near-data query on a node ([`proto::Request::Query`], [`proto::Request::RecordQuery`]):
//! evaluates a client's scan over the row groups, or record splits, it was given with the
//! `pushdown` engine and streams the matching rows back as Arrow IPC. The bytes are read from
//! this node's drives where its chunks are here, and from the peers that hold the rest (a row
//! group may cross chunk boundaries, a split's last record ends in the next chunk); a
//! chunk range missing or corrupt anywhere is rebuilt from k other chunks of its stripe, so
//! the rows are exact with up to m chunks lost. That rebuild is not on the GET path: a client
//! reading an object still decodes for itself.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cluster::{DriveRef, Placement};
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use proto::{
    AggregateSpec, ErrorKind, ObjectMeta, QueryObject, ReadItem, RecordFormat, RecordObject, Response, ScanSpec,
    VersionId,
};
use pushdown::datafusion::arrow::datatypes::SchemaRef;
use pushdown::{ByteSource, Footer, ScanLimits, ScanObject, Spill, SplitObject};

use crate::State;
use crate::peer::Peer;

/// Queries one node runs at once; more wait for a turn.
const QUERIES_MAX: usize = 4;
/// Idle peer connections one query keeps for its reads.
const PEER_CONNECTIONS_KEPT: usize = 4;
/// Bytes one read of a query's source may ask for (the Parquet reader reads a column chunk, or
/// the pages of it a filter needs, at a time).
const READ_BYTES_MAX: u64 = 256 << 20;
/// Result bytes gathered before they go out in one frame.
const DATA_FRAME_BYTES: usize = 1 << 20;

/// The node's query engine: a small runtime of its own (DataFusion is asynchronous; the rest
/// of the node is threads), started on the first query.
#[derive(Debug)]
pub(crate) struct Queries {
    runtime: OnceLock<tokio::runtime::Runtime>,
    turns: tokio::sync::Semaphore,
    limits: ScanLimits,
    /// A query that has had nothing to send for this long sends a heartbeat.
    heartbeat: Duration,
}

impl Queries {
    /// Each query may hold `memory_bytes` in the engine, and says it is alive every
    /// `heartbeat` while it has nothing to send.
    pub(crate) fn new(memory_bytes: usize, heartbeat: Duration) -> Self {
        assert!(!heartbeat.is_zero(), "a heartbeat interval above zero");
        // A node's disks are the store's: a query past its memory fails, it never spills.
        let limits = ScanLimits { memory_bytes, spill: Spill::Never, ..ScanLimits::default() };
        Self { runtime: OnceLock::new(), turns: tokio::sync::Semaphore::new(QUERIES_MAX), limits, heartbeat }
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        self.runtime.get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(self.limits.partitions.max(1))
                .max_blocking_threads(16)
                .thread_name("query")
                .enable_all()
                .build()
                .expect("the query runtime starts")
        })
    }
}

/// Where a query's answer goes: the connection's frames.
pub(crate) trait Answer {
    fn response(&mut self, response: &Response) -> std::io::Result<()>;
    fn data(&mut self, bytes: &[u8]) -> std::io::Result<()>;
}

/// Serves one query to the end. An `Err` is the connection's (the client went away or
/// cancelled: the scan stops where it is); the query's own failures are answered as
/// [`Response::Error`].
pub(crate) fn serve(
    state: &Arc<State>,
    answer: &mut dyn Answer,
    scan: &ScanSpec,
    aggregate: Option<&AggregateSpec>,
    target: Target,
) -> std::io::Result<()> {
    let result = serve_until_done(state, answer, scan, aggregate, target);
    if let Err(e) = &result {
        tracing::info!(error = %e, "query stopped: the client went away");
    }
    result
}

/// What a query scans: row groups of Parquet objects, or splits of CSV or JSON-lines ones.
pub(crate) enum Target {
    RowGroups(Vec<QueryObject>),
    Records { format: RecordFormat, schema: Vec<u8>, objects: Vec<RecordObject> },
}

fn serve_until_done(
    state: &Arc<State>,
    answer: &mut dyn Answer,
    scan: &ScanSpec,
    aggregate: Option<&AggregateSpec>,
    target: Target,
) -> std::io::Result<()> {
    // The turn first: a query waiting for one holds nothing (not even its parsed footers),
    // and says it is alive meanwhile.
    let queries = &state.queries;
    let runtime = queries.runtime();
    let mut pulse = Pulse::new(queries.heartbeat);
    // One wait for the whole time, so the query keeps its place in the queue between beats.
    let _turn = runtime.block_on(async {
        let acquire = queries.turns.acquire();
        tokio::pin!(acquire);
        loop {
            match tokio::time::timeout(pulse.left(), &mut acquire).await {
                Ok(turn) => return Ok::<_, std::io::Error>(turn.expect("the semaphore is never closed")),
                Err(_) => pulse.beat_if_due(answer, &mut Vec::new())?,
            }
        }
    })?;
    let (prepared, source) = match prepare(state, target) {
        Ok(prepared) => prepared,
        Err((kind, message)) => return answer.response(&Response::Error { kind, message }),
    };
    let source = Arc::new(source);
    let dyn_source: Arc<dyn ByteSource> = source.clone();
    let started = match prepared {
        Prepared::RowGroups(scan_objects) => {
            let footers: Vec<(&str, &Footer)> =
                scan_objects.iter().map(|o| (o.name.as_str(), o.footer.as_ref())).collect();
            let schema = match pushdown::table_schema(&footers) {
                Ok(schema) => schema,
                Err(e) => {
                    return answer.response(&Response::Error { kind: ErrorKind::BadQuery, message: e.to_string() });
                }
            };
            runtime.block_on(pushdown::scan(scan_objects, schema, dyn_source, scan, aggregate, &queries.limits))
        }
        Prepared::Records { format, schema, objects } => runtime.block_on(pushdown::scan_records(
            objects,
            schema,
            &format,
            dyn_source,
            scan,
            aggregate,
            &queries.limits,
        )),
    };
    let mut stream = match started {
        Ok(stream) => stream,
        Err(e) => return answer.response(&failure(&e)),
    };
    let mut encoder: Option<pushdown::IpcEncoder> = None;
    let mut pending = Vec::new();
    let mut rows = 0u64;
    loop {
        let next = match runtime.block_on(async { tokio::time::timeout(pulse.left(), stream.next()).await }) {
            Ok(Some(next)) => next,
            Ok(None) => break,
            Err(_) => {
                pulse.beat_if_due(answer, &mut pending)?;
                continue;
            }
        };
        let batch = match next {
            Ok(batch) => batch,
            Err(e) => return answer.response(&failure(&pushdown::Error::from_datafusion(e))),
        };
        rows += batch.num_rows() as u64;
        // Batches that come steadily but write nothing (a count, a few rows) still beat.
        pulse.beat_if_due(answer, &mut pending)?;
        if scan.count_only {
            continue;
        }
        let encoder = match &mut encoder {
            Some(encoder) => encoder,
            None => match pushdown::IpcEncoder::new(&batch.schema()) {
                Ok(new) => encoder.insert(new),
                Err(e) => return answer.response(&failure(&e)),
            },
        };
        if let Err(e) = encoder.write(&batch) {
            return answer.response(&failure(&e));
        }
        pending.extend(encoder.take());
        if pending.len() >= DATA_FRAME_BYTES {
            send_data(answer, &mut pending)?;
            pulse.wrote();
        }
    }
    if let Some(encoder) = encoder {
        match encoder.finish() {
            Ok(tail) => pending.extend(tail),
            Err(e) => return answer.response(&failure(&e)),
        }
    }
    if !pending.is_empty() {
        send_data(answer, &mut pending)?;
    }
    answer.response(&Response::QueryDone {
        rows,
        local_bytes: source.local_bytes.load(Ordering::Relaxed),
        peer_bytes: source.peer_bytes.load(Ordering::Relaxed),
    })
}

/// When a query last wrote to its client. One that has written nothing for its interval (it
/// waits for a turn, scans row groups that do not match, or counts) sends what it has pending,
/// or a heartbeat (an empty data frame): the client knows the node is working, and a client
/// that went away makes the write fail, which stops the query.
struct Pulse {
    interval: Duration,
    last: Instant,
}

impl Pulse {
    fn new(interval: Duration) -> Self {
        Self { interval, last: Instant::now() }
    }

    /// How long until a heartbeat is due.
    fn left(&self) -> Duration {
        self.interval.saturating_sub(self.last.elapsed())
    }

    fn wrote(&mut self) {
        self.last = Instant::now();
    }

    fn beat_if_due(&mut self, answer: &mut dyn Answer, pending: &mut Vec<u8>) -> std::io::Result<()> {
        if self.last.elapsed() < self.interval {
            return Ok(());
        }
        if pending.is_empty() {
            answer.response(&Response::QueryData { len: 0, crc: crc32c::crc32c(&[]) })?;
        } else {
            send_data(answer, pending)?;
        }
        self.wrote();
        Ok(())
    }
}

fn send_data(answer: &mut dyn Answer, pending: &mut Vec<u8>) -> std::io::Result<()> {
    for piece in pending.chunks(proto::QUERY_DATA_BYTES_MAX) {
        answer.response(&Response::QueryData { len: piece.len() as u32, crc: crc32c::crc32c(piece) })?;
        answer.data(piece)?;
    }
    pending.clear();
    Ok(())
}

fn failure(error: &pushdown::Error) -> Response {
    let kind = match error {
        pushdown::Error::BadQuery(_) => ErrorKind::BadQuery,
        pushdown::Error::Unavailable(_) => ErrorKind::Unavailable,
        pushdown::Error::Engine(_) => ErrorKind::Io,
    };
    tracing::debug!(error = %error, "query failed");
    Response::Error { kind, message: error.to_string() }
}

/// A request checked against what this node holds.
enum Prepared {
    RowGroups(Vec<ScanObject>),
    Records { format: RecordFormat, schema: SchemaRef, objects: Vec<SplitObject> },
}

/// Checks the request against what this node holds: every version on the drive named; a
/// Parquet object's footer sound and its row groups inside it; a record object's splits
/// inside it.
fn prepare(state: &Arc<State>, target: Target) -> Result<(Prepared, NodeSource), (ErrorKind, String)> {
    let map = state.map.get();
    let mut layouts = Vec::new();
    let mut locate = |drive: u32, bucket: &str, key: &str, version: VersionId| {
        let name = format!("{bucket}/{key}");
        let on = state
            .drives
            .get(drive as usize)
            .ok_or_else(|| (ErrorKind::NoSuchDrive, format!("node {} has no drive {drive}", state.node_id)))?;
        let versions = on.get_versions(bucket, key).map_err(|e| (ErrorKind::Io, format!("{name}: {e}")))?;
        let meta = versions.all().find(|m| m.version == version).cloned().ok_or_else(|| {
            (
                ErrorKind::Unavailable,
                format!("drive {drive} of node {} does not hold that version of {name}", state.node_id),
            )
        })?;
        if !meta.has_data_file() {
            return Err((ErrorKind::BadQuery, format!("{name} has no data file of its own (multipart or empty)")));
        }
        let set = map
            .sets
            .get(meta.set_idx as usize)
            .filter(|set| set.drives.len() == meta.n())
            .ok_or_else(|| (ErrorKind::Io, format!("{name}: its set {} is not in the map", meta.set_idx)))?;
        let size = meta.size;
        layouts.push(Layout {
            placement: Placement { set_idx: meta.set_idx as usize, rotation: usize::from(meta.rotation), n: meta.n() },
            drives: set.drives.clone(),
            meta,
        });
        Ok::<_, (ErrorKind, String)>((name, size))
    };
    let prepared = match target {
        Target::RowGroups(objects) => {
            let mut scan_objects = Vec::with_capacity(objects.len());
            for object in objects {
                let (name, size) = locate(object.drive, &object.bucket, &object.key, object.version)?;
                let footer = Footer::parse(&name, Bytes::from(object.footer), size)
                    .map_err(|e| (ErrorKind::BadQuery, e.to_string()))?;
                let row_groups: Vec<usize> = object.row_groups.iter().map(|g| *g as usize).collect();
                if let Some(bad) = row_groups.iter().find(|g| **g >= footer.row_groups()) {
                    return Err((ErrorKind::BadQuery, format!("{name} has no row group {bad}")));
                }
                // Each row group once: a repeated one would be scanned, and its rows returned, twice.
                if row_groups.windows(2).any(|pair| pair[0] >= pair[1]) {
                    return Err((
                        ErrorKind::BadQuery,
                        format!("{name}: row groups must be listed once each, in order"),
                    ));
                }
                scan_objects.push(ScanObject { name, size, footer: Arc::new(footer), row_groups });
            }
            Prepared::RowGroups(scan_objects)
        }
        Target::Records { format, schema, objects } => {
            let schema =
                pushdown::records::schema_from_bytes(&schema).map_err(|e| (ErrorKind::BadQuery, e.to_string()))?;
            let mut split_objects = Vec::with_capacity(objects.len());
            for object in objects {
                let (name, size) = locate(object.drive, &object.bucket, &object.key, object.version)?;
                // Order and overlap were checked when the request was decoded.
                if let Some(bad) = object.splits.iter().find(|s| s.last >= size) {
                    return Err((ErrorKind::BadQuery, format!("{name} ({size} bytes) has no byte {}", bad.last)));
                }
                split_objects.push(SplitObject { name, size, splits: object.splits });
            }
            Prepared::Records { format, schema, objects: split_objects }
        }
    };
    let source = NodeSource {
        inner: Arc::new(SourceInner { state: Arc::clone(state), objects: layouts, peers: Mutex::new(HashMap::new()) }),
        local_bytes: Arc::new(AtomicU64::new(0)),
        peer_bytes: Arc::new(AtomicU64::new(0)),
    };
    Ok((prepared, source))
}

/// Where an object's chunks are.
#[derive(Debug)]
struct Layout {
    meta: ObjectMeta,
    placement: Placement,
    drives: Vec<DriveRef>,
}

/// Reads a query's objects from this node's drives and its peers, verified block by block.
#[derive(Debug)]
struct NodeSource {
    inner: Arc<SourceInner>,
    local_bytes: Arc<AtomicU64>,
    peer_bytes: Arc<AtomicU64>,
}

#[derive(Debug)]
struct SourceInner {
    state: Arc<State>,
    objects: Vec<Layout>,
    /// Idle connections to peers, by node index.
    peers: Mutex<HashMap<usize, Vec<Peer>>>,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Peer")
    }
}

impl ByteSource for NodeSource {
    fn read(&self, object: usize, range: Range<u64>) -> BoxFuture<'static, Result<Bytes, String>> {
        let inner = Arc::clone(&self.inner);
        let counters = (Arc::clone(&self.local_bytes), Arc::clone(&self.peer_bytes));
        Box::pin(async move {
            tokio::task::spawn_blocking(move || inner.read(object, range, &counters))
                .await
                .map_err(|e| format!("read task: {e}"))?
        })
    }
}

impl SourceInner {
    fn read(
        &self,
        object: usize,
        range: Range<u64>,
        counters: &(Arc<AtomicU64>, Arc<AtomicU64>),
    ) -> Result<Bytes, String> {
        let layout = self.objects.get(object).ok_or("no such object in the query")?;
        let meta = &layout.meta;
        if range.start > range.end || range.end > meta.size {
            return Err(format!("bytes {range:?} of {}/{} ({} bytes)", meta.bucket, meta.key, meta.size));
        }
        if range.end - range.start > READ_BYTES_MAX {
            return Err(format!(
                "{}/{}: a read of {} bytes (a column chunk that large) exceeds the node's {READ_BYTES_MAX}",
                meta.bucket,
                meta.key,
                range.end - range.start
            ));
        }
        let geometry = meta.geometry();
        let block = u64::from(meta.block_bytes);
        let mut out = Vec::with_capacity((range.end - range.start) as usize);
        // An aligned object's bytes lie in stretches of its stored stream, between pads.
        for stored in meta.stored_ranges(range) {
            let mut at = stored.start;
            while at < stored.end {
                let stripe = at / geometry.stripe_bytes();
                let in_stripe = at - geometry.stripe_offset(stripe);
                let chunk_len = geometry.chunk_len(stripe) as u64;
                let chunk = (in_stripe / chunk_len) as usize;
                let offset = in_stripe % chunk_len;
                let take = (stored.end - at).min(chunk_len - offset);
                // Whole checksum blocks, so the bytes can be verified.
                let start = offset / block * block;
                let end = (offset + take).div_ceil(block).saturating_mul(block).min(chunk_len);
                let piece = self.chunk_range(layout, stripe, chunk, start..end, counters)?;
                let from = (offset - start) as usize;
                out.extend_from_slice(&piece[from..from + take as usize]);
                at += take;
            }
        }
        Ok(Bytes::from(out))
    }

    /// Bytes `range` (whole blocks) of chunk `chunk` of `stripe`, checked against their CRCs:
    /// read where the chunk lies, or rebuilt from k other chunks of the stripe.
    fn chunk_range(
        &self,
        layout: &Layout,
        stripe: u64,
        chunk: usize,
        range: Range<u64>,
        counters: &(Arc<AtomicU64>, Arc<AtomicU64>),
    ) -> Result<Vec<u8>, String> {
        let meta = &layout.meta;
        let (k, n) = (usize::from(meta.k), meta.n());
        let position = layout.placement.position(stripe, chunk);
        if let Some(bytes) = self.fetch_verified(layout, stripe, position, range.clone(), counters) {
            return Ok(bytes);
        }
        tracing::info!(
            key = %meta.key, version = %meta.version.to_hex(), stripe, chunk,
            "a query's chunk range is missing or corrupt; rebuilding it from the stripe"
        );
        let len = (range.end - range.start) as usize;
        let mut chunks: Vec<Vec<u8>> = vec![vec![0u8; len]; n];
        let mut present = vec![false; n];
        let mut found = 0;
        // Data chunks first (cheaper to decode), then parity.
        for other in (0..n).filter(|c| *c != chunk) {
            if found == k {
                break;
            }
            let other_position = layout.placement.position(stripe, other);
            if let Some(bytes) = self.fetch_verified(layout, stripe, other_position, range.clone(), counters) {
                chunks[other] = bytes;
                present[other] = true;
                found += 1;
            }
        }
        if found < k {
            return Err(format!(
                "{}/{}: stripe {stripe} has {found} readable chunks, {k} needed",
                meta.bucket, meta.key
            ));
        }
        let codec = ec::Codec::new(k, n - k).map_err(|e| e.to_string())?;
        let mut refs: Vec<&mut [u8]> = chunks.iter_mut().map(Vec::as_mut_slice).collect();
        codec.reconstruct_data(&mut refs, &present).map_err(|e| e.to_string())?;
        let first = (range.start / u64::from(meta.block_bytes)) as usize;
        let crcs = &meta.block_crcs(stripe, chunk)[first..];
        let rebuilt = std::mem::take(&mut chunks[chunk]);
        if !rebuilt.chunks(meta.block_bytes as usize).zip(crcs).all(|(b, c)| crc32c::crc32c(b) == *c) {
            return Err(format!("{}/{}: stripe {stripe} chunk {chunk} rebuilt wrong", meta.bucket, meta.key));
        }
        Ok(rebuilt)
    }

    /// Bytes `range` of the chunk at `position` of `stripe` if its drive serves them and they
    /// match their block checksums.
    fn fetch_verified(
        &self,
        layout: &Layout,
        stripe: u64,
        position: usize,
        range: Range<u64>,
        counters: &(Arc<AtomicU64>, Arc<AtomicU64>),
    ) -> Option<Vec<u8>> {
        let meta = &layout.meta;
        let drive = layout.drives[position];
        let offset = meta.geometry().file_offset(stripe) + range.start;
        let len = (range.end - range.start) as usize;
        let bytes = if drive.node_idx == self.state.node_idx {
            if self.state.is_rebuilding(drive.drive_idx) {
                return None;
            }
            let read = self.state.drives[drive.drive_idx].read_chunk(meta.version, offset, len);
            let bytes = read.inspect_err(|e| tracing::warn!(error = %e, "query read failed")).ok()??;
            counters.0.fetch_add(len as u64, Ordering::Relaxed);
            bytes
        } else {
            let bytes = self.peer_read(
                drive,
                ReadItem { drive: drive.drive_idx as u32, version: meta.version, offset, len: len as u32 },
            )?;
            counters.1.fetch_add(len as u64, Ordering::Relaxed);
            bytes
        };
        let chunk_idx = layout.placement.chunk_at(stripe, position);
        let first = (range.start / u64::from(meta.block_bytes)) as usize;
        let crcs = meta.block_crcs(stripe, chunk_idx).get(first..)?;
        let good = bytes.chunks(meta.block_bytes as usize).zip(crcs).all(|(b, c)| crc32c::crc32c(b) == *c);
        if !good {
            tracing::warn!(key = %meta.key, version = %meta.version.to_hex(), stripe, position, "a chunk range failed its checksum during a query");
        }
        good.then_some(bytes)
    }

    fn peer_read(&self, drive: DriveRef, item: ReadItem) -> Option<Vec<u8>> {
        let idle = self.peers.lock().expect("peer list").get_mut(&drive.node_idx).and_then(Vec::pop);
        let mut peer = match idle {
            Some(peer) => peer,
            None => {
                let map = self.state.map.get();
                let (peer, theirs) = Peer::connect(map.nodes[drive.node_idx].addr, &map, self.state.peer_tls())
                    .inspect_err(|e| tracing::debug!(error = %e, "a query's peer did not answer"))
                    .ok()?;
                if theirs > map.version {
                    self.state.map.newer_seen();
                }
                peer
            }
        };
        let mut buf = vec![0u8; item.len as usize];
        let served = peer.start_read(vec![item]).and_then(|()| peer.finish_read_into(&mut [&mut buf]));
        match served {
            Ok(served) => {
                let mut peers = self.peers.lock().expect("peer list");
                let idle = peers.entry(drive.node_idx).or_default();
                if idle.len() < PEER_CONNECTIONS_KEPT {
                    idle.push(peer);
                }
                served[0].then_some(buf)
            }
            Err(e) => {
                tracing::debug!(error = %e, "a query's peer read failed");
                None
            }
        }
    }
}
