//! The mover behind `tessera pool decommission` and `tessera pool rebalance`: lists a pool's
//! keys bucket by bucket and moves them (`client::Client::move_key`), a few at once, paced by
//! a byte budget, printing progress. It keeps no state of its own: a pool's listing is what is
//! left to move, so a run cut short (a crash, Ctrl-C) is resumed by running the command again.

use std::time::{Duration, Instant};

use client::{Client, MoveKind};
use futures_util::StreamExt as _;

use crate::size::format_bytes;

/// Keys moved at once: enough to overlap the round trips of small objects, few enough that the
/// budget, not the mover, sets the pace for large ones (each move holds at most one copy step).
const MOVES_IN_FLIGHT: usize = 4;
/// Keys listed per request.
const LIST_PAGE: u32 = 1000;
/// How often progress is printed.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// What a pool holds, from its listing.
#[derive(Clone, Debug, Default)]
pub(crate) struct PoolUsage {
    pub(crate) keys: u64,
    /// Object bytes (before parity) of the keys' newest listed versions; a multipart object's
    /// record and its pieces both count, so this errs high.
    pub(crate) bytes: u64,
    /// The most drives of one set that did not answer one listing: keys only they hold were
    /// not counted.
    pub(crate) silent_per_set: usize,
    /// Why, for the last such drive.
    pub(crate) silent_reason: Option<String>,
}

/// Counts what pool `pool_id` holds, stopping after `keys_max` keys.
pub(crate) async fn usage(client: &Client, pool_id: u32, keys_max: u64) -> anyhow::Result<PoolUsage> {
    let mut usage = PoolUsage::default();
    for bucket in client.pool_buckets(pool_id).await? {
        let mut after = String::new();
        loop {
            let page = client.pool_keys(pool_id, &bucket, &after, LIST_PAGE).await?;
            let mut per_set: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
            for (set_idx, node) in &page.silent {
                *per_set.entry(*set_idx).or_default() += 1;
                usage.silent_reason = Some(format!("{}: {}", node.node, node.reason));
            }
            usage.silent_per_set = usage.silent_per_set.max(per_set.into_values().max().unwrap_or(0));
            usage.keys += page.entries.len() as u64;
            usage.bytes += page.entries.iter().filter(|e| !e.deleted).map(|e| e.size).sum::<u64>();
            match page.entries.last() {
                Some(last) if page.truncated && usage.keys < keys_max => after = last.key.clone(),
                _ => break,
            }
        }
        if usage.keys >= keys_max {
            break;
        }
    }
    Ok(usage)
}

/// Progress and totals of one mover run.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub(crate) keys: u64,
    pub(crate) copied: u64,
    pub(crate) bytes: u64,
    /// Keys that failed (left in place; a later pass tries again), with the last error.
    pub(crate) failed: u64,
    pub(crate) last_error: Option<String>,
    /// Keys some drive of the source set could not be told to evict.
    pub(crate) partly_evicted: u64,
}

/// A byte budget: after spending, waits until the average since the start is back under it.
struct Pacer {
    bytes_per_s: u64,
    start: Instant,
    spent: u64,
}

impl Pacer {
    async fn spend(&mut self, bytes: u64) {
        self.spent += bytes;
        let due = Duration::from_secs_f64(self.spent as f64 / self.bytes_per_s as f64);
        if let Some(wait) = due.checked_sub(self.start.elapsed()) {
            tokio::time::sleep(wait).await;
        }
    }
}

/// One pass over pool `pool_id`: moves the keys its drives list until moves of `bytes_max`
/// object bytes have started (a rebalance; a decommission moves everything). `total` is what
/// the progress lines count against.
pub(crate) async fn pass(
    client: &Client,
    pool_id: u32,
    kind: MoveKind,
    bytes_per_s: u64,
    bytes_max: u64,
    total: &PoolUsage,
) -> anyhow::Result<Tally> {
    let mut tally = Tally::default();
    let mut pacer = Pacer { bytes_per_s, start: Instant::now(), spent: 0 };
    let mut printed = Instant::now();
    // Object bytes of the moves started: once `bytes_max` is reached no move starts, those in
    // flight finish (a move cut between its copy and its eviction leaves the key in both pools).
    let started = std::cell::Cell::new(0u64);
    for bucket in client.pool_buckets(pool_id).await? {
        let mut after = String::new();
        loop {
            let page = client.pool_keys(pool_id, &bucket, &after, LIST_PAGE).await?;
            let moves = page.entries.iter().map(|entry| {
                let (bucket, started) = (bucket.as_str(), &started);
                async move {
                    if started.get() >= bytes_max {
                        return (entry, None);
                    }
                    started.set(started.get().saturating_add(entry.size.max(1)));
                    (entry, Some(client.move_key(bucket, &entry.key, pool_id, kind).await))
                }
            });
            let mut moves = futures_util::stream::iter(moves).buffer_unordered(MOVES_IN_FLIGHT);
            while let Some((entry, result)) = moves.next().await {
                let Some(result) = result else { continue };
                tally.keys += 1;
                match result {
                    Ok(moved) => {
                        if moved.to_pool.is_some() {
                            tally.copied += 1;
                        }
                        if !moved.failed.is_empty() {
                            tally.partly_evicted += 1;
                            let failed: Vec<String> = moved.failed.iter().map(|f| f.node.clone()).collect();
                            tally.last_error =
                                Some(format!("{bucket}/{}: not evicted on {}", entry.key, failed.join(", ")));
                        }
                        tally.bytes += moved.bytes;
                        pacer.spend(moved.bytes).await;
                    }
                    Err(e) => {
                        tally.failed += 1;
                        tally.last_error = Some(format!("{bucket}/{}: {e}", entry.key));
                    }
                }
                if printed.elapsed() >= PROGRESS_EVERY {
                    print_progress(&tally, total, pacer.start.elapsed());
                    printed = Instant::now();
                }
            }
            drop(moves);
            match page.entries.last() {
                Some(last) if page.truncated && started.get() < bytes_max => after = last.key.clone(),
                _ => break,
            }
        }
        if started.get() >= bytes_max {
            break;
        }
    }
    Ok(tally)
}

fn print_progress(tally: &Tally, total: &PoolUsage, elapsed: Duration) {
    let rate = tally.bytes as f64 / elapsed.as_secs_f64().max(0.001);
    let left_keys = total.keys.saturating_sub(tally.keys);
    let eta = if tally.keys == 0 {
        "unknown".to_string()
    } else {
        let per_key = elapsed.as_secs_f64() / tally.keys as f64;
        humantime::format_duration(Duration::from_secs((per_key * left_keys as f64) as u64)).to_string()
    };
    println!(
        "moved {} of {} keys ({} copied, {} written, {}/s, {} failed), eta {eta}",
        tally.keys,
        total.keys,
        tally.copied,
        format_bytes(tally.bytes),
        format_bytes(rate as u64),
        tally.failed
    );
}
