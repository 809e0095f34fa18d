use super::*;
use proto::{META_FORMAT_VERSION, StripeGeometry};

fn version(unix_ns: u64) -> VersionId {
    VersionId { unix_ns, writer: 0xab }
}

fn meta(key: &str, version: VersionId, size: u64) -> ObjectMeta {
    let stripes = StripeGeometry::new(size, 2, 4096).stripes as usize;
    ObjectMeta {
        format: META_FORMAT_VERSION,
        bucket: "bkt".into(),
        key: key.into(),
        version,
        deleted: false,
        size,
        etag: String::new(),
        content_type: String::new(),
        user_meta: Vec::new(),
        headers: Vec::new(),
        modified_ms: 0,
        k: 2,
        m: 1,
        chunk_bytes: 4096,
        block_bytes: 4096,
        set_idx: 0,
        rotation: 0,
        crcs: vec![0; stripes * 3],
        parts: Vec::new(),
        pads: Vec::new(),
    }
}

fn drive() -> (tempfile::TempDir, Drive) {
    let dir = tempfile::tempdir().unwrap();
    Drive::format(dir.path()).unwrap();
    let drive = Drive::open(dir.path()).unwrap();
    drive.create_bucket("bkt").unwrap();
    (dir, drive)
}

/// Stages this drive's file for an object of `size` bytes (k=2, 4 KiB chunks) and commits it.
fn put(drive: &Drive, key: &str, version: VersionId, size: u64) -> CommitOutcome {
    put_if(drive, key, version, size, CommitCondition::None).unwrap()
}

fn put_if(
    drive: &Drive,
    key: &str,
    version: VersionId,
    size: u64,
    condition: CommitCondition,
) -> Result<CommitOutcome, Error> {
    let meta = meta(key, version, size);
    let geometry = meta.geometry();
    for stripe in 0..geometry.stripes {
        let chunk = vec![stripe as u8; geometry.chunk_len(stripe)];
        drive.write_chunk("bkt", version, geometry.file_offset(stripe), &chunk).unwrap();
    }
    drive.commit(&meta, &[], condition)
}

#[test]
fn if_absent_commit_is_refused_over_a_live_version_and_leaves_no_file() {
    let (dir, drive) = drive();
    put_if(&drive, "a", version(1), 100, CommitCondition::IfAbsent).unwrap();
    let refused = put_if(&drive, "a", version(2), 100, CommitCondition::IfAbsent);
    assert!(matches!(refused, Err(Error::PreconditionFailed { .. })), "{refused:?}");
    assert_eq!(drive.get_meta("bkt", "a").unwrap().unwrap().version, version(1));
    assert!(drive.open_version(version(2)).unwrap().is_none());
    assert!(!dir.path().join("tmp").join(version(2).to_hex()).exists(), "staging file dropped");
    // An older conditional writer is refused too (not silently superseded).
    assert!(matches!(
        put_if(&drive, "a", version(0), 100, CommitCondition::IfAbsent),
        Err(Error::PreconditionFailed { .. })
    ));
    // Over a delete marker the key is absent.
    let mut marker = meta("a", version(3), 0);
    marker.deleted = true;
    marker.crcs.clear();
    drive.commit(&marker, &[], CommitCondition::None).unwrap();
    assert!(matches!(
        put_if(&drive, "a", version(4), 100, CommitCondition::IfAbsent),
        Ok(CommitOutcome::Applied { .. })
    ));
}

#[test]
fn commit_makes_version_current_and_readable() {
    let (_dir, drive) = drive();
    assert_eq!(put(&drive, "a", version(1), 10_000), CommitOutcome::Applied { replaced_parts: Vec::new() });
    assert_eq!(drive.get_meta("bkt", "a").unwrap().unwrap().version, version(1));
    let file = drive.open_version(version(1)).unwrap().unwrap();
    assert_eq!(file.metadata().unwrap().len(), 4096 + 904);
}

#[test]
fn older_version_is_retained_beside_the_newer_one() {
    let (_dir, drive) = drive();
    put(&drive, "a", version(5), 100);
    assert_eq!(put(&drive, "a", version(3), 100), CommitOutcome::Superseded { current: version(5) });
    assert!(drive.open_version(version(3)).unwrap().is_some(), "a superseded commit stays durable");
    assert_eq!(put(&drive, "a", version(9), 100), CommitOutcome::Applied { replaced_parts: Vec::new() });
    assert!(drive.open_version(version(5)).unwrap().is_some(), "replaced data stays until retired");
    let versions = drive.get_versions("bkt", "a").unwrap();
    assert_eq!(versions.current.unwrap().version, version(9));
    let retained: Vec<_> = versions.retained.iter().map(|m| m.version).collect();
    assert_eq!(retained, [version(3), version(5)]);
    // Read brief: the same versions without their checksums, floor as asked.
    drive.finalize("bkt", "a", version(9), &[], 1_000).unwrap();
    let whole = drive.get_versions_with_floor("bkt", "a").unwrap();
    assert!(whole.all().all(|m| !m.crcs.is_empty()));
    for with_floor in [false, true] {
        let brief = drive.get_versions_brief("bkt", "a", with_floor).unwrap();
        let mut expected = whole.clone();
        expected.current = whole.current.as_ref().map(ObjectMeta::brief);
        expected.retained = whole.retained.iter().map(ObjectMeta::brief).collect();
        expected.checksums_left_out = true;
        if !with_floor {
            expected.finalized = None;
        }
        assert_eq!(brief, expected);
    }
}

