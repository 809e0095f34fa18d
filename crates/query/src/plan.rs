//! A table of Parquet objects whose scan runs on the nodes: row groups assigned to the node
//! holding their first byte, one request per node, Arrow IPC back.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use async_trait::async_trait;
use bytes::Bytes;
use client::{AggregateSpec, Client, ErrorKind, ObjectInfo, QueryObject, ScanSpec};
use futures_util::StreamExt;
use pushdown::datafusion::arrow::array::{RecordBatch, RecordBatchOptions};
use pushdown::datafusion::arrow::buffer::Buffer;
use pushdown::datafusion::arrow::datatypes::{Schema, SchemaRef};
use pushdown::datafusion::arrow::ipc::reader::StreamDecoder;
use pushdown::datafusion::catalog::Session;
use pushdown::datafusion::common::Result as DfResult;
use pushdown::datafusion::datasource::TableProvider;
use pushdown::datafusion::error::DataFusionError;
use pushdown::datafusion::execution::{SendableRecordBatchStream, TaskContext};
use pushdown::datafusion::logical_expr::{Expr, TableProviderFilterPushDown, TableType};
use pushdown::datafusion::physical_plan::ExecutionPlan;
use pushdown::datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use pushdown::datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use pushdown::datafusion::sql::unparser::expr_to_sql;
use pushdown::{Footer, ScanLimits, ScanObject};

use crate::source::ClientSource;
use crate::{Error, QueryCounters, QueryOptions};

/// Objects one table may have at most.
pub(crate) const TABLE_OBJECTS_MAX: usize = 10_000;
/// Bytes read from an object's end in one go for its footer (most footers fit).
pub(crate) const FOOTER_GUESS_BYTES: u64 = 64 << 10;
/// Result batches buffered per node between the network and the engine.
const NODE_BATCHES_BUFFERED: usize = 4;

/// One object of a table: where it is and its footer.
#[derive(Debug)]
struct TableObject {
    name: String,
    info: ObjectInfo,
    footer: Arc<Footer>,
}

/// The Parquet objects named by one table reference.
#[derive(Clone, Debug)]
pub(crate) struct ObjectTable {
    schema: SchemaRef,
    objects: Arc<Vec<TableObject>>,
    client: Client,
    pushdown: bool,
    limits: ScanLimits,
    counters: Arc<QueryCounters>,
}

impl ObjectTable {
    /// The objects `name` names (`bucket/key`, or `bucket/prefix/` for all under the prefix),
    /// their footers read and their schemas checked to agree.
    pub(crate) async fn open(
        client: &Client,
        name: &str,
        options: &QueryOptions,
        counters: Arc<QueryCounters>,
    ) -> Result<Self, Error> {
        let (bucket, key) = name
            .split_once('/')
            .filter(|(b, _)| !b.is_empty())
            .ok_or_else(|| Error::BadQuery(format!("table {name:?}: name it 'bucket/key' or 'bucket/prefix/'")))?;
        let keys = if key.is_empty() || key.ends_with('/') {
            list_all(client, bucket, key).await?
        } else {
            vec![key.to_owned()]
        };
        if keys.is_empty() {
            return Err(Error::BadQuery(format!("table {name:?}: no objects under that prefix")));
        }
        Self::open_keys(client, bucket, keys, options, counters).await
    }

    /// The one object `bucket/key`, whatever its key looks like (S3 Select: a key may end in
    /// `/` and still name one object).
    pub(crate) async fn open_object(
        client: &Client,
        bucket: &str,
        key: &str,
        options: &QueryOptions,
        counters: Arc<QueryCounters>,
    ) -> Result<Self, Error> {
        Self::open_keys(client, bucket, vec![key.to_owned()], options, counters).await
    }

    async fn open_keys(
        client: &Client,
        bucket: &str,
        keys: Vec<String>,
        options: &QueryOptions,
        counters: Arc<QueryCounters>,
    ) -> Result<Self, Error> {
        let mut objects = Vec::with_capacity(keys.len());
        for key in keys {
            let info = client.head(bucket, &key).await?;
            let name = format!("{bucket}/{key}");
            let footer = read_footer(client, &name, &info).await?;
            objects.push(TableObject { name, info, footer: Arc::new(footer) });
        }
        let named: Vec<(&str, &Footer)> = objects.iter().map(|o| (o.name.as_str(), o.footer.as_ref())).collect();
        let schema = pushdown::table_schema(&named)?;
        Ok(Self {
            schema,
            objects: Arc::new(objects),
            client: client.clone(),
            pushdown: options.pushdown,
            limits: options.limits,
            counters,
        })
    }

