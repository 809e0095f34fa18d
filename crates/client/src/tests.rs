use super::*;

pub(crate) fn meta(version: u64) -> ObjectMeta {
    ObjectMeta {
        format: proto::META_FORMAT_VERSION,
        bucket: "b".into(),
        key: "k".into(),
        version: VersionId { unix_ns: version, writer: 1 },
        deleted: false,
        size: 0,
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
        crcs: Vec::new(),
        parts: Vec::new(),
        pads: Vec::new(),
    }
}

/// One drive's reply: `None` no answer; `Some((current, retained))` with versions as numbers,
/// negative for delete markers.
type Reply = Option<(Option<i64>, Vec<i64>)>;

/// Like `check`, with the newest acknowledged version each drive reports.
fn check_finalized(replies: &[Reply], finalized: &[Option<u64>], expected: Option<i64>) {
    let replies: Vec<_> = replies
        .iter()
        .zip(finalized)
        .map(|(r, f)| {
            versions_of(r).map(|mut v| {
                v.finalized = f.map(|n| VersionId { unix_ns: n, writer: 1 });
                v
            })
        })
        .collect();
    let chosen = choose_version(&replies, 2, 3, Promote::Yes);
    assert_eq!(signed(chosen), expected);
}

/// A chosen version as `check` numbers it: negative for a delete marker.
fn signed(chosen: Option<ObjectMeta>) -> Option<i64> {
    chosen.map(|m| if m.deleted { -(m.version.unix_ns as i64) } else { m.version.unix_ns as i64 })
}

fn versions_of(reply: &Reply) -> Option<proto::KeyVersions> {
    let to_meta = |v: &i64| {
        let mut m = meta(v.unsigned_abs());
        m.deleted = *v < 0;
        m.size = if *v < 0 { 0 } else { 1 };
        m
    };
    reply.as_ref().map(|(current, retained)| proto::KeyVersions {
        current: current.as_ref().map(to_meta),
        retained: retained.iter().map(to_meta).collect(),
        finalized: None,
        unavailable: false,
        retained_truncated: false,
        checksums_left_out: false,
    })
}

/// `k` = 2 data chunks of 2+1; markers need `marker_quorum` = 2 drives; W = 3.
fn check(replies: &[Reply], expected: Option<i64>) {
    let replies: Vec<_> = replies.iter().map(versions_of).collect();
    let chosen = choose_version(&replies, 2, 3, Promote::Yes);
    assert_eq!(signed(chosen), expected);
}

#[test]
fn readers_pick_newest_version_held_by_k_drives() {
    check(&[Some((Some(1), vec![])), Some((Some(1), vec![])), Some((Some(1), vec![]))], Some(1));
    // A PUT in flight (or rolled back) on one drive does not hide the quorum version.
    check(&[Some((Some(2), vec![])), Some((Some(1), vec![])), Some((Some(1), vec![]))], Some(1));
    check(&[Some((Some(2), vec![])), Some((Some(2), vec![])), Some((Some(1), vec![]))], Some(2));
    // Nothing reaches k: the newest seen, so the read reports what is missing.
    check(&[Some((Some(2), vec![])), None, None], Some(2));
    check(&[Some((None, vec![])), Some((None, vec![])), None], None);
}

#[test]
fn the_first_put_of_a_key_in_flight_reads_as_absent_not_as_an_error() {
    // Version 2 on one drive, a second drive answers without the key: 1 holder + 1 silent drive
    // is below W = 3, so 2 cannot have been acknowledged: the key is (still) absent.
    check(&[Some((Some(2), vec![])), Some((None, vec![])), None], None);
    check(&[Some((Some(2), vec![])), Some((None, vec![])), Some((None, vec![]))], None);
    // Could have been acknowledged (holders + silent drives reach W): report it unreadable.
    check(&[Some((Some(2), vec![])), None, None], Some(2));
    // A drive knows a version acknowledged: never absent.
    check_finalized(&[Some((Some(2), vec![])), Some((None, vec![])), None], &[Some(2), None, None], Some(2));
    // Markers too: one drive holds a delete marker in flight over nothing.
    check(&[Some((Some(-2), vec![])), Some((None, vec![])), Some((None, vec![]))], None);
}

#[test]
fn retained_versions_keep_the_old_object_readable_while_an_overwrite_is_in_flight() {
    // k = 2 of 3: version 2 committed on one drive, which retains 1; another drive is down.
    // Only by counting retained versions does version 1 still reach k.
    check(&[Some((Some(2), vec![1])), Some((Some(1), vec![])), None], Some(1));
    // Once the new version reaches k it wins.
    check(&[Some((Some(2), vec![1])), Some((Some(2), vec![1])), Some((Some(1), vec![]))], Some(2));
}

