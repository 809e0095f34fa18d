//! Record splits: every record exactly once whatever the split points, filters and aggregates
//! as over Parquet, clear errors for bad records.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use datafusion::arrow::array::{Array, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use proptest::prelude::*;

use super::*;
use crate::records::{CsvFormat, RECORD_BYTES_MAX, RangeCut};

/// One object in memory; counts the bytes read and the largest read.
#[derive(Debug, Default)]
struct OneObject {
    bytes: Bytes,
    read: AtomicU64,
}

impl ByteSource for OneObject {
    fn read(&self, object: usize, range: Range<u64>) -> BoxFuture<'static, Result<Bytes, String>> {
        assert_eq!(object, 0);
        self.read.fetch_add(range.end - range.start, Ordering::Relaxed);
        let bytes = self.bytes.clone();
        Box::pin(async move {
            if range.start > range.end || range.end > bytes.len() as u64 {
                return Err(format!("range {range:?} past {}", bytes.len()));
            }
            Ok(bytes.slice(range.start as usize..range.end as usize))
        })
    }
}

fn csv(header: bool) -> RecordFormat {
    RecordFormat::Csv(CsvFormat {
        header,
        delimiter: b',',
        quote: b'"',
        escape: None,
        comment: None,
        empty_is_null: false,
    })
}

fn strings(names: &[&str]) -> SchemaRef {
    Arc::new(Schema::new(names.iter().map(|n| Field::new(*n, DataType::Utf8, true)).collect::<Vec<_>>()))
}

/// The splits an object of `size` bytes gets when its chunks start at `cuts` (and 0): the
/// records after each chunk's first byte up to the one starting at its end.
fn splits_at(size: u64, cuts: &[u64]) -> Vec<RecordSplit> {
    let mut starts: Vec<u64> = std::iter::once(0).chain(cuts.iter().copied().filter(|c| *c > 0 && *c < size)).collect();
    starts.sort_unstable();
    starts.dedup();
    let mut out = Vec::new();
    for (i, &start) in starts.iter().enumerate() {
        let first = if start == 0 { 0 } else { start + 1 };
        let last = starts.get(i + 1).copied().unwrap_or(size - 1).min(size - 1);
        if first <= last {
            out.push(RecordSplit { first, last });
        }
    }
    out
}

fn scan_splits(
    bytes: Bytes,
    format: RecordFormat,
    schema: SchemaRef,
    splits: Vec<RecordSplit>,
    spec: &ScanSpec,
    aggregate: Option<&AggregateSpec>,
) -> Result<(Vec<RecordBatch>, u64), Error> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async move {
        let size = bytes.len() as u64;
        let source = Arc::new(OneObject { bytes, read: AtomicU64::new(0) });
        let objects = vec![SplitObject { name: "b/data".into(), size, splits }];
        let stream =
            scan_records(objects, schema, &format, source.clone(), spec, aggregate, &ScanLimits::default()).await?;
        let batches: Vec<RecordBatch> =
            stream.collect::<Vec<_>>().await.into_iter().collect::<Result<_, _>>().map_err(Error::from_datafusion)?;
        Ok((batches, source.read.load(Ordering::Relaxed)))
    })
}

fn all(columns: &[&str]) -> ScanSpec {
    ScanSpec {
        columns: columns.iter().map(|c| c.to_string()).collect(),
        filters: vec![],
        limit: None,
        count_only: false,
    }
}

/// The rows of string columns, sorted.
fn rows(batches: &[RecordBatch]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for batch in batches {
        for row in 0..batch.num_rows() {
            out.push(
                batch
                    .columns()
                    .iter()
                    .map(|c| c.as_any().downcast_ref::<StringArray>().unwrap().value(row).to_owned())
                    .collect(),
            );
        }
    }
    out.sort();
    out
}

