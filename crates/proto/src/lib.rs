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
//! A connection starts with a handshake that authenticates both peers with the cluster secret
//! and derives per-connection keys: the node sends [`Challenge`] (a fresh nonce, its cluster id
//! and map version), the client answers [`AuthProof`] (its own fresh nonce, cluster id and map
//! version, and an HMAC-SHA256 under the secret of all of that, the [`Transcript`], see
//! [`client_proof`]); both then derive one [`FrameMac`] per direction over the transcript
//! ([`session_macs`]). From then on every `Request` and `Response` frame is followed by a
//! [`FRAME_TAG_BYTES`] tag: HMAC-SHA256 (truncated) over a per-direction sequence number, the
//! header and the body. The node's first tagged frame ([`Response::Ok`]) proves to the client
//! that the node knows the secret too; the sequence numbers stop replays and reordering. Raw
//! chunk bytes after a frame are not tagged: their CRC32C checksums travel inside tagged frames
//! ([`Request::ChunkWrite`] carries them, [`ObjectMeta`] holds them) and are checked by the
//! receiver. CRC32C catches corruption, not a deliberate forger on the path: confidentiality
//! and cryptographic integrity of bulk bytes need the TLS transport.
//!
//! ```ignore
//! let header = FrameHeader::new(FrameKind::Request, body.len())?;
//! stream.write_all(&header.encode())?;
//! stream.write_all(&body)?;
//! ```

mod layout;
mod meta;
mod names;

pub use layout::{
    ALIGN_CHUNK_STEP, ALIGN_PAD_BASIS_POINTS_MAX, ALIGN_STRIPE_DATA_BYTES_MAX, AlignedLayout, aligned_layout,
};
pub use meta::{META_FORMAT_VERSION, ObjectMeta, PADS_MAX, Pad, PartPiece, StripeGeometry};
pub use names::{KEY_BYTES_MAX, NameError, validate_bucket, validate_key};

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// Version of the node protocol; the handshake rejects peers that speak another. Version 2
/// added per-frame MACs, the client nonce, chunk checksums on writes and commit conditions;
/// version 3 drive replacement, per-key "unavailable" and truncation flags, scrub and rebuild
/// status; version 4 the cluster id and map version in the handshake, stale-map refusals and
/// map updates; version 5 drive space (`Request::Space`); version 6 moving keys off a pool
/// (`Request::Evict`); version 7 the aligned layout (`ObjectMeta::pads`, metadata format 2);
/// version 8 `CsvFormat::empty_is_null` in `Request::RecordQuery`; version 9 brief metadata
/// reads (`MetaDetail::VersionsBrief`, `KeyVersions::checksums_left_out`) and 32 MiB frames;
/// version 10 `Request::ChunkWrite::staging` (a repair's staging file is not a writer's), and
/// appended within it `Request::RestampCommit`.
/// postcard encodes enum
/// variants by index and structs by position: any change to a message bumps this.
pub const PROTOCOL_VERSION: u16 = 10;
/// First four bytes of every frame.
pub const FRAME_MAGIC: [u8; 4] = *b"TSR1";
/// Bytes of a frame header.
pub const FRAME_HEADER_BYTES: usize = 12;
/// Largest postcard body of one frame (32 MiB): a metadata record with the 4 KiB-block
/// checksums of an 11 GiB table (4+2), with a repair commit's copy of one position's, fits; anything
/// larger is refused before allocation.
pub const CONTROL_BODY_BYTES_MAX: usize = 32 << 20;
/// Largest raw payload following one message item: one chunk.
pub const CHUNK_BYTES_MAX: usize = cluster::CHUNK_BYTES_MAX as usize;
/// Most items in one batched read or metadata request.
pub const BATCH_ITEMS_MAX: usize = 4096;
/// Most entries one listing request returns.
pub const LIST_LIMIT_MAX: u32 = 10_000;
/// Bytes of the handshake nonce and of the authentication proof.
pub const NONCE_BYTES: usize = 32;
/// Largest body of a handshake frame ([`Challenge`], [`AuthProof`]): checked before anything is
/// allocated for an unauthenticated peer.
pub const HANDSHAKE_BODY_BYTES_MAX: usize = 256;
/// Bytes of the MAC tag after every `Request` and `Response` frame.
pub const FRAME_TAG_BYTES: usize = 16;
/// Shortest cluster secret accepted (bytes of its text; `tessera init` writes 64 hex digits).
pub const SECRET_BYTES_MIN: usize = 16;

const _: () = assert!(CONTROL_BODY_BYTES_MAX < u32::MAX as usize);
const _: () = assert!(HANDSHAKE_BODY_BYTES_MAX < CONTROL_BODY_BYTES_MAX);
const _: () = assert!(FRAME_TAG_BYTES <= 32, "a tag is a truncated HMAC-SHA256");

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
    #[error("{kind:?} frame of {len} bytes exceeds the limit of {max} for its kind")]
    FrameTooLargeForKind { kind: FrameKind, len: usize, max: usize },
    #[error("frame {seq} failed authentication (forged, replayed or reordered; or a wrong cluster secret)")]
    BadFrameMac { seq: u64 },
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
        if matches!(kind, FrameKind::Challenge | FrameKind::Auth) && body_len > HANDSHAKE_BODY_BYTES_MAX {
            return Err(Error::FrameTooLargeForKind { kind, len: body_len, max: HANDSHAKE_BODY_BYTES_MAX });
        }
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

