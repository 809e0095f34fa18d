//! Moving keys between pools, key by key: what `tessera pool decommission` (empty a draining
//! pool) and `tessera pool rebalance` (spread keys over pools by free space) do.
//!
//! A key moves in two steps, each safe to repeat: its newest version is copied to another pool
//! with the same version id, metadata and bytes (acknowledged there on W drives), then every
//! drive of the source set *evicts* the key up to that version (`proto::Request::Evict`): the
//! versions stop being current, leave the drive's listing and retire after the node's grace,
//! so a GET that chose the source copy finishes. Between the two steps both pools hold the same
//! version, which readers treat as one. A copy that fails leaves the source untouched; an
//! eviction that misses a drive leaves the key in that drive's listing for the next pass.

use cluster::PoolState;
use proto::{ListEntry, Request, Response, VersionId};

use crate::head::{self, PoolHolding};
use crate::{Client, Error, FailedNode, MULTIPART_BUCKET, multipart, put};

/// What a move does with versions in the source pool that no reader can choose (a write that
/// never reached its quorum, or one in flight).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoveKind {
    /// Emptying a draining pool: every node of it holds the draining map, so no write can be
    /// acknowledged there any more; versions whose holders and silent drives are fewer than W
    /// (never acknowledged) are leftovers and are evicted too. The copy goes to the active pool
    /// that holds the key's newest version elsewhere, else to
    /// `cluster::ClusterMap::pool_for_moved_key` (where writers of the key go too).
    Drain,
    /// Spreading keys of an active pool: a version in flight there may yet be acknowledged, so
    /// only versions no newer than the one copied (or found elsewhere) are evicted. The copy
    /// goes to the active pool that holds the key's newest version elsewhere, else to pool id
    /// `target_pool`.
    Rebalance { target_pool: u32 },
}

/// What moving one key did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Moved {
    /// Chunk bytes written to the target pool (data and parity; 0 when nothing was copied).
    pub bytes: u64,
    /// The pool id the newest version was copied to, if it was.
    pub to_pool: Option<u32>,
    /// Drives of the source set that evicted the key.
    pub evicted: usize,
    /// Drives of the source set that could not be told (the key stays in their listing).
    pub failed: Vec<FailedNode>,
}

/// Keys some drive of a pool lists in one bucket.
#[derive(Clone, Debug, Default)]
pub struct PoolListing {
    /// Sorted by key, one entry per key (the newest version any drive listed).
    pub entries: Vec<ListEntry>,
    /// More keys may follow the last one.
    pub truncated: bool,
    /// Drives that did not answer, with their set's index: keys only they hold are not listed.
    pub silent: Vec<(usize, FailedNode)>,
}

impl Client {
    /// Every bucket (internal ones included) some node of pool `pool_id` holds, sorted.
    pub async fn pool_buckets(&self, pool_id: u32) -> Result<Vec<String>, Error> {
        let client = self.current();
        let pool = client.pool_index(pool_id)?;
        let nodes = client.topo.map.pool_nodes(pool);
        let answers = client.call_nodes(&nodes, &Request::BucketList).await;
        let mut names = std::collections::BTreeSet::new();
        let mut failed = Vec::new();
        for (&node_idx, answer) in nodes.iter().zip(answers) {
            match answer {
                Ok(Response::Buckets { buckets }) => names.extend(buckets.into_iter().map(|b| b.name)),
                Ok(other) => failed.push(client.failed_node(node_idx, &format!("answered {other:?}"))),
                Err(e) => failed.push(client.failed_node(node_idx, &e.to_string())),
            }
        }
        if failed.len() == nodes.len() {
            let reasons: Vec<String> = failed.iter().map(|f| format!("{}: {}", f.node, f.reason)).collect();
            return Err(Error::Pool { pool: pool_id, reason: format!("no node answered ({})", reasons.join("; ")) });
        }
        Ok(names.into_iter().collect())
    }

