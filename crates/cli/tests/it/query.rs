//! Near-data query: SQL over Parquet objects with the scans evaluated on the nodes, checked
//! against the same query evaluated entirely in the client and against values computed here;
//! healthy, with a node killed and with chunks corrupted.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use query::arrow::array::{Array, Float64Array, Int64Array, RecordBatch, StringArray};
use query::arrow::datatypes::{DataType, Field, Schema};
use query::datafusion::parquet::arrow::ArrowWriter;
use query::datafusion::parquet::file::properties::WriterProperties;
use query::{QueryCounters, QueryOptions};

use crate::harness::{Cluster, Shape, block_on, write_file};

/// Rows per object and per row group: with 64 KiB chunks a row group (~16 KiB per column)
/// crosses chunk boundaries now and then, so nodes read tails from their peers.
const ROWS: i64 = 20_000;
const GROUP_ROWS: usize = 1_500;

/// A particle table: id, ke = a scrambled value in 0..1000, a name column.
fn particles(first_id: i64) -> Vec<u8> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("ke", DataType::Float64, false),
        Field::new("name", DataType::Utf8, true),
    ]));
    let ids: Vec<i64> = (first_id..first_id + ROWS).collect();
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(Int64Array::from(ids.clone())),
            Arc::new(Float64Array::from_iter_values(ids.iter().map(|&i| ke_of(i)))),
            Arc::new(StringArray::from_iter(ids.iter().map(|i| (i % 5 != 0).then(|| format!("p{}", i % 97))))),
        ],
    )
    .unwrap();
    let props = WriterProperties::builder().set_max_row_group_row_count(Some(GROUP_ROWS)).build();
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, schema, Some(props)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    out
}

fn ke_of(id: i64) -> f64 {
    ((id * 7919) % 1000) as f64 + 0.5
}

/// Three objects of the table `bkt/parts/` (ids 0..60000), plus one object that is not Parquet.
fn load(cluster: &Cluster) {
    cluster.cli_ok(&["mb", "bkt"]);
    for part in 0..3i64 {
        let file = write_file(cluster.dir.path(), &format!("part{part}.parquet"), &particles(part * ROWS));
        cluster.cli_ok(&["put", file.to_str().unwrap(), &format!("bkt/parts/{part}.parquet")]);
    }
    let text = write_file(cluster.dir.path(), "notes.txt", b"id,ke\n1,2\n");
    cluster.cli_ok(&["put", text.to_str().unwrap(), "bkt/notes.txt"]);
}

fn run(cluster: &Cluster, sql: &str, pushdown: bool) -> (Vec<RecordBatch>, Arc<QueryCounters>) {
    let client = cluster.client();
    block_on(async {
        let options = QueryOptions { pushdown, ..Default::default() };
        let (_, batches, counters) =
            query::collect(&client, sql, &options).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
        (batches, counters)
    })
}

fn int_column(batches: &[RecordBatch], idx: usize) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| b.column(idx).as_any().downcast_ref::<Int64Array>().expect("int64").values().to_vec())
        .collect()
}

fn float_column(batches: &[RecordBatch], idx: usize) -> Vec<f64> {
    batches
        .iter()
        .flat_map(|b| b.column(idx).as_any().downcast_ref::<Float64Array>().expect("float64").values().to_vec())
        .collect()
}

