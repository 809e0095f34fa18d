//! `tessera relayout BUCKET[/PREFIX]`: stores the Parquet objects that stock S3 clients uploaded
//! (plain, or in parts) again in the aligned layout, each row group inside one chunk, and CSV,
//! JSON-lines and `.npy` objects uploaded in parts again as one piece (so their nodes can
//! evaluate S3 Select over them, or a gather read their rows in one request per node), at a
//! paced byte rate. Each object stays readable throughout: the new copy
//! is a new version just after it ([`client::Client::relayout`], [`client::Client::consolidate`]),
//! and a PUT or delete that comes meanwhile wins.

use anyhow::Context;

use crate::ConfigArg;
use crate::object_cmd::{LIST_PAGE, connect};
use crate::size::{format_bytes, parse_bytes};

#[derive(Debug, clap::Args)]
pub(crate) struct RelayoutArgs {
    /// BUCKET or BUCKET/PREFIX: every Parquet object under it (and every multipart CSV, JSON
    /// or .npy one).
    path: String,
    /// Object bytes rewritten per second, at most (e.g. 50MiB); 0 for no limit.
    #[arg(long, default_value = "64MiB", value_parser = parse_bytes)]
    rate: u64,
    /// Only say what would be rewritten.
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    config: ConfigArg,
}

/// What happened to the objects of one run.
#[derive(Default)]
struct Tally {
    relaid: u64,
    joined: u64,
    aligned_already: u64,
    not_parquet: u64,
    not_alignable: u64,
    changed: u64,
    failed: u64,
    bytes: u64,
    padding: u64,
}

pub(crate) fn run(args: &RelayoutArgs) -> anyhow::Result<()> {
    crate::init_logging("warn");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(relayout(args))
}

async fn relayout(args: &RelayoutArgs) -> anyhow::Result<()> {
    let client = connect(&args.config)?;
    let (bucket, prefix) = args.path.split_once('/').unwrap_or((args.path.as_str(), ""));
    // Paced within each object, not only between them: one 100 GiB object keeps the rate too.
    let pace = client::Pace::new(args.rate);
    let mut tally = Tally::default();
    let mut start_after = String::new();
    loop {
        let page = client.list(bucket, prefix, &start_after, LIST_PAGE).await?;
        for entry in &page.entries {
            let info = match client.head(bucket, &entry.key).await {
                Ok(info) => info,
                Err(client::Error::NotFound { .. }) => {
                    tally.changed += 1;
                    continue;
                }
                Err(e) => return Err(e).with_context(|| format!("head {bucket}/{}", entry.key)),
            };
            if !info.meta.pads.is_empty() {
                tally.aligned_already += 1;
                continue;
            }
            let align = query::layout::object_alignment(&client, &info)
                .await
                .with_context(|| format!("read the footer of {bucket}/{}", entry.key))?;
            let Some(align) = align else {
                if !info.meta.has_data_file() && query::layout::wants_one_piece(&entry.key) {
                    if args.dry_run {
                        println!("would join {bucket}/{} into one piece ({})", entry.key, format_bytes(info.meta.size));
                        tally.joined += 1;
                        continue;
                    }
                    let joined = match client.consolidate(&info, Some(&pace)).await {
                        Ok(joined) => joined,
                        Err(e) => {
                            eprintln!("warning: join {bucket}/{} into one piece: {e}", entry.key);
                            tally.failed += 1;
                            continue;
                        }
                    };
                    if joined.is_some() {
                        println!("joined {bucket}/{} into one piece ({})", entry.key, format_bytes(info.meta.size));
                        tally.joined += 1;
                        tally.bytes += info.meta.size;
                        continue;
                    }
                }
                tally.not_parquet += 1;
                continue;
            };
            if args.dry_run {
                println!("would relayout {bucket}/{} ({})", entry.key, format_bytes(info.meta.size));
                tally.relaid += 1;
                continue;
            }
            let relaid = match client.relayout(&info, &align, Some(&pace)).await {
                Ok(relaid) => relaid,
                Err(e) => {
                    eprintln!("warning: relayout {bucket}/{}: {e}", entry.key);
                    tally.failed += 1;
                    continue;
                }
            };
            let Some(relaid) = relaid else {
                tally.not_alignable += 1;
                continue;
            };
            let padding = relaid.meta.stored_size() - relaid.meta.size;
            println!(
                "relaid {bucket}/{}: {} row groups, chunks of {}, {} of padding ({:.2}%)",
                entry.key,
                align.ranges.len(),
                format_bytes(u64::from(relaid.meta.chunk_bytes)),
                format_bytes(padding),
                padding as f64 * 100.0 / relaid.meta.size as f64
            );
            tally.relaid += 1;
            tally.bytes += relaid.meta.size;
            tally.padding += padding;
        }
        match page.next_start_after {
            Some(next) => start_after = next,
            None => break,
        }
    }
    client.settle().await;
    let verb = if args.dry_run { "to relayout" } else { "relaid" };
    println!(
        "{} {verb}, {} joined into one piece ({}, {} of padding); {} aligned already; {} not Parquet; {} skipped (no layout within the padding budget, a pool being drained, or another re-layout of it running); {} gone meanwhile",
        tally.relaid,
        tally.joined,
        format_bytes(tally.bytes),
        format_bytes(tally.padding),
        tally.aligned_already,
        tally.not_parquet,
        tally.not_alignable,
        tally.changed
    );
    // One object that fails (a pool full, too few drives) does not stop the others; the run
    // still fails, and running it again retries what is left.
    if tally.failed > 0 {
        anyhow::bail!("{} object(s) could not be rewritten (warnings above); they stay as they were", tally.failed);
    }
    Ok(())
}
