use super::*;
use proptest::prelude::*;

fn meta(size: u64, k: u8, m: u8, chunk_bytes: u32) -> ObjectMeta {
    let geometry = StripeGeometry::new(size, usize::from(k), chunk_bytes);
    ObjectMeta {
        format: META_FORMAT_VERSION,
        bucket: "bkt".into(),
        key: "a/b.bin".into(),
        version: VersionId { unix_ns: 7, writer: 9 },
        deleted: false,
        size,
        etag: "00".into(),
        content_type: "application/octet-stream".into(),
        user_meta: vec![("x".into(), "y".into())],
        headers: Vec::new(),
        modified_ms: 1,
        k,
        m,
        chunk_bytes,
        block_bytes: chunk_bytes,
        set_idx: 0,
        rotation: 1,
        crcs: vec![0; geometry.stripes as usize * usize::from(k + m)],
        parts: Vec::new(),
        pads: Vec::new(),
    }
}

fn check_request_round_trip(request: Request) {
    let frame = encode_frame(FrameKind::Request, &request).unwrap();
    let header = FrameHeader::decode(frame[..FRAME_HEADER_BYTES].try_into().unwrap()).unwrap();
    assert_eq!(header.kind, FrameKind::Request);
    assert_eq!(header.body_len, frame.len() - FRAME_HEADER_BYTES);
    assert_eq!(decode_request(&frame[FRAME_HEADER_BYTES..]).unwrap(), request);
}

#[test]
fn requests_round_trip() {
    check_request_round_trip(Request::GetMap);
    check_request_round_trip(Request::Commit {
        drive: 0,
        meta: meta(5_000_000, 4, 2, 1 << 20),
        missing_positions: vec![3],
        condition: CommitCondition::IfAbsent,
    });
    check_request_round_trip(Request::RestampCommit {
        drive: 2,
        meta: meta(5_000_000, 4, 2, 1 << 20),
        of: VersionId { unix_ns: 0, writer: 9 },
        missing_positions: vec![1],
    });
    check_request_round_trip(Request::ChunkWrite {
        drive: 0,
        bucket: "b".into(),
        version: VersionId { unix_ns: 1, writer: 1 },
        offset: 0,
        len: 100_000,
        block_bytes: 65536,
        crcs: vec![1, 2],
        staging: Staging::Repair,
    });
    check_request_round_trip(Request::Read {
        items: vec![ReadItem { drive: 1, version: VersionId { unix_ns: 1, writer: 2 }, offset: 3, len: 4 }],
    });
    check_request_round_trip(Request::List {
        drive: 0,
        bucket: "b".into(),
        prefix: "p".into(),
        start_after: "".into(),
        limit: 10,
    });
}

fn aggregate_query(group_by: usize, aggregates: usize) -> Request {
    let partial = PartialAggregate { function: AggregateFunction::Sum, argument: Some("ke".into()) };
    Request::AggregateQuery {
        scan: ScanSpec { columns: vec![], filters: vec!["ke > 0.5".into()], limit: None, count_only: false },
        aggregate: AggregateSpec { group_by: vec!["id % 2".into(); group_by], aggregates: vec![partial; aggregates] },
        objects: vec![QueryObject {
            drive: 0,
            bucket: "b".into(),
            key: "k".into(),
            version: VersionId { unix_ns: 1, writer: 1 },
            footer: vec![1, 2, 3],
            row_groups: vec![0, 2],
        }],
    }
}

#[test]
fn an_aggregate_query_round_trips_and_is_bounded() {
    check_request_round_trip(aggregate_query(1, 3));
    let at_limit = aggregate_query(AGGREGATE_ITEMS_MAX, AGGREGATE_ITEMS_MAX);
    assert!(decode_request(&encode_body(&at_limit)).is_ok());
    for over in [aggregate_query(AGGREGATE_ITEMS_MAX + 1, 1), aggregate_query(1, AGGREGATE_ITEMS_MAX + 1)] {
        assert!(matches!(decode_request(&encode_body(&over)), Err(Error::TooManyItems { .. })));
    }
    // A plain query's encoding is what it was before aggregates existed: nodes that predate
    // them still decode it, and they fail to decode an aggregate query instead of misreading it.
    let plain = Request::Query {
        scan: ScanSpec { columns: vec!["id".into()], filters: vec![], limit: Some(3), count_only: false },
        objects: vec![],
    };
    let body = encode_body(&plain);
    // After the variant: one column "id", no filters, limit Some(3), not count-only, no objects.
    assert_eq!(body[1..], [1, 2, b'i', b'd', 0, 1, 3, 0, 0]);
}

