//! A failed write leaves no trace (issue 37): listings answer as reads do, repair spreads only
//! versions known acknowledged, and a writer never rolls back what W drives may hold. Each
//! scenario is set up deterministically: leftovers of failed writes are committed by hand on
//! the drives a real writer would have left them on, and lost commit replies are dropped by a
//! relay that reads the node protocol's frames.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use proto::{
    CommitCondition, FRAME_HEADER_BYTES, FRAME_TAG_BYTES, FrameHeader, FrameKind, ObjectMeta, Request, Response,
    VersionId,
};

use crate::durability::{hand_commit, hand_meta, hand_rollback, hand_stage_and_send};
use crate::harness::{Cluster, Shape, block_on, payload};
use crate::protocol::{RawSession, secret_of};

/// What the drive at `position` of `meta`'s set holds of its key (versions and floor).
fn drive_versions(cluster: &Cluster, position: usize, meta: &ObjectMeta) -> proto::KeyVersions {
    let map = cluster.client().map().clone();
    let drive = map.sets[meta.set_idx as usize].drives[position];
    let mut session = RawSession::open(cluster.addrs[drive.node_idx], &secret_of(cluster));
    let item = proto::MetaKey { drive: drive.drive_idx as u32, bucket: meta.bucket.clone(), key: meta.key.clone() };
    match session.call(&Request::MetaGet { items: vec![item], detail: proto::MetaDetail::WithFloor }) {
        Response::Versions { mut keys } => keys.pop().expect("one key"),
        other => panic!("unexpected answer {other:?}"),
    }
}

fn listed_keys(cluster: &Cluster) -> Vec<(String, u64)> {
    let page = block_on(cluster.client().list("bkt", "", "", 100)).unwrap();
    page.entries.into_iter().map(|e| (e.key, e.size)).collect()
}

/// Commits `meta` by hand on the drives at `positions` of its set, as a failed write whose
/// rollback never reached them leaves it.
fn leave_on(cluster: &Cluster, positions: &[usize], meta: &ObjectMeta) {
    for &position in positions {
        let answer = hand_commit(cluster, position, meta, CommitCondition::None);
        assert!(matches!(answer, Response::Committed { .. }), "{answer:?}");
    }
}

/// `bkt/K` written through the client; its bytes and version.
fn acknowledged_object(cluster: &Cluster, size: usize) -> (Vec<u8>, VersionId) {
    let client = cluster.client();
    let bytes = payload(size, 1);
    let info = block_on(async {
        client.make_bucket("bkt").await.unwrap();
        client.put_bytes("bkt", "K", &bytes, &Default::default()).await.unwrap()
    });
    (bytes, info.meta.version)
}

/// A delete marker of `bkt/K` at `version`, as `Client::delete` commits it.
fn hand_marker(map: &cluster::ClusterMap, version: VersionId) -> ObjectMeta {
    let mut marker = hand_meta(map, "bkt", "K", version, 0);
    marker.deleted = true;
    marker.etag = String::new();
    marker
}

fn later(version: VersionId, micros: u64) -> VersionId {
    VersionId { unix_ns: version.unix_ns + micros * 1_000, writer: 7 }
}

#[test]
fn a_failed_first_put_left_on_two_drives_is_neither_read_nor_listed() {
    // The first PUT of K committed on two drives; the others refused or hung, and its rollback
    // never reached those two (their nodes were stopped): a leftover on m drives.
    let cluster = Cluster::start(Shape::default());
    let client = cluster.client();
    block_on(client.make_bucket("bkt")).unwrap();
    let map = client.map().clone();
    let leftover = hand_meta(&map, "bkt", "K", VersionId { unix_ns: 1_000_000_000, writer: 3 }, 100_000);
    leave_on(&cluster, &[0, 1], &leftover);
    let read = block_on(client.head("bkt", "K")).unwrap_err();
    assert!(matches!(read, client::Error::NotFound { .. }), "a read finds no object: {read}");
    assert_eq!(listed_keys(&cluster), [], "a listing agrees with the read: no phantom key");
    let ls = cluster.cli_ok(&["ls", "bkt"]);
    assert!(!ls.contains('K'), "tessera ls shows no phantom: {ls}");
}

