//! `/v1/jobs`: submit, list, show, wait for, cancel and retry jobs.

use std::time::Duration;

use axum::Json;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, ApiResult, AppState, Auth, S};
use crate::model::{Job, JobSpec, JobState, Scope, now};
use crate::policy::Refusal;
use crate::runner::blocking;

const MAX_WAIT: Duration = Duration::from_secs(60);

fn refused(r: Refusal) -> ApiError {
    ApiError::new(if r.forbidden { StatusCode::FORBIDDEN } else { StatusCode::BAD_REQUEST }, r.message)
}

/// A job as the API shows it: live progress, rate and ETA added.
fn view(st: &AppState, job: &Job) -> Value {
    let mut v = serde_json::to_value(job).unwrap_or(Value::Null);
    let progress = if job.state == JobState::Running { st.runner.live_progress(job.id).or_else(|| job.progress.clone()) } else { job.progress.clone() };
    if let Some(p) = &progress {
        let f = |k: &str| p.get(k).and_then(Value::as_f64).unwrap_or(0.0);
        let (secs, bytes, skipped, total) = (f("seconds"), f("bytes"), f("bytes_skipped"), f("bytes_total"));
        let rate = if secs > 0.0 { bytes / secs } else { 0.0 };
        v["rate_bytes_per_s"] = json!(rate.round());
        if job.state == JobState::Running && rate > 0.0 && total > 0.0 {
            v["eta_s"] = json!(((total - bytes - skipped).max(0.0) / rate).round());
        }
        v["progress"] = p.clone();
    }
    v
}

pub(crate) fn parse_id(s: &str) -> ApiResult<i64> {
    s.parse::<i64>().ok().filter(|&i| i > 0).ok_or_else(|| ApiError::new(StatusCode::BAD_REQUEST, format!("job id '{s}' is not a positive number")))
}

pub(crate) async fn load(st: &S, auth: &Auth, id: i64) -> ApiResult<Job> {
    let store = st.store.clone();
    match blocking(move || store.get_job(id)).await? {
        Some(j) if auth.owns(&j) => Ok(j),
        _ => Err(ApiError::new(StatusCode::NOT_FOUND, format!("no job {id}; list jobs with `tern jobs`"))),
    }
}

pub(super) async fn submit(State(st): State<S>, auth: Auth, body: Result<Json<JobSpec>, JsonRejection>) -> ApiResult<(StatusCode, Json<Value>)> {
    auth.require(Scope::Transfer)?;
    let Json(mut spec) = body?;
    spec.validate().map_err(|m| ApiError::new(StatusCode::BAD_REQUEST, m))?;
    spec.fix_deadline(now()).map_err(|m| ApiError::new(StatusCode::BAD_REQUEST, m))?;
    if spec.notify.as_deref().is_some_and(|n| n.starts_with("mailto:")) && !st.mail.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "notify mailto: needs a mail relay, and this service has none (start tern serve with --smtp HOST:PORT), or use an https:// webhook"));
    }
    let (policy, s2, token) = (st.policy.clone(), spec.clone(), auth.0.clone());
    tokio::task::spawn_blocking(move || policy.check_job(&s2, &token).and_then(|_| policy.check_notify(&s2)))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("policy check: {e}")))?
        .map_err(refused)?;
    let (store, owner) = (st.store.clone(), auth.0.id.clone());
    let job = blocking(move || store.insert_job(&spec, Some(&owner), now())).await?;
    st.runner.poke();
    Ok((StatusCode::CREATED, Json(view(&st, &job))))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    state: Option<String>,
    limit: Option<u32>,
}

pub(super) async fn list_jobs(State(st): State<S>, auth: Auth, q: Result<Query<ListQuery>, QueryRejection>) -> ApiResult<Json<Value>> {
    auth.require(Scope::Read)?;
    let Query(q) = q?;
    let state = match q.state.as_deref() {
        None => None,
        Some(s) => Some(JobState::parse(s).ok_or_else(|| ApiError::new(StatusCode::BAD_REQUEST, format!("state '{s}' is not one of queued, running, retrying, succeeded, failed, canceled")))?),
    };
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let owner = auth.owner_filter();
    let store = st.store.clone();
    let jobs = blocking(move || store.list_jobs(state, owner.as_deref(), limit)).await?;
    Ok(Json(json!({ "jobs": jobs.iter().map(|j| view(&st, j)).collect::<Vec<_>>() })))
}

