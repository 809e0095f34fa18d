//! Faults with real processes: SIGKILL, SIGSTOP, corrupted chunk files, full disks, garbage on
//! the wire, wrong secrets.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::harness::{Cluster, Shape, block_on, payload, write_file};

fn cluster_with_objects(count: usize, size: usize) -> (Cluster, Vec<Vec<u8>>) {
    let cluster = Cluster::start(Shape::default());
    let client = cluster.client();
    let objects: Vec<Vec<u8>> = (0..count).map(|i| payload(size + i * 1001, i as u64)).collect();
    block_on(async {
        client.make_bucket("bkt").await.unwrap();
        for (i, data) in objects.iter().enumerate() {
            client.put_bytes("bkt", &format!("obj-{i}"), data, &Default::default()).await.unwrap();
        }
    });
    (cluster, objects)
}

fn assert_all_readable(cluster: &Cluster, objects: &[Vec<u8>]) {
    let client = cluster.client();
    block_on(async {
        for (i, data) in objects.iter().enumerate() {
            let body = client.get("bkt", &format!("obj-{i}")).await.unwrap();
            assert!(body == *data, "obj-{i} differs");
        }
    });
}

#[test]
fn get_with_m_nodes_killed_returns_original_bytes() {
    let (mut cluster, objects) = cluster_with_objects(6, 700_000);
    cluster.kill_node(1);
    assert_all_readable(&cluster, &objects);
    cluster.kill_node(4);
    assert_all_readable(&cluster, &objects);
}