/// The node's first message on a new connection: also which cluster it belongs to and the
/// version of its map, so a client learns before anything else that it dialled another
/// cluster's node or that its map is older.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Challenge {
    pub protocol_version: u16,
    pub nonce: [u8; NONCE_BYTES],
    pub cluster_id: String,
    pub map_version: u64,
}

/// The client's answer to [`Challenge`]: its own nonce and [`client_proof`] over both, and the
/// cluster id and version of the map it plans with. Every request on the connection is served
/// under that map version: once the node holds a newer map it answers each of them with
/// [`ErrorKind::StaleMap`] (except [`Request::GetMap`] and [`Request::MapPut`]). A client
/// without a map yet (bootstrapping) sends an empty cluster id and version 0.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct AuthProof {
    pub protocol_version: u16,
    pub client_nonce: [u8; NONCE_BYTES],
    pub proof: [u8; NONCE_BYTES],
    pub cluster_id: String,
    pub map_version: u64,
}

impl AuthProof {
    /// The answer to `challenge` of a client that knows `secret`, with a fresh `client_nonce`,
    /// planning with version `map_version` of cluster `cluster_id`'s map, over a connection
    /// whose TLS channel binding is `channel_binding` (empty without TLS).
    pub fn new(
        secret: &str,
        challenge: &Challenge,
        client_nonce: [u8; NONCE_BYTES],
        cluster_id: &str,
        map_version: u64,
        channel_binding: &[u8],
    ) -> Self {
        let transcript =
            Transcript { challenge, client_nonce: &client_nonce, cluster_id, map_version, channel_binding };
        Self {
            protocol_version: PROTOCOL_VERSION,
            client_nonce,
            proof: client_proof(secret, &transcript),
            cluster_id: cluster_id.to_owned(),
            map_version,
        }
    }

    /// What this answer and `challenge` said, over a connection whose TLS channel binding is
    /// `channel_binding` (empty without TLS), for [`verify_client_proof`] and [`session_macs`].
    pub fn transcript<'a>(&'a self, challenge: &'a Challenge, channel_binding: &'a [u8]) -> Transcript<'a> {
        Transcript {
            challenge,
            client_nonce: &self.client_nonce,
            cluster_id: &self.cluster_id,
            map_version: self.map_version,
            channel_binding,
        }
    }
}

/// Everything both sides said in a handshake: the node's [`Challenge`] (nonce, cluster id, map
/// version) and the client's nonce, cluster id and map version. The client's proof and both
/// frame keys are derived over all of it, so none of it can be changed on the path unnoticed
/// (a changed field makes the proof or the node's first tagged frame fail).
///
/// Over TLS it also holds the connection's channel binding (keying material exported from the
/// TLS session, which both ends and no one else compute: `nodetls::channel_binding`), so a
/// relay that terminates TLS on both sides cannot pass the handshake on: its two connections
/// have different bindings. Without TLS the binding is empty and the transcript is what it was
/// before TLS existed.
#[derive(Clone, Copy, Debug)]
pub struct Transcript<'a> {
    pub challenge: &'a Challenge,
    pub client_nonce: &'a [u8; NONCE_BYTES],
    pub cluster_id: &'a str,
    pub map_version: u64,
    pub channel_binding: &'a [u8],
}

type HmacSha256 = Hmac<Sha256>;

fn keyed(secret: &str, label: &[u8], transcript: &Transcript<'_>) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(b"tessera node protocol v4\0");
    mac.update(label);
    mac.update(&transcript.challenge.nonce);
    mac.update(transcript.client_nonce);
    // Length-prefixed, so no two different transcripts feed the MAC the same bytes.
    for (id, version) in [
        (transcript.challenge.cluster_id.as_str(), transcript.challenge.map_version),
        (transcript.cluster_id, transcript.map_version),
    ] {
        mac.update(&(id.len() as u64).to_le_bytes());
        mac.update(id.as_bytes());
        mac.update(&version.to_le_bytes());
    }
    if !transcript.channel_binding.is_empty() {
        mac.update(b"tls channel binding\0");
        mac.update(&(transcript.channel_binding.len() as u64).to_le_bytes());
        mac.update(transcript.channel_binding);
    }
    mac
}

/// The client's proof that it knows the cluster secret: HMAC-SHA256 under the secret of a domain
/// tag and the whole handshake (the node's nonce is fresh, so a proof cannot be replayed).
pub fn client_proof(secret: &str, transcript: &Transcript<'_>) -> [u8; NONCE_BYTES] {
    keyed(secret, b"client proof\0", transcript).finalize().into_bytes().into()
}

/// Checks a [`client_proof`] in constant time.
pub fn verify_client_proof(secret: &str, transcript: &Transcript<'_>, proof: &[u8; NONCE_BYTES]) -> bool {
    keyed(secret, b"client proof\0", transcript).verify_slice(proof).is_ok()
}

/// The per-connection frame MACs, `(client to node, node to client)`: keys derived from the
/// secret and the whole handshake, so each connection and direction has its own.
pub fn session_macs(secret: &str, transcript: &Transcript<'_>) -> (FrameMac, FrameMac) {
    let derive = |label: &[u8]| {
        let key: [u8; 32] = keyed(secret, label, transcript).finalize().into_bytes().into();
        FrameMac { mac: HmacSha256::new_from_slice(&key).expect("HMAC takes keys of any length"), seq: 0 }
    };
    (derive(b"key client to node\0"), derive(b"key node to client\0"))
}