#[test]
fn replaced_versions_retire_only_after_a_newer_finalize_and_the_grace() {
    let (_dir, drive) = drive();
    put(&drive, "a", version(1), 100);
    put(&drive, "a", version(2), 100);
    // Nothing acknowledged newer than version 1 yet: nothing may go, however late it is.
    assert_eq!(drive.retire_expired(u64::MAX, 100).unwrap(), 0);
    drive.finalize("bkt", "a", version(2), &[], 1_000).unwrap();
    assert_eq!(drive.retire_expired(999, 100).unwrap(), 0, "not before the grace");
    assert!(drive.open_version(version(1)).unwrap().is_some());
    assert_eq!(drive.retire_expired(1_000, 100).unwrap(), 1);
    assert!(drive.open_version(version(1)).unwrap().is_none());
    assert!(drive.open_version(version(2)).unwrap().is_some(), "the current version never retires");
    assert!(drive.get_versions("bkt", "a").unwrap().retained.is_empty());
}

#[test]
fn finalize_queues_the_positions_that_missed_the_version() {
    let (_dir, drive) = drive();
    put(&drive, "a", version(1), 100);
    drive.finalize("bkt", "a", version(1), &[2, 4], 1).unwrap();
    let queue = drive.repair_queue().unwrap();
    assert_eq!(queue.len(), 1);
    assert_eq!((queue[0].0, queue[0].1.positions.clone(), queue[0].1.key.as_str()), (version(1), vec![2, 4], "a"));
}

#[test]
fn settled_retained_versions_are_bounded_per_key() {
    let (dir, drive) = drive();
    let last = RETAINED_SETTLED_MAX as u64 + 3;
    for v in 1..=last {
        put(&drive, "a", version(v), 100);
        drive.finalize("bkt", "a", version(v), &[], u64::MAX).unwrap();
    }
    let versions = drive.get_versions("bkt", "a").unwrap();
    assert_eq!(versions.retained.len(), RETAINED_SETTLED_MAX);
    assert!(versions.retained.iter().all(|m| m.version > version(2)), "the oldest rows went first");
    // A GET that chose version 1 or 2 before its row went reads it to the end: the files stay
    // until their retirement time, and survive a reopen (the sweep keeps them).
    assert!(drive.open_version(version(1)).unwrap().is_some());
    drop(drive);
    let drive = Drive::open(dir.path()).unwrap();
    assert!(drive.open_version(version(2)).unwrap().is_some());
    assert_eq!(drive.version_count().unwrap(), last);
    // Finalized with a retirement time of u64::MAX: only then do they go.
    drive.retire_expired(u64::MAX - 1, usize::MAX).unwrap();
    assert!(drive.open_version(version(1)).unwrap().is_some() && drive.open_version(version(2)).unwrap().is_some());
    drive.retire_expired(u64::MAX, usize::MAX).unwrap();
    assert!(drive.open_version(version(1)).unwrap().is_none() && drive.open_version(version(2)).unwrap().is_none());
    assert!(drive.open_version(version(last)).unwrap().is_some());
}

#[test]
fn a_file_kept_for_its_readers_is_not_deleted_when_its_version_is_committed_again() {
    let (_dir, drive) = drive();
    for v in 1..=RETAINED_SETTLED_MAX as u64 + 2 {
        put(&drive, "a", version(v), 100);
        drive.finalize("bkt", "a", version(v), &[], 1_000).unwrap();
    }
    assert!(drive.get_versions("bkt", "a").unwrap().all().all(|m| m.version != version(1)));
    // Version 1 comes back as another key's data (a pool move brings a version back): its row
    // names the file again, so its time in the retiring table must not delete it.
    put(&drive, "b", version(1), 100);
    drive.retire_expired(2_000, usize::MAX).unwrap();
    assert!(drive.open_version(version(1)).unwrap().is_some());
}

#[test]
fn unsettled_versions_are_never_dropped_and_past_the_bound_a_commit_is_refused() {
    let (_dir, drive) = drive();
    // Nothing acknowledged here: any of them may be the newest acknowledged version (its
    // finalize late or lost), so none goes to make room.
    let last = RETAINED_PER_KEY_MAX as u64 + 2;
    for v in 2..=last {
        put(&drive, "a", version(v), 100);
    }
    let versions = drive.get_versions("bkt", "a").unwrap();
    assert_eq!(versions.retained.len(), RETAINED_PER_KEY_MAX);
    assert!(drive.open_version(version(2)).unwrap().is_some(), "no unsettled version is dropped");
    // One more row would pass the bound: refused, the drive as it was, the published file gone.
    for refused_version in [version(last + 1), version(1)] {
        let refused = put_if(&drive, "a", refused_version, 100, CommitCondition::None);
        assert!(matches!(refused, Err(Error::TooManyVersions { .. })), "{refused:?}");
        assert!(drive.open_version(refused_version).unwrap().is_none());
        let versions = drive.get_versions("bkt", "a").unwrap();
        assert_eq!(versions.current.map(|m| m.version), Some(version(last)));
        assert_eq!(versions.retained.len(), RETAINED_PER_KEY_MAX);
    }
    // Once a version is acknowledged, the ones it supersedes go and commits are taken again.
    drive.finalize("bkt", "a", version(last), &[], u64::MAX).unwrap();
    assert!(matches!(put(&drive, "a", version(last + 1), 100), CommitOutcome::Applied { .. }));
    assert_eq!(drive.get_versions("bkt", "a").unwrap().retained.len(), RETAINED_SETTLED_MAX);
    assert!(drive.open_version(version(last)).unwrap().is_some(), "the acknowledged version stays");
}

