//! Generations of cursor state: one table per period, reclaimed whole.
//!
//! Pops and acks never update a cursor's state: each change inserts a new version into the
//! newest generation (`comb.cursor_states_<gen>`). Old versions would pile up as dead weight
//! for readers and vacuum alike, so every `generation_seconds` a new generation (made a
//! cycle ahead) takes over, and each older one is emptied of what still matters — the
//! latest version of every cursor that still exists, copied forward with its number — and
//! then dropped as a table. Nothing is ever updated or deleted row by row.
//!
//! The copy may race with writers: a writer that read version v and writes v + 1 into the
//! newest generation while v is being carried is harmless, because the highest version is
//! the state.
//!
//! The state versions of streams queries (`comb.stream_states`) live in the same
//! generations: each has a table per generation, made ahead with the cursors' one, and the
//! newest version of every pair whose query is current is carried forward before the old
//! table is dropped (a query registered again after a reset leaves its old state behind).
//! A stream state table lives through `stream_state_generations` generations, not one:
//! large states change a few keys at a time, and every key still current in a dropped table
//! is copied, so keeping tables longer copies each unchanged key that much less often.

use deadpool_postgres::Client;

use super::locks::{give_way, give_way_counting, lock_timeout_sql};
use super::statistics::PARTITIONS_PER_GENERATION;
use super::{Report, Settings};
use crate::db::DbError;

use crate::cursor::generations::{self as statements, table};
use crate::streams::generations as streams;

async fn exists(client: &Client, table: &str) -> Result<bool, DbError> {
    Ok(client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
        .await?
        .get(0))
}

/// Every generation, oldest first, and how long ago the newest was started.
async fn generations(client: &Client) -> Result<(Vec<i32>, f64), DbError> {
    let rows = client.query(statements::LIST_SQL, &[]).await?;
    let age = rows.last().map_or(0.0, |r| r.get("age"));
    Ok((rows.iter().map(|r| r.get("gen")).collect(), age))
}

/// Makes sure the table of the generation after the newest exists.
///
/// It is attached a cycle or more before writers are sent to it: ATTACH does not conflict
/// with their locks, so a session may go on routing rows with the partitions it saw before
/// the ATTACH for as long as it keeps its lock on `comb.cursor_states` — a statement that
/// took its snapshot just after a combined ATTACH and switch, or a transaction already
/// holding the lock, would pick a generation it has no partition for.
pub(crate) async fn make_ahead(
    client: &Client,
    settings: &Settings,
    report: &mut Report,
) -> Result<(), DbError> {
    let (gens, _) = generations(client).await?;
    let Some(&newest) = gens.last() else {
        return Ok(());
    };
    let next = newest + 1;
    let s = streams::table(next);
    if !exists(client, &s).await? {
        let sql = streams::make_ahead_sql(next, &lock_timeout_sql(settings));
        give_way(client, &sql).await?;
    }
    let t = table(next);
    if exists(client, &t).await? {
        return Ok(());
    }
    let sql = format!(
        "BEGIN; {lt};\n{make}\nCOMMIT;",
        lt = lock_timeout_sql(settings),
        make = statements::make_sql(next, PARTITIONS_PER_GENERATION),
    );
    if give_way(client, &sql).await? {
        report.generations_created += 1;
    }
    Ok(())
}

/// Sends writers to the next generation once the newest is `generation_seconds` old and the
/// next one's table exists. Writers pick the newest generation inside their own statements,
/// so the switch is the commit of its `cursor_gens` row.
pub(crate) async fn rotate(client: &Client, settings: &Settings) -> Result<(), DbError> {
    let (gens, age) = generations(client).await?;
    let Some(&newest) = gens.last() else {
        return Ok(());
    };
    if age < settings.generation_seconds as f64 {
        return Ok(());
    }
    let next = newest + 1;
    // Writers of both kinds of state must find the generation's table.
    let ready =
        exists(client, &table(next)).await? && exists(client, &streams::table(next)).await?;
    if ready {
        client.execute(statements::START_SQL, &[&next]).await?;
        tracing::info!(generation = next, "cursor state generation started");
    }
    Ok(())
}

