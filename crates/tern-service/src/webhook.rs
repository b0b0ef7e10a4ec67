//! Completion notifications: POST `{"job": ...}` to the job's `notify` URL, retried, recorded.
//!
//! Delivery is marked in the store only after a 2xx, so a service restart re-sends what was
//! still pending (at-least-once; receivers should key on the job id).

use std::sync::Arc;
use std::time::Duration;

use crate::model::Job;
use crate::runner::blocking;
use crate::store::JobStore;

const TRIES: u32 = 5;
const TIMEOUT: Duration = Duration::from_secs(10);

fn agent() -> ureq::Agent {
    let tls = ureq::tls::TlsConfig::builder()
        .provider(ureq::tls::TlsProvider::Rustls)
        .unversioned_rustls_crypto_provider(crate::tls::provider())
        .root_certs(ureq::tls::RootCerts::WebPki)
        .build();
    ureq::Agent::config_builder().tls_config(tls).timeout_global(Some(TIMEOUT)).http_status_as_error(false).build().new_agent()
}

/// One delivery with retries (1, 2, 4, 8 s apart); runs as its own task.
pub async fn deliver(store: Arc<dyn JobStore>, job: Job) {
    let Some(url) = job.spec.notify.clone() else { return };
    let id = job.id;
    let body = serde_json::json!({ "job": job });
    for attempt in 0..TRIES {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_secs(1 << (attempt - 1))).await;
        }
        let (u, b) = (url.clone(), body.clone());
        let sent = tokio::task::spawn_blocking(move || agent().post(&u).send_json(&b).map(|r| r.status().as_u16()).map_err(|e| e.to_string())).await;
        match sent {
            Ok(Ok(code)) if (200..300).contains(&code) => {
                let s = store.clone();
                if let Err(e) = blocking(move || s.mark_notified(id)).await {
                    tracing::warn!("job {id}: webhook delivered but not recorded: {e}");
                }
                return;
            }
            Ok(Ok(code)) => tracing::warn!("job {id}: webhook {url} answered {code} (try {} of {TRIES})", attempt + 1),
            Ok(Err(e)) => tracing::warn!("job {id}: webhook {url}: {e} (try {} of {TRIES})", attempt + 1),
            Err(e) => tracing::warn!("job {id}: webhook task: {e}"),
        }
    }
    tracing::error!("job {id}: webhook {url} failed {TRIES} times; it will be tried again at the next service start");
}
