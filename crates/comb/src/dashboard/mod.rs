//! The dashboard: HTML pages served by `comb serve` at `/`, built only on the administration
//! API (see [`api`]). Pages are rendered on the server from askama templates
//! (`crates/comb/templates/dashboard/`); htmx, embedded in the binary, refreshes them live and
//! sends actions; charts are inline SVG. Every asset ships in the binary: no CDN, no build step.

mod access;
mod api;
mod assets;
mod chart;
mod dead_letters;
mod figures;
mod groups;
mod messages;
mod overview;
mod queues;
mod session;

use askama::Template;
use axum::Router;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};

use crate::http::State;

pub(crate) use access::Viewer;
pub(crate) use api::{AdminApi, ApiError};

/// The dashboard's routes. They are kept out of [`crate::http::routes`] and `openapi.json`,
/// which describe the JSON API; `server` merges them with the API's router on the same port.
/// When tokens are required, every page but the sign-in page and the assets asks for one
/// ([`session::guard`]).
pub fn router(state: State) -> Router {
    Router::new()
        .route("/", get(overview::page))
        .route("/queues", get(queues::list))
        .route("/queues/{queue}", get(queues::detail))
        .route("/queues/{queue}/tail", get(queues::tail))
        .route("/groups", get(groups::list))
        .route("/groups/{group}/seek", post(groups::seek))
        .route("/dead-letters", get(dead_letters::list))
        .route("/dead-letters/confirm", get(dead_letters::confirm))
        .route("/dead-letters/requeue", post(dead_letters::requeue))
        .route("/dead-letters/purge", post(dead_letters::purge))
        .route(
            "/messages/{partition_id}/{transaction_id}",
            get(messages::detail),
        )
        .route("/assets/{file}", get(assets::serve))
        .route("/sign-in", get(session::show).post(session::sign_in))
        .route("/sign-out", post(session::sign_out))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            session::guard,
        ))
        .layer(axum::middleware::from_fn(server_timing))
        .with_state(state)
}

/// Adds `Server-Timing: page;dur=…` (milliseconds) to every dashboard answer: how long the
/// server took to gather and render it, as the browser's developer tools show it.
async fn server_timing(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let start = std::time::Instant::now();
    let mut response = next.run(request).await;
    let ms = start.elapsed().as_secs_f64() * 1000.0;
    if let Ok(v) = header::HeaderValue::from_str(&format!("page;dur={ms:.1}")) {
        response.headers_mut().insert("server-timing", v);
    }
    response
}

/// The frame around every page: navigation, the CSRF token htmx sends, the live region.
#[derive(Template)]
#[template(path = "dashboard/layout.html")]
struct Layout<'a> {
    title: &'a str,
    section: &'a str,
    csrf: &'a str,
    viewer: Viewer,
    /// The page's own markup, already rendered (escaped by its own template).
    body: &'a str,
    /// Where the live region reloads itself from, and how often; none for pages too large to
    /// redraw every few seconds.
    refresh: Option<(&'a str, u32)>,
    /// This server's release and the newest schema version it knows, in the footer: which
    /// build answered, during a rolling upgrade.
    version: &'a str,
    schema_version: i32,
}

/// A rendered page: its title, its navigation section and its body.
pub(crate) struct Page {
    pub title: String,
    pub section: &'static str,
    pub body: String,
    pub refresh: Option<(String, u32)>,
}

impl Page {
    /// Wraps the body in the layout, minting the CSRF cookie on first visit.
    pub fn respond(self, headers: &HeaderMap) -> Response {
        let (csrf, set_cookie) = access::page_token(headers);
        let layout = Layout {
            title: &self.title,
            section: self.section,
            csrf: &csrf,
            viewer: access::viewer(headers),
            body: &self.body,
            refresh: self.refresh.as_ref().map(|(u, s)| (u.as_str(), *s)),
            version: crate::schema::SERVER_VERSION,
            schema_version: crate::schema::latest_version(),
        };
        let mut response = rendered(layout.render());
        if let Some(cookie) = set_cookie {
            response.headers_mut().insert(header::SET_COOKIE, cookie);
        }
        response
    }
}

/// A template's output as an HTML answer, or a 500 saying it failed.
pub(crate) fn rendered(result: askama::Result<String>) -> Response {
    match result {
        Ok(html) => Html(html).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "dashboard template failed");
            (StatusCode::INTERNAL_SERVER_ERROR, "template failed").into_response()
        }
    }
}

/// A page body in the layout.
pub(crate) fn respond(
    body: askama::Result<String>,
    title: &str,
    section: &'static str,
    refresh: Option<(String, u32)>,
    headers: &HeaderMap,
) -> Response {
    match body {
        Ok(body) => Page {
            title: title.to_string(),
            section,
            body,
            refresh,
        }
        .respond(headers),
        Err(e) => rendered(Err(e)),
    }
}

/// A short notice (the outcome of an action, or why it was refused) for the page's notice
/// area.
#[derive(Template)]
#[template(path = "dashboard/notice.html")]
pub(crate) struct Notice {
    pub ok: bool,
    pub text: String,
}

impl Notice {
    /// A notice answer; a success also tells the live region to refresh.
    pub fn respond(self, status: StatusCode) -> Response {
        let ok = self.ok;
        let mut response = rendered(self.render());
        *response.status_mut() = status;
        if ok {
            response
                .headers_mut()
                .insert("hx-trigger", header::HeaderValue::from_static("refresh"));
        }
        response
    }

    /// The notice for a refused action or a failed API call.
    pub fn refused(refusal: access::Refusal) -> Response {
        let (status, text) = match refusal {
            access::Refusal::Csrf => (
                StatusCode::FORBIDDEN,
                "refused: the action did not come from a dashboard page of this server",
            ),
            access::Refusal::ReadOnly => {
                (StatusCode::FORBIDDEN, "refused: your role may only look")
            }
            access::Refusal::OutOfScope => (
                StatusCode::FORBIDDEN,
                "refused: your token may not touch this queue",
            ),
            access::Refusal::SignedOut => (
                StatusCode::UNAUTHORIZED,
                "refused: sign in first (your token is missing or no longer valid)",
            ),
        };
        Notice {
            ok: false,
            text: text.to_string(),
        }
        .respond(status)
    }

    /// The notice for an API error.
    pub fn failed(what: &str, e: &ApiError) -> Response {
        let status = if e.status.is_client_error() {
            StatusCode::BAD_REQUEST
        } else {
            StatusCode::BAD_GATEWAY
        };
        Notice {
            ok: false,
            text: format!("{what} failed: {}", e.detail),
        }
        .respond(status)
    }
}

/// A part of a page whose data the API could not give, said plainly in place of the part.
pub(crate) fn unavailable(what: &str, e: &ApiError) -> String {
    let text = if e.missing_route() {
        format!("{what}: this server does not serve that part of the administration API yet.")
    } else {
        format!("{what}: {} ({})", e.detail, e.status.as_u16())
    };
    format!(
        r#"<p class="unavailable" role="status">{}</p>"#,
        text.replace('&', "&amp;").replace('<', "&lt;")
    )
}

/// A path segment or query value, percent-encoded.
pub(crate) fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}