/// The queries every test checks, with their expected answers computed here.
fn check_queries(cluster: &Cluster, pushdown: bool) -> Vec<Arc<QueryCounters>> {
    let all: Vec<i64> = (0..3 * ROWS).collect();
    let mut counters = Vec::new();
    // A selective filter with a projection, ordered.
    let (batches, c) = run(cluster, "SELECT id, ke FROM 'bkt/parts/' WHERE ke > 990 ORDER BY id", pushdown);
    let expected: Vec<i64> = all.iter().copied().filter(|&i| ke_of(i) > 990.0).collect();
    assert_eq!(int_column(&batches, 0), expected);
    assert!(float_column(&batches, 1).iter().all(|&ke| ke > 990.0));
    counters.push(c);
    // Aggregates over a filter that statistics can prune (ids are sorted).
    let (batches, c) = run(
        cluster,
        "SELECT count(*) AS n, sum(id) AS s, min(ke), max(ke) FROM 'bkt/parts/' WHERE id BETWEEN 12345 AND 43210",
        pushdown,
    );
    let matching: Vec<i64> = (12_345..=43_210).collect();
    assert_eq!(int_column(&batches, 0), vec![matching.len() as i64]);
    assert_eq!(int_column(&batches, 1), vec![matching.iter().sum::<i64>()]);
    counters.push(c);
    // count(*) alone: nodes count, no columns come back.
    let (batches, c) = run(cluster, "SELECT count(*) FROM 'bkt/parts/' WHERE name LIKE 'p1%' AND id % 3 = 0", pushdown);
    let expected =
        all.iter().filter(|&&i| i % 5 != 0 && format!("p{}", i % 97).starts_with("p1") && i % 3 == 0).count();
    assert_eq!(int_column(&batches, 0), vec![expected as i64]);
    counters.push(c);
    // One object by key; string functions, IS NULL, IN, NOT, OR, arithmetic, CAST.
    let (batches, c) = run(
        cluster,
        "SELECT id, upper(name) AS u FROM 'bkt/parts/1.parquet' \
         WHERE (name IS NULL AND id < 20100) OR (CAST(ke AS BIGINT) IN (7, 8) AND NOT id > 25000) ORDER BY id",
        pushdown,
    );
    let expected: Vec<i64> = (ROWS..2 * ROWS)
        .filter(|&i| (i % 5 == 0 && i < 20_100) || ([7, 8].contains(&(ke_of(i) as i64)) && i <= 25_000))
        .collect();
    assert_eq!(int_column(&batches, 0), expected);
    counters.push(c);
    // LIMIT without ORDER BY: any rows, exactly that many.
    let (batches, c) = run(cluster, "SELECT id FROM 'bkt/parts/' WHERE ke < 500 LIMIT 17", pushdown);
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 17);
    assert!(int_column(&batches, 0).iter().all(|&i| ke_of(i) < 500.0));
    counters.push(c);
    // Aggregates per group (pushed down: each node aggregates its own rows).
    let (batches, c) = run(cluster, GROUPED, pushdown);
    assert_eq!(grouped_rows(&batches), expected_groups());
    counters.push(c);
    counters
}

#[test]
fn aggregates_on_the_nodes_answer_as_the_client_alone_does() {
    use query::arrow::util::pretty::pretty_format_batches;
    let cluster = Cluster::start(Shape::default());
    load(&cluster);
    let shapes = [
        // count of a column with nulls, count of rows, sum and average of an integer column
        "SELECT count(name), count(*), sum(id), avg(id) FROM 'bkt/parts/' WHERE id < 30000",
        // no matching row: a count of 0 and nulls
        "SELECT count(*), count(name), sum(ke), min(name), avg(ke) FROM 'bkt/parts/' WHERE id > 1000000",
        // no matching row, grouped: no group at all
        "SELECT name, count(*) FROM 'bkt/parts/' WHERE id > 1000000 GROUP BY name",
        // HAVING over the combined sums
        "SELECT name, sum(id) AS s FROM 'bkt/parts/' GROUP BY name HAVING sum(id) > 20000000 ORDER BY name",
        // an expression to group by, minimum of strings
        "SELECT id % 3 AS r, max(name), min(ke), count(*) FROM 'bkt/parts/' WHERE name IS NOT NULL \
         GROUP BY id % 3 ORDER BY r",
        // not combinable over parts: stays in the client
        "SELECT count(DISTINCT name), max(id) - min(id) FROM 'bkt/parts/'",
    ];
    for sql in shapes {
        let (pushed, counters) = run(&cluster, sql, true);
        let (local, _) = run(&cluster, sql, false);
        let text = |batches: &[RecordBatch]| {
            let text = pretty_format_batches(batches).unwrap().to_string();
            let mut lines: Vec<&str> = text.lines().collect();
            lines.sort_unstable();
            lines.join("\n")
        };
        assert_eq!(text(&pushed), text(&local), "{sql}");
        assert_eq!(counters.client_row_groups.load(Ordering::Relaxed), 0, "{sql}: evaluated on the nodes");
    }
}