    /// Row groups by node (`None`: the client's own), each as object index -> row groups.
    fn assign(&self) -> BTreeMap<Option<String>, BTreeMap<usize, Vec<u32>>> {
        let mut by_node: BTreeMap<Option<String>, BTreeMap<usize, Vec<u32>>> = BTreeMap::new();
        for (idx, object) in self.objects.iter().enumerate() {
            for group in 0..object.footer.row_groups() {
                let node = if self.pushdown { self.node_for(object, group) } else { None };
                by_node.entry(node).or_default().entry(idx).or_default().push(group as u32);
            }
        }
        by_node
    }

    /// The node that evaluates row group `group` of `object`: the one holding the group's
    /// first byte, or the next position of the set whose drive holds the version and whose
    /// node is not down (a set has one drive per node). `None` when no node can (a multipart
    /// object; every candidate down).
    fn node_for(&self, object: &TableObject, group: usize) -> Option<String> {
        let info = &object.info;
        let start = object.footer.row_group_range(group)?.start;
        let first = info.position_of(start)?;
        let n = info.drives.len();
        (0..n).map(|step| (first + step) % n).find_map(|position| {
            let node = &info.drives[position].0;
            let holds = info.meta_positions.is_empty() || info.meta_positions.contains(&position);
            (holds && !self.client.node_is_down(node)).then(|| node.clone())
        })
    }
}

/// `filter` as SQL text a node parses back to the same expression, or `None`. The SQL writer
/// loses literal types (a Float32 `0.99` would come back as a Float64, a decimal as a float),
/// so every literal other than a 64-bit integer, a string or a boolean is written as a cast
/// from text to its exact type; literals of other types keep the filter in the client.
pub(crate) fn portable_sql(filter: &Expr) -> Option<String> {
    use pushdown::datafusion::arrow::datatypes::DataType;
    use pushdown::datafusion::common::ScalarValue;
    use pushdown::datafusion::common::tree_node::{Transformed, TreeNode};
    use pushdown::datafusion::logical_expr::{Cast, lit};

    let mut writable = true;
    let rewritten = filter
        .clone()
        .transform(|expr| {
            let Expr::Literal(value, _) = &expr else {
                return Ok(Transformed::no(expr));
            };
            let from_text = |text: String, to: DataType| Expr::Cast(Cast::new(Box::new(lit(text)), to));
            let exact = match value {
                ScalarValue::Int64(Some(_)) | ScalarValue::Utf8(Some(_)) | ScalarValue::Boolean(Some(_)) => {
                    return Ok(Transformed::no(expr));
                }
                ScalarValue::Float64(Some(v)) => from_text(v.to_string(), DataType::Float64),
                ScalarValue::Float32(Some(v)) => from_text(v.to_string(), DataType::Float32),
                ScalarValue::Int8(Some(_))
                | ScalarValue::Int16(Some(_))
                | ScalarValue::Int32(Some(_))
                | ScalarValue::UInt8(Some(_))
                | ScalarValue::UInt16(Some(_))
                | ScalarValue::UInt32(Some(_))
                | ScalarValue::Decimal128(Some(_), _, _)
                | ScalarValue::Date32(Some(_)) => from_text(value.to_string(), value.data_type()),
                _ => {
                    writable = false;
                    return Ok(Transformed::no(expr));
                }
            };
            Ok(Transformed::yes(exact))
        })
        .ok()?
        .data;
    if !writable {
        return None;
    }
    expr_to_sql(&rewritten).ok().map(|sql| sql.to_string())
}

/// The filters a scan was given, as SQL text for the nodes (each was accepted for pushdown
/// because it can be written so).
pub(crate) fn filters_sql(filters: &[Expr]) -> DfResult<Vec<String>> {
    filters
        .iter()
        .map(|filter| {
            portable_sql(filter).ok_or_else(|| {
                DataFusionError::Internal(format!("filter {filter} was accepted for pushdown but cannot be written"))
            })
        })
        .collect()
}

/// Every key under `prefix` in `bucket`, in order, at most [`TABLE_OBJECTS_MAX`].
async fn list_all(client: &Client, bucket: &str, prefix: &str) -> Result<Vec<String>, Error> {
    let mut keys = Vec::new();
    let mut after = String::new();
    loop {
        let page = client.list(bucket, prefix, &after, 1000).await?;
        keys.extend(page.entries.into_iter().map(|e| e.key).filter(|k| !k.ends_with('/')));
        if keys.len() > TABLE_OBJECTS_MAX {
            return Err(Error::BadQuery(format!(
                "{bucket}/{prefix} holds more than {TABLE_OBJECTS_MAX} objects: query a narrower prefix"
            )));
        }
        match page.next_start_after {
            Some(next) => after = next,
            None => return Ok(keys),
        }
    }
}

