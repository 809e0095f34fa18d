//! One client connection: handshake, then a request/response loop.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt as _;
use std::sync::Arc;

use chunkstore::Drive;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use proto::{
    AuthProof, Challenge, ErrorKind, FRAME_HEADER_BYTES, FRAME_TAG_BYTES, FrameHeader, FrameKind, FrameMac, ItemStatus,
    ListEntry, NONCE_BYTES, PROTOCOL_VERSION, ReadItem, Request, Response, VersionId,
};
use rand::RngCore;

use crate::{CONNECTIONS_MAX, HANDSHAKE_TIMEOUT, IDLE_TIMEOUT, State, WRITE_TIMEOUT};

/// Why a connection ended early; logged where the connection is dropped.
#[derive(Debug, thiserror::Error)]
enum ConnError {
    #[error("I/O: {0}")]
    Io(#[from] io::Error),
    #[error("protocol: {0}")]
    Proto(#[from] proto::Error),
    #[error("unexpected {found:?} frame")]
    UnexpectedFrame { found: FrameKind },
    #[error("authentication failed (wrong cluster secret or protocol version)")]
    AuthFailed,
    #[error("the client's map is of cluster {theirs}, this node is in cluster {ours}")]
    WrongCluster { ours: String, theirs: String },
    #[error("the handshake did not finish within {HANDSHAKE_TIMEOUT:?}")]
    HandshakeTimeout,
    #[error("TLS handshake: {0}")]
    Tls(io::Error),
    #[error("a TLS client on a node without node TLS (a bootstrapping client tries TLS first)")]
    TlsClientOnPlainNode,
    #[error("the node already serves {CONNECTIONS_MAX} authenticated connections")]
    TooManyConnections,
}

/// An authenticated connection: the stream and the frame MACs of both directions.
struct Session {
    /// Plain TCP, or TLS when the cluster map has a CA (`nodetls`).
    stream: nodetls::Stream,
    /// Over TLS, chunk bytes go `pread` + write through this buffer instead of `sendfile`
    /// (at most [`TLS_SEND_BUFFER_BYTES`]; empty until the first such read).
    send_buffer: Vec<u8>,
    /// Checks frames from the client.
    inbound: FrameMac,
    /// Tags frames to the client.
    outbound: FrameMac,
    /// The version of the map the client plans with: once this node holds a newer one, it
    /// refuses the connection's requests with `StaleMap`.
    map_version: u64,
}

/// Serves one connection to its end: the handshake (while it holds a pending slot, released by
/// `handshake_done`), then requests. Staging files written on this connection and never
/// committed or aborted are dropped when it closes, so a client that dies mid-PUT leaves nothing.
pub(crate) fn serve(stream: TcpStream, state: &Arc<State>, handshake_done: impl FnOnce()) {
    let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    let handshake = handshake(stream, state);
    handshake_done();
    let mut session = match handshake {
        Ok(session) => session,
        Err(e) => {
            log_end(&peer, &e);
            return;
        }
    };
    let Some(_slot) = state.connection_slot() else {
        log_end(&peer, &ConnError::TooManyConnections);
        return;
    };
    let mut staged = HashSet::new();
    let result = serve_requests(&mut session, state, &mut staged);
    for (drive, version, staging) in staged {
        if let Err(e) = state.drives[drive].abort_staged(version, staging) {
            tracing::warn!(error = %e, "could not drop the staging file of an unfinished PUT");
        }
    }
    if let Err(e) = result {
        log_end(&peer, &e);
    }
}

fn log_end(peer: &str, error: &ConnError) {
    match error {
        // Port probes (`tessera up` waiting for nodes, repair's liveness check) connect and
        // close: over TLS that ends the TLS handshake early.
        ConnError::Io(e) | ConnError::Tls(e) if is_disconnect(e) => {}
        // Slow or evicted handshakes are what a flood of unauthenticated connections looks
        // like; one line each would flood the log as well.
        ConnError::HandshakeTimeout | ConnError::TlsClientOnPlainNode => {
            tracing::debug!(%peer, error = %error, "closing connection")
        }
        ConnError::Io(e) if e.kind() == io::ErrorKind::NotConnected => {
            tracing::debug!(%peer, "closing an evicted unauthenticated connection")
        }
        _ => tracing::warn!(%peer, error = %error, "closing connection"),
    }
}

fn is_disconnect(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe)
}

/// Authenticates the client within [`HANDSHAKE_TIMEOUT`] for the whole exchange (not per read,
/// so a peer dripping one byte at a time is cut off too) and derives the session's frame MACs.
/// Nothing larger than [`proto::HANDSHAKE_BODY_BYTES_MAX`] is allocated before that (over TLS, besides
/// rustls' own handshake buffers and one 16 KiB record read out of a TLS client on a plain node).
fn handshake(tcp: TcpStream, state: &State) -> Result<Session, ConnError> {
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    tcp.set_nodelay(true)?;
    tcp.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
    // With TLS, its handshake comes first, under the same deadline; the node protocol's
    // handshake then covers the connection's channel binding.
    let (mut stream, binding) = match &state.tls {
        Some(tls) => {
            let (stream, binding) = nodetls::Stream::accept(tcp, &tls.server, deadline).map_err(|e| {
                if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) {
                    ConnError::HandshakeTimeout
                } else {
                    ConnError::Tls(e)
                }
            })?;
            (stream, binding.to_vec())
        }
        None => (nodetls::Stream::Plain(tcp), Vec::new()),
    };
    let mut nonce = [0u8; NONCE_BYTES];
    rand::thread_rng().fill_bytes(&mut nonce);
    let map = state.map.get();
    let challenge = Challenge {
        protocol_version: PROTOCOL_VERSION,
        nonce,
        cluster_id: map.cluster_id.clone(),
        map_version: map.version,
    };
    stream.write_all(&proto::encode_frame(FrameKind::Challenge, &challenge)?)?;
    let mut header = [0u8; FRAME_HEADER_BYTES];
    read_exact_before(&mut stream, &mut header, deadline)?;
    // A TLS handshake record (a bootstrapping client probes for TLS, then asks again in plain).
    if !stream.is_tls() && header[0] == 0x16 {
        // Read the rest of its hello (the record's length is in bytes 3..5), so the close is a
        // FIN and not a reset that could discard the challenge before the client reads it.
        let record = 5 + usize::from(u16::from_be_bytes([header[3], header[4]]));
        // A TLS record holds at most 16 KiB (and the handshake slots bound how many run).
        let mut rest = vec![0u8; record.saturating_sub(FRAME_HEADER_BYTES).min(16 << 10)];
        let _ = read_exact_before(&mut stream, &mut rest, deadline);
        return Err(ConnError::TlsClientOnPlainNode);
    }
    let header = FrameHeader::decode(&header)?;
    if header.kind != FrameKind::Auth {
        return Err(ConnError::UnexpectedFrame { found: header.kind });
    }
    // FrameHeader::decode bounded an Auth body by HANDSHAKE_BODY_BYTES_MAX.
    let mut body = [0u8; proto::HANDSHAKE_BODY_BYTES_MAX];
    let body = &mut body[..header.body_len];
    read_exact_before(&mut stream, body, deadline)?;
    let auth: AuthProof = proto::decode_message(body, "authentication")?;
    if auth.protocol_version != PROTOCOL_VERSION
        || !proto::verify_client_proof(&state.secret, &auth.transcript(&challenge, &binding), &auth.proof)
    {
        return Err(ConnError::AuthFailed);
    }
    // An empty cluster id: a client bootstrapping, which may only ask for the map.
    if !auth.cluster_id.is_empty() && auth.cluster_id != map.cluster_id {
        return Err(ConnError::WrongCluster { ours: map.cluster_id.clone(), theirs: auth.cluster_id });
    }
    if auth.map_version > state.map.version() {
        state.map.newer_seen();
    }
    let (inbound, outbound) = proto::session_macs(&state.secret, &auth.transcript(&challenge, &binding));
    let mut session = Session { stream, send_buffer: Vec::new(), inbound, outbound, map_version: auth.map_version };
    // The first tagged frame proves to the client that this node knows the secret.
    session.send(&Response::Ok)?;
    session.stream.tcp().set_write_timeout(Some(WRITE_TIMEOUT))?;
    session.stream.tcp().set_read_timeout(Some(IDLE_TIMEOUT))?;
    Ok(session)
}

