//! Tessera's near-data query engine: evaluates a scan (projection, filter, limit, or a partial
//! aggregate: counts, sums, minimums and maximums per group) with Apache DataFusion over chosen
//! row groups of Parquet objects, or over the records of CSV and JSON-lines objects that start
//! in chosen byte splits ([`records`]), reading the bytes through a [`ByteSource`]. A storage
//! node runs it over the row groups and splits that start in its chunks (its source reads its
//! own drives and its peers); a client runs it over what no node could take (its source is the
//! smart client's degraded read).
//!
//! This crate holds no I/O of its own and knows nothing of nodes or chunks: only Parquet
//! footers, row groups, record splits, schemas and the Arrow IPC framing of results.

mod footer;
pub mod growth;
pub mod records;
mod table;

use std::fmt::Debug;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::common::DFSchema;
use datafusion::error::DataFusionError;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use futures_util::future::BoxFuture;

pub use datafusion;
pub use footer::{FOOTER_BYTES_MAX, Footer, table_schema};
pub use proto::{AggregateFunction, AggregateSpec, PartialAggregate, ScanSpec};
pub use records::{RecordFormat, RecordSplit, SplitObject};

/// Why a scan could not run or stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The query or the data is wrong: bad SQL, an unknown column, a type error, an object that
    /// is not Parquet or whose footer is damaged. Retrying will not help.
    #[error("{0}")]
    BadQuery(String),
    /// Bytes of an object could not be read (too few chunks).
    #[error("{0}")]
    Unavailable(String),
    /// The engine failed otherwise (out of its memory budget, an internal error).
    #[error("{0}")]
    Engine(String),
}

impl Error {
    /// Sorts a DataFusion error: planning and schema errors are the query's fault; a source's
    /// read failure is unavailability; the rest is the engine's.
    pub fn from_datafusion(error: DataFusionError) -> Self {
        let text = error.to_string();
        match error.find_root() {
            DataFusionError::Plan(_) | DataFusionError::SQL(..) | DataFusionError::SchemaError(..) => {
                Error::BadQuery(text)
            }
            DataFusionError::ParquetError(_) | DataFusionError::ArrowError(..) if text.contains(UNAVAILABLE_MARK) => {
                Error::Unavailable(text)
            }
            DataFusionError::ParquetError(_) => Error::BadQuery(text),
            // The data does not fit the query: a value that does not cast, a division by zero.
            DataFusionError::ArrowError(e, _)
                if matches!(
                    e.as_ref(),
                    ArrowError::CastError(_)
                        | ArrowError::ParseError(_)
                        | ArrowError::DivideByZero
                        | ArrowError::CsvError(_)
                        | ArrowError::JsonError(_)
                ) =>
            {
                Error::BadQuery(text)
            }
            DataFusionError::ResourcesExhausted(_) => Error::Engine(format!("query memory limit: {text}")),
            _ if text.contains(UNAVAILABLE_MARK) => Error::Unavailable(text),
            _ => Error::Engine(text),
        }
    }
}

/// Marks a [`ByteSource`] failure inside DataFusion's error text (which wraps it as a Parquet
/// error), so that [`Error::from_datafusion`] can tell it apart from bad data.
const UNAVAILABLE_MARK: &str = "[bytes unavailable]";

/// Where a scan reads its objects' bytes.
pub trait ByteSource: Debug + Send + Sync + 'static {
    /// Bytes `range` of object `object` (an index into the scan's objects). An error says why
    /// they could not be read (too few chunks, a peer down).
    fn read(&self, object: usize, range: Range<u64>) -> BoxFuture<'static, Result<Bytes, String>>;
}

/// One object of a scan: its footer and the row groups to evaluate.
#[derive(Clone, Debug)]
pub struct ScanObject {
    /// `bucket/key`, for errors.
    pub name: String,
    pub size: u64,
    pub footer: Arc<Footer>,
    pub row_groups: Vec<usize>,
}

