//! Object metadata: one record per object version, stored on every drive of the object's
//! erasure set and sent to clients. The same bytes go to disk and to the wire.

use serde::{Deserialize, Serialize};

use crate::{CHUNK_BYTES_MAX, Error, VersionId};

/// Version of the [`ObjectMeta`] record. Version 2 added [`ObjectMeta::pads`]; a version 1
/// record (stored by an older build) is still read ([`ObjectMeta::decode_stored`]); readers
/// refuse others.
pub const META_FORMAT_VERSION: u16 = 2;

/// Most pads one record may carry (one per row group of an aligned object, and one at the end).
pub const PADS_MAX: usize = 1 << 16;

/// One object version: identity, size, erasure layout and a CRC32C per chunk.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ObjectMeta {
    pub format: u16,
    pub bucket: String,
    pub key: String,
    pub version: VersionId,
    /// A delete marker: the key is absent as of `version`.
    pub deleted: bool,
    pub size: u64,
    /// Hex MD5 of the body.
    pub etag: String,
    pub content_type: String,
    /// `x-amz-meta-*` pairs (names without the prefix).
    pub user_meta: Vec<(String, String)>,
    /// Standard headers replayed on GET: content-encoding, content-disposition, cache-control,
    /// content-language, expires (lowercase names).
    pub headers: Vec<(String, String)>,
    pub modified_ms: u64,
    pub k: u8,
    pub m: u8,
    pub chunk_bytes: u32,
    pub set_idx: u32,
    pub rotation: u8,
    /// Bytes per checksum block: every chunk has a CRC32C per block, so a ranged read fetches
    /// and verifies only the blocks it needs. At most `chunk_bytes`.
    pub block_bytes: u32,
    /// CRC32C of every block of every chunk, stripe-major, then chunk, then block: see
    /// [`ObjectMeta::block_crcs`]. Empty for a multipart object, whose bytes live in `parts`.
    pub crcs: Vec<u32>,
    /// A multipart object: its parts in order, each an erasure-coded piece of its own (written
    /// by UploadPart, never copied). Empty for a single-piece object.
    pub parts: Vec<PartPiece>,
    /// The aligned layout (format 2): zero bytes stored before some object offsets, so that
    /// chosen byte ranges (Parquet row groups) each lie inside one data chunk. The stored
    /// stream, which stripes and checksums cover, is the object's bytes with these zeros
    /// inserted; empty for the plain layout (and for multipart objects). See
    /// [`crate::aligned_layout`].
    pub pads: Vec<Pad>,
}

/// `len` zero bytes stored before object byte `at` (`at == size`: after the last byte).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Pad {
    pub at: u64,
    pub len: u32,
}

/// The record as format 1 stored it: [`ObjectMeta`] without `pads`. postcard encodes structs
/// by position, so a record written before pads existed decodes only as this.
#[derive(Deserialize)]
struct ObjectMetaV1 {
    format: u16,
    bucket: String,
    key: String,
    version: VersionId,
    deleted: bool,
    size: u64,
    etag: String,
    content_type: String,
    user_meta: Vec<(String, String)>,
    headers: Vec<(String, String)>,
    modified_ms: u64,
    k: u8,
    m: u8,
    chunk_bytes: u32,
    set_idx: u32,
    rotation: u8,
    block_bytes: u32,
    crcs: Vec<u32>,
    parts: Vec<PartPiece>,
}

/// One part of a multipart object: where its piece is and how to verify it. The piece has the
/// object's k, m and chunk size, its own set and rotation.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PartPiece {
    pub number: u32,
    /// Internal key of the piece (in the multipart bucket); deleted with the object.
    pub piece_key: String,
    pub version: VersionId,
    pub size: u64,
    /// Hex MD5 of the part.
    pub etag: String,
    pub set_idx: u32,
    pub rotation: u8,
    pub crcs: Vec<u32>,
}

/// The fields of a stored record (the current format) before its checksums: what a brief
/// metadata answer needs of them. postcard encodes structs field after field with nothing
/// between, so the record is read in pieces: this, the checksums read past
/// ([`skip_checksums`]), the parts (each a [`BriefPartHead`] and its checksums), the pads.
#[derive(Deserialize)]
struct BriefHead {
    format: u16,
    bucket: String,
    key: String,
    version: VersionId,
    deleted: bool,
    size: u64,
    etag: String,
    content_type: String,
    user_meta: Vec<(String, String)>,
    headers: Vec<(String, String)>,
    modified_ms: u64,
    k: u8,
    m: u8,
    chunk_bytes: u32,
    set_idx: u32,
    rotation: u8,
    block_bytes: u32,
}