#[test]
fn a_late_commit_is_kept_unless_an_acknowledged_version_supersedes_it() {
    let (_dir, drive) = drive();
    for v in 3..=(RETAINED_SETTLED_MAX as u64 + 3) {
        put(&drive, "a", version(v), 100);
    }
    // Version 2 arrives after nine newer ones, none acknowledged: kept beside them (it may be
    // acknowledged, as the newest of its writer's view; dropping it would lose it here).
    assert!(matches!(put(&drive, "a", version(2), 100), CommitOutcome::Superseded { .. }));
    assert!(drive.get_versions("bkt", "a").unwrap().retained.iter().any(|m| m.version == version(2)));
    assert!(drive.open_version(version(2)).unwrap().is_some());
    // Once the newest is acknowledged, a late commit of version 1 is superseded by it: it is
    // dropped at once, with the other settled versions past the bound.
    drive.finalize("bkt", "a", version(RETAINED_SETTLED_MAX as u64 + 3), &[], u64::MAX).unwrap();
    assert!(matches!(put(&drive, "a", version(1), 100), CommitOutcome::Superseded { .. }));
    let versions = drive.get_versions("bkt", "a").unwrap();
    assert_eq!(versions.retained.len(), RETAINED_SETTLED_MAX);
    assert!(versions.retained.iter().all(|m| m.version > version(2)));
    assert!(drive.open_version(version(1)).unwrap().is_none());
}

#[test]
fn commit_without_staged_data_or_with_short_data_fails() {
    let (_dir, drive) = drive();
    assert!(matches!(
        drive.commit(&meta("a", version(1), 100), &[], CommitCondition::None),
        Err(Error::NoStagedData { .. })
    ));
    drive.write_chunk("bkt", version(2), 0, &[1; 10]).unwrap();
    assert!(matches!(
        drive.commit(&meta("a", version(2), 100), &[], CommitCondition::None),
        Err(Error::StagedLengthMismatch { .. })
    ));
    assert!(drive.get_meta("bkt", "a").unwrap().is_none());
}

#[test]
fn writes_into_missing_bucket_fail() {
    let (_dir, drive) = drive();
    assert!(matches!(drive.write_chunk("nope", version(1), 0, &[1]), Err(Error::NoSuchBucket { .. })));
}

#[test]
fn rollback_removes_only_the_named_version_and_restores_the_one_it_replaced() {
    let (_dir, drive) = drive();
    put(&drive, "a", version(1), 100);
    drive.rollback("bkt", "a", version(7)).unwrap();
    assert!(drive.get_meta("bkt", "a").unwrap().is_some());
    put(&drive, "a", version(2), 100);
    drive.rollback("bkt", "a", version(2)).unwrap();
    assert_eq!(drive.get_meta("bkt", "a").unwrap().unwrap().version, version(1), "exactly the state before");
    assert!(drive.open_version(version(2)).unwrap().is_none());
    assert!(drive.open_version(version(1)).unwrap().is_some());
    assert!(drive.get_versions("bkt", "a").unwrap().retained.is_empty());
    // A retained version that is rolled back is dropped, the current one untouched.
    put(&drive, "a", version(5), 100);
    put(&drive, "a", version(4), 100);
    drive.rollback("bkt", "a", version(4)).unwrap();
    assert_eq!(drive.get_meta("bkt", "a").unwrap().unwrap().version, version(5));
    assert!(drive.open_version(version(4)).unwrap().is_none());
    drive.rollback("bkt", "a", version(5)).unwrap();
    drive.rollback("bkt", "a", version(1)).unwrap();
    assert!(drive.get_meta("bkt", "a").unwrap().is_none());
    assert!(drive.open_version(version(1)).unwrap().is_none());
}

/// A version id of now (fences are kept by version age, so tiny ids would be pruned at once).
fn fresh_version(writer: u64) -> VersionId {
    let unix_ns = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64;
    VersionId { unix_ns, writer }
}

#[test]
fn rollback_fences_a_commit_that_arrives_after_it() {
    let (dir, drive) = drive();
    put(&drive, "a", version(1), 100);
    // The writer's data landed, its commit is still queued (a stalled node), the writer gave up
    // and rolled back here: the late commit must not make the failed write current.
    let late = fresh_version(1);
    let meta_late = meta("a", late, 100);
    let geometry = meta_late.geometry();
    for stripe in 0..geometry.stripes {
        drive.write_chunk("bkt", late, geometry.file_offset(stripe), &vec![1; geometry.chunk_len(stripe)]).unwrap();
    }
    drive.rollback("bkt", "a", late).unwrap();
    assert!(drive.is_fenced(late).unwrap());
    for stripe in 0..geometry.stripes {
        drive.write_chunk("bkt", late, geometry.file_offset(stripe), &vec![1; geometry.chunk_len(stripe)]).unwrap();
    }
    let refused = drive.commit(&meta_late, &[], CommitCondition::None);
    assert!(matches!(refused, Err(Error::RolledBack { .. })), "{refused:?}");
    assert_eq!(drive.get_meta("bkt", "a").unwrap().unwrap().version, version(1), "nothing changed");
    assert!(drive.open_version(late).unwrap().is_none(), "the published file is deleted");
    // A delete marker (no data file, nothing staged to lose) is refused the same way.
    let marker_version = fresh_version(2);
    drive.rollback("bkt", "a", marker_version).unwrap();
    let mut marker = meta("a", marker_version, 0);
    marker.deleted = true;
    marker.crcs.clear();
    assert!(matches!(drive.commit(&marker, &[], CommitCondition::None), Err(Error::RolledBack { .. })));
    assert!(!drive.get_meta("bkt", "a").unwrap().unwrap().deleted, "the key stays live");
    // A drive that held the version has had its one commit: no fence (a re-layout, which
    // writes a fixed version id, may be tried again there).
    let undone = fresh_version(3);
    put(&drive, "a", undone, 100);
    drive.rollback("bkt", "a", undone).unwrap();
    assert!(!drive.is_fenced(undone).unwrap());
    assert_eq!(drive.get_meta("bkt", "a").unwrap().unwrap().version, version(1));
    // Fences outlive a restart.
    drop(drive);
    let drive = Drive::open(dir.path()).unwrap();
    assert!(drive.is_fenced(late).unwrap() && drive.is_fenced(marker_version).unwrap());
    assert!(!drive.is_fenced(fresh_version(4)).unwrap());
}

