//! The storage node: serves the node protocol (see `proto`) from its drives.
//!
//! Main types: [`NodeConfig`] and [`Server`]. One thread per connection, blocking sockets with
//! timeouts. Unauthenticated connections are bounded apart from authenticated ones: at most
//! [`PENDING_HANDSHAKES_MAX`] handshakes run at once, each within [`HANDSHAKE_TIMEOUT`] in all,
//! and a new connection evicts the oldest pending one when they are all taken, so a flood of
//! slow unauthenticated peers can never lock clients out; authenticated connections are capped
//! at [`CONNECTIONS_MAX`]. Chunk reads go from the data file to the socket with `sendfile(2)`,
//! never through a user-space buffer. When the cluster map has a CA (`node_tls`), every
//! connection, served and made to peers, runs over TLS 1.3 (`nodetls`): the node issues itself
//! a certificate from the CA at start, and chunk reads then go `pread` + rustls.
//!
//! Nodes never reconstruct on the read path: a chunk they cannot serve is reported per item as
//! missing, corrupt or unreadable, and the client decodes around it. (A node answering a
//! near-data query rebuilds the byte ranges of the row groups it evaluates: `query`.)
//!
//! ```ignore
//! let server = Server::bind(NodeConfig { map, map_text, map_path, node_id: "n1".into(), listen: None, .. })?;
//! server.serve()?; // runs until the process exits
//! ```

mod connection;
mod map;
mod metrics;
mod peer;
mod query;
mod rebuild;
mod repair;
mod scrub;

pub use repair::REPAIR_BYTES_PER_S_DEFAULT;
pub use scrub::{DEEP_SCRUB_INTERVAL_DEFAULT, LEFTOVER_GC_AFTER_DEFAULT, SCRUB_INTERVAL_DEFAULT};

use std::collections::VecDeque;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chunkstore::Drive;
use cluster::ClusterMap;

/// Most authenticated connections served at once; further ones are closed after their handshake.
pub const CONNECTIONS_MAX: usize = 1024;
/// Most connections in their handshake at once; a new one evicts the oldest when all are taken.
/// A real client finishes its handshake in about a millisecond, so it is never the oldest.
pub const PENDING_HANDSHAKES_MAX: usize = 64;
/// A connection with no request for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// The peer must finish the whole handshake within this time (not per read).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// A write to a peer that makes no progress for this long fails.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a replaced version stays readable after a newer one was acknowledged, by default:
/// a GET that chose the old version (an S3 download of a large object at a slow client's pace)
/// has this long to finish. `NodeConfig::retire_grace` sets it.
pub const RETIRE_GRACE_DEFAULT: Duration = Duration::from_secs(10 * 60);
/// How often each drive makes its unsynced finalizes durable, and deletes retained versions
/// whose grace has passed (at most [`RETIRED_PER_ROUND_MAX`] per round).
const RETIRE_INTERVAL: Duration = Duration::from_secs(1);
const RETIRED_PER_ROUND_MAX: usize = 1000;

/// What starting a node can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("unknown node id {id:?}: the cluster map has {known}")]
    UnknownNode { id: String, known: String },
    #[error("cannot listen on {addr}: {source}{hint}", hint = if source.kind() == std::io::ErrorKind::AddrInUse { " (is another node running on this port?)" } else { "" })]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("drive {idx} of node {id}: {source}")]
    Drive { id: String, idx: usize, source: chunkstore::Error },
    #[error("refusing to start: {0}")]
    Secret(proto::Error),
    #[error(
        "refusing to start: drive {idx} of node {id} ({path}) belongs to cluster {theirs}, the map is of cluster {ours} (wrong --config?)"
    )]
    ForeignDrive { id: String, idx: usize, path: std::path::PathBuf, theirs: String, ours: String },
    #[error("refusing to start: {0}")]
    Tls(nodetls::Error),
}

/// Creates and formats every drive directory of every node in `map` (on this machine), so the
/// nodes can open them. Idempotent.
pub fn format_drives(map: &ClusterMap) -> Result<(), Error> {
    for node in &map.nodes {
        format_node_drives(map, &node.id)?;
    }
    Ok(())
}

