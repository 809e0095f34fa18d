//! Never lose an acknowledged version: the scenarios of the durability review, each set up
//! deterministically (by speaking the node protocol by hand where a real client would need
//! luck with timing), then checked through the real client.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proto::{CommitCondition, ObjectMeta, Request, Response, StripeGeometry, VersionId};

use crate::harness::{Cluster, Shape, block_on, payload};
use crate::protocol::{RawSession, secret_of};

/// A client of `cluster` whose clock is off by `skew_s` seconds.
pub(crate) fn skewed_client(cluster: &Cluster, skew_s: i64) -> client::Client {
    let text = std::fs::read_to_string(&cluster.config).unwrap();
    let map = cluster::ClusterMap::from_toml(&text, &cluster.data_dir()).unwrap();
    let options = client::ClientOptions {
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(3),
        clock_skew_ns: skew_s * 1_000_000_000,
        ..client::ClientOptions::default()
    };
    client::Client::new(map, options).unwrap()
}

/// Metadata of a small object `bucket/key` written by hand, at `version`: every chunk is
/// zeros (an object of zeros encodes to zero parity), and the block checksums are theirs, so
/// repair can rebuild it like a real one.
pub(crate) fn hand_meta(
    map: &cluster::ClusterMap,
    bucket: &str,
    key: &str,
    version: VersionId,
    size: u64,
) -> ObjectMeta {
    let (k, m) = (map.erasure.k, map.erasure.m);
    let placement = map.placement_in(0, bucket, key);
    let geometry = StripeGeometry::new(size, k, map.chunk_bytes);
    let block_bytes = (64u32 << 10).min(map.chunk_bytes);
    let mut crcs = Vec::new();
    for stripe in 0..geometry.stripes {
        let chunk = vec![0u8; geometry.chunk_len(stripe)];
        for _ in 0..k + m {
            crcs.extend(chunk.chunks(block_bytes as usize).map(crate::protocol::crc32c_of));
        }
    }
    ObjectMeta {
        format: proto::META_FORMAT_VERSION,
        bucket: bucket.into(),
        key: key.into(),
        version,
        deleted: false,
        size,
        etag: "00".repeat(16),
        content_type: String::new(),
        user_meta: Vec::new(),
        headers: Vec::new(),
        modified_ms: 0,
        k: k as u8,
        m: m as u8,
        chunk_bytes: map.chunk_bytes,
        block_bytes,
        set_idx: placement.set_idx as u32,
        rotation: placement.rotation as u8,
        crcs,
        parts: Vec::new(),
        pads: Vec::new(),
    }
}

/// Stages this drive's (zero) chunks of `meta` and commits it on the node at `position` of the
/// key's set, as a writer would.
pub(crate) fn hand_commit(
    cluster: &Cluster,
    position: usize,
    meta: &ObjectMeta,
    condition: CommitCondition,
) -> Response {
    let map = cluster.client().map().clone();
    let drive = map.sets[meta.set_idx as usize].drives[position];
    let mut session = RawSession::open(cluster.addrs[drive.node_idx], &secret_of(cluster));
    hand_commit_on(&mut session, drive.drive_idx, meta, condition)
}

/// Stages this drive's chunks of `meta` on the node at `position` of the key's set and sends
/// `commit` (built for that drive) to commit them.
pub(crate) fn hand_stage_and_send(
    cluster: &Cluster,
    position: usize,
    meta: &ObjectMeta,
    commit: impl FnOnce(u32) -> Request,
) -> Response {
    let map = cluster.client().map().clone();
    let drive = map.sets[meta.set_idx as usize].drives[position];
    let mut session = RawSession::open(cluster.addrs[drive.node_idx], &secret_of(cluster));
    hand_stage(&mut session, drive.drive_idx, meta);
    session.call(&commit(drive.drive_idx as u32))
}

fn hand_stage(session: &mut RawSession, drive_idx: usize, meta: &ObjectMeta) {
    let geometry = meta.geometry();
    for stripe in 0..geometry.stripes {
        let chunk = vec![0u8; geometry.chunk_len(stripe)];
        let crcs = chunk.chunks(meta.block_bytes as usize).map(crate::protocol::crc32c_of).collect();
        let write = Request::ChunkWrite {
            drive: drive_idx as u32,
            bucket: meta.bucket.clone(),
            version: meta.version,
            offset: geometry.file_offset(stripe),
            len: chunk.len() as u32,
            block_bytes: meta.block_bytes,
            crcs,
            staging: proto::Staging::Write,
        };
        assert_eq!(session.call_with_data(&write, &chunk), Response::Ok);
    }
}

