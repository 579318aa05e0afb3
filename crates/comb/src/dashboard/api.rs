//! The dashboard's one way to the data: the administration API's JSON routes (Queen's shapes),
//! called in process through the same router, and so the same checks and the same bearer
//! rules, as a client over HTTP. Pages never query the database themselves.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, Request, StatusCode, header};
use serde_json::Value;
use tower::ServiceExt;

use crate::http::State;

/// Largest admin answer a page reads (a queue of 10,000 partitions is a few MB).
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

/// A client of the administration API for one page request, carrying the caller's
/// credentials so the API judges the dashboard's calls exactly as the caller's own.
pub(crate) struct AdminApi {
    state: State,
    authorization: Option<HeaderValue>,
}

/// An answer the API refused or could not give.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub detail: String,
}

impl ApiError {
    /// Whether the route is not served by this build at all.
    pub fn missing_route(&self) -> bool {
        self.status == StatusCode::NOT_FOUND && self.detail == "no such route"
    }
}

impl AdminApi {
    /// A client acting for the request whose headers are given.
    pub fn new(state: &State, headers: &HeaderMap) -> AdminApi {
        AdminApi {
            state: state.clone(),
            authorization: headers.get(header::AUTHORIZATION).cloned(),
        }
    }

    /// `GET path_and_query`, decoded into the administration's answer type for it: pages read
    /// the same types the API serialises.
    pub async fn get_as<T: serde::de::DeserializeOwned>(
        &self,
        path_and_query: impl AsRef<str>,
    ) -> Result<T, ApiError> {
        let value = self
            .call(Method::GET, path_and_query.as_ref(), None)
            .await?;
        serde_json::from_value(value).map_err(|e| ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            detail: format!("reading the answer: {e}"),
        })
    }

    /// `POST path` with a JSON body, the answer decoded into the administration's type for it.
    pub async fn post_as<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &Value,
    ) -> Result<T, ApiError> {
        let value = self.call(Method::POST, path, Some(body)).await?;
        serde_json::from_value(value).map_err(|e| ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            detail: format!("reading the answer: {e}"),
        })
    }

    async fn call(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<&Value>,
    ) -> Result<Value, ApiError> {
        let mut request = Request::builder().method(method).uri(path_and_query);
        if let Some(auth) = &self.authorization {
            request = request.header(header::AUTHORIZATION, auth.clone());
        }
        let request = match body {
            Some(body) => request
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(body.to_string())),
            None => request.body(Body::empty()),
        }
        .map_err(|e| ApiError {
            status: StatusCode::BAD_REQUEST,
            detail: format!("bad request: {e}"),
        })?;
        let response = crate::http::router(self.state.clone())
            .oneshot(request)
            .await
            .unwrap_or_else(|never| match never {});
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), MAX_ANSWER_BYTES)
            .await
            .map_err(|e| ApiError {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                detail: format!("reading the answer: {e}"),
            })?;
        let value: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or(Value::Null)
        };
        if !status.is_success() {
            let detail = value["detail"]
                .as_str()
                .or(value["error"].as_str())
                .unwrap_or("the request failed")
                .to_string();
            return Err(ApiError { status, detail });
        }
        Ok(value)
    }
}
