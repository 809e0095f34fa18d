//! The cluster map: which nodes exist, where their drives are, how drives group into erasure sets,
//! and where each object's chunks go.
//!
//! Main types: [`ClusterMap`] (the model of `cluster.toml`), [`ErasureConfig`] (`k+m`),
//! [`ErasureSet`] (n drives on distinct nodes) and [`Placement`] (set and rotation of one object).
//!
//! This crate is pure: it does no I/O, reads no clock and draws no random numbers. Callers pass in
//! the file text, the cluster id and the secret.
//!
//! ```ignore
//! let map = ClusterMap::from_toml(&text, Path::new("tessera-data"))?;
//! let placement = map.placement("bkt", "cat.jpg");
//! let drive = map.sets[placement.set_idx].drives[placement.position(stripe_idx, chunk_idx)];
//! ```

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Largest `k + m`. Reed-Solomon over GF(2^8) allows up to 256; we cap far lower because a stripe
/// touches n distinct nodes.
pub const N_MAX: usize = 32;
/// Default bytes per chunk (1 MiB).
pub const CHUNK_BYTES_DEFAULT: u32 = 1 << 20;
/// Smallest configurable chunk size (4 KiB).
pub const CHUNK_BYTES_MIN: u32 = 4 << 10;
/// Largest configurable chunk size (16 MiB); the node protocol's frame limit is sized from it.
pub const CHUNK_BYTES_MAX: u32 = 16 << 20;
/// Version of the `cluster.toml` format this crate reads and writes.
pub const FORMAT_VERSION: u32 = 1;

const _: () = assert!(N_MAX <= 256, "GF(2^8) codes cannot exceed 256 chunks");
const _: () = assert!(CHUNK_BYTES_MIN.is_power_of_two() && CHUNK_BYTES_MIN <= CHUNK_BYTES_MAX);

/// Everything that can be wrong with a cluster map or a request to build one.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("malformed cluster.toml at line {line}: {message}")]
    Parse { line: usize, message: String },
    #[error("unsupported cluster.toml format {found} (this build reads format {FORMAT_VERSION})")]
    UnsupportedFormat { found: u32 },
    #[error("invalid erasure config {text:?}: expected K+M with 1 <= K, 1 <= M, K+M <= {N_MAX}")]
    InvalidErasure { text: String },
    #[error("erasure config {k}+{m} needs at least {n} nodes, the cluster has {nodes}", n = k + m)]
    TooFewNodes { k: usize, m: usize, nodes: usize },
    #[error("{drives} drives cannot be split into erasure sets of {n}: use a multiple of {n}")]
    DrivesNotMultiple { drives: usize, n: usize },
    #[error("chunk_bytes {chunk_bytes} is out of range {CHUNK_BYTES_MIN}..={CHUNK_BYTES_MAX}")]
    ChunkBytesOutOfRange { chunk_bytes: u32 },
    #[error("node {id:?} is listed twice")]
    DuplicateNodeId { id: String },
    #[error("node {id:?} has invalid address {addr:?}: expected IP:PORT")]
    InvalidAddr { id: String, addr: String },
    #[error("address {addr} is used by two nodes")]
    DuplicateAddr { addr: SocketAddr },
    #[error("node {id:?} has no drives")]
    NoDrives { id: String },
    #[error("erasure set {set_idx}: {reason}")]
    InvalidSet { set_idx: usize, reason: String },
    #[error("base port {base_port} leaves no room for {nodes} nodes")]
    PortsExhausted { base_port: u16, nodes: usize },
}

/// `k` data chunks and `m` parity chunks per stripe; `n = k + m`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ErasureConfig {
    pub k: usize,
    pub m: usize,
}

impl ErasureConfig {
    /// Checks `1 <= k`, `1 <= m` and `k + m <= N_MAX`.
    pub fn new(k: usize, m: usize) -> Result<Self, Error> {
        if k == 0 || m == 0 || k + m > N_MAX {
            return Err(Error::InvalidErasure { text: format!("{k}+{m}") });
        }
        Ok(Self { k, m })
    }

    /// Chunks per stripe.
    pub fn n(&self) -> usize {
        self.k + self.m
    }

    /// Drives that must durably hold an object before a PUT is acknowledged:
    /// `W = max(k + 1, ceil((n + 1) / 2))`, never more than `n`.
    pub fn write_quorum(&self) -> usize {
        let n = self.n();
        let w = (self.k + 1).max((n + 1).div_ceil(2)).min(n);
        assert!(w >= self.k && w <= n);
        w
    }

