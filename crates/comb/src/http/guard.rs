//! The bearer token layer over the whole router (when tokens are required): each request is
//! admitted by [`crate::auth`] or answered 401/403 here, as problem+json.

use std::sync::Arc;

use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::Problem;
use crate::auth::{Auth, Denied, Principal};
use crate::code::Code;

/// Admits the request, handing its handler the [`Principal`], or answers the refusal.
pub(super) async fn guard(auth: Arc<Auth>, mut request: Request, next: Next) -> Response {
    let admitted = auth.admit(
        request.method(),
        request.uri().path(),
        request
            .headers()
            .get(header::AUTHORIZATION)
            .map(HeaderValue::as_bytes),
    );
    match admitted {
        Ok(None) => next.run(request).await,
        Ok(Some(principal)) => {
            request.extensions_mut().insert(principal);
            next.run(request).await
        }
        Err(denied) => {
            let mut response = refusal(denied).into_response();
            let headers = request.headers();
            // The body is left unread: the client must not send its next request behind it.
            let has_body = headers.contains_key(header::TRANSFER_ENCODING)
                || headers
                    .get(header::CONTENT_LENGTH)
                    .is_some_and(|v| v.as_bytes() != b"0");
            let out = response.headers_mut();
            if has_body {
                out.insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            // The challenge of RFC 6750; nothing of the token is said back.
            let challenge = match denied {
                Denied::MissingToken => "Bearer realm=\"comb\"",
                Denied::InvalidToken => "Bearer realm=\"comb\", error=\"invalid_token\"",
                _ => "Bearer realm=\"comb\", error=\"insufficient_scope\"",
            };
            out.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(challenge),
            );
            response
        }
    }
}

fn refusal(denied: Denied) -> Problem {
    let forbidden = |detail| Problem::new(StatusCode::FORBIDDEN, Code::Forbidden, detail);
    match denied {
        Denied::MissingToken => Problem::new(
            StatusCode::UNAUTHORIZED,
            Code::MissingToken,
            "this route needs a bearer token",
        ),
        Denied::InvalidToken => Problem::new(
            StatusCode::UNAUTHORIZED,
            Code::InvalidToken,
            "the bearer token is not valid",
        ),
        Denied::NoRole => forbidden("the token carries no role this server knows"),
        Denied::RoleTooLow => forbidden("the token's role may not use this route"),
        Denied::OutOfScope => out_of_scope(),
    }
}

/// 403 for a queue outside the token's scope.
pub(super) fn out_of_scope() -> Problem {
    Problem::new(
        StatusCode::FORBIDDEN,
        Code::QueueForbidden,
        "the token may not touch this queue, or this route spans queues it may not touch",
    )
}

/// Refuses unless every queue of `names` is within the scope of the request's token (a
/// handler's check of queues named in its body).
pub(super) fn check_queues<'a>(
    principal: Option<&Principal>,
    names: impl Iterator<Item = &'a str>,
) -> Result<(), Problem> {
    match principal {
        Some(p) if !p.may_use_all(names) => Err(out_of_scope()),
        _ => Ok(()),
    }
}

/// Refuses unless every partition of `partitions` belongs to a queue within the scope of the
/// request's token. Acks and lease extensions name partitions by id, not queues by name:
/// for a token limited to some queues, their queues are looked up by the partitions' primary
/// key (one statement); other callers cost nothing.
pub(super) async fn check_partitions(
    app: &super::App,
    principal: Option<&Principal>,
    partitions: impl Iterator<Item = uuid::Uuid>,
) -> Result<(), Problem> {
    let Some(principal) = principal.filter(|p| p.queues.is_some()) else {
        return Ok(());
    };
    let mut ids: Vec<uuid::Uuid> = partitions.collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() {
        return Ok(());
    }
    let queues = crate::ack::queues_of(&app.pool, &ids).await?;
    check_queues(Some(principal), queues.iter().map(String::as_str))
}
