//! Metadata reads: ask every drive of each key's erasure set, one request per node for all the
//! keys, and pick the version readers agree on.
//!
//! With several pools a key lives in one of them (writes go where its newest version is), but
//! which one is not recorded anywhere. Every pool is asked in the same round: the set of the
//! pool the key is expected in (where this client last found or wrote it, else the first) whole,
//! the others only *probed*: n - W + 1 of their drives, which is enough to see any version
//! acknowledged there (it is on W drives). A probe that sees anything, or cannot tell, has its
//! set asked whole in a second round. With several pools every drive also reports its
//! acknowledged floor: a key whose versions ended up in two pools (two first writes racing) must
//! not have an older version in one pool come back once a newer delete marker in the other is
//! collected (only its floor is left).

use cluster::{Placement, PoolState};
use proto::{BATCH_ITEMS_MAX, KeyVersions, MetaDetail, MetaKey, ObjectMeta, Request, Response, VersionId};

use crate::coalesce::{self, ItemAnswer};
use crate::{Client, Error, FailedNode, ObjectInfo, choose_version};

/// Whether a metadata read shares its requests with other operations' (`crate::coalesce`). A
/// writer's version read does not: a PUT's client threads are busy encoding, so the hop through
/// the sender task would lengthen it, and sharing showed no PUT gain (`bench/pools.sh`, PUT two
/// pools / one: 0.90 shared; 0.99, 0.90 and 0.95 not).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sharing {
    Shared,
    Own,
}

/// One key's set in one pool, to be asked what it holds of the key.
#[derive(Clone, Copy)]
struct Lookup<'a> {
    bucket: &'a str,
    key: &'a str,
    /// Index of the pool in the map.
    pool: usize,
    placement: Placement,
    /// Ask only the probe positions ([`is_probed`]), not the whole set.
    probe: bool,
}

/// The key's set in every pool that may hold it (active or draining: a joining pool holds
/// nothing yet, a removed one nothing any more), pool by pool: the expected pool's set whole,
/// the others probed.
fn lookups<'a>(client: &Client, bucket: &'a str, key: &'a str) -> Vec<Lookup<'a>> {
    let map = &client.topo.map;
    let active: Vec<usize> = (0..map.pools.len()).filter(|&pool| map.pools[pool].is_read()).collect();
    let expected = match active.len() {
        1 => active[0],
        _ => client.pool_hint(bucket, key).filter(|pool| active.contains(pool)).unwrap_or(active[0]),
    };
    active
        .into_iter()
        .map(|pool| Lookup {
            bucket,
            key,
            pool,
            placement: map.placement_in(pool, bucket, key),
            probe: pool != expected,
        })
        .collect()
}

/// Whether a probe asks `position`: it asks n - W + 1 positions, from the key's rotation on
/// (spreading probes over the set's drives). Any version acknowledged in the set is on W
/// drives, so on one of them.
fn is_probed(client: &Client, placement: &Placement, position: usize) -> bool {
    let erasure = client.erasure_at(placement);
    let n = erasure.n();
    (position + n - placement.rotation) % n < n - erasure.write_quorum() + 1
}

/// Whether a probe shows its pool holds nothing of the key: every probed drive answered, can
/// speak for the key, and knows no version of it (nor an acknowledged floor).
fn probe_is_clear(client: &Client, lookup: &Lookup<'_>, answer: &KeyAnswers) -> bool {
    (0..answer.replies.len()).filter(|&position| is_probed(client, &lookup.placement, position)).all(|position| {
        answer.replies[position]
            .as_ref()
            .is_some_and(|v| !v.unavailable && v.finalized.is_none() && v.all().next().is_none())
    })
}

