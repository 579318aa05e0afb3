//! Partition ids derived from their queue and name, and the look-up of partitions by name.
//!
//! A partition's id is a name-based UUID (version 5) of its queue's id and its name, under a
//! namespace of Comb's own: every server computes it without reading anything, so finding a
//! partition by name is finding it by id, which on Citus (partitions distributed by id) is a
//! statement of the partition's shard alone; and creating one is an insert that its primary
//! key keeps unique per (queue, name), with no lock of the queue's row. A queue's id is
//! random per creation, so a queue deleted and made again gets new partition ids.
//!
//! On one PostgreSQL ids stay random and time-ordered (version 7, see
//! `catalog::create_locked`) and the look-up stays by name (the `(queue_id, name)` key
//! serves it, and keeps names unique whatever the ids). Partitions made before ids were
//! derived, or on one PostgreSQL before a move to Citus, have such ids. On Citus, where that key cannot exist, `comb migrate` records whether
//! any such partition is left ([`record_legacy`], table `comb.partition_ids`); only while one
//! is does a look-up that misses the derived id also look by name, over every shard.

use std::collections::HashMap;

use tokio_postgres::GenericClient;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use crate::backend::Backend;
use crate::cursor;
use crate::db::DbError;

/// The namespace of derived partition ids (a fixed random UUID of Comb's).
const NAMESPACE: Uuid = Uuid::from_u128(0x5e1c_7a0b_93d4_4c2e_8f61_2b7d_0a9e_c3f4);

/// The id of the partition `name` of the queue `queue_id`: the same on every server, and
/// different for a queue of the same name made again (its id is new).
pub(crate) fn derived(queue_id: Uuid, name: &str) -> Uuid {
    let mut bytes = Vec::with_capacity(16 + name.len());
    bytes.extend_from_slice(queue_id.as_bytes());
    bytes.extend_from_slice(name.as_bytes());
    Uuid::new_v5(&NAMESPACE, &bytes)
}

/// The partitions of (queue, name) pairs `$1`, `$2` (arrays), found by name: `queue_id`,
/// `name`, `id`. On Citus a read of every shard.
pub(super) const BY_NAME_SQL: &str = "
SELECT p.queue_id, p.name, p.id
FROM unnest($1::uuid[], $2::text[]) AS w(queue_id, name)
JOIN comb.partitions p ON p.queue_id = w.queue_id AND p.name = w.name";

/// Whether partition `$1` exists: on Citus a router statement of its shard.
const BY_ID_SQL: &str = "SELECT id FROM comb.partitions WHERE id = $1";

/// Whether partitions with ids not derived from their names may exist (none recorded yet
/// counts as yes). A reference table: read on the coordinator.
const LEGACY_SQL: &str = "SELECT legacy FROM comb.partition_ids";

/// Whether any partition has an id that is not a derived one (not version 5): a scan of every
/// shard, at `comb migrate` only.
const ANY_LEGACY_SQL: &str = "SELECT EXISTS (SELECT 1 FROM comb.partitions
    WHERE substr(id::text, 15, 1) <> '5') AS legacy";

const RECORD_LEGACY_SQL: &str = "
INSERT INTO comb.partition_ids (one, legacy, checked_at) VALUES (true, $1, now())
ON CONFLICT (one) DO UPDATE SET legacy = EXCLUDED.legacy, checked_at = EXCLUDED.checked_at";

/// Records whether partitions with random ids are left (Citus only; run by `comb migrate`,
/// so checked again at every server's start).
pub(crate) async fn record_legacy(
    client: &tokio_postgres::Client,
    backend: Backend,
) -> Result<bool, DbError> {
    if !backend.derives_partition_ids() {
        return Ok(false);
    }
    let legacy: bool = client.query_one(ANY_LEGACY_SQL, &[]).await?.get("legacy");
    client.execute(RECORD_LEGACY_SQL, &[&legacy]).await?;
    Ok(legacy)
}

/// The ids of the partitions among `keys` (queue id, name) that exist. On one PostgreSQL one
/// statement by name. On Citus one statement per derived id, pipelined, each on its
/// partition's shard, with the legacy mark read beside them; by name only for the ids not
/// found while partitions with random ids may be left.
pub(crate) async fn look_up<C: GenericClient>(
    client: &C,
    backend: Backend,
    keys: &[(Uuid, String)],
) -> Result<HashMap<(Uuid, String), Uuid>, DbError> {
    let mut out = HashMap::new();
    if keys.is_empty() {
        return Ok(out);
    }
    let mut missed: Vec<&(Uuid, String)> = keys.iter().collect();
    if backend.derives_partition_ids() {
        let ids: Vec<Uuid> = keys.iter().map(|(q, n)| derived(*q, n)).collect();
        let params: Vec<[&(dyn ToSql + Sync); 1]> = ids.iter().map(|id| [id as _]).collect();
        let probes = futures_util::future::try_join_all(
            params.iter().map(|p| client.query_opt(BY_ID_SQL, p)),
        );
        let legacy = client.query_opt(LEGACY_SQL, &[]);
        let (found, legacy) = futures_util::future::try_join(probes, legacy).await?;
        missed.clear();
        for ((key, id), row) in keys.iter().zip(ids).zip(found) {
            match row {
                Some(_) => {
                    out.insert(key.clone(), id);
                }
                None => missed.push(key),
            }
        }
        let legacy = legacy.is_none_or(|r| r.get::<_, bool>("legacy"));
        if missed.is_empty() || !legacy {
            return Ok(out);
        }
    }
    let queue_ids: Vec<Uuid> = missed.iter().map(|k| k.0).collect();
    let names: Vec<&str> = missed.iter().map(|k| k.1.as_str()).collect();
    for r in client.query(BY_NAME_SQL, &[&queue_ids, &names]).await? {
        out.insert((r.get("queue_id"), r.get("name")), r.get("id"));
    }
    Ok(out)
}

