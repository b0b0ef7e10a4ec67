//! Per-job throughput history for the dashboard's live chart: a sampler that reads each running
//! job's latest progress twice a second, and `GET /v1/jobs/{id}/throughput`.
//!
//! Kept in memory only (bounded: `MAX_SAMPLES` per job, `MAX_JOBS` jobs): it is a view of the
//! recent past, not a record; after a service restart a job's chart starts again.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Extension, Path, Query, State};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::api::{ApiResult, AppState, Auth, load, parse_id};
use crate::model::{JobState, Scope};
use crate::runner::blocking;

/// Beyond this a series is halved in resolution (pairs merged), so old samples grow coarser
/// and the newest stay at the child's 1 s tick.
const MAX_SAMPLES: usize = 900;
/// Series of this many jobs at most; the least recently updated goes first.
const MAX_JOBS: usize = 200;
const TICK: Duration = Duration::from_millis(500);
/// The rate is taken across this many of the child's progress lines (about 2 s): the engine
/// counts bytes per verified chunk (4 MiB by default), so one 1 s interval alone swings between
/// 0, 1 and 2 chunks.
const RATE_WINDOW: usize = 3;
/// A sample older than this no longer counts toward the node's rate (the child reports every
/// second; the sampler reads twice a second).
const STALE_MS: i64 = 3000;

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Sample {
    /// Server wall clock, unix milliseconds.
    pub t: i64,
    /// Bytes the current attempt has sent so far.
    pub bytes: u64,
    /// Bytes per second over the last seconds of the attempt (the child's own clock).
    pub bps: f64,
}

#[derive(Default)]
struct Series {
    samples: VecDeque<Sample>,
    /// The child's (seconds, bytes) of this attempt's last progress lines, newest last: a line
    /// is recorded once, and the rate is taken across them.
    recent: VecDeque<(f64, u64)>,
    updated: i64,
}

#[derive(Default)]
pub struct History {
    jobs: Mutex<HashMap<i64, Series>>,
}

impl History {
    /// Records one progress object of a running job (the child's `{"progress": {...}}`).
    pub fn record(&self, id: i64, progress: &Value, now_ms: i64) {
        let Some(secs) = progress.get("seconds").and_then(Value::as_f64) else { return };
        let bytes = progress.get("bytes").and_then(Value::as_u64).unwrap_or(0);
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        if !jobs.contains_key(&id)
            && jobs.len() >= MAX_JOBS
            && let Some(oldest) = jobs.iter().min_by_key(|(_, s)| s.updated).map(|(k, _)| *k)
        {
            jobs.remove(&oldest);
        }
        let s = jobs.entry(id).or_default();
        match s.recent.back() {
            Some(&(ls, _)) if ls == secs => return,
            // The counters went back: a new attempt.
            Some(&(ls, lb)) if secs < ls || bytes < lb => s.recent.clear(),
            _ => {}
        }
        s.recent.push_back((secs, bytes));
        if s.recent.len() > RATE_WINDOW {
            s.recent.pop_front();
        }
        let bps = match s.recent.front() {
            Some(&(fs, fb)) if fs < secs => (bytes - fb) as f64 / (secs - fs),
            // The first line of an attempt: its average so far.
            _ if secs > 0.0 => bytes as f64 / secs,
            _ => 0.0,
        };
        s.updated = now_ms;
        s.samples.push_back(Sample { t: now_ms, bytes, bps });
        if s.samples.len() > MAX_SAMPLES {
            let old: Vec<Sample> = s.samples.drain(..).collect();
            s.samples = old.chunks(2).map(|c| Sample { bps: c.iter().map(|x| x.bps).sum::<f64>() / c.len() as f64, ..c[c.len() - 1] }).collect();
        }
    }

    /// The bytes/s the jobs `ids` move now: each one's newest sample, where it is no older than
    /// `STALE_MS` (a job whose child stopped reporting moves nothing we know of).
    pub fn rate_now(&self, ids: &[i64], now_ms: i64) -> f64 {
        let jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        ids.iter().filter_map(|id| jobs.get(id)?.samples.back()).filter(|x| now_ms - x.t <= STALE_MS).map(|x| x.bps).sum()
    }

