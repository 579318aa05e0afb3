//! `maxWaitTimeSeconds`: a message still pending for a group after this long goes to that
//! group's dead-letter queue, and the group's position moves on. Cursors under a live lease
//! are left alone (their consumer is working); they are looked at again once it ends.

use deadpool_postgres::Client;

use crate::ack::{DeadLetter, locked_cursors, write_back};
use crate::db::DbError;

/// Cursors whose next message is overdue, locked (busy ones skipped), in the column layout of
/// `ack::locked_cursors`.
const OVERDUE_CURSORS_SQL: &str = "
SELECT c.partition_id, c.consumer_group, c.cursor_pos, c.cursor_seg, c.settled,
       c.attempt_pos, c.attempt_cnt, c.lease_id, false, c.lease_upto, q.options, q.id
FROM comb.cursors c
JOIN comb.queues q ON q.id = c.queue_id
JOIN comb.partitions p ON p.id = c.partition_id
WHERE coalesce((q.options->>'maxWaitTimeSeconds')::float8, 0) > 0
  AND p.head_pos > c.cursor_pos
  AND c.lease_id IS NULL
  AND (SELECT m.created_at FROM comb.messages m
       WHERE m.partition_id = c.partition_id AND m.pos > c.cursor_pos AND m.seg >= c.cursor_seg
       ORDER BY m.pos LIMIT 1)
      < now() - make_interval(secs => (q.options->>'maxWaitTimeSeconds')::float8)
ORDER BY c.partition_id, c.consumer_group
LIMIT 1000
FOR NO KEY UPDATE OF c SKIP LOCKED";

/// Overdue messages of one partition after a position (a prefix: times grow with positions).
const OVERDUE_MESSAGES_SQL: &str = "
SELECT m.pos, m.seg FROM comb.messages m
WHERE m.partition_id = $1 AND m.pos > $2 AND m.seg >= $3
  AND m.created_at < now() - make_interval(secs => $4::float8)
ORDER BY m.pos
LIMIT 10000";

/// Dead-letters overdue messages; returns how many.
pub async fn dead_letter_overdue(client: &mut Client) -> Result<i64, DbError> {
    let tx = client.transaction().await?;
    let rows = tx.query(OVERDUE_CURSORS_SQL, &[]).await?;
    if rows.is_empty() {
        return Ok(0);
    }
    let mut cursors = locked_cursors(&rows);
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
            let (pos, seg): (i64, i32) = (r.get(0), r.get(1));
            if pos <= state.cursor.cursor_pos || state.cursor.settled.binary_search(&pos).is_ok() {
                continue;
            }
            dead.push(DeadLetter {
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
    write_back(&tx, &cursors, &dead).await?;
    tx.commit().await?;
    Ok(dead.len() as i64)
}
