//! PUT: read stripes from the source, encode parity, fan chunks out to the set's drives with two
//! stripes in flight, then commit the metadata on at least W drives (or roll back).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use cluster::DriveRef;
use md5::{Digest, Md5};
use proto::{
    CommitCondition, CommitOutcome, META_FORMAT_VERSION, ObjectMeta, Pad, Request, Response, StripeGeometry, VersionId,
};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::conn::Conn;
use crate::{Client, Error, ObjectInfo, PutOptions};

/// Finalizes sent in the background at once, per client; past it a writer sends its own inline.
const FINALIZES_IN_FLIGHT_MAX: usize = 256;

/// Bytes per checksum block (`ObjectMeta::block_bytes`): a ranged read fetches and verifies
/// whole blocks, so smaller blocks mean less read amplification and more metadata (4 bytes per
/// block: 64 B per 1 MiB chunk at 64 KiB).
pub(crate) const CHECKSUM_BLOCK_BYTES: u32 = 64 << 10;

/// Most block checksums one object's metadata may carry: its record must fit one frame, and so
/// must a repair's commit, which carries the record and one position's checksums again (at
/// most half of them: n >= 2); postcard spends up to 5 bytes per u32 and 1 MiB is left for
/// the other fields. About 176 GiB per piece at 4+2 with 64 KiB blocks (11 GiB with 4 KiB
/// blocks); larger objects go through multipart.
pub(crate) const CHECKSUMS_PER_OBJECT_MAX: usize = (proto::CONTROL_BODY_BYTES_MAX - (1 << 20)) * 2 / 15;

/// The checksum block size for chunks of `chunk_bytes`.
pub(crate) fn block_bytes(chunk_bytes: u32) -> u32 {
    CHECKSUM_BLOCK_BYTES.min(chunk_bytes)
}

/// The checksum block size a PUT asked for (`PutOptions::block_bytes`), checked, for chunks of
/// `chunk_bytes`.
fn chosen_block_bytes(asked: Option<u32>, chunk_bytes: usize) -> Result<usize, Error> {
    let chunk_bytes = u32::try_from(chunk_bytes).unwrap_or(u32::MAX);
    match asked {
        None => Ok(block_bytes(chunk_bytes) as usize),
        Some(asked)
            if asked.is_power_of_two() && (crate::CHECKSUM_BLOCK_BYTES_MIN..=CHECKSUM_BLOCK_BYTES).contains(&asked) =>
        {
            Ok(asked.min(chunk_bytes) as usize)
        }
        Some(asked) => Err(Error::BadBlockSize(asked)),
    }
}

/// Sends one chunk on `conn` and waits for the node's answer; a failed connection is dropped.
async fn send_chunk(
    conn: &mut Option<Conn>,
    drive: &DriveRef,
    target: &ChunkTarget<'_>,
    chunk: &[u8],
    crcs: &[u32],
    timeout: std::time::Duration,
) -> Result<(), Error> {
    let Some(c) = conn.as_mut() else {
        return Ok(());
    };
    assert_eq!(crcs.len(), chunk.len().div_ceil(target.block_bytes as usize), "one checksum per block");
    let request = Request::ChunkWrite {
        drive: drive.drive_idx as u32,
        bucket: target.bucket.to_owned(),
        version: target.version,
        offset: target.offset,
        len: chunk.len() as u32,
        block_bytes: target.block_bytes,
        crcs: crcs.to_vec(),
        staging: proto::Staging::Write,
    };
    let node = c.node.clone();
    let exchange = async {
        c.send_request_with_data(&request, chunk).await?;
        match c.read_response().await? {
            Response::Ok => Ok(()),
            other => Err(c.unexpected(&other)),
        }
    };
    let result = tokio::time::timeout(timeout, exchange).await.unwrap_or(Err(Error::Timeout { node, timeout }));
    if result.is_err() {
        *conn = None;
    }
    result
}

/// Sends one commit on `conn`; `None` if the drive already dropped out of the PUT.
/// Whether a failed commit may still have applied on its drive: no answer came (a timeout, a
/// connection that broke after the request went out), as opposed to an answer that refused it.
fn outcome_unknown(error: &Error) -> bool {
    matches!(error, Error::Timeout { .. } | Error::NodeUnreachable { .. } | Error::Protocol { .. })
}

async fn send_commit(
    conn: &mut Option<Conn>,
    request: &Request,
    timeout: std::time::Duration,
) -> Option<Result<CommitOutcome, Error>> {
    let c = conn.as_mut()?;
    let node = c.node.clone();
    let result = tokio::time::timeout(timeout, c.call(request)).await.unwrap_or(Err(Error::Timeout { node, timeout }));
    Some(match result {
        Ok(Response::Committed { outcome }) => Ok(outcome),
        Ok(other) => Err(c.unexpected(&other)),
        Err(e) => Err(e),
    })
}

/// Where the chunks of one stripe go: the same for every drive of the set.
struct ChunkTarget<'a> {
    bucket: &'a str,
    version: VersionId,
    /// Offset of the stripe's chunk in each drive's file.
    offset: u64,
    block_bytes: u32,
}

/// A commit round that reached the write quorum ([`Fanout::commit_round`]).
struct Round {
    /// Set positions whose drive holds the round's version.
    applied: Vec<usize>,
    /// The newest version that some of those drives held current instead (`Superseded`).
    newer: Option<VersionId>,
    /// Piece keys of the multipart versions the round's version replaced.
    replaced: std::collections::BTreeSet<String>,
}

/// A commit that reached the write quorum.
pub(crate) struct Committed {
    /// Set positions whose drive holds the version.
    pub(crate) positions: Vec<usize>,
    /// Piece keys of the multipart version this one replaced: garbage once it is committed,
    /// deleted by the public entry points (`multipart::delete_pieces`).
    pub(crate) replaced_parts: Vec<String>,
}

/// One stripe being filled or sent: k data chunks then m parity chunks, each `chunk_bytes` long.
struct StripeBuffer {
    bytes: Vec<u8>,
    /// The object's chunk size (the map's, or an aligned layout's).
    chunk_bytes: usize,
    /// The k and n it was last cut and encoded for (`fill_stripe`).
    k: usize,
    n: usize,
    /// Object bytes in this stripe (0 at the end of the source).
    data_len: usize,
    chunk_len: usize,
    /// Block checksums of every chunk, chunk by chunk.
    crcs: Vec<u32>,
    blocks_per_chunk: usize,
    /// The object's checksum block size.
    block_bytes: usize,
}

/// The PUT in progress: one connection per set position, `None` once that drive failed.
struct Fanout<'a> {
    client: &'a Client,
    bucket: &'a str,
    key: &'a str,
    version: VersionId,
    /// The k+m of the set written to.
    erasure: cluster::ErasureConfig,
    drives: Vec<DriveRef>,
    conns: Vec<Option<Conn>>,
    failures: Vec<Error>,
}

pub(crate) async fn put(
    client: &Client,
    bucket: &str,
    key: &str,
    source: &mut (dyn AsyncRead + Unpin + Send),
    options: &PutOptions,
) -> Result<(ObjectInfo, Vec<String>), Error> {
    put_in(client, bucket, key, source, options, None).await
}

