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

use deadpool_postgres::Client;

use super::locks::{give_way, give_way_counting, lock_timeout_sql};
use super::statistics::PARTITIONS_PER_GENERATION;
use super::{Report, Settings};
use crate::db::DbError;

fn table(generation: i32) -> String {
    format!("comb.cursor_states_{generation}")
}

fn stream_table(generation: i32) -> String {
    format!("comb.stream_states_{generation}")
}

async fn exists(client: &Client, table: &str) -> Result<bool, DbError> {
    Ok(client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
        .await?
        .get(0))
}

/// Every generation, oldest first, and how long ago the newest was started.
async fn generations(client: &Client) -> Result<(Vec<i32>, f64), DbError> {
    let rows = client
        .query(
            "SELECT gen, extract(epoch FROM now() - created_at)::float8
             FROM comb.cursor_gens ORDER BY gen",
            &[],
        )
        .await?;
    let age = rows.last().map_or(0.0, |r| r.get(1));
    Ok((rows.iter().map(|r| r.get(0)).collect(), age))
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
    let s = stream_table(next);
    if !exists(client, &s).await? {
        let sql = format!(
            "BEGIN; {lt};
             CREATE TABLE {s} (LIKE comb.stream_states INCLUDING DEFAULTS INCLUDING STORAGE);
             CREATE INDEX ON {s} (partition_id, query_id, gen, ver);
             ALTER TABLE {s} ADD CONSTRAINT stream_states_{next}_gen
                 CHECK (gen >= {next} AND gen < {end});
             ALTER TABLE comb.stream_states ATTACH PARTITION {s} FOR VALUES FROM ({next}) TO ({end});
             COMMIT;",
            lt = lock_timeout_sql(settings),
            end = next + 1
        );
        give_way(client, &sql).await?;
    }
    let t = table(next);
    if exists(client, &t).await? {
        return Ok(());
    }
    // Built standalone and then attached: ATTACH takes only SHARE UPDATE EXCLUSIVE on the
    // parent, which neither readers nor writers conflict with, where CREATE … PARTITION OF
    // would queue an ACCESS EXCLUSIVE lock in front of all traffic. The indexes match the
    // parent's, so ATTACH adopts them instead of building its own; the CHECK constraint
    // spares it a validation scan.
    let sql = format!(
        "BEGIN; {lt};
         CREATE TABLE {t} (LIKE comb.cursor_states INCLUDING DEFAULTS INCLUDING STORAGE);
         CREATE INDEX ON {t} (partition_id, consumer_group, gen, ver);
         CREATE INDEX ON {t} (lease_id) WHERE lease_id IS NOT NULL;
         ALTER TABLE {t} ALTER COLUMN partition_id SET (n_distinct = {PARTITIONS_PER_GENERATION});
         ALTER TABLE {t} ADD CONSTRAINT cursor_states_{next}_gen
             CHECK (gen >= {next} AND gen < {end});
         ALTER TABLE comb.cursor_states ATTACH PARTITION {t} FOR VALUES FROM ({next}) TO ({end});
         COMMIT;",
        lt = lock_timeout_sql(settings),
        end = next + 1
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
    let ready = exists(client, &table(next)).await? && exists(client, &stream_table(next)).await?;
    if ready {
        client
            .execute(
                "INSERT INTO comb.cursor_gens (gen) VALUES ($1) ON CONFLICT DO NOTHING",
                &[&next],
            )
            .await?;
        tracing::info!(generation = next, "cursor state generation started");
    }
    Ok(())
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
        .query(
            "SELECT quote_ident(attname) FROM pg_attribute
             WHERE attrelid = 'comb.cursor_states'::regclass AND attnum > 0 AND NOT attisdropped
             ORDER BY attnum",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let values: Vec<String> = columns
        .iter()
        .map(|c| {
            if c == "gen" {
                newest.to_string()
            } else {
                format!("s.{c}")
            }
        })
        .collect();
    for &generation in older {
        let t = table(generation);
        // SHARE waits for any writer still inserting into the old generation (its statement
        // chose it just before the newest took over) and keeps new ones out; readers go on.
        // The copy starts from the cursors that exist, so states of deleted queues stay
        // behind, and skips cursors that already have this version or a later one in a newer
        // generation. (`gen >= n + 1` rather than `gen > n`: only the former prunes `n`.)
        // The latest version is ordered by (gen, ver), as the index is: by `ver` alone the
        // planner would read and sort every version of the cursor.
        let sql = format!(
            "BEGIN; {lt}; LOCK TABLE {t} IN SHARE MODE;
             INSERT INTO {into} ({columns})
             SELECT {values}
             FROM comb.cursors c
             CROSS JOIN LATERAL (
                 SELECT * FROM {t} s
                 WHERE s.partition_id = c.partition_id AND s.consumer_group = c.consumer_group
                 ORDER BY s.gen DESC, s.ver DESC LIMIT 1
             ) s
             WHERE NOT EXISTS (
                 SELECT 1 FROM comb.cursor_states n
                 WHERE n.gen >= {newer}
                   AND n.partition_id = s.partition_id
                   AND n.consumer_group = s.consumer_group
                   AND n.ver >= s.ver);
             DROP TABLE {t};
             DELETE FROM comb.cursor_gens WHERE gen = {generation};
             COMMIT;",
            lt = lock_timeout_sql(settings),
            into = table(newest),
            columns = columns.join(", "),
            values = values.join(", "),
            newer = generation + 1,
        );
        match give_way_counting(client, &sql).await? {
            Some(counts) => {
                // BEGIN, SET, LOCK, then the copy.
                let carried = counts.get(3).copied().unwrap_or(0) as i64;
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
/// still exists out of each generation older than the newest, then drops that generation's
/// `comb.stream_states` table. Runs over the tables that exist, so a drop that had to give
/// way is tried again next cycle even after the cursors' table of that generation is gone.
pub(crate) async fn carry_streams_forward_and_drop(
    client: &Client,
    settings: &Settings,
) -> Result<(), DbError> {
    let (gens, _) = generations(client).await?;
    let Some(&newest) = gens.last() else {
        return Ok(());
    };
    let older: Vec<i32> = client
        .query(
            "SELECT substr(c.relname, length('stream_states_') + 1)::integer AS gen
             FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = 'comb.stream_states'::regclass
             ORDER BY 1",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get::<_, i32>(0))
        .filter(|&g| g < newest)
        .collect();
    for generation in older {
        let t = stream_table(generation);
        let sql = format!(
            "BEGIN; {lt}; LOCK TABLE {t} IN SHARE MODE;
             INSERT INTO {into} (partition_id, query_id, gen, ver, state, updated, keys, bytes,
                                 written_at)
             SELECT s.partition_id, s.query_id, {newest}, s.ver, s.state, s.updated, s.keys,
                    s.bytes, s.written_at
             FROM comb.stream_partitions sp
             JOIN comb.stream_queries q ON q.id = sp.query_id
             CROSS JOIN LATERAL (
                 SELECT * FROM {t} s
                 WHERE s.partition_id = sp.partition_id AND s.query_id = sp.query_id
                 ORDER BY s.gen DESC, s.ver DESC LIMIT 1
             ) s
             WHERE q.id = (SELECT n.id FROM comb.stream_queries n WHERE n.name = q.name
                           ORDER BY n.registered_at DESC LIMIT 1)
               AND EXISTS (SELECT 1 FROM comb.partitions p WHERE p.id = sp.partition_id)
               AND NOT EXISTS (
                 SELECT 1 FROM comb.stream_states n
                 WHERE n.gen >= {newer}
                   AND n.partition_id = s.partition_id
                   AND n.query_id = s.query_id
                   AND n.ver >= s.ver);
             DROP TABLE {t};
             COMMIT;",
            lt = lock_timeout_sql(settings),
            into = stream_table(newest),
            newer = generation + 1,
        );
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
