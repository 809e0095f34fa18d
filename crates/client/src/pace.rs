//! A byte rate that background rewrites keep to (re-layout, joining multipart objects), within
//! an object as well as between objects: a 100 GiB object is rewritten at the rate too.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Bytes per second for one or more rewrites that share it; 0 is no limit. Each step of a
/// rewrite waits until the rate has paid for it, with no credit saved up while idle (a burst
/// after a quiet hour is paced like any other).
#[derive(Debug)]
pub struct Pace {
    bytes_per_s: u64,
    /// When the bytes counted so far are paid for.
    paid_until: Mutex<Option<Instant>>,
}

impl Pace {
    pub fn new(bytes_per_s: u64) -> Self {
        Self { bytes_per_s, paid_until: Mutex::new(None) }
    }

    /// How long `bytes` take at this rate (zero without a limit).
    pub fn duration_of(&self, bytes: u64) -> Duration {
        if self.bytes_per_s == 0 {
            return Duration::ZERO;
        }
        Duration::from_secs_f64(bytes as f64 / self.bytes_per_s as f64)
    }

    /// Counts `bytes` just written and waits until the rate allows them.
    pub async fn after(&self, bytes: u64) {
        if let Some(until) = self.reserve(Instant::now(), bytes) {
            tokio::time::sleep_until(until).await;
        }
    }

    /// When `bytes` written at `now` are paid for (`None`: no limit).
    fn reserve(&self, now: Instant, bytes: u64) -> Option<Instant> {
        if self.bytes_per_s == 0 {
            return None;
        }
        let cost = Duration::from_secs_f64(bytes as f64 / self.bytes_per_s as f64);
        let mut paid = self.paid_until.lock().expect("pace lock");
        let until = paid.filter(|t| *t > now).unwrap_or(now) + cost;
        *paid = Some(until);
        Some(until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_paid_for_at_the_rate_without_saved_up_credit() {
        let pace = Pace::new(1 << 20);
        let start = Instant::now();
        // Four half-MiB steps at once: the last is paid for two seconds on.
        let mut until = start;
        for _ in 0..4 {
            until = pace.reserve(start, 512 << 10).unwrap();
        }
        assert_eq!(until, start + Duration::from_secs(2));
        // A step after an idle minute earns nothing from it: one MiB is one second from then.
        let later = start + Duration::from_secs(62);
        assert_eq!(pace.reserve(later, 1 << 20).unwrap(), later + Duration::from_secs(1));
        assert!(Pace::new(0).reserve(start, 1 << 40).is_none());
    }
}