    /// Keys of `bucket` after `start_after` that any drive of pool `pool_id` lists (delete
    /// markers included), sorted, at most `limit` (clamped to `proto::LIST_LIMIT_MAX`).
    pub async fn pool_keys(
        &self,
        pool_id: u32,
        bucket: &str,
        start_after: &str,
        limit: u32,
    ) -> Result<PoolListing, Error> {
        let client = self.current();
        let map = &client.topo.map;
        let pool = client.pool_index(pool_id)?;
        let limit = limit.clamp(1, proto::LIST_LIMIT_MAX);
        let drives: Vec<cluster::DriveRef> =
            map.sets[map.pools[pool].sets.clone()].iter().flat_map(|set| set.drives.iter().copied()).collect();
        let calls = drives.iter().map(|drive| {
            let request = Request::List {
                drive: drive.drive_idx as u32,
                bucket: bucket.to_owned(),
                prefix: String::new(),
                start_after: start_after.to_owned(),
                limit,
            };
            let client = &client;
            async move { client.call(drive.node_idx, &request).await }
        });
        let mut merged: std::collections::BTreeMap<String, ListEntry> = std::collections::BTreeMap::new();
        let mut listing = PoolListing::default();
        let set_of = |i: usize| map.pools[pool].sets.start + i / map.pools[pool].erasure.n();
        for (i, (drive, answer)) in drives.iter().zip(futures_util::future::join_all(calls).await).enumerate() {
            match answer {
                Ok(Response::Listing { entries }) => {
                    // Each drive lists its first `limit` keys: the union's first `limit` are right.
                    listing.truncated |= entries.len() >= limit as usize;
                    for entry in entries {
                        match merged.get(&entry.key) {
                            Some(known) if known.version >= entry.version => {}
                            _ => {
                                merged.insert(entry.key.clone(), entry);
                            }
                        }
                    }
                }
                // A drive that never got the bucket holds none of its keys.
                Ok(Response::Error { kind: proto::ErrorKind::NoSuchBucket, .. }) => {}
                Ok(other) => {
                    listing.silent.push((set_of(i), client.failed_node(drive.node_idx, &format!("answered {other:?}"))))
                }
                Err(e) => listing.silent.push((set_of(i), client.failed_node(drive.node_idx, &e.to_string()))),
            }
        }
        listing.entries = merged.into_values().take(limit as usize).collect();
        Ok(listing)
    }

    /// Moves `bucket/key` out of pool `source_pool` (its id): copies the key's newest version
    /// to another pool when only the source holds it (a delete marker too, when it hides an
    /// older version in another pool), then evicts the key from the source set's drives up to
    /// the newest version that is now acknowledged elsewhere. Safe to repeat, and to race
    /// with writers: a newer version written meanwhile wins wherever it lands.
    pub async fn move_key(&self, bucket: &str, key: &str, source_pool: u32, kind: MoveKind) -> Result<Moved, Error> {
        let client = self.current();
        let result = move_key_once(&client, bucket, key, source_pool, kind).await;
        self.refreshed_after(&client, false).await;
        result
    }

    /// Hands the bucket namespace to pool `to_pool` (its id) before the namespace pool is
    /// removed: every bucket of the namespace is created on every node (a node that has it
    /// leaves it as it is) and must then be held by a majority of `to_pool`'s nodes; a bucket
    /// those nodes hold that the namespace does not (a delete they missed) is deleted there.
    /// Returns how many buckets the namespace has.
    pub async fn hand_over_buckets(&self, to_pool: u32) -> Result<usize, Error> {
        let client = self.current();
        let buckets = client.bucket_namespace().await?;
        for bucket in &buckets {
            client.bucket_call(&Request::BucketCreate { bucket: bucket.name.clone() }, &bucket.name).await?;
        }
        let nodes = client.topo.map.pool_nodes(client.pool_index(to_pool)?);
        let answers = client.call_nodes(&nodes, &Request::BucketList).await;
        let mut holders: std::collections::BTreeMap<String, Vec<usize>> = std::collections::BTreeMap::new();
        for (&node_idx, answer) in nodes.iter().zip(answers) {
            if let Ok(Response::Buckets { buckets }) = answer {
                for bucket in buckets {
                    holders.entry(bucket.name).or_default().push(node_idx);
                }
            }
        }
        let majority = nodes.len() / 2 + 1;
        for bucket in &buckets {
            let held = holders.get(&bucket.name).map_or(0, Vec::len);
            if held < majority {
                let reason =
                    format!("only {held} of its {} nodes hold bucket {:?}, a majority must", nodes.len(), bucket.name);
                return Err(Error::Pool { pool: to_pool, reason });
            }
        }
        for (name, held_by) in &holders {
            if buckets.iter().any(|b| &b.name == name) {
                continue;
            }
            let answers = client.call_nodes(held_by, &Request::BucketDelete { bucket: name.clone() }).await;
            if answers.iter().any(|a| matches!(a, Ok(Response::Error { kind: proto::ErrorKind::BucketNotEmpty, .. }))) {
                let reason = format!("its nodes hold bucket {name:?}, which the namespace deleted, with objects in it");
                return Err(Error::Pool { pool: to_pool, reason });
            }
        }
        Ok(buckets.len())
    }

