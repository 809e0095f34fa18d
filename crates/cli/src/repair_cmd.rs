//! `tessera repair status|pause|resume|rate R`: background repair on the running cluster.

use anyhow::bail;

use crate::ConfigArg;
use crate::size::{format_bytes, parse_bytes};

#[derive(Debug, clap::Args)]
pub(crate) struct RepairArgs {
    #[command(subcommand)]
    action: RepairAction,
    #[command(flatten)]
    config: ConfigArg,
}

#[derive(Debug, clap::Subcommand)]
enum RepairAction {
    /// Per node and drive: queued versions and bytes, at-risk versions, bytes repaired, ETA.
    Status {
        /// One JSON object per line, one line per node.
        #[arg(long)]
        json: bool,
    },
    /// Stop background repair on every node (queued work stays queued, across restarts too).
    Pause,
    /// Start it again.
    Resume,
    /// Set the byte budget per node, e.g. `200MiB/s` or `50MB` (per second).
    Rate {
        #[arg(value_parser = parse_rate)]
        rate: u64,
    },
}

pub(crate) fn parse_rate(text: &str) -> Result<u64, String> {
    let bytes = parse_bytes(text.trim().trim_end_matches("/s"))?;
    if bytes == 0 {
        return Err(format!("invalid rate {text:?}: it must be above 0 (use `tessera repair pause` to stop)"));
    }
    Ok(bytes)
}

pub(crate) fn run(args: &RepairArgs) -> anyhow::Result<()> {
    crate::init_logging("warn");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let client = crate::object_cmd::connect(&args.config)?;
        let action = match &args.action {
            RepairAction::Status { json } => return status(&client, *json).await,
            RepairAction::Pause => client::RepairAction::Pause,
            RepairAction::Resume => client::RepairAction::Resume,
            RepairAction::Rate { rate } => client::RepairAction::SetRate { bytes_per_s: *rate },
        };
        let results = client.repair_control(action).await;
        let failed: Vec<String> =
            results.iter().filter_map(|(node, r)| r.as_ref().err().map(|e| format!("{node}: {e}"))).collect();
        println!("{}: {} of {} nodes", describe(action), results.len() - failed.len(), results.len());
        if !failed.is_empty() {
            bail!("not applied on {} (they take it when asked again): {}", failed.len(), failed.join("; "));
        }
        Ok(())
    })
}

fn describe(action: client::RepairAction) -> String {
    match action {
        client::RepairAction::Pause => "repair paused".into(),
        client::RepairAction::Resume => "repair resumed".into(),
        client::RepairAction::SetRate { bytes_per_s } => format!("repair budget {}/s", format_bytes(bytes_per_s)),
    }
}

async fn status(client: &client::Client, json: bool) -> anyhow::Result<()> {
    let results = client.repair_status().await;
    let mut down = Vec::new();
    if !json {
        println!(
            "{:<6} {:<8} {:>11} {:>5} {:>10} {:>8} {:>12} {:>9} {:>8} {:>8}",
            "node", "state", "budget/s", "drive", "queued", "at risk", "queued bytes", "repaired", "failures", "ETA"
        );
    }
    for (node, result) in &results {
        let status = match result {
            Ok(status) => status,
            Err(e) => {
                down.push(node.clone());
                if json {
                    println!("{{\"node\":\"{node}\",\"error\":{:?}}}", e.to_string());
                } else {
                    println!("{node:<6} {:<8} {e}", "down");
                }
                continue;
            }
        };
        if json {
            println!("{}", status_json(node, status));
            continue;
        }
        let state = if status.paused { "paused" } else { "running" };
        for (idx, drive) in status.drives.iter().enumerate() {
            let state = if drive.rebuilding { "rebuild" } else { state };
            let eta = if drive.queued_bytes == 0 {
                "-".to_owned()
            } else if status.paused {
                "paused".to_owned()
            } else {
                humantime::format_duration(std::time::Duration::from_secs(
                    drive.queued_bytes / status.bytes_per_s.max(1) + 1,
                ))
                .to_string()
            };
            println!(
                "{node:<6} {state:<8} {:>11} {:>5} {:>10} {:>8} {:>12} {:>9} {:>8} {:>8}",
                format_bytes(status.bytes_per_s),
                idx + 1,
                drive.queued_versions,
                drive.at_risk,
                format_bytes(drive.queued_bytes),
                format_bytes(drive.bytes_repaired),
                drive.failed_attempts,
                eta
            );
            if drive.rebuilding || drive.rebuild_keys_checked > 0 {
                println!(
                    "{:<6} drive {} {}: {} keys checked, {} rebuilt",
                    "",
                    idx + 1,
                    if drive.rebuilding { "rebuilding (readers skip it)" } else { "rebuilt" },
                    drive.rebuild_keys_checked,
                    drive.rebuild_keys_rebuilt
                );
            }
        }
        println!("{:<6} {}", "", describe_scrub(&status.scrub));
    }
    if !down.is_empty() {
        bail!("{} of {} nodes did not answer: {}", down.len(), results.len(), down.join(", "));
    }
    Ok(())
}

fn describe_scrub(scrub: &client::ScrubStatus) -> String {
    let last = if scrub.last_pass_end_ms == 0 {
        "none finished yet".to_owned()
    } else {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let ago = now.saturating_sub(std::time::Duration::from_millis(scrub.last_pass_end_ms));
        format!("last ended {} ago", humantime::format_duration(std::time::Duration::from_secs(ago.as_secs())))
    };
    format!(
        "scrub: {} passes ({} deep), {last}{}; {} keys checked, {} problems queued for repair, {} delete markers collected",
        scrub.passes,
        scrub.deep_passes,
        if scrub.running { ", one running" } else { "" },
        scrub.keys_checked,
        scrub.problems_found,
        scrub.markers_collected
    )
}

fn status_json(node: &str, status: &client::RepairStatus) -> String {
    let drives: Vec<String> = status
        .drives
        .iter()
        .map(|d| {
            format!(
                "{{\"queued_versions\":{},\"queued_bytes\":{},\"at_risk\":{},\"bytes_repaired\":{},\"versions_repaired\":{},\"failed_attempts\":{},\"rebuilding\":{},\"rebuild_keys_checked\":{},\"rebuild_keys_rebuilt\":{}}}",
                d.queued_versions,
                d.queued_bytes,
                d.at_risk,
                d.bytes_repaired,
                d.versions_repaired,
                d.failed_attempts,
                d.rebuilding,
                d.rebuild_keys_checked,
                d.rebuild_keys_rebuilt
            )
        })
        .collect();
    format!(
        "{{\"node\":\"{node}\",\"paused\":{},\"bytes_per_s\":{},\"drives\":[{}],\"scrub\":{{\"passes\":{},\"deep_passes\":{},\"keys_checked\":{},\"problems_found\":{},\"markers_collected\":{},\"last_pass_end_ms\":{},\"running\":{}}}}}",
        status.paused,
        status.bytes_per_s,
        drives.join(","),
        status.scrub.passes,
        status.scrub.deep_passes,
        status.scrub.keys_checked,
        status.scrub.problems_found,
        status.scrub.markers_collected,
        status.scrub.last_pass_end_ms,
        status.scrub.running
    )
}
