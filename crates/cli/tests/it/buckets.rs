//! Bucket deletion across erasure sets and multipart edge cases: retries, races and aborts that
//! must never damage a completed object.

use proto::{Request, Response};

use crate::harness::{Cluster, Shape, block_on, payload};
use crate::protocol::{RawSession, secret_of};

/// Whether node `idx` has `bucket` on its drives, asked of the node itself.
fn node_has_bucket(cluster: &Cluster, idx: usize, bucket: &str) -> bool {
    let mut session = RawSession::open(cluster.addrs[idx], &secret_of(cluster));
    match session.call(&Request::BucketList) {
        Response::Buckets { buckets } => buckets.iter().any(|b| b.name == bucket),
        other => panic!("unexpected answer {other:?}"),
    }
}

#[test]
fn delete_bucket_is_all_or_nothing_across_erasure_sets() {
    // 12 nodes, two erasure sets: objects of one set live on half of the nodes only.
    let cluster = Cluster::start(Shape { nodes: 12, ..Shape::default() });
    let client = cluster.client();
    let map = client.map().clone();
    assert_eq!(map.sets.len(), 2);
    let key = (0..100).map(|i| format!("k{i}")).find(|k| map.placement_in(0, "bkt", k).set_idx == 0).unwrap();
    let data = payload(200_000, 1);
    block_on(async {
        client.make_bucket("bkt").await.unwrap();
        client.put_bytes("bkt", &key, &data, &Default::default()).await.unwrap();
        let err = client.remove_bucket("bkt").await.unwrap_err();
        assert!(matches!(err, client::Error::BucketNotEmpty { .. }), "{err}");
    });
    for idx in 0..12 {
        assert!(node_has_bucket(&cluster, idx, "bkt"), "n{} dropped a non-empty bucket", idx + 1);
    }
    // An upload in progress does not keep the bucket (as in S3): it goes with it, pieces too.
    let upload = block_on(async {
        client.delete("bkt", &key).await.unwrap();
        let upload = client.create_multipart("bkt", "pending", &client::PutOptions::default()).await.unwrap();
        client.put_part("bkt", "pending", &upload, 1, &mut payload(1000, 2).as_slice()).await.unwrap();
        upload
    });
    block_on(client.remove_bucket("bkt")).unwrap();
    assert!((0..12).all(|idx| !node_has_bucket(&cluster, idx, "bkt")), "an empty bucket goes everywhere");
    assert_eq!(cluster.cli_ok(&["ls"]), "");
    block_on(async {
        let err = client.list_parts("bkt", "pending", &upload).await.unwrap_err();
        assert!(matches!(err, client::Error::NoSuchUpload { .. }), "the upload went with the bucket: {err}");
        // A bucket made again under the name starts without the old uploads.
        client.make_bucket("bkt").await.unwrap();
        assert!(client.list_multipart_uploads("bkt", "").await.unwrap().is_empty());
    });
}

#[test]
fn retried_complete_succeeds_and_abort_after_complete_keeps_the_object() {
    let cluster = Cluster::start(Shape::default());
    let client = cluster.client();
    let part = payload(client::PART_BYTES_MIN as usize, 1);
    let tail = payload(1000, 2);
    block_on(async {
        client.make_bucket("bkt").await.unwrap();
        let upload = client.create_multipart("bkt", "obj", &client::PutOptions::default()).await.unwrap();
        let one = client.put_part("bkt", "obj", &upload, 1, &mut part.as_slice()).await.unwrap();
        let two = client.put_part("bkt", "obj", &upload, 2, &mut tail.as_slice()).await.unwrap();
        let parts = vec![(1, one.etag.clone()), (2, two.etag.clone())];
        let first = client.complete_multipart("bkt", "obj", &upload, &parts).await.unwrap();
        // A client that lost the answer retries: same object, success.
        let again = client.complete_multipart("bkt", "obj", &upload, &parts).await.unwrap();
        assert_eq!(again.meta.version, first.meta.version);
        // Another part list for the finished upload is not a retry.
        let other = vec![(1, one.etag.clone())];
        let err = client.complete_multipart("bkt", "obj", &upload, &other).await.unwrap_err();
        assert!(matches!(err, client::Error::NoSuchUpload { .. }), "{err}");
        let err = client.abort_multipart("bkt", "obj", &upload).await.unwrap_err();
        assert!(matches!(err, client::Error::NoSuchUpload { .. }), "{err}");
        assert!(client.get("bkt", "obj").await.unwrap() == [part.clone(), tail.clone()].concat());
        // Uploading a part of a finished upload is refused and changes nothing.
        let err = client.put_part("bkt", "obj", &upload, 1, &mut &b"late"[..]).await.unwrap_err();
        assert!(matches!(err, client::Error::NoSuchUpload { .. }), "{err}");
        assert!(client.get("bkt", "obj").await.unwrap() == [part, tail].concat());
    });
}