/// The lookups whose probe is not clear, asked again whole (in `asked` and `answers`).
async fn widen_unclear_probes(
    client: &Client,
    asked: &mut [Lookup<'_>],
    answers: &mut [KeyAnswers],
    detail: MetaDetail,
    reading: bool,
    sharing: Sharing,
) {
    let unclear: Vec<usize> =
        (0..asked.len()).filter(|&i| asked[i].probe && !probe_is_clear(client, &asked[i], &answers[i])).collect();
    if unclear.is_empty() {
        return;
    }
    for &i in &unclear {
        asked[i].probe = false;
    }
    let whole: Vec<Lookup<'_>> = unclear.iter().map(|&i| asked[i]).collect();
    let again = versions_many(client, &whole, detail, sharing).await;
    // Readers (the writers' version read makes its own view of the answers).
    let again = if reading { settle(client, &whole, again, detail).await } else { again };
    for (i, answer) in unclear.into_iter().zip(again) {
        answers[i] = answer;
    }
}

/// Readers' view of the answers: drives that cannot speak for a key count as silent, and whole
/// sets whose newest version is not readable (a write in flight, or failures) are asked again
/// for each drive's acknowledged floor, which choosing a version then needs (unless `detail`
/// asked for floors already).
async fn settle(
    client: &Client,
    asked: &[Lookup<'_>],
    answers: Vec<KeyAnswers>,
    detail: MetaDetail,
) -> Vec<KeyAnswers> {
    let mut answers = readable(answers);
    if detail.with_floor() {
        return answers;
    }
    let unsure: Vec<usize> = (0..asked.len())
        .filter(|&i| {
            let marker_quorum = client.erasure_at(&asked[i].placement).marker_quorum();
            !asked[i].probe && !crate::newest_is_readable(&answers[i].replies, marker_quorum)
        })
        .collect();
    if !unsure.is_empty() {
        let again: Vec<Lookup<'_>> = unsure.iter().map(|&i| asked[i]).collect();
        for (i, answer) in
            unsure.into_iter().zip(readable(versions_many(client, &again, detail.floored(), Sharing::Shared).await))
        {
            answers[i] = answer;
        }
    }
    answers
}

/// Metadata of `keys` (names already validated), in order.
pub(crate) async fn head_many(client: &Client, keys: &[(String, String)]) -> Vec<Result<ObjectInfo, Error>> {
    head_many_with(client, keys, Checksums::Included).await
}

/// Whether a head's answers carry the versions' block checksums.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Checksums {
    Included,
    /// Left out ([`MetaDetail::VersionsBrief`]): the [`ObjectInfo`]s say which version to read
    /// but cannot read one with chunks until its checksums are filled in.
    LeftOut,
}

/// [`head_many`], with or without the block checksums.
pub(crate) async fn head_many_with(
    client: &Client,
    keys: &[(String, String)],
    checksums: Checksums,
) -> Vec<Result<ObjectInfo, Error>> {
    let brief = checksums == Checksums::LeftOut;
    let mut outcomes = head_round(client, keys, brief).await;
    for attempt in 1..=FLOOR_RETRIES {
        let unsettled: Vec<usize> =
            (0..outcomes.len()).filter(|&i| matches!(outcomes[i], Outcome::Unsettled(_))).collect();
        if unsettled.is_empty() {
            break;
        }
        // The write the floor names is landing on its drives meanwhile (or its drives are out
        // of reach): ask those keys again.
        tokio::time::sleep(FLOOR_RETRY_PAUSE * attempt).await;
        let again: Vec<(String, String)> = unsettled.iter().map(|&i| keys[i].clone()).collect();
        for (i, outcome) in unsettled.into_iter().zip(head_round(client, &again, brief).await) {
            outcomes[i] = outcome;
        }
    }
    outcomes
        .into_iter()
        .map(|outcome| match outcome {
            Outcome::Done(result) => *result,
            Outcome::Unsettled(e) => Err(e),
        })
        .collect()
}

/// Rounds of metadata reads a key gets when its drives know (or may hold) a version
/// acknowledged that they cannot show yet ([`Outcome::Unsettled`]), after the first, and the
/// pause before the first of them (growing with each: 300 ms in all).
const FLOOR_RETRIES: u32 = 5;
const FLOOR_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(20);

/// What one round of metadata reads made of a key.
enum Outcome {
    Done(Box<Result<ObjectInfo, Error>>),
    /// A version newer than the one chosen is acknowledged (a drive's floor names it) and is an
    /// object, not a delete, but too few of the answers hold it to read it: the read raced its
    /// write (drives answered before and after it landed), or its drives are out of reach.
    /// Neither "absent" nor the older version is a right answer: ask again, then fail with the
    /// error. Also a newer version that no floor names but that may be acknowledged (its
    /// holders and the silent drives reach W) while fewer than k answers hold it
    /// (`maybe_acknowledged_unreadable`).
    Unsettled(Error),
}

/// One pool's lookup of a key, its drives' answers and the version chosen from them.
type PoolChoice<'a> = (Lookup<'a>, KeyAnswers, Result<Option<ObjectMeta>, Error>);

/// One round of [`head_many`] (`brief`: without block checksums).
async fn head_round(client: &Client, keys: &[(String, String)], brief: bool) -> Vec<Outcome> {
    let pools = client.topo.map.pools.iter().filter(|pool| pool.is_read()).count();
    let mut asked: Vec<Lookup<'_>> = keys.iter().flat_map(|(bucket, key)| lookups(client, bucket, key)).collect();
    debug_assert_eq!(asked.len(), keys.len() * pools, "one lookup per key and active pool");
    // One pool: floors only when the newest version is not readable (`settle`); several: always.
    let detail = MetaDetail::of(pools > 1, brief);
    let answers = versions_many(client, &asked, detail, Sharing::Shared).await;
    let mut answers = settle(client, &asked, answers, detail).await;
    if pools > 1 {
        // `settle` made drives that cannot speak for a key silent: a probe that met one is not clear.
        widen_unclear_probes(client, &mut asked, &mut answers, detail, true, Sharing::Shared).await;
    }
    let mut answers = answers.into_iter();
    asked
        .chunks(pools)
        .map(|per_pool| {
            let (bucket, key) = (per_pool[0].bucket, per_pool[0].key);
            let chosen: Vec<PoolChoice<'_>> = per_pool
                .iter()
                .map(|lookup| {
                    let answer = answers.next().expect("one answer per lookup");
                    // A clear probe: the pool holds nothing of the key.
                    let chosen = if lookup.probe {
                        Ok(None)
                    } else {
                        choose_readable(client, bucket, key, lookup.placement, &answer)
                    };
                    (*lookup, answer, chosen)
                })
                .collect();
            newest_of_pools(client, bucket, key, chosen, pools > 1)
        })
        .collect()
}