/// How much one scan may use.
#[derive(Clone, Copy, Debug)]
pub struct ScanLimits {
    /// Bytes the engine may hold for the scan's operators (DataFusion's memory pool); a scan
    /// that needs more fails with [`Error::Engine`].
    pub memory_bytes: usize,
    /// Row groups are read by this many partitions at once.
    pub partitions: usize,
    /// Rows per record batch.
    pub batch_rows: usize,
    /// Whether operators past `memory_bytes` spill to temporary files or fail.
    pub spill: Spill,
}

impl Default for ScanLimits {
    fn default() -> Self {
        Self { memory_bytes: 256 << 20, partitions: 2, batch_rows: 8192, spill: Spill::ToTempFiles }
    }
}

/// A session configured for scans and queries over Parquet row groups: filters pushed into
/// the Parquet decoder, row-group statistics used for pruning, memory bounded by `limits`.
pub fn session(limits: &ScanLimits) -> Result<SessionContext, Error> {
    session_with(limits, Identifiers::Normalized)
}

/// How a session reads SQL identifiers: lowercased (as SQL has it for people's queries) or as
/// written (filters a client's plan wrote: column names exact, `userId` included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Identifiers {
    Normalized,
    AsWritten,
}

/// Whether operators past the memory limit may spill to temporary files (a client's sorts,
/// joins and large aggregates) or fail (a scan on a storage node, whose disks are the store's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spill {
    ToTempFiles,
    Never,
}

/// [`session`], with identifiers read as given.
fn session_with(limits: &ScanLimits, identifiers: Identifiers) -> Result<SessionContext, Error> {
    let mut config = SessionConfig::new()
        .with_target_partitions(limits.partitions.max(1))
        .with_batch_size(limits.batch_rows.max(1))
        .with_information_schema(false);
    let options = config.options_mut();
    options.sql_parser.enable_ident_normalization = identifiers == Identifiers::Normalized;
    options.execution.parquet.pushdown_filters = true;
    options.execution.parquet.reorder_filters = true;
    // Page indexes and bloom filters are read from the object's bytes by the Parquet crate,
    // which reserves what their headers declare before reading them (the footer is checked
    // first, see `Footer::parse`; these are not yet): off until that is bounded.
    options.execution.parquet.enable_page_index = false;
    options.execution.parquet.bloom_filter_on_read = false;
    let mut runtime = RuntimeEnvBuilder::new().with_memory_limit(limits.memory_bytes, 1.0);
    if limits.spill == Spill::Never {
        let disabled = DiskManagerBuilder::default().with_mode(DiskManagerMode::Disabled);
        runtime = runtime.with_disk_manager_builder(disabled);
    }
    let runtime = runtime.build_arc().map_err(Error::from_datafusion)?;
    Ok(SessionContext::new_with_config_rt(config, runtime))
}

/// Evaluates `spec` over the row groups of `objects` (whose footers must all describe
/// `schema`) and returns the matching rows, a stream of `spec.columns` (or of no columns with
/// `count_only`: batches whose row counts are the matches); with `aggregate`, one row per
/// group of the matching rows ([`partial_schema`]'s columns). Past its memory, a scan spills
/// or fails as `limits.spill` says.
pub async fn scan(
    objects: Vec<ScanObject>,
    schema: SchemaRef,
    source: Arc<dyn ByteSource>,
    spec: &ScanSpec,
    aggregate: Option<&AggregateSpec>,
    limits: &ScanLimits,
) -> Result<SendableRecordBatchStream, Error> {
    // The filters come from a plan's SQL writer, with column names as the table has them.
    let ctx = session_with(limits, Identifiers::AsWritten)?;
    let table = table::RowGroupTable::new(Arc::clone(&schema), objects, source, limits.partitions);
    evaluate(ctx, Arc::new(table), schema, spec, aggregate).await
}

