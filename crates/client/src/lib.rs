//! The Tessera smart client: talks to storage nodes directly, one hop, no gateway.
//!
//! A PUT cuts the object into stripes of k chunks, encodes m parity chunks per stripe, sends
//! every chunk to its drive in parallel (two stripes in flight at most, whatever the object
//! size) and commits the metadata on at least the write quorum W of the set's drives.
//! A GET reads the metadata from the set, sends one batched scatter-gather request per node,
//! reads each chunk straight into the caller's buffer, verifies its CRC32C, and rebuilds
//! missing or corrupt chunks from parity on the client.
//!
//! Main types: [`Client`], [`ClientOptions`], [`ObjectInfo`], [`Error`].
//!
//! ```no_run
//! # async fn demo() -> Result<(), client::Error> {
//! let map = cluster::ClusterMap::from_toml(&std::fs::read_to_string("tessera-data/cluster.toml").unwrap(),
//!     std::path::Path::new("tessera-data")).unwrap();
//! let client = client::Client::new(map, client::ClientOptions::default())?;
//! client.make_bucket("bkt").await?;
//! client.put_bytes("bkt", "hello.txt", b"hello", &client::PutOptions::default()).await?;
//! let info = client.head("bkt", "hello.txt").await?;
//! let mut buf = vec![0u8; info.meta.size as usize];
//! client.read_at(&info, 0, &mut buf).await?;
//! assert_eq!(buf, b"hello");
//! # Ok(()) }
//! ```

mod admin;
mod checksum_cache;
mod coalesce;
mod conn;
mod gather;
mod get;
mod head;
mod key_records;
mod list;
mod multipart;
mod pace;
mod put;
mod query;
mod relocate;
mod status;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cluster::{ClusterMap, DriveRef, Placement};
use proto::{ObjectMeta, Request, Response, VersionId};

use conn::{Conn, MapIdentity, Pool};

pub use admin::{NodeMap, NodeSpace};
pub use checksum_cache::CHECKSUM_CACHE_BYTES_MAX;
pub use coalesce::MetadataCounts;
pub use gather::{GATHER_ROWS_MAX, GATHER_RUN_BYTES_MAX, GatherItem, RowCache, RowCacheStats, RowTable};
pub use key_records::{ACCESS_KEYS_BUCKET, KEY_RECORD_BYTES_MAX, KEY_RECORDS_MAX};
pub use list::ListPage;
pub use multipart::{
    CompleteHeaders, MULTIPART_BUCKET, PART_BYTES_MIN, PART_NUMBER_MAX, PartInfo, Replacing, UploadInfo,
};
pub use pace::Pace;
pub use proto::QUERY_FOOTER_BYTES_MAX;
pub use proto::{
    AggregateFunction, AggregateSpec, BucketEntry, CommitCondition, DriveInfo, DriveRepairStatus, DriveSpace,
    ErrorKind, ListEntry, NodeInfo, PartialAggregate, QueryObject, RECORD_SPLITS_MAX, RecordObject, RecordSplit,
    RepairAction, RepairStatus, ScanSpec, ScrubStatus,
};
pub use query::{QUERY_SILENCE_MAX, QueryReply, QueryStats};
pub use relocate::{MoveKind, Moved, PoolListing};
pub use status::{ClusterStatus, DriveStatus, NodeStatus, RepairSummary, SetStatus};

/// Most runs of one operation when nodes show its map to be stale: the first with the map it
/// had, then each with the newer map fetched.
const MAP_ATTEMPTS: usize = 3;

/// Timeouts and bounds of a client. Every node call has a deadline.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Connect plus handshake.
    pub connect_timeout: Duration,
    /// One request and its whole response (a batch of chunks, a commit).
    pub request_timeout: Duration,
    /// Idle connections kept per node.
    pub idle_connections_per_node_max: usize,
    /// After a node fails, reads plan around it for this long instead of trying it first.
    pub down_backoff: Duration,
    /// Shifts this client's clock (nanoseconds, may be negative). For fault tests of skewed
    /// clocks: version order never depends on it (see [`Client::put`]); 0 otherwise.
    pub clock_skew_ns: i64,
    /// Read repair: when a read finds a chunk missing or corrupt, or a drive without the
    /// version it reads, tell a node that holds the version, so the repair is queued at once
    /// instead of waiting for the scrubber. On by default; an observer that must not disturb
    /// the background repair (a test of the scrubber) turns it off.
    pub repair_hints: bool,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(20),
            idle_connections_per_node_max: 64,
            down_backoff: Duration::from_secs(2),
            clock_skew_ns: 0,
            repair_hints: true,
        }
    }
}

/// What reads met, since the client was made ([`Client::read_counts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadCounts {
    /// Stripes decoded because a needed data chunk was missing, unreadable or corrupt.
    pub degraded_stripes: u64,
    /// Data chunks (or the ranges of them read) rebuilt from parity.
    pub chunks_rebuilt: u64,
    /// Chunks that arrived and failed their block checksums (read around).
    pub checksum_failures: u64,
}

/// Options of one PUT.
#[derive(Clone, Debug, Default)]
pub struct PutOptions {
    pub content_type: Option<String>,
    /// `x-amz-meta-*` pairs, names without the prefix.
    pub user_meta: Vec<(String, String)>,
    /// Standard headers replayed on GET (lowercase names): content-encoding,
    /// content-disposition, cache-control, content-language, expires.
    pub headers: Vec<(String, String)>,
    /// [`CommitCondition::IfAbsent`] makes the PUT fail with [`Error::PreconditionFailed`] if
    /// the key holds a live object when it commits (S3 `If-None-Match: *`), atomically.
    pub condition: CommitCondition,
    /// Store the object in the aligned layout: these byte ranges each inside one data chunk.
    pub align: Option<Alignment>,
    /// Checksum block size (a power of two from [`CHECKSUM_BLOCK_BYTES_MIN`] to 64 KiB; capped at
    /// the chunk size): a ranged read fetches and verifies whole blocks, so an object read in
    /// small pieces (a feature table's 4 KiB rows) wants small blocks, at 4 bytes of metadata
    /// per block. `None`: 64 KiB.
    pub block_bytes: Option<u32>,
    /// Headers known only once the source has ended (a checksum computed over the body):
    /// whatever the source put there when it returned its end is stored with `headers`.
    pub headers_at_end: Option<HeadersAtEnd>,
}

/// Headers a PUT's source fills in at its end, read when the PUT commits
/// ([`PutOptions::headers_at_end`]). Clones share one slot.
#[derive(Clone, Debug, Default)]
pub struct HeadersAtEnd(Arc<std::sync::Mutex<Vec<(String, String)>>>);

impl HeadersAtEnd {
    /// Replaces what the slot holds.
    pub fn set(&self, headers: Vec<(String, String)>) {
        *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = headers;
    }

