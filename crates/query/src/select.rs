//! S3 Select (`SelectObjectContent`) over one object: the query names `S3Object`, the input is
//! CSV, JSON or Parquet, the output CSV or JSON lines. A Parquet object is the same table as
//! `'bucket/key'` in [`crate::start`] (scans on the nodes). An uncompressed CSV or JSON object
//! is scanned on the nodes too, split as input splits are: each node takes the records that
//! start in its data chunks (with a `ScanRange`, only those that also start inside the range),
//! reading the last one's tail from the next chunk. A gzip or bzip2 object cannot be split
//! (a decompressor starts at the beginning), so it streams through this client's Arrow
//! decoders, window by window, never whole.
//!
//! CSV columns are strings, as S3 Select has them (`CAST` for numbers; an empty field is an
//! empty string): named by the header line with `FileHeaderInfo USE`, `_1`, `_2`, ...
//! otherwise. JSON input is records one per line (`LINES`, or a `DOCUMENT` written that way);
//! fields take the types the first 1,000 records (at most 1 MiB) show, and a field none of
//! them has is not in the table.

use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use client::{Client, ObjectInfo};
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use pushdown::datafusion::arrow::array::RecordBatch;
use pushdown::datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use pushdown::datafusion::catalog::streaming::StreamingTable;
use pushdown::datafusion::common::tree_node::TreeNodeRecursion;
use pushdown::datafusion::error::DataFusionError;
use pushdown::datafusion::execution::{SendableRecordBatchStream, TaskContext};
use pushdown::datafusion::logical_expr::LogicalPlan;
use pushdown::datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use pushdown::datafusion::physical_plan::streaming::PartitionStream;
use pushdown::datafusion::sql::parser::Statement as DfStatement;
use pushdown::datafusion::sql::sqlparser::ast::{SetExpr, Statement, TableFactor};

use pushdown::records::{CsvFormat, Decoder, RecordFormat};

use crate::{Error, QueryCounters, QueryOptions, df_error, plan::ObjectTable, stream_error};

/// The name queries give the object.
const TABLE: &str = "s3object";
/// Bytes of a CSV or JSON object read per step.
const WINDOW_BYTES: u64 = 4 << 20;
/// Bytes of a CSV or JSON object read first to learn its columns.
const HEAD_BYTES: u64 = 64 << 10;
/// Bytes read when those do not hold the CSV header or 1,000 JSON records.
const HEAD_BYTES_MAX: u64 = 1 << 20;
/// Records of a JSON object looked at to learn its fields.
const JSON_SCHEMA_RECORDS: usize = 1000;

/// How the object's records are written.
#[derive(Clone, Debug)]
pub enum SelectInput {
    Csv(CsvInput),
    Json(JsonType),
    Parquet,
}

/// S3 Select's JSON `Type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JsonType {
    /// One record per line: split over the nodes like CSV.
    Lines,
    /// Records as they come (a record may span lines): read whole by this client.
    Document,
}

impl SelectInput {
    /// CSV or JSON: records a line at a time (not Parquet).
    pub fn is_records(&self) -> bool {
        !matches!(self, SelectInput::Parquet)
    }
}

/// Begins the error of an object whose bytes are not compressed as its `CompressionType`
/// says (S3's `InvalidCompressionFormat`).
pub const NOT_COMPRESSED_AS_DESCRIBED: &str = "not compressed as described";

/// CSV input settings (`InputSerialization.CSV`).
#[derive(Clone, Debug)]
pub struct CsvInput {
    pub header: HeaderInfo,
    pub delimiter: u8,
    pub quote: u8,
    /// Lines starting with this byte are skipped.
    pub comment: Option<u8>,
    /// Inside a quoted field, this byte makes the next one literal (`QuoteEscapeCharacter`;
    /// `None`: a doubled quote is a quote).
    pub escape: Option<u8>,
}

impl Default for CsvInput {
    fn default() -> Self {
        Self { header: HeaderInfo::None, delimiter: b',', quote: b'"', comment: None, escape: None }
    }
}

/// `FileHeaderInfo`: whether the first line names the columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderInfo {
    /// Columns are named by the first line.
    Use,
    /// The first line is skipped; columns are `_1`, `_2`, ...
    Ignore,
    /// There is no header; columns are `_1`, `_2`, ...
    None,
}

