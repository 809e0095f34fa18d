//! CSV and JSON-lines records, split as input splits are: a split is the records whose first
//! byte lies in `first..=last`; it is read from the byte before `first` (whatever precedes the
//! first line break belongs to an earlier record) to the line break that ends the record
//! holding `last`. Consecutive splits therefore take every record exactly once, wherever the
//! line breaks fall, and a node reads its splits from its own chunks plus, for the last
//! record, the head of the next chunk.

use std::sync::Arc;

use bytes::Bytes;
use datafusion::arrow::array::{Array, ArrayRef, RecordBatch, StringArray};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::error::ArrowError;
use datafusion::catalog::streaming::StreamingTable;
use datafusion::error::DataFusionError;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;

use crate::{ByteSource, Error, UNAVAILABLE_MARK};

pub use proto::{CsvFormat, RecordFormat, RecordSplit};

/// How far a split's last record may run past the split: S3 Select's documented limit on a
/// record's length (1 MB). A longer one fails the scan with a clear error.
pub const RECORD_BYTES_MAX: u64 = 1 << 20;
/// Bytes of a split read at a time.
const WINDOW_BYTES: u64 = 1 << 20;
/// Bytes past a split read at a time while looking for its last record's end.
const TAIL_STEP_BYTES: u64 = 64 << 10;
/// Rows decoded per batch.
pub const BATCH_ROWS: usize = 8192;
/// Batches a split's reader decodes ahead of the engine.
const BATCHES_AHEAD: usize = 2;

/// One object of a record scan: its size and the splits to evaluate.
#[derive(Clone, Debug)]
pub struct SplitObject {
    /// `bucket/key`, for errors.
    pub name: String,
    pub size: u64,
    /// In order, not overlapping, inside the object.
    pub splits: Vec<RecordSplit>,
}

/// `schema` as bytes for a [`proto::Request::RecordQuery`]: an Arrow IPC stream with no
/// batches.
pub fn schema_to_bytes(schema: &SchemaRef) -> Result<Vec<u8>, Error> {
    let mut writer = datafusion::arrow::ipc::writer::StreamWriter::try_new(Vec::new(), schema)
        .map_err(|e| Error::Engine(format!("Arrow IPC: {e}")))?;
    writer.finish().map_err(|e| Error::Engine(format!("Arrow IPC: {e}")))?;
    writer.into_inner().map_err(|e| Error::Engine(format!("Arrow IPC: {e}")))
}

/// The schema [`schema_to_bytes`] wrote.
pub fn schema_from_bytes(bytes: &[u8]) -> Result<SchemaRef, Error> {
    let reader = datafusion::arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None)
        .map_err(|e| Error::BadQuery(format!("the records' schema: {e}")))?;
    let schema = reader.schema();
    if schema.fields().is_empty() {
        return Err(Error::BadQuery("the records' schema has no columns".into()));
    }
    Ok(schema)
}

/// Checks that `schema` suits `format`: CSV columns are of the scalar types Arrow's CSV
/// reader parses (strings, booleans, integers, floats, dates, timestamps without a zone).
pub fn check_schema(format: &RecordFormat, schema: &SchemaRef) -> Result<(), Error> {
    use datafusion::arrow::datatypes::DataType;
    let csv_type = |t: &DataType| {
        matches!(t, DataType::Utf8 | DataType::Boolean | DataType::Float32 | DataType::Float64 | DataType::Date32)
            || t.is_integer()
            || matches!(t, DataType::Timestamp(_, None))
    };
    if let RecordFormat::Csv(_) = format
        && let Some(field) = schema.fields().iter().find(|f| !csv_type(f.data_type()))
    {
        return Err(Error::BadQuery(format!(
            "CSV column {} cannot be read as {} (strings, booleans, integers, floats, dates and timestamps can)",
            field.name(),
            field.data_type()
        )));
    }
    Ok(())
}

/// Cuts an object's bytes, read from the byte before `first` (or from 0), to the records that
/// start in `first..=last`: what comes before the first line break is the end of an earlier
/// record; the record holding `last` is read to its line break.
#[derive(Debug)]
pub struct RangeCut {
    /// Object offset of the next byte.
    at: u64,
    skipping: bool,
    last: u64,
}

