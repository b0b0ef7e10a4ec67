//! `GET /v1/cluster`: the nodes of this node's cluster, as their heartbeats last reported them
//! (docs/cluster.md "Nodes on the dashboard, the API and /metrics"); also what `/metrics` shows.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};

use super::{ApiError, ApiResult, Auth, S};
use crate::cluster::NodeStatus;
use crate::model::Scope;

/// The cluster's nodes, or None on a service that is not a cluster node. The registry being
/// out of reach is a 503 in the cluster's own words.
pub(super) async fn read(st: &S) -> ApiResult<Option<(String, String, Vec<NodeStatus>)>> {
    let Some(v) = st.cluster.get().cloned() else { return Ok(None) };
    let (cluster, node) = (v.cluster.clone(), v.node.clone());
    let nodes = tokio::task::spawn_blocking(move || v.nodes()).await.unwrap_or_else(|e| Err(format!("cluster view task failed: {e}")));
    nodes.map(|n| Some((cluster, node, n))).map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e))
}

/// Read scope: what every dashboard user sees.
pub(super) async fn nodes(State(st): State<S>, auth: Auth) -> ApiResult<Json<Value>> {
    auth.require(Scope::Read)?;
    let Some((cluster, node, nodes)) = read(&st).await? else { return Ok(Json(json!({ "cluster": null, "nodes": [] }))) };
    let nodes: Vec<Value> = nodes
        .iter()
        .map(|n| {
            json!({
                "node": n.node, "host": n.host, "state": n.state, "heartbeat_age_s": n.heartbeat_age_s,
                "running_jobs": n.running_jobs, "rate_bps": n.rate_bps, "load1": n.load1, "version": n.version,
            })
        })
        .collect();
    Ok(Json(json!({ "cluster": cluster, "node": node, "nodes": nodes })))
}