/// [`hand_commit`] on an open session to the drive's node.
fn hand_commit_on(
    session: &mut RawSession,
    drive_idx: usize,
    meta: &ObjectMeta,
    condition: CommitCondition,
) -> Response {
    hand_stage(session, drive_idx, meta);
    let commit =
        Request::Commit { drive: drive_idx as u32, meta: meta.clone(), missing_positions: Vec::new(), condition };
    session.call(&commit)
}

pub(crate) fn hand_rollback(cluster: &Cluster, position: usize, meta: &ObjectMeta) {
    let map = cluster.client().map().clone();
    let drive = map.sets[meta.set_idx as usize].drives[position];
    let mut session = RawSession::open(cluster.addrs[drive.node_idx], &secret_of(cluster));
    assert_eq!(session.call(&rollback_of(drive.drive_idx, meta)), Response::Ok);
}

fn rollback_of(drive_idx: usize, meta: &ObjectMeta) -> Request {
    Request::Rollback {
        drive: drive_idx as u32,
        bucket: meta.bucket.clone(),
        key: meta.key.clone(),
        version: meta.version,
    }
}

/// `bkt/K` written through the client (300 kB), and the metadata of an overwrite of it one
/// microsecond newer (100 kB) for a test to commit by hand: (bytes, written, map, overwrite).
fn object_and_overwrite(cluster: &Cluster) -> (Vec<u8>, client::ObjectInfo, Arc<cluster::ClusterMap>, ObjectMeta) {
    let client = cluster.client();
    let old = payload(300_000, 1);
    let info = block_on(async {
        client.make_bucket("bkt").await.unwrap();
        client.put_bytes("bkt", "K", &old, &Default::default()).await.unwrap()
    });
    let map = client.map().clone();
    let newer = VersionId { unix_ns: info.meta.version.unix_ns + 1_000, writer: 7 };
    let overwrite = hand_meta(&map, "bkt", "K", newer, 100_000);
    (old, info, map, overwrite)
}

/// [`object_and_overwrite`], with the overwrite committed by hand on positions 0-4 (W = 5:
/// acknowledged, never finalized) and repair paused, which would give position 5 the overwrite
/// from the others.
fn overwrite_missed_by_position_5(
    cluster: &Cluster,
) -> (Vec<u8>, client::ObjectInfo, Arc<cluster::ClusterMap>, ObjectMeta) {
    cluster.cli_ok(&["repair", "pause"]);
    let written = object_and_overwrite(cluster);
    for position in 0..5 {
        let outcome = hand_commit(cluster, position, &written.3, CommitCondition::None);
        assert!(matches!(outcome, Response::Committed { .. }), "{outcome:?}");
    }
    written
}

#[test]
fn a_rollback_planned_with_an_older_map_is_still_served() {
    // A writer's overwrite landed on 4 of 6 drives (short of W = 5), and before its rollbacks
    // a node moved: the map the writer planned with is stale now. The nodes must still undo
    // the commits, or the failed overwrite stays readable on 4 drives (k = 4): chaos seed 8
    // with --readdress saw a failed delete's marker stay, and its retry say "no such object".
    let mut cluster = Cluster::start(Shape::default());
    let (old, info, map, overwrite) = object_and_overwrite(&cluster);
    assert_eq!(map.version, 1);
    let set = &map.sets[overwrite.set_idx as usize];
    // The writer's connections, planned with map version 1.
    let mut sessions: Vec<RawSession> = (0..4)
        .map(|position| RawSession::open(cluster.addrs[set.drives[position].node_idx], &secret_of(&cluster)))
        .collect();
    for (position, session) in sessions.iter_mut().enumerate() {
        let outcome = hand_commit_on(session, set.drives[position].drive_idx, &overwrite, CommitCondition::None);
        assert!(matches!(outcome, Response::Committed { .. }), "{outcome:?}");
    }
    // The node at position 5 moves to another address: map version 2 on every other node.
    let moving = set.drives[5].node_idx;
    cluster.kill_node(moving);
    let moved = std::net::SocketAddr::from(([127, 0, 0, 1], crate::harness::free_ports(1)));
    let text = std::fs::read_to_string(&cluster.config).unwrap();
    let edited = text.replace(&cluster.addrs[moving].to_string(), &moved.to_string());
    let edited = crate::topology::private_file(cluster.dir.path(), "next.toml", &edited);
    cluster.cli_ok(&["map", "push", edited.to_str().unwrap()]);
    for idx in (0..6).filter(|&idx| idx != moving) {
        cluster.wait_log(idx, "cluster map updated");
    }
    for (position, session) in sessions.iter_mut().enumerate() {
        let drive_idx = set.drives[position].drive_idx;
        // The session is stale for anything else ...
        let probe = Request::MetaGet {
            items: vec![proto::MetaKey { drive: drive_idx as u32, bucket: "bkt".into(), key: "K".into() }],
            detail: proto::MetaDetail::Versions,
        };
        assert!(
            matches!(session.call(&probe), Response::Error { kind: proto::ErrorKind::StaleMap, .. }),
            "the node holds the newer map"
        );
        // ... but its own commit is undone.
        assert_eq!(session.call(&rollback_of(drive_idx, &overwrite)), Response::Ok, "position {position}");
    }
    cluster.addrs[moving] = moved;
    cluster.start_node(moving);
    cluster.wait_ready();
    let reader = cluster.client();
    block_on(async {
        let head = reader.head("bkt", "K").await.unwrap();
        assert_eq!(head.meta.version, info.meta.version, "the failed overwrite is gone from every drive");
        assert!(reader.get("bkt", "K").await.unwrap() == old);
    });
}

