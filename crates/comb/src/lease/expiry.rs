//! Lease expiry: a lease that ended without its messages settled counts an attempt for each.

use deadpool_postgres::Pool;
use uuid::Uuid;

use crate::ack::{DeadLetter, STATE_SQL, WriteStatements, locked_cursors, write_back};
use crate::db::{self, DbError};

/// Like [`LOCK_SQL`] for the cursors of one group whose lease ended, skipping busy ones.
const EXPIRED_LOCK_SQL: &str = "
SELECT c.partition_id FROM comb.cursors c
CROSS JOIN LATERAL comb.cursor_state(c.partition_id, c.consumer_group) s
WHERE c.partition_id = ANY($1) AND c.consumer_group = $2
  AND s.lease_id IS NOT NULL AND s.lease_expires_at <= now()
ORDER BY c.partition_id
FOR NO KEY UPDATE OF c SKIP LOCKED";

/// Ends the expired leases of `group` on these partitions: counts the attempts of their
/// unsettled messages and dead-letters those at the retry limit (or, in queues that keep no
/// dead letters for that, skips them: their number is returned). Cursors another claim or
/// ack holds right now are skipped; they are seen again on a later pop.
pub(crate) async fn expire_leases(
    pool: &Pool,
    group: &str,
    partitions: &[Uuid],
) -> Result<u64, DbError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    tx.batch_execute(db::consumer_plans!()).await?;
    let stmt = tx.prepare_cached(EXPIRED_LOCK_SQL).await?;
    let state = tx.prepare_cached(STATE_SQL).await?;
    let locked: Vec<Uuid> = tx
        .query(&stmt, &[&partitions, &group])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if locked.is_empty() {
        return Ok(0);
    }
    let groups: Vec<&str> = locked.iter().map(|_| group).collect();
    let rows = tx.query(&state, &[&locked, &groups]).await?;
    let mut cursors = locked_cursors(&rows);
    // Read again under the lock: only leases still ended are expired.
    cursors.retain(|_, l| l.cursor.lease_id.is_some() && !l.cursor.lease_live);
    let mut dead = Vec::new();
    let mut discarded = 0;
    for ((partition_id, group), state) in cursors.iter_mut() {
        state.changed = true;
        for (pos, attempts) in state.cursor.expire(&state.options) {
            if !state.options.dead_letters_exhausted() {
                discarded += 1;
                continue;
            }
            dead.push(DeadLetter {
                queue_id: state.queue_id,
                partition_id: *partition_id,
                group: group.clone(),
                pos,
                attempts,
                error: Some("lease expired without an ack".into()),
            });
        }
    }
    let writes = WriteStatements::prepare(&tx).await?;
    write_back(&tx, &writes, &cursors, &dead).await?;
    tx.commit().await?;
    crate::metrics::LEASE_DEAD_LETTERED.add(dead.len() as u64);
    Ok(discarded)
}