/// Tags (or checks) the frames of one direction of one connection, numbering them from 0.
#[derive(Clone)]
pub struct FrameMac {
    /// Keyed once; cloned per frame so no frame pays for the key schedule.
    mac: HmacSha256,
    seq: u64,
}

impl std::fmt::Debug for FrameMac {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameMac").field("seq", &self.seq).finish_non_exhaustive()
    }
}

impl FrameMac {
    fn tag(&self, header: &[u8; FRAME_HEADER_BYTES], body: &[u8]) -> HmacSha256 {
        let mut mac = self.mac.clone();
        mac.update(&self.seq.to_le_bytes());
        mac.update(header);
        mac.update(body);
        mac
    }

    /// The tag of the next frame sent.
    pub fn seal(&mut self, header: &[u8; FRAME_HEADER_BYTES], body: &[u8]) -> [u8; FRAME_TAG_BYTES] {
        let full = self.tag(header, body).finalize().into_bytes();
        self.seq += 1;
        full[..FRAME_TAG_BYTES].try_into().expect("a SHA-256 MAC has 32 bytes")
    }

    /// Checks the tag of the next frame received (constant time).
    pub fn open(
        &mut self,
        header: &[u8; FRAME_HEADER_BYTES],
        body: &[u8],
        tag: &[u8; FRAME_TAG_BYTES],
    ) -> Result<(), Error> {
        let seq = self.seq;
        self.tag(header, body).verify_truncated_left(tag).map_err(|_| Error::BadFrameMac { seq })?;
        self.seq += 1;
        Ok(())
    }
}

/// Encodes a tagged frame: header, body, then the tag from `mac`.
pub fn encode_sealed_frame<T: Serialize>(kind: FrameKind, message: &T, mac: &mut FrameMac) -> Result<Vec<u8>, Error> {
    let body = encode_body(message);
    let header = FrameHeader::new(kind, body.len())?.encode();
    let tag = mac.seal(&header, &body);
    let mut frame = Vec::with_capacity(FRAME_HEADER_BYTES + body.len() + FRAME_TAG_BYTES);
    frame.extend_from_slice(&header);
    frame.extend_from_slice(&body);
    frame.extend_from_slice(&tag);
    Ok(frame)
}

/// Checks that a cluster secret is long enough to authenticate anything.
pub fn validate_secret(secret: &str) -> Result<(), Error> {
    if secret.len() < SECRET_BYTES_MIN {
        return Err(Error::Invalid {
            what: "cluster secret",
            reason: format!(
                "{} bytes, at least {SECRET_BYTES_MIN} needed (`tessera init` generates one)",
                secret.len()
            ),
        });
    }
    Ok(())
}

/// Whose staging file a chunk goes to. A writer and a repair of the same version on one drive
/// (a reader's hint arrives while the PUT is still committing) each stage their own file, so
/// neither renames or aborts the other's (issue 37, item 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Staging {
    /// A PUT's (`tmp/<version>`), published by [`Request::Commit`].
    Write,
    /// A repair's (`tmp/<version>.repair`), published by [`Request::RepairCommit`].
    Repair,
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

/// A drive's record that some positions of a version's erasure set lack its chunks, kept by a
/// drive that holds the version (postcard, in the drive's `repair` table, keyed by version).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RepairRecord {
    pub bucket: String,
    pub key: String,
    /// Set positions to rebuild, ascending.
    pub positions: Vec<u32>,
    /// Failed attempts so far (the back-off grows with them).
    pub attempts: u32,
    /// Not to be tried before this time (ms since the epoch).
    pub not_before_ms: u64,
    /// When the record was made (ms since the epoch).
    pub queued_ms: u64,
    pub kind: RepairKind,
}

/// What is wrong with the positions of a [`RepairRecord`].
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub enum RepairKind {
    /// They did not get the version (down or failing when it was written): a position whose
    /// drive has the metadata since is settled.
    #[default]
    Missing,
    /// A reader found their chunk missing or corrupt: rebuilt whatever the metadata says.
    Damaged,
}

/// Most retained versions one key has on one drive (and in one [`KeyVersions`]). Past a
/// smaller number a drive drops the oldest versions that a newer acknowledged one supersedes;
/// others (maybe the newest acknowledged) it keeps, up to this bound, then refuses commits.
pub const RETAINED_PER_KEY_MAX: usize = 32;

/// The versions one drive holds of one key.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct KeyVersions {
    /// The newest version the drive committed (maybe a delete marker).
    pub current: Option<ObjectMeta>,
    /// Older versions kept beside it (replaced, not yet retired), oldest first.
    pub retained: Vec<ObjectMeta>,
    /// The newest version of the key the drive was told is acknowledged (`Finalize`): readers
    /// never return a version older than it.
    pub finalized: Option<VersionId>,
    /// The drive cannot answer for this key (it is being rebuilt, or its metadata could not be
    /// read): readers count it as a drive that did not answer, never as one without the key.
    pub unavailable: bool,
    /// Retained versions were left out of this answer (they did not fit the frame): readers
    /// cannot tell what the drive holds besides its current version.
    pub retained_truncated: bool,
    /// The versions come without block checksums (`crcs` empty, also in parts), as a brief
    /// [`MetaDetail`] asked: enough to choose a version, not to read it.
    pub checksums_left_out: bool,
}

