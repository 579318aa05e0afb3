//! Per-table counters and sizes of one schema, read from `pg_stat_user_tables` and the size
//! functions.
//!
//! The long runs (`comb-bench xmin`, `comb-bench soak`) judge storage by what PostgreSQL itself
//! reports for every table of a system, message segments included, so that bloat or growth
//! anywhere in the schema shows, not only in the tables a run expects to grow.

use tokio_postgres::Client;

use crate::http::BoxError;

/// Per table of one schema: activity counters and sizes. Leaf partitions are tables of their
/// own (`relkind = 'r'`); partitioned parents hold no data and are left out.
const TABLES_SQL: &str = "
SELECT c.relname::text,
       coalesce(s.n_dead_tup, 0)::int8, coalesce(s.n_live_tup, 0)::int8,
       coalesce(s.n_tup_ins, 0)::int8, coalesce(s.n_tup_upd, 0)::int8,
       coalesce(s.n_tup_hot_upd, 0)::int8, coalesce(s.n_tup_del, 0)::int8,
       coalesce(s.autovacuum_count + s.vacuum_count, 0)::int8,
       coalesce(pg_table_size(c.oid), 0)::int8, coalesce(pg_indexes_size(c.oid), 0)::int8,
       coalesce(pg_total_relation_size(c.oid), 0)::int8
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE n.nspname = $1 AND c.relkind = 'r'
ORDER BY c.relname";

/// Counters and sizes of one table. The counters lag: backends flush them at most once a
/// second while busy and within about 10 s when idle.
#[derive(Debug, Clone, Default)]
pub struct TableStat {
    /// Table name (without the schema).
    pub name: String,
    /// `n_dead_tup`.
    pub dead: i64,
    /// `n_live_tup`.
    pub live: i64,
    /// `n_tup_ins`.
    pub ins: i64,
    /// `n_tup_upd`.
    pub upd: i64,
    /// `n_tup_hot_upd`.
    pub hot_upd: i64,
    /// `n_tup_del`.
    pub del: i64,
    /// Autovacuum and vacuum runs since the table was made.
    pub vacuums: i64,
    /// Heap including TOAST (`pg_table_size`), bytes.
    pub table_bytes: i64,
    /// All indexes (`pg_indexes_size`), bytes.
    pub index_bytes: i64,
    /// Heap, TOAST and indexes (`pg_total_relation_size`), bytes.
    pub total_bytes: i64,
}

/// Whether a table of schema `comb` is a message segment (`messages_<n>`), the storage that
/// retention reclaims a whole table at a time.
pub fn is_message_table(name: &str) -> bool {
    name.strip_prefix("messages_")
        .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
}

/// Every table of `schema`, by name.
pub async fn tables(client: &Client, schema: &str) -> Result<Vec<TableStat>, BoxError> {
    let rows = client.query(TABLES_SQL, &[&schema]).await?;
    Ok(rows
        .iter()
        .map(|r| TableStat {
            name: r.get(0),
            dead: r.get(1),
            live: r.get(2),
            ins: r.get(3),
            upd: r.get(4),
            hot_upd: r.get(5),
            del: r.get(6),
            vacuums: r.get(7),
            table_bytes: r.get(8),
            index_bytes: r.get(9),
            total_bytes: r.get(10),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_tables_are_the_numbered_segments() {
        assert!(is_message_table("messages_1"));
        assert!(is_message_table("messages_123"));
        assert!(!is_message_table("messages"));
        assert!(!is_message_table("messages_"));
        assert!(!is_message_table("messages_transaction"));
        assert!(!is_message_table("cursors"));
    }
}