    /// What the slot holds now.
    pub fn get(&self) -> Vec<(String, String)> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

/// The smallest checksum block a PUT may ask for ([`PutOptions::block_bytes`]).
pub const CHECKSUM_BLOCK_BYTES_MIN: u32 = 4 << 10;

/// Byte ranges of an object to store each inside one data chunk, on one drive: a Parquet
/// file's row groups, so that the node holding a row group evaluates it from its own drive.
/// The source must give exactly `size` bytes (else the PUT fails and nothing is written). The
/// client picks the chunk size and where zeros are stored ([`proto::aligned_layout`]: at most
/// 1% of the object); an object it cannot align within that is stored plain.
#[derive(Clone, Debug, Default)]
pub struct Alignment {
    pub size: u64,
    /// Sorted, disjoint, inside the object.
    pub ranges: Vec<std::ops::Range<u64>>,
}

/// An object version as the client sees it: its metadata and where its chunks are.
#[derive(Clone, Debug)]
pub struct ObjectInfo {
    pub meta: ObjectMeta,
    pub placement: Placement,
    /// The set's drives by position: node id and drive index on that node.
    pub drives: Vec<(String, usize)>,
    /// Positions whose drive returned this version's metadata; reads plan around the others
    /// from the start. Empty when not known (a multipart piece): then any drive may be asked.
    pub meta_positions: Vec<usize>,
}

/// Everything a client operation can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    InvalidName(#[from] proto::NameError),
    #[error("no such bucket {bucket:?} (create it with `tessera mb {bucket}`)")]
    NoSuchBucket { bucket: String },
    #[error("bucket {bucket:?} is not empty")]
    BucketNotEmpty { bucket: String },
    #[error("no such object {bucket}/{key}")]
    NotFound { bucket: String, key: String },
    #[error("cannot {action} {bucket}/{key}: {available} of {total} {unit} reachable, {needed} needed{}", unreachable_suffix(.unreachable))]
    Unavailable {
        action: &'static str,
        /// What `available`, `total` and `needed` count.
        unit: Counted,
        bucket: String,
        key: String,
        available: usize,
        total: usize,
        needed: usize,
        /// The nodes that could not serve, and why.
        unreachable: Vec<FailedNode>,
    },
    /// Fewer than W drives accepted a write. With `unanswered` 0 it was rolled back: nothing
    /// changed. Otherwise `unanswered` drives did not answer, enough that the version may still
    /// take effect: sent the commit, enough that W may hold it (so it was not rolled back), or
    /// sent the rollback, enough that a read may still take it (and the scrubber then completes
    /// it). The outcome is unknown, as after a lost reply; retry the write to be sure.
    #[error("cannot write {bucket}/{key}: {acked} of {total} drives accepted it, {needed} needed{} ({reasons})", unanswered_note(*.unanswered))]
    WriteQuorum {
        bucket: String,
        key: String,
        acked: usize,
        total: usize,
        needed: usize,
        reasons: String,
        unanswered: usize,
    },
    #[error("node {node} is unreachable: {reason}")]
    NodeUnreachable { node: String, reason: String },
    #[error("node {node} failed less than {backoff:?} ago and is not retried yet ({reason})")]
    NodeDown { node: String, backoff: Duration, reason: String },
    #[error("node {node} refused authentication: check the cluster secret in cluster.toml")]
    AuthRejected { node: String },
    #[error("node {node} could not prove it knows the cluster secret: not a node of this cluster, or an impostor")]
    NodeNotAuthenticated { node: String },
    #[error(
        "node {node} at {addr} belongs to cluster {theirs}, the map is of cluster {ours}: wrong address or wrong cluster.toml"
    )]
    WrongCluster { node: String, addr: SocketAddr, ours: String, theirs: String },
    #[error(
        "the cluster map changed (version {version} is stale) and no node served a newer one it could take: {reason}"
    )]
    MapRefresh { version: u64, reason: String },
    #[error("cannot change the cluster map: {0}")]
    MapChange(String),
    #[error("pool {pool}: {reason}")]
    Pool { pool: u32, reason: String },
    #[error("no active pool has erasure {erasure}, which this multipart upload's parts use; complete or abort it")]
    NoPoolForErasure { erasure: String },
    #[error("{bucket}/{key} already exists")]
    PreconditionFailed { bucket: String, key: String },
    #[error("bucket {bucket:?} has more than {max} multipart upload records; abort some uploads")]
    TooManyUploads { bucket: String, max: usize },
    #[error("node {node}: drive is full")]
    DiskFull { node: String },
    #[error("node {node}: {message}")]
    Node { node: String, kind: ErrorKind, message: String },
    #[error("node {node} sent a bad message: {source}")]
    Protocol { node: String, source: proto::Error },
    #[error("node {node} timed out after {timeout:?}")]
    Timeout { node: String, timeout: Duration },
    #[error("read the object source: {0}")]
    Source(std::io::Error),
    #[error("no such multipart upload {upload_id}")]
    NoSuchUpload { upload_id: String },
    #[error("invalid part {number}: {reason}")]
    InvalidPart { number: u32, reason: String },
    #[error("parts must be listed in ascending order of part number")]
    InvalidPartOrder,
    #[error("part {number} has {size} bytes; every part but the last needs at least 5 MiB")]
    EntityTooSmall { number: u32, size: u64 },
    #[error("object too large for one piece (about {max_bytes} bytes); upload it in parts (multipart)")]
    ObjectTooLarge { max_bytes: u64 },
    #[error("range starts at {offset}, past the end of the {size}-byte object")]
    RangeNotSatisfiable { offset: u64, size: u64 },
    /// `replace_drive` named a node or drive the cluster map does not have.
    #[error("{0}")]
    NoSuchDrive(String),
    #[error("invalid cluster map: {0}")]
    Map(#[from] cluster::Error),
    #[error("the cluster map's node TLS CA is unusable: {0}")]
    NodeTlsConfig(String),
    #[error("erasure coding: {0}")]
    Codec(#[from] ec::Error),
    /// A gather's input is wrong (an index out of range, an output of the wrong size).
    #[error("gather: {0}")]
    BadGather(String),
    /// `PutOptions::block_bytes` is not a power of two in range.
    #[error("checksum block size {0}: a power of two from 4 KiB to 64 KiB")]
    BadBlockSize(u32),
    /// The stored access key records are not what they must be (too many, too large).
    #[error("access key records: {0}")]
    KeyRecords(String),
}

/// The part of an [`Error::WriteQuorum`] message about drives that did not answer the commit.
fn unanswered_note(unanswered: usize) -> String {
    match unanswered {
        0 => String::new(),
        1 => "; 1 drive did not answer, so the write may still take effect (retry it to be sure)".to_owned(),
        n => format!("; {n} drives did not answer, so the write may still take effect (retry it to be sure)"),
    }
}

/// What the numbers of an [`Error::Unavailable`] count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counted {
    Chunks,
    Drives,
    Nodes,
}

impl std::fmt::Display for Counted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Counted::Chunks => "chunks",
            Counted::Drives => "drives",
            Counted::Nodes => "nodes",
        })
    }
}

/// A node that could not serve a request, and why (the error, which names the node).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailedNode {
    /// The node's id in the cluster map.
    pub node: String,
    /// One line: what failed (a connect error, "chunk 2 missing", ...).
    pub reason: String,
}

fn unreachable_suffix(nodes: &[FailedNode]) -> String {
    if nodes.is_empty() {
        return String::new();
    }
    let ids: Vec<&str> = nodes.iter().map(|n| n.node.as_str()).collect();
    let reasons: Vec<&str> = nodes.iter().map(|n| n.reason.as_str()).collect();
    format!("; unreachable nodes: {} ({})", ids.join(", "), reasons.join("; "))
}

