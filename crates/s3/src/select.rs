//! `SelectObjectContent` (S3 Select): the request's settings checked and turned into a
//! `query::select`, whose records go back in the binary event stream (Records, Progress when
//! asked for, Stats, End; errors mid-stream as error events). Parquet objects are scanned on the
//! nodes; CSV and JSON input may be gzip or bzip2 compressed, and uncompressed input may name a
//! `ScanRange`.

use std::sync::Arc;

use futures_util::StreamExt;
use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Request, S3Response, S3Result};

use query::select::{Compression, CsvInput, HeaderInfo, JsonType, ScanRange, SelectInput, SelectOutput, SelectSource};

use crate::error::s3_error;

/// Bytes of records one Records event carries at most (results are cut to fit).
const RECORDS_EVENT_BYTES: usize = 1 << 20;
/// Memory the gateway's engine may use for one select (aggregates, sorts); past it the select
/// fails (it never spills to the gateway's disk).
const SELECT_MEMORY_BYTES: usize = 64 << 20;
/// Selects one gateway runs at once; one more is answered 503 SlowDown. With
/// [`SELECT_MEMORY_BYTES`] each, selects hold at most 256 MiB of a gateway's memory.
const SELECTS_MAX: usize = 4;
/// The permits of [`SELECTS_MAX`]: a select holds one until its event stream ends or is dropped.
static SELECTS_RUNNING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(SELECTS_MAX);

fn invalid(code: &str, message: impl Into<String>) -> S3Error {
    let mut error = S3Error::with_message(S3ErrorCode::Custom(code.to_owned().into()), message.into());
    error.set_status_code(hyper::StatusCode::BAD_REQUEST);
    error
}

/// The one-byte setting `what` (a delimiter, a quote), `default` when absent.
fn one_byte(value: Option<&String>, default: u8, what: &str) -> S3Result<u8> {
    match value.map(String::as_bytes) {
        None | Some(b"") => Ok(default),
        Some([byte]) => Ok(*byte),
        Some(_) => Err(invalid("InvalidRequest", format!("{what} must be a single character"))),
    }
}

fn compression_of(serialization: &InputSerialization) -> S3Result<Compression> {
    let Some(compression) = &serialization.compression_type else {
        return Ok(Compression::None);
    };
    match compression.as_str().to_ascii_uppercase().as_str() {
        "NONE" => Ok(Compression::None),
        "GZIP" => Ok(Compression::Gzip),
        "BZIP2" => Ok(Compression::Bzip2),
        other => {
            Err(invalid("InvalidCompressionFormat", format!("CompressionType {other} is not NONE, GZIP or BZIP2")))
        }
    }
}

/// The `QuoteEscapeCharacter` setting: `None` when absent or the quote itself (a doubled quote
/// is a quote, as in RFC 4180).
fn escape_of(value: Option<&String>, quote: u8) -> S3Result<Option<u8>> {
    let escape = one_byte(value, quote, "QuoteEscapeCharacter")?;
    Ok((escape != quote).then_some(escape))
}

fn scan_range_of(range: &s3s::dto::ScanRange) -> S3Result<ScanRange> {
    let bound = |value: Option<i64>, what: &str| {
        value
            .map(|v| u64::try_from(v).map_err(|_| invalid("InvalidRequest", format!("ScanRange {what} is negative"))))
            .transpose()
    };
    let start = bound(range.start, "Start")?;
    let end = bound(range.end, "End")?;
    if let (Some(start), Some(end)) = (start, end)
        && end < start
    {
        return Err(invalid("InvalidRequest", "ScanRange End is before its Start"));
    }
    if start.is_none() && end.is_none() {
        return Err(invalid("InvalidRequest", "ScanRange needs a Start or an End"));
    }
    Ok(ScanRange { start, end })
}