fn record_query(splits: Vec<RecordSplit>, schema_bytes: usize) -> Request {
    Request::RecordQuery {
        scan: ScanSpec { columns: vec!["_1".into()], filters: vec!["_2 = 'x'".into()], limit: None, count_only: false },
        aggregate: None,
        format: RecordFormat::Csv(CsvFormat {
            header: true,
            delimiter: b',',
            quote: b'"',
            escape: None,
            comment: None,
            empty_is_null: false,
        }),
        schema: vec![7; schema_bytes],
        objects: vec![RecordObject {
            drive: 1,
            bucket: "b".into(),
            key: "k.csv".into(),
            version: VersionId { unix_ns: 1, writer: 1 },
            splits,
        }],
    }
}

#[test]
fn a_record_query_round_trips_and_is_bounded() {
    let split = |first, last| RecordSplit { first, last };
    check_request_round_trip(record_query(vec![split(0, 10), split(11, 11), split(20, 30)], 64));
    let at_limit = record_query((0..RECORD_SPLITS_MAX as u64).map(|i| split(i, i)).collect(), RECORD_SCHEMA_BYTES_MAX);
    assert!(decode_request(&encode_body(&at_limit)).is_ok());
    let over = record_query((0..=RECORD_SPLITS_MAX as u64).map(|i| split(i, i)).collect(), 1);
    assert!(matches!(decode_request(&encode_body(&over)), Err(Error::TooManyItems { .. })));
    let big_schema = record_query(vec![split(0, 1)], RECORD_SCHEMA_BYTES_MAX + 1);
    assert!(matches!(decode_request(&encode_body(&big_schema)), Err(Error::Invalid { .. })));
    // Splits out of order, overlapping or backwards would evaluate records twice or never.
    for bad in [vec![split(5, 4)], vec![split(0, 10), split(10, 20)], vec![split(20, 30), split(0, 10)]] {
        assert!(matches!(decode_request(&encode_body(&record_query(bad, 1))), Err(Error::Invalid { .. })));
    }
}

#[test]
fn limits_are_enforced_at_limit_plus_one() {
    let item = ReadItem { drive: 0, version: VersionId { unix_ns: 1, writer: 1 }, offset: 0, len: 1 };
    let at_limit = Request::Read { items: vec![item.clone(); BATCH_ITEMS_MAX] };
    assert!(decode_request(&encode_body(&at_limit)).is_ok());
    let over = Request::Read { items: vec![item; BATCH_ITEMS_MAX + 1] };
    assert!(matches!(decode_request(&encode_body(&over)), Err(Error::TooManyItems { .. })));
    let big = Request::ChunkWrite {
        drive: 0,
        bucket: "b".into(),
        version: VersionId { unix_ns: 1, writer: 1 },
        offset: 0,
        len: CHUNK_BYTES_MAX as u32 + 1,
        block_bytes: 65536,
        crcs: vec![0; (CHUNK_BYTES_MAX + 1).div_ceil(65536)],
        staging: Staging::Write,
    };
    assert!(decode_request(&encode_body(&big)).is_err());
    let wrong_checksums = Request::ChunkWrite {
        drive: 0,
        bucket: "b".into(),
        version: VersionId { unix_ns: 1, writer: 1 },
        offset: 0,
        len: 65537,
        block_bytes: 65536,
        crcs: vec![0],
        staging: Staging::Write,
    };
    assert!(matches!(decode_request(&encode_body(&wrong_checksums)), Err(Error::Invalid { .. })));
    assert!(FrameHeader::new(FrameKind::Request, CONTROL_BODY_BYTES_MAX).is_ok());
    assert!(matches!(
        FrameHeader::new(FrameKind::Request, CONTROL_BODY_BYTES_MAX + 1),
        Err(Error::FrameTooLarge { .. })
    ));
}

#[test]
fn bad_headers_are_refused() {
    let good = FrameHeader::new(FrameKind::Response, 10).unwrap().encode();
    let mut bad_magic = good;
    bad_magic[0] = b'X';
    assert!(matches!(FrameHeader::decode(&bad_magic), Err(Error::BadMagic { .. })));
    let mut huge = good;
    huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(FrameHeader::decode(&huge), Err(Error::FrameTooLarge { .. })));
    let mut kind = good;
    kind[4] = 99;
    assert!(matches!(FrameHeader::decode(&kind), Err(Error::UnknownKind { kind: 99 })));
}

