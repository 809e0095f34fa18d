//! One client connection: handshake, then a request/response loop.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsFd;

use chunkstore::Drive;
use proto::{
    AuthProof, Challenge, ErrorKind, FRAME_HEADER_BYTES, FrameHeader, FrameKind, ItemStatus, ListEntry, NONCE_BYTES,
    PROTOCOL_VERSION, ReadItem, Request, Response, VersionId,
};
use rand::RngCore;

use crate::{HANDSHAKE_TIMEOUT, IDLE_TIMEOUT, State, WRITE_TIMEOUT};

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
}

/// Serves one connection to its end. Staging files written on this connection and never
/// committed or aborted are dropped when it closes, so a client that dies mid-PUT leaves nothing.
pub(crate) fn serve(mut stream: TcpStream, state: &State) {
    let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    let mut staged = HashSet::new();
    let result = handshake(&mut stream, state).and_then(|()| serve_requests(&mut stream, state, &mut staged));
    for (drive, version) in staged {
        if let Err(e) = state.drives[drive].abort(version) {
            tracing::warn!(error = %e, "could not drop the staging file of an unfinished PUT");
        }
    }
    match result {
        Ok(()) => {}
        Err(ConnError::Io(e)) if is_disconnect(&e) => {}
        Err(e) => tracing::warn!(%peer, error = %e, "closing connection"),
    }
}

fn is_disconnect(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe)
}

fn handshake(stream: &mut TcpStream, state: &State) -> Result<(), ConnError> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    let mut nonce = [0u8; NONCE_BYTES];
    rand::thread_rng().fill_bytes(&mut nonce);
    let challenge = Challenge { protocol_version: PROTOCOL_VERSION, nonce };
    stream.write_all(&proto::encode_frame(FrameKind::Challenge, &challenge)?)?;
    let Some(body) = read_frame(stream, FrameKind::Auth)? else {
        return Err(ConnError::Io(io::ErrorKind::UnexpectedEof.into()));
    };
    let auth: AuthProof = proto::decode_message(&body, "authentication")?;
    if auth.protocol_version != PROTOCOL_VERSION || !proto::verify_auth_proof(&state.secret, &nonce, &auth.proof) {
        return Err(ConnError::AuthFailed);
    }
    send(stream, &Response::Ok)?;
    stream.set_read_timeout(Some(IDLE_TIMEOUT))?;
    Ok(())
}

/// Reads one frame of kind `expected`; `None` on a clean end of stream between frames.
fn read_frame(stream: &mut TcpStream, expected: FrameKind) -> Result<Option<Vec<u8>>, ConnError> {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    match stream.read(&mut header[..1])? {
        0 => return Ok(None),
        _ => stream.read_exact(&mut header[1..])?,
    }
    let header = FrameHeader::decode(&header)?;
    if header.kind != expected {
        return Err(ConnError::UnexpectedFrame { found: header.kind });
    }
    // The length was checked against CONTROL_BODY_BYTES_MAX by FrameHeader::decode.
    let mut body = vec![0u8; header.body_len];
    stream.read_exact(&mut body)?;
    Ok(Some(body))
}

fn send(stream: &mut TcpStream, response: &Response) -> Result<(), ConnError> {
    stream.write_all(&proto::encode_frame(FrameKind::Response, response)?)?;
    Ok(())
}

fn serve_requests(
    stream: &mut TcpStream,
    state: &State,
    staged: &mut HashSet<(usize, VersionId)>,
) -> Result<(), ConnError> {
    let mut chunk_buffer = Vec::new();
    while let Some(body) = read_frame(stream, FrameKind::Request)? {
        let request = proto::decode_request(&body)?;
        match request {
            Request::Read { items } => serve_read(stream, state, &items)?,
            Request::ChunkWrite { drive, bucket, version, offset, len } => {
                // `len` was checked against CHUNK_BYTES_MAX by decode_request.
                chunk_buffer.resize(len as usize, 0);
                stream.read_exact(&mut chunk_buffer)?;
                let response = with_drive(state, drive, |d| {
                    staged.insert((drive as usize, version));
                    d.write_chunk(&bucket, version, offset, &chunk_buffer).map(|()| Response::Ok)
                });
                send(stream, &response)?;
            }
            other => {
                let response = handle_control(state, other, staged);
                send(stream, &response)?;
            }
        }
    }
    Ok(())
}

