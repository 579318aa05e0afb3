//! Maintenance modes: `GET`/`POST /api/v1/system/maintenance` (pushes) and
//! `/api/v1/system/maintenance/pop` (pops).

use axum::Json;
use axum::extract::State as AxState;
use serde_json::{Map, Value};

use super::body::JsonBody;
use super::params::Params;
use super::{Problem, State};
use crate::admin::modes::{Mode, ModeState};
use crate::admin::servers::ServerList;
use crate::code::Code;

async fn set(
    app: &State,
    mode: Mode,
    body: Map<String, Value>,
) -> Result<Json<ModeState>, Problem> {
    let enabled = Params::Json(body)
        .flag("enabled")?
        .ok_or_else(|| Problem::bad_request(Code::ParameterMissing, "`enabled` is required"))?;
    Ok(Json(app.modes.set(&app.pool, mode, enabled).await?))
}

/// Whether pushes are held back.
#[utoipa::path(
    get,
    path = "/api/v1/system/maintenance",
    responses(
        (status = 200, description = "The answer", body = ModeState),
        crate::http::admin_api::Refused,
    )
)]
pub async fn get_push(AxState(app): AxState<State>) -> Result<Json<ModeState>, Problem> {
    Ok(Json(app.modes.get(&app.pool, Mode::Push).await?))
}

/// Holds pushes back (503 with `Retry-After`) or lets them in again.
#[utoipa::path(
    post,
    path = "/api/v1/system/maintenance",
    request_body(content = crate::http::admin_api::ModeBody, content_type = "application/json"),
    responses(
        (status = 200, description = "The answer", body = ModeState),
        crate::http::admin_api::Refused,
    )
)]
pub async fn set_push(
    AxState(app): AxState<State>,
    JsonBody(body): JsonBody<Map<String, Value>>,
) -> Result<Json<ModeState>, Problem> {
    set(&app, Mode::Push, body).await
}

/// Whether pops are held back.
#[utoipa::path(
    get,
    path = "/api/v1/system/maintenance/pop",
    responses(
        (status = 200, description = "The answer", body = ModeState),
        crate::http::admin_api::Refused,
    )
)]
pub async fn get_pop(AxState(app): AxState<State>) -> Result<Json<ModeState>, Problem> {
    Ok(Json(app.modes.get(&app.pool, Mode::Pop).await?))
}

/// Holds pops back (204 at once) or lets them through again.
#[utoipa::path(
    post,
    path = "/api/v1/system/maintenance/pop",
    request_body(content = crate::http::admin_api::ModeBody, content_type = "application/json"),
    responses(
        (status = 200, description = "The answer", body = ModeState),
        crate::http::admin_api::Refused,
    )
)]
pub async fn set_pop(
    AxState(app): AxState<State>,
    JsonBody(body): JsonBody<Map<String, Value>>,
) -> Result<Json<ModeState>, Problem> {
    set(&app, Mode::Pop, body).await
}

/// The servers running on this database, as they registered themselves: release, set of
/// data-path functions, start and last heartbeat.
#[utoipa::path(
    get,
    path = "/api/v1/system/servers",
    responses(
        (status = 200, description = "The answer", body = ServerList),
        crate::http::admin_api::Refused,
    )
)]
pub async fn servers(AxState(app): AxState<State>) -> Result<Json<ServerList>, Problem> {
    Ok(Json(crate::admin::servers::list(&app.pool).await?))
}