/// [`PartPiece`] as stored, up to its checksums.
#[derive(Deserialize)]
struct BriefPartHead {
    number: u32,
    piece_key: String,
    version: VersionId,
    size: u64,
    etag: String,
    set_idx: u32,
    rotation: u8,
}

/// Reads past a postcard `Vec<u32>` at the start of `bytes` without decoding it: returns its
/// length and the bytes after it. Each `u32` is a varint whose last byte is below 0x80, so
/// counting those bytes (64 at a time, vectorized) finds the end: an 8 GiB table's 3 million
/// checksums (15 MB) in ~0.3 ms, where decoding them one by one took ~7 ms on every drive of
/// the set, for every version-only read. Only the count of varints is checked here (not that each
/// is at most 5 bytes): a record read whole is decoded strictly.
fn skip_checksums(bytes: &[u8]) -> Result<(usize, &[u8]), postcard::Error> {
    const BLOCK: usize = 64;
    let (count, rest) = postcard::take_from_bytes::<usize>(bytes)?;
    let (mut ends, mut at) = (0usize, 0usize);
    // A block of 64 bytes holds at most 64 ends: never past the last one while 64 or more are
    // due. A byte count of a fixed-size block in a u8 (at most 64) is what the compiler
    // vectorizes (a usize sum per byte was slower than eight bytes at a time).
    while count - ends >= BLOCK && rest.len() - at >= BLOCK {
        let block: &[u8; BLOCK] = rest[at..at + BLOCK].try_into().expect("a whole block");
        ends += usize::from(block.iter().fold(0u8, |n, &b| n + (!b >> 7)));
        at += BLOCK;
    }
    while ends < count {
        let byte = *rest.get(at).ok_or(postcard::Error::DeserializeUnexpectedEnd)?;
        at += 1;
        ends += usize::from(byte < 0x80);
    }
    Ok((count, &rest[at..]))
}

impl ObjectMeta {
    /// [`ObjectMeta::decode_stored`] and [`ObjectMeta::validate`] of a record whose checksums
    /// are left out ([`ObjectMeta::brief`]): they are read past, counted against the layout,
    /// and never allocated.
    pub fn decode_stored_brief(bytes: &[u8]) -> Result<Self, Error> {
        const WHAT: &str = "stored object metadata";
        let (format, _) =
            postcard::take_from_bytes::<u16>(bytes).map_err(|source| Error::Decode { what: WHAT, source })?;
        if format != META_FORMAT_VERSION {
            let meta = Self::decode_stored(bytes)?;
            meta.validate()?;
            return Ok(meta.brief());
        }
        let decode = |source| Error::Decode { what: WHAT, source };
        let (head, rest) = postcard::take_from_bytes::<BriefHead>(bytes).map_err(decode)?;
        let (crc_count, rest) = skip_checksums(rest).map_err(decode)?;
        let (part_count, mut rest) = postcard::take_from_bytes::<usize>(rest).map_err(decode)?;
        // Every part takes bytes: a count past them is a corrupt record, not an allocation.
        let mut parts = Vec::with_capacity(part_count.min(rest.len()));
        let mut part_counts = Vec::with_capacity(part_count.min(rest.len()));
        for _ in 0..part_count {
            let (p, after) = postcard::take_from_bytes::<BriefPartHead>(rest).map_err(decode)?;
            let (count, after) = skip_checksums(after).map_err(decode)?;
            rest = after;
            part_counts.push(count);
            parts.push(PartPiece {
                number: p.number,
                piece_key: p.piece_key,
                version: p.version,
                size: p.size,
                etag: p.etag,
                set_idx: p.set_idx,
                rotation: p.rotation,
                crcs: Vec::new(),
            });
        }
        let (pads, _) = postcard::take_from_bytes::<Vec<Pad>>(rest).map_err(decode)?;
        let meta = ObjectMeta {
            format: head.format,
            bucket: head.bucket,
            key: head.key,
            version: head.version,
            deleted: head.deleted,
            size: head.size,
            etag: head.etag,
            content_type: head.content_type,
            user_meta: head.user_meta,
            headers: head.headers,
            modified_ms: head.modified_ms,
            k: head.k,
            m: head.m,
            chunk_bytes: head.chunk_bytes,
            set_idx: head.set_idx,
            rotation: head.rotation,
            block_bytes: head.block_bytes,
            crcs: Vec::new(),
            parts,
            pads,
        };
        meta.validate_brief()?;
        // What `validate` checks of the checksums: their number.
        let expected = if !meta.deleted && meta.parts.is_empty() { meta.checksums_for(meta.stored_size()) } else { 0 };
        let parts_match = meta.parts.iter().zip(&part_counts).all(|(p, n)| *n as u128 == meta.checksums_for(p.size));
        if crc_count as u128 != expected {
            let reason = format!("{crc_count} checksums, the layout needs {expected}");
            return Err(Error::Invalid { what: "object metadata", reason });
        }
        if !parts_match {
            let reason = "a part's checksums do not match its layout".to_string();
            return Err(Error::Invalid { what: "object metadata", reason });
        }
        Ok(meta)
    }

