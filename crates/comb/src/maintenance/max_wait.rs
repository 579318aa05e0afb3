//! `maxWaitTimeSeconds`: a message still pending for a group after this long goes to that
//! group's dead-letter queue, and the group's position moves on. Cursors under a live lease
//! are left alone (their consumer is working); they are looked at again once it ends.

use deadpool_postgres::Client;

use crate::backend::Backend;
use crate::catalog::{CURSOR_STATE, CURSOR_STATE_SQL};
use crate::cursor::{StateWrites, locked_cursors};
use crate::db::DbError;
use crate::dead_letter::{self, NewDeadLetter};

/// Cursors whose next message is overdue, locked (busy ones skipped); their state is read
/// afterwards with `catalog::CURSOR_STATE_SQL`.
static OVERDUE_CURSORS_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "
SELECT c.partition_id, c.consumer_group
FROM {cursors}
{queue}
CROSS JOIN LATERAL {head} h
WHERE coalesce((q.options->>'maxWaitTimeSeconds')::float8, 0) > 0
  AND h.pos > s.cursor_pos
  AND s.lease_id IS NULL
  AND (SELECT m.created_at FROM {messages}
       AND m.pos > s.cursor_pos AND m.seg >= s.cursor_seg
       ORDER BY m.pos LIMIT 1)
      < now() - make_interval(secs => (q.options->>'maxWaitTimeSeconds')::float8)
ORDER BY c.partition_id, c.consumer_group
LIMIT 1000
FOR NO KEY UPDATE OF c SKIP LOCKED",
        cursors = crate::cursor::cursors_with_state(false),
        head = crate::messages::head_of!("c.partition_id"),
        messages = crate::messages::partition_messages!("c.partition_id"),
        queue = crate::catalog::join_queue!("c.queue_id"),
    )
});

/// [`OVERDUE_CURSORS_SQL`] on Citus, where rows are locked only by a statement of one shard:
/// the overdue cursors listed across the workers without locking (the head's test is implied
/// by an overdue next message), then locked by the coordinator a partition at a time
/// (`comb.lock_cursors`, which waits for a busy cursor instead of skipping it).
static OVERDUE_CURSORS_CITUS_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "
SELECT c.partition_id, c.consumer_group
FROM {cursors}
{queue}
WHERE coalesce((q.options->>'maxWaitTimeSeconds')::float8, 0) > 0
  AND s.lease_id IS NULL
  AND (SELECT m.created_at FROM {messages}
       AND m.pos > s.cursor_pos AND m.seg >= s.cursor_seg
       ORDER BY m.pos LIMIT 1)
      < now() - make_interval(secs => (q.options->>'maxWaitTimeSeconds')::float8)
ORDER BY c.partition_id, c.consumer_group
LIMIT 1000",
        cursors = crate::cursor::cursors_with_state(true),
        messages = crate::messages::partition_messages!("c.partition_id"),
        queue = crate::catalog::join_queue!("c.queue_id"),
    )
});

/// Overdue messages of one partition after a position (a prefix: times grow with positions).
const OVERDUE_MESSAGES_SQL: &str = concat!(
    "
SELECT m.pos, m.seg FROM ",
    crate::messages::partition_messages!("$1"),
    " AND m.pos > $2 AND m.seg >= $3
  AND m.created_at < now() - make_interval(secs => $4::float8)
ORDER BY m.pos
LIMIT 10000"
);

/// Dead-letters overdue messages; returns how many.
pub(crate) async fn dead_letter_overdue(
    client: &mut Client,
    backend: Backend,
) -> Result<i64, DbError> {
    let citus = backend.rows_lock_in_one_shard_only();
    let tx = client.transaction().await?;
    let overdue = tx
        .query(
            if citus {
                OVERDUE_CURSORS_CITUS_SQL.as_str()
            } else {
                OVERDUE_CURSORS_SQL.as_str()
            },
            &[],
        )
        .await?;
    if overdue.is_empty() {
        return Ok(0);
    }
    let pids: Vec<uuid::Uuid> = overdue.iter().map(|r| r.get("partition_id")).collect();
    let groups: Vec<String> = overdue.iter().map(|r| r.get("consumer_group")).collect();
    let rows = if citus {
        tx.query(backend.sql(&crate::cursor::LOCK), &[&pids, &groups])
            .await?;
        // The state a partition at a time, each read on its partition's worker.
        let mut rows = Vec::new();
        for (p, g) in pids.iter().zip(&groups) {
            rows.extend(
                tx.query(
                    backend.sql(&CURSOR_STATE),
                    &[&vec![*p], &vec![g.as_str()], p],
                )
                .await?,
            );
        }
        rows
    } else {
        tx.query(CURSOR_STATE_SQL, &[&pids, &groups]).await?
    };
    let mut cursors = locked_cursors(&rows);
    // Read again under the lock: a lease taken meanwhile leaves the cursor to its consumer.
    cursors.retain(|_, l| l.cursor.lease_id.is_none());
    let mut dead = Vec::new();
    for ((partition_id, group), state) in cursors.iter_mut() {
        let max_wait = state.options.max_wait_time_seconds as f64;
        let overdue = tx
            .query(
                OVERDUE_MESSAGES_SQL,
                &[
                    partition_id,
                    &state.cursor.cursor_pos,
                    &state.cursor.cursor_seg,
                    &max_wait,
                ],
            )
            .await?;
        for r in overdue {
            let (pos, seg): (i64, i32) = (r.get("pos"), r.get("seg"));
            if pos <= state.cursor.cursor_pos || state.cursor.settled.binary_search(&pos).is_ok() {
                continue;
            }
            dead.push(NewDeadLetter {
                queue_id: state.queue_id,
                partition_id: *partition_id,
                group: group.clone(),
                pos,
                attempts: state.cursor.attempts_of(pos),
                error: Some(format!(
                    "pending longer than maxWaitTimeSeconds ({max_wait} s)"
                )),
            });
            state.cursor.settle(pos, seg);
            state.changed = true;
        }
    }
    let states = StateWrites::prepare(&tx, backend).await?;
    let letters = dead_letter::Writes::prepare(&tx, backend).await?;
    let (written, copied) = tokio::join!(states.write(&tx, &cursors), letters.write(&tx, &dead));
    written?;
    copied?;
    tx.commit().await?;
    Ok(dead.len() as i64)
}
