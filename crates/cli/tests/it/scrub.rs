//! Scrubbing and drive rebuild on a real cluster: damage nobody reads is found and repaired, a
//! drive restored from an old copy catches up, and a wiped or replaced drive is rebuilt in full
//! while readers skip it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::harness::{Cluster, Shape, block_on, payload};

/// The chunk file of `key`'s current version on node `idx`.
fn chunk_file(cluster: &Cluster, idx: usize, key: &str) -> PathBuf {
    let info = block_on(cluster.client().head("bkt", key)).unwrap();
    let name = info.meta.version.to_hex();
    cluster
        .data_files(idx)
        .into_iter()
        .find(|f| f.file_name().is_some_and(|n| n.to_string_lossy() == name))
        .unwrap_or_else(|| panic!("n{} holds no chunk file of {key}", idx + 1))
}

/// Polls `done` every 200 ms for at most 90 s.
fn wait_for(cluster: &Cluster, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what}: not within 90 s\n{}",
            cluster.cli(&["repair", "status"]).stdout_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

trait StdoutText {
    fn stdout_text(&self) -> String;
}

impl StdoutText for std::process::Output {
    fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

fn put_all(cluster: &Cluster, objects: &[(String, Vec<u8>)]) {
    let client = cluster.client();
    block_on(async {
        for (key, data) in objects {
            client.put_bytes("bkt", key, data, &Default::default()).await.unwrap();
        }
    });
}

/// Every object reads back byte-exact with nodes `down` killed (so the others' chunks, the
/// repaired ones among them, are needed).
fn assert_readable_without(cluster: &mut Cluster, down: [usize; 2], objects: &[(String, Vec<u8>)]) {
    for idx in down {
        cluster.kill_node(idx);
    }
    let client = cluster.client();
    block_on(async {
        for (key, data) in objects {
            assert!(client.get("bkt", key).await.unwrap() == *data, "{key}");
        }
    });
}

#[test]
fn scrub_finds_missing_short_corrupt_and_stale_chunks_and_repair_restores_them() {
    // Every pass deep (the deep interval has passed by the first pass).
    let shape = Shape { scrub_interval: "1s", deep_scrub_interval: "1s", ..Shape::default() };
    let mut cluster = Cluster::start(shape);
    cluster.cli_ok(&["mb", "bkt"]);
    let objects: Vec<(String, Vec<u8>)> =
        ["a", "b", "c", "d"].iter().enumerate().map(|(i, k)| (k.to_string(), payload(600_000, i as u64))).collect();
    put_all(&cluster, &objects[..3]);
    put_while_n5_sleeps(&mut cluster, &objects[3..]);
    // Observers from here on: a reader's hint would repair d before the scrubber finds it.
    assert_eq!(block_on(cluster.observer().head("bkt", "d")).unwrap().meta_positions.len(), 5, "n5 lacks d");
    // Damage nobody reads: a missing, a short and a bit-flipped chunk file.
    let (missing, short, flipped) =
        (chunk_file(&cluster, 1, "a"), chunk_file(&cluster, 2, "b"), chunk_file(&cluster, 3, "c"));
    let originals: Vec<(PathBuf, Vec<u8>)> =
        [&missing, &short, &flipped].iter().map(|f| ((*f).clone(), std::fs::read(f).unwrap())).collect();
    std::fs::remove_file(&missing).unwrap();
    let half = originals[1].1.len() / 2;
    std::fs::write(&short, &originals[1].1[..half]).unwrap();
    let mut bytes = originals[2].1.clone();
    bytes[1000] ^= 0x10;
    std::fs::write(&flipped, &bytes).unwrap();
    wait_for(&cluster, "the scrubber finds and repair restores every damaged chunk", || {
        originals.iter().all(|(file, original)| std::fs::read(file).is_ok_and(|now| now == *original))
            && block_on(cluster.observer().head("bkt", "d")).is_ok_and(|info| info.meta_positions.len() == 6)
    });
    let logs: String = (0..6).map(|i| cluster.log(i)).collect();
    for what in
        ["data file missing", "data file short", "block checksum mismatch", "drives without the current version"]
    {
        assert!(logs.contains(what), "the scrubber reported {what:?}");
    }
    let status = cluster.cli_ok(&["repair", "status", "--json"]);
    assert!(status.contains("\"deep_passes\":") && !status.contains("\"deep_passes\":0,"), "{status}");
    assert!(cluster.cli_ok(&["repair", "status"]).contains("scrub: "));
    // n2, n3 and n4 hold repaired chunks; with n1 and n6 down every read needs them and n5's d.
    assert_readable_without(&mut cluster, [0, 5], &objects);
}

#[test]
fn a_reader_that_meets_a_drive_without_the_version_queues_its_repair() {
    // Scrubbing hourly: only the reader's hint can repair within the test.
    let mut cluster = Cluster::start(Shape::default());
    cluster.cli_ok(&["mb", "bkt"]);
    let object = ("d".to_string(), payload(300_000, 4));
    put_while_n5_sleeps(&mut cluster, std::slice::from_ref(&object));
    std::thread::sleep(Duration::from_secs(2));
    let observed = block_on(cluster.observer().head("bkt", "d")).unwrap();
    assert_eq!(observed.meta_positions.len(), 5, "n5 lacks d, and nothing repairs it unasked");
    // One metadata read by a hinting client: the GET plans around n5 and a holder queues n5's repair.
    assert!(block_on(cluster.client().get("bkt", "d")).unwrap() == object.1);
    wait_for(&cluster, "the hinted repair restores d on n5", || {
        block_on(cluster.observer().head("bkt", "d")).is_ok_and(|info| info.meta_positions.len() == 6)
    });
    let logs: String = (0..6).map(|i| cluster.log(i)).collect();
    assert!(logs.contains("a reader found chunks missing or corrupt; queued for repair"), "{logs}");
    assert!(!logs.contains("drives without the current version"), "the scrubber did not find it first");
    assert_readable_without(&mut cluster, [0, 5], std::slice::from_ref(&object));
}

/// Writes `objects`, then restores n5's drive from a copy taken before: n5 slept through the
/// writes, and since it acknowledged them, no node queued their repair.
fn put_while_n5_sleeps(cluster: &mut Cluster, objects: &[(String, Vec<u8>)]) {
    cluster.kill_node(4);
    let drive = cluster.drive_dir(4, 0);
    let backup = cluster.dir.path().join("n5-backup");
    copy_dir(&drive, &backup);
    cluster.start_node(4);
    cluster.wait_ready();
    put_all(cluster, objects);
    cluster.kill_node(4);
    std::fs::remove_dir_all(&drive).unwrap();
    copy_dir(&backup, &drive);
    cluster.start_node(4);
    cluster.wait_ready();
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    let status = std::process::Command::new("cp").arg("-a").arg(from).arg(to).status().unwrap();
    assert!(status.success(), "cp -a {} {}", from.display(), to.display());
}

/// Kills n2, empties its drive directory (a new disk) and restarts it; returns once it has
/// formatted the drive and taken the repair settings (its first drive held them) from a peer.
fn wipe_n2_and_restart(cluster: &mut Cluster) {
    cluster.kill_node(1);
    let drive = cluster.drive_dir(1, 0);
    for entry in std::fs::read_dir(&drive).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) }.unwrap();
    }
    cluster.start_node(1);
    cluster.wait_ready();
    assert!(cluster.log(1).contains("empty drive directory: formatted"), "{}", cluster.log(1));
    wait_for(cluster, "n2 takes the repair settings from a peer", || {
        cluster.log(1).contains("repair settings taken from a peer")
    });
}