fn challenge(nonce: u8, cluster_id: &str, map_version: u64) -> Challenge {
    Challenge {
        protocol_version: PROTOCOL_VERSION,
        nonce: [nonce; NONCE_BYTES],
        cluster_id: cluster_id.into(),
        map_version,
    }
}

#[test]
fn client_proof_needs_the_secret_and_covers_the_whole_handshake() {
    let node = challenge(7, "c1", 3);
    let auth = AuthProof::new("secret", &node, [9u8; NONCE_BYTES], "c1", 2, &[]);
    assert!(verify_client_proof("secret", &auth.transcript(&node, &[]), &auth.proof));
    assert!(!verify_client_proof("other", &auth.transcript(&node, &[]), &auth.proof));
    // Any field of either message changed on the path: the proof no longer holds.
    for changed in [challenge(8, "c1", 3), challenge(7, "c2", 3), challenge(7, "c1", 4)] {
        assert!(!verify_client_proof("secret", &auth.transcript(&changed, &[]), &auth.proof));
    }
    let mut altered = auth.clone();
    altered.client_nonce = [8u8; NONCE_BYTES];
    assert!(!verify_client_proof("secret", &altered.transcript(&node, &[]), &altered.proof));
    let mut altered = auth.clone();
    altered.map_version = 9;
    assert!(!verify_client_proof("secret", &altered.transcript(&node, &[]), &altered.proof));
    let mut altered = auth.clone();
    altered.cluster_id = "c9".into();
    assert!(!verify_client_proof("secret", &altered.transcript(&node, &[]), &altered.proof));
}

#[test]
fn over_tls_the_proof_and_keys_hold_only_on_the_connection_they_were_made_on() {
    let node = challenge(7, "c1", 3);
    let binding = [5u8; 32];
    let auth = AuthProof::new("secret", &node, [9u8; NONCE_BYTES], "c1", 2, &binding);
    assert!(verify_client_proof("secret", &auth.transcript(&node, &binding), &auth.proof));
    // A relay terminating TLS on both sides: the node's connection has another binding.
    assert!(!verify_client_proof("secret", &auth.transcript(&node, &[6u8; 32]), &auth.proof));
    assert!(!verify_client_proof("secret", &auth.transcript(&node, &[]), &auth.proof));
    let header = [0u8; FRAME_HEADER_BYTES];
    let (_, mut n2c) = session_macs("secret", &auth.transcript(&node, &binding));
    let (_, mut relayed) = session_macs("secret", &auth.transcript(&node, &[6u8; 32]));
    assert_ne!(n2c.seal(&header, b"ok"), relayed.seal(&header, b"ok"));
}

fn sealed(
    kind: FrameKind,
    message: &Response,
    mac: &mut FrameMac,
) -> ([u8; FRAME_HEADER_BYTES], Vec<u8>, [u8; FRAME_TAG_BYTES]) {
    let frame = encode_sealed_frame(kind, message, mac).unwrap();
    let header: [u8; FRAME_HEADER_BYTES] = frame[..FRAME_HEADER_BYTES].try_into().unwrap();
    let body = frame[FRAME_HEADER_BYTES..frame.len() - FRAME_TAG_BYTES].to_vec();
    let tag = frame[frame.len() - FRAME_TAG_BYTES..].try_into().unwrap();
    (header, body, tag)
}