    /// Samples newer than `since_ms`.
    pub fn since(&self, id: i64, since_ms: i64) -> Vec<Sample> {
        let jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        jobs.get(&id).map(|s| s.samples.iter().filter(|x| x.t > since_ms).copied().collect()).unwrap_or_default()
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Forever: record the live progress of every running job, and report this node's load to its
/// cluster heartbeat (`cluster::report_load`).
pub async fn sample(st: Arc<AppState>, history: Arc<History>) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let count = st.runner.running_count();
        if count == 0 {
            crate::cluster::report_load(0, 0.0);
            continue;
        }
        let store = st.store.clone();
        let Ok(running) = blocking(move || store.list_jobs(Some(JobState::Running), None, 1000)).await else { continue };
        let t = now_ms();
        // On a cluster the list holds every node's running jobs: only this runner's have progress here.
        let mut mine = Vec::new();
        for job in running {
            if let Some(p) = st.runner.live_progress(job.id) {
                history.record(job.id, &p, t);
                mine.push(job.id);
            }
        }
        crate::cluster::report_load(count, history.rate_now(&mine, t));
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThroughputQuery {
    since: Option<i64>,
}

/// `GET /v1/jobs/{id}/throughput?since=MS`: the job's recent rate samples (read scope; a
/// path-prefixed token sees only its own jobs, exactly as `GET /v1/jobs/{id}`).
pub async fn throughput(
    State(st): State<Arc<AppState>>,
    auth: Auth,
    Extension(history): Extension<Arc<History>>,
    Path(id): Path<String>,
    q: Result<Query<ThroughputQuery>, QueryRejection>,
) -> ApiResult<Json<Value>> {
    auth.require(Scope::Read)?;
    let Query(q) = q?;
    let job = load(&st, &auth, parse_id(&id)?).await?;
    let samples = history.since(job.id, q.since.unwrap_or(0));
    Ok(Json(json!({ "id": job.id, "state": job.state, "interval_ms": 1000, "samples": samples })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(secs: f64, bytes: u64) -> Value {
        json!({ "seconds": secs, "bytes": bytes })
    }

    #[test]
    fn rate_is_over_a_short_window_and_each_line_counts_once() {
        let h = History::default();
        h.record(1, &p(1.0, 1000), 10_000);
        h.record(1, &p(1.0, 1000), 10_500); // the same line seen twice: one sample
        h.record(1, &p(2.0, 5000), 11_000);
        h.record(1, &p(3.0, 6000), 12_000);
        h.record(1, &p(4.0, 12000), 13_000); // across (2 s, 5000) .. (4 s, 12000): 3 lines
        h.record(1, &p(0.5, 100), 14_000); // a new attempt: its own average
        let s = h.since(1, 0);
        assert_eq!(s.iter().map(|x| x.bps).collect::<Vec<_>>(), [1000.0, 4000.0, 2500.0, 3500.0, 200.0]);
        assert_eq!(h.since(1, 13_000).len(), 1);
        assert!(h.since(2, 0).is_empty());
    }

    #[test]
    fn the_rate_now_sums_fresh_samples_only() {
        let h = History::default();
        h.record(1, &p(1.0, 1000), 10_000);
        h.record(2, &p(2.0, 6000), 10_000);
        h.record(3, &p(1.0, 500), 6_000); // silent since
        assert_eq!(h.rate_now(&[1, 2, 3, 4], 10_500), 4000.0);
        assert_eq!(h.rate_now(&[1], 13_001), 0.0);
    }

    #[test]
    fn bounded_in_samples_and_jobs() {
        let h = History::default();
        for i in 0..(MAX_SAMPLES as u64 * 3) {
            h.record(7, &p(i as f64 + 1.0, (i + 1) * 100), i as i64);
        }
        let s = h.since(7, -1);
        assert!(s.len() <= MAX_SAMPLES && s.len() > MAX_SAMPLES / 2, "{}", s.len());
        assert!(s.iter().all(|x| (x.bps - 100.0).abs() < 1e-9), "merging keeps the rate");
        assert_eq!(s.last().unwrap().bytes, MAX_SAMPLES as u64 * 300, "the newest sample survives");
        for id in 0..(MAX_JOBS as i64 + 10) {
            h.record(1000 + id, &p(1.0, 1), id);
        }
        assert!(h.jobs.lock().unwrap().len() <= MAX_JOBS);
        assert_eq!(h.since(1000 + MAX_JOBS as i64 + 9, 0).len(), 1, "the newest job is kept");
    }
}