#[test]
fn a_wiped_drive_is_rebuilt_from_its_set_and_readers_skip_it_meanwhile() {
    let mut cluster = Cluster::start(Shape::default());
    cluster.cli_ok(&["mb", "bkt"]);
    let mut objects: Vec<(String, Vec<u8>)> =
        (0..6).map(|i| (format!("obj-{i}"), payload(50_000 + i * 150_000, i as u64))).collect();
    put_all(&cluster, &objects);
    objects[0].1 = payload(333_333, 99); // an overwrite: the rebuild takes the newest version
    put_all(&cluster, &objects[..1]);
    let client = cluster.client();
    block_on(async {
        client.put_bytes("bkt", "gone", b"deleted before the wipe", &Default::default()).await.unwrap();
        client.delete("bkt", "gone").await.unwrap();
    });
    // Hold the rebuild so what readers do meanwhile can be seen.
    cluster.cli_ok(&["repair", "pause"]);
    // Its first drive held the repair settings: it takes "paused" from a peer.
    wipe_n2_and_restart(&mut cluster);
    let status = cluster.cli_ok(&["repair", "status", "--json"]);
    assert!(status.lines().any(|l| l.contains("\"node\":\"n2\"") && l.contains("\"rebuilding\":true")), "{status}");
    // Readers skip n2: it is not counted as a drive without the objects, and with n3 down too
    // every object is still read from the other four.
    cluster.kill_node(2);
    let reader = cluster.client();
    block_on(async {
        for (key, data) in &objects {
            let info = reader.head("bkt", key).await.unwrap();
            assert_eq!(info.meta_positions.len(), 4, "{key}: n2 (rebuilding) and n3 (down) are skipped");
            assert!(reader.get("bkt", key).await.unwrap() == *data, "{key} while n2 rebuilds");
        }
        assert!(matches!(reader.get("bkt", "gone").await, Err(client::Error::NotFound { .. })));
    });
    cluster.start_node(2);
    cluster.wait_ready();
    cluster.cli_ok(&["repair", "resume"]);
    wait_for(&cluster, "n2 rebuilt", || {
        let status = cluster.cli(&["repair", "status", "--json"]).stdout_text();
        status.lines().any(|l| l.contains("\"node\":\"n2\"") && l.contains("\"rebuilding\":false"))
    });
    assert!(cluster.log(1).contains("drive rebuilt"));
    block_on(async {
        for (key, _) in &objects {
            assert_eq!(cluster.client().head("bkt", key).await.unwrap().meta_positions.len(), 6, "{key}");
        }
    });
    // The delete survived the rebuild, and n2's rebuilt chunks serve reads.
    assert_readable_without(&mut cluster, [0, 2], &objects);
    assert!(matches!(block_on(cluster.client().get("bkt", "gone")), Err(client::Error::NotFound { .. })));
}

