//! Metadata reads: ask every drive of each key's erasure set, one request per node for all the
//! keys, and pick the version readers agree on.

use proto::{BATCH_ITEMS_MAX, KeyVersions, MetaDetail, MetaKey, Request, Response, VersionId};

use crate::{Client, Error, FailedNode, ObjectInfo, choose_version};

/// Metadata of `keys` (names already validated), in order.
pub(crate) async fn head_many(client: &Client, keys: &[(String, String)]) -> Vec<Result<ObjectInfo, Error>> {
    let mut answers = readable(versions_many(client, keys, MetaDetail::Versions).await);
    // Keys whose newest version is not readable (a write in flight, or failures) need each
    // drive's acknowledged floor before a version is chosen: ask again for those only.
    let erasure = client.topo.map.erasure;
    let unsure: Vec<usize> =
        (0..keys.len()).filter(|&i| !crate::newest_is_readable(&answers[i].replies, erasure.marker_quorum())).collect();
    if !unsure.is_empty() {
        let again: Vec<(String, String)> = unsure.iter().map(|&i| keys[i].clone()).collect();
        for (i, answer) in unsure.into_iter().zip(readable(versions_many(client, &again, MetaDetail::WithFloor).await))
        {
            answers[i] = answer;
        }
    }
    keys.iter()
        .zip(answers)
        .map(|((bucket, key), answer)| {
            let placement = client.topo.map.placement(bucket, key);
            resolve(client, bucket, key, placement, &answer)
        })
        .collect()
}

/// What each drive of one key's set answered: `replies[position]` is `None` when the drive did
/// not answer, and then `why[position]` says why.
struct KeyAnswers {
    replies: Vec<Option<KeyVersions>>,
    why: Vec<Option<Silence>>,
}

/// Why a drive gave no usable answer for a key.
#[derive(Clone)]
enum Silence {
    /// The request to its node failed: the error, which names the node.
    Failed(String),
    /// It answered that it cannot speak for the key (being rebuilt, or unreadable metadata).
    Unavailable,
}

/// For readers, a drive that cannot answer for a key (being rebuilt) did not answer.
fn readable(mut answers: Vec<KeyAnswers>) -> Vec<KeyAnswers> {
    for answer in &mut answers {
        for (reply, why) in answer.replies.iter_mut().zip(&mut answer.why) {
            if reply.as_ref().is_some_and(|v| v.unavailable) {
                *reply = None;
                *why = Some(Silence::Unavailable);
            }
        }
    }
    answers
}

/// The newest version any reachable drive of the key's set holds (current or retained) or
/// knows acknowledged, for a writer to order its version after. Fails unless at least W drives
/// answered: then any version acknowledged before this call is among the answers (write
/// quorums intersect). A drive being
/// rebuilt counts as answered (it takes the write) though it knows no version, as long as at
/// least n - W + 1 other drives answered: with u drives rebuilding, an acknowledged version is
/// on at least W - u of the n - u others, so n - W + 1 answers among them meet it.
pub(crate) async fn newest_version_seen(client: &Client, bucket: &str, key: &str) -> Result<Option<VersionId>, Error> {
    let keys = [(bucket.to_owned(), key.to_owned())];
    let mut replies =
        versions_many(client, &keys, MetaDetail::WithFloor).await.pop().expect("one result per key").replies;
    let erasure = client.topo.map.erasure;
    let placement = client.topo.map.placement(bucket, key);
    let drives = client.set_drives(&placement);
    if replies.iter().flatten().count() < erasure.write_quorum() {
        // Drives skipped for a recent failure may be back, and the write needs them: ask now.
        let silent: Vec<usize> = (0..drives.len()).filter(|&p| replies[p].is_none()).collect();
        for position in silent {
            let drive = &drives[position];
            let item = MetaKey { drive: drive.drive_idx as u32, bucket: bucket.to_owned(), key: key.to_owned() };
            let request = Request::MetaGet { items: vec![item], detail: MetaDetail::WithFloor };
            if let Ok(Response::Versions { mut keys }) = client.call_now(drive.node_idx, &request).await
                && keys.len() == 1
            {
                replies[position] = keys.pop();
            }
        }
    }
    let answered = replies.iter().flatten().count();
    let knowing = replies.iter().flatten().filter(|v| !v.unavailable).count();
    if answered < erasure.write_quorum() || knowing < erasure.n() - erasure.write_quorum() + 1 {
        let unreachable: Vec<String> = drives
            .iter()
            .zip(&replies)
            .filter(|(_, r)| r.is_none())
            .map(|(d, _)| client.node_id(d.node_idx).to_owned())
            .collect();
        return Err(Error::WriteQuorum {
            bucket: bucket.into(),
            key: key.into(),
            acked: answered,
            total: erasure.n(),
            needed: erasure.write_quorum(),
            reasons: format!("unreachable nodes: {}", unreachable.join(", ")),
        });
    }
    // Floors too: a collected delete marker leaves only its floor, and a write after it must
    // be newer.
    let floors = replies.iter().flatten().filter_map(|v| v.finalized);
    Ok(replies.iter().flatten().flat_map(KeyVersions::all).map(|m| m.version).chain(floors).max())
}