impl RangeCut {
    pub fn new(first: u64, last: u64) -> Self {
        Self { at: first.saturating_sub(1), skipping: first > 0, last }
    }

    /// Where reading starts: the byte before `first`, or 0.
    pub fn start(first: u64) -> u64 {
        first.saturating_sub(1)
    }

    /// The part of `bytes` (the next ones read) that belongs to selected records, and whether
    /// the selected records end there.
    pub fn apply<'a>(&mut self, bytes: &'a [u8]) -> (&'a [u8], bool) {
        let mut offset = self.at;
        self.at += bytes.len() as u64;
        let mut piece = bytes;
        if self.skipping {
            let Some(i) = piece.iter().position(|b| *b == b'\n') else {
                return (&[], false);
            };
            piece = &piece[i + 1..];
            offset += i as u64 + 1;
            self.skipping = false;
            if offset > self.last {
                return (&[], true);
            }
        }
        if offset + piece.len() as u64 > self.last {
            let from = (self.last.saturating_sub(offset) as usize).min(piece.len());
            if let Some(i) = piece[from..].iter().position(|b| *b == b'\n') {
                return (&piece[..from + i + 1], true);
            }
        }
        (piece, false)
    }
}

/// Arrow's CSV or JSON decoder for records of one format and schema. An empty CSV field of a
/// string column is an empty string, as S3 Select has it, unless the format says
/// `empty_is_null` (Arrow's decoder reads every empty field as a null).
pub enum Decoder {
    /// With whether empty strings stay nulls.
    Csv(Box<datafusion::arrow::csv::reader::Decoder>, QuotedLines, bool),
    /// With a [`JsonLines`] check for one record per line; without, JSON documents as they come.
    Json(datafusion::arrow::json::reader::Decoder, Option<JsonLines>),
}

/// Refuses a CSV line break inside a quoted field. Records are split at every line break (S3
/// Select without `AllowQuotedRecordDelimiter` has it so), while Arrow's decoder would read one
/// inside quotes as part of the field: the answer would then depend on where chunks end. So
/// every byte passes this check, which follows the CSV parser's (csv-core's) rules for quotes:
/// a quote opens a quoted field only at a field's start (elsewhere it is a plain byte); inside,
/// a doubled quote (or the escape byte and the next) is a literal; after the closing quote the
/// field goes on unquoted. Such an object is an error wherever the line break lies.
#[derive(Debug)]
pub struct QuotedLines {
    delimiter: u8,
    quote: u8,
    escape: Option<u8>,
    comment: Option<u8>,
    state: CsvState,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CsvState {
    LineStart,
    Comment,
    FieldStart,
    Unquoted,
    Quoted,
    /// A quote inside a quoted field: the field's end, or the first of a doubled quote.
    QuoteInQuoted,
    /// The escape byte inside a quoted field: the next byte is literal.
    Escaped,
}

impl QuotedLines {
    fn new(csv: &CsvFormat) -> Self {
        let escape = csv.escape.filter(|e| *e != csv.quote);
        Self { delimiter: csv.delimiter, quote: csv.quote, escape, comment: csv.comment, state: CsvState::LineStart }
    }

