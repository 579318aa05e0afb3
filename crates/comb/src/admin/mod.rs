//! Administration: what operators read about queues, partitions, consumer groups, messages
//! and dead letters, and what they change (clear, seek, requeue, purge, modes).
//!
//! Reads are index probes per partition and cursor (heads, latest cursor states, the one
//! message after a cursor) and every listing is paged with a capped `limit`, so no answer
//! reads message storage in bulk. Changes are written the way the data path writes: a moved
//! cursor is a new cursor state version, a requeued dead letter a row of its own.
//! Answers are Rust types serialised in Queen's shapes (field names, nesting, nulls); the SQL
//! returns plain columns read by name, and JSON comes from the database only where it is stored
//! data (payloads, trace data, queue options).

pub mod cursors;
pub mod dead_letters;
pub mod groups;
pub mod messages;
pub mod modes;
pub mod resources;
pub mod servers;
pub mod status;
pub mod traces;

use crate::backend::Backend;
use crate::code::Code;
use crate::refusal::Refusal;

/// Refuses `what`, an administrative action not available on a Citus cluster yet, before
/// anything is read or written: it moves cursors or locks dead letters of several partitions
/// in statements Citus cannot run (`docs/scale-out.md`, "Not yet"). Nothing on PostgreSQL.
pub(crate) fn not_on_cluster(backend: Backend, what: &str) -> Result<(), Refusal> {
    if !backend.moves_cursors_of_many_partitions() {
        return Err(Refusal::unsupported(
            Code::UnsupportedOnCluster,
            format!("{what} is not available on a Citus cluster yet"),
        ));
    }
    Ok(())
}

/// How answers write values the way Queen's clients read them.
pub(crate) mod wire {
    use chrono::{DateTime, SecondsFormat, Utc};
    use serde::Serializer;

    /// A time as Queen writes it: UTC, milliseconds, `Z` (`comb.iso` in SQL writes the same).
    pub(crate) fn iso<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&t.to_rfc3339_opts(SecondsFormat::Millis, true))
    }

    /// A figure as PostgreSQL writes a `float8` in JSON: a whole number without a fraction
    /// (`0`, not `0.0`), so answers and the CLI's tables read as they always have.
    pub(crate) fn num<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
        if x.fract() == 0.0 && x.abs() < 9.0e15 {
            s.serialize_i64(*x as i64)
        } else {
            s.serialize_f64(*x)
        }
    }

    /// [`num`] of a figure that may be absent (`null`).
    pub(crate) fn num_opt<S: Serializer>(x: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
        match x {
            Some(x) => num(x, s),
            None => s.serialize_none(),
        }
    }

    /// [`iso`] of a time that may be absent (`null`).
    pub(crate) fn iso_opt<S: Serializer>(
        t: &Option<DateTime<Utc>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => iso(t, s),
            None => s.serialize_none(),
        }
    }
    #[cfg(test)]
    mod tests {
        use chrono::TimeZone;

        #[derive(serde::Serialize)]
        struct Figures {
            #[serde(serialize_with = "super::num")]
            whole: f64,
            #[serde(serialize_with = "super::num")]
            fraction: f64,
            #[serde(serialize_with = "super::num_opt")]
            absent: Option<f64>,
            #[serde(serialize_with = "super::iso")]
            at: chrono::DateTime<chrono::Utc>,
        }

        #[test]
        fn figures_and_times_are_written_as_the_database_wrote_them() {
            let at = chrono::Utc
                .timestamp_opt(1_700_000_000, 123_456_789)
                .single()
                .unwrap();
            let figures = Figures {
                whole: 0.0,
                fraction: 1.5,
                absent: None,
                at,
            };
            assert_eq!(
                serde_json::to_string(&figures).unwrap(),
                r#"{"whole":0,"fraction":1.5,"absent":null,"at":"2023-11-14T22:13:20.123Z"}"#
            );
        }
    }
}

