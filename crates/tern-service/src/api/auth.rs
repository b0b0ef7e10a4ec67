//! Authentication (the bearer token of every request but `/healthz`) and authorisation (scopes,
//! and which jobs a token owns).

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{StatusCode, header};

use super::{ApiError, ApiResult, S};
use crate::model::{Job, Scope, TokenInfo, now};
use crate::runner::blocking;
use crate::tokens;

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
    pub(super) fn owns(&self, job: &Job) -> bool {
        self.0.scope >= Scope::Admin || job.owner.as_deref() == Some(self.0.id.as_str())
    }

    /// The owner to filter lists by: None (all) for admins.
    pub(super) fn owner_filter(&self) -> Option<String> {
        (self.0.scope < Scope::Admin).then(|| self.0.id.clone())
    }
}
