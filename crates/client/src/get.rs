//! GET: plan which chunks a byte range needs, fetch them with one batched request per node
//! straight into the caller's buffer, verify checksums, and decode around missing chunks.

use proto::{ItemStatus, ReadItem, Request, Response};

use crate::{Client, Error, FailedNode, ObjectInfo};

/// Stripes planned and fetched together. Bounds the scratch memory of a degraded read to
/// `WINDOW_STRIPES * m` chunks, and a node batch to `WINDOW_STRIPES` items per object.
pub(crate) const WINDOW_STRIPES: u64 = 16;
/// Object bytes one window covers at most: objects with chunks larger than the cluster's
/// 1 MiB (the aligned layout's, up to 16 MiB) read fewer stripes at a time, so a degraded
/// read's scratch stays as small.
const WINDOW_DATA_BYTES_MAX: u64 = 64 << 20;

/// Stripes per window of a read of `meta`'s chunks: `WINDOW_STRIPES`, fewer for large chunks.
fn window_stripes(meta: &proto::ObjectMeta) -> u64 {
    let stripe = u64::from(meta.k) * u64::from(meta.chunk_bytes);
    (WINDOW_DATA_BYTES_MAX / stripe.max(1)).clamp(1, WINDOW_STRIPES)
}
/// Fetch rounds per window: the first asks for the data chunks (plus parity for nodes known to
/// be down), later rounds ask for replacements of chunks that turned out missing or corrupt.
const ROUNDS_MAX: usize = 3;

/// One chunk slot of a stripe being read.
#[derive(Default)]
struct Slot {
    /// Needed by the caller (a data chunk overlapping the range).
    needed: bool,
    requested: bool,
    good: bool,
    failed: bool,
    /// Why the chunk could not be used, for the error a read that cannot go on returns.
    why: Option<String>,
    /// Where in the caller's buffer the chunk's fetched range lands whole, if it does.
    direct: Option<usize>,
    scratch: Vec<u8>,
}

/// One stripe of a read. Every chunk fetched for it covers the same block-aligned byte range
/// `[range_start, range_start + range_len)` of the chunk: the union of what the caller needs
/// from its data chunks. Reed-Solomon works byte by byte, so that range decodes on its own.
struct StripeRead {
    stripe_idx: u64,
    chunk_len: usize,
    range_start: usize,
    range_len: usize,
    slots: Vec<Slot>,
}

/// Where one fetched chunk's bytes go.
enum Dest<'b> {
    Direct(&'b mut [u8]),
    Scratch(Vec<u8>),
}

struct Job<'b> {
    /// Which object window (`Plan`) of the round the chunk belongs to.
    plan_idx: usize,
    window_idx: usize,
    chunk_idx: usize,
    item: ReadItem,
    /// CRC32C of each checksum block of the fetched range, in order.
    crcs: Vec<u32>,
    block_bytes: usize,
    dest: Dest<'b>,
}

impl Dest<'_> {
    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Dest::Direct(slice) => slice,
            Dest::Scratch(vec) => vec,
        }
    }
}

pub(crate) async fn read_at(client: &Client, info: &ObjectInfo, offset: u64, buf: &mut [u8]) -> Result<usize, Error> {
    if !info.meta.pads.is_empty() {
        return read_aligned_at(client, info, offset, buf).await;
    }
    if info.meta.parts.is_empty() {
        return read_piece_at(client, info, offset, buf).await;
    }
    let size = info.meta.size;
    if offset > size || (offset == size && size > 0 && !buf.is_empty()) {
        return Err(Error::RangeNotSatisfiable { offset, size });
    }
    let len = (buf.len() as u64).min(size - offset) as usize;
    let end = offset + len as u64;
    let mut part_start = 0u64;
    for part in &info.meta.parts {
        let part_end = part_start + part.size;
        if part_end > offset && part_start < end {
            let from = offset.max(part_start);
            let to = end.min(part_end);
            let piece = crate::multipart::piece_info(client, &info.meta, part)?;
            let target = &mut buf[(from - offset) as usize..(to - offset) as usize];
            let map = &client.topo.map;
            let recorded_pool_is_read =
                map.pool_of_set(piece.placement.set_idx).is_some_and(|p| map.pools[p].is_read());
            let read = if recorded_pool_is_read {
                match read_piece_at(client, &piece, from - part_start, target).await {
                    Ok(read) => read,
                    Err(e @ Error::Unavailable { .. }) => match moved_piece(client, part).await {
                        Some(moved) => read_piece_at(client, &moved, from - part_start, target).await?,
                        None => return Err(e),
                    },
                    Err(e) => return Err(e),
                }
            } else {
                let moved = moved_piece(client, part).await.ok_or_else(|| Error::NotFound {
                    bucket: crate::MULTIPART_BUCKET.into(),
                    key: part.piece_key.clone(),
                })?;
                read_piece_at(client, &moved, from - part_start, target).await?
            };
            assert_eq!(read as u64, to - from, "a piece read inside the piece returns every byte");
        }
        part_start = part_end;
    }
    Ok(len)
}

