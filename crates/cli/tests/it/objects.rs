//! Buckets and objects through the CLI and the smart client on a healthy cluster.

use crate::harness::{Cluster, Shape, block_on, payload, write_file};

#[test]
fn put_get_round_trips_every_size_byte_exact() {
    let cluster = Cluster::start(Shape::default());
    cluster.cli_ok(&["mb", "bkt"]);
    let chunk = 64 << 10;
    for (i, size) in [0, 1, chunk - 1, chunk, 4 * chunk, 4 * chunk + 1, 3_000_001].into_iter().enumerate() {
        let data = payload(size, i as u64);
        let source = write_file(cluster.dir.path(), &format!("in-{i}"), &data);
        let key = format!("bkt/sizes/{size}");
        cluster.cli_ok(&["put", source.to_str().unwrap(), &key]);
        let target = cluster.dir.path().join(format!("out-{i}"));
        cluster.cli_ok(&["get", &key, target.to_str().unwrap()]);
        assert_eq!(std::fs::read(&target).unwrap(), data, "size {size}");
    }
    let listing = cluster.cli_ok(&["ls", "bkt/sizes/"]);
    assert_eq!(listing.lines().count(), 7, "{listing}");
}

#[test]
fn cli_get_reads_a_byte_range_and_names_the_version_it_read() {
    let cluster = Cluster::start(Shape::default());
    cluster.cli_ok(&["mb", "bkt"]);
    let data = payload(700_001, 3);
    let source = write_file(cluster.dir.path(), "in", &data);
    cluster.cli_ok(&["put", source.to_str().unwrap(), "bkt/obj"]);
    let etag = md5_hex(&data);
    for (offset, length, end) in [(0usize, "10", 10usize), (65_530, "20000", 85_530), (700_000, "50", 700_001)] {
        let output = cluster.cli(&["get", "bkt/obj", "-", "--offset", &offset.to_string(), "--length", length]);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        assert_eq!(output.stdout, data[offset..end], "offset {offset}");
        assert!(String::from_utf8_lossy(&output.stderr).contains(&format!("etag {etag}")));
    }
    let err = cluster.cli_err(&["get", "bkt/obj", "-", "--offset", "700001"]);
    assert!(err.contains("past the end") && err.lines().count() == 1, "{err}");
}

#[test]
fn cli_get_in_small_steps_and_put_if_absent() {
    let cluster = Cluster::start(Shape::default());
    cluster.cli_ok(&["mb", "bkt"]);
    let data = payload(300_001, 5);
    let source = write_file(cluster.dir.path(), "in", &data);
    let source = source.to_str().unwrap();
    // Create only: the first wins, the second is refused and changes nothing.
    cluster.cli_ok(&["put", "--if-absent", source, "bkt/obj"]);
    let other = write_file(cluster.dir.path(), "other", b"other");
    let err = cluster.cli_err(&["put", "--if-absent", other.to_str().unwrap(), "bkt/obj"]);
    assert!(err.contains("bkt/obj already exists") && err.lines().count() == 1, "{err}");
    // Held 4 KiB at a time: the same bytes.
    let output = cluster.cli(&["get", "bkt/obj", "-", "--buffer", "4KiB", "--offset", "1000"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.stdout, data[1000..]);
    let err = cluster.cli_err(&["get", "bkt/obj", "-", "--buffer", "1KiB"]);
    assert!(err.contains("outside 4KiB"), "{err}");
}

/// The hex MD5 of `data` (the etag of a single-part object), from coreutils' md5sum: the test
/// binary has no MD5 crate of its own.
fn md5_hex(data: &[u8]) -> String {
    let mut child = std::process::Command::new("md5sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("md5sum (coreutils)");
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), data).unwrap();
    let output = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&output.stdout).split_whitespace().next().unwrap().to_owned()
}

#[test]
fn ranged_reads_fetch_exact_bytes_across_stripes() {
    let cluster = Cluster::start(Shape::default());
    let client = cluster.client();
    let data = payload(1_000_003, 7);
    block_on(async {
        client.make_bucket("bkt").await.unwrap();
        client.put_bytes("bkt", "obj", &data, &Default::default()).await.unwrap();
        let info = client.head("bkt", "obj").await.unwrap();
        let stripe = 4 * (64 << 10);
        for (offset, len) in
            [(0, 1), (1, 10), (65535, 2), (stripe - 1, 2), (stripe + 3, 3 * stripe), (999_000, 5000), (1_000_002, 1)]
        {
            let mut buf = vec![0u8; len];
            let read = client.read_at(&info, offset as u64, &mut buf).await.unwrap();
            let end = (offset + len).min(data.len());
            assert_eq!(read, end - offset);
            assert_eq!(&buf[..read], &data[offset..end], "offset {offset} len {len}");
        }
        assert!(matches!(
            client.read_at(&info, 2_000_000, &mut [0u8; 4]).await,
            Err(client::Error::RangeNotSatisfiable { .. })
        ));
    });
}

