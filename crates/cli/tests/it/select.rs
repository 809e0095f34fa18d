//! S3 Select over CSV and JSON-lines objects, evaluated on the nodes: each takes the records
//! that start in its chunks. Checked against values computed here, healthy, with a ScanRange,
//! with corrupt chunks and with a node killed.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures_util::StreamExt;
use query::QueryCounters;
use query::select::{
    Compression, CsvInput, HeaderInfo, JsonType, ScanRange, SelectInput, SelectOutput, SelectSource, select,
};

use crate::harness::{Cluster, Shape, block_on, write_file};

const ROWS: i64 = 80_000;

fn ke_of(id: i64) -> i64 {
    (id * 7919) % 1000
}

/// `id,ke,name` with a header; names hold the delimiter, so they are quoted.
fn csv_body() -> Vec<u8> {
    let mut out = String::from("id,ke,name\n");
    for id in 0..ROWS {
        out.push_str(&format!("{id},{},\"p{}, q\"\n", ke_of(id), id % 97));
    }
    out.into_bytes()
}

fn json_body() -> Vec<u8> {
    (0..ROWS)
        .map(|id| format!("{{\"id\": {id}, \"ke\": {}, \"name\": \"p{}\"}}\n", ke_of(id), id % 97))
        .collect::<String>()
        .into_bytes()
}

fn load(cluster: &Cluster) -> (Vec<u8>, Vec<u8>) {
    cluster.cli_ok(&["mb", "bkt"]);
    let (csv, json) = (csv_body(), json_body());
    for (name, body) in [("rows.csv", &csv), ("rows.json", &json)] {
        let file = write_file(cluster.dir.path(), name, body);
        cluster.cli_ok(&["put", file.to_str().unwrap(), &format!("bkt/{name}")]);
    }
    (csv, json)
}

/// Runs a select and returns its CSV output lines and what it moved.
fn run(cluster: &Cluster, key: &str, sql: &str, scan_range: Option<ScanRange>) -> (Vec<String>, Arc<QueryCounters>) {
    let input = if key.ends_with(".csv") {
        SelectInput::Csv(CsvInput { header: HeaderInfo::Use, ..CsvInput::default() })
    } else {
        SelectInput::Json(JsonType::Lines)
    };
    let source =
        SelectSource { bucket: "bkt".into(), key: key.into(), input, compression: Compression::None, scan_range };
    let client = cluster.client();
    block_on(async {
        let output = SelectOutput::Csv { delimiter: b',', quote: b'"', always_quote: false, escape: None };
        let selection =
            select(&client, &source, sql, &output, &Default::default()).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
        let counters = Arc::clone(selection.scanned.counters());
        let mut out = Vec::new();
        let mut records = selection.records;
        while let Some(piece) = records.next().await {
            out.extend_from_slice(&piece.unwrap_or_else(|e| panic!("{sql}: {e}")));
        }
        (String::from_utf8(out).unwrap().lines().map(str::to_owned).collect(), counters)
    })
}

/// The first field of each line, as numbers, sorted.
fn sorted_ids(lines: &[String]) -> Vec<i64> {
    let mut ids: Vec<i64> = lines.iter().map(|l| l.split(',').next().unwrap().parse().unwrap()).collect();
    ids.sort_unstable();
    ids
}