/// Where a multipart object's piece is now, if it moved to another pool (`tessera pool
/// decommission` and `rebalance` move pieces as keys; the record keeps the set it was written
/// to): its key, found in whichever pool holds it, with the version the record names.
async fn moved_piece(client: &Client, part: &proto::PartPiece) -> Option<ObjectInfo> {
    let found = client.head_inner(crate::MULTIPART_BUCKET, &part.piece_key).await.ok()?;
    (found.meta.version == part.version).then_some(found)
}

/// Reads from an object in the aligned layout: each stretch of object bytes between two pads
/// is one read of the stored stream (the zeros between them are never read).
async fn read_aligned_at(client: &Client, info: &ObjectInfo, offset: u64, buf: &mut [u8]) -> Result<usize, Error> {
    let size = info.meta.size;
    if offset > size || (offset == size && size > 0 && !buf.is_empty()) {
        return Err(Error::RangeNotSatisfiable { offset, size });
    }
    let len = (buf.len() as u64).min(size - offset) as usize;
    let mut done = 0usize;
    for stored in info.meta.stored_ranges(offset..offset + len as u64) {
        let part = (stored.end - stored.start) as usize;
        if part > 0 {
            let read = read_piece_at(client, info, stored.start, &mut buf[done..done + part]).await?;
            assert_eq!(read, part, "a read inside the stored stream returns every byte");
        }
        done += part;
    }
    assert_eq!(done, len, "the stored ranges hold the whole range");
    Ok(len)
}

/// Reads from one erasure-coded piece: a single-piece object or one part of a multipart one,
/// at an offset of its stored stream (the object's own offset unless it has pads).
async fn read_piece_at(client: &Client, info: &ObjectInfo, offset: u64, buf: &mut [u8]) -> Result<usize, Error> {
    let size = info.meta.stored_size();
    if offset > size || (offset == size && size > 0 && !buf.is_empty()) {
        return Err(Error::RangeNotSatisfiable { offset, size });
    }
    let len = (buf.len() as u64).min(size - offset) as usize;
    if len == 0 {
        return Ok(0);
    }
    let geometry = info.meta.geometry();
    let first = offset / geometry.stripe_bytes();
    let last = (offset + len as u64 - 1) / geometry.stripe_bytes();
    let mut window_start = first;
    while window_start <= last {
        let window_end = (window_start + window_stripes(&info.meta)).min(last + 1);
        read_window(client, info, window_start..window_end, offset, &mut buf[..len]).await?;
        window_start = window_end;
    }
    Ok(len)
}

