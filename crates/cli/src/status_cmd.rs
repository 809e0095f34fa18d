//! `tessera status [--json]`: the running cluster at a glance: nodes, drives, erasure sets and
//! their health, repair. Exits non-zero when a node is down, a drive cannot answer or a set has
//! lost a drive.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::bail;
use serde::Serialize;

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

#[derive(Debug, Serialize)]
struct Status {
    cluster_id: String,
    map_version: u64,
    /// `ok`, or `degraded` when anything below is down, unreadable or short of a drive.
    health: &'static str,
    nodes: Vec<NodeStatus>,
    sets: Vec<SetStatus>,
    repair: RepairSummary,
}

#[derive(Debug, Serialize)]
struct NodeStatus {
    id: String,
    addr: String,
    up: bool,
    /// Why the node did not answer.
    error: Option<String>,
    version: Option<String>,
    uptime_s: Option<u64>,
    map_version: Option<u64>,
    connections: Option<u64>,
    drives: Vec<DriveStatus>,
}

#[derive(Debug, Serialize)]
struct DriveStatus {
    /// 1-based, as the CLI names drives.
    drive: usize,
    path: String,
    total_bytes: Option<u64>,
    used_bytes: Option<u64>,
    free_bytes: Option<u64>,
    /// Object versions with data on the drive (multipart pieces included).
    versions: Option<u64>,
    /// I/O and database errors since the node started.
    errors: Option<u64>,
    rebuilding: bool,
    /// Why the drive could not answer.
    problem: Option<String>,
}

#[derive(Debug, Serialize)]
struct SetStatus {
    set: usize,
    pool: Option<u32>,
    erasure: String,
    /// `node/drive` of each drive, in set order.
    drives: Vec<String>,
    /// Those not serving: node down, drive unreadable or being rebuilt.
    out: Vec<String>,
    /// `ok`; `degraded` (readable and writable with up to m drives out); `unavailable` (more
    /// than m out: some objects cannot be read).
    health: &'static str,
}

#[derive(Debug, Default, Serialize)]
struct RepairSummary {
    /// Repair queue entries over all drives (a version below full redundancy is queued on the
    /// drives that hold it).
    queued_entries: u64,
    queued_bytes: u64,
    /// Queued versions with fewer than k+1 healthy chunks.
    at_risk: u64,
    bytes_repaired: u64,
    versions_repaired: u64,
    paused_nodes: Vec<String>,
    /// Nodes whose repair status could not be read.
    unknown_nodes: Vec<String>,
}

pub(crate) fn run(args: &StatusArgs) -> anyhow::Result<()> {
    crate::init_logging("error");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let status = runtime.block_on(async {
        let client = crate::object_cmd::connect(&args.config)?;
        let map = client.fresh_map().await;
        let (infos, repairs) = tokio::join!(client.node_info(), client.repair_status());
        anyhow::Ok(gather(&map, infos, repairs))
    })?;
    if args.json {
        println!("{}", serde_json::to_string(&status)?);
    } else {
        print_tables(&status);
    }
    if status.health != "ok" {
        let down: Vec<&str> = status.nodes.iter().filter(|n| !n.up).map(|n| n.id.as_str()).collect();
        let sets = status.sets.iter().filter(|s| s.health != "ok").count();
        bail!(
            "cluster degraded: {} node(s) down ({}), {sets} erasure set(s) short of a drive",
            down.len(),
            down.join(", ")
        );
    }
    Ok(())
}