/// The selective query, the aggregate and a ranged select over both objects; returns what
/// each select moved.
fn check_selects(cluster: &Cluster, csv: &[u8]) -> Vec<Arc<QueryCounters>> {
    let mut moved = Vec::new();
    let hot: Vec<i64> = (0..ROWS).filter(|&id| ke_of(id) > 990).collect();
    for key in ["rows.csv", "rows.json"] {
        let (rows, counters) =
            run(cluster, key, "SELECT s.id, s.name FROM S3Object s WHERE CAST(s.ke AS INT) > 990", None);
        assert_eq!(sorted_ids(&rows), hot, "{key}");
        // The names came through whole (the CSV ones hold the delimiter).
        let suffix = if key.ends_with(".csv") { ", q\"" } else { "" };
        for row in &rows {
            let (id, name) = row.split_once(',').unwrap();
            let id: i64 = id.parse().unwrap();
            let quote = if suffix.is_empty() { "" } else { "\"" };
            assert_eq!(name, format!("{quote}p{}{suffix}", id % 97), "{key}");
        }
        moved.push(counters);

        let (rows, counters) = run(
            cluster,
            key,
            "SELECT count(*) AS n, sum(CAST(s.id AS BIGINT)) AS total FROM S3Object s WHERE CAST(s.ke AS INT) < 10",
            None,
        );
        let cold: Vec<i64> = (0..ROWS).filter(|&id| ke_of(id) < 10).collect();
        assert_eq!(rows, [format!("{},{}", cold.len(), cold.iter().sum::<i64>())], "{key}");
        moved.push(counters);
    }
    // A ScanRange: the records whose first byte lies in it, across several chunks.
    let (first, last) = (300_001u64, 1_200_000u64);
    let (rows, counters) = run(
        cluster,
        "rows.csv",
        "SELECT s.id FROM S3Object s",
        Some(ScanRange { start: Some(first), end: Some(last) }),
    );
    let mut starts = vec![0usize];
    starts.extend(csv.iter().enumerate().filter(|(_, b)| **b == b'\n').map(|(i, _)| i + 1));
    // Record i (after the header) starts at starts[i + 1].
    let expected: Vec<i64> =
        (0..ROWS).filter(|&id| (first..=last).contains(&(starts[id as usize + 1] as u64))).collect();
    assert_eq!(sorted_ids(&rows), expected);
    moved.push(counters);
    moved
}

#[test]
fn csv_and_json_selects_run_on_the_nodes_that_hold_the_records() {
    let cluster = Cluster::start(Shape::default());
    let (csv, json) = load(&cluster);
    let moved = check_selects(&cluster, &csv);
    for (i, counters) in moved.iter().enumerate() {
        // Every split went to a node; the client read only the object's head for its columns
        // (64 KiB: a CSV header, or the first 1,000 JSON records that type its fields).
        assert!(counters.node_requests.load(Ordering::Relaxed) >= 4, "select {i}");
        assert_eq!(counters.client_row_groups.load(Ordering::Relaxed), 0, "select {i}");
        assert_eq!(counters.client_read_bytes.load(Ordering::Relaxed), 64 << 10, "select {i}");
    }
    // The selective CSV select: each chunk was read by the node holding it (so its own drive's
    // reads cover the object); from its peers a node read only the checksum blocks (64 KiB, as
    // big as this cluster's chunks; two where a short last stripe's chunk ends mid-block) where
    // its split's last record ends. It sent back a small part of the object.
    let selective = &moved[0];
    let read = selective.node_read_bytes.load(Ordering::Relaxed);
    let peers = selective.node_peer_bytes.load(Ordering::Relaxed);
    let chunks = (csv.len() as u64).div_ceil(64 << 10);
    assert!(read - peers >= csv.len() as u64, "read {read} ({peers} from peers) of {}", csv.len());
    assert!(peers <= 2 * chunks * (64 << 10), "{peers} bytes came from peers for {chunks} chunks");
    assert!(selective.result_bytes.load(Ordering::Relaxed) * 20 < csv.len() as u64);
    // The aggregates sent partial rows only.
    for i in [1, 3] {
        let result = moved[i].result_bytes.load(Ordering::Relaxed);
        assert!(result < 16 << 10, "aggregate {i} moved {result} bytes");
    }
    assert!(moved[2].node_read_bytes.load(Ordering::Relaxed) >= json.len() as u64);
}

