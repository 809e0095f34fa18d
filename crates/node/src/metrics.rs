//! The node's Prometheus metrics ([`crate::Server::metrics_text`]): requests served by kind,
//! chunk bytes in and out, read items by outcome, and, read at scrape time, the drives
//! (capacity, free, versions, errors, rebuilding), connections, repair queue lengths and what
//! repair did. Every value read at scrape time is cheap (a table length, an atomic).
//!
//! Labels are bounded: request kinds and item outcomes are fixed sets, drives are the node's
//! own (numbered from 1). No bucket, key or secret is ever a label or a value.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};
use proto::{ItemStatus, Request};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DriveLabel {
    drive: String,
}

/// Counters the serving threads bump; cheap clones of shared atomics.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    requests: Family<KindLabel, Counter>,
    request_errors: Family<KindLabel, Counter>,
    read_items: Family<OutcomeLabel, Counter>,
    sent_bytes: Counter,
    received_bytes: Counter,
}

/// A request's kind as a label: the variant's name in snake case, a fixed set.
fn kind(request: &Request) -> &'static str {
    match request {
        Request::GetMap => "get_map",
        Request::BucketCreate { .. } => "bucket_create",
        Request::BucketDelete { .. } => "bucket_delete",
        Request::BucketList => "bucket_list",
        Request::MetaGet { .. } => "meta_get",
        Request::ChunkWrite { .. } => "chunk_write",
        Request::Commit { .. } => "commit",
        Request::RestampCommit { .. } => "restamp_commit",
        Request::Abort { .. } => "abort",
        Request::Rollback { .. } => "rollback",
        Request::Finalize { .. } => "finalize",
        Request::RepairHint { .. } => "repair_hint",
        Request::RepairCommit { .. } => "repair_commit",
        Request::RepairControl { .. } => "repair_control",
        Request::RepairStatus => "repair_status",
        Request::Read { .. } => "read",
        Request::List { .. } => "list",
        Request::DriveReplace { .. } => "drive_replace",
        Request::Background => "background",
        Request::MapPut { .. } => "map_put",
        Request::Space => "space",
        Request::Evict { .. } => "evict",
        Request::Query { .. } => "query",
        Request::AggregateQuery { .. } => "aggregate_query",
        Request::RecordQuery { .. } => "record_query",
        Request::NodeInfo => "node_info",
    }
}

impl Counters {
    /// One request received (before it is served).
    pub(crate) fn request(&self, request: &Request) {
        self.requests.get_or_create(&KindLabel { kind: kind(request) }).inc();
    }

    /// A request answered with an error.
    pub(crate) fn request_error(&self, request_kind: &'static str) {
        self.request_errors.get_or_create(&KindLabel { kind: request_kind }).inc();
    }

    /// The kind label of `request`, for [`Counters::request_error`] after it was consumed.
    pub(crate) fn kind_of(request: &Request) -> &'static str {
        kind(request)
    }

    /// Items of one batched read, by how each was answered.
    pub(crate) fn read_items(&self, statuses: &[ItemStatus]) {
        for status in statuses {
            let outcome = match status {
                ItemStatus::Ok => "ok",
                ItemStatus::Missing => "missing",
                ItemStatus::Corrupt => "corrupt",
                ItemStatus::Unreadable => "unreadable",
            };
            self.read_items.get_or_create(&OutcomeLabel { outcome }).inc();
        }
    }

    pub(crate) fn sent(&self, bytes: u64) {
        self.sent_bytes.inc_by(bytes);
    }

    pub(crate) fn received(&self, bytes: u64) {
        self.received_bytes.inc_by(bytes);
    }
}