#[test]
fn failed_overwrite_rolled_back_on_four_drives_keeps_the_previous_version_readable() {
    // The review's example, 4+2: K is on all 6 drives; an overwrite reaches only 4 drives (one
    // node was down, one died during the commit), so the writer rolls those 4 back. The old K
    // must survive the loss of the 2 drives that never saw the overwrite.
    let mut cluster = Cluster::start(Shape::default());
    let (old, info, map, overwrite) = object_and_overwrite(&cluster);
    for position in 0..4 {
        let outcome = hand_commit(&cluster, position, &overwrite, CommitCondition::None);
        assert!(matches!(outcome, Response::Committed { .. }), "{outcome:?}");
    }
    for position in 0..4 {
        hand_rollback(&cluster, position, &overwrite);
    }
    // The two drives that held K but not the overwrite die.
    for position in 4..6 {
        let node = map.sets[overwrite.set_idx as usize].drives[position].node_idx;
        cluster.kill_node(node);
    }
    let reader = cluster.client();
    block_on(async {
        let head = reader.head("bkt", "K").await.unwrap();
        assert_eq!(head.meta.version, info.meta.version, "the acknowledged version is current again");
        assert!(reader.get("bkt", "K").await.unwrap() == old, "and readable from the 4 drives left");
    });
}

#[test]
fn writes_from_clients_with_lagging_or_leading_clocks_win_once_acknowledged() {
    let cluster = Cluster::start(Shape::default());
    let on_time = cluster.client();
    let lagging = skewed_client(&cluster, -120);
    let leading = skewed_client(&cluster, 120);
    block_on(async {
        on_time.make_bucket("bkt").await.unwrap();
        // A lagging writer after an on-time one: its PUT is acknowledged, so it must win.
        on_time.put_bytes("bkt", "k", b"first, on time", &Default::default()).await.unwrap();
        lagging.put_bytes("bkt", "k", b"second, 2 minutes behind", &Default::default()).await.unwrap();
        assert_eq!(on_time.get("bkt", "k").await.unwrap(), b"second, 2 minutes behind");
        // An on-time writer after a leading one.
        leading.put_bytes("bkt", "k", b"third, 2 minutes ahead", &Default::default()).await.unwrap();
        on_time.put_bytes("bkt", "k", b"fourth, on time", &Default::default()).await.unwrap();
        assert_eq!(lagging.get("bkt", "k").await.unwrap(), b"fourth, on time");
        // A lagging DELETE after that: the key is gone for every reader.
        lagging.delete("bkt", "k").await.unwrap();
        assert!(matches!(on_time.get("bkt", "k").await, Err(client::Error::NotFound { .. })));
        assert!(matches!(leading.head("bkt", "k").await, Err(client::Error::NotFound { .. })));
        // And a lagging re-create after the delete.
        lagging.put_bytes("bkt", "k", b"fifth, back again", &Default::default()).await.unwrap();
        assert_eq!(leading.get("bkt", "k").await.unwrap(), b"fifth, back again");
    });
}