    fn check(&mut self, bytes: &[u8]) -> Result<(), ArrowError> {
        use CsvState::*;
        for &b in bytes {
            if self.state == LineStart {
                self.state = if self.comment == Some(b) { Comment } else { FieldStart };
            }
            self.state = match (self.state, b) {
                (Quoted | Escaped, b'\n') => {
                    return Err(ArrowError::CsvError(
                        "a quoted field holds a line break (records end at every line break; \
                         AllowQuotedRecordDelimiter is not supported)"
                            .into(),
                    ));
                }
                (_, b'\n') => LineStart,
                (Comment, _) => Comment,
                (Escaped, _) => Quoted,
                (Quoted, b) if self.escape == Some(b) => Escaped,
                (Quoted, b) if b == self.quote => QuoteInQuoted,
                (Quoted, _) => Quoted,
                (QuoteInQuoted, b) if b == self.quote => Quoted,
                (FieldStart, b) if b == self.quote => Quoted,
                (FieldStart | Unquoted | QuoteInQuoted, b) if b == self.delimiter => FieldStart,
                (FieldStart | Unquoted | QuoteInQuoted, _) => Unquoted,
                (LineStart, _) => unreachable!("a line's first byte was read above"),
            };
        }
        Ok(())
    }
}

/// Refuses a JSON record that is not on one line: a line break inside a string, or inside an
/// object or array. JSON LINES input is split at every line break, while Arrow's decoder would
/// read on across one: the answer would depend on where chunks end.
#[derive(Debug, Default)]
pub struct JsonLines {
    in_string: bool,
    escaped: bool,
    depth: u32,
}

impl JsonLines {
    fn check(&mut self, bytes: &[u8]) -> Result<(), ArrowError> {
        for &b in bytes {
            if self.in_string {
                match b {
                    b'\n' => {
                        return Err(ArrowError::JsonError("a JSON string holds a line break".into()));
                    }
                    _ if self.escaped => self.escaped = false,
                    b'\\' => self.escaped = true,
                    b'"' => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => self.depth = self.depth.saturating_sub(1),
                b'\n' if self.depth > 0 => {
                    return Err(ArrowError::JsonError(
                        "a JSON record spans lines (JSON LINES input is one record per line; \
                         a document written over several lines is Type DOCUMENT)"
                            .into(),
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Decoder::Csv(..) => "Decoder::Csv",
            Decoder::Json(..) => "Decoder::Json",
        })
    }
}

impl Decoder {
    /// A decoder of `format` into `schema`; `at_start` when the bytes it gets begin at the
    /// object's first line (a CSV header there is skipped).
    pub fn new(format: &RecordFormat, schema: &SchemaRef, at_start: bool) -> Result<Self, ArrowError> {
        match format {
            RecordFormat::Csv(csv) => {
                let mut builder = datafusion::arrow::csv::ReaderBuilder::new(Arc::clone(schema))
                    .with_header(at_start && csv.header)
                    .with_delimiter(csv.delimiter)
                    .with_quote(csv.quote)
                    .with_batch_size(BATCH_ROWS);
                if let Some(escape) = csv.escape {
                    builder = builder.with_escape(escape);
                }
                if let Some(comment) = csv.comment {
                    builder = builder.with_comment(comment);
                }
                Ok(Decoder::Csv(Box::new(builder.build_decoder()), QuotedLines::new(csv), csv.empty_is_null))
            }
            RecordFormat::JsonLines => Self::json(schema, Some(JsonLines::default())),
        }
    }

    /// A decoder of JSON documents as they come (one or more per line, or over several lines):
    /// for input read whole, never split (S3 Select's JSON Type DOCUMENT).
    pub fn json_documents(schema: &SchemaRef) -> Result<Self, ArrowError> {
        Self::json(schema, None)
    }

    fn json(schema: &SchemaRef, lines: Option<JsonLines>) -> Result<Self, ArrowError> {
        // A string column takes numbers and booleans as their text (inference types a column
        // of mixed values, or of no values in the sample, as a string).
        let decoder = datafusion::arrow::json::ReaderBuilder::new(Arc::clone(schema))
            .with_batch_size(BATCH_ROWS)
            .with_coerce_primitive(true)
            .build_decoder()?;
        Ok(Decoder::Json(decoder, lines))
    }

    /// Takes bytes up to a full batch; how many it took.
    fn decode(&mut self, buf: &[u8]) -> Result<usize, ArrowError> {
        match self {
            Decoder::Csv(d, ..) => d.decode(buf),
            Decoder::Json(d, _) => d.decode(buf),
        }
    }

    /// The records decoded so far, if any.
    fn flush(&mut self) -> Result<Option<RecordBatch>, ArrowError> {
        match self {
            Decoder::Csv(d, _, true) => d.flush(),
            Decoder::Csv(d, _, false) => d.flush()?.map(empty_not_null).transpose(),
            Decoder::Json(d, _) => d.flush(),
        }
    }

    /// Decodes all of `bytes`, handing each full batch to `out`; with `end`, the records end
    /// there and the last batch is handed on too.
    pub fn feed(
        &mut self,
        mut bytes: &[u8],
        end: bool,
        out: &mut dyn FnMut(RecordBatch) -> Result<(), ArrowError>,
    ) -> Result<(), ArrowError> {
        match self {
            Decoder::Csv(_, quoted, _) => quoted.check(bytes)?,
            Decoder::Json(_, Some(lines)) => lines.check(bytes)?,
            Decoder::Json(_, None) => {}
        }
        while !bytes.is_empty() {
            let used = self.decode(bytes)?;
            bytes = &bytes[used..];
            // The decoder stopped short: its batch is full.
            if !bytes.is_empty()
                && let Some(batch) = self.flush()?
            {
                out(batch)?;
            }
        }
        if end {
            self.decode(&[])?;
            if let Some(batch) = self.flush()? {
                out(batch)?;
            }
        }
        Ok(())
    }
}

/// A CSV batch whose empty fields are empty strings.
fn empty_not_null(batch: RecordBatch) -> Result<RecordBatch, ArrowError> {
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

/// The splits of `objects` as one table of `schema`: `partitions` streams, each reading its
/// share of the splits (round robin) one after another.
pub(crate) fn table(
    schema: SchemaRef,
    format: RecordFormat,
    objects: Vec<SplitObject>,
    source: Arc<dyn ByteSource>,
    partitions: usize,
) -> Result<StreamingTable, Error> {
    let objects = Arc::new(objects);
    let partitions = partitions.max(1);
    let mut work: Vec<Vec<(usize, RecordSplit)>> = vec![Vec::new(); partitions];
    let mut next = 0;
    for (idx, object) in objects.iter().enumerate() {
        for split in &object.splits {
            if split.first > split.last || split.last >= object.size {
                return Err(Error::BadQuery(format!(
                    "{}: split {}..={} is not inside its {} bytes",
                    object.name, split.first, split.last, object.size
                )));
            }
            work[next % partitions].push((idx, *split));
            next += 1;
        }
    }
    let streams: Vec<Arc<dyn PartitionStream>> = work
        .into_iter()
        .filter(|w| !w.is_empty())
        .map(|work| {
            Arc::new(SplitStream {
                schema: Arc::clone(&schema),
                format: format.clone(),
                objects: Arc::clone(&objects),
                source: Arc::clone(&source),
                work,
            }) as Arc<dyn PartitionStream>
        })
        .collect();
    // No splits at all: a table with no partitions answers nothing, in the right shape.
    StreamingTable::try_new(schema, streams).map_err(Error::from_datafusion)
}

/// Splits decoded one after another by a task of their own.
#[derive(Debug)]
struct SplitStream {
    schema: SchemaRef,
    format: RecordFormat,
    objects: Arc<Vec<SplitObject>>,
    source: Arc<dyn ByteSource>,
    work: Vec<(usize, RecordSplit)>,
}

type BatchSender = tokio::sync::mpsc::Sender<Result<RecordBatch, DataFusionError>>;

/// Aborts its task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl PartitionStream for SplitStream {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let (tx, mut rx) = tokio::sync::mpsc::channel(BATCHES_AHEAD);
        let (schema, format, objects, source) =
            (Arc::clone(&self.schema), self.format.clone(), Arc::clone(&self.objects), Arc::clone(&self.source));
        let work = self.work.clone();
        let task = tokio::spawn(async move {
            let splits = async {
                for (idx, split) in work {
                    match read_split(&objects[idx], idx, split, &schema, &format, &source, &tx).await {
                        Ok(()) => {}
                        // The engine went away (a limit reached, the query dropped).
                        Err(None) => return,
                        Err(Some(error)) => {
                            let _ = tx.send(Err(error)).await;
                            return;
                        }
                    }
                }
            };
            // A panic (a decoder's bug) fails the scan; it never ends it as if the records had.
            if futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(splits)).await.is_err() {
                let _ = tx.send(Err(DataFusionError::Internal("the record decoder failed".into()))).await;
            }
        });
        // Dropping the stream stops the task: no reads for a query that is gone.
        let guard = AbortOnDrop(task);
        let stream = futures_util::stream::poll_fn(move |cx| {
            let _ = &guard;
            rx.poll_recv(cx)
        });
        Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&self.schema), stream))
    }
}

