//! Gather: rows of a 2-D table stored as one object (a `.npy` file's data, or raw row-major
//! bytes), picked by index, written straight into their slots of the caller's buffer.
//!
//! Each index is a byte range of the object; rows whose indices follow each other in the
//! request and in the table are read as one range (up to [`GATHER_RUN_BYTES_MAX`]); every range
//! goes to the smart client's batched read ([`Client::read_many`]), which sends one
//! scatter-gather request per node per round, verifies every block's CRC32C, and rebuilds the
//! ranges of missing or corrupt chunks from k other chunks of their stripes. A repeated index
//! is read once and copied to its other slots.
//!
//! A [`RowCache`] (optional, bounded in bytes) keeps hot rows: S3-FIFO (`quick_cache`), which
//! suits the power-law access of graph sampling (a small probation queue keeps one-off rows
//! from pushing out the hubs). Rows are keyed by the object's version, so a replaced object's
//! rows are never served: they age out.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use proto::VersionId;

use crate::{Client, Error, ObjectInfo};

/// Indices one gather takes at most.
pub const GATHER_ROWS_MAX: usize = 1 << 22;
/// Bytes of consecutive rows read as one range at most.
pub const GATHER_RUN_BYTES_MAX: u64 = 1 << 20;

/// Where a table's rows lie in its object: `rows` rows of `row_bytes` each, row-major, the
/// first at `data_offset` (a `.npy` file's header length).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowTable {
    pub data_offset: u64,
    pub row_bytes: u64,
    pub rows: u64,
}

impl RowTable {
    /// Checks that the table lies inside an object of `size` bytes.
    fn check(&self, size: u64) -> Result<(), Error> {
        if self.row_bytes == 0 {
            return Err(Error::BadGather("a row has at least one byte".into()));
        }
        let end = self.rows.checked_mul(self.row_bytes).and_then(|bytes| bytes.checked_add(self.data_offset));
        match end {
            Some(end) if end <= size => Ok(()),
            _ => Err(Error::BadGather(format!(
                "{} rows of {} bytes from byte {} do not fit the {size}-byte object",
                self.rows, self.row_bytes, self.data_offset
            ))),
        }
    }
}

/// Bytes a cached row costs beyond its own (key, index entry), counted against the capacity.
const ROW_OVERHEAD_BYTES: u64 = 96;

/// A bounded cache of gathered rows, shared by every gather given it (thread-safe; one per
/// process is the intended use: each DataLoader worker has its own).
pub struct RowCache {
    rows: quick_cache::sync::Cache<RowKey, Arc<[u8]>, RowWeight>,
    capacity_bytes: u64,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl std::fmt::Debug for RowCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowCache").field("stats", &self.stats()).finish()
    }
}

/// A row of one table layout of one version of one object (the same version read with
/// another row size or offset has other rows).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct RowKey {
    object: Arc<str>,
    version: VersionId,
    data_offset: u64,
    row_bytes: u64,
    row: u64,
}

#[derive(Clone, Debug)]
struct RowWeight;

impl quick_cache::Weighter<RowKey, Arc<[u8]>> for RowWeight {
    fn weight(&self, _key: &RowKey, row: &Arc<[u8]>) -> u64 {
        row.len() as u64 + ROW_OVERHEAD_BYTES
    }
}

/// What a [`RowCache`] holds and how it served.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RowCacheStats {
    /// Rows served from the cache, and rows read from the nodes, over all gathers.
    pub hits: u64,
    pub misses: u64,
    /// Rows held, the bytes they count for, and the most they may.
    pub rows: u64,
    pub bytes: u64,
    pub capacity_bytes: u64,
}

