//! The client side of a near-data query's node exchange ([`proto::Request::Query`]): one
//! request to one node, then its answer frame by frame. Planning (which row groups go to which
//! node) and merging belong to the `query` crate; this module only moves the bytes.

use std::time::Duration;

use proto::{AggregateSpec, QueryObject, RecordFormat, RecordObject, Request, Response, ScanSpec};

use crate::conn::Conn;
use crate::{Client, Error, ObjectInfo};

/// How long a node may stay silent in a query: a node that says nothing for longer is taken
/// for hung. A node scanning row groups none of which match sends a heartbeat (an empty
/// [`Response::QueryData`]) every `tessera node --query-heartbeat` (5 s by default, at most a
/// quarter of this), so only a node that stopped working goes silent.
pub const QUERY_SILENCE_MAX: Duration = Duration::from_secs(120);

/// What a node read to answer a query.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueryStats {
    /// Rows that matched.
    pub rows: u64,
    /// Bytes the node read from its own drives and from its peers.
    pub local_bytes: u64,
    pub peer_bytes: u64,
}

/// A node's answer to a query, read as it comes. Dropping it before the end closes the
/// connection, which stops the query on the node.
#[derive(Debug)]
pub struct QueryReply {
    client: Client,
    node_idx: usize,
    conn: Option<Conn>,
    stats: Option<QueryStats>,
    heartbeats: u64,
}

impl QueryReply {
    /// The next piece of the node's Arrow IPC stream; `None` once the node said it is done
    /// (then [`QueryReply::stats`] holds what it read).
    pub async fn next(&mut self) -> Result<Option<Vec<u8>>, Error> {
        let Some(conn) = self.conn.as_mut() else {
            return Ok(None);
        };
        let node = self.client.topo.map.nodes[self.node_idx].id.clone();
        let silence = |node: &String| Error::Timeout { node: node.clone(), timeout: QUERY_SILENCE_MAX };
        let step = async {
            loop {
                let response = tokio::time::timeout(QUERY_SILENCE_MAX, conn.read_response())
                    .await
                    .map_err(|_| silence(&node))??;
                match response {
                    // A heartbeat: the node is scanning and has found nothing to send yet.
                    Response::QueryData { len: 0, .. } => self.heartbeats += 1,
                    Response::QueryData { len, crc } if len as usize <= proto::QUERY_DATA_BYTES_MAX => {
                        let mut bytes = vec![0u8; len as usize];
                        tokio::time::timeout(QUERY_SILENCE_MAX, conn.read_exact(&mut bytes))
                            .await
                            .map_err(|_| silence(&node))??;
                        if crc32c::crc32c(&bytes) != crc {
                            return Err(Error::Node {
                                node: node.clone(),
                                kind: proto::ErrorKind::ChecksumMismatch,
                                message: "query result damaged in transit".into(),
                            });
                        }
                        return Ok(Some(bytes));
                    }
                    Response::QueryDone { rows, local_bytes, peer_bytes } => {
                        self.stats = Some(QueryStats { rows, local_bytes, peer_bytes });
                        return Ok(None);
                    }
                    Response::Error { kind, message } => return Err(Error::Node { node: node.clone(), kind, message }),
                    other => return Err(conn.unexpected(&other)),
                }
            }
        };
        let result = step.await;
        match &result {
            Ok(Some(_)) => {}
            Ok(None) => {
                // A clean end: the connection can serve again.
                let conn = self.conn.take().expect("checked above");
                let pool = &self.client.topo.pools[self.node_idx];
                pool.put_back(conn, self.client.inner.options.idle_connections_per_node_max);
            }
            // The node answered the query with an error between frames: the connection is
            // still in step and goes back too.
            Err(Error::Node { kind, .. }) if *kind != proto::ErrorKind::ChecksumMismatch => {
                let conn = self.conn.take().expect("checked above");
                let pool = &self.client.topo.pools[self.node_idx];
                pool.put_back(conn, self.client.inner.options.idle_connections_per_node_max);
            }
            Err(e) => {
                self.conn = None;
                // A node silent for long may be overloaded, not down (it sends heartbeats while
                // it scans): only a broken connection marks it down.
                if matches!(e, Error::NodeUnreachable { .. } | Error::Protocol { .. }) {
                    self.client.topo.pools[self.node_idx].mark_down(e);
                }
            }
        }
        result
    }