/// `read_exact` that fails with [`ConnError::HandshakeTimeout`] once `deadline` has passed.
fn read_exact_before(stream: &mut nodetls::Stream, buf: &mut [u8], deadline: Instant) -> Result<(), ConnError> {
    let mut filled = 0;
    while filled < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ConnError::HandshakeTimeout);
        }
        stream.tcp().set_read_timeout(Some(left))?;
        match stream.read(&mut buf[filled..]) {
            Ok(0) => return Err(ConnError::Io(io::ErrorKind::UnexpectedEof.into())),
            Ok(read) => filled += read,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err(ConnError::HandshakeTimeout);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

impl Session {
    /// Reads one tagged request frame; `None` on a clean end of stream between frames.
    fn read_request(&mut self) -> Result<Option<Vec<u8>>, ConnError> {
        let mut header = [0u8; FRAME_HEADER_BYTES];
        match self.stream.read(&mut header[..1])? {
            0 => return Ok(None),
            _ => self.stream.read_exact(&mut header[1..])?,
        }
        let decoded = FrameHeader::decode(&header)?;
        if decoded.kind != FrameKind::Request {
            return Err(ConnError::UnexpectedFrame { found: decoded.kind });
        }
        // The length was checked against CONTROL_BODY_BYTES_MAX by FrameHeader::decode, and
        // the peer is authenticated.
        let mut body = vec![0u8; decoded.body_len];
        self.stream.read_exact(&mut body)?;
        let mut tag = [0u8; FRAME_TAG_BYTES];
        self.stream.read_exact(&mut tag)?;
        self.inbound.open(&header, &body, &tag)?;
        Ok(Some(body))
    }

    fn send(&mut self, response: &Response) -> Result<(), ConnError> {
        self.stream.write_all(&proto::encode_sealed_frame(FrameKind::Response, response, &mut self.outbound)?)?;
        Ok(())
    }
}

fn serve_requests(session: &mut Session, state: &Arc<State>, staged: &mut HashSet<Staged>) -> Result<(), ConnError> {
    let mut chunk_buffer = Vec::new();
    while let Some(body) = session.read_request()? {
        let request = proto::decode_request(&body)?;
        state.counters.request(&request);
        let node_version = state.map.version();
        // Undoing this connection's own work needs no map: a drive index names the same drive
        // in every map the node may take (a map change never changes a node's drives). A
        // rollback refused here would leave a failed write (or a failed delete's marker) where
        // it landed, when the map changed between the writer's commit and its rollback.
        let map_free = matches!(
            request,
            Request::GetMap | Request::MapPut { .. } | Request::Rollback { .. } | Request::Abort { .. }
        );
        if session.map_version < node_version && !map_free {
            if let Request::ChunkWrite { len, .. } = request {
                // The bytes follow the frame: read past them to stay in step.
                chunk_buffer.resize(len as usize, 0);
                session.stream.read_exact(&mut chunk_buffer)?;
            }
            let message = format!(
                "node {} holds cluster map version {node_version}, the request was planned with version {}: fetch the map and retry",
                state.node_id, session.map_version
            );
            session.send(&Response::Error { kind: ErrorKind::StaleMap, message })?;
            continue;
        }
        match request {
            Request::Read { items } => serve_read(session, state, &items)?,
            Request::Query { scan, objects } => {
                crate::query::serve(state, session, &scan, None, crate::query::Target::RowGroups(objects))?
            }
            Request::AggregateQuery { scan, aggregate, objects } => {
                crate::query::serve(state, session, &scan, Some(&aggregate), crate::query::Target::RowGroups(objects))?
            }
            Request::RecordQuery { scan, aggregate, format, schema, objects } => crate::query::serve(
                state,
                session,
                &scan,
                aggregate.as_ref(),
                crate::query::Target::Records { format, schema, objects },
            )?,
            Request::ChunkWrite { drive, bucket, version, offset, len, block_bytes, crcs, staging } => {
                // `len` was checked against CHUNK_BYTES_MAX by decode_request, and `crcs`
                // against `len` and `block_bytes`.
                chunk_buffer.resize(len as usize, 0);
                session.stream.read_exact(&mut chunk_buffer)?;
                let response = if let Some(block) = first_bad_block(&chunk_buffer, block_bytes, &crcs) {
                    tracing::warn!(drive, version = %version.to_hex(), block, "chunk damaged in transit; refused");
                    Response::Error {
                        kind: ErrorKind::ChecksumMismatch,
                        message: format!("block {block} of the chunk does not match its CRC32C"),
                    }
                } else {
                    with_drive(state, drive, |d| {
                        staged.insert((drive as usize, version, staging));
                        d.write_staged(staging, &bucket, version, offset, &chunk_buffer).map(|()| Response::Ok)
                    })
                };
                match response {
                    Response::Error { .. } => state.counters.request_error("chunk_write"),
                    _ => state.counters.received(u64::from(len)),
                }
                session.send(&response)?;
            }
            other => {
                let kind = crate::metrics::Counters::kind_of(&other);
                let response = handle_control(state, other, staged);
                if matches!(response, Response::Error { .. }) {
                    state.counters.request_error(kind);
                }
                session.send(&response)?;
            }
        }
    }
    Ok(())
}

impl crate::query::Answer for Session {
    fn response(&mut self, response: &Response) -> io::Result<()> {
        self.send(response).map_err(|e| match e {
            ConnError::Io(e) => e,
            other => io::Error::other(other.to_string()),
        })
    }

    fn data(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)
    }
}