#[test]
fn get_with_more_than_m_down_says_how_many_chunks_were_missing_and_needed() {
    let (mut cluster, _) = cluster_with_objects(1, 700_000);
    for idx in [0, 2, 5] {
        cluster.kill_node(idx);
    }
    let err = cluster.cli_err(&["get", "bkt/obj-0", "-"]);
    assert!(err.contains("3 of 6 chunks reachable, 4 needed"), "{err}");
    assert!(err.contains("unreachable nodes: n1, n3, n6 (node n1 is unreachable: "), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn flipped_byte_in_a_stored_chunk_is_detected_and_read_around() {
    let (cluster, objects) = cluster_with_objects(1, 700_000);
    for idx in [0, 3] {
        for file in cluster.data_files(idx) {
            let mut bytes = std::fs::read(&file).unwrap();
            let middle = bytes.len() / 2;
            bytes[middle] ^= 0x01;
            std::fs::write(&file, bytes).unwrap();
        }
    }
    assert_all_readable(&cluster, &objects);
}

#[test]
fn node_killed_during_puts_loses_no_acknowledged_object() {
    let mut cluster = Cluster::start(Shape::default());
    block_on(async { cluster.client().make_bucket("bkt").await.unwrap() });
    let acked = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let timeline = Arc::new(Timeline::default());
    let writer = {
        let (client, acked, stop, timeline) = (cluster.client(), acked.clone(), stop.clone(), timeline.clone());
        std::thread::spawn(move || {
            block_on(async {
                // Made up front, so the PUTs follow each other with no gap for the kill to fall in.
                let values: Vec<Vec<u8>> = (0..8).map(|i| payload(300_000, i)).collect();
                for i in 0..400u64 {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let data = values[i as usize % values.len()].clone();
                    let start = timeline.begin();
                    if client.put_bytes("bkt", &format!("p-{i}"), &data, &Default::default()).await.is_ok() {
                        acked.lock().unwrap().push((i, data));
                    }
                    timeline.record(start);
                }
            })
        })
    };
    wait_for("five acknowledged PUTs", || acked.lock().unwrap().len() >= 5);
    let begun = timeline.begun.load(Ordering::SeqCst);
    timeline.wait_begun(begun + 1);
    let killed_at = Instant::now();
    cluster.kill_node(2);
    wait_for("five PUTs after the kill", || timeline.started_after(killed_at) >= 5);
    stop.store(true, Ordering::SeqCst);
    writer.join().unwrap();
    assert!(timeline.in_flight_at(killed_at), "the node must die while a PUT is in flight");
    let acked = acked.lock().unwrap();
    assert!(acked.len() >= 10, "puts must go on with one node down");
    cluster.kill_node(5);
    let client = cluster.client();
    block_on(async {
        for (i, data) in acked.iter() {
            assert!(client.get("bkt", &format!("p-{i}")).await.unwrap() == *data, "p-{i}");
        }
    });
}

/// When each operation of a loop started and ended, to prove a fault struck during one.
#[derive(Default)]
struct Timeline {
    spans: Mutex<Vec<(Instant, Instant)>>,
    /// Operations begun so far (set just before each one starts).
    begun: std::sync::atomic::AtomicUsize,
}

impl Timeline {
    /// Marks the start of an operation; returns its start time.
    fn begin(&self) -> Instant {
        let start = Instant::now();
        self.begun.fetch_add(1, Ordering::SeqCst);
        start
    }

    /// Waits (bounded) until `count` operations have begun: the last one is then in flight for
    /// as long as it takes, so a fault injected right away strikes during it.
    fn wait_begun(&self, count: usize) {
        // Spins rather than sleeps: the fault must follow the start within microseconds.
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.begun.load(Ordering::SeqCst) < count {
            assert!(Instant::now() < deadline, "timed out waiting for an operation to begin");
            std::thread::yield_now();
        }
    }

    fn record(&self, start: Instant) {
        self.spans.lock().unwrap().push((start, Instant::now()));
    }

    fn count(&self) -> usize {
        self.spans.lock().unwrap().len()
    }

    fn in_flight_at(&self, moment: Instant) -> bool {
        self.spans.lock().unwrap().iter().any(|(start, end)| *start <= moment && moment <= *end)
    }

    fn started_after(&self, moment: Instant) -> usize {
        self.spans.lock().unwrap().iter().filter(|(start, _)| *start > moment).count()
    }
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn node_killed_during_gets_every_read_is_byte_exact() {
    let (mut cluster, objects) = cluster_with_objects(1, 6_000_000);
    let timeline = Arc::new(Timeline::default());
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (client, data, timeline, stop) = (cluster.client(), objects[0].clone(), timeline.clone(), stop.clone());
        std::thread::spawn(move || {
            block_on(async {
                // Back to back, so the kill lands inside one of them; bounded in count.
                for _ in 0..2000 {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let start = timeline.begin();
                    assert!(client.get("bkt", "obj-0").await.unwrap() == data);
                    timeline.record(start);
                }
            })
        })
    };
    wait_for("two GETs before the kill", || timeline.count() >= 2);
    let begun = timeline.begun.load(Ordering::SeqCst);
    timeline.wait_begun(begun + 1);
    let killed_at = Instant::now();
    cluster.kill_node(3);
    wait_for("five GETs after the kill", || timeline.started_after(killed_at) >= 5);
    stop.store(true, Ordering::SeqCst);
    reader.join().expect("every GET during the kill returns the right bytes");
    assert!(timeline.in_flight_at(killed_at), "the node must die while a GET is in flight");
}

#[test]
fn restarted_nodes_keep_all_their_data() {
    let (mut cluster, objects) = cluster_with_objects(4, 500_000);
    for idx in 0..6 {
        cluster.restart_node(idx);
    }
    // Two nodes down after the restart: the read needs the restarted nodes' chunks.
    cluster.kill_node(0);
    cluster.kill_node(1);
    assert_all_readable(&cluster, &objects);
}

#[test]
fn failed_put_leaves_nothing_visible_and_no_orphan_files() {
    let mut cluster = Cluster::start(Shape::default());
    cluster.cli_ok(&["mb", "bkt"]);
    cluster.kill_node(0);
    cluster.kill_node(1);
    let file = write_file(cluster.dir.path(), "f", &payload(1_000_000, 1));
    let err = cluster.cli_err(&["put", file.to_str().unwrap(), "bkt/doomed"]);
    assert!(err.contains("4 of 6 drives accepted it, 5 needed"), "{err}");
    cluster.start_node(0);
    cluster.start_node(1);
    cluster.wait_ready();
    assert!(cluster.cli_err(&["get", "bkt/doomed", "-"]).contains("no such object"));
    assert_eq!(cluster.cli_ok(&["ls", "bkt"]), "");
    for idx in 0..6 {
        assert!(cluster.data_files(idx).is_empty(), "n{} kept data of a failed PUT", idx + 1);
        let tmp = cluster.drive_dir(idx, 0).join("tmp");
        assert_eq!(std::fs::read_dir(tmp).unwrap().count(), 0, "n{} kept a staging file", idx + 1);
    }
}

fn process_state(pid: u32) -> char {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("State:")).unwrap().to_owned();
    line.split_whitespace().nth(1).and_then(|s| s.chars().next()).unwrap()
}

#[test]
fn hung_node_costs_a_bounded_delay_not_a_hang() {
    let (cluster, objects) = cluster_with_objects(2, 700_000);
    cluster.signal_node(2, libc::SIGSTOP);
    let pid = cluster.pid(2);
    wait_for("n3 to stop", || process_state(pid) == 'T');
    // The test client's request timeout is 3 s and its down-node backoff 2 s: the first
    // request to the stopped node waits out one timeout, then reads plan around it.
    let client = cluster.client();
    let timeout = Duration::from_secs(3);
    block_on(async {
        for round in 0..3 {
            for (i, data) in objects.iter().enumerate() {
                let start = Instant::now();
                let info = client.head("bkt", &format!("obj-{i}")).await.unwrap();
                let body = client.get("bkt", &format!("obj-{i}")).await.unwrap();
                let took = start.elapsed();
                assert!(body == *data, "obj-{i} differs");
                // The fault reached the read: the stopped node's drive did not answer.
                let position = info.drives.iter().position(|(node, _)| node == "n3").unwrap();
                assert!(!info.meta_positions.contains(&position), "n3 must not have answered");
                // Bounded: never more than one timeout per call (a hang would hit the test's
                // own limit), whatever the round.
                assert!(took < 2 * timeout + Duration::from_secs(2), "round {round} obj-{i} took {took:?}");
            }
        }
    });
    assert_eq!(process_state(pid), 'T', "n3 stayed stopped during every read");
    cluster.signal_node(2, libc::SIGCONT);
}

#[test]
fn protocol_garbage_oversized_frames_and_wrong_secret_leave_the_node_up() {
    let (mut cluster, objects) = cluster_with_objects(1, 100_000);
    let addr = cluster.addrs[0];
    let garbage: Vec<Vec<u8>> = vec![
        payload(4096, 99),
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        // A valid magic with a 4 GiB body length.
        [b"TSR1".as_slice(), &2u16.to_le_bytes(), &0u16.to_le_bytes(), &u32::MAX.to_le_bytes()].concat(),
        // An auth frame with a wrong proof.
        proto::encode_frame(
            proto::FrameKind::Auth,
            &proto::AuthProof {
                protocol_version: proto::PROTOCOL_VERSION,
                client_nonce: [3; 32],
                proof: [7; 32],
                cluster_id: String::new(),
                map_version: 0,
            },
        )
        .unwrap(),
        // An auth frame that declares a 16 MiB body: refused before anything is allocated.
        [b"TSR1".as_slice(), &2u16.to_le_bytes(), &0u16.to_le_bytes(), &(16u32 << 20).to_le_bytes()].concat(),
    ];
    for bytes in garbage {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = stream.write_all(&bytes);
        // The node answers the challenge, then closes: reading must reach EOF, not hang.
        let mut sink = Vec::new();
        let _ = stream.read_to_end(&mut sink);
        assert!(sink.len() < 1024, "the node must not answer garbage with data");
    }
    // A client with the wrong secret is refused with a clear error.
    let text = std::fs::read_to_string(&cluster.config).unwrap();
    let wrong = cluster::ClusterMap::from_toml(&text, &cluster.data_dir()).map(|mut m| {
        m.secret = "not-the-secret".into();
        m
    });
    let wrong = client::Client::new(wrong.unwrap(), client::ClientOptions::default()).unwrap();
    let err = block_on(wrong.head("bkt", "obj-0")).unwrap_err();
    assert!(err.to_string().contains("unreachable") || err.to_string().contains("refused"), "{err}");
    assert!(cluster.is_running(0), "garbage must not crash the node");
    assert_all_readable(&cluster, &objects);
    cluster.wait_log(0, "authentication failed");
}

#[test]
fn full_disks_fail_the_put_cleanly_and_the_node_keeps_serving() {
    // Not a skip: a suite run without root must fail here rather than pass without the test.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test mounts a 1 MiB tmpfs as a full drive and needs root (CI runs as root)"
    );
    let mut cluster = Cluster::init(Shape::default());
    let mounted: Vec<std::path::PathBuf> = [0usize, 1].iter().map(|&idx| cluster.drive_dir(idx, 0)).collect();
    for dir in &mounted {
        mount_tmpfs(dir, "1m", false);
        std::fs::write(dir.join("tessera-drive"), "tessera drive format 1\n").unwrap();
    }
    let _unmount = Unmount(mounted);
    for idx in 0..6 {
        cluster.start_node(idx);
    }
    cluster.wait_ready();
    cluster.cli_ok(&["mb", "bkt"]);
    let small = payload(100_000, 3);
    let small_file = write_file(cluster.dir.path(), "small", &small);
    cluster.cli_ok(&["put", small_file.to_str().unwrap(), "bkt/small"]);
    let big = write_file(cluster.dir.path(), "big", &payload(8_000_000, 4));
    let err = cluster.cli_err(&["put", big.to_str().unwrap(), "bkt/big"]);
    assert!(err.contains("full"), "{err}");
    assert!(cluster.cli_err(&["get", "bkt/big", "-"]).contains("no such object"));
    let out = cluster.dir.path().join("small.out");
    cluster.cli_ok(&["get", "bkt/small", out.to_str().unwrap()]);
    assert_eq!(std::fs::read(out).unwrap(), small);
    for idx in 0..2 {
        assert!(cluster.is_running(idx));
        let tmp = cluster.drive_dir(idx, 0).join("tmp");
        assert_eq!(std::fs::read_dir(tmp).unwrap().count(), 0, "no partial staging file is left");
    }
}