#[test]
fn listing_is_sorted_prefixed_paged_and_hides_deleted_keys() {
    let cluster = Cluster::start(Shape { nodes: 6, drives_per_node: 2, ..Shape::default() });
    let client = cluster.client();
    block_on(async {
        client.make_bucket("bkt").await.unwrap();
        for i in (0..25).rev() {
            client.put_bytes("bkt", &format!("k/{i:03}"), b"x", &Default::default()).await.unwrap();
        }
        client.put_bytes("bkt", "other", b"y", &Default::default()).await.unwrap();
        client.delete("bkt", "k/013").await.unwrap();
        let mut keys = Vec::new();
        let mut start_after = String::new();
        loop {
            let page = client.list("bkt", "k/", &start_after, 7).await.unwrap();
            keys.extend(page.entries.into_iter().map(|e| e.key));
            match page.next_start_after {
                Some(next) => start_after = next,
                None => break,
            }
        }
        let expected: Vec<String> = (0..25).filter(|i| *i != 13).map(|i| format!("k/{i:03}")).collect();
        assert_eq!(keys, expected);
        assert!(matches!(client.head("bkt", "k/013").await, Err(client::Error::NotFound { .. })));
    });
}

#[test]
fn buckets_follow_s3_rules_and_rb_refuses_non_empty() {
    let cluster = Cluster::start(Shape::default());
    assert!(cluster.cli_err(&["mb", "Bad_Name"]).contains("invalid bucket name"));
    cluster.cli_ok(&["mb", "bkt"]);
    cluster.cli_ok(&["mb", "bkt2"]);
    assert_eq!(cluster.cli_ok(&["ls"]), "bkt\nbkt2\n");
    let file = write_file(cluster.dir.path(), "f", b"hello");
    let err = cluster.cli_err(&["put", file.to_str().unwrap(), "nobucket/key"]);
    assert!(err.contains("no such bucket") && err.lines().count() == 1, "{err}");
    let long_key = format!("bkt/{}", "k".repeat(1025));
    assert!(cluster.cli_err(&["put", file.to_str().unwrap(), &long_key]).contains("1025 bytes"));
    cluster.cli_ok(&["put", file.to_str().unwrap(), "bkt/f"]);
    assert!(cluster.cli_err(&["rb", "bkt"]).contains("not empty"));
    cluster.cli_ok(&["rm", "bkt/f"]);
    assert!(cluster.cli_err(&["get", "bkt/f", "-"]).contains("no such object"));
    cluster.cli_ok(&["rb", "bkt"]);
    assert_eq!(cluster.cli_ok(&["ls"]), "bkt2\n");
}

#[test]
fn stat_shows_size_etag_erasure_and_chunk_locations() {
    let cluster = Cluster::start(Shape::default());
    cluster.cli_ok(&["mb", "bkt"]);
    let file = write_file(cluster.dir.path(), "f", b"hello");
    cluster.cli_ok(&["put", file.to_str().unwrap(), "bkt/f"]);
    let stat = cluster.cli_ok(&["stat", "bkt/f"]);
    assert!(stat.contains("size:         5"), "{stat}");
    assert!(stat.contains("5d41402abc4b2a76b9719d911017c592"), "etag is the MD5 of the body: {stat}");
    assert!(stat.contains("4+2"), "{stat}");
    for node in 1..=6 {
        assert!(stat.contains(&format!("node n{node} drive 0")), "{stat}");
    }
}

