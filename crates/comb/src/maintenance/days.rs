//! Tables kept by the day (traces, per-minute counters and figures): the next days' tables made ahead,
//! tables past their retention dropped whole. Nothing in them is ever updated or deleted
//! row by row.

use chrono::{Days, NaiveDate, Utc};
use deadpool_postgres::Client;

use super::Settings;
use super::locks::{give_way, lock_timeout_sql};
use crate::db::DbError;

/// The tables kept by the day.
pub(super) const TABLES: &[&str] = &[
    "traces",
    "server_minutes",
    "queue_counts",
    "queue_minutes",
    "group_minutes",
];

/// Days made ahead of the current one.
const AHEAD: u64 = 2;

/// How many days a daily table is kept, today included.
pub(super) const RETENTION_DAYS: u64 = 7;

fn leaf(table: &str, day: NaiveDate) -> String {
    format!("comb.{table}_{}", day.format("%Y%m%d"))
}

/// Makes the tables of today and the next days that are missing; returns how many.
pub(super) async fn make_ahead(client: &Client, settings: &Settings) -> Result<i32, DbError> {
    let today = Utc::now().date_naive();
    let mut made = 0;
    for table in TABLES {
        for ahead in 0..=AHEAD {
            let day = today + Days::new(ahead);
            let t = leaf(table, day);
            let exists: bool = client
                .query_one("SELECT to_regclass($1) IS NOT NULL", &[&t])
                .await?
                .get(0);
            if exists {
                continue;
            }
            // Standalone, then attached: ATTACH takes only SHARE UPDATE EXCLUSIVE on the
            // parent; the CHECK constraint spares it a validation scan.
            let next = day + Days::new(1);
            let sql = format!(
                "BEGIN; {lt};
                 CREATE TABLE {t} (LIKE comb.{table} INCLUDING DEFAULTS INCLUDING STORAGE);
                 ALTER TABLE {t} ADD CONSTRAINT {name}_day CHECK (day >= '{day}' AND day < '{next}');
                 ALTER TABLE comb.{table} ATTACH PARTITION {t} FOR VALUES FROM ('{day}') TO ('{next}');
                 COMMIT;",
                lt = lock_timeout_sql(settings),
                name = t.trim_start_matches("comb."),
            );
            if give_way(client, &sql).await? {
                made += 1;
            }
        }
    }
    Ok(made)
}

/// Drops the daily tables older than [`RETENTION_DAYS`]; returns how many.
pub(super) async fn drop_expired(client: &Client, settings: &Settings) -> Result<i32, DbError> {
    let oldest_kept = Utc::now().date_naive() - Days::new(RETENTION_DAYS - 1);
    let mut dropped = 0;
    for table in TABLES {
        let rows = client
            .query(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                 WHERE i.inhparent = to_regclass($1)",
                &[&format!("comb.{table}")],
            )
            .await?;
        for r in rows {
            let name: String = r.get(0);
            let Some(day) = name
                .rsplit('_')
                .next()
                .and_then(|d| NaiveDate::parse_from_str(d, "%Y%m%d").ok())
            else {
                continue;
            };
            if day >= oldest_kept {
                continue;
            }
            let sql = format!(
                "BEGIN; {lt}; DROP TABLE comb.{name}; COMMIT;",
                lt = lock_timeout_sql(settings)
            );
            if give_way(client, &sql).await? {
                dropped += 1;
            }
        }
    }
    Ok(dropped)
}