#[test]
fn fences_of_versions_older_than_the_keep_time_are_dropped() {
    let (_dir, drive) = drive();
    let old = VersionId { unix_ns: 1_000_000, writer: 1 };
    drive.rollback("bkt", "a", old).unwrap();
    assert!(drive.is_fenced(old).unwrap(), "the newest fence stays, however old its version");
    let young = fresh_version(1);
    drive.rollback("bkt", "a", young).unwrap();
    assert!(!drive.is_fenced(old).unwrap(), "pruned by the next rollback");
    assert!(drive.is_fenced(young).unwrap());
}

#[test]
fn reopen_keeps_committed_data_and_sweeps_orphans() {
    let (dir, drive) = drive();
    put(&drive, "kept", version(1), 5000);
    drive.write_chunk("bkt", version(2), 0, &[1; 100]).unwrap();
    let orphan = dir.path().join("data").join("ab").join(version(3).to_hex());
    fs::write(&orphan, b"crash leftover").unwrap();
    drop(drive);
    let drive = Drive::open(dir.path()).unwrap();
    assert!(drive.open_version(version(1)).unwrap().is_some());
    assert!(!orphan.exists());
    assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
}

#[test]
fn list_is_sorted_prefixed_and_paged() {
    let (_dir, drive) = drive();
    for key in ["b/2", "a", "b/1", "c", "b/3"] {
        put(&drive, key, version(1), 10);
    }
    let keys = |prefix, start_after, limit| -> Vec<String> {
        drive.list("bkt", prefix, start_after, limit).unwrap().into_iter().map(|e| e.key).collect()
    };
    assert_eq!(keys("", "", 100), ["a", "b/1", "b/2", "b/3", "c"]);
    assert_eq!(keys("b/", "", 100), ["b/1", "b/2", "b/3"]);
    assert_eq!(keys("b/", "b/1", 1), ["b/2"]);
    assert_eq!(keys("", "b/3", 100), ["c"]);
}

#[test]
fn delete_bucket_refuses_live_objects_but_not_markers() {
    let (_dir, drive) = drive();
    put(&drive, "a", version(1), 10);
    assert!(matches!(drive.delete_bucket("bkt"), Err(Error::BucketNotEmpty { .. })));
    let mut marker = meta("a", version(2), 0);
    marker.deleted = true;
    marker.crcs.clear();
    drive.commit(&marker, &[], CommitCondition::None).unwrap();
    drive.delete_bucket("bkt").unwrap();
    assert!(!drive.has_bucket("bkt").unwrap());
    assert!(matches!(drive.delete_bucket("bkt"), Err(Error::NoSuchBucket { .. })));
}

#[test]
fn open_refuses_unformatted_directory() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(Drive::open(&dir.path().join("missing")), Err(Error::DriveMissing { .. })));
}

#[test]
fn repair_queue_records_missing_positions() {
    let (_dir, drive) = drive();
    let meta = meta("a", version(1), 0);
    drive.commit(&meta, &[2], CommitCondition::None).unwrap();
    let queue = drive.repair_queue().unwrap();
    assert_eq!((queue[0].0, queue[0].1.positions.clone()), (version(1), vec![2]));
    // Done for some positions, put off, merged with new knowledge, done for the rest.
    drive.queue_repair("bkt", "a", version(1), &[4, 2], proto::RepairKind::Missing).unwrap();
    drive.repair_later(version(1), 5_000).unwrap();
    assert!(drive.repairs(4_999, 10).unwrap().is_empty(), "put off");
    assert_eq!(drive.repairs(5_000, 10).unwrap()[0].1.attempts, 1);
    drive.repair_done(version(1), &[2]).unwrap();
    assert_eq!(drive.repair_queue().unwrap()[0].1.positions, [4]);
    drive.repair_done(version(1), &[4]).unwrap();
    assert!(drive.repair_queue().unwrap().is_empty());
}

#[test]
fn retained_versions_stay_out_of_listings_and_go_with_their_bucket() {
    let (_dir, drive) = drive();
    put(&drive, "a", version(1), 100);
    put(&drive, "a", version(2), 100);
    put(&drive, "ab", version(3), 100);
    let keys: Vec<String> = drive.list("bkt", "", "", 10).unwrap().into_iter().map(|e| e.key).collect();
    assert_eq!(keys, ["a", "ab"], "a key's retained rows sit between it and the next key, unlisted");
    assert_eq!(drive.get_versions("bkt", "a").unwrap().retained.len(), 1);
    assert!(drive.get_versions("bkt", "ab").unwrap().retained.is_empty(), "a prefix's rows are not its");
    for (key, v) in [("a", 4), ("ab", 5)] {
        let mut marker = meta(key, version(v), 0);
        marker.deleted = true;
        marker.crcs.clear();
        drive.commit(&marker, &[], CommitCondition::None).unwrap();
    }
    // Only markers are current: the retained live versions do not keep the bucket.
    drive.delete_bucket("bkt").unwrap();
    assert!(drive.open_version(version(1)).unwrap().is_none(), "retained data went with the bucket");
}

