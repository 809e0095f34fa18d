//! S3 Select (`SelectObjectContent`) over one object: the query names `S3Object`, the input is
//! CSV, JSON or Parquet, the output CSV or JSON lines. A Parquet object is the same table as
//! `'bucket/key'` in [`crate::start`] (scans on the nodes); CSV and JSON objects are streamed
//! through this client's Arrow decoders (records are not aligned to chunks yet, so nodes cannot
//! split them), window by window, never whole.
//!
//! CSV columns are strings, as S3 Select has them (`CAST` for numbers; an empty field is an
//! empty string): named by the header line with `FileHeaderInfo USE`, `_1`, `_2`, ...
//! otherwise. JSON input is records one per line (`LINES`, or a `DOCUMENT` written that way);
//! fields take the types the first 1,000 records (at most 1 MiB) show, and a field none of
//! them has is not in the table.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use client::{Client, ObjectInfo};
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use pushdown::datafusion::arrow::array::RecordBatch;
use pushdown::datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use pushdown::datafusion::catalog::streaming::StreamingTable;
use pushdown::datafusion::error::DataFusionError;
use pushdown::datafusion::execution::{SendableRecordBatchStream, TaskContext};
use pushdown::datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use pushdown::datafusion::physical_plan::streaming::PartitionStream;
use pushdown::datafusion::sql::parser::Statement as DfStatement;
use pushdown::datafusion::sql::sqlparser::ast::{SetExpr, Statement, TableFactor};

use crate::{Error, QueryCounters, QueryOptions, df_error, plan::ObjectTable, stream_error};

/// The name queries give the object.
const TABLE: &str = "s3object";
/// Bytes of a CSV or JSON object read per step.
const WINDOW_BYTES: u64 = 4 << 20;
/// Bytes of a JSON object looked at to learn its fields.
const JSON_SCHEMA_BYTES: u64 = 1 << 20;
/// Records of a JSON object looked at to learn its fields.
const JSON_SCHEMA_RECORDS: usize = 1000;

/// How the object's records are written.
#[derive(Clone, Debug)]
pub enum SelectInput {
    Csv(CsvInput),
    /// JSON records one per line (`LINES`; a `DOCUMENT` laid out so works too).
    Json,
    Parquet,
}

/// CSV input settings (`InputSerialization.CSV`).
#[derive(Clone, Debug)]
pub struct CsvInput {
    pub header: HeaderInfo,
    pub delimiter: u8,
    pub quote: u8,
    /// Lines starting with this byte are skipped.
    pub comment: Option<u8>,
}