/// What the drives of a key's set hold, counted: every version with how many drives hold it
/// (current or retained), and the newest version any drive knows acknowledged. Readers, the
/// scrubber and the rebuild choose from it.
#[derive(Debug)]
pub struct VersionTally<'a> {
    pub held: std::collections::BTreeMap<VersionId, (&'a ObjectMeta, usize)>,
    pub floor: Option<VersionId>,
}

impl<'a> VersionTally<'a> {
    /// Counts the replies of a key's drives (`None`: a drive that did not answer).
    pub fn of(replies: &'a [Option<KeyVersions>]) -> Self {
        let mut held = std::collections::BTreeMap::new();
        for versions in replies.iter().flatten() {
            for meta in versions.all() {
                held.entry(meta.version).or_insert((meta, 0)).1 += 1;
            }
        }
        Self { held, floor: replies.iter().flatten().filter_map(|v| v.finalized).max() }
    }

    /// Versions no older than the floor, oldest first.
    pub fn candidates(&self) -> impl DoubleEndedIterator<Item = (&'a ObjectMeta, usize)> + Clone + '_ {
        self.held.range(self.floor.unwrap_or(VersionId { unix_ns: 0, writer: 0 })..).map(|(_, (m, c))| (*m, *c))
    }

    /// The newest version no older than the floor that enough drives hold to be read.
    pub fn newest_readable(&self, marker_quorum: usize) -> Option<&'a ObjectMeta> {
        self.candidates().rev().find(|(meta, count)| *count >= meta.drives_to_read(marker_quorum)).map(|(m, _)| m)
    }

    /// How many drives hold the most widely held version.
    pub fn most_held(&self) -> usize {
        self.held.values().map(|(_, count)| *count).max().unwrap_or(0)
    }
}