/// Evaluates `spec` (with `aggregate`, a partial aggregate) over the records of `objects` that
/// start in their splits, decoded as `format` says into a table of `schema` (for CSV, strings
/// only): the same answer as [`scan`] gives over row groups.
pub async fn scan_records(
    objects: Vec<SplitObject>,
    schema: SchemaRef,
    format: &RecordFormat,
    source: Arc<dyn ByteSource>,
    spec: &ScanSpec,
    aggregate: Option<&AggregateSpec>,
    limits: &ScanLimits,
) -> Result<SendableRecordBatchStream, Error> {
    records::check_schema(format, &schema)?;
    let ctx = session_with(limits, Identifiers::AsWritten)?;
    let table = records::table(Arc::clone(&schema), format.clone(), objects, source, limits.partitions)?;
    evaluate(ctx, Arc::new(table), schema, spec, aggregate).await
}

/// `spec` (and `aggregate`) over `table`, registered in `ctx` as `t`.
async fn evaluate(
    ctx: SessionContext,
    table: Arc<dyn datafusion::catalog::TableProvider>,
    schema: SchemaRef,
    spec: &ScanSpec,
    aggregate: Option<&AggregateSpec>,
) -> Result<SendableRecordBatchStream, Error> {
    if spec.count_only && !spec.columns.is_empty() {
        return Err(Error::BadQuery("a count-only scan returns no columns".into()));
    }
    ctx.register_table("t", table).map_err(Error::from_datafusion)?;
    let df_schema = DFSchema::try_from(schema.as_ref().clone()).map_err(Error::from_datafusion)?;
    let mut frame = ctx.table("t").await.map_err(Error::from_datafusion)?;
    for filter in &spec.filters {
        let expr = ctx.parse_sql_expr(filter, &df_schema).map_err(|e| bad_filter(filter, e))?;
        frame = frame.filter(expr).map_err(|e| bad_filter(filter, e))?;
    }
    if let Some(aggregate) = aggregate {
        if !spec.columns.is_empty() || spec.count_only || spec.limit.is_some() {
            return Err(Error::BadQuery("an aggregating scan names no columns, count or limit of its own".into()));
        }
        frame = aggregate_frame(&ctx, frame, &df_schema, aggregate)?;
        growth::check_plan(frame.logical_plan())?;
        return frame.execute_stream().await.map_err(Error::from_datafusion);
    }
    let columns: Vec<&str> = spec.columns.iter().map(String::as_str).collect();
    frame = frame.select_columns(&columns).map_err(Error::from_datafusion)?;
    if let Some(limit) = spec.limit {
        frame = frame.limit(0, Some(usize::try_from(limit).unwrap_or(usize::MAX))).map_err(Error::from_datafusion)?;
    }
    growth::check_plan(frame.logical_plan())?;
    frame.execute_stream().await.map_err(Error::from_datafusion)
}

/// The columns a scan with `aggregate` answers over a table of `schema`: the group columns
/// (`g0`, `g1`, ...), then the aggregates (`p0`, `p1`, ...), every one nullable. A client
/// plans with these; a node's answer has exactly these types, as it is built the same way.
pub fn partial_schema(schema: &SchemaRef, aggregate: &AggregateSpec) -> Result<SchemaRef, Error> {
    let never = ScanLimits { spill: Spill::Never, ..ScanLimits::default() };
    let ctx = session_with(&never, Identifiers::AsWritten)?;
    let df_schema = DFSchema::try_from(schema.as_ref().clone()).map_err(Error::from_datafusion)?;
    let empty = datafusion::datasource::empty::EmptyTable::new(Arc::clone(schema));
    let frame = ctx.read_table(Arc::new(empty)).map_err(Error::from_datafusion)?;
    let frame = aggregate_frame(&ctx, frame, &df_schema, aggregate)?;
    let fields: Vec<_> = frame.schema().fields().iter().map(|f| f.as_ref().clone().with_nullable(true)).collect();
    Ok(Arc::new(datafusion::arrow::datatypes::Schema::new(fields)))
}

