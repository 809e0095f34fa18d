//! A table of objects whose scan runs on the nodes, one request per node, Arrow IPC back:
//! Parquet objects by row group, each assigned to the node holding its first byte; CSV and
//! JSON-lines objects by record split, one per data chunk (the records that start in it),
//! each assigned to the node holding the chunk.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use async_trait::async_trait;
use bytes::Bytes;
use client::{AggregateSpec, Client, ErrorKind, ObjectInfo, QueryObject, RecordObject, RecordSplit, ScanSpec};
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
use pushdown::{Footer, RecordFormat, ScanLimits, ScanObject, SplitObject};

use crate::source::ClientSource;
use crate::{Error, QueryCounters, QueryOptions};

/// Objects one table may have at most.
pub(crate) const TABLE_OBJECTS_MAX: usize = 10_000;
/// Bytes read from an object's end in one go for its footer (most footers fit).
pub(crate) const FOOTER_GUESS_BYTES: u64 = 64 << 10;
/// Result batches buffered per node between the network and the engine.
const NODE_BATCHES_BUFFERED: usize = 4;

/// A record object smaller than this is one split, not k tiny ones on k nodes.
const SPLIT_BYTES_MIN: u64 = 1 << 20;

/// One object of a table: where it is and what its scan is made of.
#[derive(Debug)]
struct TableObject {
    name: String,
    info: ObjectInfo,
    units: Units,
}

/// The pieces an object's scan is cut into, each evaluated whole by one node (or the client).
#[derive(Debug)]
enum Units {
    /// A Parquet object's row groups (unit `i` is row group `i`).
    RowGroups(Arc<Footer>),
    /// A record object's splits, in order (unit `i` is split `i`).
    Splits(Vec<RecordSplit>),
}

impl TableObject {
    fn unit_count(&self) -> usize {
        match &self.units {
            Units::RowGroups(footer) => footer.row_groups(),
            Units::Splits(splits) => splits.len(),
        }
    }

    /// The first object byte unit `unit` reads.
    fn unit_start(&self, unit: usize) -> Option<u64> {
        match &self.units {
            Units::RowGroups(footer) => footer.row_group_range(unit).map(|r| r.start),
            Units::Splits(splits) => splits.get(unit).map(|s| pushdown::records::RangeCut::start(s.first)),
        }
    }
}

/// How a table's records are written: Parquet, or records of one format and schema.
#[derive(Clone, Debug)]
enum TableFormat {
    Parquet,
    /// `schema` as the nodes get it (an Arrow IPC stream of the schema alone).
    Records {
        format: RecordFormat,
        schema_bytes: Arc<Vec<u8>>,
    },
}

/// The objects named by one table reference: Parquet objects, or CSV or JSON-lines objects of
/// one format.
#[derive(Clone, Debug)]
pub(crate) struct ObjectTable {
    schema: SchemaRef,
    format: TableFormat,
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

    /// The one Parquet object `bucket/key`, whatever its key looks like (S3 Select: a key may
    /// end in `/` and still name one object, or in `.csv` and hold Parquet).
    pub(crate) async fn open_object(
        client: &Client,
        bucket: &str,
        key: &str,
        options: &QueryOptions,
        counters: Arc<QueryCounters>,
    ) -> Result<Self, Error> {
        Self::open_parquet_keys(client, bucket, vec![key.to_owned()], options, counters).await
    }

    /// `keys` as one table, of the format their names say (see [`crate::layout::table_records_format`]).
    async fn open_keys(
        client: &Client,
        bucket: &str,
        keys: Vec<String>,
        options: &QueryOptions,
        counters: Arc<QueryCounters>,
    ) -> Result<Self, Error> {
        if let Some(key) = keys.iter().find(|k| crate::layout::is_compressed_key(k)) {
            return Err(Error::BadQuery(format!(
                "{bucket}/{key} is compressed: its records cannot be evaluated where they lie \
                 (S3 Select reads compressed CSV and JSON through the gateway)"
            )));
        }
        let formats: Vec<Option<RecordFormat>> = keys.iter().map(|k| crate::layout::table_records_format(k)).collect();
        if let Some(first) = formats.iter().position(Option::is_some) {
            let format = formats[first].clone().expect("found above");
            if let Some((other, _)) = keys.iter().zip(&formats).find(|(_, f)| f.as_ref() != Some(&format)) {
                return Err(Error::BadQuery(format!(
                    "{bucket}/{other} and {bucket}/{} are not of one format: the objects of a table are all \
                     Parquet, all CSV (.csv), all TSV (.tsv) or all JSON lines (.json, .jsonl, .ndjson); \
                     query a narrower prefix",
                    keys[first]
                )));
            }
            return Self::open_record_keys(client, bucket, keys, format, options, counters).await;
        }
        Self::open_parquet_keys(client, bucket, keys, options, counters).await
    }