/// [`put`] into a pool of erasure config `only` when given (a multipart piece goes where its
/// upload's other pieces can go: one object's parts share one k+m).
pub(crate) async fn put_in(
    client: &Client,
    bucket: &str,
    key: &str,
    source: &mut (dyn AsyncRead + Unpin + Send),
    options: &PutOptions,
    only: Option<cluster::ErasureConfig>,
) -> Result<(ObjectInfo, Vec<String>), Error> {
    let map = Arc::clone(&client.topo.map);
    // A bad block size fails before anything is sent.
    chosen_block_bytes(options.block_bytes, map.chunk_bytes as usize)?;
    let mut md5 = Md5::new();
    // The version read (a round trip to the sets) overlaps reading and encoding the first
    // stripe when every pool has the cluster's k+m; else the target's k+m must be known first.
    let uniform =
        only.is_none_or(|only| only == map.erasure) && map.pools.iter().all(|pool| pool.erasure == map.erasure);
    let (mut target, current, filled, padding) = if uniform {
        let codec = client.codec(map.erasure.k, map.erasure.m)?;
        let (chunk_bytes, mut padding) = Padding::plan(options.align.as_ref(), map.erasure.k, map.chunk_bytes);
        let mut current = StripeBuffer::take(client, map.erasure.n(), chunk_bytes);
        current.block_bytes = chosen_block_bytes(options.block_bytes, chunk_bytes)?;
        let (target, filled) = tokio::join!(
            client.write_target(bucket, key, only),
            fill_stripe(&codec, source, &mut current, &mut md5, &mut padding)
        );
        (target, current, filled, padding)
    } else {
        let target = client.write_target(bucket, key, only).await?;
        let erasure = client.erasure_at(&target.1);
        let codec = client.codec(erasure.k, erasure.m)?;
        let (chunk_bytes, mut padding) = Padding::plan(options.align.as_ref(), erasure.k, map.chunk_bytes);
        let mut current = StripeBuffer::take(client, erasure.n(), chunk_bytes);
        current.block_bytes = chosen_block_bytes(options.block_bytes, chunk_bytes)?;
        let filled = fill_stripe(&codec, source, &mut current, &mut md5, &mut padding).await;
        (Ok(target), current, filled, padding)
    };
    let encoded_as = (current.k, current.n);
    let mut planner = client.clone();
    if filled.is_ok() && planner.refreshed_after(client, true).await {
        // A node holds a newer map: plan with it, keeping the stripe already read (a map
        // change keeps the chunk size, and the k+m of every pool it had).
        planner = client.current();
        target = planner.write_target(bucket, key, only).await;
    }
    let client = &planner;
    let target = target.and_then(|(version, placement)| {
        let erasure = client.erasure_at(&placement);
        if filled.is_ok() && (erasure.k, erasure.n()) != encoded_as {
            // The newer map sends the key to a pool of another k+m than the stripe was cut for.
            let reason = format!("the key now goes to a pool of erasure {erasure}; run the upload again");
            return Err(Error::MapRefresh { version: client.topo.map.version, reason });
        }
        Ok((version, placement))
    });
    let (version, placement) = match (target, filled) {
        (Ok(target), Ok(())) => target,
        (Err(e), _) | (_, Err(e)) => {
            current.give_back(client);
            return Err(e);
        }
    };
    let fields = MetaFields {
        content_type: options.content_type.clone().unwrap_or_else(|| "application/octet-stream".into()),
        user_meta: options.user_meta.clone(),
        headers: options.headers.clone(),
        headers_at_end: options.headers_at_end.clone(),
        modified_ms: unix_ms(),
        etag: None,
        recorded_etag: None,
    };
    let target = Target { bucket, key, version, placement, restamp: Restamp::Allowed };
    upload(client, &target, current, source, md5, padding, &fields, options.condition).await
}

impl MetaFields {
    /// The headers to store: those given, then those the source left at its end.
    fn all_headers(&self) -> Vec<(String, String)> {
        let mut headers = self.headers.clone();
        if let Some(at_end) = &self.headers_at_end {
            headers.extend(at_end.get());
        }
        headers
    }
}

/// Where an upload goes: the key, its version and its erasure set.
struct Target<'a> {
    bucket: &'a str,
    key: &'a str,
    version: VersionId,
    placement: cluster::Placement,
    /// Whether the commit may take a later version id (a writer's new object) or must keep
    /// `version` (a copy or re-layout of an existing version).
    restamp: Restamp,
}

/// Re-stamps a write may take after its first commit (issue 37, item 9). Each needs another
/// write of the key to have committed a newer version on one of this write's drives during
/// the round before it: past this many in a row, writers keep superseding each other, and the
/// write is acknowledged as it stands (ordered among them by its version; logged).
pub(crate) const RESTAMPS_MAX: usize = 3;

/// Whether [`Fanout::commit`] may commit the object again under a later version id when it
/// finds a newer version current on some of its drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Restamp {
    /// A writer's own version: acknowledged last, it must order after every version
    /// acknowledged before its commit landed.
    Allowed,
    /// A copy (pool move) or re-layout keeps the version id it copies.
    Never,
}

/// The metadata fields an upload keeps as given (the rest it computes).
struct MetaFields {
    content_type: String,
    user_meta: Vec<(String, String)>,
    headers: Vec<(String, String)>,
    /// More headers, read once the source has ended.
    headers_at_end: Option<crate::HeadersAtEnd>,
    modified_ms: u64,
    /// The MD5 the bytes must have (a copy of a version): the commit is refused otherwise.
    etag: Option<String>,
    /// The ETag to record instead of the bytes' MD5: a multipart object's (MD5 of its parts'
    /// MD5s), when a re-layout keeps it (the reader checked every part's MD5).
    recorded_etag: Option<String>,
}

/// Sends `current` (the first stripe, filled already) and the rest of `source` to `target`'s
/// set, then commits on W drives.
#[allow(clippy::too_many_arguments)]
async fn upload(
    client: &Client,
    target: &Target<'_>,
    mut current: StripeBuffer,
    source: &mut (dyn AsyncRead + Unpin + Send),
    mut md5: Md5,
    mut padding: Padding,
    fields: &MetaFields,
    condition: CommitCondition,
) -> Result<(ObjectInfo, Vec<String>), Error> {
    let erasure = client.erasure_at(&target.placement);
    let (k, n) = (erasure.k, erasure.n());
    assert_eq!((current.k, current.n), (k, n), "the first stripe is cut for the target's k+m");
    let codec = client.codec(erasure.k, erasure.m)?;
    let (chunk_bytes, block_bytes) = (current.chunk_bytes, current.block_bytes);
    let (bucket, key, version, placement) = (target.bucket, target.key, target.version, target.placement);
    let mut crcs = Vec::new();
    let mut size = 0u64;
    let mut fanout = match Fanout::open(client, bucket, key, version, &placement).await {
        Ok(fanout) => fanout,
        Err(e) => {
            current.give_back(client);
            return Err(e);
        }
    };
    // Taken only once a full stripe shows the object may go on: small objects use one buffer.
    let mut next: Option<StripeBuffer> = None;
    let result: Result<(), Error> = async {
        let mut stripe_idx = 0u64;
        while current.data_len > 0 {
            let offset = stripe_idx * chunk_bytes as u64;
            if current.data_len < k * chunk_bytes {
                // A short stripe: the source has ended (fill_stripe reads until full or EOF).
                fanout.send_stripe(&current, stripe_idx, offset, &placement).await?;
                crcs.extend_from_slice(&current.crcs);
                size += current.data_len as u64;
                break;
            }
            let following = next.get_or_insert_with(|| StripeBuffer::take_like(client, n, &current));
            // Send this stripe while the next one is read and encoded: two stripes in flight.
            let (sent, filled) = tokio::join!(
                fanout.send_stripe(&current, stripe_idx, offset, &placement),
                fill_stripe(&codec, source, following, &mut md5, &mut padding)
            );
            sent?;
            filled?;
            crcs.extend_from_slice(&current.crcs);
            if crcs.len() > CHECKSUMS_PER_OBJECT_MAX {
                return Err(Error::ObjectTooLarge { max_bytes: stripe_idx * (k * chunk_bytes) as u64 });
            }
            size += current.data_len as u64;
            std::mem::swap(&mut current, following);
            stripe_idx += 1;
        }
        padding.finish()
    }
    .await;
    current.give_back(client);
    if let Some(buffer) = next {
        buffer.give_back(client);
    }
    if let Err(e) = result {
        fanout.abort_all().await;
        return Err(e);
    }
    let etag = hex::encode(md5.finalize());
    if let Some(expected) = fields.etag.as_ref().filter(|expected| **expected != etag) {
        fanout.abort_all().await;
        let reason = format!("the copied bytes have MD5 {etag}, the version {expected}");
        return Err(Error::Node {
            node: "(copy source)".into(),
            kind: proto::ErrorKind::ChecksumMismatch,
            message: reason,
        });
    }
    let mut meta = ObjectMeta {
        format: META_FORMAT_VERSION,
        bucket: bucket.to_owned(),
        key: key.to_owned(),
        version: fanout.version,
        deleted: false,
        size,
        etag: fields.recorded_etag.clone().unwrap_or(etag),
        content_type: fields.content_type.clone(),
        user_meta: fields.user_meta.clone(),
        headers: fields.all_headers(),
        modified_ms: fields.modified_ms,
        k: k as u8,
        m: erasure.m as u8,
        chunk_bytes: chunk_bytes as u32,
        block_bytes: block_bytes as u32,
        set_idx: placement.set_idx as u32,
        rotation: placement.rotation as u8,
        crcs,
        parts: Vec::new(),
        pads: padding.pads,
    };
    meta.size = size - meta.pads.iter().map(|p| u64::from(p.len)).sum::<u64>();
    debug_assert_eq!(meta.geometry(), StripeGeometry::new(size, k, chunk_bytes as u32));
    let committed = fanout.commit(&mut meta, condition, target.restamp).await?;
    let drives = fanout.drives.iter().map(|d| (client.node_id(d.node_idx).to_owned(), d.drive_idx)).collect();
    Ok((ObjectInfo { meta, placement, drives, meta_positions: committed.positions }, committed.replaced_parts))
}

