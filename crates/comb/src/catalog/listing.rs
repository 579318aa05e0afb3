//! Reads and changes of the catalog for the administration: ids by name without the cache
//! (an operator's request must see a queue another server just deleted as gone), and the
//! subscription rows a group's deletion or new start point changes. Each takes the caller's
//! client or transaction, so the administration composes them into its own transactions.

use chrono::{DateTime, Utc};
use tokio_postgres::GenericClient;
use uuid::Uuid;

use crate::backend::Backend;
use crate::db::DbError;

/// The id of the queue named `queue`, if it exists.
pub(crate) async fn queue_id(
    client: &impl GenericClient,
    queue: &str,
) -> Result<Option<Uuid>, DbError> {
    Ok(client
        .query_opt("SELECT id FROM comb.queues WHERE name = $1", &[&queue])
        .await?
        .map(|r| r.get("id")))
}

/// The id of the partition named `partition` of the queue `queue_id`, if it exists: the
/// catalog's look-up by name (on Citus by its derived id, on its shard).
pub(crate) async fn partition_id(
    client: &impl GenericClient,
    backend: Backend,
    queue_id: Uuid,
    partition: &str,
) -> Result<Option<Uuid>, DbError> {
    let key = (queue_id, partition.to_string());
    Ok(
        super::ids::look_up(client, backend, std::slice::from_ref(&key))
            .await?
            .remove(&key),
    )
}

/// Whether any group reads the queue.
pub(crate) async fn is_subscribed(
    client: &impl GenericClient,
    queue_id: Uuid,
) -> Result<bool, DbError> {
    Ok(client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM comb.subscriptions WHERE queue_id = $1) AS subscribed",
            &[&queue_id],
        )
        .await?
        .get("subscribed"))
}

