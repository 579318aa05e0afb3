//! The catalog: queue, partition and subscription identities, created on first use.
//!
//! Names resolve to ids that never change while the queue exists, so they are cached in memory;
//! every server keeps its own cache and the database stays the only source of truth.
//! A partition's id is derived from its queue's id and its name ([`ids`]). Creating a
//! partition and subscribing a group are kept apart (on one PostgreSQL both lock the queue
//! row; on Citus an advisory lock of the queue on the coordinator), so that every
//! (partition, group) pair gets its cursor row exactly once, whichever comes first.

mod ids;
pub(crate) mod listing;
mod queues;

pub(crate) use ids::{CREATE_CITUS_FUNCTION, CREATE_CITUS_SIGNATURE, record_legacy};

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use deadpool_postgres::{GenericClient, Pool};
use uuid::Uuid;

use crate::backend::{Backend, Forms};
use crate::cursor;
use crate::db::DbError;
use crate::queue::{OptionsSet, QueueOptions};
use crate::wake::{OnStale, Stale};

/// The name of partition `$p` (an SQL expression; NULL for a partition deleted since).
macro_rules! partition_name {
    ($p:literal) => {
        concat!(
            "(SELECT p.name FROM comb.partitions p WHERE p.id = ",
            $p,
            ")"
        )
    };
}
pub(crate) use partition_name;

/// Every queue's id (an SQL array).
macro_rules! queue_ids {
    () => {
        "ARRAY(SELECT id FROM comb.queues)"
    };
}
pub(crate) use queue_ids;

/// Every subscription of a group to a queue as one row of two arrays, `queue_ids` and
/// `groups`, in (queue, group) order (a subquery).
macro_rules! subscriptions {
    () => {
        "(SELECT array_agg(queue_id ORDER BY queue_id, consumer_group) AS queue_ids,
               array_agg(consumer_group ORDER BY queue_id, consumer_group) AS groups
        FROM comb.subscriptions)"
    };
}
pub(crate) use subscriptions;

/// The id of the partition named `$name` in queue `$queue` (SQL expressions), as a subquery
/// of one row or none.
macro_rules! partition_named {
    ($queue:literal, $name:literal) => {
        concat!(
            "(SELECT p.id FROM comb.partitions p WHERE p.queue_id = ",
            $queue,
            " AND p.name = ",
            $name,
            ")"
        )
    };
}
pub(crate) use partition_named;

/// Whether partition `$p` (an SQL expression) exists: its queue was not deleted.
macro_rules! partition_exists {
    ($p:literal) => {
        concat!(
            "EXISTS (SELECT 1 FROM comb.partitions p WHERE p.id = ",
            $p,
            ")"
        )
    };
}
pub(crate) use partition_exists;

/// Whether partition `$p` belongs to the queue named `$queue` (SQL expressions).
macro_rules! partition_in_queue {
    ($p:literal, $queue:literal) => {
        concat!(
            "EXISTS (SELECT 1 FROM comb.partitions p JOIN comb.queues s ON s.id = p.queue_id
               WHERE p.id = ",
            $p,
            " AND s.name = ",
            $queue,
            ")"
        )
    };
}
pub(crate) use partition_in_queue;

/// Joins partition `p` of id `$p` (an SQL expression) and its queue `q`: for statements that
/// answer with names or judge by the queue's options.
macro_rules! join_partition_and_queue {
    ($p:literal) => {
        concat!(
            "JOIN comb.partitions p ON p.id = ",
            $p,
            "\nJOIN comb.queues q ON q.id = p.queue_id"
        )
    };
}
pub(crate) use join_partition_and_queue;

/// Joins queue `q` of id `$q` (an SQL expression): its name and stored options.
macro_rules! join_queue {
    ($q:literal) => {
        concat!("JOIN comb.queues q ON q.id = ", $q)
    };
}
pub(crate) use join_queue;

// Fragments of the claim.

/// The queue of id `$q` (an SQL expression), for a `FROM` whose columns are read unqualified
/// (`options`): one probe of the queues' key.
macro_rules! queue_by_id {
    ($q:literal) => {
        concat!("comb.queues WHERE id = ", $q)
    };
}
pub(crate) use queue_by_id;

/// The stored options of the queue of partition `$p` (an SQL expression; NULL for a
/// partition deleted since).
macro_rules! options_of_partition {
    ($p:literal) => {
        concat!(
            "(SELECT q.options FROM comb.partitions p JOIN comb.queues q ON q.id = p.queue_id
             WHERE p.id = ",
            $p,
            ")"
        )
    };
}
pub(crate) use options_of_partition;