fn gather(
    map: &cluster::ClusterMap,
    infos: Vec<(String, Result<client::NodeInfo, String>)>,
    repairs: Vec<(String, Result<client::RepairStatus, client::Error>)>,
) -> Status {
    let mut nodes = Vec::with_capacity(map.nodes.len());
    for (node, (id, answer)) in map.nodes.iter().zip(infos) {
        debug_assert_eq!(node.id, id, "answers come in node order");
        let path = |idx: usize| node.drives.get(idx).map(|p| p.display().to_string()).unwrap_or_default();
        let status = match answer {
            Ok(info) => NodeStatus {
                id,
                addr: node.addr.to_string(),
                up: true,
                error: None,
                version: Some(info.version),
                uptime_s: Some(info.uptime_ms / 1000),
                map_version: Some(info.map_version),
                connections: Some(info.connections),
                drives: info
                    .drives
                    .into_iter()
                    .enumerate()
                    .map(|(idx, d)| {
                        let known = d.problem.is_none() || d.total_bytes > 0;
                        DriveStatus {
                            drive: idx + 1,
                            path: path(idx),
                            total_bytes: known.then_some(d.total_bytes),
                            used_bytes: known.then_some(d.total_bytes.saturating_sub(d.free_bytes)),
                            free_bytes: known.then_some(d.free_bytes),
                            versions: d.versions,
                            errors: Some(d.errors),
                            rebuilding: d.rebuilding,
                            problem: d.problem,
                        }
                    })
                    .collect(),
            },
            Err(error) => NodeStatus {
                id,
                addr: node.addr.to_string(),
                up: false,
                error: Some(error),
                version: None,
                uptime_s: None,
                map_version: None,
                connections: None,
                drives: (0..node.drives.len())
                    .map(|idx| DriveStatus {
                        drive: idx + 1,
                        path: path(idx),
                        total_bytes: None,
                        used_bytes: None,
                        free_bytes: None,
                        versions: None,
                        errors: None,
                        rebuilding: false,
                        problem: None,
                    })
                    .collect(),
            },
        };
        nodes.push(status);
    }
    // A drive is out when its node is down, it cannot answer, or it is being rebuilt.
    let out: BTreeSet<(usize, usize)> = nodes
        .iter()
        .enumerate()
        .flat_map(|(node_idx, n)| {
            n.drives
                .iter()
                .filter(move |d| !n.up || d.problem.is_some() || d.rebuilding)
                .map(move |d| (node_idx, d.drive - 1))
        })
        .collect();
    let sets = map
        .sets
        .iter()
        .enumerate()
        .map(|(set_idx, set)| {
            let pool = map.pool_of_set(set_idx).map(|p| &map.pools[p]);
            let erasure = pool.map_or(map.erasure, |p| p.erasure);
            let name = |d: &cluster::DriveRef| format!("{}/{}", map.nodes[d.node_idx].id, d.drive_idx + 1);
            let out_here: Vec<String> =
                set.drives.iter().filter(|d| out.contains(&(d.node_idx, d.drive_idx))).map(name).collect();
            let health = match out_here.len() {
                0 => "ok",
                n if n <= erasure.m => "degraded",
                _ => "unavailable",
            };
            SetStatus {
                set: set_idx,
                pool: pool.map(|p| p.id),
                erasure: erasure.to_string(),
                drives: set.drives.iter().map(name).collect(),
                out: out_here,
                health,
            }
        })
        .collect::<Vec<_>>();
    let mut repair = RepairSummary::default();
    for (node, answer) in repairs {
        match answer {
            Ok(status) => {
                if status.paused {
                    repair.paused_nodes.push(node);
                }
                for drive in &status.drives {
                    repair.queued_entries += drive.queued_versions;
                    repair.queued_bytes += drive.queued_bytes;
                    repair.at_risk += drive.at_risk;
                    repair.bytes_repaired += drive.bytes_repaired;
                    repair.versions_repaired += drive.versions_repaired;
                }
            }
            Err(_) => repair.unknown_nodes.push(node),
        }
    }
    let healthy = nodes.iter().all(|n| n.up && n.drives.iter().all(|d| d.problem.is_none()))
        && sets.iter().all(|s| s.health == "ok");
    Status {
        cluster_id: map.cluster_id.clone(),
        map_version: map.version,
        health: if healthy { "ok" } else { "degraded" },
        nodes,
        sets,
        repair,
    }
}

fn print_tables(status: &Status) {
    let up = status.nodes.iter().filter(|n| n.up).count();
    println!(
        "cluster {} (map version {}): {}, {} of {} nodes up",
        status.cluster_id,
        status.map_version,
        status.health,
        up,
        status.nodes.len()
    );
    println!();
    println!(
        "{:<8} {:<22} {:<5} {:<9} {:>12} {:>4} {:>6}",
        "NODE", "ADDRESS", "STATE", "VERSION", "UPTIME", "MAP", "CONNS"
    );
    for node in &status.nodes {
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
    for node in &status.nodes {
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