#[test]
fn concurrent_puts_to_one_key_converge_on_one_winner() {
    let cluster = Cluster::start(Shape::default());
    let client = cluster.client();
    block_on(async { client.make_bucket("bkt").await.unwrap() });
    let writers: Vec<_> = (0..4u64)
        .map(|w| {
            let client = cluster.client();
            std::thread::spawn(move || {
                block_on(async {
                    for round in 0..5u64 {
                        let data = payload(200_000, w * 100 + round);
                        client.put_bytes("bkt", "contended", &data, &Default::default()).await.unwrap();
                    }
                })
            })
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }
    let candidates: Vec<Vec<u8>> = (0..4u64).map(|w| payload(200_000, w * 100 + 4)).collect();
    block_on(async {
        let first = client.head("bkt", "contended").await.unwrap();
        for _ in 0..3 {
            let other = cluster.client();
            assert_eq!(other.head("bkt", "contended").await.unwrap().meta.version, first.meta.version);
        }
        let body = client.get("bkt", "contended").await.unwrap();
        assert!(candidates.contains(&body), "the winner is one writer's last PUT, whole");
    });
}

#[test]
fn multipart_upload_reads_back_across_parts_and_copies_nothing() {
    let cluster = Cluster::start(Shape { retire_grace: "1s", ..Shape::default() });
    let client = cluster.client();
    let part_bytes = client::PART_BYTES_MIN as usize;
    let parts: Vec<Vec<u8>> = vec![payload(part_bytes, 1), payload(part_bytes + 7, 2), payload(123_457, 3)];
    let whole: Vec<u8> = parts.concat();
    block_on(async {
        client.make_bucket("bkt").await.unwrap();
        let upload = client.create_multipart("bkt", "big", &client::PutOptions::default()).await.unwrap();
        let mut etags = Vec::new();
        for (i, data) in parts.iter().enumerate() {
            let mut source = data.as_slice();
            let info = client.put_part("bkt", "big", &upload, i as u32 + 1, &mut source).await.unwrap();
            assert_eq!(info.size, data.len() as u64);
            etags.push((i as u32 + 1, format!("\"{}\"", info.etag)));
        }
        let listed = client.list_parts("bkt", "big", &upload).await.unwrap();
        assert_eq!(listed.iter().map(|p| p.number).collect::<Vec<_>>(), [1, 2, 3]);
        let uploads = client.list_multipart_uploads("bkt", "").await.unwrap();
        assert_eq!(uploads.len(), 1);
        assert_eq!((uploads[0].key.as_str(), uploads[0].upload_id.as_str()), ("big", upload.as_str()));
        let files_before: usize = (0..6).map(|i| cluster.data_files(i).len()).sum();
        let info = client.complete_multipart("bkt", "big", &upload, &etags).await.unwrap();
        assert!(info.meta.etag.ends_with("-3"), "{}", info.meta.etag);
        let files_after: usize = (0..6).map(|i| cluster.data_files(i).len()).sum();
        assert!(files_after <= files_before, "complete adds no data file");
        assert_eq!(client.get("bkt", "big").await.unwrap(), whole);
        let head = client.head("bkt", "big").await.unwrap();
        let mut buf = vec![0u8; 100];
        let boundary = part_bytes as u64 - 50;
        client.read_at(&head, boundary, &mut buf).await.unwrap();
        assert_eq!(buf, whole[boundary as usize..boundary as usize + 100]);
        assert!(matches!(client.list_parts("bkt", "big", &upload).await, Err(client::Error::NoSuchUpload { .. })));
        assert!(client.list_multipart_uploads("bkt", "").await.unwrap().is_empty());
    });
    let client = cluster.client();
    block_on(async {
        client.put_bytes("bkt", "big", b"small now", &Default::default()).await.unwrap();
        assert_eq!(client.get("bkt", "big").await.unwrap(), b"small now");
    });
    // Pieces, the marker and the replaced versions retire after the grace (1 s here; the nodes
    // look every 5 s): then one file per drive is left.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let files: usize = (0..6).map(|i| cluster.data_files(i).len()).sum();
        if files == 6 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{files} data files left, 6 expected");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

#[test]
fn multipart_object_reads_back_with_two_nodes_down() {
    let mut cluster = Cluster::start(Shape::default());
    let client = cluster.client();
    let parts = [payload(client::PART_BYTES_MIN as usize, 4), payload(99_999, 5)];
    block_on(async {
        client.make_bucket("bkt").await.unwrap();
        let upload = client.create_multipart("bkt", "big", &client::PutOptions::default()).await.unwrap();
        let mut etags = Vec::new();
        for (i, data) in parts.iter().enumerate() {
            let info = client.put_part("bkt", "big", &upload, i as u32 + 1, &mut data.as_slice()).await.unwrap();
            etags.push((i as u32 + 1, info.etag));
        }
        client.complete_multipart("bkt", "big", &upload, &etags).await.unwrap();
    });
    cluster.kill_node(0);
    cluster.kill_node(4);
    let degraded = cluster.client();
    block_on(async { assert!(degraded.get("bkt", "big").await.unwrap() == parts.concat(), "read with 2 nodes down") });
}

#[test]
fn multipart_complete_refuses_bad_part_lists() {
    let cluster = Cluster::start(Shape::default());
    let client = cluster.client();
    block_on(async {
        client.make_bucket("bkt").await.unwrap();
        let upload = client.create_multipart("bkt", "k", &client::PutOptions::default()).await.unwrap();
        let mut etags = Vec::new();
        for number in 1..=2u32 {
            let mut source = &b"tiny part"[..];
            etags.push((number, client.put_part("bkt", "k", &upload, number, &mut source).await.unwrap().etag));
        }
        let reversed = vec![etags[1].clone(), etags[0].clone()];
        assert!(matches!(
            client.complete_multipart("bkt", "k", &upload, &reversed).await,
            Err(client::Error::InvalidPartOrder)
        ));
        let wrong = vec![(1, "00".repeat(16)), etags[1].clone()];
        assert!(matches!(
            client.complete_multipart("bkt", "k", &upload, &wrong).await,
            Err(client::Error::InvalidPart { number: 1, .. })
        ));
        let missing = vec![etags[0].clone(), (3, etags[1].1.clone())];
        assert!(matches!(
            client.complete_multipart("bkt", "k", &upload, &missing).await,
            Err(client::Error::InvalidPart { number: 3, .. })
        ));
        assert!(matches!(
            client.complete_multipart("bkt", "k", &upload, &etags).await,
            Err(client::Error::EntityTooSmall { number: 1, .. })
        ));
        assert!(matches!(
            client.put_part("bkt", "other-key", &upload, 1, &mut &b"x"[..]).await,
            Err(client::Error::NoSuchUpload { .. })
        ));
        client.abort_multipart("bkt", "k", &upload).await.unwrap();
        assert!(matches!(client.list_parts("bkt", "k", &upload).await, Err(client::Error::NoSuchUpload { .. })));
        assert!(matches!(client.head("bkt", "k").await, Err(client::Error::NotFound { .. })));
        assert!(client.list("bkt", "", "", 100).await.unwrap().entries.is_empty());
        assert_eq!(client.list_buckets().await.unwrap(), ["bkt"], "the internal bucket stays hidden");
        let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
        let created = client.buckets().await.unwrap()[0].created_ms;
        assert!(created <= now_ms && now_ms - created < 600_000, "bucket creation time is recorded: {created}");
    });
}

#[test]
fn client_bootstraps_from_any_node_address_with_the_secret() {
    let cluster = Cluster::start(Shape::default());
    let text = std::fs::read_to_string(&cluster.config).unwrap();
    let secret = cluster::ClusterMap::from_toml(&text, &cluster.data_dir()).unwrap().secret;
    block_on(async {
        let client =
            client::Client::bootstrap(cluster.addrs[3], &secret, client::ClientOptions::default()).await.unwrap();
        assert_eq!(client.map().nodes.len(), 6);
        client.make_bucket("bkt").await.unwrap();
        client.put_bytes("bkt", "k", b"via bootstrap", &Default::default()).await.unwrap();
        assert_eq!(client.get("bkt", "k").await.unwrap(), b"via bootstrap");
        let refused = client::Client::bootstrap(cluster.addrs[0], "wrong", client::ClientOptions::default()).await;
        assert!(refused.is_err(), "a wrong secret gets no map");
    });
}

#[test]
fn batched_head_and_read_of_many_objects_are_byte_exact_with_two_nodes_down() {
    let mut cluster = Cluster::start(Shape::default());
    let client = cluster.client();
    let sizes: Vec<usize> = (0..40).map(|i| [1, 1000, 65_536, 300_001, 1_100_000][i % 5] + i).collect();
    let objects: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &size)| payload(size, i as u64)).collect();
    block_on(async {
        client.make_bucket("bkt").await.unwrap();
        for (i, data) in objects.iter().enumerate() {
            client.put_bytes("bkt", &format!("o/{i:02}"), data, &Default::default()).await.unwrap();
        }
    });
    cluster.kill_node(1);
    cluster.kill_node(3);
    let client = cluster.client();
    block_on(async {
        let mut keys: Vec<(String, String)> = (0..40).map(|i| ("bkt".to_owned(), format!("o/{i:02}"))).collect();
        keys.push(("bkt".to_owned(), "missing".to_owned()));
        let heads = client.head_many(&keys).await;
        assert!(matches!(heads[40], Err(client::Error::NotFound { .. })));
        let infos: Vec<client::ObjectInfo> = heads.into_iter().take(40).map(Result::unwrap).collect();
        let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|&size| vec![0u8; size]).collect();
        // Whole objects, plus a ranged read into the middle of the largest one.
        let mut middle = vec![0u8; 10_000];
        let mut reads: Vec<(&client::ObjectInfo, u64, &mut [u8])> =
            infos.iter().zip(bufs.iter_mut()).map(|(info, buf)| (info, 0, buf.as_mut_slice())).collect();
        reads.push((&infos[4], 500_000, middle.as_mut_slice()));
        let results = client.read_many(reads).await;
        for (i, result) in results.iter().take(40).enumerate() {
            assert_eq!(*result.as_ref().unwrap(), sizes[i], "o/{i:02}");
        }
        assert_eq!(*results[40].as_ref().unwrap(), 10_000);
        for (i, buf) in bufs.iter().enumerate() {
            assert!(*buf == objects[i], "o/{i:02} differs");
        }
        assert_eq!(middle, objects[4][500_000..510_000]);
    });
}