/// Reads the part of `buf` (object bytes from `offset`) that lies in `stripes`.
async fn read_window(
    client: &Client,
    info: &ObjectInfo,
    stripes: std::ops::Range<u64>,
    offset: u64,
    buf: &mut [u8],
) -> Result<(), Error> {
    let mut plans = vec![Plan::new(client, info, stripes, offset, buf.len())];
    read_plans(client, &mut plans, &mut [buf]).await;
    match plans.pop().and_then(|plan| plan.error) {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

/// One window of one object within a fetch round: the stripes it reads and where its bytes go.
/// Many plans (of many objects) share each round, so each node gets one request per round.
struct Plan<'a> {
    info: &'a ObjectInfo,
    /// Object offset of the first byte of this plan's buffer.
    offset: u64,
    reads: Vec<StripeRead>,
    error: Option<Error>,
}

impl<'a> Plan<'a> {
    fn new(client: &Client, info: &'a ObjectInfo, stripes: std::ops::Range<u64>, offset: u64, len: usize) -> Self {
        match plan_window(client, info, stripes, offset, len) {
            Ok(reads) => Self { info, offset, reads, error: None },
            Err(error) => Self { info, offset, reads: Vec::new(), error: Some(error) },
        }
    }
}

/// Runs fetch rounds for every plan together, then decodes and copies each plan's stripes;
/// failures land in the plan's `error` (one object's trouble never fails the others).
async fn read_plans(client: &Client, plans: &mut [Plan<'_>], bufs: &mut [&mut [u8]]) {
    assert_eq!(plans.len(), bufs.len());
    for round in 0..ROUNDS_MAX {
        if round > 0 {
            let mut planned = false;
            for plan in plans.iter_mut().filter(|p| p.error.is_none()) {
                match plan_replacements(client, plan.info, &mut plan.reads) {
                    Ok(more) => planned |= more,
                    Err(error) => plan.error = Some(error),
                }
            }
            if !planned {
                break;
            }
        }
        fetch_round(client, plans, bufs).await;
    }
    for (plan, buf) in plans.iter_mut().zip(bufs.iter_mut()) {
        if plan.error.is_some() {
            continue;
        }
        for read in &mut plan.reads {
            if let Err(error) = finish_stripe(client, plan.info, read, plan.offset, buf) {
                plan.error = Some(error);
                break;
            }
        }
    }
}

/// Marks the data chunks the range needs, and where each lands; for stripes with a needed chunk
/// on a node known to be down, also plans replacements right away.
fn plan_window(
    client: &Client,
    info: &ObjectInfo,
    stripes: std::ops::Range<u64>,
    offset: u64,
    len: usize,
) -> Result<Vec<StripeRead>, Error> {
    let geometry = info.meta.geometry();
    let (k, n) = (usize::from(info.meta.k), info.meta.n());
    let block = info.meta.block_bytes as usize;
    let range_end = offset + len as u64;
    let mut reads = Vec::new();
    for stripe_idx in stripes {
        let chunk_len = geometry.chunk_len(stripe_idx);
        let stripe_start = geometry.stripe_offset(stripe_idx);
        let chunk_start = |chunk_idx: usize| stripe_start + (chunk_idx * chunk_len) as u64;
        // The bytes of each data chunk the caller wants, as offsets inside the chunk.
        let wanted: Vec<Option<(usize, usize)>> = (0..k)
            .map(|chunk_idx| {
                let start = chunk_start(chunk_idx);
                let data = geometry.data_bytes_in_chunk(stripe_idx, chunk_idx) as u64;
                let (from, to) = (start.max(offset), (start + data).min(range_end));
                (from < to).then(|| ((from - start) as usize, (to - start) as usize))
            })
            .collect();
        let Some(low) = wanted.iter().flatten().map(|w| w.0).min() else { continue };
        let high = wanted.iter().flatten().map(|w| w.1).max().expect("some chunk is wanted");
        let range_start = low / block * block;
        let range_len = (high.div_ceil(block) * block).min(chunk_len) - range_start;
        let mut slots: Vec<Slot> = (0..n).map(|_| Slot::default()).collect();
        for (chunk_idx, slot) in slots.iter_mut().enumerate().take(k) {
            if wanted[chunk_idx].is_none() {
                continue;
            }
            slot.needed = true;
            slot.requested = true;
            let fetched = chunk_start(chunk_idx) + range_start as u64;
            let data = geometry.data_bytes_in_chunk(stripe_idx, chunk_idx);
            let unpadded = range_start + range_len <= data;
            if fetched >= offset && fetched + range_len as u64 <= range_end && unpadded {
                slot.direct = Some((fetched - offset) as usize);
            } else {
                // Partly wanted or padded: lands in scratch, the wanted part is copied out.
                slot.scratch = vec![0u8; range_len];
            }
            if let Some(why) = skip_reason(client, info, stripe_idx, chunk_idx) {
                // Not asked now; `plan_replacements` asks it last, if the stripe's other chunks
                // are too few (a drive whose commit landed after the metadata read has it).
                slot.requested = false;
                slot.failed = true;
                slot.why = Some(why);
            }
        }
        reads.push(StripeRead { stripe_idx, chunk_len, range_start, range_len, slots });
    }
    plan_replacements(client, info, &mut reads)?;
    Ok(reads)
}

/// Why the chunk is planned around rather than asked for, if it is: its node failed within
/// the backoff, or its drive did not return the version's metadata (missed the write, or is
/// being rebuilt), so it would only answer "missing" and cost a second round.
fn skip_reason(client: &Client, info: &ObjectInfo, stripe_idx: u64, chunk_idx: usize) -> Option<String> {
    let position = info.placement.position(stripe_idx, chunk_idx);
    let drive = client.set_drives(&info.placement)[position];
    let pool = &client.topo.pools[drive.node_idx];
    if let Some(reason) = pool.down_reason(client.inner.options.down_backoff) {
        return Some(reason);
    }
    (!info.meta_positions.is_empty() && !info.meta_positions.contains(&position))
        .then(|| format!("node {}: drive {} did not return this version's metadata", pool.node, drive.drive_idx))
}

/// For every stripe missing a needed chunk, requests enough other chunks (data first, then
/// parity, skipping nodes known to be down) to hold k good ones. Returns whether it requested
/// anything; fails when a stripe cannot reach k chunks at all.
fn plan_replacements(client: &Client, info: &ObjectInfo, reads: &mut [StripeRead]) -> Result<bool, Error> {
    let k = usize::from(info.meta.k);
    let mut planned = false;
    for read in reads.iter_mut() {
        if !read.slots.iter().any(|s| s.needed && s.failed) {
            continue;
        }
        let usable = read.slots.iter().filter(|s| s.requested && !s.failed).count();
        let mut short = k.saturating_sub(usable);
        let untried: Vec<usize> = (0..read.slots.len()).filter(|&c| !read.slots[c].requested).collect();
        // Likely holders first; the others only when nothing else is left.
        let (likely, unlikely): (Vec<usize>, Vec<usize>) =
            untried.into_iter().partition(|&c| skip_reason(client, info, read.stripe_idx, c).is_none());
        for chunk_idx in likely.into_iter().chain(unlikely) {
            if short == 0 {
                break;
            }
            let slot = &mut read.slots[chunk_idx];
            slot.requested = true;
            slot.failed = false;
            slot.why = None;
            slot.scratch = vec![0u8; read.range_len];
            short -= 1;
            planned = true;
        }
        if short > 0 {
            return Err(unavailable(client, info, read));
        }
    }
    Ok(planned)
}

fn unavailable(client: &Client, info: &ObjectInfo, read: &StripeRead) -> Error {
    let drives = client.set_drives(&info.placement);
    // Once per node, in node order.
    let mut failed: Vec<FailedNode> = read
        .slots
        .iter()
        .enumerate()
        .filter(|(_, s)| s.failed)
        .map(|(c, s)| {
            let node = client.node_id(drives[info.placement.position(read.stripe_idx, c)].node_idx).to_owned();
            let why = s.why.clone().unwrap_or_else(|| format!("node {node}: chunk {c} not received"));
            FailedNode { node, reason: why }
        })
        .collect();
    failed.sort_by(|a, b| a.node.cmp(&b.node));
    failed.dedup_by(|a, b| a.node == b.node);
    let n = read.slots.len();
    Error::Unavailable {
        action: "read",
        unit: crate::Counted::Chunks,
        bucket: info.meta.bucket.clone(),
        key: info.meta.key.clone(),
        available: read.slots.iter().filter(|s| !s.failed).count(),
        total: n,
        needed: usize::from(info.meta.k),
        unreachable: failed,
    }
}

/// Fetches every requested, not yet fetched chunk: one batched request per node, all nodes at
/// once, each chunk read straight into its destination and checked against its CRC32C.
async fn fetch_round(client: &Client, plans: &mut [Plan<'_>], bufs: &mut [&mut [u8]]) {
    let mut jobs_by_node: Vec<Vec<Job<'_>>> = (0..client.topo.pools.len()).map(|_| Vec::new()).collect();
    for (plan_idx, (plan, buf)) in plans.iter_mut().zip(bufs.iter_mut()).enumerate() {
        if plan.error.is_some() {
            continue;
        }
        let info = plan.info;
        let drives = client.set_drives(&info.placement);
        let geometry = info.meta.geometry();
        let mut direct: Vec<(usize, usize, usize, usize)> = Vec::new(); // (buf_start, len, window_idx, chunk_idx)
        for (window_idx, read) in plan.reads.iter_mut().enumerate() {
            for (chunk_idx, slot) in read.slots.iter_mut().enumerate() {
                if !slot.requested || slot.good || slot.failed {
                    continue;
                }
                if let Some(start) = slot.direct {
                    direct.push((start, read.range_len, window_idx, chunk_idx));
                    continue;
                }
                let dest = Dest::Scratch(std::mem::take(&mut slot.scratch));
                let at = JobAt {
                    plan_idx,
                    window_idx,
                    chunk_idx,
                    stripe_idx: read.stripe_idx,
                    range_start: read.range_start,
                    range_len: read.range_len,
                };
                let (job, node_idx) = make_job(info, drives, &geometry, at, dest);
                jobs_by_node[node_idx].push(job);
            }
        }
        // Direct destinations are disjoint ranges of this plan's buffer: carve them in order.
        direct.sort_unstable();
        let mut rest: &mut [u8] = buf;
        let mut consumed = 0;
        for (start, len, window_idx, chunk_idx) in direct {
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(start - consumed);
            let (piece, tail) = tail.split_at_mut(len);
            rest = tail;
            consumed = start + len;
            debug_assert_eq!(len, plan.reads[window_idx].range_len);
            let at = JobAt::new(plan_idx, window_idx, chunk_idx, &plan.reads[window_idx]);
            let (job, node_idx) = make_job(info, drives, &geometry, at, Dest::Direct(piece));
            jobs_by_node[node_idx].push(job);
        }
    }
    let fetches = jobs_by_node.into_iter().enumerate().map(|(node_idx, jobs)| fetch_node(client, node_idx, jobs));
    for (job, good, answered, why) in futures_util::future::join_all(fetches).await.into_iter().flatten() {
        if answered && !good {
            // A node that answered but could not serve a chunk, or served a corrupt one: tell
            // a drive that holds the version, so repair does not wait for the scrubber.
            let info = plans[job.plan_idx].info;
            let stripe_idx = plans[job.plan_idx].reads[job.window_idx].stripe_idx;
            client.hint_repair(info, info.placement.position(stripe_idx, job.chunk_idx));
        }
        let slot = &mut plans[job.plan_idx].reads[job.window_idx].slots[job.chunk_idx];
        slot.good = good;
        slot.failed = !good;
        slot.why = why;
        if let Dest::Scratch(vec) = job.dest {
            slot.scratch = vec;
        }
    }
}

/// Where a job's chunk sits in the round's plans.
#[derive(Clone, Copy)]
struct JobAt {
    plan_idx: usize,
    window_idx: usize,
    chunk_idx: usize,
    stripe_idx: u64,
    range_start: usize,
    range_len: usize,
}

impl JobAt {
    fn new(plan_idx: usize, window_idx: usize, chunk_idx: usize, read: &StripeRead) -> Self {
        let (stripe_idx, range_start, range_len) = (read.stripe_idx, read.range_start, read.range_len);
        Self { plan_idx, window_idx, chunk_idx, stripe_idx, range_start, range_len }
    }
}

fn make_job<'b>(
    info: &ObjectInfo,
    drives: &[cluster::DriveRef],
    geometry: &proto::StripeGeometry,
    at: JobAt,
    dest: Dest<'b>,
) -> (Job<'b>, usize) {
    let drive = drives[info.placement.position(at.stripe_idx, at.chunk_idx)];
    let item = ReadItem {
        drive: drive.drive_idx as u32,
        version: info.meta.version,
        offset: geometry.file_offset(at.stripe_idx) + at.range_start as u64,
        len: at.range_len as u32,
    };
    let block_bytes = info.meta.block_bytes as usize;
    assert_eq!(at.range_start % block_bytes, 0, "fetched ranges start on a checksum block");
    let blocks = at.range_len.div_ceil(block_bytes);
    let first = at.range_start / block_bytes;
    let crcs = info.meta.block_crcs(at.stripe_idx, at.chunk_idx)[first..first + blocks].to_vec();
    let job = Job {
        plan_idx: at.plan_idx,
        window_idx: at.window_idx,
        chunk_idx: at.chunk_idx,
        item,
        crcs,
        block_bytes,
        dest,
    };
    (job, drive.node_idx)
}

/// One batched read from one node. Items the node cannot serve, that fail their checksum, or
/// that were not received before an error or the timeout come back as not good, with why;
/// `answered` says the node itself reported the item missing or sent bad bytes (a repair hint).
async fn fetch_node<'b>(
    client: &Client,
    node_idx: usize,
    mut jobs: Vec<Job<'b>>,
) -> Vec<(Job<'b>, bool, bool, Option<String>)> {
    let mut good = vec![false; jobs.len()];
    let mut answered = vec![false; jobs.len()];
    let mut why: Vec<Option<String>> = vec![None; jobs.len()];
    if jobs.is_empty() {
        return Vec::new();
    }
    let pool = &client.topo.pools[node_idx];
    let options = &client.inner.options;
    let exchange = async {
        let mut conn = pool.get(options.connect_timeout, options.down_backoff).await?;
        let items = jobs.iter().map(|job| job.item.clone()).collect();
        conn.send_request(&Request::Read { items }).await?;
        let statuses = match conn.read_response().await? {
            Response::Read { statuses } if statuses.len() == jobs.len() => statuses,
            other => return Err(conn.unexpected(&other)),
        };
        let promised =
            jobs.iter().zip(&statuses).filter(|(_, s)| **s == ItemStatus::Ok).map(|(j, _)| u64::from(j.item.len));
        let mut ranges = RangeReader::new(promised.sum());
        for (idx, (job, status)) in jobs.iter_mut().zip(&statuses).enumerate() {
            answered[idx] = true;
            if *status != ItemStatus::Ok {
                tracing::debug!(node = %pool.node, ?status, "chunk not served");
                why[idx] = Some(format!("node {}: chunk {} {}", pool.node, job.chunk_idx, status_text(*status)));
                continue;
            }
            let dest = job.dest.bytes_mut();
            assert_eq!(dest.len(), job.item.len as usize, "every destination holds exactly its chunk");
            ranges.read_into(&mut conn.stream, dest).await.map_err(|e| conn.io(e))?;
            good[idx] = dest.len().div_ceil(job.block_bytes) == job.crcs.len()
                && dest.chunks(job.block_bytes).zip(&job.crcs).all(|(block, crc)| crc32c::crc32c(block) == *crc);
            if !good[idx] {
                client.count_checksum_failure();
                tracing::warn!(node = %pool.node, version = %job.item.version.to_hex(), offset = job.item.offset, chunk = job.chunk_idx, "chunk failed its checksum; reading around it");
                why[idx] = Some(format!("node {}: chunk {} failed its checksum", pool.node, job.chunk_idx));
            }
        }
        assert!(ranges.is_drained(), "the answer was read to its end, no further");
        pool.put_back(conn, options.idle_connections_per_node_max);
        Ok::<(), Error>(())
    };
    let failure = match tokio::time::timeout(options.request_timeout, exchange).await {
        Ok(Ok(())) => None,
        // Skipped for a recent failure: that failure is why.
        Ok(Err(Error::NodeDown { reason, .. })) => Some(reason),
        Ok(Err(e)) => {
            tracing::debug!(node = %pool.node, error = %e, "batched read failed");
            pool.mark_down(&e);
            Some(e.to_string())
        }
        Err(_) => {
            tracing::debug!(node = %pool.node, "batched read timed out");
            let error = Error::Timeout { node: pool.node.clone(), timeout: options.request_timeout };
            pool.mark_down(&error);
            Some(error.to_string())
        }
    };
    // Items not received before the exchange failed fail with it.
    for (good, why) in good.iter().zip(why.iter_mut()) {
        if !*good && why.is_none() {
            *why = failure.clone();
        }
    }
    jobs.into_iter()
        .zip(good)
        .zip(answered)
        .zip(why)
        .map(|(((job, good), answered), why)| (job, good, answered, why))
        .collect()
}

fn status_text(status: ItemStatus) -> &'static str {
    match status {
        ItemStatus::Ok => "served",
        ItemStatus::Missing => "missing",
        ItemStatus::Corrupt => "known corrupt",
        ItemStatus::Unreadable => "unreadable (I/O error)",
    }
}