/// Creates, formats and labels the drive directories of node `node_id`, as drives of a new
/// cluster (no rebuild): the first start of a node on its own host. Refuses, changing
/// nothing, if any of them belongs to another cluster. Idempotent.
pub fn format_node_drives(map: &ClusterMap, node_id: &str) -> Result<(), Error> {
    let node_idx = map.node_idx(node_id).ok_or_else(|| unknown_node(map, node_id))?;
    let paths = check_drive_labels(map, node_idx)?;
    for (drive_idx, path) in paths.iter().enumerate() {
        let drive_error = |source| Error::Drive { id: node_id.to_owned(), idx: drive_idx, source };
        Drive::format(path).map_err(drive_error)?;
        Drive::set_label(path, &map.cluster_id).map_err(drive_error)?;
    }
    Ok(())
}

fn unknown_node(map: &ClusterMap, id: &str) -> Error {
    let known = map.nodes.iter().map(|n| n.id.as_str()).collect::<Vec<_>>().join(", ");
    Error::UnknownNode { id: id.to_owned(), known }
}

/// The drive directories of node `node_idx`, after checking that none is labelled with
/// another cluster's id (reads only).
fn check_drive_labels(map: &ClusterMap, node_idx: usize) -> Result<Vec<std::path::PathBuf>, Error> {
    let node = &map.nodes[node_idx];
    let mut paths = Vec::with_capacity(node.drives.len());
    for drive_idx in 0..node.drives.len() {
        let path = map.drive_path(cluster::DriveRef { node_idx, drive_idx });
        let label =
            Drive::label(&path).map_err(|source| Error::Drive { id: node.id.clone(), idx: drive_idx, source })?;
        if let Some(theirs) = label.filter(|label| *label != map.cluster_id) {
            let (id, ours) = (node.id.clone(), map.cluster_id.clone());
            return Err(Error::ForeignDrive { id, idx: drive_idx, path, theirs, ours });
        }
        paths.push(path);
    }
    Ok(paths)
}

/// Writes a `cluster.toml` crash-safe (the old file or the new one, never a mix) with mode 0600:
/// it holds the cluster secret. What a node does with a map update; `tessera init` and
/// `tessera map push` too.
pub fn write_map_file(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    chunkstore::write_durably(path, text.as_bytes(), 0o600)
}

/// Everything a node needs to start.
#[derive(Debug)]
pub struct NodeConfig {
    pub map: ClusterMap,
    /// The `cluster.toml` text, served to clients that bootstrap from this node.
    pub map_text: String,
    /// Where `map_text` came from: map updates are written there. `None` keeps them in memory.
    pub map_path: Option<std::path::PathBuf>,
    pub node_id: String,
    /// Address to listen on; `None` listens on the node's address in the map. (The map's
    /// address is what peers and clients dial: behind NAT or in a container it differs.)
    pub listen: Option<SocketAddr>,
    /// How long replaced versions stay after a newer one is acknowledged
    /// ([`RETIRE_GRACE_DEFAULT`]).
    pub retire_grace: Duration,
    /// How often the scrubber passes over the drives ([`SCRUB_INTERVAL_DEFAULT`]), and how
    /// often a pass is deep ([`DEEP_SCRUB_INTERVAL_DEFAULT`]).
    pub scrub_interval: Duration,
    pub deep_scrub_interval: Duration,
    /// How long the scrubber watches a failed write's leftover before it removes it
    /// ([`LEFTOVER_GC_AFTER_DEFAULT`]): longer than any writer takes to decide.
    pub leftover_gc_after: Duration,
    /// Bytes one near-data query may hold in the node's engine (DataFusion's memory pool:
    /// sorts, aggregates, buffered batches); a query that needs more fails with a clear error
    /// and the node goes on ([`QUERY_MEMORY_DEFAULT`]).
    pub query_memory_bytes: usize,
    /// How often a near-data query with nothing to send says it is alive
    /// ([`QUERY_HEARTBEAT_DEFAULT`]); at most a quarter of `client::QUERY_SILENCE_MAX`.
    pub query_heartbeat: Duration,
    /// Tell the kernel about every range of a batched read before sending the first
    /// (`POSIX_FADV_WILLNEED`), so their disk reads run at the device's queue depth instead of
    /// one page fault at a time. On unless `tessera node --no-read-hints`.
    pub read_hints: bool,
}

