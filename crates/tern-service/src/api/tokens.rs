//! `/v1/tokens`: create (never with more rights than the creator), list and revoke tokens.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, ApiResult, Auth, S};
use crate::model::{Scope, TokenInfo, now};
use crate::runner::blocking;
use crate::store::NewToken;
use crate::tokens;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateToken {
    scope: Scope,
    expires: Option<String>,
    name: Option<String>,
    path_prefix: Option<String>,
    /// The local account a root service runs this token's transfers as.
    run_as: Option<String>,
}

pub(super) async fn create_token(State(st): State<S>, auth: Auth, body: Result<Json<CreateToken>, JsonRejection>) -> ApiResult<(StatusCode, Json<Value>)> {
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

pub(super) async fn list_tokens(State(st): State<S>, auth: Auth) -> ApiResult<Json<Value>> {
    auth.require(Scope::Admin)?;
    let store = st.store.clone();
    let list = blocking(move || store.list_tokens()).await?;
    Ok(Json(json!({ "tokens": list })))
}

pub(super) async fn revoke_token(State(st): State<S>, auth: Auth, Path(id): Path<String>) -> ApiResult<Json<Value>> {
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