#[test]
fn an_aggregate_too_large_for_a_nodes_memory_is_answered_by_the_client() {
    let cluster = cluster_whose_nodes_run_with(&["--query-memory", "256KiB"]);
    load(&cluster);
    // One group per row: far more state than a node may hold. The nodes refuse (they never
    // spill); the client, whose engine may, evaluates their row groups itself.
    let sql = "SELECT id, count(*) AS n, max(name) FROM 'bkt/parts/' GROUP BY id";
    let (batches, counters) = run(&cluster, sql, true);
    let mut ids = int_column(&batches, 0);
    ids.sort_unstable();
    assert_eq!(ids, (0..3 * ROWS).collect::<Vec<_>>());
    assert!(int_column(&batches, 1).iter().all(|&n| n == 1));
    assert!(counters.client_row_groups.load(Ordering::Relaxed) > 0, "no node ran out of memory");
}

/// An aggregate per group whose functions all combine over parts.
const GROUPED: &str = "SELECT name, count(*), avg(ke), min(id), max(id) FROM 'bkt/parts/' \
                       WHERE id < 50000 GROUP BY name ORDER BY name NULLS FIRST";

/// Name, count, average ke, min and max id per group, computed here.
type Group = (Option<String>, i64, f64, i64, i64);

fn expected_groups() -> Vec<Group> {
    let mut groups: std::collections::BTreeMap<Option<String>, (i64, f64, i64, i64)> = Default::default();
    for id in 0..50_000i64 {
        let name = (id % 5 != 0).then(|| format!("p{}", id % 97));
        let entry = groups.entry(name).or_insert((0, 0.0, i64::MAX, i64::MIN));
        *entry = (entry.0 + 1, entry.1 + ke_of(id), entry.2.min(id), entry.3.max(id));
    }
    groups.into_iter().map(|(name, (n, ke, min, max))| (name, n, ke / n as f64, min, max)).collect()
}

fn grouped_rows(batches: &[RecordBatch]) -> Vec<Group> {
    let names = batches.iter().flat_map(|b| {
        let names = b.column(0).as_any().downcast_ref::<StringArray>().expect("utf8");
        (0..names.len()).map(|i| names.is_valid(i).then(|| names.value(i).to_owned())).collect::<Vec<_>>()
    });
    let (counts, averages) = (int_column(batches, 1), float_column(batches, 2));
    let (mins, maxes) = (int_column(batches, 3), int_column(batches, 4));
    names.enumerate().map(|(i, name)| (name, counts[i], averages[i], mins[i], maxes[i])).collect()
}

#[test]
fn queries_run_on_the_nodes_and_match_the_answer_computed_here() {
    let cluster = Cluster::start(Shape::default());
    load(&cluster);
    let pushed = check_queries(&cluster, true);
    let local = check_queries(&cluster, false);
    let object_bytes: u64 = (0..3).map(|p| particles(p * ROWS).len() as u64).sum();
    for (i, (p, l)) in pushed.iter().zip(&local).enumerate() {
        // Pushed down: every row group went to a node, none was read by the client.
        assert!(p.node_requests.load(Ordering::Relaxed) > 0, "query {i}");
        assert_eq!(p.client_row_groups.load(Ordering::Relaxed), 0, "query {i}");
        assert_eq!(p.client_read_bytes.load(Ordering::Relaxed), 0, "query {i}");
        // Not pushed down: the client read the row groups itself.
        assert_eq!(l.node_requests.load(Ordering::Relaxed), 0, "query {i}");
        assert!(l.client_read_bytes.load(Ordering::Relaxed) > 0, "query {i}");
    }
    // The selective query brought a small fraction of the table to the client.
    let selective = pushed[0].bytes_to_client();
    assert!(selective * 10 < object_bytes, "{selective} bytes reached the client of {object_bytes}");
    assert!(selective * 3 < local[0].bytes_to_client());
    // The count brought no rows at all.
    assert_eq!(pushed[2].result_bytes.load(Ordering::Relaxed), 0);
    // The grouped aggregate brought each node's partial rows (about 100 groups), not the
    // matching rows; the same query's rows are far more.
    let (_, rows) = run(&cluster, "SELECT name, ke, id FROM 'bkt/parts/' WHERE id < 50000", true);
    let (partial, matching) =
        (pushed[5].result_bytes.load(Ordering::Relaxed), rows.result_bytes.load(Ordering::Relaxed));
    assert!(partial > 0 && partial * 10 < matching, "aggregate moved {partial} bytes, its rows {matching}");
}