#[test]
fn a_failed_delete_left_on_one_drive_does_not_hide_a_live_object_from_listings() {
    let cluster = Cluster::start(Shape::default());
    let (bytes, version) = acknowledged_object(&cluster, 100_000);
    let map = cluster.client().map().clone();
    // A DELETE committed on one drive, then failed; its rollback missed that drive.
    let marker = hand_marker(&map, later(version, 1));
    assert!(matches!(hand_commit(&cluster, 2, &marker, CommitCondition::None), Response::Committed { .. }));
    assert!(block_on(cluster.client().get("bkt", "K")).unwrap() == bytes, "a read returns the live object");
    assert_eq!(listed_keys(&cluster), [("K".to_owned(), bytes.len() as u64)], "and a listing shows it");
}

#[test]
fn a_failed_put_after_a_delete_does_not_bring_the_key_back_to_listings() {
    let cluster = Cluster::start(Shape::default());
    let (_, _) = acknowledged_object(&cluster, 100_000);
    let client = cluster.client();
    block_on(client.delete("bkt", "K")).unwrap();
    let map = client.map().clone();
    let probe = hand_meta(&map, "bkt", "K", VersionId { unix_ns: 1, writer: 1 }, 0);
    let marker = drive_versions(&cluster, 0, &probe).current.expect("the delete's marker");
    assert!(marker.deleted);
    // A PUT after the delete committed on two drives, then failed; its rollback missed them.
    let leftover = hand_meta(&map, "bkt", "K", later(marker.version, 1), 50_000);
    leave_on(&cluster, &[3, 4], &leftover);
    let read = block_on(client.head("bkt", "K")).unwrap_err();
    assert!(matches!(read, client::Error::NotFound { .. }), "a read finds the key deleted: {read}");
    assert_eq!(listed_keys(&cluster), [], "the listing agrees");
}

#[test]
fn repair_does_not_spread_a_write_before_it_is_known_acknowledged() {
    // 4+2, W = 5. An overwrite V of X skipped position 5 (down when the writer connected), so
    // its commit carries position 5 as missing; it applied on positions 0-3, position 4 refused
    // it, and the writer rolled it back. Between the commit and the rollback, the holders must
    // not rebuild V onto position 5 (nor finalize it there: that floor would hide X for ever).
    let cluster = Cluster::start(Shape::default());
    let (bytes, version) = acknowledged_object(&cluster, 300_000);
    let map = cluster.client().map().clone();
    let overwrite = hand_meta(&map, "bkt", "K", later(version, 1), 100_000);
    for position in 0..4 {
        let commit = |drive| Request::Commit {
            drive,
            meta: overwrite.clone(),
            missing_positions: vec![5],
            condition: CommitCondition::None,
        };
        let answer = hand_stage_and_send(&cluster, position, &overwrite, commit);
        assert!(matches!(answer, Response::Committed { .. }), "{answer:?}");
    }
    // Long enough for the designated holder (position 0, at once) to have repaired it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline
        && !drive_versions(&cluster, 5, &overwrite).all().any(|m| m.version == overwrite.version)
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    let at_5 = drive_versions(&cluster, 5, &overwrite);
    for position in 0..4 {
        hand_rollback(&cluster, position, &overwrite);
    }
    assert!(
        at_5.all().all(|m| m.version != overwrite.version) && at_5.finalized.is_none_or(|f| f < overwrite.version),
        "position 5 got the unacknowledged overwrite from repair: {at_5:?}"
    );
    assert!(block_on(cluster.client().get("bkt", "K")).unwrap() == bytes, "X stays readable");
    assert_eq!(listed_keys(&cluster), [("K".to_owned(), bytes.len() as u64)]);
}

/// Which replies a [`CommitReplyDropper`] drops once it has passed a `Commit` toward its node.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dropping {
    /// That connection's: the commit's reply and whatever follows on it.
    Connection,
    /// Every connection's, from then on: the node looks hung to the writer.
    Node,
}

/// A TCP relay in front of a node that reads the node protocol's frames toward it and, once
/// armed, drops what the node answers after a `Commit`: the commit applies, its reply is lost.
struct CommitReplyDropper {
    addr: SocketAddr,
    armed: Arc<AtomicBool>,
    commits_cut: Arc<AtomicUsize>,
}