#[test]
fn drive_replace_wipes_and_rebuilds_and_refuses_unknown_nodes_and_drives() {
    let mut cluster = Cluster::start(Shape::default());
    cluster.cli_ok(&["mb", "bkt"]);
    let objects: Vec<(String, Vec<u8>)> = (0..4).map(|i| (format!("obj-{i}"), payload(400_000, i as u64))).collect();
    put_all(&cluster, &objects);
    let before = cluster.data_files(2).len();
    for (args, expected) in [
        (["--node", "n9", "--drive", "1"], "unknown node \"n9\""),
        (["--node", "n3", "--drive", "2"], "node n3 has 1 drive (1 to 1), not drive 2"),
        (["--node", "n3", "--drive", "0"], "--drive"),
    ] {
        let err = cluster.cli_err(&[&["drive", "replace"][..], &args[..]].concat());
        assert!(err.contains(expected), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().filter(|l| l.starts_with("error")).count(), 1, "one error line: {err}");
    }
    assert_eq!(cluster.data_files(2).len(), before, "a refused replace changes nothing");
    let out = cluster.cli_ok(&["drive", "replace", "--node", "n3", "--drive", "1"]);
    assert!(out.contains("rebuilding"), "{out}");
    assert!(cluster.log(2).contains("drive replaced: wiped"));
    wait_for(&cluster, "n3 rebuilt", || {
        let status = cluster.cli(&["repair", "status", "--json"]).stdout_text();
        status.lines().any(|l| l.contains("\"node\":\"n3\"") && l.contains("\"rebuilding\":false"))
            && cluster.log(2).contains("drive rebuilt")
    });
    assert_eq!(cluster.data_files(2).len(), before, "n3 holds a chunk of every object again");
    assert_readable_without(&mut cluster, [0, 1], &objects);
}

#[test]
fn repair_requests_for_chunks_a_node_does_not_hold_or_own_are_refused() {
    use proto::{ErrorKind, Request, Response, VersionId};
    let mut cluster = Cluster::start(Shape::default());
    cluster.cli_ok(&["mb", "bkt"]);
    put_all(&cluster, &[("obj".to_owned(), payload(100_000, 1))]);
    let info = block_on(cluster.client().head("bkt", "obj")).unwrap();
    let mut session = crate::protocol::RawSession::open(cluster.addrs[0], &crate::protocol::secret_of(&cluster));
    let hint = |version| Request::RepairHint {
        drive: 0,
        bucket: "bkt".into(),
        key: "obj".into(),
        version,
        positions: vec![1],
    };
    let refused = |answer: Response| matches!(answer, Response::Error { kind: ErrorKind::BadRequest, .. });
    let answer = session.call(&hint(VersionId { unix_ns: 1, writer: 1 }));
    assert!(refused(answer.clone()), "a hint for a version the drive does not hold: {answer:?}");
    let mut elsewhere = info.meta.clone();
    elsewhere.set_idx += 1; // metadata placed on a set this drive is not in
    let answer = session.call(&Request::RepairCommit { drive: 0, meta: elsewhere, crcs: Vec::new() });
    assert!(refused(answer.clone()), "a repair commit for another set: {answer:?}");
    let status = cluster.cli_ok(&["repair", "status", "--json"]);
    assert!(!status.contains("\"queued_versions\":1"), "nothing was queued: {status}");
    // The version it does hold is taken.
    assert_eq!(session.call(&hint(info.meta.version)), Response::Ok);
    assert!(cluster.is_running(0));
}