/// A CSV field as written: quoted when it holds the delimiter or a quote.
fn field(value: &str) -> String {
    if value.contains([',', '"']) { format!("\"{}\"", value.replace('"', "\"\"")) } else { value.to_owned() }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Wherever the chunks start, the splits take every record exactly once.
    #[test]
    fn splits_take_every_csv_record_once(
        records in proptest::collection::vec(("[a-z]{0,40}", "[a-z ,\"]{0,12}"), 1..200),
        cuts in proptest::collection::vec(0u64..20_000, 0..12),
        header in any::<bool>(),
        crlf in any::<bool>(),
    ) {
        let end = if crlf { "\r\n" } else { "\n" };
        let mut text = String::new();
        if header {
            text.push_str(&format!("name,note{end}"));
        }
        for (name, note) in &records {
            text.push_str(&format!("{},{}{end}", field(name), field(note)));
        }
        let size = text.len() as u64;
        let splits = splits_at(size, &cuts);
        let (batches, read) =
            scan_splits(Bytes::from(text), csv(header), strings(&["a", "b"]), splits.clone(), &all(&["a", "b"]), None)
                .unwrap();
        let mut expected: Vec<Vec<String>> =
            records.iter().map(|(n, t)| vec![n.clone(), t.clone()]).collect();
        expected.sort();
        prop_assert_eq!(rows(&batches), expected);
        // Each split reads its own bytes, the byte before it and its last record's tail.
        prop_assert!(read <= size + splits.len() as u64 * (1 + (64 << 10)), "read {} of {}", read, size);
    }

    #[test]
    fn splits_take_every_json_record_once(
        values in proptest::collection::vec(0i64..1_000_000, 1..300),
        cuts in proptest::collection::vec(0u64..20_000, 0..12),
    ) {
        let text: String = values.iter().map(|v| format!("{{\"v\": {v}, \"s\": \"x{v}\"}}\n")).collect();
        let size = text.len() as u64;
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, true), Field::new("s", DataType::Utf8, true)]));
        let (batches, _) = scan_splits(Bytes::from(text), RecordFormat::JsonLines, schema, splits_at(size, &cuts), &all(&["v"]), None).unwrap();
        let mut got: Vec<i64> = batches.iter().flat_map(|b| b.column(0).as_any().downcast_ref::<Int64Array>().unwrap().values().to_vec()).collect();
        got.sort_unstable();
        let mut expected = values.clone();
        expected.sort_unstable();
        prop_assert_eq!(got, expected);
    }

    /// A cut applied piece by piece keeps the records starting in the range, whatever the pieces.
    #[test]
    fn a_cut_keeps_the_records_that_start_in_its_range(
        lines in proptest::collection::vec("[a-z]{0,20}", 1..50),
        first in 0u64..600,
        span in 0u64..600,
        piece in 1usize..50,
    ) {
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        let bytes = text.as_bytes();
        let last = (first + span).min(bytes.len() as u64 - 1);
        prop_assume!(first <= last);
        let mut starts = vec![0u64];
        starts.extend(bytes.iter().enumerate().filter(|(_, b)| **b == b'\n').map(|(i, _)| i as u64 + 1));
        let expected: String = starts
            .windows(2)
            .filter(|w| w[0] >= first && w[0] <= last)
            .map(|w| std::str::from_utf8(&bytes[w[0] as usize..w[1] as usize]).unwrap())
            .collect();
        let mut cut = RangeCut::new(first, last);
        let mut got = Vec::new();
        for chunk in bytes[RangeCut::start(first) as usize..].chunks(piece) {
            let (kept, done) = cut.apply(chunk);
            got.extend_from_slice(kept);
            if done {
                break;
            }
        }
        prop_assert_eq!(String::from_utf8(got).unwrap(), expected);
    }
}

fn csv_rows(count: usize) -> String {
    (0..count).map(|i| format!("{i},{}\n", if i % 3 == 0 { "x" } else { "" })).collect()
}

