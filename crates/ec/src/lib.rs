//! Reed-Solomon `k + m` erasure coding over byte slices: encode `k` data chunks into `m` parity
//! chunks, and rebuild any `m` lost chunks from the `k` that remain.
//!
//! The crate owns the code itself (a Cauchy matrix over GF(2^8)) and nothing around it: it does
//! no I/O, reads no clock and spawns nothing, so the same input always gives the same output.
//! The arithmetic runs in ISA-L 2.32 kernels (GFNI / AVX-512 when the CPU has them).
//!
//! Main types: [`Codec`] (one per `k + m`, shareable across threads) and [`Error`].
//!
//! ```
//! let codec = ec::Codec::new(4, 2)?;
//! let data: Vec<Vec<u8>> = (0..4).map(|i| vec![i as u8; 1000]).collect();
//! let mut parity = vec![vec![0u8; 1000]; 2];
//! let data_slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
//! let mut parity_slices: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
//! codec.encode(&data_slices, &mut parity_slices)?;
//!
//! // Lose data chunk 1 and parity chunk 5, then rebuild both in place.
//! let mut chunks: Vec<Vec<u8>> = data.iter().chain(&parity).cloned().collect();
//! chunks[1].fill(0);
//! chunks[5].fill(0);
//! let present = [true, false, true, true, true, false];
//! let mut chunk_slices: Vec<&mut [u8]> = chunks.iter_mut().map(Vec::as_mut_slice).collect();
//! codec.reconstruct(&mut chunk_slices, &present)?;
//! assert_eq!(chunks[1], data[1]);
//! assert_eq!(chunks[5], parity[1]);
//! # Ok::<(), ec::Error>(())
//! ```

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};

mod isal;
#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;

/// Most chunks in a stripe: `k + m <= N_MAX`.
pub const N_MAX: usize = 32;
// A chunk set is a u32 bitmask, and Cauchy rows need k + m distinct field elements.
const _: () = assert!(N_MAX <= u32::BITS as usize);
const _: () = assert!(N_MAX <= 256);

/// Erasure patterns whose decode tables a [`Codec`] keeps; the cache is cleared when full. One
/// entry is at most 32 * 16 * 16 bytes (8 KiB, at k = m = 16), so the cache stays under 8 MiB.
const DECODE_CACHE_ENTRIES_MAX: usize = 1024;

/// A Reed-Solomon code with `k` data and `m` parity chunks per stripe.
///
/// Chunks `0..k` hold data and `k..n` parity; any `k` of the `n` chunks rebuild the rest. Decode
/// tables are cached per erasure pattern, so a `Codec` is meant to live long and be shared
/// (it is `Send + Sync`; wrap it in an `Arc`).
///
/// Any chunk length and alignment works, but for full speed start every chunk on a 64-byte
/// boundary: with AVX-512 kernels, chunks at a 16-byte offset (where malloc puts a `Vec<u8>`)
/// code 25-60% slower at 64 KiB.
pub struct Codec {
    k: usize,
    m: usize,
    /// n x k, row-major: identity in rows 0..k, Cauchy rows k..n.
    encode_matrix: Vec<u8>,
    /// ISA-L tables for the parity rows of `encode_matrix`.
    encode_tables: Box<[u8]>,
    decode_tables: RwLock<HashMap<DecodeKey, Arc<[u8]>>>,
}

const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Codec>();
};

impl Codec {
    /// A code with `k` data and `m` parity chunks; needs `k >= 1`, `m >= 1`, `k + m <= N_MAX`.
    pub fn new(k: usize, m: usize) -> Result<Codec, Error> {
        if k == 0 || m == 0 || k.checked_add(m).is_none_or(|n| n > N_MAX) {
            return Err(Error::InvalidConfig { k, m });
        }
        let encode_matrix = isal::cauchy_matrix(k, k + m);
        let encode_tables = isal::init_tables(k, m, &encode_matrix[k * k..]);
        Ok(Codec { k, m, encode_matrix, encode_tables, decode_tables: RwLock::new(HashMap::new()) })
    }

    /// Data chunks per stripe.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Parity chunks per stripe.
    pub fn m(&self) -> usize {
        self.m
    }

