//! Growing a running cluster by a pool of new nodes (`tessera pool add`): nothing moves, old
//! objects stay readable (also by clients with the old map), new keys spread over both pools
//! by free space, a key's later versions stay in its pool, listing merges pools.

use std::net::SocketAddr;

use crate::harness::{Cluster, Shape, block_on, free_ports, payload};

pub(crate) fn map_of(cluster: &Cluster) -> cluster::ClusterMap {
    let text = std::fs::read_to_string(&cluster.config).unwrap();
    cluster::ClusterMap::from_toml(&text, &cluster.data_dir()).unwrap()
}

/// `tessera pool add` of six nodes on new ports, each formatted and started.
pub(crate) fn add_pool(cluster: &mut Cluster) -> Vec<SocketAddr> {
    add_pool_of(cluster, 6, "4+2", "pool 2 added (joining): nodes n7, n8, n9, n10, n11, n12, 1 erasure set(s) of 4+2")
}

/// `tessera pool add --ec EC` of `count` nodes (one drive each) on new ports, each formatted
/// and started; the command must print `expected`.
pub(crate) fn add_pool_of(cluster: &mut Cluster, count: u16, ec: &str, expected: &str) -> Vec<SocketAddr> {
    add_pool_with(cluster, count, ec, expected, |_, _| {})
}

