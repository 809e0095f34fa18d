//! Operations on the nodes themselves (not on objects): background repair status and control,
//! and replacing a drive.

use proto::{NodeInfo, RepairAction, RepairStatus, Request, Response};

use crate::{Client, Error};

impl Client {
    /// Every node's repair state, by node id; a node that does not answer gives its error.
    pub async fn repair_status(&self) -> Vec<(String, Result<RepairStatus, Error>)> {
        let client = self.current();
        let results = client.repair_status_once().await;
        if self.refreshed_after(&client, results.iter().any(|(_, r)| r.is_err())).await {
            return self.current().repair_status_once().await;
        }
        results
    }

    async fn repair_status_once(&self) -> Vec<(String, Result<RepairStatus, Error>)> {
        let calls = (0..self.topo.map.nodes.len()).map(|node_idx| async move {
            let result = match self.call_now(node_idx, &Request::RepairStatus).await {
                Ok(Response::RepairStatus { status }) => Ok(status),
                Ok(Response::Error { kind, message }) => Err(Error::from_node(self.node_id(node_idx), kind, &message)),
                Ok(other) => Err(Error::Protocol {
                    node: self.node_id(node_idx).to_owned(),
                    source: proto::Error::Invalid { what: "repair status", reason: format!("unexpected {other:?}") },
                }),
                Err(e) => Err(e),
            };
            (self.node_id(node_idx).to_owned(), result)
        });
        futures_util::future::join_all(calls).await
    }

    /// Pauses, resumes or re-rates background repair on every node; returns each node's result.
    pub async fn repair_control(&self, action: RepairAction) -> Vec<(String, Result<(), Error>)> {
        let client = self.current();
        let results = client.repair_control_once(action).await;
        if self.refreshed_after(&client, results.iter().any(|(_, r)| r.is_err())).await {
            return self.current().repair_control_once(action).await;
        }
        results
    }

    async fn repair_control_once(&self, action: RepairAction) -> Vec<(String, Result<(), Error>)> {
        let request = Request::RepairControl { action };
        let calls = (0..self.topo.map.nodes.len()).map(|node_idx| {
            let request = &request;
            async move {
                let result = match self.call_now(node_idx, request).await {
                    Ok(Response::Ok) => Ok(()),
                    Ok(Response::Error { kind, message }) => {
                        Err(Error::from_node(self.node_id(node_idx), kind, &message))
                    }
                    Ok(other) => Err(Error::Protocol {
                        node: self.node_id(node_idx).to_owned(),
                        source: proto::Error::Invalid {
                            what: "repair control",
                            reason: format!("unexpected {other:?}"),
                        },
                    }),
                    Err(e) => Err(e),
                };
                (self.node_id(node_idx).to_owned(), result)
            }
        });
        futures_util::future::join_all(calls).await
    }

    /// Tells node `node_id` that its drive `drive_idx` (0-based) was replaced or is not to be
    /// trusted: the node wipes it and rebuilds it from the drive's set, and readers skip it
    /// meanwhile. Fails for an unknown node or drive, before anything changes.
    pub async fn replace_drive(&self, node_id: &str, drive_idx: usize) -> Result<(), Error> {
        self.with_map(|c| async move { c.replace_drive_once(node_id, drive_idx).await }).await
    }

    async fn replace_drive_once(&self, node_id: &str, drive_idx: usize) -> Result<(), Error> {
        let map = &self.topo.map;
        let Some(node_idx) = map.node_idx(node_id) else {
            let known: Vec<&str> = map.nodes.iter().map(|n| n.id.as_str()).collect();
            return Err(Error::NoSuchDrive(format!("unknown node {node_id:?}: the cluster has {}", known.join(", "))));
        };
        let drives = map.nodes[node_idx].drives.len();
        if drive_idx >= drives {
            return Err(Error::NoSuchDrive(format!(
                "node {node_id} has {drives} drive{} (1 to {drives}), not drive {}",
                if drives == 1 { "" } else { "s" },
                drive_idx + 1
            )));
        }
        match self.call_now(node_idx, &Request::DriveReplace { drive: drive_idx as u32 }).await? {
            Response::Ok => Ok(()),
            Response::Error { kind, message } => Err(Error::from_node(node_id, kind, &message)),
            other => Err(Error::Protocol {
                node: node_id.to_owned(),
                source: proto::Error::Invalid { what: "drive replace", reason: format!("unexpected {other:?}") },
            }),
        }
    }
}