    /// Chunks per stripe: `k + m`.
    pub fn n(&self) -> usize {
        self.k + self.m
    }

    /// Computes parity. `data`: k equal-length slices; `parity`: m slices of the same length
    /// (overwritten).
    pub fn encode(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), Error> {
        check_count(data.len(), self.k)?;
        check_count(parity.len(), self.m)?;
        let lengths = data.iter().map(|c| c.len());
        check_lengths(lengths.chain(parity.iter().map(|c| c.len())))?;
        isal::encode(&self.encode_tables, data, parity);
        Ok(())
    }

    /// Rebuilds every chunk that is not present, data and parity, in place.
    ///
    /// `chunks`: all n slices (data `0..k` then parity `k..n`), equal length. `present[i]` says
    /// whether `chunks[i]` holds valid bytes. Present chunks are only read. On error nothing
    /// is written.
    pub fn reconstruct(&self, chunks: &mut [&mut [u8]], present: &[bool]) -> Result<(), Error> {
        let present = self.check_chunks(chunks, present)?;
        let missing = ChunkSet::below(self.n()).difference(present);
        self.decode(chunks, present, missing)
    }

    /// Like [`Codec::reconstruct`], but rebuilds only the missing data chunks (`0..k`); missing
    /// parity chunks are left untouched. This is the degraded-read path.
    pub fn reconstruct_data(&self, chunks: &mut [&mut [u8]], present: &[bool]) -> Result<(), Error> {
        let present = self.check_chunks(chunks, present)?;
        let missing_data = ChunkSet::below(self.k).difference(present);
        self.decode(chunks, present, missing_data)
    }

    fn check_chunks(&self, chunks: &[&mut [u8]], present: &[bool]) -> Result<ChunkSet, Error> {
        check_count(chunks.len(), self.n())?;
        check_count(present.len(), self.n())?;
        check_lengths(chunks.iter().map(|c| c.len()))?;
        Ok(ChunkSet::from_flags(present))
    }

    /// Writes `targets` from the first k chunks of `present`.
    fn decode(&self, chunks: &mut [&mut [u8]], present: ChunkSet, targets: ChunkSet) -> Result<(), Error> {
        if present.len() < self.k {
            return Err(Error::TooFewChunks { present: present.len(), needed: self.k });
        }
        if targets.is_empty() {
            return Ok(());
        }
        let sources = present.lowest(self.k);
        let tables = self.decode_tables(sources, targets);
        isal::decode(&tables, chunks, sources, targets);
        Ok(())
    }

    /// Cached tables that compute `targets` from `sources`.
    fn decode_tables(&self, sources: ChunkSet, targets: ChunkSet) -> Arc<[u8]> {
        let key = DecodeKey { sources, targets };
        // The map stays valid if a holder panicked: every write is a single insert or clear.
        let cache = self.decode_tables.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(tables) = cache.get(&key) {
            return Arc::clone(tables);
        }
        drop(cache);
        let tables: Arc<[u8]> = self.build_decode_tables(sources, targets).into();
        let mut cache = self.decode_tables.write().unwrap_or_else(PoisonError::into_inner);
        if cache.len() >= DECODE_CACHE_ENTRIES_MAX {
            cache.clear();
        }
        cache.insert(key, Arc::clone(&tables));
        tables
    }

    /// Inverts the source rows of the encode matrix, then multiplies each target's encode row
    /// by the inverse (for a data target that picks out a row of the inverse).
    fn build_decode_tables(&self, sources: ChunkSet, targets: ChunkSet) -> Box<[u8]> {
        let k = self.k;
        assert_eq!(sources.len(), k);
        let submatrix: Vec<u8> = sources.iter().flat_map(|i| self.encode_row(i)).copied().collect();
        let inverse =
            isal::invert_matrix(&submatrix, k).expect("every k rows of an identity-over-Cauchy matrix are independent");
        let mut rows = Vec::with_capacity(targets.len() * k);
        for target in targets.iter() {
            let encode_row = self.encode_row(target);
            rows.extend(
                (0..k)
                    .map(|column| (0..k).fold(0, |sum, l| sum ^ isal::gf_mul(encode_row[l], inverse[l * k + column]))),
            );
        }
        isal::init_tables(k, targets.len(), &rows)
    }