pub(crate) struct Unmount(pub(crate) Vec<std::path::PathBuf>);

impl Drop for Unmount {
    fn drop(&mut self) {
        for dir in &self.0 {
            let _ = std::process::Command::new("umount").arg("-l").arg(dir).status();
        }
    }
}

pub(crate) fn mount_tmpfs(dir: &std::path::Path, size: &str, remount: bool) {
    let options = if remount { format!("remount,size={size}") } else { format!("size={size}") };
    let mut mount = std::process::Command::new("mount");
    if !remount {
        mount.args(["-t", "tmpfs"]);
    }
    let status = mount.args(["-o", &options, "tmpfs"]).arg(dir).status().unwrap();
    assert!(status.success(), "mount -o {options} {}", dir.display());
}

#[test]
fn a_drive_that_filled_up_takes_writes_again_once_space_is_freed() {
    // The chaos checker found this: once a metadata commit hits the full disk, redb refuses
    // every later transaction ("previous I/O error"), so the drive stayed unusable after space
    // was freed, until the node restarted.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test mounts a 4 MiB tmpfs as a drive and needs root");
    let mut cluster = Cluster::init(Shape::default());
    let dir = cluster.drive_dir(5, 0);
    mount_tmpfs(&dir, "4m", false);
    let _unmount = Unmount(vec![dir.clone()]);
    std::fs::write(dir.join("tessera-drive"), "tessera drive format 1\n").unwrap();
    for idx in 0..6 {
        cluster.start_node(idx);
    }
    cluster.wait_ready();
    cluster.cli_ok(&["mb", "bkt"]);
    let client = cluster.client();
    let on_every_drive = |key: &str, data: &[u8]| {
        block_on(async {
            client.put_bytes("bkt", key, data, &Default::default()).await.unwrap();
            client.head("bkt", key).await.unwrap().meta_positions.len() == 6
        })
    };
    let mut written = vec![("before".to_owned(), payload(50_000, 1))];
    assert!(on_every_drive("before", &written[0].1));
    // Take every free byte, then write small objects until the drive's metadata commit fails.
    let filler = dir.join("filler");
    {
        let mut file = std::fs::File::create(&filler).unwrap();
        let block = vec![0u8; 4096];
        while file.write_all(&block).is_ok() {}
    }
    let refused = (0..300u64).any(|i| {
        let data = payload(100, 10 + i);
        let landed = on_every_drive(&format!("small-{i}"), &data);
        written.push((format!("small-{i}"), data));
        !landed
    });
    assert!(refused, "the full drive never refused a write");
    std::fs::remove_file(&filler).unwrap();
    let healed = (0..20u64).any(|i| {
        let data = payload(60_000, 1000 + i);
        let landed = on_every_drive(&format!("after-{i}"), &data);
        written.push((format!("after-{i}"), data));
        landed
    });
    assert!(healed, "writes must reach the drive again once it has room, without a restart:\n{}", cluster.log(5));
    assert!(cluster.is_running(5));
    block_on(async {
        for (key, data) in &written {
            assert_eq!(&client.get("bkt", key).await.unwrap(), data, "{key}");
        }
    });
}