impl KeyVersions {
    /// Every version, current first.
    pub fn all(&self) -> impl Iterator<Item = &ObjectMeta> {
        self.current.iter().chain(self.retained.iter().rev())
    }
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
    /// Every version each key has on its drive: the current one and the retained older ones,
    /// and with [`MetaDetail::WithFloor`] the newest version the drive knows acknowledged.
    MetaGet { items: Vec<MetaKey>, detail: MetaDetail },
    /// Write `len` raw bytes (following this frame) at `offset` of the staging file of `version`.
    /// `crcs` are the CRC32C of each `block_bytes` block of those bytes (the last may be short):
    /// the node checks them before writing, so bytes damaged in transit are refused.
    ChunkWrite {
        drive: u32,
        bucket: String,
        version: VersionId,
        offset: u64,
        len: u32,
        block_bytes: u32,
        crcs: Vec<u32>,
        /// Whose staging file: a writer's ([`Request::Commit`]) or a repair's
        /// ([`Request::RepairCommit`]).
        staging: Staging,
    },
    /// Make `meta` durable and current on `drive` if it is newer than what the drive has and
    /// `condition` holds. `missing_positions` lists set positions that did not get their chunks
    /// (queued for repair).
    Commit { drive: u32, meta: ObjectMeta, missing_positions: Vec<u32>, condition: CommitCondition },
    /// Drop the staging file of an uncommitted version.
    Abort { drive: u32, version: VersionId },
    /// Undo the commit of a PUT that failed to reach its write quorum: the version it replaced
    /// becomes current again.
    Rollback { drive: u32, bucket: String, key: String, version: VersionId },
    /// `version` is acknowledged (committed on W drives): older retained versions of the key
    /// may retire after the node's grace; `missing_positions` (set positions that did not
    /// commit it) are queued for repair.
    Finalize { drive: u32, bucket: String, key: String, version: VersionId, missing_positions: Vec<u32> },
    /// A reader found `positions` of `version` missing or corrupt: queue their repair on
    /// `drive`, which holds the version (read repair).
    RepairHint { drive: u32, bucket: String, key: String, version: VersionId, positions: Vec<u32> },
    /// Repair's commit: the staged chunks of `meta` (sent with `ChunkWrite`) become this drive's
    /// data file of the version, replacing a damaged one if the drive has the version already,
    /// once the whole staged file matches `crcs` (its blocks, stripe by stripe).
    RepairCommit { drive: u32, meta: ObjectMeta, crcs: Vec<u32> },
    /// Change the node's background repair.
    RepairControl { action: RepairAction },
    /// The node's repair state ([`Response::RepairStatus`]).
    RepairStatus,
    /// Batched scatter-gather read.
    Read { items: Vec<ReadItem> },
    /// Keys of `bucket` after `start_after` that start with `prefix`, sorted, at most `limit`.
    List { drive: u32, bucket: String, prefix: String, start_after: String, limit: u32 },
    /// `drive` was replaced (or is not trusted): wipe what it holds, treat it as missing for
    /// readers, and rebuild it in full from the other drives of its set.
    DriveReplace { drive: u32 },
    /// This connection carries background work (repair, rebuild, scrubbing; nodes send it to
    /// each other): the node serves the rest of it at lowered CPU priority, so that foreground
    /// requests go first. Answered with [`Response::Ok`].
    Background,
    /// Replace the node's map (`cluster.toml` text) with the next version, if the node holds
    /// `expected_version` now ([`ErrorKind::MapConflict`] if not) and the new map keeps every
    /// node, drive and set of the old one (`cluster::ClusterMap::check_successor`). The node
    /// writes it to its `cluster.toml` durably before it answers. Idempotent: a node that
    /// already holds exactly this map answers `Ok`.
    MapPut { expected_version: u64, toml: String },
    /// Free and total bytes of each of the node's drives ([`Response::Space`]): clients draw
    /// the pool of a new key in proportion to free space.
    Space,
    /// `bucket/key` was copied to another pool up to `version` (acknowledged there): every
    /// version of it on `drive` not newer than `version` stops being current and retires after
    /// the node's grace (readers that chose one finish meanwhile), its repairs are dropped, and
    /// the key leaves the drive's listing. Newer versions stay. Answered with [`Response::Ok`]
    /// (also when the drive holds nothing of the key).
    Evict { drive: u32, bucket: String, key: String, version: VersionId },
    /// Near-data query: evaluate `scan` over the listed row groups of Parquet objects (each a
    /// version this node holds on `drive`) and stream the matching rows back as Arrow IPC:
    /// [`Response::QueryData`] frames, each followed by its raw bytes, then one
    /// [`Response::QueryDone`] (or a [`Response::Error`] at any point). The node reads the
    /// bytes of the row groups from its own drives and, for what lies on other drives, from
    /// its peers; a chunk missing or corrupt there is rebuilt from k others of its stripe.
    /// Closing the connection cancels the query.
    Query { scan: ScanSpec, objects: Vec<QueryObject> },
    /// A near-data query with a partial aggregate: as [`Request::Query`], but the node answers
    /// one row per group of its own matching rows (the `aggregate`'s group columns, then its
    /// aggregates), which the client combines with the other nodes' rows. `scan` names no
    /// columns, count or limit. Appended within protocol version 6 as `Query` was: a node that
    /// predates it fails to decode the request and closes the connection, and the client
    /// evaluates that node's row groups itself.
    AggregateQuery { scan: ScanSpec, aggregate: AggregateSpec, objects: Vec<QueryObject> },
    /// A near-data query over CSV or JSON-lines objects: as [`Request::Query`] (with
    /// `aggregate`, as [`Request::AggregateQuery`]), over the records that start in each
    /// object's listed splits, decoded as `format` says into a table of `schema` (an Arrow IPC
    /// stream holding only its schema, at most [`RECORD_SCHEMA_BYTES_MAX`]). The node reads a
    /// split from its own drives and the last record's tail from the neighbouring chunk, as
    /// input splits do. Appended within protocol version 7 as `AggregateQuery` was (a node
    /// that predates it fails to decode the request, and the client evaluates its splits);
    /// version 8 added [`CsvFormat::empty_is_null`].
    RecordQuery {
        scan: ScanSpec,
        aggregate: Option<AggregateSpec>,
        format: RecordFormat,
        schema: Vec<u8>,
        objects: Vec<RecordObject>,
    },
    /// What `tessera status` shows of a node: its build, uptime, map and drives
    /// ([`Response::NodeInfo`]). Appended within protocol version 9 as the queries were: a node
    /// that predates it fails to decode it and closes the connection.
    NodeInfo,
    /// A writer's re-stamp (issue 37, item 9): its commit of `of` reached W drives but found a
    /// newer version current on some, so it commits the same object again as `meta.version`
    /// (newer than any they reported), which then orders after them. The drive links `of`'s
    /// data file under the new version's name (it must hold it: a version without data needs
    /// none) and commits `meta` as [`Request::Commit`] does, without a condition; `of` stays,
    /// retained, and retires below the new version. Appended within protocol version 10 as
    /// [`Request::NodeInfo`] was within 9: a node that predates it closes the connection, and
    /// the writer acknowledges `of` as it did before.
    RestampCommit { drive: u32, meta: ObjectMeta, of: VersionId, missing_positions: Vec<u32> },
}

/// Bytes of a [`Request::RecordQuery`]'s schema at most.
pub const RECORD_SCHEMA_BYTES_MAX: usize = 1 << 20;
/// Splits one [`Request::RecordQuery`] lists at most (over all its objects).
pub const RECORD_SPLITS_MAX: usize = 1 << 16;

/// How a [`Request::RecordQuery`]'s objects write their records: one per line.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum RecordFormat {
    Csv(CsvFormat),
    /// One JSON object per line.
    JsonLines,
}

/// CSV records, typed by the query's schema (S3 Select: every column a string).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct CsvFormat {
    /// The object's first line is a header, not a record.
    pub header: bool,
    pub delimiter: u8,
    pub quote: u8,
    /// Inside a quoted field, this byte makes the next one literal (`None`: a doubled quote).
    pub escape: Option<u8>,
    /// Lines starting with this byte are skipped.
    pub comment: Option<u8>,
    /// An empty field of a string column is NULL (as SQL engines read CSV), not an empty
    /// string (S3 Select's rule). An empty field of any other type is always NULL.
    pub empty_is_null: bool,
}

/// The records of an object whose first byte lies in `first..=last` (each read to its line
/// break, past `last` if it must be).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RecordSplit {
    pub first: u64,
    pub last: u64,
}