    /// What the node read, once it finished.
    pub fn stats(&self) -> Option<QueryStats> {
        self.stats
    }

    /// Heartbeats the node sent so far (it was scanning with nothing to send).
    pub fn heartbeats(&self) -> u64 {
        self.heartbeats
    }
}

impl Client {
    /// Sends a near-data query to node `node` (its id in the map): `scan` over the row groups
    /// of `objects`, each naming a drive of that node holding the version; with `aggregate`,
    /// the node answers a partial aggregate of the matching rows ([`Request::AggregateQuery`]).
    pub async fn query_node(
        &self,
        node: &str,
        scan: ScanSpec,
        aggregate: Option<AggregateSpec>,
        objects: Vec<QueryObject>,
    ) -> Result<QueryReply, Error> {
        let request = match aggregate {
            Some(aggregate) => Request::AggregateQuery { scan, aggregate, objects },
            None => Request::Query { scan, objects },
        };
        self.send_query(node, request).await
    }

    /// Sends a near-data query over records to node `node`: `scan` (with `aggregate`, a partial
    /// aggregate) over the records of `objects` that start in their splits, decoded as `format`
    /// says into a table of `schema` (an Arrow IPC stream of the schema alone).
    pub async fn query_node_records(
        &self,
        node: &str,
        scan: ScanSpec,
        aggregate: Option<AggregateSpec>,
        format: RecordFormat,
        schema: Vec<u8>,
        objects: Vec<RecordObject>,
    ) -> Result<QueryReply, Error> {
        self.send_query(node, Request::RecordQuery { scan, aggregate, format, schema, objects }).await
    }

    async fn send_query(&self, node: &str, request: Request) -> Result<QueryReply, Error> {
        let node_idx = self
            .topo
            .map
            .node_idx(node)
            .ok_or_else(|| Error::NoSuchDrive(format!("no node {node} in the cluster map")))?;
        let pool = &self.topo.pools[node_idx];
        let options = &self.inner.options;
        let send = async {
            let mut conn = pool.get(options.connect_timeout, options.down_backoff).await?;
            conn.send_request(&request).await?;
            Ok::<_, Error>(conn)
        };
        let conn = match tokio::time::timeout(options.request_timeout, send).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => {
                if matches!(e, Error::NodeUnreachable { .. } | Error::Protocol { .. }) {
                    pool.mark_down(&e);
                }
                return Err(e);
            }
            Err(_) => {
                let error = Error::Timeout { node: pool.node.clone(), timeout: options.request_timeout };
                pool.mark_down(&error);
                return Err(error);
            }
        };
        Ok(QueryReply { client: self.clone(), node_idx, conn: Some(conn), stats: None, heartbeats: 0 })
    }

    /// Whether node `node` failed within the last `down_backoff` (reads plan around it).
    pub fn node_is_down(&self, node: &str) -> bool {
        let Some(idx) = self.topo.map.node_idx(node) else {
            return true;
        };
        self.topo.pools[idx].down_reason(self.inner.options.down_backoff).is_some()
    }
}

impl ObjectInfo {
    /// The set position holding the object byte at `offset` (of a single-piece object: one with
    /// a data file; `None` for a multipart object, an empty one or an offset past the end).
    pub fn position_of(&self, offset: u64) -> Option<usize> {
        if !self.meta.has_data_file() || offset >= self.meta.size {
            return None;
        }
        let geometry = self.meta.geometry();
        let offset = self.meta.stored_offset(offset);
        let stripe = offset / geometry.stripe_bytes();
        let chunk_len = geometry.chunk_len(stripe) as u64;
        let chunk = ((offset - geometry.stripe_offset(stripe)) / chunk_len) as usize;
        Some(self.placement.position(stripe, chunk))
    }
}
