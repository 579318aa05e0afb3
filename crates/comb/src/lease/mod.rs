//! Leases: a consumer still working keeps its partition for longer ([`extend`]); a lease
//! that ended unsettled is counted against its messages ([`expiry`]).
//!
//! A lease lives in its cursor's latest state version, so extending it appends a version with
//! the new end, under the cursor's row lock like every other writer. An ended lease is never
//! revived: its partition may already be with another consumer.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use crate::auth::Principal;
use crate::backend::Backend;
use crate::cursor;
use crate::db::DbError;

mod expiry;
mod granted;

pub(crate) use expiry::expire_leases;
pub(crate) use granted::{entries as granted_entries, granted};

/// The cursors a lease id was ever written to (any version holds it), with their queues.
const FIND_SQL: &str = concat!(
    "
SELECT s.partition_id, s.consumer_group, q.name AS queue
FROM (",
    cursor::lease_holders!(),
    ") s
",
    crate::catalog::join_partition_and_queue!("s.partition_id"),
    "
WHERE $2::uuid IS NULL OR s.partition_id = $2"
);

/// The next version with the new end, as the extension's insert selects it: the state read
/// from `$state`, the queue's options by `$options`, into generation `$gen`; nothing unless
/// the lease is still the cursor's and still live. The lease's digest goes along: the
/// extension moves nothing, so the lease's ids are still those its claim digested.
macro_rules! extend_select {
    (state: $($state:expr),+; options: $($options:expr),+; gen: $gen:expr) => {
        concat!(
            "SELECT s.partition_id, s.consumer_group, ",
            $gen,
            ", s.ver + 1,
       s.cursor_pos, s.cursor_seg, s.settled, s.attempt_pos, s.attempt_cnt, s.lease_id,
       now() + make_interval(secs => coalesce($4::float8,
           (",
            $($options),+,
            "->>'leaseTime')::float8, 300)),
       s.lease_upto, s.available_at, s.last_claimed_at, s.lease_digest
FROM ",
            $($state),+,
            " s
WHERE s.lease_id = $3 AND s.lease_expires_at > now()"
        )
    };
}

/// Appends the version with the new end, if the lease is still the cursor's and still live:
/// the state read from `$state`, the queue's options by `$options`.
macro_rules! extend_sql {
    (state: $($state:expr),+; options: $($options:expr),+) => {
        concat!(
            "\n",
            cursor::insert_leased_state!(),
            "\n",
            extend_select!(state: $($state),+; options: $($options),+;
                gen: cursor::newest_gen!()),
            "\nRETURNING lease_expires_at"
        )
    };
}

/// Appends the version with the new end, if the lease is still the cursor's and still live.
const EXTEND_SQL: &str = extend_sql!(
    state: cursor::state_of!("$1", "$2");
    options: crate::catalog::options_of_partition!("s.partition_id")
);

/// The extension of a lease on one cursor on Citus as one function of its partition
/// (`a_partition`), made by `comb migrate` ([`crate::schema::citus::delegate`]) and called
/// alone, outside a transaction block: Citus sends the call to the partition's worker, which
/// locks the cursor ([`cursor::LOCK_ONE_SQL`]), reads the new version into variables and
/// inserts them ([`cursor::StateByValues`]), each a router statement of its shards, a
/// transaction committed there in one phase. Sent from the coordinator, the insert of the new
/// version (an `INSERT … SELECT` with a limit) was pulled through the coordinator and the
/// extension committed in two phases; as one `INSERT … SELECT` on the worker, its steps' results
/// went to every node and the worker committed in two phases.
pub(crate) static EXTEND_CITUS_FUNCTION: LazyLock<String> = LazyLock::new(|| {
    let lock = cursor::lock_one!("$1", "$2");
    // The state read by a subquery rather than `comb.cursor_state` (a function reading a
    // distributed table, which would run on the coordinator), the partition named to every
    // distributed table, the newest generation the function's variable.
    let select = extend_select!(
        state: cursor::state_in_partition!("$1", "$2");
        options: crate::catalog::options_of_partition!("s.partition_id AND p.id = $1");
        gen: "extend_newest_gen"
    );
    let state = cursor::StateByValues::of_lease(select, "extend");
    crate::schema::citus::function_of_partition(
        crate::schema::versioned!("comb.extend_lease"),
        "a_partition uuid, a_group text, a_lease uuid, a_seconds float8",
        "lease_expires_at timestamptz",
        &format!(
            "DECLARE
{declare}BEGIN
    PERFORM {lock};
    IF NOT FOUND THEN
        RETURN;
    END IF;
    {newest_gen};
    {select}
    INTO {vars};
    IF NOT FOUND THEN
        RETURN;
    END IF;
    {insert};
    RETURN QUERY SELECT extend_lease_expires_at;
END;",
            declare = state.declare,
            newest_gen = state.newest_gen,
            select = state.select,
            vars = state.vars,
            insert = state.insert,
        ),
    )
});

/// [`EXTEND_CITUS_FUNCTION`]'s signature and distribution argument.
pub(crate) const EXTEND_CITUS_SIGNATURE: (&str, &str, bool) = (
    concat!(
        crate::schema::versioned!("comb.extend_lease"),
        "(uuid, text, uuid, double precision)"
    ),
    "a_partition",
    false,
);

/// The call of [`EXTEND_CITUS_FUNCTION`], with [`EXTEND_SQL`]'s parameters.
const EXTEND_CITUS_CALL: &str = concat!(
    "SELECT * FROM ",
    crate::schema::versioned!("comb.extend_lease"),
    "($1::uuid, $2::text, $3::uuid, $4::float8)"
);

/// What an extension did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Extended {
    /// The lease now ends then (the latest end over its partitions).
    Until(DateTime<Utc>),
    /// No live lease has this id.
    NoLiveLease,
    /// The lease holds a partition of a queue outside the caller's token scope: nothing
    /// was changed.
    OutOfScope,
}

/// Moves the end of a live lease to `seconds` from now (by default, the queue's `leaseTime`),
/// on every partition it holds (a multi-partition pop leases them all under one id), if
/// `principal` (the caller's token, when tokens are required) may touch all their queues.
pub(crate) async fn extend(
    pool: &Pool,
    backend: Backend,
    router: &crate::db::route::Router,
    lease: Uuid,
    seconds: Option<f64>,
    partition: Option<Uuid>,
    principal: Option<&Principal>,
) -> Result<Extended, DbError> {
    if !backend.finds_leases_by_id() {
        return extend_on_citus(pool, router, lease, seconds, partition, principal).await;
    }
    let mut client = router.general(pool, partition).await.get().await?;
    let tx = client.transaction().await?;
    let mut found = tx.query(FIND_SQL, &[&lease, &partition]).await?;
    if let Some(p) = principal
        && !p.may_use_all(found.iter().map(|r| r.get::<_, &str>("queue")))
    {
        return Ok(Extended::OutOfScope);
    }
    // Locked in a stable order, like every other writer of several cursors.
    sort_cursors(&mut found);
    let mut latest: Option<DateTime<Utc>> = None;
    for r in found {
        let (pid, group): (Uuid, String) = (r.get("partition_id"), r.get("consumer_group"));
        let lock = tx.prepare_cached(cursor::LOCK_ONE_SQL).await?;
        let extend = tx.prepare_cached(EXTEND_SQL).await?;
        // Pipelined: the insert's snapshot is taken once the lock is held.
        let lock_params: [&(dyn ToSql + Sync); 2] = [&pid, &group];
        let extend_params: [&(dyn ToSql + Sync); 4] = [&pid, &group, &lease, &seconds];
        let (locked, extended) = tokio::join!(
            tx.query(&lock, &lock_params),
            tx.query_opt(&extend, &extend_params),
        );
        // A cursor whose queue was deleted meanwhile has no row left to lock: its lease is
        // gone with it.
        if locked?.is_empty() {
            continue;
        }
        if let Some(row) = extended? {
            let expires: DateTime<Utc> = row.get("lease_expires_at");
            latest = latest.max(Some(expires));
        }
    }
    let Some(latest) = latest else {
        return Ok(Extended::NoLiveLease);
    };
    tx.commit().await?;
    Ok(Extended::Until(latest))
}

/// Sorts found cursors by (partition, group), the order every writer of several locks them in.
fn sort_cursors(found: &mut [tokio_postgres::Row]) {
    found.sort_by_key(|r| {
        (
            r.get::<_, Uuid>("partition_id"),
            r.get::<_, String>("consumer_group"),
        )
    });
}

/// [`extend`] on Citus: each cursor of the lease extended by one call of
/// [`EXTEND_CITUS_FUNCTION`], a transaction of its own on the cursor's worker. A lease over
/// several partitions (a multi-partition pop) is extended a partition at a time: one that
/// fails part-way leaves the others extended, which a retry extends again.
///
/// By the lease id alone, the cursors come from the leases this server granted
/// ([`granted`]), so no statement reads every shard; a lease granted by another server (or
/// forgotten) is looked up over every shard, counted in
/// [`crate::metrics::LEASE_LOOKUPS_ALL_SHARDS`].
async fn extend_on_citus(
    pool: &Pool,
    router: &crate::db::route::Router,
    lease: Uuid,
    seconds: Option<f64>,
    partition: Option<Uuid>,
    principal: Option<&Principal>,
) -> Result<Extended, DbError> {
    let mut found: Vec<granted::Cursor> = match granted::cursors_of(lease, partition) {
        Some(cursors) => cursors,
        None => {
            if partition.is_none() {
                crate::metrics::LEASE_LOOKUPS_ALL_SHARDS.add(1);
            }
            router
                .general(pool, partition)
                .await
                .get()
                .await?
                .query(FIND_SQL, &[&lease, &partition])
                .await?
                .iter()
                .map(|r| granted::Cursor {
                    partition: r.get("partition_id"),
                    group: r.get::<_, String>("consumer_group").into(),
                    queue: r.get::<_, String>("queue").into(),
                })
                .collect()
        }
    };
    if let Some(p) = principal
        && !p.may_use_all(found.iter().map(|c| &*c.queue))
    {
        return Ok(Extended::OutOfScope);
    }
    found.sort_by(|a, b| (a.partition, &a.group).cmp(&(b.partition, &b.group)));
    let mut latest: Option<DateTime<Utc>> = None;
    for c in &found {
        // Each on its partition's worker, on the direct route.
        let client = router.general(pool, Some(c.partition)).await.get().await?;
        let extend = client.prepare_cached(EXTEND_CITUS_CALL).await?;
        let group: &str = &c.group;
        if let Some(row) = client
            .query_opt(&extend, &[&c.partition, &group, &lease, &seconds])
            .await?
        {
            let expires: DateTime<Utc> = row.get("lease_expires_at");
            latest = latest.max(Some(expires));
        }
    }
    match latest {
        Some(until) => {
            if partition.is_none() {
                granted::remember(lease, found, until);
            }
            Ok(Extended::Until(until))
        }
        None => {
            granted::forget(lease);
            Ok(Extended::NoLiveLease)
        }
    }
}