/// Decodes the stripe if a needed chunk is missing, then copies every needed chunk that did not
/// land directly into the caller's buffer.
fn finish_stripe(
    client: &Client,
    info: &ObjectInfo,
    read: &mut StripeRead,
    offset: u64,
    buf: &mut [u8],
) -> Result<(), Error> {
    let k = usize::from(info.meta.k);
    let geometry = info.meta.geometry();
    let chunk_len = read.chunk_len;
    let stripe_start = geometry.stripe_offset(read.stripe_idx);
    let needs_decode = read.slots.iter().any(|s| s.needed && !s.good);
    if needs_decode {
        if read.slots.iter().filter(|s| s.good).count() < k {
            return Err(unavailable(client, info, read));
        }
        client.count_decode(read.slots[..k].iter().filter(|s| s.needed && !s.good).count());
        let contiguous = k == 1 || read.range_len == read.chunk_len;
        if contiguous && read.slots[..k].iter().all(|s| s.direct.is_some()) {
            decode_in_place(client, info, read, buf)?;
        } else {
            decode_via_scratch(client, info, read, buf)?;
        }
    }
    for (chunk_idx, slot) in read.slots.iter().enumerate().take(k) {
        if !slot.needed || slot.direct.is_some() {
            continue;
        }
        assert!(slot.good && slot.scratch.len() == read.range_len);
        let chunk_start = stripe_start + (chunk_idx * chunk_len) as u64;
        let fetched_start = chunk_start + read.range_start as u64;
        let data_end = chunk_start + geometry.data_bytes_in_chunk(read.stripe_idx, chunk_idx) as u64;
        let from = fetched_start.max(offset);
        let to = (fetched_start + read.range_len as u64).min(data_end).min(offset + buf.len() as u64);
        if from < to {
            let source = &slot.scratch[(from - fetched_start) as usize..(to - fetched_start) as usize];
            buf[(from - offset) as usize..(to - offset) as usize].copy_from_slice(source);
        }
    }
    Ok(())
}

