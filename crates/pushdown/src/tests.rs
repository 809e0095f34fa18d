use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use datafusion::arrow::array::{Array, Float64Array, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::file::properties::WriterProperties;
use futures_util::StreamExt;
use futures_util::future::BoxFuture;

use super::*;

/// Objects held in memory; counts the bytes read.
#[derive(Debug, Default)]
struct MemSource {
    files: Vec<Bytes>,
    read: AtomicU64,
}

impl ByteSource for MemSource {
    fn read(&self, object: usize, range: Range<u64>) -> BoxFuture<'static, Result<Bytes, String>> {
        self.read.fetch_add(range.end - range.start, Ordering::Relaxed);
        let file = self.files[object].clone();
        Box::pin(async move {
            if range.end > file.len() as u64 {
                return Err(format!("range {range:?} past {}", file.len()));
            }
            Ok(file.slice(range.start as usize..range.end as usize))
        })
    }
}

/// A particle table: id 0..rows, ke = id as f64, `rows / group_rows` row groups.
fn particles(first_id: i64, rows: i64, group_rows: usize) -> Bytes {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("ke", DataType::Float64, true),
    ]));
    let ids = Int64Array::from_iter_values(first_id..first_id + rows);
    let ke = Float64Array::from_iter_values((first_id..first_id + rows).map(|i| i as f64));
    let batch = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(ids), Arc::new(ke)]).unwrap();
    let props = WriterProperties::builder().set_max_row_group_row_count(Some(group_rows)).build();
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, schema, Some(props)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    Bytes::from(out)
}

fn footer_of(name: &str, file: &Bytes) -> Footer {
    let size = file.len() as u64;
    let tail = Footer::tail_len(name, &file[file.len() - 8..], size).unwrap();
    let bytes = file.slice(file.len() - tail as usize..file.len() - 8);
    Footer::parse(name, bytes, size).unwrap()
}

fn run(spec: ScanSpec, objects: Vec<(Bytes, Vec<usize>)>) -> Result<(Vec<RecordBatch>, u64), Error> {
    run_aggregate(spec, None, objects)
}

fn run_aggregate(
    spec: ScanSpec,
    aggregate: Option<AggregateSpec>,
    objects: Vec<(Bytes, Vec<usize>)>,
) -> Result<(Vec<RecordBatch>, u64), Error> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async move {
        let footers: Vec<Arc<Footer>> =
            objects.iter().enumerate().map(|(i, (f, _))| Arc::new(footer_of(&format!("b/o{i}"), f))).collect();
        let named: Vec<(&str, &Footer)> = footers.iter().map(|f| ("b/o", f.as_ref())).collect();
        let schema = table_schema(&named)?;
        let scan_objects = objects
            .iter()
            .zip(&footers)
            .enumerate()
            .map(|(i, ((file, groups), footer))| ScanObject {
                name: format!("b/o{i}"),
                size: file.len() as u64,
                footer: Arc::clone(footer),
                row_groups: groups.clone(),
            })
            .collect();
        let source =
            Arc::new(MemSource { files: objects.iter().map(|(f, _)| f.clone()).collect(), ..Default::default() });
        let stream =
            scan(scan_objects, schema, source.clone(), &spec, aggregate.as_ref(), &ScanLimits::default()).await?;
        let batches: Vec<RecordBatch> =
            stream.collect::<Vec<_>>().await.into_iter().collect::<Result<_, _>>().map_err(Error::from_datafusion)?;
        Ok((batches, source.read.load(Ordering::Relaxed)))
    })
}

fn ids(batches: &[RecordBatch]) -> Vec<i64> {
    let mut out: Vec<i64> = batches
        .iter()
        .flat_map(|b| b.column(0).as_any().downcast_ref::<Int64Array>().unwrap().values().to_vec())
        .collect();
    out.sort_unstable();
    out
}

fn spec(columns: &[&str], filters: &[&str]) -> ScanSpec {
    ScanSpec {
        columns: columns.iter().map(|c| c.to_string()).collect(),
        filters: filters.iter().map(|f| f.to_string()).collect(),
        limit: None,
        count_only: false,
    }
}

#[test]
fn a_scan_returns_exactly_the_matching_rows_of_its_row_groups() {
    let file = particles(0, 10_000, 1000);
    // Row groups 0, 3 and 9 only: ids 0..1000, 3000..4000, 9000..10000.
    let (batches, _) = run(spec(&["id"], &["ke >= 3500", "id % 2 = 0"]), vec![(file, vec![0, 3, 9])]).unwrap();
    let expected: Vec<i64> = (3500..4000).chain(9000..10_000).filter(|i| i % 2 == 0).collect();
    assert_eq!(ids(&batches), expected);
    assert_eq!(batches[0].schema().fields().len(), 1);
}

