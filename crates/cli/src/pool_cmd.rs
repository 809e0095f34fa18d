//! `tessera pool add|activate|decommission|rebalance|status`: grow the cluster by a pool of
//! erasure sets on new nodes, empty a pool to retire its nodes, spread keys over pools, and see
//! how full each pool is.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use client::MoveKind;
use cluster::{ErasureConfig, NodeSpec, PoolState};

use crate::ConfigArg;
use crate::pool_move;
use crate::size::format_bytes;

#[derive(Debug, clap::Args)]
pub(crate) struct PoolArgs {
    #[command(subcommand)]
    action: PoolAction,
    #[command(flatten)]
    config: ConfigArg,
}

#[derive(Debug, clap::Subcommand)]
enum PoolAction {
    /// Add a pool of new nodes (ids after the last node's) with erasure sets of their own, as
    /// joining: in the map, not yet used. Writes the next map version to every running node
    /// (refused, changing nothing, as `tessera map push` is) and to --config; then copy that
    /// file to the new nodes' hosts, start them, and `tessera pool activate ID`.
    Add {
        /// A new node, as IP:PORT (one drive), IP:PORT=COUNT (drives nI/d1.. beside
        /// cluster.toml) or IP:PORT=PATH,PATH... Repeat it once per node.
        #[arg(long, value_name = "IP:PORT[=DRIVES]", required_unless_present = "hosts", conflicts_with = "hosts")]
        node: Vec<NodeSpec>,
        /// A file with one IP:PORT[=DRIVES] per line (as --node).
        #[arg(long, value_name = "FILE")]
        hosts: Option<PathBuf>,
        /// Erasure config of the new pool's sets, e.g. 8+3 (default: the cluster's). Pools may
        /// differ: each object is read with the k+m it was written with.
        #[arg(long)]
        ec: Option<ErasureConfig>,
    },
    /// Start using joining pool ID: once every one of its nodes answers with the current map
    /// and holds the cluster's buckets, the next map version makes it active. Existing objects
    /// stay where they are; keys written from then on go to a pool chosen in proportion to free
    /// space (a key's later versions follow its first), and every read and write asks it.
    Activate {
        /// The pool's id (`tessera pool status`).
        id: u32,
    },
    /// Move every key off pool ID, then mark it removed, so its nodes can be shut down. The
    /// pool turns draining at once (no write goes to it; reads and writes go on everywhere),
    /// its keys move to the active pools by free space, paced by --rate; progress is printed
    /// as it goes. Run it again to resume a run cut short (a crash, Ctrl-C): what is left to
    /// move is what the pool still lists. Refused for the last active pool and for a pool whose
    /// keys do not fit in the others' free space.
    Decommission {
        /// The pool's id (`tessera pool status`).
        id: u32,
        /// Byte budget of the move (chunk bytes written per second, as the repair budget).
        #[arg(long, value_parser = crate::repair_cmd::parse_rate, default_value = "100MiB/s")]
        rate: u64,
        /// Call off a decommission in progress: the pool takes writes again (what was moved
        /// stays where it went).
        #[arg(long)]
        cancel: bool,
    },
    /// Spread the keys of active pools by free space: from each pool holding more than its
    /// share of the stored bytes (its share of the pools' total space), keys move to the pool
    /// with the most room until it is within `--tolerance` of its share. Paced by --rate;
    /// run it again to continue.
    Rebalance {
        /// Byte budget of the move (chunk bytes written per second, as the repair budget).
        #[arg(long, value_parser = crate::repair_cmd::parse_rate, default_value = "100MiB/s")]
        rate: u64,
        /// How far above its share a pool may stay, in percent of its share.
        #[arg(long, default_value_t = 10)]
        tolerance: u64,
    },
    /// Each pool: its state, nodes, sets, and free and total bytes; a draining pool also shows
    /// how many keys are left to move.
    Status,
}

