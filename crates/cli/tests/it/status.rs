//! `tessera status`: what it shows of a healthy cluster, and of one with nodes killed.

use crate::harness::{Cluster, Shape, block_on, payload};

fn status_json(stdout: &[u8]) -> serde_json::Value {
    serde_json::from_slice(stdout)
        .unwrap_or_else(|e| panic!("status --json printed {e}: {}", String::from_utf8_lossy(stdout)))
}

#[test]
fn status_shows_nodes_drives_and_sets_and_fails_while_a_node_is_down() {
    let mut cluster = Cluster::start(Shape::default());
    let client = cluster.client();
    block_on(async {
        client.make_bucket("bkt").await.unwrap();
        for i in 0..3 {
            client.put_bytes("bkt", &format!("obj-{i}"), &payload(200_000, i), &Default::default()).await.unwrap();
        }
    });

    let status = status_json(cluster.cli_ok(&["status", "--json"]).as_bytes());
    assert_eq!(status["health"], "ok", "{status}");
    let nodes = status["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 6);
    for node in nodes {
        assert_eq!(node["up"], true, "{node}");
        assert_eq!(node["version"], env!("CARGO_PKG_VERSION"));
        assert!(node["map_version"].as_u64().is_some() && node["uptime_s"].as_u64().is_some(), "{node}");
        let drives = node["drives"].as_array().unwrap();
        assert_eq!(drives.len(), 1);
        let drive = &drives[0];
        assert!(drive["total_bytes"].as_u64().unwrap() > 0 && drive["used_bytes"].as_u64().is_some(), "{drive}");
        // 4+2 over six drives: every drive holds a chunk of each of the three objects.
        assert_eq!(drive["versions"], 3, "{drive}");
        assert_eq!(drive["errors"], 0, "{drive}");
    }
    let sets = status["sets"].as_array().unwrap();
    assert_eq!(sets.len(), 1);
    assert_eq!((sets[0]["health"].as_str(), sets[0]["erasure"].as_str()), (Some("ok"), Some("4+2")));
    assert_eq!(sets[0]["drives"].as_array().unwrap().len(), 6);

    // One node down: the set is degraded (within m), the command says so and fails.
    cluster.kill_node(2);
    let output = cluster.cli(&["status", "--json"]);
    assert!(!output.status.success(), "a node is down");
    assert!(String::from_utf8_lossy(&output.stderr).contains("n3"), "{}", String::from_utf8_lossy(&output.stderr));
    let status = status_json(&output.stdout);
    assert_eq!(status["health"], "degraded");
    let n3 = &status["nodes"][2];
    assert_eq!((n3["id"].as_str(), n3["up"].as_bool()), (Some("n3"), Some(false)));
    assert!(n3["error"].as_str().is_some_and(|e| !e.is_empty()), "{n3}");
    assert_eq!(status["sets"][0]["health"], "degraded");
    assert_eq!(status["sets"][0]["out"], serde_json::json!(["n3/1"]));

    // Three down, more than m = 2: objects of that set cannot be read.
    cluster.kill_node(0);
    cluster.kill_node(5);
    let output = cluster.cli(&["status"]);
    assert!(!output.status.success());
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(table.contains("unavailable") && table.contains("3 of 6 nodes up"), "{table}");
    assert!(
        table
            .lines()
            .filter(|l| l.starts_with("n1 ") || l.starts_with("n3 ") || l.starts_with("n6 "))
            .all(|l| l.contains("down")),
        "{table}"
    );
}