/// Reads and parses an object's Parquet footer: one read of its last 64 KiB, a second when
/// the footer is larger.
pub(crate) async fn read_footer(client: &Client, name: &str, info: &ObjectInfo) -> Result<Footer, Error> {
    let size = info.meta.size;
    if size < 12 {
        return Err(Error::BadQuery(format!("{name} is not a Parquet file ({size} bytes)")));
    }
    let guess = size.min(FOOTER_GUESS_BYTES);
    let mut tail = vec![0u8; guess as usize];
    client.read_at(info, size - guess, &mut tail).await?;
    let needed = Footer::tail_len(name, &tail[tail.len() - 8..], size)?;
    let metadata = if needed <= guess {
        tail[(guess - needed) as usize..tail.len() - 8].to_vec()
    } else {
        let mut bytes = vec![0u8; (needed - 8) as usize];
        client.read_at(info, size - needed, &mut bytes).await?;
        bytes
    };
    Ok(Footer::parse(name, Bytes::from(metadata), size)?)
}

#[async_trait]
impl TableProvider for ObjectTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    /// Filters that can be written back as SQL go to the nodes, which apply them exactly
    /// (DataFusion's filter over the decoded rows, after statistics and page pruning), so the
    /// client does not filter again: a count with a filter moves no rows at all, and a limit
    /// goes down to the nodes too. Anything else (volatile functions, expressions the SQL
    /// writer cannot express) is evaluated by the client over the rows that come back.
    fn supports_filters_pushdown(&self, filters: &[&Expr]) -> DfResult<Vec<TableProviderFilterPushDown>> {
        Ok(filters
            .iter()
            .map(|f| {
                if !f.is_volatile() && portable_sql(f).is_some() {
                    TableProviderFilterPushDown::Exact
                } else {
                    TableProviderFilterPushDown::Unsupported
                }
            })
            .collect())
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let indices: Vec<usize> = match projection {
            Some(indices) => indices.clone(),
            None => (0..self.schema.fields().len()).collect(),
        };
        let projected = Arc::new(self.schema.project(&indices)?);
        let columns: Vec<String> = projected.fields().iter().map(|f| f.name().clone()).collect();
        let sql_filters = filters_sql(filters)?;
        let spec =
            ScanSpec { count_only: columns.is_empty(), columns, filters: sql_filters, limit: limit.map(|l| l as u64) };
        self.exec(spec, None, projected, None, limit)
    }
}

impl ObjectTable {
    /// The table's columns.
    pub(crate) fn table_schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Whether scans go to the nodes.
    pub(crate) fn pushes_down(&self) -> bool {
        self.pushdown
    }

    /// The plan that evaluates `spec` (with `aggregate`, a partial aggregate) over every row
    /// group of the table, one partition per node (and one for the client's own): each yields
    /// `schema` (what `spec` answers), of which the plan passes on the `projection`.
    pub(crate) fn exec(
        &self,
        spec: ScanSpec,
        aggregate: Option<AggregateSpec>,
        schema: SchemaRef,
        projection: Option<&Vec<usize>>,
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let mut assigned = self.assign();
        if assigned.is_empty() {
            // No row groups at all: one empty partition gives an empty result of the right shape.
            assigned.insert(None, BTreeMap::new());
        }
        let partitions: Vec<Arc<dyn PartitionStream>> = assigned
            .into_iter()
            .map(|(node, groups)| {
                Arc::new(Fragment {
                    node,
                    groups,
                    objects: Arc::clone(&self.objects),
                    table_schema: Arc::clone(&self.schema),
                    schema: Arc::clone(&schema),
                    spec: spec.clone(),
                    aggregate: aggregate.clone(),
                    client: self.client.clone(),
                    limits: self.limits,
                    counters: Arc::clone(&self.counters),
                }) as Arc<dyn PartitionStream>
            })
            .collect();
        Ok(Arc::new(StreamingTableExec::try_new(schema, partitions, projection, [], false, limit)?))
    }
}

