//! Moving consumer group cursors: clearing a queue, seeking a group.
//!
//! A move is a new cursor state version written under the cursor's row lock, like every
//! other cursor change: position set, settled and attempt sets emptied, any lease ended (its
//! acks then answer as stale). Nothing is deleted; what a move skips stays in message storage
//! until maintenance drops its segment.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::Refusal;
use crate::cursor;

/// Where a move puts cursors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// After the partition's newest message: everything there now is passed.
    End,
    /// Before the first message: everything retained is delivered again.
    Start,
    /// Before the first message pushed at or after this time.
    Time(DateTime<Utc>),
}

/// Which cursors of a queue a move takes.
#[derive(Debug, Clone, Copy)]
pub struct Selection<'a> {
    pub queue_id: Uuid,
    /// One group, or every group of the queue.
    pub group: Option<&'a str>,
    /// One partition, or every partition of the queue.
    pub partition: Option<Uuid>,
    /// Only cursors behind the target move (a later subscription start never moves a group
    /// back).
    pub forward_only: bool,
}

/// What a move did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Moved {
    /// Cursors given a new position.
    pub cursors: u64,
    /// Unsettled messages before the move, summed over the cursors moved.
    pub unsettled_before: i64,
    /// Unsettled messages after it.
    pub unsettled_after: i64,
}

/// The cursors of the selection, locked in (partition, group) order like every writer of
/// cursors.
const LOCK_SQL: &str = "
SELECT c.partition_id FROM comb.cursors c
WHERE c.queue_id = $1 AND ($2::text IS NULL OR c.consumer_group = $2)
  AND ($3::uuid IS NULL OR c.partition_id = $3)
ORDER BY c.partition_id, c.consumer_group
FOR NO KEY UPDATE";

/// The next version of each selected cursor at its target position, written from its
/// latest version (read after the lock). Moving back lowers the segment bound to 0, which
/// only costs the next read a look at older segments.
const MOVE_SQL: &str = concat!(
    "
WITH plan AS (
    SELECT c.partition_id, c.consumer_group, s.ver, s.cursor_pos, s.cursor_seg,
           cardinality(s.settled) AS settled, s.last_claimed_at, h.pos AS head, t.pos
    FROM comb.cursors c
    CROSS JOIN LATERAL comb.cursor_state(c.partition_id, c.consumer_group) s
    CROSS JOIN LATERAL ",
    crate::messages::head_of!("c.partition_id"),
    " h
    CROSS JOIN LATERAL (
        SELECT CASE $4::text
            WHEN 'end' THEN h.pos
            WHEN 'start' THEN 0::bigint
            ELSE ",
    crate::messages::position_before!("c.partition_id", "$5"),
    "
        END AS pos
    ) t
    WHERE c.queue_id = $1 AND ($2::text IS NULL OR c.consumer_group = $2)
      AND ($3::uuid IS NULL OR c.partition_id = $3)
), moved AS (
    ",
    cursor::insert_state!(),
    "
    SELECT p.partition_id, p.consumer_group, ",
    cursor::newest_gen!(),
    ", p.ver + 1,
           p.pos, CASE WHEN p.pos >= p.cursor_pos THEN p.cursor_seg ELSE 0 END,
           '{}', '{}', '{}', NULL, NULL, p.pos, '-infinity', p.last_claimed_at
    FROM plan p
    WHERE NOT $6 OR p.pos > p.cursor_pos
    RETURNING 1
)
SELECT (SELECT count(*) FROM moved),
       coalesce(sum(greatest(head - cursor_pos - settled, 0)), 0)::bigint,
       coalesce(sum(greatest(head - CASE WHEN $6 THEN greatest(pos, cursor_pos) ELSE pos END, 0)), 0)::bigint
FROM plan"
);

/// Moves the selected cursors to `target`, inside the caller's transaction.
pub async fn move_in(
    tx: &deadpool_postgres::Transaction<'_>,
    selection: Selection<'_>,
    target: Target,
) -> Result<Moved, Refusal> {
    let (kind, at): (&str, Option<DateTime<Utc>>) = match target {
        Target::End => ("end", None),
        Target::Start => ("start", None),
        Target::Time(t) => ("time", Some(t)),
    };
    let Selection {
        queue_id,
        group,
        partition,
        forward_only,
    } = selection;
    tx.query(LOCK_SQL, &[&queue_id, &group, &partition]).await?;
    let row = tx
        .query_one(
            MOVE_SQL,
            &[&queue_id, &group, &partition, &kind, &at, &forward_only],
        )
        .await?;
    Ok(Moved {
        cursors: row.get::<_, i64>(0) as u64,
        unsettled_before: row.get(1),
        unsettled_after: row.get(2),
    })
}