/// Decodes a stripe whose k data chunks all belong whole in the caller's buffer (so they are
/// contiguous there): missing data chunks are rebuilt straight into place, no copies. Works on
/// the fetched range of each chunk (Reed-Solomon is byte-wise).
fn decode_in_place(client: &Client, info: &ObjectInfo, read: &mut StripeRead, buf: &mut [u8]) -> Result<(), Error> {
    let codec = client.codec(usize::from(info.meta.k), usize::from(info.meta.m))?;
    let k = codec.k();
    // Whole chunks (or the single data chunk of k = 1): the fetched ranges are contiguous.
    let chunk_len = read.range_len;
    let base = read.slots[0].direct.expect("every data chunk is direct");
    let present: Vec<bool> = read.slots.iter().map(|s| s.good).collect();
    for slot in &mut read.slots[k..] {
        // Absent parity chunks are neither read nor written; they only need the right length.
        slot.scratch.resize(chunk_len, 0);
    }
    let mut chunks: Vec<&mut [u8]> = buf[base..base + k * chunk_len].chunks_mut(chunk_len).collect();
    for (chunk_idx, chunk) in chunks.iter().enumerate() {
        assert_eq!(read.slots[chunk_idx].direct, Some(base + chunk_idx * chunk_len), "data chunks are contiguous");
        debug_assert_eq!(chunk.len(), chunk_len);
    }
    chunks.extend(read.slots[k..].iter_mut().map(|s| s.scratch.as_mut_slice()));
    codec.reconstruct_data(&mut chunks, &present)?;
    for slot in &mut read.slots[..k] {
        slot.good = true;
    }
    Ok(())
}

