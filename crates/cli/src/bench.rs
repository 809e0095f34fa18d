//! `tessera bench get|put`: throughput, objects/s, latency percentiles and client CPU use of
//! the smart client against a running cluster, or of any S3 endpoint (`--s3`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use client::{Client, PutOptions};

use crate::ConfigArg;
use crate::s3_load::S3Target;
use crate::size::{format_bytes, parse_bytes};

/// Latency samples kept per run; later operations still count toward throughput.
const LATENCY_SAMPLES_MAX: usize = 1_000_000;
/// Largest object size a benchmark buffers per worker.
const OBJECT_BYTES_MAX: u64 = 1 << 30;

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum BenchOp {
    Get,
    Put,
}

#[derive(Debug, clap::Args)]
pub(crate) struct BenchArgs {
    /// What to measure.
    op: BenchOp,
    /// Object size.
    #[arg(long, default_value = "1MiB", value_parser = parse_bytes)]
    size: u64,
    /// Distinct objects (keys) used; `get` writes them first.
    #[arg(long, default_value_t = 64)]
    objects: u64,
    /// Operations in flight.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Offer this many operations per second, on a fixed schedule (open loop), instead of
    /// as many as `--concurrency` workers can do; latency counts from each operation's
    /// scheduled start, so time spent queued behind a slow system is counted.
    #[arg(long, value_name = "OPS_PER_S")]
    rate: Option<f64>,
    /// How long to measure (e.g. 30s, 2m).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Bucket to use (created if missing).
    #[arg(long, default_value = "bench")]
    bucket: String,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// For `get`: read objects an earlier run wrote instead of writing them first (lets a run
    /// with nodes down reuse objects written while all were up).
    #[arg(long)]
    no_prefill: bool,
    /// Measure an S3 endpoint (Tessera's gateway, MinIO, ...) instead of the smart client.
    #[arg(long, value_name = "URL")]
    s3: Option<String>,
    /// S3 access key (with --s3).
    #[arg(long, env = "TESSERA_ACCESS_KEY", hide_env_values = true)]
    access_key: Option<String>,
    /// S3 secret key (with --s3).
    #[arg(long, env = "TESSERA_SECRET_KEY", hide_env_values = true)]
    secret_key: Option<String>,
    /// With an https:// --s3: trust the CA certificates in this PEM file (as `tessera up
    /// --tls` prints) instead of the system's.
    #[arg(long, value_name = "FILE", requires = "s3")]
    ca_bundle: Option<std::path::PathBuf>,
    #[command(flatten)]
    config: ConfigArg,
}

struct Outcome {
    ops: u64,
    bytes: u64,
    elapsed: Duration,
    cpu: Duration,
    latencies: Vec<Duration>,
    /// Metadata requests and items the smart client sent during the run (not for S3).
    metadata: Option<client::MetadataCounts>,
}

pub(crate) fn run(args: &BenchArgs) -> anyhow::Result<()> {
    crate::init_logging("warn");
    if args.size == 0 || args.size > OBJECT_BYTES_MAX || args.objects == 0 || args.concurrency == 0 {
        bail!("--size must be 1 B..1 GiB, --objects and --concurrency at least 1");
    }
    if args.rate.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
        bail!("--rate must be a positive number of operations per second");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let outcome = runtime.block_on(async {
        let target = Target::open(args)?;
        target.make_bucket(&args.bucket).await.context("create the bench bucket")?;
        if matches!(args.op, BenchOp::Get) && !args.no_prefill {
            prefill(&target, args).await?;
        }
        measure(&target, args).await
    })?;
    report(args, &outcome);
    Ok(())
}

/// What a benchmark talks to: the cluster through the smart client, or an S3 endpoint.
#[derive(Clone)]
enum Target {
    Smart(Client),
    S3(Arc<S3Target>),
}

impl Target {
    fn open(args: &BenchArgs) -> anyhow::Result<Self> {
        let Some(endpoint) = &args.s3 else {
            return Ok(Target::Smart(crate::object_cmd::connect(&args.config)?));
        };
        let (Some(access), Some(secret)) = (&args.access_key, &args.secret_key) else {
            bail!("--s3 needs --access-key and --secret-key (or TESSERA_ACCESS_KEY and TESSERA_SECRET_KEY)");
        };
        Ok(Target::S3(Arc::new(S3Target::new(endpoint, &args.bucket, access, secret, args.ca_bundle.as_deref())?)))
    }

