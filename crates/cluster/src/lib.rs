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
//! let placement = map.placement_in(0, "bkt", "cat.jpg");
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
/// Longest cluster id (it travels in every handshake).
pub const CLUSTER_ID_BYTES_MAX: usize = 64;

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
    #[error("invalid node {text:?}: {reason}")]
    InvalidNodeSpec { text: String, reason: String },
    #[error(
        "node {id:?} has {drives} of the {total} drives: sets of {n} on distinct nodes allow at most {most} per node"
    )]
    UnevenDrives { id: String, drives: usize, total: usize, n: usize, most: usize },
    #[error("cluster id {id:?} is invalid: expected 1 to {CLUSTER_ID_BYTES_MAX} letters, digits, '-' or '_'")]
    InvalidClusterId { id: String },
    #[error("map version {next} of cluster {cluster_id} cannot follow version {current}: {reason}")]
    BadSuccessor { cluster_id: String, current: u64, next: u64, reason: String },
    #[error("invalid pools: {reason}")]
    InvalidPools { reason: String },
    #[error("a new pool cannot reuse {what}: node {id} has it")]
    PoolOverlap { what: String, id: String },
    #[error("the cluster has no pool {id}")]
    NoSuchPool { id: u32 },
    #[error("pool {id} is {state}, not {wanted}")]
    PoolState { id: u32, state: PoolState, wanted: PoolState },
    #[error(
        "pool {id} is the only active pool: its keys would have nowhere to go (add a pool first: `tessera pool add`)"
    )]
    LastActivePool { id: u32 },
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

/// Erasure sets added to the cluster together (`tessera init`, then `tessera pool add`): a key
/// hashes over the sets of each pool, so adding a pool moves no object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool {
    /// 1 for the sets `tessera init` made, then 2, 3, ... in the order pools were added.
    pub id: u32,
    /// Its sets: a contiguous range of [`ClusterMap::sets`].
    pub sets: std::ops::Range<usize>,
    pub state: PoolState,
    /// The k+m of its sets (pool 1: the cluster's [`ClusterMap::erasure`]; a later pool may
    /// have another).
    pub erasure: ErasureConfig,
}

/// Where a pool is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolState {
    /// Added, its nodes being started: in the map (they take it and the buckets) but holding
    /// nothing, so no read or write asks it. A write must hear from every active pool, so a
    /// pool whose nodes are not up yet must not be active.
    Joining,
    /// Takes new keys and is asked by every read and write.
    Active,
    /// Being emptied (`tessera pool decommission`): asked by every read and write, as it still
    /// holds keys, but no write goes to it; a key whose newest version is here gets its next
    /// version in an active pool.
    Draining,
    /// Emptied: no read or write asks it, its nodes may be shut down. Its nodes and sets stay
    /// in the map (so later maps still descend from this one), and it never comes back.
    Removed,
}

impl Pool {
    /// Whether writes may go to this pool (it takes new keys).
    pub fn is_active(&self) -> bool {
        self.state == PoolState::Active
    }

    /// Whether reads (and writers' version reads) ask this pool: it may hold keys.
    pub fn is_read(&self) -> bool {
        matches!(self.state, PoolState::Active | PoolState::Draining)
    }
}

impl PoolState {
    /// Whether a pool may go from `self` to `next` in a later map (a node catching up may
    /// skip steps): joining -> active -> draining -> removed, and a draining pool back to
    /// active (a decommission called off). Nothing leaves removed or goes back to joining.
    pub fn may_become(self, next: PoolState) -> bool {
        use PoolState::{Active, Draining, Joining, Removed};
        self == next
            || matches!(
                (self, next),
                (Joining, Active | Draining | Removed) | (Active, Draining | Removed) | (Draining, Active | Removed)
            )
    }
}

impl fmt::Display for PoolState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PoolState::Joining => "joining",
            PoolState::Active => "active",
            PoolState::Draining => "draining",
            PoolState::Removed => "removed",
        })
    }
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

