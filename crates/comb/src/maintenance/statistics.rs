//! Planner statistics of the tables being written now: the newest message segment and the
//! newest generation of cursor state.
//!
//! Both are read by key in order and stopped early — a partition's messages by position, a
//! cursor's versions newest first — across several child tables. Planned from statistics
//! that say a key holds one row (none taken yet, or taken while the table was empty, as a
//! database-wide `ANALYZE` does to a table made ahead), the planner reads every row of the
//! key and sorts them instead of taking the ordered index scans, which for a busy partition
//! or cursor reads thousands of rows to return a few. Autovacuum gets there too, but on its
//! own schedule, and a generation lives only seconds; this analyses each table once enough of
//! it changed since its last statistics. The tables also carry a fixed number of distinct
//! partition ids (set when made), so that what ANALYZE samples never makes a key look
//! shallow.

use deadpool_postgres::Client;

use super::Settings;
use super::locks::{give_way, lock_timeout_sql};
use crate::db::DbError;

/// How many partitions the planner assumes a segment holds (schema version 5): every
/// partition looks deep, so reads of one partition in position order take the primary key.
pub(crate) const PARTITIONS_PER_SEGMENT: u32 = 100;

/// How many partitions the planner assumes a generation of cursor state holds (schema
/// version 6): one, so that any cursor may own the whole generation, which is what a busy
/// cursor does.
pub(crate) const PARTITIONS_PER_GENERATION: u32 = 1;

/// Rows ANALYZE samples from a table being written: 300 × this target, a tenth of the
/// default's 30,000. The plans that matter are fixed in shape (distinct partition ids are
/// set per table, the data path prices out whole-table reads), so these statistics only need
/// the table's density and rough column figures; with the default sample, analysing a
/// segment that grows at 100,000 rows a second cost a third to two thirds of a second of
/// CPU each time.
const SAMPLE_TARGET: u32 = 10;

/// Analyses the newest segment once a fifth of it (and at least 1,000 rows) changed since its
/// last statistics, and the newest generation once it doubled (and at least 1,000 rows):
/// its row count is taken from its size as it grows, only the rows per cursor need a sample.
/// Returns how many tables it analysed.
pub(crate) async fn refresh(client: &Client, settings: &Settings) -> Result<u32, DbError> {
    let due = client
        .query(
            concat!(
                "SELECT c.oid::regclass::text
             FROM pg_class c
             JOIN pg_stat_user_tables t ON t.relid = c.oid
             WHERE c.relnamespace = 'comb'::regnamespace
               AND ((c.relname = 'messages_' || ",
                crate::messages::segments::newest_segment!(),
                "
                     AND t.n_mod_since_analyze >= greatest(1000, 0.2 * greatest(c.reltuples, 0)))
                 OR (c.relname = 'cursor_states_' || ",
                crate::cursor::newest_gen!(),
                "
                     AND t.n_mod_since_analyze >= greatest(1000, greatest(c.reltuples, 0))))"
            ),
            &[],
        )
        .await?;
    let mut analysed = 0;
    for row in due {
        let t: String = row.get(0);
        let sql = format!(
            "BEGIN; {}; SET LOCAL default_statistics_target = {SAMPLE_TARGET}; ANALYZE {t}; COMMIT;",
            lock_timeout_sql(settings)
        );
        if give_way(client, &sql).await? {
            analysed += 1;
        }
    }
    Ok(analysed)
}