    fn pool_index(&self, pool_id: u32) -> Result<usize, Error> {
        let pools = &self.topo.map.pools;
        pools.iter().position(|pool| pool.id == pool_id).ok_or(Error::Map(cluster::Error::NoSuchPool { id: pool_id }))
    }
}

async fn move_key_once(
    client: &Client,
    bucket: &str,
    key: &str,
    source_pool: u32,
    kind: MoveKind,
) -> Result<Moved, Error> {
    let map = &client.topo.map;
    let source = client.pool_index(source_pool)?;
    // The map may have changed since the move began (a decommission called off, a target
    // pool drained): each key checks it again.
    let wanted = match kind {
        MoveKind::Drain => PoolState::Draining,
        MoveKind::Rebalance { .. } => PoolState::Active,
    };
    if map.pools[source].state != wanted {
        let reason = format!("it is {}, not {wanted}: the move stopped", map.pools[source].state);
        return Err(Error::Pool { pool: source_pool, reason });
    }
    let holdings = head::holdings(client, bucket, key).await?;
    let src = holdings.iter().find(|h| h.pool == source).expect("a draining or active pool is asked");
    let others: Vec<&PoolHolding> = holdings.iter().filter(|h| h.pool != source).collect();
    // Only what is known acknowledged elsewhere counts: a version in flight there may yet be
    // rolled back.
    let acknowledged_elsewhere = others.iter().filter_map(|h| h.acknowledged).max();
    if let Some(doubtful) = src.doubtful
        && acknowledged_elsewhere.is_none_or(|other| other < doubtful)
    {
        let reason = format!(
            "{bucket}/{key}: version {} may be acknowledged but cannot be read now (too many drives silent); the next pass tries again",
            doubtful.to_hex()
        );
        return Err(Error::Pool { pool: source_pool, reason });
    }
    let mut moved = Moved::default();
    let mut upto = acknowledged_elsewhere;
    if let Some(top_src) = src.top()
        && acknowledged_elsewhere.is_none_or(|other| other < top_src)
    {
        // Only the source holds the key's newest version: carry it.
        let holder =
            others.iter().filter(|h| map.pools[h.pool].is_active() && h.top().is_some()).max_by_key(|h| h.top());
        let target = match (holder, kind) {
            (Some(holder), _) => holder.pool,
            (None, MoveKind::Drain) => map.pool_for_moved_key(bucket, key),
            (None, MoveKind::Rebalance { target_pool }) => client.pool_index(target_pool)?,
        };
        if target == source || !map.pools[target].is_active() {
            let reason = format!(
                "pool {} is {}: keys move to another, active pool",
                map.pools[target].id, map.pools[target].state
            );
            return Err(Error::Pool { pool: source_pool, reason });
        }
        let placement = map.placement_in(target, bucket, key);
        let (meta, source_info) = match &src.chosen {
            Some(info) if info.meta.version == top_src && !info.meta.deleted => (info.meta.clone(), Some(info)),
            // Deleted (a marker, or only a collected marker's floor): the deletion goes along,
            // metadata only, so no older version elsewhere comes back.
            _ => {
                let mut marker = put::empty_meta(client, bucket, key, top_src, placement);
                marker.deleted = true;
                (marker, None)
            }
        };
        let mut meta = meta;
        if !meta.parts.is_empty() && client.pool_erasure(target) != (meta.k, meta.m) {
            // A multipart record's k+m is its pieces': into a pool of another k+m its pieces go
            // first, re-encoded, and the record names them there.
            moved.bytes += move_pieces(client, &mut meta, target).await?;
        }
        let (_, bytes, replaced) = put::copy_version(client, &meta, source_info, target).await?;
        multipart::delete_pieces(client, &replaced).await;
        moved.bytes += bytes;
        moved.to_pool = Some(map.pools[target].id);
        upto = Some(top_src);
    }
    if kind == MoveKind::Drain {
        // No write can be acknowledged in a draining pool any more: a version there that could
        // never have been acknowledged is a leftover, evicted too.
        upto = upto.max(src.leftover);
    }
    if let Some(version) = upto {
        evict(client, bucket, key, source, version, &mut moved).await;
    }
    // A multipart object replaced by a version written to another pool: its writer found no
    // pieces to delete there (it replaced nothing in that pool), so they go now, as a writer
    // replacing it in place would delete them.
    if let Some(replaced) = src.chosen.as_ref().filter(|info| {
        !info.meta.parts.is_empty()
            && moved.to_pool.is_none()
            && acknowledged_elsewhere.is_some_and(|v| v > info.meta.version)
    }) {
        let pieces: Vec<String> = replaced.meta.parts.iter().map(|part| part.piece_key.clone()).collect();
        multipart::delete_pieces(client, &pieces).await;
    }
    Ok(moved)
}