/// The lock a generation's drop takes first on Citus: the whole state table's, in the mode
/// its `DROP` needs, before the old generation's `SHARE`. Empty on PostgreSQL.
///
/// A delegated call (`comb.claim_partition`, `comb.judge_acks`, `comb.extend_lease`) reads
/// the state, then inserts a version, on its worker alone, where Citus locks every partition
/// of a partitioned table it writes (`ROW EXCLUSIVE` on each generation, the old one too).
/// With the old generation's `SHARE` taken first (as on PostgreSQL) and propagated to the
/// workers, the drop then waited for the call's read lock on `comb.cursor_states` while the
/// call waited for the old generation behind the `SHARE`: a deadlock on the worker, which
/// Citus's detector does not see and the worker's broke by cancelling one of the two. Taken
/// parent first, in the drop's mode, maintenance holds nothing a call waits for until it has
/// every lock it needs: it waits for calls in flight (giving way on the coordinator under its
/// lock timeout) and later calls wait for it, as behind the `DROP` itself. On PostgreSQL an
/// insert locks only the generation it writes, the `DROP` queues behind readers without a
/// cycle, and writers of the newest generation go on during the copy.
fn first_lock(settings: &Settings) -> String {
    if settings.backend.drops_lock_the_parent_first() {
        format!("{};\n", statements::LOCK_ALL_SQL)
    } else {
        String::new()
    }
}

/// Carries the latest state of every live cursor out of each generation older than the
/// newest, then drops that generation's table.
pub(crate) async fn carry_forward_and_drop(
    client: &Client,
    settings: &Settings,
    report: &mut Report,
) -> Result<(), DbError> {
    let (gens, _) = generations(client).await?;
    let Some((&newest, older)) = gens.split_last() else {
        return Ok(());
    };
    if older.is_empty() {
        return Ok(());
    }
    // Every column, so that a column added to the state later is carried too.
    let columns: Vec<String> = client
        .query(statements::COLUMNS_SQL, &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let first = first_lock(settings);
    for &generation in older {
        // BEGIN, SET, then the locks and the copy (see `carry_forward_sql`).
        let sql = format!(
            "BEGIN; {lt}; {first}{carry}\nCOMMIT;",
            lt = lock_timeout_sql(settings),
            carry = statements::carry_forward_sql(generation, newest, &columns),
        );
        match give_way_counting(client, &sql).await? {
            Some(counts) => {
                // BEGIN, SET, the locks, then the copy.
                let at = if first.is_empty() { 3 } else { 4 };
                let carried = counts.get(at).copied().unwrap_or(0) as i64;
                tracing::info!(generation, carried, "dropped cursor state generation");
                report.generations_dropped += 1;
                report.states_carried += carried;
            }
            None => {
                tracing::info!(generation, "generation busy; dropping it next cycle");
                report.drop_retries += 1;
                // Whatever held the lock would most likely hold up the next drop too: give
                // way to traffic for the rest of this cycle.
                break;
            }
        }
    }
    Ok(())
}

/// Carries the newest state version of every current streams query on every partition that
/// still exists out of each generation `stream_state_generations` or more older than the
/// newest, then drops that generation's `comb.stream_states` table. Runs over the tables that exist, so a drop that had to give
/// way is tried again next cycle even after the cursors' table of that generation is gone.
pub(crate) async fn carry_streams_forward_and_drop(
    client: &Client,
    settings: &Settings,
) -> Result<(), DbError> {
    let (gens, _) = generations(client).await?;
    let Some(&newest) = gens.last() else {
        return Ok(());
    };
    let kept = i32::try_from(settings.stream_state_generations.max(1)).unwrap_or(i32::MAX);
    let older: Vec<i32> = client
        .query(streams::LIST_SQL, &[])
        .await?
        .iter()
        .map(|r| r.get::<_, i32>(0))
        .filter(|&g| g <= newest - kept)
        .collect();
    for generation in older {
        let sql = streams::carry_forward_sql(generation, newest, &lock_timeout_sql(settings));
        if !give_way(client, &sql).await? {
            tracing::info!(
                generation,
                "stream state generation busy; dropping it next cycle"
            );
            break;
        }
        tracing::info!(generation, "dropped stream state generation");
    }
    Ok(())
}