impl Error {
    fn from_node(node: &str, kind: ErrorKind, message: &str) -> Self {
        match kind {
            ErrorKind::DiskFull => Error::DiskFull { node: node.to_owned() },
            _ => Error::Node { node: node.to_owned(), kind, message: message.to_owned() },
        }
    }
}

/// A smart client of one cluster. Cheap to clone; safe to share between tasks.
///
/// Every operation plans with one version of the cluster map from start to end. When a node
/// holds a newer map it refuses the operation's requests (`StaleMap`); the client then fetches
/// the newer map from the nodes and runs the operation once more. A streaming PUT (its source
/// cannot be read twice) plans again before it sends its first chunk if the set's nodes show a
/// newer map, and fails if the map changes later in its upload.
#[derive(Clone, Debug)]
pub struct Client {
    inner: Arc<Inner>,
    /// The map (and connections) this handle's operations plan with.
    topo: Arc<Topology>,
}

/// One version of the cluster map and the connection pools that speak for it.
#[derive(Debug)]
struct Topology {
    map: Arc<ClusterMap>,
    pools: Vec<Pool>,
    /// Small metadata reads waiting per node, coalesced into shared requests (by node index).
    meta_queues: Vec<coalesce::MetaQueue>,
    /// A node showed a newer map than `map`.
    stale: Arc<std::sync::atomic::AtomicBool>,
    /// Free bytes per storage pool of `map` and when the nodes said so (maps with more than one
    /// pool only); held while it is asked anew.
    space: tokio::sync::Mutex<Option<(std::time::Instant, Arc<Vec<u64>>)>>,
}

/// How long the nodes' free space guides where new keys go before it is asked again.
const SPACE_MAX_AGE: Duration = Duration::from_secs(10);
/// How long a node has to tell its free space.
const SPACE_TIMEOUT: Duration = Duration::from_secs(1);

impl Topology {
    /// `tls`: trusting `map`'s cluster CA, when it has one (a descendant map keeps its CA).
    fn new(map: ClusterMap, tls: Option<Arc<rustls::ClientConfig>>) -> Self {
        let identity = MapIdentity::of(&map, tls);
        let pools = map.nodes.iter().map(|node| Pool::new(node.id.clone(), node.addr, identity.clone())).collect();
        let meta_queues = map.nodes.iter().map(|_| coalesce::MetaQueue::default()).collect();
        Self { map: Arc::new(map), pools, meta_queues, stale: identity.stale, space: tokio::sync::Mutex::new(None) }
    }

    fn is_stale(&self) -> bool {
        self.stale.load(Ordering::SeqCst)
    }
}

#[derive(Debug)]
struct Inner {
    /// The newest map this client knows.
    latest: std::sync::RwLock<Arc<Topology>>,
    /// Held while the map is fetched anew, so one refresh serves every waiting operation; holds
    /// when the last refresh failed, and why: another is tried only after `down_backoff`.
    refreshing: tokio::sync::Mutex<Option<(std::time::Instant, String)>>,
    /// Codecs by k+m, made on first use: pools may differ (a handful at most).
    codecs: std::sync::Mutex<Vec<Arc<ec::Codec>>>,
    options: ClientOptions,
    writer_id: u64,
    last_version_ns: AtomicU64,
    /// Idle stripe buffers (n x chunk_bytes each) kept for the next PUT.
    stripe_buffers: std::sync::Mutex<Vec<Vec<u8>>>,
    /// Repair hints sent recently, `(version, position)`, so one bad chunk read many times is
    /// reported once; cleared when full. Bounds the hints in flight too.
    hinted: std::sync::Mutex<std::collections::HashSet<(VersionId, usize)>>,
    /// Finalizes sent in the background and not finished yet; `finalized` wakes `settle`.
    finalizing: std::sync::atomic::AtomicUsize,
    finalized: tokio::sync::Notify,
    /// With several pools: where keys were last found or written, by a hash of `bucket/key`
    /// (a collision only costs a second round). Pool indexes never change: pools are appended.
    pool_hints: std::sync::Mutex<std::collections::HashMap<u64, u32>>,
    /// Metadata requests sent and items they asked about (see [`MetadataCounts`]).
    meta_requests: AtomicU64,
    meta_items: AtomicU64,
    /// What reads met (see [`ReadCounts`]).
    degraded_stripes: AtomicU64,
    chunks_rebuilt: AtomicU64,
    checksum_failures: AtomicU64,
    /// Block checksums of versions read before ([`Client::head_many_cached`]).
    checksums: checksum_cache::ChecksumCache,
    /// The node protocol's TLS, trusting the map's cluster CA (which no descendant map changes).
    tls: Option<Arc<rustls::ClientConfig>>,
}

/// Keys whose pool a client remembers at most (about 16 bytes each).
const POOL_HINTS_MAX: usize = 1 << 16;

/// A hash of `bucket/key` (for pool hints).
fn key_hash(bucket: &str, key: &str) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (bucket, key).hash(&mut hasher);
    hasher.finish()
}

/// Repair hints remembered (and so in flight) at most.
const REPAIR_HINTS_MAX: usize = 1024;

/// Stripe buffers a client keeps between PUTs (each n x chunk_bytes: 6 MiB at 4+2, 1 MiB).
const STRIPE_BUFFERS_POOLED_MAX: usize = 8;

impl Client {
    /// A client of the cluster described by `map`.
    pub fn new(map: ClusterMap, options: ClientOptions) -> Result<Self, Error> {
        let codec = Arc::new(ec::Codec::new(map.erasure.k, map.erasure.m)?);
        let tls = match &map.node_tls {
            Some(pem) => Some(nodetls::client_config(&pem.ca_cert).map_err(|e| Error::NodeTlsConfig(e.to_string()))?),
            None => None,
        };
        let topo = Arc::new(Topology::new(map, tls.clone()));
        let inner = Inner {
            latest: std::sync::RwLock::new(Arc::clone(&topo)),
            refreshing: tokio::sync::Mutex::new(None),
            codecs: std::sync::Mutex::new(vec![codec]),
            options,
            writer_id: rand::random(),
            last_version_ns: AtomicU64::new(0),
            stripe_buffers: std::sync::Mutex::new(Vec::new()),
            hinted: std::sync::Mutex::new(std::collections::HashSet::new()),
            finalizing: std::sync::atomic::AtomicUsize::new(0),
            pool_hints: std::sync::Mutex::new(std::collections::HashMap::new()),
            meta_requests: AtomicU64::new(0),
            checksums: checksum_cache::ChecksumCache::default(),
            meta_items: AtomicU64::new(0),
            degraded_stripes: AtomicU64::new(0),
            chunks_rebuilt: AtomicU64::new(0),
            checksum_failures: AtomicU64::new(0),
            finalized: tokio::sync::Notify::new(),
            tls,
        };
        Ok(Self { inner: Arc::new(inner), topo })
    }