/// The partitions `p` of queue `$queue` (an SQL expression), for a `FROM`.
macro_rules! partitions_of {
    ($queue:literal) => {
        concat!("comb.partitions p WHERE p.queue_id = ", $queue)
    };
}
pub(crate) use partitions_of;

/// The partitions `p` among the ids `$ids` (an SQL array) that exist, for a `FROM`: one probe
/// of the partitions' key each.
macro_rules! partitions_among {
    ($ids:literal) => {
        concat!("comb.partitions p WHERE p.id = ANY(", $ids, ")")
    };
}
pub(crate) use partitions_among;

/// Locks the partition rows `$1` in id order and returns the ids of those that exist (column
/// `id`): what a push holds while it assigns positions, so that positions commit in order.
pub(crate) const LOCK_PARTITIONS_SQL: &str =
    "SELECT id FROM comb.partitions WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE";

/// The partitions' lock: [`LOCK_PARTITIONS_SQL`], and on Citus, which locks rows only in a
/// statement of one shard, the coordinator locking each partition with one of its own
/// (`comb.lock_partitions`).
pub(crate) const LOCK_PARTITIONS: Forms = Forms {
    postgres: LOCK_PARTITIONS_SQL,
    citus: "SELECT * FROM comb.lock_partitions($1) AS id",
};

/// A write of partition `$1`'s row that matches nothing: see [`enlist_workers`].
const ENLIST_CITUS_SQL: &str =
    "UPDATE comb.partitions SET name = name WHERE id = $1 AND name IS NULL";

/// On Citus, makes a transaction that writes `partitions` commit in two phases when they lie
/// on several workers, so it stays atomic across a worker's loss.
///
/// Citus turns two-phase commit on when a transaction that already modified a worker's
/// shards modifies over a connection to another worker. Calls it delegates (the partitions'
/// lock, the judgement of acks) count as reads for that decision, so a `/transaction` or
/// streams batch acking on one worker and pushing to another would commit each worker in one
/// phase: a worker lost between the commits could keep the ack without the push. A write of
/// each partition's row that matches nothing (no row changed, no WAL), first in the
/// transaction, makes every worker's connection a modifying one from the start. Partitions
/// of one worker share its connection and still commit in one phase. With one partition, or
/// on PostgreSQL, nothing is sent.
pub(crate) async fn enlist_workers<C: GenericClient + Sync>(
    client: &C,
    backend: Backend,
    partitions: &[Uuid],
) -> Result<(), DbError> {
    let mut ids = partitions.to_vec();
    ids.sort();
    ids.dedup();
    if ids.len() < 2 || !backend.enlists_workers_for_two_phase_commit() {
        return Ok(());
    }
    let statement = client.prepare_cached(ENLIST_CITUS_SQL).await?;
    for id in &ids {
        client.execute(&statement, &[id]).await?;
    }
    Ok(())
}

/// The latest state of locked cursors with their queue's options, for the writers that judge
/// cursors by them (acks, lease expiry, maintenance, unreadable payloads): `cursor`'s
/// statement ([`cursor::state_sql!`]) with the queue joined here.
pub const CURSOR_STATE_SQL: &str = cursor::state_sql!(crate::catalog::join_queue!("c.queue_id"));

/// [`CURSOR_STATE_SQL`], and on Citus its form of cursors all of one partition (`$3`), a
/// router statement on that partition's worker (callers split their cursors by partition).
pub(crate) const CURSOR_STATE: Forms = Forms {
    postgres: CURSOR_STATE_SQL,
    citus: cursor::state_sql!(citus; crate::catalog::join_queue!("c.queue_id")),
};

/// The partition and queue names of the partitions `$1` that exist, one probe of the
/// partitions' key each: `id`, `partition`, `queue`.
pub(crate) const NAMES_SQL: &str = "
SELECT p.id, p.name AS partition, q.name AS queue
FROM comb.partitions p JOIN comb.queues q ON q.id = p.queue_id
WHERE p.id = ANY($1)";

/// A queue's identity as its row has it.
pub(crate) struct QueueRow {
    pub(crate) id: Uuid,
    pub(crate) namespace: Option<String>,
    pub(crate) task: Option<String>,
}

