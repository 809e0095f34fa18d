//! Background scrubbing: each node walks its drives' key indexes, compares every current version
//! with what the other drives of its erasure set hold, and checks its own data file (present,
//! full length). A deep pass, less often, also reads every chunk and checks each block against
//! the checksums the writer recorded. What it finds goes to the drive's repair queue, which
//! `repair` drains: a peer that lacks a version (it slept through the PUT, or its drive was
//! restored from an old copy) and a chunk of ours that is missing, short or corrupt.
//!
//! Rules: a version younger than [`SETTLE_MS`] is a write in flight and is left alone; a
//! version is only pushed to peers when it is known acknowledged (a drive's floor names it, or
//! W drives hold it, so it was never rolled back), so the scrubber never spreads a failed
//! write; a drive whose version is older than a floor some drive knows is stale and pushes
//! nothing; only the lowest holder that answered queues the repair, so one node does each. A version held by W drives is finalized here if the writer's finalize
//! never arrived, so the versions it replaced can retire. A delete marker that every drive of
//! the set holds, older than the retire grace and alone on its drive, is collected (garbage):
//! its key's row goes, its acknowledged floor stays. A failed write's leftover (a version no
//! reader can take: fewer holders than reading it needs, fewer than W, no floor naming it, with
//! every drive of the set answering) that stays so for [`LEFTOVER_GC_AFTER_DEFAULT`] is removed
//! (`chunkstore::Drive::rollback`, as its writer's rollback would have). A readable one (as
//! many holders as a read takes, fewer than W, nothing newer anywhere) is completed instead,
//! once watched for the shorter of that and 90 s: finalized by its lowest holder, as an
//! acknowledged version, and queued for the drives that lack it, since readers may have taken
//! it already (a writer that may leave one says "may still take effect").
//!
//! Bounded: [`KEYS_PER_BATCH`] keys per metadata round trip to each peer, at most
//! [`KEYS_PER_S_MAX`] keys a second, and deep reads paced by the repair byte budget (a paused
//! repair pauses deep reads too).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cluster::{DriveRef, Placement};
use proto::{BATCH_ITEMS_MAX, KeyVersions, MetaDetail, MetaKey, ObjectMeta, RepairKind};

use crate::State;
use crate::repair::{Peers, now_ms};

/// How often a node scrubs its drives, by default: a pass over a drive's key index costs one
/// metadata lookup per key here and one batched request per peer per 256 keys.
pub const SCRUB_INTERVAL_DEFAULT: Duration = Duration::from_secs(60 * 60);
/// How often a scrub pass is deep (reads and checksums every chunk), by default: a deep pass
/// reads the whole drive at the repair budget, so weekly keeps its cost a small share of the
/// disk's time while catching bit rot long before a second failure meets it.
pub const DEEP_SCRUB_INTERVAL_DEFAULT: Duration = Duration::from_secs(7 * 24 * 60 * 60);
/// The first pass after a start waits at most this long.
const FIRST_PASS_DELAY_MAX: Duration = Duration::from_secs(5 * 60);
/// Keys per batch: one metadata request per peer node for the whole batch.
const KEYS_PER_BATCH: usize = 256;
/// Versions younger than this (by their version clock) are writes in flight: not judged yet.
pub(crate) const SETTLE_MS: u64 = 10_000;
/// Most keys checked per second per node.
const KEYS_PER_S_MAX: u64 = 2_000;
/// How long a failed write's leftover must stay one before the scrubber removes it, by default:
/// its writer has long given up (a writer decides within two request timeouts, 30 s each by
/// default), and clients whose timeouts are longer still fit.
pub const LEFTOVER_GC_AFTER_DEFAULT: Duration = Duration::from_secs(10 * 60);
/// Leftovers watched at once per node; past it the watch starts over (collection is delayed,
/// never wrong).
const LEFTOVERS_WATCHED_MAX: usize = 100_000;
/// When the last deep pass ended (Unix ms, little-endian), on the node's first drive.
const SETTING_DEEP_LAST: &str = "scrub.deep_last_ms";

