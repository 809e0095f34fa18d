//! The one `tessera` binary: cluster tooling (`init`, `up`, `node`, `gateway`), object commands through the
//! smart client (`mb`, `rb`, `put`, `get`, `ls`, `rm`, `stat`), `status`, `query` and `bench`.
//!
//! Only this crate prints to the terminal, reads environment variables or exits the process.

mod bench;
mod cluster_cmd;
mod drive_cmd;
mod key_cmd;
mod local_ca;
mod map_cmd;
mod metrics_http;
mod object_cmd;
mod pool_cmd;
mod pool_move;
mod query_cmd;
mod relayout_cmd;
mod repair_cmd;
mod s3_load;
mod size;
mod status_cmd;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Tessera: an erasure-coded, S3-compatible object store with one-hop smart clients.
#[derive(Debug, Parser)]
#[command(name = "tessera", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Where the cluster map comes from, for commands that act as a client.
#[derive(Debug, clap::Args)]
pub(crate) struct ConfigArg {
    /// Path of cluster.toml [env: TESSERA_CONFIG]
    #[arg(long, global = true, env = "TESSERA_CONFIG", hide_env = true)]
    pub(crate) config: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Write DIR/cluster.toml and prepare the drives of a new local cluster.
    Init(cluster_cmd::InitArgs),
    /// Run a local cluster (init if needed, then every node and the S3 gateway) until Ctrl-C.
    Up(cluster_cmd::UpArgs),
    /// Run one storage node in the foreground.
    Node(cluster_cmd::NodeArgs),
    /// Run the S3 gateway in the foreground (credentials from TESSERA_ACCESS_KEY/TESSERA_SECRET_KEY).
    Gateway(cluster_cmd::GatewayArgs),
    /// Create a bucket.
    Mb(object_cmd::BucketArgs),
    /// Remove an empty bucket.
    Rb(object_cmd::BucketArgs),
    /// Upload FILE (or - for stdin) as BUCKET/KEY.
    Put(object_cmd::PutArgs),
    /// Download BUCKET/KEY into FILE (or - for stdout).
    Get(object_cmd::GetArgs),
    /// List buckets, or the objects of BUCKET[/PREFIX].
    Ls(object_cmd::LsArgs),
    /// Delete BUCKET/KEY.
    Rm(object_cmd::ObjectArgs),
    /// Show size, etag, erasure layout and chunk locations of BUCKET/KEY.
    Stat(object_cmd::ObjectArgs),
    /// Measure GET or PUT throughput and latency with the smart client.
    Bench(bench::BenchArgs),
    /// The running cluster at a glance: nodes, drives, erasure sets and their health, repair.
    /// Exits non-zero when anything is down.
    Status(status_cmd::StatusArgs),
    /// Background repair on the running cluster: status, pause, resume, rate.
    Repair(repair_cmd::RepairArgs),
    /// Drives: prepare a new node's drives on its host, or replace (wipe and rebuild) one.
    Drive(drive_cmd::DriveArgs),
    /// The cluster map on the running cluster: which version each node holds; push a change.
    Map(map_cmd::MapArgs),
    /// Storage pools: add a pool of new nodes to grow the cluster; free space per pool.
    Pool(pool_cmd::PoolArgs),
    /// Run SQL over Parquet objects, with filters and projections evaluated on the storage nodes.
    Query(query_cmd::QueryArgs),
    /// Store the Parquet objects of BUCKET[/PREFIX] in the aligned layout (each row group inside
    /// one chunk, so queries read it on one node), at a paced rate; objects stay readable.
    Relayout(relayout_cmd::RelayoutArgs),
    /// Issue a TLS server certificate (for `tessera gateway --tls-cert/--tls-key`) from a local
    /// CA, made in DIR if it has none.
    TlsCert(local_ca::TlsCertArgs),
    /// Scoped S3 access keys: create (some buckets or all, read-only or read-write), list,
    /// revoke. Every gateway of the cluster honours them.
    Key(key_cmd::KeyArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // `--help` and `--version` print to stdout and succeed.
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("error: {}", argument_error(&e.to_string()));
            return ExitCode::from(2);
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            if is_broken_pipe(&err) {
                return ExitCode::SUCCESS;
            }
            eprintln!("error: {}", one_line(&err));
            ExitCode::FAILURE
        }
    }
}

