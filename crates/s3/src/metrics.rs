//! The gateway's Prometheus metrics ([`GatewayMetrics::render`]): S3 requests by operation and
//! outcome, their latency, object bytes in and out, open connections, and what its smart
//! client met (degraded reads, chunks rebuilt, checksum failures, which nodes it counts up).
//!
//! The operation is s3s's name for it (`GetObject`, ...), recorded by [`RecordOperation`]
//! when s3s has routed the request; requests refused before (bad signature, SigV2 refused)
//! count as `Unrouted`. Labels are bounded: operations are s3s's fixed set, outcomes the
//! status classes, nodes the cluster's. No bucket, key, credential or secret is a label.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use s3s::access::S3AccessContext;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    operation: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabel {
    operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabel {
    node: String,
}

/// Latency buckets: 1 ms to ~33 s, doubling.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// The gateway's metrics. Clones share them.
#[derive(Clone, Debug)]
pub struct GatewayMetrics {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Off: nothing is counted (the request path does no metrics work at all).
    enabled: bool,
    client: client::Client,
    requests: Family<RequestLabels, Counter>,
    durations: Family<OperationLabel, Histogram, fn() -> Histogram>,
    bytes: ObjectBytes,
    connections: Gauge,
    /// Every answered request and their latencies summed in microseconds, whatever the
    /// operation (the console's charts; the histograms' own sums are not readable).
    answered: Counter,
    answered_micros: Counter,
    /// Answers with a 5xx status.
    server_errors: Counter,
}

/// What the gateway has answered since it started, over every operation: what the console's
/// throughput and latency charts take differences of.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Totals {
    pub requests: u64,
    pub server_errors: u64,
    /// The answered requests' latencies, summed.
    pub request_seconds: f64,
    pub bytes_received: u64,
    pub bytes_sent: u64,
}

/// Object bytes received in upload bodies and sent in GET bodies; travels to the handlers as
/// a request extension.
#[derive(Clone, Debug, Default)]
pub(crate) struct ObjectBytes {
    pub(crate) received: Counter,
    pub(crate) sent: Counter,
}

/// A request extension the access check fills with s3s's name of the operation.
#[derive(Clone, Debug, Default)]
pub(crate) struct OperationSlot(Arc<OnceLock<String>>);

/// Records the operation's name for the request's metrics (called by the access check).
pub(crate) fn record_operation(cx: &mut S3AccessContext<'_>, name: &str) {
    if let Some(slot) = cx.extensions_mut().get::<OperationSlot>() {
        let _ = slot.0.set(name.to_owned()); // set once per request
    }
}

impl GatewayMetrics {
    pub(crate) fn new(client: client::Client, enabled: bool) -> Self {
        let inner = Inner {
            enabled,
            client,
            requests: Family::default(),
            durations: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            bytes: ObjectBytes::default(),
            connections: Gauge::default(),
            answered: Counter::default(),
            answered_micros: Counter::default(),
            server_errors: Counter::default(),
        };
        Self { inner: Arc::new(inner) }
    }

    /// What a request carries for the metrics: the slot for its operation's name, and the
    /// object byte counters.
    pub(crate) fn attach(&self, extensions: &mut hyper::http::Extensions) -> OperationSlot {
        let slot = OperationSlot::default();
        if self.inner.enabled {
            extensions.insert(slot.clone());
            extensions.insert(self.inner.bytes.clone());
        }
        slot
    }

    /// One answered request.
    pub(crate) fn observe(&self, slot: &OperationSlot, status: hyper::StatusCode, elapsed: Duration) {
        if !self.inner.enabled {
            return;
        }
        let operation = slot.0.get().cloned().unwrap_or_else(|| "Unrouted".to_owned());
        let outcome = match status.as_u16() {
            100..=199 => "1xx",
            200..=299 => "2xx",
            300..=399 => "3xx",
            400..=499 => "4xx",
            _ => "5xx",
        };
        self.inner.requests.get_or_create(&RequestLabels { operation: operation.clone(), outcome }).inc();
        self.inner.durations.get_or_create(&OperationLabel { operation }).observe(elapsed.as_secs_f64());
        self.inner.answered.inc();
        self.inner.answered_micros.inc_by(u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX));
        if outcome == "5xx" {
            self.inner.server_errors.inc();
        }
    }

    /// The totals of every operation, as of now (zeros when metrics are off).
    pub fn totals(&self) -> Totals {
        let inner = &self.inner;
        Totals {
            requests: inner.answered.get(),
            server_errors: inner.server_errors.get(),
            request_seconds: inner.answered_micros.get() as f64 / 1e6,
            bytes_received: inner.bytes.received.get(),
            bytes_sent: inner.bytes.sent.get(),
        }
    }

    pub(crate) fn connection_opened(&self) {
        if self.inner.enabled {
            self.inner.connections.inc();
        }
    }

    pub(crate) fn connection_closed(&self) {
        if self.inner.enabled {
            self.inner.connections.dec();
        }
    }

    /// The metrics in the Prometheus text format (OpenMetrics), as of now.
    pub fn render(&self) -> String {
        let inner = &self.inner;
        let mut registry = Registry::with_prefix("tessera_s3");
        registry.register("requests", "S3 requests answered, by operation and status class", inner.requests.clone());
        registry.register_with_unit(
            "request_duration",
            "Time from a request's arrival to its answer's status line, by operation",
            Unit::Seconds,
            inner.durations.clone(),
        );
        registry.register_with_unit(
            "object_received",
            "Object bytes received in PutObject and UploadPart bodies",
            Unit::Bytes,
            inner.bytes.received.clone(),
        );
        registry.register_with_unit(
            "object_sent",
            "Object bytes sent in GetObject bodies",
            Unit::Bytes,
            inner.bytes.sent.clone(),
        );
        registry.register("connections", "Open client connections", inner.connections.clone());

        // What the gateway's smart client met, read now.
        let client = registry.sub_registry_with_prefix("client");
        let counts = inner.client.read_counts();
        let counter = |value: u64| {
            let counter = Counter::<u64>::default();
            counter.inc_by(value);
            counter
        };
        client.register(
            "degraded_stripes",
            "Stripes decoded because a needed chunk was missing, unreadable or corrupt",
            counter(counts.degraded_stripes),
        );
        client.register("chunks_rebuilt", "Data chunks rebuilt from parity by reads", counter(counts.chunks_rebuilt));
        client.register(
            "checksum_failures",
            "Chunks that arrived failing their block checksums (read around)",
            counter(counts.checksum_failures),
        );
        let up = Family::<NodeLabel, Gauge>::default();
        for (node, reachable) in inner.client.node_reachability() {
            up.get_or_create(&NodeLabel { node }).set(i64::from(reachable));
        }
        client.register("node_up", "1 when the client counts the node up, 0 when a request to it just failed", up);
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
        text
    }
}