#[test]
fn statistics_prune_row_groups_that_cannot_match() {
    let file = particles(0, 100_000, 10_000);
    let all: Vec<usize> = (0..10).collect();
    let (_, read_all) = run(spec(&["id", "ke"], &[]), vec![(file.clone(), all.clone())]).unwrap();
    let (batches, read_few) = run(spec(&["id", "ke"], &["ke > 95000.5"]), vec![(file, all)]).unwrap();
    assert_eq!(ids(&batches), (95_001..100_000).collect::<Vec<_>>());
    assert!(read_few * 5 < read_all, "pruning read {read_few} bytes of {read_all}");
}

#[test]
fn count_only_scans_count_and_objects_form_one_table() {
    let a = particles(0, 5000, 1000);
    let b = particles(5000, 5000, 1000);
    let mut count = spec(&[], &["id BETWEEN 4000 AND 6999"]);
    count.count_only = true;
    let (batches, _) = run(count, vec![(a, vec![0, 1, 2, 3, 4]), (b, vec![0, 1, 2, 3, 4])]).unwrap();
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 3000);
    assert!(batches.iter().all(|b| b.num_columns() == 0));
}

fn partial(function: AggregateFunction, argument: Option<&str>) -> PartialAggregate {
    PartialAggregate { function, argument: argument.map(str::to_owned) }
}

#[test]
fn an_aggregating_scan_answers_one_row_per_group_of_its_row_groups() {
    let a = particles(0, 5000, 1000);
    let b = particles(5000, 5000, 1000);
    let grouped = spec(&[], &["id >= 2000"]);
    let aggregate = AggregateSpec {
        group_by: vec!["id % 2".into()],
        aggregates: vec![
            partial(AggregateFunction::Count, None),
            partial(AggregateFunction::Sum, Some("ke")),
            partial(AggregateFunction::Min, Some("id")),
            partial(AggregateFunction::Max, Some("id")),
            partial(AggregateFunction::Count, Some("CASE WHEN id < 3000 THEN id END")),
        ],
    };
    // Row groups 1..3 of a (ids 1000..4000, of which the filter keeps 2000..4000) and row
    // group 4 of b (ids 9000..10000): one table.
    let (batches, _) = run_aggregate(grouped, Some(aggregate), vec![(a, vec![1, 2, 3]), (b, vec![4])]).unwrap();
    let mut rows = Vec::new();
    for batch in &batches {
        let column = |i: usize| batch.column(i).as_any().downcast_ref::<Int64Array>().unwrap().clone();
        let sums = batch.column(2).as_any().downcast_ref::<Float64Array>().unwrap().clone();
        for row in 0..batch.num_rows() {
            let values = (column(0).value(row), column(1).value(row), sums.value(row));
            rows.push((values, column(3).value(row), column(4).value(row), column(5).value(row)));
        }
    }
    rows.sort_by_key(|r| r.0.0);
    let ids = |parity: i64| (2000..4000).chain(9000..10_000).filter(move |i| i % 2 == parity);
    for (parity, row) in rows.iter().enumerate() {
        let parity = parity as i64;
        let count = ids(parity).count() as i64;
        let sum: f64 = ids(parity).map(|i| i as f64).sum();
        let below_3000 = ids(parity).filter(|i| *i < 3000).count() as i64;
        assert_eq!(*row, ((parity, count, sum), 2000 + parity, 9998 + parity, below_3000));
    }
    assert_eq!(rows.len(), 2);
}

#[test]
fn a_partial_schema_has_the_types_a_node_answers_with() {
    let file = particles(0, 2000, 1000);
    let footer = footer_of("b/o", &file);
    let schema = table_schema(&[("b/o", &footer)]).unwrap();
    let aggregate = AggregateSpec {
        group_by: vec!["id > 10".into()],
        aggregates: vec![
            partial(AggregateFunction::Count, Some("ke")),
            partial(AggregateFunction::Sum, Some("id")),
            partial(AggregateFunction::Max, Some("ke")),
        ],
    };
    let expected = partial_schema(&schema, &aggregate).unwrap();
    let (batches, _) = run_aggregate(spec(&[], &[]), Some(aggregate), vec![(file, vec![0, 1])]).unwrap();
    let types = |s: &SchemaRef| s.fields().iter().map(|f| f.data_type().clone()).collect::<Vec<_>>();
    assert_eq!(types(&batches[0].schema()), types(&expected));
    assert_eq!(types(&expected), [DataType::Boolean, DataType::Int64, DataType::Int64, DataType::Float64]);
}

#[test]
fn an_aggregating_scan_refuses_columns_and_bad_expressions() {
    let file = particles(0, 2000, 1000);
    let empty = AggregateSpec { group_by: vec![], aggregates: vec![] };
    let refused = run_aggregate(spec(&["id"], &[]), Some(empty), vec![(file.clone(), vec![0])]).unwrap_err();
    assert!(matches!(refused, Error::BadQuery(_)), "{refused}");
    let unknown = AggregateSpec { group_by: vec![], aggregates: vec![partial(AggregateFunction::Sum, Some("nope"))] };
    let refused = run_aggregate(spec(&[], &[]), Some(unknown), vec![(file.clone(), vec![0])]).unwrap_err();
    assert!(matches!(&refused, Error::BadQuery(t) if t.contains("nope")), "{refused}");
    let injected = AggregateSpec {
        group_by: vec!["id) FROM t; DROP TABLE t --".into()],
        aggregates: vec![partial(AggregateFunction::Count, None)],
    };
    let refused = run_aggregate(spec(&[], &[]), Some(injected), vec![(file, vec![0])]).unwrap_err();
    assert!(matches!(refused, Error::BadQuery(_)), "{refused}");
}