impl CommitReplyDropper {
    fn new(target: SocketAddr, dropping: Dropping) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let armed = Arc::new(AtomicBool::new(false));
        let commits_cut = Arc::new(AtomicUsize::new(0));
        let node_silent = Arc::new(AtomicBool::new(false));
        let (armed_, cut_) = (Arc::clone(&armed), Arc::clone(&commits_cut));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(node) = TcpStream::connect(target) else { continue };
                let silent = Arc::new(AtomicBool::new(false));
                let (mut from_client, mut to_node) = (client.try_clone().unwrap(), node.try_clone().unwrap());
                let (armed, cut, conn_silent, node_wide) =
                    (Arc::clone(&armed_), Arc::clone(&cut_), Arc::clone(&silent), Arc::clone(&node_silent));
                std::thread::spawn(move || {
                    pass_toward_node(&mut from_client, &mut to_node, || {
                        if armed.load(Ordering::SeqCst) {
                            // Before the commit goes on: its reply must not slip through.
                            conn_silent.store(true, Ordering::SeqCst);
                            if dropping == Dropping::Node {
                                node_wide.store(true, Ordering::SeqCst);
                            }
                            cut.fetch_add(1, Ordering::SeqCst);
                        }
                        true
                    });
                });
                let (mut from_node, mut to_client) = (node, client);
                let node_wide = Arc::clone(&node_silent);
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 64 << 10];
                    while let Ok(read @ 1..) = from_node.read(&mut buf) {
                        if silent.load(Ordering::SeqCst) || node_wide.load(Ordering::SeqCst) {
                            continue;
                        }
                        if to_client.write_all(&buf[..read]).is_err() {
                            break;
                        }
                    }
                    let _ = to_client.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        Self { addr, armed, commits_cut }
    }
}

/// Passes a client's frames (and the raw bytes after a `ChunkWrite`) on to its node until either
/// side ends; before each `Commit` it calls `on_commit`, which may hold it, and which stops the
/// relay by answering false. Then shuts the node's side down.
fn pass_toward_node(from_client: &mut TcpStream, to_node: &mut TcpStream, mut on_commit: impl FnMut() -> bool) {
    while let Some(frame) = read_frame_toward_node(from_client) {
        if frame.commit && !on_commit() {
            break;
        }
        if to_node.write_all(&frame.bytes).is_err() {
            break;
        }
        if let Some(len) = frame.data_len {
            let mut data = vec![0u8; len];
            if from_client.read_exact(&mut data).is_err() || to_node.write_all(&data).is_err() {
                break;
            }
        }
    }
    let _ = to_node.shutdown(std::net::Shutdown::Both);
}

/// A frame a client sent toward a node.
struct FrameTowardNode {
    /// The whole frame: header, body, tag.
    bytes: Vec<u8>,
    /// Whether it is a `Commit`.
    commit: bool,
    /// The request, decoded.
    request: Option<Request>,
    /// The length of the raw bytes that follow it (a `ChunkWrite`'s).
    data_len: Option<usize>,
}

/// The next frame a client sends a node; `None` when the connection ended.
fn read_frame_toward_node(stream: &mut TcpStream) -> Option<FrameTowardNode> {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    stream.read_exact(&mut header).ok()?;
    let decoded = FrameHeader::decode(&header).ok()?;
    let tag = if decoded.kind == FrameKind::Request { FRAME_TAG_BYTES } else { 0 };
    let mut rest = vec![0u8; decoded.body_len + tag];
    stream.read_exact(&mut rest).ok()?;
    let mut frame = header.to_vec();
    frame.extend_from_slice(&rest);
    let request =
        if decoded.kind == FrameKind::Request { proto::decode_request(&rest[..decoded.body_len]).ok() } else { None };
    Some(FrameTowardNode {
        bytes: frame,
        commit: matches!(request, Some(Request::Commit { .. })),
        data_len: match request {
            Some(Request::ChunkWrite { len, .. }) => Some(len as usize),
            _ => None,
        },
        request,
    })
}

/// A client of `cluster` that reaches the nodes at positions 4 and 5 of `bkt/K`'s set through
/// commit-reply droppers (not armed yet), with a 3 s request timeout.
fn client_losing_replies_of_two(cluster: &Cluster, dropping: Dropping) -> (client::Client, Vec<CommitReplyDropper>) {
    let text = std::fs::read_to_string(&cluster.config).unwrap();
    let mut map = cluster::ClusterMap::from_toml(&text, &cluster.data_dir()).unwrap();
    let set = map.sets[map.placement_in(0, "bkt", "K").set_idx].drives.clone();
    let mut droppers = Vec::new();
    for position in [4, 5] {
        let node = &mut map.nodes[set[position].node_idx];
        let dropper = CommitReplyDropper::new(node.addr, dropping);
        node.addr = dropper.addr;
        droppers.push(dropper);
    }
    let options = client::ClientOptions {
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(3),
        ..client::ClientOptions::default()
    };
    (client::Client::new(map, options).unwrap(), droppers)
}

