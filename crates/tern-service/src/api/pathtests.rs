//! `/v1/path-tests`: create, list, show and delete scheduled path tests, and list a schedule's
//! results (docs/service.md "Scheduled path tests"; the rules are in docs/security-service.md).

use axum::Json;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, ApiResult, Auth, S};
use crate::model::pathtest::{self, MAX_SCHEDULES, MAX_SCHEDULES_PER_TOKEN, Schedule, TestRequest};
use crate::model::{Scope, now};
use crate::policy::Refusal;
use crate::runner::blocking;

fn refused(r: Refusal) -> ApiError {
    ApiError::new(if r.forbidden { StatusCode::FORBIDDEN } else { StatusCode::BAD_REQUEST }, r.message)
}

fn parse_id(s: &str) -> ApiResult<i64> {
    s.parse::<i64>().ok().filter(|&i| i > 0).ok_or_else(|| ApiError::new(StatusCode::BAD_REQUEST, format!("path test id '{}' is not a positive number", s.chars().take(40).collect::<String>())))
}

/// The schedule if the caller may see it; 404 otherwise (another token's is not revealed).
async fn load(st: &S, auth: &Auth, id: i64) -> ApiResult<Schedule> {
    let store = st.store.clone();
    match blocking(move || store.get_schedule(id)).await? {
        Some(s) if auth.0.scope >= Scope::Admin || s.owner.as_deref() == Some(auth.0.id.as_str()) => Ok(s),
        _ => Err(ApiError::new(StatusCode::NOT_FOUND, format!("no path test {id}; list them with tern test --schedules"))),
    }
}

/// A schedule with its newest result and current baseline.
async fn view(st: &S, s: &Schedule) -> ApiResult<Value> {
    let (store, id) = (st.store.clone(), s.id);
    let recent = blocking(move || store.list_results(id, None, (pathtest::BASELINE_K * 20) as u32)).await?;
    let mut v = serde_json::to_value(s).unwrap_or(Value::Null);
    v["last"] = recent.last().map_or(Value::Null, |r| serde_json::to_value(r).unwrap_or(Value::Null));
    v["baseline_gbps"] = json!(pathtest::baseline(&recent));
    Ok(v)
}

pub(super) async fn create(State(st): State<S>, auth: Auth, body: Result<Json<TestRequest>, JsonRejection>) -> ApiResult<(StatusCode, Json<Value>)> {
    auth.require(Scope::Transfer)?;
    let Json(req) = body?;
    let spec = req.validate(st.tests.min_every_s()).map_err(|m| ApiError::new(StatusCode::BAD_REQUEST, m))?;
    if spec.notify.as_deref().is_some_and(|n| n.starts_with("mailto:")) && !st.mail.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "notify mailto: needs a mail relay, and this service has none (start tern serve with --smtp HOST:PORT), or use an https:// webhook"));
    }
    let (policy, s2, token) = (st.policy.clone(), spec.clone(), auth.0.clone());
    tokio::task::spawn_blocking(move || policy.check_test(&s2, &token).and_then(|_| policy.check_notify(&s2.as_job())))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("policy check: {e}")))?
        .map_err(refused)?;
    let (store, owner) = (st.store.clone(), auth.0.id.clone());
    let all = blocking(move || store.list_schedules(None)).await?;
    let mine = all.iter().filter(|s| s.owner.as_deref() == Some(auth.0.id.as_str())).count();
    if all.len() >= MAX_SCHEDULES {
        return Err(ApiError::new(StatusCode::CONFLICT, format!("this service has {MAX_SCHEDULES} path-test schedules, its limit; delete some (tern test --unschedule ID)")));
    }
    if mine >= MAX_SCHEDULES_PER_TOKEN {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("token {} has {MAX_SCHEDULES_PER_TOKEN} path-test schedules, the limit per token; delete some (tern test --unschedule ID)", auth.0.id),
        ));
    }
    let store = st.store.clone();
    let s = blocking(move || store.insert_schedule(&spec, Some(&owner), now())).await?;
    tracing::info!(target: "tern::access", "path test {} created: token {}: {} every {} s", s.id, auth.0.id, s.spec.dest, s.spec.every_s);
    st.tests.poke();
    Ok((StatusCode::CREATED, Json(view(&st, &s).await?)))
}

pub(super) async fn list(State(st): State<S>, auth: Auth) -> ApiResult<Json<Value>> {
    auth.require(Scope::Read)?;
    let (store, owner) = (st.store.clone(), auth.owner_filter());
    let all = blocking(move || store.list_schedules(owner.as_deref())).await?;
    let mut out = Vec::with_capacity(all.len());
    for s in &all {
        out.push(view(&st, s).await?);
    }
    Ok(Json(json!({ "path_tests": out })))
}

pub(super) async fn show(State(st): State<S>, auth: Auth, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    auth.require(Scope::Read)?;
    let s = load(&st, &auth, parse_id(&id)?).await?;
    Ok(Json(view(&st, &s).await?))
}

pub(super) async fn remove(State(st): State<S>, auth: Auth, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    auth.require(Scope::Transfer)?;
    let id = parse_id(&id)?;
    load(&st, &auth, id).await?;
    let store = st.store.clone();
    let gone = blocking(move || store.delete_schedule(id)).await?;
    tracing::info!(target: "tern::access", "path test {id} deleted: token {}", auth.0.id);
    Ok(Json(json!({ "deleted": gone, "id": id })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ResultsQuery {
    limit: Option<u32>,
    before: Option<i64>,
}

pub(super) async fn results(State(st): State<S>, auth: Auth, Path(id): Path<String>, q: Result<Query<ResultsQuery>, QueryRejection>) -> ApiResult<Json<Value>> {
    auth.require(Scope::Read)?;
    let Query(q) = q?;
    let id = parse_id(&id)?;
    load(&st, &auth, id).await?;
    let limit = q.limit.unwrap_or(500).clamp(1, pathtest::KEEP_RESULTS);
    let store = st.store.clone();
    let rows = blocking(move || store.list_results(id, q.before, limit)).await?;
    // Older ones may remain when this page is full.
    let next_before = (rows.len() as u32 == limit).then(|| rows.first().map(|r| r.id)).flatten();
    Ok(Json(json!({ "id": id, "results": rows, "next_before": next_before })))
}