/// Most rows a listing answers at once.
pub const MAX_LIMIT: i64 = 1000;

/// Most rows a listing skips: deeper pages would read that much to skip it.
pub const MAX_OFFSET: u64 = 100_000;

/// Rows a listing answers when the request does not say.
pub const DEFAULT_LIMIT: i64 = 100;

/// A page of a listing: `limit` rows after skipping `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page {
    pub limit: i64,
    pub offset: i64,
}

impl Page {
    /// A page from request values; `limit` above [`MAX_LIMIT`] is refused, not silently cut.
    pub fn new(limit: Option<u64>, offset: Option<u64>) -> Result<Page, Refusal> {
        let limit = limit.map_or(DEFAULT_LIMIT, |l| l.min(i64::MAX as u64) as i64);
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(Refusal::invalid(
                Code::LimitInvalid,
                format!("limit must be between 1 and {MAX_LIMIT}"),
            ));
        }
        let offset = offset.unwrap_or(0);
        if offset > MAX_OFFSET {
            return Err(Refusal::invalid(
                Code::OffsetInvalid,
                format!("offset may be at most {MAX_OFFSET}"),
            ));
        }
        let offset = offset as i64;
        Ok(Page { limit, offset })
    }
}

impl Default for Page {
    fn default() -> Page {
        Page {
            limit: DEFAULT_LIMIT,
            offset: 0,
        }
    }
}

/// Makes sure some group reads the queue before an operator settles messages in it: with no
/// subscription there is no cursor to record the change in, and the messages would be
/// handed out later as if nothing had been done. The queue-mode group (what a pop without a
/// group reads) is then subscribed from the start.
pub(crate) async fn ensure_a_reader(
    pool: &deadpool_postgres::Pool,
    catalog: &crate::catalog::Catalog,
    queue_id: uuid::Uuid,
) -> Result<(), Refusal> {
    let subscribed = crate::catalog::listing::is_subscribed(&**pool.get().await?, queue_id).await?;
    if !subscribed {
        catalog
            .ensure_subscription(
                pool,
                queue_id,
                crate::queue::QUEUE_MODE_GROUP,
                crate::catalog::StartFrom::All,
            )
            .await?;
    }
    Ok(())
}

/// The id of a queue by name, or a `NotFound` [`Refusal`].
pub(crate) async fn queue_id(
    client: &impl tokio_postgres::GenericClient,
    queue: &str,
) -> Result<uuid::Uuid, Refusal> {
    crate::catalog::listing::queue_id(client, queue)
        .await?
        .ok_or_else(|| {
            Refusal::not_found(
                Code::QueueNotFound,
                format!("queue `{queue}` does not exist"),
            )
        })
}

/// The id of a partition of a queue by name, or a `NotFound` [`Refusal`].
pub(crate) async fn partition_id(
    client: &impl tokio_postgres::GenericClient,
    backend: Backend,
    queue_id: uuid::Uuid,
    queue: &str,
    partition: &str,
) -> Result<uuid::Uuid, Refusal> {
    crate::catalog::listing::partition_id(client, backend, queue_id, partition)
        .await?
        .ok_or_else(|| {
            Refusal::not_found(
                Code::PartitionNotFound,
                format!("queue `{queue}` has no partition `{partition}`"),
            )
        })
}

/// The ids of a queue and, if named, one of its partitions; a `NotFound` [`Refusal`] otherwise.
pub(crate) async fn queue_and_partition(
    client: &impl tokio_postgres::GenericClient,
    backend: Backend,
    queue: &str,
    partition: Option<&str>,
) -> Result<(uuid::Uuid, Option<uuid::Uuid>), Refusal> {
    let id = queue_id(client, queue).await?;
    let partition_id = match partition {
        Some(p) => Some(partition_id(client, backend, id, queue, p).await?),
        None => None,
    };
    Ok((id, partition_id))
}
