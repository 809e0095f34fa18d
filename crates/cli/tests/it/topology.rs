//! Clusters across addresses, listen versus advertised addresses, and cluster-map versions:
//! refreshes of stale clients, nodes that catch up, refused changes, foreign clusters.

use std::fs;
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::{Cluster, Shape, TESSERA, block_on, free_ports, payload, write_file};

/// Six "hosts": 127.0.0.2 to 127.0.0.7 (any 127.0.0.0/8 address is this machine's), each
/// node on its own address and port.
fn six_hosts() -> Vec<SocketAddr> {
    let base = free_ports(6);
    (0..6u8).map(|i| SocketAddr::from(([127, 0, 0, 2 + i], base + u16::from(i)))).collect()
}

fn map_version(path: &std::path::Path) -> u64 {
    let text = fs::read_to_string(path).unwrap();
    cluster::ClusterMap::from_toml(&text, path.parent().unwrap()).unwrap().version
}

/// A file only its owner reads (as cluster.toml must be, or commands warn about it).
pub(crate) fn private_file(dir: &std::path::Path, name: &str, text: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let path = write_file(dir, name, text.as_bytes());
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
    path
}

fn one_line_error(output: &std::process::Output, expected: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "must fail, printed {}", String::from_utf8_lossy(&output.stdout));
    assert!(stderr.starts_with("error: ") && stderr.contains(expected), "expected {expected:?} in: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
}

#[test]
fn a_cluster_across_addresses_serves_from_each_nodes_own_address() {
    let addrs = six_hosts();
    let mut cluster = Cluster::init_across(addrs.clone(), Shape { drives_per_node: 2, ..Shape::default() });
    let text = fs::read_to_string(&cluster.config).unwrap();
    for addr in &addrs {
        assert!(text.contains(&addr.to_string()), "cluster.toml lacks {addr}:\n{text}");
    }
    for idx in 0..addrs.len() {
        cluster.start_node(idx);
    }
    cluster.wait_ready();
    // Each node listens on its own address only, not on every address of the machine.
    let other = SocketAddr::from(([127, 0, 0, 1], addrs[0].port()));
    assert!(TcpStream::connect_timeout(&other, Duration::from_millis(200)).is_err());
    cluster.cli_ok(&["mb", "bkt"]);
    let data = payload(300_000, 1);
    let file = write_file(cluster.dir.path(), "in.bin", &data);
    cluster.cli_ok(&["put", file.to_str().unwrap(), "bkt/obj"]);
    let out = cluster.dir.path().join("out.bin");
    cluster.cli_ok(&["get", "bkt/obj", out.to_str().unwrap()]);
    assert_eq!(fs::read(&out).unwrap(), data);
    // The drives were labelled for this cluster by `tessera drive format`.
    let label = fs::read_to_string(cluster.drive_dir(3, 1).join("cluster-id")).unwrap();
    assert!(text.contains(&format!("cluster_id = \"{}\"", label.trim())), "label {label:?}");
}

#[test]
fn a_node_listens_where_told_and_is_reached_at_its_advertised_address() {
    let addrs = six_hosts();
    let mut cluster = Cluster::init_across(addrs.clone(), Shape::default());
    let listen = format!("0.0.0.0:{}", addrs[0].port());
    cluster.set_node_args(0, &["--listen", &listen]);
    for idx in 0..addrs.len() {
        cluster.start_node(idx);
    }
    cluster.wait_ready();
    // Bound to every address: reachable at one the map does not name.
    let elsewhere = SocketAddr::from(([127, 0, 0, 99], addrs[0].port()));
    assert!(TcpStream::connect_timeout(&elsewhere, Duration::from_millis(500)).is_ok());
    // Clients dial the advertised address; n1 holds a chunk of every object of a 6-drive set.
    let client = cluster.client();
    block_on(async {
        client.make_bucket("bkt").await.unwrap();
        let info = client.put_bytes("bkt", "k", &payload(100_000, 2), &Default::default()).await.unwrap();
        // n1 took its chunk and answered the metadata read at the address it advertises.
        let n1 = info.drives.iter().position(|(node, _)| node == "n1").unwrap();
        assert!(client.head("bkt", "k").await.unwrap().meta_positions.contains(&n1));
        assert_eq!(client.get("bkt", "k").await.unwrap(), payload(100_000, 2));
    });
}