#[test]
fn bench_at_a_fixed_rate_runs_its_schedule_and_no_more() {
    let cluster = Cluster::start(Shape::default());
    let common = ["bench", "get", "--size", "4KiB", "--objects", "4", "--duration", "1s", "--json"];
    // 20 operations/s for 1 s: the schedule has 20 slots, the first one at the start.
    let out = cluster.cli_ok(&[&common[..], &["--rate", "20"]].concat());
    assert!(out.contains("\"offered_ops_per_s\":20,"), "{out}");
    let ops: u64 = out.split("\"ops\":").nth(1).and_then(|rest| rest.split(',').next()).unwrap().parse().unwrap();
    assert!((1..=20).contains(&ops), "{ops} operations on a schedule of 20: {out}");
    for bad in ["--rate=0", "--rate=-1", "--rate=inf"] {
        let err = cluster.cli_err(&[&common[..], &[bad]].concat());
        assert!(err.starts_with("error: --rate must be") && err.trim_end().lines().count() == 1, "{bad}: {err}");
    }
    let err = cluster.cli_err(&[&common[..], &["--rate", "many"]].concat());
    assert!(err.contains("invalid value 'many'"), "{err}");
}

#[test]
fn concurrent_reads_share_metadata_requests_and_read_byte_exact() {
    let cluster = Cluster::start(Shape::default());
    let objects: Vec<Vec<u8>> = (0..64).map(|i| payload(1000 + i * 7919, i as u64)).collect();
    // One thread for the client and its senders, so no sender runs while the 64 GETs are still
    // queueing their items: on the shared two-worker runtime of a busy machine an answer could
    // come back before the next GET asked, and how much they shared was a matter of timing.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let client = cluster.client();
        client.make_bucket("bkt").await.unwrap();
        for (i, data) in objects.iter().enumerate() {
            client.put_bytes("bkt", &format!("o/{i}"), data, &Default::default()).await.unwrap();
        }
        let before = client.metadata_counts();
        let gets = (0..objects.len()).map(|i| {
            let client = client.clone();
            async move { client.get("bkt", &format!("o/{i}")).await }
        });
        let got = futures_util::future::join_all(gets).await;
        let after = client.metadata_counts();
        for (i, data) in got.into_iter().enumerate() {
            assert!(data.unwrap() == objects[i], "o/{i} differs");
        }
        let (requests, items) = (after.requests - before.requests, after.items - before.items);
        assert!(items >= 64 * 6, "every GET asks the 6 drives of its key's set: {items} items");
        // 64 GETs at once ask each node about 64 keys: batches of them, not a request each.
        assert!(requests * 4 <= items, "{requests} metadata requests for {items} items: the reads did not share them");
    });
}

