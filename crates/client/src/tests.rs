use super::*;

fn meta(version: u64) -> ObjectMeta {
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
    }
}

fn check(replies: &[Option<Option<u64>>], k: usize, expected: Option<u64>) {
    let replies: Vec<_> = replies.iter().map(|r| r.map(|v| v.map(meta))).collect();
    assert_eq!(choose_version(&replies, k).map(|m| m.version.unix_ns), expected);
}

#[test]
fn readers_pick_newest_version_held_by_k_drives() {
    check(&[Some(Some(1)), Some(Some(1)), Some(Some(1))], 2, Some(1));
    // A PUT in flight (or rolled back) on one drive does not hide the quorum version.
    check(&[Some(Some(2)), Some(Some(1)), Some(Some(1))], 2, Some(1));
    check(&[Some(Some(2)), Some(Some(2)), Some(Some(1))], 2, Some(2));
    // Nothing reaches k: the newest seen, so the read reports what is missing.
    check(&[Some(Some(2)), None, None], 2, Some(2));
    check(&[Some(None), Some(None), None], 2, None);
}