#[test]
fn degraded_queries_return_the_same_rows() {
    let mut cluster = Cluster::start(Shape::default());
    load(&cluster);
    // Corrupt one spot of every data file on n2: nodes reading those chunk ranges rebuild
    // them from the rest of their stripe.
    let mut corrupted = 0;
    for file in cluster.data_files(1) {
        let mut bytes = std::fs::read(&file).unwrap();
        for at in (0..bytes.len()).step_by(20_000) {
            bytes[at] ^= 0x5a;
        }
        std::fs::write(&file, bytes).unwrap();
        corrupted += 1;
    }
    assert!(corrupted >= 3, "n2 holds chunks of every object");
    check_queries(&cluster, true);
    let rebuilt = (0..6).map(|i| cluster.log(i)).filter(|log| log.contains("rebuilding it from the stripe")).count();
    assert!(rebuilt > 0, "no node met a corrupt chunk range: the fault was not exercised");
    // And with a node down as well (m = 2): its row groups go to other nodes of their sets.
    cluster.kill_node(4);
    let counters = check_queries(&cluster, true);
    assert!(counters.iter().all(|c| c.node_requests.load(Ordering::Relaxed) > 0));
}

#[test]
fn bad_queries_get_clear_errors_and_the_nodes_keep_serving() {
    let cluster = Cluster::start(Shape::default());
    load(&cluster);
    for (sql, expected) in [
        ("SELECT nope FROM 'bkt/parts/'", "nope"),
        ("SELECT id FROM 'bkt/parts/' WHERE", "SQL"),
        ("SELECT * FROM 'bkt/notes.txt'", "not a Parquet file"),
        ("SELECT * FROM 'bkt/missing/'", "no objects"),
        ("SELECT * FROM 'bkt/parts/0.parquet' WHERE name + 1 > 2", "Cannot coerce arithmetic expression Utf8 + Int64"),
        ("CREATE EXTERNAL TABLE t STORED AS CSV LOCATION '/etc/passwd'", "only SELECT"),
        ("SELECT * FROM nobucket", "bucket/key"),
    ] {
        let error = cluster.cli_err(&["query", sql]);
        assert!(error.contains(expected), "{sql}: {error}");
    }
    // Every node still serves.
    let output = cluster.cli_ok(&["query", "SELECT count(*) AS n FROM 'bkt/parts/'", "--format", "csv"]);
    assert_eq!(output.trim(), format!("n\n{}", 3 * ROWS));
}

#[test]
fn cli_formats() {
    let cluster = Cluster::start(Shape::default());
    load(&cluster);
    let sql = "SELECT id, ke FROM 'bkt/parts/0.parquet' WHERE id < 3 ORDER BY id";
    let csv = cluster.cli_ok(&["query", sql, "--format", "csv"]);
    assert_eq!(csv, format!("id,ke\n0,{}\n1,{}\n2,{}\n", ke_of(0), ke_of(1), ke_of(2)));
    let json = cluster.cli_ok(&["query", sql, "--format", "json"]);
    assert_eq!(json.lines().count(), 3);
    assert!(json.starts_with(&format!("{{\"id\":0,\"ke\":{}}}", ke_of(0))), "{json}");
    let table = cluster.cli_ok(&["query", sql]);
    assert!(table.contains("| id | ke"), "{table}");
    let arrow = cluster.cli(&["query", sql, "--format", "arrow"]);
    assert!(arrow.status.success());
    let reader = query::arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(arrow.stdout), None).unwrap();
    let batches: Vec<RecordBatch> = reader.map(Result::unwrap).collect();
    assert_eq!(int_column(&batches, 0), vec![0, 1, 2]);
}