    /// Parquet objects as one table: their footers read, their schemas checked to agree.
    async fn open_parquet_keys(
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
            objects.push(TableObject { name, info, units: Units::RowGroups(Arc::new(footer)) });
        }
        let named: Vec<(&str, &Footer)> = objects
            .iter()
            .filter_map(|o| match &o.units {
                Units::RowGroups(footer) => Some((o.name.as_str(), footer.as_ref())),
                Units::Splits(_) => None,
            })
            .collect();
        let schema = pushdown::table_schema(&named)?;
        Ok(Self {
            schema,
            format: TableFormat::Parquet,
            objects: Arc::new(objects),
            client: client.clone(),
            pushdown: options.pushdown,
            limits: options.limits,
            counters,
        })
    }

    /// CSV or JSON-lines objects as one table: every record of each, split by data chunk; the
    /// columns typed from a sample of the first objects' heads (see [`RecordsSample`]).
    async fn open_record_keys(
        client: &Client,
        bucket: &str,
        keys: Vec<String>,
        format: RecordFormat,
        options: &QueryOptions,
        counters: Arc<QueryCounters>,
    ) -> Result<Self, Error> {
        let mut objects = Vec::with_capacity(keys.len());
        let mut sample = RecordsSample::default();
        for key in keys {
            let info = client.head(bucket, &key).await?;
            let name = format!("{bucket}/{key}");
            // An empty object (an empty partition) has no header and no records.
            if info.meta.size > 0 && sample.bytes.len() < RECORDS_SAMPLE_BYTES_MAX {
                let head = read_record_head(client, &name, &info, &counters, RECORDS_HEAD_BYTES).await?;
                sample.add(&format, &name, head)?;
            } else if info.meta.size > 0 && matches!(&format, RecordFormat::Csv(csv) if csv.header) {
                // Past the sample, every CSV object's header is still checked: its columns are
                // read by position, and a reordered file must not answer with swapped columns.
                let head = read_record_head(client, &name, &info, &counters, HEADER_GUESS_BYTES).await?;
                sample.check_header(&format, &name, &head)?;
            }
            let splits = record_splits(&info, 0, u64::MAX);
            objects.push(TableObject { name, info, units: Units::Splits(splits) });
        }
        let schema = sample.schema(&format)?;
        pushdown::records::check_schema(&format, &schema)?;
        let schema_bytes = pushdown::records::schema_to_bytes(&schema)?;
        Ok(Self {
            schema,
            format: TableFormat::Records { format, schema_bytes: Arc::new(schema_bytes) },
            objects: Arc::new(objects),
            client: client.clone(),
            pushdown: options.pushdown,
            limits: options.limits,
            counters,
        })
    }

    /// The records of one CSV or JSON-lines object, `info`, decoded as `format` says into a
    /// table of `schema`; `range` (first and last byte, inclusive) limits them to the records
    /// that start inside it, `None` to none at all.
    pub(crate) fn open_records(
        client: &Client,
        info: ObjectInfo,
        format: RecordFormat,
        schema: SchemaRef,
        range: Option<(u64, u64)>,
        options: &QueryOptions,
        counters: Arc<QueryCounters>,
    ) -> Result<Self, Error> {
        pushdown::records::check_schema(&format, &schema)?;
        let schema_bytes = pushdown::records::schema_to_bytes(&schema)?;
        let name = format!("{}/{}", info.meta.bucket, info.meta.key);
        let splits = match range {
            Some((first, last)) => record_splits(&info, first, last),
            None => Vec::new(),
        };
        Ok(Self {
            schema,
            format: TableFormat::Records { format, schema_bytes: Arc::new(schema_bytes) },
            objects: Arc::new(vec![TableObject { name, info, units: Units::Splits(splits) }]),
            client: client.clone(),
            pushdown: options.pushdown,
            limits: options.limits,
            counters,
        })
    }

    /// Units by node (`None`: the client's own), each as object index -> units.
    fn assign(&self) -> BTreeMap<Option<String>, BTreeMap<usize, Vec<u32>>> {
        let mut by_node: BTreeMap<Option<String>, BTreeMap<usize, Vec<u32>>> = BTreeMap::new();
        for (idx, object) in self.objects.iter().enumerate() {
            for unit in 0..object.unit_count() {
                let node = if self.pushdown { self.node_for(object, unit) } else { None };
                by_node.entry(node).or_default().entry(idx).or_default().push(unit as u32);
            }
        }
        by_node
    }

    /// The node that evaluates unit `unit` of `object`: the one holding the unit's first
    /// byte, or the next position of the set whose drive holds the version and whose node is
    /// not down (a set has one drive per node). `None` when no node can (a multipart object;
    /// every candidate down).
    fn node_for(&self, object: &TableObject, unit: usize) -> Option<String> {
        let info = &object.info;
        let start = object.unit_start(unit)?;
        let first = info.position_of(start)?;
        let n = info.drives.len();
        (0..n).map(|step| (first + step) % n).find_map(|position| {
            let node = &info.drives[position].0;
            let holds = info.meta_positions.is_empty() || info.meta_positions.contains(&position);
            (holds && !self.client.node_is_down(node)).then(|| node.clone())
        })
    }
}