#[test]
fn a_repair_commit_refuses_a_staged_file_with_holes_and_replaces_a_damaged_one() {
    let (dir, drive) = drive();
    put(&drive, "a", version(1), 10_000);
    let meta = meta("a", version(1), 10_000);
    let geometry = meta.geometry();
    let good: Vec<Vec<u8>> = (0..geometry.stripes).map(|s| vec![7u8 + s as u8; geometry.chunk_len(s)]).collect();
    let crcs: Vec<u32> = good.iter().flat_map(|c| c.chunks(4096).map(crc32c::crc32c).collect::<Vec<_>>()).collect();
    // Another repair published the staging file: a later chunk cannot start a new one with a
    // hole where the first was.
    let last = geometry.stripes - 1;
    let err = drive
        .write_staged(Staging::Repair, "bkt", version(1), geometry.file_offset(last), &good[last as usize])
        .unwrap_err();
    assert!(matches!(err, Error::NoStagedData { .. }), "{err}");
    // Only the first stripe staged: short, refused.
    drive.write_staged(Staging::Repair, "bkt", version(1), 0, &good[0]).unwrap();
    assert!(matches!(
        drive.commit_repair(&meta, &crcs, MetaSync::Now),
        Err(Error::StagedChecksumMismatch { stripe: 1, .. })
    ));
    // Fully staged: the damaged data file is replaced, the metadata left alone.
    for stripe in 0..geometry.stripes {
        let offset = geometry.file_offset(stripe);
        drive.write_staged(Staging::Repair, "bkt", version(1), offset, &good[stripe as usize]).unwrap();
    }
    drive.commit_repair(&meta, &crcs, MetaSync::Now).unwrap();
    let data = fs::read(dir.path().join("data").join(&version(1).to_hex()[30..]).join(version(1).to_hex())).unwrap();
    assert_eq!(data, good.concat());
    assert_eq!(drive.get_meta("bkt", "a").unwrap().unwrap().version, version(1));
}

#[test]
fn a_repair_commit_applies_a_version_whose_writer_was_fenced() {
    // The writer's rollback fenced the version here; its outcome was then left unknown and the
    // scrubber completed it (node::scrub): the repair must land, or the version stays at k.
    let (_dir, drive) = drive();
    put(&drive, "a", version(1), 100);
    let completed = fresh_version(1);
    drive.rollback("bkt", "a", completed).unwrap();
    assert!(drive.is_fenced(completed).unwrap());
    let meta = meta("a", completed, 10_000);
    let geometry = meta.geometry();
    let chunks: Vec<Vec<u8>> = (0..geometry.stripes).map(|s| vec![3u8; geometry.chunk_len(s)]).collect();
    let crcs: Vec<u32> = chunks.iter().flat_map(|c| c.chunks(4096).map(crc32c::crc32c).collect::<Vec<_>>()).collect();
    for stripe in 0..geometry.stripes {
        drive
            .write_staged(Staging::Repair, "bkt", completed, geometry.file_offset(stripe), &chunks[stripe as usize])
            .unwrap();
    }
    drive.commit_repair(&meta, &crcs, MetaSync::Now).unwrap();
    assert_eq!(drive.get_meta("bkt", "a").unwrap().unwrap().version, completed);
    // The writer's own late commit is still refused (it is not the repair's).
    let late = fresh_version(2);
    drive.rollback("bkt", "a", late).unwrap();
    let refused = put_if(&drive, "a", late, 100, CommitCondition::None);
    assert!(matches!(refused, Err(Error::RolledBack { .. })), "{refused:?}");
    assert_eq!(drive.get_meta("bkt", "a").unwrap().unwrap().version, completed);
}

#[test]
fn a_repair_and_a_writer_of_one_version_stage_separate_files() {
    // A reader's hint queues a repair of a version whose PUT is still staging on this drive
    // (issue 37, item 5): the repair must neither publish nor abort the writer's file.
    let (dir, drive) = drive();
    let meta = meta("a", version(1), 10_000);
    let geometry = meta.geometry();
    let chunks: Vec<Vec<u8>> = (0..geometry.stripes).map(|s| vec![3u8 + s as u8; geometry.chunk_len(s)]).collect();
    let crcs: Vec<u32> = chunks.iter().flat_map(|c| c.chunks(4096).map(crc32c::crc32c).collect::<Vec<_>>()).collect();
    drive.write_chunk("bkt", version(1), 0, &chunks[0]).unwrap();
    for stripe in 0..geometry.stripes {
        let offset = geometry.file_offset(stripe);
        drive.write_staged(Staging::Repair, "bkt", version(1), offset, &chunks[stripe as usize]).unwrap();
    }
    drive.commit_repair(&meta, &crcs, MetaSync::Now).unwrap();
    drive.abort_staged(version(1), Staging::Repair).unwrap();
    // The writer goes on staging its own file and commits: the version is there already.
    for stripe in 1..geometry.stripes {
        drive.write_chunk("bkt", version(1), geometry.file_offset(stripe), &chunks[stripe as usize]).unwrap();
    }
    assert!(matches!(drive.commit(&meta, &[], CommitCondition::None), Ok(CommitOutcome::Applied { .. })));
    assert_eq!(drive.read_chunk(version(1), 0, chunks[0].len()).unwrap().unwrap(), chunks[0]);
    assert!(!dir.path().join("tmp").join(version(1).to_hex()).exists(), "the writer's file is gone with its commit");
}