/// `versions_of` every reply, as versions of 4+2 objects.
fn versions_4_2(replies: &[Reply]) -> Vec<Option<proto::KeyVersions>> {
    let mut replies: Vec<_> = replies.iter().map(versions_of).collect();
    for meta in replies.iter_mut().flatten().flat_map(|v| v.current.iter_mut().chain(v.retained.iter_mut())) {
        (meta.k, meta.m) = (4, 2);
    }
    replies
}

/// 4+2, W = 5: `check` for that geometry (markers need W - m = 3 drives).
fn check_4_2(replies: &[Reply], expected: Option<i64>) {
    let chosen = choose_version(&versions_4_2(replies), 3, 5, Promote::Yes);
    assert_eq!(signed(chosen), expected);
}

#[test]
fn reads_never_go_back_behind_a_version_that_may_be_acknowledged_without_a_floor() {
    // Chaos seed 7 (pool decommission under faults): version 2 was acknowledged on five of six
    // drives (W = 5) and its finalize was lost; two of its drives are out of reach, the drive
    // that missed it still has 1, and the three others retain 1 under 2. Version 1 is held by
    // k = 4 answering drives and 2 by three, which with the two silent ones reach W: 2 may be
    // acknowledged, so the read must report it unreadable, never return 1.
    let acked_unseen = [
        Some((Some(1), vec![])),
        Some((Some(2), vec![1])),
        Some((Some(2), vec![1])),
        None,
        None,
        Some((Some(2), vec![1])),
    ];
    check_4_2(&acked_unseen, Some(2));
    // A delete marker needs only W - m = 3 drives to be read, which an acknowledged one keeps
    // with m drives silent: on two it cannot have been acknowledged, and the object stands.
    let marker_in_flight = [
        Some((Some(1), vec![])),
        Some((Some(-2), vec![1])),
        Some((Some(-2), vec![1])),
        None,
        None,
        Some((Some(1), vec![])),
    ];
    check_4_2(&marker_in_flight, Some(1));
    // With every drive answering, three holders cannot be W: a write in flight, the old object.
    let in_flight = [
        Some((Some(1), vec![])),
        Some((Some(2), vec![1])),
        Some((Some(2), vec![1])),
        Some((Some(1), vec![])),
        Some((Some(1), vec![])),
        Some((Some(2), vec![1])),
    ];
    check_4_2(&in_flight, Some(1));
    // One drive silent: 2 on three drives plus one silent is four, below W.
    let one_silent = [
        Some((Some(1), vec![])),
        Some((Some(2), vec![1])),
        Some((Some(2), vec![1])),
        None,
        Some((Some(1), vec![])),
        Some((Some(2), vec![1])),
    ];
    check_4_2(&one_silent, Some(1));
    // Answers cut short (retained versions left out: large metadata) hide nothing newer than
    // their current version: an overwrite in flight on one drive is not promoted.
    let mut truncated = versions_4_2(&[
        Some((Some(2), vec![1])),
        Some((Some(1), vec![])),
        Some((Some(1), vec![])),
        Some((Some(1), vec![])),
        Some((Some(1), vec![])),
        Some((Some(1), vec![])),
    ]);
    for reply in truncated.iter_mut().flatten() {
        reply.retained_truncated = true;
    }
    let chosen = choose_version(&truncated, 3, 5, Promote::Yes).map(|m| m.version.unix_ns);
    assert_eq!(chosen, Some(1), "one holder of 2 and no drive that could hide it");
    // The mover chooses without promotion: the readable version, its doubts its own.
    assert_eq!(signed(choose_version(&versions_4_2(&acked_unseen), 3, 5, Promote::No)), Some(1));
    // Readable newer versions win as before.
    let readable = [
        Some((Some(2), vec![1])),
        Some((Some(2), vec![1])),
        Some((Some(2), vec![1])),
        None,
        None,
        Some((Some(2), vec![1])),
    ];
    check_4_2(&readable, Some(2));
}

#[test]
fn delete_markers_need_their_own_quorum_and_hide_older_versions() {
    // A marker on one drive (in flight, or a failed delete) does not hide the object.
    check(&[Some((Some(-3), vec![1])), Some((Some(1), vec![])), Some((Some(1), vec![]))], Some(1));
    // On marker_quorum drives it does, even if the data version is everywhere (retained).
    check(&[Some((Some(-3), vec![1])), Some((Some(-3), vec![1])), Some((Some(1), vec![]))], Some(-3));
}

