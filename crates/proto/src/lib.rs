//! Everything that crosses a process or disk boundary: node-protocol frames and messages, object
//! metadata (also the on-disk record), size limits, peer authentication and name rules.
//!
//! Main types: [`Request`] and [`Response`] (the node protocol), [`ObjectMeta`] (one object
//! version, stored on every drive of its erasure set), [`VersionId`] and [`FrameHeader`].
//!
//! # Wire format (version [`PROTOCOL_VERSION`])
//! Every message is a 12-byte [`FrameHeader`] (magic `TSR1`, kind, flags, body length, all
//! little-endian) followed by a postcard-encoded body of at most [`CONTROL_BODY_BYTES_MAX`].
//! A [`Request::ChunkWrite`] is followed by `len` raw bytes; a [`Response::Read`] is followed by
//! the raw bytes of each item whose status is [`ItemStatus::Ok`], in item order. Raw bytes carry
//! no header: their length is in the message before them.
//!
//! A connection starts with a handshake: the node sends [`Challenge`] (a fresh nonce), the
//! client answers [`AuthProof`] (HMAC-SHA256 of the nonce under the cluster secret), and the
//! node answers [`Response::Ok`] or closes the connection.
//!
//! ```ignore
//! let header = FrameHeader::new(FrameKind::Request, body.len())?;
//! stream.write_all(&header.encode())?;
//! stream.write_all(&body)?;
//! ```

mod meta;
mod names;

pub use meta::{META_FORMAT_VERSION, ObjectMeta, PartPiece, StripeGeometry};
pub use names::{KEY_BYTES_MAX, NameError, validate_bucket, validate_key};

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// Version of the node protocol; the handshake rejects peers that speak another.
pub const PROTOCOL_VERSION: u16 = 1;
/// First four bytes of every frame.
pub const FRAME_MAGIC: [u8; 4] = *b"TSR1";
/// Bytes of a frame header.
pub const FRAME_HEADER_BYTES: usize = 12;
/// Largest postcard body of one frame (16 MiB): a metadata record with the checksums of a
/// multi-TiB object fits; anything larger is refused before allocation.
pub const CONTROL_BODY_BYTES_MAX: usize = 16 << 20;
/// Largest raw payload following one message item: one chunk.
pub const CHUNK_BYTES_MAX: usize = cluster::CHUNK_BYTES_MAX as usize;
/// Most items in one batched read or metadata request.
pub const BATCH_ITEMS_MAX: usize = 4096;
/// Most entries one listing request returns.
pub const LIST_LIMIT_MAX: u32 = 10_000;
/// Bytes of the handshake nonce and of the authentication proof.
pub const NONCE_BYTES: usize = 32;

const _: () = assert!(CONTROL_BODY_BYTES_MAX < u32::MAX as usize);

