//! `tessera drive replace --node ID --drive N`: a drive was swapped or is not to be trusted;
//! `tessera drive format --node ID`: prepare a new node's drives on its host.

use anyhow::Context as _;

use crate::ConfigArg;

#[derive(Debug, clap::Args)]
pub(crate) struct DriveArgs {
    #[command(subcommand)]
    action: DriveAction,
    #[command(flatten)]
    config: ConfigArg,
}

#[derive(Debug, clap::Subcommand)]
enum DriveAction {
    /// Wipe a drive and rebuild it from the other drives of its erasure set. Readers skip it
    /// until the rebuild ends; `tessera repair status` shows its progress. Each drive being
    /// rebuilt counts as one of the m failures the cluster survives.
    Replace {
        /// Node id from cluster.toml (n1, n2, ...).
        #[arg(long)]
        node: String,
        /// Drive number on that node, from 1 (as `tessera repair status` shows it).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        drive: u32,
    },
    /// Prepare the drives of a node of a new cluster (or of a node just added to one) on its
    /// own host: create the drive directories in cluster.toml and label them with the
    /// cluster's id. Run it once per node before its first start. Not for a replaced disk: a
    /// node started on an empty drive directory rebuilds it instead. Refuses, changing
    /// nothing, if a drive belongs to another cluster.
    Format {
        /// Node id from cluster.toml (n1, n2, ...).
        #[arg(long)]
        node: String,
    },
}

pub(crate) fn run(args: &DriveArgs) -> anyhow::Result<()> {
    crate::init_logging("warn");
    if let DriveAction::Format { node } = &args.action {
        let path = args.config.config.as_deref().context("--config is required (the node's cluster.toml)")?;
        let (map, _) = crate::cluster_cmd::load_map(path)?;
        node::format_node_drives(&map, node)?;
        let node_idx = map.node_idx(node).expect("format_node_drives checked the id");
        for drive_idx in 0..map.nodes[node_idx].drives.len() {
            println!("{}", map.drive_path(cluster::DriveRef { node_idx, drive_idx }).display());
        }
        println!("node {node}: drives ready; start it with `tessera node --config {} --id {node}`", path.display());
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let client = crate::object_cmd::connect(&args.config)?;
        match &args.action {
            DriveAction::Replace { node, drive } => {
                client.replace_drive(node, *drive as usize - 1).await?;
                println!("node {node} drive {drive}: wiped; rebuilding from its set (see `tessera repair status`)");
            }
            DriveAction::Format { .. } => unreachable!("handled above"),
        }
        Ok(())
    })
}