/// `bkt/K` acknowledged, then overwritten by a writer that loses the commit replies of the
/// drives at positions 4 and 5 as `dropping` says: the cluster, the overwrite's bytes, and what
/// the writer answered. Checks that both replies were really cut.
fn overwrite_losing_two_replies(dropping: Dropping) -> (Cluster, Vec<u8>, Result<client::ObjectInfo, client::Error>) {
    let cluster = Cluster::start(Shape::default());
    let (_, _) = acknowledged_object(&cluster, 100_000);
    let (writer, droppers) = client_losing_replies_of_two(&cluster, dropping);
    droppers.iter().for_each(|d| d.armed.store(true, Ordering::SeqCst));
    let overwrite = payload(200_000, 9);
    let answer = block_on(writer.put_bytes("bkt", "K", &overwrite, &Default::default()));
    assert!(droppers.iter().all(|d| d.commits_cut.load(Ordering::SeqCst) >= 1), "both commits' replies were cut");
    (cluster, overwrite, answer)
}

#[test]
fn a_write_whose_commit_replies_were_lost_is_not_rolled_back() {
    // All six drives apply the overwrite; the replies of two are lost and those two nodes then
    // answer nothing: the writer hears four, W = 5. Four plus two that may have applied reach
    // W, so it must not roll back (the version may have been read, or finalized by a scrubber,
    // whose floor would then hide X): it fails saying the write may still take effect.
    let (cluster, overwrite, answer) = overwrite_losing_two_replies(Dropping::Node);
    let text = answer.unwrap_err().to_string();
    assert!(text.contains("4 of 6 drives accepted it"), "{text}");
    assert!(text.contains("may still take effect"), "the error says the outcome is unknown: {text}");
    // Not rolled back: all six hold it, and every reader gets it.
    let reader = cluster.client();
    assert!(block_on(reader.get("bkt", "K")).unwrap() == overwrite, "the overwrite stands");
    assert_eq!(listed_keys(&cluster), [("K".to_owned(), overwrite.len() as u64)]);
}

#[test]
fn a_writer_that_lost_two_commit_replies_asks_those_drives_and_acknowledges() {
    // The same lost replies, but the two nodes answer a fresh request: the writer asks them
    // whether they hold the version before it decides, finds W holders and acknowledges.
    let (cluster, overwrite, answer) = overwrite_losing_two_replies(Dropping::Connection);
    let info = answer.unwrap();
    assert_eq!(info.meta_positions, [0, 1, 2, 3, 4, 5], "all six hold it");
    assert!(block_on(cluster.client().get("bkt", "K")).unwrap() == overwrite);
}

#[test]
fn a_failed_writes_leftover_is_collected_and_then_the_bucket_can_be_removed() {
    // A failed first PUT left on two drives (its rollback never reached them): no read takes
    // it, and the scrubber, once it has watched it long enough, removes it as its writer's
    // rollback would have. On 2862b84 nothing did: `tessera rb` refused the bucket for ever.
    let shape = Shape { scrub_interval: "1s", leftover_gc_after: "2s", ..Shape::default() };
    let cluster = Cluster::start(shape);
    let client = cluster.client();
    block_on(client.make_bucket("bkt")).unwrap();
    let map = client.map().clone();
    let leftover = hand_meta(&map, "bkt", "K", VersionId { unix_ns: 1_000_000_000, writer: 3 }, 100_000);
    leave_on(&cluster, &[0, 1], &leftover);
    let held = |position| drive_versions(&cluster, position, &leftover).all().any(|m| m.version == leftover.version);
    let deadline = Instant::now() + Duration::from_secs(30);
    while held(0) || held(1) {
        assert!(Instant::now() < deadline, "the leftover is still there");
        std::thread::sleep(Duration::from_millis(200));
    }
    let logs: String = (0..6).map(|i| cluster.log(i)).collect();
    assert!(logs.contains("a failed write's leftover collected"), "{logs}");
    cluster.cli_ok(&["rb", "bkt"]);
}