/// The index of the first `block_bytes` block of `data` whose CRC32C differs from `crcs`.
fn first_bad_block(data: &[u8], block_bytes: u32, crcs: &[u32]) -> Option<usize> {
    debug_assert_eq!(data.len().div_ceil(block_bytes as usize), crcs.len());
    data.chunks(block_bytes as usize).zip(crcs).position(|(block, crc)| crc32c::crc32c(block) != *crc)
}

/// A staging file written on a connection: drive, version, whose.
type Staged = (usize, VersionId, proto::Staging);

fn handle_control(state: &State, request: Request, staged: &mut HashSet<Staged>) -> Response {
    match request {
        Request::GetMap => Response::Map { toml: state.map.text().to_string() },
        Request::MapPut { expected_version, toml } => match state.map.put(expected_version, &toml) {
            Ok(_) => Response::Ok,
            Err(e @ crate::map::MapError::Conflict { .. }) => {
                Response::Error { kind: ErrorKind::MapConflict, message: e.to_string() }
            }
            Err(e @ crate::map::MapError::Invalid(_)) => refuse(e.to_string()),
            Err(e @ crate::map::MapError::Write { .. }) => {
                tracing::error!(error = %e, "cannot store a map update; refused");
                Response::Error { kind: ErrorKind::Io, message: e.to_string() }
            }
        },
        Request::Space => {
            let mut drives = Vec::with_capacity(state.drives.len());
            for drive in &state.drives {
                match drive.space() {
                    Ok((free_bytes, total_bytes)) => drives.push(proto::DriveSpace { free_bytes, total_bytes }),
                    Err(e) => return error_response(&e),
                }
            }
            Response::Space { drives }
        }
        Request::Background => {
            // One thread per connection: the priority lasts as long as the connection.
            crate::background_priority();
            Response::Ok
        }
        Request::BucketCreate { bucket } => all_drives(state, |d| d.create_bucket(&bucket)),
        Request::BucketDelete { bucket } => delete_bucket(state, &bucket),
        Request::BucketList => list_buckets(state),
        Request::MetaGet { items, detail } => meta_get(state, &items, detail),
        Request::Finalize { drive, bucket, key, version, missing_positions } => with_drive(state, drive, |d| {
            let retire_at = SystemTime::now() + state.retire_grace;
            let retire_at_ms = retire_at.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(u64::MAX);
            d.finalize(&bucket, &key, version, &missing_positions, retire_at_ms).map(|()| Response::Ok)
        }),
        Request::Evict { drive, bucket, key, version } => with_drive(state, drive, |d| {
            let retire_at = SystemTime::now() + state.retire_grace;
            let retire_at_ms = retire_at.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(u64::MAX);
            let evicted = d.evict(&bucket, &key, version, retire_at_ms)?;
            if evicted {
                tracing::debug!(%bucket, %key, version = %version.to_hex(), "key moved to another pool; evicted here");
            }
            Ok(Response::Ok)
        }),
        Request::Commit { drive, meta, missing_positions, condition } => with_drive(state, drive, |d| {
            staged.remove(&(drive as usize, meta.version, proto::Staging::Write));
            d.commit(&meta, &missing_positions, condition).map(|outcome| Response::Committed { outcome })
        }),
        Request::RestampCommit { drive, meta, of, missing_positions } => with_drive(state, drive, |d| {
            d.restamp(&meta, of, &missing_positions).map(|outcome| Response::Committed { outcome })
        }),
        Request::Abort { drive, version } => with_drive(state, drive, |d| {
            staged.remove(&(drive as usize, version, proto::Staging::Write));
            d.abort(version).map(|()| Response::Ok)
        }),
        Request::Rollback { drive, bucket, key, version } => {
            with_drive(state, drive, |d| d.rollback(&bucket, &key, version).map(|()| Response::Ok))
        }
        Request::List { drive, .. } if state.is_rebuilding(drive as usize) => Response::Error {
            kind: ErrorKind::Io,
            message: format!("drive {} of node {} is being rebuilt", drive + 1, state.node_id),
        },
        Request::List { drive, bucket, prefix, start_after, limit } => with_drive(state, drive, |d| {
            d.list(&bucket, &prefix, &start_after, limit as usize)
                .map(|entries: Vec<ListEntry>| Response::Listing { entries })
        }),
        Request::RepairHint { drive, bucket, key, version, positions } => with_drive(state, drive, |d| {
            if !d.get_versions(&bucket, &key)?.all().any(|m| m.version == version) {
                return Ok(refuse(format!(
                    "drive {} does not hold version {} of {bucket}/{key}",
                    drive + 1,
                    version.to_hex()
                )));
            }
            tracing::info!(version = %version.to_hex(), key, ?positions, "a reader found chunks missing or corrupt; queued for repair");
            d.queue_repair(&bucket, &key, version, &positions, proto::RepairKind::Damaged).map(|()| Response::Ok)
        }),
        Request::RepairCommit { drive, meta, .. } if !owns(state, drive, &meta) => {
            // Its staged chunks (if any) go when the connection ends.
            refuse(format!("drive {} is not in the erasure set of {}/{}", drive + 1, meta.bucket, meta.key))
        }
        Request::RepairCommit { drive, meta, crcs } => with_drive(state, drive, |d| {
            staged.remove(&(drive as usize, meta.version, proto::Staging::Repair));
            let result = d.commit_repair(&meta, &crcs, chunkstore::MetaSync::Now);
            if result.is_err() {
                // Nothing half-repaired stays behind; the repairer tries again.
                let _ = d.abort_staged(meta.version, proto::Staging::Repair); // best effort: the sweep at the next start removes it too
            }
            result.map(|()| Response::Ok)
        }),
        Request::RepairControl { action } => {
            state.control_repair(action).map(|()| Response::Ok).unwrap_or_else(|e| error_response(&e))
        }
        Request::RepairStatus => Response::RepairStatus { status: crate::repair::status(state) },
        Request::NodeInfo => Response::NodeInfo { info: state.info() },
        Request::DriveReplace { drive } => {
            with_drive(state, drive, |_| crate::rebuild::replace(state, drive as usize).map(|()| Response::Ok))
        }
        Request::Read { .. }
        | Request::ChunkWrite { .. }
        | Request::Query { .. }
        | Request::AggregateQuery { .. }
        | Request::RecordQuery { .. } => {
            unreachable!("data requests are served by serve_requests")
        }
    }
}

