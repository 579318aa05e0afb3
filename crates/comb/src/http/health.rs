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
    database_problem(app).await.is_none()
}

/// Why the database cannot take work now (`None` when a pooled connection to the primary
/// answers): no server answers, none is the primary, or the probe timed out.
async fn database_problem(app: &State) -> Option<String> {
    let probe = async {
        let client = app
            .pool
            .get()
            .await
            .map_err(|e| crate::db::DbError::from(e).to_string())?;
        let writable: bool = client
            .query_one(
                "SELECT current_setting('transaction_read_only') = 'off'",
                &[],
            )
            .await
            .map_err(|e| crate::db::DbError::from(e).to_string())?
            .get(0);
        if !writable {
            // Its server was demoted: the connection is of no use to any request.
            drop(deadpool_postgres::Object::take(client));
            return Err("the database server is read-only: no longer the primary".to_string());
        }
        Ok(())
    };
    match tokio::time::timeout(PROBE_TIMEOUT, probe).await {
        Ok(Ok(())) => None,
        Ok(Err(why)) => Some(why),
        Err(_) => Some(format!(
            "the database did not answer within {} s",
            PROBE_TIMEOUT.as_secs()
        )),
    }
}

/// Liveness: the process answers and so does its database.
pub async fn health(AxState(app): AxState<State>) -> Response {
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
pub async fn ready(AxState(app): AxState<State>) -> Response {
    let stopping = app.is_stopping();
    let problem = if stopping {
        Some("stopping".to_string())
    } else {
        database_problem(&app).await
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