#[test]
fn frame_macs_accept_frames_in_order_and_nothing_else() {
    let node = challenge(1, "c1", 1);
    let auth = AuthProof::new("secret-secret-secret", &node, [2u8; NONCE_BYTES], "c1", 1, &[]);
    let (mut c2n_send, _) = session_macs("secret-secret-secret", &auth.transcript(&node, &[]));
    let (mut c2n_recv, mut n2c) = session_macs("secret-secret-secret", &auth.transcript(&node, &[]));
    let first = sealed(FrameKind::Request, &Response::Ok, &mut c2n_send);
    let second = sealed(FrameKind::Request, &Response::Map { toml: "x".into() }, &mut c2n_send);
    // Out of order (the second frame first) fails, and so does a replay of the first.
    let mut reorder = c2n_recv.clone();
    assert!(matches!(reorder.open(&second.0, &second.1, &second.2), Err(Error::BadFrameMac { seq: 0 })));
    c2n_recv.open(&first.0, &first.1, &first.2).unwrap();
    assert!(c2n_recv.clone().open(&first.0, &first.1, &first.2).is_err());
    // A flipped body bit, a different header, the other direction's key: all refused.
    let mut flipped = second.1.clone();
    flipped[0] ^= 1;
    assert!(c2n_recv.clone().open(&second.0, &flipped, &second.2).is_err());
    let mut header = second.0;
    header[4] = FrameKind::Response as u8;
    assert!(c2n_recv.clone().open(&header, &second.1, &second.2).is_err());
    assert!(n2c.open(&second.0, &second.1, &second.2).is_err());
    c2n_recv.open(&second.0, &second.1, &second.2).unwrap();
    // Another connection (other nonces), a handshake changed on the path (another map
    // version), or another secret derives other keys.
    let other_auth = AuthProof::new("secret-secret-secret", &node, [3u8; NONCE_BYTES], "c1", 1, &[]);
    let (mut other, _) = session_macs("secret-secret-secret", &other_auth.transcript(&node, &[]));
    assert!(other.open(&first.0, &first.1, &first.2).is_err());
    let (mut other, _) = session_macs("secret-secret-secret", &auth.transcript(&challenge(1, "c1", 2), &[]));
    assert!(other.open(&first.0, &first.1, &first.2).is_err());
    let (mut other, _) = session_macs("another-secret-here", &auth.transcript(&node, &[]));
    assert!(other.open(&first.0, &first.1, &first.2).is_err());
}

#[test]
fn handshake_frames_are_small_before_anything_is_allocated() {
    let at_limit = FrameHeader::new(FrameKind::Auth, HANDSHAKE_BODY_BYTES_MAX).unwrap().encode();
    assert!(FrameHeader::decode(&at_limit).is_ok());
    let over = FrameHeader::new(FrameKind::Auth, HANDSHAKE_BODY_BYTES_MAX + 1).unwrap().encode();
    assert!(matches!(FrameHeader::decode(&over), Err(Error::FrameTooLargeForKind { .. })));
    let cluster_id = "x".repeat(cluster::CLUSTER_ID_BYTES_MAX);
    let proof = AuthProof {
        protocol_version: PROTOCOL_VERSION,
        client_nonce: [0xff; NONCE_BYTES],
        proof: [0xff; NONCE_BYTES],
        cluster_id: cluster_id.clone(),
        map_version: u64::MAX,
    };
    assert!(encode_body(&proof).len() <= HANDSHAKE_BODY_BYTES_MAX);
    let challenge =
        Challenge { protocol_version: PROTOCOL_VERSION, nonce: [0xff; NONCE_BYTES], cluster_id, map_version: u64::MAX };
    assert!(encode_body(&challenge).len() <= HANDSHAKE_BODY_BYTES_MAX);
}

#[test]
fn short_secrets_are_refused() {
    assert!(validate_secret("").is_err());
    assert!(validate_secret(&"x".repeat(SECRET_BYTES_MIN - 1)).is_err());
    assert!(validate_secret(&"x".repeat(SECRET_BYTES_MIN)).is_ok());
}

#[test]
fn metadata_with_wrong_checksum_count_is_invalid() {
    let mut record = meta(10, 4, 2, 4096);
    assert!(record.validate().is_ok());
    record.crcs.push(0);
    assert!(record.validate().is_err());
}

#[test]
fn brief_records_leave_out_every_checksum_and_say_so() {
    let whole = meta(10 << 20, 4, 2, 1 << 20);
    let brief = whole.brief();
    assert_eq!(ObjectMeta { crcs: whole.crcs.clone(), ..brief.clone() }, whole, "only the checksums differ");
    assert!(brief.crcs.is_empty() && brief.validate_brief().is_ok());
    assert!(brief.validate().is_err(), "a brief record is not one to read with");
    assert!(whole.validate_brief().is_err(), "checksums in a record that says it has none");
    let mut bad = brief.clone();
    bad.k = 0;
    assert!(bad.validate_brief().is_err(), "the rest is checked as before");

    // In an answer: `checksums_left_out` says which check applies.
    let answer = |versions: KeyVersions| decode_response(&encode_body(&Response::Versions { keys: vec![versions] }));
    let mut versions =
        KeyVersions { current: Some(whole.clone()), retained: vec![whole.clone()], ..Default::default() };
    assert!(answer(versions.clone()).is_ok());
    versions = KeyVersions {
        current: Some(brief.clone()),
        retained: vec![brief.clone()],
        checksums_left_out: true,
        ..Default::default()
    };
    assert!(answer(versions.clone()).is_ok());
    versions.checksums_left_out = false;
    assert!(answer(versions).is_err(), "a whole answer without checksums is refused");
    let sneaked = KeyVersions { current: Some(whole), checksums_left_out: true, ..Default::default() };
    assert!(answer(sneaked).is_err());

    for detail in [MetaDetail::Versions, MetaDetail::WithFloor, MetaDetail::VersionsBrief, MetaDetail::WithFloorBrief] {
        assert_eq!(MetaDetail::of(detail.with_floor(), detail.brief()), detail);
        assert!(detail.floored().with_floor() && detail.floored().brief() == detail.brief());
    }
}