/// Whether `drive` of this node is one of the drives `meta`'s key is placed on in the pool of
/// `meta`'s set.
/// Room left in a metadata answer's frame for what is not the keys' versions.
const VERSIONS_FRAME_MARGIN: usize = 64 << 10;

/// What each drive holds of each key asked. Retained versions ride along while the answer stays
/// well inside one frame; past that they are left out (readers then see only current versions,
/// as before retention). Keys are answered while the answer fits in one frame (the first one
/// always): the client asks again for those left out (large objects' metadata, their CRCs, is
/// large, and one request may ask about thousands of keys).
fn meta_get(state: &State, items: &[proto::MetaKey], detail: proto::MetaDetail) -> Response {
    let mut retained_budget = proto::CONTROL_BODY_BYTES_MAX / 2;
    let mut body_budget = proto::CONTROL_BODY_BYTES_MAX - VERSIONS_FRAME_MARGIN;
    let mut keys = Vec::with_capacity(items.len());
    for item in items {
        let unavailable = proto::KeyVersions { unavailable: true, ..Default::default() };
        let versions = match state.drives.get(item.drive as usize) {
            Some(_) if state.is_rebuilding(item.drive as usize) => Ok(unavailable.clone()),
            Some(drive) if detail.brief() => drive.get_versions_brief(&item.bucket, &item.key, detail.with_floor()),
            Some(drive) if detail.with_floor() => drive.get_versions_with_floor(&item.bucket, &item.key),
            Some(drive) => drive.get_versions(&item.bucket, &item.key),
            None => Ok(unavailable.clone()),
        };
        let mut versions = versions.unwrap_or_else(|e| {
            tracing::error!(error = %e, "metadata read failed; reporting the drive unavailable for the key");
            unavailable
        });
        if detail.brief() {
            // Read brief already; the unavailable answer says so too.
            debug_assert!(versions.all().all(|m| m.crcs.is_empty()));
            versions.checksums_left_out = true;
        }
        if versions.retained.len() > proto::RETAINED_PER_KEY_MAX {
            // Kept past the bound by an eviction (never by a commit): the answer carries the
            // newest and says it left some out.
            versions.retained.drain(..versions.retained.len() - proto::RETAINED_PER_KEY_MAX);
            versions.retained_truncated = true;
        }
        if !versions.retained.is_empty() {
            let bytes: usize = versions.retained.iter().map(|m| proto::encode_body(m).len()).sum();
            if bytes > retained_budget {
                tracing::debug!(key = %item.key, bytes, "retained versions left out of a metadata answer");
                versions.retained.clear();
                versions.retained_truncated = true;
            } else {
                retained_budget -= bytes;
            }
        }
        let mut bytes = proto::encode_body(&versions).len();
        if bytes > body_budget && !versions.retained.is_empty() {
            // A large current record and its retained versions may not fit one frame together
            // (the first key is always answered): the current one goes alone.
            tracing::debug!(key = %item.key, bytes, "retained versions left out of a metadata answer");
            versions.retained.clear();
            versions.retained_truncated = true;
            bytes = proto::encode_body(&versions).len();
        }
        if bytes > body_budget && !keys.is_empty() {
            break;
        }
        body_budget = body_budget.saturating_sub(bytes);
        keys.push(versions);
    }
    Response::Versions { keys }
}