impl RowCache {
    /// A cache of at most `capacity_bytes` (rows and their bookkeeping).
    pub fn new(capacity_bytes: u64) -> Self {
        let estimated_rows =
            usize::try_from(capacity_bytes / (4096 + ROW_OVERHEAD_BYTES)).unwrap_or(usize::MAX).max(16);
        Self {
            rows: quick_cache::sync::Cache::with_weighter(estimated_rows, capacity_bytes, RowWeight),
            capacity_bytes,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    pub fn stats(&self) -> RowCacheStats {
        RowCacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            rows: self.rows.len() as u64,
            bytes: self.rows.weight(),
            capacity_bytes: self.capacity_bytes,
        }
    }
}

/// Consecutive slots of the output that hold consecutive rows, read as one range.
#[derive(Debug, PartialEq, Eq)]
struct Run {
    /// The first slot and its row.
    slot: usize,
    row: u64,
    rows: usize,
}

/// Refuses the first index past the table's end.
fn check_indices(table: &RowTable, indices: &[u64]) -> Result<(), Error> {
    match indices.iter().enumerate().find(|(_, row)| **row >= table.rows) {
        Some((slot, row)) => Err(Error::BadGather(format!(
            "index {row} (position {slot}) is out of range: the table has {} rows",
            table.rows
        ))),
        None => Ok(()),
    }
}

/// How a gather reads its rows.
#[derive(Debug)]
struct Plan {
    /// Reads of every distinct row once, in slot order.
    runs: Vec<Run>,
    /// The slots that repeat an earlier one's row: (slot, the slot it copies).
    copies: Vec<(usize, usize)>,
}

/// The plan that gathers `indices` of `table` (checked), but for the slots `served` already holds.
fn plan(table: &RowTable, indices: &[u64], served: &[bool]) -> Plan {
    let run_rows_max = (GATHER_RUN_BYTES_MAX / table.row_bytes).max(1) as usize;
    let mut first_slot: HashMap<u64, usize> = HashMap::with_capacity(indices.len());
    let mut runs: Vec<Run> = Vec::new();
    let mut copies = Vec::new();
    debug_assert!(check_indices(table, indices).is_ok(), "indices are checked before planning");
    for (slot, &row) in indices.iter().enumerate() {
        if served.get(slot).copied().unwrap_or(false) {
            continue;
        }
        if let Some(&earlier) = first_slot.get(&row) {
            copies.push((slot, earlier));
            continue;
        }
        first_slot.insert(row, slot);
        match runs.last_mut() {
            Some(run) if run.slot + run.rows == slot && run.row + run.rows as u64 == row && run.rows < run_rows_max => {
                run.rows += 1;
            }
            _ => runs.push(Run { slot, row, rows: 1 }),
        }
    }
    Plan { runs, copies }
}

/// One table's part of a [`Client::gather_many`]: rows `indices` of `table` in object `info`,
/// into `out` (row `indices[i]` into `out[i * row_bytes..][..row_bytes]`).
#[derive(Debug)]
pub struct GatherItem<'a> {
    pub info: &'a ObjectInfo,
    pub table: RowTable,
    pub indices: &'a [u64],
    pub out: &'a mut [u8],
}

impl GatherItem<'_> {
    /// Refuses a table that does not fit its object, an output of the wrong size and an index
    /// out of range.
    fn check(&self) -> Result<usize, Error> {
        self.table.check(self.info.meta.size)?;
        let row_bytes = usize::try_from(self.table.row_bytes).map_err(|_| Error::BadGather("rows too large".into()))?;
        if Some(self.out.len()) != self.indices.len().checked_mul(row_bytes) {
            return Err(Error::BadGather(format!(
                "{}/{}: the output has {} bytes; {} rows of {row_bytes} bytes need {}",
                self.info.meta.bucket,
                self.info.meta.key,
                self.out.len(),
                self.indices.len(),
                self.indices.len().saturating_mul(row_bytes)
            )));
        }
        check_indices(&self.table, self.indices)?;
        Ok(row_bytes)
    }

    /// The cache key of one of its rows.
    fn row_key(&self, object: &Arc<str>, row: u64) -> RowKey {
        RowKey {
            object: Arc::clone(object),
            version: self.info.meta.version,
            data_offset: self.table.data_offset,
            row_bytes: self.table.row_bytes,
            row,
        }
    }
}

impl Client {
    /// Reads rows `indices` of `table` in object `info` into `out`: row `indices[i]` into
    /// `out[i * row_bytes..][..row_bytes]`. Indices may repeat and come in any order. Bad
    /// input (an index out of range, `out` of the wrong size, a table that does not fit the
    /// object) is refused before anything is read. With `cache`, rows it holds for this
    /// version are copied from it and the rows read are added to it.
    pub async fn gather(
        &self,
        info: &ObjectInfo,
        table: &RowTable,
        indices: &[u64],
        out: &mut [u8],
        cache: Option<&RowCache>,
    ) -> Result<(), Error> {
        self.gather_many(&mut [GatherItem { info, table: *table, indices, out }], cache).await
    }