/// What one node holds of the cluster map.
#[derive(Clone, Debug)]
pub struct NodeMap {
    pub node: String,
    /// The node's map, or why it could not be read.
    pub map: Result<cluster::ClusterMap, String>,
}

/// The space of one node's drives.
#[derive(Clone, Debug)]
pub struct NodeSpace {
    pub node: String,
    /// Per drive, in the node's order; or why the node could not tell.
    pub drives: Result<Vec<proto::DriveSpace>, String>,
}

impl Client {
    /// Free and total bytes of every drive of every node (in node order), as the nodes' file
    /// systems report them.
    pub async fn node_space(&self) -> Vec<NodeSpace> {
        let answers = self
            .ask_every_node(&Request::Space, |response| match response {
                Response::Space { drives } => Ok(drives),
                other => Err(other),
            })
            .await;
        answers.into_iter().map(|(node, drives)| NodeSpace { node, drives }).collect()
    }

    /// Every node's build, uptime, map version and drives (`tessera status`), or why it could
    /// not be asked.
    pub async fn node_info(&self) -> Vec<(String, Result<NodeInfo, String>)> {
        self.ask_every_node(&Request::NodeInfo, |response| match response {
            Response::NodeInfo { info } => Ok(info),
            other => Err(other),
        })
        .await
    }

    /// The buckets each node holds (in node order), internal ones included, or why it could
    /// not tell.
    pub async fn node_buckets(&self) -> Vec<(String, Result<Vec<String>, String>)> {
        self.ask_every_node(&Request::BucketList, |response| match response {
            Response::Buckets { buckets } => Ok(buckets.into_iter().map(|b| b.name).collect()),
            other => Err(other),
        })
        .await
    }

    /// `request` to every node of the newest map this client knows, at once; per node (in node
    /// order) its id and what `answer` takes from its response (which it hands back if it is
    /// not the expected kind), or why there is none.
    async fn ask_every_node<T>(
        &self,
        request: &Request,
        answer: impl Fn(Response) -> Result<T, Response>,
    ) -> Vec<(String, Result<T, String>)> {
        let client = self.current();
        let calls = (0..client.topo.map.nodes.len()).map(|node_idx| {
            let (client, answer) = (&client, &answer);
            async move {
                let taken = match client.call_now(node_idx, request).await {
                    Ok(Response::Error { message, .. }) => Err(message),
                    Ok(response) => answer(response).map_err(|other| format!("unexpected answer {other:?}")),
                    Err(e) => Err(e.to_string()),
                };
                (client.node_id(node_idx).to_owned(), taken)
            }
        });
        futures_util::future::join_all(calls).await
    }

    /// The newest map a node holds that descends from the one this client knows (the client
    /// plans with it from now on), or the one it knows when no node holds a newer one: what an
    /// admin's change starts from when the local `cluster.toml` may be behind.
    pub async fn fresh_map(&self) -> std::sync::Arc<cluster::ClusterMap> {
        let known = self.map();
        let newest = self
            .node_maps()
            .await
            .into_iter()
            .filter_map(|node| node.map.ok())
            .filter(|map| known.check_descendant(map).is_ok())
            .max_by_key(|map| map.version);
        if let Some(map) = newest {
            self.adopt(map);
        }
        self.map()
    }

    /// The map every node of the newest map this client knows holds (in node order).
    pub async fn node_maps(&self) -> Vec<NodeMap> {
        let base_dir = self.map().base_dir.clone();
        let answers = self
            .ask_every_node(&Request::GetMap, |response| match response {
                Response::Map { toml } => {
                    Ok(cluster::ClusterMap::from_toml(&toml, &base_dir).map_err(|e| e.to_string()))
                }
                other => Err(other),
            })
            .await;
        answers.into_iter().map(|(node, map)| NodeMap { node, map: map.and_then(|parsed| parsed) }).collect()
    }