#[test]
fn limits_and_bad_queries() {
    let file = particles(0, 10_000, 1000);
    let mut limited = spec(&["id"], &["ke < 5000"]);
    limited.limit = Some(7);
    let (batches, _) = run(limited, vec![(file.clone(), (0..10).collect())]).unwrap();
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 7);
    let unknown = run(spec(&["nope"], &[]), vec![(file.clone(), vec![0])]).unwrap_err();
    assert!(matches!(unknown, Error::BadQuery(_)), "{unknown}");
    let broken = run(spec(&["id"], &["ke >"]), vec![(file.clone(), vec![0])]).unwrap_err();
    assert!(matches!(&broken, Error::BadQuery(t) if t.contains("ke >")), "{broken}");
    let injected = run(spec(&["id"], &["1=1) UNION SELECT 1 --"]), vec![(file, vec![0])]).unwrap_err();
    assert!(matches!(injected, Error::BadQuery(_)), "{injected}");
}

#[test]
fn unreadable_bytes_are_unavailability_not_bad_data() {
    let file = particles(0, 10_000, 1000);
    let footer = Arc::new(footer_of("b/o", &file));
    let schema = Arc::clone(&footer.schema);
    // The source holds only the first half of the file.
    let half = file.slice(..file.len() / 2);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let error = runtime
        .block_on(async {
            let objects =
                vec![ScanObject { name: "b/o".into(), size: file.len() as u64, footer, row_groups: (0..10).collect() }];
            let source = Arc::new(MemSource { files: vec![half], ..Default::default() });
            let stream = scan(objects, schema, source, &spec(&["id"], &[]), None, &ScanLimits::default()).await?;
            let results: Vec<_> = stream.collect().await;
            results.into_iter().collect::<Result<Vec<_>, _>>().map_err(Error::from_datafusion)
        })
        .unwrap_err();
    assert!(matches!(error, Error::Unavailable(_)), "{error}");
}

#[test]
fn footers_that_lie_are_refused_before_anything_is_read() {
    let file = particles(0, 1000, 100);
    let n = file.len();
    assert!(
        matches!(Footer::tail_len("b/x", b"12345678", 100), Err(Error::BadQuery(t)) if t.contains("not a Parquet"))
    );
    let mut huge = file[n - 8..].to_vec();
    huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(Footer::tail_len("b/x", &huge, n as u64).is_err());
    // A footer whose row group points past the data.
    let footer = footer_of("b/x", &file);
    let truncated = Footer::parse("b/x", footer.bytes.clone(), footer.bytes.len() as u64 + 100);
    assert!(matches!(truncated, Err(Error::BadQuery(t)) if t.contains("outside the data")));
    // A 8-byte footer declaring 2^31 - 1 row groups: refused before the decoder reserves
    // memory for them (it would abort the process).
    let hostile = Footer::parse("b/x", Bytes::from_static(&[0x49, 0xfc, 0xff, 0xff, 0xff, 0xff, 0x07, 0x00]), 1 << 30);
    assert!(matches!(hostile, Err(Error::BadQuery(t)) if t.contains("elements")));
    // Garbage footers of every length up to 2 KiB give errors, never panics.
    let mut state = 0x9e3779b97f4a7c15u64;
    for len in 0..2048usize {
        let garbage: Vec<u8> = (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        let _ = Footer::parse("b/x", Bytes::from(garbage), 1 << 30);
    }
    // Flipped bytes of a real footer.
    for at in 0..footer.bytes.len() {
        let mut bytes = footer.bytes.to_vec();
        bytes[at] ^= 0xff;
        let _ = Footer::parse("b/x", Bytes::from(bytes), n as u64);
    }
}

#[test]
fn ipc_round_trip() {
    let file = particles(0, 3000, 1000);
    let (batches, _) = run(spec(&["id", "ke"], &["id < 1500"]), vec![(file, vec![0, 1, 2])]).unwrap();
    let mut encoder = IpcEncoder::new(&batches[0].schema()).unwrap();
    let mut bytes = encoder.take();
    for batch in &batches {
        encoder.write(batch).unwrap();
        bytes.extend(encoder.take());
    }
    bytes.extend(encoder.finish().unwrap());
    let reader = datafusion::arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None).unwrap();
    let decoded: Vec<RecordBatch> = reader.map(Result::unwrap).collect();
    assert_eq!(ids(&decoded), (0..1500).collect::<Vec<_>>());
}
