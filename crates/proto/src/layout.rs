//! The aligned layout: which chunk size to use and where to store zero padding so that chosen
//! byte ranges of an object (a Parquet file's row groups) each lie inside one data chunk, on
//! one drive. Pure arithmetic over [`StripeGeometry`]; the writer applies it, readers follow
//! [`ObjectMeta::pads`](crate::ObjectMeta::pads).
//!
//! The rule: try chunk sizes that hold 1, 2, 3, ... of the largest range (rounded up to whole
//! 4 KiB, at least the cluster's chunk size, at most `CHUNK_BYTES_MAX` and 64 MiB per stripe's
//! data); with each, walk the
//! ranges in order and pad to the next chunk when a range would cross the end of the chunk it
//! starts in. The last stripe of an erasure-coded stream is short (its chunks are a k-th of
//! what is left), so either pad the stream to a whole stripe, or leave the ranges of the last
//! stripe unaligned. Keep the variant that aligns the most ranges within the padding budget
//! (1% of the object), then the one with less padding, then the smaller chunk. A range longer
//! than the chunk stays where it falls (it crosses chunks). `None` when nothing aligns within
//! the budget: the object is stored plain.

use std::ops::Range;

use crate::{CHUNK_BYTES_MAX, Pad, StripeGeometry};

/// Most padding the aligned layout may add, in hundredths of a percent of the object's size.
pub const ALIGN_PAD_BASIS_POINTS_MAX: u64 = 100;
/// Chunk sizes of aligned objects are whole multiples of this.
pub const ALIGN_CHUNK_STEP: u32 = 4 << 10;
/// Chunk sizes tried (holding 1, 2, ... of the largest range).
const CANDIDATES_MAX: u64 = 16;
/// Most object bytes in one stripe of an aligned object (k chunks): a writer holds two
/// stripes (with parity) in memory, a reader's window is one stripe.
pub const ALIGN_STRIPE_DATA_BYTES_MAX: u64 = 64 << 20;

/// An aligned layout for one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AlignedLayout {
    pub chunk_bytes: u32,
    pub pads: Vec<Pad>,
    /// How many of the ranges lie inside one data chunk.
    pub aligned: usize,
}

impl AlignedLayout {
    /// Zero bytes the layout stores beside the object's.
    pub fn pad_bytes(&self) -> u64 {
        self.pads.iter().map(|p| u64::from(p.len)).sum()
    }
}

/// The aligned layout for an object of `size` bytes cut into stripes of `k` data chunks,
/// aligning `ranges` (sorted, disjoint, inside the object); `chunk_min` is the cluster's chunk
/// size. `None` when the ranges are not sorted, disjoint and inside the object, or when no
/// layout aligns any range within the padding budget.
pub fn aligned_layout(size: u64, k: usize, chunk_min: u32, ranges: &[Range<u64>]) -> Option<AlignedLayout> {
    assert!(k > 0 && chunk_min > 0);
    let ordered = ranges.windows(2).all(|w| w[0].end <= w[1].start);
    let inside = ranges.iter().all(|r| r.start < r.end && r.end <= size);
    if ranges.is_empty() || !ordered || !inside || ranges.len() >= crate::PADS_MAX {
        return None;
    }
    let budget = size / 10_000 * ALIGN_PAD_BASIS_POINTS_MAX;
    let largest = ranges.iter().map(|r| r.end - r.start).max().expect("not empty");
    let step = u64::from(ALIGN_CHUNK_STEP);
    // The largest chunk: the protocol's, and one that keeps a stripe's data within bounds.
    let chunk_max = (CHUNK_BYTES_MAX as u64).min(ALIGN_STRIPE_DATA_BYTES_MAX / k as u64 / step * step).max(step);
    let mut best: Option<AlignedLayout> = None;
    let mut previous = 0u64;
    for holds in 1..=CANDIDATES_MAX {
        let chunk = (holds.saturating_mul(largest).div_ceil(step) * step).max(u64::from(chunk_min));
        let chunk = chunk.min(chunk_max);
        if chunk == previous {
            if chunk == chunk_max {
                break;
            }
            continue;
        }
        previous = chunk;
        let chunk = chunk as u32;
        for layout in candidates(size, k, chunk, ranges) {
            let pad = layout.pad_bytes();
            // Without pads an object is read as plain: a layout must pad to count as aligned.
            if layout.aligned == 0 || layout.pads.is_empty() || pad > budget {
                continue;
            }
            let better = best.as_ref().is_none_or(|b| {
                (layout.aligned, std::cmp::Reverse(pad), std::cmp::Reverse(layout.chunk_bytes))
                    > (b.aligned, std::cmp::Reverse(b.pad_bytes()), std::cmp::Reverse(b.chunk_bytes))
            });
            if better {
                best = Some(layout);
            }
        }
    }
    best
}