#[test]
fn filters_and_partial_aggregates_run_over_splits() {
    let text = csv_rows(50_000);
    let size = text.len() as u64;
    let cuts: Vec<u64> = (1..10).map(|i| size * i / 10).collect();
    let schema = strings(&["id", "tag"]);
    // Empty fields are empty strings, not nulls (S3 Select's rule).
    let mut filtered = all(&["id"]);
    filtered.filters = vec!["tag = ''".into(), "CAST(id AS BIGINT) < 100".into()];
    let (batches, _) = scan_splits(
        Bytes::from(text.clone()),
        csv(false),
        Arc::clone(&schema),
        splits_at(size, &cuts),
        &filtered,
        None,
    )
    .unwrap();
    let expected: Vec<Vec<String>> = {
        let mut ids: Vec<Vec<String>> = (0..100).filter(|i| i % 3 != 0).map(|i| vec![i.to_string()]).collect();
        ids.sort();
        ids
    };
    assert_eq!(rows(&batches), expected);

    let aggregate = AggregateSpec {
        group_by: vec!["tag".into()],
        aggregates: vec![
            PartialAggregate { function: AggregateFunction::Count, argument: None },
            PartialAggregate { function: AggregateFunction::Sum, argument: Some("CAST(id AS BIGINT)".into()) },
        ],
    };
    let (batches, _) =
        scan_splits(Bytes::from(text), csv(false), schema, splits_at(size, &cuts), &all(&[]), Some(&aggregate))
            .unwrap();
    // Partial rows: one per group per partition at most; add them up.
    let mut by_tag = std::collections::BTreeMap::<String, (i64, i64)>::new();
    for batch in &batches {
        let tags = batch.column(0).as_any().downcast_ref::<StringArray>().unwrap();
        let counts = batch.column(1).as_any().downcast_ref::<Int64Array>().unwrap();
        let sums = batch.column(2).as_any().downcast_ref::<Int64Array>().unwrap();
        for row in 0..batch.num_rows() {
            let entry = by_tag.entry(tags.value(row).to_owned()).or_default();
            entry.0 += counts.value(row);
            entry.1 += sums.value(row);
        }
    }
    let x: Vec<i64> = (0..50_000).filter(|i| i % 3 == 0).collect();
    let blank: Vec<i64> = (0..50_000).filter(|i| i % 3 != 0).collect();
    assert_eq!(by_tag["x"], (x.len() as i64, x.iter().sum()));
    assert_eq!(by_tag[""], (blank.len() as i64, blank.iter().sum()));
}

#[test]
fn bad_records_fail_with_errors_that_name_the_object() {
    // A ragged CSV row.
    let ragged = Bytes::from_static(b"1,a\n2,b,extra\n3,c\n");
    let error =
        scan_splits(ragged, csv(false), strings(&["a", "b"]), splits_at(18, &[]), &all(&["a"]), None).unwrap_err();
    assert!(matches!(&error, Error::BadQuery(text) if text.contains("b/data")), "{error}");
    // JSON that is not.
    let broken = Bytes::from_static(b"{\"v\": 1}\n{\"v\": \n");
    let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, true)]));
    let error =
        scan_splits(broken, RecordFormat::JsonLines, schema, splits_at(17, &[]), &all(&["v"]), None).unwrap_err();
    assert!(matches!(&error, Error::BadQuery(text) if text.contains("b/data")), "{error}");
    // A CSV column of a type the CSV reader cannot parse.
    let nested = Arc::new(Schema::new(vec![Field::new(
        "v",
        DataType::List(Arc::new(Field::new("item", DataType::Int64, true))),
        true,
    )]));
    let error =
        scan_splits(Bytes::from_static(b"1\n"), csv(false), nested, splits_at(2, &[]), &all(&["v"]), None).unwrap_err();
    assert!(matches!(&error, Error::BadQuery(text) if text.contains("cannot be read as")), "{error}");
    // A value that is not of its integer column's type.
    let typed = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, true)]));
    let error = scan_splits(Bytes::from_static(b"1\n2.5\n"), csv(false), typed, splits_at(6, &[]), &all(&["v"]), None)
        .unwrap_err();
    assert!(matches!(&error, Error::BadQuery(text) if text.contains("b/data")), "{error}");
    // A split past the object.
    let error = scan_splits(
        Bytes::from_static(b"1\n"),
        csv(false),
        strings(&["v"]),
        vec![RecordSplit { first: 0, last: 5 }],
        &all(&["v"]),
        None,
    )
    .unwrap_err();
    assert!(matches!(&error, Error::BadQuery(_)), "{error}");
}

#[test]
fn a_record_running_far_past_its_split_is_refused() {
    // The second record starts inside the first split and has no line break for 2 MiB.
    let mut text = b"a\n".to_vec();
    text.extend(std::iter::repeat_n(b'x', 2 << 20));
    text.extend_from_slice(b"\nb\n");
    let size = text.len() as u64;
    let error = scan_splits(Bytes::from(text), csv(false), strings(&["v"]), splits_at(size, &[4]), &all(&["v"]), None)
        .unwrap_err();
    let limit = RECORD_BYTES_MAX.to_string();
    assert!(matches!(&error, Error::BadQuery(text) if text.contains(&limit) && text.contains("b/data")), "{error}");
}