/// `frame` grouped by `aggregate.group_by` (columns `g0`, `g1`, ...) with its aggregates
/// (`p0`, `p1`, ...); every expression is parsed against the table's columns, never spliced.
fn aggregate_frame(
    ctx: &SessionContext,
    frame: datafusion::dataframe::DataFrame,
    df_schema: &DFSchema,
    aggregate: &AggregateSpec,
) -> Result<datafusion::dataframe::DataFrame, Error> {
    use datafusion::functions_aggregate::expr_fn::{count, max, min, sum};
    use datafusion::logical_expr::lit;

    if aggregate.group_by.len() > proto::AGGREGATE_ITEMS_MAX || aggregate.aggregates.len() > proto::AGGREGATE_ITEMS_MAX
    {
        return Err(Error::BadQuery(format!("more than {} group columns or aggregates", proto::AGGREGATE_ITEMS_MAX)));
    }
    let parse = |sql: &str| ctx.parse_sql_expr(sql, df_schema).map_err(|e| bad_expression(sql, e));
    let mut groups = Vec::with_capacity(aggregate.group_by.len());
    for (idx, sql) in aggregate.group_by.iter().enumerate() {
        groups.push(parse(sql)?.alias(format!("g{idx}")));
    }
    let mut aggregates = Vec::with_capacity(aggregate.aggregates.len());
    for (idx, partial) in aggregate.aggregates.iter().enumerate() {
        let argument = match &partial.argument {
            Some(sql) => parse(sql)?,
            None => lit(1i64),
        };
        let expr = match partial.function {
            AggregateFunction::Count => count(argument),
            AggregateFunction::Sum => sum(argument),
            AggregateFunction::Min => min(argument),
            AggregateFunction::Max => max(argument),
        };
        aggregates.push(expr.alias(format!("p{idx}")));
    }
    frame.aggregate(groups, aggregates).map_err(|e| match Error::from_datafusion(e) {
        Error::BadQuery(text) | Error::Engine(text) => Error::BadQuery(format!("aggregate: {text}")),
        other => other,
    })
}

fn bad_expression(sql: &str, error: DataFusionError) -> Error {
    match Error::from_datafusion(error) {
        Error::BadQuery(text) | Error::Engine(text) => Error::BadQuery(format!("expression {sql:?}: {text}")),
        other => other,
    }
}

fn bad_filter(filter: &str, error: DataFusionError) -> Error {
    match Error::from_datafusion(error) {
        Error::BadQuery(text) | Error::Engine(text) => Error::BadQuery(format!("filter {filter:?}: {text}")),
        other => other,
    }
}

/// Writes record batches as one Arrow IPC stream (schema first), handing out the bytes batch
/// by batch so they can go out in frames.
pub struct IpcEncoder {
    writer: StreamWriter<Vec<u8>>,
}

impl Debug for IpcEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IpcEncoder")
    }
}

impl IpcEncoder {
    /// The stream's schema message is the first bytes [`IpcEncoder::take`] returns.
    pub fn new(schema: &SchemaRef) -> Result<Self, Error> {
        let writer = StreamWriter::try_new(Vec::new(), schema).map_err(|e| Error::Engine(format!("Arrow IPC: {e}")))?;
        Ok(Self { writer })
    }

    pub fn write(&mut self, batch: &RecordBatch) -> Result<(), Error> {
        self.writer.write(batch).map_err(|e| Error::Engine(format!("Arrow IPC: {e}")))
    }

    /// Bytes written since the last call.
    pub fn take(&mut self) -> Vec<u8> {
        std::mem::take(self.writer.get_mut())
    }

    /// Ends the stream; its last bytes.
    pub fn finish(mut self) -> Result<Vec<u8>, Error> {
        self.writer.finish().map_err(|e| Error::Engine(format!("Arrow IPC: {e}")))?;
        Ok(self.take())
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod records_tests;
