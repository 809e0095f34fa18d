//! Operations on the nodes themselves (not on objects): background repair status and control.

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
}