#[test]
fn degraded_csv_and_json_selects_return_the_same_records() {
    let mut cluster = Cluster::start(Shape::default());
    let (csv, _) = load(&cluster);
    for file in cluster.data_files(2) {
        let mut bytes = std::fs::read(&file).unwrap();
        for at in (0..bytes.len()).step_by(30_000) {
            bytes[at] ^= 0x5a;
        }
        std::fs::write(&file, bytes).unwrap();
    }
    check_selects(&cluster, &csv);
    let rebuilt = (0..6).map(|i| cluster.log(i)).filter(|log| log.contains("rebuilding it from the stripe")).count();
    assert!(rebuilt > 0, "no node met a corrupt chunk range: the fault was not exercised");
    // A node down as well: its splits go to other nodes of the set (or, until the client
    // knows it is down, to the client itself).
    cluster.kill_node(4);
    for counters in check_selects(&cluster, &csv) {
        assert!(counters.node_requests.load(Ordering::Relaxed) > 0);
    }
}

#[test]
fn a_multipart_csv_is_joined_into_one_piece_and_then_selected_on_the_nodes() {
    let cluster = Cluster::start(Shape::default());
    cluster.cli_ok(&["mb", "bkt"]);
    let body: Vec<u8> = std::iter::once("id,ke,name\n".to_owned())
        .chain((0..400_000i64).map(|id| format!("{id},{},\"p{}, q\"\n", ke_of(id), id % 97)))
        .collect::<String>()
        .into_bytes();
    let client = cluster.client();
    let uploaded = block_on(async {
        let id = client.create_multipart("bkt", "parts.csv", &Default::default()).await.unwrap();
        let mut etags = Vec::new();
        for (i, part) in body.chunks(client::PART_BYTES_MIN as usize).enumerate() {
            let n = i as u32 + 1;
            etags.push((n, client.put_part("bkt", "parts.csv", &id, n, &mut &part[..]).await.unwrap().etag));
        }
        client.complete_multipart("bkt", "parts.csv", &id, &etags).await.unwrap()
    });
    assert!(uploaded.meta.parts.len() >= 2, "a multipart object");
    let sql = "SELECT s.id FROM S3Object s WHERE CAST(s.ke AS INT) > 990";
    let hot: Vec<i64> = (0..400_000).filter(|&id| ke_of(id) > 990).collect();
    // In parts, the client reads and evaluates it (one split).
    let (rows, counters) = run(&cluster, "parts.csv", sql, None);
    assert_eq!(sorted_ids(&rows), hot);
    assert_eq!(counters.node_requests.load(Ordering::Relaxed), 0);
    assert_eq!(counters.client_row_groups.load(Ordering::Relaxed), 1);
    assert!(cluster.cli_ok(&["stat", "bkt/parts.csv"]).contains("parts (a multipart upload"));
    let dry = cluster.cli_ok(&["relayout", "bkt", "--dry-run"]);
    assert!(dry.contains("would join bkt/parts.csv"), "{dry}");
    let out = cluster.cli_ok(&["relayout", "bkt"]);
    assert!(out.contains("1 joined into one piece"), "{out}");
    // One piece now: same bytes and ETag, a newer version; the nodes evaluate it.
    let joined = block_on(client.head("bkt", "parts.csv")).unwrap();
    assert!(joined.meta.parts.is_empty() && joined.meta.has_data_file());
    assert_eq!(joined.meta.etag, uploaded.meta.etag);
    assert!(joined.meta.version > uploaded.meta.version);
    assert_eq!(block_on(client.get("bkt", "parts.csv")).unwrap(), body);
    let (rows, counters) = run(&cluster, "parts.csv", sql, None);
    assert_eq!(sorted_ids(&rows), hot);
    assert!(counters.node_requests.load(Ordering::Relaxed) >= 4);
    assert_eq!(counters.client_row_groups.load(Ordering::Relaxed), 0);
    // Nothing left to do.
    let again = cluster.cli_ok(&["relayout", "bkt"]);
    assert!(again.contains("0 joined"), "{again}");
}