#[test]
fn gets_racing_overwrites_return_the_old_or_the_new_object_never_an_error() {
    let cluster = Cluster::start(Shape::default());
    let client = cluster.client();
    // Several 4 MiB windows per GET, so a GET spans many commits' worth of time.
    let values: Vec<Vec<u8>> = (0..4).map(|i| payload(10_000_000 + i * 1001, 40 + i as u64)).collect();
    block_on(async {
        client.make_bucket("bkt").await.unwrap();
        client.put_bytes("bkt", "hot", &values[0], &Default::default()).await.unwrap();
    });
    let commits = Arc::new(Mutex::new(Vec::<(Instant, Instant)>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (client, values, commits, stop) = (cluster.client(), values.clone(), commits.clone(), stop.clone());
        std::thread::spawn(move || {
            block_on(async {
                for i in 1..200usize {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let start = Instant::now();
                    client.put_bytes("bkt", "hot", &values[i % values.len()], &Default::default()).await.unwrap();
                    commits.lock().unwrap().push((start, Instant::now()));
                }
            })
        })
    };
    // Count the GETs in flight at the moment an overwrite was acknowledged (its commit).
    let mut spanned = 0;
    let mut gets = 0;
    let deadline = Instant::now() + Duration::from_secs(90);
    block_on(async {
        while spanned < 10 && gets < 3000 && Instant::now() < deadline {
            let start = Instant::now();
            let body = client.get("bkt", "hot").await.expect("a GET overlapping an overwrite must not fail");
            let end = Instant::now();
            gets += 1;
            assert!(values.contains(&body), "a GET returned bytes that no PUT wrote (torn or corrupt)");
            let acks = commits.lock().unwrap();
            spanned += usize::from(acks.iter().any(|(_, acked)| *acked > start && *acked < end));
        }
    });
    stop.store(true, Ordering::SeqCst);
    writer.join().unwrap();
    assert!(spanned >= 10, "only {spanned} of {gets} GETs spanned an acknowledged overwrite: the race did not happen");
}

#[test]
fn a_drive_that_fails_during_the_commit_is_queued_for_repair() {
    // The drive at position 5 already holds a live version of the key (written there by hand),
    // so it refuses an If-None-Match commit while the other five apply it: it failed during
    // the commit, after the writer had sent it every chunk.
    let mut cluster = Cluster::start(Shape::default());
    let client = cluster.client();
    block_on(client.make_bucket("bkt")).unwrap();
    // Repair would drain the queue this test reads.
    cluster.cli_ok(&["repair", "pause"]);
    let map = client.map().clone();
    let set = &map.sets[map.placement_in(0, "bkt", "k").set_idx];
    let stray = hand_meta(&map, "bkt", "k", VersionId { unix_ns: 1, writer: 1 }, 10);
    assert!(matches!(hand_commit(&cluster, 5, &stray, CommitCondition::None), Response::Committed { .. }));
    let options = client::PutOptions { condition: client::CommitCondition::IfAbsent, ..Default::default() };
    let info = block_on(async {
        let info = client.put_bytes("bkt", "k", &payload(200_000, 3), &options).await.unwrap();
        client.settle().await;
        info
    });
    assert_eq!(info.meta_positions, [0, 1, 2, 3, 4], "five drives applied it, position 5 refused");
    let version = info.meta.version;
    // Finalize went out (and, listing missing positions, was fsynced) before settle returned.
    for idx in 0..cluster.addrs.len() {
        cluster.kill_node(idx);
    }
    for drive in &set.drives[..5] {
        let opened = chunkstore::Drive::open(&cluster.drive_dir(drive.node_idx, drive.drive_idx)).unwrap();
        let queue = opened.repair_queue().unwrap();
        assert!(queue.iter().any(|(v, r)| *v == version && r.positions == [5]), "n{}: {queue:?}", drive.node_idx + 1);
    }
}

#[test]
fn a_read_of_a_write_rolled_back_under_it_gives_way_to_the_version_it_replaced() {
    // Chaos seed 3: a head chose an overwrite in flight (on k = 4 drives), the overwrite then
    // missed W and was rolled back, and the read found its chunks missing everywhere. The
    // reader must then read the version the rollback restored, not fail.
    let cluster = Cluster::start(Shape::default());
    let (old, info, _map, overwrite) = object_and_overwrite(&cluster);
    for position in 0..4 {
        let outcome = hand_commit(&cluster, position, &overwrite, CommitCondition::None);
        assert!(matches!(outcome, Response::Committed { .. }), "{outcome:?}");
    }
    let reader = cluster.client();
    let chosen = block_on(reader.head("bkt", "K")).unwrap();
    assert_eq!(chosen.meta.version, overwrite.version, "k drives hold the overwrite: a head chooses it");
    for position in 0..4 {
        hand_rollback(&cluster, position, &overwrite);
    }
    block_on(async {
        let mut buf = vec![0u8; chosen.meta.size as usize];
        let failed = reader.read_at(&chosen, 0, &mut buf).await.unwrap_err();
        assert!(matches!(failed, client::Error::Unavailable { .. }), "the rollback removed it: {failed}");
        let again = reader.head_after_failed_read(&chosen, failed).await.unwrap();
        assert_eq!(again.meta.version, info.meta.version, "the version the rollback restored");
        let mut buf = vec![0u8; again.meta.size as usize];
        assert_eq!(reader.read_at(&again, 0, &mut buf).await.unwrap(), old.len());
        assert!(buf == old);
    });
    // The same version failing again is the error itself, not another head.
    let lost = client::Error::Unavailable {
        action: "read",
        unit: client::Counted::Chunks,
        bucket: "bkt".into(),
        key: "K".into(),
        available: 3,
        total: 6,
        needed: 4,
        unreachable: Vec::new(),
    };
    let same = block_on(reader.head_after_failed_read(&info, lost));
    assert!(matches!(same, Err(client::Error::Unavailable { .. })), "{same:?}");
}

#[test]
fn an_overwrite_acknowledged_without_its_finalize_is_never_read_past_with_two_holders_down() {
    // Chaos seed 7 (decommission under faults): an overwrite was acknowledged on W = 5 drives,
    // its finalize never landed, then two of its holders went down. The drives that answer hold
    // it on 3 (fewer than k = 4) and the old version on 4 (one current, three retained): the
    // old one is "readable", yet returning it goes back behind an acknowledged write.
    let mut cluster = Cluster::start(Shape::default());
    let (_old, info, map, overwrite) = overwrite_missed_by_position_5(&cluster);
    let set = &map.sets[overwrite.set_idx as usize];
    let down: Vec<usize> = (3..5).map(|position| set.drives[position].node_idx).collect();
    for &node in &down {
        cluster.kill_node(node);
    }
    let reader = cluster.client();
    let failed = block_on(reader.head("bkt", "K")).expect_err("neither the old object nor absent is right");
    let client::Error::Unavailable { available, needed, unreachable, .. } = &failed else {
        panic!("expected Unavailable, got {failed}");
    };
    assert_eq!((*available, *needed), (3, 4), "{failed}");
    // The fault happened: the killed holders are what the read misses.
    for &node in &down {
        let id = &map.nodes[node].id;
        assert!(unreachable.iter().any(|f| &f.node == id), "{id} is named as unreachable: {failed}");
    }
    let get = block_on(reader.get("bkt", "K"));
    assert!(matches!(get, Err(client::Error::Unavailable { .. })), "a GET fails the same way: {get:?}");
    // Back up: the overwrite is readable and wins; the old version never came back meanwhile.
    for &node in &down {
        cluster.start_node(node);
    }
    cluster.wait_ready();
    let head = block_on(cluster.client().head("bkt", "K")).unwrap();
    assert_eq!(head.meta.version, overwrite.version);
    assert!(head.meta.version > info.meta.version);
}

#[test]
fn a_read_that_hears_from_too_few_drives_to_see_every_acknowledged_version_fails() {
    // Chaos seed 7 of the decommission test (CI, 2026-11-27): a client whose map a pool
    // addition had just made old heard only from the one node the new map had not reached yet
    // (the others refused its requests; two were down). That node had missed an acknowledged
    // overwrite, and a ranged GET answered with the value it replaced: the range needed only
    // that node's chunk. One answer of six cannot show a version acknowledged on W = 5 drives.
    let mut cluster = Cluster::start(Shape::default());
    let (old, info, map, overwrite) = overwrite_missed_by_position_5(&cluster);
    let set = &map.sets[overwrite.set_idx as usize];
    for position in 0..5 {
        cluster.kill_node(set.drives[position].node_idx);
    }
    let reader = cluster.client();
    let failed = block_on(reader.head("bkt", "K")).expect_err("the old object is not an answer");
    let client::Error::Unavailable { available, needed, unreachable, .. } = &failed else {
        panic!("expected Unavailable, got {failed}");
    };
    assert_eq!((*available, *needed, unreachable.len()), (1, 4, 5), "{failed}");
    // What the checker did: ranged GETs through the CLI, one at the start of every data chunk
    // of every stripe. Before the fix, one lying in a chunk of the drive that answered (position
    // 5; which chunks those are depends on the key's rotation) returned the replaced bytes.
    let geometry = info.meta.geometry();
    let (k, chunk_bytes) = (map.erasure.k, u64::from(map.chunk_bytes));
    for stripe in 0..geometry.stripes {
        for chunk in 0..k {
            let offset = stripe * k as u64 * chunk_bytes + (chunk * geometry.chunk_len(stripe)) as u64;
            if offset >= info.meta.size {
                continue;
            }
            let out = cluster.cli(&["get", "bkt/K", "-", "--offset", &offset.to_string(), "--length", "1000"]);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success(),
                "stripe {stripe} chunk {chunk}: read {} bytes of the replaced object",
                out.stdout.len()
            );
            assert!(stderr.contains("1 of 6 drives reachable, 4 needed"), "stripe {stripe} chunk {chunk}: {stderr}");
            assert!(out.stdout.is_empty(), "nothing of the {} old bytes is written", old.len());
        }
    }
    // The fault is the one described: the five killed nodes are what the read missed.
    for position in 0..5 {
        let id = &map.nodes[set.drives[position].node_idx].id;
        assert!(unreachable.iter().any(|f| &f.node == id), "{id} is named as unreachable: {failed}");
    }
}