/// One object of a [`Request::RecordQuery`]: which version and which of its records.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RecordObject {
    /// A drive of this node that holds the version's metadata.
    pub drive: u32,
    pub bucket: String,
    pub key: String,
    pub version: VersionId,
    /// In order, not overlapping.
    pub splits: Vec<RecordSplit>,
}

/// What a node evaluates over its row groups: `SELECT columns FROM t WHERE filters LIMIT limit`
/// (with a [`Request::AggregateQuery`]'s aggregate: `SELECT group_by, aggregates FROM t WHERE
/// filters GROUP BY group_by`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ScanSpec {
    /// Columns to return, in order; empty with `count_only` or an aggregate.
    pub columns: Vec<String>,
    /// SQL boolean expressions over the columns, all of which a row must satisfy.
    pub filters: Vec<String>,
    /// At most this many rows (per node; the client applies the query's own limit). `None`
    /// with an aggregate.
    pub limit: Option<u64>,
    /// Return no rows, only how many match ([`Response::QueryDone`]'s `rows`).
    pub count_only: bool,
}

/// Group columns, and aggregates, of a partial aggregate ([`Request::AggregateQuery`]) at most.
pub const AGGREGATE_ITEMS_MAX: usize = 256;

/// A partial aggregate ([`Request::AggregateQuery`]): the answer's columns are the `group_by`
/// expressions, then one column per aggregate, each over the rows of this node that match the
/// scan's filters.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct AggregateSpec {
    /// SQL expressions over the table's columns (at most [`AGGREGATE_ITEMS_MAX`]).
    pub group_by: Vec<String>,
    /// At most [`AGGREGATE_ITEMS_MAX`].
    pub aggregates: Vec<PartialAggregate>,
}

/// One aggregate of an [`AggregateSpec`]: a function over an SQL expression, or `count` of
/// rows when `argument` is `None`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PartialAggregate {
    pub function: AggregateFunction,
    pub argument: Option<String>,
}

/// Aggregate functions whose results over parts combine into the result over the whole:
/// counts and sums add up, minimums and maximums compare (an average is a sum and a count).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum AggregateFunction {
    /// Non-null values of the argument (rows without one).
    Count,
    Sum,
    Min,
    Max,
}

/// One object of a [`Request::Query`]: which version, its Parquet footer (the client has read
/// it to plan the query, so the node need not fetch it again) and the row groups to evaluate.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct QueryObject {
    /// A drive of this node that holds the version's metadata.
    pub drive: u32,
    pub bucket: String,
    pub key: String,
    pub version: VersionId,
    /// The Thrift-encoded Parquet file metadata (the bytes before the last 8 of the file).
    pub footer: Vec<u8>,
    pub row_groups: Vec<u32>,
}

/// How much a [`Request::MetaGet`] answers per key.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum MetaDetail {
    /// Current and retained versions (`KeyVersions::finalized` is `None`): what a read needs
    /// when the newest version is readable, the common case.
    Versions,
    /// Also the acknowledged floor: for reads whose newest version is not readable.
    WithFloor,
    /// [`MetaDetail::Versions`] without block checksums ([`KeyVersions::checksums_left_out`]):
    /// a client that holds a version's checksums already asks only which version to read
    /// (a large table's checksums are megabytes from every drive).
    VersionsBrief,
    /// [`MetaDetail::WithFloor`] without block checksums.
    WithFloorBrief,
}

impl MetaDetail {
    /// Whether the answer carries each drive's acknowledged floor.
    pub fn with_floor(self) -> bool {
        matches!(self, MetaDetail::WithFloor | MetaDetail::WithFloorBrief)
    }

    /// Whether the answer leaves block checksums out.
    pub fn brief(self) -> bool {
        matches!(self, MetaDetail::VersionsBrief | MetaDetail::WithFloorBrief)
    }

    /// The same detail with the floor.
    pub fn floored(self) -> Self {
        if self.brief() { MetaDetail::WithFloorBrief } else { MetaDetail::WithFloor }
    }

    /// [`MetaDetail::Versions`] or [`MetaDetail::WithFloor`], brief if asked.
    pub fn of(with_floor: bool, brief: bool) -> Self {
        match (with_floor, brief) {
            (false, false) => MetaDetail::Versions,
            (true, false) => MetaDetail::WithFloor,
            (false, true) => MetaDetail::VersionsBrief,
            (true, true) => MetaDetail::WithFloorBrief,
        }
    }
}

/// An admin's change to a node's background repair.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum RepairAction {
    Pause,
    Resume,
    /// A new budget, bytes per second read and written by repair (at least 1).
    SetRate {
        bytes_per_s: u64,
    },
}

/// A node's repair state.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RepairStatus {
    pub paused: bool,
    pub bytes_per_s: u64,
    /// One per drive of the node, in order.
    pub drives: Vec<DriveRepairStatus>,
    pub scrub: ScrubStatus,
}

/// A node's background scrubber: passes over its drives' keys.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ScrubStatus {
    /// Passes finished since the node started, and how many of them were deep (whole chunks read
    /// and checked against their block checksums).
    pub passes: u64,
    pub deep_passes: u64,
    /// Keys checked and problems queued for repair since the node started.
    pub keys_checked: u64,
    pub problems_found: u64,
    /// Delete markers collected since the node started (held by every drive of their set).
    pub markers_collected: u64,
    /// When the last pass ended (Unix ms; 0 if none has).
    pub last_pass_end_ms: u64,
    /// Whether a pass is running now.
    pub running: bool,
}