#[test]
fn a_metadata_answer_too_large_for_one_frame_comes_in_parts() {
    // A 96 MiB object in 64 KiB chunks carries 2,304 block CRCs in its metadata (about 12 KB).
    // 4,096 heads of it (`BATCH_ITEMS_MAX`) ask each node for 4,096 items in one request: about
    // 48 MB of answer, more than one frame holds (32 MiB). The node answers the items that fit
    // and the client asks again for the rest; before, the node dropped the connection.
    const { assert!(4096 * 2304 * 5 > proto::CONTROL_BODY_BYTES_MAX, "the answer must not fit one frame") };
    let cluster = Cluster::start(Shape::default());
    let client = cluster.client();
    let data = payload(96 << 20, 7);
    block_on(async {
        client.make_bucket("bkt").await.unwrap();
        client.put_bytes("bkt", "big", &data, &Default::default()).await.unwrap();
        let keys = vec![("bkt".to_owned(), "big".to_owned()); proto::BATCH_ITEMS_MAX];
        let before = client.metadata_counts();
        let heads = client.head_many(&keys).await;
        let after = client.metadata_counts();
        for head in heads {
            assert_eq!(head.unwrap().meta.size, data.len() as u64);
        }
        let requests = after.requests - before.requests;
        assert!(requests >= 2 * 6, "{requests} metadata requests: every node should have answered in parts");
    });
}
