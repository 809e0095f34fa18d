//! Operations on the nodes themselves (not on objects): background repair status and control,
//! and replacing a drive.

use proto::{RepairAction, RepairStatus, Request, Response};

use crate::{Client, Error};

impl Client {
    /// Every node's repair state, by node id; a node that does not answer gives its error.
    pub async fn repair_status(&self) -> Vec<(String, Result<RepairStatus, Error>)> {
        let calls = (0..self.inner.map.nodes.len()).map(|node_idx| async move {
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
        let request = Request::RepairControl { action };
        let calls = (0..self.inner.map.nodes.len()).map(|node_idx| {
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
        let map = &self.inner.map;
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