    /// How many drives must hold a version without chunks (a delete marker, an empty object)
    /// for readers to take it: W - m, the fewest drives an acknowledged version can be left on
    /// after m failures. A write that failed and whose rollback missed some drives is on at
    /// most m.
    pub fn marker_quorum(&self) -> usize {
        self.write_quorum().saturating_sub(self.m).max(1)
    }
}

impl FromStr for ErasureConfig {
    type Err = Error;
    fn from_str(text: &str) -> Result<Self, Error> {
        let invalid = || Error::InvalidErasure { text: text.to_owned() };
        let (k, m) = text.split_once('+').ok_or_else(invalid)?;
        let k: usize = k.trim().parse().map_err(|_| invalid())?;
        let m: usize = m.trim().parse().map_err(|_| invalid())?;
        Self::new(k, m).map_err(|_| invalid())
    }
}

impl fmt::Display for ErasureConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}+{}", self.k, self.m)
    }
}

/// One drive of one node: indexes into [`ClusterMap::nodes`] and that node's `drives`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DriveRef {
    pub node_idx: usize,
    pub drive_idx: usize,
}

/// A storage node: an id (`n1`), the address its node protocol listens on, and its drives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub id: String,
    pub addr: SocketAddr,
    /// Drive directories as written in the file: relative to the map's directory or absolute.
    pub drives: Vec<PathBuf>,
}

/// `n` drives on `n` distinct nodes. Position `p` in `drives` holds chunk `(p - h - s) mod n` of
/// stripe `s` (see [`Placement`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErasureSet {
    pub drives: Vec<DriveRef>,
}

/// Where one object lives: its erasure set and the rotation `h` of chunk positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub set_idx: usize,
    pub rotation: usize,
    pub n: usize,
}

impl Placement {
    /// Position (index into the set's drives) of chunk `chunk_idx` of stripe `stripe_idx`:
    /// `(chunk_idx + h + stripe_idx) mod n`, so parity load rotates over the set.
    pub fn position(&self, stripe_idx: u64, chunk_idx: usize) -> usize {
        assert!(chunk_idx < self.n);
        let n = self.n as u64;
        ((chunk_idx as u64 + self.rotation as u64 + stripe_idx % n) % n) as usize
    }

    /// Inverse of [`Placement::position`]: which chunk of stripe `stripe_idx` sits at `position`.
    pub fn chunk_at(&self, stripe_idx: u64, position: usize) -> usize {
        assert!(position < self.n);
        let n = self.n as u64;
        let shift = (self.rotation as u64 + stripe_idx % n) % n;
        ((position as u64 + n - shift) % n) as usize
    }
}

/// What `tessera init` asks for.
#[derive(Clone, Debug)]
pub struct InitSpec {
    pub nodes: usize,
    pub drives_per_node: usize,
    pub erasure: ErasureConfig,
    pub base_port: u16,
    pub chunk_bytes: u32,
}

/// The cluster map: the parsed, validated contents of `cluster.toml`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterMap {
    pub cluster_id: String,
    /// Incremented on every change of the map.
    pub version: u64,
    /// Shared secret that authenticates node-protocol peers (hex).
    pub secret: String,
    pub erasure: ErasureConfig,
    pub chunk_bytes: u32,
    pub nodes: Vec<Node>,
    pub sets: Vec<ErasureSet>,
    /// Directory that relative drive paths are resolved against (the file's directory).
    pub base_dir: PathBuf,
}