fn input_of(serialization: &InputSerialization) -> S3Result<SelectInput> {
    match (&serialization.csv, &serialization.json, &serialization.parquet) {
        (Some(csv), None, None) => {
            let header = match csv.file_header_info.as_ref().map(|h| h.as_str().to_ascii_uppercase()) {
                None => HeaderInfo::None,
                Some(h) if h == "NONE" => HeaderInfo::None,
                Some(h) if h == "IGNORE" => HeaderInfo::Ignore,
                Some(h) if h == "USE" => HeaderInfo::Use,
                Some(h) => {
                    return Err(invalid(
                        "InvalidFileHeaderInfo",
                        format!("FileHeaderInfo {h} is not NONE, IGNORE or USE"),
                    ));
                }
            };
            if csv.record_delimiter.as_deref().is_some_and(|d| d != "\n" && d != "\r\n") {
                return Err(invalid("InvalidRequest", "CSV input records must end with \\n or \\r\\n"));
            }
            if csv.allow_quoted_record_delimiter.is_some_and(|allow| allow) {
                return Err(S3Error::with_message(
                    S3ErrorCode::NotImplemented,
                    "AllowQuotedRecordDelimiter is not supported yet",
                ));
            }
            let comment = match csv.comments.as_deref() {
                None | Some("") => None,
                Some(c) if c.len() == 1 => Some(c.as_bytes()[0]),
                Some(_) => return Err(invalid("InvalidRequest", "Comments must be a single character")),
            };
            let quote = one_byte(csv.quote_character.as_ref(), b'"', "QuoteCharacter")?;
            Ok(SelectInput::Csv(CsvInput {
                header,
                delimiter: one_byte(csv.field_delimiter.as_ref(), b',', "FieldDelimiter")?,
                quote,
                comment,
                escape: escape_of(csv.quote_escape_character.as_ref(), quote)?,
            }))
        }
        (None, Some(json), None) => {
            // LINES: one record per line (split over the nodes); DOCUMENT (S3's default): records
            // as they come, read whole.
            let lines = json.type_.as_ref().is_some_and(|t| t.as_str().eq_ignore_ascii_case("LINES"));
            Ok(SelectInput::Json(if lines { JsonType::Lines } else { JsonType::Document }))
        }
        (None, None, Some(_)) => Ok(SelectInput::Parquet),
        _ => Err(invalid("InvalidRequest", "InputSerialization needs exactly one of CSV, JSON and Parquet")),
    }
}

fn output_of(serialization: &OutputSerialization) -> S3Result<SelectOutput> {
    match (&serialization.csv, &serialization.json) {
        (Some(csv), None) => {
            if csv.record_delimiter.as_deref().is_some_and(|d| d != "\n") {
                return Err(invalid("InvalidRequest", "CSV output records end with \\n only"));
            }
            let always_quote = csv.quote_fields.as_ref().is_some_and(|q| q.as_str().eq_ignore_ascii_case("ALWAYS"));
            let quote = one_byte(csv.quote_character.as_ref(), b'"', "QuoteCharacter")?;
            Ok(SelectOutput::Csv {
                delimiter: one_byte(csv.field_delimiter.as_ref(), b',', "FieldDelimiter")?,
                quote,
                always_quote,
                escape: escape_of(csv.quote_escape_character.as_ref(), quote)?,
            })
        }
        (None, Some(json)) => {
            if json.record_delimiter.as_deref().is_some_and(|d| d != "\n") {
                return Err(invalid("InvalidRequest", "JSON output records end with \\n only"));
            }
            Ok(SelectOutput::Json)
        }
        _ => Err(invalid("InvalidRequest", "OutputSerialization needs exactly one of CSV and JSON")),
    }
}

fn query_error(error: query::Error) -> S3Error {
    match error {
        query::Error::Client(e) => s3_error(e),
        query::Error::BadQuery(message) => {
            let code = if message.contains(query::select::NOT_COMPRESSED_AS_DESCRIBED) {
                "InvalidCompressionFormat"
            } else if message.contains("SQL error") || message.contains("ParserError") {
                "ParseUnexpectedToken"
            } else if message.contains("Cast error") {
                "CastFailed"
            } else if message.contains("only") || message.contains("FROM S3Object") {
                "UnsupportedSyntax"
            } else {
                "InvalidQuery"
            };
            invalid(code, message)
        }
        query::Error::Engine(message) => {
            tracing::warn!("select failed: {message}");
            S3Error::with_message(S3ErrorCode::InternalError, message)
        }
    }
}

