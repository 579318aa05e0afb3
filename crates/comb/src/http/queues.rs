//! Queue resources: `DELETE /api/v1/resources/queues/{queue}`.
//!
//! Deleting a queue removes its catalog rows at once (partitions, cursors, subscriptions,
//! dead letters); its messages stop being reachable and their storage is reclaimed with the
//! segments that hold them, whole tables at a time, by maintenance.

use axum::extract::State as AxState;

use super::params::PathParams;
use serde_json::{Value, json};

use super::{Problem, State};
use crate::db::DbError;
use crate::queue::validate_queue_name;

/// Channel on which servers tell each other that catalog entries changed.
pub const CATALOG_CHANNEL: &str = "comb_catalog";

/// Deletes a queue and everything the catalog knows of it.
pub async fn delete_queue(
    AxState(app): AxState<State>,
    PathParams(queue): PathParams<String>,
) -> Result<axum::Json<Value>, Problem> {
    validate_queue_name(&queue).map_err(|e| Problem::bad_request("queue_name_invalid", e))?;
    let mut client = app.pool.get().await.map_err(DbError::from)?;
    let tx = client.transaction().await.map_err(DbError::from)?;
    let row = tx
        .query_opt(
            "DELETE FROM comb.queues WHERE name = $1 RETURNING id",
            &[&queue],
        )
        .await
        .map_err(DbError::from)?;
    let Some(row) = row else {
        return Err(Problem::not_found(
            "queue_not_found",
            format!("queue `{queue}` does not exist"),
        ));
    };
    let id: uuid::Uuid = row.get(0);
    let (partitions, dead) = {
        let cursors = tx
            .execute("DELETE FROM comb.cursors WHERE queue_id = $1", &[&id])
            .await
            .map_err(DbError::from)?;
        let dead = tx
            .execute("DELETE FROM comb.dead_letters WHERE queue_id = $1", &[&id])
            .await
            .map_err(DbError::from)?;
        (cursors, dead)
    };
    tx.execute("SELECT pg_notify($1, $2)", &[&CATALOG_CHANNEL, &queue])
        .await
        .map_err(DbError::from)?;
    tx.commit().await.map_err(DbError::from)?;
    app.catalog.forget_queue(&queue);
    tracing::info!(
        queue,
        cursors = partitions,
        dead_letters = dead,
        "queue deleted"
    );
    Ok(axum::Json(json!({"deleted": true, "queue": queue})))
}