    async fn make_bucket(&self, bucket: &str) -> anyhow::Result<()> {
        match self {
            Target::Smart(client) => Ok(client.make_bucket(bucket).await?),
            Target::S3(s3) => s3.make_bucket().await,
        }
    }

    /// The smart client's metadata requests so far.
    fn metadata_counts(&self) -> Option<client::MetadataCounts> {
        match self {
            Target::Smart(client) => Some(client.metadata_counts()),
            Target::S3(_) => None,
        }
    }

    async fn put(&self, bucket: &str, key: &str, data: &Bytes) -> anyhow::Result<()> {
        match self {
            Target::Smart(client) => {
                Ok(client.put_bytes(bucket, key, data, &PutOptions::default()).await.map(|_| ())?)
            }
            Target::S3(s3) => s3.put(key, data.clone()).await,
        }
    }

    /// Reads the whole object into `buf`; returns its size.
    async fn get(&self, bucket: &str, key: &str, buf: &mut [u8]) -> anyhow::Result<usize> {
        match self {
            Target::Smart(client) => {
                let info = client.head(bucket, key).await?;
                Ok(client.read_at(&info, 0, buf).await?)
            }
            Target::S3(s3) => s3.get(key, buf).await,
        }
    }
}

fn key(idx: u64) -> String {
    format!("bench/obj-{idx:08}")
}

fn payload(size: u64, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..size)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

async fn prefill(target: &Target, args: &BenchArgs) -> anyhow::Result<()> {
    let next = Arc::new(AtomicU64::new(0));
    let data = Bytes::from(payload(args.size, 1));
    let mut workers = Vec::new();
    for _ in 0..args.concurrency {
        let (target, next, data, bucket, objects) =
            (target.clone(), next.clone(), data.clone(), args.bucket.clone(), args.objects);
        workers.push(tokio::spawn(async move {
            loop {
                let idx = next.fetch_add(1, Ordering::Relaxed);
                if idx >= objects {
                    return Ok::<_, anyhow::Error>(());
                }
                target.put(&bucket, &key(idx), &data).await?;
            }
        }));
    }
    for worker in workers {
        worker.await.context("prefill worker")?.context("write the objects to read")?;
    }
    Ok(())
}

async fn measure(target: &Target, args: &BenchArgs) -> anyhow::Result<Outcome> {
    let next = Arc::new(AtomicU64::new(0));
    let data = Bytes::from(payload(args.size, 2));
    let cpu_start = process_cpu();
    let metadata_start = target.metadata_counts();
    let start = Instant::now();
    let deadline = start + args.duration;
    let mut workers = Vec::new();
    for _ in 0..args.concurrency {
        let (target, next, data, bucket) = (target.clone(), next.clone(), data.clone(), args.bucket.clone());
        let (op, objects, size, rate) = (args.op, args.objects, args.size as usize, args.rate);
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut buf = vec![0u8; size];
            let (mut ops, mut bytes) = (0u64, 0u64);
            while Instant::now() < deadline {
                let idx = next.fetch_add(1, Ordering::Relaxed);
                let key = key(idx % objects);
                let began = match rate {
                    Some(rate) => {
                        let due = start + Duration::from_secs_f64(idx as f64 / rate);
                        if due >= deadline {
                            break;
                        }
                        tokio::time::sleep_until(due.into()).await;
                        due
                    }
                    None => Instant::now(),
                };
                match op {
                    BenchOp::Get => {
                        let read = target.get(&bucket, &key, &mut buf).await?;
                        if read != size {
                            bail!("{key}: read {read} bytes, expected {size}");
                        }
                    }
                    BenchOp::Put => target.put(&bucket, &key, &data).await?,
                }
                if latencies.len() < LATENCY_SAMPLES_MAX / 64 {
                    latencies.push(began.elapsed());
                }
                ops += 1;
                bytes += size as u64;
            }
            Ok::<_, anyhow::Error>((ops, bytes, latencies))
        }));
    }
    let mut outcome = Outcome {
        ops: 0,
        bytes: 0,
        elapsed: Duration::ZERO,
        cpu: Duration::ZERO,
        latencies: Vec::new(),
        metadata: None,
    };
    for worker in workers {
        let (ops, bytes, latencies) = worker.await.context("bench worker")??;
        outcome.ops += ops;
        outcome.bytes += bytes;
        outcome.latencies.extend(latencies);
    }
    outcome.elapsed = start.elapsed();
    outcome.cpu = process_cpu().saturating_sub(cpu_start);
    outcome.metadata = metadata_start.zip(target.metadata_counts()).map(|(before, after)| client::MetadataCounts {
        requests: after.requests - before.requests,
        items: after.items - before.items,
    });
    outcome.latencies.sort_unstable();
    Ok(outcome)
}

