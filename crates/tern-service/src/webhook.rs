//! Webhook notifications: POST `{"job": ...}` to the job's `notify` URL (one try; `notify.rs`
//! retries and records delivery).

use std::time::Duration;

use crate::model::Job;

const TIMEOUT: Duration = Duration::from_secs(10);

fn agent() -> ureq::Agent {
    let tls = ureq::tls::TlsConfig::builder().provider(ureq::tls::TlsProvider::Rustls).unversioned_rustls_crypto_provider(crate::tls::provider()).root_certs(ureq::tls::RootCerts::WebPki).build();
    ureq::Agent::config_builder().tls_config(tls).timeout_global(Some(TIMEOUT)).max_redirects(0).http_status_as_error(false).build().new_agent()
}

/// One POST (blocking); Ok on a 2xx answer.
/// Not followed: a redirect could lead to an address the allow-list refuses.
pub fn post(url: &str, job: &Job, allow: &[crate::netallow::Allow]) -> Result<(), String> {
    // Again at delivery: the name may resolve elsewhere now than at submit.
    crate::netallow::check_webhook(url, allow)?;
    let body = serde_json::json!({ "job": job });
    match agent().post(url).send_json(&body) {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => Err(format!("webhook {url} answered {}", r.status().as_u16())),
        Err(e) => Err(format!("webhook {url}: {e}")),
    }
}
