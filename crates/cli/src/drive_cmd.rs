//! `tessera drive replace --node ID --drive N`: a drive was swapped or is not to be trusted.

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
}

pub(crate) fn run(args: &DriveArgs) -> anyhow::Result<()> {
    crate::init_logging("warn");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let client = crate::object_cmd::connect(&args.config)?;
        match &args.action {
            DriveAction::Replace { node, drive } => {
                client.replace_drive(node, *drive as usize - 1).await?;
                println!("node {node} drive {drive}: wiped; rebuilding from its set (see `tessera repair status`)");
            }
        }
        Ok(())
    })
}
