//! SQL over Tessera objects, evaluated near the data.
//!
//! A table is named by a quoted path: `'bucket/key'` (one object) or `'bucket/prefix/'` (every
//! object under the prefix, one table; names starting with `_` or `.` skipped). Its objects are
//! all Parquet, or all CSV (`.csv`, `.tsv`: a header line, columns typed from a sample of the
//! first records) or all JSON lines (`.json`, `.jsonl`, `.ndjson`). The client parses and plans
//! the query with DataFusion; the scan of each table becomes one request per node
//! (`proto::Request::Query` or `RecordQuery`) carrying the projection, the filters that can be
//! written back as SQL, and the row groups (or record splits) that start in that node's chunks. Nodes answer Arrow IPC; the client runs the
//! rest of the plan (ordering, limits, joins) over what comes back. An aggregate whose
//! functions combine over parts (count, sum, min, max, avg) runs on the nodes too, each over
//! its own rows; the client combines their partial rows. Row groups no
//! node can take (a multipart object, a node down) are evaluated by the client itself, through
//! its degraded read.

mod aggregate;
pub mod layout;
mod plan;
pub mod select;
mod source;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use client::Client;
use pushdown::ScanLimits;
use pushdown::datafusion::arrow::datatypes::SchemaRef;
use pushdown::datafusion::execution::SendableRecordBatchStream;
use pushdown::datafusion::execution::context::SQLOptions;

pub use pushdown::datafusion;
pub use pushdown::datafusion::arrow;

/// Why a query failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The query or the data is wrong (SQL, columns, types, a table that is not Parquet).
    #[error("{0}")]
    BadQuery(String),
    /// The store could not serve the data.
    #[error(transparent)]
    Client(#[from] client::Error),
    /// The engine failed (memory limit, internal error).
    #[error("{0}")]
    Engine(String),
}

impl From<pushdown::Error> for Error {
    fn from(error: pushdown::Error) -> Self {
        match error {
            pushdown::Error::BadQuery(text) => Error::BadQuery(text),
            pushdown::Error::Unavailable(text) | pushdown::Error::Engine(text) => Error::Engine(text),
        }
    }
}

fn df_error(error: datafusion::error::DataFusionError) -> Error {
    Error::from(pushdown::Error::from_datafusion(error))
}

/// The error a query's result stream failed with: a node's or the store's error as it was
/// raised (it travels through DataFusion boxed), anything else sorted by its kind.
pub fn stream_error(error: datafusion::error::DataFusionError) -> Error {
    match error {
        datafusion::error::DataFusionError::External(boxed) => match boxed.downcast::<Error>() {
            Ok(error) => *error,
            Err(other) => Error::Engine(other.to_string()),
        },
        other => df_error(other),
    }
}

/// How a query runs.
#[derive(Clone, Debug)]
pub struct QueryOptions {
    /// The client's own engine: memory for merging, aggregating and sorting, partitions.
    pub limits: ScanLimits,
    /// Send scans to the nodes (the default). Off, the client reads the row groups itself and
    /// evaluates everything: the same answer, all the bytes over the network (a baseline).
    pub pushdown: bool,
}

impl Default for QueryOptions {
    fn default() -> Self {
        Self { limits: ScanLimits::default(), pushdown: true }
    }
}

/// What a query moved, counted as it runs.
#[derive(Debug, Default)]
pub struct QueryCounters {
    /// Node requests sent.
    pub node_requests: AtomicU64,
    /// Arrow IPC bytes the nodes sent back.
    pub result_bytes: AtomicU64,
    /// Bytes nodes read from their drives and peers to answer.
    pub node_read_bytes: AtomicU64,
    /// Of those, the bytes nodes read from their peers (row groups that cross chunks of
    /// other drives, ranges rebuilt from a stripe).
    pub node_peer_bytes: AtomicU64,
    /// Row groups (or record splits) the client evaluated itself, and the object bytes it read
    /// for them (and for a record object's head).
    pub client_row_groups: AtomicU64,
    pub client_read_bytes: AtomicU64,
    /// Heartbeats nodes sent while they scanned with nothing to send.
    pub heartbeats: AtomicU64,
}

impl QueryCounters {
    /// Bytes that reached the client: node results plus what it read itself.
    pub fn bytes_to_client(&self) -> u64 {
        self.result_bytes.load(Ordering::Relaxed) + self.client_read_bytes.load(Ordering::Relaxed)
    }
}

/// A running query: its result schema and batches.
pub struct Query {
    pub schema: SchemaRef,
    pub stream: SendableRecordBatchStream,
    pub counters: Arc<QueryCounters>,
}

impl std::fmt::Debug for Query {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Query").field("schema", &self.schema).finish_non_exhaustive()
    }
}

/// The engine a query plans and runs in: `pushdown`'s session, whose optimizer also sends
/// aggregates that combine over parts to the nodes (`aggregate::PushAggregates`).
fn session(options: &QueryOptions) -> Result<datafusion::prelude::SessionContext, Error> {
    let ctx = pushdown::session(&options.limits)?;
    ctx.add_optimizer_rule(Arc::new(aggregate::PushAggregates));
    Ok(ctx)
}

/// Plans `sql` and starts it. The result streams; dropping the stream cancels the query on
/// every node.
pub async fn start(client: &Client, sql: &str, options: &QueryOptions) -> Result<Query, Error> {
    let ctx = session(options)?;
    let counters = Arc::new(QueryCounters::default());
    let state = ctx.state();
    let statement = state.sql_to_statement(sql, &datafusion::config::Dialect::Generic).map_err(df_error)?;
    let is_query = matches!(&statement, datafusion::sql::parser::Statement::Statement(s)
        if matches!(s.as_ref(), datafusion::sql::sqlparser::ast::Statement::Query(_)));
    if !is_query {
        return Err(Error::BadQuery("only SELECT queries are supported".into()));
    }
    for reference in state.resolve_table_references(&statement).map_err(df_error)? {
        if reference.schema().is_some() {
            return Err(Error::BadQuery(format!(
                "table {reference}: name a table as a quoted path, 'bucket/key' or 'bucket/prefix/'"
            )));
        }
        let table = plan::ObjectTable::open(client, reference.table(), options, Arc::clone(&counters)).await?;
        ctx.register_table(reference, Arc::new(table)).map_err(df_error)?;
    }
    let plan = ctx.state().statement_to_plan(statement).await.map_err(df_error)?;
    // Queries only: no DDL (CREATE EXTERNAL TABLE could read local files), no DML, no SET.
    SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false)
        .verify_plan(&plan)
        .map_err(|e| Error::BadQuery(format!("only SELECT queries are supported ({e})")))?;
    pushdown::growth::check_plan(&plan)?;
    let frame = ctx.execute_logical_plan(plan).await.map_err(df_error)?;
    let schema: SchemaRef = Arc::new(frame.schema().as_arrow().clone());
    let stream = frame.execute_stream().await.map_err(df_error)?;
    Ok(Query { schema, stream, counters })
}

/// Runs `sql` to the end: every result batch.
pub async fn collect(
    client: &Client,
    sql: &str,
    options: &QueryOptions,
) -> Result<(SchemaRef, Vec<arrow::array::RecordBatch>, Arc<QueryCounters>), Error> {
    use futures_util::StreamExt;
    let mut query = start(client, sql, options).await?;
    let mut batches = Vec::new();
    while let Some(batch) = query.stream.next().await {
        batches.push(batch.map_err(stream_error)?);
    }
    Ok((query.schema, batches, query.counters))
}