/// Everything that can be wrong with bytes received from a peer or read from disk.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("bad frame magic {found:02x?} (not a Tessera node-protocol peer)")]
    BadMagic { found: [u8; 4] },
    #[error("unknown frame kind {kind}")]
    UnknownKind { kind: u16 },
    #[error("frame body of {len} bytes exceeds the limit of {CONTROL_BODY_BYTES_MAX}")]
    FrameTooLarge { len: usize },
    #[error("undecodable {what}: {source}")]
    Decode { what: &'static str, source: postcard::Error },
    #[error("{what} has {found} items, the limit is {max}")]
    TooManyItems { what: &'static str, found: usize, max: usize },
    #[error("unsupported {what} version {found} (this build speaks {supported})")]
    UnsupportedVersion { what: &'static str, found: u16, supported: u16 },
    #[error("invalid {what}: {reason}")]
    Invalid { what: &'static str, reason: String },
}

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum FrameKind {
    Challenge = 1,
    Auth = 2,
    Request = 3,
    Response = 4,
}

/// The fixed 12-byte prefix of every frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: FrameKind,
    pub body_len: usize,
}

impl FrameHeader {
    /// A header for a body of `body_len` bytes; refuses bodies over [`CONTROL_BODY_BYTES_MAX`].
    pub fn new(kind: FrameKind, body_len: usize) -> Result<Self, Error> {
        if body_len > CONTROL_BODY_BYTES_MAX {
            return Err(Error::FrameTooLarge { len: body_len });
        }
        Ok(Self { kind, body_len })
    }

    /// The header's 12 bytes.
    pub fn encode(&self) -> [u8; FRAME_HEADER_BYTES] {
        assert!(self.body_len <= CONTROL_BODY_BYTES_MAX);
        let mut bytes = [0u8; FRAME_HEADER_BYTES];
        bytes[0..4].copy_from_slice(&FRAME_MAGIC);
        bytes[4..6].copy_from_slice(&(self.kind as u16).to_le_bytes());
        // bytes[6..8]: flags, zero in version 1.
        bytes[8..12].copy_from_slice(&(self.body_len as u32).to_le_bytes());
        bytes
    }

    /// Parses and checks a header received from a peer.
    pub fn decode(bytes: &[u8; FRAME_HEADER_BYTES]) -> Result<Self, Error> {
        let magic: [u8; 4] = bytes[0..4].try_into().expect("slice of 4");
        if magic != FRAME_MAGIC {
            return Err(Error::BadMagic { found: magic });
        }
        let kind = match u16::from_le_bytes([bytes[4], bytes[5]]) {
            1 => FrameKind::Challenge,
            2 => FrameKind::Auth,
            3 => FrameKind::Request,
            4 => FrameKind::Response,
            kind => return Err(Error::UnknownKind { kind }),
        };
        let flags = u16::from_le_bytes([bytes[6], bytes[7]]);
        if flags != 0 {
            return Err(Error::Invalid { what: "frame flags", reason: format!("{flags:#x} set, version 1 has none") });
        }
        let body_len = u32::from_le_bytes(bytes[8..12].try_into().expect("slice of 4")) as usize;
        Self::new(kind, body_len)
    }
}

/// Encodes a message body (postcard).
pub fn encode_body<T: Serialize>(message: &T) -> Vec<u8> {
    postcard::to_stdvec(message).expect("in-memory postcard encoding cannot fail")
}

/// Encodes a whole frame: header then body.
pub fn encode_frame<T: Serialize>(kind: FrameKind, message: &T) -> Result<Vec<u8>, Error> {
    let body = encode_body(message);
    let header = FrameHeader::new(kind, body.len())?;
    let mut frame = Vec::with_capacity(FRAME_HEADER_BYTES + body.len());
    frame.extend_from_slice(&header.encode());
    frame.extend_from_slice(&body);
    Ok(frame)
}

/// Decodes a request body and checks its item counts and lengths against the limits.
pub fn decode_request(body: &[u8]) -> Result<Request, Error> {
    let request: Request = postcard::from_bytes(body).map_err(|source| Error::Decode { what: "request", source })?;
    request.validate()?;
    Ok(request)
}

/// Decodes a response body and checks its item counts and lengths against the limits.
pub fn decode_response(body: &[u8]) -> Result<Response, Error> {
    let response: Response = postcard::from_bytes(body).map_err(|source| Error::Decode { what: "response", source })?;
    response.validate()?;
    Ok(response)
}

/// Decodes a handshake message or a stored record.
pub fn decode_message<T: for<'de> Deserialize<'de>>(body: &[u8], what: &'static str) -> Result<T, Error> {
    postcard::from_bytes(body).map_err(|source| Error::Decode { what, source })
}

/// The node's first message on a new connection.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Challenge {
    pub protocol_version: u16,
    pub nonce: [u8; NONCE_BYTES],
}

/// The client's answer to [`Challenge`].
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct AuthProof {
    pub protocol_version: u16,
    pub proof: [u8; NONCE_BYTES],
}

/// HMAC-SHA256 over a domain tag and `nonce`, keyed with the cluster secret.
pub fn auth_proof(secret: &str, nonce: &[u8; NONCE_BYTES]) -> [u8; NONCE_BYTES] {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(b"tessera node protocol v1\0");
    mac.update(nonce);
    mac.finalize().into_bytes().into()
}

/// Checks a proof in constant time.
pub fn verify_auth_proof(secret: &str, nonce: &[u8; NONCE_BYTES], proof: &[u8; NONCE_BYTES]) -> bool {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(b"tessera node protocol v1\0");
    mac.update(nonce);
    mac.verify_slice(proof).is_ok()
}

/// Identifies one object version: nanoseconds since the epoch, then a writer id. Ordered by
/// time, ties broken by writer, so every reader picks the same winner among concurrent PUTs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct VersionId {
    pub unix_ns: u64,
    pub writer: u64,
}

impl VersionId {
    /// 32 hex digits; used as the version's file name on a drive (never the key).
    pub fn to_hex(&self) -> String {
        format!("{:016x}{:016x}", self.unix_ns, self.writer)
    }

    /// Parses [`VersionId::to_hex`] output.
    pub fn from_hex(text: &str) -> Option<Self> {
        if text.len() != 32 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let unix_ns = u64::from_str_radix(&text[..16], 16).ok()?;
        let writer = u64::from_str_radix(&text[16..], 16).ok()?;
        Some(Self { unix_ns, writer })
    }
}

/// Where a metadata lookup points: one drive of the node, one bucket/key.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct MetaKey {
    pub drive: u32,
    pub bucket: String,
    pub key: String,
}

/// One entry of a batched (scatter-gather) read: `len` bytes at `offset` of one object version's
/// file on one drive.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ReadItem {
    pub drive: u32,
    pub version: VersionId,
    pub offset: u64,
    pub len: u32,
}

/// The node's answer for one [`ReadItem`]; the node never fails the batch for one item.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum ItemStatus {
    /// `len` raw bytes follow (in item order, after the response frame).
    Ok,
    /// The drive has no such version or the file does not cover the range.
    Missing,
    /// The node knows the bytes are bad (short file, failed scrub); nothing follows.
    Corrupt,
    /// The drive failed to read (I/O error); nothing follows.
    Unreadable,
}