/// Bytes read from the start of a record object to type a table's columns (a second read of
/// up to [`RECORDS_HEAD_BYTES_MAX`] when its first line is longer), and bytes of all objects'
/// heads together past which no further object is sampled.
const RECORDS_HEAD_BYTES: u64 = 64 << 10;
const RECORDS_HEAD_BYTES_MAX: u64 = 1 << 20;
const RECORDS_SAMPLE_BYTES_MAX: usize = 1 << 20;
/// Bytes read first for the header line of a CSV object past the sample.
const HEADER_GUESS_BYTES: u64 = 4 << 10;

/// The first records of a table's first objects, whose values type its columns, as DuckDB's
/// and DataFusion's CSV readers type theirs from a sample: a CSV table's columns are named by
/// the first object's header line, and each sampled object must have the same header.
#[derive(Default)]
struct RecordsSample {
    /// The sampled records, the first object's CSV header line first.
    bytes: Vec<u8>,
    /// The first sampled object: its name and CSV header line.
    first: Option<(String, Vec<u8>)>,
}

impl RecordsSample {
    /// Adds `head`, an object's first whole records.
    fn add(&mut self, format: &RecordFormat, name: &str, mut head: Vec<u8>) -> Result<(), Error> {
        if !head.is_empty() && !head.ends_with(b"\n") {
            head.push(b'\n');
        }
        if let RecordFormat::JsonLines = format
            && head.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[')
        {
            return Err(Error::BadQuery(format!(
                "{name} holds a JSON array: a table's JSON objects hold one record per line (JSON lines)"
            )));
        }
        let (header, header_end) = header_line(format, &head);
        match &self.first {
            None => {
                self.first = Some((name.to_owned(), header));
                self.bytes.extend_from_slice(&head);
            }
            Some(_) => {
                self.check_header(format, name, &head)?;
                self.bytes.extend_from_slice(&head[header_end..]);
            }
        }
        Ok(())
    }

    /// Checks that `head`, the first line(s) of object `name`, has the sampled objects' header.
    fn check_header(&self, format: &RecordFormat, name: &str, head: &[u8]) -> Result<(), Error> {
        let (header, _) = header_line(format, head);
        match &self.first {
            Some((first, first_header)) if *first_header != header => Err(Error::BadQuery(format!(
                "{name}'s header line differs from {first}'s: a table's CSV objects have the same columns"
            ))),
            _ => Ok(()),
        }
    }

    /// The table's columns as the sample types them: what Arrow's CSV or JSON schema inference
    /// finds, a column with no values in the sample typed as a string.
    fn schema(&self, format: &RecordFormat) -> Result<SchemaRef, Error> {
        use pushdown::datafusion::arrow::datatypes::{DataType, Field};
        let name = self.first.as_ref().map_or("the table", |(name, _)| name.as_str());
        let inferred = match format {
            RecordFormat::Csv(csv) => {
                let mut reader = pushdown::datafusion::arrow::csv::reader::Format::default()
                    .with_header(csv.header)
                    .with_delimiter(csv.delimiter)
                    .with_quote(csv.quote);
                if let Some(escape) = csv.escape {
                    reader = reader.with_escape(escape);
                }
                reader
                    .infer_schema(std::io::Cursor::new(&self.bytes), None)
                    .map(|(schema, _)| schema)
                    .map_err(|e| Error::BadQuery(format!("{name}: not CSV with a header line: {e}")))?
            }
            RecordFormat::JsonLines => {
                let inferred = pushdown::datafusion::arrow::json::reader::infer_json_schema(
                    std::io::Cursor::new(&self.bytes),
                    None,
                )
                .map(|(schema, _)| schema)
                .map_err(|e| Error::BadQuery(format!("{name}: not JSON lines: {e}")))?;
                in_json_order(&inferred, &self.bytes)
            }
        };
        if inferred.fields().is_empty() {
            return Err(Error::BadQuery(format!("{name}: no columns in its first records")));
        }
        let fields: Vec<Field> = inferred
            .fields()
            .iter()
            .map(|f| match f.data_type() {
                DataType::Null => Field::new(f.name(), DataType::Utf8, true),
                _ => f.as_ref().clone().with_nullable(true),
            })
            .collect();
        Ok(Arc::new(Schema::new(fields)))
    }
}

/// `schema`'s fields in the order `records` (JSON) first name them, as they are written (Arrow's
/// inference sorts them by name); fields the records do not name stay last, in their order.
pub(crate) fn in_json_order(schema: &Schema, records: &[u8]) -> Schema {
    use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};