/// Every version each key has on each drive of its set, in key order.
async fn versions_many(client: &Client, keys: &[(String, String)], detail: MetaDetail) -> Vec<KeyAnswers> {
    let n = client.topo.map.erasure.n();
    // (key index, set position) of every item each node is asked for.
    let mut asked: Vec<Vec<(usize, usize)>> = vec![Vec::new(); client.topo.pools.len()];
    let mut items: Vec<Vec<MetaKey>> = vec![Vec::new(); client.topo.pools.len()];
    let placements: Vec<_> = keys.iter().map(|(bucket, key)| client.topo.map.placement(bucket, key)).collect();
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
        let mut metas: Vec<Result<KeyVersions, String>> = Vec::with_capacity(items.len());
        for batch in items.chunks(BATCH_ITEMS_MAX) {
            let request = Request::MetaGet { items: batch.to_vec(), detail };
            let failure = match client.call(node_idx, &request).await {
                Ok(Response::Versions { keys: got }) if got.len() == batch.len() => {
                    metas.extend(got.into_iter().map(Ok));
                    continue;
                }
                Ok(Response::Versions { keys: got }) => {
                    format!(
                        "node {} answered {} of {} metadata items",
                        client.node_id(node_idx),
                        got.len(),
                        batch.len()
                    )
                }
                Ok(Response::Error { kind, message }) => {
                    Error::from_node(client.node_id(node_idx), kind, &message).to_string()
                }
                Ok(other) => format!("node {}: unexpected answer {other:?}", client.node_id(node_idx)),
                Err(e) => e.to_string(),
            };
            metas.extend(batch.iter().map(|_| Err(failure.clone())));
        }
        metas
    });
    let answers = futures_util::future::join_all(calls).await;
    let mut by_key: Vec<KeyAnswers> =
        (0..keys.len()).map(|_| KeyAnswers { replies: vec![None; n], why: vec![None; n] }).collect();
    for (node_answers, node_asked) in answers.into_iter().zip(&asked) {
        for (answer, &(key_idx, position)) in node_answers.into_iter().zip(node_asked) {
            match answer {
                Ok(versions) => by_key[key_idx].replies[position] = Some(versions),
                Err(why) => by_key[key_idx].why[position] = Some(Silence::Failed(why)),
            }
        }
    }
    by_key
}

/// Turns one key's replies into its metadata, `NotFound`, or `Unavailable` with the numbers.
fn resolve(
    client: &Client,
    bucket: &str,
    key: &str,
    placement: cluster::Placement,
    answers: &KeyAnswers,
) -> Result<ObjectInfo, Error> {
    let replies = &answers.replies;
    let drives = client.set_drives(&placement);
    let erasure = client.topo.map.erasure;
    let k = erasure.k;
    let reachable = replies.iter().filter(|r| r.is_some()).count();
    let Some(meta) = choose_version(replies, erasure.marker_quorum(), erasure.write_quorum()) else {
        if reachable < k {
            let unreachable = drives
                .iter()
                .zip(replies)
                .zip(&answers.why)
                .filter(|((_, r), _)| r.is_none())
                .map(|((d, _), why)| {
                    let node = client.node_id(d.node_idx).to_owned();
                    let why = match why {
                        Some(Silence::Failed(error)) => error.clone(),
                        Some(Silence::Unavailable) => format!(
                            "node {node}: drive {} cannot answer for the key (being rebuilt, or its metadata unreadable)",
                            d.drive_idx
                        ),
                        None => format!("node {node}: no answer"),
                    };
                    FailedNode { node, reason: why }
                })
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
        .filter(|(_, r)| r.as_ref().is_some_and(|v| v.all().any(|m| m.version == meta.version)))
        .map(|(p, _)| p)
        .collect();
    let names = drives.iter().map(|d| (client.node_id(d.node_idx).to_owned(), d.drive_idx)).collect();
    let info = ObjectInfo { meta, placement, drives: names, meta_positions };
    // A drive that answered with only older versions missed this one (slept through the write,
    // or lost it). Reads plan around it, so they never meet its missing chunk: tell a holder
    // now, as a read meeting a missing chunk would.
    for (position, reply) in replies.iter().enumerate() {
        if let Some(versions) = reply
            && !info.meta_positions.contains(&position)
            && !versions.retained_truncated
            && versions.all().all(|m| m.version < info.meta.version)
        {
            client.hint_repair(&info, position);
        }
    }
    Ok(info)
}