#[test]
fn reads_never_go_back_behind_an_acknowledged_version() {
    // Version 5 is acknowledged (finalized) but only one of its drives answers, and an older
    // delete marker is held by two: the read must report version 5 unreadable, not "absent".
    let replies = [Some((Some(5), vec![-3])), Some((Some(-3), vec![])), None];
    check(&replies, Some(-3));
    check_finalized(&replies, &[Some(5), None, None], Some(5));
    // While 5 is in flight (not finalized) the acknowledged 3 stays the answer.
    check_finalized(&[Some((Some(5), vec![3])), Some((Some(3), vec![])), None], &[Some(3), Some(3), None], Some(3));
}

#[test]
fn a_failed_deletes_leftover_marker_is_no_answer_unless_acknowledged() {
    // Version 3 was acknowledged on all three drives; a delete (version 5) failed with its
    // marker on drive 0, whose rollback never came (the drive was killed mid-commit). Drives 1
    // and 2 are out of reach: 3 may be acknowledged (1 holder + 2 silent reach W), nothing is
    // readable, and the newest version seen is the marker.
    let replies: Vec<_> = [Some((Some(-5), vec![3])), None, None].iter().map(versions_of).collect();
    let chosen = choose_version(&replies, 2, 3, Promote::Yes).expect("3 may be acknowledged: not absent");
    assert!(chosen.deleted && chosen.version.unix_ns == 5);
    assert!(is_unconfirmed(&replies, &chosen, 2), "one holder of a marker that needs two: no answer");
    // Acknowledged (a drive's floor names it): the key is deleted.
    let mut finalized = replies.clone();
    finalized[0].as_mut().unwrap().finalized = Some(VersionId { unix_ns: 5, writer: 1 });
    assert!(!is_unconfirmed(&finalized, &chosen, 2));
    // Held by a marker quorum: readable, so it is the answer anyway.
    let held: Vec<_> = [Some((Some(-5), vec![3])), Some((Some(-5), vec![3])), None].iter().map(versions_of).collect();
    assert!(!is_unconfirmed(&held, &chosen, 2));
    // A version with data is never judged here: reading its chunks fails on its own.
    let mut data = meta(7);
    data.size = 1;
    assert!(!is_unconfirmed(&replies, &data, 2));
}

/// 4+2: W = 5 of 6 drives; an acknowledged version is on at least one of any two.
#[test]
fn a_reader_hearing_from_fewer_drives_than_can_show_every_acknowledged_version_is_refused() {
    let replies = |answers: &[Reply]| -> Vec<Option<proto::KeyVersions>> { answers.iter().map(versions_of).collect() };
    let v = |n: u64| Some(VersionId { unix_ns: n, writer: 1 });
    // Chaos seed 7: only the drive that missed the overwrite answered; the five that hold it
    // (or refused a stale map) were silent. Its old version is what `choose_version` sees.
    let one = replies(&[None, None, None, None, None, Some((Some(1), vec![]))]);
    assert_eq!(signed(choose_version(&one, 3, 5, Promote::Yes)), Some(1));
    assert!(may_miss_acknowledged(&one, v(1), 5), "an overwrite on the 5 silent drives may be acknowledged");
    // Nothing held and five silent: "absent" could hide an acknowledged first write too.
    let nothing = replies(&[None, None, None, None, None, Some((None, vec![]))]);
    assert!(may_miss_acknowledged(&nothing, None, 5));
    // Two answers: any version on 5 drives shows in one of them.
    let two = replies(&[None, None, None, None, Some((Some(2), vec![1])), Some((Some(1), vec![]))]);
    assert!(!may_miss_acknowledged(&two, v(2), 5));
    let two_empty = replies(&[None, None, None, None, Some((None, vec![])), Some((None, vec![]))]);
    assert!(!may_miss_acknowledged(&two_empty, None, 5));
    // A drive whose retained versions were cut and whose current one is newer than the chosen
    // version may hold a newer one unseen; one whose current is the chosen version cannot.
    let mut cut = replies(&[None, None, None, None, Some((Some(3), vec![2])), Some((Some(1), vec![]))]);
    cut[4].as_mut().unwrap().retained_truncated = true;
    assert!(may_miss_acknowledged(&cut, v(1), 5));
    assert!(!may_miss_acknowledged(&cut, v(3), 5));
    // 2+1: W = 3 = n, so every acknowledged version is on every drive: one answer shows it.
    let alone = replies(&[None, None, Some((Some(1), vec![]))]);
    assert!(!may_miss_acknowledged(&alone, v(1), 3));
}
