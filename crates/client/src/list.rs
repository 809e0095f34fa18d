//! Buckets and listings: requests to every node (buckets) or every drive of every set (keys),
//! merged on the client.

use std::collections::BTreeMap;

use proto::{BucketEntry, ErrorKind, LIST_LIMIT_MAX, ListEntry, Request, Response};

use crate::{Client, Error};

/// Keys a listing resolves with one round of metadata reads ([`Client::list_as_reads`]): a
/// bound on the items of each node's request.
const LIST_HEADS_PER_BATCH: usize = 256;

/// The newest version the drives of a listing reported as current for a key.
struct Newest {
    entry: ListEntry,
    /// The entry of `sets` (in `list_inner`) whose drive reported it first.
    slot: usize,
    /// Drives that reported exactly this version as current.
    holders: usize,
}

/// One page of a listing.
#[derive(Clone, Debug, Default)]
pub struct ListPage {
    /// Live objects, sorted by key.
    pub entries: Vec<ListEntry>,
    /// Pass as `start_after` to get the next page; `None` when the listing is complete.
    pub next_start_after: Option<String>,
}

impl Client {
    /// Creates `bucket` on every node; succeeds once a majority of nodes have it.
    pub async fn make_bucket(&self, bucket: &str) -> Result<(), Error> {
        self.with_map(|c| async move { c.make_bucket_once(bucket).await }).await
    }

    async fn make_bucket_once(&self, bucket: &str) -> Result<(), Error> {
        proto::validate_bucket(bucket)?;
        self.bucket_call(&Request::BucketCreate { bucket: bucket.into() }, bucket).await
    }

    /// Removes an empty `bucket` from every node, all or nothing: it first checks every
    /// erasure set for live objects, then deletes it on every node; a node that still refuses
    /// (an object written in between) gets the bucket back on the nodes that had dropped it,
    /// and the call fails `BucketNotEmpty`. Multipart uploads in progress do not keep a
    /// bucket, as in S3: once the bucket is gone (no new upload can start, no upload can
    /// complete into it), its uploads are aborted with their pieces. One that cannot be
    /// aborted then is logged and left to the gateway's expiry of abandoned uploads.
    pub async fn remove_bucket(&self, bucket: &str) -> Result<(), Error> {
        self.with_map(|c| async move { c.remove_bucket_once(bucket).await }).await
    }

    async fn remove_bucket_once(&self, bucket: &str) -> Result<(), Error> {
        proto::validate_bucket(bucket)?;
        if !self.list_inner(bucket, "", "", 1).await?.entries.is_empty() {
            return Err(Error::BucketNotEmpty { bucket: bucket.into() });
        }
        let request = Request::BucketDelete { bucket: bucket.into() };
        let responses = self.call_all_nodes(&request).await;
        let refused =
            responses.iter().any(|r| matches!(r, Ok(Response::Error { kind: ErrorKind::BucketNotEmpty, .. })));
        if refused {
            let dropped: Vec<usize> =
                (0..responses.len()).filter(|&idx| matches!(responses[idx], Ok(Response::Ok))).collect();
            let create = Request::BucketCreate { bucket: bucket.into() };
            for node_idx in dropped {
                if let Err(e) = self.call_now(node_idx, &create).await {
                    tracing::warn!(node = %self.node_id(node_idx), error = %e, bucket, "could not restore a bucket after a refused delete; the next write heals it");
                }
            }
            return Err(Error::BucketNotEmpty { bucket: bucket.into() });
        }
        self.bucket_result(&request, bucket, responses)?;
        self.abort_uploads_of_removed(bucket).await;
        Ok(())
    }

    /// Names of the buckets known to a majority of the reachable nodes of the namespace pool
    /// (pool 1 until it is removed), sorted.
    pub async fn list_buckets(&self) -> Result<Vec<String>, Error> {
        Ok(self.buckets().await?.into_iter().map(|b| b.name).collect())
    }

