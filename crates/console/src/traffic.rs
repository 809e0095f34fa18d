//! The cluster page's live charts: the gateway's own request totals (the counters its
//! `/metrics` serves), sampled every [`SAMPLE_INTERVAL`] into a bounded ring, and served as
//! per-interval rates (`GET /cluster/traffic`, JSON) that the page draws with uPlot.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Time between two samples.
pub(crate) const SAMPLE_INTERVAL: Duration = Duration::from_secs(2);
/// Samples kept: ten minutes of history.
pub(crate) const SAMPLES_MAX: usize = 300;

/// What the gateway has answered since it started, over every operation.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Traffic {
    pub requests: u64,
    pub server_errors: u64,
    /// The answered requests' latencies, summed.
    pub request_seconds: f64,
    pub bytes_received: u64,
    pub bytes_sent: u64,
}

/// Reads the gateway's totals now.
pub type TrafficSource = Arc<dyn Fn() -> Traffic + Send + Sync>;

/// The sampled totals, oldest first, each with its time in ms: on the wall clock (the charts'
/// axis) and on the monotonic clock since the first sample (the rates' intervals, which a
/// step of the wall clock must not skew).
#[derive(Default)]
pub(crate) struct Samples {
    ring: Mutex<VecDeque<(Sampled, Traffic)>>,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Sampled {
    pub wall_ms: u64,
    pub monotonic_ms: u64,
}

/// Per-interval rates between consecutive samples: the chart series.
#[derive(Debug, Default, PartialEq, serde::Serialize)]
pub(crate) struct Series {
    pub interval_s: u64,
    /// End of each interval, seconds since the epoch.
    pub time: Vec<f64>,
    pub received_mb_s: Vec<f64>,
    pub sent_mb_s: Vec<f64>,
    pub requests_s: Vec<f64>,
    pub server_errors_s: Vec<f64>,
    /// Mean latency of the interval's requests; null when it had none.
    pub mean_latency_ms: Vec<Option<f64>>,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Samples {
    pub(crate) fn push(&self, at: Sampled, totals: Traffic) {
        let mut ring = self.ring.lock().expect("no panic while the ring is held");
        if ring.len() == SAMPLES_MAX {
            ring.pop_front();
        }
        ring.push_back((at, totals));
        debug_assert!(ring.len() <= SAMPLES_MAX);
    }

    pub(crate) fn series(&self) -> Series {
        let ring = self.ring.lock().expect("no panic while the ring is held");
        let mut series = Series { interval_s: SAMPLE_INTERVAL.as_secs(), ..Series::default() };
        for ((t0, a), (t1, b)) in ring.iter().zip(ring.iter().skip(1)) {
            let seconds = t1.monotonic_ms.saturating_sub(t0.monotonic_ms) as f64 / 1000.0;
            if seconds <= 0.0 {
                continue;
            }
            // A counter that went down means the gateway restarted: no rate for that interval.
            let delta = |x: u64, y: u64| y.saturating_sub(x) as f64;
            let requests = delta(a.requests, b.requests);
            series.time.push(t1.wall_ms as f64 / 1000.0);
            series.received_mb_s.push(delta(a.bytes_received, b.bytes_received) / 1e6 / seconds);
            series.sent_mb_s.push(delta(a.bytes_sent, b.bytes_sent) / 1e6 / seconds);
            series.requests_s.push(requests / seconds);
            series.server_errors_s.push(delta(a.server_errors, b.server_errors) / seconds);
            let latency_s = (b.request_seconds - a.request_seconds).max(0.0);
            series.mean_latency_ms.push((requests > 0.0).then(|| 1000.0 * latency_s / requests));
        }
        series
    }
}

/// Samples `source` every [`SAMPLE_INTERVAL`] until the console's state is gone.
pub(crate) async fn sample(samples: Weak<Samples>, source: TrafficSource) {
    let mut tick = tokio::time::interval(SAMPLE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let start = std::time::Instant::now();
    loop {
        tick.tick().await;
        let Some(samples) = samples.upgrade() else { return };
        let monotonic_ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
        samples.push(Sampled { wall_ms: now_ms(), monotonic_ms }, source());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn when(ms: u64) -> Sampled {
        Sampled { wall_ms: 1_000_000 + ms, monotonic_ms: ms }
    }

    fn at(requests: u64, seconds: f64, received: u64, sent: u64, errors: u64) -> Traffic {
        Traffic {
            requests,
            server_errors: errors,
            request_seconds: seconds,
            bytes_received: received,
            bytes_sent: sent,
        }
    }

    #[test]
    fn rates_are_differences_over_each_interval() {
        let samples = Samples::default();
        samples.push(when(10_000), at(0, 0.0, 0, 0, 0));
        samples.push(when(12_000), at(10, 0.5, 4_000_000, 2_000_000, 1));
        samples.push(when(14_000), at(10, 0.5, 4_000_000, 2_000_000, 1));
        let series = samples.series();
        assert_eq!(series.time, vec![1012.0, 1014.0]);
        assert_eq!(series.received_mb_s, vec![2.0, 0.0]);
        assert_eq!(series.sent_mb_s, vec![1.0, 0.0]);
        assert_eq!(series.requests_s, vec![5.0, 0.0]);
        assert_eq!(series.server_errors_s, vec![0.5, 0.0]);
        assert_eq!(series.mean_latency_ms, vec![Some(50.0), None], "no requests: no latency, not zero");
    }

    #[test]
    fn a_step_of_the_wall_clock_does_not_skew_the_rates() {
        let samples = Samples::default();
        samples.push(Sampled { wall_ms: 10_000_000, monotonic_ms: 0 }, at(0, 0.0, 0, 0, 0));
        // The wall clock stepped back an hour between two samples 2 s apart.
        samples
            .push(Sampled { wall_ms: 10_000_000 - 3_600_000 + 2000, monotonic_ms: 2000 }, at(4, 0.2, 2_000_000, 0, 0));
        let series = samples.series();
        assert_eq!(series.requests_s, vec![2.0]);
        assert_eq!(series.received_mb_s, vec![1.0]);
    }

    #[test]
    fn the_ring_keeps_the_newest_samples_only() {
        let samples = Samples::default();
        for i in 0..(SAMPLES_MAX as u64 + 50) {
            samples.push(when(i * 2000), at(i, 0.0, 0, 0, 0));
        }
        let series = samples.series();
        assert_eq!(series.time.len(), SAMPLES_MAX - 1);
        assert_eq!(series.time.last().copied(), Some(1000.0 + (SAMPLES_MAX as f64 + 49.0) * 2.0));
        // A restarted gateway (counters back to zero) gives a zero rate, never a negative one.
        let restarted = Samples::default();
        restarted.push(when(0), at(100, 9.0, 100, 100, 3));
        restarted.push(when(2000), at(1, 0.1, 0, 0, 0));
        let series = restarted.series();
        assert_eq!(series.requests_s, vec![0.0]);
        assert_eq!(series.mean_latency_ms, vec![None]);
    }
}
