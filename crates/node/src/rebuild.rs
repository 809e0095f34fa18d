//! Rebuild of a drive that was wiped or replaced: an empty drive directory found at start, or
//! `tessera drive replace` (which wipes the drive first). The drive is marked rebuilding, durably,
//! before anything else; while marked, it answers every metadata request as unavailable, so
//! readers count it as missing rather than trusting an empty drive, and it still takes new
//! writes. The node then pulls: it lists the keys the other drives of its set hold (enough of
//! them to meet every acknowledged version), picks the version readers would pick for each,
//! and rebuilds its own chunks of it from k healthy peers through the repair path (checksums
//! verified, staged, committed). A cursor saved after every page lets a restart or a pause go
//! on where it stopped; the mark is cleared only after a pass with no failure.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use chunkstore::{Drive, MetaSync};
use cluster::{DriveRef, ErasureSet};
use proto::{BATCH_ITEMS_MAX, KeyVersions, MetaDetail, MetaKey, ObjectMeta, Request, Response};

use crate::State;
use crate::repair::{Peers, RepairError, now_ms};

/// "1" while the drive is being rebuilt.
const SETTING_REBUILDING: &str = "drive.rebuilding";
/// The last key rebuilt: `set NUL bucket NUL key`.
const SETTING_CURSOR: &str = "drive.rebuild_cursor";
/// The last key of the page being rebuilt (same form): its commits may not be durable yet.
const SETTING_UNSYNCED_UNTIL: &str = "drive.rebuild_unsynced_until";
/// Keys listed from each peer per round trip; also what a crash makes the rebuild redo (a
/// page's commits become durable together at its end).
const KEYS_PER_PAGE: u32 = 1024;
/// Pause after a pass that could not finish (a peer down, a key without k healthy chunks).
const RETRY: Duration = Duration::from_secs(10);
/// Keys rebuilt at once, each by its own thread with its own peer connections, so that round
/// trips, decoding and writes overlap (16 rebuilt fastest on the 2-core benchmark machine, see
/// bench/rebuild.sh); the node's repair budget still bounds them together.
const REBUILD_THREADS: usize = 16;

/// Keys' versions asked of a peer per request: a page's worth could exceed a frame when
/// objects are large (each carries its block checksums).
const META_ITEMS_PER_REQUEST: usize = 256;
const _: () = assert!(META_ITEMS_PER_REQUEST <= BATCH_ITEMS_MAX);

/// A rebuild's progress since the node started.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) keys_checked: AtomicU64,
    pub(crate) keys_rebuilt: AtomicU64,
}

/// Whether the drive is marked rebuilding. Settings that cannot be read count as marked:
/// readers then skip the drive rather than trust it.
pub(crate) fn is_marked(drive: &Drive) -> bool {
    match drive.setting(SETTING_REBUILDING) {
        Ok(value) => value.is_some_and(|v| v == b"1"),
        Err(e) => {
            tracing::error!(drive = %drive.root().display(), error = %e, "cannot read whether the drive is rebuilding; treating it as rebuilding");
            true
        }
    }
}

/// Marks a drive rebuilding from its first key (durable before the caller wipes or trusts it).
pub(crate) fn mark(drive: &Drive) -> Result<(), chunkstore::Error> {
    drive.set_setting(SETTING_CURSOR, b"")?;
    drive.set_setting(SETTING_REBUILDING, b"1")
}

/// `tessera drive replace`: mark, wipe, and let the worker rebuild the drive.
pub(crate) fn replace(state: &State, drive_idx: usize) -> Result<(), chunkstore::Error> {
    let drive = &state.drives[drive_idx];
    let _guard = state.rebuild_locks[drive_idx].lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    state.rebuild_generation[drive_idx].fetch_add(1, Ordering::SeqCst);
    mark(drive)?;
    state.rebuilding[drive_idx].store(true, Ordering::SeqCst);
    drive.wipe()?;
    tracing::warn!(drive = drive_idx, "drive replaced: wiped; readers skip it while it is rebuilt from its set");
    Ok(())
}

