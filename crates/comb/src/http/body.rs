//! Reading JSON bodies at the edge: size limit first, then syntax, then shape.

use crate::code::Code;
use axum::body::Body;
use axum::extract::{FromRequest, Request};
use axum::http::header;
use bytes::Bytes;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::{Problem, State};

/// A JSON body decoded into `T`, or a problem explaining what was wrong with it.
pub(crate) struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<State> for JsonBody<T> {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &State) -> Result<Self, Problem> {
        let LimitedBody(bytes) = LimitedBody::from_request(req, state).await?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// A body read whole under the size limit, for handlers that decode it with [`parse_json`]
/// into types borrowing from it (pushes keep their payloads as slices of these bytes).
pub(crate) struct LimitedBody(pub Bytes);

impl FromRequest<State> for LimitedBody {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &State) -> Result<Self, Problem> {
        let limit = state.config.max_body_bytes;
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        if declared.is_some_and(|n| n > limit) {
            return Err(too_large(limit));
        }
        read_limited(req.into_body(), limit).await.map(LimitedBody)
    }
}

/// Reads a whole body, refusing more than `limit` bytes.
pub(crate) async fn read_limited(body: Body, limit: usize) -> Result<Bytes, Problem> {
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        if e.to_string().contains("length limit") {
            too_large(limit)
        } else {
            Problem::bad_request(
                Code::BodyUnreadable,
                format!("could not read the body: {e}"),
            )
        }
    })
}

/// Decodes JSON, telling syntax errors (`json_invalid`) from shape errors (`field_invalid`).
pub(crate) fn parse_json<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, Problem> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(Problem::bad_request(
            Code::BodyMissing,
            "a JSON request body is required",
        ));
    }
    serde_json::from_slice(bytes).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => {
            Problem::bad_request(Code::FieldInvalid, format!("invalid request: {e}"))
        }
        _ => Problem::bad_request(Code::JsonInvalid, format!("malformed JSON: {e}")),
    })
}

fn too_large(limit: usize) -> Problem {
    Problem {
        // The rest of the body is left unread.
        closes_connection: true,
        ..Problem::new(
            axum::http::StatusCode::PAYLOAD_TOO_LARGE,
            Code::BodyTooLarge,
            format!("request body exceeds the limit of {limit} bytes"),
        )
    }
}