fn owns(state: &State, drive: u32, meta: &proto::ObjectMeta) -> bool {
    let map = state.map.get();
    let Some(pool) = map.pool_of_set(meta.set_idx as usize) else {
        return false;
    };
    let placement = map.placement_in(pool, &meta.bucket, &meta.key);
    let me = cluster::DriveRef { node_idx: state.node_idx, drive_idx: drive as usize };
    placement.set_idx == meta.set_idx as usize && map.sets[placement.set_idx].drives.contains(&me)
}

fn refuse(message: String) -> Response {
    tracing::warn!("{message}; refused");
    Response::Error { kind: ErrorKind::BadRequest, message }
}

fn with_drive(state: &State, drive: u32, op: impl FnOnce(&Drive) -> Result<Response, chunkstore::Error>) -> Response {
    match state.drives.get(drive as usize) {
        Some(d) => op(d).unwrap_or_else(|e| error_response(&e)),
        None => Response::Error {
            kind: ErrorKind::NoSuchDrive,
            message: format!("node {} has no drive {drive}", state.node_id),
        },
    }
}

fn all_drives(state: &State, op: impl Fn(&Drive) -> Result<(), chunkstore::Error>) -> Response {
    for drive in &state.drives {
        if let Err(e) = op(drive) {
            return error_response(&e);
        }
    }
    Response::Ok
}