    /// Decodes a record read from a drive: the current format, or format 1 (no pads: the plain
    /// layout), which comes back as the current format.
    pub fn decode_stored(bytes: &[u8]) -> Result<Self, Error> {
        const WHAT: &str = "stored object metadata";
        let (format, _) =
            postcard::take_from_bytes::<u16>(bytes).map_err(|source| Error::Decode { what: WHAT, source })?;
        if format != 1 {
            return crate::decode_message(bytes, WHAT);
        }
        let old: ObjectMetaV1 = crate::decode_message(bytes, WHAT)?;
        assert_eq!(old.format, 1);
        Ok(Self {
            format: META_FORMAT_VERSION,
            bucket: old.bucket,
            key: old.key,
            version: old.version,
            deleted: old.deleted,
            size: old.size,
            etag: old.etag,
            content_type: old.content_type,
            user_meta: old.user_meta,
            headers: old.headers,
            modified_ms: old.modified_ms,
            k: old.k,
            m: old.m,
            chunk_bytes: old.chunk_bytes,
            set_idx: old.set_idx,
            rotation: old.rotation,
            block_bytes: old.block_bytes,
            crcs: old.crcs,
            parts: old.parts,
            pads: Vec::new(),
        })
    }

    /// Bytes of the stored stream: the object's bytes and its pads.
    pub fn stored_size(&self) -> u64 {
        self.size + self.pads.iter().map(|p| u64::from(p.len)).sum::<u64>()
    }

    /// Where object byte `offset` lies in the stored stream (`offset == size`: its end).
    pub fn stored_offset(&self, offset: u64) -> u64 {
        offset + self.pads.iter().take_while(|p| p.at <= offset).map(|p| u64::from(p.len)).sum::<u64>()
    }

    /// The stored ranges that hold object bytes `range`, in order: one per stretch between
    /// pads. Their lengths add up to the range's.
    pub fn stored_ranges(&self, range: std::ops::Range<u64>) -> Vec<std::ops::Range<u64>> {
        assert!(range.start <= range.end && range.end <= self.size, "a range inside the object");
        let mut out = Vec::new();
        let mut at = range.start;
        let mut shift = 0u64;
        for pad in &self.pads {
            if pad.at <= at {
                shift += u64::from(pad.len);
                continue;
            }
            if pad.at >= range.end {
                break;
            }
            out.push(at + shift..pad.at + shift);
            at = pad.at;
            shift += u64::from(pad.len);
        }
        if at < range.end || out.is_empty() {
            out.push(at + shift..range.end + shift);
        }
        out
    }

    /// Chunks per stripe.
    pub fn n(&self) -> usize {
        usize::from(self.k) + usize::from(self.m)
    }

    /// Block checksums a piece of `size` bytes has with this record's layout.
    pub(crate) fn checksums_for(&self, size: u64) -> u128 {
        let geometry = StripeGeometry::new(size, usize::from(self.k), self.chunk_bytes);
        if geometry.stripes == 0 {
            return 0;
        }
        let blocks = |len: usize| len.div_ceil(self.block_bytes as usize) as u128;
        let last = geometry.stripes - 1;
        let n = self.n() as u128;
        u128::from(last) * n * blocks(self.chunk_bytes as usize) + n * blocks(geometry.chunk_len(last))
    }

    /// Whether this version owns a data file of its own on each drive of its set.
    pub fn has_data_file(&self) -> bool {
        !self.deleted && self.size > 0 && self.parts.is_empty()
    }