/// What the scrubber did since the node started.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    passes: AtomicU64,
    deep_passes: AtomicU64,
    keys_checked: AtomicU64,
    problems_found: AtomicU64,
    markers_collected: AtomicU64,
    leftovers_collected: AtomicU64,
    /// Readable versions of unknown outcome finalized (`complete_readable_leftover`).
    leftovers_completed: AtomicU64,
    /// Failed writes' leftovers seen, per (drive, version), with when first seen (this node's
    /// monotonic clock: the writers' clocks, which name versions, may be off).
    leftovers: std::sync::Mutex<HashMap<(usize, proto::VersionId), Instant>>,
    last_pass_end_ms: AtomicU64,
    running: AtomicBool,
    /// The running deep pass skipped chunks (repair was paused).
    deep_skipped: AtomicBool,
}

/// The scrubber's counters, for `tessera repair status`.
pub(crate) fn status(state: &State) -> proto::ScrubStatus {
    let stats = &state.scrub_stats;
    proto::ScrubStatus {
        passes: stats.passes.load(Ordering::Relaxed),
        deep_passes: stats.deep_passes.load(Ordering::Relaxed),
        keys_checked: stats.keys_checked.load(Ordering::Relaxed),
        problems_found: stats.problems_found.load(Ordering::Relaxed),
        markers_collected: stats.markers_collected.load(Ordering::Relaxed),
        last_pass_end_ms: stats.last_pass_end_ms.load(Ordering::Relaxed),
        running: stats.running.load(Ordering::Relaxed),
    }
}

/// Runs until the process exits: a pass every `state.scrub_interval`, deep once
/// `state.deep_scrub_interval` has passed since the last deep one.
pub(crate) fn worker(state: &State) {
    let mut deep_last = deep_last_ms(state);
    let first = if state.scrub_soon { Duration::from_secs(1) } else { state.scrub_interval.min(FIRST_PASS_DELAY_MAX) };
    std::thread::sleep(first);
    loop {
        if state.map.get().node_is_removed(state.node_idx) {
            // Nothing reads a removed pool: no copies to compare or restore.
            std::thread::sleep(state.scrub_interval.min(FIRST_PASS_DELAY_MAX));
            continue;
        }
        let started = Instant::now();
        let deep = now_ms().saturating_sub(deep_last) >= state.deep_scrub_interval.as_millis() as u64;
        state.scrub_stats.running.store(true, Ordering::Relaxed);
        state.scrub_stats.deep_skipped.store(false, Ordering::Relaxed);
        tracing::debug!(deep, "scrub pass starting");
        let attempt = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pass(state, deep)));
        state.scrub_stats.running.store(false, Ordering::Relaxed);
        if attempt.is_err() {
            tracing::error!("scrub pass panicked; the next pass starts over");
        } else {
            let stats = &state.scrub_stats;
            stats.passes.fetch_add(1, Ordering::Relaxed);
            stats.last_pass_end_ms.store(now_ms(), Ordering::Relaxed);
            if deep && !stats.deep_skipped.load(Ordering::Relaxed) {
                stats.deep_passes.fetch_add(1, Ordering::Relaxed);
                deep_last = now_ms();
                if let Err(e) = state.drives[0].set_setting(SETTING_DEEP_LAST, &deep_last.to_le_bytes()) {
                    tracing::error!(error = %e, "cannot record the deep scrub's end; the next start scrubs deep again");
                }
            }
            tracing::info!(deep, seconds = started.elapsed().as_secs_f64(), "scrub pass done");
        }
        std::thread::sleep(state.scrub_interval.saturating_sub(started.elapsed()).max(Duration::from_millis(100)));
    }
}

/// When the last deep pass ended; a node that never ran one starts counting now. Unreadable or
/// corrupt state is logged and treated as "never", so the next deep pass comes one interval on.
fn deep_last_ms(state: &State) -> u64 {
    let stored = match state.drives[0].setting(SETTING_DEEP_LAST) {
        Ok(value) => value.and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok()).map(u64::from_le_bytes),
        Err(e) => {
            tracing::error!(error = %e, "cannot read the scrubber's state; starting its schedule over");
            None
        }
    };
    stored.unwrap_or_else(|| {
        let now = now_ms();
        if let Err(e) = state.drives[0].set_setting(SETTING_DEEP_LAST, &now.to_le_bytes()) {
            tracing::warn!(error = %e, "cannot record the scrubber's schedule");
        }
        now
    })
}