pub(crate) fn run(args: &PoolArgs) -> anyhow::Result<()> {
    crate::init_logging("warn");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let client = crate::object_cmd::connect(&args.config)?;
        match &args.action {
            PoolAction::Add { node, hosts, ec } => {
                let config = args.config.config.as_deref().context("--config is required")?;
                let nodes = match hosts {
                    Some(path) => crate::cluster_cmd::read_hosts(path)?,
                    None => node.clone(),
                };
                add(&client, &nodes, *ec, config).await
            }
            PoolAction::Activate { id } => {
                let config = args.config.config.as_deref().context("--config is required")?;
                activate(&client, *id, config).await
            }
            PoolAction::Decommission { id, rate, cancel } => {
                let config = args.config.config.as_deref().context("--config is required")?;
                if *cancel {
                    cancel_decommission(&client, *id, config).await
                } else {
                    decommission(&client, *id, *rate, config).await
                }
            }
            PoolAction::Rebalance { rate, tolerance } => rebalance(&client, *rate, *tolerance).await,
            PoolAction::Status => status(&client).await,
        }
    })
}

async fn add(
    client: &client::Client,
    nodes: &[NodeSpec],
    ec: Option<ErasureConfig>,
    config: &Path,
) -> anyhow::Result<()> {
    // Plan from the map the nodes hold (the file may be behind a change made elsewhere).
    let current = client.fresh_map().await;
    let next = match current.pools.last() {
        // A run cut short left this pool on some nodes: finish pushing it.
        Some(last)
            if last.state == cluster::PoolState::Joining && same_nodes(&current, current.pools.len() - 1, nodes) =>
        {
            println!("pool {} with these nodes is in map version {}: finishing its push", last.id, current.version);
            (*current).clone()
        }
        _ => current.with_pool(nodes, ec.unwrap_or(current.erasure)).context("plan the pool")?,
    };
    let silent = client.push_map(&next).await?;
    crate::cluster_cmd::write_map(config, &next)?;
    let pool = next.pools.last().expect("with_pool adds a pool");
    let ids: Vec<&str> = next.pool_nodes(next.pools.len() - 1).iter().map(|&i| next.nodes[i].id.as_str()).collect();
    println!(
        "pool {} added (joining): nodes {}, {} erasure set(s) of {}; map version {} written to {}",
        pool.id,
        ids.join(", "),
        pool.sets.len(),
        pool.erasure,
        next.version,
        config.display()
    );
    if !silent.is_empty() {
        println!("nodes {} did not answer: they take the new map from their peers when they return", silent.join(", "));
    }
    println!(
        "next: copy {} to the new nodes' hosts; on each run `tessera drive format --node ID` and `tessera node --id ID`; then `tessera pool activate {}`",
        config.display(),
        pool.id
    );
    Ok(())
}

async fn activate(client: &client::Client, id: u32, config: &Path) -> anyhow::Result<()> {
    let current = client.fresh_map().await;
    let next = current.with_pool_active(id)?;
    let pool_idx = current.pools.iter().position(|pool| pool.id == id).expect("with_pool_active found it");
    let members = current.pool_nodes(pool_idx);
    // Every active pool must answer every write: refuse until all of this one's nodes run with
    // this map, and have the buckets (writes to the pool would fail without them).
    let maps = client.node_maps().await;
    let buckets = client.node_buckets().await;
    let namespace: Vec<String> = client.bucket_namespace().await?.into_iter().map(|b| b.name).collect();
    let mut problems = Vec::new();
    for &node_idx in &members {
        let node = &maps[node_idx].node;
        match &maps[node_idx].map {
            Ok(map) if map.version == current.version => {}
            Ok(map) => problems.push(format!("{node} holds map version {}, not {}", map.version, current.version)),
            Err(reason) => problems.push(format!("{node} does not answer ({reason})")),
        }
        match &buckets[node_idx] {
            (_, Ok(held)) => {
                let missing: Vec<&String> = namespace.iter().filter(|b| !held.contains(b)).collect();
                if !missing.is_empty() {
                    problems.push(format!(
                        "{node} lacks buckets {missing:?} (a node takes them within seconds of starting)"
                    ));
                }
            }
            // Not answering at all is said above.
            (_, Err(reason)) if maps[node_idx].map.is_ok() => {
                problems.push(format!("{node} cannot list its buckets ({reason})"));
            }
            (_, Err(_)) => {}
        }
    }
    if !problems.is_empty() {
        bail!("pool {id} stays joining: {}", problems.join("; "));
    }
    let silent = client.push_map(&next).await?;
    crate::cluster_cmd::write_map(config, &next)?;
    println!("pool {id} is active: map version {} written to {}", next.version, config.display());
    if !silent.is_empty() {
        println!("nodes {} did not answer: they take the new map from their peers when they return", silent.join(", "));
    }
    Ok(())
}

/// Passes over a draining pool before a decommission gives up on keys it could not move.
const DECOMMISSION_PASSES_MAX: u32 = 3;