#[test]
fn version_hex_round_trips_and_orders_by_time_then_writer() {
    let a = VersionId { unix_ns: 5, writer: u64::MAX };
    let b = VersionId { unix_ns: 6, writer: 0 };
    assert!(a < b);
    assert_eq!(VersionId::from_hex(&a.to_hex()), Some(a));
    assert_eq!(VersionId::from_hex("../../etc/passwd"), None);
}

#[test]
fn names_follow_s3_rules() {
    for good in ["abc", "my-bucket.1", "a23"] {
        assert!(validate_bucket(good).is_ok(), "{good}");
    }
    for bad in ["ab", "ABC", "-abc", "abc-", "a..b", "192.168.1.1", "a_b", &"a".repeat(64)] {
        assert!(validate_bucket(bad).is_err(), "{bad}");
    }
    assert!(validate_key("../../x").is_ok(), "keys are never paths, so any UTF-8 is fine");
    assert!(validate_key("").is_err());
    assert!(validate_key(&"k".repeat(KEY_BYTES_MAX)).is_ok());
    assert!(validate_key(&"k".repeat(KEY_BYTES_MAX + 1)).is_err());
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_request(&bytes);
        let _ = decode_response(&bytes);
        if bytes.len() >= FRAME_HEADER_BYTES {
            let _ = FrameHeader::decode(bytes[..FRAME_HEADER_BYTES].try_into().unwrap());
        }
    }

    #[test]
    fn geometry_covers_every_byte_once(size in 0u64..200_000, k in 1usize..10, chunk_pow in 12u32..15) {
        let chunk_bytes = 1u32 << chunk_pow;
        let geometry = StripeGeometry::new(size, k, chunk_bytes);
        let mut covered = 0u64;
        for stripe_idx in 0..geometry.stripes {
            let len = geometry.chunk_len(stripe_idx);
            prop_assert!(len <= chunk_bytes as usize);
            let in_stripe: usize = (0..k).map(|i| geometry.data_bytes_in_chunk(stripe_idx, i)).sum();
            prop_assert_eq!(in_stripe as u64, geometry.stripe_data_bytes(stripe_idx));
            prop_assert!(len * k >= in_stripe && len * k - in_stripe < k);
            covered += in_stripe as u64;
        }
        prop_assert_eq!(covered, size);
    }
}

proptest! {
    #[test]
    fn block_checksums_are_indexed_once_each_in_order(size in 0u64..300_000, k in 1u8..6, block_pow in 10u32..13) {
        let (chunk_bytes, block_bytes) = (1u32 << 13, 1u32 << block_pow);
        let mut record = meta(size, k, 2, chunk_bytes);
        record.block_bytes = block_bytes;
        let geometry = record.geometry();
        let blocks: usize = (0..geometry.stripes)
            .map(|s| geometry.chunk_len(s).div_ceil(block_bytes as usize) * record.n())
            .sum();
        record.crcs = (0..blocks as u32).collect();
        prop_assert!(record.validate().is_ok());
        let mut walked = Vec::new();
        for stripe in 0..geometry.stripes {
            for chunk in 0..record.n() {
                walked.extend_from_slice(record.block_crcs(stripe, chunk));
            }
        }
        prop_assert_eq!(walked, record.crcs.clone());
        record.crcs.push(0);
        prop_assert!(record.validate().is_err());
    }
}

#[test]
fn positions_outside_any_set_are_refused() {
    let finalize = |positions: Vec<u32>| Request::Finalize {
        drive: 0,
        bucket: "b".into(),
        key: "k".into(),
        version: VersionId { unix_ns: 1, writer: 1 },
        missing_positions: positions,
    };
    assert!(decode_request(&encode_body(&finalize(vec![0, 5]))).is_ok());
    assert!(matches!(decode_request(&encode_body(&finalize(vec![cluster::N_MAX as u32]))), Err(Error::Invalid { .. })));
    assert!(matches!(decode_request(&encode_body(&finalize(vec![1; cluster::N_MAX + 1]))), Err(Error::Invalid { .. })));
}