#[test]
fn the_repair_queue_answers_by_due_time_from_its_index() {
    let (dir, drive) = drive();
    // What the queue should hold: version -> not before (ms).
    let mut expected = std::collections::BTreeMap::new();
    for v in 1..=40u64 {
        drive.queue_repair("bkt", "a", version(v), &[1], proto::RepairKind::Missing).unwrap();
        expected.insert(version(v), 0u64);
    }
    for v in (1..=40u64).filter(|v| v % 3 == 0) {
        drive.repair_later(version(v), 1_000 + v).unwrap();
        expected.insert(version(v), 1_000 + v);
    }
    for v in (1..=40u64).filter(|v| v % 5 == 0) {
        drive.repair_defer(version(v), 5_000).unwrap();
        expected.insert(version(v), 5_000);
    }
    drive.repair_done(version(7), &[1]).unwrap();
    expected.remove(&version(7));
    // A merge makes an entry due again (new knowledge).
    drive.queue_repair("bkt", "a", version(9), &[2], proto::RepairKind::Missing).unwrap();
    expected.insert(version(9), 0);
    let check = |drive: &Drive, expected: &std::collections::BTreeMap<VersionId, u64>| {
        for now in [0, 1_010, 1_030, 4_999, 5_000, u64::MAX] {
            let mut due: Vec<VersionId> = drive.repairs(now, usize::MAX).unwrap().into_iter().map(|(v, _)| v).collect();
            due.sort();
            let want: Vec<VersionId> = expected.iter().filter(|(_, at)| **at <= now).map(|(v, _)| *v).collect();
            assert_eq!(due, want, "due at {now}");
        }
        assert_eq!(drive.repairs(u64::MAX, 3).unwrap().len(), 3, "bounded by max");
    };
    check(&drive, &expected);
    // Entries backed off after failures are woken; those only deferred (no failure) are not.
    drive.repair_retry_now().unwrap();
    for (v, at) in expected.iter_mut() {
        if v.unix_ns % 3 == 0 {
            *at = 0;
        }
    }
    check(&drive, &expected);
    // A drive from before the index (its table gone) rebuilds it at open.
    {
        let txn = drive.db().unwrap().begin_write().unwrap();
        txn.delete_table(REPAIR_DUE).unwrap();
        txn.commit().unwrap();
    }
    drop(drive);
    let drive = Drive::open(dir.path()).unwrap();
    check(&drive, &expected);
    drive.clear_repairs().unwrap();
    assert!(drive.repairs(u64::MAX, usize::MAX).unwrap().is_empty());
}