#[test]
fn a_client_with_an_older_map_fetches_the_new_one_and_retries() {
    let mut cluster = Cluster::start(Shape::default());
    let stale = cluster.client();
    let streaming = cluster.client();
    let reader = cluster.client();
    block_on(async {
        stale.make_bucket("bkt").await.unwrap();
        stale.put_bytes("bkt", "before", b"old map", &Default::default()).await.unwrap();
    });
    assert_eq!(stale.map().version, 1);
    // n6's host is replaced by one at another address: the map says so from version 2.
    cluster.kill_node(5);
    let moved = SocketAddr::from(([127, 0, 0, 1], free_ports(1)));
    let text = fs::read_to_string(&cluster.config).unwrap();
    let edited =
        private_file(cluster.dir.path(), "next.toml", &text.replace(&cluster.addrs[5].to_string(), &moved.to_string()));
    let out = cluster.cli_ok(&["map", "push", edited.to_str().unwrap()]);
    assert!(out.contains("map version 2 is on every node but n6"), "{out}");
    assert_eq!(map_version(&cluster.config), 2);
    for idx in 0..5 {
        cluster.wait_log(idx, "cluster map updated");
    }
    cluster.addrs[5] = moved;
    cluster.start_node(5);
    cluster.wait_ready();
    block_on(async {
        // Planned with version 1: refused by the nodes, refreshed, retried.
        assert_eq!(stale.get("bkt", "before").await.unwrap(), b"old map");
        assert_eq!(stale.map().version, 2, "the read must have refreshed the map");
        stale.put_bytes("bkt", "after", b"new map", &Default::default()).await.unwrap();
        // A streaming PUT plans again before it sends its first chunk.
        let mut source: &[u8] = &payload(200_000, 3);
        streaming.put("bkt", "streamed", &mut source, &Default::default()).await.unwrap();
        assert_eq!(streaming.map().version, 2);
    });
    // With n1 and n2 down every read needs n6, at its new address only: a client that still
    // plans with version 1 (n6 at the old address) must find it there.
    cluster.kill_node(0);
    cluster.kill_node(1);
    block_on(async {
        assert_eq!(reader.map().version, 1);
        assert_eq!(reader.get("bkt", "after").await.unwrap(), b"new map");
        assert_eq!(reader.get("bkt", "streamed").await.unwrap(), payload(200_000, 3));
        assert_eq!(reader.get("bkt", "before").await.unwrap(), b"old map");
    });
}

#[test]
fn a_node_refuses_a_client_of_another_cluster_even_with_the_secret() {
    use std::io::{Read as _, Write as _};
    let cluster = Cluster::start(Shape::default());
    let map = cluster.client().map();
    let mut stream = TcpStream::connect(cluster.addrs[0]).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (_, body) = crate::protocol::read_plain_frame(&mut stream);
    let challenge: proto::Challenge = proto::decode_message(&body, "challenge").unwrap();
    assert_eq!(challenge.cluster_id, map.cluster_id);
    // The right secret, a valid proof, another cluster's id.
    let auth = proto::AuthProof::new(&map.secret, &challenge, [5; proto::NONCE_BYTES], "another-cluster", 1, &[]);
    stream.write_all(&proto::encode_frame(proto::FrameKind::Auth, &auth).unwrap()).unwrap();
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
    assert!(rest.is_empty(), "the node must close the connection without answering");
    cluster.wait_log(0, "the client's map is of cluster another-cluster");
}