#[test]
fn dropping_a_query_stops_it_on_the_nodes() {
    let cluster = Cluster::start(Shape::default());
    // 2 million rows: far more result bytes than the sockets buffer, so nodes are still
    // sending when the client stops reading.
    put_big(&cluster);
    let client = cluster.client();
    block_on(async {
        use futures_util::StreamExt;
        let mut query =
            query::start(&client, "SELECT * FROM 'bkt/big.parquet'", &QueryOptions::default()).await.unwrap();
        let first = query.stream.next().await.unwrap().unwrap();
        assert!(first.num_rows() > 0);
        drop(query);
    });
    // Every node that was sending notices: its next write fails and the scan stops.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !(0..6).any(|i| cluster.log(i).contains("query stopped: the client went away")) {
        assert!(std::time::Instant::now() < deadline, "no node stopped its query after the client dropped it");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // The nodes still answer queries.
    let output = cluster.cli_ok(&["query", "SELECT count(*) AS n FROM 'bkt/big.parquet'", "--format", "csv"]);
    assert_eq!(output.trim(), "n\n2000000");
}

#[test]
fn nodes_scanning_without_matches_send_heartbeats() {
    let cluster = cluster_whose_nodes_run_with(&["--query-heartbeat", "20ms"]);
    put_big(&cluster);
    // A filter statistics cannot prune, slow to evaluate, that no row meets: nodes scan for a
    // while with nothing to send.
    let sql = "SELECT id FROM 'bkt/big.parquet' WHERE length(repeat(CAST(id AS VARCHAR), 60)) = 3";
    let (batches, counters) = run(&cluster, sql, true);
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 0);
    assert!(counters.node_requests.load(Ordering::Relaxed) > 0);
    assert_eq!(counters.client_row_groups.load(Ordering::Relaxed), 0, "the nodes answered");
    assert!(counters.heartbeats.load(Ordering::Relaxed) > 0, "no heartbeat while the nodes scanned");
    // A count whose batches come steadily writes nothing until its end: it beats too.
    let sql = "SELECT count(*) AS n FROM 'bkt/big.parquet' WHERE length(repeat(CAST(id AS VARCHAR), 60)) > 3";
    let (batches, counters) = run(&cluster, sql, true);
    assert_eq!(int_column(&batches, 0), vec![2_000_000]);
    assert_eq!(counters.result_bytes.load(Ordering::Relaxed), 0, "a count moves no rows");
    assert!(counters.heartbeats.load(Ordering::Relaxed) > 0, "no heartbeat while the nodes counted");
    // A bad interval is refused at start.
    let refused = cluster.cli_err(&[
        "node",
        "--config",
        cluster.config.to_str().unwrap(),
        "--id",
        "n1",
        "--query-heartbeat",
        "1h",
    ]);
    assert!(refused.contains("query-heartbeat"), "{refused}");
}

/// A default cluster whose six nodes run with these extra `tessera node` arguments.
fn cluster_whose_nodes_run_with(args: &[&str]) -> Cluster {
    let mut cluster = Cluster::start(Shape::default());
    for node in 0..6 {
        cluster.set_node_args(node, args);
        cluster.restart_node(node);
    }
    cluster
}

/// `bkt/big.parquet`: 2 million rows (id, ke = id) in row groups of 50,000.
fn put_big(cluster: &Cluster) {
    cluster.cli_ok(&["mb", "bkt"]);
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("ke", DataType::Float64, false),
    ]));
    let ids: Vec<i64> = (0..2_000_000).collect();
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(Int64Array::from(ids.clone())),
            Arc::new(Float64Array::from_iter_values(ids.iter().map(|&i| i as f64))),
        ],
    )
    .unwrap();
    let mut bytes = Vec::new();
    let props = WriterProperties::builder().set_max_row_group_row_count(Some(50_000)).build();
    let mut writer = ArrowWriter::try_new(&mut bytes, schema, Some(props)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    let file = write_file(cluster.dir.path(), "big.parquet", &bytes);
    cluster.cli_ok(&["put", file.to_str().unwrap(), "bkt/big.parquet"]);
}