/// [`add_pool_of`], with `prepare(cluster, node index)` run for each new node before its drive
/// is formatted (to mount something there, say).
pub(crate) fn add_pool_with(
    cluster: &mut Cluster,
    count: u16,
    ec: &str,
    expected: &str,
    prepare: impl Fn(&Cluster, usize),
) -> Vec<SocketAddr> {
    let base = free_ports(usize::from(count));
    let addrs: Vec<SocketAddr> = (0..count).map(|i| SocketAddr::from(([127, 0, 0, 1], base + i))).collect();
    let mut args = vec!["pool".to_owned(), "add".to_owned(), "--ec".to_owned(), ec.to_owned()];
    for addr in &addrs {
        args.extend(["--node".to_owned(), format!("{addr}=1")]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = cluster.cli_ok(&args);
    assert!(out.contains(expected), "{out}");
    let first = cluster.addrs.len();
    cluster.add_nodes(&addrs);
    for idx in first..first + addrs.len() {
        prepare(cluster, idx);
        cluster.cli_ok(&["drive", "format", "--node", &format!("n{}", idx + 1)]);
        cluster.start_node(idx);
    }
    cluster.wait_ready();
    // New nodes take the buckets the first pool's nodes hold; then the pool can be activated.
    for idx in first..first + addrs.len() {
        cluster.wait_log(idx, "took a bucket its peers hold");
    }
    let out = cluster.cli_ok(&["pool", "activate", "2"]);
    assert!(out.contains("pool 2 is active: map version 3"), "{out}");
    addrs
}

#[test]
fn a_pool_added_to_a_running_cluster_takes_new_keys_and_moves_nothing() {
    let mut cluster = Cluster::start(Shape::default());
    cluster.cli_ok(&["mb", "bkt"]);
    let before = cluster.client();
    let old_keys: Vec<String> = (0..12).map(|i| format!("old-{i}")).collect();
    block_on(async {
        for (i, key) in old_keys.iter().enumerate() {
            before.put_bytes("bkt", key, &payload(20_000 + i * 1000, i as u64), &Default::default()).await.unwrap();
        }
    });
    let files_before: Vec<usize> = (0..6).map(|idx| cluster.data_files(idx).len()).collect();

    add_pool(&mut cluster);
    let map = map_of(&cluster);
    assert_eq!(map.version, 3);
    assert_eq!(map.pools.len(), 2);
    let second_pool = map.pools[1].sets.clone();
    let status = cluster.cli_ok(&["pool", "status"]);
    assert!(status.contains("pool 1\tactive\t1 set(s) of 4+2\tnodes n1,n2,n3,n4,n5,n6\tfree "), "{status}");
    assert!(status.contains("pool 2\tactive\t1 set(s) of 4+2\tnodes n7,n8,n9,n10,n11,n12\tfree "), "{status}");

    // Nothing moved: the first pool's nodes hold exactly the files they held.
    let files_after: Vec<usize> = (0..6).map(|idx| cluster.data_files(idx).len()).collect();
    assert_eq!(files_before, files_after);

    let fresh = cluster.client();
    block_on(async {
        // A client that still plans with version 1 reads every old object (the nodes tell it to
        // refresh; it then asks both pools).
        for (i, key) in old_keys.iter().enumerate() {
            assert_eq!(before.get("bkt", key).await.unwrap(), payload(20_000 + i * 1000, i as u64), "{key}");
        }
        assert_eq!(before.map().version, 3, "the old client took the new map");
        // New keys go to both pools (the same free space here: half and half, at random).
        let mut in_second = 0;
        for i in 0..40 {
            let key = format!("new-{i}");
            let info =
                fresh.put_bytes("bkt", &key, &payload(5_000 + i, 100 + i as u64), &Default::default()).await.unwrap();
            in_second += usize::from(second_pool.contains(&info.placement.set_idx));
        }
        assert!((5..=35).contains(&in_second), "{in_second} of 40 new keys went to the new pool");
        for i in 0..40 {
            let key = format!("new-{i}");
            let info = before.head("bkt", &key).await.unwrap();
            assert_eq!(fresh.get("bkt", &key).await.unwrap(), payload(5_000 + i, 100 + i as u64));
            assert_eq!(info.meta_positions.len(), 6, "{key}: every drive of its set holds it");
            // A key's next version goes where its first is.
            let again = fresh.put_bytes("bkt", &key, b"second version", &Default::default()).await.unwrap();
            assert_eq!(again.placement.set_idx, info.placement.set_idx, "{key}");
            assert_eq!(before.get("bkt", &key).await.unwrap(), b"second version");
        }
        // Old keys are overwritten and deleted in the first pool.
        let info = fresh.put_bytes("bkt", "old-3", b"replaced", &Default::default()).await.unwrap();
        assert!(map.pools[0].sets.contains(&info.placement.set_idx));
        assert_eq!(before.get("bkt", "old-3").await.unwrap(), b"replaced");
        fresh.delete("bkt", "old-4").await.unwrap();
        assert!(matches!(before.get("bkt", "old-4").await, Err(client::Error::NotFound { .. })));
        // A listing merges both pools.
        let page = fresh.list("bkt", "", "", 1000).await.unwrap();
        assert_eq!(page.entries.len(), 12 - 1 + 40);
    });
    let listed = cluster.cli_ok(&["ls", "bkt"]);
    assert!(listed.contains("new-39") && listed.contains("old-11") && !listed.contains("old-4"), "{listed}");
}

#[test]
fn a_pool_that_is_down_does_not_hide_the_other_pools_objects() {
    let mut cluster = Cluster::start(Shape::default());
    cluster.cli_ok(&["mb", "bkt"]);
    let client = cluster.client();
    block_on(async { client.put_bytes("bkt", "first", &payload(30_000, 1), &Default::default()).await.unwrap() });
    add_pool(&mut cluster);
    let map = map_of(&cluster);
    // Three nodes of the new pool down: more than m, so its set cannot be read or written.
    for idx in 6..9 {
        cluster.kill_node(idx);
    }
    let fresh = cluster.client();
    block_on(async {
        assert_eq!(fresh.get("bkt", "first").await.unwrap(), payload(30_000, 1));
        // A write must know what every pool holds of the key: three drives of six show any
        // version acknowledged there (it is on five).
        fresh.put_bytes("bkt", "first", b"v2", &Default::default()).await.unwrap();
        assert_eq!(fresh.get("bkt", "first").await.unwrap(), b"v2");
    });
    // With one drive of the new pool's set left, it cannot: the write fails and says why.
    cluster.kill_node(9);
    cluster.kill_node(10);
    block_on(async {
        let err = fresh.put_bytes("bkt", "first", b"v3", &Default::default()).await.unwrap_err();
        assert!(err.to_string().contains("pool 2 (set 1) cannot show which versions of the key it holds"), "{err}");
        assert_eq!(fresh.get("bkt", "first").await.unwrap(), b"v2");
    });
    assert!(map.pools[0].sets.contains(&map.placement_in(0, "bkt", "first").set_idx));
    // Buckets live on the first pool's nodes: made and listed while the new pool is down, and
    // taken by its nodes when they return.
    cluster.cli_ok(&["mb", "later"]);
    assert!(cluster.cli_ok(&["ls"]).contains("later"));
    cluster.start_node(6);
    cluster.wait_ready();
    cluster.wait_log(6, "bucket=\"later\"");
}

#[test]
fn pools_that_cannot_join_are_refused_with_one_line_and_change_nothing() {
    let cluster = Cluster::start(Shape::default());
    let fresh: Vec<String> = {
        let base = free_ports(6);
        (0..6u16).map(|i| format!("127.0.0.1:{}=1", base + i)).collect()
    };
    let pool_add = |nodes: &[String], extra: &[&str]| {
        let mut args = vec!["pool", "add"];
        for node in nodes {
            args.extend(["--node", node.as_str()]);
        }
        args.extend(extra);
        cluster.cli(&args)
    };
    let one_line = |output: std::process::Output, expected: &str| {
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(!output.status.success(), "must fail: {}", String::from_utf8_lossy(&output.stdout));
        assert!(stderr.contains(expected), "expected {expected:?} in: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    };
    one_line(pool_add(&fresh[..5], &[]), "erasure config 4+2 needs at least 6 nodes, the cluster has 5");
    let mut overlapping = fresh.clone();
    overlapping[2] = format!("{}=1", cluster.addrs[3]);
    one_line(
        pool_add(&overlapping, &[]),
        &format!("a new pool cannot reuse address {}: node n4 has it", cluster.addrs[3]),
    );
    let mut twice = fresh.clone();
    twice[1] = twice[0].clone();
    one_line(pool_add(&twice, &[]), "is used by two nodes");
    one_line(pool_add(&fresh[..2], &["--ec", "2+1"]), "erasure config 2+1 needs at least 3 nodes, the cluster has 2");
    assert_eq!(map_of(&cluster).version, 1);
    let maps = cluster.cli_ok(&["map", "status"]);
    assert!(maps.contains("all 6 nodes hold version 1"), "{maps}");

    // A pool added but not started is joining: nothing asks it, everything keeps working, and
    // it cannot be activated until its nodes run.
    cluster.cli_ok(&["mb", "bkt"]);
    assert!(pool_add(&fresh, &[]).status.success());
    // Run again (as after a push cut short), it finishes the same pool's push: no third pool.
    let again = pool_add(&fresh, &[]);
    assert!(String::from_utf8_lossy(&again.stdout).contains("pool 2 with these nodes is in map version 2"));
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
    let status = cluster.cli_ok(&["pool", "status"]);
    assert!(status.contains("pool 2\tjoining\t"), "{status}");
    let client = cluster.client();
    block_on(async {
        for i in 0..8 {
            let key = format!("k{i}");
            let info = client.put_bytes("bkt", &key, b"while joining", &Default::default()).await.unwrap();
            assert_eq!(info.placement.set_idx, 0, "{key}: only the active pool takes keys");
            assert_eq!(client.get("bkt", &key).await.unwrap(), b"while joining");
        }
    });
    assert_eq!(client.map().version, 2);
    one_line(cluster.cli(&["pool", "activate", "2"]), "pool 2 stays joining: n7 does not answer");
    one_line(cluster.cli(&["pool", "activate", "1"]), "pool 1 is active, not joining");
    one_line(cluster.cli(&["pool", "activate", "9"]), "the cluster has no pool 9");
    assert_eq!(map_of(&cluster).version, 2);
}

#[test]
fn a_pool_added_under_a_running_workload_loses_no_acknowledged_write() {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    let mut cluster = Cluster::start(Shape::default());
    cluster.cli_ok(&["mb", "bkt"]);
    // Writers: two clients made before the pool exists (their map goes stale mid-run), each
    // writing its own keys over and over; the last acknowledged value of each key is recorded.
    let acked: Arc<Mutex<HashMap<String, Vec<u8>>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let (client, acked, stop, failures) =
                (cluster.client(), Arc::clone(&acked), Arc::clone(&stop), Arc::clone(&failures));
            std::thread::spawn(move || {
                let mut round = 0u64;
                // Bounded: at most 400 writes per writer, whatever happens.
                while !stop.load(Ordering::SeqCst) && round < 400 {
                    let key = format!("w{w}-{}", round % 24);
                    let value = payload(3_000 + (round as usize % 7) * 100, (w * 1000) as u64 + round);
                    match block_on(client.put_bytes("bkt", &key, &value, &Default::default())) {
                        Ok(_) => {
                            acked.lock().unwrap().insert(key, value);
                        }
                        // Not acknowledged: the key keeps its previous value or takes this one.
                        Err(e) => failures.lock().unwrap().push(format!("{key}: {e}")),
                    }
                    round += 1;
                }
                client
            })
        })
        .collect();
    // Every key written once before the pool comes.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while acked.lock().unwrap().len() < 48 {
        assert!(std::time::Instant::now() < deadline, "writers too slow: {:?}", failures.lock().unwrap());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let acked_before = acked.lock().unwrap().clone();
    add_pool(&mut cluster);
    std::thread::sleep(std::time::Duration::from_millis(500));
    stop.store(true, Ordering::SeqCst);
    let stale_clients: Vec<client::Client> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    let acked = acked.lock().unwrap();
    let overwritten = acked.iter().filter(|(key, value)| acked_before.get(*key) != Some(value)).count();
    assert!(overwritten > 0, "the writers kept writing while the pool was added");
    let map = map_of(&cluster);
    let reader = cluster.client();
    let mut in_second = 0;
    block_on(async {
        for (key, value) in acked.iter() {
            let info = reader.head("bkt", key).await.unwrap();
            in_second += usize::from(map.pools[1].sets.contains(&info.placement.set_idx));
            assert_eq!(&reader.get("bkt", key).await.unwrap(), value, "{key}: the last acknowledged value");
        }
    });
    // Every key was first written before the pool existed: all stay in the first pool.
    assert_eq!(in_second, 0, "a key's later versions follow its first");
    for client in &stale_clients {
        assert_eq!(client.map().version, 3, "the writers took the new map");
    }
    // The pool's arrival is not an error for writers (nothing was down).
    assert!(failures.lock().unwrap().is_empty(), "{:?}", failures.lock().unwrap());
}

#[test]
fn a_key_whose_versions_raced_into_two_pools_stays_deleted_once_the_marker_is_collected() {
    use proto::{Request, Response};
    let shape = Shape { scrub_interval: "1s", retire_grace: "1s", ..Shape::default() };
    let mut cluster = Cluster::start(shape);
    cluster.cli_ok(&["mb", "bkt"]);
    let writer = cluster.client();
    let older = block_on(writer.put_bytes("bkt", "raced", b"older, in pool 1", &Default::default())).unwrap();
    add_pool(&mut cluster);
    let map = map_of(&cluster);
    // What a second first write racing that one, to pool 2, then deleted, leaves there: a
    // delete marker newer than pool 1's version, acknowledged on every drive of the key's set.
    let placement = map.placement_in(1, "bkt", "raced");
    let version = proto::VersionId { unix_ns: older.meta.version.unix_ns + 1_000, writer: 7 };
    let marker = proto::ObjectMeta {
        version,
        deleted: true,
        size: 0,
        etag: String::new(),
        set_idx: placement.set_idx as u32,
        rotation: placement.rotation as u8,
        crcs: Vec::new(),
        ..older.meta.clone()
    };
    let secret = crate::protocol::secret_of(&cluster);
    for drive in &map.sets[placement.set_idx].drives {
        let mut session = crate::protocol::RawSession::open(map.nodes[drive.node_idx].addr, &secret);
        let commit = Request::Commit {
            drive: drive.drive_idx as u32,
            meta: marker.clone(),
            missing_positions: Vec::new(),
            condition: Default::default(),
        };
        assert!(matches!(session.call(&commit), Response::Committed { .. }));
        let finalize = Request::Finalize {
            drive: drive.drive_idx as u32,
            bucket: "bkt".into(),
            key: "raced".into(),
            version,
            missing_positions: Vec::new(),
        };
        assert_eq!(session.call(&finalize), Response::Ok);
    }
    let absent =
        |client: &client::Client| matches!(block_on(client.get("bkt", "raced")), Err(client::Error::NotFound { .. }));
    assert!(absent(&cluster.client()) && absent(&writer), "the marker is the newest version");
    // The scrubbers of pool 2's nodes collect the marker (every drive holds it), leaving only
    // its acknowledged floor there: pool 1's older version must not come back.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let status = String::from_utf8_lossy(&cluster.cli(&["repair", "status", "--json"]).stdout).into_owned();
        let collected: u64 = status
            .split("\"markers_collected\":")
            .skip(1)
            .filter_map(|rest| rest.split(|c: char| !c.is_ascii_digit()).next()?.parse::<u64>().ok())
            .sum();
        if collected >= 6 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the marker was not collected: {status}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert!(absent(&cluster.client()), "a client that never saw the key");
    assert!(absent(&writer), "the client that expects the key in pool 1");
    // Known gap (ARCHITECTURE.md, Pools): a listing still shows pool 1's older version, as
    // listings carry no floors.
}

#[test]
fn two_clients_racing_the_first_writes_of_keys_put_each_key_in_one_pool() {
    use proto::{MetaDetail, MetaKey, Request, Response};
    let mut cluster = Cluster::start(Shape::default());
    cluster.cli_ok(&["mb", "bkt"]);
    add_pool(&mut cluster);
    let map = map_of(&cluster);
    let (one, two) = (cluster.client(), cluster.client());
    let keys: Vec<String> = (0..16).map(|i| format!("raced-{i}")).collect();
    block_on(async {
        // Both first writes of each key start together: each writer's version read finds nothing,
        // so each chooses a pool for a new key on its own.
        let writes = keys.iter().map(|key| {
            let (one, two) = (one.clone(), two.clone());
            async move {
                let options = client::PutOptions::default();
                let (a, b) = tokio::join!(
                    one.put_bytes("bkt", key, b"from client one", &options),
                    two.put_bytes("bkt", key, b"from client two", &options)
                );
                (a.unwrap().meta.version, b.unwrap().meta.version)
            }
        });
        let versions = futures_util::future::join_all(writes).await;
        let secret = crate::protocol::secret_of(&cluster);
        let mut in_second = 0;
        for (key, (a, b)) in keys.iter().zip(versions) {
            // Which pools' sets hold any version of the key, on any drive.
            let holders: Vec<usize> = (0..map.pools.len())
                .filter(|&pool| {
                    let placement = map.placement_in(pool, "bkt", key);
                    map.sets[placement.set_idx].drives.iter().any(|drive| {
                        let mut session = crate::protocol::RawSession::open(map.nodes[drive.node_idx].addr, &secret);
                        let item = MetaKey { drive: drive.drive_idx as u32, bucket: "bkt".into(), key: key.clone() };
                        match session.call(&Request::MetaGet { items: vec![item], detail: MetaDetail::Versions }) {
                            Response::Versions { keys } => keys[0].current.is_some() || !keys[0].retained.is_empty(),
                            other => panic!("{other:?}"),
                        }
                    })
                })
                .collect();
            assert_eq!(holders.len(), 1, "{key}: versions {a:?} and {b:?} are in pools {holders:?}");
            in_second += usize::from(holders[0] == 1);
            let newest = if a > b { "from client one" } else { "from client two" };
            assert_eq!(one.get("bkt", key).await.unwrap(), newest.as_bytes(), "{key}");
        }
        assert!((1..16).contains(&in_second), "{in_second} of 16 keys in pool 2: new keys should use both pools");
    });
}
