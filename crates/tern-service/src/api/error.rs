//! JSON errors: every refusal is `{"error": "..."}` with its status code; store, body and
//! query-string failures map onto those.

use axum::Json;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::store::StoreError;

pub struct ApiError(StatusCode, String);

impl ApiError {
    pub(super) fn new(code: StatusCode, msg: impl Into<String>) -> Self {
        Self(code, msg.into())
    }

    pub(super) fn message(&self) -> &str {
        &self.1
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