#[test]
fn filters_keep_their_literal_types_on_the_nodes() {
    use query::arrow::array::{Decimal128Array, Float32Array};
    let cluster = Cluster::start(Shape::default());
    cluster.cli_ok(&["mb", "bkt"]);
    // Values right at the literals: a Float32 0.99 is 0.99000001 as a double, and a decimal
    // 999.999999999999999999 is 1000.0 as a double. A node that read the literals back as
    // doubles would count them on the wrong side.
    let rows = 4_000usize;
    let w: Vec<f32> = (0..rows).map(|i| if i % 4 == 0 { 0.99 } else { (i % 100) as f32 / 100.0 }).collect();
    let cents: Vec<i128> = (0..rows)
        .map(|i| match i % 3 {
            0 => 999_999_999_999_999_999_999,   // 999.999999999999999999
            1 => 1_000_000_000_000_000_000_000, // 1000
            _ => 5_000_000_000_000_000_000,     // 5
        })
        .collect();
    let schema = Arc::new(Schema::new(vec![
        Field::new("w", DataType::Float32, false),
        // A mixed-case name: the node must read the filter's column names as written.
        Field::new("Amount", DataType::Decimal128(38, 18), false),
    ]));
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(Float32Array::from(w.clone())),
            Arc::new(Decimal128Array::from(cents.clone()).with_precision_and_scale(38, 18).unwrap()),
        ],
    )
    .unwrap();
    let mut bytes = Vec::new();
    let props = WriterProperties::builder().set_max_row_group_row_count(Some(1_000)).build();
    let mut writer = ArrowWriter::try_new(&mut bytes, schema, Some(props)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    let file = write_file(cluster.dir.path(), "typed.parquet", &bytes);
    cluster.cli_ok(&["put", file.to_str().unwrap(), "bkt/typed.parquet"]);
    let count = |sql: &str| -> i64 {
        let (batches, counters) = run(&cluster, sql, true);
        assert_eq!(counters.client_row_groups.load(Ordering::Relaxed), 0, "{sql}: evaluated on the nodes");
        // The filter itself ran on the nodes: only counts came back, no rows.
        assert_eq!(counters.result_bytes.load(Ordering::Relaxed), 0, "{sql}: filter pushed down");
        int_column(&batches, 0)[0]
    };
    let expected_w = w.iter().filter(|v| **v > 0.99f32).count() as i64;
    assert_eq!(count("SELECT count(*) FROM 'bkt/typed.parquet' WHERE w > CAST(0.99 AS FLOAT)"), expected_w);
    let expected_amount = cents.iter().filter(|c| **c >= 1_000_000_000_000_000_000_000).count() as i64;
    assert_eq!(count("SELECT count(*) FROM 'bkt/typed.parquet' WHERE \"Amount\" >= 1000"), expected_amount);
}

/// 16 row groups of 65,536 rows (id, ke = id / 1000), plain encoding without compression: every
/// group has the same size (~1 MiB), 16.8 MB in all.
pub(crate) fn equal_groups() -> Vec<u8> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("ke", DataType::Float64, false),
    ]));
    let ids: Vec<i64> = (0..16 * 65_536).collect();
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(Int64Array::from(ids.clone())),
            Arc::new(Float64Array::from_iter_values(ids.iter().map(|&i| i as f64 / 1000.0))),
        ],
    )
    .unwrap();
    let props =
        WriterProperties::builder().set_max_row_group_row_count(Some(65_536)).set_dictionary_enabled(false).build();
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, schema, Some(props)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    out
}