/// Bytes read from the source version per step of a copy (bounded memory per copy).
const COPY_STEP_BYTES: usize = 8 << 20;

/// Writes `meta`'s version of its key (the same version id, metadata and bytes, read from
/// `source` when it has a data file) to the key's set in pool `pool`. Returns the metadata
/// written, the chunk bytes written (data and parity) and the multipart pieces of a version it
/// replaced there.
pub(crate) async fn copy_version(
    client: &Client,
    meta: &ObjectMeta,
    source: Option<&ObjectInfo>,
    pool: usize,
) -> Result<(ObjectMeta, u64, Vec<String>), Error> {
    let map = Arc::clone(&client.topo.map);
    let placement = map.placement_in(pool, &meta.bucket, &meta.key);
    let target =
        Target { bucket: &meta.bucket, key: &meta.key, version: meta.version, placement, restamp: Restamp::Never };
    if !meta.has_data_file() {
        let mut fanout = Fanout::open(client, target.bucket, target.key, meta.version, &placement).await?;
        let mut copy = meta.clone();
        copy.set_idx = placement.set_idx as u32;
        copy.rotation = placement.rotation as u8;
        if copy.parts.is_empty() {
            // A marker or an empty object takes the target's k+m (a multipart record keeps
            // its pieces', which the caller moved first if they changed).
            let erasure = client.erasure_at(&placement);
            (copy.k, copy.m) = (erasure.k as u8, erasure.m as u8);
        }
        let committed = fanout.commit(&mut copy, CommitCondition::None, Restamp::Never).await?;
        return Ok((copy, 0, committed.replaced_parts));
    }
    let source = source.expect("a version with data is copied from a readable source");
    assert_eq!(source.meta.version, meta.version, "the copy reads the version it writes");
    let erasure = map.pools[pool].erasure;
    // An aligned version stays aligned where the stripes have as many data chunks.
    let (chunk_bytes, padding) = if erasure.k == usize::from(meta.k) && !meta.pads.is_empty() {
        (meta.chunk_bytes, Padding::new(meta.size, meta.pads.clone()))
    } else {
        (map.chunk_bytes, Padding::plain())
    };
    let (info, replaced) = rewrite(client, source, &target, chunk_bytes, padding, None).await?;
    assert_eq!(info.meta.size, meta.size, "a copy has the size of its source");
    let geometry = info.meta.geometry();
    let written: u64 = (0..geometry.stripes).map(|stripe| geometry.chunk_len(stripe) as u64).sum();
    Ok((info.meta, written * erasure.n() as u64, replaced))
}

/// Streams `source`'s bytes through a bounded pipe into an upload to `target` with chunks of
/// `chunk_bytes` and `padding`, keeping the source's metadata; the commit is refused unless
/// the bytes written have the source's MD5.
async fn rewrite(
    client: &Client,
    source: &ObjectInfo,
    target: &Target<'_>,
    chunk_bytes: u32,
    mut padding: Padding,
    pace: Option<&crate::Pace>,
) -> Result<(ObjectInfo, Vec<String>), Error> {
    let meta = &source.meta;
    // A multipart ETag (MD5 of the parts' MD5s, "-N") is kept as it is: a multipart source has
    // each part checked below; a version re-laid from one (whose parts are gone) has only its
    // block checksums, which every read checks.
    let plain_md5 = !meta.etag.contains('-');
    let fields = MetaFields {
        content_type: meta.content_type.clone(),
        user_meta: meta.user_meta.clone(),
        headers: meta.headers.clone(),
        headers_at_end: None,
        modified_ms: meta.modified_ms,
        etag: plain_md5.then(|| meta.etag.clone()),
        recorded_etag: (!plain_md5).then(|| meta.etag.clone()),
    };
    let (mut writer, reader) = tokio::io::duplex(COPY_STEP_BYTES);
    let produce = async {
        let mut buf = vec![0u8; COPY_STEP_BYTES.min(usize::try_from(meta.size).unwrap_or(usize::MAX)).max(1)];
        let mut offset = 0u64;
        let mut parts = PartCheck::new(&meta.parts);
        while offset < meta.size {
            let want = buf.len().min(usize::try_from(meta.size - offset).unwrap_or(usize::MAX));
            let read = client.read_at(source, offset, &mut buf[..want]).await?;
            if read == 0 {
                break;
            }
            // Checked before the bytes go on: the upload cannot complete without them.
            parts.update(&buf[..read])?;
            tokio::io::AsyncWriteExt::write_all(&mut writer, &buf[..read]).await.map_err(Error::Source)?;
            offset += read as u64;
            if let Some(pace) = pace {
                pace.after(read as u64).await;
            }
        }
        drop(writer);
        Ok::<_, Error>(())
    };
    // The reader is the upload's: it goes when the upload ends, so a failed upload ends the
    // producer's writes too instead of leaving them blocked on a full pipe.
    let erasure = client.erasure_at(&target.placement);
    let consume = async move {
        let mut reader = reader;
        let codec = client.codec(erasure.k, erasure.m)?;
        let mut current = StripeBuffer::take(client, erasure.n(), chunk_bytes as usize);
        // A copy keeps the source's checksum blocks (a feature table's small ones above all).
        current.block_bytes = (meta.block_bytes as usize).min(chunk_bytes as usize);
        let mut md5 = Md5::new();
        if let Err(e) = fill_stripe(&codec, &mut reader, &mut current, &mut md5, &mut padding).await {
            current.give_back(client);
            return Err(e);
        }
        upload(client, target, current, &mut reader, md5, padding, &fields, CommitCondition::None).await
    };
    let (produced, uploaded) = tokio::join!(produce, consume);
    // A failed read ends the pipe early: the upload then has fewer bytes, its MD5 differs and
    // it fails; the read's error says more. An upload that failed first breaks the pipe.
    match (produced, uploaded) {
        (_, Ok(done)) => Ok(done),
        (Err(e), Err(_)) if !matches!(e, Error::Source(_)) => Err(e),
        (_, Err(e)) => Err(e),
    }
}

/// The MD5 of each part of a multipart object, checked against its record as the bytes pass.
struct PartCheck<'a> {
    parts: &'a [proto::PartPiece],
    /// The part being hashed, and its bytes hashed so far.
    idx: usize,
    done: u64,
    md5: Md5,
}

impl<'a> PartCheck<'a> {
    fn new(parts: &'a [proto::PartPiece]) -> Self {
        Self { parts, idx: 0, done: 0, md5: Md5::new() }
    }