/// How often a query scanning without results sends a heartbeat unless `tessera node
/// --query-heartbeat` says otherwise.
pub const QUERY_HEARTBEAT_DEFAULT: Duration = Duration::from_secs(5);

/// What one near-data query may hold on a node unless `tessera node --query-memory` says
/// otherwise: at most 4 run at once, so 1 GiB in all.
pub const QUERY_MEMORY_DEFAULT: usize = 256 << 20;

/// Renders a node's metrics ([`Server::metrics`]).
#[derive(Clone, Debug)]
pub struct Metrics {
    state: Arc<State>,
}

impl Metrics {
    /// The node's metrics in the Prometheus text format (OpenMetrics), as of now.
    pub fn render(&self) -> String {
        metrics::render(&self.state)
    }
}

/// A bound node, ready to serve.
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    state: Arc<State>,
}

#[derive(Debug)]
struct State {
    node_id: String,
    node_idx: usize,
    /// The cluster map this node serves under; updated by admins and from peers.
    map: map::MapHolder,
    /// The background repair's mode and byte budget.
    repair: repair::Control,
    /// Per drive, in order.
    repair_stats: Vec<repair::DriveStats>,
    secret: String,
    drives: Vec<Drive>,
    /// Per drive: being rebuilt (wiped or replaced); readers skip it meanwhile.
    rebuilding: Vec<AtomicBool>,
    /// Per drive: bumped by every `drive replace`, so a rebuild pass that began before it
    /// does not clear the mark.
    rebuild_generation: Vec<AtomicU64>,
    /// Per drive: held while a replace wipes it and while a rebuild clears its mark or saves
    /// its cursor, so neither acts on a generation the other just changed.
    rebuild_locks: Vec<Mutex<()>>,
    rebuild_stats: Vec<rebuild::Stats>,
    scrub_stats: scrub::Stats,
    /// The first scrub pass starts at once (the repair queue lost entries).
    scrub_soon: bool,
    scrub_interval: Duration,
    deep_scrub_interval: Duration,
    leftover_gc_after: Duration,
    retire_grace: Duration,
    /// Authenticated connections being served.
    connections: AtomicUsize,
    /// Connections in their handshake, oldest first, by accept number.
    pending: Mutex<VecDeque<(u64, TcpStream)>>,
    /// Near-data queries: their runtime and turns.
    queries: query::Queries,
    /// `NodeConfig::read_hints`.
    read_hints: bool,
    /// When the node began serving, for its uptime.
    started: std::time::Instant,
    /// Requests and bytes served, for metrics.
    counters: metrics::Counters,
    /// The node protocol's TLS, when the map has a cluster CA.
    tls: Option<Tls>,
}

/// A node's TLS configurations: serving (its own certificate, issued at start) and calling
/// peers (trusting the cluster CA).
#[derive(Debug)]
struct Tls {
    server: Arc<rustls::ServerConfig>,
    client: Arc<rustls::ClientConfig>,
}

/// The cluster CA expiring within this long is logged as a warning at start.
const CA_EXPIRY_WARNING: Duration = Duration::from_secs(30 * 24 * 3600);

/// The node's TLS from the map's CA, checked (valid now, key and certificate a pair).
fn node_tls(map: &ClusterMap) -> Result<Option<Tls>, Error> {
    let Some(pem) = &map.node_tls else {
        return Ok(None);
    };
    let ca = nodetls::ClusterCa::from_pem(pem.ca_cert.clone(), pem.ca_key.clone());
    let now = std::time::SystemTime::now();
    let not_after = ca.check(now).map_err(Error::Tls)?;
    if not_after.duration_since(now).unwrap_or_default() < CA_EXPIRY_WARNING {
        tracing::warn!(
            "the cluster CA (node_tls in cluster.toml) expires within 30 days; nodes refuse to start once it has"
        );
    }
    let server = nodetls::server_config(&ca, now).map_err(Error::Tls)?;
    let client = nodetls::client_config(ca.cert_pem()).map_err(Error::Tls)?;
    Ok(Some(Tls { server, client }))
}

