//! The REST API: routes, authentication (bearer tokens) and authorisation (scopes, path
//! prefixes), JSON errors, Prometheus metrics.
//!
//! Every route is registered through `Routes::add`, which also records it, so `routes()` is
//! exactly what is served; a test compares that list with `docs/openapi.json`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, delete, get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::model::{Job, JobSpec, JobState, Scope, TokenInfo, now};
use crate::policy::{Policy, Refusal};
use crate::runner::{Runner, blocking};
use crate::store::{JobStore, NewToken, StoreError};
use crate::tokens;

pub const OPENAPI: &str = include_str!("../../../docs/openapi.json");
const BODY_LIMIT: usize = 64 * 1024;
/// Oversized bodies up to this size are read and dropped before the 413, so the client sees
/// the answer instead of a connection reset (closing on unread data makes the kernel send RST).
const DRAIN_LIMIT: usize = 1 << 20;
const MAX_WAIT: Duration = Duration::from_secs(60);

pub struct AppState {
    pub store: Arc<dyn JobStore>,
    pub runner: Arc<Runner>,
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
}

type S = Arc<AppState>;

impl AppState {
    pub fn new(store: Arc<dyn JobStore>, runner: Arc<Runner>, on_done: Arc<dyn Fn(Job) + Send + Sync>, policy: Arc<Policy>, metrics_anonymous: bool) -> S {
        Arc::new(Self { store, runner, http: Mutex::default(), touched: Mutex::default(), on_done, mail: Default::default(), policy, metrics_anonymous })
    }

    pub fn with_mail(self: S, on: bool) -> S {
        self.mail.store(on, std::sync::atomic::Ordering::Relaxed);
        self
    }
}

// ---------- errors ----------

pub struct ApiError(StatusCode, String);

impl ApiError {
    fn new(code: StatusCode, msg: impl Into<String>) -> Self {
        Self(code, msg.into())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        tracing::error!("{e}");
        // Locked or full: the request changed nothing and can be made again as is.
        let code = match e {
            StoreError::Busy(_) | StoreError::Unreachable(_) => StatusCode::SERVICE_UNAVAILABLE,
            StoreError::Full(_) => StatusCode::INSUFFICIENT_STORAGE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self(code, e.to_string())
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        Self(r.status(), format!("request body: {}", r.body_text()))
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        Self(StatusCode::BAD_REQUEST, format!("query string: {}", r.body_text()))
    }
}

pub(crate) type ApiResult<T> = Result<T, ApiError>;

// ---------- authentication ----------

pub struct Auth(pub TokenInfo);

impl FromRequestParts<S> for Auth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, st: &S) -> ApiResult<Self> {
        let unauth = |m: String| ApiError::new(StatusCode::UNAUTHORIZED, m);
        let Some(h) = parts.headers.get(header::AUTHORIZATION) else {
            return Err(unauth("missing 'Authorization: Bearer <token>' header; pass --token or set TERN_TOKEN".into()));
        };
        let Some(token) = h.to_str().ok().and_then(|s| s.strip_prefix("Bearer ")).map(str::trim) else {
            return Err(unauth("the Authorization header must be 'Bearer <token>'".into()));
        };
        if !tokens::well_formed(token) {
            return Err(unauth("malformed token (expected tern_<16 hex>_<64 hex>); check for a truncated copy".into()));
        }
        let hash = tokens::hash(token);
        let store = st.store.clone();
        let Some(info) = blocking(move || store.token_by_hash(&hash)).await? else {
            return Err(unauth("unknown token; ask an admin for one (tern token create)".into()));
        };
        let t = now();
        if info.revoked_at.is_some() {
            return Err(unauth(format!("token {} was revoked; ask an admin for a new one (tern token create)", info.id)));
        }
        if let Some(exp) = info.expires_at
            && exp <= t
        {
            return Err(unauth(format!("token {} expired {} s ago; create a new one (tern token create --expires 90d)", info.id, t - exp)));
        }
        let touch = {
            let mut m = st.touched.lock().unwrap_or_else(|p| p.into_inner());
            let last = m.get(&info.id).copied().unwrap_or(0);
            (t - last >= 60).then(|| m.insert(info.id.clone(), t)).is_some()
        };
        if touch {
            let (store, id) = (st.store.clone(), info.id.clone());
            tokio::spawn(async move { blocking(move || store.touch_token(&id, t)).await });
        }
        Ok(Auth(info))
    }
}

