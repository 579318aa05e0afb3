//! `POST /api/v1/lease/{leaseId}/extend`: keep a live lease for longer while work goes on.
//! An ended lease cannot be revived: its partition may already be with another consumer.

use axum::Extension;
use axum::extract::State as AxState;

use super::params::PathParams;
use chrono::SecondsFormat;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::body::{LimitedBody, parse_json};
use super::{Problem, State};
use crate::auth::Principal;
use crate::code::Code;
use crate::lease::Extended;
use crate::queue::MAX_LEASE_SECONDS;

/// The extension request body; Queen's clients send none (or `{}`).
#[derive(Serialize, Deserialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = ExtendLeaseRequest)]
pub(crate) struct ExtendIn {
    /// New remaining length of the lease, from now; the queue's `leaseTime` when absent.
    seconds: Option<u32>,
    /// The lease's partition, when known: finds the lease without a scan.
    partition_id: Option<Uuid>,
}

/// The answer of an extension.
#[derive(Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = ExtendLeaseResult)]
pub(crate) struct ExtendOut {
    pub(crate) lease_id: Uuid,
    pub(crate) success: bool,
    /// The lease's new end (RFC 3339, milliseconds).
    pub(crate) expires_at: String,
}

/// Extend a live lease.
///
/// Moves a live lease's end to `seconds` from now. An ended lease cannot be revived (409
/// `lease_invalid`).
#[utoipa::path(
    post,
    path = "/api/v1/lease/{leaseId}/extend",
    tag = "messages",
    operation_id = "extendLease",
    params(("leaseId" = String, Path, description = "The lease, as a pop answered it.")),
    request_body(content = Option<ExtendIn>, description = "Optional; Queen's clients send none."),
    responses((status = 200, description = "Extended: one result.", body = [ExtendOut]))
)]
pub(crate) async fn extend(
    AxState(app): AxState<State>,
    principal: Option<Extension<Principal>>,
    PathParams(lease_id): PathParams<String>,
    LimitedBody(bytes): LimitedBody,
) -> Result<axum::Json<Vec<ExtendOut>>, Problem> {
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
        app.backend,
        &app.router,
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
    Ok(axum::Json(vec![ExtendOut {
        lease_id: lease,
        success: true,
        expires_at: expires.to_rfc3339_opts(SecondsFormat::Millis, true),
    }]))
}
