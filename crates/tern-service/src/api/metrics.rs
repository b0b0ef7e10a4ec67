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

/// `GET /healthz`: no token; answers once the API serves and the database answers. A fenced
/// cluster node answers 503 with the reason: load balancers and orchestrators take any
/// non-2xx as "send nothing here", and a fenced node runs no jobs.
pub(super) async fn healthz(State(st): State<S>) -> ApiResult<Json<Value>> {
    if let Some(why) = st.runner.fenced() {
        return Err(ApiError::new(axum::http::StatusCode::SERVICE_UNAVAILABLE, why));
    }
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
    out.push_str(&path_test_metrics(&st).await?);
    out.push_str(&cluster_metrics(&st).await);
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response())
}

/// A label value as the text format needs it (backslash, quote and newline escaped), cut to
/// 200 bytes: a `dest` is the token holder's text.
fn label(v: &str) -> String {
    let mut cut = v;
    if cut.len() > 200 {
        let mut end = 200;
        while !cut.is_char_boundary(end) {
            end -= 1;
        }
        cut = &cut[..end];
    }
    cut.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// A per-node gauge: name, help, and its value from the node's row.
type NodeGauge = (&'static str, &'static str, fn(&crate::cluster::NodeStatus) -> f64);

/// On a cluster node, each node of its cluster as its heartbeats last reported it. The registry
/// out of reach leaves these out (said in the log) rather than failing the whole scrape.
async fn cluster_metrics(st: &S) -> String {
    let (cluster, nodes) = match super::cluster::read(st).await {
        Ok(Some((cluster, _, nodes))) => (cluster, nodes),
        Ok(None) => return String::new(),
        Err(e) => {
            tracing::warn!("/metrics: the cluster's nodes are left out: {}", e.message());
            return String::new();
        }
    };
    let mut out = String::new();
    let gauges: [NodeGauge; 4] = [
        ("tern_cluster_node_up", "1 while a node of this cluster is active or draining and heard from within 3 heartbeats.", |n| u8::from(n.state == "active" || n.state == "draining") as f64),
        ("tern_cluster_node_heartbeat_age_seconds", "Seconds since a node's last heartbeat, by the database's clock.", |n| n.heartbeat_age_s),
        ("tern_cluster_node_running_jobs", "Jobs a node ran at its last heartbeat.", |n| n.running_jobs as f64),
        ("tern_cluster_node_rate_bytes_per_second", "Bytes per second a node's jobs moved at its last heartbeat.", |n| n.rate_bps),
    ];
    for (name, help, value) in gauges {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n"));
        for n in &nodes {
            out.push_str(&format!("{name}{{cluster=\"{}\",node=\"{}\"}} {}\n", label(&cluster), label(&n.node), value(n)));
        }
    }
    out
}

/// Per schedule, from its newest successful result: rates, round trip, regressed.
async fn path_test_metrics(st: &S) -> ApiResult<String> {
    let store = st.store.clone();
    let rows = blocking(move || {
        let mut rows = Vec::new();
        for s in store.list_schedules(None)? {
            let last = store.list_results(s.id, None, 50)?.into_iter().rev().find(|r| r.ok);
            rows.push((s, last));
        }
        Ok(rows)
    })
    .await?;
    let mut rate = String::from(
        "# HELP tern_path_test_rate_bits_per_second Memory-to-memory rate of the newest successful scheduled path test, with one stream and with many.\n# TYPE tern_path_test_rate_bits_per_second gauge\n",
    );
    let mut rtt = String::from("# HELP tern_path_test_rtt_seconds Median round trip of the newest successful scheduled path test.\n# TYPE tern_path_test_rtt_seconds gauge\n");
    let mut reg = String::from("# HELP tern_path_test_regressed 1 while a scheduled path test is below its alert fraction of its own baseline.\n# TYPE tern_path_test_regressed gauge\n");
    for (s, last) in rows {
        let l = format!("id=\"{}\",dest=\"{}\"", s.id, label(&s.spec.dest));
        reg.push_str(&format!("tern_path_test_regressed{{{l}}} {}\n", s.regressed as u8));
        let Some(r) = last else { continue };
        for (which, v) in [("one", r.one_gbps), ("many", r.many_gbps)] {
            if let Some(v) = v {
                rate.push_str(&format!("tern_path_test_rate_bits_per_second{{{l},streams=\"{which}\"}} {}\n", (v * 1e9).round()));
            }
        }
        if let Some(ms) = r.rtt_ms {
            rtt.push_str(&format!("tern_path_test_rtt_seconds{{{l}}} {}\n", ms / 1e3));
        }
    }
    Ok(rate + &rtt + &reg)
}

#[cfg(test)]
mod tests {
    #[test]
    fn labels_are_escaped_and_bounded() {
        assert_eq!(super::label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert_eq!(super::label(&"é".repeat(200)).len(), 200);
    }
}