/// The queue named `name`, read now (no cache: its namespace and task may change).
pub(crate) async fn queue_named<C: GenericClient>(
    client: &C,
    name: &str,
) -> Result<Option<QueueRow>, DbError> {
    Ok(client
        .query_opt(
            "SELECT id, namespace, task FROM comb.queues WHERE name = $1",
            &[&name],
        )
        .await?
        .map(|r| QueueRow {
            id: r.get("id"),
            namespace: r.get("namespace"),
            task: r.get("task"),
        }))
}

/// Entries beyond which a cache is emptied rather than grown.
const CACHE_LIMIT: usize = 1_000_000;

/// Where a consumer group starts reading partitions that exist when it first appears.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StartFrom {
    /// From the first retained message.
    All,
    /// After the newest message at subscription time.
    New,
    /// From the first message pushed at or after this time.
    Time(DateTime<Utc>),
}

/// How long queue options are trusted before they are read again (another server may have
/// changed them).
const OPTIONS_TTL: std::time::Duration = std::time::Duration::from_secs(1);

/// Cached name → id mappings.
pub(crate) struct Catalog {
    backend: Backend,
    options: Mutex<HashMap<Uuid, (std::time::Instant, QueueOptions)>>,
    queues: Mutex<HashMap<String, Uuid>>,
    partitions: Mutex<HashMap<(Uuid, String), Uuid>>,
    subscriptions: Mutex<HashSet<(Uuid, String)>>,
}

impl Catalog {
    /// An empty catalog of a database of `backend`.
    pub(crate) fn new(backend: Backend) -> Catalog {
        Catalog {
            backend,
            options: Mutex::default(),
            queues: Mutex::default(),
            partitions: Mutex::default(),
            subscriptions: Mutex::default(),
        }
    }

    /// The storage this catalog's database is.
    pub(crate) fn backend(&self) -> Backend {
        self.backend
    }

    /// The id of a queue, if it exists (never creates it).
    pub(crate) async fn find_queue(
        &self,
        pool: &Pool,
        name: &str,
    ) -> Result<Option<Uuid>, DbError> {
        if let Some(id) = self.queues.lock().unwrap().get(name) {
            return Ok(Some(*id));
        }
        let client = pool.get().await?;
        let row = client
            .query_opt("SELECT id FROM comb.queues WHERE name = $1", &[&name])
            .await?;
        let id = row.map(|r| r.get::<_, Uuid>(0));
        if let Some(id) = id {
            self.remember_queue(name, id);
        }
        Ok(id)
    }

    /// The id of a partition, if it exists (never creates it).
    pub(crate) async fn find_partition(
        &self,
        pool: &Pool,
        queue_id: Uuid,
        name: &str,
    ) -> Result<Option<Uuid>, DbError> {
        let key = (queue_id, name.to_string());
        if let Some(id) = self.partitions.lock().unwrap().get(&key) {
            return Ok(Some(*id));
        }
        let client = pool.get().await?;
        let id = ids::look_up(&**client, self.backend, std::slice::from_ref(&key))
            .await?
            .remove(&key);
        if let Some(id) = id {
            self.remember_partition(key, id);
        }
        Ok(id)
    }

    /// Ids of queues by name, creating the missing ones.
    pub(crate) async fn ensure_queues(
        &self,
        pool: &Pool,
        names: &[&str],
    ) -> Result<HashMap<String, Uuid>, DbError> {
        let mut out = HashMap::new();
        let mut missing: Vec<String> = Vec::new();
        {
            let cache = self.queues.lock().unwrap();
            for n in names {
                match cache.get(*n) {
                    Some(id) => {
                        out.insert(n.to_string(), *id);
                    }
                    None => missing.push(n.to_string()),
                }
            }
        }
        missing.sort();
        missing.dedup();
        if missing.is_empty() {
            return Ok(out);
        }
        let ids: Vec<Uuid> = missing.iter().map(|_| Uuid::now_v7()).collect();
        let client = pool.get().await?;
        client
            .execute(
                "INSERT INTO comb.queues (id, name)
                 SELECT * FROM unnest($1::uuid[], $2::text[]) ORDER BY 2
                 ON CONFLICT (name) DO NOTHING",
                &[&ids, &missing],
            )
            .await?;
        let rows = client
            .query(
                "SELECT name, id FROM comb.queues WHERE name = ANY($1)",
                &[&missing],
            )
            .await?;
        for r in rows {
            let (name, id): (String, Uuid) = (r.get("name"), r.get("id"));
            self.remember_queue(&name, id);
            out.insert(name, id);
        }
        Ok(out)
    }

