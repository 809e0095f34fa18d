//! Metadata reads: ask every drive of each key's erasure set, one request per node for all the
//! keys, and pick the version readers agree on.

use proto::{BATCH_ITEMS_MAX, MetaKey, ObjectMeta, Request, Response};

use crate::{Client, Error, ObjectInfo, choose_version};

/// Metadata of `keys` (names already validated), in order.
pub(crate) async fn head_many(client: &Client, keys: &[(String, String)]) -> Vec<Result<ObjectInfo, Error>> {
    let n = client.inner.map.erasure.n();
    // (key index, set position) of every item each node is asked for.
    let mut asked: Vec<Vec<(usize, usize)>> = vec![Vec::new(); client.inner.pools.len()];
    let mut items: Vec<Vec<MetaKey>> = vec![Vec::new(); client.inner.pools.len()];
    let placements: Vec<_> = keys.iter().map(|(bucket, key)| client.inner.map.placement(bucket, key)).collect();
    for (key_idx, ((bucket, key), placement)) in keys.iter().zip(&placements).enumerate() {
        for (position, drive) in client.set_drives(placement).iter().enumerate() {
            asked[drive.node_idx].push((key_idx, position));
            items[drive.node_idx].push(MetaKey {
                drive: drive.drive_idx as u32,
                bucket: bucket.clone(),
                key: key.clone(),
            });
        }
    }
    let calls = items.into_iter().enumerate().map(|(node_idx, items)| async move {
        let mut metas = Vec::with_capacity(items.len());
        for batch in items.chunks(BATCH_ITEMS_MAX) {
            let request = Request::MetaGet { items: batch.to_vec() };
            match client.call(node_idx, &request).await {
                Ok(Response::Metas { metas: got }) if got.len() == batch.len() => {
                    metas.extend(got.into_iter().map(Some))
                }
                _ => metas.extend(batch.iter().map(|_| None)),
            }
        }
        metas
    });
    let answers = futures_util::future::join_all(calls).await;
    // replies[key][position]: None = the drive did not answer; Some(None) = it has no such key.
    let mut replies: Vec<Vec<Option<Option<ObjectMeta>>>> = vec![vec![None; n]; keys.len()];
    for (node_answers, node_asked) in answers.into_iter().zip(&asked) {
        for (answer, &(key_idx, position)) in node_answers.into_iter().zip(node_asked) {
            replies[key_idx][position] = answer;
        }
    }
    keys.iter()
        .zip(placements)
        .zip(replies)
        .map(|(((bucket, key), placement), replies)| resolve(client, bucket, key, placement, &replies))
        .collect()
}

/// Turns one key's replies into its metadata, `NotFound`, or `Unavailable` with the numbers.
fn resolve(
    client: &Client,
    bucket: &str,
    key: &str,
    placement: cluster::Placement,
    replies: &[Option<Option<ObjectMeta>>],
) -> Result<ObjectInfo, Error> {
    let drives = client.set_drives(&placement);
    let k = client.inner.map.erasure.k;
    let reachable = replies.iter().filter(|r| r.is_some()).count();
    let Some(meta) = choose_version(replies, k) else {
        if reachable < k {
            let unreachable = drives
                .iter()
                .zip(replies)
                .filter(|(_, r)| r.is_none())
                .map(|(d, _)| client.node_id(d.node_idx).to_owned())
                .collect();
            return Err(Error::Unavailable {
                action: "read",
                bucket: bucket.into(),
                key: key.into(),
                available: reachable,
                total: drives.len(),
                needed: k,
                unreachable,
            });
        }
        return Err(Error::NotFound { bucket: bucket.into(), key: key.into() });
    };
    if meta.deleted {
        return Err(Error::NotFound { bucket: bucket.into(), key: key.into() });
    }
    let meta_positions = replies
        .iter()
        .enumerate()
        .filter(|(_, r)| matches!(r, Some(Some(m)) if m.version == meta.version))
        .map(|(p, _)| p)
        .collect();
    let names = drives.iter().map(|d| (client.node_id(d.node_idx).to_owned(), d.drive_idx)).collect();
    Ok(ObjectInfo { meta, placement, drives: names, meta_positions })
}