/// Decodes a stripe with partial or padded data chunks through a stripe-sized scratch buffer;
/// rebuilt chunks land in their slots' scratch and are copied out by `finish_stripe`.
fn decode_via_scratch(client: &Client, info: &ObjectInfo, read: &mut StripeRead, buf: &[u8]) -> Result<(), Error> {
    let codec = client.codec(usize::from(info.meta.k), usize::from(info.meta.m))?;
    let (k, n) = (codec.k(), codec.n());
    // Only the fetched range of each chunk takes part (Reed-Solomon is byte-wise).
    let chunk_len = read.range_len;
    let mut stripe = vec![0u8; n * chunk_len];
    let mut present = vec![false; n];
    for (chunk_idx, slot) in read.slots.iter().enumerate() {
        if slot.good {
            let target = &mut stripe[chunk_idx * chunk_len..(chunk_idx + 1) * chunk_len];
            match slot.direct {
                Some(start) => target.copy_from_slice(&buf[start..start + chunk_len]),
                None => target.copy_from_slice(&slot.scratch),
            }
            present[chunk_idx] = true;
        }
    }
    let mut chunks: Vec<&mut [u8]> = stripe.chunks_mut(chunk_len).collect();
    codec.reconstruct_data(&mut chunks, &present)?;
    for chunk_idx in 0..k {
        let slot = &mut read.slots[chunk_idx];
        if slot.needed && !slot.good {
            slot.scratch = stripe[chunk_idx * chunk_len..(chunk_idx + 1) * chunk_len].to_vec();
            slot.direct = None;
            slot.good = true;
        }
    }
    Ok(())
}

/// Bytes a batched read's answer is read in at once when its ranges are small.
const RANGE_READ_BYTES: usize = 256 << 10;

/// Reads the ranges of a batched read's answer into their destinations. A gather's thousands
/// of 4 KiB ranges were one `recv` each (a system call and a task wakeup per row): small ranges
/// are now read `RANGE_READ_BYTES` at a time into a buffer and copied out (a warm gather of
/// 30 k rows: 58 ms a batch before, 46 ms), large ones straight into their destination. Never reads past the
/// bytes the node promised (`unread`), so the connection stays aligned for its next request.
pub(crate) struct RangeReader {
    buf: Vec<u8>,
    /// `buf[start..end]` arrived and is not handed out yet.
    start: usize,
    end: usize,
    /// Bytes of the answer not read from the socket yet.
    unread: u64,
}

