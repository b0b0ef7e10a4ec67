//! `/v1/fs`: directory browsing for the dashboard, confined like the token's jobs.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, ApiResult, Auth, S};
use crate::model::Scope;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BrowseQuery {
    path: Option<String>,
}

/// `GET /v1/fs?path=DIR`: the entries of a directory a job of this token may use (beneath the
/// job roots and the token's prefix, judged as at submit); without `path`, where to start.
pub(super) async fn browse(State(st): State<S>, auth: Auth, q: Result<Query<BrowseQuery>, QueryRejection>) -> ApiResult<Json<Value>> {
    auth.require(Scope::Transfer)?;
    let Query(q) = q?;
    let (policy, token) = (st.policy.clone(), auth.0.clone());
    // The listing is made by the service's own user; a token whose jobs run as another
    // account would see what that account may not: it lists with `tern ls` as that user.
    if token.run_as.is_some() && crate::runas::is_root() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("token {} runs its jobs as '{}', and the service lists directories as itself; list them as that user with tern ls", token.id, token.run_as.as_deref().unwrap_or("")),
        ));
    }
    let prefix = token.path_prefix.clone();
    let Some(path) = q.path else {
        let starts = policy.roots.starts(prefix.as_deref());
        return Ok(Json(json!({ "path": null, "entries": starts.iter().map(|p| json!({ "name": p.display().to_string(), "kind": "dir", "size": 0, "mtime": 0 })).collect::<Vec<_>>(), "omitted": 0 })));
    };
    let listed = tokio::task::spawn_blocking(move || policy.roots.list_dir(&path, prefix.as_deref()))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("listing: {e}")))?
        .map_err(|m| ApiError::new(StatusCode::FORBIDDEN, m))?;
    let (real, entries, omitted) = listed;
    Ok(Json(json!({ "path": real.display().to_string(), "entries": entries, "omitted": omitted })))
}