fn delete_bucket(state: &State, bucket: &str) -> Response {
    // Refuse before changing anything if any drive still holds objects.
    for drive in &state.drives {
        match drive.list(bucket, "", "", 1) {
            Ok(entries) if entries.iter().any(|e| !e.deleted) => {
                return error_response(&chunkstore::Error::BucketNotEmpty { bucket: bucket.to_owned() });
            }
            _ => {}
        }
    }
    let mut found = false;
    for drive in &state.drives {
        match drive.delete_bucket(bucket) {
            Ok(()) => found = true,
            Err(chunkstore::Error::NoSuchBucket { .. }) => {}
            Err(e) => return error_response(&e),
        }
    }
    if found { Response::Ok } else { error_response(&chunkstore::Error::NoSuchBucket { bucket: bucket.to_owned() }) }
}

/// The buckets on the node's drives; drives being rebuilt are left out (they may lack some),
/// and a node whose drives are all being rebuilt answers with an error, not an empty list.
fn list_buckets(state: &State) -> Response {
    let mut created = std::collections::BTreeMap::new();
    let trusted: Vec<&Drive> =
        state.drives.iter().enumerate().filter(|(idx, _)| !state.is_rebuilding(*idx)).map(|(_, d)| d).collect();
    if trusted.is_empty() {
        return Response::Error {
            kind: ErrorKind::Io,
            message: format!("every drive of node {} is being rebuilt", state.node_id),
        };
    }
    for drive in trusted {
        match drive.list_buckets() {
            Ok(list) => {
                for bucket in list {
                    let at = created.entry(bucket.name).or_insert(bucket.created_ms);
                    *at = (*at).min(bucket.created_ms);
                }
            }
            Err(e) => return error_response(&e),
        }
    }
    let buckets = created.into_iter().map(|(name, created_ms)| proto::BucketEntry { name, created_ms }).collect();
    Response::Buckets { buckets }
}

fn error_response(error: &chunkstore::Error) -> Response {
    use chunkstore::Error as E;
    let kind = match error {
        E::NoSuchBucket { .. } => ErrorKind::NoSuchBucket,
        E::BucketNotEmpty { .. } => ErrorKind::BucketNotEmpty,
        E::DiskFull { .. } => ErrorKind::DiskFull,
        E::NoStagedData { .. } => ErrorKind::NoSuchUpload,
        E::NoDataToRestamp { .. } => ErrorKind::Io,
        E::StagedLengthMismatch { .. } | E::StagedChecksumMismatch { .. } => ErrorKind::BadRequest,
        // This drive misses the write (the writer counts it failed; repair or a later write
        // brings the key back in line).
        E::VersionBusy { .. } | E::TooManyVersions { .. } => ErrorKind::Io,
        // The writer rolled this version back here before its commit arrived (it counts the
        // drive failed, as it already decided).
        E::RolledBack { .. } => ErrorKind::Io,
        E::PreconditionFailed { .. } => ErrorKind::PreconditionFailed,
        E::DriveMissing { .. } | E::DriveUnusable { .. } | E::Io { .. } | E::Db { .. } | E::CorruptMeta { .. } => {
            // A drive that fails or holds corrupt metadata needs a human; clients read around it.
            tracing::error!(error = %error, "drive operation failed");
            ErrorKind::Io
        }
    };
    Response::Error { kind, message: error.to_string() }
}

