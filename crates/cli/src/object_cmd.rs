//! Bucket and object commands through the smart client.

use std::io::{IsTerminal, Write as _};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use anyhow::{Context, bail};
use client::{Client, ClientOptions, PutOptions};
use indicatif::{ProgressBar, ProgressStyle};
use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};

use crate::ConfigArg;
use crate::size::{format_bytes, parse_bytes};

/// Objects smaller than this get no progress bar.
const PROGRESS_MIN_BYTES: u64 = 8 << 20;
/// Keys per listing request.
pub(crate) const LIST_PAGE: u32 = 1000;

#[derive(Debug, clap::Args)]
pub(crate) struct BucketArgs {
    bucket: String,
    #[command(flatten)]
    config: ConfigArg,
}

#[derive(Debug, clap::Args)]
pub(crate) struct ObjectArgs {
    /// BUCKET/KEY
    path: String,
    #[command(flatten)]
    config: ConfigArg,
}

#[derive(Debug, clap::Args)]
pub(crate) struct PutArgs {
    /// Local file, or - for stdin.
    file: PathBuf,
    /// BUCKET/KEY
    path: String,
    /// Content-Type stored with the object.
    #[arg(long)]
    content_type: Option<String>,
    /// Store a Parquet file in the plain layout: by default each of its row groups is stored
    /// inside one chunk (the aligned layout, at most 1% more bytes), so a query's node reads
    /// it from its own drive.
    #[arg(long)]
    no_align: bool,
    /// Create only: fail ("already exists", nothing written) if the key holds an object when
    /// the PUT commits, atomically against concurrent writers (S3's `If-None-Match: *`).
    #[arg(long)]
    if_absent: bool,
    #[command(flatten)]
    config: ConfigArg,
}

#[derive(Debug, clap::Args)]
pub(crate) struct GetArgs {
    /// BUCKET/KEY
    path: String,
    /// Local file, or - for stdout.
    file: PathBuf,
    /// Start reading at this byte of the object.
    #[arg(long, default_value_t = 0)]
    offset: u64,
    /// Read at most this many bytes (default: to the end of the object).
    #[arg(long)]
    length: Option<u64>,
    /// How much of the object is held in memory at once: it is read in steps of this size
    /// (all of the version the GET chose first), each written out before the next is fetched.
    #[arg(long, default_value = "64MiB", value_parser = parse_buffer)]
    buffer: u64,
    #[command(flatten)]
    config: ConfigArg,
}

/// A GET's step: at least 4 KiB, at most 1 GiB.
fn parse_buffer(text: &str) -> Result<u64, String> {
    let bytes = parse_bytes(text)?;
    if !(4 << 10..=1 << 30).contains(&bytes) {
        return Err(format!("{text} is outside 4KiB..1GiB"));
    }
    Ok(bytes)
}

#[derive(Debug, clap::Args)]
pub(crate) struct LsArgs {
    /// BUCKET or BUCKET/PREFIX; nothing lists the buckets.
    path: Option<String>,
    #[command(flatten)]
    config: ConfigArg,
}

#[derive(Debug)]
pub(crate) enum Op {
    MakeBucket(BucketArgs),
    RemoveBucket(BucketArgs),
    Put(PutArgs),
    Get(GetArgs),
    List(LsArgs),
    Remove(ObjectArgs),
    Stat(ObjectArgs),
}

pub(crate) fn run(op: Op) -> anyhow::Result<()> {
    crate::init_logging("warn");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        match op {
            Op::MakeBucket(args) => {
                connect(&args.config)?.make_bucket(&args.bucket).await?;
                println!("created bucket {}", args.bucket);
            }
            Op::RemoveBucket(args) => {
                connect(&args.config)?.remove_bucket(&args.bucket).await?;
                println!("removed bucket {}", args.bucket);
            }
            Op::Put(args) => put(&args).await?,
            Op::Get(args) => get(&args).await?,
            Op::List(args) => list(&args).await?,
            Op::Remove(args) => {
                let (bucket, key) = split_path(&args.path)?;
                let client = connect(&args.config)?;
                client.delete(bucket, key).await?;
                client.settle().await;
            }
            Op::Stat(args) => stat(&args).await?,
        }
        Ok(())
    })
}

