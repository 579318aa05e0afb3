//! Errors as `application/problem+json` (RFC 9457) with a stable machine `code`.
//!
//! Every error body also carries `error` (the same text as `detail`), which Queen's clients read.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use crate::code::Code;
use crate::db::DbError;
use crate::queue::NameInvalid;
use crate::refusal::{Kind, Refusal};

/// An error answer.
#[derive(Debug)]
pub(crate) struct Problem {
    pub status: StatusCode,
    /// Stable, documented, machine-readable.
    pub code: Code,
    pub detail: String,
    /// Seconds, sent as `Retry-After` on 429 and 503.
    pub(crate) retry_after: Option<u64>,
    /// Sent with `Connection: close`: the request was answered before its body was read
    /// whole, so the connection cannot carry another request.
    pub(crate) closes_connection: bool,
    /// What went wrong inside: logged with the request's id, never sent.
    pub(crate) cause: Option<String>,
}

/// An error answer's body: RFC 9457 problem details with a stable machine-readable `code`.
/// `error` repeats `detail`, for Queen's clients, which read `error`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = Problem)]
pub struct ProblemBody {
    /// `urn:comb:problem:` followed by `code`.
    #[serde(rename = "type")]
    #[schema(example = "urn:comb:problem:queue_name_invalid")]
    pub kind: String,
    /// The reason phrase of the HTTP status.
    #[schema(example = "Bad Request")]
    pub title: String,
    /// The HTTP status code.
    #[schema(minimum = 400, maximum = 599)]
    pub status: u16,
    /// What went wrong, for people.
    pub detail: String,
    /// Stable machine-readable error code (`docs/errors.md`).
    #[schema(value_type = Code)]
    pub code: String,
    /// The same text as `detail`.
    pub error: String,
    /// The request's id, also sent as the `x-request-id` header. The server logs an internal
    /// failure's cause under it; the answer never carries the cause.
    #[serde(rename = "requestId", skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

tokio::task_local! {
    /// The id of the request being answered (see [`with_request_id`]).
    static REQUEST_ID: String;
}

/// Gives every request an id, sent back as `x-request-id` and in problem bodies as
/// `requestId`: the server's log line of an internal failure carries the same id and the
/// whole cause, so an operator finds what a client was told only in general terms.
pub(crate) async fn with_request_id(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let id = uuid::Uuid::now_v7().simple().to_string();
    let mut response = REQUEST_ID.scope(id.clone(), next.run(request)).await;
    if let Ok(v) = HeaderValue::from_str(&id) {
        response.headers_mut().insert("x-request-id", v);
    }
    response
}

impl Problem {
    /// A problem with any status.
    pub(crate) fn new(status: StatusCode, code: Code, detail: impl Into<String>) -> Problem {
        Problem {
            status,
            code,
            detail: detail.into(),
            retry_after: None,
            closes_connection: false,
            cause: None,
        }
    }

    /// 400: the request itself is wrong.
    pub(crate) fn bad_request(code: Code, detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::BAD_REQUEST, code, detail)
    }

    /// 404: the thing named does not exist.
    pub(crate) fn not_found(code: Code, detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::NOT_FOUND, code, detail)
    }

    /// 409: the request conflicts with current state (a stale lease, say).
    pub(crate) fn conflict(code: Code, detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::CONFLICT, code, detail)
    }
}

impl From<Refusal> for Problem {
    fn from(r: Refusal) -> Problem {
        let status = match r.kind {
            Kind::Invalid => StatusCode::BAD_REQUEST,
            Kind::NotFound => StatusCode::NOT_FOUND,
            Kind::Conflict => StatusCode::CONFLICT,
            Kind::Full => StatusCode::TOO_MANY_REQUESTS,
            Kind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Kind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Kind::Unsupported => StatusCode::NOT_IMPLEMENTED,
        };
        Problem {
            retry_after: r.retry_after,
            cause: r.cause,
            ..Problem::new(status, r.code, r.detail)
        }
    }
}

/// A name that is no name is a bad request with the name's own code.
impl From<NameInvalid> for Problem {
    fn from(e: NameInvalid) -> Self {
        Problem::bad_request(e.code, e.message)
    }
}

impl From<DbError> for Problem {
    fn from(e: DbError) -> Problem {
        Problem::from(Refusal::from(&e))
    }
}

impl From<&DbError> for Problem {
    fn from(e: &DbError) -> Problem {
        Problem::from(Refusal::from(e))
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let request_id = REQUEST_ID.try_with(String::clone).ok();
        if let Some(cause) = &self.cause {
            let id = request_id.as_deref().unwrap_or("-");
            if self.status.is_server_error() && self.status != StatusCode::SERVICE_UNAVAILABLE {
                tracing::error!(request_id = id, code = self.code.as_str(), cause = %cause, "request failed");
            } else {
                tracing::warn!(request_id = id, code = self.code.as_str(), cause = %cause, "request refused");
            }
        }
        let body = ProblemBody {
            kind: format!("urn:comb:problem:{}", self.code.as_str()),
            title: self
                .status
                .canonical_reason()
                .unwrap_or("Error")
                .to_string(),
            status: self.status.as_u16(),
            error: self.detail.clone(),
            detail: self.detail,
            code: self.code.as_str().to_string(),
            request_id,
        };
        let text = serde_json::to_string(&body).unwrap_or_default();
        let mut resp = (self.status, text).into_response();
        let headers = resp.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(s) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if self.closes_connection {
            // Said, or the client may send its next request into the closing socket.
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}