    /// Buckets known to a majority of the reachable nodes of the namespace pool (which hold the
    /// bucket namespace), sorted by name, each with the earliest creation time any recorded.
    pub async fn buckets(&self) -> Result<Vec<BucketEntry>, Error> {
        self.with_map(|c| async move { c.buckets_once().await }).await
    }

    async fn buckets_once(&self) -> Result<Vec<BucketEntry>, Error> {
        // Internal buckets (a leading dot: not a valid S3 name) stay hidden.
        Ok(self.bucket_namespace().await?.into_iter().filter(|b| !b.name.starts_with('.')).collect())
    }

    /// Every bucket (internal ones included) a majority of the reachable nodes of the namespace
    /// pool hold (`cluster::ClusterMap::namespace_pool`: the first pool that is active or
    /// draining); nodes of other pools take it from them (a new pool's nodes start without
    /// buckets).
    pub async fn bucket_namespace(&self) -> Result<Vec<BucketEntry>, Error> {
        let namespace = self.topo.map.pool_nodes(self.topo.map.namespace_pool());
        let responses = self.call_nodes(&namespace, &Request::BucketList).await;
        let mut seen: BTreeMap<String, (usize, u64)> = BTreeMap::new();
        let mut reachable = 0;
        let mut failed = Vec::new();
        for (&node_idx, response) in namespace.iter().zip(responses) {
            match response {
                Ok(Response::Buckets { buckets }) => {
                    reachable += 1;
                    for bucket in buckets {
                        let entry = seen.entry(bucket.name).or_insert((0, bucket.created_ms));
                        entry.0 += 1;
                        entry.1 = entry.1.min(bucket.created_ms);
                    }
                }
                Ok(other) => failed.push(self.failed_node(node_idx, &format!("answered {other:?}"))),
                Err(e) => failed.push(self.failed_node(node_idx, &e.to_string())),
            }
        }
        self.require_majority_of(reachable, namespace.len(), crate::Counted::Nodes, failed)?;
        let held = seen.into_iter().filter(|(_, (count, _))| *count * 2 > reachable);
        Ok(held.map(|(name, (_, created_ms))| BucketEntry { name, created_ms }).collect())
    }

    /// Whether `bucket` exists (on a majority of reachable nodes).
    pub async fn bucket_exists(&self, bucket: &str) -> Result<bool, Error> {
        proto::validate_bucket(bucket)?;
        Ok(self.list_buckets().await?.iter().any(|b| b == bucket))
    }

    /// Live objects of `bucket` whose key starts with `prefix` and sorts after `start_after`,
    /// at most `limit` of them: a key is listed exactly when a GET starting then would return
    /// it. Asks every drive of every erasure set of the active pools for its current rows; a
    /// key whose newest row W drives of its set report is settled (listed unless it is a delete
    /// marker), any other is read as a GET reads it ([`crate::head`]). Fails `Unavailable` unless, in every
    /// set, at least n - W + 1 drives answer (so every acknowledged write, on W drives of its
    /// set, is on one that answered) and a majority of all drives do.
    pub async fn list(&self, bucket: &str, prefix: &str, start_after: &str, limit: u32) -> Result<ListPage, Error> {
        self.with_map(|c| async move { c.list_once(bucket, prefix, start_after, limit).await }).await
    }

    async fn list_once(&self, bucket: &str, prefix: &str, start_after: &str, limit: u32) -> Result<ListPage, Error> {
        proto::validate_bucket(bucket)?;
        self.list_inner(bucket, prefix, start_after, limit).await
    }