    /// How many drives must hold this version for a reader to take it: k when it has chunks
    /// (a data file or parts), `marker_quorum` otherwise (a delete marker, an empty object).
    pub fn drives_to_read(&self, marker_quorum: usize) -> usize {
        if self.has_data_file() || !self.parts.is_empty() { usize::from(self.k) } else { marker_quorum }
    }

    /// The stripe geometry of the stored stream (size with pads, k and chunk size).
    pub fn geometry(&self) -> StripeGeometry {
        StripeGeometry::new(self.stored_size(), usize::from(self.k), self.chunk_bytes)
    }

    /// Checksum blocks in each chunk of stripe `stripe_idx` (the last block may be short).
    pub fn blocks_per_chunk(&self, stripe_idx: u64) -> usize {
        self.geometry().chunk_len(stripe_idx).div_ceil(self.block_bytes as usize)
    }

    /// CRC32Cs of the blocks of chunk `chunk_idx` of stripe `stripe_idx`, in order. Every
    /// stripe before it is full, so its blocks start at `stripe * n * blocks of a full chunk`.
    pub fn block_crcs(&self, stripe_idx: u64, chunk_idx: usize) -> &[u32] {
        let full = (self.chunk_bytes as usize).div_ceil(self.block_bytes as usize);
        let blocks = self.blocks_per_chunk(stripe_idx);
        let start = stripe_idx as usize * self.n() * full + chunk_idx * blocks;
        &self.crcs[start..start + blocks]
    }

    /// Checks internal consistency of a record received from a peer or read from disk.
    pub fn validate(&self) -> Result<(), Error> {
        self.validate_with(true)
    }

    /// [`ObjectMeta::validate`] for a record whose block checksums were left out
    /// ([`ObjectMeta::brief`]): everything else must hold, and no checksum is there.
    pub fn validate_brief(&self) -> Result<(), Error> {
        if !self.crcs.is_empty() || self.parts.iter().any(|p| !p.crcs.is_empty()) {
            let reason = "checksums in a record that says it left them out".to_string();
            return Err(Error::Invalid { what: "object metadata", reason });
        }
        self.validate_with(false)
    }

    /// This record without its block checksums, copied (the checksums are not).
    pub fn brief(&self) -> ObjectMeta {
        ObjectMeta {
            crcs: Vec::new(),
            parts: self.parts.iter().map(|p| PartPiece { crcs: Vec::new(), ..p.clone() }).collect(),
            user_meta: self.user_meta.clone(),
            headers: self.headers.clone(),
            pads: self.pads.clone(),
            bucket: self.bucket.clone(),
            key: self.key.clone(),
            etag: self.etag.clone(),
            content_type: self.content_type.clone(),
            ..*self
        }
    }

    fn validate_with(&self, checksums: bool) -> Result<(), Error> {
        let invalid = |reason: String| Err(Error::Invalid { what: "object metadata", reason });
        if self.format != META_FORMAT_VERSION {
            return Err(Error::UnsupportedVersion {
                what: "object metadata",
                found: self.format,
                supported: META_FORMAT_VERSION,
            });
        }
        if self.k == 0 || self.m == 0 || self.n() > cluster::N_MAX {
            return invalid(format!("erasure config {}+{}", self.k, self.m));
        }
        if self.chunk_bytes == 0 || self.chunk_bytes as usize > CHUNK_BYTES_MAX {
            return invalid(format!("chunk_bytes {}", self.chunk_bytes));
        }
        // A version without data may sit in a set of another size than its k+m says (a
        // multipart record's k+m is its pieces', which may be in a pool of another k+m).
        let positions = if self.has_data_file() { self.n() } else { cluster::N_MAX };
        if usize::from(self.rotation) >= positions {
            return invalid(format!("rotation {} >= {positions}", self.rotation));
        }
        if self.block_bytes == 0 || self.block_bytes > self.chunk_bytes {
            return invalid(format!("block_bytes {} not in 1..=chunk_bytes", self.block_bytes));
        }
        self.validate_pads()?;
        let single_piece = !self.deleted && self.parts.is_empty();
        let expected = if single_piece { self.checksums_for(self.stored_size()) } else { 0 };
        if checksums && self.crcs.len() as u128 != expected {
            return invalid(format!("{} checksums, the layout needs {expected}", self.crcs.len()));
        }
        let mut total = 0u64;
        for part in &self.parts {
            let crcs_match = !checksums || part.crcs.len() as u128 == self.checksums_for(part.size);
            if !crcs_match || usize::from(part.rotation) >= self.n() {
                return invalid(format!("part {} does not match its layout", part.number));
            }
            total = total.saturating_add(part.size);
        }
        if !self.parts.is_empty() && total != self.size {
            return invalid(format!("parts hold {total} bytes, the object {}", self.size));
        }
        Ok(())
    }

