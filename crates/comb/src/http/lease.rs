//! `POST /api/v1/lease/{leaseId}/extend`: keep a live lease for longer while work goes on.
//! An ended lease cannot be revived: its partition may already be with another consumer.

use axum::Extension;
use axum::extract::State as AxState;

use super::params::PathParams;
use chrono::SecondsFormat;
use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

use super::body::{LimitedBody, parse_json};
use super::{Problem, State};
use crate::auth::Principal;
use crate::code::Code;
use crate::lease::Extended;
use crate::queue::MAX_LEASE_SECONDS;

/// The extension request body; Queen's clients send none (or `{}`).
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ExtendIn {
    /// New remaining length of the lease, from now; the queue's `leaseTime` when absent.
    seconds: Option<u32>,
    /// The lease's partition, when known: finds the lease without a scan.
    partition_id: Option<Uuid>,
}

/// Moves a live lease's end to `seconds` from now.
pub(crate) async fn extend(
    AxState(app): AxState<State>,
    principal: Option<Extension<Principal>>,
    PathParams(lease_id): PathParams<String>,
    LimitedBody(bytes): LimitedBody,
) -> Result<axum::Json<Value>, Problem> {
    let body: ExtendIn = if bytes.iter().all(u8::is_ascii_whitespace) {
        ExtendIn::default()
    } else {
        parse_json(&bytes)?
    };
    let lease = Uuid::parse_str(&lease_id).map_err(|_| {
        Problem::bad_request(
            Code::LeaseIdInvalid,
            format!("leaseId must be a UUID, got {lease_id:?}"),
        )
    })?;
    if body
        .seconds
        .is_some_and(|s| !(1..=MAX_LEASE_SECONDS).contains(&s))
    {
        return Err(Problem::bad_request(
            Code::FieldInvalid,
            format!("seconds must be between 1 and {MAX_LEASE_SECONDS}"),
        ));
    }
    let expires = match crate::lease::extend(
        &app.pool,
        lease,
        body.seconds.map(f64::from),
        body.partition_id,
        principal.as_deref(),
    )
    .await?
    {
        Extended::Until(expires) => expires,
        Extended::NoLiveLease => {
            return Err(Problem::conflict(
                Code::LeaseInvalid,
                "no live lease with this id: it ended, was released, or never existed (an ended lease cannot be revived)",
            ));
        }
        Extended::OutOfScope => return Err(super::guard::out_of_scope()),
    };
    Ok(axum::Json(json!([{
        "leaseId": lease,
        "success": true,
        "expiresAt": expires.to_rfc3339_opts(SecondsFormat::Millis, true),
    }])))
}
