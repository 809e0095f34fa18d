//! The cluster at a glance, as `tessera status` prints it and the console's cluster page shows
//! it: nodes, drives, erasure sets and their health, repair. Asked of every node at once.

use std::collections::BTreeSet;

use serde::Serialize;

use crate::{Client, Error, NodeInfo, RepairStatus};

impl Client {
    /// Every node's state, the health of every erasure set, and repair, from the newest map a
    /// node holds. A node that does not answer is down (with why).
    pub async fn cluster_status(&self) -> ClusterStatus {
        let map = self.fresh_map().await;
        let (infos, repairs) = tokio::join!(self.node_info(), self.repair_status());
        gather(&map, infos, repairs)
    }
}

/// The whole cluster: [`Client::cluster_status`].
#[derive(Debug, Serialize)]
pub struct ClusterStatus {
    pub cluster_id: String,
    pub map_version: u64,
    /// Whether the node protocol runs over TLS (the map has a cluster CA).
    pub node_tls: bool,
    /// `ok`, or `degraded` when anything below is down, unreadable or short of a drive.
    pub health: &'static str,
    pub nodes: Vec<NodeStatus>,
    pub sets: Vec<SetStatus>,
    pub repair: RepairSummary,
}

/// One node of the map, as it answered (or why it did not).
#[derive(Debug, Serialize)]
pub struct NodeStatus {
    pub id: String,
    pub addr: String,
    pub up: bool,
    /// All its drives are in pools since removed (decommissioned): it holds nothing, may be
    /// shut down, and its state does not count toward the cluster's health.
    pub removed: bool,
    /// Why the node did not answer.
    pub error: Option<String>,
    pub version: Option<String>,
    pub uptime_s: Option<u64>,
    pub map_version: Option<u64>,
    pub connections: Option<u64>,
    pub drives: Vec<DriveStatus>,
}

/// One drive of a node; sizes are `None` when its node is down or it cannot tell.
#[derive(Debug, Serialize)]
pub struct DriveStatus {
    /// 1-based, as the CLI names drives.
    pub drive: usize,
    pub path: String,
    pub total_bytes: Option<u64>,
    pub used_bytes: Option<u64>,
    pub free_bytes: Option<u64>,
    /// Object versions with data on the drive (multipart pieces included).
    pub versions: Option<u64>,
    /// I/O and database errors since the node started.
    pub errors: Option<u64>,
    pub rebuilding: bool,
    /// Why the drive could not answer.
    pub problem: Option<String>,
}

/// One erasure set and how many of its drives are out.
#[derive(Debug, Serialize)]
pub struct SetStatus {
    pub set: usize,
    pub pool: Option<u32>,
    pub erasure: String,
    /// `node/drive` of each drive, in set order.
    pub drives: Vec<String>,
    /// Those not serving: node down, drive unreadable or being rebuilt.
    pub out: Vec<String>,
    /// `ok`; `degraded` (readable and writable with up to m drives out); `unavailable` (more
    /// than m out: some objects cannot be read).
    pub health: &'static str,
}

/// Repair summed over every node that answered.
#[derive(Debug, Default, Serialize)]
pub struct RepairSummary {
    /// Repair queue entries over all drives (a version below full redundancy is queued on the
    /// drives that hold it).
    pub queued_entries: u64,
    pub queued_bytes: u64,
    /// Queued versions with fewer than k+1 healthy chunks.
    pub at_risk: u64,
    pub bytes_repaired: u64,
    pub versions_repaired: u64,
    pub paused_nodes: Vec<String>,
    /// Nodes whose repair status could not be read.
    pub unknown_nodes: Vec<String>,
}

fn gather(
    map: &cluster::ClusterMap,
    infos: Vec<(String, Result<NodeInfo, String>)>,
    repairs: Vec<(String, Result<RepairStatus, Error>)>,
) -> ClusterStatus {
    let removed_set = |set_idx: usize| {
        map.pool_of_set(set_idx).is_some_and(|pool| map.pools[pool].state == cluster::PoolState::Removed)
    };
    // Nodes whose every drive is in a removed pool's sets.
    let removed: Vec<bool> = (0..map.nodes.len())
        .map(|node_idx| {
            let mut sets =
                map.sets.iter().enumerate().filter(|(_, set)| set.drives.iter().any(|d| d.node_idx == node_idx));
            let mut any = false;
            let all_removed = sets.all(|(set_idx, _)| {
                any = true;
                removed_set(set_idx)
            });
            any && all_removed
        })
        .collect();
    let mut nodes = Vec::with_capacity(map.nodes.len());
    for (node_idx, (node, (id, answer))) in map.nodes.iter().zip(infos).enumerate() {
        let removed = removed[node_idx];
        debug_assert_eq!(node.id, id, "answers come in node order");
        let path = |idx: usize| node.drives.get(idx).map(|p| p.display().to_string()).unwrap_or_default();
        let status = match answer {
            Ok(info) => NodeStatus {
                id,
                addr: node.addr.to_string(),
                up: true,
                removed,
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
                removed,
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
    // A removed pool's sets hold nothing any more.
    let sets = map
        .sets
        .iter()
        .enumerate()
        .filter(|(set_idx, _)| !removed_set(*set_idx))
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
            Err(_) if nodes.iter().any(|n| n.id == node && n.removed) => {}
            Err(_) => repair.unknown_nodes.push(node),
        }
    }
    let healthy = nodes.iter().filter(|n| !n.removed).all(|n| n.up && n.drives.iter().all(|d| d.problem.is_none()))
        && sets.iter().all(|s| s.health == "ok");
    ClusterStatus {
        cluster_id: map.cluster_id.clone(),
        map_version: map.version,
        node_tls: map.node_tls.is_some(),
        health: if healthy { "ok" } else { "degraded" },
        nodes,
        sets,
        repair,
    }
}