#[test]
fn schemas_travel_as_bytes() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("v", DataType::Int64, true),
        Field::new("s", DataType::Utf8, true),
        Field::new("l", DataType::List(Arc::new(Field::new("item", DataType::Float64, true))), true),
    ]));
    let bytes = records::schema_to_bytes(&schema).unwrap();
    assert_eq!(records::schema_from_bytes(&bytes).unwrap(), schema);
    assert!(matches!(records::schema_from_bytes(b"not a schema"), Err(Error::BadQuery(_))));
}

#[test]
fn a_line_break_inside_quotes_is_refused_wherever_the_splits_fall() {
    // Quotes doubled or escaped, and a comment line with a lone quote, are fine.
    let fine = Bytes::from_static(b"\"say \"\"hi\"\"\",1\n# don't\n\"a,b\",2\n");
    let format = RecordFormat::Csv(CsvFormat {
        header: false,
        delimiter: b',',
        quote: b'"',
        escape: None,
        comment: Some(b'#'),
        empty_is_null: false,
    });
    let size = fine.len() as u64;
    let (batches, _) =
        scan_splits(fine.clone(), format.clone(), strings(&["a", "b"]), splits_at(size, &[]), &all(&["a"]), None)
            .unwrap();
    assert_eq!(batches.iter().map(RecordBatch::num_rows).sum::<usize>(), 2);
    let escaped = RecordFormat::Csv(CsvFormat { escape: Some(b'\\'), comment: None, ..csv_format() });
    let (batches, _) = scan_splits(
        Bytes::from_static(b"\"a\\\"b,c\",1\n\"d\",2\n"),
        escaped,
        strings(&["a", "b"]),
        splits_at(17, &[]),
        &all(&["a"]),
        None,
    )
    .unwrap();
    assert_eq!(rows(&batches), [vec!["a\"b,c".to_owned()], vec!["d".to_owned()]]);
    // A quoted line break: refused inside one split, and across two.
    let text = Bytes::from_static(b"1,\"two\nlines\"\n3,x\n");
    for cuts in [vec![], vec![5], vec![12]] {
        let error =
            scan_splits(text.clone(), csv(false), strings(&["a", "b"]), splits_at(18, &cuts), &all(&["a"]), None)
                .unwrap_err();
        // Splits are decoded concurrently: cut inside the quotes, the second split's own refusal
        // (its first line has too few fields) may come back before the first split's.
        let line_break = matches!(&error, Error::BadQuery(t) if t.contains("line break"));
        let split_refused = !cuts.is_empty() && error.to_string().contains("incorrect number of fields");
        assert!(line_break || split_refused, "{cuts:?}: {error}");
    }
}

fn csv_format() -> CsvFormat {
    CsvFormat { header: false, delimiter: b',', quote: b'"', escape: None, comment: None, empty_is_null: false }
}

#[test]
fn quotes_count_as_the_csv_parser_counts_them() {
    // A quote inside an unquoted field is a plain byte (inches): fine.
    let inches = Bytes::from_static(b"1,12\" pipe\n2,3\n");
    let (batches, _) =
        scan_splits(inches, csv(false), strings(&["a", "b"]), splits_at(15, &[]), &all(&["b"]), None).unwrap();
    assert_eq!(rows(&batches), [vec!["12\" pipe".to_owned()], vec!["3".to_owned()]]);
    // A stray quote does not hide a quoted field's line break behind it.
    let hidden = Bytes::from_static(b"1,ab\"c,\"x\ny\",z\n");
    let error =
        scan_splits(hidden, csv(false), strings(&["a", "b", "c"]), splits_at(15, &[]), &all(&["a"]), None).unwrap_err();
    assert!(matches!(&error, Error::BadQuery(t) if t.contains("line break")), "{error}");
    // After a closing quote the field goes on unquoted; CRLF ends records.
    let tail = Bytes::from_static(b"\"a\"b,1\r\n\"c\",2\r\n");
    let (batches, _) =
        scan_splits(tail, csv(false), strings(&["a", "b"]), splits_at(15, &[]), &all(&["b"]), None).unwrap();
    assert_eq!(rows(&batches), [vec!["1".to_owned()], vec!["2".to_owned()]]);
}