/// One node of a cluster across hosts, as `tessera init --node IP:PORT[=DRIVES]` gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSpec {
    pub addr: SocketAddr,
    pub drives: DriveSpec,
}

/// A node's drives: a count (directories `nI/d1..` beside the map) or their paths.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DriveSpec {
    Count(usize),
    Paths(Vec<PathBuf>),
}

/// Most drives one `--node` may name by count.
pub const DRIVES_PER_NODE_MAX: usize = 1024;

impl FromStr for NodeSpec {
    type Err = Error;
    /// `IP:PORT` (one drive), `IP:PORT=COUNT` or `IP:PORT=PATH[,PATH...]`; IPv6 as `[::1]:7001`.
    fn from_str(text: &str) -> Result<Self, Error> {
        let invalid = |reason: &str| Error::InvalidNodeSpec { text: text.to_owned(), reason: reason.to_owned() };
        let (addr, drives) = match text.split_once('=') {
            Some((addr, drives)) => (addr, Some(drives)),
            None => (text, None),
        };
        let addr: SocketAddr = addr
            .trim()
            .parse()
            .map_err(|_| invalid("expected IP:PORT[=DRIVES] (an IP address: the map stores addresses, not names)"))?;
        if addr.port() == 0 || addr.ip().is_unspecified() {
            return Err(invalid("the address must be one peers can connect to (not port 0 or 0.0.0.0)"));
        }
        let drives = match drives.map(str::trim) {
            None => DriveSpec::Count(1),
            Some(count) if !count.is_empty() && count.bytes().all(|b| b.is_ascii_digit()) => {
                match count.parse::<usize>() {
                    Ok(count) if (1..=DRIVES_PER_NODE_MAX).contains(&count) => DriveSpec::Count(count),
                    _ => return Err(invalid(&format!("the drive count must be 1 to {DRIVES_PER_NODE_MAX}"))),
                }
            }
            Some(paths) => {
                let paths: Vec<PathBuf> = paths.split(',').map(|p| PathBuf::from(p.trim())).collect();
                if paths.iter().any(|p| p.as_os_str().is_empty()) {
                    return Err(invalid("an empty drive path"));
                }
                if paths.iter().collect::<HashSet<_>>().len() != paths.len() {
                    return Err(invalid("a drive path is listed twice"));
                }
                DriveSpec::Paths(paths)
            }
        };
        Ok(Self { addr, drives })
    }
}

/// The nodes of a new pool (ids `n{first + 1}`...), checked to make sets of `erasure`: at least
/// n nodes, drives a multiple of n, no node with more than one drive per set.
fn pool_nodes(nodes: &[NodeSpec], erasure: ErasureConfig, first: usize) -> Result<Vec<Node>, Error> {
    let n = erasure.n();
    if nodes.len() < n {
        return Err(Error::TooFewNodes { k: erasure.k, m: erasure.m, nodes: nodes.len() });
    }
    let nodes: Vec<Node> = nodes
        .iter()
        .enumerate()
        .map(|(offset, spec)| {
            let id = format!("n{}", first + offset + 1);
            let drives = match &spec.drives {
                DriveSpec::Count(count) => (0..*count).map(|d| PathBuf::from(format!("{id}/d{}", d + 1))).collect(),
                DriveSpec::Paths(paths) => paths.clone(),
            };
            Node { id, addr: spec.addr, drives }
        })
        .collect();
    let drive_count: usize = nodes.iter().map(|node| node.drives.len()).sum();
    if nodes.iter().any(|node| node.drives.is_empty()) || !drive_count.is_multiple_of(n) {
        return Err(Error::DrivesNotMultiple { drives: drive_count, n });
    }
    let most = drive_count / n;
    if let Some(node) = nodes.iter().find(|node| node.drives.len() > most) {
        let (id, drives) = (node.id.clone(), node.drives.len());
        return Err(Error::UnevenDrives { id, drives, total: drive_count, n, most });
    }
    Ok(nodes)
}