/// How a group subscribed to a queue.
#[derive(Debug, Clone)]
pub(crate) struct Subscription {
    /// `all`, `new` or `from`.
    pub mode: String,
    /// With `from`: the time it reads from.
    pub start_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

/// The group's subscription to the queue, locked until the transaction ends, if it has one.
pub(crate) async fn lock_subscription(
    client: &impl GenericClient,
    queue_id: Uuid,
    group: &str,
) -> Result<Option<Subscription>, DbError> {
    Ok(client
        .query_opt(
            "SELECT mode, start_at, created_at FROM comb.subscriptions
             WHERE queue_id = $1 AND consumer_group = $2 FOR UPDATE",
            &[&queue_id, &group],
        )
        .await?
        .map(|r| Subscription {
            mode: r.get("mode"),
            start_at: r.get("start_at"),
            created_at: r.get("created_at"),
        }))
}

/// Deletes the group's subscription to the queue (its cursors go through `cursor`).
pub(crate) async fn delete_subscription(
    client: &impl GenericClient,
    queue_id: Uuid,
    group: &str,
) -> Result<(), DbError> {
    client
        .execute(
            "DELETE FROM comb.subscriptions WHERE queue_id = $1 AND consumer_group = $2",
            &[&queue_id, &group],
        )
        .await?;
    Ok(())
}

/// Records that the group reads every queue it is subscribed to from `at`; answers those
/// queues' ids (none when the group reads no queue).
pub(crate) async fn subscribe_from(
    client: &impl GenericClient,
    group: &str,
    at: DateTime<Utc>,
) -> Result<Vec<Uuid>, DbError> {
    Ok(client
        .query(
            "UPDATE comb.subscriptions SET mode = 'from', start_at = $2
             WHERE consumer_group = $1 RETURNING queue_id",
            &[&group, &at],
        )
        .await?
        .iter()
        .map(|r| r.get("queue_id"))
        .collect())
}

/// A queue's catalog row, as listings show it.
#[derive(Debug, Clone)]
pub(crate) struct QueueRow {
    pub id: Uuid,
    pub name: String,
    pub namespace: Option<String>,
    pub task: Option<String>,
    pub created_at: DateTime<Utc>,
    /// The options as stored.
    pub options: serde_json::Value,
}

impl QueueRow {
    fn from_row(r: &tokio_postgres::Row) -> QueueRow {
        QueueRow {
            id: r.get("id"),
            name: r.get("name"),
            namespace: r.get("namespace"),
            task: r.get("task"),
            created_at: r.get("created_at"),
            options: r.get("options"),
        }
    }
}

/// Which queues a listing shows: all of them, narrowed by namespace, task and part of the
/// name.
#[derive(Debug, Default, Clone)]
pub(crate) struct QueueFilter {
    pub namespace: Option<String>,
    pub task: Option<String>,
    /// Part of the name.
    pub search: Option<String>,
}

const QUEUE_WHERE: &str = "($1::text IS NULL OR namespace = $1)
  AND ($2::text IS NULL OR task = $2)
  AND ($3::text IS NULL OR strpos(name, $3) > 0)";

/// A page of the queues `filter` selects, by name, and how many it selects in all.
pub(crate) async fn queue_page(
    client: &impl GenericClient,
    filter: &QueueFilter,
    limit: i64,
    offset: i64,
) -> Result<(Vec<QueueRow>, i64), DbError> {
    let args: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [
        &filter.namespace,
        &filter.task,
        &filter.search,
        &limit,
        &offset,
    ];
    let rows = client
        .query(
            &format!(
                "SELECT id, name, namespace, task, created_at, options FROM comb.queues
                 WHERE {QUEUE_WHERE} ORDER BY name LIMIT $4 OFFSET $5"
            ),
            &args,
        )
        .await?;
    let total: i64 = client
        .query_one(
            &format!("SELECT count(*) AS n FROM comb.queues WHERE {QUEUE_WHERE}"),
            &args[..3],
        )
        .await?
        .get("n");
    Ok((rows.iter().map(QueueRow::from_row).collect(), total))
}

/// One queue's catalog row.
pub(crate) async fn queue_row(
    client: &impl GenericClient,
    queue_id: Uuid,
) -> Result<Option<QueueRow>, DbError> {
    Ok(client
        .query_opt(
            "SELECT id, name, namespace, task, created_at, options FROM comb.queues
             WHERE id = $1",
            &[&queue_id],
        )
        .await?
        .as_ref()
        .map(QueueRow::from_row))
}

/// How many of each thing the catalog holds, and every queue's id.
#[derive(Debug, Clone)]
pub(crate) struct Counts {
    pub queues: i64,
    pub partitions: i64,
    pub namespaces: i64,
    pub tasks: i64,
    pub consumer_groups: i64,
    pub queue_ids: Vec<Uuid>,
}

/// The catalog's [`Counts`], in one statement.
pub(crate) async fn counts(client: &impl GenericClient) -> Result<Counts, DbError> {
    let r = client
        .query_one(
            "SELECT (SELECT count(*) FROM comb.queues) AS queues,
                    (SELECT count(*) FROM comb.partitions) AS partitions,
                    (SELECT count(DISTINCT namespace) FROM comb.queues) AS namespaces,
                    (SELECT count(DISTINCT task) FROM comb.queues) AS tasks,
                    (SELECT count(DISTINCT consumer_group) FROM comb.subscriptions) AS groups,
                    ARRAY(SELECT id FROM comb.queues) AS ids",
            &[],
        )
        .await?;
    Ok(Counts {
        queues: r.get("queues"),
        partitions: r.get("partitions"),
        namespaces: r.get("namespaces"),
        tasks: r.get("tasks"),
        consumer_groups: r.get("groups"),
        queue_ids: r.get("ids"),
    })
}

/// The queue column a grouping listing groups by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Grouping {
    Namespace,
    Task,
}

/// Every queue's id with its namespace (or task), for queues that have one.
pub(crate) async fn queues_by(
    client: &impl GenericClient,
    grouping: Grouping,
) -> Result<Vec<(String, Uuid)>, DbError> {
    let col = match grouping {
        Grouping::Namespace => "namespace",
        Grouping::Task => "task",
    };
    Ok(client
        .query(
            &format!("SELECT {col} AS v, id FROM comb.queues WHERE {col} IS NOT NULL"),
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get("v"), r.get("id")))
        .collect())
}

/// A partition's catalog row, with its queue's name.
#[derive(Debug, Clone)]
pub(crate) struct PartitionRow {
    pub id: Uuid,
    pub name: String,
    pub created_at: DateTime<Utc>,
    pub queue: String,
}