/// Runs until the process exits, rebuilding every marked drive.
pub(crate) fn worker(state: &State) {
    if state.is_rebuilding(0) && state.drives[0].setting(crate::SETTING_REPAIR_RATE).ok().flatten().is_none() {
        adopt_repair_settings(state);
    }
    loop {
        let mut failed = false;
        for drive_idx in 0..state.drives.len() {
            if !state.is_rebuilding(drive_idx) {
                continue;
            }
            let generation = state.rebuild_generation[drive_idx].load(Ordering::SeqCst);
            let attempt =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rebuild_drive(state, drive_idx, generation)))
                    .unwrap_or_else(|_| Err(RepairError::Refused("the rebuild panicked".into())));
            match attempt {
                Ok(()) => finish(state, drive_idx, generation),
                Err(RepairError::Paused) => {}
                Err(e) => {
                    tracing::warn!(drive = drive_idx, error = %e, retry_in_s = RETRY.as_secs(), "drive rebuild pass incomplete; will go on");
                    failed = true;
                }
            }
        }
        std::thread::sleep(if failed { RETRY } else { Duration::from_secs(1) });
    }
}

/// The node's first drive (which holds the repair settings) is new: take the mode and budget
/// the admin set from the first peer that answers, so a replaced disk does not start repairing
/// on a cluster whose repair was paused.
fn adopt_repair_settings(state: &State) {
    let mut peers = Peers::new(state);
    for node_idx in (0..state.map.get().nodes.len()).filter(|&i| i != state.node_idx) {
        let answer = peers.get(node_idx).and_then(|p| p.call(&Request::RepairStatus).map_err(Into::into));
        if let Ok(Response::RepairStatus { status }) = answer {
            let mut result = state.control_repair(proto::RepairAction::SetRate { bytes_per_s: status.bytes_per_s });
            if result.is_ok() {
                let action = if status.paused { proto::RepairAction::Pause } else { proto::RepairAction::Resume };
                result = state.control_repair(action);
            }
            match result {
                Ok(()) => {
                    tracing::info!(from = %state.map.get().nodes[node_idx].id, paused = status.paused, bytes_per_s = status.bytes_per_s, "repair settings taken from a peer (the first drive is new)")
                }
                Err(e) => tracing::error!(error = %e, "cannot store the repair settings taken from a peer"),
            }
            return;
        }
    }
    tracing::warn!("no peer answered; repair runs with the default settings");
}

fn finish(state: &State, drive_idx: usize, generation: u64) {
    // Under the drive's lock: a replace cannot slip between the check and the clearing.
    let _guard = state.rebuild_locks[drive_idx].lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if state.rebuild_generation[drive_idx].load(Ordering::SeqCst) != generation {
        return; // replaced again meanwhile: start over
    }
    let drive = &state.drives[drive_idx];
    match drive.sync_deferred().and_then(|()| drive.set_setting(SETTING_REBUILDING, b"0")) {
        Ok(()) => {
            state.rebuilding[drive_idx].store(false, Ordering::SeqCst);
            let stats = &state.rebuild_stats[drive_idx];
            tracing::info!(
                drive = drive_idx,
                keys_checked = stats.keys_checked.load(Ordering::Relaxed),
                keys_rebuilt = stats.keys_rebuilt.load(Ordering::Relaxed),
                "drive rebuilt; readers use it again"
            );
        }
        Err(e) => tracing::error!(drive = drive_idx, error = %e, "cannot clear the rebuilding mark; will retry"),
    }
}

/// A (set, bucket, key) position saved in setting `name`: where the last pass stopped
/// ([`SETTING_CURSOR`]) or how far it may have committed without fsync
/// ([`SETTING_UNSYNCED_UNTIL`]). A corrupt one is logged and read as none: the rebuild starts
/// over (it skips what the drive already holds).
fn cursor(drive: &Drive, name: &str) -> Option<(usize, String, String)> {
    let value = match drive.setting(name) {
        Ok(value) => value?,
        Err(e) => {
            tracing::error!(error = %e, "cannot read the rebuild cursor; starting over");
            return None;
        }
    };
    if value.is_empty() {
        return None;
    }
    let parsed = String::from_utf8(value).ok().and_then(|text| {
        let mut parts = text.splitn(3, '\0');
        let set = parts.next()?.parse().ok()?;
        Some((set, parts.next()?.to_owned(), parts.next()?.to_owned()))
    });
    if parsed.is_none() {
        tracing::error!(drive = %drive.root().display(), setting = name, "a rebuild position is corrupt; starting over");
    }
    parsed
}