/// Erasure sets over `nodes`: each takes one drive from each of the `n` nodes with the most
/// drives left (ties to the lower node index), so the sets span distinct nodes. The caller
/// checked that no node has more than `total / n` drives, which makes this always succeed.
fn plan_sets(nodes: &[Node], n: usize) -> Vec<ErasureSet> {
    let equal = nodes.iter().all(|node| node.drives.len() == nodes[0].drives.len());
    if equal {
        // Drive i of the round-robin sequence is on node i mod N; n consecutive entries are on
        // n consecutive (hence distinct, as N >= n) nodes.
        let count = nodes.len() * nodes[0].drives.len();
        let sequence: Vec<DriveRef> =
            (0..count).map(|i| DriveRef { node_idx: i % nodes.len(), drive_idx: i / nodes.len() }).collect();
        return sequence.chunks(n).map(|c| ErasureSet { drives: c.to_vec() }).collect();
    }
    let mut next_drive = vec![0usize; nodes.len()];
    let mut sets = Vec::new();
    loop {
        let mut order: Vec<usize> = (0..nodes.len()).filter(|&idx| next_drive[idx] < nodes[idx].drives.len()).collect();
        if order.is_empty() {
            return sets;
        }
        order.sort_by_key(|&idx| (std::cmp::Reverse(nodes[idx].drives.len() - next_drive[idx]), idx));
        assert!(order.len() >= n, "a node holds more than total/n drives");
        let mut drives: Vec<DriveRef> = order[..n]
            .iter()
            .map(|&node_idx| {
                next_drive[node_idx] += 1;
                DriveRef { node_idx, drive_idx: next_drive[node_idx] - 1 }
            })
            .collect();
        drives.sort();
        sets.push(ErasureSet { drives });
    }
}

/// What `tessera init` asks for, for a cluster on this machine.
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
    /// The sets grouped by when they were added: at least one pool, together covering `sets`
    /// in order.
    pub pools: Vec<Pool>,
    /// Directory that relative drive paths are resolved against (the file's directory).
    pub base_dir: PathBuf,
    /// The cluster CA of the node protocol's TLS: with it, nodes serve and clients and peers
    /// connect only over TLS. `None`: the node protocol runs over plain TCP.
    pub node_tls: Option<NodeTls>,
}

/// The cluster CA (PEM certificate and key) that nodes issue their TLS certificates from and
/// clients trust; made by `tessera init`. `Debug` leaves the key out.
#[derive(Clone, PartialEq, Eq)]
pub struct NodeTls {
    pub ca_cert: String,
    pub ca_key: String,
}

impl std::fmt::Debug for NodeTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeTls").field("ca_cert", &self.ca_cert).finish_non_exhaustive()
    }
}

/// xxh3-64 of `bucket/key`, a byte naming what the hash chooses (0: where a moved key goes, 1: a
/// new key's pool) and a pool's id: rendezvous hashing's score of that pool for the key.
fn key_pool_hash(bucket: &str, key: &str, purpose: u8, pool_id: u32) -> u64 {
    let mut name = Vec::with_capacity(bucket.len() + key.len() + 6);
    name.extend_from_slice(bucket.as_bytes());
    name.push(b'/');
    name.extend_from_slice(key.as_bytes());
    name.push(purpose);
    name.extend_from_slice(&pool_id.to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&name)
}

/// Steps the pools' weights are rounded to when a new key's pool is chosen
/// ([`ClusterMap::pool_for_new_key`]): fine enough to fill pools evenly, coarse enough that
/// clients' slightly different views of the free space agree.
pub const NEW_KEY_WEIGHT_STEPS: u64 = 64;