    /// Ids of partitions by (queue id, name), creating the missing ones together with a cursor
    /// for every consumer group already subscribed to their queue.
    pub(crate) async fn ensure_partitions(
        &self,
        pool: &Pool,
        wanted: &[(Uuid, &str)],
    ) -> Result<HashMap<(Uuid, String), Uuid>, DbError> {
        let mut out = HashMap::new();
        let mut missing: Vec<(Uuid, String)> = Vec::new();
        {
            let cache = self.partitions.lock().unwrap();
            for (q, n) in wanted {
                let key = (*q, n.to_string());
                match cache.get(&key) {
                    Some(id) => {
                        out.insert(key, *id);
                    }
                    None => missing.push(key),
                }
            }
        }
        missing.sort();
        missing.dedup();
        if missing.is_empty() {
            return Ok(out);
        }
        let made = if self.backend.derives_partition_ids() {
            create_on_citus(pool, self.backend, &missing).await?
        } else {
            create_locked(pool, &missing).await?
        };
        for (key, id) in made {
            self.remember_partition(key.clone(), id);
            out.insert(key, id);
        }
        Ok(out)
    }

    /// Makes sure `group` reads `queue_id`: on the group's first appearance, creates its cursor
    /// in every partition, starting where `start` says.
    pub(crate) async fn ensure_subscription(
        &self,
        pool: &Pool,
        queue_id: Uuid,
        group: &str,
        start: StartFrom,
    ) -> Result<(), DbError> {
        let key = (queue_id, group.to_string());
        if self.subscriptions.lock().unwrap().contains(&key) {
            return Ok(());
        }
        let (mode, start_at): (&str, Option<DateTime<Utc>>) = match start {
            StartFrom::All => ("all", None),
            StartFrom::New => ("new", None),
            StartFrom::Time(t) => ("from", Some(t)),
        };
        let mut client = pool.get().await?;
        // Read first: the subscription usually exists (a group seen by another server, or by
        // this one before a restart), and the write below, of reference tables on Citus,
        // needs every node, so a pop would fail while any worker is down.
        let known = client
            .query_opt(
                "SELECT 1 FROM comb.subscriptions WHERE queue_id = $1 AND consumer_group = $2",
                &[&queue_id, &group],
            )
            .await?
            .is_some();
        if known {
            self.remember_subscription(key);
            return Ok(());
        }
        let tx = client.transaction().await?;
        if self.backend.derives_partition_ids() {
            // Partitions made on Citus do not lock the queue's row; they hold its creation
            // lock, shared, until they commit: waiting here for it sees them all below.
            tx.execute(ids::CREATION_LOCK_SQL, &[&ids::CREATION_LOCK, &queue_id])
                .await?;
        }
        tx.query(
            "SELECT id FROM comb.queues WHERE id = $1 FOR NO KEY UPDATE",
            &[&queue_id],
        )
        .await?;
        let created = tx
            .query_opt(
                "INSERT INTO comb.subscriptions (queue_id, consumer_group, mode, start_at)
                 VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING RETURNING 1",
                &[&queue_id, &group, &mode, &start_at],
            )
            .await?
            .is_some();
        if created {
            tx.execute(
                concat!(
                    "WITH anchors AS (
                     ",
                    cursor::insert_cursor!(),
                    "
                     SELECT p.id, $2, p.queue_id FROM comb.partitions p WHERE p.queue_id = $1
                     ON CONFLICT DO NOTHING
                     RETURNING partition_id
                 ),
                 -- With `subscriptionFrom`, each partition's last position before that
                 -- time. Read apart from the new cursors and joined by partition: Citus
                 -- plans a subquery of the messages correlated to the inserted rows in
                 -- no form, and this one per partition as a query of each shard.
                 before AS (
                     SELECT p.id AS partition_id,
                            ",
                    crate::messages::position_before!("p.id", "$4"),
                    " AS pos
                     FROM comb.partitions p WHERE p.queue_id = $1 AND $3::text = 'from'
                 )
                 ",
                    cursor::insert_first_state!(),
                    "
                 SELECT a.partition_id, $2, ",
                    cursor::newest_gen!(),
                    ",
                        coalesce(o.ver, 0) + 1, s.pos, s.pos
                 FROM anchors a
                 -- A group deleted and subscribed again continues its versions: the old
                 -- ones stay until their generation is dropped and must not win.
                 LEFT JOIN LATERAL ",
                    cursor::state_of!("a.partition_id", "$2"),
                    " o ON true
                 LEFT JOIN before b ON b.partition_id = a.partition_id
                 CROSS JOIN LATERAL (
                     SELECT CASE $3::text
                         WHEN 'new' THEN (SELECT h.pos FROM ",
                    crate::messages::head_of!("a.partition_id"),
                    " h)
                         WHEN 'from' THEN coalesce(b.pos, 0)
                         ELSE 0 END AS pos
                 ) s"
                ),
                &[&queue_id, &group, &mode, &start_at],
            )
            .await?;
        }
        tx.commit().await?;
        self.remember_subscription(key);
        Ok(())
    }