    /// A JSON object's keys, in order.
    struct Keys(Vec<String>);
    impl<'de> Deserialize<'de> for Keys {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            struct KeysVisitor;
            impl<'de> Visitor<'de> for KeysVisitor {
                type Value = Keys;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("a JSON object")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Keys, A::Error> {
                    let mut keys = Vec::new();
                    while let Some(key) = map.next_key::<String>()? {
                        map.next_value::<IgnoredAny>()?;
                        keys.push(key);
                    }
                    Ok(Keys(keys))
                }
            }
            deserializer.deserialize_map(KeysVisitor)
        }
    }

    let mut order: Vec<String> = Vec::new();
    for keys in serde_json::Deserializer::from_slice(records).into_iter::<Keys>() {
        let Ok(Keys(keys)) = keys else { break };
        for key in keys {
            if !order.contains(&key) {
                order.push(key);
            }
        }
        if order.len() >= schema.fields().len() {
            break;
        }
    }
    let mut fields: Vec<_> = order.iter().filter_map(|name| schema.field_with_name(name).ok().cloned()).collect();
    for field in schema.fields() {
        if !order.contains(field.name()) {
            fields.push(field.as_ref().clone());
        }
    }
    Schema::new_with_metadata(fields, schema.metadata().clone())
}

/// A CSV object's header line (without its line break) and where its records start; empty
/// and 0 for records without one.
fn header_line(format: &RecordFormat, head: &[u8]) -> (Vec<u8>, usize) {
    match format {
        RecordFormat::Csv(csv) if csv.header => {
            let end = head.iter().position(|b| *b == b'\n').map_or(head.len(), |i| i + 1);
            (head[..end].trim_ascii_end().to_vec(), end)
        }
        _ => (Vec::new(), 0),
    }
}

/// A record object's first whole records: its first `first_read` bytes up to the last line
/// break (all of it when it is that small; up to [`RECORDS_HEAD_BYTES_MAX`] when that holds
/// no line break), counted as bytes this client read.
async fn read_record_head(
    client: &Client,
    name: &str,
    info: &ObjectInfo,
    counters: &QueryCounters,
    first_read: u64,
) -> Result<Vec<u8>, Error> {
    let size = info.meta.size;
    for head_len in [first_read, RECORDS_HEAD_BYTES_MAX] {
        let len = size.min(head_len);
        let mut head = vec![0u8; len as usize];
        client.read_at(info, 0, &mut head).await?;
        counters.client_read_bytes.fetch_add(len, Ordering::Relaxed);
        if len == size {
            return Ok(head);
        }
        if let Some(end) = head.iter().rposition(|b| *b == b'\n') {
            head.truncate(end + 1);
            return Ok(head);
        }
    }
    Err(Error::BadQuery(format!("{name}: its first record is longer than {RECORDS_HEAD_BYTES_MAX} bytes")))
}