/// Setting names on the node's first drive.
const SETTING_REPAIR_PAUSED: &str = "repair.paused";
pub(crate) const SETTING_REPAIR_RATE: &str = "repair.bytes_per_s";

/// The repair mode and budget an admin last set (defaults otherwise). Unreadable settings are
/// logged and replaced by the defaults: the node starts either way.
fn repair_settings(drive: &Drive) -> (repair::Mode, u64) {
    let read = |name| {
        drive.setting(name).unwrap_or_else(|e| {
            tracing::error!(error = %e, setting = name, "cannot read a node setting; using the default");
            None
        })
    };
    let paused = read(SETTING_REPAIR_PAUSED).is_some_and(|v| v == b"1");
    let rate = read(SETTING_REPAIR_RATE)
        .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
        .map(u64::from_le_bytes)
        .filter(|rate| *rate > 0)
        .unwrap_or(REPAIR_BYTES_PER_S_DEFAULT);
    (if paused { repair::Mode::Paused } else { repair::Mode::Running }, rate)
}

impl State {
    /// What `tessera status` shows of this node. A drive that cannot tell its space or
    /// version count says why instead (the node still answers).
    fn info(&self) -> proto::NodeInfo {
        let drives = self
            .drives
            .iter()
            .enumerate()
            .map(|(idx, drive)| {
                let mut info = proto::DriveInfo { rebuilding: self.is_rebuilding(idx), ..Default::default() };
                match drive.space() {
                    Ok((free, total)) => (info.free_bytes, info.total_bytes) = (free, total),
                    Err(e) => info.problem = Some(e.to_string()),
                }
                match drive.version_count() {
                    Ok(count) => info.versions = Some(count),
                    Err(e) => info.problem = Some(e.to_string()),
                }
                info.errors = drive.errors();
                info
            })
            .collect();
        proto::NodeInfo {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            uptime_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            map_version: self.map.version(),
            connections: self.connections.load(Ordering::Relaxed) as u64,
            drives,
        }
    }

    /// Whether drive `idx` is being rebuilt: it answers metadata requests as unavailable.
    fn is_rebuilding(&self, idx: usize) -> bool {
        self.rebuilding.get(idx).is_some_and(|r| r.load(Ordering::SeqCst))
    }

    /// Applies and persists an admin's repair change.
    fn control_repair(&self, action: proto::RepairAction) -> Result<(), chunkstore::Error> {
        let (mode, rate) = self.repair.get();
        let (mode, rate) = match action {
            proto::RepairAction::Pause => (repair::Mode::Paused, rate),
            proto::RepairAction::Resume => (repair::Mode::Running, rate),
            proto::RepairAction::SetRate { bytes_per_s } => (mode, bytes_per_s),
        };
        let drive = &self.drives[0];
        drive.set_setting(SETTING_REPAIR_PAUSED, if mode == repair::Mode::Paused { b"1" } else { b"0" })?;
        drive.set_setting(SETTING_REPAIR_RATE, &rate.to_le_bytes())?;
        self.repair.set(mode, rate);
        tracing::info!(?mode, bytes_per_s = rate, "repair settings changed");
        Ok(())
    }
}

/// Whether `path` is a directory with nothing in it.
fn is_empty_dir(path: &std::path::Path) -> bool {
    std::fs::read_dir(path).is_ok_and(|mut entries| entries.next().is_none())
}

/// Lowers the calling thread (and the threads it starts, which inherit it) to `SCHED_IDLE`:
/// the repair, scrub and rebuild threads, and the threads serving their reads on peers. They
/// run on CPU that requests leave idle ("foreground first"), paced only by the repair budget;
/// under a load that keeps every core busy they wait. A nice value is not enough: weights add
/// up, and sixteen rebuild threads at nice 10 outweigh one request thread at nice 0.
fn background_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: gettid has no preconditions; sched_setscheduler reads `param` only during the
    // call, and pid = this thread's id changes this thread only.
    let rc = unsafe { libc::sched_setscheduler(libc::gettid(), libc::SCHED_IDLE, &param) };
    if rc != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "cannot lower the priority of a background thread");
    }
}