impl Default for CsvInput {
    fn default() -> Self {
        Self { header: HeaderInfo::None, delimiter: b',', quote: b'"', comment: None }
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

/// How result records are written.
#[derive(Clone, Debug)]
pub enum SelectOutput {
    Csv {
        delimiter: u8,
        quote: u8,
        always_quote: bool,
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
}

impl ScannedBytes {
    /// What the nodes read for a Parquet object, what this client read otherwise.
    pub fn total(&self) -> u64 {
        self.counters.node_read_bytes.load(Ordering::Relaxed)
            + self.counters.client_read_bytes.load(Ordering::Relaxed)
            + self.records.load(Ordering::Relaxed)
    }
}

/// Starts `sql` over `bucket/key`.
pub async fn select(
    client: &Client,
    bucket: &str,
    key: &str,
    sql: &str,
    input: &SelectInput,
    output: &SelectOutput,
    options: &QueryOptions,
) -> Result<Selection, Error> {
    let ctx = pushdown::session(&options.limits)?;
    let state = ctx.state();
    let statement = state.sql_to_statement(sql, &pushdown::datafusion::config::Dialect::Generic).map_err(df_error)?;
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
    match input {
        SelectInput::Parquet => {
            let table = ObjectTable::open_object(client, bucket, key, options, Arc::clone(&counters)).await?;
            ctx.register_table(TABLE, Arc::new(table)).map_err(df_error)?;
        }
        SelectInput::Csv(_) | SelectInput::Json => {
            let info = client.head(bucket, key).await?;
            let schema = records_schema(client, &info, input).await?;
            let partition = RecordPartition {
                client: client.clone(),
                info,
                input: input.clone(),
                schema,
                scanned: Arc::clone(&scanned),
            };
            let table =
                StreamingTable::try_new(Arc::clone(&partition.schema), vec![Arc::new(partition)]).map_err(df_error)?;
            ctx.register_table(TABLE, Arc::new(table)).map_err(df_error)?;
        }
    }
    let plan = ctx.state().statement_to_plan(statement).await.map_err(df_error)?;
    let frame = ctx.execute_logical_plan(plan).await.map_err(df_error)?;
    let batches = frame.execute_stream().await.map_err(df_error)?;
    let records = encode(batches, output.clone());
    Ok(Selection { records, scanned: ScannedBytes { counters, records: scanned } })
}

/// The table's columns: CSV strings named by the header or by position, JSON fields as the
/// first records show them.
async fn records_schema(client: &Client, info: &ObjectInfo, input: &SelectInput) -> Result<SchemaRef, Error> {
    let size = info.meta.size;
    let head_len = size.min(match input {
        SelectInput::Json => JSON_SCHEMA_BYTES,
        _ => WINDOW_BYTES,
    });
    let mut head = vec![0u8; head_len as usize];
    client.read_at(info, 0, &mut head).await?;
    // Whole records only: up to the last line break, unless the object ended.
    if head_len < size
        && let Some(end) = head.iter().rposition(|b| *b == b'\n')
    {
        head.truncate(end + 1);
    }
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
        SelectInput::Json => {
            let (schema, _) = pushdown::datafusion::arrow::json::reader::infer_json_schema(
                std::io::Cursor::new(&head),
                Some(JSON_SCHEMA_RECORDS),
            )
            .map_err(|e| Error::BadQuery(format!("{}: not JSON records: {e}", name(info))))?;
            if schema.fields().is_empty() {
                return Err(Error::BadQuery(format!("{}: no JSON records with fields", name(info))));
            }
            Ok(Arc::new(schema))
        }
        SelectInput::Parquet => unreachable!("Parquet objects are an ObjectTable"),
    }
}

fn name(info: &ObjectInfo) -> String {
    format!("{}/{}", info.meta.bucket, info.meta.key)
}

/// The object's records, decoded window by window.
#[derive(Debug)]
struct RecordPartition {
    client: Client,
    info: ObjectInfo,
    input: SelectInput,
    schema: SchemaRef,
    scanned: Arc<AtomicU64>,
}

/// Rows decoded per batch.
const BATCH_ROWS: usize = 8192;

enum Decoder {
    Csv(Box<pushdown::datafusion::arrow::csv::reader::Decoder>),
    Json(pushdown::datafusion::arrow::json::reader::Decoder),
}

impl Decoder {
    fn decode(&mut self, buf: &[u8]) -> Result<usize, pushdown::datafusion::arrow::error::ArrowError> {
        match self {
            Decoder::Csv(d) => d.decode(buf),
            Decoder::Json(d) => d.decode(buf),
        }
    }

    fn flush(&mut self) -> Result<Option<RecordBatch>, pushdown::datafusion::arrow::error::ArrowError> {
        match self {
            Decoder::Csv(d) => d.flush(),
            Decoder::Json(d) => d.flush(),
        }
    }
}

impl PartitionStream for RecordPartition {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let decoder = match &self.input {
            SelectInput::Csv(csv) => {
                let mut builder = pushdown::datafusion::arrow::csv::ReaderBuilder::new(Arc::clone(&self.schema))
                    .with_header(csv.header != HeaderInfo::None)
                    .with_delimiter(csv.delimiter)
                    .with_quote(csv.quote)
                    .with_batch_size(BATCH_ROWS);
                if let Some(comment) = csv.comment {
                    builder = builder.with_comment(comment);
                }
                Ok(Decoder::Csv(Box::new(builder.build_decoder())))
            }
            _ => pushdown::datafusion::arrow::json::ReaderBuilder::new(Arc::clone(&self.schema))
                .with_batch_size(BATCH_ROWS)
                .build_decoder()
                .map(Decoder::Json),
        };
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<RecordBatch, DataFusionError>>(2);
        let (client, info, scanned) = (self.client.clone(), self.info.clone(), Arc::clone(&self.scanned));
        let csv = matches!(self.input, SelectInput::Csv(_));
        let object = name(&info);
        tokio::spawn(async move {
            let result = async {
                let mut decoder = decoder.map_err(|e| format!("{object}: {e}"))?;
                let size = info.meta.size;
                let mut at = 0u64;
                let mut window = Vec::new();
                loop {
                    let end = (at + WINDOW_BYTES).min(size);
                    window.resize((end - at) as usize, 0);
                    if !window.is_empty() {
                        client.read_at(&info, at, &mut window).await.map_err(|e| e.to_string())?;
                        scanned.fetch_add(window.len() as u64, Ordering::Relaxed);
                    }
                    at = end;
                    let mut rest: &[u8] = &window;
                    loop {
                        let used = decoder.decode(rest).map_err(|e| format!("{object}: {e}"))?;
                        rest = &rest[used..];
                        // A full batch (or the end of the object): pass it on.
                        if (!rest.is_empty() || window.is_empty())
                            && let Some(batch) = decoder.flush().map_err(|e| format!("{object}: {e}"))?
                        {
                            let batch =
                                if csv { empty_not_null(batch).map_err(|e| format!("{object}: {e}"))? } else { batch };
                            tx.send(Ok(batch)).await.map_err(|_| String::new())?;
                        }
                        if rest.is_empty() {
                            break;
                        }
                    }
                    if window.is_empty() {
                        return Ok::<(), String>(());
                    }
                    if at == size {
                        window.clear();
                    }
                }
            }
            .await;
            if let Err(message) = result
                && !message.is_empty()
            {
                let _ = tx.send(Err(DataFusionError::External(Box::new(Error::BadQuery(message))))).await;
            }
        });
        let mut rx = rx;
        let stream = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
        Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&self.schema), stream))
    }
}

