//! Object metadata: one record per object version, stored on every drive of the object's
//! erasure set and sent to clients. The same bytes go to disk and to the wire.

use serde::{Deserialize, Serialize};

use crate::{CHUNK_BYTES_MAX, Error, VersionId};

/// Version of the [`ObjectMeta`] record; readers refuse others.
pub const META_FORMAT_VERSION: u16 = 1;

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
    /// CRC32C of every chunk, stripe-major: `crcs[stripe * n + chunk_idx]`. Empty for a
    /// multipart object, whose bytes live in `parts`.
    pub crcs: Vec<u32>,
    /// A multipart object: its parts in order, each an erasure-coded piece of its own (written
    /// by UploadPart, never copied). Empty for a single-piece object.
    pub parts: Vec<PartPiece>,
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

impl ObjectMeta {
    /// Chunks per stripe.
    pub fn n(&self) -> usize {
        usize::from(self.k) + usize::from(self.m)
    }

    /// Whether this version owns a data file of its own on each drive of its set.
    pub fn has_data_file(&self) -> bool {
        !self.deleted && self.size > 0 && self.parts.is_empty()
    }

    /// The stripe geometry implied by size, k and chunk size.
    pub fn geometry(&self) -> StripeGeometry {
        StripeGeometry::new(self.size, usize::from(self.k), self.chunk_bytes)
    }

    /// CRC32C of chunk `chunk_idx` of stripe `stripe_idx`.
    pub fn crc(&self, stripe_idx: u64, chunk_idx: usize) -> u32 {
        self.crcs[stripe_idx as usize * self.n() + chunk_idx]
    }

    /// Checks internal consistency of a record received from a peer or read from disk.
    pub fn validate(&self) -> Result<(), Error> {
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
        if usize::from(self.rotation) >= self.n() {
            return invalid(format!("rotation {} >= n", self.rotation));
        }
        let single_piece = !self.deleted && self.parts.is_empty();
        let expected = if single_piece { self.geometry().stripes as u128 * self.n() as u128 } else { 0 };
        if self.crcs.len() as u128 != expected {
            return invalid(format!("{} checksums, the layout needs {expected}", self.crcs.len()));
        }
        let mut total = 0u64;
        for part in &self.parts {
            let stripes = StripeGeometry::new(part.size, usize::from(self.k), self.chunk_bytes).stripes;
            if part.crcs.len() as u128 != stripes as u128 * self.n() as u128 || usize::from(part.rotation) >= self.n() {
                return invalid(format!("part {} does not match its layout", part.number));
            }
            total = total.saturating_add(part.size);
        }
        if !self.parts.is_empty() && total != self.size {
            return invalid(format!("parts hold {total} bytes, the object {}", self.size));
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