    /// A client of the cluster described by `text` (the contents of `cluster.toml`); relative
    /// drive paths resolve against `base_dir`.
    pub fn from_map_text(text: &str, base_dir: &std::path::Path, options: ClientOptions) -> Result<Self, Error> {
        Self::new(ClusterMap::from_toml(text, base_dir)?, options)
    }

    /// Fetches the cluster map from any node at `addr` (authenticated with `secret`).
    pub async fn bootstrap(addr: SocketAddr, secret: &str, options: ClientOptions) -> Result<Self, Error> {
        let identity = MapIdentity::bootstrap(secret);
        let mut conn = Conn::open(&addr.to_string(), addr, &identity, options.connect_timeout).await?;
        let response = tokio::time::timeout(options.request_timeout, conn.call(&Request::GetMap))
            .await
            .map_err(|_| Error::Timeout { node: addr.to_string(), timeout: options.request_timeout })??;
        let Response::Map { toml } = response else {
            return Err(conn.unexpected(&response));
        };
        let map = ClusterMap::from_toml(&toml, std::path::Path::new("."))?;
        Self::new(map, options)
    }

    /// The newest cluster map this client knows.
    pub fn map(&self) -> Arc<ClusterMap> {
        Arc::clone(&self.current().topo.map)
    }

    /// This client with the newest map it knows.
    fn current(&self) -> Client {
        let topo = Arc::clone(&self.inner.latest.read().expect("map lock poisoned"));
        Client { inner: Arc::clone(&self.inner), topo }
    }

    /// Runs `op` with the newest map; again (with the newer map) while it fails and a node
    /// showed the map it used to be stale meanwhile, at most [`MAP_ATTEMPTS`] runs in all (maps
    /// may change twice in a row: a node that moved twice).
    async fn with_map<T, F, Fut>(&self, op: F) -> Result<T, Error>
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, Error>>,
    {
        let mut client = self.current();
        let mut result = op(client.clone()).await;
        for _ in 1..MAP_ATTEMPTS {
            if !self.refreshed_after(&client, result.is_err()).await {
                break;
            }
            client = self.current();
            result = op(client.clone()).await;
        }
        result
    }

    /// After an operation that planned with `used`'s map: if a node showed that map to be
    /// stale, fetches the newer one. Whether the operation should run again: it `failed` and
    /// the map was refreshed.
    async fn refreshed_after(&self, used: &Client, failed: bool) -> bool {
        if !used.topo.is_stale() {
            return false;
        }
        match self.refresh_map(&used.topo).await {
            Ok(()) => failed,
            Err(e) => {
                tracing::warn!(error = %e, "cannot refresh the cluster map");
                false
            }
        }
    }

    /// Replaces `stale` (a map a node showed to be old) with the newest map a node serves that
    /// descends from it. Nothing to do if another task did it already.
    async fn refresh_map(&self, stale: &Arc<Topology>) -> Result<(), Error> {
        let mut last_failure = self.inner.refreshing.lock().await;
        if !Arc::ptr_eq(&self.inner.latest.read().expect("map lock poisoned"), stale) {
            return Ok(());
        }
        if let Some((at, reason)) = last_failure.as_ref()
            && at.elapsed() < self.inner.options.down_backoff
        {
            let reason = format!("{reason} ({:?} ago; not tried again yet)", at.elapsed());
            return Err(Error::MapRefresh { version: stale.map.version, reason });
        }
        let client = Client { inner: Arc::clone(&self.inner), topo: Arc::clone(stale) };
        let calls = (0..stale.map.nodes.len()).map(|node_idx| client.call_now(node_idx, &Request::GetMap));
        let mut newest: Option<ClusterMap> = None;
        let mut reasons = Vec::new();
        for (node_idx, answer) in futures_util::future::join_all(calls).await.into_iter().enumerate() {
            let node = &stale.map.nodes[node_idx].id;
            let map = match answer {
                Ok(Response::Map { toml }) => ClusterMap::from_toml(&toml, &stale.map.base_dir),
                Ok(other) => {
                    reasons.push(format!("{node} answered {other:?}"));
                    continue;
                }
                Err(e) => {
                    reasons.push(e.to_string());
                    continue;
                }
            };
            match map {
                Ok(map) if newest.as_ref().is_some_and(|n| n.version >= map.version) => {}
                Ok(map) => match stale.map.check_descendant(&map) {
                    Ok(()) => newest = Some(map),
                    Err(e) => reasons.push(format!("{node}: {e}")),
                },
                Err(e) => reasons.push(format!("{node}: {e}")),
            }
        }
        let Some(map) = newest else {
            let reason = reasons.join("; ");
            *last_failure = Some((std::time::Instant::now(), reason.clone()));
            return Err(Error::MapRefresh { version: stale.map.version, reason });
        };
        *last_failure = None;
        tracing::info!(from = stale.map.version, to = map.version, "cluster map refreshed");
        *self.inner.latest.write().expect("map lock poisoned") = Arc::new(Topology::new(map, self.inner.tls.clone()));
        Ok(())
    }

    /// Metadata of the current version of `bucket/key` (quorum read over its erasure set).
    pub async fn head(&self, bucket: &str, key: &str) -> Result<ObjectInfo, Error> {
        proto::validate_bucket(bucket)?;
        proto::validate_key(key)?;
        self.with_map(|c| async move { c.head_inner(bucket, key).await }).await
    }

    /// Reads `buf.len()` bytes (fewer at the end of the object) at `offset` of the version in
    /// `info` straight into `buf`; returns how many bytes were read.
    pub async fn read_at(&self, info: &ObjectInfo, offset: u64, buf: &mut [u8]) -> Result<usize, Error> {
        let mut client = self.current();
        let mut result = get::read_at(&client, info, offset, buf).await;
        for _ in 1..MAP_ATTEMPTS {
            if !self.refreshed_after(&client, result.is_err()).await {
                break;
            }
            client = self.current();
            result = get::read_at(&client, info, offset, buf).await;
        }
        result
    }

    /// Metadata requests this client (and its clones) sent so far, and the items they asked.
    pub fn metadata_counts(&self) -> MetadataCounts {
        MetadataCounts {
            requests: self.inner.meta_requests.load(Ordering::Relaxed),
            items: self.inner.meta_items.load(Ordering::Relaxed),
        }
    }

    /// What this client's reads (and its clones') met so far: for metrics.
    pub fn read_counts(&self) -> ReadCounts {
        ReadCounts {
            degraded_stripes: self.inner.degraded_stripes.load(Ordering::Relaxed),
            chunks_rebuilt: self.inner.chunks_rebuilt.load(Ordering::Relaxed),
            checksum_failures: self.inner.checksum_failures.load(Ordering::Relaxed),
        }
    }

    /// Every node of the current map and whether this client counts it up: a node a request
    /// failed on within the down backoff is down (readers plan around it) until a probe succeeds.
    pub fn node_reachability(&self) -> Vec<(String, bool)> {
        let current = self.current();
        let backoff = self.inner.options.down_backoff;
        current.topo.pools.iter().map(|pool| (pool.node.clone(), pool.down_reason(backoff).is_none())).collect()
    }

    /// Counts a stripe a read decoded, and the data chunks it rebuilt.
    pub(crate) fn count_decode(&self, chunks_rebuilt: usize) {
        self.inner.degraded_stripes.fetch_add(1, Ordering::Relaxed);
        self.inner.chunks_rebuilt.fetch_add(chunks_rebuilt as u64, Ordering::Relaxed);
    }