impl RangeReader {
    pub(crate) fn new(promised: u64) -> Self {
        Self { buf: Vec::new(), start: 0, end: 0, unread: promised }
    }

    pub(crate) async fn read_into<R: tokio::io::AsyncRead + Unpin>(
        &mut self,
        stream: &mut R,
        dest: &mut [u8],
    ) -> std::io::Result<()> {
        use tokio::io::AsyncReadExt as _;
        let mut done = (self.end - self.start).min(dest.len());
        dest[..done].copy_from_slice(&self.buf[self.start..self.start + done]);
        self.start += done;
        while done < dest.len() {
            let want = dest.len() - done;
            assert!(self.start == self.end, "buffered bytes are handed out first");
            assert!(want as u64 <= self.unread, "a destination within what the node promised");
            if want >= RANGE_READ_BYTES {
                stream.read_exact(&mut dest[done..]).await?;
                self.unread -= want as u64;
                return Ok(());
            }
            if self.buf.is_empty() {
                self.buf = vec![0; RANGE_READ_BYTES];
            }
            let room = (RANGE_READ_BYTES as u64).min(self.unread) as usize;
            let got = stream.read(&mut self.buf[..room]).await?;
            if got == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.unread -= got as u64;
            let take = got.min(want);
            dest[done..done + take].copy_from_slice(&self.buf[..take]);
            (self.start, self.end) = (take, got);
            done += take;
        }
        Ok(())
    }

    /// Whether every promised byte was read and handed out.
    pub(crate) fn is_drained(&self) -> bool {
        self.unread == 0 && self.start == self.end
    }
}

/// Most stripes one multi-object round plans: a node gets at most one item per stripe, so this
/// keeps every request within `proto::BATCH_ITEMS_MAX`.
const ROUND_STRIPES_MAX: u64 = 1024;
/// Most chunk bytes (n ranges per stripe) one multi-object round plans: bounds degraded scratch.
const ROUND_BYTES_MAX: u64 = 256 << 20;
const _: () = assert!(ROUND_STRIPES_MAX as usize <= proto::BATCH_ITEMS_MAX);