/// Decodes one split's records into batches sent to `tx`. `Err(None)`: the receiver went away.
async fn read_split(
    object: &SplitObject,
    idx: usize,
    split: RecordSplit,
    schema: &SchemaRef,
    format: &RecordFormat,
    source: &Arc<dyn ByteSource>,
    tx: &BatchSender,
) -> Result<(), Option<DataFusionError>> {
    let name = &object.name;
    let bad = |e: ArrowError| Some(DataFusionError::ArrowError(Box::new(bad_records(name, e)), None));
    let mut decoder = Decoder::new(format, schema, split.first == 0).map_err(bad)?;
    let mut cut = RangeCut::new(split.first, split.last);
    let mut at = RangeCut::start(split.first);
    let size = object.size;
    // The split itself is read a window at a time, the next window while this one decodes;
    // past it, a step at a time until the last record ends.
    let window = |from: u64| (from < split.last).then(|| from..(from + WINDOW_BYTES).min(split.last));
    let fetch = |range: std::ops::Range<u64>| tokio::spawn(source.read(idx, range));
    let mut ahead = window(at).map(|range| (range.end, fetch(range)));
    loop {
        let (end, bytes) = match ahead.take() {
            Some((end, task)) => {
                let bytes = task.await.map_err(|e| Some(DataFusionError::External(Box::new(e))))?;
                ahead = window(end).map(|range| (range.end, fetch(range)));
                (end, bytes)
            }
            None if at >= size => {
                // The object ends: so does its last record.
                return feed(&mut decoder, &[], true, tx).await.map_err(|e| e.map(bad_arrow(name)));
            }
            None => {
                if at - split.last > RECORD_BYTES_MAX {
                    return Err(bad(ArrowError::ParseError(format!(
                        "the record at byte {} runs more than {RECORD_BYTES_MAX} bytes past it without a line \
                         break (records are at most 1 MiB)",
                        split.last
                    ))));
                }
                let end = (at + TAIL_STEP_BYTES).min(size);
                (end, source.read(idx, at..end).await)
            }
        };
        let bytes: Bytes =
            bytes.map_err(|e| Some(DataFusionError::Execution(format!("{UNAVAILABLE_MARK} {name}: {e}"))))?;
        if bytes.len() as u64 != end - at {
            return Err(Some(DataFusionError::Execution(format!(
                "{UNAVAILABLE_MARK} {name}: a read of bytes {at}..{end} returned {}",
                bytes.len()
            ))));
        }
        at = end;
        let (piece, done) = cut.apply(&bytes);
        feed(&mut decoder, piece, done || at >= size, tx).await.map_err(|e| e.map(bad_arrow(name)))?;
        if done || at >= size {
            return Ok(());
        }
    }
}