/// A client of the cluster named by `--config` or `TESSERA_CONFIG`.
pub(crate) fn connect(config: &ConfigArg) -> anyhow::Result<Client> {
    let Some(path) = &config.config else {
        bail!("no cluster config: pass --config or set TESSERA_CONFIG (create one with `tessera init`)");
    };
    let (map, _) = crate::cluster_cmd::load_map(path)?;
    Ok(Client::new(map, ClientOptions::default())?)
}

/// Splits `BUCKET/KEY`.
pub(crate) fn split_path(path: &str) -> anyhow::Result<(&str, &str)> {
    match path.split_once('/') {
        Some((bucket, key)) if !bucket.is_empty() && !key.is_empty() => Ok((bucket, key)),
        _ => bail!("expected BUCKET/KEY, got {path:?}"),
    }
}

fn progress_bar(total: u64, verb: &str) -> Option<ProgressBar> {
    if total < PROGRESS_MIN_BYTES || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = ProgressBar::new(total);
    let style = ProgressStyle::with_template(&format!(
        "{verb} [{{bar:40}}] {{bytes}}/{{total_bytes}} {{binary_bytes_per_sec}} eta {{eta}}"
    ))
    .expect("the template is valid");
    bar.set_style(style.progress_chars("=> "));
    Some(bar)
}

/// Counts bytes read through it into a progress bar.
struct Counted<R> {
    inner: R,
    bar: Option<ProgressBar>,
}

impl<R: AsyncRead + Unpin> AsyncRead for Counted<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Some(bar) = &self.bar {
            bar.inc((buf.filled().len() - before) as u64);
        }
        poll
    }
}

async fn put(args: &PutArgs) -> anyhow::Result<()> {
    let (bucket, key) = split_path(&args.path)?;
    let client = connect(&args.config)?;
    let condition = if args.if_absent { client::CommitCondition::IfAbsent } else { client::CommitCondition::None };
    let mut options = PutOptions { content_type: args.content_type.clone(), condition, ..PutOptions::default() };
    let info = if args.file == Path::new("-") {
        let mut source = tokio::io::stdin();
        client.put(bucket, key, &mut source, &options).await?
    } else {
        let file = tokio::fs::File::open(&args.file).await.with_context(|| format!("open {}", args.file.display()))?;
        let size = file.metadata().await.map(|m| m.len()).unwrap_or(0);
        if !args.no_align {
            let std_file = file.try_clone().await.with_context(|| format!("open {}", args.file.display()))?;
            let std_file = std_file.into_std().await;
            options.align = query::layout::parquet_alignment(size, &mut |offset, len| {
                let mut buf = vec![0u8; len];
                std::os::unix::fs::FileExt::read_exact_at(&std_file, &mut buf, offset)?;
                Ok(buf)
            });
        }
        let bar = progress_bar(size, "put");
        let mut source = Counted { inner: file, bar: bar.clone() };
        let info = client.put(bucket, key, &mut source, &options).await?;
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        info
    };
    client.settle().await;
    eprintln!("put {bucket}/{key}: {} ({}), etag {}", format_bytes(info.meta.size), info.meta.size, info.meta.etag);
    Ok(())
}