async fn decommission(client: &client::Client, id: u32, rate: u64, config: &Path) -> anyhow::Result<()> {
    let current = client.fresh_map().await;
    let Some(pool_idx) = current.pools.iter().position(|pool| pool.id == id) else {
        bail!(cluster::Error::NoSuchPool { id });
    };
    let map = match current.pools[pool_idx].state {
        PoolState::Active => start_draining(client, &current, pool_idx, config).await?,
        PoolState::Draining => {
            println!("pool {id} is draining already: resuming the move");
            (*current).clone()
        }
        state => bail!("pool {id} is {state}: only an active pool can be decommissioned"),
    };
    pool_holds_map(client, &map, pool_idx).await?;
    for pass in 1..=DECOMMISSION_PASSES_MAX {
        let left = pool_move::usage(client, id, u64::MAX).await.context("list the pool's keys")?;
        if left.keys == 0 {
            break;
        }
        println!(
            "pass {pass}: moving {} keys ({}) at most {}/s",
            left.keys,
            format_bytes(left.bytes),
            format_bytes(rate)
        );
        let tally = pool_move::pass(client, id, MoveKind::Drain, rate, u64::MAX, &left).await?;
        println!(
            "pass {pass}: {} keys seen, {} copied ({} written), {} failed, {} not evicted everywhere",
            tally.keys,
            tally.copied,
            format_bytes(tally.bytes),
            tally.failed,
            tally.partly_evicted
        );
        if let Some(error) = &tally.last_error {
            println!("  last problem: {error}");
        }
    }
    // Empty, as far as any acknowledged version goes: a version acknowledged in a set is on W of
    // its drives, so on one of any n - W + 1 that answered.
    let left = pool_move::usage(client, id, u64::MAX).await.context("list the pool's keys")?;
    if left.keys > 0 {
        bail!(
            "pool {id} still holds {} keys after {DECOMMISSION_PASSES_MAX} passes: it stays draining; run `tessera pool decommission {id}` again once its nodes are healthy",
            left.keys
        );
    }
    let silent_max = map.pools[pool_idx].erasure.write_quorum() - 1;
    if left.silent_per_set > silent_max {
        bail!(
            "pool {id} lists no keys, but {} drives of one set did not answer (at most {silent_max} may be silent to prove it empty; {}): it stays draining; run the command again when they are back",
            left.silent_per_set,
            left.silent_reason.as_deref().unwrap_or("no reason given")
        );
    }
    remove(client, id, pool_idx, config).await
}

/// Makes active pool index `pool_idx` draining, once its keys fit in the other active pools.
async fn start_draining(
    client: &client::Client,
    current: &cluster::ClusterMap,
    pool_idx: usize,
    config: &Path,
) -> anyhow::Result<cluster::ClusterMap> {
    let id = current.pools[pool_idx].id;
    let next = current.with_pool_draining(id)?;
    let held = pool_move::usage(client, id, u64::MAX).await.context("count the pool's keys")?;
    let free = free_bytes_outside(client, current, pool_idx).await;
    if held.bytes > free {
        bail!(
            "pool {id} holds about {} of objects, the other active pools have {} free: add a pool first (`tessera pool add`)",
            format_bytes(held.bytes),
            format_bytes(free)
        );
    }
    let silent = client.push_map(&next).await?;
    crate::cluster_cmd::write_map(config, &next)?;
    println!(
        "pool {id} is draining: map version {} written to {}; no write goes to it, reads and writes go on; {} keys ({}) to move",
        next.version,
        config.display(),
        held.keys,
        format_bytes(held.bytes)
    );
    if !silent.is_empty() {
        println!("nodes {} did not answer: they take the new map from their peers when they return", silent.join(", "));
    }
    Ok(next)
}