/// The splits of an object whose records are selected when they start in `first..=last`:
/// one per data chunk (the records that start after the chunk's first byte, up to and with the
/// one starting at its end; the object's first record is the first chunk's), or one for an
/// object under [`SPLIT_BYTES_MIN`], each cut to `first..=last`.
fn record_splits(info: &ObjectInfo, first: u64, last: u64) -> Vec<RecordSplit> {
    let meta = &info.meta;
    let size = meta.size;
    let last = last.min(size.saturating_sub(1));
    if size == 0 || first > last {
        return Vec::new();
    }
    // Where chunks start, as object offsets (a multipart or small object: one split).
    let mut starts = vec![0u64];
    if meta.has_data_file() && size >= SPLIT_BYTES_MIN {
        let geometry = meta.geometry();
        let stored = meta.stored_size();
        let mut stripe = 0u64;
        while geometry.stripe_offset(stripe) < stored {
            let chunk_len = geometry.chunk_len(stripe) as u64;
            for chunk in 0..u64::from(meta.k) {
                let at = object_offset(info, geometry.stripe_offset(stripe) + chunk * chunk_len);
                if at < size && at > *starts.last().expect("never empty") {
                    starts.push(at);
                }
            }
            stripe += 1;
        }
    }
    let mut splits = Vec::with_capacity(starts.len());
    for (i, &start) in starts.iter().enumerate() {
        let from = if start == 0 { 0 } else { start + 1 };
        let to = starts.get(i + 1).copied().unwrap_or(size - 1).min(size - 1);
        let (from, to) = (from.max(first), to.min(last));
        if from <= to {
            splits.push(RecordSplit { first: from, last: to });
        }
    }
    splits
}

