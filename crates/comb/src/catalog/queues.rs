//! Queue definitions: create or configure a queue, delete its row.
//!
//! Deleting a queue (`admin::resources::delete_queue`) removes its row here (its partitions and
//! subscriptions go with it) and, in the same transaction, its cursors and dead letters through
//! their owners; its messages stop being reachable and their storage is reclaimed with the
//! segments that hold them, whole tables at a time, by maintenance.

use deadpool_postgres::GenericClient;
use uuid::Uuid;

use super::Catalog;
use crate::code::Code;
use crate::db::DbError;
use crate::queue::{OptionsSet, QueueOptions};
use crate::refusal::Refusal;

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

    /// Deletes the queue's row in `tx` and returns its id, or refuses when there is none.
    /// The rows of the queue in other owners' tables are deleted by the use case that calls
    /// this (`admin::resources::delete_queue`), in the same transaction; once it commits,
    /// [`Catalog::forget_queue`] drops what this server cached.
    pub(crate) async fn delete_queue_row<C: GenericClient>(
        tx: &C,
        queue: &str,
    ) -> Result<Uuid, Refusal> {
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
        Ok(row.get("id"))
    }
}
