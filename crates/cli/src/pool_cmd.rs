//! `tessera pool add|activate|status`: grow the cluster by a pool of erasure sets on new nodes,
//! and see how full each pool is.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use cluster::{ErasureConfig, NodeSpec};

use crate::ConfigArg;

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
        /// Erasure config of the new pool's sets: the cluster's (every pool uses it today).
        #[arg(long)]
        ec: Option<ErasureConfig>,
    },
    /// Start using joining pool ID: once every one of its nodes answers with the current map
    /// and holds the cluster's buckets, the next map version makes it active. Existing objects
    /// stay where they are; keys written from then on go to a pool drawn in proportion to free
    /// space (a key's later versions follow its first), and every read and write asks it.
    Activate {
        /// The pool's id (`tessera pool status`).
        id: u32,
    },
    /// Each pool: its state, nodes, sets, and free and total bytes.
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
        next.erasure,
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

/// Whether pool index `pool` of `map` is made of nodes at exactly the addresses of `nodes`.
fn same_nodes(map: &cluster::ClusterMap, pool: usize, nodes: &[NodeSpec]) -> bool {
    let members = map.pool_nodes(pool);
    members.len() == nodes.len() && members.iter().zip(nodes).all(|(&i, spec)| map.nodes[i].addr == spec.addr)
}

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
            map.erasure,
            ids.join(","),
            crate::size::format_bytes(free),
            crate::size::format_bytes(total)
        );
        if !silent.is_empty() {
            println!("  not counted: {}", silent.join("; "));
        }
    }
    if spaces.iter().all(|s| s.drives.is_err()) {
        bail!("no node answered");
    }
    Ok(())
}