fn pass(state: &State, deep: bool) {
    let mut peers = Peers::new(state);
    let mut batch_started = Instant::now();
    for drive_idx in 0..state.drives.len() {
        if state.is_rebuilding(drive_idx) {
            continue; // its rebuild goes through every key anyway
        }
        let drive = &state.drives[drive_idx];
        let buckets = match drive.list_buckets() {
            Ok(buckets) => buckets,
            Err(e) => {
                tracing::error!(drive = drive_idx, error = %e, "scrub cannot list buckets; skipping the drive");
                continue;
            }
        };
        for bucket in buckets {
            let mut after = String::new();
            loop {
                let entries = match drive.list(&bucket.name, "", &after, KEYS_PER_BATCH) {
                    Ok(entries) => entries,
                    Err(chunkstore::Error::NoSuchBucket { .. }) => break,
                    Err(e) => {
                        tracing::error!(drive = drive_idx, bucket = %bucket.name, error = %e, "scrub cannot list keys");
                        break;
                    }
                };
                let Some(last) = entries.last() else { break };
                after = last.key.clone();
                let keys: Vec<String> = entries.iter().map(|e| e.key.clone()).collect();
                check_batch(state, drive_idx, &bucket.name, &keys, deep, &mut peers);
                // At most KEYS_PER_S_MAX keys a second.
                let due = Duration::from_secs_f64(keys.len() as f64 / KEYS_PER_S_MAX as f64);
                std::thread::sleep(due.saturating_sub(batch_started.elapsed()));
                batch_started = Instant::now();
                if keys.len() < KEYS_PER_BATCH {
                    break;
                }
            }
        }
    }
}