impl ClusterMap {
    /// Builds a fresh map: nodes `n1..nN` on `127.0.0.1:base_port+i`, drives `nI/dJ`, and erasure
    /// sets taken round-robin over nodes so each set has `n` distinct nodes.
    pub fn generate(spec: &InitSpec, cluster_id: &str, secret: &str, base_dir: &Path) -> Result<Self, Error> {
        let n = spec.erasure.n();
        if spec.nodes < n {
            return Err(Error::TooFewNodes { k: spec.erasure.k, m: spec.erasure.m, nodes: spec.nodes });
        }
        let drive_count = spec.nodes * spec.drives_per_node;
        if spec.drives_per_node == 0 || !drive_count.is_multiple_of(n) {
            return Err(Error::DrivesNotMultiple { drives: drive_count, n });
        }
        if usize::from(spec.base_port) + spec.nodes > usize::from(u16::MAX) {
            return Err(Error::PortsExhausted { base_port: spec.base_port, nodes: spec.nodes });
        }
        let nodes = (0..spec.nodes)
            .map(|node_idx| Node {
                id: format!("n{}", node_idx + 1),
                addr: SocketAddr::from(([127, 0, 0, 1], spec.base_port + node_idx as u16)),
                drives: (0..spec.drives_per_node)
                    .map(|d| PathBuf::from(format!("n{}/d{}", node_idx + 1, d + 1)))
                    .collect(),
            })
            .collect();
        // Drive i of the round-robin sequence is on node i mod N; n consecutive entries are on n
        // consecutive (hence distinct, as N >= n) nodes.
        let sequence: Vec<DriveRef> =
            (0..drive_count).map(|i| DriveRef { node_idx: i % spec.nodes, drive_idx: i / spec.nodes }).collect();
        let sets = sequence.chunks(n).map(|c| ErasureSet { drives: c.to_vec() }).collect();
        let map = Self {
            cluster_id: cluster_id.to_owned(),
            version: 1,
            secret: secret.to_owned(),
            erasure: spec.erasure,
            chunk_bytes: spec.chunk_bytes,
            nodes,
            sets,
            base_dir: base_dir.to_owned(),
        };
        map.validate()?;
        Ok(map)
    }

    /// Parses and validates `cluster.toml`; `base_dir` is the directory the file is in.
    pub fn from_toml(text: &str, base_dir: &Path) -> Result<Self, Error> {
        let file: file::ClusterFile = toml::from_str(text).map_err(|e| {
            let line = e.span().map_or(0, |span| text[..span.start.min(text.len())].lines().count().max(1));
            Error::Parse { line, message: e.message().replace('\n', " ") }
        })?;
        let map = file.into_map(base_dir)?;
        map.validate()?;
        Ok(map)
    }

    /// Serialises the map in the `cluster.toml` format.
    pub fn to_toml(&self) -> String {
        let file = file::ClusterFile::from_map(self);
        toml::to_string(&file).expect("a cluster map always serialises")
    }

    /// Index of the node with id `id`.
    pub fn node_idx(&self, id: &str) -> Option<usize> {
        self.nodes.iter().position(|node| node.id == id)
    }

    /// The drive directory of `drive`, resolved against the map's directory.
    pub fn drive_path(&self, drive: DriveRef) -> PathBuf {
        let path = &self.nodes[drive.node_idx].drives[drive.drive_idx];
        if path.is_absolute() { path.clone() } else { self.base_dir.join(path) }
    }

    /// The erasure set and rotation of `bucket/key`: a stable hash (xxh3-64), so every client
    /// and every version of Tessera computes the same placement.
    pub fn placement(&self, bucket: &str, key: &str) -> Placement {
        let mut name = Vec::with_capacity(bucket.len() + 1 + key.len());
        name.extend_from_slice(bucket.as_bytes());
        name.push(b'/');
        name.extend_from_slice(key.as_bytes());
        let hash = xxhash_rust::xxh3::xxh3_64(&name);
        let n = self.erasure.n();
        Placement { set_idx: (hash % self.sets.len() as u64) as usize, rotation: ((hash >> 32) % n as u64) as usize, n }
    }

    fn validate(&self) -> Result<(), Error> {
        let n = self.erasure.n();
        if !(CHUNK_BYTES_MIN..=CHUNK_BYTES_MAX).contains(&self.chunk_bytes) {
            return Err(Error::ChunkBytesOutOfRange { chunk_bytes: self.chunk_bytes });
        }
        if self.nodes.len() < n {
            let (k, m, nodes) = (self.erasure.k, self.erasure.m, self.nodes.len());
            return Err(Error::TooFewNodes { k, m, nodes });
        }
        let mut ids = HashSet::new();
        let mut addrs = HashSet::new();
        for node in &self.nodes {
            if !ids.insert(node.id.as_str()) {
                return Err(Error::DuplicateNodeId { id: node.id.clone() });
            }
            if !addrs.insert(node.addr) {
                return Err(Error::DuplicateAddr { addr: node.addr });
            }
            if node.drives.is_empty() {
                return Err(Error::NoDrives { id: node.id.clone() });
            }
        }
        if self.sets.is_empty() {
            return Err(Error::InvalidSet { set_idx: 0, reason: "the map has no erasure sets".into() });
        }
        let mut used = HashSet::new();
        for (set_idx, set) in self.sets.iter().enumerate() {
            let invalid = |reason: String| Error::InvalidSet { set_idx, reason };
            if set.drives.len() != n {
                return Err(invalid(format!("has {} drives, the erasure config needs {n}", set.drives.len())));
            }
            let mut set_nodes = HashSet::new();
            for drive in &set.drives {
                let Some(node) = self.nodes.get(drive.node_idx) else {
                    return Err(invalid(format!("names node index {}", drive.node_idx)));
                };
                if drive.drive_idx >= node.drives.len() {
                    return Err(invalid(format!("names drive {} of node {}", drive.drive_idx, node.id)));
                }
                if !set_nodes.insert(drive.node_idx) {
                    return Err(invalid(format!("has two drives on node {}", node.id)));
                }
                if !used.insert(*drive) {
                    return Err(invalid(format!("reuses drive {} of node {}", drive.drive_idx, node.id)));
                }
            }
        }
        Ok(())
    }
}

