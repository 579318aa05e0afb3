//! `GET /health` (alive and the database answers) and `GET /ready` (accepting work).

use std::time::Duration;

use axum::extract::State as AxState;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::State;

/// How long a health probe waits for the database.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

async fn database_answers(app: &State) -> bool {
    crate::db::answers(&app.pool, PROBE_TIMEOUT).await
}

/// The answer of `GET /health`.
#[derive(Serialize, Deserialize, utoipa::ToSchema)]
pub(crate) struct Health {
    /// `healthy` or `unhealthy`.
    pub(crate) status: String,
    /// `connected` or `disconnected`.
    pub(crate) database: String,
    /// This server's release (`comb --version`).
    pub(crate) version: String,
    /// The newest schema version this server knows (its last migration).
    #[serde(rename = "schemaVersion")]
    pub(crate) schema_version: i32,
}

/// The answer of `GET /ready`.
#[derive(Serialize, Deserialize, utoipa::ToSchema)]
pub(crate) struct Ready {
    pub(crate) ready: bool,
    /// A graceful stop has begun.
    pub(crate) stopping: bool,
    /// A primary answers.
    pub(crate) database: bool,
    /// Why not ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<String>,
    /// Whether acknowledged writes would survive a failover of the database, as last checked
    /// (informative: it does not make the server unready), with a `summary` for people.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub(crate) durability: Option<serde_json::Value>,
}

/// Liveness: the process answers and so does its database.
#[utoipa::path(
    get,
    path = "/health",
    tag = "operations",
    operation_id = "health",
    responses(
        (status = 200, description = "Alive, and the database answers.", body = Health),
        (status = 503, description = "The database does not answer.", body = Health),
    )
)]
pub(crate) async fn health(AxState(app): AxState<State>) -> Response {
    let (status, health, database) = if database_answers(&app).await {
        (StatusCode::OK, "healthy", "connected")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "unhealthy", "disconnected")
    };
    let body = Health {
        status: health.to_string(),
        database: database.to_string(),
        version: crate::schema::SERVER_VERSION.to_string(),
        schema_version: crate::schema::latest_version(),
    };
    (status, axum::Json(body)).into_response()
}

/// Readiness: accepting work (not stopping, a primary reachable); load balancers route on it.
/// Says why not (`reason`), and whether acknowledged writes would survive a failover of the
/// database (`durability`, informative: it does not make the server unready).
#[utoipa::path(
    get,
    path = "/ready",
    tag = "operations",
    operation_id = "ready",
    responses(
        (status = 200, description = "Accepting work.", body = Ready),
        (status = 503, description = "Not accepting work: stopping, or no primary answers.", body = Ready),
    )
)]
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
    let durability = app.replication.last().map(|d| {
        let mut detail = json!(d);
        detail["summary"] = json!(d.describe());
        detail
    });
    let body = Ready {
        ready: db,
        stopping,
        database: db,
        reason: problem,
        durability,
    };
    (status, axum::Json(body)).into_response()
}