    /// Counts a chunk that failed its block checksums on arrival.
    pub(crate) fn count_checksum_failure(&self) {
        self.inner.checksum_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one metadata request of `items` items.
    fn count_metadata_request(&self, items: usize) {
        self.inner.meta_requests.fetch_add(1, Ordering::Relaxed);
        self.inner.meta_items.fetch_add(items as u64, Ordering::Relaxed);
    }

    /// The smallest checksum block ([`PutOptions::block_bytes`], [`CHECKSUM_BLOCK_BYTES_MIN`]
    /// up to 64 KiB) with which an object of `size` bytes keeps its checksums within what one
    /// version may carry in any active pool (a 4+2 pool: 4 KiB up to about 11 GiB). Larger
    /// objects get 64 KiB.
    pub fn smallest_block_bytes(&self, size: u64) -> u32 {
        let map = self.current().topo.map.clone();
        let fits = |block: u32| {
            map.pools.iter().filter(|pool| pool.is_active()).all(|pool| {
                let (k, n) = (pool.erasure.k as u64, (pool.erasure.k + pool.erasure.m) as u64);
                let chunk = u64::from(map.chunk_bytes);
                let stripes = size.div_ceil(k * chunk);
                let blocks = chunk.div_ceil(u64::from(block.min(map.chunk_bytes)));
                stripes.saturating_mul(n).saturating_mul(blocks) <= put::CHECKSUMS_PER_OBJECT_MAX as u64
            })
        };
        let mut block = CHECKSUM_BLOCK_BYTES_MIN;
        while block < put::CHECKSUM_BLOCK_BYTES && !fits(block) {
            block *= 2;
        }
        block
    }

    /// Metadata of many objects: one metadata request per node covers all of them.
    pub async fn head_many(&self, keys: &[(String, String)]) -> Vec<Result<ObjectInfo, Error>> {
        self.head_many_checked(keys, head::Checksums::Included).await
    }

    async fn head_many_checked(
        &self,
        keys: &[(String, String)],
        checksums: head::Checksums,
    ) -> Vec<Result<ObjectInfo, Error>> {
        let mut results: Vec<Option<Result<ObjectInfo, Error>>> = keys
            .iter()
            .map(|(bucket, key)| match proto::validate_bucket(bucket).and_then(|()| proto::validate_key(key)) {
                Ok(()) => None,
                Err(e) => Some(Err(e.into())),
            })
            .collect();
        let valid: Vec<(String, String)> =
            keys.iter().zip(&results).filter(|(_, r)| r.is_none()).map(|(k, _)| k.clone()).collect();
        let mut client = self.current();
        let mut heads = head::head_many_with(&client, &valid, checksums).await;
        for _ in 1..MAP_ATTEMPTS {
            if !self.refreshed_after(&client, heads.iter().any(Result::is_err)).await {
                break;
            }
            client = self.current();
            heads = head::head_many_with(&client, &valid, checksums).await;
        }
        let mut heads = heads.into_iter();
        for slot in results.iter_mut().filter(|r| r.is_none()) {
            *slot = heads.next();
        }
        results.into_iter().map(|r| r.expect("every key has a result")).collect()
    }

    /// Reads many objects at once, each `(info, offset, buffer)` like [`Client::read_at`]; every
    /// fetch round sends one batched request per node for all of them. One object's failure
    /// does not fail the others.
    pub async fn read_many(&self, mut reads: Vec<(&ObjectInfo, u64, &mut [u8])>) -> Vec<Result<usize, Error>> {
        let client = self.current();
        let again: Vec<_> = reads.iter_mut().map(|(info, offset, buf)| (*info, *offset, &mut **buf)).collect();
        let mut results = get::read_many(&client, again).await;
        if self.refreshed_after(&client, results.iter().any(Result::is_err)).await {
            let failed: Vec<usize> = (0..results.len()).filter(|&i| results[i].is_err()).collect();
            let again: Vec<_> = reads
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| results[*i].is_err())
                .map(|(_, (info, offset, buf))| (*info, *offset, &mut **buf))
                .collect();
            for (idx, result) in failed.into_iter().zip(get::read_many(&self.current(), again).await) {
                results[idx] = result;
            }
        }
        results
    }

