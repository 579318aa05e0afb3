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

/// Readiness: accepting work (not stopping, a primary reachable); load balancers route on it.
/// Says why not (`reason`), and whether acknowledged writes would survive a failover of the
/// database (`durability`, informative: it does not make the server unready).
pub(crate) async fn ready(AxState(app): AxState<State>) -> Response {
    let stopping = app.is_stopping();
    let problem = if stopping {
        Some("stopping".to_string())
    } else {
        crate::db::problem(&app.pool, PROBE_TIMEOUT).await
    };
    let db = !stopping && problem.is_none();
    let status = if db {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut body = json!({"ready": db, "stopping": stopping, "database": db});
    if let Some(why) = problem {
        body["reason"] = json!(why);
    }
    if let Some(d) = app.replication.last() {
        let mut detail = json!(d);
        detail["summary"] = json!(d.describe());
        body["durability"] = detail;
    }
    (status, axum::Json(body)).into_response()
}
