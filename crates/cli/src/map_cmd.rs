//! `tessera map status|push FILE`: the cluster map the nodes hold, and an admin's change to it
//! (today a node's address; capacity grows by pools).

use std::path::PathBuf;

use anyhow::{Context as _, bail};

use crate::ConfigArg;

#[derive(Debug, clap::Args)]
pub(crate) struct MapArgs {
    #[command(subcommand)]
    action: MapAction,
    #[command(flatten)]
    config: ConfigArg,
}

#[derive(Debug, clap::Subcommand)]
enum MapAction {
    /// The map version each node holds (they agree unless a change is in progress).
    Status,
    /// Make FILE (an edited copy of cluster.toml: a node's new address) the cluster's map, as
    /// the version after FILE's, on every node; then write it to --config too. Refused,
    /// changing nothing, unless a majority of nodes answer, all that answer hold the map FILE
    /// was copied from (its version), and FILE keeps every node, drive and erasure set. Nodes
    /// that do not answer take the new map from their peers when they return.
    Push {
        /// The edited map, its `version` left as it was in the copy.
        file: PathBuf,
    },
}

pub(crate) fn run(args: &MapArgs) -> anyhow::Result<()> {
    crate::init_logging("warn");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let client = crate::object_cmd::connect(&args.config)?;
        match &args.action {
            MapAction::Status => status(&client).await,
            MapAction::Push { file } => {
                let config = args.config.config.as_deref().context("--config is required")?;
                push(&client, file, config).await
            }
        }
    })
}

async fn status(client: &client::Client) -> anyhow::Result<()> {
    let maps = client.node_maps().await;
    let mut versions = std::collections::BTreeSet::new();
    let mut unreachable = 0;
    for node in &maps {
        match &node.map {
            Ok(map) => {
                versions.insert(map.version);
                println!("{}\tversion {}\tcluster {}", node.node, map.version, map.cluster_id);
            }
            Err(reason) => {
                unreachable += 1;
                println!("{}\tunreachable\t{reason}", node.node);
            }
        }
    }
    match versions.len() {
        0 => bail!("no node answered"),
        1 if unreachable == 0 => {
            println!("all {} nodes hold version {}", maps.len(), versions.first().expect("one version"));
        }
        1 => println!("{unreachable} of {} nodes did not answer", maps.len()),
        _ => println!("nodes disagree (versions {versions:?}): a change is in progress; `tessera map push` it again"),
    }
    Ok(())
}

async fn push(client: &client::Client, file: &std::path::Path, config: &std::path::Path) -> anyhow::Result<()> {
    let (mut next, _) = crate::cluster_cmd::load_map(file)?;
    // Drive paths resolve against the directory of --config, as every command reads them.
    next.base_dir = client.map().base_dir.clone();
    // The file is an edited copy of the map at its `version`: the change is the next one, and
    // only nodes that still hold that version take it (an edit of an older map never undoes a
    // newer change).
    next.version += 1;
    let silent = client.push_map(&next).await?;
    crate::cluster_cmd::write_map(config, &next)?;
    if silent.is_empty() {
        println!("every node holds map version {}; wrote {}", next.version, config.display());
    } else {
        println!(
            "map version {} is on every node but {} (they did not answer and take it from their peers when they return); wrote {}",
            next.version,
            silent.join(", "),
            config.display()
        );
    }
    Ok(())
}