impl ClusterMap {
    /// Builds a fresh map: nodes `n1..nN` on `127.0.0.1:base_port+i`, drives `nI/dJ`, and erasure
    /// sets taken round-robin over nodes so each set has `n` distinct nodes.
    pub fn generate(spec: &InitSpec, cluster_id: &str, secret: &str, base_dir: &Path) -> Result<Self, Error> {
        let n = spec.erasure.n();
        if spec.nodes < n {
            return Err(Error::TooFewNodes { k: spec.erasure.k, m: spec.erasure.m, nodes: spec.nodes });
        }
        if usize::from(spec.base_port) + spec.nodes > usize::from(u16::MAX) {
            return Err(Error::PortsExhausted { base_port: spec.base_port, nodes: spec.nodes });
        }
        let nodes: Vec<NodeSpec> = (0..spec.nodes)
            .map(|node_idx| NodeSpec {
                addr: SocketAddr::from(([127, 0, 0, 1], spec.base_port + node_idx as u16)),
                drives: DriveSpec::Count(spec.drives_per_node),
            })
            .collect();
        Self::generate_hosts(&nodes, spec.erasure, spec.chunk_bytes, cluster_id, secret, base_dir)
    }

    /// Builds a fresh map of the nodes in `nodes` (ids `n1..nN` in that order), for a cluster
    /// across hosts. Every set takes its `n` drives from the `n` nodes with the most drives not
    /// yet in a set (round-robin when all nodes have as many drives), so sets span distinct
    /// nodes and drives spread evenly.
    pub fn generate_hosts(
        nodes: &[NodeSpec],
        erasure: ErasureConfig,
        chunk_bytes: u32,
        cluster_id: &str,
        secret: &str,
        base_dir: &Path,
    ) -> Result<Self, Error> {
        let nodes = pool_nodes(nodes, erasure, 0)?;
        let sets = plan_sets(&nodes, erasure.n());
        let pools = vec![Pool { id: 1, sets: 0..sets.len(), state: PoolState::Active, erasure }];
        let map = Self {
            cluster_id: cluster_id.to_owned(),
            version: 1,
            secret: secret.to_owned(),
            erasure,
            chunk_bytes,
            nodes,
            sets,
            pools,
            base_dir: base_dir.to_owned(),
            node_tls: None,
        };
        map.validate()?;
        Ok(map)
    }

    /// The next version of this map with a pool of `nodes` added, joining (ids continue after
    /// the last node's, drives `nI/dJ` when counted), its sets planned as `init` plans them.
    /// Objects stay where they are: each pool's sets are hashed over on their own.
    pub fn with_pool(&self, nodes: &[NodeSpec], erasure: ErasureConfig) -> Result<Self, Error> {
        let first_node = self.nodes.len();
        let added = pool_nodes(nodes, erasure, first_node)?;
        for node in &added {
            if let Some(old) = self.nodes.iter().find(|old| old.addr == node.addr) {
                return Err(Error::PoolOverlap { what: format!("address {}", node.addr), id: old.id.clone() });
            }
            for drive in node.drives.iter().filter(|d| d.is_absolute()) {
                if let Some(old) = self.nodes.iter().find(|old| old.drives.contains(drive)) {
                    return Err(Error::PoolOverlap { what: format!("drive {}", drive.display()), id: old.id.clone() });
                }
            }
        }
        let mut next = self.clone();
        next.version = self.version + 1;
        let first_set = next.sets.len();
        for set in plan_sets(&added, erasure.n()) {
            let drives = set.drives.iter().map(|d| DriveRef { node_idx: d.node_idx + first_node, ..*d }).collect();
            next.sets.push(ErasureSet { drives });
        }
        next.nodes.extend(added);
        let id = next.pools.last().map_or(1, |pool| pool.id + 1);
        next.pools.push(Pool { id, sets: first_set..next.sets.len(), state: PoolState::Joining, erasure });
        next.validate()?;
        Ok(next)
    }

    /// The next version of this map with joining pool `id` active.
    pub fn with_pool_active(&self, id: u32) -> Result<Self, Error> {
        let mut next = self.clone();
        let Some(pool) = next.pools.iter_mut().find(|pool| pool.id == id) else {
            return Err(Error::NoSuchPool { id });
        };
        if pool.state != PoolState::Joining {
            return Err(Error::PoolState { id, state: pool.state, wanted: PoolState::Joining });
        }
        pool.state = PoolState::Active;
        next.version += 1;
        Ok(next)
    }

