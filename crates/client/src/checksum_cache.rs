//! Block checksums of versions this client has read, so that a repeated read of a large object
//! (a feature table gathered from every mini-batch) asks the drives only which version to read.
//!
//! An object's metadata carries a CRC32C per checksum block of every chunk: 12 MB for an 8 GiB
//! table with 4 KiB blocks (4+2), sent by every drive of the set on every full metadata read.
//! [`Client::head_many_cached`] asks for versions without them ([`proto::MetaDetail`]'s brief
//! forms) and fills them in from here; a version not held is asked for whole and kept. A version
//! id names one immutable write, and the cached record must equal the one just read in every
//! field but the checksums (placement, layout, size, parts), so a version moved to another pool
//! or set is never read with another placement's record.

use std::collections::VecDeque;
use std::sync::Arc;

use proto::ObjectMeta;

use crate::{Client, Error, ObjectInfo, head};

/// Bytes of checksums a client keeps at most (the records of five 8 GiB tables at 4 KiB
/// blocks); the least recently used records go first.
pub const CHECKSUM_CACHE_BYTES_MAX: usize = 64 << 20;
/// Records kept at most (lookups scan them).
const RECORDS_MAX: usize = 256;
/// Bytes a record counts for beyond its checksums.
const RECORD_OVERHEAD_BYTES: usize = 512;

/// The cache: most recently used first.
#[derive(Debug, Default)]
pub(crate) struct ChecksumCache {
    records: std::sync::Mutex<VecDeque<Arc<ObjectMeta>>>,
}

fn weight(meta: &ObjectMeta) -> usize {
    RECORD_OVERHEAD_BYTES + 4 * (meta.crcs.len() + meta.parts.iter().map(|p| p.crcs.len()).sum::<usize>())
}

/// Whether reading `meta`'s version needs block checksums (it has chunks).
fn has_checksums(meta: &ObjectMeta) -> bool {
    !meta.deleted && meta.size > 0
}

impl ChecksumCache {
    /// Fills in `brief`'s checksums from a held record of the same version and layout; false
    /// when none is held.
    fn fill(&self, brief: &mut ObjectMeta) -> bool {
        let mut records = self.records.lock().expect("checksum cache lock");
        let Some(at) =
            records.iter().position(|m| m.version == brief.version && m.key == brief.key && m.bucket == brief.bucket)
        else {
            return false;
        };
        let record = records.remove(at).expect("found above");
        if record.brief() != *brief {
            return false; // the version moved (another set): its old record goes
        }
        records.push_front(Arc::clone(&record));
        drop(records);
        // Megabytes for a large table: copied outside the lock.
        brief.crcs = record.crcs.clone();
        for (part, held) in brief.parts.iter_mut().zip(&record.parts) {
            part.crcs = held.crcs.clone();
        }
        true
    }

    /// Keeps `meta` (a whole record), evicting the least recently used past the bounds.
    fn insert(&self, meta: &ObjectMeta) {
        if weight(meta) > CHECKSUM_CACHE_BYTES_MAX {
            return;
        }
        let mut records = self.records.lock().expect("checksum cache lock");
        records.retain(|m| !(m.version == meta.version && m.key == meta.key && m.bucket == meta.bucket));
        records.push_front(Arc::new(meta.clone()));
        let mut bytes: usize = records.iter().map(|m| weight(m)).sum();
        while bytes > CHECKSUM_CACHE_BYTES_MAX || records.len() > RECORDS_MAX {
            let evicted = records.pop_back().expect("over the bound, so not empty");
            bytes -= weight(&evicted);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.records.lock().expect("checksum cache lock").len()
    }
}

impl Client {
    /// [`Client::head_many`] for repeated reads of large objects: the drives are asked which
    /// version to read without its block checksums, which come from this client's cache when it
    /// read the same version before; the others are asked for whole (a second round) and kept
    /// ([`CHECKSUM_CACHE_BYTES_MAX`]). The answers are the same as `head_many`'s.
    pub async fn head_many_cached(&self, keys: &[(String, String)]) -> Vec<Result<ObjectInfo, Error>> {
        let mut results = self.head_many_checked(keys, head::Checksums::LeftOut).await;
        let cache = &self.inner.checksums;
        let missing: Vec<usize> = (0..results.len())
            .filter(|&i| match &mut results[i] {
                Ok(info) => has_checksums(&info.meta) && !cache.fill(&mut info.meta),
                Err(_) => false,
            })
            .collect();
        if missing.is_empty() {
            return results;
        }
        let again: Vec<(String, String)> = missing.iter().map(|&i| keys[i].clone()).collect();
        // Whatever version this round finds (a write may have landed meanwhile) is as fresh.
        for (i, whole) in missing.into_iter().zip(self.head_many_checked(&again, head::Checksums::Included).await) {
            if let Ok(info) = &whole
                && has_checksums(&info.meta)
            {
                cache.insert(&info.meta);
            }
            results[i] = whole;
        }
        results
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(version: u64, blocks: usize) -> ObjectMeta {
        let mut meta = crate::tests::meta(version);
        meta.crcs = (0..blocks as u32).collect();
        meta
    }

    #[test]
    fn fills_only_the_same_version_with_the_same_layout() {
        let cache = ChecksumCache::default();
        let whole = record(7, 10);
        cache.insert(&whole);
        let mut brief = whole.brief();
        assert!(cache.fill(&mut brief));
        assert_eq!(brief, whole);

        let mut other_version = record(8, 10).brief();
        assert!(!cache.fill(&mut other_version));
        assert!(other_version.crcs.is_empty());

        // The same version in another set (moved to another pool): not filled.
        let mut moved = whole.brief();
        moved.set_idx += 1;
        assert!(!cache.fill(&mut moved));
        assert!(moved.crcs.is_empty());
    }

    #[test]
    fn stays_within_its_bounds() {
        let cache = ChecksumCache::default();
        let blocks = CHECKSUM_CACHE_BYTES_MAX / 4 / 3;
        for version in 1..=4 {
            cache.insert(&record(version, blocks));
        }
        assert_eq!(cache.len(), 2, "three records of a third of the bound do not fit with their overhead");
        let mut oldest = record(1, blocks).brief();
        assert!(!cache.fill(&mut oldest), "the least recently used went first");
        let mut newest = record(4, blocks).brief();
        assert!(cache.fill(&mut newest));

        cache.insert(&record(9, CHECKSUM_CACHE_BYTES_MAX / 4 + 1));
        assert_eq!(cache.len(), 2, "a record over the bound is not kept");
        for version in 100..100 + RECORDS_MAX as u64 + 5 {
            cache.insert(&record(version, 1));
        }
        assert_eq!(cache.len(), RECORDS_MAX);
    }
}