/// Answers a batched read: statuses first, then the bytes of every servable item, each sent from
/// its file with `sendfile(2)`. Each version's file is opened once per batch, however many of
/// its ranges the batch lists (a gather lists thousands of small ranges of one object).
fn serve_read(session: &mut Session, state: &State, items: &[ReadItem]) -> Result<(), ConnError> {
    let mut opened: HashMap<(u32, VersionId), Opened> = HashMap::new();
    let mut files: Vec<Option<Arc<File>>> = Vec::with_capacity(items.len());
    let mut statuses = Vec::with_capacity(items.len());
    for item in items {
        let (status, file) = match opened.entry((item.drive, item.version)).or_insert_with(|| open_version(state, item))
        {
            Opened::File { file, len } if *len >= item.offset + u64::from(item.len) => {
                (ItemStatus::Ok, Some(Arc::clone(file)))
            }
            Opened::File { .. } => (ItemStatus::Corrupt, None),
            Opened::Failed(status) => (*status, None),
        };
        statuses.push(status);
        files.push(file);
    }
    drop(opened);
    // Many ranges: hold partial segments back until all are queued, so thousands of 4 KiB
    // `sendfile`s leave as full segments rather than one small packet each (the connection's
    // TCP_NODELAY would push each at once).
    let cork = items.len() > 1;
    if cork {
        set_cork(session.stream.tcp(), true);
    }
    let hints = state.read_hints && items.len() >= READ_HINT_RANGES_MIN;
    state.counters.read_items(&statuses);
    let bytes: u64 = items.iter().zip(&files).filter(|(_, f)| f.is_some()).map(|(i, _)| u64::from(i.len)).sum();
    let sent = send_read(session, items, statuses, files, hints);
    if cork {
        set_cork(session.stream.tcp(), false);
    }
    if sent.is_ok() {
        state.counters.sent(bytes);
    }
    sent
}

/// The answer to a batched read: the statuses, then each range found. With `hints`, the
/// ranges ahead of the one being sent are announced to the kernel first ([`ReadAhead`]).
fn send_read(
    session: &mut Session,
    items: &[ReadItem],
    statuses: Vec<ItemStatus>,
    files: Vec<Option<Arc<File>>>,
    hints: bool,
) -> Result<(), ConnError> {
    let mut ahead = ReadAhead { items, files: &files, next: 0, bytes: 0, sent: 0 };
    if hints {
        ahead.hint_up_to(0);
    }
    session.send(&Response::Read { statuses })?;
    for (i, (item, file)) in items.iter().zip(&files).enumerate() {
        if let Some(file) = file {
            if hints {
                ahead.hint_up_to(i);
            }
            send_file_range(session, file, item.offset, item.len as usize)?;
            ahead.sent += u64::from(item.len);
        }
    }
    Ok(())
}

/// Sets or clears TCP_CORK on `stream` (clearing it sends what it held back). Best effort: a
/// failure only costs packets.
fn set_cork(stream: &TcpStream, on: bool) {
    use std::os::fd::AsRawFd;
    let value = libc::c_int::from(on);
    // SAFETY: a valid socket descriptor, and an option value of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CORK,
            (&raw const value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        tracing::debug!(error = %io::Error::last_os_error(), "TCP_CORK not set");
    }
}

/// A batched read with at least this many ranges tells the kernel about them ahead of sending.
const READ_HINT_RANGES_MIN: usize = 2;
/// Ranges announced ahead of the one being sent: enough to keep the disk's queue full (fio
/// reaches this machine's random-read limit at queue depth 32; a node announces this many, and
/// a gather asks every node at once), few enough that sending starts after the first reads
/// land rather than after all of them were issued.
const READ_HINT_AHEAD_RANGES: usize = 256;
/// Bytes announced ahead of what was sent at most: the page cache holds them until they are.
const READ_HINT_AHEAD_BYTES: u64 = 64 << 20;

