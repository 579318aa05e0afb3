//! `POST /api/v1/configure`: create a queue or change its options, keeping options not mentioned.

use axum::extract::State as AxState;
use serde::{Deserialize, Serialize};

use super::body::JsonBody;
use super::{Problem, State};
use crate::code::Code;
use crate::queue::{OPTION_NAMES, OptionsSet, QueueName, QueueOptions};

/// A queue to create or change.
#[derive(Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = ConfigureRequest)]
pub(crate) struct ConfigureIn {
    pub(crate) queue: String,
    pub(crate) namespace: Option<String>,
    pub(crate) task: Option<String>,
    /// Options to set; those not named keep their value.
    #[schema(value_type = Option<OptionsSet>)]
    pub(crate) options: Option<serde_json::Map<String, serde_json::Value>>,
}

/// The queue as configured now, defaults filled in.
#[derive(Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = ConfigureResponse)]
pub(crate) struct ConfigureOut {
    pub(crate) configured: bool,
    pub(crate) queue: String,
    pub(crate) namespace: Option<String>,
    pub(crate) task: Option<String>,
    pub(crate) options: QueueOptions,
}

/// Create a queue or change its options.
///
/// Creates the queue if needed and merges the given options into those already set.
#[utoipa::path(
    post,
    path = "/api/v1/configure",
    tag = "queues",
    operation_id = "configure",
    request_body = ConfigureIn,
    responses((status = 200, description = "The queue as configured now.", body = ConfigureOut))
)]
pub(crate) async fn configure(
    AxState(app): AxState<State>,
    principal: Option<axum::Extension<crate::auth::Principal>>,
    JsonBody(body): JsonBody<ConfigureIn>,
) -> Result<axum::Json<ConfigureOut>, Problem> {
    QueueName::parse(body.queue.as_str())?;
    super::guard::check_queues(principal.as_deref(), std::iter::once(body.queue.as_str()))?;
    for (what, v) in [("namespace", &body.namespace), ("task", &body.task)] {
        if let Some(v) = v
            && (v.len() > 255 || v.chars().any(char::is_control))
        {
            return Err(Problem::bad_request(
                Code::FieldInvalid,
                format!("{what} must be at most 255 bytes without control characters"),
            ));
        }
    }
    let raw = body.options.unwrap_or_default();
    if let Some(unknown) = raw.keys().find(|k| !OPTION_NAMES.contains(&k.as_str())) {
        return Err(Problem::bad_request(
            Code::OptionUnknown,
            format!(
                "unknown queue option {unknown:?}; known options: {}",
                OPTION_NAMES.join(", ")
            ),
        ));
    }
    // Each option alone first, so a bad value is reported with its name.
    for (name, value) in &raw {
        let one = serde_json::Map::from_iter([(name.clone(), value.clone())]);
        serde_json::from_value::<OptionsSet>(serde_json::Value::Object(one)).map_err(|e| {
            Problem::bad_request(Code::OptionInvalid, format!("invalid option {name}: {e}"))
        })?;
    }
    let set: OptionsSet = serde_json::from_value(serde_json::Value::Object(raw))
        .map_err(|e| Problem::bad_request(Code::OptionInvalid, format!("invalid option: {e}")))?;
    set.validate()
        .map_err(|e| Problem::bad_request(Code::OptionInvalid, e))?;
    if set.encryption_enabled == Some(true) && !app.keys.can_seal() {
        return Err(Problem::bad_request(
            Code::EncryptionUnavailable,
            "encryptionEnabled needs an encryption key in the server configuration, and this server has none",
        ));
    }
    let configured = app
        .catalog
        .configure(
            &app.pool,
            &body.queue,
            body.namespace.as_deref(),
            body.task.as_deref(),
            &set,
        )
        .await?;
    Ok(axum::Json(ConfigureOut {
        configured: true,
        queue: body.queue,
        namespace: configured.namespace,
        task: configured.task,
        options: configured.options,
    }))
}