/// Copies the pieces of multipart record `record` to pool index `pool` (re-encoded with its
/// k+m, same version ids) and points the record at them, with that k+m. The pieces' old copies
/// leave their pool when the mover meets their keys. Returns the chunk bytes written.
async fn move_pieces(client: &Client, record: &mut proto::ObjectMeta, pool: usize) -> Result<u64, Error> {
    let mut bytes = 0;
    for part in &mut record.parts {
        let piece = client.head_inner(MULTIPART_BUCKET, &part.piece_key).await?;
        if piece.meta.version != part.version {
            let reason = format!(
                "piece {} of {}/{} is not the version the object names",
                part.piece_key, record.bucket, record.key
            );
            return Err(Error::Pool { pool: client.topo.map.pools[pool].id, reason });
        }
        let (written, piece_bytes, _) = put::copy_version(client, &piece.meta, Some(&piece), pool).await?;
        bytes += piece_bytes;
        *part = multipart::piece_of(part.number, written);
    }
    let erasure = client.topo.map.pools[pool].erasure;
    (record.k, record.m) = (erasure.k as u8, erasure.m as u8);
    Ok(bytes)
}

/// Tells every drive of the key's set in pool index `pool` to evict it up to `version`.
async fn evict(client: &Client, bucket: &str, key: &str, pool: usize, version: VersionId, moved: &mut Moved) {
    let placement = client.topo.map.placement_in(pool, bucket, key);
    let drives = client.set_drives(&placement).to_vec();
    let calls = drives.iter().map(|drive| {
        let request =
            Request::Evict { drive: drive.drive_idx as u32, bucket: bucket.to_owned(), key: key.to_owned(), version };
        async move { client.call_now(drive.node_idx, &request).await }
    });
    for (drive, answer) in drives.iter().zip(futures_util::future::join_all(calls).await) {
        match answer {
            Ok(Response::Ok) => moved.evicted += 1,
            Ok(Response::Error { kind, message }) => {
                let error = Error::from_node(client.node_id(drive.node_idx), kind, &message);
                moved.failed.push(client.failed_node(drive.node_idx, &error.to_string()));
            }
            Ok(other) => moved.failed.push(client.failed_node(drive.node_idx, &format!("answered {other:?}"))),
            Err(e) => moved.failed.push(client.failed_node(drive.node_idx, &e.to_string())),
        }
    }
}