fn rebuild_drive(state: &State, drive_idx: usize, generation: u64) -> Result<(), RepairError> {
    if state.repair.get().0 == crate::repair::Mode::Paused {
        return Err(RepairError::Paused);
    }
    let drive = &state.drives[drive_idx];
    let me = DriveRef { node_idx: state.node_idx, drive_idx };
    let mut peers = Peers::new(state);
    let start = cursor(drive, SETTING_CURSOR);
    // Keys up to here may have rows an earlier attempt committed without fsync whose data
    // files a power loss took: their chunks are checked, not trusted.
    let check_until = cursor(drive, SETTING_UNSYNCED_UNTIL);
    let mut failures = 0usize;
    for (set_idx, set) in state.map.get().sets.iter().enumerate() {
        let Some(position) = set.drives.iter().position(|d| *d == me) else { continue };
        if start.as_ref().is_some_and(|(s, _, _)| *s > set_idx) {
            continue;
        }
        for bucket in bucket_union(state, &mut peers, set, position)? {
            let mut after = String::new();
            if let Some((s, b, k)) = &start
                && *s == set_idx
            {
                if *b > bucket {
                    continue;
                }
                if *b == bucket {
                    after = k.clone();
                }
            }
            drive.create_bucket(&bucket)?;
            loop {
                let losses = drive.deferred_losses();
                let (keys, more) = key_page(state, &mut peers, set, position, &bucket, &after)?;
                let Some(last) = keys.last() else { break };
                // Durable before any of the page's deferred commits: a restart checks every
                // key up to here, wherever its pages then end.
                drive.set_setting(SETTING_UNSYNCED_UNTIL, format!("{set_idx}\0{bucket}\0{last}").as_bytes())?;
                let target =
                    Target { state, drive_idx, set, position, bucket: &bucket, set_idx, check_until: &check_until };
                failures += target.rebuild_keys(&mut peers, &keys)?;
                after = last.clone();
                let _guard = state.rebuild_locks[drive_idx].lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if state.rebuild_generation[drive_idx].load(Ordering::SeqCst) != generation {
                    return Err(RepairError::Refused("the drive was replaced again".into()));
                }
                // The page's commits were deferred: its data files reach the disk first, then
                // the cursor's durable write carries their metadata, unless the database was
                // dropped meanwhile (then the cursor stays, and the page is done again).
                drive.sync_deferred()?;
                let cursor = format!("{set_idx}\0{bucket}\0{after}");
                if !drive.set_setting_unless_lost(SETTING_CURSOR, cursor.as_bytes(), losses)? {
                    return Err(RepairError::Refused("the drive's metadata was reopened; redoing the page".into()));
                }
                if !more {
                    break;
                }
            }
        }
    }
    // The next pass (or the next rebuild) starts from the first key.
    {
        let _guard = state.rebuild_locks[drive_idx].lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if state.rebuild_generation[drive_idx].load(Ordering::SeqCst) != generation {
            return Err(RepairError::Refused("the drive was replaced again".into()));
        }
        drive.set_setting(SETTING_CURSOR, b"")?;
        drive.set_setting(SETTING_UNSYNCED_UNTIL, b"")?;
    }
    if failures > 0 {
        return Err(RepairError::Refused(format!("{failures} keys could not be rebuilt yet")));
    }
    Ok(())
}

/// The other drives of `set` (position, drive).
fn others(set: &ErasureSet, position: usize) -> impl Iterator<Item = (usize, DriveRef)> + '_ {
    set.drives.iter().copied().enumerate().filter(move |(p, _)| *p != position)
}

/// How many of the other drives must answer a listing for it to include every acknowledged
/// key: n - W + 1 (an acknowledged key is on at least W - 1 of the n - 1 others).
fn listing_quorum(state: &State) -> usize {
    let erasure = state.map.get().erasure_of_node(state.node_idx);
    erasure.n() - erasure.write_quorum() + 1
}

/// Buckets on the other drives' nodes, sorted.
fn bucket_union(
    state: &State,
    peers: &mut Peers<'_>,
    set: &ErasureSet,
    position: usize,
) -> Result<Vec<String>, RepairError> {
    let mut names = BTreeSet::new();
    let mut answered = 0;
    for (_, drive) in others(set, position) {
        let buckets = if drive.node_idx == state.node_idx {
            state.drives[drive.drive_idx].list_buckets().ok()
        } else {
            match peers.get(drive.node_idx).and_then(|p| p.call(&Request::BucketList).map_err(Into::into)) {
                Ok(Response::Buckets { buckets }) => Some(buckets),
                _ => {
                    peers.forget(drive.node_idx);
                    None
                }
            }
        };
        if let Some(buckets) = buckets {
            answered += 1;
            names.extend(buckets.into_iter().map(|b| b.name));
        }
    }
    if answered < listing_quorum(state) {
        return Err(RepairError::Refused(format!("{answered} peers listed buckets, {} needed", listing_quorum(state))));
    }
    Ok(names.into_iter().collect())
}

