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

    /// `GET path_and_query`, decoded.
    pub async fn get(&self, path_and_query: impl AsRef<str>) -> Result<Json, ApiError> {
        self.call(Method::GET, path_and_query.as_ref(), None).await
    }

    /// `GET path_and_query`, decoded into the administration's answer type for it: pages read
    /// the same types the API serialises.
    pub async fn get_as<T: serde::de::DeserializeOwned>(
        &self,
        path_and_query: impl AsRef<str>,
    ) -> Result<T, ApiError> {
        let Json(value) = self.get(path_and_query).await?;
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
        let Json(value) = self.post(path, body).await?;
        serde_json::from_value(value).map_err(|e| ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            detail: format!("reading the answer: {e}"),
        })
    }

    /// `POST path` with a JSON body.
    pub async fn post(&self, path: &str, body: &Value) -> Result<Json, ApiError> {
        self.call(Method::POST, path, Some(body)).await
    }

    async fn call(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<&Value>,
    ) -> Result<Json, ApiError> {
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
        Ok(Json(value))
    }
}

/// A decoded answer, read tolerantly: a missing or mistyped field reads as absent, never as a
/// failed page. For streams' answers, which have no Rust type yet, and the message listings the
/// dead letters' and queues' pages read; the others are read with [`AdminApi::get_as`] into the
/// types the API serialises.
#[derive(Debug, Clone, Default)]
pub(crate) struct Json(pub Value);

impl Json {
    /// The value at a dotted path (`messages.pending`).
    pub fn at(&self, path: &str) -> &Value {
        let mut v = &self.0;
        for key in path.split('.') {
            v = match v {
                Value::Object(map) => map.get(key).unwrap_or(&Value::Null),
                Value::Array(items) => key
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| items.get(i))
                    .unwrap_or(&Value::Null),
                _ => &Value::Null,
            };
        }
        v
    }

    /// The first of `paths` that holds a number (or a numeric string).
    pub fn num(&self, paths: &[&str]) -> Option<f64> {
        paths.iter().find_map(|p| match self.at(p) {
            Value::Number(n) => n.as_f64(),
            Value::String(s) => s.parse().ok(),
            _ => None,
        })
    }

    /// Like [`Json::num`], as a count; 0 when absent.
    pub fn count(&self, paths: &[&str]) -> i64 {
        self.num(paths).map(|n| n as i64).unwrap_or(0)
    }

    /// The first of `paths` that holds a string (numbers and booleans are written out).
    pub fn text(&self, paths: &[&str]) -> Option<String> {
        paths.iter().find_map(|p| match self.at(p) {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            _ => None,
        })
    }

    /// The items of the first of `paths` that holds an array; the answer itself when it is one.
    pub fn list(&self, paths: &[&str]) -> Vec<Json> {
        if let Value::Array(items) = &self.0 {
            return items.iter().cloned().map(Json).collect();
        }
        paths
            .iter()
            .find_map(|p| self.at(p).as_array())
            .map(|items| items.iter().cloned().map(Json).collect())
            .unwrap_or_default()
    }
}