/// Tells the kernel which ranges of a batched read are wanted soon (`POSIX_FADV_WILLNEED`,
/// which starts their reads and returns), a sliding window ahead of the range being sent: a
/// gather's thousands of small ranges are read at the disk's queue depth, `sendfile` finds
/// them in the page cache instead of faulting them in one at a time, and the first ranges
/// can leave while later ones are still being read. Announcing all of them first (up to 64
/// MiB a batch) measured the same for a gather, but left the rest of a larger batch to be
/// faulted in one range at a time. Best effort: a failed hint only costs speed.
struct ReadAhead<'a> {
    items: &'a [ReadItem],
    files: &'a [Option<Arc<File>>],
    /// The first range not announced yet.
    next: usize,
    /// Bytes announced so far.
    bytes: u64,
    /// Bytes sent so far.
    sent: u64,
}

impl ReadAhead<'_> {
    /// Announces ranges until `READ_HINT_AHEAD_RANGES` past range `current` or
    /// `READ_HINT_AHEAD_BYTES` past what was sent.
    fn hint_up_to(&mut self, current: usize) {
        use std::os::fd::AsRawFd;
        let last = (current + READ_HINT_AHEAD_RANGES).min(self.items.len());
        while self.next < last && self.bytes.saturating_sub(self.sent) < READ_HINT_AHEAD_BYTES {
            let (item, file) = (&self.items[self.next], &self.files[self.next]);
            self.next += 1;
            // A zero length would advise the whole rest of the file.
            let Some(file) = file.as_ref().filter(|_| item.len > 0) else { continue };
            self.bytes += u64::from(item.len);
            let (offset, len) = (item.offset as i64, i64::from(item.len));
            let advice = nix::fcntl::PosixFadviseAdvice::POSIX_FADV_WILLNEED;
            if let Err(e) = nix::fcntl::posix_fadvise(file.as_raw_fd(), offset, len, advice) {
                tracing::debug!(error = %e, "read-ahead hint refused");
                self.next = self.items.len();
                return;
            }
        }
    }
}

/// A version's file as a batched read found it.
enum Opened {
    File { file: Arc<File>, len: u64 },
    Failed(ItemStatus),
}

fn open_version(state: &State, item: &ReadItem) -> Opened {
    let Some(drive) = state.drives.get(item.drive as usize) else {
        return Opened::Failed(ItemStatus::Missing);
    };
    let file = match drive.open_version(item.version) {
        Ok(Some(file)) => file,
        Ok(None) => return Opened::Failed(ItemStatus::Missing),
        Err(e) => {
            tracing::error!(error = %e, "chunk read failed");
            return Opened::Failed(ItemStatus::Unreadable);
        }
    };
    match file.metadata() {
        Ok(meta) => Opened::File { file: Arc::new(file), len: meta.len() },
        Err(_) => Opened::Failed(ItemStatus::Unreadable),
    }
}

/// Sends `len` bytes at `offset` of `file` to the socket without copying them through user
/// space (over TLS: read into the session's buffer, then encrypted by rustls). Once the
/// statuses are sent the byte count is promised, so a short file ends the connection (the
/// client then treats the rest of the batch as missing).
fn send_file_range(session: &mut Session, file: &File, offset: u64, len: usize) -> Result<(), ConnError> {
    if session.stream.is_tls() {
        return send_file_range_tls(session, file, offset, len);
    }
    let stream = session.stream.tcp();
    let mut offset = offset as i64;
    let mut left = len;
    while left > 0 {
        let sent = nix::sys::sendfile::sendfile64(stream.as_fd(), file.as_fd(), Some(&mut offset), left)
            .map_err(io::Error::from)?;
        if sent == 0 {
            return Err(ConnError::Io(io::Error::new(io::ErrorKind::UnexpectedEof, "chunk file shrank during a read")));
        }
        left -= sent;
    }
    Ok(())
}

/// Bytes of a chunk read over TLS that one `pread` takes at most (the session keeps a buffer
/// this size once it serves a read over TLS).
const TLS_SEND_BUFFER_BYTES: usize = 64 << 10;

/// [`send_file_range`] over TLS: `pread` into the session's buffer, then written through rustls
/// (which encrypts into records of at most 16 KiB).
fn send_file_range_tls(session: &mut Session, file: &File, offset: u64, len: usize) -> Result<(), ConnError> {
    let mut buffer = std::mem::take(&mut session.send_buffer);
    buffer.resize(TLS_SEND_BUFFER_BYTES.min(len.max(buffer.len())), 0);
    let sent = (|| {
        let mut done = 0usize;
        while done < len {
            let want = (len - done).min(buffer.len());
            let read = file.read_at(&mut buffer[..want], offset + done as u64)?;
            if read == 0 {
                return Err(ConnError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "chunk file shrank during a read",
                )));
            }
            session.stream.write_all(&buffer[..read])?;
            done += read;
        }
        Ok(())
    })();
    session.send_buffer = buffer;
    sent
}