    /// The next version of this map with active pool `id` draining (`tessera pool
    /// decommission`): refused for the last active pool, whose keys would have nowhere to go.
    pub fn with_pool_draining(&self, id: u32) -> Result<Self, Error> {
        let next = self.with_pool_state(id, PoolState::Active, PoolState::Draining)?;
        if !next.pools.iter().any(Pool::is_active) {
            return Err(Error::LastActivePool { id });
        }
        Ok(next)
    }

    /// The next version of this map with draining pool `id` removed (its keys moved away).
    pub fn with_pool_removed(&self, id: u32) -> Result<Self, Error> {
        self.with_pool_state(id, PoolState::Draining, PoolState::Removed)
    }

    /// The next version of this map with draining pool `id` active again (a decommission
    /// called off; what was moved stays moved).
    pub fn with_pool_undrained(&self, id: u32) -> Result<Self, Error> {
        self.with_pool_state(id, PoolState::Draining, PoolState::Active)
    }

    fn with_pool_state(&self, id: u32, wanted: PoolState, state: PoolState) -> Result<Self, Error> {
        let mut next = self.clone();
        let Some(pool) = next.pools.iter_mut().find(|pool| pool.id == id) else {
            return Err(Error::NoSuchPool { id });
        };
        if pool.state != wanted {
            return Err(Error::PoolState { id, state: pool.state, wanted });
        }
        pool.state = state;
        next.version += 1;
        Ok(next)
    }

    /// Index (into [`ClusterMap::pools`]) of the pool whose nodes hold the bucket namespace: the
    /// first that is active or draining (pool 1 until it is removed). A bucket exists once a
    /// majority of its nodes have it; nodes of other pools take the buckets from them.
    pub fn namespace_pool(&self) -> usize {
        self.pools.iter().position(Pool::is_read).expect("a valid map has an active pool")
    }

    /// Checks that `next` may replace this map on a running cluster, as an admin's change:
    /// version one higher and [`ClusterMap::check_descendant`] (today: nodes' addresses only).
    pub fn check_successor(&self, next: &ClusterMap) -> Result<(), Error> {
        if next.cluster_id == self.cluster_id && next.version != self.version + 1 {
            return Err(Error::BadSuccessor {
                cluster_id: self.cluster_id.clone(),
                current: self.version,
                next: next.version,
                reason: format!("a change must take version {}", self.version + 1),
            });
        }
        self.check_descendant(next)?;
        // An admin's change adds a pool as joining: it may take no traffic before its nodes run
        // (`tessera pool activate` checks that). A node catching up may skip that version.
        if next.cluster_id == self.cluster_id && next.pools[self.pools.len()..].iter().any(Pool::is_active) {
            return Err(Error::BadSuccessor {
                cluster_id: self.cluster_id.clone(),
                current: self.version,
                next: next.version,
                reason: "a pool is added as active (add it joining, then `tessera pool activate`)".into(),
            });
        }
        Ok(())
    }