/// The two layouts with chunks of `chunk` bytes: the stream padded to whole stripes, and the
/// last stripe left short (its pads dropped: they align nothing there).
fn candidates(size: u64, k: usize, chunk: u32, ranges: &[Range<u64>]) -> [AlignedLayout; 2] {
    let slot = u64::from(chunk);
    let stripe = slot * k as u64;
    let mut pads = Vec::new();
    let mut shift = 0u64;
    for r in ranges {
        let len = r.end - r.start;
        let offset = (r.start + shift) % slot;
        if len <= slot && offset + len > slot {
            let pad = slot - offset;
            pads.push(Pad { at: r.start, len: pad as u32 });
            shift += pad;
        }
    }
    let stored = size + shift;
    let mut whole = pads.clone();
    if !stored.is_multiple_of(stripe) {
        whole.push(Pad { at: size, len: (stripe - stored % stripe) as u32 });
    }
    let last_stripe_start = stored.saturating_sub(1) / stripe * stripe;
    let mut shift = 0u64;
    let mut short = Vec::new();
    for pad in pads {
        if pad.at + shift + u64::from(pad.len) > last_stripe_start {
            break;
        }
        shift += u64::from(pad.len);
        short.push(pad);
    }
    [finish(size, k, chunk, whole, ranges), finish(size, k, chunk, short, ranges)]
}

fn finish(size: u64, k: usize, chunk: u32, pads: Vec<Pad>, ranges: &[Range<u64>]) -> AlignedLayout {
    let aligned = aligned_count(size, k, chunk, &pads, ranges);
    AlignedLayout { chunk_bytes: chunk, pads, aligned }
}

/// How many of `ranges` lie inside one data chunk of the stream `pads` make of the object.
fn aligned_count(size: u64, k: usize, chunk: u32, pads: &[Pad], ranges: &[Range<u64>]) -> usize {
    let stored = size + pads.iter().map(|p| u64::from(p.len)).sum::<u64>();
    let geometry = StripeGeometry::new(stored, k, chunk);
    let mut count = 0;
    let mut pad_idx = 0;
    let mut shift = 0u64;
    for r in ranges {
        while pad_idx < pads.len() && pads[pad_idx].at <= r.start {
            shift += u64::from(pads[pad_idx].len);
            pad_idx += 1;
        }
        let padded_inside = pads.get(pad_idx).is_some_and(|p| p.at < r.end);
        let (start, last) = (r.start + shift, r.end - 1 + shift);
        if !padded_inside && chunk_of(&geometry, start) == chunk_of(&geometry, last) {
            count += 1;
        }
    }
    count
}

/// The stripe and data chunk holding stored byte `offset`.
fn chunk_of(geometry: &StripeGeometry, offset: u64) -> (u64, u64) {
    let stripe = offset / geometry.stripe_bytes();
    let chunk_len = geometry.chunk_len(stripe) as u64;
    (stripe, (offset - geometry.stripe_offset(stripe)) / chunk_len)
}