/// The next keys after `after` that any answering peer holds, sorted, and whether more follow.
fn key_page(
    state: &State,
    peers: &mut Peers<'_>,
    set: &ErasureSet,
    position: usize,
    bucket: &str,
    after: &str,
) -> Result<(Vec<String>, bool), RepairError> {
    let mut keys = BTreeSet::new();
    let mut answered = 0;
    // Keys up to the smallest last key of a full page are complete across the answers.
    let mut cutoff: Option<String> = None;
    for (_, drive) in others(set, position) {
        let listed = if drive.node_idx == state.node_idx {
            match state.drives[drive.drive_idx].list(bucket, "", after, KEYS_PER_PAGE as usize) {
                Ok(entries) => Some(entries),
                Err(chunkstore::Error::NoSuchBucket { .. }) => Some(Vec::new()),
                Err(_) => None,
            }
        } else {
            let request = Request::List {
                drive: drive.drive_idx as u32,
                bucket: bucket.to_owned(),
                prefix: String::new(),
                start_after: after.to_owned(),
                limit: KEYS_PER_PAGE,
            };
            match peers.get(drive.node_idx).and_then(|p| p.call(&request).map_err(Into::into)) {
                Ok(Response::Listing { entries }) => Some(entries),
                Ok(Response::Error { kind: proto::ErrorKind::NoSuchBucket, .. }) => Some(Vec::new()),
                _ => {
                    peers.forget(drive.node_idx);
                    None
                }
            }
        };
        let Some(entries) = listed else { continue };
        answered += 1;
        if entries.len() >= KEYS_PER_PAGE as usize
            && let Some(last) = entries.last()
            && cutoff.as_ref().is_none_or(|c| last.key < *c)
        {
            cutoff = Some(last.key.clone());
        }
        keys.extend(entries.into_iter().map(|e| e.key));
    }
    if answered < listing_quorum(state) {
        return Err(RepairError::Refused(format!(
            "{answered} peers listed {bucket}, {} needed",
            listing_quorum(state)
        )));
    }
    let more = cutoff.is_some();
    let keys = match cutoff {
        Some(cutoff) => keys.into_iter().filter(|k| *k <= cutoff).collect(),
        None => keys.into_iter().collect(),
    };
    Ok((keys, more))
}

/// One bucket of one set, being rebuilt onto this node's drive at `position`.
struct Target<'a> {
    state: &'a State,
    drive_idx: usize,
    set: &'a ErasureSet,
    position: usize,
    bucket: &'a str,
    set_idx: usize,
    /// Keys up to this position: check the chunks of versions the drive holds already instead
    /// of trusting them.
    check_until: &'a Option<(usize, String, String)>,
}

impl Target<'_> {
    /// Rebuilds this drive's chunks of each key's readable version, [`REBUILD_THREADS`] keys
    /// at a time; returns how many keys failed.
    fn rebuild_keys(&self, peers: &mut Peers<'_>, keys: &[String]) -> Result<usize, RepairError> {
        let replies = set_versions(self.state, peers, self.set, self.position, self.bucket, keys);
        let next = AtomicUsize::new(0);
        let failures = AtomicUsize::new(0);
        let paused = AtomicBool::new(false);
        std::thread::scope(|scope| {
            for _ in 0..REBUILD_THREADS.min(keys.len()) {
                scope.spawn(|| {
                    let mut peers = Peers::new(self.state);
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        if i >= keys.len() || paused.load(Ordering::SeqCst) {
                            return;
                        }
                        match self.rebuild_key(&mut peers, &keys[i], &replies[i]) {
                            Ok(()) => {}
                            Err(RepairError::Paused) => paused.store(true, Ordering::SeqCst),
                            Err(e) => {
                                tracing::warn!(key = %keys[i], error = %e, "could not rebuild a key onto the drive yet");
                                failures.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                    }
                });
            }
        });
        if paused.load(Ordering::SeqCst) {
            return Err(RepairError::Paused);
        }
        Ok(failures.load(Ordering::SeqCst))
    }

    /// Rebuilds one key's readable version onto the drive, unless it holds it (or newer).
    fn rebuild_key(
        &self,
        peers: &mut Peers<'_>,
        key: &str,
        replies: &[Option<KeyVersions>],
    ) -> Result<(), RepairError> {
        let (state, position, bucket) = (self.state, self.position, self.bucket);
        let drive = &state.drives[self.drive_idx];
        let stats = &state.rebuild_stats[self.drive_idx];
        stats.keys_checked.fetch_add(1, Ordering::Relaxed);
        let Some((meta, acknowledged)) = readable_version(state, replies) else {
            // Nothing readable among the answers. If the silent peers (and this drive, which
            // may have held it) could make up a write quorum with a version's holders, that
            // version may be acknowledged: try again later rather than call the drive rebuilt
            // without it.
            let silent = (0..replies.len()).filter(|&p| p != position && replies[p].is_none()).count();
            if silent > 0
                && proto::VersionTally::of(replies).most_held() + silent + 1
                    >= state.map.get().erasure_of_node(state.node_idx).write_quorum()
            {
                return Err(RepairError::Refused(format!("{silent} peers did not answer for {key}")));
            }
            tracing::debug!(key, "no readable version on the set (a write in flight, or lost); nothing to rebuild");
            return Ok(());
        };
        let held = drive.get_versions(bucket, key)?;
        if held.all().any(|m| m.version > meta.version) {
            return Ok(()); // written here since (durably)
        }
        if let Some(mine) = held.all().find(|m| m.version == meta.version) {
            let check = crate::scrub::Check::DeepUnpaced;
            let suspect = self
                .check_until
                .as_ref()
                .is_some_and(|(s, b, k)| (self.set_idx, bucket, key) <= (*s, b.as_str(), k.as_str()));
            let problem = if suspect {
                crate::scrub::own_chunk_problem(state, self.drive_idx, mine, position, check)
            } else {
                None
            };
            let Some(problem) = problem else {
                return Ok(()); // repaired or written here already
            };
            tracing::warn!(key, problem, "a chunk rebuilt before a crash is damaged; rebuilding it again");
        }
        // Deferred: the cursor, saved durably after each page, carries these commits to the disk;
        // a crash before it redoes the page.
        let missing = [position as u32];
        crate::repair::rebuild(state, peers, &meta, &self.set.drives, position, &missing, MetaSync::Deferred)?;
        stats.keys_rebuilt.fetch_add(1, Ordering::Relaxed);
        if acknowledged {
            let retire_at_ms = now_ms().saturating_add(state.retire_grace.as_millis() as u64);
            drive.finalize(bucket, key, meta.version, &[], retire_at_ms)?;
        }
        Ok(())
    }
}

