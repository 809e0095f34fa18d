//! The node's cluster map: the version it serves under, admins' updates ([`Request::MapPut`]),
//! and catching up with peers that hold a newer one.
//!
//! A map changes only as an admin operation that writes version v+1 to every node, each node
//! checking that it holds v (`client::Client::push_map`); no node changes the map on its own.
//! A node that missed an update (down at the time) learns of it when a client or peer connects
//! with a newer version, when a peer answers with a newer one, and every
//! [`CATCH_UP_INTERVAL`]; it then fetches the newest map from its peers and takes it if it
//! descends from its own (`cluster::ClusterMap::check_descendant`).
//!
//! [`Request::MapPut`]: proto::Request::MapPut

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::Duration;

use cluster::ClusterMap;
use proto::{Request, Response};

use crate::State;
use crate::peer::Peer;

/// How often a node asks its peers for a newer map even if nothing hinted at one.
pub(crate) const CATCH_UP_INTERVAL: Duration = Duration::from_secs(300);
/// Least time between two rounds of asking the peers: hints (any connection that names a newer
/// version, which a stale or hostile peer can send often) cost at most one round per second.
const CATCH_UP_GAP: Duration = Duration::from_secs(1);

/// Why a map update was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MapError {
    #[error("this node holds map version {held}, the update expected {expected}")]
    Conflict { held: u64, expected: u64 },
    #[error("{0}")]
    Invalid(#[from] cluster::Error),
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
}

/// The map a node serves under, swapped whole on an update.
#[derive(Debug)]
pub(crate) struct MapHolder {
    current: RwLock<(Arc<ClusterMap>, Arc<str>)>,
    /// `current`'s version, read on every request without the lock.
    version: AtomicU64,
    /// Where the node's `cluster.toml` is: updates are written there before they apply.
    path: Option<PathBuf>,
    /// Held across an update, so two admins' updates apply one after the other.
    updating: Mutex<()>,
    /// Set when a newer map was seen somewhere; wakes the catch-up thread.
    newer_seen: Mutex<bool>,
    wake: Condvar,
}

impl MapHolder {
    pub(crate) fn new(map: ClusterMap, text: String, path: Option<PathBuf>) -> Self {
        let version = map.version;
        Self {
            current: RwLock::new((Arc::new(map), Arc::from(text))),
            version: AtomicU64::new(version),
            path,
            updating: Mutex::new(()),
            newer_seen: Mutex::new(false),
            wake: Condvar::new(),
        }
    }

    pub(crate) fn get(&self) -> Arc<ClusterMap> {
        Arc::clone(&self.current.read().expect("map lock poisoned").0)
    }

    pub(crate) fn text(&self) -> Arc<str> {
        Arc::clone(&self.current.read().expect("map lock poisoned").1)
    }

    pub(crate) fn version(&self) -> u64 {
        self.version.load(Ordering::SeqCst)
    }

    /// An admin's update: `text` replaces the map if the node holds `expected_version` and
    /// the new map is its successor. `Ok(false)`: the node held exactly this map already.
    pub(crate) fn put(&self, expected_version: u64, text: &str) -> Result<bool, MapError> {
        let _updating = self.updating.lock().expect("map update lock poisoned");
        let current = self.get();
        let next = ClusterMap::from_toml(text, &current.base_dir)?;
        if next == *current {
            return Ok(false);
        }
        if current.version != expected_version {
            return Err(MapError::Conflict { held: current.version, expected: expected_version });
        }
        current.check_successor(&next)?;
        self.install(next, text)?;
        Ok(true)
    }

    /// Takes `text` if it is a newer map that descends from the node's; whether it did.
    fn take_if_newer(&self, text: &str) -> Result<bool, MapError> {
        let _updating = self.updating.lock().expect("map update lock poisoned");
        let current = self.get();
        let next = ClusterMap::from_toml(text, &current.base_dir)?;
        if next.version <= current.version {
            return Ok(false);
        }
        current.check_descendant(&next)?;
        self.install(next, text)?;
        Ok(true)
    }

    /// Writes the map durably (when the node has a file), then serves under it.
    fn install(&self, next: ClusterMap, text: &str) -> Result<(), MapError> {
        if let Some(path) = &self.path {
            crate::write_map_file(path, text).map_err(|source| MapError::Write { path: path.clone(), source })?;
        }
        let version = next.version;
        *self.current.write().expect("map lock poisoned") = (Arc::new(next), Arc::from(text));
        self.version.store(version, Ordering::SeqCst);
        tracing::info!(version, "cluster map updated");
        Ok(())
    }

