//! The REST API: routes, authentication (bearer tokens) and authorisation (scopes, path
//! prefixes), JSON errors, Prometheus metrics.
//!
//! Every route is registered through `Routes::add`, which also records it, so `routes()` is
//! exactly what is served; a test compares that list with `docs/openapi.json`.
//!
//! This file holds the shared state, the route table and the layers every request passes
//! through; the rest, one concern per file:
//! - `error.rs` JSON errors; `auth.rs` bearer tokens and scopes; `limits.rs` the body limit;
//! - the handlers by resource: `jobs.rs`, `tokens.rs`, `fs.rs` (directory browsing),
//!   `pathtests.rs` (scheduled path tests and their results), `metrics.rs` (`/metrics` and the request counts it shows, `/healthz`),
//!   `cluster.rs` (`/v1/cluster`: the nodes of this node's cluster).

mod auth;
mod cluster;
mod error;
mod fs;
mod jobs;
mod limits;
mod metrics;
mod pathtests;
mod tokens;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, delete, get, post};

pub use auth::Auth;
pub use error::ApiError;
pub(crate) use error::ApiResult;
pub(crate) use jobs::{load, parse_id};

use crate::model::{Job, Scope};
use crate::policy::Policy;
use crate::runner::Runner;
use crate::store::JobStore;

pub const OPENAPI: &str = include_str!("../../../../docs/openapi.json");

pub struct AppState {
    pub store: Arc<dyn JobStore>,
    pub runner: Arc<Runner>,
    /// Runs scheduled path tests (poked when one is created).
    pub tests: Arc<crate::pathtests::Tester>,
    /// Requests answered, by status code (for /metrics).
    http: Mutex<BTreeMap<u16, u64>>,
    /// When each token's `last_used_at` was last written: at most once a minute per token.
    touched: Mutex<HashMap<String, i64>>,
    pub on_done: Arc<dyn Fn(Job) + Send + Sync>,
    /// A mail relay is configured (`--smtp`): `mailto:` notifications are accepted.
    mail: std::sync::atomic::AtomicBool,
    /// What a token may make the service do (`policy.rs`).
    pub policy: Arc<Policy>,
    /// `--metrics-anonymous`: `/metrics` answers without a token.
    pub metrics_anonymous: bool,
    /// Set on a cluster node: its view of the cluster's registry.
    cluster: std::sync::OnceLock<Arc<crate::cluster::Viewer>>,
}

type S = Arc<AppState>;

impl AppState {
    pub fn new(store: Arc<dyn JobStore>, runner: Arc<Runner>, tests: Arc<crate::pathtests::Tester>, on_done: Arc<dyn Fn(Job) + Send + Sync>, policy: Arc<Policy>, metrics_anonymous: bool) -> S {
        Arc::new(Self { store, runner, tests, http: Mutex::default(), touched: Mutex::default(), on_done, mail: Default::default(), policy, metrics_anonymous, cluster: Default::default() })
    }

    pub fn with_mail(self: S, on: bool) -> S {
        self.mail.store(on, std::sync::atomic::Ordering::Relaxed);
        self
    }

    /// Makes this service a cluster node's: `/v1/cluster` and `/metrics` show its cluster.
    pub fn with_cluster(self: S, viewer: Option<crate::cluster::Viewer>) -> S {
        if let Some(v) = viewer {
            let _ = self.cluster.set(Arc::new(v));
        }
        self
    }
}

// ---------- routes ----------

struct Routes {
    router: Router<S>,
    list: Vec<(&'static str, &'static str)>,
}

impl Routes {
    fn add(mut self, method: &'static str, path: &'static str, h: MethodRouter<S>) -> Self {
        self.list.push((method, path));
        self.router = self.router.route(path, h);
        self
    }
}

fn table() -> Routes {
    Routes { router: Router::new(), list: Vec::new() }
        .add("POST", "/v1/jobs", post(jobs::submit))
        .add("GET", "/v1/jobs", get(jobs::list_jobs))
        .add("GET", "/v1/jobs/{id}", get(jobs::get_job))
        .add("GET", "/v1/jobs/{id}/wait", get(jobs::wait_job))
        .add("POST", "/v1/jobs/{id}/cancel", post(jobs::cancel_job))
        .add("POST", "/v1/jobs/{id}/retry", post(jobs::retry_job))
        .add("POST", "/v1/tokens", post(tokens::create_token))
        .add("GET", "/v1/tokens", get(tokens::list_tokens))
        .add("DELETE", "/v1/tokens/{id}", delete(tokens::revoke_token))
        .add("POST", "/v1/path-tests", post(pathtests::create))
        .add("GET", "/v1/path-tests", get(pathtests::list))
        .add("GET", "/v1/path-tests/{id}", get(pathtests::show))
        .add("DELETE", "/v1/path-tests/{id}", delete(pathtests::remove))
        .add("GET", "/v1/path-tests/{id}/results", get(pathtests::results))
        .add("GET", "/metrics", get(metrics::metrics))
        .add("GET", "/healthz", get(metrics::healthz))
        .add("GET", "/v1/fs", get(fs::browse))
        .add("GET", "/v1/cluster", get(cluster::nodes))
        .add("GET", "/openapi.json", get(openapi))
}

/// (method, path) of every served route.
pub fn routes() -> Vec<(&'static str, &'static str)> {
    table().list.into_iter().chain(crate::dashboard::API_ROUTES).collect()
}

pub fn router(state: S) -> Router {
    table()
        .router
        .merge(crate::dashboard::router(&state))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such route; the API is described at /openapi.json") })
        .method_not_allowed_fallback(|| async { ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method not allowed on this route; see /openapi.json") })
        .layer(DefaultBodyLimit::max(limits::BODY_LIMIT))
        .layer(axum::middleware::from_fn(limits::refuse_oversized))
        .layer(axum::middleware::from_fn_with_state(state.clone(), metrics::count_requests))
        .with_state(state)
}

async fn openapi(auth: Auth) -> ApiResult<Response> {
    auth.require(Scope::Read)?;
    Ok(([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response())
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    /// The document and the router are the same set of (method, path); the integration test
    /// additionally checks each one is answered by a running service.
    #[test]
    fn openapi_lists_exactly_the_served_routes() {
        let doc: Value = serde_json::from_str(OPENAPI).expect("docs/openapi.json is JSON");
        let mut documented: Vec<(String, String)> =
            doc["paths"].as_object().expect("paths").iter().flat_map(|(p, ops)| ops.as_object().expect("operations").keys().map(move |m| (m.to_uppercase(), p.clone()))).collect();
        let mut served: Vec<(String, String)> = routes().into_iter().map(|(m, p)| (m.to_string(), p.to_string())).collect();
        documented.sort();
        served.sort();
        assert_eq!(documented, served);
    }
}