/// The newest version any pool chose for the key (a delete marker there makes it absent), unless
/// a pool's drives know a newer version acknowledged: a collected delete marker (absent), a
/// version that pool cannot read now (its failure), or an object whose write raced this read
/// ([`Outcome::Unsettled`]). A pool that could not tell (too few drives answered) fails the
/// read only if no other pool holds a version: a key's writes go to one pool, so a pool that
/// cannot be read is then the only place it can be; except that a version in a draining pool
/// is no answer while an active pool cannot tell (overwrites of a draining pool's keys go to an
/// active pool). (A key whose first versions raced into two pools reads the older while the
/// newer one's pool cannot be read: ARCHITECTURE.md, Pools.)
/// With several pools, remembers where the key was.
fn newest_of_pools(client: &Client, bucket: &str, key: &str, chosen: Vec<PoolChoice<'_>>, remember: bool) -> Outcome {
    let version_of =
        |choice: &Result<Option<ObjectMeta>, Error>| choice.as_ref().ok().and_then(Option::as_ref).map(|m| m.version);
    // The newest version any pool knows acknowledged.
    let floor =
        chosen.iter().flat_map(|(_, answer, _)| answer.replies.iter().flatten().filter_map(|v| v.finalized)).max();
    let mut newest: Option<usize> = None;
    for (i, (_, _, choice)) in chosen.iter().enumerate() {
        if let Some(version) = version_of(choice)
            && newest.is_none_or(|best| version_of(&chosen[best].2).is_some_and(|b| b < version))
        {
            newest = Some(i);
        }
    }
    if remember && let Some(i) = newest {
        client.remember_pool(bucket, key, chosen[i].0.pool);
    }
    let newest_version = newest.and_then(|i| version_of(&chosen[i].2));
    let floor_ahead = match (floor, newest_version) {
        (Some(floor), Some(version)) => floor > version,
        _ => false,
    };
    let unsettled =
        if floor_ahead { unreadable_floor(client, bucket, key, &chosen, floor.expect("checked")) } else { None };
    let mut unavailable = None;
    // An active pool that could not tell what it holds of the key.
    let mut active_unclear = None;
    let mut picked = None;
    let pools = &client.topo.map.pools;
    for (i, (lookup, answer, choice)) in chosen.into_iter().enumerate() {
        match choice {
            Err(e) if pools[lookup.pool].state == PoolState::Active => active_unclear = active_unclear.or(Some(e)),
            Err(e) => unavailable = unavailable.or(Some(e)),
            Ok(Some(meta)) if Some(i) == newest => picked = Some((lookup, answer, meta)),
            Ok(_) => {}
        }
    }
    // A draining pool's version is no answer while an active pool cannot tell: writes of a key
    // whose newest version is in a draining pool go to an active one, so that version may be
    // one an acknowledged overwrite there replaced.
    if picked.as_ref().is_some_and(|(lookup, ..)| pools[lookup.pool].state == PoolState::Draining)
        && let Some(e) = active_unclear.take()
    {
        return Outcome::Done(Box::new(Err(e)));
    }
    let unavailable = unavailable.or(active_unclear);
    let not_found = || Error::NotFound { bucket: bucket.into(), key: key.into() };
    if floor_ahead {
        return match (unavailable, unsettled) {
            (Some(e), _) => Outcome::Done(Box::new(Err(e))),
            (None, Some(e)) => Outcome::Unsettled(e),
            // A delete since collected (only its floor is left), or not collected yet.
            (None, None) => Outcome::Done(Box::new(Err(not_found()))),
        };
    }
    if let Some((lookup, answer, meta)) = &picked
        && let Some(e) = maybe_acknowledged_unreadable(client, bucket, key, lookup.placement, answer, meta)
    {
        return Outcome::Unsettled(e);
    }
    Outcome::Done(Box::new(match (picked, unavailable) {
        (Some((_, _, meta)), _) if meta.deleted => Err(not_found()),
        (Some((lookup, answer, meta)), _) => Ok(info_of(client, lookup.placement, &answer, meta)),
        (None, Some(e)) => Err(e),
        (None, None) => Err(not_found()),
    }))
}