    /// Makes `next` the cluster's map: an admin's change (today a node's new address), the
    /// version after the one the nodes hold. Refused, changing nothing, unless a majority of
    /// the current map's nodes in active pools answer (a joining pool's may not run yet), every
    /// node that answers holds the map of version
    /// `next.version - 1` (or `next` already: a push cut short can be run again), and `next` keeps every
    /// node, drive and set of it (`ClusterMap::check_successor`). Each node then checks the
    /// version it holds, stores `next` durably and serves under it; clients with the old map are
    /// told to refresh. Nodes that did not answer (down, or the dead host whose address the
    /// change replaces) take the new map from their peers when they return. Returns their ids.
    pub async fn push_map(&self, next: &cluster::ClusterMap) -> Result<Vec<String>, Error> {
        let held = self.node_maps().await;
        let mut current: Option<cluster::ClusterMap> = None;
        let mut problems = Vec::new();
        let mut silent = Vec::new();
        for node in &held {
            match &node.map {
                Ok(map) if map == next => {}
                Ok(map) => match &current {
                    None => current = Some(map.clone()),
                    Some(c) if c == map => {}
                    Some(c) => problems.push(format!(
                        "node {} holds map version {}, others {}: finish or undo the change in progress first",
                        node.node, map.version, c.version
                    )),
                },
                Err(reason) => silent.push((node.node.clone(), reason.clone())),
            }
        }
        // A majority of the active and draining pools' nodes must answer: a joining pool's nodes
        // may not run yet, a removed pool's may be gone (they are told if they answer, and take
        // the map from their peers otherwise).
        let known = self.map();
        let voters: Vec<&str> = (0..known.pools.len())
            .filter(|&pool| known.pools[pool].is_read())
            .flat_map(|pool| known.pool_nodes(pool))
            .map(|node_idx| known.nodes[node_idx].id.as_str())
            .collect();
        let silent_voters: Vec<&(String, String)> =
            silent.iter().filter(|(node, _)| voters.contains(&node.as_str())).collect();
        if silent_voters.len() * 2 >= voters.len() {
            let reasons: Vec<String> = silent_voters.iter().map(|(node, reason)| format!("{node}: {reason}")).collect();
            problems.push(format!(
                "{} of {} nodes of active pools did not answer, a map change needs a majority ({})",
                silent_voters.len(),
                voters.len(),
                reasons.join("; ")
            ));
        }
        if !problems.is_empty() {
            return Err(Error::MapChange(problems.join("; ")));
        }
        let silent: Vec<String> = silent.into_iter().map(|(node, _)| node).collect();
        let Some(current) = current else {
            // Every node that answered holds `next` already.
            self.adopt(next.clone());
            return Ok(silent);
        };
        current.check_successor(next)?;
        let client = self.current();
        let request = Request::MapPut { expected_version: current.version, toml: next.to_toml() };
        let answered = (0..client.topo.map.nodes.len()).filter(|&idx| !silent.iter().any(|s| s == client.node_id(idx)));
        let calls = answered.map(|node_idx| {
            let (client, request) = (&client, &request);
            async move { (node_idx, client.call_now(node_idx, request).await) }
        });
        let mut failed = Vec::new();
        for (node_idx, answer) in futures_util::future::join_all(calls).await {
            let node = client.node_id(node_idx);
            match answer {
                Ok(Response::Ok) => {}
                Ok(Response::Error { message, .. }) => failed.push(format!("node {node}: {message}")),
                Ok(other) => failed.push(format!("node {node}: unexpected answer {other:?}")),
                Err(e) => failed.push(e.to_string()),
            }
        }
        if !failed.is_empty() {
            return Err(Error::MapChange(format!(
                "version {} reached only some nodes ({}); run the change again to finish it",
                next.version,
                failed.join("; ")
            )));
        }
        self.adopt(next.clone());
        Ok(silent)
    }

    /// Plans with `map` from now on (a map this client just made the cluster's).
    fn adopt(&self, map: cluster::ClusterMap) {
        let mut latest = self.inner.latest.write().expect("map lock poisoned");
        if latest.map.version < map.version {
            *latest = std::sync::Arc::new(crate::Topology::new(map, self.inner.tls.clone()));
        }
    }
}