    fn remember_subscription(&self, key: (Uuid, String)) {
        let mut subs = self.subscriptions.lock().unwrap();
        if subs.len() >= CACHE_LIMIT {
            subs.clear();
        }
        subs.insert(key);
    }

    /// Effective options of a queue, at most [`OPTIONS_TTL`] old.
    pub(crate) async fn options(
        &self,
        pool: &Pool,
        queue_id: Uuid,
    ) -> Result<QueueOptions, DbError> {
        if let Some((at, o)) = self.options.lock().unwrap().get(&queue_id)
            && at.elapsed() < OPTIONS_TTL
        {
            return Ok(o.clone());
        }
        let client = pool.get().await?;
        let row = client
            .query_opt(
                "SELECT options FROM comb.queues WHERE id = $1",
                &[&queue_id],
            )
            .await?;
        let set: OptionsSet = row
            .and_then(|r| serde_json::from_value(r.get::<_, serde_json::Value>(0)).ok())
            .unwrap_or_default();
        let opts = QueueOptions::from_set(&set);
        let mut cache = self.options.lock().unwrap();
        if cache.len() >= CACHE_LIMIT {
            cache.clear();
        }
        cache.insert(queue_id, (std::time::Instant::now(), opts.clone()));
        Ok(opts)
    }

    /// Drops the cached options of a queue (after it was configured here).
    pub(crate) fn forget_options(&self, queue_id: Uuid) {
        self.options.lock().unwrap().remove(&queue_id);
    }

    /// Forgets everything cached about a queue (after it was deleted or a stale id was seen).
    pub(crate) fn forget_queue(&self, name: &str) {
        if let Some(id) = self.queues.lock().unwrap().remove(name) {
            self.partitions.lock().unwrap().retain(|k, _| k.0 != id);
            self.subscriptions.lock().unwrap().retain(|k| k.0 != id);
            self.options.lock().unwrap().remove(&id);
        }
    }

    /// What the wake relay calls with catalog changes made through other servers.
    pub(crate) fn on_stale(self: &Arc<Self>) -> OnStale {
        let catalog = self.clone();
        Arc::new(move |stale| match stale {
            Stale::Queue(name) => catalog.forget_queue(name),
            Stale::All => catalog.forget_all(),
        })
    }

    /// Forgets every cached id (after notifications may have been missed).
    pub(crate) fn forget_all(&self) {
        self.queues.lock().unwrap().clear();
        self.partitions.lock().unwrap().clear();
        self.subscriptions.lock().unwrap().clear();
        self.options.lock().unwrap().clear();
    }