/// When `meta` is the version `choose_version` gave because it may be acknowledged (its holders
/// and the silent drives reach W) although an older version is readable and no floor names it,
/// the error that it cannot be read. It is a write in flight (soon committed everywhere or
/// rolled back) or an acknowledged write whose finalize was lost, with drives out of reach:
/// asked again ([`Outcome::Unsettled`]), then failed, never answered with the older version.
fn maybe_acknowledged_unreadable(
    client: &Client,
    bucket: &str,
    key: &str,
    placement: Placement,
    answers: &KeyAnswers,
    meta: &ObjectMeta,
) -> Option<Error> {
    let replies = &answers.replies;
    let marker_quorum = client.erasure_at(&placement).marker_quorum();
    let tally = proto::VersionTally::of(replies);
    let needed = meta.drives_to_read(marker_quorum);
    let holders = tally.held.get(&meta.version).map_or(0, |(_, count)| *count);
    let older_readable = tally.newest_readable(marker_quorum).is_some_and(|r| r.version < meta.version);
    let acknowledged = tally.floor.is_some_and(|floor| floor >= meta.version);
    (holders < needed && older_readable && !acknowledged)
        .then(|| version_unreadable(client, bucket, key, placement, answers, meta.version, (holders, needed)))
}

/// For a read whose chosen version is older than `floor`, a version its drives know
/// acknowledged: `None` when `floor` is a delete (no answer holds it, as a collected marker
/// leaves only its floor, or one holds it as a marker), else the error that the object version
/// `floor` cannot be read from the answers: how many drives hold it, and what the others said.
fn unreadable_floor(
    client: &Client,
    bucket: &str,
    key: &str,
    chosen: &[PoolChoice<'_>],
    floor: VersionId,
) -> Option<Error> {
    // The pool whose answers hold the version most.
    let mut best: Option<(usize, &Lookup<'_>, &KeyAnswers, &ObjectMeta)> = None;
    for (lookup, answer, _) in chosen {
        let held: Vec<&ObjectMeta> =
            answer.replies.iter().flatten().filter_map(|v| v.all().find(|m| m.version == floor)).collect();
        if held.iter().any(|m| m.deleted) {
            return None;
        }
        if let Some(meta) = held.first()
            && best.as_ref().is_none_or(|(count, ..)| *count < held.len())
        {
            best = Some((held.len(), lookup, answer, meta));
        }
    }
    let (holders, lookup, answer, meta) = best?;
    let marker_quorum = client.erasure_at(&lookup.placement).marker_quorum();
    let needed = meta.drives_to_read(marker_quorum);
    Some(version_unreadable(client, bucket, key, lookup.placement, answer, floor, (holders, needed)))
}

/// A read of `version` fails: `counts` = (drives whose answers hold it, drives reading it
/// takes). Names every drive without it: what silenced it, or that it answered without it.
fn version_unreadable(
    client: &Client,
    bucket: &str,
    key: &str,
    placement: Placement,
    answers: &KeyAnswers,
    version: VersionId,
    (holders, needed): (usize, usize),
) -> Error {
    let drives = client.set_drives(&placement);
    let unreachable = drives
        .iter()
        .zip(&answers.replies)
        .zip(&answers.why)
        .filter(|((_, reply), _)| reply.as_ref().is_none_or(|v| v.all().all(|m| m.version != version)))
        .map(|((d, reply), why)| {
            let node = client.node_id(d.node_idx).to_owned();
            let reason = match (reply, why) {
                (Some(_), _) => {
                    format!("node {node}: drive {} does not hold version {}", d.drive_idx, version.to_hex())
                }
                (None, why) => silent_reason(&node, d.drive_idx, why.as_ref()),
            };
            FailedNode { node, reason }
        })
        .collect();
    Error::Unavailable {
        action: "read",
        unit: crate::Counted::Chunks,
        bucket: bucket.into(),
        key: key.into(),
        available: holders,
        total: drives.len(),
        needed,
        unreachable,
    }
}

/// Why drive `drive_idx` of `node` gave no usable answer, for an error naming it.
fn silent_reason(node: &str, drive_idx: usize, why: Option<&Silence>) -> String {
    match why {
        Some(Silence::Failed(error)) => error.clone(),
        Some(Silence::Unavailable) => {
            format!(
                "node {node}: drive {drive_idx} cannot answer for the key (being rebuilt, or its metadata unreadable)"
            )
        }
        None => format!("node {node}: no answer"),
    }
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

/// What a writer of one key learns from every pool that may hold it.
pub(crate) struct WriterView {
    /// The newest version of the key that any pool holds or knows acknowledged.
    pub(crate) newest: Option<VersionId>,
    /// Where the write must go: the pool that holds the newest version (so a key's versions
    /// stay in one pool), or when that pool is draining, the active pool with the newest
    /// version of the key; `None` when no active pool has seen the key (one is chosen for it).
    pub(crate) pool: Option<usize>,
    /// The key's newest version is in a draining pool (and no active pool has seen the key):
    /// the write goes where the mover sends the key (`ClusterMap::pool_for_moved_key`).
    pub(crate) draining: bool,
}

/// What every pool that may hold the key (active or draining) holds of it, for a writer. A pool
/// whose probe is clear holds nothing of it; every other pool's set must show what it holds
/// ([`versions_seen_in`]): a pool that cannot might hold a newer version. The pool the write
/// goes to (with one pool: that pool) must also have W drives answering, or the write could
/// not be acknowledged.
pub(crate) async fn writer_view(client: &Client, bucket: &str, key: &str) -> Result<WriterView, Error> {
    let mut asked = lookups(client, bucket, key);
    // Versions only: a writer never reads what it replaces (a large table's checksums would
    // be megabytes from every drive).
    let mut answers = versions_many(client, &asked, MetaDetail::WithFloorBrief, Sharing::Own).await;
    if asked.len() > 1 {
        widen_unclear_probes(client, &mut asked, &mut answers, MetaDetail::WithFloorBrief, false, Sharing::Own).await;
    }
    let pools = &client.topo.map.pools;
    // The pool the key lives in is where its newest live version is (versions a move evicted
    // from a pool are on their way out there), overall and among active pools: (that version,
    // pool index, what the pool's set holds).
    let mut version: Option<VersionId> = None;
    let mut newest: Option<(Option<VersionId>, usize, SetVersions)> = None;
    let mut newest_active: Option<(Option<VersionId>, usize, SetVersions)> = None;
    for (lookup, answer) in asked.iter().zip(answers) {
        if lookup.probe {
            continue; // Clear: the pool holds nothing of the key.
        }
        let seen = versions_seen_in(client, lookup, answer.replies, asked.len() == 1).await?;
        version = version.max(seen.newest);
        let newer_than = |best: &Option<(Option<VersionId>, usize, SetVersions)>| match (seen.newest_live, best) {
            (Some(version), Some((Some(best), _, _))) => *best < version,
            (Some(_), _) => true,
            (None, _) => asked.len() == 1,
        };
        if pools[lookup.pool].is_active() && newer_than(&newest_active) {
            newest_active = Some((seen.newest_live, lookup.pool, seen.clone()));
        }
        if newer_than(&newest) {
            newest = Some((seen.newest_live, lookup.pool, seen));
        }
    }
    let draining = newest.as_ref().is_some_and(|(version, pool, _)| version.is_some() && !pools[*pool].is_active());
    let target = match newest {
        Some(found) if pools[found.1].is_active() => Some(found),
        // The newest version is in a draining pool: the write goes to the active pool that
        // holds the key's newest version there, if any.
        _ => newest_active.filter(|(version, _, _)| version.is_some()),
    };
    if let Some((_, _, set)) = &target
        && set.answered < client.erasure_at(&set.placement).write_quorum()
    {
        return Err(set.write_quorum_error(client, bucket, key));
    }
    let pool = target.map(|(_, pool, _)| pool);
    Ok(WriterView { newest: version, pool, draining: draining && pool.is_none() })
}

/// What one set holds of a key, for a writer.
#[derive(Clone)]
struct SetVersions {
    /// The newest version any drive holds (current or retained) or knows acknowledged.
    newest: Option<VersionId>,
    /// The same among drives that hold a current version of the key (a drive without one
    /// holds only versions on their way out: evicted by a move to another pool).
    newest_live: Option<VersionId>,
    /// Drives that answered (a drive being rebuilt answers, and takes the write).
    answered: usize,
    placement: Placement,
    /// Bit `p` set: the drive at position `p` did not answer (n <= `cluster::N_MAX` = 32).
    silent: u32,
}

impl SetVersions {
    /// The ids of the nodes whose drives did not answer, for an error (built only then).
    fn unreachable(&self, client: &Client) -> String {
        let drives = client.set_drives(&self.placement).iter().enumerate();
        let silent = drives.filter(|(position, _)| self.silent & (1 << position) != 0);
        silent.map(|(_, d)| client.node_id(d.node_idx)).collect::<Vec<_>>().join(", ")
    }

    /// The write cannot go to this set: fewer than W of its drives answered.
    fn write_quorum_error(&self, client: &Client, bucket: &str, key: &str) -> Error {
        let erasure = client.erasure_at(&self.placement);
        Error::WriteQuorum {
            bucket: bucket.into(),
            key: key.into(),
            acked: self.answered,
            total: erasure.n(),
            needed: erasure.write_quorum(),
            reasons: format!("unreachable nodes: {}", self.unreachable(client)),
            unanswered: 0,
        }
    }
}

/// What the key's set holds, for a writer to order its version after. Fails unless at least
/// n - W + 1 drives answered and can speak for the key (a drive being rebuilt cannot): then any
/// version acknowledged before this call, which is on W drives, is among the answers; and, for
/// the set the write goes to (`target`), unless W drives answered. Drives skipped for a recent
/// failure are asked once more when fewer answered than that needs.
async fn versions_seen_in(
    client: &Client,
    lookup: &Lookup<'_>,
    mut replies: Vec<Option<KeyVersions>>,
    target: bool,
) -> Result<SetVersions, Error> {
    let (bucket, key) = (lookup.bucket, lookup.key);
    let erasure = client.erasure_at(&lookup.placement);
    let drives = client.set_drives(&lookup.placement);
    let needed = erasure.n() - erasure.write_quorum() + 1;
    let enough = if target { erasure.write_quorum() } else { needed };
    if replies.iter().flatten().count() < enough {
        // Drives skipped for a recent failure may be back, and the write needs them: ask now.
        let silent: Vec<usize> = (0..drives.len()).filter(|&p| replies[p].is_none()).collect();
        for position in silent {
            let drive = &drives[position];
            let item = MetaKey { drive: drive.drive_idx as u32, bucket: bucket.to_owned(), key: key.to_owned() };
            let request = Request::MetaGet { items: vec![item], detail: MetaDetail::WithFloorBrief };
            client.count_metadata_request(1);
            if let Ok(Response::Versions { mut keys }) = client.call_now(drive.node_idx, &request).await
                && keys.len() == 1
            {
                replies[position] = keys.pop();
            }
        }
    }
    let knowing = replies.iter().flatten().filter(|v| !v.unavailable).count();
    // Floors too: a collected delete marker leaves only its floor, and a write after it must
    // be newer.
    let floors = replies.iter().flatten().filter_map(|v| v.finalized);
    let live = replies.iter().flatten().filter(|v| v.current.is_some());
    let live_floors = live.clone().filter_map(|v| v.finalized);
    let seen = SetVersions {
        newest: replies.iter().flatten().flat_map(KeyVersions::all).map(|m| m.version).chain(floors).max(),
        newest_live: live.flat_map(KeyVersions::all).map(|m| m.version).chain(live_floors).max(),
        answered: replies.iter().flatten().count(),
        placement: lookup.placement,
        silent: (0..replies.len()).filter(|&p| replies[p].is_none()).fold(0, |mask, p| mask | 1 << p),
    };
    if target && (seen.answered < erasure.write_quorum() || knowing < needed) {
        // The write goes to this set: say so in its terms.
        return Err(seen.write_quorum_error(client, bucket, key));
    }
    if knowing < needed {
        // Nothing was written: the write cannot be ordered after what this pool may hold.
        let reasons = format!(
            "pool {} (set {}) cannot show which versions of the key it holds: {knowing} of its drives answered, {needed} needed; unreachable nodes: {}",
            client.topo.map.pools[lookup.pool].id,
            lookup.placement.set_idx,
            seen.unreachable(client)
        );
        let (total, bucket, key) = (erasure.n(), bucket.into(), key.into());
        return Err(Error::WriteQuorum { bucket, key, acked: knowing, total, needed, reasons, unanswered: 0 });
    }
    Ok(seen)
}

/// Every version each lookup's key has on each drive of its set, in lookup order.
async fn versions_many(
    client: &Client,
    lookups: &[Lookup<'_>],
    detail: MetaDetail,
    sharing: Sharing,
) -> Vec<KeyAnswers> {
    // (lookup index, set position) of every item each node is asked for.
    let mut asked: Vec<Vec<(usize, usize)>> = vec![Vec::new(); client.topo.pools.len()];
    let mut items: Vec<Vec<MetaKey>> = vec![Vec::new(); client.topo.pools.len()];
    for (key_idx, lookup) in lookups.iter().enumerate() {
        let drives = client.set_drives(&lookup.placement);
        let positions =
            (0..lookup.placement.n).filter(|&position| !lookup.probe || is_probed(client, &lookup.placement, position));
        for position in positions {
            let drive = &drives[position];
            asked[drive.node_idx].push((key_idx, position));
            items[drive.node_idx].push(MetaKey {
                drive: drive.drive_idx as u32,
                bucket: lookup.bucket.to_owned(),
                key: lookup.key.to_owned(),
            });
        }
    }
    let calls = items.into_iter().enumerate().map(|(node_idx, items)| async move {
        if items.is_empty() {
            Vec::new()
        } else if sharing == Sharing::Shared && items.len() <= coalesce::CALLER_ITEMS_MAX {
            client.topo.meta_queues[node_idx].ask(client, node_idx, items, detail).await
        } else {
            client.meta_get_direct(node_idx, &items, detail).await
        }
    });
    let answers = futures_util::future::join_all(calls).await;
    let mut by_key: Vec<KeyAnswers> = lookups
        .iter()
        .map(|lookup| KeyAnswers { replies: vec![None; lookup.placement.n], why: vec![None; lookup.placement.n] })
        .collect();
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

/// The version one set's replies agree on (maybe a delete marker), `None` for a key the set
/// does not hold, or `Unavailable` with the numbers.
///
/// Whatever it chose, the answers must be enough to have seen every acknowledged version: one
/// is on W drives, so with W or more drives silent it may be on none that answered, and the
/// version chosen (or "absent") may be older than an acknowledged write. The read fails then
/// (`crate::may_miss_acknowledged`), as does the mover's look at the key: a ranged read needs
/// only the chunks it covers, so the chunks of an older version's holder were enough to answer
/// with it. (Chaos seed 7 of the decommission test: a client with an old map heard only from
/// the one node the new map had not reached yet, the others refusing its requests or down,
/// and read the value an acknowledged overwrite had replaced 3 s before.)
fn choose(
    client: &Client,
    bucket: &str,
    key: &str,
    placement: Placement,
    answers: &KeyAnswers,
    promote: crate::Promote,
) -> Result<Option<ObjectMeta>, Error> {
    let replies = &answers.replies;
    let erasure = client.erasure_at(&placement);
    let k = erasure.k;
    let write_quorum = erasure.write_quorum();
    let chosen = choose_version(replies, erasure.marker_quorum(), write_quorum, promote);
    if crate::may_miss_acknowledged(replies, chosen.as_ref().map(|m| m.version), write_quorum) {
        let needed = k.max(erasure.n() - write_quorum + 1);
        return Err(too_few_answered(client, bucket, key, placement, answers, needed));
    }
    let reachable = replies.iter().filter(|r| r.is_some()).count();
    if chosen.is_none() && reachable < k {
        return Err(too_few_answered(client, bucket, key, placement, answers, k));
    }
    Ok(chosen)
}

/// A read fails: fewer drives answered than `needed`. Names every silent drive and why.
fn too_few_answered(
    client: &Client,
    bucket: &str,
    key: &str,
    placement: Placement,
    answers: &KeyAnswers,
    needed: usize,
) -> Error {
    let drives = client.set_drives(&placement);
    let unreachable = drives
        .iter()
        .zip(&answers.replies)
        .zip(&answers.why)
        .filter(|((_, r), _)| r.is_none())
        .map(|((d, _), why)| {
            let node = client.node_id(d.node_idx).to_owned();
            let reason = silent_reason(&node, d.drive_idx, why.as_ref());
            FailedNode { node, reason }
        })
        .collect();
    Error::Unavailable {
        action: "read",
        unit: crate::Counted::Drives,
        bucket: bucket.into(),
        key: key.into(),
        available: answers.replies.iter().filter(|r| r.is_some()).count(),
        total: drives.len(),
        needed,
        unreachable,
    }
}

/// [`choose`] for a reader. When nothing was readable, `choose` gives the newest version seen
/// (so the read reports what is missing): a version with data then fails at its chunks, but one
/// without (a delete marker above all) would be taken as it is, and a failed delete's marker
/// left on one drive (its rollback did not reach a drive killed mid-commit) would read as
/// "absent" over an acknowledged PUT whose holders are out of reach. Unless a drive knows it
/// acknowledged, such a version is not an answer: the read fails. Readers promote a newer
/// version that may be acknowledged over the readable one (`choose_version`). (The mover's
/// `holdings` takes `choose` as it is, without promotion: it sorts leftovers and doubtful
/// versions out itself.)
fn choose_readable(
    client: &Client,
    bucket: &str,
    key: &str,
    placement: Placement,
    answers: &KeyAnswers,
) -> Result<Option<ObjectMeta>, Error> {
    let Some(meta) = choose(client, bucket, key, placement, answers, crate::Promote::Yes)? else {
        return Ok(None);
    };
    let replies = &answers.replies;
    let marker_quorum = client.erasure_at(&placement).marker_quorum();
    if !crate::is_unconfirmed(replies, &meta, marker_quorum) {
        return Ok(Some(meta));
    }
    let needed = meta.drives_to_read(marker_quorum);
    let holders = replies.iter().flatten().filter(|v| v.all().any(|m| m.version == meta.version)).count();
    Err(version_unreadable(client, bucket, key, placement, answers, meta.version, (holders, needed)))
}

/// What a read of `meta` (chosen from `answers`, the replies of its set) needs to know; tells
/// holders of the version about drives that missed it.
fn info_of(client: &Client, placement: Placement, answers: &KeyAnswers, meta: ObjectMeta) -> ObjectInfo {
    let replies = &answers.replies;
    let info = object_info(client, placement, answers, meta);
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
    info
}

/// What a read of `meta` (chosen from `answers`, the replies of its set) needs to know.
fn object_info(client: &Client, placement: Placement, answers: &KeyAnswers, meta: ObjectMeta) -> ObjectInfo {
    let drives = client.set_drives(&placement);
    let meta_positions = answers
        .replies
        .iter()
        .enumerate()
        .filter(|(_, r)| r.as_ref().is_some_and(|v| v.all().any(|m| m.version == meta.version)))
        .map(|(p, _)| p)
        .collect();
    let names = drives.iter().map(|d| (client.node_id(d.node_idx).to_owned(), d.drive_idx)).collect();
    ObjectInfo { meta, placement, drives: names, meta_positions }
}

/// What one pool holds of a key, for moving the key between pools.
pub(crate) struct PoolHolding {
    /// Index of the pool in the map.
    pub(crate) pool: usize,
    /// The version its set agrees on (a delete marker included), with what reading it needs.
    pub(crate) chosen: Option<ObjectInfo>,
    /// The newest version known acknowledged here: a drive's floor names it (a collected
    /// marker leaves only that), or W drives hold it.
    pub(crate) acknowledged: Option<VersionId>,
    /// The newest version held here that cannot have been acknowledged: its holders and the
    /// drives that did not answer are fewer than W.
    pub(crate) leftover: Option<VersionId>,
    /// A version newer than the chosen one and every floor that may be acknowledged but cannot
    /// be read now: too few holders to read it, but with the silent drives they reach W.
    pub(crate) doubtful: Option<VersionId>,
}

impl PoolHolding {
    /// The newest version this pool speaks for: chosen or known acknowledged.
    pub(crate) fn top(&self) -> Option<VersionId> {
        self.chosen.as_ref().map(|info| info.meta.version).max(self.acknowledged)
    }

    fn of(client: &Client, lookup: &Lookup<'_>, answer: &KeyAnswers, chosen: Option<ObjectMeta>) -> Self {
        let write_quorum = client.erasure_at(&lookup.placement).write_quorum();
        let silent = answer.replies.iter().filter(|r| r.is_none()).count();
        let mut holders: std::collections::BTreeMap<VersionId, usize> = std::collections::BTreeMap::new();
        for reply in answer.replies.iter().flatten() {
            let mut versions: Vec<VersionId> = reply.all().map(|m| m.version).collect();
            versions.sort_unstable();
            versions.dedup();
            for version in versions {
                *holders.entry(version).or_default() += 1;
            }
        }
        let floor = answer.replies.iter().flatten().filter_map(|v| v.finalized).max();
        let held_by_w = holders.iter().filter(|(_, count)| **count >= write_quorum).map(|(v, _)| *v).max();
        let chosen_version = chosen.as_ref().map(|meta| meta.version);
        let leftover = holders.iter().filter(|(_, count)| **count + silent < write_quorum).map(|(v, _)| *v).max();
        let doubtful = holders
            .iter()
            .filter(|(version, count)| {
                **count < write_quorum
                    && **count + silent >= write_quorum
                    && chosen_version.is_none_or(|c| c < **version)
                    && floor.is_none_or(|f| f < **version)
            })
            .map(|(v, _)| *v)
            .max();
        let chosen = chosen.map(|meta| object_info(client, lookup.placement, answer, meta));
        PoolHolding { pool: lookup.pool, chosen, acknowledged: floor.max(held_by_w), leftover, doubtful }
    }
}

/// What every pool that may hold the key (active or draining) holds of it, each set asked whole
/// with floors. Fails if a pool cannot tell (fewer than k of the key's drives there answered).
/// A drive without a current version of the key holds only versions on their way out (evicted
/// by an earlier move, or written below a collected marker's floor): they do not count, or a
/// key moved back and forth would be evicted from both pools. Sends no repair hints.
pub(crate) async fn holdings(client: &Client, bucket: &str, key: &str) -> Result<Vec<PoolHolding>, Error> {
    let mut asked = lookups(client, bucket, key);
    for lookup in &mut asked {
        lookup.probe = false;
    }
    let mut answers = readable(versions_many(client, &asked, MetaDetail::WithFloor, Sharing::Shared).await);
    for reply in answers.iter_mut().flat_map(|answer| answer.replies.iter_mut().flatten()) {
        if reply.current.is_none() {
            reply.retained.clear();
        }
    }
    let mut holdings = Vec::with_capacity(asked.len());
    for (lookup, answer) in asked.iter().zip(answers) {
        // Without promotion: `PoolHolding::of` sorts out newer versions that may be
        // acknowledged but cannot be read (doubtful) against the readable one itself.
        let chosen = choose(client, bucket, key, lookup.placement, &answer, crate::Promote::No)?;
        holdings.push(PoolHolding::of(client, lookup, &answer, chosen));
    }
    Ok(holdings)
}

impl Client {
    /// Asks one node for `items` in requests of at most `BATCH_ITEMS_MAX`: one answer per item,
    /// in order, or why the node could not give it. A node answers the first items of a request
    /// when all of them would not fit in one frame; the rest are asked again.
    pub(crate) async fn meta_get_direct(
        &self,
        node_idx: usize,
        items: &[MetaKey],
        detail: MetaDetail,
    ) -> Vec<ItemAnswer> {
        let mut metas: Vec<ItemAnswer> = Vec::with_capacity(items.len());
        // Every round answers at least one item or fails the rest: at most `items.len()` rounds.
        while metas.len() < items.len() {
            let rest = &items[metas.len()..];
            let batch = &rest[..rest.len().min(BATCH_ITEMS_MAX)];
            let request = Request::MetaGet { items: batch.to_vec(), detail };
            self.count_metadata_request(batch.len());
            let failure = match self.call(node_idx, &request).await {
                Ok(Response::Versions { keys: got })
                    if !got.is_empty()
                        && got.len() <= batch.len()
                        && got.iter().all(|v| v.checksums_left_out == detail.brief()) =>
                {
                    metas.extend(got.into_iter().map(Ok));
                    continue;
                }
                Ok(Response::Versions { keys: got }) if got.iter().any(|v| v.checksums_left_out != detail.brief()) => {
                    // A whole answer without checksums would fail a read later; never use one.
                    format!("node {} answered metadata of another detail than {detail:?}", self.node_id(node_idx))
                }
                Ok(Response::Versions { keys: got }) => {
                    format!("node {} answered {} of {} metadata items", self.node_id(node_idx), got.len(), batch.len())
                }
                Ok(Response::Error { kind, message }) => {
                    Error::from_node(self.node_id(node_idx), kind, &message).to_string()
                }
                Ok(other) => format!("node {}: unexpected answer {other:?}", self.node_id(node_idx)),
                Err(e) => e.to_string(),
            };
            metas.extend(rest.iter().map(|_| Err(failure.clone())));
        }
        metas
    }
}