#[test]
fn a_leftover_over_an_acknowledged_version_is_collected_and_the_version_stays() {
    let shape = Shape { scrub_interval: "1s", leftover_gc_after: "2s", ..Shape::default() };
    let cluster = Cluster::start(shape);
    let (bytes, version) = acknowledged_object(&cluster, 100_000);
    let map = cluster.client().map().clone();
    let leftover = hand_meta(&map, "bkt", "K", later(version, 1), 50_000);
    leave_on(&cluster, &[2, 3], &leftover);
    let deadline = Instant::now() + Duration::from_secs(30);
    while [2, 3]
        .iter()
        .any(|&p| drive_versions(&cluster, p, &leftover).current.is_some_and(|c| c.version == leftover.version))
    {
        assert!(Instant::now() < deadline, "the leftover is still current");
        std::thread::sleep(Duration::from_millis(200));
    }
    for position in 0..6 {
        let current = drive_versions(&cluster, position, &leftover).current.expect("X");
        assert_eq!(current.version, version, "position {position} has X current again");
    }
    assert!(block_on(cluster.client().get("bkt", "K")).unwrap() == bytes);
}

#[test]
fn a_readable_write_of_unknown_outcome_is_completed_on_every_drive() {
    // An overwrite of X applied on exactly k = 4 drives and never acknowledged (its writer lost
    // the other commits' replies and its node then died, or its rollbacks were lost): reads
    // take it (k holders), so it must not stay with no redundancy at all. Found by checker seed
    // 5 on 7859528: such a version stayed on 4 of 6 drives for ever, the repair queue never saw
    // it (only a finalize queues) and the scrubber removed only unreadable leftovers.
    let shape = Shape { scrub_interval: "1s", leftover_gc_after: "2s", ..Shape::default() };
    let cluster = Cluster::start(shape);
    let (_, version) = acknowledged_object(&cluster, 100_000);
    let map = cluster.client().map().clone();
    let unknown = hand_meta(&map, "bkt", "K", later(version, 1), 50_000);
    leave_on(&cluster, &[0, 1, 2, 3], &unknown);
    assert!(block_on(cluster.client().get("bkt", "K")).unwrap() == vec![0u8; 50_000], "a read takes it already");
    let deadline = Instant::now() + Duration::from_secs(60);
    let everywhere = || {
        (0..6).all(|p| {
            let held = drive_versions(&cluster, p, &unknown);
            held.current.is_some_and(|c| c.version == unknown.version) && held.finalized == Some(unknown.version)
        })
    };
    while !everywhere() {
        assert!(Instant::now() < deadline, "the readable version was not completed on all six drives");
        std::thread::sleep(Duration::from_millis(200));
    }
    let logs: String = (0..6).map(|i| cluster.log(i)).collect();
    assert!(logs.contains("a readable write of unknown outcome completed"), "{logs}");
    // Complete: any two drives may go now.
    let observer = cluster.observer();
    assert_eq!(block_on(observer.head("bkt", "K")).unwrap().meta_positions, [0, 1, 2, 3, 4, 5]);
    assert!(block_on(cluster.client().get("bkt", "K")).unwrap() == vec![0u8; 50_000]);
}

/// What a [`FaultRelay`] does to the frames a writer sends its node.
#[derive(Clone, Copy, PartialEq, Eq)]
enum RelayFault {
    /// Before passing a `Commit` on, fences its version on the node (a rollback on a session of
    /// its own), so the node refuses the commit: a definite refusal.
    RefuseCommits,
    /// Breaks the connection at the first `Rollback` (which never reaches the node).
    LoseRollbacks,
}

/// A TCP relay in front of a node that applies a [`RelayFault`] to the writer's frames.
struct FaultRelay {
    addr: SocketAddr,
    /// Frames the fault struck.
    struck: Arc<AtomicUsize>,
}

impl FaultRelay {
    fn new(target: SocketAddr, secret: String, fault: RelayFault) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let struck = Arc::new(AtomicUsize::new(0));
        let struck_ = Arc::clone(&struck);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(node) = TcpStream::connect(target) else { continue };
                let (mut from_client, mut to_node) = (client.try_clone().unwrap(), node.try_clone().unwrap());
                let (struck, secret) = (Arc::clone(&struck_), secret.clone());
                std::thread::spawn(move || {
                    while let Some(frame) = read_frame_toward_node(&mut from_client) {
                        match (&frame.request, fault) {
                            (Some(Request::Commit { drive, meta, .. }), RelayFault::RefuseCommits) => {
                                let rollback = Request::Rollback {
                                    drive: *drive,
                                    bucket: meta.bucket.clone(),
                                    key: meta.key.clone(),
                                    version: meta.version,
                                };
                                let answer = RawSession::open(target, &secret).call(&rollback);
                                assert!(matches!(answer, Response::Ok), "fenced: {answer:?}");
                                struck.fetch_add(1, Ordering::SeqCst);
                            }
                            (Some(Request::Rollback { .. }), RelayFault::LoseRollbacks) => {
                                struck.fetch_add(1, Ordering::SeqCst);
                                break;
                            }
                            _ => {}
                        }
                        if to_node.write_all(&frame.bytes).is_err() {
                            break;
                        }
                        if let Some(len) = frame.data_len {
                            let mut data = vec![0u8; len];
                            if from_client.read_exact(&mut data).is_err() || to_node.write_all(&data).is_err() {
                                break;
                            }
                        }
                    }
                    let _ = to_node.shutdown(std::net::Shutdown::Both);
                    let _ = from_client.shutdown(std::net::Shutdown::Both);
                });
                let (mut from_node, mut to_client) = (node, client);
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from_node, &mut to_client);
                    let _ = to_client.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        Self { addr, struck }
    }
}