#[test]
fn aligned_row_groups_are_read_by_the_node_that_holds_them() {
    let mut cluster = Cluster::start(Shape::default());
    cluster.cli_ok(&["mb", "bkt"]);
    let bytes = equal_groups();
    let file = write_file(cluster.dir.path(), "equal.parquet", &bytes);
    let file = file.to_str().unwrap();
    cluster.cli_ok(&["put", file, "bkt/aligned/t.parquet"]);
    cluster.cli_ok(&["put", "--no-align", file, "bkt/plain/t.parquet"]);
    assert!(cluster.cli_ok(&["stat", "bkt/aligned/t.parquet"]).contains("layout:       aligned"));
    assert!(cluster.cli_ok(&["stat", "bkt/plain/t.parquet"]).contains("layout:       plain"));

    // The aligned object reads back byte for byte, whole and in ranges across its pads, and
    // its zeros cost at most 1% of its size.
    let client = cluster.client();
    let info = block_on(client.head("bkt", "aligned/t.parquet")).unwrap();
    assert!(!info.meta.pads.is_empty());
    assert!((info.meta.stored_size() - info.meta.size) * 100 <= info.meta.size);
    assert_eq!(info.meta.size, bytes.len() as u64);
    assert_eq!(block_on(client.get("bkt", "aligned/t.parquet")).unwrap(), bytes);
    for pad in info.meta.pads.iter().filter(|p| p.at < info.meta.size) {
        let from = pad.at.saturating_sub(5_000);
        let to = (pad.at + 5_000).min(info.meta.size);
        let mut buf = vec![0u8; (to - from) as usize];
        assert_eq!(block_on(client.read_at(&info, from, &mut buf)).unwrap(), buf.len());
        assert_eq!(buf, bytes[from as usize..to as usize], "bytes {from}..{to}");
    }

    // Every row group of the aligned object is read by the node holding it: no bytes from
    // peers; the plain object's row groups cross chunks of other drives.
    let sql = |prefix: &str| format!("SELECT count(*) AS n, sum(id) AS s FROM 'bkt/{prefix}/' WHERE ke > 700.5");
    let expected: Vec<i64> = (0..16 * 65_536).filter(|&i| i as f64 / 1000.0 > 700.5).collect();
    let check = |batches: &[RecordBatch]| {
        assert_eq!(int_column(batches, 0), vec![expected.len() as i64]);
        assert_eq!(int_column(batches, 1), vec![expected.iter().sum::<i64>()]);
    };
    let (aligned, a) = run(&cluster, &sql("aligned"), true);
    let (plain, p) = run(&cluster, &sql("plain"), true);
    check(&aligned);
    check(&plain);
    assert!(a.node_read_bytes.load(Ordering::Relaxed) > 0);
    assert_eq!(a.node_peer_bytes.load(Ordering::Relaxed), 0, "an aligned row group came from a peer");
    assert!(p.node_peer_bytes.load(Ordering::Relaxed) > 0, "the plain object read nothing from peers");
    assert_eq!(a.client_read_bytes.load(Ordering::Relaxed), 0);

    // An aligned PUT whose source has another size than its layout was planned for fails
    // and stores nothing.
    let mut align = query::layout::parquet_alignment_of(&bytes).expect("a Parquet file");
    assert_eq!(align.ranges.len(), 16);
    align.size += 1;
    let options = client::PutOptions { align: Some(align), ..Default::default() };
    let error = block_on(client.put_bytes("bkt", "short.parquet", &bytes, &options)).unwrap_err();
    assert!(error.to_string().contains("changed during the upload"), "{error}");
    assert!(block_on(client.head("bkt", "short.parquet")).is_err());

    // Degraded: with a node down its row groups are rebuilt from the stripes, by another node
    // of the set or (the node's failure found when the query was sent) by the client; same
    // answer, whole reads still byte for byte.
    // The node holding the last row group (which the filter reads).
    let last_group = query::layout::parquet_alignment_of(&bytes).unwrap().ranges[15].start;
    let holder = &info.drives[info.position_of(last_group).unwrap()].0;
    cluster.kill_node(holder.trim_start_matches('n').parse::<usize>().unwrap() - 1);
    let (degraded, d) = run(&cluster, &sql("aligned"), true);
    check(&degraded);
    let rebuilt = d.node_peer_bytes.load(Ordering::Relaxed) + d.client_read_bytes.load(Ordering::Relaxed);
    assert!(rebuilt > 0, "no row group was read around the dead node: the fault was missed");
    let client = cluster.client();
    assert_eq!(block_on(client.get("bkt", "aligned/t.parquet")).unwrap(), bytes);
}