/// Marks emptied pool `id` removed, handing the bucket namespace on first if it held it.
async fn remove(client: &client::Client, id: u32, pool_idx: usize, config: &Path) -> anyhow::Result<()> {
    let current = client.fresh_map().await;
    let next = current.with_pool_removed(id)?;
    if next.namespace_pool() != current.namespace_pool() {
        // The next pool takes over the bucket namespace: it must hold every bucket first.
        let heir = next.pools[next.namespace_pool()].id;
        let buckets = client.hand_over_buckets(heir).await.context("hand the bucket namespace to the next pool")?;
        println!("pool {heir} holds the bucket namespace from now on ({buckets} buckets)");
    }
    let silent = client.push_map(&next).await?;
    crate::cluster_cmd::write_map(config, &next)?;
    let members = next.pool_nodes(pool_idx);
    let ids: Vec<&str> = members.iter().map(|&i| next.nodes[i].id.as_str()).collect();
    println!(
        "pool {id} is removed: map version {} written to {}; its nodes ({}) hold nothing and may be shut down",
        next.version,
        config.display(),
        ids.join(", ")
    );
    if !silent.is_empty() {
        println!("nodes {} did not answer: they take the new map from their peers when they return", silent.join(", "));
    }
    Ok(())
}

/// Waits until every answering node of pool index `pool` holds `map` (a node that still
/// served the older map would take writes from clients that have not seen the change),
/// pushing it again to the ones behind.
async fn pool_holds_map(client: &client::Client, map: &cluster::ClusterMap, pool: usize) -> anyhow::Result<()> {
    let members = map.pool_nodes(pool);
    for _ in 0..10 {
        let maps = client.node_maps().await;
        let behind: Vec<&str> = members
            .iter()
            .filter(|&&i| maps[i].map.as_ref().is_ok_and(|held| held.version < map.version))
            .map(|&i| maps[i].node.as_str())
            .collect();
        if behind.is_empty() {
            return Ok(());
        }
        println!("nodes {} hold an older map: pushing version {} again", behind.join(", "), map.version);
        client.push_map(map).await?;
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    bail!("nodes of pool {} do not take map version {}: see their logs", map.pools[pool].id, map.version)
}

/// Space per set of `map` (free or total, as `bytes` picks from a drive's answer): the least
/// of its drives times k/n, as new keys fill sets evenly; a drive that did not answer counts 0.
fn set_bytes(
    map: &cluster::ClusterMap,
    spaces: &[client::NodeSpace],
    set: &cluster::ErasureSet,
    bytes: fn(&client::DriveSpace) -> u64,
) -> u64 {
    let erasure = set.drives.first().map_or(map.erasure, |d| map.erasure_of_node(d.node_idx));
    let (k, n) = (erasure.k as u64, erasure.n() as u64);
    let per_drive = set.drives.iter().map(|d| match &spaces[d.node_idx].drives {
        Ok(drives) => drives.get(d.drive_idx).map_or(0, bytes),
        Err(_) => 0,
    });
    per_drive.min().unwrap_or(0) / n * k
}

/// Free bytes (before parity) of the active pools other than pool index `except`.
async fn free_bytes_outside(client: &client::Client, map: &cluster::ClusterMap, except: usize) -> u64 {
    let spaces = client.node_space().await;
    let pools = map.pools.iter().enumerate().filter(|(idx, pool)| *idx != except && pool.is_active());
    pools
        .flat_map(|(_, pool)| &map.sets[pool.sets.clone()])
        .map(|set| set_bytes(map, &spaces, set, |s| s.free_bytes))
        .sum()
}

async fn cancel_decommission(client: &client::Client, id: u32, config: &Path) -> anyhow::Result<()> {
    let current = client.fresh_map().await;
    let next = current.with_pool_undrained(id)?;
    client.push_map(&next).await?;
    crate::cluster_cmd::write_map(config, &next)?;
    println!(
        "pool {id} is active again (decommission called off): map version {} written to {}",
        next.version,
        config.display()
    );
    Ok(())
}

async fn rebalance(client: &client::Client, rate: u64, tolerance_percent: u64) -> anyhow::Result<()> {
    let map = client.fresh_map().await;
    let active: Vec<usize> = (0..map.pools.len()).filter(|&p| map.pools[p].is_active()).collect();
    if active.len() < 2 {
        bail!("nothing to rebalance: the cluster has one active pool (add one with `tessera pool add`)");
    }
    let spaces = client.node_space().await;
    // (id, space, stored bytes) of each active pool.
    let mut pools = Vec::new();
    for &pool_idx in &active {
        let pool = &map.pools[pool_idx];
        let sets = &map.sets[pool.sets.clone()];
        let capacity: u64 = sets.iter().map(|set| set_bytes(&map, &spaces, set, |s| s.total_bytes)).sum();
        let stored = pool_move::usage(client, pool.id, u64::MAX).await?.bytes;
        pools.push((pool.id, capacity, stored));
    }
    let capacity_sum: u128 = pools.iter().map(|p| u128::from(p.1)).sum();
    let stored_sum: u128 = pools.iter().map(|p| u128::from(p.2)).sum();
    if capacity_sum == 0 {
        bail!("no pool reported its space: are its nodes up?");
    }
    // Each pool's share of the stored bytes, in proportion to its space.
    let share = |capacity: u64| (u128::from(capacity) * stored_sum / capacity_sum) as u64;
    for &(id, capacity, stored) in &pools {
        println!("pool {id}: {} stored, its share {}", format_bytes(stored), format_bytes(share(capacity)));
    }
    let mut moved_any = false;
    for &(id, capacity, stored) in &pools {
        let excess = stored.saturating_sub(share(capacity));
        if excess == 0 || excess <= share(capacity) / 100 * tolerance_percent {
            continue;
        }
        let (target, deficit) = pools
            .iter()
            .filter(|p| p.0 != id)
            .map(|&(other, capacity, stored)| (other, share(capacity).saturating_sub(stored)))
            .max_by_key(|&(_, deficit)| deficit)
            .expect("two active pools at least");
        let bytes = excess.min(deficit);
        if bytes == 0 {
            continue;
        }
        println!(
            "moving about {} from pool {id} to pool {target} at most {}/s",
            format_bytes(bytes),
            format_bytes(rate)
        );
        let total = pool_move::usage(client, id, u64::MAX).await?;
        let kind = MoveKind::Rebalance { target_pool: target };
        let tally = pool_move::pass(client, id, kind, rate, bytes, &total).await?;
        println!(
            "pool {id}: {} keys seen, {} copied ({} written), {} failed",
            tally.keys,
            tally.copied,
            format_bytes(tally.bytes),
            tally.failed
        );
        if let Some(error) = &tally.last_error {
            println!("  last problem: {error}");
        }
        moved_any = true;
    }
    if !moved_any {
        println!("pools are within {tolerance_percent}% of their share: nothing moved");
    }
    Ok(())
}

/// Whether pool index `pool` of `map` is made of nodes at exactly the addresses of `nodes`.
fn same_nodes(map: &cluster::ClusterMap, pool: usize, nodes: &[NodeSpec]) -> bool {
    let members = map.pool_nodes(pool);
    members.len() == nodes.len() && members.iter().zip(nodes).all(|(&i, spec)| map.nodes[i].addr == spec.addr)
}

/// Keys `pool status` counts in a draining pool before it stops counting.
const STATUS_KEYS_MAX: u64 = 100_000;

async fn status(client: &client::Client) -> anyhow::Result<()> {
    let map = client.fresh_map().await;
    let spaces = client.node_space().await;
    for (pool_idx, pool) in map.pools.iter().enumerate() {
        let sets = &map.sets[pool.sets.clone()];
        let node_idxs = map.pool_nodes(pool_idx);
        let ids: Vec<&str> = node_idxs.iter().map(|&i| map.nodes[i].id.as_str()).collect();
        let (mut free, mut total, mut silent) = (0u64, 0u64, Vec::new());
        for &node_idx in &node_idxs {
            match &spaces[node_idx].drives {
                Ok(drives) => {
                    free += drives.iter().map(|d| d.free_bytes).sum::<u64>();
                    total += drives.iter().map(|d| d.total_bytes).sum::<u64>();
                }
                Err(reason) => silent.push(format!("{}: {reason}", map.nodes[node_idx].id)),
            }
        }
        println!(
            "pool {}\t{}\t{} set(s) of {}\tnodes {}\tfree {} of {} (raw, before parity)",
            pool.id,
            pool.state,
            sets.len(),
            pool.erasure,
            ids.join(","),
            format_bytes(free),
            format_bytes(total)
        );
        if !silent.is_empty() {
            println!("  not counted: {}", silent.join("; "));
        }
        if pool.state == PoolState::Draining {
            match pool_move::usage(client, pool.id, STATUS_KEYS_MAX).await {
                Ok(left) if left.keys >= STATUS_KEYS_MAX => {
                    println!("  draining: {STATUS_KEYS_MAX} or more keys left to move")
                }
                Ok(left) => println!("  draining: {} keys ({}) left to move", left.keys, format_bytes(left.bytes)),
                Err(e) => println!("  draining: cannot list what is left ({e:#})"),
            }
        }
    }
    if spaces.iter().all(|s| s.drives.is_err()) {
        bail!("no node answered");
    }
    Ok(())
}