#[test]
fn a_failed_write_whose_rollbacks_were_lost_says_its_outcome_is_unknown_and_is_completed() {
    // Four drives apply the overwrite, two refuse it (4 < W = 5, nothing unanswered: a failed
    // write), and every rollback to the four is lost: four drives still hold it, which a read
    // takes. On 7859528 the writer answered as for a write rolled back ("4 of 6 drives accepted
    // it", nothing that says it may take effect) while reads returned it: a failed write shown.
    // Now it says the outcome is unknown, and the scrubber completes the version.
    let shape = Shape { scrub_interval: "1s", leftover_gc_after: "2s", ..Shape::default() };
    let cluster = Cluster::start(shape);
    let (_, _) = acknowledged_object(&cluster, 100_000);
    let text = std::fs::read_to_string(&cluster.config).unwrap();
    let mut map = cluster::ClusterMap::from_toml(&text, &cluster.data_dir()).unwrap();
    let set = map.sets[map.placement_in(0, "bkt", "K").set_idx].drives.clone();
    let mut relays = Vec::new();
    for (position, drive) in set.iter().enumerate() {
        let fault = if position >= 4 { RelayFault::RefuseCommits } else { RelayFault::LoseRollbacks };
        let node = &mut map.nodes[drive.node_idx];
        let relay = FaultRelay::new(node.addr, secret_of(&cluster), fault);
        node.addr = relay.addr;
        relays.push(relay);
    }
    let options = client::ClientOptions {
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(3),
        ..client::ClientOptions::default()
    };
    let writer = client::Client::new(map, options).unwrap();
    let overwrite = payload(60_000, 4);
    let text = block_on(writer.put_bytes("bkt", "K", &overwrite, &Default::default())).unwrap_err().to_string();
    let struck: Vec<usize> = relays.iter().map(|r| r.struck.load(Ordering::SeqCst)).collect();
    assert_eq!(struck, [1, 1, 1, 1, 1, 1], "two commits refused, four rollbacks lost");
    assert!(text.contains("4 of 6 drives accepted it"), "{text}");
    assert!(text.contains("may still take effect"), "the error says the outcome is unknown: {text}");
    assert!(block_on(cluster.client().get("bkt", "K")).unwrap() == overwrite, "a read takes it");
    let observer = cluster.observer();
    let deadline = Instant::now() + Duration::from_secs(60);
    while block_on(observer.head("bkt", "K")).map_or(true, |i| i.meta_positions.len() < 6) {
        assert!(Instant::now() < deadline, "the version was not completed on all six drives");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(block_on(cluster.client().get("bkt", "K")).unwrap() == overwrite);
}

#[test]
fn a_target_back_after_the_designated_wait_is_repaired_by_one_holder() {
    // Position 5's node is down for longer than the designated holder's head start (30 s):
    // when it returns, the designated holder repairs it and the others, seeing it answer,
    // leave it alone. On 2862b84 every holder past the wait repaired it at once.
    let mut cluster = Cluster::start(Shape::default());
    let client = cluster.client();
    block_on(client.make_bucket("bkt")).unwrap();
    let map = client.map().clone();
    let set = map.sets[map.placement_in(0, "bkt", "K").set_idx].drives.clone();
    cluster.kill_node(set[5].node_idx);
    let info = block_on(async {
        let info = client.put_bytes("bkt", "K", &payload(300_000, 5), &Default::default()).await.unwrap();
        client.settle().await;
        info
    });
    assert_eq!(info.meta_positions, [0, 1, 2, 3, 4]);
    std::thread::sleep(Duration::from_secs(33));
    cluster.restart_node(set[5].node_idx);
    let observer = cluster.observer();
    let deadline = Instant::now() + Duration::from_secs(30);
    while block_on(observer.head("bkt", "K")).map_or(true, |i| i.meta_positions.len() < 6) {
        assert!(Instant::now() < deadline, "position 5 was not repaired");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Give any other holder the time it would take to start too.
    std::thread::sleep(Duration::from_secs(3));
    let version = info.meta.version.to_hex();
    let repairs: usize = set[..5]
        .iter()
        .map(|d| cluster.log(d.node_idx).lines().filter(|l| l.contains("repaired") && l.contains(&version)).count())
        .sum();
    assert_eq!(repairs, 1, "exactly one holder repaired position 5");
}

/// A commit a [`CommitGate`] holds: whose, at which set position, how to let it go, and
/// whether the node's answer to it has passed back.
struct HeldCommit {
    writer: usize,
    position: usize,
    release: std::sync::mpsc::Sender<()>,
    answered: Arc<AtomicBool>,
}

/// A TCP relay in front of one node for one writer that holds every `Commit` toward the node
/// until the test releases it: the test chooses the order in which two writers' commits reach
/// each drive.
struct CommitGate {
    addr: SocketAddr,
}

impl CommitGate {
    fn new(target: SocketAddr, writer: usize, position: usize, held: Arc<std::sync::Mutex<Vec<HeldCommit>>>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(node) = TcpStream::connect(target) else { continue };
                let awaiting: Arc<std::sync::Mutex<Option<Arc<AtomicBool>>>> = Arc::default();
                let (mut from_client, mut to_node) = (client.try_clone().unwrap(), node.try_clone().unwrap());
                let (held, awaiting_) = (Arc::clone(&held), Arc::clone(&awaiting));
                std::thread::spawn(move || {
                    pass_toward_node(&mut from_client, &mut to_node, || {
                        let (release, released) = std::sync::mpsc::channel();
                        let answered = Arc::new(AtomicBool::new(false));
                        *awaiting_.lock().unwrap() = Some(Arc::clone(&answered));
                        held.lock().unwrap().push(HeldCommit { writer, position, release, answered });
                        released.recv().is_ok()
                    });
                });
                let (mut from_node, mut to_client) = (node, client);
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 64 << 10];
                    while let Ok(read @ 1..) = from_node.read(&mut buf) {
                        if to_client.write_all(&buf[..read]).is_err() {
                            break;
                        }
                        // The connection carries one request at a time: these bytes answer
                        // the commit it last passed.
                        if let Some(answered) = awaiting.lock().unwrap().take() {
                            answered.store(true, Ordering::SeqCst);
                        }
                    }
                    let _ = to_client.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        Self { addr }
    }
}

#[test]
fn two_creators_that_disagree_about_a_drive_give_exactly_one_winner() {
    // Two PUTs with If-None-Match: * of one new key. Writer A takes the set's first drive for
    // down (its address leads nowhere), writer B reaches all six. Their commits are held at
    // every drive and let through in the order that splits the set between them: at positions
    // 2 and 3 A's first, everywhere else B's first. On 2862b84 each won its own arbiter (A
    // position 1, B position 0) and then half of the rest: both failed with 412 and no object
    // existed. Now exactly one of them wins, whatever the order.
    let cluster = Cluster::start(Shape::default());
    block_on(cluster.client().make_bucket("bkt")).unwrap();
    let text = std::fs::read_to_string(&cluster.config).unwrap();
    let base = cluster::ClusterMap::from_toml(&text, &cluster.data_dir()).unwrap();
    let set = base.sets[base.placement_in(0, "bkt", "K").set_idx].drives.clone();
    let held: Arc<std::sync::Mutex<Vec<HeldCommit>>> = Arc::default();
    let mut gates = Vec::new();
    let writers: Vec<client::Client> = (0..2)
        .map(|writer| {
            let mut map = base.clone();
            for (position, drive) in set.iter().enumerate() {
                let node = &mut map.nodes[drive.node_idx];
                if writer == 0 && position == 0 {
                    let nowhere = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
                    node.addr = nowhere; // closed when the listener drops: connections refused
                    continue;
                }
                let gate = CommitGate::new(node.addr, writer, position, Arc::clone(&held));
                node.addr = gate.addr;
                gates.push(gate);
            }
            let options = client::ClientOptions {
                connect_timeout: Duration::from_secs(1),
                request_timeout: Duration::from_secs(20),
                ..client::ClientOptions::default()
            };
            client::Client::new(map, options).unwrap()
        })
        .collect();
    let bodies = [payload(100_000, 1), payload(100_000, 2)];
    let options = client::PutOptions { condition: CommitCondition::IfAbsent, ..Default::default() };
    let answers: Vec<Result<client::ObjectInfo, client::Error>> = std::thread::scope(|scope| {
        let puts: Vec<_> = writers
            .iter()
            .zip(&bodies)
            .map(|(writer, body)| scope.spawn(|| block_on(writer.put_bytes("bkt", "K", body, &options))))
            .collect();
        // The scheduler: once no new commit has arrived for a while, let the held ones go,
        // per position in the splitting order, the second writer's only after the drive
        // answered the first's.
        let mut seen = 0;
        let mut quiet_since = Instant::now();
        let mut rounds = 0;
        while puts.iter().any(|put| !put.is_finished()) {
            std::thread::sleep(Duration::from_millis(50));
            let pending = held.lock().unwrap().len();
            if pending != seen {
                (seen, quiet_since) = (pending, Instant::now());
                continue;
            }
            if pending == 0 || quiet_since.elapsed() < Duration::from_millis(500) {
                continue;
            }
            rounds += 1;
            assert!(rounds < 50, "the writers keep committing");
            let mut batch: Vec<HeldCommit> = std::mem::take(&mut *held.lock().unwrap());
            seen = 0;
            let first = |c: &HeldCommit| if matches!(c.position, 2 | 3) { c.writer == 0 } else { c.writer == 1 };
            batch.sort_by_key(|c| !first(c));
            let (firsts, seconds): (Vec<HeldCommit>, Vec<HeldCommit>) = {
                let mut positions_first = std::collections::HashSet::new();
                batch.into_iter().partition(|c| positions_first.insert(c.position))
            };
            for commit in &firsts {
                let _ = commit.release.send(());
            }
            let deadline = Instant::now() + Duration::from_secs(20);
            while !firsts.iter().all(|c| c.answered.load(Ordering::SeqCst)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            for commit in &seconds {
                let _ = commit.release.send(());
            }
        }
        puts.into_iter().map(|put| put.join().unwrap()).collect()
    });
    let won: Vec<usize> = (0..2).filter(|&w| answers[w].is_ok()).collect();
    assert_eq!(
        won.len(),
        1,
        "exactly one creator wins: {:?}",
        answers.iter().map(|a| a.as_ref().err().map(ToString::to_string)).collect::<Vec<_>>()
    );
    let loser = 1 - won[0];
    assert!(
        matches!(answers[loser], Err(client::Error::PreconditionFailed { .. })),
        "the other is told the key exists: {:?}",
        answers[loser].as_ref().err().map(ToString::to_string)
    );
    assert!(block_on(cluster.client().get("bkt", "K")).unwrap() == bodies[won[0]], "the winner's object is there");
    assert_eq!(listed_keys(&cluster), [("K".to_owned(), 100_000)]);
}

#[test]
fn a_version_a_get_chose_stays_readable_while_a_hot_key_is_overwritten() {
    // A GET chooses `first` (its metadata round) and reads its chunks a moment later; in
    // between the key is overwritten and acknowledged ten times. Past 8 settled versions a
    // drive drops the oldest rows early; on 2862b84 their data files went with them and the
    // GET's chunk reads found every drive Missing (issue 37, item 7). The rows still go (no new
    // reader chooses them), the files stay until the retire grace (10 minutes here) ends.
    let cluster = Cluster::start(Shape::default());
    let (_, first) = acknowledged_object(&cluster, 100_000);
    let client = cluster.client();
    for i in 0..10 {
        block_on(client.put_bytes("bkt", "K", &payload(100_000, 10 + i), &Default::default())).unwrap();
    }
    let map = client.map().clone();
    let set = map.sets[map.placement_in(0, "bkt", "K").set_idx].drives.clone();
    let meta = hand_meta(&map, "bkt", "K", first, 100_000);
    let rows_gone = (0..6).filter(|&p| drive_versions(&cluster, p, &meta).all().all(|m| m.version != first)).count();
    assert!(rows_gone >= 4, "the per-key bound dropped the first version's rows early ({rows_gone} of 6 drives)");
    for (position, drive) in set.iter().enumerate() {
        let mut session = RawSession::open(cluster.addrs[drive.node_idx], &secret_of(&cluster));
        let item = proto::ReadItem { drive: drive.drive_idx as u32, version: first, offset: 0, len: 1 };
        let answer = session.call(&Request::Read { items: vec![item] });
        assert_eq!(
            answer,
            Response::Read { statuses: vec![proto::ItemStatus::Ok] },
            "position {position}: the chosen version's chunk is still there for the GET reading it"
        );
    }
}