impl Auth {
    pub(crate) fn require(&self, need: Scope) -> ApiResult<()> {
        if tokens::scope_allows(self.0.scope, need) {
            Ok(())
        } else {
            Err(ApiError::new(StatusCode::FORBIDDEN, format!("token {} has scope '{}'; this needs '{}' (ask an admin for such a token)", self.0.id, self.0.scope.as_str(), need.as_str())))
        }
    }

    /// Each token sees and controls only its own jobs; admin tokens see all.
    fn owns(&self, job: &Job) -> bool {
        self.0.scope >= Scope::Admin || job.owner.as_deref() == Some(self.0.id.as_str())
    }

    /// The owner to filter lists by: None (all) for admins.
    fn owner_filter(&self) -> Option<String> {
        (self.0.scope < Scope::Admin).then(|| self.0.id.clone())
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
        .add("POST", "/v1/jobs", post(submit))
        .add("GET", "/v1/jobs", get(list_jobs))
        .add("GET", "/v1/jobs/{id}", get(get_job))
        .add("GET", "/v1/jobs/{id}/wait", get(wait_job))
        .add("POST", "/v1/jobs/{id}/cancel", post(cancel_job))
        .add("POST", "/v1/jobs/{id}/retry", post(retry_job))
        .add("POST", "/v1/tokens", post(create_token))
        .add("GET", "/v1/tokens", get(list_tokens))
        .add("DELETE", "/v1/tokens/{id}", delete(revoke_token))
        .add("GET", "/metrics", get(metrics))
        .add("GET", "/healthz", get(healthz))
        .add("GET", "/v1/fs", get(browse))
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
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(axum::middleware::from_fn(refuse_oversized))
        .layer(axum::middleware::from_fn_with_state(state.clone(), count_requests))
        .with_state(state)
}

async fn count_requests(State(st): State<S>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let resp = next.run(req).await;
    *st.http.lock().unwrap_or_else(|p| p.into_inner()).entry(resp.status().as_u16()).or_default() += 1;
    tracing::debug!("answered {} in {:?}", resp.status(), started.elapsed());
    resp
}

async fn refuse_oversized(req: Request, next: Next) -> Response {
    let len = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|s| s.parse::<u64>().ok());
    if let Some(n) = len
        && n > BODY_LIMIT as u64
    {
        if n <= DRAIN_LIMIT as u64 {
            let _ = axum::body::to_bytes(req.into_body(), DRAIN_LIMIT).await;
        }
        return ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("request body of {n} bytes is over the {BODY_LIMIT}-byte limit")).into_response();
    }
    next.run(req).await
}

// ---------- jobs ----------

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