/// A format 1 record: the current fields without `pads`, in order (postcard is positional).
#[derive(Serialize)]
struct MetaV1<'a> {
    format: u16,
    bucket: &'a str,
    key: &'a str,
    version: VersionId,
    deleted: bool,
    size: u64,
    etag: &'a str,
    content_type: &'a str,
    user_meta: &'a [(String, String)],
    headers: &'a [(String, String)],
    modified_ms: u64,
    k: u8,
    m: u8,
    chunk_bytes: u32,
    set_idx: u32,
    rotation: u8,
    block_bytes: u32,
    crcs: &'a [u32],
    parts: &'a [PartPiece],
}

#[test]
fn format_1_records_stay_readable_as_the_plain_layout() {
    let current = meta(100_000, 4, 2, 8192);
    let old = MetaV1 {
        format: 1,
        bucket: &current.bucket,
        key: &current.key,
        version: current.version,
        deleted: false,
        size: current.size,
        etag: &current.etag,
        content_type: &current.content_type,
        user_meta: &current.user_meta,
        headers: &current.headers,
        modified_ms: current.modified_ms,
        k: current.k,
        m: current.m,
        chunk_bytes: current.chunk_bytes,
        set_idx: current.set_idx,
        rotation: current.rotation,
        block_bytes: current.block_bytes,
        crcs: &current.crcs,
        parts: &current.parts,
    };
    let bytes = postcard::to_allocvec(&old).unwrap();
    let decoded = ObjectMeta::decode_stored(&bytes).unwrap();
    assert_eq!(decoded, current);
    assert!(decoded.validate().is_ok());
    // The current format round-trips; a format 1 record is not a current one on the wire.
    let stored = postcard::to_allocvec(&current).unwrap();
    assert_eq!(ObjectMeta::decode_stored(&stored).unwrap(), current);
    assert!(decode_message::<ObjectMeta>(&bytes, "meta").is_err());
    assert!(ObjectMeta::decode_stored(&bytes[..bytes.len() - 1]).is_err());
    // Read brief, both formats give the record without its checksums.
    assert_eq!(ObjectMeta::decode_stored_brief(&bytes).unwrap(), current.brief());
    assert_eq!(ObjectMeta::decode_stored_brief(&stored).unwrap(), current.brief());
}

#[test]
fn brief_decoding_reads_past_the_checksums_and_still_counts_them() {
    let mut whole = meta(3 << 20, 4, 2, 1 << 20);
    whole.block_bytes = 4096;
    whole.crcs =
        (0..whole.checksums_for(whole.stored_size()) as u32).map(|i: u32| i.wrapping_mul(0x9e37_79b9)).collect();
    whole.pads = Vec::new();
    assert!(whole.validate().is_ok());
    let stored = encode_body(&whole);
    assert_eq!(ObjectMeta::decode_stored_brief(&stored).unwrap(), whole.brief());
    // A record with one checksum too many or too few is as corrupt read brief as read whole.
    for delta in [1i64, -1] {
        let mut bad = whole.clone();
        if delta > 0 {
            bad.crcs.push(7)
        } else {
            bad.crcs.pop();
        }
        let bytes = encode_body(&bad);
        assert!(ObjectMeta::decode_stored(&bytes).unwrap().validate().is_err());
        assert!(ObjectMeta::decode_stored_brief(&bytes).is_err(), "{delta}");
    }
    assert!(ObjectMeta::decode_stored_brief(&stored[..stored.len() - 1]).is_err(), "cut short");
    // A multipart record: each part's checksums are read past and counted.
    let mut multipart = meta(0, 4, 2, 1 << 20);
    multipart.crcs = Vec::new();
    multipart.parts = (1..=2)
        .map(|number| PartPiece {
            number,
            piece_key: format!("piece-{number}"),
            version: VersionId { unix_ns: 100 + u64::from(number), writer: 1 },
            size: 5 << 20,
            etag: "00".into(),
            set_idx: 0,
            rotation: 0,
            crcs: vec![1; multipart.checksums_for(5 << 20) as usize],
        })
        .collect();
    multipart.size = 10 << 20;
    assert!(multipart.validate().is_ok());
    let stored = encode_body(&multipart);
    assert_eq!(ObjectMeta::decode_stored_brief(&stored).unwrap(), multipart.brief());
    multipart.parts[1].crcs.pop();
    assert!(ObjectMeta::decode_stored_brief(&encode_body(&multipart)).is_err());
}