/// One drive's repair state.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct DriveRepairStatus {
    /// Versions this drive holds that other drives of their set lack (below full redundancy).
    pub queued_versions: u64,
    /// Bytes to write to rebuild them (estimate).
    pub queued_bytes: u64,
    /// Of those, versions with fewer than k+1 healthy chunks.
    pub at_risk: u64,
    /// Since the node started.
    pub bytes_repaired: u64,
    pub versions_repaired: u64,
    pub failed_attempts: u64,
    /// The drive was wiped or replaced and is being rebuilt from its set: readers skip it.
    pub rebuilding: bool,
    /// Keys the rebuild has gone through, and of those it rebuilt (both since it began).
    pub rebuild_keys_checked: u64,
    pub rebuild_keys_rebuilt: u64,
}

/// What must hold on the drive for a [`Request::Commit`] to apply.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub enum CommitCondition {
    /// Apply if newer than the drive's current version.
    #[default]
    None,
    /// Also refuse ([`ErrorKind::PreconditionFailed`]) if the drive's current version of the key
    /// is a live object (S3 `If-None-Match: *`). Write quorums intersect, so of two such writers
    /// at most one reaches W.
    IfAbsent,
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
    /// A [`CommitCondition`] did not hold.
    PreconditionFailed,
    /// Chunk bytes did not match the checksums sent with them (damaged in transit).
    ChecksumMismatch,
    /// The node holds a newer cluster map than the connection's: fetch it
    /// ([`Request::GetMap`]) and retry.
    StaleMap,
    /// A [`Request::MapPut`] expected another map version than the node holds.
    MapConflict,
    /// A query could not run: bad SQL, unknown columns, data that is not what it claims.
    BadQuery,
    /// Fewer than k chunks of a stripe could be read.
    Unavailable,
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
    /// One entry per [`MetaKey`] asked, in order; possibly only the first ones (at least one),
    /// when all of them would not fit in one frame: the client asks again for the rest.
    Versions {
        keys: Vec<KeyVersions>,
    },
    RepairStatus {
        status: RepairStatus,
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
    /// One per drive of the node, in order.
    Space {
        drives: Vec<DriveSpace>,
    },
    /// Followed by `len` bytes of a [`Request::Query`]'s Arrow IPC stream (the schema first,
    /// then record batches) whose CRC32C is `crc`.
    QueryData {
        len: u32,
        crc: u32,
    },
    /// The query's end: rows that matched and bytes the node read to find them (from its own
    /// drives and from peers).
    QueryDone {
        rows: u64,
        local_bytes: u64,
        peer_bytes: u64,
    },
    NodeInfo {
        info: NodeInfo,
    },
}

/// A node as [`Request::NodeInfo`] answers it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct NodeInfo {
    /// The node's build (the crate version).
    pub version: String,
    pub uptime_ms: u64,
    /// The version of the cluster map it serves under.
    pub map_version: u64,
    /// Authenticated connections being served.
    pub connections: u64,
    /// One per drive of the node, in order.
    pub drives: Vec<DriveInfo>,
}

/// One drive of a [`NodeInfo`].
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct DriveInfo {
    pub free_bytes: u64,
    pub total_bytes: u64,
    /// Object versions with data on the drive; `None` when it could not be read.
    pub versions: Option<u64>,
    /// I/O and database errors since the node started (a failed read of this info included).
    pub errors: u64,
    /// Being rebuilt (wiped or replaced): readers skip it meanwhile.
    pub rebuilding: bool,
    /// Why the drive could not answer, if it could not.
    pub problem: Option<String>,
}

/// Bytes of Arrow IPC one [`Response::QueryData`] carries at most.
pub const QUERY_DATA_BYTES_MAX: usize = 64 << 20;
/// Footer bytes one [`Request::Query`] carries at most (all objects together); a client splits
/// larger ones over several requests.
pub const QUERY_FOOTER_BYTES_MAX: usize = 8 << 20;

/// The file system space of one drive.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct DriveSpace {
    /// Bytes an unprivileged writer can still use.
    pub free_bytes: u64,
    pub total_bytes: u64,
}