    /// Hashes the object's next bytes; fails at the end of a part whose MD5 differs.
    fn update(&mut self, mut bytes: &[u8]) -> Result<(), Error> {
        while !bytes.is_empty() {
            let Some(part) = self.parts.get(self.idx) else {
                return Ok(());
            };
            let take = (part.size - self.done).min(bytes.len() as u64) as usize;
            self.md5.update(&bytes[..take]);
            self.done += take as u64;
            bytes = &bytes[take..];
            if self.done == part.size {
                let md5 = hex::encode(std::mem::take(&mut self.md5).finalize());
                if md5 != part.etag {
                    return Err(Error::Node {
                        node: "(re-layout source)".into(),
                        kind: proto::ErrorKind::ChecksumMismatch,
                        message: format!(
                            "part {} reads back with MD5 {md5}, its record says {}",
                            part.number, part.etag
                        ),
                    });
                }
                (self.idx, self.done) = (self.idx + 1, 0);
            }
        }
        Ok(())
    }
}

/// A re-layout lock older than this (its holder died) may be taken over.
const RELAYOUT_LOCK_STALE_MS: u64 = 6 * 3600 * 1000;

/// Writes `source` (the key's current version) again in the aligned layout `align` (with
/// `None`, a multipart source as one plain piece, which its nodes can then query), as the
/// version just after it: `(unix_ns, writer + 1)`, which sorts after the source and before
/// any version a writer orders after it (those are at least 1 ns newer), with the same bytes,
/// MD5, metadata and modification time. A concurrent PUT or delete therefore always wins, and
/// a reader that picks either version reads the same bytes; the source stays readable until
/// the drives retire it. Every re-layout of one version would write that same version id, so
/// one at a time holds a lock ([`relayout_lock`]). `None` when there is nothing to do: a delete
/// marker or empty object, an object already aligned, one no layout aligns within the padding
/// budget, an object already in one piece (with `None`), one larger than a piece can hold, one
/// in a pool that takes no writes, or one another re-layout holds.
pub(crate) async fn relayout(
    client: &Client,
    source: &ObjectInfo,
    align: Option<&crate::Alignment>,
    pace: Option<&crate::Pace>,
) -> Result<Option<(ObjectInfo, Vec<String>)>, Error> {
    let meta = &source.meta;
    if meta.deleted || meta.size == 0 || !meta.pads.is_empty() {
        return Ok(None);
    }
    match align {
        Some(align) if align.size != meta.size => return Ok(None),
        None if meta.has_data_file() => return Ok(None),
        _ => {}
    }
    let Some(writer) = meta.version.writer.checked_add(1) else {
        return Ok(None);
    };
    let version = VersionId { unix_ns: meta.version.unix_ns, writer };
    let map = Arc::clone(&client.topo.map);
    let Some(pool) = map.pool_of_set(source.placement.set_idx).filter(|p| map.pools[*p].is_active()) else {
        return Ok(None);
    };
    let placement = map.placement_in(pool, &meta.bucket, &meta.key);
    let erasure = client.erasure_at(&placement);
    let (chunk_bytes, padding) = Padding::plan(align, erasure.k, map.chunk_bytes);
    if align.is_some() && padding.pads.is_empty() {
        return Ok(None);
    }
    // A multipart object may be larger than one piece can hold: find out now, not after
    // streaming the first 100 GiB of it.
    let stored = meta.size + padding.pads.iter().map(|p| u64::from(p.len)).sum::<u64>();
    let stripes = stored.div_ceil((erasure.k * chunk_bytes) as u64);
    // The rewrite keeps the source's checksum blocks (`rewrite`).
    let block = meta.block_bytes.clamp(1, chunk_bytes as u32);
    let blocks = (chunk_bytes as u64).div_ceil(u64::from(block));
    if stripes.saturating_mul((erasure.k + erasure.m) as u64).saturating_mul(blocks) > CHECKSUMS_PER_OBJECT_MAX as u64 {
        tracing::info!(bucket = %meta.bucket, key = %meta.key, size = meta.size, "too large for one piece; left as it is");
        return Ok(None);
    }
    // The lock goes stale after RELAYOUT_LOCK_STALE_MS (and another re-layout would then take
    // it): a rewrite that the pace would stretch past half of that runs unpaced instead.
    let pace = pace.filter(|p| {
        let fits = p.duration_of(stored).as_millis() < u128::from(RELAYOUT_LOCK_STALE_MS / 2);
        if !fits {
            tracing::warn!(bucket = %meta.bucket, key = %meta.key, size = meta.size,
                "the re-layout rate would hold this object's lock too long; rewriting it unpaced");
        }
        fits
    });
    let lock = relayout_lock(meta);
    if !take_relayout_lock(client, &lock).await? {
        tracing::info!(bucket = %meta.bucket, key = %meta.key, "another re-layout of this version is running");
        return Ok(None);
    }
    // Under the lock: a re-layout that finished before it was taken made its version current.
    let result = match client.head_inner(&meta.bucket, &meta.key).await {
        Ok(now) if now.meta.version == meta.version => {
            let target = Target { bucket: &meta.bucket, key: &meta.key, version, placement, restamp: Restamp::Never };
            rewrite(client, source, &target, chunk_bytes as u32, padding, pace).await.map(Some)
        }
        Ok(_) | Err(Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    };
    if let Err(e) = delete(client, crate::MULTIPART_BUCKET, &lock).await {
        tracing::warn!(lock, error = %e, "could not release a re-layout lock; it goes stale in 6 hours");
    }
    result
}

/// The internal key that a re-layout of `meta`'s version holds while it runs: two re-layouts
/// of one version would write the same version id (one's abort or rollback would remove the
/// other's files), so the second one, finding the lock live, does nothing.
fn relayout_lock(meta: &ObjectMeta) -> String {
    let key = hex::encode(Md5::digest(meta.key.as_bytes()));
    format!("r/{}/{key}/{}", meta.bucket, meta.version.to_hex())
}

/// Creates `lock` if no live object holds it (an `IfAbsent` commit: of concurrent takers one
/// wins), taking over one older than `RELAYOUT_LOCK_STALE_MS`. Whether this caller holds it.
async fn take_relayout_lock(client: &Client, lock: &str) -> Result<bool, Error> {
    let bucket = crate::MULTIPART_BUCKET;
    client.bucket_call(&Request::BucketCreate { bucket: bucket.into() }, bucket).await?;
    for attempt in 0..2 {
        let options = PutOptions { condition: CommitCondition::IfAbsent, ..Default::default() };
        let mut body: &[u8] = b"re-layout";
        match put(client, bucket, lock, &mut body, &options).await {
            Ok(_) => return Ok(true),
            Err(Error::PreconditionFailed { .. }) if attempt == 0 => {
                let held = match client.head_inner(bucket, lock).await {
                    Ok(info) => info,
                    Err(Error::NotFound { .. }) => continue,
                    Err(e) => return Err(e),
                };
                if unix_ms().saturating_sub(held.meta.modified_ms) < RELAYOUT_LOCK_STALE_MS {
                    return Ok(false);
                }
                delete(client, bucket, lock).await?;
            }
            Err(Error::PreconditionFailed { .. }) => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}

/// Commits a delete marker: a newer version with no data.
pub(crate) async fn delete(client: &Client, bucket: &str, key: &str) -> Result<Vec<String>, Error> {
    client.head_inner(bucket, key).await?;
    let (_, replaced) = commit_without_data(client, bucket, key, CommitCondition::None, None, |marker| {
        marker.deleted = true;
        Ok(())
    })
    .await?;
    Ok(replaced)
}

/// Commits a version that has no data file of its own (a delete marker, or a multipart object
/// whose bytes are its parts' pieces) on the key's set, in a pool of erasure config `only` when
/// given (a multipart record goes to a pool of its pieces' k+m, whose sets can hold the k drives
/// a reader wants of it). `fill` completes the record.
pub(crate) async fn commit_without_data(
    client: &Client,
    bucket: &str,
    key: &str,
    condition: CommitCondition,
    only: Option<cluster::ErasureConfig>,
    fill: impl FnOnce(&mut ObjectMeta) -> Result<(), Error>,
) -> Result<(ObjectInfo, Vec<String>), Error> {
    let (version, placement) = client.write_target(bucket, key, only).await?;
    let mut fanout = Fanout::open(client, bucket, key, version, &placement).await?;
    let mut meta = empty_meta(client, bucket, key, version, placement);
    if let Err(e) = fill(&mut meta) {
        fanout.abort_all().await;
        return Err(e);
    }
    assert!(!meta.has_data_file(), "commit_without_data commits no data");
    let committed = fanout.commit(&mut meta, condition, Restamp::Allowed).await?;
    let drives = fanout.drives.iter().map(|d| (client.node_id(d.node_idx).to_owned(), d.drive_idx)).collect();
    Ok((ObjectInfo { meta, placement, drives, meta_positions: committed.positions }, committed.replaced_parts))
}

/// The record of a version without data at `placement` (an empty object until filled in).
pub(crate) fn empty_meta(
    client: &Client,
    bucket: &str,
    key: &str,
    version: VersionId,
    placement: cluster::Placement,
) -> ObjectMeta {
    let map = &client.topo.map;
    let erasure = client.erasure_at(&placement);
    ObjectMeta {
        format: META_FORMAT_VERSION,
        bucket: bucket.to_owned(),
        key: key.to_owned(),
        version,
        deleted: false,
        size: 0,
        etag: String::new(),
        content_type: String::new(),
        user_meta: Vec::new(),
        headers: Vec::new(),
        modified_ms: unix_ms(),
        k: erasure.k as u8,
        m: erasure.m as u8,
        chunk_bytes: map.chunk_bytes,
        block_bytes: block_bytes(map.chunk_bytes),
        set_idx: placement.set_idx as u32,
        rotation: placement.rotation as u8,
        crcs: Vec::new(),
        parts: Vec::new(),
        pads: Vec::new(),
    }
}

/// Where an upload's stored stream gets the zeros of its aligned layout: the pads still to
/// write, in order, and how many object bytes the source gave so far. No pads: the plain layout.
struct Padding {
    pads: Vec<Pad>,
    /// The pad being written (or next).
    next: usize,
    /// Zeros of `pads[next]` written so far.
    written: u64,
    /// Object bytes read from the source.
    read: u64,
    /// The object's size the layout was planned for.
    planned: Option<u64>,
}

impl Padding {
    fn plain() -> Self {
        Self { pads: Vec::new(), next: 0, written: 0, read: 0, planned: None }
    }

    fn new(size: u64, pads: Vec<Pad>) -> Self {
        Self { pads, next: 0, written: 0, read: 0, planned: Some(size) }
    }

    /// The chunk size and padding of an upload of `align`'s object into stripes of `k` data
    /// chunks: an aligned layout when one fits the budget, else the plain one.
    fn plan(align: Option<&crate::Alignment>, k: usize, chunk_bytes: u32) -> (usize, Self) {
        let layout = align.and_then(|a| proto::aligned_layout(a.size, k, chunk_bytes, &a.ranges).map(|l| (a.size, l)));
        match layout {
            Some((size, layout)) => (layout.chunk_bytes as usize, Self::new(size, layout.pads)),
            None => (chunk_bytes as usize, Self::plain()),
        }
    }

    /// Zeros due before the next object byte.
    fn zeros_due(&self) -> u64 {
        match self.pads.get(self.next) {
            Some(pad) if pad.at == self.read => u64::from(pad.len) - self.written,
            _ => 0,
        }
    }

    fn wrote_zeros(&mut self, zeros: u64) {
        self.written += zeros;
        if self.written == u64::from(self.pads[self.next].len) {
            self.next += 1;
            self.written = 0;
        }
    }

    /// Object bytes the source may give before the next pad (`None`: no pad is left).
    fn bytes_before_pad(&self) -> Option<u64> {
        self.pads.get(self.next).map(|pad| pad.at - self.read)
    }

    /// Fails an aligned upload whose source did not have the size its layout was planned for.
    fn finish(&self) -> Result<(), Error> {
        match self.planned {
            Some(planned) if planned != self.read || self.next != self.pads.len() => {
                Err(Error::Source(std::io::Error::other(format!(
                    "the source gave {} bytes, its aligned layout was planned for {planned}: it changed during the upload",
                    self.read
                ))))
            }
            _ => Ok(()),
        }
    }
}

impl StripeBuffer {
    /// A stripe buffer from the client's pool (or a new one): reusing them spares each PUT the
    /// page faults of fresh multi-MiB allocations.
    /// Stripes of `n` chunks of the map's chunk size come from the client's pool; an aligned
    /// layout's other sizes are allocated and freed.
    fn take(client: &Client, n: usize, chunk_bytes: usize) -> Self {
        let bytes = n * chunk_bytes;
        let pooled = if chunk_bytes == client.topo.map.chunk_bytes as usize {
            client.inner.stripe_buffers.lock().expect("stripe pool lock poisoned").pop()
        } else {
            None
        };
        let bytes = pooled.filter(|b| b.len() == bytes).unwrap_or_else(|| vec![0u8; bytes]);
        Self {
            bytes,
            chunk_bytes,
            k: 0,
            n: 0,
            data_len: 0,
            chunk_len: 0,
            crcs: Vec::new(),
            blocks_per_chunk: 0,
            block_bytes: block_bytes(chunk_bytes as u32) as usize,
        }
    }

    /// [`StripeBuffer::take`] of `n` chunks with the chunk and checksum block sizes of `like`
    /// (the next stripe of its object).
    fn take_like(client: &Client, n: usize, like: &StripeBuffer) -> Self {
        let mut stripe = Self::take(client, n, like.chunk_bytes);
        stripe.block_bytes = like.block_bytes;
        stripe
    }

    fn give_back(self, client: &Client) {
        if self.chunk_bytes != client.topo.map.chunk_bytes as usize {
            return;
        }
        let mut pool = client.inner.stripe_buffers.lock().expect("stripe pool lock poisoned");
        if pool.len() < crate::STRIPE_BUFFERS_POOLED_MAX {
            pool.push(self.bytes);
        }
    }

    fn chunk(&self, chunk_idx: usize) -> &[u8] {
        &self.bytes[chunk_idx * self.chunk_len..(chunk_idx + 1) * self.chunk_len]
    }

    /// The block checksums of chunk `chunk_idx` (every chunk of a stripe has as many blocks).
    fn chunk_crcs(&self, chunk_idx: usize) -> &[u32] {
        &self.crcs[chunk_idx * self.blocks_per_chunk..(chunk_idx + 1) * self.blocks_per_chunk]
    }
}

/// Reads up to one stripe of the stored stream (object bytes, and the zeros of an aligned
/// layout's pads where `padding` puts them), zero-pads the last data chunk, encodes parity and
/// checksums every chunk; `md5` sees the object's bytes only. `data_len == 0` means the
/// source has ended.
async fn fill_stripe(
    codec: &ec::Codec,
    source: &mut (dyn AsyncRead + Unpin + Send),
    stripe: &mut StripeBuffer,
    md5: &mut Md5,
    padding: &mut Padding,
) -> Result<(), Error> {
    let (k, n) = (codec.k(), codec.n());
    let chunk_bytes = stripe.chunk_bytes;
    assert!(stripe.bytes.len() >= n * chunk_bytes, "a stripe buffer holds n chunks");
    (stripe.k, stripe.n) = (k, n);
    let capacity = k * chunk_bytes;
    let mut filled = 0;
    if padding.pads.is_empty() {
        while filled < capacity {
            let read = source.read(&mut stripe.bytes[filled..capacity]).await.map_err(Error::Source)?;
            if read == 0 {
                break;
            }
            filled += read;
        }
        padding.read += filled as u64;
        md5.update(&stripe.bytes[..filled]);
    } else {
        while filled < capacity {
            let zeros = padding.zeros_due().min((capacity - filled) as u64) as usize;
            if zeros > 0 {
                stripe.bytes[filled..filled + zeros].fill(0);
                filled += zeros;
                padding.wrote_zeros(zeros as u64);
                continue;
            }
            let limit =
                padding.bytes_before_pad().map_or(capacity, |b| filled + b.min((capacity - filled) as u64) as usize);
            let read = source.read(&mut stripe.bytes[filled..limit]).await.map_err(Error::Source)?;
            if read == 0 {
                break;
            }
            md5.update(&stripe.bytes[filled..filled + read]);
            filled += read;
            padding.read += read as u64;
        }
    }
    stripe.data_len = filled;
    stripe.crcs.clear();
    if filled == 0 {
        return Ok(());
    }
    let chunk_len = filled.div_ceil(k);
    stripe.chunk_len = chunk_len;
    // Chunks of a short stripe are packed at chunk_len spacing; zero the data padding (parity
    // is overwritten by the encoder).
    stripe.bytes[filled..k * chunk_len].fill(0);
    let (data, parity) = stripe.bytes[..n * chunk_len].split_at_mut(k * chunk_len);
    let data: Vec<&[u8]> = data.chunks(chunk_len).collect();
    let mut parity: Vec<&mut [u8]> = parity.chunks_mut(chunk_len).collect();
    codec.encode(&data, &mut parity)?;
    let block = stripe.block_bytes;
    stripe.blocks_per_chunk = chunk_len.div_ceil(block);
    for chunk_idx in 0..n {
        let chunk = &stripe.bytes[chunk_idx * chunk_len..(chunk_idx + 1) * chunk_len];
        stripe.crcs.extend(chunk.chunks(block).map(crc32c::crc32c));
    }
    Ok(())
}

impl<'a> Fanout<'a> {
    async fn open(
        client: &'a Client,
        bucket: &'a str,
        key: &'a str,
        version: VersionId,
        placement: &cluster::Placement,
    ) -> Result<Self, Error> {
        let drives = client.set_drives(placement).to_vec();
        let options = &client.inner.options;
        let opens =
            drives.iter().map(|d| client.topo.pools[d.node_idx].get(options.connect_timeout, options.down_backoff));
        let results = futures_util::future::join_all(opens).await;
        let erasure = client.erasure_at(placement);
        let mut fanout =
            Self { client, bucket, key, version, erasure, drives, conns: Vec::new(), failures: Vec::new() };
        let mut skipped = Vec::new();
        for (position, result) in results.into_iter().enumerate() {
            match result {
                Ok(conn) => fanout.conns.push(Some(conn)),
                Err(e) => {
                    if matches!(e, Error::NodeDown { .. }) {
                        skipped.push(position);
                    }
                    fanout.failures.push(e);
                    fanout.conns.push(None);
                }
            }
        }
        if fanout.alive() < fanout.erasure.write_quorum() {
            // Skipping recently failed nodes would cost the quorum: try them now (they may be
            // back) rather than fail the PUT.
            for position in skipped {
                let pool = &client.topo.pools[fanout.drives[position].node_idx];
                if let Ok(conn) = pool.get_now(options.connect_timeout).await {
                    fanout.conns[position] = Some(conn);
                }
            }
        }
        fanout.check_quorum()?;
        Ok(fanout)
    }

    /// Creates the bucket on the nodes of `positions`, whose drives said it does not exist, if a
    /// majority of nodes has it (they were down when it was created), and reconnects them.
    /// Returns the positions healed; the caller retries its request there.
    async fn heal_bucket(&mut self, positions: &[usize]) -> Vec<usize> {
        if positions.is_empty() || !self.client.bucket_exists(self.bucket).await.unwrap_or(false) {
            return Vec::new();
        }
        let options = &self.client.inner.options;
        let mut healed = Vec::new();
        for &position in positions {
            let node_idx = self.drives[position].node_idx;
            let request = Request::BucketCreate { bucket: self.bucket.to_owned() };
            if !matches!(self.client.call_now(node_idx, &request).await, Ok(Response::Ok)) {
                continue;
            }
            tracing::info!(node = %self.client.node_id(node_idx), bucket = self.bucket, "created a bucket the node missed");
            if let Ok(conn) = self.client.topo.pools[node_idx].get_now(options.connect_timeout).await {
                self.conns[position] = Some(conn);
                healed.push(position);
            }
        }
        healed
    }

    /// Splits results into the positions whose drive lacks the bucket and everything else;
    /// other failures are recorded.
    fn missing_bucket_positions<T>(&mut self, results: Vec<Result<T, Error>>) -> Vec<usize> {
        let mut missing = Vec::new();
        for (position, result) in results.into_iter().enumerate() {
            match result {
                Err(Error::Node { kind: proto::ErrorKind::NoSuchBucket, .. }) => missing.push(position),
                Err(e) => self.failures.push(e),
                Ok(_) => {}
            }
        }
        missing
    }

    fn alive(&self) -> usize {
        self.conns.iter().filter(|c| c.is_some()).count()
    }

    fn check_quorum(&self) -> Result<(), Error> {
        let erasure = self.erasure;
        if self.alive() >= erasure.write_quorum() {
            return Ok(());
        }
        Err(self.quorum_error(self.alive()))
    }

    /// [`Error::WriteQuorum`]: fewer than W drives accepted the write. With `unknown` 0 it was
    /// rolled back; otherwise its outcome is unknown: `unknown` drives did not answer (the
    /// commit, or its rollback), enough that W may hold it (not rolled back) or that a read may
    /// take it (rollbacks unconfirmed). An unknown outcome is never given as a refusal (412, no
    /// bucket, disk full), which says that nothing changed.
    fn write_quorum_error(&self, acked: usize, unknown: usize) -> Error {
        Error::WriteQuorum {
            bucket: self.bucket.to_owned(),
            key: self.key.to_owned(),
            acked,
            total: self.erasure.n(),
            needed: self.erasure.write_quorum(),
            reasons: self.failures.iter().map(Error::to_string).collect::<Vec<_>>().join("; "),
            unanswered: unknown,
        }
    }

    fn quorum_error(&self, acked: usize) -> Error {
        let erasure = self.erasure;
        let tolerated = erasure.n() - erasure.write_quorum();
        let precondition = |e: &&Error| matches!(e, Error::Node { kind: proto::ErrorKind::PreconditionFailed, .. });
        if self.failures.iter().any(|e| precondition(&e)) {
            return Error::PreconditionFailed { bucket: self.bucket.to_owned(), key: self.key.to_owned() };
        }
        let no_bucket = |e: &&Error| matches!(e, Error::Node { kind: proto::ErrorKind::NoSuchBucket, .. });
        if self.failures.iter().filter(no_bucket).count() > tolerated {
            return Error::NoSuchBucket { bucket: self.bucket.to_owned() };
        }
        let full: Vec<&Error> = self.failures.iter().filter(|e| matches!(e, Error::DiskFull { .. })).collect();
        if full.len() > tolerated
            && let Error::DiskFull { node } = full[0]
        {
            return Error::DiskFull { node: node.clone() };
        }
        self.write_quorum_error(acked, 0)
    }

    /// Sends every chunk of one stripe to its drive, all drives in parallel. A drive that fails
    /// is dropped for the rest of the PUT; the PUT fails once fewer than W drives remain.
    async fn send_stripe(
        &mut self,
        stripe: &StripeBuffer,
        stripe_idx: u64,
        offset: u64,
        placement: &cluster::Placement,
    ) -> Result<(), Error> {
        let timeout = self.client.inner.options.request_timeout;
        let (bucket, version) = (self.bucket, self.version);
        let target = ChunkTarget { bucket, version, offset, block_bytes: stripe.block_bytes as u32 };
        let target = &target;
        let sends = self.conns.iter_mut().zip(&self.drives).enumerate().map(|(position, (conn, drive))| {
            let chunk_idx = placement.chunk_at(stripe_idx, position);
            send_chunk(conn, drive, target, stripe.chunk(chunk_idx), stripe.chunk_crcs(chunk_idx), timeout)
        });
        let results = futures_util::future::join_all(sends).await;
        let missing = self.missing_bucket_positions(results);
        let healed = self.heal_bucket(&missing).await;
        for &position in &missing {
            let chunk_idx = placement.chunk_at(stripe_idx, position);
            let (chunk, crcs) = (stripe.chunk(chunk_idx), stripe.chunk_crcs(chunk_idx));
            let drive = self.drives[position];
            let result = if healed.contains(&position) {
                send_chunk(&mut self.conns[position], &drive, target, chunk, crcs, timeout).await
            } else {
                Err(Error::Node {
                    node: self.client.node_id(drive.node_idx).to_owned(),
                    kind: proto::ErrorKind::NoSuchBucket,
                    message: format!("no such bucket {bucket:?}"),
                })
            };
            if let Err(e) = result {
                self.failures.push(e);
            }
        }
        self.check_quorum()
    }

    /// Commits `meta` on every live drive; acknowledged once W drives hold it durably. Below W,
    /// rolls back the drives that applied it, so a failed PUT leaves no visible version.
    ///
    /// Re-stamps (issue 37, item 9): when W drives applied it but some held a newer version
    /// (`Superseded`: a write that overlapped this one committed first), and `restamp`
    /// allows, the object is committed again as a version past the newest they reported, on
    /// the drives that applied it (`Request::RestampCommit`: a link to the same data file),
    /// so that it orders after every write acknowledged before its commit landed: the write
    /// acknowledged last wins, as S3 promises. `meta.version` is then the new version. A
    /// re-stamp round that fails is decided as a failed commit of its own version (rolled
    /// back, or of unknown outcome) and the write is acknowledged as the version W drives hold
    /// already, ordered by when it began, as before (model: `Fixes::restamp_superseded`).
    async fn commit(
        &mut self,
        meta: &mut ObjectMeta,
        condition: CommitCondition,
        restamp: Restamp,
    ) -> Result<Committed, Error> {
        debug_assert_eq!(meta.version, self.version, "the fanout staged this version");
        let mut round = self.commit_round(meta, condition, None).await?;
        let mut replaced = std::mem::take(&mut round.replaced);
        let mut restamps = 0;
        while let Some(newer) = round.newer.filter(|_| restamp == Restamp::Allowed) {
            if restamps == RESTAMPS_MAX {
                tracing::warn!(
                    bucket = %self.bucket, key = %self.key, version = %meta.version.to_hex(), newer = %newer.to_hex(),
                    "acknowledged after {RESTAMPS_MAX} re-stamps with a newer version still current on some drives: writers keep superseding each other"
                );
                break;
            }
            restamps += 1;
            let (previous, held) = (meta.version, round.applied.clone());
            meta.version = self.client.next_version(Some(newer));
            self.version = meta.version;
            tracing::debug!(
                bucket = %self.bucket, key = %self.key, from = %previous.to_hex(), to = %meta.version.to_hex(),
                "a newer version was current on some drives: re-stamping"
            );
            match self.commit_round(meta, CommitCondition::None, Some(previous)).await {
                Ok(mut next) => {
                    replaced.append(&mut next.replaced);
                    round = next;
                }
                Err(e) => {
                    tracing::warn!(
                        bucket = %self.bucket, key = %self.key, version = %previous.to_hex(), error = %e,
                        "re-stamp failed: acknowledged as the version W drives hold, ordered by when the write began"
                    );
                    (meta.version, self.version) = (previous, previous);
                    round = Round { applied: held, newer: None, replaced: Default::default() };
                    break;
                }
            }
        }
        self.release();
        self.finalize(&round.applied).await;
        // A retried Complete replaces an earlier commit of the same pieces: those are the new
        // version's own, never garbage.
        replaced.retain(|key| !meta.parts.iter().any(|part| part.piece_key == *key));
        Ok(Committed { positions: round.applied, replaced_parts: replaced.into_iter().collect() })
    }

    /// One commit round of `meta.version` ([`Fanout::commit`]): to every live drive, as a
    /// re-stamp of `of` when given. Ok once W drives applied it (their positions, the newest
    /// version any of them reported current instead, the multipart pieces it replaced); below
    /// W, decided as a failed write: rolled back, or of unknown outcome.
    async fn commit_round(
        &mut self,
        meta: &ObjectMeta,
        condition: CommitCondition,
        of: Option<VersionId>,
    ) -> Result<Round, Error> {
        let missing: Vec<u32> =
            self.conns.iter().enumerate().filter(|(_, c)| c.is_none()).map(|(p, _)| p as u32).collect();
        let timeout = self.client.inner.options.request_timeout;
        let request_for = |drive: &DriveRef| match of {
            None => Request::Commit {
                drive: drive.drive_idx as u32,
                meta: meta.clone(),
                missing_positions: missing.clone(),
                condition,
            },
            Some(of) => Request::RestampCommit {
                drive: drive.drive_idx as u32,
                meta: meta.clone(),
                of,
                missing_positions: missing.clone(),
            },
        };
        // A conditional commit goes first, one drive at a time in position order, to the first
        // m + 1 live positions (the *ordered prefix*), then to the others at once. Of concurrent
        // creators, the first position both try is won by exactly one (the drive refuses the
        // second), and the loser stops there, having applied only positions the winner took for
        // down, so the winner's view decides and there is one winner (issue 37, item 8). Two
        // prefixes of m + 1 positions, each within the first 2m + 1 (a writer that sees more
        // than m drives down fails before), always share a position.
        let n = self.drives.len();
        let mut results: Vec<Option<Result<CommitOutcome, Error>>> = (0..n).map(|_| None).collect();
        let mut ordered = Vec::new();
        if condition == CommitCondition::IfAbsent {
            let prefix: Vec<usize> = (0..n).filter(|&p| self.conns[p].is_some()).take(self.erasure.m + 1).collect();
            for position in prefix {
                let request = request_for(&self.drives[position]);
                let result = send_commit(&mut self.conns[position], &request, timeout).await;
                let refused =
                    matches!(&result, Some(Err(Error::Node { kind: proto::ErrorKind::PreconditionFailed, .. })));
                results[position] = result;
                ordered.push(position);
                if refused {
                    // Another creator holds this position: undo what this one applied before it
                    // (and fence what may have applied unanswered).
                    let applied: Vec<usize> =
                        ordered.iter().copied().filter(|&p| matches!(results[p], Some(Ok(_)))).collect();
                    let unanswered: Vec<usize> = ordered
                        .iter()
                        .copied()
                        .filter(|&p| matches!(&results[p], Some(Err(e)) if outcome_unknown(e)))
                        .collect();
                    for result in results.iter_mut() {
                        if let Some(Err(e)) = result.take() {
                            self.failures.push(e);
                        }
                    }
                    let undone = self.rollback(&applied).await + self.rollback_unanswered(&unanswered).await;
                    let may_hold = applied.len() + unanswered.len() - undone;
                    if may_hold >= meta.drives_to_read(self.erasure.marker_quorum()) {
                        return Err(self.write_quorum_error(applied.len(), may_hold));
                    }
                    return Err(self.quorum_error(0));
                }
            }
        }
        let commits = self.conns.iter_mut().zip(&self.drives).enumerate().map(|(position, (conn, drive))| {
            let request = request_for(drive);
            let skip = ordered.contains(&position);
            async move { if skip { None } else { send_commit(conn, &request, timeout).await } }
        });
        let parallel: Vec<Option<Result<CommitOutcome, Error>>> = futures_util::future::join_all(commits).await;
        for (position, result) in parallel.into_iter().enumerate() {
            if !ordered.contains(&position) {
                results[position] = result;
            }
        }
        // A data-less version (empty object, marker) meets a drive that missed the bucket here.
        let no_bucket: Vec<usize> = (0..results.len())
            .filter(|&p| matches!(results[p], Some(Err(Error::Node { kind: proto::ErrorKind::NoSuchBucket, .. }))))
            .collect();
        let healed = if of.is_none() { self.heal_bucket(&no_bucket).await } else { Vec::new() };
        for position in healed {
            let request = request_for(&self.drives[position]);
            results[position] = send_commit(&mut self.conns[position], &request, timeout).await;
        }
        let mut applied = Vec::new();
        // Drives sent the commit that gave no answer: they may have applied it.
        let mut unknown = Vec::new();
        let mut replaced = std::collections::BTreeSet::new();
        let mut newer: Option<VersionId> = None;
        for (position, result) in results.into_iter().enumerate() {
            match result {
                Some(Ok(CommitOutcome::Applied { replaced_parts })) => {
                    applied.push(position);
                    replaced.extend(replaced_parts);
                }
                // A newer version was current on this drive: ours is durably held, ordered
                // before it; the caller re-stamps past the newest one.
                Some(Ok(CommitOutcome::Superseded { current })) => {
                    applied.push(position);
                    newer = newer.max(Some(current));
                }
                Some(Err(e)) => {
                    if outcome_unknown(&e) {
                        unknown.push(position);
                    }
                    self.failures.push(e);
                    self.conns[position] = None;
                }
                None => {}
            }
        }
        let quorum = self.erasure.write_quorum();
        if applied.len() < quorum && applied.len() + unknown.len() >= quorum {
            // The version may be on W drives: ask those that did not answer before deciding.
            let holding = self.holders_among(&unknown).await;
            unknown.retain(|p| !holding.contains(p));
            applied.extend(holding);
            applied.sort_unstable();
        }
        if applied.len() >= quorum {
            return Ok(Round { applied, newer, replaced });
        }
        if applied.len() + unknown.len() >= quorum {
            // Never roll back what W drives may hold: a reader may have read it, and a scrubber
            // may have finalized it (its floor would then hide the version it replaced). The
            // write's outcome is unknown: it is left to take effect, or not, as the drives
            // that did not answer decide, and their holders treat it as acknowledged once W
            // hold it (issue 37, item 2).
            return Err(self.write_quorum_error(applied.len(), unknown.len()));
        }
        let error = self.quorum_error(applied.len());
        let mut undone = self.rollback(&applied).await;
        // A drive that did not answer may have applied the commit since: roll it back there too
        // (on a fresh connection). A rollback fences the version on its drive, so a commit still
        // queued there (a stalled node) is refused when it comes (`chunkstore::Drive::rollback`).
        undone += self.rollback_unanswered(&unknown).await;
        // "Failed" is a promise that no read takes the version: with rollbacks unconfirmed on
        // as many drives as a read takes, it may stay readable, and the scrubber completes such
        // a version (`node::scrub`, readable leftovers): the outcome is unknown then.
        let may_hold = applied.len() + unknown.len() - undone;
        if may_hold >= meta.drives_to_read(self.erasure.marker_quorum()) {
            return Err(self.write_quorum_error(applied.len(), may_hold));
        }
        Err(error)
    }

    /// [`Fanout::rollback`] for `positions`, whose connections were dropped: each on a fresh
    /// one, all at once, best effort. Returns how many drives confirmed it.
    async fn rollback_unanswered(&self, positions: &[usize]) -> usize {
        let sends = positions.iter().map(|&position| {
            let drive = self.drives[position];
            let request = Request::Rollback {
                drive: drive.drive_idx as u32,
                bucket: self.bucket.to_owned(),
                key: self.key.to_owned(),
                version: self.version,
            };
            async move {
                match self.client.call_now(drive.node_idx, &request).await {
                    Ok(Response::Ok) => true,
                    Ok(other) => {
                        tracing::debug!(answer = ?other, "rollback to a drive that did not answer its commit refused");
                        false
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "rollback to a drive that did not answer its commit not delivered");
                        false
                    }
                }
            }
        });
        futures_util::future::join_all(sends).await.into_iter().filter(|confirmed| *confirmed).count()
    }

    /// The positions of `positions` whose drive shows this version now (asked once each, all
    /// at once, with the request timeout): their commit applied, its answer was lost.
    async fn holders_among(&self, positions: &[usize]) -> Vec<usize> {
        let asks = positions.iter().map(|&position| {
            let drive = self.drives[position];
            let item =
                proto::MetaKey { drive: drive.drive_idx as u32, bucket: self.bucket.into(), key: self.key.into() };
            let request = Request::MetaGet { items: vec![item], detail: proto::MetaDetail::VersionsBrief };
            async move {
                match self.client.call_now(drive.node_idx, &request).await {
                    Ok(Response::Versions { keys }) => {
                        keys.first().is_some_and(|v| !v.unavailable && v.all().any(|m| m.version == self.version))
                    }
                    _ => false,
                }
            }
        });
        let held = futures_util::future::join_all(asks).await;
        positions.iter().zip(held).filter(|(_, held)| *held).map(|(p, _)| *p).collect()
    }

    /// Tells the drives that hold the version that it is acknowledged, and which positions
    /// missed it (for their repair queue, whether they failed before or during the commit).
    /// Best effort: a lost finalize only keeps replaced versions longer.
    async fn finalize(&self, applied: &[usize]) {
        let n = self.drives.len();
        let missing: Vec<u32> = (0..n).filter(|p| !applied.contains(p)).map(|p| p as u32).collect();
        let calls: Vec<(usize, Request)> = applied
            .iter()
            .map(|&position| {
                let drive = self.drives[position];
                let request = Request::Finalize {
                    drive: drive.drive_idx as u32,
                    bucket: self.bucket.to_owned(),
                    key: self.key.to_owned(),
                    version: self.version,
                    missing_positions: missing.clone(),
                };
                (drive.node_idx, request)
            })
            .collect();
        let client = self.client.clone();
        let work = async move {
            let sends = calls.iter().map(|(node_idx, request)| client.call(*node_idx, request));
            for result in futures_util::future::join_all(sends).await {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "finalize not delivered; the drive keeps the replaced version longer");
                }
            }
        };
        // In the background, so the acknowledgement does not wait for it; a process that
        // exits soon after waits with `Client::settle`. Past the bound, inline (back-pressure).
        let inner = &self.client.inner;
        if inner.finalizing.load(Ordering::SeqCst) >= FINALIZES_IN_FLIGHT_MAX {
            work.await;
            return;
        }
        inner.finalizing.fetch_add(1, Ordering::SeqCst);
        let client = self.client.clone();
        tokio::spawn(async move {
            work.await;
            client.inner.finalizing.fetch_sub(1, Ordering::SeqCst);
            client.inner.finalized.notify_waiters();
        });
    }

    async fn rollback(&mut self, applied: &[usize]) -> usize {
        let timeout = self.client.inner.options.request_timeout;
        let mut confirmed = 0;
        for &position in applied {
            let Some(conn) = self.conns[position].as_mut() else {
                continue;
            };
            let request = Request::Rollback {
                drive: self.drives[position].drive_idx as u32,
                bucket: self.bucket.to_owned(),
                key: self.key.to_owned(),
                version: self.version,
            };
            match tokio::time::timeout(timeout, conn.call(&request)).await {
                Ok(Ok(Response::Ok)) => confirmed += 1,
                Ok(Ok(other)) => tracing::warn!(node = %conn.node, answer = ?other, "rollback of a failed PUT refused"),
                Ok(Err(e)) => tracing::warn!(node = %conn.node, error = %e, "rollback of a failed PUT not delivered"),
                Err(e) => tracing::warn!(node = %conn.node, error = %e, "rollback of a failed PUT timed out"),
            }
        }
        confirmed
    }

    /// Best effort: drops the staging files. Nodes also drop them when the connection closes.
    async fn abort_all(&mut self) {
        let timeout = self.client.inner.options.request_timeout;
        for (conn, drive) in self.conns.iter_mut().zip(&self.drives) {
            let Some(c) = conn.as_mut() else { continue };
            let request = Request::Abort { drive: drive.drive_idx as u32, version: self.version };
            // Dropping the connection below makes the node drop the staging file anyway.
            let _ = tokio::time::timeout(timeout, c.call(&request)).await;
        }
        self.conns.clear();
    }

    /// Returns healthy connections to their pools.
    fn release(&mut self) {
        let idle_max = self.client.inner.options.idle_connections_per_node_max;
        for (conn, drive) in self.conns.drain(..).zip(&self.drives) {
            if let Some(conn) = conn {
                self.client.topo.pools[drive.node_idx].put_back(conn, idle_max);
            }
        }
    }
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