async fn submit(State(st): State<S>, auth: Auth, body: Result<Json<JobSpec>, JsonRejection>) -> ApiResult<(StatusCode, Json<Value>)> {
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
struct ListQuery {
    state: Option<String>,
    limit: Option<u32>,
}

async fn list_jobs(State(st): State<S>, auth: Auth, q: Result<Query<ListQuery>, QueryRejection>) -> ApiResult<Json<Value>> {
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

async fn get_job(State(st): State<S>, auth: Auth, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    auth.require(Scope::Read)?;
    let job = load(&st, &auth, parse_id(&id)?).await?;
    Ok(Json(view(&st, &job)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WaitQuery {
    timeout_s: Option<u64>,
}

/// Long poll: answers when the job is terminal or after `timeout_s` (≤ 60), whichever first.
async fn wait_job(State(st): State<S>, auth: Auth, Path(id): Path<String>, q: Result<Query<WaitQuery>, QueryRejection>) -> ApiResult<Json<Value>> {
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

async fn cancel_job(State(st): State<S>, auth: Auth, Path(id): Path<String>) -> ApiResult<Json<Value>> {
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

async fn retry_job(State(st): State<S>, auth: Auth, Path(id): Path<String>, body: axum::body::Bytes) -> ApiResult<Json<Value>> {
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

// ---------- tokens ----------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateToken {
    scope: Scope,
    expires: Option<String>,
    name: Option<String>,
    path_prefix: Option<String>,
    /// The local account a root service runs this token's transfers as.
    run_as: Option<String>,
}

async fn create_token(State(st): State<S>, auth: Auth, body: Result<Json<CreateToken>, JsonRejection>) -> ApiResult<(StatusCode, Json<Value>)> {
    auth.require(Scope::Admin)?;
    let Json(req) = body?;
    let bad = |m: String| ApiError::new(StatusCode::BAD_REQUEST, m);
    if req.scope > auth.0.scope {
        return Err(ApiError::new(StatusCode::FORBIDDEN, "a token cannot create a token with more rights than itself"));
    }
    let ttl = tokens::parse_expiry(req.expires.as_deref().unwrap_or("90d")).map_err(bad)?;
    let name = req.name.unwrap_or_default();
    if name.len() > 200 || name.chars().any(char::is_control) {
        return Err(bad("name must be at most 200 printable characters".into()));
    }
    if let Some(p) = &req.path_prefix {
        tokens::valid_prefix(p).map_err(bad)?;
        if let Some(mine) = &auth.0.path_prefix
            && !tokens::path_allowed(mine, p)
        {
            return Err(ApiError::new(StatusCode::FORBIDDEN, format!("path prefix {p} is outside this token's prefix {mine}")));
        }
    }
    if let Some(user) = &req.run_as {
        let a = crate::runas::lookup(user).map_err(bad)?;
        if a.uid == 0 {
            return Err(bad(format!("run-as '{user}' is root; a token without --run-as already means that (and needs --allow-root-transfers)")));
        }
    }
    let (id, token) = tokens::generate().map_err(|m| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, m))?;
    let hash = tokens::hash(&token);
    let t = now();
    let (store, creator, prefix) = (st.store.clone(), auth.0.id.clone(), req.path_prefix.clone().or_else(|| auth.0.path_prefix.clone()));
    let info = blocking(move || {
        store.insert_token(
            &NewToken {
                id: &id,
                name: &name,
                scope: req.scope,
                hash: &hash,
                path_prefix: prefix.as_deref(),
                created_by: Some(&creator),
                expires_at: ttl.map(|s| t + s),
                run_as: req.run_as.as_deref(),
            },
            t,
        )
    })
    .await?;
    let mut v = serde_json::to_value(&info).unwrap_or(Value::Null);
    v["token"] = json!(token);
    Ok((StatusCode::CREATED, Json(v)))
}

async fn list_tokens(State(st): State<S>, auth: Auth) -> ApiResult<Json<Value>> {
    auth.require(Scope::Admin)?;
    let store = st.store.clone();
    let list = blocking(move || store.list_tokens()).await?;
    Ok(Json(json!({ "tokens": list })))
}

async fn revoke_token(State(st): State<S>, auth: Auth, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    auth.require(Scope::Admin)?;
    let store = st.store.clone();
    let all = blocking(move || store.list_tokens()).await?;
    let t = now();
    let Some(target) = all.iter().find(|x| x.id == id) else {
        return Err(ApiError::new(StatusCode::NOT_FOUND, format!("no token {id}; list them with `tern token list`")));
    };
    let live = |x: &TokenInfo| x.revoked_at.is_none() && x.expires_at.is_none_or(|e| e > t);
    if target.scope == Scope::Admin && live(target) && all.iter().filter(|x| x.scope == Scope::Admin && live(x)).count() <= 1 {
        return Err(ApiError::new(StatusCode::CONFLICT, format!("token {id} is the last live admin token; create another admin token before revoking it")));
    }
    let store = st.store.clone();
    let id2 = id.clone();
    blocking(move || store.revoke_token(&id2, t)).await?;
    Ok(Json(json!({ "revoked": id })))
}

// ---------- metrics, OpenAPI ----------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BrowseQuery {
    path: Option<String>,
}

/// `GET /v1/fs?path=DIR`: the entries of a directory a job of this token may use (beneath the
/// job roots and the token's prefix, judged as at submit); without `path`, where to start.
async fn browse(State(st): State<S>, auth: Auth, q: Result<Query<BrowseQuery>, QueryRejection>) -> ApiResult<Json<Value>> {
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

/// `GET /healthz`: no token; answers once the API serves and the database answers.
async fn healthz(State(st): State<S>) -> ApiResult<Json<Value>> {
    let store = st.store.clone();
    blocking(move || store.live_tokens(Scope::Admin, now())).await?;
    Ok(Json(json!({ "ok": true })))
}

async fn metrics(State(st): State<S>, auth: Result<Auth, ApiError>) -> ApiResult<Response> {
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

async fn openapi(auth: Auth) -> ApiResult<Response> {
    auth.require(Scope::Read)?;
    Ok(([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response())
}

#[cfg(test)]
mod tests {
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