/// Locks the cursors of one partition (one group, or all), in group order.
const LOCK_PARTITION_SQL: &str = "
SELECT c.consumer_group FROM comb.cursors c
WHERE c.partition_id = $1 AND ($2::text IS NULL OR c.consumer_group = $2)
ORDER BY c.consumer_group
FOR NO KEY UPDATE";

/// The latest state of the cursors locked by [`LOCK_PARTITION_SQL`], read after the lock.
const PARTITION_STATE_SQL: &str = "
SELECT c.consumer_group, s.cursor_pos, s.cursor_seg, s.settled, s.attempt_pos, s.attempt_cnt,
       s.lease_id, coalesce(s.lease_expires_at > now(), false), s.lease_upto
FROM comb.cursors c CROSS JOIN LATERAL comb.cursor_state(c.partition_id, c.consumer_group) s
WHERE c.partition_id = $1 AND ($2::text IS NULL OR c.consumer_group = $2)";

/// Appends the next version of changed cursors of one partition; what the edit does not
/// decide (lease end, last claim) is carried over, and `available_at` is reset when asked.
const EDIT_SQL: &str = concat!(
    "\n",
    cursor::insert_state!(),
    "
SELECT $1, u.consumer_group, ",
    cursor::newest_gen!(),
    ", s.ver + 1,
       u.cursor_pos, u.cursor_seg, u.settled::bigint[], u.attempt_pos::bigint[],
       u.attempt_cnt::integer[], s.lease_id, s.lease_expires_at, s.lease_upto,
       CASE WHEN $8 THEN '-infinity' ELSE s.available_at END, s.last_claimed_at
FROM unnest($2::text[], $3::bigint[], $4::integer[], $5::text[], $6::text[], $7::text[])
    AS u(consumer_group, cursor_pos, cursor_seg, settled, attempt_pos, attempt_cnt)
CROSS JOIN LATERAL comb.cursor_state($1, u.consumer_group) s"
);

fn pg_array<T: std::fmt::Display>(items: impl Iterator<Item = T>) -> String {
    let parts: Vec<String> = items.map(|i| i.to_string()).collect();
    format!("{{{}}}", parts.join(","))
}

/// Edits the cursors of one partition (one group, or every group) inside the caller's
/// transaction: `edit` changes a cursor as the ack rules see it and says whether it did.
/// Returns the groups whose cursor changed.
pub async fn edit_in(
    tx: &deadpool_postgres::Transaction<'_>,
    partition: Uuid,
    group: Option<&str>,
    reset_rest: bool,
    mut edit: impl FnMut(&str, &mut crate::cursor::Cursor) -> bool,
) -> Result<Vec<String>, Refusal> {
    tx.query(LOCK_PARTITION_SQL, &[&partition, &group]).await?;
    let rows = tx.query(PARTITION_STATE_SQL, &[&partition, &group]).await?;
    let mut groups = Vec::new();
    let (mut pos, mut seg, mut settled, mut apos, mut acnt) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for r in rows {
        let name: String = r.get(0);
        let attempt_pos: Vec<i64> = r.get(4);
        let attempt_cnt: Vec<i32> = r.get(5);
        let mut cursor = crate::cursor::Cursor {
            cursor_pos: r.get(1),
            cursor_seg: r.get(2),
            settled: r.get(3),
            attempts: attempt_pos.into_iter().zip(attempt_cnt).collect(),
            lease_id: r.get(6),
            lease_live: r.get(7),
            request_lease: None,
            lease_upto: r.get(8),
            rest_ms: None,
        };
        if !edit(&name, &mut cursor) {
            continue;
        }
        pos.push(cursor.cursor_pos);
        seg.push(cursor.cursor_seg);
        settled.push(pg_array(cursor.settled.iter()));
        apos.push(pg_array(cursor.attempts.iter().map(|a| a.0)));
        acnt.push(pg_array(cursor.attempts.iter().map(|a| a.1)));
        groups.push(name);
    }
    if !groups.is_empty() {
        tx.execute(
            EDIT_SQL,
            &[
                &partition,
                &groups,
                &pos,
                &seg,
                &settled,
                &apos,
                &acnt,
                &reset_rest,
            ],
        )
        .await?;
    }
    Ok(groups)
}