/// A page of partitions (of one queue, or of all by queue and name), and how many there
/// are in all.
pub(crate) async fn partition_page(
    client: &impl GenericClient,
    queue_id: Option<Uuid>,
    limit: i64,
    offset: i64,
) -> Result<(Vec<PartitionRow>, i64), DbError> {
    let rows = client
        .query(
            "SELECT p.id, p.name, p.created_at, q.name AS queue FROM comb.partitions p
             JOIN comb.queues q ON q.id = p.queue_id
             WHERE $1::uuid IS NULL OR p.queue_id = $1
             ORDER BY q.name, p.name LIMIT $2 OFFSET $3",
            &[&queue_id, &limit, &offset],
        )
        .await?;
    let total: i64 = client
        .query_one(
            "SELECT count(*) AS n FROM comb.partitions WHERE $1::uuid IS NULL OR queue_id = $1",
            &[&queue_id],
        )
        .await?
        .get("n");
    Ok((
        rows.iter()
            .map(|r| PartitionRow {
                id: r.get("id"),
                name: r.get("name"),
                created_at: r.get("created_at"),
                queue: r.get("queue"),
            })
            .collect(),
        total,
    ))
}

/// The queue's and the partition's names of each partition given that still exists.
pub(crate) async fn partition_names(
    client: &impl GenericClient,
    partitions: &[Uuid],
) -> Result<std::collections::HashMap<Uuid, (String, String)>, DbError> {
    Ok(client
        .query(
            "SELECT p.id, q.name AS queue, p.name FROM comb.partitions p
             JOIN comb.queues q ON q.id = p.queue_id
             WHERE p.id = ANY ($1)",
            &[&partitions],
        )
        .await?
        .iter()
        .map(|r| (r.get("id"), (r.get("queue"), r.get("name"))))
        .collect())
}

/// A group's subscription to a queue, with the queue's name.
#[derive(Debug, Clone)]
pub(crate) struct SubscriptionRow {
    pub queue_id: Uuid,
    pub queue: String,
    pub group: String,
    /// `all`, `new` or `from`.
    pub mode: String,
    pub created_at: DateTime<Utc>,
}

/// Which subscriptions [`subscriptions`] reads.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Subscribers<'a> {
    /// Every group of one queue, the first `limit` groups by name.
    OfQueue(Uuid, i64),
    /// The first `limit` subscriptions by group and queue id.
    First(i64),
    /// One group's, of every queue or of the queue named.
    OfGroup(&'a str, Option<&'a str>),
    /// Every subscription.
    All,
}

/// The subscriptions `which` selects, by group and then queue name.
pub(crate) async fn subscriptions(
    client: &impl GenericClient,
    which: Subscribers<'_>,
) -> Result<Vec<SubscriptionRow>, DbError> {
    const COLUMNS: &str = "s.queue_id, q.name AS queue, s.consumer_group, s.mode, s.created_at";
    let rows = match which {
        Subscribers::OfQueue(queue_id, limit) => {
            client
                .query(
                    &format!(
                        "SELECT {COLUMNS} FROM (SELECT * FROM comb.subscriptions
                                               WHERE queue_id = $1
                                               ORDER BY consumer_group LIMIT $2) s
                         JOIN comb.queues q ON q.id = s.queue_id
                         ORDER BY s.consumer_group"
                    ),
                    &[&queue_id, &limit],
                )
                .await?
        }
        Subscribers::First(limit) => {
            client
                .query(
                    &format!(
                        "SELECT {COLUMNS} FROM (SELECT * FROM comb.subscriptions
                                               ORDER BY consumer_group, queue_id LIMIT $1) s
                         JOIN comb.queues q ON q.id = s.queue_id
                         ORDER BY s.consumer_group, q.name"
                    ),
                    &[&limit],
                )
                .await?
        }
        Subscribers::OfGroup(group, queue) => {
            client
                .query(
                    &format!(
                        "SELECT {COLUMNS} FROM comb.subscriptions s
                         JOIN comb.queues q ON q.id = s.queue_id
                         WHERE s.consumer_group = $1 AND ($2::text IS NULL OR q.name = $2)
                         ORDER BY q.name"
                    ),
                    &[&group, &queue],
                )
                .await?
        }
        Subscribers::All => {
            client
                .query(
                    &format!(
                        "SELECT {COLUMNS} FROM comb.subscriptions s
                         JOIN comb.queues q ON q.id = s.queue_id
                         ORDER BY s.consumer_group, q.name"
                    ),
                    &[],
                )
                .await?
        }
    };
    Ok(rows
        .iter()
        .map(|r| SubscriptionRow {
            queue_id: r.get("queue_id"),
            queue: r.get("queue"),
            group: r.get("consumer_group"),
            mode: r.get("mode"),
            created_at: r.get("created_at"),
        })
        .collect())
}