    /// Checks that `next` is a later map of the same cluster: a higher version, the same id,
    /// secret, erasure config and chunk size, the same nodes (ids, drives, order), sets and
    /// pools, so that every object stays where it is, plus any pools added after them (with
    /// their new nodes and sets). A node's address may change. Placement is `hash % sets` within
    /// a pool, so a set added to an existing pool would move most of its objects.
    pub fn check_descendant(&self, next: &ClusterMap) -> Result<(), Error> {
        let refuse = |reason: String| Error::BadSuccessor {
            cluster_id: self.cluster_id.clone(),
            current: self.version,
            next: next.version,
            reason,
        };
        if next.cluster_id != self.cluster_id {
            return Err(refuse(format!("it belongs to cluster {}", next.cluster_id)));
        }
        if next.version <= self.version {
            return Err(refuse("it is not newer".into()));
        }
        if next.secret != self.secret {
            return Err(refuse("it changes the cluster secret".into()));
        }
        if next.erasure != self.erasure || next.chunk_bytes != self.chunk_bytes {
            return Err(refuse("it changes the erasure config or the chunk size".into()));
        }
        if next.node_tls != self.node_tls {
            return Err(refuse("it turns the node protocol's TLS on or off, or changes the cluster CA".into()));
        }
        for (idx, node) in self.nodes.iter().enumerate() {
            match next.nodes.get(idx) {
                Some(other) if other.id == node.id && other.drives == node.drives => {}
                _ => return Err(refuse(format!("node {} is removed, moved or has other drives", node.id))),
            }
        }
        // A pool keeps its id, sets and k+m; its state only moves as `PoolState::may_become` says.
        let same_pool = |(old, new): (&Pool, &Pool)| {
            old.id == new.id && old.sets == new.sets && old.erasure == new.erasure && old.state.may_become(new.state)
        };
        if next.sets.get(..self.sets.len()) != Some(&self.sets[..])
            || next.pools.len() < self.pools.len()
            || !self.pools.iter().zip(&next.pools).all(same_pool)
        {
            return Err(refuse("it changes existing erasure sets or pools (objects would move)".into()));
        }
        // What is added must be whole pools: nodes that only new pools' sets use.
        let added_sets = &next.sets[self.sets.len()..];
        let first_added_set = next.pools.get(self.pools.len()).map_or(next.sets.len(), |pool| pool.sets.start);
        if first_added_set != self.sets.len() {
            return Err(refuse("it adds erasure sets outside a new pool".into()));
        }
        if added_sets.iter().flat_map(|set| &set.drives).any(|d| d.node_idx < self.nodes.len()) {
            return Err(refuse("a new pool uses a node of an existing pool".into()));
        }
        if next.nodes.len() > self.nodes.len() && added_sets.is_empty() {
            return Err(refuse("it adds nodes without a pool (capacity grows by `tessera pool add`)".into()));
        }
        Ok(())
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

    /// The erasure set (of pool index `pool`) and rotation of `bucket/key`: a stable hash
    /// (xxh3-64) over that pool's sets, so every client and every version of Tessera computes
    /// the same placement, and adding a pool moves nothing.
    pub fn placement_in(&self, pool: usize, bucket: &str, key: &str) -> Placement {
        let mut name = Vec::with_capacity(bucket.len() + 1 + key.len());
        name.extend_from_slice(bucket.as_bytes());
        name.push(b'/');
        name.extend_from_slice(key.as_bytes());
        let hash = xxhash_rust::xxh3::xxh3_64(&name);
        let n = self.pools[pool].erasure.n();
        let sets = &self.pools[pool].sets;
        let set_idx = sets.start + (hash % sets.len() as u64) as usize;
        Placement { set_idx, rotation: ((hash >> 32) % n as u64) as usize, n }
    }

    /// The active pool a key leaves a draining pool for when no active pool holds it: the one
    /// whose hash with the key is highest (rendezvous hashing), so the mover and every writer
    /// of the key agree on it without talking to each other.
    pub fn pool_for_moved_key(&self, bucket: &str, key: &str) -> usize {
        let score = |pool: &Pool| key_pool_hash(bucket, key, 0, pool.id);
        let active = self.pools.iter().enumerate().filter(|(_, pool)| pool.is_active());
        active.max_by_key(|(_, pool)| score(pool)).map(|(idx, _)| idx).expect("a valid map has an active pool")
    }

    /// The pool (index) for a key no pool holds yet, among those with a nonzero weight (their
    /// free bytes): weighted rendezvous hashing, so every client that sees the same weights
    /// sends the key to the same pool, and two first writes of one key racing from two clients
    /// do not land in two pools. Weights are first rounded to [`NEW_KEY_WEIGHT_STEPS`]ths of their
    /// sum (a pool with any weight keeps at least one step), so views of the free space that
    /// differ a little, as two clients' do, still agree. Keys spread over pools in proportion to
    /// the rounded weights; a change of weights moves only the keys it must. `None` when every
    /// weight is zero.
    pub fn pool_for_new_key(&self, bucket: &str, key: &str, weights: &[u64]) -> Option<usize> {
        assert_eq!(weights.len(), self.pools.len(), "one weight per pool");
        let total: u128 = weights.iter().map(|&w| u128::from(w)).sum();
        if total == 0 {
            return None;
        }
        let steps = |weight: u64| {
            let rounded = (u128::from(weight) * u128::from(NEW_KEY_WEIGHT_STEPS) + total / 2) / total;
            rounded.max(1) as f64
        };
        let score = |pool: &Pool, weight: u64| {
            // A uniform draw in (0, 1) from the top 53 bits of the hash.
            let unit = ((key_pool_hash(bucket, key, 1, pool.id) >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            steps(weight) / -unit.ln()
        };
        (0..self.pools.len())
            .filter(|&pool| weights[pool] > 0)
            .map(|pool| (pool, score(&self.pools[pool], weights[pool])))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(pool, _)| pool)
    }

    /// Indexes (into [`ClusterMap::nodes`]) of the nodes of pool index `pool`, ascending.
    pub fn pool_nodes(&self, pool: usize) -> Vec<usize> {
        let mut nodes: Vec<usize> = self.sets[self.pools[pool].sets.clone()]
            .iter()
            .flat_map(|set| set.drives.iter().map(|d| d.node_idx))
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        nodes
    }

    /// The k+m of the sets node `node_idx` has drives in (a node belongs to one pool).
    pub fn erasure_of_node(&self, node_idx: usize) -> ErasureConfig {
        let pool = self.sets.iter().position(|set| set.drives.iter().any(|d| d.node_idx == node_idx));
        pool.map_or(self.erasure, |set_idx| self.erasure_of_set(set_idx))
    }

    /// The k+m of erasure set `set_idx` (its pool's).
    pub fn erasure_of_set(&self, set_idx: usize) -> ErasureConfig {
        let pool = self.pool_of_set(set_idx).expect("every set belongs to a pool");
        self.pools[pool].erasure
    }

    /// Whether node `node_idx` belongs to a removed pool (emptied: nothing asks it any more).
    pub fn node_is_removed(&self, node_idx: usize) -> bool {
        let set = self.sets.iter().position(|set| set.drives.iter().any(|d| d.node_idx == node_idx));
        set.and_then(|set_idx| self.pool_of_set(set_idx))
            .is_some_and(|pool| self.pools[pool].state == PoolState::Removed)
    }

    /// Index (into [`ClusterMap::pools`]) of the pool that set `set_idx` belongs to.
    pub fn pool_of_set(&self, set_idx: usize) -> Option<usize> {
        self.pools.iter().position(|pool| pool.sets.contains(&set_idx))
    }

    fn validate(&self) -> Result<(), Error> {
        let n = self.erasure.n();
        let id_ok = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
        if self.cluster_id.is_empty()
            || self.cluster_id.len() > CLUSTER_ID_BYTES_MAX
            || !self.cluster_id.chars().all(id_ok)
        {
            return Err(Error::InvalidClusterId { id: self.cluster_id.clone() });
        }
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
        let mut next_set = 0;
        for (idx, pool) in self.pools.iter().enumerate() {
            let invalid = |reason: String| Error::InvalidPools { reason };
            if pool.id as usize != idx + 1 {
                return Err(invalid(format!("pool {} is listed where pool {} belongs", pool.id, idx + 1)));
            }
            if pool.sets.start != next_set || pool.sets.is_empty() {
                return Err(invalid(format!("pool {} must take at least one set, after the previous pool's", pool.id)));
            }
            next_set = pool.sets.end;
        }
        if self.pools.first().is_some_and(|pool| pool.state == PoolState::Joining) {
            return Err(Error::InvalidPools { reason: "pool 1 cannot be joining (init makes it active)".into() });
        }
        if !self.pools.iter().any(Pool::is_active) {
            return Err(Error::InvalidPools { reason: "no pool is active".into() });
        }

        if next_set != self.sets.len() {
            return Err(Error::InvalidPools {
                reason: format!("the pools take {next_set} sets, the map lists {}", self.sets.len()),
            });
        }
        // A node belongs to one pool: a pool's nodes can then be added (and later drained) whole.
        let mut pool_of_node: Vec<Option<u32>> = vec![None; self.nodes.len()];
        for pool in &self.pools {
            for drive in self.sets[pool.sets.clone()].iter().flat_map(|set| &set.drives) {
                let Some(owner) = pool_of_node.get_mut(drive.node_idx) else { continue };
                match *owner {
                    Some(other) if other != pool.id => {
                        let id = &self.nodes[drive.node_idx].id;
                        let reason = format!("node {id} has drives in pools {other} and {}", pool.id);
                        return Err(Error::InvalidPools { reason });
                    }
                    _ => *owner = Some(pool.id),
                }
            }
        }
        if self.pools[0].erasure != self.erasure {
            return Err(Error::InvalidPools { reason: "pool 1 must use the cluster's erasure config".into() });
        }
        let mut used = HashSet::new();
        for (set_idx, set) in self.sets.iter().enumerate() {
            let invalid = |reason: String| Error::InvalidSet { set_idx, reason };
            let n = self.erasure_of_set(set_idx).n();
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
        /// Absent in maps written before pools: then one pool holds every set.
        #[serde(rename = "pool", default)]
        pools: Vec<PoolFile>,
        /// Absent: the node protocol runs over plain TCP.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node_tls: Option<NodeTlsFile>,
    }

    /// The cluster CA, PEM.
    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct NodeTlsFile {
        ca_cert: String,
        ca_key: String,
    }

    /// A pool takes the next `sets` sets of the list.
    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct PoolFile {
        id: u32,
        sets: usize,
        state: PoolState,
        /// K+M of the pool's sets when it differs from the cluster's `ec`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ec: Option<String>,
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
                pools: map
                    .pools
                    .iter()
                    .map(|pool| PoolFile {
                        id: pool.id,
                        sets: pool.sets.len(),
                        state: pool.state,
                        ec: (pool.erasure != map.erasure).then(|| pool.erasure.to_string()),
                    })
                    .collect(),
                node_tls: map
                    .node_tls
                    .as_ref()
                    .map(|tls| NodeTlsFile { ca_cert: tls.ca_cert.clone(), ca_key: tls.ca_key.clone() }),
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
            let mut pools = Vec::with_capacity(self.pools.len().max(1));
            for pool in &self.pools {
                let start = pools.last().map_or(0, |last: &Pool| last.sets.end);
                let end = start.checked_add(pool.sets).ok_or_else(|| Error::InvalidPools {
                    reason: format!("pool {} takes {} sets", pool.id, pool.sets),
                })?;
                let pool_erasure = match &pool.ec {
                    Some(text) => text.parse()?,
                    None => erasure,
                };
                pools.push(Pool { id: pool.id, sets: start..end, state: pool.state, erasure: pool_erasure });
            }
            if pools.is_empty() {
                pools.push(Pool { id: 1, sets: 0..sets.len(), state: PoolState::Active, erasure });
            }
            Ok(ClusterMap {
                cluster_id: self.cluster_id,
                version: self.version,
                secret: self.secret,
                erasure,
                chunk_bytes: self.chunk_bytes,
                nodes,
                sets,
                pools,
                base_dir: base_dir.to_owned(),
                node_tls: self.node_tls.map(|tls| NodeTls { ca_cert: tls.ca_cert, ca_key: tls.ca_key }),
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