#[test]
fn a_node_that_missed_a_map_change_takes_it_from_its_peers() {
    let mut cluster = Cluster::start(Shape::default());
    // n6 on a host of its own: its own copy of cluster.toml (beside the shared one, so its
    // relative drive paths mean the same).
    let own = cluster.data_dir().join("n6.toml");
    fs::copy(&cluster.config, &own).unwrap();
    cluster.set_node_config(5, own.clone());
    cluster.kill_node(5);
    let edited = cluster.dir.path().join("next.toml");
    fs::copy(&cluster.config, &edited).unwrap();
    let out = cluster.cli_ok(&["map", "push", edited.to_str().unwrap()]);
    assert!(out.contains("every node but n6"), "{out}");
    assert_eq!(map_version(&own), 1, "n6's copy is untouched while it is down");
    cluster.start_node(5);
    cluster.wait_ready();
    let deadline = Instant::now() + Duration::from_secs(20);
    while map_version(&own) != 2 {
        assert!(Instant::now() < deadline, "n6 did not take the new map:\n{}", cluster.log(5));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(cluster.log(5).contains("took a newer cluster map from a peer"));
    let status = cluster.cli_ok(&["map", "status"]);
    assert!(status.contains("all 6 nodes hold version 2"), "{status}");
}

#[test]
fn map_changes_that_would_move_data_or_race_another_change_are_refused() {
    let cluster = Cluster::start(Shape::default());
    let text = fs::read_to_string(&cluster.config).unwrap();
    let push = |name: &str, text: &str| {
        let path = private_file(cluster.dir.path(), name, text);
        cluster.cli(&["map", "push", path.to_str().unwrap()])
    };
    // Moving a node's drive elsewhere would lose the objects on it.
    let moved = text.replacen("\"n6/d1\"", "\"n6/elsewhere\"", 1);
    assert_ne!(moved, text);
    one_line_error(&push("moved.toml", &moved), "cannot follow version 1");
    // Growing by editing the map (a second drive per node, a second set) would move objects.
    let mut grown = cluster::ClusterMap::from_toml(&text, &cluster.data_dir()).unwrap();
    for node in &mut grown.nodes {
        node.drives.push(format!("{}/d2", node.id).into());
    }
    let second = (0..6).map(|node_idx| cluster::DriveRef { node_idx, drive_idx: 1 }).collect();
    grown.sets.push(cluster::ErasureSet { drives: second });
    grown.pools[0].sets = 0..2;
    one_line_error(&push("grown.toml", &grown.to_toml()), "cannot follow version 1");
    let other_cluster = text.replacen("cluster_id = \"", "cluster_id = \"x", 1);
    one_line_error(&push("other.toml", &other_cluster), "belongs to cluster");
    assert!(cluster.cli_ok(&["map", "status"]).contains("all 6 nodes hold version 1"));
    // A change goes through; a second one edited from the old map must not undo it.
    assert!(push("first.toml", &text).status.success());
    // An edit of version 1 made before that change: refused, and running the first change
    // again is a no-op (pushes cut short can be finished).
    let elsewhere = SocketAddr::from(([127, 0, 0, 1], free_ports(1))).to_string();
    one_line_error(&push("late.toml", &text.replace(&cluster.addrs[5].to_string(), &elsewhere)), "must take version 3");
    assert!(push("again.toml", &text).status.success());
    assert!(cluster.cli_ok(&["map", "status"]).contains("all 6 nodes hold version 2"));
}

#[test]
fn clients_and_nodes_refuse_another_clusters_nodes_and_drives() {
    let a = Cluster::start(Shape::default());
    let b = Cluster::start(Shape::default());
    let a_text = fs::read_to_string(&a.config).unwrap();
    let b_text = fs::read_to_string(&b.config).unwrap();
    let id =
        |text: &str| text.lines().find_map(|l| l.strip_prefix("cluster_id = ")).unwrap().trim_matches('"').to_owned();
    let (a_id, b_id) = (id(&a_text), id(&b_text));
    // A client whose map names cluster A but whose addresses reach B's nodes.
    let confused = private_file(a.dir.path(), "confused.toml", &b_text.replace(&b_id, &a_id));
    let output = Command::new(TESSERA).args(["mb", "bkt", "--config", confused.to_str().unwrap()]).output().unwrap();
    one_line_error(&output, "belongs to cluster");
    // A node started with B's map on one of A's drives: refused before anything changes.
    let a_drive = a.drive_dir(0, 0);
    let before: Vec<_> = fs::read_dir(&a_drive).unwrap().map(|e| e.unwrap().file_name()).collect();
    let b_on_a = b_text.replacen("\"n1/d1\"", &format!("{:?}", a_drive.to_str().unwrap()), 1);
    let config = private_file(b.dir.path().join("data").as_path(), "b-on-a.toml", &b_on_a);
    let output = Command::new(TESSERA)
        .args(["node", "--config", config.to_str().unwrap(), "--id", "n1", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    one_line_error(&output, &format!("belongs to cluster {a_id}, the map is of cluster {b_id}"));
    let after: Vec<_> = fs::read_dir(&a_drive).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(before, after);
}

#[test]
fn init_across_hosts_refuses_bad_node_lists_with_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let run = |extra: &[String]| {
        Command::new(TESSERA).args(["init", "--data", data.to_str().unwrap()]).args(extra).output().unwrap()
    };
    let nodes = |list: &[String]| list.iter().flat_map(|n| ["--node".to_owned(), n.clone()]).collect::<Vec<_>>();
    let six: Vec<String> = (2..8).map(|i| format!("127.0.0.{i}:7001")).collect();
    let mut twice = six.clone();
    twice[5] = six[0].clone();
    one_line_error(&run(&nodes(&twice)), "used by two nodes");
    one_line_error(&run(&nodes(&six[..5])), "needs at least 6 nodes");
    let hosts = write_file(dir.path(), "hosts", b"# rack 1\n127.0.0.2:7001\nnode-b.example:7001\n");
    let from_file = |path: &std::path::Path| run(&["--hosts".to_owned(), path.to_str().unwrap().to_owned()]);
    one_line_error(&from_file(&hosts), "line 3");
    assert!(!data.join("cluster.toml").exists(), "nothing written");
    let hosts_text: String = six.iter().map(|n| format!("{n}=2  # two disks\n")).collect();
    let hosts = write_file(dir.path(), "hosts", hosts_text.as_bytes());
    assert!(from_file(&hosts).status.success());
    let text = fs::read_to_string(data.join("cluster.toml")).unwrap();
    assert!(text.contains("127.0.0.7:7001") && text.contains("n6/d2"), "{text}");
    let config = data.join("cluster.toml");
    let output = Command::new(TESSERA)
        .args(["drive", "format", "--config", config.to_str().unwrap(), "--node", "n9"])
        .output()
        .unwrap();
    one_line_error(&output, "unknown node id \"n9\"");
}