    /// The whole object in a new buffer.
    pub async fn get(&self, bucket: &str, key: &str) -> Result<Vec<u8>, Error> {
        let mut info = self.head(bucket, key).await?;
        let mut retried = false;
        loop {
            let size = usize::try_from(info.meta.size).expect("object size fits in memory on 64-bit");
            let mut buf = vec![0u8; size];
            match self.read_at(&info, 0, &mut buf).await {
                Ok(read) => {
                    assert_eq!(read, size, "a whole-object read returns the whole object");
                    return Ok(buf);
                }
                Err(e) if !retried => {
                    retried = true;
                    info = self.head_after_failed_read(&info, e).await?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// What to read after a read of `info` failed (`error`) before anything of it was used.
    /// A head may choose a write in flight once k drives hold it; if that write then misses
    /// its quorum, its rollback removes the version and the read finds its chunks missing. The
    /// key is headed again: a version other than `info`'s (the one the rollback restored), or
    /// `NotFound` (the key's first write failed), is the answer; the same version again, or any
    /// other failure, gives back `error`.
    pub async fn head_after_failed_read(&self, info: &ObjectInfo, error: Error) -> Result<ObjectInfo, Error> {
        if !matches!(error, Error::Unavailable { .. }) {
            return Err(error);
        }
        match self.head(&info.meta.bucket, &info.meta.key).await {
            Ok(again) if again.meta.version != info.meta.version => Ok(again),
            Err(absent @ Error::NotFound { .. }) => Err(absent),
            _ => Err(error),
        }
    }

    /// Stores `info`, the key's current version, again in the aligned layout `align` (a
    /// Parquet object that a stock S3 client uploaded plain or in parts): a new version just
    /// after it with the same bytes, ETag, metadata and modification time, which a concurrent
    /// PUT or delete always supersedes. The old version stays readable until the drives retire
    /// it (the pieces of a multipart one are deleted once the new version is acknowledged).
    /// `None` when there is nothing to do (already aligned, a delete marker, no layout within
    /// the padding budget).
    pub async fn relayout(
        &self,
        info: &ObjectInfo,
        align: &Alignment,
        pace: Option<&Pace>,
    ) -> Result<Option<ObjectInfo>, Error> {
        self.rewrite_current(info, Some(align), pace).await
    }

    /// Stores `info`, the key's current version, again as one piece when it is a multipart
    /// object (a CSV or JSON object a stock S3 client uploaded in parts: its nodes can then
    /// evaluate S3 Select over it), in the same way as [`Client::relayout`]: same bytes, ETag,
    /// metadata and modification time, superseded by any concurrent PUT or delete. `None` when
    /// there is nothing to do (one piece already, a delete marker, an empty object).
    pub async fn consolidate(&self, info: &ObjectInfo, pace: Option<&Pace>) -> Result<Option<ObjectInfo>, Error> {
        self.rewrite_current(info, None, pace).await
    }

    async fn rewrite_current(
        &self,
        info: &ObjectInfo,
        align: Option<&Alignment>,
        pace: Option<&Pace>,
    ) -> Result<Option<ObjectInfo>, Error> {
        let client = self.current();
        match put::relayout(&client, info, align, pace).await? {
            Some((info, replaced)) => {
                multipart::delete_pieces(&self.current(), &replaced).await;
                Ok(Some(info))
            }
            None => Ok(None),
        }
    }

    /// Writes `data` as `bucket/key`. Unlike a streaming [`Client::put`], it runs once more
    /// with the newer map if the map changed during the upload (the bytes can be sent again).
    pub async fn put_bytes(
        &self,
        bucket: &str,
        key: &str,
        data: &[u8],
        options: &PutOptions,
    ) -> Result<ObjectInfo, Error> {
        proto::validate_bucket(bucket)?;
        proto::validate_key(key)?;
        self.with_map(|c| async move {
            let mut source = data;
            let (info, replaced) = put::put(&c, bucket, key, &mut source, options).await?;
            // With the newest map, as `Client::put`: `put::put` may have planned with a newer one.
            multipart::delete_pieces(&c.current(), &replaced).await;
            Ok(info)
        })
        .await
    }

    /// Streams `source` to `bucket/key` until it ends; memory stays bounded by two stripes.
    ///
    /// Acknowledged means it wins: the version is ordered after every version W drives of the
    /// set report when the PUT starts, so a read that starts after the acknowledgement returns
    /// this version or a newer one, however the writers' clocks differ.
    pub async fn put(
        &self,
        bucket: &str,
        key: &str,
        source: &mut (dyn tokio::io::AsyncRead + Unpin + Send),
        options: &PutOptions,
    ) -> Result<ObjectInfo, Error> {
        proto::validate_bucket(bucket)?;
        proto::validate_key(key)?;
        // `put::put` plans again with a newer map if the set's nodes show one before the first
        // chunk is sent; a map change later in the upload fails it (the source is consumed).
        let client = self.current();
        let result = put::put(&client, bucket, key, source, options).await;
        self.refreshed_after(&client, false).await;
        let (info, replaced) = result?;
        // With the newest map: `put::put` may have planned with a newer one than `client`'s.
        multipart::delete_pieces(&self.current(), &replaced).await;
        Ok(info)
    }

    /// Deletes `bucket/key` by committing a delete marker (a newer version) on the quorum.
    pub async fn delete(&self, bucket: &str, key: &str) -> Result<(), Error> {
        proto::validate_bucket(bucket)?;
        proto::validate_key(key)?;
        let attempt = |c: Client| async move {
            let replaced = put::delete(&c, bucket, key).await?;
            multipart::delete_pieces(&c, &replaced).await;
            Ok(())
        };
        let mut client = self.current();
        let first = attempt(client.clone()).await;
        let mut retried: Option<Result<(), Error>> = None;
        for _ in 1..MAP_ATTEMPTS {
            let failed = retried.as_ref().unwrap_or(&first).is_err();
            if !self.refreshed_after(&client, failed).await {
                break;
            }
            client = self.current();
            retried = Some(attempt(client.clone()).await);
        }
        match (retried, first) {
            (None, first) => first,
            // The first attempt's commit fell short of W and may have left its marker on enough
            // drives to be read (its rollback did not reach them all): "no such object" would
            // claim this delete did nothing. Its error says what is known: the delete may or
            // may not have happened. (A first attempt that failed before committing, such as a
            // version read refused for a stale map, left nothing: the retry's answer stands.)
            (Some(Err(Error::NotFound { .. })), Err(e @ (Error::WriteQuorum { .. } | Error::DiskFull { .. }))) => {
                Err(e)
            }
            (Some(again), _) => again,
        }
    }

    /// A version for a new write of `bucket/key`, newer than every version of the key that
    /// W drives of its set in every pool report (so newer than any write acknowledged before
    /// this call, whatever the clocks of the writers say) and than anything this client issued
    /// before; and where it goes: the pool that holds the newest version, so a key's versions
    /// stay together, or for a key no pool has seen, a pool chosen by free space.
    /// With `only`, the write goes to a pool of that erasure config.
    async fn write_target(
        &self,
        bucket: &str,
        key: &str,
        only: Option<cluster::ErasureConfig>,
    ) -> Result<(VersionId, Placement), Error> {
        let seen = head::writer_view(self, bucket, key).await?;
        let pools = &self.topo.map.pools;
        let pool = match seen.pool {
            Some(pool) if only.is_none_or(|only| pools[pool].erasure == only) => pool,
            None if seen.draining && only.is_none() => self.topo.map.pool_for_moved_key(bucket, key),
            _ => self.pool_for_new_key(bucket, key, only).await?,
        };
        assert!(self.topo.map.pools[pool].is_active(), "writes go to active pools only");
        if self.topo.map.pools.len() > 1 {
            self.remember_pool(bucket, key, pool);
        }
        Ok((self.next_version(seen.newest), self.topo.map.placement_in(pool, bucket, key)))
    }

    /// The pool this client last found `bucket/key` in or wrote it to, if it remembers.
    fn pool_hint(&self, bucket: &str, key: &str) -> Option<usize> {
        let hints = self.inner.pool_hints.lock().expect("pool hints lock poisoned");
        hints.get(&key_hash(bucket, key)).map(|&pool| pool as usize)
    }

    /// Remembers where `bucket/key` is, so that its next read asks that pool's set whole and
    /// only probes the others; forgotten all at once when `POOL_HINTS_MAX` are held.
    fn remember_pool(&self, bucket: &str, key: &str, pool: usize) {
        let mut hints = self.inner.pool_hints.lock().expect("pool hints lock poisoned");
        if hints.len() >= POOL_HINTS_MAX {
            hints.clear();
        }
        hints.insert(key_hash(bucket, key), pool as u32);
    }

    /// An active pool for `bucket/key`, which no pool holds: chosen in proportion to each active
    /// pool's free space (so pools fill evenly), from the nodes' answers at most `SPACE_MAX_AGE`
    /// old, by weighted rendezvous hashing of the key (`ClusterMap::pool_for_new_key`), so that
    /// clients agree on it. The first active pool when it is the only one or no node answers.
    /// With `only`, among the active pools of that erasure config (an error if there is none).
    pub(crate) async fn pool_for_new_key(
        &self,
        bucket: &str,
        key: &str,
        only: Option<cluster::ErasureConfig>,
    ) -> Result<usize, Error> {
        let pools = &self.topo.map.pools;
        let eligible = |pool: &cluster::Pool| pool.is_active() && only.is_none_or(|only| pool.erasure == only);
        let Some(first) = pools.iter().position(eligible) else {
            let only = only.expect("a valid map has an active pool");
            return Err(Error::NoPoolForErasure { erasure: only.to_string() });
        };
        if pools.iter().filter(|pool| eligible(pool)).count() == 1 {
            return Ok(first);
        }
        let free = self.pool_free_bytes().await;
        let weights: Vec<u64> =
            pools.iter().zip(free.iter()).map(|(pool, &free)| if eligible(pool) { free } else { 0 }).collect();
        Ok(self.topo.map.pool_for_new_key(bucket, key, &weights).unwrap_or(first))
    }

    /// Free bytes per pool: what its sets can still take, the least free drive of each set
    /// times the set's data share (k of n drives). A set with a silent drive counts as full,
    /// and so does every set of a pool that is not active.
    async fn pool_free_bytes(&self) -> Arc<Vec<u64>> {
        let mut space = self.topo.space.lock().await;
        if let Some((at, free)) = space.as_ref()
            && at.elapsed() < SPACE_MAX_AGE
        {
            return Arc::clone(free);
        }
        // Bounded: a stalled node must not hold up every new key's PUT (it counts as full).
        let calls = (0..self.topo.map.nodes.len()).map(|node_idx| async move {
            match tokio::time::timeout(SPACE_TIMEOUT, self.call(node_idx, &Request::Space)).await {
                Ok(Ok(Response::Space { drives })) => drives,
                _ => Vec::new(),
            }
        });
        let nodes = futures_util::future::join_all(calls).await;
        let map = &self.topo.map;
        let free: Vec<u64> = map
            .pools
            .iter()
            .map(|pool| {
                if !pool.is_active() {
                    return 0;
                }
                map.sets[pool.sets.clone()]
                    .iter()
                    .map(|set| {
                        let least =
                            set.drives.iter().map(|d| nodes[d.node_idx].get(d.drive_idx).map_or(0, |s| s.free_bytes));
                        least.min().unwrap_or(0) / pool.erasure.n() as u64 * pool.erasure.k as u64
                    })
                    .sum()
            })
            .collect();
        let free = Arc::new(free);
        *space = Some((std::time::Instant::now(), Arc::clone(&free)));
        free
    }

    /// Waits (at most the request timeout) until the finalizes of acknowledged writes have
    /// reached the nodes. A process about to exit calls it: a lost finalize keeps replaced
    /// versions on the drives longer and leaves drives that failed during a commit out of the
    /// repair queue until the scrubber finds them.
    pub async fn settle(&self) {
        let deadline = tokio::time::Instant::now() + self.inner.options.request_timeout;
        while self.inner.finalizing.load(Ordering::SeqCst) > 0 {
            let mut notified = std::pin::pin!(self.inner.finalized.notified());
            // Registered before the count is read again, so a wake-up in between is not lost.
            notified.as_mut().enable();
            if self.inner.finalizing.load(Ordering::SeqCst) == 0 {
                break;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                break;
            }
        }
    }

    /// A fresh, strictly increasing version id for this client, later than `after`.
    fn next_version(&self, after: Option<VersionId>) -> VersionId {
        let clock = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
        let clock = clock.saturating_add_signed(self.inner.options.clock_skew_ns);
        // The writer id breaks ties between versions of one nanosecond, so `after.unix_ns + 1`
        // is newer than `after` whoever wrote it.
        let now = clock.max(after.map_or(0, |v| v.unix_ns.saturating_add(1)));
        let last = &self.inner.last_version_ns;
        let mut prev = last.load(Ordering::SeqCst);
        loop {
            let next = now.max(prev + 1);
            match last.compare_exchange(prev, next, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => {
                    return VersionId { unix_ns: next, writer: self.inner.writer_id };
                }
                Err(actual) => prev = actual,
            }
        }
    }

    /// Tells a drive that holds `info`'s version that `position` lacks a good copy of its chunk
    /// (fire and forget: a lost hint waits for the scrubber). Hints to the lowest position that
    /// answered the metadata read, which the nodes designate to repair at once.
    fn hint_repair(&self, info: &ObjectInfo, position: usize) {
        if !self.inner.options.repair_hints {
            return;
        }
        {
            let mut hinted = self.inner.hinted.lock().expect("hint lock poisoned");
            if hinted.len() >= REPAIR_HINTS_MAX {
                hinted.clear();
            }
            if !hinted.insert((info.meta.version, position)) {
                return;
            }
        }
        // Pieces of multipart objects carry no metadata positions: any other position holds it.
        let holder = info.meta_positions.iter().copied().find(|p| *p != position);
        let Some(holder) = holder.or_else(|| (0..info.drives.len()).find(|p| *p != position)) else {
            return;
        };
        let drive = self.set_drives(&info.placement)[holder];
        let request = Request::RepairHint {
            drive: drive.drive_idx as u32,
            bucket: info.meta.bucket.clone(),
            key: info.meta.key.clone(),
            version: info.meta.version,
            positions: vec![position as u32],
        };
        let client = self.clone();
        tokio::spawn(async move {
            if let Err(e) = client.call(drive.node_idx, &request).await {
                tracing::debug!(error = %e, "repair hint not delivered");
            }
        });
    }

    /// The codec of `k` data and `m` parity chunks (an object's, or a pool's).
    fn codec(&self, k: usize, m: usize) -> Result<Arc<ec::Codec>, Error> {
        let mut codecs = self.inner.codecs.lock().expect("codec lock poisoned");
        if let Some(codec) = codecs.iter().find(|c| c.k() == k && c.n() == k + m) {
            return Ok(Arc::clone(codec));
        }
        let codec = Arc::new(ec::Codec::new(k, m)?);
        codecs.push(Arc::clone(&codec));
        Ok(codec)
    }

    /// The k and m of pool index `pool`, as an object's metadata records them.
    fn pool_erasure(&self, pool: usize) -> (u8, u8) {
        let erasure = self.topo.map.pools[pool].erasure;
        (erasure.k as u8, erasure.m as u8)
    }

    /// The k+m of the set `placement` names.
    fn erasure_at(&self, placement: &Placement) -> cluster::ErasureConfig {
        self.topo.map.erasure_of_set(placement.set_idx)
    }

    fn set_drives(&self, placement: &Placement) -> &[DriveRef] {
        &self.topo.map.sets[placement.set_idx].drives
    }

    fn node_id(&self, node_idx: usize) -> &str {
        &self.topo.map.nodes[node_idx].id
    }

    /// One request to one node with the request timeout; the connection goes back to the pool
    /// only after a clean exchange.
    async fn call(&self, node_idx: usize, request: &Request) -> Result<Response, Error> {
        self.exchange(node_idx, request, Backoff::Respect).await
    }

    /// [`Client::call`] that tries the node even if it failed recently.
    async fn call_now(&self, node_idx: usize, request: &Request) -> Result<Response, Error> {
        self.exchange(node_idx, request, Backoff::Ignore).await
    }

    async fn exchange(&self, node_idx: usize, request: &Request, backoff: Backoff) -> Result<Response, Error> {
        let pool = &self.topo.pools[node_idx];
        let options = &self.inner.options;
        let exchange = async {
            let mut conn = match backoff {
                Backoff::Respect => pool.get(options.connect_timeout, options.down_backoff).await?,
                Backoff::Ignore => pool.get_now(options.connect_timeout).await?,
            };
            let response = conn.call(request).await?;
            pool.put_back(conn, options.idle_connections_per_node_max);
            Ok::<_, Error>(response)
        };
        match tokio::time::timeout(options.request_timeout, exchange).await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(e)) => {
                if matches!(e, Error::NodeUnreachable { .. } | Error::Protocol { .. }) {
                    pool.mark_down(&e);
                }
                Err(e)
            }
            Err(_) => {
                let error = Error::Timeout { node: pool.node.clone(), timeout: options.request_timeout };
                pool.mark_down(&error);
                Err(error)
            }
        }
    }

    async fn head_inner(&self, bucket: &str, key: &str) -> Result<ObjectInfo, Error> {
        let keys = [(bucket.to_owned(), key.to_owned())];
        head::head_many(self, &keys).await.pop().expect("one result per key")
    }
}

/// Whether a request skips a node that failed within `ClientOptions::down_backoff`.
#[derive(Clone, Copy, Debug)]
enum Backoff {
    Respect,
    Ignore,
}

/// Picks the version readers agree on from what each drive holds (current and retained
/// versions, and the newest version each drive knows acknowledged): among versions no older
/// than the newest acknowledged one any drive reports, the newest held by enough drives to be
/// read, `k` for a version with chunks and `marker_quorum` for one without (a delete marker, an
/// empty object). A newer version on fewer drives is a write in flight (or a failed one), and
/// the older one it replaces is still there, so a read overlapping a commit returns the old or
/// the new object; but only while that newer version cannot have been acknowledged: when its
/// holders plus the drives that did not answer reach `write_quorum` it may be (its finalize is
/// best effort, so no floor need name it), and the read gets that version instead (reading it
/// reports what is missing) rather than go back behind it. Failing all that, the newest such
/// version seen: never an older one, so a read never goes back behind an acknowledged write.
/// `None` if no reachable drive has the key, and also when no version is readable, no drive
/// knows one acknowledged, and none can have been (its holders plus the drives that did not
/// answer are fewer than `write_quorum`): the first PUT of a key still in flight, which the
/// read may order before itself, rather than an error. With [`Promote::No`] (the mover, which
/// sorts doubtful versions out itself) a version that may be acknowledged is not promoted over
/// the readable one.
fn choose_version(
    replies: &[Option<proto::KeyVersions>],
    marker_quorum: usize,
    write_quorum: usize,
    promote: Promote,
) -> Option<ObjectMeta> {
    let tally = proto::VersionTally::of(replies);
    let readable = tally.newest_readable(marker_quorum);
    let newest =
        tally.candidates().next_back().map(|(meta, _)| meta).or(tally.held.values().next_back().map(|(m, _)| *m));
    // Drives whose retained versions were left out of the answer may hold more than they said.
    let silent = replies.iter().filter(|r| r.as_ref().is_none_or(|v| v.retained_truncated)).count();
    if readable.is_none()
        && tally.floor.is_none()
        && tally.held.values().all(|(_, count)| count + silent < write_quorum)
    {
        return None;
    }
    // The newest version newer than the readable one that W drives may hold (with the drives
    // that may hold it unseen): with m drives out of reach an acknowledged version can be on
    // fewer than k of those that answered, while the version it replaced is still on k
    // (retained).
    let maybe_acknowledged = tally
        .candidates()
        .rev()
        .take_while(|(meta, _)| promote == Promote::Yes && readable.is_none_or(|r| r.version < meta.version))
        .find(|(meta, count)| count + unseen_holders(replies, meta.version) >= write_quorum)
        .map(|(meta, _)| meta);
    maybe_acknowledged.or(readable).or(newest).cloned()
}

/// Whether [`choose_version`] may promote a version that may be acknowledged over the readable
/// one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Promote {
    Yes,
    No,
}

/// Drives that may hold `version` without showing it: those that did not answer, and those
/// whose retained versions were cut from the answer while their current one is newer (retained
/// versions are older than the current one, so a drive whose current is older cannot).
fn unseen_holders(replies: &[Option<proto::KeyVersions>], version: proto::VersionId) -> usize {
    replies
        .iter()
        .filter(|reply| match reply {
            None => true,
            Some(v) => {
                v.retained_truncated
                    && v.current.as_ref().is_some_and(|c| c.version > version)
                    && v.all().all(|m| m.version != version)
            }
        })
        .count()
}

/// Whether an acknowledged version newer than `chosen` (or any, with `None`: the key read as
/// absent) could hide from `replies`: it is on W drives, and a drive that answered shows
/// every version it holds, unless it did not answer or its retained versions were cut from the
/// answer while its current one is newer than `chosen` (retained versions are older than the
/// current one). With W such drives, every holder of that version may be among them.
fn may_miss_acknowledged(
    replies: &[Option<proto::KeyVersions>],
    chosen: Option<proto::VersionId>,
    write_quorum: usize,
) -> bool {
    let hiding = replies
        .iter()
        .filter(|reply| match reply {
            None => true,
            Some(v) => {
                v.retained_truncated
                    && v.current.as_ref().is_some_and(|c| chosen.is_none_or(|chosen| c.version > chosen))
            }
        })
        .count();
    hiding >= write_quorum
}

/// Whether `meta`, which [`choose_version`] gave as the newest version seen when nothing was
/// readable, is no answer for a reader: a version without a data file (a delete marker, an
/// empty object, a multipart record) that fewer drives hold than reading it takes and that no
/// drive knows acknowledged (a failed write's leftover, or one whose holders are out of reach).
fn is_unconfirmed(replies: &[Option<proto::KeyVersions>], meta: &ObjectMeta, marker_quorum: usize) -> bool {
    let holders = replies.iter().flatten().filter(|v| v.all().any(|m| m.version == meta.version)).count();
    let floor = replies.iter().flatten().filter_map(|v| v.finalized).max();
    !meta.has_data_file()
        && holders < meta.drives_to_read(marker_quorum)
        && floor.is_none_or(|floor| floor < meta.version)
}

/// Whether the newest version any reply holds is held by enough drives to be read (then no
/// acknowledged floor can change the choice); also true when no drive has the key.
fn newest_is_readable(replies: &[Option<proto::KeyVersions>], marker_quorum: usize) -> bool {
    let newest = replies.iter().flatten().flat_map(proto::KeyVersions::all).max_by_key(|m| m.version);
    let Some(newest) = newest else {
        return true;
    };
    let held = replies.iter().flatten().filter(|v| v.all().any(|m| m.version == newest.version)).count();
    held >= newest.drives_to_read(marker_quorum)
}

/// Renders which chunks of `info` are on which node, for `tessera stat`.
pub fn describe_layout(info: &ObjectInfo) -> String {
    let geometry = info.meta.geometry();
    let k = usize::from(info.meta.k);
    let mut text = String::new();
    for (position, (node, drive)) in info.drives.iter().enumerate() {
        let (mut data, mut parity) = (0u64, 0u64);
        for stripe in 0..geometry.stripes {
            if info.placement.chunk_at(stripe, position) < k { data += 1 } else { parity += 1 }
        }
        let meta = if info.meta_positions.contains(&position) { "" } else { " (no metadata)" };
        let first = if geometry.stripes > 0 {
            format!(", stripe 0 chunk {}", info.placement.chunk_at(0, position))
        } else {
            String::new()
        };
        let _ = writeln!(
            text,
            "  position {position}: node {node} drive {drive}: {data} data + {parity} parity chunks{first}{meta}"
        );
    }
    text
}

#[cfg(test)]
mod tests;