/// Checks one batch of keys of one drive: its own chunks, then what its peers hold.
fn check_batch(state: &State, drive_idx: usize, bucket: &str, keys: &[String], deep: bool, peers: &mut Peers<'_>) {
    let drive = &state.drives[drive_idx];
    let me = DriveRef { node_idx: state.node_idx, drive_idx };
    let settled_before = now_ms().saturating_sub(SETTLE_MS);
    // (meta, this drive's position in its set, its floor, whether it retains older versions)
    let mut checked: Vec<(ObjectMeta, usize, Option<proto::VersionId>, bool)> = Vec::with_capacity(keys.len());
    for key in keys {
        let current = drive
            .get_versions(bucket, key)
            .and_then(|v| Ok((v.current, !v.retained.is_empty(), drive.finalized(bucket, key)?)));
        let (meta, retains, floor) = match current {
            Ok((Some(meta), retains, floor)) => (meta, retains, floor),
            Ok((None, ..)) => continue,
            Err(e) => {
                tracing::error!(drive = drive_idx, key, error = %e, "scrub cannot read a key's metadata");
                continue;
            }
        };
        if meta.version.unix_ns / 1_000_000 > settled_before {
            continue;
        }
        let Some(position) =
            state.map.get().sets.get(meta.set_idx as usize).and_then(|s| s.drives.iter().position(|d| *d == me))
        else {
            tracing::error!(drive = drive_idx, key, set = meta.set_idx, "a version names a set this drive is not in");
            continue;
        };
        state.scrub_stats.keys_checked.fetch_add(1, Ordering::Relaxed);
        if let Some(problem) =
            own_chunk_problem(state, drive_idx, &meta, position, if deep { Check::Deep } else { Check::Shallow })
        {
            tracing::warn!(drive = drive_idx, key, version = %meta.version.to_hex(), problem, "scrub found a damaged chunk; queued for repair");
            queue(state, drive_idx, &meta, &[position as u32], RepairKind::Damaged);
        }
        checked.push((meta, position, floor, retains));
    }
    let replies = peer_versions(state, peers, &checked);
    let erasure = state.map.get().erasure_of_node(state.node_idx);
    for ((meta, position, floor, retains), replies) in checked.iter().zip(replies) {
        // A drive that collected this delete marker holds it as far as anyone can tell.
        let holds = |v: &KeyVersions| {
            v.all().any(|m| m.version == meta.version)
                || (meta.deleted && v.current.is_none() && v.finalized.is_some_and(|f| f >= meta.version))
        };
        let holders: Vec<usize> =
            (0..replies.len()).filter(|&p| p == *position || replies[p].as_ref().is_some_and(&holds)).collect();
        if floor.is_some_and(|f| f > meta.version)
            || replies.iter().flatten().any(|v| v.finalized.is_some_and(|f| f > meta.version))
        {
            continue; // a newer version is acknowledged: this drive is the stale one
        }
        // Spread only what is known acknowledged (finalized, or on W drives, so never rolled
        // back): a version merely readable may be a failed write whose rollback is on its way.
        let acknowledged = *floor == Some(meta.version)
            || replies.iter().flatten().any(|v| v.finalized == Some(meta.version))
            || holders.len() >= erasure.write_quorum();
        let mut completed = false;
        if !acknowledged {
            // Every other drive answered: no holder hides. Fewer than W hold it, with no floor
            // naming it, so it was never acknowledged: a write in flight (hence the watches
            // below), or one whose outcome its writer left unknown or whose rollback missed
            // drives.
            let all_answered = (0..replies.len()).all(|p| p == *position || replies[p].is_some());
            let readable = holders.len() >= meta.drives_to_read(erasure.marker_quorum());
            if all_answered && !readable && holders.len() < erasure.write_quorum() {
                // Too few hold it to read it (data versions need k, others W - m): no reader
                // takes it, and its writer did not acknowledge it. Removed, as its writer would.
                collect_leftover(state, drive_idx, meta);
                continue;
            }
            // Readable: readers take it already, so it is completed, never removed (a read
            // that returned it must not be undone). Its writer either left the outcome
            // unknown or had rollbacks unconfirmed on as many drives as a read takes, and says
            // so ("may still take effect"): a writer reports a failure only when fewer may
            // hold it (`client::put::Fanout::commit`). Done by its lowest holder, once no
            // writer can still be deciding, and only while nothing newer exists anywhere.
            let newer = replies.iter().flatten().any(|v| v.all().any(|m| m.version > meta.version));
            if !(all_answered && readable && !newer && holders.first() == Some(position)) {
                continue;
            }
            if !complete_readable_leftover(state, drive_idx, meta) {
                continue;
            }
            completed = true;
        }
        // (No floor is newer than the version here: such keys were skipped above.)
        let finalized_here = *floor == Some(meta.version) || completed;
        // Held by W drives but never finalized here (the writer's finalize was lost), or
        // finalized with replaced versions that arrived later and have no retirement time yet.
        if (holders.len() >= erasure.write_quorum() && !finalized_here) || (finalized_here && *retains && !completed) {
            finalize_here(state, drive_idx, meta);
        }
        if meta.deleted && finalized_here && !*retains && holders.len() == replies.len() {
            collect_marker(state, drive_idx, meta, settled_before);
        }
        let lacking: Vec<u32> = (0..replies.len())
            .filter(|&p| replies[p].as_ref().is_some_and(|v| !holds(v) && !v.all().any(|m| m.version > meta.version)))
            .map(|p| p as u32)
            .collect();
        if !lacking.is_empty() && holders.first() == Some(position) {
            tracing::info!(key = %meta.key, version = %meta.version.to_hex(), ?lacking, "scrub found drives without the current version; queued for repair");
            queue(state, drive_idx, meta, &lacking, RepairKind::Missing);
        }
    }
}

/// Removes a delete marker every drive of its set holds, once it is older than the retire
/// grace (its floor stays: see `chunkstore::Drive::collect_marker`).
fn collect_marker(state: &State, drive_idx: usize, meta: &ObjectMeta, settled_before_ms: u64) {
    let old_enough = meta.version.unix_ns / 1_000_000 + state.retire_grace.as_millis() as u64 <= settled_before_ms;
    if !old_enough {
        return;
    }
    match state.drives[drive_idx].collect_marker(&meta.bucket, &meta.key, meta.version) {
        Ok(true) => {
            state.scrub_stats.markers_collected.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(key = %meta.key, version = %meta.version.to_hex(), "delete marker collected");
        }
        Ok(false) => {}
        Err(e) => tracing::warn!(error = %e, "could not collect a delete marker"),
    }
}