pub(super) async fn get_job(State(st): State<S>, auth: Auth, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    auth.require(Scope::Read)?;
    let job = load(&st, &auth, parse_id(&id)?).await?;
    Ok(Json(view(&st, &job)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WaitQuery {
    timeout_s: Option<u64>,
}

/// Long poll: answers when the job is terminal or after `timeout_s` (≤ 60), whichever first.
pub(super) async fn wait_job(State(st): State<S>, auth: Auth, Path(id): Path<String>, q: Result<Query<WaitQuery>, QueryRejection>) -> ApiResult<Json<Value>> {
    auth.require(Scope::Read)?;
    let Query(q) = q?;
    let id = parse_id(&id)?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(q.timeout_s.unwrap_or(30)).min(MAX_WAIT);
    let mut changes = st.runner.subscribe();
    loop {
        changes.borrow_and_update();
        let job = load(&st, &auth, id).await?;
        if job.state.is_terminal() || tokio::time::Instant::now() >= deadline {
            return Ok(Json(view(&st, &job)));
        }
        let _ = tokio::time::timeout_at(deadline, changes.changed()).await;
    }
}

pub(super) async fn cancel_job(State(st): State<S>, auth: Auth, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    auth.require(Scope::Transfer)?;
    let id = parse_id(&id)?;
    let before = load(&st, &auth, id).await?;
    let store = st.store.clone();
    // Recorded first, then the child is killed: a crash in between still ends canceled.
    let done = blocking(move || store.transition(id, &[JobState::Queued, JobState::Retrying, JobState::Running], JobState::Canceled, now())).await?;
    if !done {
        return Err(ApiError::new(StatusCode::CONFLICT, format!("job {id} is {}; only queued, retrying or running jobs can be canceled", before.state.as_str())));
    }
    st.runner.kill(id);
    st.runner.poke();
    let job = load(&st, &auth, id).await?;
    if before.state != JobState::Running {
        // No child will report this one: notify now.
        (st.on_done)(job.clone());
    }
    Ok(Json(view(&st, &job)))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RetryBody {
    /// A new deadline (RFC 3339 or a duration from now) for a job whose old one passed.
    deadline: Option<String>,
}

pub(super) async fn retry_job(State(st): State<S>, auth: Auth, Path(id): Path<String>, body: axum::body::Bytes) -> ApiResult<Json<Value>> {
    auth.require(Scope::Transfer)?;
    let id = parse_id(&id)?;
    let req: RetryBody = if body.iter().all(u8::is_ascii_whitespace) {
        RetryBody::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, format!("retry body: {e} (it may hold only {{\"deadline\": T}})")))?
    };
    let before = load(&st, &auth, id).await?;
    let mut spec = before.spec.clone();
    if let Some(d) = req.deadline {
        spec.options.deadline = Some(d);
        spec.validate().map_err(|m| ApiError::new(StatusCode::BAD_REQUEST, m))?;
        spec.fix_deadline(now()).map_err(|m| ApiError::new(StatusCode::BAD_REQUEST, m))?;
        let store = st.store.clone();
        if !blocking(move || store.set_spec(id, &spec)).await? {
            return Err(ApiError::new(StatusCode::CONFLICT, format!("job {id} is {}; only failed or canceled jobs can be retried", before.state.as_str())));
        }
    } else if let Some(d) = spec.deadline_at().filter(|&d| d <= now()) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("job {id}'s deadline {} has passed; retry it with a later one (tern retry {id} --deadline 6h, or {{\"deadline\": ...}} in the body)", crate::model::rfc3339(d)),
        ));
    }
    let store = st.store.clone();
    if !blocking(move || store.requeue(id, now())).await? {
        return Err(ApiError::new(StatusCode::CONFLICT, format!("job {id} is {}; only failed or canceled jobs can be retried", before.state.as_str())));
    }
    st.runner.poke();
    Ok(Json(view(&st, &load(&st, &auth, id).await?)))
}