    /// Entries of each cache: queue names, partition names, subscriptions, queue options.
    /// Each holds only what exists in the database (lookups of names that do not exist are
    /// not remembered) and is capped at [`CACHE_LIMIT`].
    pub(crate) fn sizes(&self) -> [(&'static str, usize); 4] {
        [
            ("catalog_queues", self.queues.lock().unwrap().len()),
            ("catalog_partitions", self.partitions.lock().unwrap().len()),
            (
                "catalog_subscriptions",
                self.subscriptions.lock().unwrap().len(),
            ),
            ("catalog_options", self.options.lock().unwrap().len()),
        ]
    }

    fn remember_queue(&self, name: &str, id: Uuid) {
        let mut q = self.queues.lock().unwrap();
        if q.len() >= CACHE_LIMIT {
            q.clear();
        }
        q.insert(name.to_string(), id);
    }

    fn remember_partition(&self, key: (Uuid, String), id: Uuid) {
        let mut p = self.partitions.lock().unwrap();
        if p.len() >= CACHE_LIMIT {
            p.clear();
        }
        p.insert(key, id);
    }
}

/// Creates the partitions `missing` (sorted) on one PostgreSQL under their queues' row locks
/// (which a subscription takes too), and returns every one's id: those that exist keep
/// theirs (the `(queue_id, name)` key keeps a name unique per queue). New ids are random and
/// time-ordered (version 7), not derived: the look-up here is by name anyway, and ordered
/// ids keep the plans of young tables on their indexes (`claim_plans::the_acks_reads_…`:
/// with derived ids, random in order, an ack's state read joined a scan of every cursor).
async fn create_locked(
    pool: &Pool,
    missing: &[(Uuid, String)],
) -> Result<HashMap<(Uuid, String), Uuid>, DbError> {
    let queue_ids: Vec<Uuid> = missing.iter().map(|k| k.0).collect();
    let names: Vec<String> = missing.iter().map(|k| k.1.clone()).collect();
    let new_ids: Vec<Uuid> = missing.iter().map(|_| Uuid::now_v7()).collect();
    let mut lock_ids = queue_ids.clone();
    lock_ids.sort();
    lock_ids.dedup();
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    tx.query(
        "SELECT id FROM comb.queues WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE",
        &[&lock_ids],
    )
    .await?;
    // Under the queues' locks, partitions made meanwhile are seen here and not made again
    // (the key `(queue_id, name)` would refuse them anyway).
    let found: HashSet<(Uuid, String)> = tx
        .query(ids::BY_NAME_SQL, &[&queue_ids, &names])
        .await?
        .iter()
        .map(|r| (r.get("queue_id"), r.get("name")))
        .collect();
    let (mut make_ids, mut make_queues, mut make_names) = (Vec::new(), Vec::new(), Vec::new());
    for (i, key) in missing.iter().enumerate() {
        if !found.contains(key) {
            make_ids.push(new_ids[i]);
            make_queues.push(key.0);
            make_names.push(key.1.clone());
        }
    }
    tx.execute(
        concat!(
            "WITH created AS (
                 INSERT INTO comb.partitions (id, queue_id, name)
                 SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[]) ORDER BY 2, 3
                 ON CONFLICT DO NOTHING
                 RETURNING id, queue_id
             )
             , anchors AS (
                 ",
            cursor::insert_cursor!(),
            "
                 SELECT c.id, s.consumer_group, c.queue_id
                 FROM created c JOIN comb.subscriptions s ON s.queue_id = c.queue_id
                 ON CONFLICT DO NOTHING
                 RETURNING partition_id, consumer_group
             )
             ",
            cursor::insert_first_state!(),
            "
             SELECT a.partition_id, a.consumer_group, ",
            cursor::newest_gen!(),
            ", 1, 0, 0
             FROM anchors a"
        ),
        &[&make_ids, &make_queues, &make_names],
    )
    .await?;
    let rows = tx.query(ids::BY_NAME_SQL, &[&queue_ids, &names]).await?;
    tx.commit().await?;
    Ok(rows
        .iter()
        .map(|r| ((r.get("queue_id"), r.get("name")), r.get("id")))
        .collect())
}

/// Creates the partitions `missing` on Citus: looked up first (by derived id, a statement of
/// each partition's shard), then each one not found made by one call of
/// `comb.create_partition` on its worker, in a transaction of its own that holds its
/// queue's creation lock (shared) on the coordinator: no lock of the queue's row, which is a
/// reference table's and would need every node. Two servers making one partition insert the
/// same id: the primary key keeps one.
async fn create_on_citus(
    pool: &Pool,
    backend: Backend,
    missing: &[(Uuid, String)],
) -> Result<HashMap<(Uuid, String), Uuid>, DbError> {
    let mut client = pool.get().await?;
    let mut found = ids::look_up(&**client, backend, missing).await?;
    for key in missing {
        if found.contains_key(key) {
            continue;
        }
        let id = ids::derived(key.0, &key.1);
        let tx = client.transaction().await?;
        tx.execute(
            ids::CREATION_LOCK_SHARED_SQL,
            &[&ids::CREATION_LOCK, &key.0],
        )
        .await?;
        tx.execute(ids::CREATE_CITUS_CALL, &[&id, &key.0, &key.1])
            .await?;
        tx.commit().await?;
        found.insert(key.clone(), id);
    }
    Ok(found)
}