fn handle_control(state: &State, request: Request, staged: &mut HashSet<(usize, VersionId)>) -> Response {
    match request {
        Request::GetMap => Response::Map { toml: state.map_text.clone() },
        Request::BucketCreate { bucket } => all_drives(state, |d| d.create_bucket(&bucket)),
        Request::BucketDelete { bucket } => delete_bucket(state, &bucket),
        Request::BucketList => list_buckets(state),
        Request::MetaGet { items } => {
            let metas = items
                .iter()
                .map(|item| {
                    let drive = state.drives.get(item.drive as usize)?;
                    drive.get_meta(&item.bucket, &item.key).unwrap_or_else(|e| {
                        tracing::warn!(error = %e, "metadata read failed; reporting the key absent on this drive");
                        None
                    })
                })
                .collect();
            Response::Metas { metas }
        }
        Request::Commit { drive, meta, missing_positions } => with_drive(state, drive, |d| {
            staged.remove(&(drive as usize, meta.version));
            d.commit(&meta, &missing_positions).map(|outcome| Response::Committed { outcome })
        }),
        Request::Abort { drive, version } => with_drive(state, drive, |d| {
            staged.remove(&(drive as usize, version));
            d.abort(version).map(|()| Response::Ok)
        }),
        Request::Rollback { drive, bucket, key, version } => {
            with_drive(state, drive, |d| d.rollback(&bucket, &key, version).map(|()| Response::Ok))
        }
        Request::List { drive, bucket, prefix, start_after, limit } => with_drive(state, drive, |d| {
            d.list(&bucket, &prefix, &start_after, limit as usize)
                .map(|entries: Vec<ListEntry>| Response::Listing { entries })
        }),
        Request::Read { .. } | Request::ChunkWrite { .. } => {
            unreachable!("data requests are served by serve_requests")
        }
    }
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

fn list_buckets(state: &State) -> Response {
    let mut created = std::collections::BTreeMap::new();
    for drive in &state.drives {
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
        E::StagedLengthMismatch { .. } => ErrorKind::BadRequest,
        E::DriveMissing { .. } | E::DriveUnusable { .. } | E::Io { .. } | E::Db { .. } | E::CorruptMeta { .. } => {
            tracing::warn!(error = %error, "drive operation failed");
            ErrorKind::Io
        }
    };
    Response::Error { kind, message: error.to_string() }
}

/// Answers a batched read: statuses first, then the bytes of every servable item, each sent from
/// its file with `sendfile(2)`.
fn serve_read(stream: &mut TcpStream, state: &State, items: &[ReadItem]) -> Result<(), ConnError> {
    let mut files: Vec<Option<File>> = Vec::with_capacity(items.len());
    let mut statuses = Vec::with_capacity(items.len());
    for item in items {
        let (status, file) = open_item(state, item);
        statuses.push(status);
        files.push(file);
    }
    send(stream, &Response::Read { statuses })?;
    for (item, file) in items.iter().zip(files) {
        if let Some(file) = file {
            send_file_range(stream, &file, item.offset, item.len as usize)?;
        }
    }
    Ok(())
}

fn open_item(state: &State, item: &ReadItem) -> (ItemStatus, Option<File>) {
    let Some(drive) = state.drives.get(item.drive as usize) else {
        return (ItemStatus::Missing, None);
    };
    let file = match drive.open_version(item.version) {
        Ok(Some(file)) => file,
        Ok(None) => return (ItemStatus::Missing, None),
        Err(e) => {
            tracing::warn!(error = %e, "chunk read failed");
            return (ItemStatus::Unreadable, None);
        }
    };
    match file.metadata() {
        Ok(meta) if meta.len() >= item.offset + u64::from(item.len) => (ItemStatus::Ok, Some(file)),
        Ok(_) => (ItemStatus::Corrupt, None),
        Err(_) => (ItemStatus::Unreadable, None),
    }
}

/// Sends `len` bytes at `offset` of `file` to the socket without copying them through user
/// space. Once the statuses are sent the byte count is promised, so a short file ends the
/// connection (the client then treats the rest of the batch as missing).
fn send_file_range(stream: &mut TcpStream, file: &File, offset: u64, len: usize) -> Result<(), ConnError> {
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
