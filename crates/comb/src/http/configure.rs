//! `POST /api/v1/configure`: create a queue or change its options, keeping options not mentioned.

use axum::extract::State as AxState;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::body::JsonBody;
use super::{Problem, State};
use crate::queue::{OPTION_NAMES, OptionsSet, QueueOptions, validate_queue_name};

#[derive(Deserialize)]
pub struct ConfigureIn {
    queue: String,
    namespace: Option<String>,
    task: Option<String>,
    options: Option<serde_json::Map<String, serde_json::Value>>,
}

#[derive(Serialize)]
pub struct ConfigureOut {
    configured: bool,
    queue: String,
    namespace: Option<String>,
    task: Option<String>,
    options: QueueOptions,
}

/// Creates the queue if needed and merges the given options into those already set.
pub async fn configure(
    AxState(app): AxState<State>,
    principal: Option<axum::Extension<crate::auth::Principal>>,
    JsonBody(body): JsonBody<ConfigureIn>,
) -> Result<axum::Json<ConfigureOut>, Problem> {
    validate_queue_name(&body.queue).map_err(|e| Problem::bad_request("queue_name_invalid", e))?;
    crate::auth::Principal::check_queues(principal.as_deref(), [body.queue.as_str()])?;
    for (what, v) in [("namespace", &body.namespace), ("task", &body.task)] {
        if let Some(v) = v
            && (v.len() > 255 || v.chars().any(char::is_control))
        {
            return Err(Problem::bad_request(
                "field_invalid",
                format!("{what} must be at most 255 bytes without control characters"),
            ));
        }
    }
    let raw = body.options.unwrap_or_default();
    if let Some(unknown) = raw.keys().find(|k| !OPTION_NAMES.contains(&k.as_str())) {
        return Err(Problem::bad_request(
            "option_unknown",
            format!(
                "unknown queue option {unknown:?}; known options: {}",
                OPTION_NAMES.join(", ")
            ),
        ));
    }
    let set: OptionsSet = serde_json::from_value(serde_json::Value::Object(raw))
        .map_err(|e| Problem::bad_request("option_invalid", format!("invalid option: {e}")))?;
    set.validate()
        .map_err(|e| Problem::bad_request("option_invalid", e))?;
    if set.encryption_enabled == Some(true) {
        return Err(Problem::bad_request(
            "encryption_unavailable",
            "encryptionEnabled needs an encryption key in the server configuration, and this server has none",
        ));
    }
    let patch = serde_json::to_value(&set).expect("options serialize");
    let client = app.pool.get().await.map_err(crate::db::DbError::from)?;
    let row = client
        .query_one(
            "INSERT INTO comb.queues (id, name, namespace, task, options)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (name) DO UPDATE SET
                 options = comb.queues.options || EXCLUDED.options,
                 namespace = coalesce(EXCLUDED.namespace, comb.queues.namespace),
                 task = coalesce(EXCLUDED.task, comb.queues.task)
             RETURNING options, namespace, task",
            &[
                &Uuid::now_v7(),
                &body.queue,
                &body.namespace,
                &body.task,
                &patch,
            ],
        )
        .await
        .map_err(crate::db::DbError::from)?;
    let stored: serde_json::Value = row.get(0);
    let stored: OptionsSet = serde_json::from_value(stored).unwrap_or_default();
    Ok(axum::Json(ConfigureOut {
        configured: true,
        queue: body.queue,
        namespace: row.get(1),
        task: row.get(2),
        options: QueueOptions::from_set(&stored),
    }))
}