#[test]
fn corrupt_repair_queue_entries_are_skipped_and_dropped_the_rest_kept() {
    let (_dir, drive) = drive();
    drive.queue_repair("bkt", "a", version(1), &[2], proto::RepairKind::Missing).unwrap();
    {
        let txn = drive.db().unwrap().begin_write().unwrap();
        {
            let mut table = txn.open_table(REPAIR).unwrap();
            table.insert(version_bytes(version(2)).as_slice(), b"\xff\xfe not a record".as_slice()).unwrap();
            table.insert(b"short key".as_slice(), b"".as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    let due = drive.repairs(u64::MAX, 100).unwrap();
    assert_eq!(due.len(), 1, "the good entry is served, the corrupt ones skipped");
    assert_eq!(due[0].0, version(1));
    assert_eq!(drive.drop_corrupt_repairs().unwrap(), 2);
    assert_eq!(drive.drop_corrupt_repairs().unwrap(), 0);
    assert_eq!(drive.repair_queue().unwrap().len(), 1);
}

#[test]
fn wipe_forgets_everything_but_settings_and_the_drive_takes_writes_again() {
    let (dir, drive) = drive();
    let v = version(5);
    drive.write_chunk("bkt", v, 0, &[7u8; 50]).unwrap();
    drive.commit(&meta("a", v, 100), &[1], CommitCondition::None).unwrap();
    drive.set_setting("x", b"kept").unwrap();
    drive.wipe().unwrap();
    assert!(drive.list_buckets().unwrap().is_empty());
    assert!(drive.get_meta("bkt", "a").is_err() || drive.get_meta("bkt", "a").unwrap().is_none());
    assert!(drive.repair_queue().unwrap().is_empty());
    assert_eq!(drive.setting("x").unwrap().as_deref(), Some(b"kept".as_slice()));
    assert!(drive.data_len(v).unwrap().is_none(), "the data file went");
    let files =
        std::fs::read_dir(dir.path().join("data")).unwrap().flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap());
    assert_eq!(files.count(), 0);
    drive.create_bucket("bkt").unwrap();
    drive.write_chunk("bkt", version(6), 0, &[1u8; 50]).unwrap();
    drive.commit(&meta("a", version(6), 100), &[], CommitCondition::None).unwrap();
    assert_eq!(drive.get_meta("bkt", "a").unwrap().unwrap().version, version(6));
}

#[test]
fn a_delete_marker_is_collected_only_while_current_and_alone_and_its_floor_stays() {
    let (_dir, drive) = drive();
    let data = version(1);
    drive.write_chunk("bkt", data, 0, &[7u8; 50]).unwrap();
    drive.commit(&meta("a", data, 100), &[], CommitCondition::None).unwrap();
    let mut marker = meta("a", version(2), 0);
    marker.deleted = true;
    marker.crcs.clear();
    drive.commit(&marker, &[], CommitCondition::None).unwrap();
    assert!(!drive.collect_marker("bkt", "a", version(2)).unwrap(), "the replaced data version is still retained");
    drive.finalize("bkt", "a", version(2), &[], 0).unwrap();
    drive.retire_expired(u64::MAX, 100).unwrap();
    assert!(!drive.collect_marker("bkt", "a", version(3)).unwrap(), "not the current version");
    assert!(drive.collect_marker("bkt", "a", version(2)).unwrap());
    assert!(drive.get_versions("bkt", "a").unwrap().all().next().is_none());
    assert_eq!(drive.finalized("bkt", "a").unwrap(), Some(version(2)), "the floor stays");
    assert!(drive.list("bkt", "", "", 10).unwrap().is_empty());
    assert!(!drive.collect_marker("bkt", "a", version(2)).unwrap(), "gone already");
}

#[test]
fn a_write_older_than_a_collected_marker_never_becomes_current() {
    let (_dir, drive) = drive();
    let mut marker = meta("a", version(5), 0);
    marker.deleted = true;
    marker.crcs.clear();
    drive.commit(&marker, &[], CommitCondition::None).unwrap();
    drive.finalize("bkt", "a", version(5), &[], 0).unwrap();
    assert!(drive.collect_marker("bkt", "a", version(5)).unwrap());
    // A PUT that took its version before the delete commits only now.
    drive.write_chunk("bkt", version(3), 0, &[7u8; 50]).unwrap();
    let outcome = drive.commit(&meta("a", version(3), 100), &[], CommitCondition::None).unwrap();
    assert!(matches!(outcome, CommitOutcome::Superseded { .. }), "{outcome:?}");
    let versions = drive.get_versions("bkt", "a").unwrap();
    assert!(versions.current.is_none(), "the key stays deleted");
    drive.retire_expired(u64::MAX, 100).unwrap();
    assert!(drive.get_versions("bkt", "a").unwrap().all().next().is_none(), "and the old write retires");
    assert!(drive.data_len(version(3)).unwrap().is_none());
}

#[test]
fn a_chunk_write_past_the_start_needs_the_staging_file_of_the_first() {
    let (_dir, drive) = drive();
    let err = drive.write_chunk("bkt", version(9), 4096, &[1u8; 10]).unwrap_err();
    assert!(matches!(err, Error::NoStagedData { .. }), "{err}");
    drive.write_chunk("bkt", version(9), 0, &[1u8; 4096]).unwrap();
    drive.write_chunk("bkt", version(9), 4096, &[1u8; 10]).unwrap();
}

#[test]
fn retry_now_makes_backed_off_entries_due_and_leaves_waiting_ones() {
    let (_dir, drive) = drive();
    drive.queue_repair("bkt", "a", version(1), &[2], proto::RepairKind::Missing).unwrap();
    drive.queue_repair("bkt", "b", version(2), &[3], proto::RepairKind::Missing).unwrap();
    drive.repair_later(version(1), u64::MAX / 2).unwrap(); // failed, backing off
    drive.repair_defer(version(2), u64::MAX / 2).unwrap(); // waiting for another holder
    assert!(drive.repairs(1_000, 10).unwrap().is_empty());
    assert_eq!(drive.repair_retry_now().unwrap(), 1);
    let due = drive.repairs(1_000, 10).unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!((due[0].0, due[0].1.attempts), (version(1), 1), "the attempt count stays");
}

#[test]
fn an_evicted_key_leaves_the_listing_stays_readable_through_the_grace_then_retires() {
    let (_dir, drive) = drive();
    put(&drive, "a", version(1), 100);
    put(&drive, "a", version(2), 100);
    drive.finalize("bkt", "a", version(2), &[3], 1_000_000).unwrap();
    put(&drive, "b", version(5), 100);
    assert!(drive.evict("bkt", "a", version(2), 1_000).unwrap());
    assert!(!drive.evict("bkt", "a", version(2), 1_000).unwrap(), "a repeated eviction changes nothing");
    let listed: Vec<String> = drive.list("bkt", "", "", 10).unwrap().into_iter().map(|e| e.key).collect();
    assert_eq!(listed, ["b"], "the evicted key left the listing");
    let versions = drive.get_versions("bkt", "a").unwrap();
    assert!(versions.current.is_none());
    assert_eq!(versions.retained.iter().map(|m| m.version).collect::<Vec<_>>(), [version(1), version(2)]);
    assert!(drive.repair_queue().unwrap().is_empty(), "its repairs were dropped: {:?}", drive.repair_queue());
    assert_eq!(drive.finalized("bkt", "a").unwrap(), None, "the floor went with the key");
    assert!(drive.open_version(version(2)).unwrap().is_some(), "readable through the grace");
    assert_eq!(drive.retire_expired(1_000, 100).unwrap(), 2);
    assert!(drive.open_version(version(2)).unwrap().is_none());
    assert!(drive.get_versions("bkt", "a").unwrap().all().next().is_none());
}

#[test]
fn eviction_keeps_newer_versions_and_a_version_moved_back_is_one_row() {
    let (_dir, drive) = drive();
    put(&drive, "a", version(1), 100);
    put(&drive, "a", version(3), 100);
    // Moved away up to version 1 while version 3 was written here: 3 stays current.
    assert!(drive.evict("bkt", "a", version(1), 1_000).unwrap());
    assert_eq!(drive.get_meta("bkt", "a").unwrap().map(|m| m.version), Some(version(3)));
    assert!(drive.evict("bkt", "a", version(3), 1_000).unwrap());
    // Moved back within the grace: the version is current again, once.
    put(&drive, "a", version(3), 100);
    let versions = drive.get_versions("bkt", "a").unwrap();
    assert_eq!(versions.current.map(|m| m.version), Some(version(3)));
    assert_eq!(versions.retained.iter().map(|m| m.version).collect::<Vec<_>>(), [version(1)]);
    assert_eq!(drive.retire_expired(u64::MAX, 100).unwrap(), 1);
    assert!(drive.open_version(version(3)).unwrap().is_some(), "the current version's file stays");
}

#[test]
fn an_eviction_is_never_refused_by_the_bound_on_retained_versions() {
    let (_dir, drive) = drive();
    for v in 1..=(proto::RETAINED_PER_KEY_MAX as u64 + 1) {
        put(&drive, "a", version(v), 100);
    }
    assert_eq!(drive.get_versions("bkt", "a").unwrap().retained.len(), proto::RETAINED_PER_KEY_MAX);
    assert!(drive.evict("bkt", "a", version(100), 1_000).unwrap());
    let versions = drive.get_versions("bkt", "a").unwrap();
    assert!(versions.current.is_none());
    // Every row retires at the eviction's time; the node's answers carry the newest 32.
    assert_eq!(versions.retained.len(), proto::RETAINED_PER_KEY_MAX + 1);
    assert_eq!(versions.retained.last().map(|m| m.version), Some(version(proto::RETAINED_PER_KEY_MAX as u64 + 1)));
    assert_eq!(drive.retire_expired(u64::MAX, 100).unwrap(), proto::RETAINED_PER_KEY_MAX + 1);
}

#[test]
fn a_version_moved_back_after_it_retired_here_is_published_afresh() {
    let (_dir, drive) = drive();
    put(&drive, "a", version(3), 100);
    assert!(drive.evict("bkt", "a", version(3), 1_000).unwrap());
    assert_eq!(drive.retire_expired(1_000, 100).unwrap(), 1);
    assert!(drive.open_version(version(3)).unwrap().is_none());
    put(&drive, "a", version(3), 100);
    assert_eq!(drive.get_meta("bkt", "a").unwrap().map(|m| m.version), Some(version(3)));
    assert!(drive.open_version(version(3)).unwrap().is_some());
    assert_eq!(drive.retire_expired(u64::MAX, 100).unwrap(), 0, "the current version never retires");
}

#[test]
fn versions_with_floor_read_both_at_once() {
    let (_dir, drive) = drive();
    put(&drive, "a", version(1), 100);
    put(&drive, "a", version(2), 100);
    drive.finalize("bkt", "a", version(2), &[], 1_000).unwrap();
    let mut expected = drive.get_versions("bkt", "a").unwrap();
    assert_eq!(expected.finalized, None, "without the floor");
    expected.finalized = drive.finalized("bkt", "a").unwrap();
    assert_eq!(drive.get_versions_with_floor("bkt", "a").unwrap(), expected);
    assert_eq!(drive.get_versions_with_floor("bkt", "absent").unwrap().all().count(), 0);
}

#[test]
fn clearing_the_repair_queue_empties_it() {
    let (_dir, drive) = drive();
    assert_eq!(drive.clear_repairs().unwrap(), 0);
    drive.queue_repair("bkt", "a", version(1), &[2], proto::RepairKind::Missing).unwrap();
    drive.queue_repair("bkt", "b", version(2), &[0, 3], proto::RepairKind::Damaged).unwrap();
    assert_eq!(drive.clear_repairs().unwrap(), 2);
    assert!(drive.repair_queue().unwrap().is_empty());
}

#[test]
fn a_restamp_commits_the_same_bytes_as_a_newer_version_and_keeps_the_old_one_until_it_retires() {
    // Issue 37, item 9: a write superseded by an overlapping one commits its object again
    // under a later version id, from the data file its first commit published.
    let (_dir, drive) = drive();
    put(&drive, "a", version(5), 10_000);
    assert_eq!(put(&drive, "a", version(3), 10_000), CommitOutcome::Superseded { current: version(5) });
    let restamped = meta("a", version(7), 10_000);
    assert_eq!(
        drive.restamp(&restamped, version(3), &[]).unwrap(),
        CommitOutcome::Applied { replaced_parts: Vec::new() }
    );
    let versions = drive.get_versions("bkt", "a").unwrap();
    assert_eq!(versions.current.unwrap().version, version(7));
    let retained: Vec<_> = versions.retained.iter().map(|m| m.version).collect();
    assert_eq!(retained, [version(3), version(5)]);
    let geometry = restamped.geometry();
    for stripe in 0..geometry.stripes {
        let len = geometry.chunk_len(stripe);
        let bytes = drive.read_chunk(version(7), geometry.file_offset(stripe), len).unwrap().unwrap();
        assert_eq!(bytes, vec![stripe as u8; len], "stripe {stripe}: the re-stamp holds the first commit's bytes");
    }
    // A retried re-stamp (its reply lost) answers as a retried commit does.
    assert_eq!(
        drive.restamp(&restamped, version(3), &[]).unwrap(),
        CommitOutcome::Applied { replaced_parts: Vec::new() }
    );
    // The old version retires below the new one; the new one's file is its own.
    drive.finalize("bkt", "a", version(7), &[], 0).unwrap();
    drive.retire_expired(u64::MAX, 100).unwrap();
    assert!(drive.open_version(version(3)).unwrap().is_none(), "the first commit retired");
    assert!(drive.read_chunk(version(7), 0, 10).unwrap().is_some(), "the re-stamp's data outlives it");
}

#[test]
fn a_restamp_of_a_version_the_drive_never_got_is_refused() {
    let (_dir, drive) = drive();
    put(&drive, "a", version(5), 10_000);
    let refused = drive.restamp(&meta("a", version(7), 10_000), version(3), &[]);
    assert!(matches!(refused, Err(Error::NoDataToRestamp { .. })), "{refused:?}");
    assert_eq!(drive.get_meta("bkt", "a").unwrap().unwrap().version, version(5));
    // A version without data (a delete marker) needs none.
    let mut marker = meta("a", version(8), 0);
    marker.deleted = true;
    marker.crcs.clear();
    assert!(drive.restamp(&marker, version(6), &[]).is_ok());
    assert!(drive.get_meta("bkt", "a").unwrap().unwrap().deleted);
}