    /// Pads belong to a version with a data file, lie in strictly increasing order inside the
    /// object, are not empty, and add up to less than a full stripe per pad.
    fn validate_pads(&self) -> Result<(), Error> {
        if self.pads.is_empty() {
            return Ok(());
        }
        let invalid = |reason: String| Err(Error::Invalid { what: "object metadata", reason });
        if !self.has_data_file() {
            return invalid("pads on a version without a data file".into());
        }
        if self.pads.len() > PADS_MAX {
            return invalid(format!("{} pads (at most {PADS_MAX})", self.pads.len()));
        }
        let total = self.pads.iter().try_fold(self.size, |total, pad| total.checked_add(u64::from(pad.len)));
        if total.is_none() {
            return invalid(format!("{} bytes and their pads overflow", self.size));
        }
        let mut previous: Option<u64> = None;
        for pad in &self.pads {
            if pad.len == 0 || pad.len > self.chunk_bytes.saturating_mul(u32::from(self.k)) || pad.at > self.size {
                return invalid(format!("pad of {} bytes at {}", pad.len, pad.at));
            }
            if previous.is_some_and(|p| p >= pad.at) {
                return invalid(format!("pads out of order at {}", pad.at));
            }
            previous = Some(pad.at);
        }
        Ok(())
    }
}

/// How an object of `size` bytes is cut into stripes of k chunks of at most `chunk_bytes`.
/// Every stripe but the last is full; the last has chunks of `ceil(rest / k)` bytes, the tail of
/// its last data chunks zero-padded. Chunk `s` of a drive's file starts at `s * chunk_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StripeGeometry {
    pub size: u64,
    pub k: usize,
    pub chunk_bytes: u32,
    pub stripes: u64,
}

impl StripeGeometry {
    pub fn new(size: u64, k: usize, chunk_bytes: u32) -> Self {
        assert!(k > 0 && chunk_bytes > 0);
        let stripes = size.div_ceil(Self::stripe_bytes_of(k, chunk_bytes));
        Self { size, k, chunk_bytes, stripes }
    }

    fn stripe_bytes_of(k: usize, chunk_bytes: u32) -> u64 {
        k as u64 * u64::from(chunk_bytes)
    }

    /// Object bytes a full stripe holds.
    pub fn stripe_bytes(&self) -> u64 {
        Self::stripe_bytes_of(self.k, self.chunk_bytes)
    }

    /// Object offset where stripe `stripe_idx` starts.
    pub fn stripe_offset(&self, stripe_idx: u64) -> u64 {
        stripe_idx * self.stripe_bytes()
    }

    /// Object bytes in stripe `stripe_idx` (the last one may be short).
    pub fn stripe_data_bytes(&self, stripe_idx: u64) -> u64 {
        assert!(stripe_idx < self.stripes);
        (self.size - self.stripe_offset(stripe_idx)).min(self.stripe_bytes())
    }

    /// Bytes of every chunk (data and parity) of stripe `stripe_idx`.
    pub fn chunk_len(&self, stripe_idx: u64) -> usize {
        let len = self.stripe_data_bytes(stripe_idx).div_ceil(self.k as u64) as usize;
        assert!(len > 0 && len <= self.chunk_bytes as usize);
        len
    }

    /// Offset of stripe `stripe_idx`'s chunk inside a drive's file of this version.
    pub fn file_offset(&self, stripe_idx: u64) -> u64 {
        stripe_idx * u64::from(self.chunk_bytes)
    }

    /// Object bytes (not padding) held by data chunk `chunk_idx` of stripe `stripe_idx`.
    pub fn data_bytes_in_chunk(&self, stripe_idx: u64, chunk_idx: usize) -> usize {
        assert!(chunk_idx < self.k);
        let chunk_len = self.chunk_len(stripe_idx) as u64;
        let start = chunk_idx as u64 * chunk_len;
        self.stripe_data_bytes(stripe_idx).saturating_sub(start).min(chunk_len) as usize
    }
}