#[test]
fn delete_markers_every_drive_holds_are_collected_and_the_key_stays_deleted() {
    let shape = Shape { scrub_interval: "1s", retire_grace: "1s", ..Shape::default() };
    let cluster = Cluster::start(shape);
    cluster.cli_ok(&["mb", "bkt"]);
    let client = cluster.client();
    block_on(async {
        client.put_bytes("bkt", "gone", b"deleted soon", &Default::default()).await.unwrap();
        client.delete("bkt", "gone").await.unwrap();
        client.put_bytes("bkt", "kept", b"stays", &Default::default()).await.unwrap();
    });
    wait_for(&cluster, "every drive collects the marker", || {
        let status = cluster.cli(&["repair", "status", "--json"]).stdout_text();
        let collected: u64 = status
            .split("\"markers_collected\":")
            .skip(1)
            .filter_map(|rest| rest.split(|c: char| !c.is_ascii_digit()).next()?.parse::<u64>().ok())
            .sum();
        collected >= 6
    });
    let listed = cluster.cli_ok(&["ls", "bkt"]);
    assert!(listed.contains("kept") && !listed.contains("gone"), "{listed}");
    assert!(matches!(block_on(client.get("bkt", "gone")), Err(client::Error::NotFound { .. })));
    // A write after the collection, from a client whose clock lags by a minute, still wins: the
    // marker's acknowledged floor stayed on every drive.
    let lagging = crate::durability::skewed_client(&cluster, -60);
    block_on(async {
        lagging.put_bytes("bkt", "gone", b"written again", &Default::default()).await.unwrap();
        assert_eq!(client.get("bkt", "gone").await.unwrap(), b"written again");
    });
}

#[test]
fn a_rebuild_killed_mid_page_checks_what_it_rebuilt_without_fsync_and_redoes_damaged_chunks() {
    let mut cluster = Cluster::start(Shape::default());
    cluster.cli_ok(&["mb", "bkt"]);
    let objects: Vec<(String, Vec<u8>)> = (0..24).map(|i| (format!("obj-{i:02}"), payload(1 << 20, i))).collect();
    put_all(&cluster, &objects);
    cluster.cli_ok(&["repair", "pause"]);
    wipe_n2_and_restart(&mut cluster);
    // 1 MiB/s: the 24 keys (6 MiB on n2, one page) take about 6 s.
    cluster.cli_ok(&["repair", "rate", "1MiB/s"]);
    cluster.cli_ok(&["repair", "resume"]);
    wait_for(&cluster, "n2 rebuilds some keys", || {
        let status = cluster.cli(&["repair", "status", "--json"]).stdout_text();
        status.lines().filter(|l| l.contains("\"node\":\"n2\"")).any(|l| {
            l.split("\"rebuild_keys_rebuilt\":").nth(1).and_then(|r| r.split([',', '}']).next()?.parse::<u64>().ok())
                >= Some(4)
        })
    });
    // A write the drive takes while it rebuilds: its durable commit carries the rows of the
    // keys rebuilt so far, whose data files were written without fsync.
    let fg = payload(100_000, 1000);
    block_on(cluster.client().put_bytes("bkt", "fg", &fg, &Default::default())).unwrap();
    cluster.kill_node(1);
    assert!(!cluster.log(1).contains("drive rebuilt"), "the rebuild finished before the kill");
    // Power lost instead of a process: what was not fsynced is gone. Files whose rows were lost
    // are swept at the next start; those whose rows the write carried must be checked.
    let fg_version = block_on(cluster.client().head("bkt", "fg")).unwrap().meta.version.to_hex();
    let mut torn = 0;
    for file in cluster.data_files(1) {
        if file.file_name().is_some_and(|n| n.to_string_lossy() != fg_version) {
            std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(1000).unwrap();
            torn += 1;
        }
    }
    assert!(torn >= 4, "{torn} rebuilt chunk files on n2");
    cluster.start_node(1);
    cluster.wait_ready();
    cluster.cli_ok(&["repair", "rate", "1GiB/s"]);
    wait_for(&cluster, "n2 rebuilt", || {
        let status = cluster.cli(&["repair", "status", "--json"]).stdout_text();
        status.lines().any(|l| l.contains("\"node\":\"n2\"") && l.contains("\"rebuilding\":false"))
    });
    assert!(cluster.log(1).contains("damaged; rebuilding it again"), "{}", cluster.log(1));
    let mut all = objects;
    all.push(("fg".to_owned(), fg));
    assert_readable_without(&mut cluster, [0, 2], &all);
}