proptest! {
    /// The checksums are read past by counting varint ends eight bytes at a time: whatever
    /// the mix of 1- to 5-byte varints, and whatever the count modulo 8, the brief record is
    /// the whole one less its checksums (for a part's checksums too).
    #[test]
    fn brief_decoding_finds_the_end_of_checksums_of_any_width(
        values in proptest::collection::vec((any::<u32>(), 0u32..32), 1..40),
        size in 1u64..(3 << 20),
    ) {
        let pick = |i: usize| { let (v, s) = values[i % values.len()]; v >> s };
        let mut whole = meta(size, 4, 2, 1 << 20);
        whole.block_bytes = 4096;
        whole.crcs = (0..whole.checksums_for(whole.stored_size()) as usize).map(pick).collect();
        prop_assert!(whole.validate().is_ok());
        prop_assert_eq!(ObjectMeta::decode_stored_brief(&encode_body(&whole)).unwrap(), whole.brief());
        let mut multipart = meta(0, 4, 2, 1 << 20);
        multipart.block_bytes = 4096;
        multipart.crcs = Vec::new();
        multipart.parts = (1..=2)
            .map(|number| PartPiece {
                number,
                piece_key: format!("piece-{number}"),
                version: VersionId { unix_ns: 100 + u64::from(number), writer: 1 },
                size: size + u64::from(number),
                etag: "00".into(),
                set_idx: 0,
                rotation: 0,
                crcs: (0..multipart.checksums_for(size + u64::from(number)) as usize).map(|i| pick(i + 3)).collect(),
            })
            .collect();
        multipart.size = 2 * size + 3;
        prop_assert!(multipart.validate().is_ok());
        prop_assert_eq!(ObjectMeta::decode_stored_brief(&encode_body(&multipart)).unwrap(), multipart.brief());
    }
}

/// A record of the stored stream `pads` make of `size` object bytes.
fn padded_meta(size: u64, k: u8, chunk_bytes: u32, pads: Vec<Pad>) -> ObjectMeta {
    let mut record = meta(size, k, 2, chunk_bytes);
    record.pads = pads;
    let geometry = record.geometry();
    record.crcs = vec![0; geometry.stripes as usize * record.n()];
    record
}

#[test]
fn stored_ranges_skip_the_pads() {
    let record =
        padded_meta(100, 2, 4096, vec![Pad { at: 10, len: 5 }, Pad { at: 30, len: 7 }, Pad { at: 100, len: 9 }]);
    assert!(record.validate().is_ok());
    assert_eq!(record.stored_size(), 121);
    assert_eq!(record.stored_offset(0), 0);
    assert_eq!(record.stored_offset(10), 15);
    assert_eq!(record.stored_offset(29), 34);
    assert_eq!(record.stored_offset(30), 42);
    assert_eq!(record.stored_offset(100), 121);
    assert_eq!(record.stored_ranges(0..100), vec![0..10, 15..35, 42..112]);
    assert_eq!(record.stored_ranges(10..30), vec![15..35]);
    assert_eq!(record.stored_ranges(5..12), vec![5..10, 15..17]);
    assert_eq!(record.stored_ranges(40..40), vec![52..52]);
    assert_eq!(record.stored_ranges(99..100), vec![111..112]);
}

#[test]
fn bad_pads_are_refused() {
    let check = |pads: Vec<Pad>| padded_meta(100, 2, 4096, pads).validate();
    assert!(check(vec![Pad { at: 10, len: 0 }]).is_err(), "an empty pad");
    assert!(check(vec![Pad { at: 101, len: 1 }]).is_err(), "past the end");
    assert!(check(vec![Pad { at: 10, len: 1 }, Pad { at: 10, len: 1 }]).is_err(), "twice at one offset");
    assert!(check(vec![Pad { at: 20, len: 1 }, Pad { at: 10, len: 1 }]).is_err(), "out of order");
    assert!(check(vec![Pad { at: 10, len: 2 * 4096 + 1 }]).is_err(), "longer than a stripe");
    assert!(check(vec![Pad { at: 100, len: 2 * 4096 }]).is_ok());
    let mut huge = padded_meta(100, 2, 4096, vec![Pad { at: 100, len: 4096 }]);
    huge.size = u64::MAX - 10;
    assert!(huge.validate().is_err(), "a size whose pads overflow");
    let mut marker = padded_meta(100, 2, 4096, vec![Pad { at: 10, len: 1 }]);
    marker.deleted = true;
    marker.crcs.clear();
    assert!(marker.validate().is_err(), "pads on a delete marker");
    // The checksums must cover the stored stream, pads included.
    let mut short = padded_meta(8000, 2, 4096, vec![Pad { at: 8000, len: 4096 }]);
    short.crcs.truncate(short.crcs.len() - 1);
    assert!(short.validate().is_err());
}