/// The node's metrics in the Prometheus text format (OpenMetrics), as of now.
pub(crate) fn render(state: &crate::State) -> String {
    let mut registry = Registry::with_prefix("tessera_node");
    let counters = &state.counters;
    registry.register("requests", "Requests received, by kind", counters.requests.clone());
    registry.register("request_errors", "Requests answered with an error, by kind", counters.request_errors.clone());
    registry.register("read_items", "Chunk ranges asked by batched reads, by answer", counters.read_items.clone());
    registry.register_with_unit("sent", "Chunk bytes sent to readers", Unit::Bytes, counters.sent_bytes.clone());
    registry.register_with_unit(
        "received",
        "Chunk bytes received from writers",
        Unit::Bytes,
        counters.received_bytes.clone(),
    );
    let connections = Gauge::<i64>::default();
    connections.set(i64::try_from(state.connections.load(std::sync::atomic::Ordering::Relaxed)).unwrap_or(i64::MAX));
    registry.register("connections", "Authenticated connections being served", connections);
    let uptime = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
    uptime.set(state.started.elapsed().as_secs_f64());
    registry.register_with_unit("uptime", "Time since the node started", Unit::Seconds, uptime);

    let capacity = Family::<DriveLabel, Gauge>::default();
    let free = Family::<DriveLabel, Gauge>::default();
    let versions = Family::<DriveLabel, Gauge>::default();
    let errors = Family::<DriveLabel, Counter>::default();
    let rebuilding = Family::<DriveLabel, Gauge>::default();
    let up = Family::<DriveLabel, Gauge>::default();
    let repair_queued = Family::<DriveLabel, Gauge>::default();
    let repaired_bytes = Family::<DriveLabel, Counter>::default();
    let repaired_versions = Family::<DriveLabel, Counter>::default();
    let repair_failures = Family::<DriveLabel, Counter>::default();
    // Only what is cheap to read: a scrape must not walk a repair queue of millions of entries
    // (`tessera repair status` does, when asked, for queued bytes and at-risk versions).
    let info = state.info();
    let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let load = |counter: &std::sync::atomic::AtomicU64| counter.load(std::sync::atomic::Ordering::Relaxed);
    for (idx, drive) in info.drives.iter().enumerate() {
        let label = DriveLabel { drive: (idx + 1).to_string() };
        capacity.get_or_create(&label).set(as_i64(drive.total_bytes));
        free.get_or_create(&label).set(as_i64(drive.free_bytes));
        if let Some(count) = drive.versions {
            versions.get_or_create(&label).set(as_i64(count));
        }
        // A fresh family per scrape: counting up from zero gives the drive's own total.
        errors.get_or_create(&label).inc_by(drive.errors);
        rebuilding.get_or_create(&label).set(i64::from(drive.rebuilding));
        up.get_or_create(&label).set(i64::from(drive.problem.is_none()));
        if let Ok(queued) = state.drives[idx].repair_queue_len() {
            repair_queued.get_or_create(&label).set(as_i64(queued));
        }
        let stats = &state.repair_stats[idx];
        repaired_bytes.get_or_create(&label).inc_by(load(&stats.bytes_repaired));
        repaired_versions.get_or_create(&label).inc_by(load(&stats.versions_repaired));
        repair_failures.get_or_create(&label).inc_by(load(&stats.failed_attempts));
    }
    registry.register_with_unit("drive_capacity", "Size of the drive's file system", Unit::Bytes, capacity);
    registry.register_with_unit("drive_free", "Bytes a writer can still use on the drive", Unit::Bytes, free);
    registry.register("drive_versions", "Object versions with data on the drive", versions);
    registry.register("drive_errors", "I/O and database errors the drive hit since the node started", errors);
    registry.register("drive_rebuilding", "1 while the drive is being rebuilt (readers skip it)", rebuilding);
    registry.register("drive_up", "1 when the drive answers, 0 when it cannot tell its space or contents", up);
    registry.register(
        "repair_queued_versions",
        "Versions on the drive that other drives of their set lack (its repair queue)",
        repair_queued,
    );
    registry.register_with_unit("repaired", "Bytes repaired since the node started", Unit::Bytes, repaired_bytes);
    registry.register("repaired_versions", "Versions repaired since the node started", repaired_versions);
    registry.register("repair_failures", "Repair attempts that failed since the node started", repair_failures);
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
    text
}