/// User plus system CPU time of this process so far.
fn process_cpu() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one rusage struct into the pointer we pass; RUSAGE_SELF is valid.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    assert_eq!(rc, 0, "getrusage(RUSAGE_SELF) cannot fail");
    // SAFETY: getrusage returned 0, so the struct is initialised.
    let usage = unsafe { usage.assume_init() };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[idx]
}

fn report(args: &BenchArgs, outcome: &Outcome) {
    let secs = outcome.elapsed.as_secs_f64();
    let throughput = outcome.bytes as f64 / secs;
    let objects_per_s = outcome.ops as f64 / secs;
    let p50 = percentile(&outcome.latencies, 0.50).as_secs_f64() * 1e3;
    let p99 = percentile(&outcome.latencies, 0.99).as_secs_f64() * 1e3;
    let gb = outcome.bytes as f64 / 1e9;
    let cpu_per_gb = if gb > 0.0 { outcome.cpu.as_secs_f64() / gb } else { 0.0 };
    let op = match args.op {
        BenchOp::Get => "get",
        BenchOp::Put => "put",
    };
    let target = if args.s3.is_some() { "s3" } else { "smart-client" };
    let per_op = |count: u64| if outcome.ops > 0 { count as f64 / outcome.ops as f64 } else { 0.0 };
    let (metadata_requests, metadata_items) = match outcome.metadata {
        Some(m) => (format!("{:.2}", per_op(m.requests)), format!("{:.2}", per_op(m.items))),
        None => ("null".to_owned(), "null".to_owned()),
    };
    if args.json {
        println!(
            "{{\"target\":\"{target}\",\"op\":\"{op}\",\"object_bytes\":{},\"objects\":{},\"concurrency\":{},\"offered_ops_per_s\":{},\"duration_s\":{secs:.3},\"ops\":{},\"bytes\":{},\"throughput_bytes_per_s\":{throughput:.0},\"objects_per_s\":{objects_per_s:.1},\"p50_ms\":{p50:.3},\"p99_ms\":{p99:.3},\"client_cpu_s\":{:.3},\"client_cpu_s_per_gb\":{cpu_per_gb:.3},\"metadata_requests_per_op\":{metadata_requests},\"metadata_items_per_op\":{metadata_items}}}",
            args.size,
            args.objects,
            args.concurrency,
            args.rate.map_or("null".to_owned(), |r| format!("{r}")),
            outcome.ops,
            outcome.bytes,
            outcome.cpu.as_secs_f64()
        );
        return;
    }
    println!(
        "{op} {} x {} objects, concurrency {}, {secs:.1} s",
        format_bytes(args.size),
        args.objects,
        args.concurrency
    );
    if let Some(rate) = args.rate {
        println!("  offered      {rate:.1} objects/s (open loop)");
    }
    println!("  throughput   {:.3} GB/s ({}/s)", throughput / 1e9, format_bytes(throughput as u64));
    println!("  objects/s    {objects_per_s:.1}");
    println!("  latency      p50 {p50:.2} ms, p99 {p99:.2} ms");
    println!("  client CPU   {:.2} s ({cpu_per_gb:.3} CPU-s per GB)", outcome.cpu.as_secs_f64());
    if outcome.metadata.is_some() {
        println!("  metadata     {metadata_requests} node requests per op for {metadata_items} items (keys on drives)");
    }
}
