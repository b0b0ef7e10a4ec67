//! Completion notifications, whichever the channel: a webhook (`https://...`) or an email
//! (`mailto:ADDR`). Up to 5 tries (1, 2, 4, 8 s apart); delivery is recorded in the store only
//! once it succeeded, so a service restart re-sends what was still pending (at-least-once;
//! receivers should key on the job id).

use std::sync::Arc;
use std::time::Duration;

use crate::mail::Mailer;
use crate::model::Job;
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