#[test]
fn bucket_created_while_nodes_were_down_heals_on_first_write_after_they_return() {
    let mut cluster = Cluster::start(Shape::default());
    cluster.kill_node(1);
    cluster.kill_node(4);
    let client = cluster.client();
    block_on(async { client.make_bucket("late").await.unwrap() });
    cluster.start_node(1);
    cluster.start_node(4);
    cluster.wait_ready();
    // The same client: it saw n2 and n5 fail moments ago, and must still reach the write quorum.
    let data = payload(300_000, 9);
    block_on(async {
        client.put_bytes("late", "obj", &data, &Default::default()).await.unwrap();
        client.put_bytes("late", "empty", b"", &Default::default()).await.unwrap();
        let info = client.head("late", "obj").await.unwrap();
        assert_eq!(info.meta_positions.len(), 6, "every drive holds the object once the bucket healed");
    });
    cluster.kill_node(0);
    cluster.kill_node(2);
    let after = cluster.client();
    block_on(async { assert!(after.get("late", "obj").await.unwrap() == data) });
}

#[test]
fn ranged_reads_fetch_and_verify_only_the_checksum_blocks_they_need() {
    // 1 MiB chunks with 64 KiB checksum blocks: block 5 of every chunk is corrupted on every
    // drive, so nothing can decode it. Reads that avoid it must still succeed.
    let cluster = Cluster::start(Shape { chunk_size: "1MiB", ..Shape::default() });
    let client = cluster.client();
    let data = payload(4 << 20, 5);
    block_on(async {
        client.make_bucket("bkt").await.unwrap();
        client.put_bytes("bkt", "obj", &data, &Default::default()).await.unwrap();
    });
    let block = 64 << 10;
    for idx in 0..6 {
        for file in cluster.data_files(idx) {
            let mut bytes = std::fs::read(&file).unwrap();
            bytes[5 * block + 100] ^= 0xff;
            std::fs::write(&file, bytes).unwrap();
        }
    }
    block_on(async {
        let info = client.head("bkt", "obj").await.unwrap();
        // Chunk 0 of stripe 0 holds object bytes 0..1 MiB; its block 5 is bytes 320..384 KiB.
        let mut head = vec![0u8; 1000];
        client.read_at(&info, 0, &mut head).await.unwrap();
        assert_eq!(head, data[..1000]);
        let mut other_chunk = vec![0u8; 3000];
        client.read_at(&info, (1 << 20) + 7 * block as u64, &mut other_chunk).await.unwrap();
        let start = (1 << 20) + 7 * block;
        assert_eq!(other_chunk, data[start..start + 3000]);
        let mut bad = vec![0u8; 10];
        let err = client.read_at(&info, 5 * block as u64 + 90, &mut bad).await.unwrap_err();
        assert!(matches!(err, client::Error::Unavailable { .. }), "{err}");
        assert!(client.get("bkt", "obj").await.is_err(), "a whole read needs the corrupt blocks");
    });
}