/// The on-disk (TOML) shape of the map. Kept apart from [`ClusterMap`] so the file format can
/// change without touching the in-memory model.
mod file {
    use super::*;

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct ClusterFile {
        format: u32,
        cluster_id: String,
        version: u64,
        secret: String,
        ec: String,
        chunk_bytes: u32,
        #[serde(rename = "node")]
        nodes: Vec<NodeFile>,
        #[serde(rename = "set")]
        sets: Vec<SetFile>,
    }

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct NodeFile {
        id: String,
        addr: String,
        drives: Vec<String>,
    }

    /// Drives as `"NODE_ID:DRIVE_INDEX"` (drive index counts from 0 in that node's list).
    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct SetFile {
        drives: Vec<String>,
    }

    impl ClusterFile {
        pub(super) fn from_map(map: &ClusterMap) -> Self {
            Self {
                format: FORMAT_VERSION,
                cluster_id: map.cluster_id.clone(),
                version: map.version,
                secret: map.secret.clone(),
                ec: map.erasure.to_string(),
                chunk_bytes: map.chunk_bytes,
                nodes: map
                    .nodes
                    .iter()
                    .map(|node| NodeFile {
                        id: node.id.clone(),
                        addr: node.addr.to_string(),
                        drives: node.drives.iter().map(|d| d.display().to_string()).collect(),
                    })
                    .collect(),
                sets: map
                    .sets
                    .iter()
                    .map(|set| SetFile {
                        drives: set
                            .drives
                            .iter()
                            .map(|d| format!("{}:{}", map.nodes[d.node_idx].id, d.drive_idx))
                            .collect(),
                    })
                    .collect(),
            }
        }

        pub(super) fn into_map(self, base_dir: &Path) -> Result<ClusterMap, Error> {
            if self.format != FORMAT_VERSION {
                return Err(Error::UnsupportedFormat { found: self.format });
            }
            let erasure: ErasureConfig = self.ec.parse()?;
            let mut nodes = Vec::with_capacity(self.nodes.len());
            for node in self.nodes {
                let addr = node
                    .addr
                    .parse()
                    .map_err(|_| Error::InvalidAddr { id: node.id.clone(), addr: node.addr.clone() })?;
                let drives = node.drives.into_iter().map(PathBuf::from).collect();
                nodes.push(Node { id: node.id, addr, drives });
            }
            let mut sets = Vec::with_capacity(self.sets.len());
            for (set_idx, set) in self.sets.into_iter().enumerate() {
                let drives = set
                    .drives
                    .iter()
                    .map(|text| parse_drive_ref(text, &nodes))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| Error::InvalidSet {
                        set_idx,
                        reason: format!("drives {:?} are not all NODE_ID:DRIVE_INDEX of listed nodes", set.drives),
                    })?;
                sets.push(ErasureSet { drives });
            }
            Ok(ClusterMap {
                cluster_id: self.cluster_id,
                version: self.version,
                secret: self.secret,
                erasure,
                chunk_bytes: self.chunk_bytes,
                nodes,
                sets,
                base_dir: base_dir.to_owned(),
            })
        }
    }

    fn parse_drive_ref(text: &str, nodes: &[Node]) -> Option<DriveRef> {
        let (id, drive) = text.split_once(':')?;
        let node_idx = nodes.iter().position(|node| node.id == id)?;
        let drive_idx = drive.parse().ok()?;
        Some(DriveRef { node_idx, drive_idx })
    }
}

#[cfg(test)]
mod tests;
