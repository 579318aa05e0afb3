//! `POST /api/v1/lease/{leaseId}/extend`: keep a live lease for longer while work goes on.
//! An ended lease cannot be revived: its partition may already be with another consumer.

use axum::extract::State as AxState;

use super::params::PathParams;
use chrono::SecondsFormat;
use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

use super::body::JsonBody;
use super::{Problem, State};
use crate::queue::MAX_LEASE_SECONDS;

/// The extension request body.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ExtendIn {
    /// New remaining length of the lease, from now.
    seconds: u32,
    /// The lease's partition, when known: finds the lease without a scan.
    partition_id: Option<Uuid>,
}

/// Moves a live lease's end to `seconds` from now.
pub(crate) async fn extend(
    AxState(app): AxState<State>,
    PathParams(lease_id): PathParams<String>,
    JsonBody(body): JsonBody<ExtendIn>,
) -> Result<axum::Json<Value>, Problem> {
    let lease = Uuid::parse_str(&lease_id).map_err(|_| {
        Problem::bad_request(
            "lease_id_invalid",
            format!("leaseId must be a UUID, got {lease_id:?}"),
        )
    })?;
    if !(1..=MAX_LEASE_SECONDS).contains(&body.seconds) {
        return Err(Problem::bad_request(
            "field_invalid",
            format!("seconds must be between 1 and {MAX_LEASE_SECONDS}"),
        ));
    }
    let expires =
        crate::lease::extend(&app.pool, lease, body.seconds as f64, body.partition_id).await?;
    let Some(expires) = expires else {
        return Err(Problem::conflict(
            "lease_invalid",
            "no live lease with this id: it ended, was released, or never existed (an ended lease cannot be revived)",
        ));
    };
    Ok(axum::Json(json!([{
        "leaseId": lease,
        "success": true,
        "expiresAt": expires.to_rfc3339_opts(SecondsFormat::Millis, true),
    }])))
}
