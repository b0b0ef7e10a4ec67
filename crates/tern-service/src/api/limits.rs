//! The request body limit, enforced before any handler reads a body.

use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::ApiError;

pub(super) const BODY_LIMIT: usize = 64 * 1024;
/// Oversized bodies up to this size are read and dropped before the 413, so the client sees
/// the answer instead of a connection reset (closing on unread data makes the kernel send RST).
const DRAIN_LIMIT: usize = 1 << 20;

pub(super) async fn refuse_oversized(req: Request, next: Next) -> Response {
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
