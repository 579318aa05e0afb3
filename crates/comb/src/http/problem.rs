//! Errors as `application/problem+json` (RFC 9457) with a stable machine `code`.
//!
//! Every error body also carries `error` (the same text as `detail`), which Queen's clients read.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::db::DbError;

/// An error answer.
#[derive(Debug)]
pub struct Problem {
    pub status: StatusCode,
    /// Stable, documented, machine-readable.
    pub code: &'static str,
    pub detail: String,
    /// Seconds, sent as `Retry-After` on 429 and 503.
    pub retry_after: Option<u64>,
    /// Sent with `Connection: close`: the request was answered before its body was read
    /// whole, so the connection cannot carry another request.
    pub closes_connection: bool,
}

impl Problem {
    /// A problem with any status.
    pub fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Problem {
        Problem {
            status,
            code,
            detail: detail.into(),
            retry_after: None,
            closes_connection: false,
        }
    }

    /// 400: the request itself is wrong.
    pub fn bad_request(code: &'static str, detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::BAD_REQUEST, code, detail)
    }

    /// 404: the thing named does not exist.
    pub fn not_found(code: &'static str, detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::NOT_FOUND, code, detail)
    }

    /// 409: the request conflicts with current state (a stale lease, say).
    pub fn conflict(code: &'static str, detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::CONFLICT, code, detail)
    }

    /// 503 with `Retry-After`: try again shortly.
    pub fn unavailable(code: &'static str, detail: impl Into<String>) -> Problem {
        Problem {
            retry_after: Some(1),
            ..Problem::new(StatusCode::SERVICE_UNAVAILABLE, code, detail)
        }
    }
}

impl From<DbError> for Problem {
    fn from(e: DbError) -> Problem {
        Problem::from(&e)
    }
}

impl From<&DbError> for Problem {
    fn from(e: &DbError) -> Problem {
        match e {
            DbError::Unavailable(m) => {
                Problem::unavailable("database_unavailable", format!("database unavailable: {m}"))
            }
            DbError::Postgres(pg) => {
                tracing::error!(error = %pg, "database error");
                let detail = match pg.as_db_error() {
                    Some(db) => format!("database error: {}", db.message()),
                    None => format!("database error: {pg}"),
                };
                Problem::new(StatusCode::INTERNAL_SERVER_ERROR, "database_error", detail)
            }
        }
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let body = json!({
            "type": format!("urn:comb:problem:{}", self.code),
            "title": self.status.canonical_reason().unwrap_or("Error"),
            "status": self.status.as_u16(),
            "detail": self.detail,
            "code": self.code,
            "error": self.detail,
        });
        let mut resp = (self.status, body.to_string()).into_response();
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

impl From<crate::admin::Failure> for Problem {
    fn from(f: crate::admin::Failure) -> Problem {
        use crate::admin::Failure;
        match f {
            Failure::NotFound(code, detail) => Problem::not_found(code, detail),
            Failure::Invalid(code, detail) => Problem::bad_request(code, detail),
            Failure::Conflict(code, detail) => Problem::conflict(code, detail),
            Failure::Db(e) => Problem::from(e),
        }
    }
}