fn bad_records(name: &str, error: ArrowError) -> ArrowError {
    match error {
        ArrowError::CsvError(text) => ArrowError::CsvError(format!("{name}: {text}")),
        ArrowError::JsonError(text) => ArrowError::JsonError(format!("{name}: {text}")),
        ArrowError::ParseError(text) => ArrowError::ParseError(format!("{name}: {text}")),
        // Not the data's fault (memory, a bug): the engine's error.
        other => ArrowError::ExternalError(Box::new(std::io::Error::other(format!("{name}: {other}")))),
    }
}

fn bad_arrow(name: &str) -> impl Fn(ArrowError) -> DataFusionError + '_ {
    move |e| DataFusionError::ArrowError(Box::new(bad_records(name, e)), None)
}

/// Feeds `bytes` to `decoder` and sends the batches. `Err(None)`: the receiver went away.
async fn feed(decoder: &mut Decoder, bytes: &[u8], end: bool, tx: &BatchSender) -> Result<(), Option<ArrowError>> {
    let mut batches = Vec::new();
    decoder
        .feed(bytes, end, &mut |batch| {
            batches.push(batch);
            Ok(())
        })
        .map_err(Some)?;
    for batch in batches {
        tx.send(Ok(batch)).await.map_err(|_| None)?;
    }
    Ok(())
}