#[test]
fn a_listing_needs_enough_drives_of_every_set_not_just_a_majority_of_all() {
    // 12 nodes of one drive, two erasure sets of six: each set on half of the nodes.
    let mut cluster = Cluster::start(Shape { nodes: 12, ..Shape::default() });
    let map = cluster.client().map().clone();
    assert_eq!(map.sets.len(), 2);
    let set0: Vec<usize> = map.sets[0].drives.iter().map(|d| d.node_idx).collect();
    assert!(map.sets[1].drives.iter().all(|d| !set0.contains(&d.node_idx)), "the sets share no node");
    let n = set0.len();
    let needed = n + 1 - map.erasure.write_quorum();
    assert_eq!(needed, 2, "4+2: W = 5, so any 2 drives of a set hold every acknowledged write");
    let key = (0..100).map(|i| format!("k{i}")).find(|k| map.placement_in(0, "bkt", k).set_idx == 0).unwrap();
    block_on(cluster.client().make_bucket("bkt")).unwrap();

    // Acknowledged while set0[0] is down: on the five other drives of set 0 only.
    cluster.kill_node(set0[0]);
    block_on(cluster.client().put_bytes("bkt", &key, &payload(1000, 7), &Default::default())).unwrap();
    // Then those five go down and set0[0] comes back: of set 0, only a drive without the key
    // answers, while 7 of the 12 drives (a majority of all) do.
    for &idx in &set0[1..] {
        cluster.kill_node(idx);
    }
    cluster.restart_node(set0[0]);
    let mut session = RawSession::open(cluster.addrs[set0[0]], &secret_of(&cluster));
    let request =
        Request::List { drive: 0, bucket: "bkt".into(), prefix: String::new(), start_after: String::new(), limit: 100 };
    match session.call(&request) {
        Response::Listing { entries } => assert!(entries.iter().all(|e| e.key != key), "the lone drive lacks the key"),
        other => panic!("unexpected answer {other:?}"),
    }
    // A listing from it alone would miss an acknowledged key: it is refused instead.
    let err = block_on(cluster.client().list("bkt", "", "", 100)).unwrap_err();
    let client::Error::Unavailable { available: 1, needed: 2, unreachable, .. } = &err else {
        panic!("expected 1 of set 0's drives answering, 2 needed: {err}");
    };
    let mut named: Vec<&str> = unreachable.iter().map(|f| f.node.as_str()).collect();
    let mut down: Vec<String> = set0[1..].iter().map(|idx| format!("n{}", idx + 1)).collect();
    named.sort_unstable();
    down.sort_unstable();
    assert_eq!(named, down, "names exactly set 0's nodes that are down: {err}");
    let ls = cluster.cli_err(&["ls", "bkt"]);
    assert!(ls.contains("1 of 6 drives reachable, 2 needed"), "{ls}");

    // A second drive of set 0 back: one of the two has the key, and the listing shows it.
    cluster.start_node(set0[1]);
    cluster.wait_ready();
    let page = block_on(cluster.client().list("bkt", "", "", 100)).unwrap();
    assert_eq!(page.entries.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(), [key.as_str()]);
}