#[test]
fn row_groups_of_the_benchmark_shape_align_under_one_percent() {
    // 12 row groups of ~11.7 MB (a 6.25M-row particle file, 512Ki rows per group) at 4+2.
    let mut ranges = Vec::new();
    let mut at = 4u64;
    for g in 0..12u64 {
        let len = if g == 11 { 10_800_000 } else { 11_700_000 + g * 3_000 };
        ranges.push(at..at + len);
        at += len;
    }
    let size = at + 9_000;
    let layout = aligned_layout(size, 4, 1 << 20, &ranges).expect("aligns");
    assert_eq!(layout.aligned, 12);
    assert!(layout.pad_bytes() * 100 <= size, "{} bytes of pads", layout.pad_bytes());
    assert_eq!(layout.chunk_bytes % ALIGN_CHUNK_STEP, 0);
    // A small file stays plain: a stripe of padding would cost more than the budget.
    assert_eq!(aligned_layout(3_000_000, 4, 1 << 20, &[4..1_000_000, 1_000_000..2_999_000]), None);
    // Ranges out of order or outside the object are not a layout's input.
    assert_eq!(aligned_layout(size, 4, 1 << 20, &[ranges[1].clone(), ranges[0].clone()]), None);
    assert_eq!(aligned_layout(100, 4, 1 << 20, &[0..50, 60..200]), None);
}

proptest! {
    #[test]
    fn aligned_layouts_hold_their_promises(
        lens in proptest::collection::vec(1u64..3_000_000, 1..40),
        gap in 0u64..5_000,
        k in 1usize..7,
        chunk_pow in 16u32..22,
    ) {
        let mut ranges = Vec::new();
        let mut at = 4u64;
        for len in &lens {
            ranges.push(at..at + len);
            at += len + gap;
        }
        let size = at + 1_000;
        let chunk_min = 1u32 << chunk_pow;
        if let Some(layout) = aligned_layout(size, k, chunk_min, &ranges) {
            prop_assert!(layout.pad_bytes() <= size / 10_000 * ALIGN_PAD_BASIS_POINTS_MAX);
            prop_assert!(layout.chunk_bytes >= chunk_min.min(CHUNK_BYTES_MAX as u32));
            prop_assert!(layout.chunk_bytes as usize <= CHUNK_BYTES_MAX);
            prop_assert!(u64::from(layout.chunk_bytes) * k as u64 <= ALIGN_STRIPE_DATA_BYTES_MAX.max(k as u64 * 4096));
            prop_assert!(!layout.pads.is_empty());
            prop_assert!(layout.aligned >= 1 && layout.aligned <= ranges.len());
            let record = padded_meta(size, k as u8, layout.chunk_bytes, layout.pads.clone());
            prop_assert!(record.validate().is_ok());
            // Count again from the record: each aligned range's stored bytes lie in one chunk.
            let geometry = record.geometry();
            let mut counted = 0;
            for r in &ranges {
                let stored = record.stored_ranges(r.clone());
                let (first, last) = (stored[0].start, stored.last().unwrap().end - 1);
                let chunk = |o: u64| {
                    let s = o / geometry.stripe_bytes();
                    (s, (o - geometry.stripe_offset(s)) / geometry.chunk_len(s) as u64)
                };
                if stored.len() == 1 && chunk(first) == chunk(last) {
                    counted += 1;
                }
            }
            prop_assert_eq!(counted, layout.aligned);
            // The stretches of the whole object add up to it and never overlap a pad.
            let whole = record.stored_ranges(0..size);
            prop_assert_eq!(whole.iter().map(|r| r.end - r.start).sum::<u64>(), size);
            prop_assert!(whole.windows(2).all(|w| w[0].end < w[1].start));
        }
    }
}