    /// [`Client::list`] without name checks, for internal buckets.
    pub(crate) async fn list_inner(
        &self,
        bucket: &str,
        prefix: &str,
        start_after: &str,
        limit: u32,
    ) -> Result<ListPage, Error> {
        let limit = limit.clamp(1, LIST_LIMIT_MAX);
        let map = &self.topo.map;
        // A joining pool holds nothing yet (its nodes may not run), a removed one nothing any
        // more; the namespace pool's nodes hold the bucket namespace, so only they can say a
        // bucket does not exist.
        let sets: Vec<(usize, usize)> = (0..map.pools.len())
            .filter(|&pool| map.pools[pool].is_read())
            .flat_map(|pool| map.pools[pool].sets.clone().map(move |set_idx| (pool, set_idx)))
            .collect();
        let request_for = |drive: &cluster::DriveRef| Request::List {
            drive: drive.drive_idx as u32,
            bucket: bucket.into(),
            prefix: prefix.into(),
            start_after: start_after.into(),
            limit,
        };
        // (slot in `sets`, pool, drive), one per drive asked.
        let asked: Vec<(usize, usize, cluster::DriveRef)> = sets
            .iter()
            .enumerate()
            .flat_map(|(slot, &(pool, set_idx))| map.sets[set_idx].drives.iter().map(move |&d| (slot, pool, d)))
            .collect();
        let calls =
            asked.iter().map(|(_, _, drive)| async move { self.call(drive.node_idx, &request_for(drive)).await });
        let mut responses = futures_util::future::join_all(calls).await;
        let definite = |response: &Result<Response, Error>| {
            matches!(response, Ok(Response::Listing { .. } | Response::Error { kind: ErrorKind::NoSuchBucket, .. }))
        };
        // Drives that answered, per entry of `sets`, and what each set needs: an acknowledged
        // write is on W of its n drives, so any n - W + 1 of them include one that has it (or a
        // newer version). A majority of all drives alone would let one set answer from a single
        // drive while the others carry the count.
        let needed: Vec<usize> = sets
            .iter()
            .map(|&(_, set_idx)| map.sets[set_idx].drives.len() + 1 - map.erasure_of_set(set_idx).write_quorum())
            .collect();
        let count_answered = |responses: &[Result<Response, Error>]| {
            let mut counts = vec![0usize; sets.len()];
            for ((slot, _, _), response) in asked.iter().zip(responses) {
                counts[*slot] += usize::from(definite(response));
            }
            counts
        };
        let mut set_answered = count_answered(&responses);
        if set_answered.iter().zip(&needed).any(|(got, need)| got < need) {
            // Drives skipped for a recent failure may be back: ask those of short sets now.
            let again: Vec<usize> = (0..asked.len())
                .filter(|&i| set_answered[asked[i].0] < needed[asked[i].0] && !definite(&responses[i]))
                .collect();
            let calls = again.iter().map(|&i| {
                let drive = asked[i].2;
                async move { self.call_now(drive.node_idx, &request_for(&drive)).await }
            });
            for (i, response) in again.iter().zip(futures_util::future::join_all(calls).await) {
                responses[*i] = response;
            }
            set_answered = count_answered(&responses);
        }
        let mut newest: BTreeMap<String, Newest> = BTreeMap::new();
        let mut missing_bucket = 0;
        let mut answered = 0;
        let mut truncated = false;
        // (slot, why), for the error.
        let mut failed: Vec<(usize, crate::FailedNode)> = Vec::new();
        let mut namespace_answered = 0;
        let namespace = map.namespace_pool();
        for (&(slot, pool, drive), response) in asked.iter().zip(responses) {
            let node_idx = drive.node_idx;
            match response {
                Ok(Response::Listing { entries }) => {
                    answered += 1;
                    namespace_answered += usize::from(pool == namespace);
                    truncated |= entries.len() as u32 == limit;
                    for entry in entries {
                        match newest.get_mut(&entry.key) {
                            Some(seen) if seen.entry.version > entry.version => {}
                            Some(seen) if seen.entry.version == entry.version => seen.holders += 1,
                            _ => {
                                newest.insert(entry.key.clone(), Newest { entry, slot, holders: 1 });
                            }
                        }
                    }
                }
                Ok(Response::Error { kind: ErrorKind::NoSuchBucket, .. }) if pool == namespace => missing_bucket += 1,
                // A later pool's node that has not taken the bucket yet holds nothing in it.
                Ok(Response::Error { kind: ErrorKind::NoSuchBucket, .. }) => answered += 1,
                Ok(Response::Error { message, .. }) => failed.push((slot, self.failed_node(node_idx, &message))),
                Ok(other) => {
                    tracing::warn!(node = %self.node_id(node_idx), ?other, "unexpected listing answer");
                    failed.push((slot, self.failed_node(node_idx, &format!("answered {other:?}"))));
                }
                Err(e) => {
                    tracing::debug!(error = %e, "drive did not answer a listing");
                    failed.push((slot, self.failed_node(node_idx, &e.to_string())));
                }
            }
        }
        // A node with several drives fails each the same way: name it once.
        let named_once = |mut nodes: Vec<crate::FailedNode>| {
            nodes.sort_by(|a, b| a.node.cmp(&b.node));
            nodes.dedup_by(|a, b| a.node == b.node);
            nodes
        };
        // The quorums first: too few answers cannot say a bucket does not exist either.
        if let Some(short) = (0..sets.len()).find(|&slot| set_answered[slot] < needed[slot]) {
            let set_failed = failed.iter().filter(|(slot, _)| *slot == short).map(|(_, f)| f.clone()).collect();
            return Err(Error::Unavailable {
                action: "list",
                unit: crate::Counted::Drives,
                bucket: bucket.into(),
                key: prefix.into(),
                available: set_answered[short],
                total: map.sets[sets[short].1].drives.len(),
                needed: needed[short],
                unreachable: named_once(set_failed),
            });
        }
        let failed = named_once(failed.into_iter().map(|(_, f)| f).collect());
        let drives_total: usize = sets.iter().map(|&(_, set_idx)| map.sets[set_idx].drives.len()).sum();
        self.require_majority_of(answered + missing_bucket, drives_total, crate::Counted::Drives, failed)?;
        if missing_bucket > namespace_answered {
            return Err(Error::NoSuchBucket { bucket: bucket.into() });
        }
        // Only keys up to the `limit`-th merged key are complete: every drive returned all its
        // keys up to there.
        let keys: Vec<String> = newest.keys().take(limit as usize).cloned().collect();
        let last_key = keys.last().cloned();
        let write_quorum = |slot: usize| map.erasure_of_set(sets[slot].1).write_quorum();
        let mut settled = Vec::with_capacity(keys.len());
        let mut unsettled = Vec::new();
        for key in keys {
            let seen = newest.remove(&key).expect("a key of the merge");
            if seen.holders >= write_quorum(seen.slot) {
                settled.push(seen.entry);
            } else {
                unsettled.push(key);
            }
        }
        let mut entries: Vec<ListEntry> = settled.into_iter().filter(|e| !e.deleted).collect();
        entries.extend(self.list_as_reads(bucket, unsettled).await?);
        entries.sort_by(|a, b| a.key.cmp(&b.key));
        let next_start_after = if truncated { last_key } else { None };
        Ok(ListPage { entries, next_start_after })
    }

