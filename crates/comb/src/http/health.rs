//! `GET /health` (alive and the database answers) and `GET /ready` (accepting work).

use std::time::Duration;

use axum::extract::State as AxState;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::State;

/// How long a health probe waits for the database.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

async fn database_answers(app: &State) -> bool {
    crate::db::answers(&app.pool, PROBE_TIMEOUT).await
}

/// Liveness: the process answers and so does its database.
pub(crate) async fn health(AxState(app): AxState<State>) -> Response {
    if database_answers(&app).await {
        (
            StatusCode::OK,
            axum::Json(json!({"status": "healthy", "database": "connected"})),
        )
            .into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "unhealthy", "database": "disconnected"})),
        )
            .into_response()
    }
}

/// Readiness: accepting work (not stopping, database reachable); load balancers route on it.
pub(crate) async fn ready(AxState(app): AxState<State>) -> Response {
    let stopping = app.is_stopping();
    let db = !stopping && database_answers(&app).await;
    let status = if db {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        axum::Json(json!({"ready": db, "stopping": stopping, "database": db})),
    )
        .into_response()
}