/// clap's rendered argument error on one line: its message, its tips and the usage line
/// (`error: unexpected argument '-5' found; tip: to pass '-5' as a value, use '-- -5' (usage:
/// tessera repair rate <RATE>; see --help)`), without clap's `error: `, colours and layout.
fn argument_error(rendered: &str) -> String {
    let plain = strip_ansi(rendered);
    let text = plain.trim_start().strip_prefix("error:").unwrap_or(&plain).trim_start();
    let flat = |paragraph: &str| -> String {
        paragraph.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ")
    };
    let mut paragraphs = text.split("\n\n").map(str::trim).filter(|p| !p.is_empty());
    let mut line = paragraphs.next().map(flat).unwrap_or_default();
    let mut usage = None;
    for paragraph in paragraphs {
        if let Some(rest) = paragraph.strip_prefix("Usage:") {
            usage = rest.lines().next().map(|u| u.trim().to_owned());
        } else if paragraph.starts_with("tip:") {
            line.push_str("; ");
            line.push_str(&flat(paragraph));
        }
    }
    match usage {
        Some(usage) => format!("{line} (usage: {usage}; see --help)"),
        None => format!("{line} (see --help)"),
    }
}

/// `text` without ANSI escape sequences (`ESC [ ... letter`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            for next in chars.by_ref() {
                if next.is_ascii_alphabetic() {
                    break;
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// The error and its causes on one line, `outer: inner`. Library errors often name their cause
/// in their own message as well; a cause already spelled out is not repeated.
fn one_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line.replace('\n', " ")
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain()
        .any(|cause| cause.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe))
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Init(args) => cluster_cmd::init(&args),
        Command::Up(args) => cluster_cmd::up(&args),
        Command::Node(args) => cluster_cmd::node(&args),
        Command::Gateway(args) => cluster_cmd::gateway(&args),
        Command::Mb(args) => object_cmd::run(object_cmd::Op::MakeBucket(args)),
        Command::Rb(args) => object_cmd::run(object_cmd::Op::RemoveBucket(args)),
        Command::Put(args) => object_cmd::run(object_cmd::Op::Put(args)),
        Command::Get(args) => object_cmd::run(object_cmd::Op::Get(args)),
        Command::Ls(args) => object_cmd::run(object_cmd::Op::List(args)),
        Command::Rm(args) => object_cmd::run(object_cmd::Op::Remove(args)),
        Command::Stat(args) => object_cmd::run(object_cmd::Op::Stat(args)),
        Command::Bench(args) => bench::run(&args),
        Command::Status(args) => status_cmd::run(&args),
        Command::Key(args) => key_cmd::run(&args),
        Command::Repair(args) => repair_cmd::run(&args),
        Command::Drive(args) => drive_cmd::run(&args),
        Command::Map(args) => map_cmd::run(&args),
        Command::Pool(args) => pool_cmd::run(&args),
        Command::Query(args) => query_cmd::run(&args),
        Command::Relayout(args) => relayout_cmd::run(&args),
        Command::TlsCert(args) => local_ca::tls_cert(&args),
    }
}

/// Logs go to stderr, coloured only when it is a terminal and `NO_COLOR` is unset (a log
/// written to a file or a pipe carries no escape codes); `TESSERA_LOG` (e.g. `debug`,
/// `client=debug`) overrides `default`.
pub(crate) fn init_logging(default: &str) {
    init_logging_quieting(default, &[]);
}

/// Like [`init_logging`], and turns off the log targets in `quiet` unless `TESSERA_LOG` names
/// them (s3s logs every S3 error response, a 404 included, at ERROR).
pub(crate) fn init_logging_quieting(default: &str, quiet: &[&str]) {
    let mut directives = std::env::var("TESSERA_LOG").unwrap_or_else(|_| default.to_owned());
    for target in quiet {
        if !directives.contains(target) {
            directives.push_str(&format!(",{target}=off"));
        }
    }
    let filter = tracing_subscriber::EnvFilter::try_new(&directives)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr()) && std::env::var_os("NO_COLOR").is_none();
    let subscriber =
        tracing_subscriber::fmt().with_env_filter(filter).with_ansi(colour).with_writer(std::io::stderr).finish();
    // A second call (never made) would fail harmlessly; logging is set up once per process.
    let _ = tracing::subscriber::set_global_default(subscriber);
}