/// Removes the leftover `meta` from this drive once it has been one for `leftover_gc_after`
/// (the first sighting starts the watch). Nothing a reader sees changes: no read could take it.
/// A listing and a bucket delete no longer meet it, and its space comes back.
fn collect_leftover(state: &State, drive_idx: usize, meta: &ObjectMeta) {
    if watched_for(state, drive_idx, meta) < state.leftover_gc_after {
        return;
    }
    match state.drives[drive_idx].rollback(&meta.bucket, &meta.key, meta.version) {
        Ok(()) => {
            state.scrub_stats.leftovers_collected.fetch_add(1, Ordering::Relaxed);
            tracing::info!(key = %meta.key, version = %meta.version.to_hex(), "a failed write's leftover collected");
            let mut leftovers = state.scrub_stats.leftovers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            leftovers.remove(&(drive_idx, meta.version));
        }
        Err(e) => tracing::warn!(error = %e, "could not collect a failed write's leftover"),
    }
}

/// Finalizes the readable leftover `meta` here once it has been one for the shorter of
/// `leftover_gc_after` and [`UNDECIDED_WAIT`] (a writer decides within two request timeouts),
/// as its writer would have had it acknowledged: the caller then queues the drives that lack
/// it, and repair, which spreads only versions known acknowledged, finds this floor. Whether
/// it did.
fn complete_readable_leftover(state: &State, drive_idx: usize, meta: &ObjectMeta) -> bool {
    if watched_for(state, drive_idx, meta) < state.leftover_gc_after.min(UNDECIDED_WAIT) {
        return false;
    }
    if !finalize_here(state, drive_idx, meta) {
        return false;
    }
    state.scrub_stats.leftovers_completed.fetch_add(1, Ordering::Relaxed);
    tracing::info!(key = %meta.key, version = %meta.version.to_hex(), "a readable write of unknown outcome completed (finalized; its missing chunks are queued for repair)");
    let mut leftovers = state.scrub_stats.leftovers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    leftovers.remove(&(drive_idx, meta.version));
    true
}

/// How long a readable version of unknown outcome is watched before it is completed: longer
/// than a writer takes to decide (as `repair::UNDECIDED_WAIT_MS`).
const UNDECIDED_WAIT: Duration = Duration::from_secs(90);

/// How long `meta` has been watched as a leftover on this drive (the first call starts it).
fn watched_for(state: &State, drive_idx: usize, meta: &ObjectMeta) -> Duration {
    let mut leftovers = state.scrub_stats.leftovers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if leftovers.len() >= LEFTOVERS_WATCHED_MAX && !leftovers.contains_key(&(drive_idx, meta.version)) {
        leftovers.clear();
    }
    leftovers.entry((drive_idx, meta.version)).or_insert_with(Instant::now).elapsed()
}

fn queue(state: &State, drive_idx: usize, meta: &ObjectMeta, positions: &[u32], kind: RepairKind) {
    state.scrub_stats.problems_found.fetch_add(positions.len() as u64, Ordering::Relaxed);
    if let Err(e) = state.drives[drive_idx].queue_repair(&meta.bucket, &meta.key, meta.version, positions, kind) {
        tracing::error!(error = %e, "cannot queue a repair the scrubber found");
    }
}

/// Whether it did.
fn finalize_here(state: &State, drive_idx: usize, meta: &ObjectMeta) -> bool {
    let retire_at_ms = now_ms().saturating_add(state.retire_grace.as_millis() as u64);
    match state.drives[drive_idx].finalize(&meta.bucket, &meta.key, meta.version, &[], retire_at_ms) {
        Ok(()) => {
            tracing::debug!(key = %meta.key, version = %meta.version.to_hex(), "scrub finalized a version");
            true
        }
        Err(e) => {
            tracing::warn!(error = %e, "scrub could not finalize a version");
            false
        }
    }
}

/// How closely [`own_chunk_problem`] looks.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Check {
    /// The data file's length.
    Shallow,
    /// Every block's checksum too, paced by the repair budget (a paused repair skips it).
    Deep,
    /// Every block's checksum, now: the rebuild's check of what a crash may have torn.
    DeepUnpaced,
}

