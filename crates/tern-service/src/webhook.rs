//! Webhook notifications: POST `{"job": ...}` to the job's `notify` URL (one try; `notify.rs`
//! retries and records delivery).
//!
//! The URL is checked against the operator's allow-list (`netallow.rs`) at every try, and the
//! connection goes to exactly the addresses that check approved (a pinned resolver): no
//! redirect is followed, no proxy from the environment is used.

use std::net::SocketAddr;
use std::time::Duration;

use ureq::unversioned::resolver::{ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{DefaultConnector, NextTimeout};

use crate::model::Job;
use crate::netallow::Allow;

const TIMEOUT: Duration = Duration::from_secs(10);

/// Answers every lookup with the addresses the allow-list approved.
#[derive(Debug)]
struct Pinned(Vec<SocketAddr>);

impl Resolver for Pinned {
    fn resolve(&self, _uri: &ureq::http::Uri, _config: &ureq::config::Config, _timeout: NextTimeout) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let mut out = self.empty();
        for a in self.0.iter().take(16) {
            out.push(*a);
        }
        if out.is_empty() { Err(ureq::Error::HostNotFound) } else { Ok(out) }
    }
}

fn agent(addrs: Vec<SocketAddr>) -> ureq::Agent {
    let tls = ureq::tls::TlsConfig::builder().provider(ureq::tls::TlsProvider::Rustls).unversioned_rustls_crypto_provider(crate::tls::provider()).root_certs(ureq::tls::RootCerts::WebPki).build();
    let config = ureq::Agent::config_builder().tls_config(tls).timeout_global(Some(TIMEOUT)).http_status_as_error(false).max_redirects(0).proxy(None).build();
    ureq::Agent::with_parts(config, DefaultConnector::new(), Pinned(addrs))
}

/// One POST of `{"job": ...}` (blocking); Ok on a 2xx answer.
pub fn post(url: &str, job: &Job, allow: &[Allow]) -> Result<(), String> {
    post_json(url, &serde_json::json!({ "job": job }), allow)
}

/// One POST of `body` (blocking), under the same allow-list and pinning; Ok on a 2xx answer.
pub fn post_json(url: &str, body: &serde_json::Value, allow: &[Allow]) -> Result<(), String> {
    // Again at delivery, resolved now: the connection uses exactly what this approved.
    let addrs = crate::netallow::check_webhook(url, allow)?;
    match agent(addrs).post(url).send_json(body) {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => Err(format!("webhook {url} answered {}", r.status().as_u16())),
        Err(e) => Err(format!("webhook {url}: {e}")),
    }
}