    /// The listing entries of `keys` whose newest current version fewer than W drives of
    /// their set reported (a write in flight, a failed write's leftover, drives out of reach):
    /// each is what a read starting now would return ([`crate::head::head_many_with`], the
    /// same version choice and the same failures), absent when a read would answer `NotFound`.
    /// A listing that took any drive's newest row showed a failed first PUT for ever, hid a
    /// live object under a failed DELETE's leftover marker, and brought back a deleted key
    /// under a failed PUT's leftover.
    async fn list_as_reads(&self, bucket: &str, keys: Vec<String>) -> Result<Vec<ListEntry>, Error> {
        let mut entries = Vec::new();
        for batch in keys.chunks(LIST_HEADS_PER_BATCH) {
            let asked: Vec<(String, String)> = batch.iter().map(|key| (bucket.to_owned(), key.clone())).collect();
            let answers = crate::head::head_many_with(self, &asked, crate::head::Checksums::LeftOut).await;
            for answer in answers {
                match answer {
                    Ok(info) => entries.push(ListEntry {
                        key: info.meta.key,
                        version: info.meta.version,
                        deleted: false,
                        size: info.meta.size,
                        etag: info.meta.etag,
                        modified_ms: info.meta.modified_ms,
                    }),
                    Err(Error::NotFound { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(entries)
    }

    pub(crate) async fn bucket_call(&self, request: &Request, bucket: &str) -> Result<(), Error> {
        let responses = self.call_all_nodes(request).await;
        self.bucket_result(request, bucket, responses)
    }

    fn bucket_result(
        &self,
        request: &Request,
        bucket: &str,
        responses: Vec<Result<Response, Error>>,
    ) -> Result<(), Error> {
        // A majority of the namespace pool's nodes decides (they hold the bucket namespace);
        // the other pools' nodes that missed the change take it from them later.
        let map = &self.topo.map;
        let namespace = map.pool_nodes(map.namespace_pool());
        // A removed pool's nodes hold no keys and may be gone: their answers do not count.
        let removed: Vec<usize> = (0..map.pools.len())
            .filter(|&pool| map.pools[pool].state == cluster::PoolState::Removed)
            .flat_map(|pool| map.pool_nodes(pool))
            .collect();
        let mut ok = 0;
        let mut failed = Vec::new();
        for (node_idx, response) in responses.into_iter().enumerate() {
            if removed.contains(&node_idx) {
                continue;
            }
            if !namespace.contains(&node_idx) {
                if let Ok(Response::Error { kind: ErrorKind::BucketNotEmpty, .. }) = response {
                    return Err(Error::BucketNotEmpty { bucket: bucket.into() });
                }
                if let Err(e) = &response {
                    tracing::warn!(node = %self.node_id(node_idx), error = %e, "bucket operation failed on a node");
                }
                continue;
            }
            match response {
                Ok(Response::Ok) => ok += 1,
                Ok(Response::Error { kind: ErrorKind::BucketNotEmpty, .. }) => {
                    return Err(Error::BucketNotEmpty { bucket: bucket.into() });
                }
                Ok(Response::Error { kind: ErrorKind::NoSuchBucket, .. }) => {}
                Ok(Response::Error { kind, message }) => {
                    tracing::warn!(node = %self.node_id(node_idx), ?kind, %message, "bucket operation failed on a node");
                    failed.push(self.failed_node(node_idx, &message));
                }
                Ok(other) => failed.push(self.failed_node(node_idx, &format!("answered {other:?}"))),
                Err(e) => failed.push(self.failed_node(node_idx, &e.to_string())),
            }
        }
        if ok == 0 && matches!(request, Request::BucketDelete { .. }) {
            return Err(Error::NoSuchBucket { bucket: bucket.into() });
        }
        self.require_majority_of(ok, namespace.len(), crate::Counted::Nodes, failed)
    }

    pub(crate) fn failed_node(&self, node_idx: usize, reason: &str) -> crate::FailedNode {
        crate::FailedNode { node: self.node_id(node_idx).to_owned(), reason: reason.to_owned() }
    }

    /// Bucket operations are rare and need a majority of all nodes: they try every node, even
    /// one that failed recently.
    async fn call_all_nodes(&self, request: &Request) -> Vec<Result<Response, Error>> {
        let all: Vec<usize> = (0..self.topo.map.nodes.len()).collect();
        self.call_nodes(&all, request).await
    }

    /// [`Client::call_all_nodes`] for the nodes `node_idxs`, answers in that order.
    pub(crate) async fn call_nodes(&self, node_idxs: &[usize], request: &Request) -> Vec<Result<Response, Error>> {
        let calls = node_idxs.iter().map(|&node_idx| self.call_now(node_idx, request));
        futures_util::future::join_all(calls).await
    }

    /// `failed`: the nodes that could not serve, and why (for the error); `unit`: what
    /// `reachable` and `total` count.
    fn require_majority_of(
        &self,
        reachable: usize,
        total: usize,
        unit: crate::Counted,
        failed: Vec<crate::FailedNode>,
    ) -> Result<(), Error> {
        if reachable * 2 > total {
            return Ok(());
        }
        Err(Error::Unavailable {
            action: "reach a majority for",
            unit,
            bucket: String::from("the cluster"),
            key: String::new(),
            available: reachable,
            total,
            needed: total / 2 + 1,
            unreachable: failed,
        })
    }
}
