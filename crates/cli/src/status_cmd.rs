//! `tessera status [--json]`: the running cluster at a glance: nodes, drives, erasure sets and
//! their health, repair. Exits non-zero when a node is down, a drive cannot answer or a set has
//! lost a drive.

use std::time::Duration;

use anyhow::bail;
use client::ClusterStatus;

use crate::ConfigArg;
use crate::size::format_bytes;

#[derive(Debug, clap::Args)]
pub(crate) struct StatusArgs {
    /// One JSON object (for scripts) instead of tables.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    config: ConfigArg,
}

pub(crate) fn run(args: &StatusArgs) -> anyhow::Result<()> {
    crate::init_logging("error");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let status = runtime.block_on(async {
        let client = crate::object_cmd::connect(&args.config)?;
        anyhow::Ok(client.cluster_status().await)
    })?;
    if args.json {
        println!("{}", serde_json::to_string(&status)?);
    } else {
        print_tables(&status);
    }
    if status.health != "ok" {
        let down: Vec<&str> = status.nodes.iter().filter(|n| !n.up && !n.removed).map(|n| n.id.as_str()).collect();
        let sets = status.sets.iter().filter(|s| s.health != "ok").count();
        bail!(
            "cluster degraded: {} node(s) down ({}), {sets} erasure set(s) short of a drive",
            down.len(),
            down.join(", ")
        );
    }
    Ok(())
}

fn print_tables(status: &ClusterStatus) {
    let serving = status.nodes.iter().filter(|n| !n.removed).count();
    let up = status.nodes.iter().filter(|n| n.up && !n.removed).count();
    println!(
        "cluster {} (map version {}): {}, {} of {} nodes up; node protocol over {}",
        status.cluster_id,
        status.map_version,
        status.health,
        up,
        serving,
        if status.node_tls { "TLS" } else { "plain TCP" }
    );
    println!();
    println!(
        "{:<8} {:<22} {:<5} {:<9} {:>12} {:>4} {:>6}",
        "NODE", "ADDRESS", "STATE", "VERSION", "UPTIME", "MAP", "CONNS"
    );
    for node in &status.nodes {
        if node.removed {
            let state = if node.up { "up" } else { "down" };
            println!(
                "{:<8} {:<22} {:<5} in a removed pool: holds nothing, may be shut down",
                node.id, node.addr, state
            );
            continue;
        }
        if !node.up {
            println!("{:<8} {:<22} {:<5} {}", node.id, node.addr, "down", node.error.as_deref().unwrap_or_default());
            continue;
        }
        let uptime = node.uptime_s.map(|s| humantime::format_duration(Duration::from_secs(s)).to_string());
        println!(
            "{:<8} {:<22} {:<5} {:<9} {:>12} {:>4} {:>6}",
            node.id,
            node.addr,
            "up",
            node.version.as_deref().unwrap_or("-"),
            uptime.as_deref().unwrap_or("-"),
            node.map_version.map_or("-".into(), |v| v.to_string()),
            node.connections.map_or("-".into(), |c| c.to_string()),
        );
    }
    println!();
    println!(
        "{:<10} {:>10} {:>10} {:>5} {:>10} {:>7}  {:<10} PATH",
        "DRIVE", "SIZE", "USED", "USE%", "VERSIONS", "ERRORS", "STATE"
    );
    let or_dash = |v: Option<u64>, f: fn(u64) -> String| v.map_or("-".to_owned(), f);
    for node in status.nodes.iter().filter(|n| !n.removed) {
        for drive in &node.drives {
            let state = if !node.up {
                "node down".to_owned()
            } else if let Some(problem) = &drive.problem {
                format!("error: {problem}")
            } else if drive.rebuilding {
                "rebuilding".to_owned()
            } else {
                "ok".to_owned()
            };
            let percent = match (drive.used_bytes, drive.total_bytes) {
                (Some(used), Some(total)) if total > 0 => format!("{}%", used * 100 / total),
                _ => "-".to_owned(),
            };
            println!(
                "{:<10} {:>10} {:>10} {:>5} {:>10} {:>7}  {:<10} {}",
                format!("{}/{}", node.id, drive.drive),
                or_dash(drive.total_bytes, format_bytes),
                or_dash(drive.used_bytes, format_bytes),
                percent,
                or_dash(drive.versions, |v| v.to_string()),
                or_dash(drive.errors, |v| v.to_string()),
                state,
                drive.path
            );
        }
    }
    println!();
    println!("{:<5} {:<5} {:<8} {:<12} HEALTH", "SET", "POOL", "ERASURE", "OUT");
    for set in &status.sets {
        let out = if set.out.is_empty() { "-".to_owned() } else { set.out.join(",") };
        println!(
            "{:<5} {:<5} {:<8} {:<12} {}",
            set.set,
            set.pool.map_or("-".into(), |p| p.to_string()),
            set.erasure,
            out,
            set.health
        );
    }
    println!();
    let repair = &status.repair;
    let mut line = format!(
        "repair: {} queued ({}), {} at risk; {} versions ({}) repaired since the nodes started",
        repair.queued_entries,
        format_bytes(repair.queued_bytes),
        repair.at_risk,
        repair.versions_repaired,
        format_bytes(repair.bytes_repaired)
    );
    if !repair.paused_nodes.is_empty() {
        line.push_str(&format!("; paused on {}", repair.paused_nodes.join(", ")));
    }
    if !repair.unknown_nodes.is_empty() {
        line.push_str(&format!("; unknown on {}", repair.unknown_nodes.join(", ")));
    }
    println!("{line}");
}