pub(crate) async fn select_object_content(
    client: &client::Client,
    req: S3Request<SelectObjectContentInput>,
) -> S3Result<S3Response<SelectObjectContentOutput>> {
    let input = &req.input;
    let request = &input.request;
    if !request.expression_type.as_str().eq_ignore_ascii_case("SQL") {
        return Err(invalid("InvalidExpressionType", "ExpressionType must be SQL"));
    }
    let source = SelectSource {
        bucket: input.bucket.clone(),
        key: input.key.clone(),
        input: input_of(&request.input_serialization)?,
        compression: compression_of(&request.input_serialization)?,
        scan_range: request.scan_range.as_ref().map(scan_range_of).transpose()?,
    };
    if matches!(source.input, SelectInput::Parquet) && source.compression != Compression::None {
        return Err(invalid(
            "InvalidRequest",
            "a Parquet object takes CompressionType NONE (its pages are compressed)",
        ));
    }
    // A JSON DOCUMENT's records may span lines, so a byte range cannot cut it into records.
    let json_document = matches!(source.input, SelectInput::Json(JsonType::Document));
    if source.scan_range.is_some()
        && (source.compression != Compression::None || !source.input.is_records() || json_document)
    {
        return Err(invalid("InvalidRequest", "ScanRange applies to uncompressed CSV and JSON LINES input only"));
    }
    let output = output_of(&request.output_serialization)?;
    let progress = request.request_progress.as_ref().and_then(|p| p.enabled).unwrap_or(false);
    let Ok(permit) = SELECTS_RUNNING.try_acquire() else {
        return Err(S3Error::with_message(
            S3ErrorCode::SlowDown,
            format!("this gateway runs {SELECTS_MAX} S3 Select requests at once; retry later"),
        ));
    };
    let mut options = query::QueryOptions::default();
    options.limits.memory_bytes = SELECT_MEMORY_BYTES;
    let selection =
        query::select::select(client, &source, &request.expression, &output, &options).await.map_err(query_error)?;
    let returned = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counts = Counts { scanned: selection.scanned.clone(), returned: Arc::clone(&returned) };
    let progress_counts = counts.clone();
    let records = selection.records.flat_map(move |piece| {
        let mut events: Vec<S3Result<SelectObjectContentEvent>> = match piece {
            Ok(bytes) => {
                returned.fetch_add(bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
                (0..bytes.len())
                    .step_by(RECORDS_EVENT_BYTES)
                    .map(|at| {
                        let end = (at + RECORDS_EVENT_BYTES).min(bytes.len());
                        Ok(SelectObjectContentEvent::Records(RecordsEvent { payload: Some(bytes.slice(at..end)) }))
                    })
                    .collect()
            }
            Err(e) => vec![Err(query_error(e))],
        };
        // With RequestProgress, a Progress event follows each piece of records.
        if progress && events.last().is_some_and(Result::is_ok) {
            let details = progress_counts.progress();
            events.push(Ok(SelectObjectContentEvent::Progress(ProgressEvent { details: Some(details) })));
        }
        futures_util::stream::iter(events)
    });
    let tail = futures_util::stream::once(async move {
        let Progress { bytes_scanned, bytes_processed, bytes_returned } = counts.progress();
        let details = Stats { bytes_scanned, bytes_processed, bytes_returned };
        futures_util::stream::iter(vec![
            Ok(SelectObjectContentEvent::Stats(StatsEvent { details: Some(details) })),
            Ok(SelectObjectContentEvent::End(EndEvent {})),
        ])
    })
    .flatten();
    // An error event ends the stream: nothing (no Stats, no End) follows it.
    let mut failed = false;
    let events = records.chain(tail).take_while(move |event| {
        // The select's permit lives as long as its stream.
        let _running = &permit;
        let go = !failed;
        failed |= event.is_err();
        futures_util::future::ready(go)
    });
    let output =
        SelectObjectContentOutput { payload: Some(SelectObjectContentEventStream::new(SyncStream::new(events))) };
    Ok(S3Response::new(output))
}

/// What a select has read and returned so far.
#[derive(Clone)]
struct Counts {
    scanned: query::select::ScannedBytes,
    returned: Arc<std::sync::atomic::AtomicU64>,
}

impl Counts {
    fn progress(&self) -> Progress {
        let count = |bytes: u64| i64::try_from(bytes).ok();
        Progress {
            bytes_scanned: count(self.scanned.total()),
            bytes_processed: count(self.scanned.processed()),
            bytes_returned: count(self.returned.load(std::sync::atomic::Ordering::Relaxed)),
        }
    }
}

/// s3s wants a `Sync` stream; the query's stream is only `Send`. The stream is polled by one
/// task at a time, behind this mutex.
struct SyncStream<S> {
    inner: std::sync::Mutex<std::pin::Pin<Box<S>>>,
}

impl<S> SyncStream<S> {
    fn new(inner: S) -> Self {
        Self { inner: std::sync::Mutex::new(Box::pin(inner)) }
    }
}

impl<S: futures_util::Stream> futures_util::Stream for SyncStream<S> {
    type Item = S::Item;

    fn poll_next(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<S::Item>> {
        let this = self.get_mut();
        this.inner.get_mut().unwrap_or_else(|p| p.into_inner()).as_mut().poll_next(cx)
    }
}