/// Every [`RETIRE_INTERVAL`]: makes deferred commits and finalizes durable and deletes the
/// retained versions whose grace has passed.
fn retire_loop(state: &State) {
    loop {
        std::thread::sleep(RETIRE_INTERVAL);
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        for drive in &state.drives {
            if let Err(e) = drive.sync_deferred() {
                tracing::error!(drive = %drive.root().display(), error = %e, "could not make finalized versions durable");
            }
            match drive.retire_expired(now_ms, RETIRED_PER_ROUND_MAX) {
                Ok(0) => {}
                Ok(retired) => tracing::debug!(drive = %drive.root().display(), retired, "retired replaced versions"),
                Err(e) => {
                    tracing::error!(drive = %drive.root().display(), error = %e, "could not retire replaced versions")
                }
            }
        }
    }
}

/// One of the [`CONNECTIONS_MAX`] authenticated-connection slots, given back on drop.
struct ConnectionSlot<'a>(&'a AtomicUsize);

impl Drop for ConnectionSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl State {
    /// A slot for an authenticated connection, or `None` at [`CONNECTIONS_MAX`].
    fn connection_slot(&self) -> Option<ConnectionSlot<'_>> {
        let open = self.connections.fetch_add(1, Ordering::SeqCst);
        let slot = ConnectionSlot(&self.connections);
        (open < CONNECTIONS_MAX).then_some(slot)
    }

    /// Registers a connection entering its handshake; when all pending slots are taken, shuts
    /// the oldest pending connection down (its thread then ends on a failed read).
    fn add_pending(&self, id: u64, stream: &TcpStream) {
        let mut pending = self.pending.lock().expect("pending lock poisoned");
        if pending.len() >= PENDING_HANDSHAKES_MAX
            && let Some((_, oldest)) = pending.pop_front()
        {
            // The evicted peer sees its connection closed; nothing else to do if that fails.
            let _ = oldest.shutdown(Shutdown::Both);
        }
        match stream.try_clone() {
            Ok(clone) => pending.push_back((id, clone)),
            // Without a handle it cannot be evicted, but its handshake deadline still holds.
            Err(e) => tracing::warn!(error = %e, "could not track a pending handshake"),
        }
        assert!(pending.len() <= PENDING_HANDSHAKES_MAX);
    }

    /// The TLS configuration for calls to peers, when the node protocol runs over TLS.
    fn peer_tls(&self) -> Option<&Arc<rustls::ClientConfig>> {
        self.tls.as_ref().map(|tls| &tls.client)
    }

    fn remove_pending(&self, id: u64) {
        self.pending.lock().expect("pending lock poisoned").retain(|(pending_id, _)| *pending_id != id);
    }
}