/// How a CSV or JSON object's bytes are compressed (`CompressionType`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Compression {
    #[default]
    None,
    /// One or more gzip members.
    Gzip,
    /// One or more bzip2 streams.
    Bzip2,
}

/// S3's `ScanRange`: only records whose first byte lies in `start..=end` are selected (a
/// record that starts there is read to its end). `start` alone: from there to the object's
/// end; `end` alone: the last `end` bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanRange {
    pub start: Option<u64>,
    pub end: Option<u64>,
}

impl ScanRange {
    /// The first and last byte (inclusive) of an object of `size` bytes whose records are
    /// selected; `None` when no byte is.
    fn bytes(&self, size: u64) -> Option<(u64, u64)> {
        let last = size.checked_sub(1)?;
        let (start, end) = match (self.start, self.end) {
            (None, None) => (0, last),
            (Some(start), None) => (start, last),
            (None, Some(tail)) => (size.saturating_sub(tail), last),
            (Some(start), Some(end)) => (start, end.min(last)),
        };
        (start <= end).then_some((start, end))
    }
}

/// What an S3 Select reads: the object, how its bytes are written, and which of its records.
#[derive(Clone, Debug)]
pub struct SelectSource {
    pub bucket: String,
    pub key: String,
    pub input: SelectInput,
    /// CSV and JSON only (a Parquet object compresses its own pages).
    pub compression: Compression,
    /// CSV and JSON lines only, uncompressed.
    pub scan_range: Option<ScanRange>,
}

/// How result records are written.
#[derive(Clone, Debug)]
pub enum SelectOutput {
    Csv {
        delimiter: u8,
        quote: u8,
        always_quote: bool,
        /// Written before a quote inside a quoted field (`None`: the quote is doubled).
        escape: Option<u8>,
    },
    /// One JSON object per record, each on its own line.
    Json,
}

/// A running S3 Select: result bytes (CSV or JSON lines) as they come, and what it moved.
pub struct Selection {
    pub records: BoxStream<'static, Result<Bytes, Error>>,
    pub scanned: ScannedBytes,
}

impl std::fmt::Debug for Selection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Selection").finish_non_exhaustive()
    }
}

/// What a select read to answer, counted as it runs (S3's BytesScanned).
#[derive(Clone, Debug)]
pub struct ScannedBytes {
    counters: Arc<QueryCounters>,
    /// Object bytes read by this client (CSV and JSON input).
    records: Arc<AtomicU64>,
    /// Record bytes (decompressed, within the scan range) decoded by this client.
    decoded: Arc<AtomicU64>,
}

impl ScannedBytes {
    /// What the select's scan moved: node requests, result bytes, what the client read.
    pub fn counters(&self) -> &Arc<QueryCounters> {
        &self.counters
    }

    /// What the nodes read, and what this client read (an object's head for its columns; all
    /// of a compressed object, or of what no node could take).
    pub fn total(&self) -> u64 {
        self.counters.node_read_bytes.load(Ordering::Relaxed)
            + self.counters.client_read_bytes.load(Ordering::Relaxed)
            + self.records.load(Ordering::Relaxed)
    }

    /// Uncompressed bytes processed (S3's BytesProcessed): what the nodes read, what this
    /// client read, and the record bytes it decompressed and decoded itself.
    pub fn processed(&self) -> u64 {
        self.counters.node_read_bytes.load(Ordering::Relaxed)
            + self.counters.client_read_bytes.load(Ordering::Relaxed)
            + self.decoded.load(Ordering::Relaxed)
    }
}