    /// A client or peer holds a newer map than this node: fetch it from the peers soon.
    pub(crate) fn newer_seen(&self) {
        *self.newer_seen.lock().expect("map hint lock poisoned") = true;
        self.wake.notify_one();
    }

    /// Waits until a newer map was seen or `timeout` passed.
    fn wait_for_hint(&self, timeout: Duration) {
        let seen = self.newer_seen.lock().expect("map hint lock poisoned");
        let (mut seen, _) = self.wake.wait_timeout_while(seen, timeout, |seen| !*seen).expect("map hint lock poisoned");
        *seen = false;
    }
}

/// The catch-up thread: at start, when hinted, and every [`CATCH_UP_INTERVAL`], asks every
/// peer for its map and takes the newest one that descends from the node's.
pub(crate) fn worker(state: &State) {
    loop {
        catch_up(state);
        std::thread::sleep(CATCH_UP_GAP);
        state.map.wait_for_hint(CATCH_UP_INTERVAL);
    }
}

/// Creates on this node's drives every bucket that a majority of the namespace pool's nodes
/// hold (`holders` counts them; `ClusterMap::namespace_pool`, pool 1 until it is removed): a node of a newly added
/// pool, or one that was down when a bucket was created, takes them from its peers. A bucket
/// that majority lacks is left alone.
fn take_buckets(state: &State, map: &ClusterMap, holders: &BTreeMap<String, usize>) {
    let majority = map.pool_nodes(map.namespace_pool()).len() / 2 + 1;
    // The names come from authenticated peers' drives (internal buckets included).
    for (bucket, _) in holders.iter().filter(|(_, count)| **count >= majority) {
        for (drive_idx, drive) in state.drives.iter().enumerate() {
            // A drive being rebuilt takes its buckets from its set; one that cannot tell is left.
            if state.is_rebuilding(drive_idx) || drive.has_bucket(bucket).unwrap_or(true) {
                continue;
            }
            match drive.create_bucket(bucket) {
                Ok(()) => tracing::info!(bucket, drive = drive_idx, "took a bucket its peers hold"),
                Err(e) => {
                    tracing::warn!(bucket, drive = drive_idx, error = %e, "cannot create a bucket its peers hold")
                }
            }
        }
    }
}

fn catch_up(state: &State) {
    let map = state.map.get();
    let mut newest: Option<(u64, String)> = None;
    // Buckets each answering node of the namespace pool holds (see `take_buckets`).
    let mut holders: BTreeMap<String, usize> = BTreeMap::new();
    let namespace = map.pool_nodes(map.namespace_pool());
    for (node_idx, node) in map.nodes.iter().enumerate().filter(|(idx, _)| *idx != state.node_idx) {
        let answer = Peer::connect(node.addr, &map, state.peer_tls()).and_then(|(mut peer, held)| {
            if held <= map.version {
                // Same map (or the peer is behind and catches up from this connection).
                if !namespace.contains(&node_idx) {
                    return Ok(None);
                }
                match peer.call(&Request::BucketList)? {
                    Response::Buckets { buckets } => {
                        for bucket in buckets {
                            *holders.entry(bucket.name).or_default() += 1;
                        }
                    }
                    other => tracing::debug!(peer = %node.id, answer = ?other, "cannot list a peer's buckets"),
                }
                return Ok(None);
            }
            if newest.as_ref().is_some_and(|(v, _)| *v >= held) {
                return Ok(None);
            }
            match peer.call(&Request::GetMap)? {
                Response::Map { toml } => Ok(Some((held, toml))),
                other => Err(crate::peer::PeerError::Unexpected { addr: node.addr, answer: format!("{other:?}") }),
            }
        });
        match answer {
            Ok(Some(found)) => newest = Some(found),
            Ok(None) => {}
            Err(e) => tracing::debug!(peer = %map.nodes[node_idx].id, error = %e, "cannot compare maps with a peer"),
        }
    }
    take_buckets(state, &map, &holders);
    let Some((version, text)) = newest else {
        return;
    };
    match state.map.take_if_newer(&text) {
        Ok(true) => tracing::info!(version, "took a newer cluster map from a peer"),
        Ok(false) => {}
        Err(e) => tracing::error!(version, error = %e, "a peer holds a newer cluster map this node cannot take"),
    }
}