#[test]
fn abort_after_a_complete_whose_marker_delete_failed_keeps_the_object() {
    // Two erasure sets: the object in one, the upload's marker in the other, whose nodes go
    // down so that Complete commits the object but cannot delete the marker.
    // A short retire grace: pieces deleted by mistake would be gone within the test.
    let mut cluster = Cluster::start(Shape { nodes: 12, retire_grace: "1s", ..Shape::default() });
    let client = cluster.client();
    let map = client.map().clone();
    let object_set = map.placement_in(0, "bkt", "obj").set_idx;
    let part = payload(client::PART_BYTES_MIN as usize, 3);
    let upload = block_on(async {
        client.make_bucket("bkt").await.unwrap();
        for _ in 0..40 {
            let upload = client.create_multipart("bkt", "obj", &client::PutOptions::default()).await.unwrap();
            let marker = format!("u/bkt/{upload}");
            if map.placement_in(0, client::MULTIPART_BUCKET, &marker).set_idx != object_set {
                return upload;
            }
            client.abort_multipart("bkt", "obj", &upload).await.unwrap();
        }
        panic!("no upload id whose marker lands in the other erasure set in 40 tries");
    });
    let one = block_on(client.put_part("bkt", "obj", &upload, 1, &mut part.as_slice())).unwrap();
    // Two nodes of the marker's set that are not in the object's set.
    let marker_set = &map.sets[1 - object_set];
    let object_nodes: Vec<usize> = map.sets[object_set].drives.iter().map(|d| d.node_idx).collect();
    let victims: Vec<usize> =
        marker_set.drives.iter().map(|d| d.node_idx).filter(|n| !object_nodes.contains(n)).take(2).collect();
    assert_eq!(victims.len(), 2);
    // The piece must stay readable: it is in one of the sets, each keeps k chunks.
    for &idx in &victims {
        cluster.kill_node(idx);
    }
    let degraded = cluster.client();
    block_on(async {
        // Complete reads the marker (k chunks suffice), commits the object in the healthy set,
        // and fails to delete the marker (no write quorum in its set): the object is complete.
        degraded.complete_multipart("bkt", "obj", &upload, &[(1, one.etag.clone())]).await.unwrap();
    });
    for &idx in &victims {
        cluster.start_node(idx);
    }
    cluster.wait_ready();
    let client = cluster.client();
    block_on(async {
        let uploads = client.list_multipart_uploads("bkt", "").await.unwrap();
        assert_eq!(uploads.len(), 1, "the marker survived the failed delete: the fault happened");
        // A client retrying the Complete (its answer was lost) commits the same pieces again:
        // they replace themselves, and must not be deleted as the replaced object's garbage.
        let again = client.complete_multipart("bkt", "obj", &upload, &[(1, one.etag.clone())]).await.unwrap();
        assert_eq!(again.meta.parts[0].piece_key, client.head("bkt", "obj").await.unwrap().meta.parts[0].piece_key);
        let until = std::time::Instant::now() + std::time::Duration::from_secs(4);
        while std::time::Instant::now() < until {
            assert!(client.get("bkt", "obj").await.unwrap() == part, "pieces survive the retire grace");
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
        // The retried Complete dropped the marker; an Abort now finds no upload.
        let err = client.abort_multipart("bkt", "obj", &upload).await.unwrap_err();
        assert!(matches!(err, client::Error::NoSuchUpload { .. }), "{err}");
        assert!(client.list_multipart_uploads("bkt", "").await.unwrap().is_empty(), "the marker is gone now");
        assert!(client.get("bkt", "obj").await.unwrap() == part, "the object's pieces were kept");
    });
}

#[test]
fn part_uploads_racing_complete_never_change_the_completed_object() {
    let cluster = Cluster::start(Shape::default());
    let client = cluster.client();
    let first = payload(client::PART_BYTES_MIN as usize, 10);
    let tail = payload(5000, 11);
    block_on(async {
        client.make_bucket("bkt").await.unwrap();
        for round in 0..4u64 {
            let key = format!("obj-{round}");
            let upload = client.create_multipart("bkt", &key, &client::PutOptions::default()).await.unwrap();
            let one = client.put_part("bkt", &key, &upload, 1, &mut first.as_slice()).await.unwrap();
            let two = client.put_part("bkt", &key, &upload, 2, &mut tail.as_slice()).await.unwrap();
            let parts = vec![(1, one.etag.clone()), (2, two.etag.clone())];
            // Retries of part 1 with other bytes race the Complete.
            let racers = (0..3u64).map(|i| {
                let (client, key, upload) = (client.clone(), key.clone(), upload.clone());
                async move {
                    let data = payload(client::PART_BYTES_MIN as usize, 100 + round * 10 + i);
                    let _ = client.put_part("bkt", &key, &upload, 1, &mut data.as_slice()).await;
                }
            });
            let (completed, _) = tokio::join!(
                client.complete_multipart("bkt", &key, &upload, &parts),
                futures_util::future::join_all(racers)
            );
            match completed {
                // Whatever raced, the object is exactly the parts Complete named.
                Ok(info) => {
                    assert!(client.get("bkt", &key).await.unwrap() == [first.clone(), tail.clone()].concat());
                    assert_eq!(client.head("bkt", &key).await.unwrap().meta.etag, info.meta.etag);
                }
                // A newer upload of part 1 landed before Complete looked: the named ETag is
                // not the part any more, as S3 answers.
                Err(client::Error::InvalidPart { number: 1, .. }) => {
                    client.abort_multipart("bkt", &key, &upload).await.unwrap();
                }
                Err(e) => panic!("round {round}: {e}"),
            }
        }
    });
}

#[test]
fn uploads_stay_listed_after_a_thousand_finished_ones() {
    let cluster = Cluster::start(Shape::default());
    let client = cluster.client();
    block_on(async {
        client.make_bucket("bkt").await.unwrap();
        // Finished uploads leave delete markers: more than a listing page of them.
        for batch in 0..(1100 / 20) {
            let work = (0..20).map(|i| {
                let client = client.clone();
                async move {
                    let key = format!("done-{batch}-{i}");
                    let upload = client.create_multipart("bkt", &key, &client::PutOptions::default()).await.unwrap();
                    client.abort_multipart("bkt", &key, &upload).await.unwrap();
                }
            });
            futures_util::future::join_all(work).await;
        }
        let live = client.create_multipart("bkt", "zzz-live", &client::PutOptions::default()).await.unwrap();
        let uploads = client.list_multipart_uploads("bkt", "").await.unwrap();
        assert_eq!(uploads.len(), 1, "{uploads:?}");
        assert_eq!(uploads[0].upload_id, live);
        client.abort_multipart("bkt", "zzz-live", &live).await.unwrap();
    });
}

#[test]
fn concurrent_if_absent_puts_have_exactly_one_winner() {
    let cluster = Cluster::start(Shape::default());
    let client = cluster.client();
    block_on(async {
        client.make_bucket("bkt").await.unwrap();
        for round in 0..5u64 {
            let key = format!("once-{round}");
            let writers = (0..8u64).map(|i| {
                let (client, key) = (client.clone(), key.clone());
                async move {
                    let data = payload(100_000, round * 100 + i);
                    let options =
                        client::PutOptions { condition: client::CommitCondition::IfAbsent, ..Default::default() };
                    (data.clone(), client.put_bytes("bkt", &key, &data, &options).await)
                }
            });
            let results = futures_util::future::join_all(writers).await;
            let winners: Vec<&Vec<u8>> = results.iter().filter(|(_, r)| r.is_ok()).map(|(d, _)| d).collect();
            assert_eq!(winners.len(), 1, "round {round}: exactly one creator wins");
            for (_, result) in &results {
                if let Err(e) = result {
                    assert!(matches!(e, client::Error::PreconditionFailed { .. }), "{e}");
                }
            }
            assert!(client.get("bkt", &key).await.unwrap() == *winners[0], "the winner's bytes are stored");
        }
    });
}

#[test]
fn the_gateway_aborts_multipart_uploads_older_than_its_expiry_with_their_pieces() {
    let shape = Shape { retire_grace: "1s", ..Shape::default() };
    let cluster = Cluster::start(shape);
    let client = cluster.client();
    let part = payload(client::PART_BYTES_MIN as usize, 3);
    let (old, done) = block_on(async {
        client.make_bucket("bkt").await.unwrap();
        let old = client.create_multipart("bkt", "old", &client::PutOptions::default()).await.unwrap();
        client.put_part("bkt", "old", &old, 1, &mut part.as_slice()).await.unwrap();
        // A completed upload's pieces belong to its object: they stay.
        let done = client.create_multipart("bkt", "done", &client::PutOptions::default()).await.unwrap();
        let info = client.put_part("bkt", "done", &done, 1, &mut part.as_slice()).await.unwrap();
        client.complete_multipart("bkt", "done", &done, &[(1, info.etag)]).await.unwrap();
        (old, done)
    });
    let pieces_before = (0..6).map(|i| cluster.data_files(i).len()).sum::<usize>();
    let port = crate::harness::free_ports(1);
    let mut gateway = std::process::Command::new(crate::harness::TESSERA)
        .args(["gateway", "--config"])
        .arg(&cluster.config)
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--multipart-expiry",
            "3s",
            "--multipart-check-interval",
            "1s",
        ])
        .env("TESSERA_ACCESS_KEY", "gc-test-access")
        .env("TESSERA_SECRET_KEY", "gc-test-secret-key")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let gone = loop {
        let uploads = block_on(client.list_multipart_uploads("bkt", "")).unwrap();
        if uploads.is_empty() || std::time::Instant::now() > deadline {
            break uploads.is_empty();
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    let _ = gateway.kill();
    let _ = gateway.wait();
    assert!(gone, "the abandoned upload was not aborted within 60 s");
    block_on(async {
        assert!(matches!(client.list_parts("bkt", "old", &old).await, Err(client::Error::NoSuchUpload { .. })));
        assert!(client.get("bkt", "done").await.unwrap() == part, "a completed upload's object keeps its pieces");
        let _ = done;
    });
    // The abandoned piece's chunks go once its delete is acknowledged and the grace passed.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while (0..6).map(|i| cluster.data_files(i).len()).sum::<usize>() >= pieces_before {
        assert!(std::time::Instant::now() < deadline, "the abandoned piece's chunk files were not deleted");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}