impl Server {
    /// Opens the node's drives (sweeping crash leftovers) and binds its address.
    pub fn bind(config: NodeConfig) -> Result<Self, Error> {
        let map = &config.map;
        let node_idx = map.node_idx(&config.node_id).ok_or_else(|| unknown_node(map, &config.node_id))?;
        proto::validate_secret(&map.secret).map_err(Error::Secret)?;
        let node = &map.nodes[node_idx];
        // Before anything on the drives changes: a node started with another cluster's map
        // stops here.
        let paths = check_drive_labels(map, node_idx)?;
        let mut drives = Vec::with_capacity(node.drives.len());
        let mut rebuilding = Vec::with_capacity(node.drives.len());
        let mut scrub_soon = false;
        for (drive_idx, path) in paths.into_iter().enumerate() {
            let drive_error = |source| Error::Drive { id: config.node_id.clone(), idx: drive_idx, source };
            let fresh = is_empty_dir(&path);
            if fresh {
                // A wiped or replaced disk mounted where the drive was: format it and rebuild it.
                // A missing directory stays an error (a typo in cluster.toml, an unmounted disk
                // whose mount point is gone), and so does one with other files in it.
                Drive::format(&path).map_err(drive_error)?;
            }
            let drive = Drive::open(&path).map_err(drive_error)?;
            if Drive::label(&path).map_err(drive_error)?.is_none() {
                Drive::set_label(&path, &map.cluster_id).map_err(drive_error)?;
            }
            if fresh {
                rebuild::mark(&drive).map_err(drive_error)?;
                tracing::warn!(drive = drive_idx, path = %path.display(), "empty drive directory: formatted; rebuilding it from its set (readers skip it meanwhile)");
            }
            match drive.drop_corrupt_repairs() {
                Ok(0) => {}
                Ok(dropped) => {
                    tracing::error!(
                        drive = drive_idx,
                        dropped,
                        "corrupt repair-queue entries dropped; scrubbing soon to find them again"
                    );
                    scrub_soon = true;
                }
                Err(e) => tracing::error!(drive = drive_idx, error = %e, "cannot check the repair queue"),
            }
            rebuilding.push(AtomicBool::new(rebuild::is_marked(&drive)));
            drives.push(drive);
        }
        let tls = node_tls(map)?;
        let listen = config.listen.unwrap_or(node.addr);
        let listener = TcpListener::bind(listen).map_err(|source| Error::Bind { addr: listen, source })?;
        let (mode, bytes_per_s) = repair_settings(&drives[0]);
        let repair_stats = drives.iter().map(|_| repair::DriveStats::default()).collect();
        let state = State {
            node_id: config.node_id,
            node_idx,
            secret: map.secret.clone(),
            map: map::MapHolder::new(config.map, config.map_text, config.map_path),
            repair: repair::Control::new(mode, bytes_per_s),
            repair_stats,
            rebuild_generation: drives.iter().map(|_| AtomicU64::new(0)).collect(),
            rebuild_locks: drives.iter().map(|_| Mutex::new(())).collect(),
            rebuild_stats: drives.iter().map(|_| rebuild::Stats::default()).collect(),
            drives,
            rebuilding,
            scrub_stats: scrub::Stats::default(),
            scrub_soon,
            scrub_interval: config.scrub_interval,
            deep_scrub_interval: config.deep_scrub_interval,
            leftover_gc_after: config.leftover_gc_after,
            retire_grace: config.retire_grace,
            connections: AtomicUsize::new(0),
            pending: Mutex::new(VecDeque::new()),
            queries: query::Queries::new(config.query_memory_bytes, config.query_heartbeat),
            read_hints: config.read_hints,
            started: std::time::Instant::now(),
            counters: metrics::Counters::default(),
            tls,
        };
        Ok(Self { listener, state: Arc::new(state) })
    }

    /// A handle that renders this node's metrics, usable while [`Server::serve`] runs.
    pub fn metrics(&self) -> Metrics {
        Metrics { state: Arc::clone(&self.state) }
    }

    /// The address the node listens on.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accepts and serves connections until the process exits.
    pub fn serve(self) -> std::io::Result<()> {
        tracing::info!(node = %self.state.node_id, addr = %self.listener.local_addr()?, drives = self.state.drives.len(), tls = self.state.tls.is_some(), "node ready");
        let mapper = Arc::clone(&self.state);
        std::thread::Builder::new().name("map".into()).spawn(move || map::worker(&mapper))?;
        let retirer = Arc::clone(&self.state);
        std::thread::Builder::new().name("retire".into()).spawn(move || retire_loop(&retirer))?;
        let repairer = Arc::clone(&self.state);
        std::thread::Builder::new().name("repair".into()).spawn(move || {
            background_priority();
            repair::worker(&repairer)
        })?;
        let scrubber = Arc::clone(&self.state);
        std::thread::Builder::new().name("scrub".into()).spawn(move || {
            background_priority();
            scrub::worker(&scrubber)
        })?;
        let rebuilder = Arc::clone(&self.state);
        std::thread::Builder::new().name("rebuild".into()).spawn(move || {
            background_priority();
            rebuild::worker(&rebuilder)
        })?;
        let mut accepted = 0u64;
        for stream in self.listener.incoming() {
            let stream = match stream {
                Ok(stream) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            };
            accepted += 1;
            let id = accepted;
            self.state.add_pending(id, &stream);
            let state = Arc::clone(&self.state);
            let spawned = std::thread::Builder::new().name("conn".into()).spawn(move || {
                connection::serve(stream, &state, || state.remove_pending(id));
            });
            if let Err(e) = spawned {
                self.state.remove_pending(id);
                tracing::warn!(error = %e, "could not start a connection thread");
            }
        }
        Ok(())
    }
}
