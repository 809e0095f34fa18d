//! Background repair on a real cluster: objects written short of n are rebuilt when the node
//! returns, a corrupt chunk a reader finds is rebuilt, and admins pause, resume and re-rate it.

use std::time::{Duration, Instant};

use crate::harness::{Cluster, Shape, block_on, payload};

/// Waits (bounded) until every object has metadata on all n drives. Watches without hinting
/// repairs, so what it waits for is the nodes' own repair.
pub(crate) fn wait_full_redundancy(cluster: &Cluster, keys: &[String]) {
    let client = cluster.observer();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let full = block_on(async {
            let mut full = true;
            for key in keys {
                full &= client.head("bkt", key).await.is_ok_and(|info| info.meta_positions.len() == 6);
            }
            full
        });
        if full {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "objects not back to full redundancy in 60 s:\n{}",
            cluster.cli_ok(&["repair", "status"])
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn objects_written_while_a_node_was_down_are_rebuilt_on_it_when_it_returns() {
    let mut cluster = Cluster::start(Shape::default());
    cluster.cli_ok(&["mb", "bkt"]);
    cluster.kill_node(2);
    let client = cluster.client();
    let objects: Vec<(String, Vec<u8>)> =
        (0..8).map(|i| (format!("obj-{i}"), payload(100_000 + i * 77_777, i as u64))).collect();
    block_on(async {
        for (key, data) in &objects {
            let info = client.put_bytes("bkt", key, data, &Default::default()).await.unwrap();
            assert_eq!(info.meta_positions.len(), 5, "written short of n: the fault happened");
        }
    });
    // n3 is down, so status fails (non-zero), and still shows the queues of the others.
    let output = cluster.cli(&["repair", "status", "--json"]);
    let status = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success());
    assert!(status.contains("\"queued_versions\":8"), "queued on the drives that hold them: {status}");
    cluster.start_node(2);
    cluster.wait_ready();
    let keys: Vec<String> = objects.iter().map(|(k, _)| k.clone()).collect();
    wait_full_redundancy(&cluster, &keys);
    // n3's chunks are real: with two other nodes down, reads need them.
    cluster.kill_node(0);
    cluster.kill_node(5);
    let reader = cluster.client();
    block_on(async {
        for (key, data) in &objects {
            assert!(reader.get("bkt", key).await.unwrap() == *data, "{key} after repair");
        }
    });
}

#[test]
fn a_corrupt_chunk_found_by_a_reader_is_rebuilt() {
    let mut cluster = Cluster::start(Shape::default());
    let client = cluster.client();
    let data = payload(600_000, 9);
    block_on(async {
        client.make_bucket("bkt").await.unwrap();
        client.put_bytes("bkt", "obj", &data, &Default::default()).await.unwrap();
    });
    let victim = cluster.data_files(1).pop().expect("n2 holds a chunk file");
    let original = std::fs::read(&victim).unwrap();
    // One flipped bit in n2's chunk of every stripe: whichever stripes hold a data chunk on n2,
    // the reader meets one.
    let mut bytes = original.clone();
    for offset in (100..original.len()).step_by(64 << 10) {
        bytes[offset] ^= 0x40;
    }
    std::fs::write(&victim, &bytes).unwrap();
    // The read succeeds around the bad chunk and hints its repair.
    block_on(async { assert!(client.get("bkt", "obj").await.unwrap() == data) });
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::read(&victim).unwrap() != original {
        assert!(Instant::now() < deadline, "the corrupt chunk was not rebuilt in 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!((0..6).any(|i| cluster.log(i).contains("queued for repair")), "a holder queued it from the reader's hint");
    // The rebuilt chunk serves reads: with two other nodes down, n2 is needed.
    cluster.kill_node(0);
    cluster.kill_node(2);
    block_on(async { assert!(cluster.client().get("bkt", "obj").await.unwrap() == data) });
}

#[test]
fn repair_is_paused_resumed_and_rerated_on_the_running_cluster() {
    let mut cluster = Cluster::start(Shape::default());
    cluster.cli_ok(&["mb", "bkt"]);
    assert!(cluster.cli_ok(&["repair", "pause"]).contains("repair paused: 6 of 6 nodes"));
    cluster.kill_node(4);
    let client = cluster.client();
    let keys: Vec<String> = (0..4).map(|i| format!("k{i}")).collect();
    block_on(async {
        for key in &keys {
            client.put_bytes("bkt", key, &payload(50_000, 1), &Default::default()).await.unwrap();
        }
    });
    // Paused survives a restart of the node that must be repaired and of the holders.
    cluster.start_node(4);
    cluster.restart_node(0);
    cluster.wait_ready();
    std::thread::sleep(Duration::from_secs(2));
    let status = cluster.cli_ok(&["repair", "status"]);
    assert!(status.contains("paused") && !status.contains("running"), "{status}");
    let short = block_on(client.head("bkt", "k0")).unwrap();
    assert_eq!(short.meta_positions.len(), 5, "nothing was repaired while paused");
    // Bad rates are one-line errors and change nothing.
    for bad in ["-5", "0", "fast", "12parsecs"] {
        let err = cluster.cli_err(&["repair", "rate", bad]);
        assert!(err.starts_with("error: ") && (err.contains("rate") || err.contains("size")), "{bad}: {err}");
    }
    assert!(cluster.cli_ok(&["repair", "rate", "50MiB/s"]).contains("repair budget 50.0 MiB/s: 6 of 6 nodes"));
    assert!(cluster.cli_ok(&["repair", "resume"]).contains("repair resumed"));
    wait_full_redundancy(&cluster, &keys);
    let status = cluster.cli_ok(&["repair", "status", "--json"]);
    assert!(status.contains("\"bytes_per_s\":52428800") && status.contains("\"paused\":false"), "{status}");
    // A node that is down makes status fail (non-zero) and says which.
    cluster.kill_node(3);
    let err = cluster.cli_err(&["repair", "status"]);
    assert!(err.contains("1 of 6 nodes did not answer: n4"), "{err}");
}

#[test]
fn delete_markers_and_multipart_objects_written_while_a_node_was_down_are_repaired() {
    let mut cluster = Cluster::start(Shape::default());
    let client = cluster.client();
    let part = payload(client::PART_BYTES_MIN as usize, 5);
    block_on(async {
        client.make_bucket("bkt").await.unwrap();
        client.put_bytes("bkt", "doomed", b"to be deleted", &Default::default()).await.unwrap();
    });
    cluster.kill_node(3);
    let client = cluster.client();
    block_on(async {
        client.delete("bkt", "doomed").await.unwrap();
        let upload = client.create_multipart("bkt", "mp", &client::PutOptions::default()).await.unwrap();
        let one = client.put_part("bkt", "mp", &upload, 1, &mut part.as_slice()).await.unwrap();
        let info = client.complete_multipart("bkt", "mp", &upload, &[(1, one.etag)]).await.unwrap();
        assert_eq!(info.meta_positions.len(), 5, "written short of n: the fault happened");
    });
    cluster.start_node(3);
    cluster.wait_ready();
    // Metadata-only versions come back on n4 too: the marker and the multipart record.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let answered = block_on(async {
            let mp = client.head("bkt", "mp").await.map(|i| i.meta_positions.len()).unwrap_or(0);
            (mp, repair_queued(&cluster))
        });
        if answered.0 == 6 && answered.1 == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not repaired in 60 s (multipart on {} drives, {} queued)",
            answered.0,
            answered.1
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // With two other nodes down, n4's copies are needed: the marker still hides the key and
    // the multipart object still reads back.
    cluster.kill_node(0);
    cluster.kill_node(1);
    let reader = cluster.client();
    block_on(async {
        assert!(matches!(reader.head("bkt", "doomed").await, Err(client::Error::NotFound { .. })));
        assert!(reader.get("bkt", "mp").await.unwrap() == part);
    });
}

/// Versions queued for repair on every node that answers.
fn repair_queued(cluster: &Cluster) -> u64 {
    let output = cluster.cli(&["repair", "status", "--json"]);
    let text = String::from_utf8_lossy(&output.stdout);
    text.split("\"queued_versions\":").skip(1).filter_map(|rest| rest.split(',').next()?.parse::<u64>().ok()).sum()
}

#[test]
fn repairs_backed_off_toward_a_node_are_retried_when_it_returns() {
    let mut cluster = Cluster::start(Shape::default());
    cluster.cli_ok(&["mb", "bkt"]);
    cluster.kill_node(3);
    let client = cluster.client();
    let keys: Vec<String> = (0..4).map(|i| format!("k{i}")).collect();
    block_on(async {
        for key in &keys {
            let info = client.put_bytes("bkt", key, &payload(80_000, 7), &Default::default()).await.unwrap();
            assert_eq!(info.meta_positions.len(), 5, "written while n4 was down");
        }
    });
    // Repairs toward n4 fail and back off: 1, 2, 4, 8 s... after 16 s the next try is ~16 s away.
    std::thread::sleep(Duration::from_secs(16));
    let status = cluster.cli(&["repair", "status", "--json"]);
    assert!(String::from_utf8_lossy(&status.stdout).contains("\"failed_attempts\":"), "attempts failed meanwhile");
    cluster.start_node(3);
    cluster.wait_ready();
    wait_full_redundancy(&cluster, &keys);
    // The holder that repairs saw n4 come back and made its backed-off entries due at once.
    let logs: String = (0..6).map(|i| cluster.log(i)).collect();
    let woken = logs.lines().find(|l| l.contains("a peer is reachable again")).unwrap_or_else(|| panic!("{logs}"));
    assert!(!woken.contains("woken=0"), "{woken}");
}

#[test]
fn repair_scrub_and_rebuild_threads_yield_the_cpu_to_requests() {
    const SCHED_OTHER: i64 = 0;
    const SCHED_IDLE: i64 = 5;
    let cluster = Cluster::start(Shape::default());
    // /proc/PID/task/TID/stat: "tid (comm) state ..."; the scheduling policy is the 41st field.
    let threads_of = |comm: &str| -> std::collections::BTreeMap<u64, i64> {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", cluster.pid(0))).unwrap();
        tasks
            .filter_map(|task| std::fs::read_to_string(task.unwrap().path().join("stat")).ok())
            .filter(|stat| stat.contains(&format!("({comm})")))
            .map(|stat| {
                let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
                let tid = stat.split(' ').next().unwrap().parse().unwrap();
                (tid, after_comm.split(' ').nth(38).unwrap().parse().unwrap())
            })
            .collect()
    };
    let policy_of = |comm: &str| -> Vec<i64> { threads_of(comm).into_values().collect() };
    // Each background thread lowers itself as its first step; on a loaded machine that step may
    // not have run yet when the node reports ready.
    let deadline = Instant::now() + Duration::from_secs(10);
    for background in ["repair", "scrub", "rebuild"] {
        while policy_of(background) != vec![SCHED_IDLE] && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(policy_of(background), vec![SCHED_IDLE], "the {background} thread of n1");
    }
    // The thread that accepts connections (and those that serve them) keep the default.
    assert!(policy_of("tessera").iter().all(|&p| p == SCHED_OTHER), "{:?}", policy_of("tessera"));
    // A connection that says it carries background work (as nodes' repair connections to
    // each other do) is served at the background priority; a client's stays at the default.
    let secret = crate::protocol::secret_of(&cluster);
    let mut client = crate::protocol::RawSession::open(cluster.addrs[0], &secret);
    assert!(matches!(client.call(&proto::Request::BucketList), proto::Response::Buckets { .. }));
    // By thread id: peers' short map catch-up connections come and go meanwhile.
    let before = threads_of("conn");
    assert!(before.values().any(|&p| p == SCHED_OTHER), "{before:?}");
    let mut peer = crate::protocol::RawSession::open(cluster.addrs[0], &secret);
    assert_eq!(peer.call(&proto::Request::Background), proto::Response::Ok);
    let after = threads_of("conn");
    let lowered: Vec<&u64> =
        after.iter().filter(|(tid, p)| **p == SCHED_IDLE && !before.contains_key(tid)).map(|(t, _)| t).collect();
    assert!(!lowered.is_empty(), "the new background connection: before {before:?}, after {after:?}");
    // Threads serving before (the client's among them, which is still open) kept their policy.
    let kept = before.iter().filter(|(tid, _)| after.contains_key(tid)).all(|(tid, p)| after[tid] == *p);
    assert!(kept, "before {before:?}, after {after:?}");
    assert!(
        before.iter().any(|(tid, &p)| p == SCHED_OTHER && after.get(tid) == Some(&SCHED_OTHER)),
        "the client's stays default: before {before:?}, after {after:?}"
    );
}
