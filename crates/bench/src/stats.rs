//! Counting and latency histograms for one kind of request, and the backlog trend.
//!
//! Every worker task keeps its own [`Tally`] (no shared locks on the hot path) and the
//! tallies are merged when the cell ends. Only requests that complete inside the measured
//! window count, so warm-up and wind-down never leak into the figures.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// The measured part of a cell: requests completing in `[start, end)` count.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// End of warm-up.
    pub start: Instant,
    /// End of the measurement.
    pub end: Instant,
}

impl Window {
    /// A window that begins after `warmup` and lasts `duration`.
    pub fn after(warmup: Duration, duration: Duration) -> Window {
        let start = Instant::now() + warmup;
        Window {
            start,
            end: start + duration,
        }
    }

    /// Whether a completion at `t` counts.
    pub fn contains(&self, t: Instant) -> bool {
        t >= self.start && t < self.end
    }

    /// Length of the window in seconds.
    pub fn secs(&self) -> f64 {
        (self.end - self.start).as_secs_f64()
    }
}

/// Requests, messages, errors and a latency histogram (microseconds) of one kind of request.
#[derive(Debug, Clone)]
pub struct Tally {
    /// Requests answered with the expected status inside the window.
    pub requests: u64,
    /// Messages those requests carried.
    pub messages: u64,
    /// Requests that failed (transport error or unexpected status), anywhere in the cell.
    pub errors: u64,
    /// Latency of the counted requests, in microseconds.
    pub latency: Histogram<u64>,
}

impl Default for Tally {
    fn default() -> Self {
        Tally {
            requests: 0,
            messages: 0,
            errors: 0,
            // 1 µs to 10 min at 3 significant digits: a few tens of kB per tally.
            latency: Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid bounds"),
        }
    }
}

impl Tally {
    /// Counts one successful request that took `latency` and carried `messages`.
    pub fn record(&mut self, latency: Duration, messages: u64) {
        self.requests += 1;
        self.messages += messages;
        self.latency
            .saturating_record((latency.as_micros() as u64).max(1));
    }

    /// Adds another worker's tally to this one.
    pub fn merge(&mut self, other: &Tally) {
        self.requests += other.requests;
        self.messages += other.messages;
        self.errors += other.errors;
        self.latency.add(&other.latency).expect("same bounds");
    }

    /// The latency at quantile `q` (0–1) in milliseconds, or `None` without samples.
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        quantile_ms(&self.latency, q)
    }
}

/// A fresh latency histogram in microseconds with the suite's bounds.
pub fn histogram() -> Histogram<u64> {
    Tally::default().latency
}

/// The value at quantile `q` of a microsecond histogram, in milliseconds.
pub fn quantile_ms(h: &Histogram<u64>, q: f64) -> Option<f64> {
    (!h.is_empty()).then(|| h.value_at_quantile(q) as f64 / 1000.0)
}

/// Microseconds since the first call in this process: the clock of the send stamps that
/// producers put into payloads and consumers subtract from their receive time. Producer and
/// consumer run in the same process, so one monotonic clock serves both.
pub fn now_us() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_micros() as u64
}

/// The arithmetic mean, or `None` for no values (a run whose phase had no samples must show
/// a gap, not a zero).
pub fn mean(xs: &[f64]) -> Option<f64> {
    (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64)
}

/// The least-squares slope of `y` over `x`, or `None` with fewer than two distinct `x`.
///
/// Used on (seconds, backlog) samples: a consumer that keeps up has a slope near zero, one
/// that falls behind a positive slope in messages per second.
pub fn slope(points: &[(f64, f64)]) -> Option<f64> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx == 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    Some(sxy / sxx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tallies_merge_and_report_quantiles() {
        let mut a = Tally::default();
        for ms in 1..=100 {
            a.record(Duration::from_millis(ms), 10);
        }
        let mut b = Tally {
            errors: 3,
            ..Tally::default()
        };
        b.record(Duration::from_millis(1000), 1);
        a.merge(&b);
        assert_eq!(a.requests, 101);
        assert_eq!(a.messages, 1001);
        assert_eq!(a.errors, 3);
        let p50 = a.quantile_ms(0.5).unwrap();
        assert!((50.0..=52.0).contains(&p50), "{p50}");
        assert!(a.quantile_ms(1.0).unwrap() >= 999.0);
        assert_eq!(Tally::default().quantile_ms(0.5), None);
    }

    #[test]
    fn slope_of_a_growing_backlog() {
        let pts: Vec<(f64, f64)> = (0..10).map(|i| (i as f64, 5.0 + 3.0 * i as f64)).collect();
        assert!((slope(&pts).unwrap() - 3.0).abs() < 1e-9);
        let flat: Vec<(f64, f64)> = (0..10).map(|i| (i as f64, 7.0)).collect();
        assert_eq!(slope(&flat), Some(0.0));
        assert_eq!(slope(&[(1.0, 2.0)]), None);
        assert_eq!(slope(&[(1.0, 2.0), (1.0, 3.0)]), None);
    }

    #[test]
    fn means_of_nothing_are_none() {
        assert_eq!(mean(&[1.0, 2.0, 6.0]), Some(3.0));
        assert_eq!(mean(&[]), None);
    }

    #[test]
    fn window_bounds() {
        let w = Window::after(Duration::from_secs(1), Duration::from_secs(2));
        assert!(!w.contains(Instant::now()));
        assert!(w.contains(w.start));
        assert!(!w.contains(w.end));
        assert!((w.secs() - 2.0).abs() < 1e-9);
    }
}