#[test]
fn relayout_aligns_parquet_objects_stored_plain_and_keeps_their_bytes() {
    let cluster = Cluster::start(Shape::default());
    cluster.cli_ok(&["mb", "bkt"]);
    let bytes = equal_groups();
    let file = write_file(cluster.dir.path(), "equal.parquet", &bytes);
    cluster.cli_ok(&["put", "--no-align", file.to_str().unwrap(), "bkt/r/t.parquet"]);
    let text = write_file(cluster.dir.path(), "notes.txt", b"not parquet");
    cluster.cli_ok(&["put", text.to_str().unwrap(), "bkt/r/notes.txt"]);
    let client = cluster.client();
    let before = block_on(client.head("bkt", "r/t.parquet")).unwrap();
    assert!(before.meta.pads.is_empty());

    let dry = cluster.cli_ok(&["relayout", "bkt/r/", "--dry-run"]);
    assert!(dry.contains("would relayout bkt/r/t.parquet"), "{dry}");
    assert!(block_on(client.head("bkt", "r/t.parquet")).unwrap().meta.pads.is_empty(), "a dry run wrote");

    let out = cluster.cli_ok(&["relayout", "bkt/r/"]);
    assert!(out.contains("relaid bkt/r/t.parquet: 16 row groups"), "{out}");
    assert!(out.contains("1 not Parquet"), "{out}");
    let after = block_on(client.head("bkt", "r/t.parquet")).unwrap();
    assert!(!after.meta.pads.is_empty());
    // The version just after the plain one, with its ETag, metadata and modification time.
    assert_eq!(after.meta.version.unix_ns, before.meta.version.unix_ns);
    assert_eq!(after.meta.version.writer, before.meta.version.writer + 1);
    assert_eq!(
        (&after.meta.etag, &after.meta.content_type, after.meta.modified_ms),
        (&before.meta.etag, &before.meta.content_type, before.meta.modified_ms)
    );
    assert_eq!(block_on(client.get("bkt", "r/t.parquet")).unwrap(), bytes);
    // The plain version stays readable by version until the drives retire it.
    let mut old = vec![0u8; bytes.len()];
    assert_eq!(block_on(client.read_at(&before, 0, &mut old)).unwrap(), bytes.len());
    assert_eq!(old, bytes);
    let (_, counters) = run(&cluster, "SELECT count(*), sum(id) FROM 'bkt/r/t.parquet' WHERE ke > 900.5", true);
    assert_eq!(counters.node_peer_bytes.load(Ordering::Relaxed), 0);

    // A second run finds nothing to do; a write after the re-layout wins over it.
    let again = cluster.cli_ok(&["relayout", "bkt/r/"]);
    assert!(again.contains("0 relaid") && again.contains("1 aligned already"), "{again}");
    cluster.cli_ok(&["put", text.to_str().unwrap(), "bkt/r/t.parquet"]);
    assert_eq!(block_on(client.get("bkt", "r/t.parquet")).unwrap(), b"not parquet");
}

#[test]
fn concurrent_relayouts_of_one_version_write_it_once() {
    let cluster = Cluster::start(Shape::default());
    cluster.cli_ok(&["mb", "bkt"]);
    let bytes = equal_groups();
    let file = write_file(cluster.dir.path(), "equal.parquet", &bytes);
    cluster.cli_ok(&["put", "--no-align", file.to_str().unwrap(), "bkt/c/t.parquet"]);
    let client = cluster.client();
    let info = block_on(client.head("bkt", "c/t.parquet")).unwrap();
    let align = query::layout::parquet_alignment_of(&bytes).unwrap();
    // Every re-layout of one version writes the same version id: one at a time holds the
    // version's lock, and one that comes after finds the version replaced.
    let (a, b) =
        block_on(async { tokio::join!(client.relayout(&info, &align, None), client.relayout(&info, &align, None)) });
    let done = [a.unwrap(), b.unwrap()];
    assert_eq!(done.iter().filter(|d| d.is_some()).count(), 1, "exactly one re-layout wrote");
    let again = block_on(client.relayout(&info, &align, None)).unwrap();
    assert!(again.is_none(), "a re-layout of a replaced version wrote");
    let now = block_on(client.head("bkt", "c/t.parquet")).unwrap();
    assert!(!now.meta.pads.is_empty());
    assert_eq!(block_on(client.get("bkt", "c/t.parquet")).unwrap(), bytes);
}