    /// [`Client::gather`] of several tables (or several index lists of one) at once: one
    /// batched request per node per round for all of them (a GNN mini-batch's features,
    /// labels and embeddings in one go). Every item is checked before anything is read; at
    /// most [`GATHER_ROWS_MAX`] indices in all. The first error fails the whole call (the
    /// outputs are then partly written).
    pub async fn gather_many(&self, items: &mut [GatherItem<'_>], cache: Option<&RowCache>) -> Result<(), Error> {
        let total: usize = items.iter().map(|item| item.indices.len()).sum();
        if total > GATHER_ROWS_MAX {
            return Err(Error::BadGather(format!("{total} indices: at most {GATHER_ROWS_MAX} per gather")));
        }
        let row_bytes: Vec<usize> = items.iter().map(GatherItem::check).collect::<Result<_, _>>()?;
        let objects: Vec<Arc<str>> =
            items.iter().map(|item| Arc::from(format!("{}/{}", item.info.meta.bucket, item.info.meta.key))).collect();
        let mut plans = Vec::with_capacity(items.len());
        for ((item, object), &row_bytes) in items.iter_mut().zip(&objects).zip(&row_bytes) {
            let mut served = vec![false; if cache.is_some() { item.indices.len() } else { 0 }];
            if let Some(cache) = cache {
                for (slot, &row) in item.indices.iter().enumerate() {
                    let key = item.row_key(object, row);
                    if let Some(bytes) = cache.rows.get(&key).filter(|b| b.len() == row_bytes) {
                        item.out[slot * row_bytes..(slot + 1) * row_bytes].copy_from_slice(&bytes);
                        served[slot] = true;
                    }
                }
                let hits = served.iter().filter(|s| **s).count() as u64;
                cache.hits.fetch_add(hits, Ordering::Relaxed);
                cache.misses.fetch_add(item.indices.len() as u64 - hits, Ordering::Relaxed);
            }
            plans.push(plan(&item.table, item.indices, &served));
        }
        // Carve each output into its runs' slots (in slot order, so each split is past the
        // last), all items' runs into one batched read.
        let mut reads: Vec<(&ObjectInfo, u64, &mut [u8])> =
            Vec::with_capacity(plans.iter().map(|p| p.runs.len()).sum());
        let mut owners: Vec<usize> = Vec::with_capacity(reads.capacity());
        for (idx, ((item, plan), &row_bytes)) in items.iter_mut().zip(&plans).zip(&row_bytes).enumerate() {
            let mut rest: &mut [u8] = &mut *item.out;
            let mut at = 0usize;
            for run in &plan.runs {
                let tail = std::mem::take(&mut rest);
                let (_, from_run) = tail.split_at_mut((run.slot - at) * row_bytes);
                let (slots, after) = from_run.split_at_mut(run.rows * row_bytes);
                rest = after;
                at = run.slot + run.rows;
                reads.push((item.info, item.table.data_offset + run.row * item.table.row_bytes, slots));
                owners.push(idx);
            }
        }
        let wanted: Vec<usize> = reads.iter().map(|(_, _, buf)| buf.len()).collect();
        for ((result, wanted), idx) in self.read_many(reads).await.into_iter().zip(wanted).zip(owners) {
            let read = result?;
            if read != wanted {
                let meta = &items[idx].info.meta;
                return Err(Error::BadGather(format!(
                    "{}/{} ended early: {read} of {wanted} bytes",
                    meta.bucket, meta.key
                )));
            }
        }
        for (((item, plan), object), &row_bytes) in items.iter_mut().zip(plans).zip(&objects).zip(&row_bytes) {
            for (slot, earlier) in plan.copies {
                item.out.copy_within(earlier * row_bytes..(earlier + 1) * row_bytes, slot * row_bytes);
            }
            if let Some(cache) = cache {
                for run in &plan.runs {
                    for i in 0..run.rows {
                        let slot = run.slot + i;
                        let bytes: Arc<[u8]> = Arc::from(&item.out[slot * row_bytes..(slot + 1) * row_bytes]);
                        cache.rows.insert(item.row_key(object, run.row + i as u64), bytes);
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(rows: u64, row_bytes: u64) -> RowTable {
        RowTable { data_offset: 128, row_bytes, rows }
    }

    #[test]
    fn consecutive_rows_in_consecutive_slots_are_one_run() {
        let Plan { runs, copies } = plan(&table(100, 16), &[5, 6, 7, 9, 10, 3], &[]);
        assert_eq!(
            runs,
            vec![Run { slot: 0, row: 5, rows: 3 }, Run { slot: 3, row: 9, rows: 2 }, Run { slot: 5, row: 3, rows: 1 }]
        );
        assert!(copies.is_empty());
    }

    #[test]
    fn repeated_rows_are_read_once_and_copied() {
        let Plan { runs, copies } = plan(&table(100, 16), &[4, 4, 5, 4], &[]);
        // Slot 1 repeats slot 0; slot 2's row 5 follows row 4 but not its slot: its own run.
        assert_eq!(runs, vec![Run { slot: 0, row: 4, rows: 1 }, Run { slot: 2, row: 5, rows: 1 }]);
        assert_eq!(copies, vec![(1, 0), (3, 0)]);
    }

    #[test]
    fn served_slots_are_holes_in_the_runs() {
        let served = [false, true, false, false];
        let Plan { runs, copies } = plan(&table(100, 16), &[1, 2, 3, 3], &served);
        assert_eq!(runs, vec![Run { slot: 0, row: 1, rows: 1 }, Run { slot: 2, row: 3, rows: 1 }]);
        assert_eq!(copies, vec![(3, 2)]);
    }

    #[test]
    fn runs_stop_at_their_byte_bound() {
        let row_bytes = GATHER_RUN_BYTES_MAX / 2;
        let runs = plan(&table(10, row_bytes), &[0, 1, 2, 3, 4], &[]).runs;
        assert_eq!(runs.iter().map(|r| r.rows).collect::<Vec<_>>(), vec![2, 2, 1]);
    }

    #[test]
    fn bad_input_is_refused_with_the_reason() {
        let error = check_indices(&table(10, 16), &[1, 10]).unwrap_err().to_string();
        assert!(error.contains("index 10 (position 1) is out of range"), "{error}");
        assert!(table(10, 0).check(1000).unwrap_err().to_string().contains("at least one byte"));
        assert!(table(10, 100).check(1000).unwrap_err().to_string().contains("do not fit"));
        assert!(table(u64::MAX, 100).check(1000).is_err());
        table(8, 109).check(1000).unwrap();
    }
}