/// Writes one result batch into the pending bytes.
type BatchWriter = dyn FnMut(&RecordBatch) -> Result<(), Error> + Send;

/// A CSV batch whose empty fields are empty strings, as S3 Select has them (the Arrow decoder
/// reads them as nulls).
fn empty_not_null(batch: RecordBatch) -> Result<RecordBatch, pushdown::datafusion::arrow::error::ArrowError> {
    use pushdown::datafusion::arrow::array::{Array, ArrayRef, StringArray};
    let columns: Vec<ArrayRef> = batch
        .columns()
        .iter()
        .map(|column| match column.as_any().downcast_ref::<StringArray>() {
            Some(strings) if strings.null_count() > 0 => {
                Arc::new(StringArray::from_iter_values(strings.iter().map(|v| v.unwrap_or("")))) as ArrayRef
            }
            _ => Arc::clone(column),
        })
        .collect();
    RecordBatch::try_new(batch.schema(), columns)
}

/// The result batches written as CSV or JSON lines, a piece per batch.
fn encode(batches: SendableRecordBatchStream, output: SelectOutput) -> BoxStream<'static, Result<Bytes, Error>> {
    use pushdown::datafusion::arrow::csv::QuoteStyle;
    let pending = Pending::default();
    let mut writer: Box<BatchWriter> = match output {
        SelectOutput::Csv { delimiter, quote, always_quote } => {
            let mut csv = pushdown::datafusion::arrow::csv::WriterBuilder::new()
                .with_header(false)
                .with_delimiter(delimiter)
                .with_quote(quote)
                .with_quote_style(if always_quote { QuoteStyle::Always } else { QuoteStyle::Necessary })
                .build(pending.clone());
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