    fn encode_row(&self, chunk_idx: usize) -> &[u8] {
        &self.encode_matrix[chunk_idx * self.k..(chunk_idx + 1) * self.k]
    }

    #[cfg(test)]
    fn decode_cache_len(&self) -> usize {
        self.decode_tables.read().unwrap_or_else(PoisonError::into_inner).len()
    }
}

impl fmt::Debug for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cached = self.decode_tables.read().unwrap_or_else(PoisonError::into_inner).len();
        f.debug_struct("Codec")
            .field("k", &self.k)
            .field("m", &self.m)
            .field("cached_decode_patterns", &cached)
            .finish_non_exhaustive()
    }
}

/// What went wrong; every variant is a caller error except [`Error::TooFewChunks`], which means
/// more than m chunks are lost.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `Codec::new` needs `k >= 1`, `m >= 1` and `k + m <= N_MAX`.
    #[error("invalid erasure code {k}+{m}: need k >= 1, m >= 1 and k + m <= {N_MAX}")]
    InvalidConfig { k: usize, m: usize },
    /// A slice of chunks (or of presence flags) has the wrong count.
    #[error("expected {expected} chunks, found {found}")]
    ChunkCount { expected: usize, found: usize },
    /// Chunk slices differ in length; `expected` is the first chunk's length.
    #[error("chunk lengths differ: expected {expected} bytes, found {found}")]
    ChunkLengthMismatch { expected: usize, found: usize },
    /// Fewer than k chunks are present, so the stripe cannot be decoded.
    #[error("{present} chunks present, {needed} needed to decode")]
    TooFewChunks { present: usize, needed: usize },
}

fn check_count(found: usize, expected: usize) -> Result<(), Error> {
    if found != expected {
        return Err(Error::ChunkCount { expected, found });
    }
    Ok(())
}

fn check_lengths(mut lengths: impl Iterator<Item = usize>) -> Result<(), Error> {
    let Some(expected) = lengths.next() else {
        return Ok(());
    };
    match lengths.find(|&found| found != expected) {
        Some(found) => Err(Error::ChunkLengthMismatch { expected, found }),
        None => Ok(()),
    }
}

/// Which decode tables: the chunks read and the chunks written.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct DecodeKey {
    sources: ChunkSet,
    targets: ChunkSet,
}

/// A set of chunk indices below `N_MAX`, as a bitmask.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct ChunkSet(u32);

impl ChunkSet {
    /// The chunks `0..count`.
    fn below(count: usize) -> ChunkSet {
        assert!(count <= N_MAX);
        ChunkSet(u32::MAX.checked_shr(u32::BITS - count as u32).unwrap_or(0))
    }

    /// The indices whose flag is set.
    fn from_flags(flags: &[bool]) -> ChunkSet {
        assert!(flags.len() <= N_MAX);
        let bits = flags.iter().enumerate().filter(|&(_, &flag)| flag);
        ChunkSet(bits.fold(0, |set, (i, _)| set | 1 << i))
    }

    fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    fn is_empty(self) -> bool {
        self.0 == 0
    }

    fn difference(self, other: ChunkSet) -> ChunkSet {
        ChunkSet(self.0 & !other.0)
    }

    fn union(self, other: ChunkSet) -> ChunkSet {
        ChunkSet(self.0 | other.0)
    }

    fn is_disjoint(self, other: ChunkSet) -> bool {
        self.0 & other.0 == 0
    }

    fn all_below(self, count: usize) -> bool {
        self.difference(ChunkSet::below(count)).is_empty()
    }

    /// The `count` smallest indices of the set.
    fn lowest(self, count: usize) -> ChunkSet {
        assert!(count <= self.len());
        ChunkSet(self.iter().take(count).fold(0, |set, i| set | 1 << i))
    }

    /// Indices in ascending order.
    fn iter(self) -> impl Iterator<Item = usize> {
        let mut rest = self.0;
        std::iter::from_fn(move || {
            let i = rest.trailing_zeros();
            rest &= rest.wrapping_sub(1);
            (i < u32::BITS).then_some(i as usize)
        })
    }
}
