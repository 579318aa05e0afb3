//! Static files of the dashboard, compiled into the binary.
//!
//! `htmx.min.js` is htmx 2.0.11 from the npm package `htmx.org`, unchanged, under the
//! Zero-Clause BSD licence (`crates/comb/assets/htmx.LICENSE`).

use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

const HTMX: &str = include_str!("../../assets/htmx.min.js");
const CSS: &str = include_str!("../../assets/comb.css");
const ICON: &str = include_str!("../../assets/comb.svg");

/// `GET /assets/{file}`: cached for a day (the binary's version is in no URL, so not forever).
pub(crate) async fn serve(Path(file): Path<String>) -> Response {
    let (body, kind) = match file.as_str() {
        "htmx.min.js" => (HTMX, "text/javascript; charset=utf-8"),
        "comb.css" => (CSS, "text/css; charset=utf-8"),
        "comb.svg" => (ICON, "image/svg+xml"),
        _ => return (StatusCode::NOT_FOUND, "no such asset").into_response(),
    };
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "public, max-age=86400"),
        ],
        body,
    )
        .into_response()
}