/// What a [`Request::Commit`] did.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum CommitOutcome {
    /// This version is now the drive's current version of the key. `replaced_parts` lists the
    /// piece keys of the multipart version it replaced, for the writer to delete.
    Applied { replaced_parts: Vec<String> },
    /// The drive already had this version or a newer one; this one was dropped (and its data
    /// deleted), which is also a durable outcome for the writer.
    Superseded { current: VersionId },
}

/// One bucket in a bucket listing.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct BucketEntry {
    pub name: String,
    /// When it was created (milliseconds since the epoch); the earliest any drive recorded.
    pub created_ms: u64,
}

/// One key in a listing.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ListEntry {
    pub key: String,
    pub version: VersionId,
    pub deleted: bool,
    pub size: u64,
    pub etag: String,
    pub modified_ms: u64,
}

/// A client's request to a node.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum Request {
    /// The node's `cluster.toml` text.
    GetMap,
    /// Create `bucket` on every drive of the node (idempotent).
    BucketCreate { bucket: String },
    /// Remove `bucket` from every drive; fails with [`ErrorKind::BucketNotEmpty`].
    BucketDelete { bucket: String },
    /// Buckets on any of the node's drives.
    BucketList,
    /// Current metadata of each key (absent: `None`).
    MetaGet { items: Vec<MetaKey> },
    /// Write `len` raw bytes (following this frame) at `offset` of the staging file of `version`.
    ChunkWrite { drive: u32, bucket: String, version: VersionId, offset: u64, len: u32 },
    /// Make `meta` durable and current on `drive` if it is newer than what the drive has.
    /// `missing_positions` lists set positions that did not get their chunks (queued for repair).
    Commit { drive: u32, meta: ObjectMeta, missing_positions: Vec<u32> },
    /// Drop the staging file of an uncommitted version.
    Abort { drive: u32, version: VersionId },
    /// Undo the commit of a PUT that failed to reach its write quorum.
    Rollback { drive: u32, bucket: String, key: String, version: VersionId },
    /// Batched scatter-gather read.
    Read { items: Vec<ReadItem> },
    /// Keys of `bucket` after `start_after` that start with `prefix`, sorted, at most `limit`.
    List { drive: u32, bucket: String, prefix: String, start_after: String, limit: u32 },
}

/// What went wrong on the node, for [`Response::Error`].
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum ErrorKind {
    NoSuchBucket,
    BucketNotEmpty,
    NoSuchDrive,
    DiskFull,
    Io,
    BadRequest,
    NoSuchUpload,
}

/// A node's answer to a [`Request`].
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum Response {
    Ok,
    Map {
        toml: String,
    },
    Buckets {
        buckets: Vec<BucketEntry>,
    },
    Metas {
        metas: Vec<Option<ObjectMeta>>,
    },
    Committed {
        outcome: CommitOutcome,
    },
    /// Followed by raw bytes of every `Ok` item, in order; lengths are the requested ones.
    Read {
        statuses: Vec<ItemStatus>,
    },
    Listing {
        entries: Vec<ListEntry>,
    },
    Error {
        kind: ErrorKind,
        message: String,
    },
}

impl Request {
    fn validate(&self) -> Result<(), Error> {
        let too_many = |what, found| Error::TooManyItems { what, found, max: BATCH_ITEMS_MAX };
        match self {
            Request::MetaGet { items } if items.len() > BATCH_ITEMS_MAX => {
                Err(too_many("metadata request", items.len()))
            }
            Request::Read { items } if items.len() > BATCH_ITEMS_MAX => Err(too_many("read batch", items.len())),
            Request::Read { items } => match items.iter().find(|item| item.len as usize > CHUNK_BYTES_MAX) {
                Some(item) => {
                    Err(Error::Invalid { what: "read item", reason: format!("len {} exceeds one chunk", item.len) })
                }
                None => Ok(()),
            },
            Request::ChunkWrite { len, .. } if *len as usize > CHUNK_BYTES_MAX => {
                Err(Error::Invalid { what: "chunk write", reason: format!("len {len} exceeds one chunk") })
            }
            Request::List { limit, .. } if *limit > LIST_LIMIT_MAX => {
                Err(Error::Invalid { what: "list", reason: format!("limit {limit} exceeds {LIST_LIMIT_MAX}") })
            }
            Request::Commit { meta, .. } => meta.validate(),
            _ => Ok(()),
        }
    }
}

impl Response {
    fn validate(&self) -> Result<(), Error> {
        let too_many = |what, found| Error::TooManyItems { what, found, max: BATCH_ITEMS_MAX };
        match self {
            Response::Metas { metas } if metas.len() > BATCH_ITEMS_MAX => {
                Err(too_many("metadata response", metas.len()))
            }
            Response::Read { statuses } if statuses.len() > BATCH_ITEMS_MAX => {
                Err(too_many("read response", statuses.len()))
            }
            Response::Listing { entries } if entries.len() > LIST_LIMIT_MAX as usize => {
                Err(Error::TooManyItems { what: "listing", found: entries.len(), max: LIST_LIMIT_MAX as usize })
            }
            Response::Metas { metas } => metas.iter().flatten().try_for_each(ObjectMeta::validate),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests;