/// The row groups one node (or the client itself) evaluates; each execution runs a copy in a
/// task of its own.
#[derive(Clone, Debug)]
struct Fragment {
    /// `None`: the client evaluates them.
    node: Option<String>,
    /// Object index -> row groups.
    groups: BTreeMap<usize, Vec<u32>>,
    objects: Arc<Vec<TableObject>>,
    table_schema: SchemaRef,
    /// What the fragment yields: the projected columns.
    schema: SchemaRef,
    spec: ScanSpec,
    /// A partial aggregate of the matching rows, answered instead of them.
    aggregate: Option<AggregateSpec>,
    client: Client,
    limits: ScanLimits,
    counters: Arc<QueryCounters>,
}

impl PartitionStream for Fragment {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let (tx, rx) = tokio::sync::mpsc::channel(NODE_BATCHES_BUFFERED);
        let job = self.clone();
        tokio::spawn(async move {
            let result = job.run(&tx).await;
            if let Err(e) = result {
                let _ = tx.send(Err(DataFusionError::External(Box::new(e)))).await;
            }
        });
        let stream = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
        Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&self.schema), stream))
    }
}

type Sender = tokio::sync::mpsc::Sender<DfResult<RecordBatch>>;

/// The consumer went away (the query was dropped or its limit reached): stop quietly.
#[derive(Debug)]
struct Stopped;

impl Fragment {
    async fn run(self, tx: &Sender) -> Result<(), Error> {
        if self.groups.is_empty() {
            return Ok(());
        }
        if let Some(node) = &self.node {
            match self.on_node(node, tx).await {
                Ok(Ok(())) | Err(Stopped) => return Ok(()),
                // Nothing was passed on yet: the client evaluates the fragment instead.
                Ok(Err(NodeFailure::BeforeResults(e))) => {
                    tracing::info!(node = %node, error = %e, "a node could not evaluate its row groups; the client reads them");
                }
                Ok(Err(NodeFailure::Fatal(e))) => return Err(e),
            }
        }
        match self.on_client(tx).await {
            Ok(result) => result,
            Err(Stopped) => Ok(()),
        }
    }

    /// Sends the fragment to its node and passes the rows on.
    async fn on_node(&self, node: &str, tx: &Sender) -> Result<Result<(), NodeFailure>, Stopped> {
        let mut objects = Vec::with_capacity(self.groups.len());
        for (&idx, groups) in &self.groups {
            let object = &self.objects[idx];
            let info = &object.info;
            let Some(drive) = info.drives.iter().find(|(id, _)| id == node).map(|(_, d)| *d as u32) else {
                return Ok(Err(NodeFailure::BeforeResults(Error::Engine(format!(
                    "{node} holds no drive of {}",
                    object.name
                )))));
            };
            objects.push(QueryObject {
                drive,
                bucket: info.meta.bucket.clone(),
                key: info.meta.key.clone(),
                version: info.meta.version,
                footer: object.footer.bytes.to_vec(),
                row_groups: groups.clone(),
            });
        }
        // Requests carry the footers: split them so that each stays within the frame bound.
        let mut batches_passed = false;
        for request in split_by_footer_bytes(objects) {
            self.counters.node_requests.fetch_add(1, Ordering::Relaxed);
            let sent = self.client.query_node(node, self.spec.clone(), self.aggregate.clone(), request).await;
            let mut reply = match sent {
                Ok(reply) => reply,
                Err(e) => return Ok(Err(failure(e, batches_passed))),
            };
            let mut decoder = StreamDecoder::new();
            loop {
                // The consumer gone (query dropped, limit reached): stop now, which closes the
                // connection and so stops the node's scan at its next write.
                let next = tokio::select! {
                    next = reply.next() => next,
                    () = tx.closed() => return Err(Stopped),
                };
                match next {
                    Ok(Some(bytes)) => {
                        self.counters.result_bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                        let mut buffer = Buffer::from(bytes);
                        while !buffer.is_empty() {
                            let decoded = match decoder.decode(&mut buffer) {
                                Ok(decoded) => decoded,
                                Err(e) => {
                                    return Ok(Err(NodeFailure::Fatal(Error::Engine(format!(
                                        "{node}'s results: {e}"
                                    )))));
                                }
                            };
                            if let Some(batch) = decoded {
                                let batch = match self.conform(batch) {
                                    Ok(batch) => batch,
                                    Err(e) => return Ok(Err(NodeFailure::Fatal(e))),
                                };
                                batches_passed = true;
                                tx.send(Ok(batch)).await.map_err(|_| Stopped)?;
                            }
                        }
                    }
                    Ok(None) => break,
                    Err(e) => return Ok(Err(failure(e, batches_passed))),
                }
            }
            self.counters.heartbeats.fetch_add(reply.heartbeats(), Ordering::Relaxed);
            let stats = reply.stats().unwrap_or_default();
            self.counters.node_read_bytes.fetch_add(stats.local_bytes + stats.peer_bytes, Ordering::Relaxed);
            self.counters.node_peer_bytes.fetch_add(stats.peer_bytes, Ordering::Relaxed);
            if self.spec.count_only && stats.rows > 0 {
                let options = RecordBatchOptions::new().with_row_count(Some(stats.rows as usize));
                let batch = RecordBatch::try_new_with_options(Arc::new(Schema::empty()), vec![], &options)
                    .expect("a batch without columns takes any row count");
                batches_passed = true;
                tx.send(Ok(batch)).await.map_err(|_| Stopped)?;
            }
        }
        Ok(Ok(()))
    }