/// The object offset of stored offset `stored` (one inside a pad: the object byte after it).
fn object_offset(info: &ObjectInfo, stored: u64) -> u64 {
    let mut shift = 0u64;
    for pad in &info.meta.pads {
        let (pad_start, pad_end) = (pad.at + shift, pad.at + shift + u64::from(pad.len));
        if stored < pad_start {
            break;
        }
        if stored < pad_end {
            return pad.at;
        }
        shift += u64::from(pad.len);
    }
    stored - shift
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

/// Whether `key`, under `prefix`, names a file a dataset's writers leave beside its data,
/// which readers skip (Hadoop's rule: a name or directory after the prefix starting with `_`
/// or `.`, like `_SUCCESS`, `_temporary/...` or `.hive-staging_.../...`).
fn is_hidden(prefix: &str, key: &str) -> bool {
    let below = key.strip_prefix(prefix).unwrap_or(key);
    below.split('/').any(|part| part.starts_with('_') || part.starts_with('.'))
}

/// Every key under `prefix` in `bucket`, in order (but those [`is_hidden`]), at most
/// [`TABLE_OBJECTS_MAX`].
async fn list_all(client: &Client, bucket: &str, prefix: &str) -> Result<Vec<String>, Error> {
    let mut keys = Vec::new();
    let mut after = String::new();
    loop {
        let page = client.list(bucket, prefix, &after, 1000).await?;
        keys.extend(page.entries.into_iter().map(|e| e.key).filter(|k| !k.ends_with('/') && !is_hidden(prefix, k)));
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
                    format: self.format.clone(),
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
    /// Object index -> units (row groups or splits).
    groups: BTreeMap<usize, Vec<u32>>,
    format: TableFormat,
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

    /// The fragment as node requests, each within the protocol's bounds; `Err`: the node
    /// holds no drive of an object.
    fn requests(&self, node: &str) -> Result<Vec<NodeRequest>, Error> {
        let mut row_groups = Vec::new();
        let mut records = Vec::new();
        for (&idx, units) in &self.groups {
            let object = &self.objects[idx];
            let info = &object.info;
            let drive = info
                .drives
                .iter()
                .find(|(id, _)| id == node)
                .map(|(_, d)| *d as u32)
                .ok_or_else(|| Error::Engine(format!("{node} holds no drive of {}", object.name)))?;
            let (bucket, key, version) = (info.meta.bucket.clone(), info.meta.key.clone(), info.meta.version);
            match &object.units {
                Units::RowGroups(footer) => row_groups.push(QueryObject {
                    drive,
                    bucket,
                    key,
                    version,
                    footer: footer.bytes.to_vec(),
                    row_groups: units.clone(),
                }),
                Units::Splits(splits) => {
                    let splits = units.iter().map(|u| splits[*u as usize]).collect();
                    records.push(RecordObject { drive, bucket, key, version, splits });
                }
            }
        }
        let mut requests: Vec<NodeRequest> = split_by_footer_bytes(row_groups)
            .into_iter()
            .filter(|r| !r.is_empty())
            .map(NodeRequest::RowGroups)
            .collect();
        requests.extend(split_by_split_count(records).into_iter().map(NodeRequest::Records));
        Ok(requests)
    }

    /// Sends the fragment to its node and passes the rows on.
    async fn on_node(&self, node: &str, tx: &Sender) -> Result<Result<(), NodeFailure>, Stopped> {
        let requests = match self.requests(node) {
            Ok(requests) => requests,
            Err(e) => return Ok(Err(NodeFailure::BeforeResults(e))),
        };
        let mut batches_passed = false;
        for request in requests {
            self.counters.node_requests.fetch_add(1, Ordering::Relaxed);
            let (spec, aggregate) = (self.spec.clone(), self.aggregate.clone());
            let sent = match (request, &self.format) {
                (NodeRequest::RowGroups(objects), _) => self.client.query_node(node, spec, aggregate, objects).await,
                (NodeRequest::Records(objects), TableFormat::Records { format, schema_bytes }) => {
                    let (format, schema) = (format.clone(), schema_bytes.to_vec());
                    self.client.query_node_records(node, spec, aggregate, format, schema, objects).await
                }
                (NodeRequest::Records(_), TableFormat::Parquet) => unreachable!("record splits in a Parquet table"),
            };
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

    /// Evaluates the fragment here, reading the row groups or splits through the smart client.
    async fn on_client(&self, tx: &Sender) -> Result<Result<(), Error>, Stopped> {
        let mut scan_objects = Vec::new();
        let mut split_objects = Vec::new();
        let mut infos = Vec::with_capacity(self.groups.len());
        for (&idx, units) in &self.groups {
            let object = &self.objects[idx];
            self.counters.client_row_groups.fetch_add(units.len() as u64, Ordering::Relaxed);
            let (name, size) = (object.name.clone(), object.info.meta.size);
            match &object.units {
                Units::RowGroups(footer) => scan_objects.push(ScanObject {
                    name,
                    size,
                    footer: Arc::clone(footer),
                    row_groups: units.iter().map(|g| *g as usize).collect(),
                }),
                Units::Splits(splits) => split_objects.push(SplitObject {
                    name,
                    size,
                    splits: units.iter().map(|u| splits[*u as usize]).collect(),
                }),
            }
            infos.push(object.info.clone());
        }
        let source = Arc::new(ClientSource {
            client: self.client.clone(),
            objects: infos,
            counters: Arc::clone(&self.counters),
        });
        let (spec, aggregate, limits) = (&self.spec, self.aggregate.as_ref(), &self.limits);
        let started = match &self.format {
            TableFormat::Parquet => {
                pushdown::scan(scan_objects, Arc::clone(&self.table_schema), source, spec, aggregate, limits).await
            }
            TableFormat::Records { format, .. } => {
                let schema = Arc::clone(&self.table_schema);
                pushdown::scan_records(split_objects, schema, format, source, spec, aggregate, limits).await
            }
        };
        let mut stream = match started {
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

/// One request of a fragment to its node.
enum NodeRequest {
    RowGroups(Vec<QueryObject>),
    Records(Vec<RecordObject>),
}

/// Splits a node's record objects into requests of at most [`client::RECORD_SPLITS_MAX`]
/// splits and [`OBJECTS_PER_REQUEST_MAX`] objects (an object with more splits is listed in
/// several).
fn split_by_split_count(objects: Vec<RecordObject>) -> Vec<Vec<RecordObject>> {
    let mut requests: Vec<Vec<RecordObject>> = Vec::new();
    let mut splits = 0;
    for object in objects {
        for piece in object.splits.chunks(client::RECORD_SPLITS_MAX) {
            let full = requests
                .last()
                .is_none_or(|r| splits + piece.len() > client::RECORD_SPLITS_MAX || r.len() >= OBJECTS_PER_REQUEST_MAX);
            if full {
                requests.push(Vec::new());
                splits = 0;
            }
            splits += piece.len();
            requests.last_mut().expect("pushed above").push(RecordObject {
                drive: object.drive,
                bucket: object.bucket.clone(),
                key: object.key.clone(),
                version: object.version,
                splits: piece.to_vec(),
            });
        }
    }
    requests
}

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