/// Starts `sql` over the records of `source`.
pub async fn select(
    client: &Client,
    source: &SelectSource,
    sql: &str,
    output: &SelectOutput,
    options: &QueryOptions,
) -> Result<Selection, Error> {
    let (bucket, key, input) = (source.bucket.as_str(), source.key.as_str(), &source.input);
    if matches!(input, SelectInput::Parquet) && (source.compression != Compression::None || source.scan_range.is_some())
    {
        return Err(Error::BadQuery(
            "a Parquet object is read whole and uncompressed: no CompressionType or ScanRange".into(),
        ));
    }
    if source.compression != Compression::None && source.scan_range.is_some() {
        return Err(Error::BadQuery("ScanRange needs uncompressed input".into()));
    }
    if matches!(input, SelectInput::Json(JsonType::Document)) && source.scan_range.is_some() {
        return Err(Error::BadQuery("ScanRange needs JSON LINES input: a document's records may span lines".into()));
    }
    // A select runs in the gateway for whoever may read the object: past its memory it fails
    // rather than spill to the gateway's disk.
    let mut options = options.clone();
    options.limits.spill = pushdown::Spill::Never;
    let options = &options;
    let ctx = crate::session(options)?;
    let state = ctx.state();
    let mut statement =
        state.sql_to_statement(sql, &pushdown::datafusion::config::Dialect::Generic).map_err(df_error)?;
    if let DfStatement::Statement(parsed) = &mut statement {
        s3_select_types(parsed.as_mut());
    }
    let DfStatement::Statement(parsed) = &statement else {
        return Err(Error::BadQuery("S3 Select runs SELECT statements only".into()));
    };
    let Statement::Query(query) = parsed.as_ref() else {
        return Err(Error::BadQuery("S3 Select runs SELECT statements only".into()));
    };
    // One table, S3Object, and no joins (a self join of a large object multiplies rows).
    let single = match query.body.as_ref() {
        SetExpr::Select(select) => {
            select.from.len() == 1
                && select.from[0].joins.is_empty()
                && matches!(select.from[0].relation, TableFactor::Table { .. })
        }
        _ => false,
    };
    if !single {
        return Err(Error::BadQuery(
            "S3 Select reads FROM S3Object only: one table, no joins or set operations".into(),
        ));
    }
    for reference in state.resolve_table_references(&statement).map_err(df_error)? {
        if reference.schema().is_some() || !reference.table().eq_ignore_ascii_case(TABLE) {
            return Err(Error::BadQuery(format!("S3 Select reads FROM S3Object, not {reference}")));
        }
    }
    let counters = Arc::new(QueryCounters::default());
    let scanned = Arc::new(AtomicU64::new(0));
    let decoded = Arc::new(AtomicU64::new(0));
    match input {
        SelectInput::Parquet => {
            let table = ObjectTable::open_object(client, bucket, key, options, Arc::clone(&counters)).await?;
            ctx.register_table(TABLE, Arc::new(table)).map_err(df_error)?;
        }
        SelectInput::Csv(_) | SelectInput::Json(JsonType::Lines) if source.compression == Compression::None => {
            let info = client.head(bucket, key).await?;
            let schema = records_schema(client, &info, input, source.compression, &counters).await?;
            let range = source.scan_range.unwrap_or_default().bytes(info.meta.size);
            let format = record_format(input);
            let counters = Arc::clone(&counters);
            let table = ObjectTable::open_records(client, info, format, schema, range, options, counters)?;
            ctx.register_table(TABLE, Arc::new(table)).map_err(df_error)?;
        }
        SelectInput::Csv(_) | SelectInput::Json(_) => {
            let info = client.head(bucket, key).await?;
            let schema = records_schema(client, &info, input, source.compression, &counters).await?;
            let partition = RecordPartition {
                client: client.clone(),
                info,
                format: record_format(input),
                json_documents: matches!(input, SelectInput::Json(JsonType::Document)),
                compression: source.compression,
                schema,
                scanned: Arc::clone(&scanned),
                decoded: Arc::clone(&decoded),
            };
            let table =
                StreamingTable::try_new(Arc::clone(&partition.schema), vec![Arc::new(partition)]).map_err(df_error)?;
            ctx.register_table(TABLE, Arc::new(table)).map_err(df_error)?;
        }
    }
    let plan = ctx.state().statement_to_plan(statement).await.map_err(df_error)?;
    one_scan_only(&plan)?;
    pushdown::growth::check_plan(&plan)?;
    let frame = ctx.execute_logical_plan(plan).await.map_err(df_error)?;
    let batches = frame.execute_stream().await.map_err(df_error)?;
    let records = encode(batches, output.clone());
    Ok(Selection { records, scanned: ScannedBytes { counters, records: scanned, decoded } })
}

