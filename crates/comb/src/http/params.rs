//! Options of a request that may come as URL query parameters or as JSON members.

use crate::code::Code;
use std::collections::HashMap;

use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::Problem;

/// Path parameters; a path that cannot be decoded (not UTF-8, say) is answered as
/// problem+json like every other bad input, instead of the framework's plain text.
pub(crate) struct PathParams<T>(pub T);

impl<T, S> FromRequestParts<S> for PathParams<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(v)) => Ok(PathParams(v)),
            Err(e) => Err(Problem::bad_request(Code::ParameterInvalid, e.body_text())),
        }
    }
}

/// Named request options, from the query string or a JSON object.
pub(crate) enum Params {
    Query(HashMap<String, String>),
    Json(serde_json::Map<String, Value>),
}

fn invalid(name: &str, expected: &str) -> Problem {
    Problem::bad_request(
        Code::ParameterInvalid,
        format!("parameter `{name}` must be {expected}"),
    )
}

impl Params {
    /// A text option.
    pub(crate) fn text(&self, name: &str) -> Result<Option<String>, Problem> {
        match self {
            Params::Query(q) => Ok(q.get(name).cloned()),
            Params::Json(j) => match j.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(invalid(name, "a string")),
            },
        }
    }

    /// A non-negative integer option.
    pub(crate) fn uint(&self, name: &str) -> Result<Option<u64>, Problem> {
        let expected = "a non-negative integer";
        match self {
            Params::Query(q) => q
                .get(name)
                .map(|v| v.trim().parse::<u64>().map_err(|_| invalid(name, expected)))
                .transpose(),
            Params::Json(j) => match j.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Number(n)) => {
                    n.as_u64().map(Some).ok_or_else(|| invalid(name, expected))
                }
                Some(Value::String(s)) => s
                    .trim()
                    .parse::<u64>()
                    .map(Some)
                    .map_err(|_| invalid(name, expected)),
                Some(_) => Err(invalid(name, expected)),
            },
        }
    }

    /// A boolean option (`true`/`false`, `1`/`0`).
    pub(crate) fn flag(&self, name: &str) -> Result<Option<bool>, Problem> {
        let parse = |s: &str| match s.trim() {
            "true" | "1" => Ok(true),
            "false" | "0" => Ok(false),
            _ => Err(invalid(name, "true or false")),
        };
        match self {
            Params::Query(q) => q.get(name).map(|v| parse(v)).transpose(),
            Params::Json(j) => match j.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Bool(b)) => Ok(Some(*b)),
                Some(Value::String(s)) => parse(s).map(Some),
                Some(_) => Err(invalid(name, "true or false")),
            },
        }
    }
}

/// The query string as it arrived, or the framework's rejection of it.
pub type QueryString =
    Result<axum::extract::Query<HashMap<String, String>>, axum::extract::rejection::QueryRejection>;

/// Named options of a query string; a malformed query string is a problem.
pub fn query(q: QueryString) -> Result<Params, Problem> {
    q.map(|q| Params::Query(q.0))
        .map_err(|e| Problem::bad_request(Code::ParameterInvalid, e.body_text()))
}

/// Parses a time given as RFC 3339 (`2026-01-31T12:00:00Z`) or as a date (`2026-01-31`,
/// midnight UTC).
pub fn parse_time(name: &str, text: &str) -> Result<chrono::DateTime<chrono::Utc>, Problem> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&chrono::Utc));
    }
    if let Ok(d) = chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        return Ok(d.and_hms_opt(0, 0, 0).unwrap_or_default().and_utc());
    }
    Err(Problem::bad_request(
        Code::ParameterInvalid,
        format!(
            "parameter `{name}` must be an RFC 3339 time such as 2026-01-31T12:00:00Z or a date such as 2026-01-31, got {text:?}"
        ),
    ))
}

impl Params {
    /// A time option (see [`parse_time`]).
    pub fn time(&self, name: &str) -> Result<Option<chrono::DateTime<chrono::Utc>>, Problem> {
        self.text(name)?
            .filter(|t| !t.is_empty())
            .map(|t| parse_time(name, &t))
            .transpose()
    }

    /// The page a listing asks for (`limit`, `offset`).
    pub fn page(&self) -> Result<crate::admin::Page, Problem> {
        crate::admin::Page::new(self.uint("limit")?, self.uint("offset")?).map_err(Problem::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_and_json_agree() {
        let q = Params::Query(HashMap::from([
            ("batch".to_string(), "5".to_string()),
            ("wait".to_string(), "true".to_string()),
        ]));
        let j = Params::Json(
            serde_json::json!({"batch": 5, "wait": true})
                .as_object()
                .unwrap()
                .clone(),
        );
        for p in [q, j] {
            assert_eq!(p.uint("batch").unwrap(), Some(5));
            assert_eq!(p.flag("wait").unwrap(), Some(true));
            assert_eq!(p.uint("timeout").unwrap(), None);
        }
    }

    #[test]
    fn bad_values_are_refused() {
        let q = Params::Query(HashMap::from([
            ("batch".to_string(), "-1".to_string()),
            ("wait".to_string(), "yes".to_string()),
        ]));
        assert_eq!(q.uint("batch").unwrap_err().code, Code::ParameterInvalid);
        assert_eq!(q.flag("wait").unwrap_err().code, Code::ParameterInvalid);
        let j = Params::Json(
            serde_json::json!({"batch": 1.5})
                .as_object()
                .unwrap()
                .clone(),
        );
        assert!(j.uint("batch").is_err());
    }
}