/// What is wrong with this drive's chunks of `meta`, if anything: the data file is missing or
/// short (shallow), or a block does not match its checksum (deep).
pub(crate) fn own_chunk_problem(
    state: &State,
    drive_idx: usize,
    meta: &ObjectMeta,
    position: usize,
    check: Check,
) -> Option<&'static str> {
    if !meta.has_data_file() {
        return None;
    }
    let drive = &state.drives[drive_idx];
    let geometry = meta.geometry();
    if geometry.stripes == 0 {
        return None;
    }
    let last = geometry.stripes - 1;
    let expected = geometry.file_offset(last) + geometry.chunk_len(last) as u64;
    match drive.data_len(meta.version) {
        Ok(None) => return Some("data file missing"),
        Ok(Some(len)) if len < expected => return Some("data file short"),
        Ok(Some(_)) => {}
        Err(e) => {
            tracing::error!(drive = drive_idx, error = %e, "scrub cannot stat a data file");
            // The rebuild's check trusts nothing it cannot see; the scrubber tries again later.
            return (check == Check::DeepUnpaced).then_some("data file unreadable");
        }
    }
    if check == Check::Shallow {
        return None;
    }
    let placement = Placement { set_idx: meta.set_idx as usize, rotation: usize::from(meta.rotation), n: meta.n() };
    for stripe in 0..geometry.stripes {
        let len = geometry.chunk_len(stripe);
        if check == Check::Deep && state.repair.take(len as u64).is_err() {
            // Repair paused: deep reads wait, and this pass does not count as deep.
            state.scrub_stats.deep_skipped.store(true, Ordering::Relaxed);
            return None;
        }
        let chunk = match drive.read_chunk(meta.version, geometry.file_offset(stripe), len) {
            Ok(Some(chunk)) => chunk,
            Ok(None) => return Some("data file short"),
            Err(e) => {
                tracing::error!(drive = drive_idx, error = %e, "scrub cannot read a chunk");
                return Some("chunk unreadable");
            }
        };
        let crcs = meta.block_crcs(stripe, placement.chunk_at(stripe, position));
        if chunk.chunks(meta.block_bytes as usize).zip(crcs).any(|(block, crc)| crc32c::crc32c(block) != *crc) {
            return Some("block checksum mismatch");
        }
    }
    None
}

/// What every other drive of each version's set holds of its key: `[key][position]`, `None`
/// where the drive did not answer (down, or being rebuilt) and at the key's own position.
fn peer_versions(
    state: &State,
    peers: &mut Peers<'_>,
    checked: &[(ObjectMeta, usize, Option<proto::VersionId>, bool)],
) -> Vec<Vec<Option<KeyVersions>>> {
    let mut replies: Vec<Vec<Option<KeyVersions>>> = Vec::with_capacity(checked.len());
    // Per node: (key index, position) and the items asked.
    let mut asked: HashMap<usize, Vec<(usize, usize, MetaKey)>> = HashMap::new();
    for (i, (meta, position, ..)) in checked.iter().enumerate() {
        let set = &state.map.get().sets[meta.set_idx as usize];
        replies.push(vec![None; set.drives.len()]);
        for (p, drive) in set.drives.iter().enumerate() {
            if p == *position {
                continue;
            }
            if drive.node_idx == state.node_idx {
                replies[i][p] = local_versions(state, drive.drive_idx, &meta.bucket, &meta.key);
                continue;
            }
            let item = MetaKey { drive: drive.drive_idx as u32, bucket: meta.bucket.clone(), key: meta.key.clone() };
            asked.entry(drive.node_idx).or_default().push((i, p, item));
        }
    }
    for (node_idx, items) in asked {
        for batch in items.chunks(BATCH_ITEMS_MAX) {
            let items: Vec<MetaKey> = batch.iter().map(|(_, _, m)| m.clone()).collect();
            let answer =
                peers.get(node_idx).and_then(|peer| peer.meta_get(&items, MetaDetail::WithFloor).map_err(Into::into));
            match answer {
                Ok(keys) => {
                    for ((i, p, _), versions) in batch.iter().zip(keys) {
                        if !versions.unavailable {
                            replies[*i][*p] = Some(versions);
                        }
                    }
                }
                Err(e) => {
                    tracing::debug!(node = node_idx, error = %e, "a peer did not answer the scrubber");
                    peers.forget(node_idx);
                    break;
                }
            }
        }
    }
    replies
}

/// Another drive of this node, read directly; `None` if it is being rebuilt or fails.
fn local_versions(state: &State, drive_idx: usize, bucket: &str, key: &str) -> Option<KeyVersions> {
    if state.is_rebuilding(drive_idx) {
        return None;
    }
    let drive = &state.drives[drive_idx];
    let mut versions = drive.get_versions(bucket, key).ok()?;
    versions.finalized = drive.finalized(bucket, key).ok()?;
    Some(versions)
}
