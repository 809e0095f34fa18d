//! Buckets and objects through the CLI and the smart client on a healthy cluster.

use crate::harness::{Cluster, Shape, block_on, payload, write_file};

#[test]
fn put_get_round_trips_every_size_byte_exact() {
    let cluster = Cluster::start(Shape::default());
    cluster.cli_ok(&["mb", "bkt"]);
    let chunk = 64 << 10;
    for (i, size) in [0, 1, chunk - 1, chunk, 4 * chunk, 4 * chunk + 1, 3_000_001]
        .into_iter()
        .enumerate()
    {
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
fn ranged_reads_fetch_exact_bytes_across_stripes() {
    let cluster = Cluster::start(Shape::default());
    let client = cluster.client();
    let data = payload(1_000_003, 7);
    block_on(async {
        client.make_bucket("bkt").await.unwrap();
        client
            .put_bytes("bkt", "obj", &data, &Default::default())
            .await
            .unwrap();
        let info = client.head("bkt", "obj").await.unwrap();
        let stripe = 4 * (64 << 10);
        for (offset, len) in [
            (0, 1),
            (1, 10),
            (65535, 2),
            (stripe - 1, 2),
            (stripe + 3, 3 * stripe),
            (999_000, 5000),
            (1_000_002, 1),
        ] {
            let mut buf = vec![0u8; len];
            let read = client
                .read_at(&info, offset as u64, &mut buf)
                .await
                .unwrap();
            let end = (offset + len).min(data.len());
            assert_eq!(read, end - offset);
            assert_eq!(
                &buf[..read],
                &data[offset..end],
                "offset {offset} len {len}"
            );
        }
        assert!(matches!(
            client.read_at(&info, 2_000_000, &mut [0u8; 4]).await,
            Err(client::Error::RangeNotSatisfiable { .. })
        ));
    });
}

#[test]
fn listing_is_sorted_prefixed_paged_and_hides_deleted_keys() {
    let cluster = Cluster::start(Shape {
        nodes: 6,
        drives_per_node: 2,
        ..Shape::default()
    });
    let client = cluster.client();
    block_on(async {
        client.make_bucket("bkt").await.unwrap();
        for i in (0..25).rev() {
            client
                .put_bytes("bkt", &format!("k/{i:03}"), b"x", &Default::default())
                .await
                .unwrap();
        }
        client
            .put_bytes("bkt", "other", b"y", &Default::default())
            .await
            .unwrap();
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
        let expected: Vec<String> = (0..25)
            .filter(|i| *i != 13)
            .map(|i| format!("k/{i:03}"))
            .collect();
        assert_eq!(keys, expected);
        assert!(matches!(
            client.head("bkt", "k/013").await,
            Err(client::Error::NotFound { .. })
        ));
    });
}

#[test]
fn buckets_follow_s3_rules_and_rb_refuses_non_empty() {
    let cluster = Cluster::start(Shape::default());
    assert!(
        cluster
            .cli_err(&["mb", "Bad_Name"])
            .contains("invalid bucket name")
    );
    cluster.cli_ok(&["mb", "bkt"]);
    cluster.cli_ok(&["mb", "bkt2"]);
    assert_eq!(cluster.cli_ok(&["ls"]), "bkt\nbkt2\n");
    let file = write_file(cluster.dir.path(), "f", b"hello");
    let err = cluster.cli_err(&["put", file.to_str().unwrap(), "nobucket/key"]);
    assert!(
        err.contains("no such bucket") && err.lines().count() == 1,
        "{err}"
    );
    let long_key = format!("bkt/{}", "k".repeat(1025));
    assert!(
        cluster
            .cli_err(&["put", file.to_str().unwrap(), &long_key])
            .contains("1025 bytes")
    );
    cluster.cli_ok(&["put", file.to_str().unwrap(), "bkt/f"]);
    assert!(cluster.cli_err(&["rb", "bkt"]).contains("not empty"));
    cluster.cli_ok(&["rm", "bkt/f"]);
    assert!(
        cluster
            .cli_err(&["get", "bkt/f", "-"])
            .contains("no such object")
    );
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
    assert!(
        stat.contains("5d41402abc4b2a76b9719d911017c592"),
        "etag is the MD5 of the body: {stat}"
    );
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
                        client
                            .put_bytes("bkt", "contended", &data, &Default::default())
                            .await
                            .unwrap();
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
            assert_eq!(
                other.head("bkt", "contended").await.unwrap().meta.version,
                first.meta.version
            );
        }
        let body = client.get("bkt", "contended").await.unwrap();
        assert!(
            candidates.contains(&body),
            "the winner is one writer's last PUT, whole"
        );
    });
}
