//! The storage node: serves the node protocol (see `proto`) from its drives.
//!
//! Main types: [`NodeConfig`] and [`Server`]. One thread per connection, blocking sockets with
//! timeouts, at most [`CONNECTIONS_MAX`] connections. Chunk reads go from the data file to the
//! socket with `sendfile(2)`, never through a user-space buffer.
//!
//! Nodes never reconstruct on the read path: a chunk they cannot serve is reported per item as
//! missing, corrupt or unreadable, and the client decodes around it.
//!
//! ```ignore
//! let server = Server::bind(NodeConfig { map, map_text, node_id: "n1".into() })?;
//! server.serve()?; // runs until the process exits
//! ```

mod connection;

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chunkstore::Drive;
use cluster::ClusterMap;

/// Most connections served at once; further ones are closed on accept.
pub const CONNECTIONS_MAX: usize = 1024;
/// A connection with no request for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// The peer must authenticate within this time.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A write to a peer that makes no progress for this long fails.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// What starting a node can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("unknown node id {id:?}: the cluster map has {known}")]
    UnknownNode { id: String, known: String },
    #[error("cannot listen on {addr}: {source}{hint}", hint = if source.kind() == std::io::ErrorKind::AddrInUse { " (is another node running on this port?)" } else { "" })]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("drive {idx} of node {id}: {source}")]
    Drive { id: String, idx: usize, source: chunkstore::Error },
}

/// Creates and formats every drive directory of every node in `map` (on this machine), so the
/// nodes can open them. Idempotent.
pub fn format_drives(map: &ClusterMap) -> Result<(), Error> {
    for (node_idx, node) in map.nodes.iter().enumerate() {
        for drive_idx in 0..node.drives.len() {
            let path = map.drive_path(cluster::DriveRef { node_idx, drive_idx });
            Drive::format(&path).map_err(|source| Error::Drive { id: node.id.clone(), idx: drive_idx, source })?;
        }
    }
    Ok(())
}

/// Everything a node needs to start.
#[derive(Debug)]
pub struct NodeConfig {
    pub map: ClusterMap,
    /// The `cluster.toml` text, served to clients that bootstrap from this node.
    pub map_text: String,
    pub node_id: String,
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
    secret: String,
    map_text: String,
    drives: Vec<Drive>,
    connections: AtomicUsize,
}

impl Server {
    /// Opens the node's drives (sweeping crash leftovers) and binds its address.
    pub fn bind(config: NodeConfig) -> Result<Self, Error> {
        let map = &config.map;
        let node_idx = map.node_idx(&config.node_id).ok_or_else(|| Error::UnknownNode {
            id: config.node_id.clone(),
            known: map.nodes.iter().map(|n| n.id.as_str()).collect::<Vec<_>>().join(", "),
        })?;
        let node = &map.nodes[node_idx];
        let mut drives = Vec::with_capacity(node.drives.len());
        for drive_idx in 0..node.drives.len() {
            let path = map.drive_path(cluster::DriveRef { node_idx, drive_idx });
            let drive = Drive::open(&path).map_err(|source| Error::Drive {
                id: config.node_id.clone(),
                idx: drive_idx,
                source,
            })?;
            drives.push(drive);
        }
        let listener = TcpListener::bind(node.addr).map_err(|source| Error::Bind { addr: node.addr, source })?;
        let state = State {
            node_id: config.node_id,
            secret: map.secret.clone(),
            map_text: config.map_text,
            drives,
            connections: AtomicUsize::new(0),
        };
        Ok(Self { listener, state: Arc::new(state) })
    }

    /// The address the node listens on.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accepts and serves connections until the process exits.
    pub fn serve(self) -> std::io::Result<()> {
        tracing::info!(node = %self.state.node_id, addr = %self.listener.local_addr()?, drives = self.state.drives.len(), "node ready");
        for stream in self.listener.incoming() {
            let stream = match stream {
                Ok(stream) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            };
            let open = self.state.connections.fetch_add(1, Ordering::SeqCst);
            if open >= CONNECTIONS_MAX {
                self.state.connections.fetch_sub(1, Ordering::SeqCst);
                tracing::warn!(limit = CONNECTIONS_MAX, "connection limit reached; closing new connection");
                continue;
            }
            let state = Arc::clone(&self.state);
            let spawned = std::thread::Builder::new().name("conn".into()).spawn(move || {
                connection::serve(stream, &state);
                state.connections.fetch_sub(1, Ordering::SeqCst);
            });
            if let Err(e) = spawned {
                self.state.connections.fetch_sub(1, Ordering::SeqCst);
                tracing::warn!(error = %e, "could not start a connection thread");
            }
        }
        Ok(())
    }
}