pub(crate) async fn read_many(
    client: &Client,
    mut reads: Vec<(&ObjectInfo, u64, &mut [u8])>,
) -> Vec<Result<usize, Error>> {
    let mut results: Vec<Option<Result<usize, Error>>> = (0..reads.len()).map(|_| None).collect();
    let mut lens = vec![0usize; reads.len()];
    // Per object: next stripe to read and one past its last.
    let mut cursors = vec![(0u64, 0u64); reads.len()];
    for (idx, (info, offset, buf)) in reads.iter_mut().enumerate() {
        let size = info.meta.size;
        if !info.meta.parts.is_empty() || !info.meta.pads.is_empty() {
            // Multipart objects read their pieces one by one, aligned ones their stretches.
            results[idx] = Some(read_at(client, info, *offset, buf).await);
        } else if *offset > size || (*offset == size && size > 0 && !buf.is_empty()) {
            results[idx] = Some(Err(Error::RangeNotSatisfiable { offset: *offset, size }));
        } else {
            lens[idx] = (buf.len() as u64).min(size - *offset) as usize;
            if lens[idx] == 0 {
                results[idx] = Some(Ok(0));
            } else {
                let stripe_bytes = info.meta.geometry().stripe_bytes();
                cursors[idx] = (*offset / stripe_bytes, (*offset + lens[idx] as u64 - 1) / stripe_bytes + 1);
            }
        }
    }
    loop {
        let mut plans = Vec::new();
        let mut bufs: Vec<&mut [u8]> = Vec::new();
        let mut owners = Vec::new();
        let (mut stripes, mut bytes) = (0u64, 0u64);
        for (idx, (info, offset, buf)) in reads.iter_mut().enumerate() {
            let (next, end) = cursors[idx];
            if results[idx].is_some() || next >= end {
                continue;
            }
            if stripes >= ROUND_STRIPES_MAX || bytes >= ROUND_BYTES_MAX {
                break;
            }
            let window_end = (next + window_stripes(&info.meta)).min(end).min(next + ROUND_STRIPES_MAX - stripes);
            let n = info.meta.n() as u64;
            // What a stripe of this read fetches per chunk (and decodes in scratch): the wanted
            // range widened to whole checksum blocks, a chunk at most (a 4 KiB row of a gather
            // costs a block or two, not a 1 MiB chunk).
            let block = u64::from(info.meta.block_bytes).max(1);
            let per_chunk = (lens[idx] as u64)
                .div_ceil(block)
                .saturating_add(1)
                .saturating_mul(block)
                .min(u64::from(info.meta.chunk_bytes));
            stripes += window_end - next;
            bytes += (window_end - next) * n * per_chunk;
            plans.push(Plan::new(client, info, next..window_end, *offset, lens[idx]));
            bufs.push(&mut buf[..lens[idx]]);
            owners.push(idx);
            cursors[idx].0 = window_end;
        }
        if plans.is_empty() {
            break;
        }
        read_plans(client, &mut plans, &mut bufs).await;
        for (plan, idx) in plans.into_iter().zip(owners) {
            if let Some(error) = plan.error {
                results[idx] = Some(Err(error));
            }
        }
    }
    results.into_iter().zip(lens).map(|(result, len)| result.unwrap_or(Ok(len))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client of a 6-node 4+2 map (nothing listens: planning needs no network) and one
    /// single-stripe object of it.
    fn client_and_object() -> (Client, ObjectInfo) {
        let spec = cluster::InitSpec {
            nodes: 6,
            drives_per_node: 1,
            erasure: cluster::ErasureConfig { k: 4, m: 2 },
            base_port: 9500,
            chunk_bytes: 4096,
        };
        let map = cluster::ClusterMap::generate(&spec, "test", "secret", std::path::Path::new("/nonexistent")).unwrap();
        let placement = map.placement_in(0, "b", "k");
        let client = Client::new(map, crate::ClientOptions::default()).unwrap();
        let meta = proto::ObjectMeta {
            format: proto::META_FORMAT_VERSION,
            bucket: "b".into(),
            key: "k".into(),
            version: proto::VersionId { unix_ns: 1, writer: 1 },
            deleted: false,
            size: 4 * 4096,
            etag: String::new(),
            content_type: String::new(),
            user_meta: Vec::new(),
            headers: Vec::new(),
            modified_ms: 0,
            k: 4,
            m: 2,
            chunk_bytes: 4096,
            block_bytes: 4096,
            set_idx: placement.set_idx as u32,
            rotation: placement.rotation as u8,
            crcs: Vec::new(),
            parts: Vec::new(),
            pads: Vec::new(),
        };
        let drives = (0..6).map(|i| (format!("n{}", i + 1), 0)).collect();
        (client, ObjectInfo { meta, placement, drives, meta_positions: (0..6).collect() })
    }

    #[test]
    fn a_drive_without_the_versions_metadata_is_planned_around_from_the_start() {
        let (client, mut info) = client_and_object();
        let all = plan_window(&client, &info, 0..1, 0, 4 * 4096).unwrap();
        let requested =
            |reads: &[StripeRead]| reads[0].slots.iter().map(|s| s.requested && !s.failed).collect::<Vec<_>>();
        assert_eq!(requested(&all), [true, true, true, true, false, false], "healthy: the data chunks only");
        // The drive of data chunk 2 did not return the version: parity replaces it in round one.
        let stale = info.placement.position(0, 2);
        info.meta_positions.retain(|&p| p != stale);
        let around = plan_window(&client, &info, 0..1, 0, 4 * 4096).unwrap();
        assert_eq!(requested(&around), [true, true, false, true, true, false]);
        let why = around[0].slots[2].why.as_deref().unwrap();
        assert!(why.contains("did not return this version's metadata"), "{why}");
        // Fewer than k drives returned the version (a read racing the commit of an
        // acknowledged version): the stripe still asks k chunks, the likely holders first.
        let holders: Vec<usize> = (0..3).map(|c| info.placement.position(0, c)).collect();
        info.meta_positions.retain(|p| holders.contains(p));
        assert_eq!(
            requested(&plan_window(&client, &info, 0..1, 0, 4 * 4096).unwrap()),
            [true, true, true, true, false, false]
        );
        // Unknown positions (a multipart piece) plan no way around anything.
        info.meta_positions.clear();
        assert_eq!(requested(&plan_window(&client, &info, 0..1, 0, 4 * 4096).unwrap()), requested(&all));
    }

    /// Ranges of mixed sizes (small ones through the buffer, large ones straight in, one
    /// larger than what is buffered ahead of it) arrive in pieces of any size: each lands
    /// whole in its destination, and the bytes after the answer (the next response) stay on
    /// the stream.
    #[tokio::test]
    async fn ranges_are_read_whole_and_never_past_the_answer() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let sizes = [4096, 1, 300_000, 4096, RANGE_READ_BYTES, 7, RANGE_READ_BYTES - 1, 70_000, 4096];
        let answer: Vec<u8> = (0..sizes.iter().sum::<usize>()).map(|i| (i * 31 % 251) as u8).collect();
        let next = b"the next response";
        let (mut reader, mut writer) = tokio::io::duplex(8192);
        let sent = [answer.clone(), next.to_vec()].concat();
        let writing = tokio::spawn(async move {
            let mut at = 0;
            for piece in [1usize, 5000, 9000, 3, 100_000].iter().cycle() {
                if at == sent.len() {
                    break;
                }
                let end = (at + piece).min(sent.len());
                writer.write_all(&sent[at..end]).await.unwrap();
                at = end;
            }
        });
        let mut ranges = RangeReader::new(answer.len() as u64);
        let mut at = 0;
        for size in sizes {
            let mut dest = vec![0u8; size];
            ranges.read_into(&mut reader, &mut dest).await.unwrap();
            assert!(dest == answer[at..at + size], "range of {size} bytes at {at}");
            at += size;
        }
        assert!(ranges.is_drained());
        let mut rest = Vec::new();
        writing.await.unwrap();
        reader.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, next);
        // An answer cut short is an error, not a short range.
        let mut ranges = RangeReader::new(10);
        let mut dest = [0u8; 10];
        assert!(ranges.read_into(&mut &b"12345"[..], &mut dest).await.is_err());
    }
}