/// Refuses a plan that reads S3Object more than once or joins anything, anywhere in it: the
/// check of the statement's top SELECT does not see subqueries (`... WHERE x IN (SELECT ...
/// FROM s3object a, s3object b, s3object c)` is a cubic join of the object).
fn one_scan_only(plan: &LogicalPlan) -> Result<(), Error> {
    let mut scans = 0usize;
    let mut joins = false;
    plan.apply_with_subqueries(|node| {
        match node {
            LogicalPlan::TableScan(_) => scans += 1,
            LogicalPlan::Join(_)
            | LogicalPlan::Subquery(_)
            | LogicalPlan::Union(_)
            | LogicalPlan::RecursiveQuery(_) => {
                joins = true;
            }
            _ => {}
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .map_err(df_error)?;
    if joins || scans > 1 {
        return Err(Error::BadQuery(
            "S3 Select reads FROM S3Object once: no joins, subqueries or set operations".into(),
        ));
    }
    Ok(())
}

/// Gives the types S3 Select's SQL names their S3 Select meaning: `INT` and `INTEGER` are
/// 8-byte integers and `FLOAT` (`REAL`) an 8-byte float there, where DataFusion reads them as
/// 4-byte ones (so `CAST(ke AS FLOAT) > 0.990234375` would round `0.9902344` down to the
/// threshold and drop the row).
fn s3_select_types(statement: &mut Statement) {
    use pushdown::datafusion::sql::sqlparser::ast::{
        DataType as SqlType, ExactNumberInfo, Expr, visit_expressions_mut,
    };
    let _ = visit_expressions_mut(statement, |expr| {
        // CAST, TRY_CAST and `::` are casts; `REAL '0.5'` and `INT '5'` typed literals.
        let data_type = match expr {
            Expr::Cast { data_type, .. } => data_type,
            Expr::TypedString(typed) => &mut typed.data_type,
            _ => return std::ops::ControlFlow::<()>::Continue(()),
        };
        match data_type {
            SqlType::Int(_) | SqlType::Integer(_) | SqlType::Int4(_) => *data_type = SqlType::BigInt(None),
            SqlType::Float(_) | SqlType::Real | SqlType::Float4 => {
                *data_type = SqlType::Double(ExactNumberInfo::None);
            }
            _ => {}
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
}

/// The table's columns: CSV strings named by the header or by position, JSON fields as the
/// first records show them.
/// Reads the head of the object whose records it types: a CSV header is one line, JSON
/// fields are typed by the first 1,000 records; 64 KiB are read first, then 1 MiB if they do
/// not hold that. What an uncompressed head took is counted in `counters` as bytes this
/// client read.
async fn records_schema(
    client: &Client,
    info: &ObjectInfo,
    input: &SelectInput,
    compression: Compression,
    counters: &QueryCounters,
) -> Result<SchemaRef, Error> {
    let records_needed = match input {
        SelectInput::Json(_) => JSON_SCHEMA_RECORDS,
        _ => 1,
    };
    let mut head = Vec::new();
    for head_len in [HEAD_BYTES, HEAD_BYTES_MAX] {
        let read = Arc::new(AtomicU64::new(0));
        let ended;
        (head, ended) = read_head(client, info, compression, head_len, Arc::clone(&read)).await?;
        if compression == Compression::None {
            counters.client_read_bytes.fetch_add(read.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        if ended || head.iter().filter(|b| **b == b'\n').count() >= records_needed {
            break;
        }
    }
    schema_of_head(info, input, head)
}

/// The object's first `head_len` record bytes (decompressed), whole records only unless the
/// records end there, and whether they do.
async fn read_head(
    client: &Client,
    info: &ObjectInfo,
    compression: Compression,
    head_len: u64,
    read: Arc<AtomicU64>,
) -> Result<(Vec<u8>, bool), Error> {
    // Uncompressed, the head is the object's first bytes; compressed, it takes what it takes.
    let to = (compression == Compression::None).then_some(head_len);
    let reader = ObjectReader::start(client.clone(), info.clone(), 0, to, read);
    let object = name(info);
    let (mut head, ended) = tokio::task::spawn_blocking(move || {
        let mut records = decompressed(reader, compression);
        let mut head = Vec::new();
        let read = (&mut records).take(head_len).read_to_end(&mut head);
        read.map(|_| {
            let ended = (head.len() as u64) < head_len;
            (head, ended)
        })
    })
    .await
    .map_err(|e| Error::Engine(format!("{object}: {e}")))?
    .map_err(|e| Error::BadQuery(format!("{object}: {e}")))?;
    // Whole records only: up to the last line break, unless the records ended.
    if !ended && let Some(end) = head.iter().rposition(|b| *b == b'\n') {
        head.truncate(end + 1);
    }
    Ok((head, ended))
}

/// The table's columns as `head` (the object's first records) shows them.
fn schema_of_head(info: &ObjectInfo, input: &SelectInput, head: Vec<u8>) -> Result<SchemaRef, Error> {
    match input {
        SelectInput::Csv(csv) => {
            use pushdown::datafusion::arrow::csv::reader::Format;
            let mut format = Format::default()
                .with_header(csv.header == HeaderInfo::Use)
                .with_delimiter(csv.delimiter)
                .with_quote(csv.quote);
            if let Some(comment) = csv.comment {
                format = format.with_comment(comment);
            }
            if let Some(escape) = csv.escape {
                format = format.with_escape(escape);
            }
            let (schema, _) = format
                .infer_schema(std::io::Cursor::new(&head), Some(1))
                .map_err(|e| Error::BadQuery(format!("{}: not CSV as described: {e}", name(info))))?;
            let fields: Vec<Field> = schema
                .fields()
                .iter()
                .enumerate()
                .map(|(i, f)| {
                    let name = if csv.header == HeaderInfo::Use { f.name().clone() } else { format!("_{}", i + 1) };
                    Field::new(name, DataType::Utf8, true)
                })
                .collect();
            if fields.is_empty() {
                return Err(Error::BadQuery(format!("{}: no CSV columns in its first line", name(info))));
            }
            Ok(Arc::new(Schema::new(fields)))
        }
        SelectInput::Json(json) => {
            use pushdown::datafusion::arrow::json::reader::{infer_json_schema, infer_json_schema_from_iterator};
            let inferred = match json {
                JsonType::Lines => {
                    infer_json_schema(std::io::Cursor::new(&head), Some(JSON_SCHEMA_RECORDS)).map(|(s, _)| s)
                }
                // Documents may span lines: the head's whole ones (it may end inside one).
                JsonType::Document => {
                    let mut documents = serde_json::Deserializer::from_slice(&head).into_iter::<serde_json::Value>();
                    let mut values = Vec::new();
                    let mut first_error = None;
                    for value in documents.by_ref().take(JSON_SCHEMA_RECORDS) {
                        match value {
                            Ok(value) => values.push(value),
                            Err(e) => {
                                first_error = Some(e);
                                break;
                            }
                        }
                    }
                    match first_error {
                        Some(e) if values.is_empty() || !e.is_eof() => {
                            Err(pushdown::datafusion::arrow::error::ArrowError::JsonError(e.to_string()))
                        }
                        _ => infer_json_schema_from_iterator(values.into_iter().map(Ok)),
                    }
                }
            };
            let schema = inferred.map_err(|e| Error::BadQuery(format!("{}: not JSON records: {e}", name(info))))?;
            let schema = crate::plan::in_json_order(&schema, &head);
            if schema.fields().is_empty() {
                return Err(Error::BadQuery(format!("{}: no JSON records with fields", name(info))));
            }
            Ok(Arc::new(schema))
        }
        SelectInput::Parquet => unreachable!("Parquet objects are an ObjectTable"),
    }
}

/// The record format the decoders and the nodes take (`FileHeaderInfo` IGNORE and USE both
/// skip the first line).
fn record_format(input: &SelectInput) -> RecordFormat {
    match input {
        SelectInput::Csv(csv) => RecordFormat::Csv(CsvFormat {
            header: csv.header != HeaderInfo::None,
            delimiter: csv.delimiter,
            quote: csv.quote,
            escape: csv.escape,
            comment: csv.comment,
            empty_is_null: false,
        }),
        _ => RecordFormat::JsonLines,
    }
}

fn name(info: &ObjectInfo) -> String {
    format!("{}/{}", info.meta.bucket, info.meta.key)
}

/// The records of a compressed object, or of JSON documents, decompressed and decoded window
/// by window by this client.
#[derive(Debug)]
struct RecordPartition {
    client: Client,
    info: ObjectInfo,
    format: RecordFormat,
    /// JSON records as they come, a record may span lines (not one per line).
    json_documents: bool,
    compression: Compression,
    schema: SchemaRef,
    scanned: Arc<AtomicU64>,
    decoded: Arc<AtomicU64>,
}

/// The bytes of an object from an offset on, as a blocking reader: a task reads them window
/// by window through the smart client (at most two windows ahead), a blocking thread reads
/// them here. Dropping the reader stops the task.
struct ObjectReader {
    windows: tokio::sync::mpsc::Receiver<Result<Bytes, String>>,
    current: Bytes,
    /// Bytes the task has still to send: a task that stops short (it panicked, or its runtime
    /// shut down) is an error, never an early end of the records.
    left: u64,
}

impl ObjectReader {
    /// Bytes `from..to` (or to the object's end); must be called inside the runtime, and read
    /// from a blocking thread.
    fn start(client: Client, info: ObjectInfo, from: u64, to: Option<u64>, scanned: Arc<AtomicU64>) -> Self {
        let (tx, windows) = tokio::sync::mpsc::channel(2);
        let size = to.map_or(info.meta.size, |to| to.min(info.meta.size));
        let left = size.saturating_sub(from);
        tokio::spawn(async move {
            let mut at = from;
            while at < size {
                let end = (at + WINDOW_BYTES).min(size);
                let mut window = vec![0u8; (end - at) as usize];
                let read = client.read_at(&info, at, &mut window).await.map_err(|e| e.to_string());
                let failed = read.is_err();
                scanned.fetch_add(window.len() as u64, Ordering::Relaxed);
                if tx.send(read.map(|_| Bytes::from(window))).await.is_err() || failed {
                    return;
                }
                at = end;
            }
        });
        Self { windows, current: Bytes::new(), left }
    }
}

impl std::io::Read for ObjectReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.windows.blocking_recv() {
                Some(Ok(window)) => {
                    self.left = self.left.saturating_sub(window.len() as u64);
                    self.current = window;
                }
                Some(Err(e)) => return Err(std::io::Error::other(e)),
                None if self.left > 0 => {
                    return Err(std::io::Error::other(format!("the object's last {} bytes never came", self.left)));
                }
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

/// `reader`'s bytes, decompressed as `compression` says (output is read a buffer at a time,
/// so a small input that expands hugely never sits in memory whole).
fn decompressed(reader: ObjectReader, compression: Compression) -> Box<dyn std::io::Read + Send> {
    match compression {
        Compression::None => Box::new(reader),
        Compression::Gzip => Box::new(Decompressed(flate2::read::MultiGzDecoder::new(reader), "GZIP")),
        Compression::Bzip2 => Box::new(Decompressed(bzip2::read::MultiBzDecoder::new(reader), "BZIP2")),
    }
}

/// A decompressor whose errors about its input say so ([`NOT_COMPRESSED_AS_DESCRIBED`]); the
/// object reader's own failures (the store's) pass through as they are.
struct Decompressed<R>(R, &'static str);

impl<R: std::io::Read> std::io::Read for Decompressed<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf).map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidData | std::io::ErrorKind::InvalidInput | std::io::ErrorKind::UnexpectedEof => {
                std::io::Error::new(e.kind(), format!("{NOT_COMPRESSED_AS_DESCRIBED} ({}): {e}", self.1))
            }
            _ => e,
        })
    }
}

/// Bytes of decompressed records handed to the decoder at a time.
const DECODE_BYTES: usize = 1 << 20;

impl PartitionStream for RecordPartition {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<RecordBatch, DataFusionError>>(2);
        if self.info.meta.size > 0 {
            let decoder = if self.json_documents {
                Decoder::json_documents(&self.schema)
            } else {
                Decoder::new(&self.format, &self.schema, true)
            };
            let reader =
                ObjectReader::start(self.client.clone(), self.info.clone(), 0, None, Arc::clone(&self.scanned));
            let compression = self.compression;
            let object = name(&self.info);
            let decoded = Arc::clone(&self.decoded);
            tokio::task::spawn_blocking(move || {
                let records = Records { bytes: decompressed(reader, compression), decoded };
                // A panic in a decoder fails the select with an error, never ends it early as if
                // the records had ended.
                let decode = std::panic::AssertUnwindSafe(|| {
                    decoder.map_err(|e| e.to_string()).and_then(|decoder| decode_records(records, decoder, &tx))
                });
                let error = match std::panic::catch_unwind(decode) {
                    Ok(Ok(())) => return,
                    // The consumer went away: nobody to tell.
                    Ok(Err(message)) if message.is_empty() => return,
                    Ok(Err(message)) => Error::BadQuery(format!("{object}: {message}")),
                    // A bug, not the request's fault.
                    Err(_) => Error::Engine(format!("{object}: the record decoder failed")),
                };
                let _ = tx.blocking_send(Err(DataFusionError::External(Box::new(error))));
            });
        }
        let mut rx = rx;
        let stream = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
        Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&self.schema), stream))
    }
}

type BatchSender = tokio::sync::mpsc::Sender<Result<RecordBatch, DataFusionError>>;

/// The record bytes a select decodes.
struct Records {
    /// The object's bytes, decompressed.
    bytes: Box<dyn std::io::Read + Send>,
    /// Counts what is decoded.
    decoded: Arc<AtomicU64>,
}

/// Decodes `records` into batches sent to `tx`. An empty error: the consumer went away.
fn decode_records(mut records: Records, mut decoder: Decoder, tx: &BatchSender) -> Result<(), String> {
    let mut buf = vec![0u8; DECODE_BYTES];
    let mut gone = false;
    loop {
        let n = records.bytes.read(&mut buf).map_err(|e| e.to_string())?;
        records.decoded.fetch_add(n as u64, Ordering::Relaxed);
        let mut send = |batch| {
            if tx.blocking_send(Ok(batch)).is_err() {
                gone = true;
            }
            Ok(())
        };
        decoder.feed(&buf[..n], n == 0, &mut send).map_err(|e| e.to_string())?;
        if gone {
            return Err(String::new());
        }
        if n == 0 {
            return Ok(());
        }
    }
}

/// Writes one result batch into the pending bytes.
type BatchWriter = dyn FnMut(&RecordBatch) -> Result<(), Error> + Send;

/// The result batches written as CSV or JSON lines, a piece per batch.
fn encode(batches: SendableRecordBatchStream, output: SelectOutput) -> BoxStream<'static, Result<Bytes, Error>> {
    use pushdown::datafusion::arrow::csv::QuoteStyle;
    let pending = Pending::default();
    let mut writer: Box<BatchWriter> = match output {
        SelectOutput::Csv { delimiter, quote, always_quote, escape } => {
            let mut builder = pushdown::datafusion::arrow::csv::WriterBuilder::new()
                .with_header(false)
                .with_delimiter(delimiter)
                .with_quote(quote)
                .with_quote_style(if always_quote { QuoteStyle::Always } else { QuoteStyle::Necessary });
            if let Some(escape) = escape {
                builder = builder.with_double_quote(false).with_escape(escape);
            }
            let mut csv = builder.build(pending.clone());
            Box::new(move |batch| csv.write(batch).map_err(|e| Error::Engine(format!("CSV output: {e}"))))
        }
        SelectOutput::Json => {
            let mut json = pushdown::datafusion::arrow::json::LineDelimitedWriter::new(pending.clone());
            Box::new(move |batch| json.write(batch).map_err(|e| Error::Engine(format!("JSON output: {e}"))))
        }
    };
    let stream = batches.map(move |batch| {
        let batch = batch.map_err(stream_error)?;
        writer(&batch)?;
        Ok(Bytes::from(pending.take()))
    });
    Box::pin(stream.filter(|piece| futures_util::future::ready(!matches!(piece, Ok(b) if b.is_empty()))))
}

/// Bytes a writer produced and not yet passed on.
#[derive(Clone, Debug, Default)]
struct Pending(Arc<std::sync::Mutex<Vec<u8>>>);

impl Pending {
    fn take(&self) -> Vec<u8> {
        std::mem::take(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl std::io::Write for Pending {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
