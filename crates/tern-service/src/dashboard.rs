//! The web dashboard, served by the API's own HTTPS listener: a single page and its script,
//! style and icon, compiled into the binary (nothing to install, nothing fetched at run time),
//! plus the throughput history its chart reads (`throughput.rs`).
//!
//! The page itself holds no data and needs no token; every number it shows comes from the
//! API with the `Authorization: Bearer` token the user pasted, so the dashboard can do exactly
//! what that token's scope allows and nothing more.

use std::sync::Arc;

use axum::extract::Extension;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::{Json, Router};

use crate::api::{AppState, Auth};
use crate::model::TokenInfo;
use crate::throughput::{self, History};

/// Scripts, styles, images and API calls from this origin only; no inline script or style, no
/// framing, no form posting anywhere (the login form must never put a token in a URL).
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; \
                       base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const INDEX: &str = include_str!("../web/index.html");
const APP_JS: &str = include_str!("../web/app.js");
const APP_CSS: &str = include_str!("../web/app.css");
const ICON: &str = include_str!("../web/icon.svg");

/// The dashboard's JSON routes, for the OpenAPI comparison (`api::routes`).
pub const API_ROUTES: [(&str, &str); 2] = [("GET", "/v1/jobs/{id}/throughput"), ("GET", "/v1/whoami")];

/// Pages and the dashboard's API routes, merged into the API router. Starts the throughput
/// sampler when called inside the service's runtime.
pub fn router(state: &Arc<AppState>) -> Router<Arc<AppState>> {
    let history = Arc::new(History::default());
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(throughput::sample(state.clone(), history.clone()));
    }
    Router::new()
        .route("/", get(|| async { Redirect::to("/ui/") }))
        .route("/ui", get(|| async { Redirect::to("/ui/") }))
        .route("/ui/", get(|| async { asset("text/html; charset=utf-8", INDEX) }))
        .route("/ui/app.js", get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }))
        .route("/ui/app.css", get(|| async { asset("text/css; charset=utf-8", APP_CSS) }))
        .route("/ui/icon.svg", get(|| async { asset("image/svg+xml", ICON) }))
        .route(API_ROUTES[0].1, get(throughput::throughput))
        .route(API_ROUTES[1].1, get(whoami))
        .layer(Extension(history))
}

fn asset(kind: &'static str, body: &'static str) -> Response {
    let mut r = (StatusCode::OK, body).into_response();
    let h = r.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, kind),
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_FRAME_OPTIONS, "DENY"),
        // Compiled in: a new binary is a new dashboard, so always revalidate.
        (header::CACHE_CONTROL, "no-cache"),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    r
}

/// `GET /v1/whoami`: the caller's own token metadata, so the page can greet the user and show
/// only the actions its scope allows (the API still checks every call).
async fn whoami(auth: Auth) -> Json<TokenInfo> {
    Json(auth.0)
}
