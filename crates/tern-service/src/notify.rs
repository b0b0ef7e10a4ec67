//! Completion notifications, whichever the channel: a webhook (`https://...`) or an email
//! (`mailto:ADDR`). Up to 5 tries (1, 2, 4, 8 s apart); delivery is recorded in the store only
//! once it succeeded, so a service restart re-sends what was still pending (at-least-once;
//! receivers should key on the job id).

use std::sync::Arc;
use std::time::Duration;

use crate::mail::Mailer;
use crate::model::Job;
use crate::model::pathtest::{Schedule, TestResult};
use crate::runner::blocking;
use crate::store::JobStore;

const TRIES: u32 = 5;

/// One delivery with retries; runs as its own task.
pub async fn deliver(store: Arc<dyn JobStore>, mailer: Option<Arc<Mailer>>, allow: Arc<Vec<crate::netallow::Allow>>, job: Job) {
    let Some(target) = job.spec.notify.clone() else { return };
    let id = job.id;
    let job = Arc::new(job);
    for attempt in 0..TRIES {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_secs(1 << (attempt - 1))).await;
        }
        let (t, j, m, allow) = (target.clone(), job.clone(), mailer.clone(), allow.clone());
        let sent = tokio::task::spawn_blocking(move || match t.strip_prefix("mailto:") {
            Some(addr) => match m {
                Some(m) => m.send(addr, &j),
                None => Err("this service has no mail relay (start tern serve with --smtp HOST:PORT)".into()),
            },
            None => crate::webhook::post(&t, &j, &allow),
        })
        .await
        .unwrap_or_else(|e| Err(format!("notification task: {e}")));
        match sent {
            Ok(()) => {
                let s = store.clone();
                if let Err(e) = blocking(move || s.mark_notified(id)).await {
                    tracing::warn!("job {id}: notification to {target} delivered but not recorded: {e}");
                }
                return;
            }
            Err(e) => tracing::warn!("job {id}: notification: {e} (try {} of {TRIES})", attempt + 1),
        }
    }
    tracing::error!("job {id}: notification to {target} failed {TRIES} times; it will be tried again at the next service start");
}

/// A scheduled path test crossed into regression: one notification to its `notify`, with the
/// same channels, allow-list and retries as a job's; recorded once delivered (a restart sends
/// a pending one again).
pub async fn deliver_test_alert(store: Arc<dyn JobStore>, mailer: Option<Arc<Mailer>>, allow: Arc<Vec<crate::netallow::Allow>>, s: Schedule, r: TestResult) {
    let Some(target) = s.spec.notify.clone() else {
        let st = store.clone();
        let _ = blocking(move || st.mark_test_alert_sent(s.id)).await;
        return;
    };
    let id = s.id;
    let subject = format!("tern path test {id} to {} fell below {:.0} % of its baseline", s.spec.dest, s.spec.alert_below * 100.0);
    let text = format!(
        "Path test {id} to {}{}:\n\n  now:      {:.3} Gb/s with {} streams (1 stream {:.3} Gb/s, RTT {:.2} ms)\n  baseline: {:.3} Gb/s (median of the last good results)\n  alert below: {:.0} % of the baseline\n\nHistory: tern test --results {id}\n",
        s.spec.dest,
        s.spec.label.as_deref().map(|l| format!(" ({l})")).unwrap_or_default(),
        r.many_gbps.unwrap_or(0.0),
        r.streams.unwrap_or(0),
        r.one_gbps.unwrap_or(0.0),
        r.rtt_ms.unwrap_or(0.0),
        r.baseline_gbps.unwrap_or(0.0),
        s.spec.alert_below * 100.0
    );
    let body = Arc::new(serde_json::json!({ "path_test": s, "result": r }));
    for attempt in 0..TRIES {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_secs(1 << (attempt - 1))).await;
        }
        let (t, m, allow, body, subject, text) = (target.clone(), mailer.clone(), allow.clone(), body.clone(), subject.clone(), text.clone());
        let sent = tokio::task::spawn_blocking(move || match t.strip_prefix("mailto:") {
            Some(addr) => match m {
                Some(m) => m.send_text(addr, &subject, text),
                None => Err("this service has no mail relay (start tern serve with --smtp HOST:PORT)".into()),
            },
            None => crate::webhook::post_json(&t, &body, &allow),
        })
        .await
        .unwrap_or_else(|e| Err(format!("notification task: {e}")));
        match sent {
            Ok(()) => {
                let st = store.clone();
                if let Err(e) = blocking(move || st.mark_test_alert_sent(id)).await {
                    tracing::warn!("path test {id}: regression notification delivered but not recorded: {e}");
                }
                return;
            }
            Err(e) => tracing::warn!("path test {id}: regression notification: {e} (try {} of {TRIES})", attempt + 1),
        }
    }
    tracing::error!("path test {id}: regression notification to {target} failed {TRIES} times; it will be tried again at the next service start");
}
