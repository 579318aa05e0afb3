//! Queue definitions: create or configure a queue, delete it.
//!
//! Deleting a queue removes its catalog rows at once (partitions, cursors, subscriptions,
//! dead letters); its messages stop being reachable and their storage is reclaimed with the
//! segments that hold them, whole tables at a time, by maintenance.

use uuid::Uuid;

use super::Catalog;
use crate::code::Code;
use crate::db::DbError;
use crate::queue::{OptionsSet, QueueOptions};
use crate::refusal::Refusal;
use crate::wake;

/// A queue as configured: its options with defaults filled in.
pub(crate) struct Configured {
    pub(crate) namespace: Option<String>,
    pub(crate) task: Option<String>,
    pub(crate) options: QueueOptions,
}

impl Catalog {
    /// Creates the queue if needed and merges `set` into the options already stored: options
    /// left out keep their values. `namespace` and `task` change only when given.
    pub(crate) async fn configure(
        &self,
        pool: &deadpool_postgres::Pool,
        queue: &str,
        namespace: Option<&str>,
        task: Option<&str>,
        set: &OptionsSet,
    ) -> Result<Configured, Refusal> {
        let patch = serde_json::to_value(set).expect("options serialize");
        let client = pool.get().await.map_err(DbError::from)?;
        let row = client
            .query_one(
                "INSERT INTO comb.queues (id, name, namespace, task, options)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (name) DO UPDATE SET
                     options = comb.queues.options || EXCLUDED.options,
                     namespace = coalesce(EXCLUDED.namespace, comb.queues.namespace),
                     task = coalesce(EXCLUDED.task, comb.queues.task)
                 RETURNING options, namespace, task, id",
                &[&Uuid::now_v7(), &queue, &namespace, &task, &patch],
            )
            .await
            .map_err(DbError::from)?;
        // This server's next push sees the new options at once (others within a second).
        self.forget_options(row.get("id"));
        let stored: serde_json::Value = row.get("options");
        let stored: OptionsSet = serde_json::from_value(stored).unwrap_or_default();
        Ok(Configured {
            namespace: row.get("namespace"),
            task: row.get("task"),
            options: QueueOptions::from_set(&stored),
        })
    }

    /// Deletes a queue and everything the catalog knows of it, and tells every server.
    pub(crate) async fn delete_queue(
        &self,
        pool: &deadpool_postgres::Pool,
        queue: &str,
    ) -> Result<(), Refusal> {
        let mut client = pool.get().await.map_err(DbError::from)?;
        let tx = client.transaction().await.map_err(DbError::from)?;
        let row = tx
            .query_opt(
                "DELETE FROM comb.queues WHERE name = $1 RETURNING id",
                &[&queue],
            )
            .await
            .map_err(DbError::from)?;
        let Some(row) = row else {
            return Err(Refusal::not_found(
                Code::QueueNotFound,
                format!("queue `{queue}` does not exist"),
            ));
        };
        let id: Uuid = row.get(0);
        let cursors = crate::cursor::delete_of_queue(&tx, id)
            .await
            .map_err(DbError::from)?;
        let dead = tx
            .execute("DELETE FROM comb.dead_letters WHERE queue_id = $1", &[&id])
            .await
            .map_err(DbError::from)?;
        wake::announce_queue_deleted(&tx, queue)
            .await
            .map_err(DbError::from)?;
        tx.commit().await.map_err(DbError::from)?;
        self.forget_queue(queue);
        tracing::info!(queue, cursors, dead_letters = dead, "queue deleted");
        Ok(())
    }
}
