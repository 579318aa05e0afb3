//! Lease expiry: a lease that ended without its messages settled counts an attempt for each.

use tokio_postgres::Statement;
use uuid::Uuid;

use crate::backend::{Backend, Forms};
use crate::catalog::CURSOR_STATE;
use crate::cursor::{LOCK_EXPIRED_SQL, StateWrites, locked_cursors};
use crate::db::{DbError, Pipelined, Prepared};
use crate::dead_letter::{self, NewDeadLetter};

/// The lock of ended leases: [`LOCK_EXPIRED_SQL`], and on Citus a router statement per
/// partition, run by the coordinator (`comb.lock_expired`).
const LOCK_EXPIRED: Forms = Forms {
    postgres: LOCK_EXPIRED_SQL,
    citus: "SELECT * FROM comb.lock_expired($1, $2)",
};

/// Ends the expired leases of `group` on these partitions: counts the attempts of their
/// unsettled messages and dead-letters those past the retry limit (or, in queues that keep no
/// dead letters for that, skips them). Cursors another claim or
/// ack holds right now are skipped; they are seen again on a later pop. Runs in a transaction
/// of its own on the claim's connection (whose claim has committed): a claim never waits for
/// a second connection of the consumer pool.
pub(crate) async fn expire_leases(
    client: &deadpool_postgres::Client,
    backend: Backend,
    group: &str,
    partitions: &[Uuid],
) -> Result<Expired, DbError> {
    let statements = Statements {
        lock: client.prepare_cached(backend.sql(&LOCK_EXPIRED)).await?,
        state: client.prepare_cached(backend.sql(&CURSOR_STATE)).await?,
        states: StateWrites::prepare(client, backend).await?,
        dead: dead_letter::Writes::prepare(client, backend).await?,
        backend,
    };
    if !backend.statements_span_partitions() && partitions.len() > 1 {
        // On Citus, a partition at a time: its statements read one partition each.
        let mut all = Expired {
            discarded: 0,
            dead_lettered: 0,
        };
        for p in partitions {
            let one = Box::pin(expire_leases(
                client,
                backend,
                group,
                std::slice::from_ref(p),
            ))
            .await?;
            all.discarded += one.discarded;
            all.dead_lettered += one.dead_lettered;
        }
        return Ok(all);
    }
    let p = Pipelined::on(client);
    p.begin().await?;
    match expire_in(&p, &statements, group, partitions).await {
        Ok(done) => {
            p.commit().await?;
            crate::metrics::LEASE_DEAD_LETTERED.add(done.dead_lettered);
            Ok(done)
        }
        Err(e) => {
            p.roll_back().await;
            Err(e)
        }
    }
}

/// The statements of an expiry, prepared before its transaction begins.
struct Statements {
    lock: Statement,
    state: Statement,
    states: StateWrites,
    dead: dead_letter::Writes,
    backend: Backend,
}

/// What an expiry did to the messages of the ended leases.
pub(crate) struct Expired {
    /// Skipped at the retry limit: their queue keeps no dead letters for that.
    pub(crate) discarded: u64,
    /// Moved to the dead letters at the retry limit.
    pub(crate) dead_lettered: u64,
}

/// The expiry's reads and writes, inside its transaction.
async fn expire_in(
    client: &Pipelined<'_>,
    statements: &Statements,
    group: &str,
    partitions: &[Uuid],
) -> Result<Expired, DbError> {
    let locked: Vec<Uuid> = client
        .query(&statements.lock, &[&partitions, &group])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if locked.is_empty() {
        return Ok(Expired {
            discarded: 0,
            dead_lettered: 0,
        });
    }
    let groups: Vec<&str> = locked.iter().map(|_| group).collect();
    let one = statements.backend.one_partition(locked[0]);
    let params = crate::schema::citus::with_partition(&[&locked, &groups], &one);
    let rows = client.query(&statements.state, &params).await?;
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
            dead.push(NewDeadLetter {
                queue_id: state.queue_id,
                partition_id: *partition_id,
                group: group.clone(),
                pos,
                attempts,
                error: Some("lease expired without an ack".into()),
            });
        }
    }
    // Pipelined: one round trip for both.
    let (written, copied) = tokio::join!(
        statements.states.write(client, &cursors),
        statements.dead.write(client, &dead)
    );
    written?;
    copied?;
    Ok(Expired {
        discarded,
        dead_lettered: dead.len() as u64,
    })
}
