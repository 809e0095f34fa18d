//! `tessera query "SQL"`: SQL over Parquet, CSV and JSON-lines objects, filters and projections evaluated on the
//! storage nodes (the `query` crate), results printed as a table, CSV, JSON lines or an Arrow
//! IPC stream.

use std::io::Write;
use std::sync::atomic::Ordering;

use anyhow::bail;
use futures_util::StreamExt;
use query::arrow::array::RecordBatch;
use query::arrow::util::pretty::pretty_format_batches;

use crate::ConfigArg;

#[derive(Debug, clap::Args)]
pub(crate) struct QueryArgs {
    /// The query. Tables are quoted paths: 'bucket/key.parquet' (one object) or
    /// 'bucket/prefix/' (all objects under the prefix, one table). A table's objects are all
    /// Parquet, all CSV with a header line (.csv, .tsv) or all JSON lines (.json, .jsonl,
    /// .ndjson).
    sql: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Evaluate everything in this client instead of on the nodes (same answer, every byte
    /// over the network: a baseline).
    #[arg(long)]
    no_pushdown: bool,
    /// Memory the client's engine may use for merging, aggregating and sorting (bytes).
    #[arg(long, default_value_t = 512 << 20)]
    memory: usize,
    /// After the results, print on stderr what the query moved.
    #[arg(long)]
    stats: bool,
    #[command(flatten)]
    config: ConfigArg,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    /// An aligned text table (at most TABLE_ROWS_MAX rows: use csv for more).
    Table,
    Csv,
    /// JSON lines: one object per row.
    Json,
    /// An Arrow IPC stream (binary), for pyarrow.ipc.open_stream and friends.
    Arrow,
}

/// Rows the table format holds in memory to align its columns.
const TABLE_ROWS_MAX: usize = 100_000;

pub(crate) fn run(args: &QueryArgs) -> anyhow::Result<()> {
    crate::init_logging("warn");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let client = crate::object_cmd::connect(&args.config)?;
        let mut options = query::QueryOptions { pushdown: !args.no_pushdown, ..Default::default() };
        options.limits.memory_bytes = args.memory;
        let mut started = query::start(&client, &args.sql, &options).await?;
        let stdout = std::io::stdout();
        let mut out = std::io::BufWriter::new(stdout.lock());
        let mut table: Vec<RecordBatch> = Vec::new();
        let mut table_rows = 0;
        let pending = Pending::default();
        let mut csv =
            (args.format == Format::Csv).then(|| query::arrow::csv::WriterBuilder::new().with_header(true).build(pending.clone()));
        let mut json = (args.format == Format::Json).then(|| query::arrow::json::LineDelimitedWriter::new(Vec::new()));
        let mut ipc = match args.format {
            Format::Arrow => Some(query::arrow::ipc::writer::StreamWriter::try_new(Vec::new(), &started.schema)?),
            _ => None,
        };
        let mut rows = 0u64;
        while let Some(batch) = started.stream.next().await {
            let batch = batch.map_err(query::stream_error)?;
            rows += batch.num_rows() as u64;
            match args.format {
                Format::Table => {
                    table_rows += batch.num_rows();
                    if table_rows > TABLE_ROWS_MAX {
                        bail!("more than {TABLE_ROWS_MAX} rows: use --format csv, json or arrow");
                    }
                    table.push(batch);
                }
                Format::Csv => {
                    csv.as_mut().expect("csv format").write(&batch)?;
                    out.write_all(&pending.take())?;
                }
                Format::Json => {
                    let writer = json.as_mut().expect("json format");
                    writer.write(&batch)?;
                    out.write_all(&std::mem::take(writer.get_mut()))?;
                }
                Format::Arrow => {
                    let writer = ipc.as_mut().expect("arrow format");
                    writer.write(&batch)?;
                    out.write_all(&std::mem::take(writer.get_mut()))?;
                }
            }
        }
        match args.format {
            Format::Table => writeln!(out, "{}", pretty_format_batches(&table)?)?,
            Format::Json => {
                let mut writer = json.take().expect("json format");
                writer.finish()?;
                out.write_all(&writer.into_inner())?;
            }
            Format::Arrow => {
                let mut writer = ipc.take().expect("arrow format");
                writer.finish()?;
                out.write_all(&writer.into_inner()?)?;
            }
            Format::Csv => {}
        }
        out.flush()?;
        if args.stats {
            let c = &started.counters;
            eprintln!(
                "{rows} rows; {} node requests; {} result bytes from nodes; nodes read {} bytes ({} from peers); client read {} bytes for {} row groups; {} heartbeats",
                c.node_requests.load(Ordering::Relaxed),
                c.result_bytes.load(Ordering::Relaxed),
                c.node_read_bytes.load(Ordering::Relaxed),
                c.node_peer_bytes.load(Ordering::Relaxed),
                c.client_read_bytes.load(Ordering::Relaxed),
                c.client_row_groups.load(Ordering::Relaxed),
                c.heartbeats.load(Ordering::Relaxed),
            );
        }
        Ok(())
    })
}

/// Bytes a format writer produced and that have not gone to stdout yet.
#[derive(Clone, Debug, Default)]
struct Pending(std::rc::Rc<std::cell::RefCell<Vec<u8>>>);

impl Pending {
    fn take(&self) -> Vec<u8> {
        std::mem::take(&mut self.0.borrow_mut())
    }
}

impl Write for Pending {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