/// Key (the first of two) of the advisory locks, on the coordinator, that keep a partition's
/// creation and a group's subscription to its queue apart on Citus: a creation holds its
/// queue's shared, a subscription exclusive, so that whichever commits second sees the
/// other and every (partition, group) pair gets its cursor. The second key is a hash of the
/// queue's id.
pub(super) const CREATION_LOCK: i32 = 0x636f_6d62;

/// Takes the creation lock of queue `$2` (shared, in the creating transaction).
pub(super) const CREATION_LOCK_SHARED_SQL: &str =
    "SELECT pg_advisory_xact_lock_shared($1, hashtext($2::uuid::text))";

/// Takes the creation lock of queue `$2` (exclusive, in the subscribing transaction).
pub(super) const CREATION_LOCK_SQL: &str =
    "SELECT pg_advisory_xact_lock($1, hashtext($2::uuid::text))";

/// The creation of partition `a_partition` (its derived id) of queue `a_queue` named `a_name`
/// on Citus, as one function of the partition that Citus runs on its worker
/// (`force_delegation`: it is called in the transaction holding [`CREATION_LOCK`]): the row,
/// unless it exists, and then a cursor and its first state for every group subscribed to
/// the queue, one row at a time (a statement of the partition's shard each; the groups and
/// the newest cursor generation are read apart, from reference tables). Returns whether it
/// made the partition. A queue deleted meanwhile fails the partition's foreign key (checked
/// on the worker against its copy of the queue's row, which the deletion locks there too).
pub(crate) static CREATE_CITUS_FUNCTION: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| {
        format!(
            "
CREATE FUNCTION {name}(a_partition uuid, a_queue uuid, a_name text)
RETURNS boolean
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan AS $body$
DECLARE
    groups text[];
    newest integer;
    grp text;
BEGIN
    INSERT INTO comb.partitions (id, queue_id, name) VALUES (a_partition, a_queue, a_name)
    ON CONFLICT (id) DO NOTHING;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    SELECT array_agg(consumer_group ORDER BY consumer_group) INTO groups
    FROM comb.subscriptions WHERE queue_id = a_queue;
    newest := {newest};
    FOREACH grp IN ARRAY coalesce(groups, '{{}}') LOOP
        {cursor} VALUES (a_partition, grp, a_queue) ON CONFLICT DO NOTHING;
        IF FOUND THEN
            {state} VALUES (a_partition, grp, newest, 1, 0, 0);
        END IF;
    END LOOP;
    RETURN true;
END $body$",
            name = crate::schema::versioned!("comb.create_partition"),
            newest = cursor::newest_gen!(),
            cursor = cursor::insert_cursor!(),
            state = cursor::insert_first_state!(),
        )
    });

/// [`CREATE_CITUS_FUNCTION`]'s signature, distribution argument and `force_delegation`.
pub(crate) const CREATE_CITUS_SIGNATURE: (&str, &str, bool) = (
    concat!(
        crate::schema::versioned!("comb.create_partition"),
        "(uuid, uuid, text)"
    ),
    "a_partition",
    true,
);

/// The call of [`CREATE_CITUS_FUNCTION`]: `$1` the id, `$2` the queue, `$3` the name.
pub(super) const CREATE_CITUS_CALL: &str = concat!(
    "SELECT ",
    crate::schema::versioned!("comb.create_partition"),
    "($1::uuid, $2::uuid, $3::text)"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_ids_are_stable_version_5_and_differ_by_queue_and_name() {
        let q = Uuid::from_u128(1);
        let a = derived(q, "a");
        assert_eq!(a, derived(q, "a"));
        assert_eq!(a.get_version_num(), 5);
        assert_ne!(a, derived(q, "b"));
        assert_ne!(a, derived(Uuid::from_u128(2), "a"));
        // The version sits where the legacy scan reads it.
        assert_eq!(&a.to_string()[14..15], "5");
        assert_ne!(&Uuid::now_v7().to_string()[14..15], "5");
    }
}