#[test]
fn json_lines_are_one_record_per_line() {
    let schema = Arc::new(Schema::new(vec![Field::new("s", DataType::Utf8, true)]));
    for bad in [&b"{\"s\": \"a\nb\"}\n"[..], &b"{\"s\":\n \"a\"}\n"[..], &b"[{\"s\": \"a\"},\n{\"s\": \"b\"}]\n"[..]] {
        let size = bad.len() as u64;
        let error = scan_splits(
            Bytes::copy_from_slice(bad),
            RecordFormat::JsonLines,
            Arc::clone(&schema),
            splits_at(size, &[]),
            &all(&["s"]),
            None,
        )
        .unwrap_err();
        assert!(matches!(&error, Error::BadQuery(t) if t.contains("line")), "{error}");
    }
    // Braces and escaped quotes inside strings are not structure.
    let fine = Bytes::from_static(b"{\"s\": \"{[\\\"\"}\n{\"s\": \"}\"}\n");
    let size = fine.len() as u64;
    let (batches, _) =
        scan_splits(fine, RecordFormat::JsonLines, Arc::clone(&schema), splits_at(size, &[]), &all(&["s"]), None)
            .unwrap();
    assert_eq!(rows(&batches), [vec!["{[\"".to_owned()], vec!["}".to_owned()]]);
    // Documents read whole may span lines.
    let mut decoder = records::Decoder::json_documents(&schema).unwrap();
    let mut got = Vec::new();
    decoder
        .feed(b"{\n  \"s\": \"x\"\n}\n{\"s\":\n\"y\"}", true, &mut |batch| {
            got.push(batch);
            Ok(())
        })
        .unwrap();
    assert_eq!(rows(&got), [vec!["x".to_owned()], vec!["y".to_owned()]]);
}

#[test]
fn typed_csv_columns_and_empty_fields_as_nulls() {
    use datafusion::arrow::array::{Array, Float64Array, Int64Array, StringArray};
    let schema = Arc::new(Schema::new(vec![
        Field::new("n", DataType::Int64, true),
        Field::new("x", DataType::Float64, true),
        Field::new("s", DataType::Utf8, true),
    ]));
    let bytes = Bytes::from_static(b"1,0.5,a\n,,\n3,1e3,\n");
    let size = bytes.len() as u64;
    for empty_is_null in [false, true] {
        let format = RecordFormat::Csv(CsvFormat { empty_is_null, ..csv_format() });
        let (batches, _) =
            scan_splits(bytes.clone(), format, Arc::clone(&schema), splits_at(size, &[]), &all(&["n", "x", "s"]), None)
                .unwrap();
        let batch = datafusion::arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap();
        let n = batch.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        let x = batch.column(1).as_any().downcast_ref::<Float64Array>().unwrap();
        let s = batch.column(2).as_any().downcast_ref::<StringArray>().unwrap();
        assert_eq!(n.iter().collect::<Vec<_>>(), vec![Some(1), None, Some(3)]);
        assert_eq!(x.iter().collect::<Vec<_>>(), vec![Some(0.5), None, Some(1000.0)]);
        // Strings: empty as S3 Select has it, or NULL as SQL engines read CSV.
        if empty_is_null {
            assert_eq!(s.iter().collect::<Vec<_>>(), vec![Some("a"), None, None]);
        } else {
            assert_eq!(s.null_count(), 0);
            assert_eq!(s.iter().collect::<Vec<_>>(), vec![Some("a"), Some(""), Some("")]);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Garbage through the CSV and JSON readers, typed and untyped, cut anywhere: an answer
    /// or an error, never a panic or a hang (the test suite's bounded fuzzing of the readers).
    #[test]
    fn garbage_records_give_answers_or_errors(
        bytes in proptest::collection::vec(
            prop_oneof![any::<u8>(), Just(b'\n'), Just(b','), Just(b'"'), Just(b'{'), Just(b'}'), Just(b'1')],
            1..4096,
        ),
        cuts in proptest::collection::vec(0u64..4096, 0..6),
        typed in any::<bool>(),
        json in any::<bool>(),
    ) {
        let size = bytes.len() as u64;
        let kind = if typed { DataType::Int64 } else { DataType::Utf8 };
        let schema = Arc::new(Schema::new(vec![Field::new("a", kind, true), Field::new("b", DataType::Utf8, true)]));
        let format = if json { RecordFormat::JsonLines } else { csv(false) };
        let _ = scan_splits(Bytes::from(bytes), format, schema, splits_at(size, &cuts), &all(&["a", "b"]), None);
    }
}