async fn get(args: &GetArgs) -> anyhow::Result<()> {
    let (bucket, key) = split_path(&args.path)?;
    let client = connect(&args.config)?;
    let mut info = client.head(bucket, key).await?;
    // The first step is read before anything is written, so that a version that vanished
    // under the read (a write in flight that was rolled back) can give way to the key's
    // current one (`Client::head_after_failed_read`).
    let mut retried = false;
    let (size, mut buf, first) = loop {
        if args.offset > info.meta.size || (args.offset == info.meta.size && info.meta.size > 0) {
            bail!("--offset {} is past the end of {bucket}/{key} ({} bytes)", args.offset, info.meta.size);
        }
        let end = args.length.map_or(info.meta.size, |length| info.meta.size.min(args.offset.saturating_add(length)));
        let size = end - args.offset;
        let mut buf = vec![0u8; (args.buffer as usize).min(size as usize)];
        match client.read_at(&info, args.offset, &mut buf).await {
            Ok(read) => break (size, buf, read),
            Err(e) if !retried => {
                retried = true;
                info = client.head_after_failed_read(&info, e).await?;
            }
            Err(e) => return Err(e.into()),
        }
    };
    let to_stdout = args.file == Path::new("-");
    // Write beside the target and rename at the end: a failed get leaves no half file behind.
    let partial = partial_path(&args.file);
    let mut out: Box<dyn tokio::io::AsyncWrite + Unpin + Send> = if to_stdout {
        Box::new(tokio::io::stdout())
    } else {
        let file = tokio::fs::File::create(&partial).await.with_context(|| format!("create {}", partial.display()))?;
        Box::new(file)
    };
    let bar = if to_stdout { None } else { progress_bar(size, "get") };
    let mut done = 0u64;
    let result: anyhow::Result<()> = async {
        out.write_all(&buf[..first]).await.context("write the output")?;
        done += first as u64;
        while done < size {
            let step = buf.len().min((size - done) as usize);
            let read = client.read_at(&info, args.offset + done, &mut buf[..step]).await?;
            out.write_all(&buf[..read]).await.context("write the output")?;
            done += read as u64;
            if let Some(bar) = &bar {
                bar.set_position(done);
            }
        }
        out.flush().await.context("write the output")?;
        Ok(())
    }
    .await;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    // The version read, for scripts that check what they got (the fault checker does).
    let etag = &info.meta.etag;
    if to_stdout {
        result?;
        eprintln!("got {bucket}/{key}: {size} bytes at {}, etag {etag}", args.offset);
        return Ok(());
    }
    if let Err(e) = result {
        // The partial file is ours and incomplete; leaving it would look like a download.
        let _ = tokio::fs::remove_file(&partial).await;
        return Err(e);
    }
    drop(out);
    tokio::fs::rename(&partial, &args.file)
        .await
        .with_context(|| format!("rename {} to {}", partial.display(), args.file.display()))?;
    eprintln!("got {bucket}/{key}: {} ({size}) at {}, etag {etag}", format_bytes(size), args.offset);
    Ok(())
}

fn partial_path(target: &Path) -> PathBuf {
    let mut name = target.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".tessera-partial");
    target.with_file_name(name)
}

async fn list(args: &LsArgs) -> anyhow::Result<()> {
    let client = connect(&args.config)?;
    let mut stdout = std::io::stdout().lock();
    let Some(path) = &args.path else {
        for bucket in client.list_buckets().await? {
            writeln!(stdout, "{bucket}")?;
        }
        return Ok(());
    };
    let (bucket, prefix) = path.split_once('/').unwrap_or((path.as_str(), ""));
    let mut start_after = String::new();
    loop {
        let page = client.list(bucket, prefix, &start_after, LIST_PAGE).await?;
        for entry in &page.entries {
            writeln!(stdout, "{:>12}  {}  {}", entry.size, format_ms(entry.modified_ms), entry.key)?;
        }
        match page.next_start_after {
            Some(next) => start_after = next,
            None => return Ok(()),
        }
    }
}

pub(crate) fn format_ms(ms: u64) -> String {
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(time).to_string()
}

async fn stat(args: &ObjectArgs) -> anyhow::Result<()> {
    let (bucket, key) = split_path(&args.path)?;
    let client = connect(&args.config)?;
    let info = client.head(bucket, key).await?;
    let meta = &info.meta;
    let geometry = meta.geometry();
    println!("object:       {bucket}/{key}");
    println!("size:         {} ({})", meta.size, format_bytes(meta.size));
    println!("etag:         {}", meta.etag);
    println!("content-type: {}", meta.content_type);
    println!("modified:     {}", format_ms(meta.modified_ms));
    println!("version:      {}", meta.version.to_hex());
    println!(
        "erasure:      {}+{}, chunk size {}, {} stripe(s)",
        meta.k,
        meta.m,
        format_bytes(u64::from(meta.chunk_bytes)),
        geometry.stripes
    );
    println!("erasure set:  {} (rotation {})", meta.set_idx, meta.rotation);
    if !meta.parts.is_empty() {
        println!("layout:       {} parts (a multipart upload's pieces)", meta.parts.len());
    } else if meta.pads.is_empty() {
        println!("layout:       plain");
    } else {
        let padding = meta.stored_size() - meta.size;
        println!(
            "layout:       aligned ({} pads, {} of zeros stored, {:.2}% of the object)",
            meta.pads.len(),
            format_bytes(padding),
            padding as f64 * 100.0 / meta.size as f64
        );
    }
    println!("chunks:");
    print!("{}", client::describe_layout(&info));
    Ok(())
}