impl Request {
    fn validate(&self) -> Result<(), Error> {
        let too_many = |what, found| Error::TooManyItems { what, found, max: BATCH_ITEMS_MAX };
        match self {
            Request::MetaGet { items, .. } if items.len() > BATCH_ITEMS_MAX => {
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
            Request::ChunkWrite { len, block_bytes, crcs, .. } => {
                if *block_bytes == 0 || crcs.len() != len.div_ceil(*block_bytes) as usize {
                    return Err(Error::Invalid {
                        what: "chunk write",
                        reason: format!("{} checksums for {len} bytes in blocks of {block_bytes}", crcs.len()),
                    });
                }
                Ok(())
            }
            Request::Query { objects, .. } | Request::AggregateQuery { objects, .. }
                if objects.len() > BATCH_ITEMS_MAX =>
            {
                Err(too_many("query objects", objects.len()))
            }
            Request::Query { objects, .. } | Request::AggregateQuery { objects, .. } => {
                if let Request::AggregateQuery { aggregate, .. } = self {
                    for (what, found) in
                        [("group columns", aggregate.group_by.len()), ("aggregates", aggregate.aggregates.len())]
                    {
                        if found > AGGREGATE_ITEMS_MAX {
                            return Err(Error::TooManyItems { what, found, max: AGGREGATE_ITEMS_MAX });
                        }
                    }
                }
                let footers: usize = objects.iter().map(|o| o.footer.len()).sum();
                if footers > QUERY_FOOTER_BYTES_MAX {
                    return Err(Error::Invalid {
                        what: "query",
                        reason: format!("{footers} footer bytes exceed {QUERY_FOOTER_BYTES_MAX}"),
                    });
                }
                Ok(())
            }
            Request::RecordQuery { objects, .. } if objects.len() > BATCH_ITEMS_MAX => {
                Err(too_many("query objects", objects.len()))
            }
            Request::RecordQuery { aggregate, schema, objects, .. } => {
                if let Some(aggregate) = aggregate {
                    for (what, found) in
                        [("group columns", aggregate.group_by.len()), ("aggregates", aggregate.aggregates.len())]
                    {
                        if found > AGGREGATE_ITEMS_MAX {
                            return Err(Error::TooManyItems { what, found, max: AGGREGATE_ITEMS_MAX });
                        }
                    }
                }
                if schema.len() > RECORD_SCHEMA_BYTES_MAX {
                    return Err(Error::Invalid {
                        what: "record query",
                        reason: format!("a schema of {} bytes exceeds {RECORD_SCHEMA_BYTES_MAX}", schema.len()),
                    });
                }
                let splits: usize = objects.iter().map(|o| o.splits.len()).sum();
                if splits > RECORD_SPLITS_MAX {
                    return Err(Error::TooManyItems { what: "record splits", found: splits, max: RECORD_SPLITS_MAX });
                }
                for object in objects {
                    let mut after: Option<u64> = None;
                    for split in &object.splits {
                        if split.first > split.last || after.is_some_and(|a| split.first <= a) {
                            return Err(Error::Invalid {
                                what: "record query",
                                reason: format!(
                                    "splits of {}/{} must be in order and apart ({}..={})",
                                    object.bucket, object.key, split.first, split.last
                                ),
                            });
                        }
                        after = Some(split.last);
                    }
                }
                Ok(())
            }
            Request::List { limit, .. } if *limit > LIST_LIMIT_MAX => {
                Err(Error::Invalid { what: "list", reason: format!("limit {limit} exceeds {LIST_LIMIT_MAX}") })
            }
            Request::Commit { meta, missing_positions, .. } => {
                check_positions(missing_positions)?;
                meta.validate()
            }
            Request::RestampCommit { meta, of, missing_positions, .. } => {
                check_positions(missing_positions)?;
                if *of >= meta.version {
                    return Err(Error::Invalid {
                        what: "re-stamp",
                        reason: format!("{} is not newer than {}", meta.version.to_hex(), of.to_hex()),
                    });
                }
                meta.validate()
            }
            Request::RepairCommit { meta, crcs, .. } => {
                meta.validate()?;
                if crcs.len() > meta.crcs.len() {
                    return Err(Error::TooManyItems {
                        what: "repair checksums",
                        found: crcs.len(),
                        max: meta.crcs.len(),
                    });
                }
                Ok(())
            }
            Request::RepairControl { action: RepairAction::SetRate { bytes_per_s: 0 } } => {
                Err(Error::Invalid { what: "repair rate", reason: "0 bytes/s (pause instead)".into() })
            }
            Request::RepairHint { positions, .. } | Request::Finalize { missing_positions: positions, .. } => {
                check_positions(positions)
            }
            _ => Ok(()),
        }
    }
}

/// Set positions from a peer: at most `N_MAX` of them, each below `N_MAX` (a node checks them
/// against the version's own n before use).
fn check_positions(positions: &[u32]) -> Result<(), Error> {
    if positions.len() > cluster::N_MAX || positions.iter().any(|p| *p as usize >= cluster::N_MAX) {
        let reason = format!("{} positions, each must be below {}", positions.len(), cluster::N_MAX);
        return Err(Error::Invalid { what: "set positions", reason });
    }
    Ok(())
}

impl Response {
    fn validate(&self) -> Result<(), Error> {
        let too_many = |what, found| Error::TooManyItems { what, found, max: BATCH_ITEMS_MAX };
        match self {
            Response::Versions { keys } if keys.len() > BATCH_ITEMS_MAX => {
                Err(too_many("metadata response", keys.len()))
            }
            Response::Read { statuses } if statuses.len() > BATCH_ITEMS_MAX => {
                Err(too_many("read response", statuses.len()))
            }
            Response::Listing { entries } if entries.len() > LIST_LIMIT_MAX as usize => {
                Err(Error::TooManyItems { what: "listing", found: entries.len(), max: LIST_LIMIT_MAX as usize })
            }
            Response::Versions { keys } => keys.iter().try_for_each(|versions| {
                if versions.retained.len() > RETAINED_PER_KEY_MAX {
                    return Err(Error::TooManyItems {
                        what: "retained versions",
                        found: versions.retained.len(),
                        max: RETAINED_PER_KEY_MAX,
                    });
                }
                if versions.checksums_left_out {
                    versions.all().try_for_each(ObjectMeta::validate_brief)
                } else {
                    versions.all().try_for_each(ObjectMeta::validate)
                }
            }),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests;
