//! `/metrics` (Prometheus text) and the per-status request counts it shows; `/healthz`.

use std::time::Instant;

use axum::Json;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{ApiError, ApiResult, Auth, S};
use crate::model::{JobState, Scope, now};
use crate::runner::blocking;

pub(super) async fn count_requests(State(st): State<S>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let resp = next.run(req).await;
    *st.http.lock().unwrap_or_else(|p| p.into_inner()).entry(resp.status().as_u16()).or_default() += 1;
    tracing::debug!("answered {} in {:?}", resp.status(), started.elapsed());
    resp
}

/// `GET /healthz`: no token; answers once the API serves and the database answers.
pub(super) async fn healthz(State(st): State<S>) -> ApiResult<Json<Value>> {
    let store = st.store.clone();
    blocking(move || store.live_tokens(Scope::Admin, now())).await?;
    Ok(Json(json!({ "ok": true })))
}

pub(super) async fn metrics(State(st): State<S>, auth: Result<Auth, ApiError>) -> ApiResult<Response> {
    if !st.metrics_anonymous {
        auth?.require(Scope::Read)?;
    }
    let store = st.store.clone();
    let t = blocking(move || store.totals()).await?;
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, rows: Vec<(String, u64)>| {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for (labels, v) in rows {
            out.push_str(&format!("{name}{labels} {v}\n"));
        }
    };
    metric("tern_jobs", "gauge", "Jobs by state.", t.jobs_by_state.iter().map(|(s, n)| (format!("{{state=\"{}\"}}", s.as_str()), *n)).collect());
    metric("tern_jobs_running_processes", "gauge", "Transfer child processes running now.", vec![(String::new(), st.runner.running_count() as u64)]);
    metric("tern_transferred_bytes_total", "counter", "Bytes sent by finished attempts (from their summaries).", vec![(String::new(), t.bytes)]);
    metric("tern_transferred_files_total", "counter", "Files landed and verified by finished attempts.", vec![(String::new(), t.files)]);
    metric("tern_failed_files_total", "counter", "Files that failed in finished attempts.", vec![(String::new(), t.files_failed)]);
    metric("tern_job_retries_total", "counter", "Automatic retries after transient failures.", vec![(String::new(), t.retries)]);
    let failed = t.jobs_by_state.iter().find(|(s, _)| *s == JobState::Failed).map_or(0, |x| x.1);
    metric("tern_job_failures_total", "counter", "Jobs that ended failed.", vec![(String::new(), failed)]);
    let http = st.http.lock().unwrap_or_else(|p| p.into_inner()).clone();
    metric("tern_http_requests_total", "counter", "API requests answered, by status code.", http.into_iter().map(|(c, n)| (format!("{{code=\"{c}\"}}"), n)).collect());
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response())
}