/// What the other drives of the set hold of each key: `[key][position]`.
fn set_versions(
    state: &State,
    peers: &mut Peers<'_>,
    set: &ErasureSet,
    position: usize,
    bucket: &str,
    keys: &[String],
) -> Vec<Vec<Option<KeyVersions>>> {
    let mut replies = vec![vec![None; set.drives.len()]; keys.len()];
    let mut by_node: HashMap<usize, Vec<(usize, u32)>> = HashMap::new();
    for (p, drive) in others(set, position) {
        if drive.node_idx == state.node_idx {
            if state.is_rebuilding(drive.drive_idx) {
                continue;
            }
            let local = &state.drives[drive.drive_idx];
            for (i, key) in keys.iter().enumerate() {
                replies[i][p] = local.get_versions(bucket, key).ok().and_then(|mut v| {
                    v.finalized = local.finalized(bucket, key).ok()?;
                    Some(v)
                });
            }
        } else {
            by_node.entry(drive.node_idx).or_default().push((p, drive.drive_idx as u32));
        }
    }
    for (node_idx, drives) in by_node {
        let items: Vec<(usize, usize, MetaKey)> = keys
            .iter()
            .enumerate()
            .flat_map(|(i, key)| {
                drives
                    .iter()
                    .map(move |(p, d)| (i, *p, MetaKey { drive: *d, bucket: bucket.to_owned(), key: key.clone() }))
            })
            .collect();
        for batch in items.chunks(META_ITEMS_PER_REQUEST) {
            let items: Vec<MetaKey> = batch.iter().map(|(_, _, m)| m.clone()).collect();
            match peers.get(node_idx).and_then(|peer| peer.meta_get(&items, MetaDetail::WithFloor).map_err(Into::into))
            {
                Ok(got) => {
                    for ((i, p, _), versions) in batch.iter().zip(got) {
                        if !versions.unavailable {
                            replies[*i][*p] = Some(versions);
                        }
                    }
                }
                Err(_) => {
                    peers.forget(node_idx);
                    break;
                }
            }
        }
    }
    replies
}

/// The version a reader would take from these replies (see the client's `choose_version`): the
/// newest no older than any drive's acknowledged floor that enough drives hold to be read; and
/// whether it is acknowledged. `None` when no version is readable.
fn readable_version(state: &State, replies: &[Option<KeyVersions>]) -> Option<(ObjectMeta, bool)> {
    let tally = proto::VersionTally::of(replies);
    let meta = tally.newest_readable(state.map.get().erasure_of_node(state.node_idx).marker_quorum())?;
    Some((meta.clone(), tally.floor.is_some_and(|f| f >= meta.version)))
}