    /// A node's batch with the client's schema (same columns and types; the node's schema may
    /// differ in metadata).
    fn conform(&self, batch: RecordBatch) -> Result<RecordBatch, Error> {
        RecordBatch::try_new(Arc::clone(&self.schema), batch.columns().to_vec())
            .map_err(|e| Error::Engine(format!("a node's results do not match the table's columns: {e}")))
    }

    /// Evaluates the fragment here, reading the row groups through the smart client.
    async fn on_client(&self, tx: &Sender) -> Result<Result<(), Error>, Stopped> {
        let mut scan_objects = Vec::with_capacity(self.groups.len());
        let mut infos = Vec::with_capacity(self.groups.len());
        for (&idx, groups) in &self.groups {
            let object = &self.objects[idx];
            self.counters.client_row_groups.fetch_add(groups.len() as u64, Ordering::Relaxed);
            scan_objects.push(ScanObject {
                name: object.name.clone(),
                size: object.info.meta.size,
                footer: Arc::clone(&object.footer),
                row_groups: groups.iter().map(|g| *g as usize).collect(),
            });
            infos.push(object.info.clone());
        }
        let source = Arc::new(ClientSource {
            client: self.client.clone(),
            objects: infos,
            counters: Arc::clone(&self.counters),
        });
        let mut stream = match pushdown::scan(
            scan_objects,
            Arc::clone(&self.table_schema),
            source,
            &self.spec,
            self.aggregate.as_ref(),
            &self.limits,
        )
        .await
        {
            Ok(stream) => stream,
            Err(e) => return Ok(Err(e.into())),
        };
        while let Some(batch) = stream.next().await {
            let batch = match batch {
                Ok(batch) if self.spec.count_only => Ok(batch),
                Ok(batch) => self.conform(batch).map_err(|e| DataFusionError::External(Box::new(e))),
                Err(e) => Err(e),
            };
            tx.send(batch).await.map_err(|_| Stopped)?;
        }
        Ok(Ok(()))
    }
}

enum NodeFailure {
    /// The node failed before any of its rows were passed on: the client can take over.
    BeforeResults(Error),
    /// The query is wrong, or rows were already passed on (taking over would repeat them).
    Fatal(Error),
}

fn failure(error: client::Error, batches_passed: bool) -> NodeFailure {
    let bad_query = matches!(&error, client::Error::Node { kind: ErrorKind::BadQuery, .. });
    if bad_query {
        let client::Error::Node { message, .. } = error else { unreachable!("matched above") };
        return NodeFailure::Fatal(Error::BadQuery(message));
    }
    if batches_passed {
        NodeFailure::Fatal(Error::Client(error))
    } else {
        NodeFailure::BeforeResults(Error::Client(error))
    }
}

/// Objects one node request lists at most.
const OBJECTS_PER_REQUEST_MAX: usize = 1024;

/// Splits a node's objects into requests whose footers stay within the protocol's bound (one
/// footer alone always fits: [`pushdown::FOOTER_BYTES_MAX`] is that bound).
fn split_by_footer_bytes(objects: Vec<QueryObject>) -> Vec<Vec<QueryObject>> {
    let mut requests: Vec<Vec<QueryObject>> = vec![Vec::new()];
    let mut bytes = 0;
    for object in objects {
        let len = object.footer.len();
        let current = requests.last_mut().expect("never empty");
        if !current.is_empty()
            && (bytes + len > client::QUERY_FOOTER_BYTES_MAX || current.len() >= OBJECTS_PER_REQUEST_MAX)
        {
            requests.push(Vec::new());
            bytes = 0;
        }
        bytes += len;
        requests.last_mut().expect("never empty").push(object);
    }
    requests
}