/// A page of each given queue's partitions by name (`limit` after `offset` per queue), in
/// the queues' order: (queue id, partition id, partition name). On Citus one statement per
/// queue: it cannot plan a `LIMIT` in a lateral subquery over the ids' table function.
pub(crate) async fn partition_pages(
    client: &impl GenericClient,
    backend: Backend,
    queue_ids: &[Uuid],
    limit: i64,
    offset: i64,
) -> Result<Vec<(Uuid, Uuid, String)>, DbError> {
    if !backend.joins_across_partitions() {
        let mut out = Vec::new();
        for id in queue_ids {
            let rows = client
                .query(
                    "SELECT p.id, p.name FROM comb.partitions p WHERE p.queue_id = $1
                     ORDER BY p.name LIMIT $2 OFFSET $3",
                    &[id, &limit, &offset],
                )
                .await?;
            out.extend(rows.iter().map(|r| (*id, r.get("id"), r.get("name"))));
        }
        return Ok(out);
    }
    Ok(client
        .query(
            "SELECT k.id AS queue_id, p.id, p.name
             FROM unnest($1::uuid[]) WITH ORDINALITY AS k(id, i)
             CROSS JOIN LATERAL (SELECT p.id, p.name FROM comb.partitions p
                                 WHERE p.queue_id = k.id
                                 ORDER BY p.name LIMIT $2 OFFSET $3) p
             ORDER BY k.i, p.name",
            &[&queue_ids, &limit, &offset],
        )
        .await?
        .iter()
        .map(|r| (r.get("queue_id"), r.get("id"), r.get("name")))
        .collect())
}

/// Every queue's id.
pub(crate) async fn queue_ids(client: &impl GenericClient) -> Result<Vec<Uuid>, DbError> {
    Ok(client
        .query("SELECT id FROM comb.queues", &[])
        .await?
        .iter()
        .map(|r| r.get("id"))
        .collect())
}

/// The ids of the queues named, each with its name; names of no queue are left out.
pub(crate) async fn queue_ids_by_name(
    client: &impl GenericClient,
    names: &[&str],
) -> Result<Vec<(String, Uuid)>, DbError> {
    Ok(client
        .query(
            "SELECT name, id FROM comb.queues WHERE name = ANY ($1)",
            &[&names],
        )
        .await?
        .iter()
        .map(|r| (r.get("name"), r.get("id")))
        .collect())
}

// Messages, for the administration.

/// The partitions (`id`, `name`, `queue_id`, `queue`: its queue's name) of queue `$q` or only
/// partition `$p` (SQL expressions, NULL for any), by queue and partition name, at most `$max`:
/// a query for a `WITH`, for the message listing's statement.
macro_rules! partitions_by_name {
    ($q:literal, $p:literal, $max:literal) => {
        concat!(
            "SELECT p.id, p.name, p.queue_id, q.name AS queue FROM comb.partitions p
             JOIN comb.queues q ON q.id = p.queue_id
             WHERE (",
            $q,
            "::uuid IS NULL OR p.queue_id = ",
            $q,
            ") AND (",
            $p,
            "::uuid IS NULL OR p.id = ",
            $p,
            ")
             ORDER BY q.name, p.name LIMIT ",
            $max
        )
    };
}
pub(crate) use partitions_by_name;

/// Where a partition sits: its queue's id and name and its own name.
#[derive(Debug, Clone)]
pub(crate) struct PartitionPlace {
    pub queue_id: Uuid,
    pub queue: String,
    pub partition: String,
}

/// The place of each partition given that still exists.
pub(crate) async fn partition_places(
    client: &impl GenericClient,
    partitions: &[Uuid],
) -> Result<std::collections::HashMap<Uuid, PartitionPlace>, DbError> {
    Ok(client
        .query(
            "SELECT p.id, p.queue_id, q.name AS queue, p.name FROM comb.partitions p
             JOIN comb.queues q ON q.id = p.queue_id
             WHERE p.id = ANY ($1)",
            &[&partitions],
        )
        .await?
        .iter()
        .map(|r| {
            let place = PartitionPlace {
                queue_id: r.get("queue_id"),
                queue: r.get("queue"),
                partition: r.get("name"),
            };
            (r.get("id"), place)
        })
        .collect())
}
