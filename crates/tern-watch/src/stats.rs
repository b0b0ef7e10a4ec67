//! Lag, backlog, rate and the ETA warning, from the state and a sliding window of samples.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::state::{HookState, Unit};

/// The `watch` object of a progress line.
#[derive(Debug, Clone, Default, Serialize)]
pub struct WatchFields {
    pub units_done: u64,
    pub units_seen: u64,
    pub units_failed: u64,
    pub hooks_failed: u64,
    pub backlog_units: u64,
    pub backlog_bytes: u64,
    pub lag_seconds: f64,
    pub rate_bps: f64,
    pub production_bps: f64,
    pub eta_seconds: Option<f64>,
    pub eta_warning: Option<String>,
}

/// Samples of (time, bytes moved, bytes produced, backlog bytes).
pub struct RateWindow {
    window: Duration,
    samples: VecDeque<(Instant, u64, u64, u64)>,
}

impl RateWindow {
    pub fn new(window: Duration) -> Self {
        Self { window, samples: VecDeque::new() }
    }

    /// Adds a sample; returns (moved/s, produced/s, backlog growth/s) over the window.
    pub fn sample(&mut self, now: Instant, moved: u64, produced: u64, backlog: u64) -> (f64, f64, f64) {
        self.samples.push_back((now, moved, produced, backlog));
        while self.samples.len() > 2 && now.duration_since(self.samples[0].0) > self.window {
            self.samples.pop_front();
        }
        let (t0, m0, p0, b0) = self.samples[0];
        let dt = now.duration_since(t0).as_secs_f64();
        if dt < 0.5 {
            return (0.0, 0.0, 0.0);
        }
        (moved.saturating_sub(m0) as f64 / dt, produced.saturating_sub(p0) as f64 / dt, (backlog as f64 - b0 as f64) / dt)
    }

    pub fn span(&self) -> Duration {
        match (self.samples.front(), self.samples.back()) {
            (Some(a), Some(b)) => b.0.duration_since(a.0),
            _ => Duration::ZERO,
        }
    }
}

/// Whether a unit needs nothing more.
pub fn finished(u: &Unit, hooks: bool, delete: bool) -> bool {
    u.failed.is_some() || (u.verified_at.is_some() && (!hooks || matches!(u.hook, HookState::Done | HookState::Failed(_))) && (!delete || u.deleted))
}

/// Computes the fields from the units, the window's rates and the wall clock (Unix seconds).
pub fn compute(units: &[Unit], hooks: bool, delete: bool, now_unix: f64, rates: (f64, f64, f64), window: Duration) -> WatchFields {
    let mut f = WatchFields { units_seen: units.len() as u64, ..Default::default() };
    let mut oldest_pending: Option<f64> = None;
    let mut last_verified: Option<(f64, f64)> = None;
    for u in units {
        if u.failed.is_some() {
            f.units_failed += 1;
            continue;
        }
        if matches!(u.hook, HookState::Failed(_)) {
            f.hooks_failed += 1;
        }
        if finished(u, hooks, delete) {
            f.units_done += 1;
        }
        match u.verified_at {
            None => {
                f.backlog_units += 1;
                f.backlog_bytes += u.bytes;
                oldest_pending = Some(oldest_pending.map_or(u.ready_at, |o: f64| o.min(u.ready_at)));
            }
            Some(v) => {
                if last_verified.is_none_or(|(lv, _)| v > lv) {
                    last_verified = Some((v, v - u.ready_at));
                }
            }
        }
    }
    f.lag_seconds = match (oldest_pending, last_verified) {
        (Some(o), Some((_, l))) => (now_unix - o).max(l),
        (Some(o), None) => now_unix - o,
        (None, Some((_, l))) => l,
        (None, None) => 0.0,
    }
    .max(0.0);
    let (rate, production, growth) = rates;
    f.rate_bps = rate;
    f.production_bps = production;
    if f.backlog_bytes > 0 && rate > 0.0 {
        f.eta_seconds = Some(f.backlog_bytes as f64 / rate);
    }
    // Judge only over a window with real production, and only if the backlog actually grew.
    if production > 0.0 && production > rate * 1.05 && growth > 0.0 && f.backlog_units > 1 {
        f.eta_warning = Some(format!(
            "production ({}/s) outruns the link ({}/s) over the last {:.0} s: the backlog ({} in {} units) grows by {}/s",
            human(production),
            human(rate),
            window.as_secs_f64(),
            human(f.backlog_bytes as f64),
            f.backlog_units,
            human(growth),
        ));
    }
    f
}

fn human(b: f64) -> String {
    let units = ["B", "KB", "MB", "GB", "TB", "PB"];
    let mut v = b;
    let mut i = 0;
    while v >= 1000.0 && i + 1 < units.len() {
        v /= 1000.0;
        i += 1;
    }
    format!("{v:.1} {}", units[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(seq: u64, bytes: u64, ready: f64, verified: Option<f64>) -> Unit {
        Unit {
            seq,
            name: format!("u{seq}"),
            bytes,
            files: 1,
            ready_at: ready,
            shipments: 1,
            verified_at: verified,
            bytes_sent: 0,
            hook: HookState::NotYet,
            hook_attempts: 0,
            deleted: false,
            failed: None,
        }
    }

    #[test]
    fn lag_backlog_and_warning() {
        let units = vec![unit(0, 100, 10.0, Some(14.0)), unit(1, 200, 12.0, None), unit(2, 300, 15.0, None)];
        let f = compute(&units, false, false, 20.0, (50.0, 100.0, 50.0), Duration::from_secs(60));
        assert_eq!((f.units_done, f.backlog_units, f.backlog_bytes), (1, 2, 500));
        assert_eq!(f.lag_seconds, 8.0); // unit 1, ready at 12, still not verified at 20
        assert_eq!(f.eta_seconds, Some(10.0));
        assert!(f.eta_warning.as_deref().unwrap().contains("outruns the link"), "{:?}", f.eta_warning);
        // Caught up: the lag is the last unit's ready → verified time; no warning.
        let units = vec![unit(0, 100, 10.0, Some(14.0)), unit(1, 100, 12.0, Some(13.0))];
        let f = compute(&units, false, false, 30.0, (100.0, 100.0, 0.0), Duration::from_secs(60));
        assert_eq!((f.backlog_units, f.lag_seconds, f.eta_warning.is_none()), (0, 4.0, true));
        // Hooks pending: verified but not done.
        let f = compute(&units, true, false, 30.0, (0.0, 0.0, 0.0), Duration::from_secs(60));
        assert_eq!(f.units_done, 0);
    }

    #[test]
    fn window_rates() {
        let mut w = RateWindow::new(Duration::from_secs(10));
        let t = Instant::now();
        w.sample(t, 0, 0, 0);
        let (m, p, g) = w.sample(t + Duration::from_secs(2), 200, 400, 200);
        assert_eq!((m, p, g), (100.0, 200.0, 100.0));
    }
}
