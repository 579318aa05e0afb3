//! The cursor of a (partition, group): its identity row in `comb.cursors` and its state as
//! insert-only versions in `comb.cursor_states`.
//!
//! Every writer of a state version (claims, acks, lease extension, lease expiry) inserts one
//! full row with `ver` one above the version it follows; the column list is written once,
//! here, so the writers cannot disagree on it.

/// `INSERT INTO comb.cursor_states (…every column…)`, for statements that append a full state
/// version; the `SELECT` that follows gives the columns in this order: partition, group,
/// generation, version, position, position's segment, settled positions, attempt positions,
/// attempt counts, lease id, lease end, last position leased, available from, last claimed.
macro_rules! insert_state {
    () => {
        "INSERT INTO comb.cursor_states
    (partition_id, consumer_group, gen, ver, cursor_pos, cursor_seg, settled, attempt_pos,
     attempt_cnt, lease_id, lease_expires_at, lease_upto, available_at, last_claimed_at)"
    };
}
pub(crate) use insert_state;

/// `INSERT INTO comb.cursor_states (…)` for a cursor's first version: its position and its
/// lease bound given, every other column the table's default (no lease, nothing settled).
/// The `SELECT` that follows gives partition, group, generation, version, position, lease
/// bound.
macro_rules! insert_first_state {
    () => {
        "INSERT INTO comb.cursor_states
    (partition_id, consumer_group, gen, ver, cursor_pos, lease_upto)"
    };
}
pub(crate) use insert_first_state;

/// The generation a new state version goes into: the newest, read inside the writing
/// statement itself, so a statement never writes into a generation maintenance has left.
macro_rules! newest_gen {
    () => {
        "(SELECT max(gen) FROM comb.cursor_gens)"
    };
}
pub(crate) use newest_gen;

/// The (partition, group) pairs any state version of which holds lease `$1`, each once: a
/// subquery for statements that find a lease's cursors.
macro_rules! lease_holders {
    () => {
        "SELECT DISTINCT partition_id, consumer_group FROM comb.cursor_states WHERE lease_id = $1"
    };
}
pub(crate) use lease_holders;

/// The statements of the state generations' lifecycle, which `maintenance::generations`
/// runs (when, and under which lock timeout, is its choice).
pub(crate) mod generations {
    /// The table of one generation.
    pub(crate) fn table(generation: i32) -> String {
        format!("comb.cursor_states_{generation}")
    }

    /// Every generation, oldest first, with the age of each in seconds.
    pub(crate) const LIST_SQL: &str = "SELECT gen, extract(epoch FROM now() - created_at)::float8
             FROM comb.cursor_gens ORDER BY gen";

    /// Sends writers to generation `$1`: they read the newest inside their own statements.
    pub(crate) const START_SQL: &str =
        "INSERT INTO comb.cursor_gens (gen) VALUES ($1) ON CONFLICT DO NOTHING";

    /// Every column of the state, quoted, in order.
    pub(crate) const COLUMNS_SQL: &str = "SELECT quote_ident(attname) FROM pg_attribute
             WHERE attrelid = 'comb.cursor_states'::regclass AND attnum > 0 AND NOT attisdropped
             ORDER BY attnum";

    /// Makes generation `next`'s table and attaches it, with `n_distinct` partitions assumed.
    /// Built standalone and then attached: ATTACH takes only SHARE UPDATE EXCLUSIVE on the
    /// parent, which neither readers nor writers conflict with, where CREATE … PARTITION OF
    /// would queue an ACCESS EXCLUSIVE lock in front of all traffic. The indexes match the
    /// parent's, so ATTACH adopts them instead of building its own; the CHECK constraint
    /// spares it a validation scan.
    pub(crate) fn make_sql(next: i32, n_distinct: u32) -> String {
        let t = table(next);
        let end = next + 1;
        format!(
            "CREATE TABLE {t} (LIKE comb.cursor_states INCLUDING DEFAULTS INCLUDING STORAGE);
         CREATE INDEX ON {t} (partition_id, consumer_group, gen, ver);
         CREATE INDEX ON {t} (lease_id) WHERE lease_id IS NOT NULL;
         ALTER TABLE {t} ALTER COLUMN partition_id SET (n_distinct = {n_distinct});
         ALTER TABLE {t} ADD CONSTRAINT cursor_states_{next}_gen
             CHECK (gen >= {next} AND gen < {end});
         ALTER TABLE comb.cursor_states ATTACH PARTITION {t} FOR VALUES FROM ({next}) TO ({end});"
        )
    }

    /// Locks generation `old`, copies the latest version of each cursor still living there
    /// into generation `newest` (`columns` of [`COLUMNS_SQL`]), drops its table and forgets
    /// it: four statements, the copy second.
    ///
    /// SHARE waits for any writer still inserting into the old generation (its statement
    /// chose it just before the newest took over) and keeps new ones out; readers go on.
    /// The copy starts from the cursors that exist, so states of deleted queues stay
    /// behind, and skips cursors that already have this version or a later one in a newer
    /// generation. (`gen >= n + 1` rather than `gen > n`: only the former prunes `n`.)
    /// The latest version is ordered by (gen, ver), as the index is: by `ver` alone the
    /// planner would read and sort every version of the cursor.
    pub(crate) fn carry_forward_sql(old: i32, newest: i32, columns: &[String]) -> String {
        let t = table(old);
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
        format!(
            "LOCK TABLE {t} IN SHARE MODE;
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
             DELETE FROM comb.cursor_gens WHERE gen = {old};",
            into = table(newest),
            columns = columns.join(", "),
            values = values.join(", "),
            newer = old + 1,
        )
    }
}

#[cfg(test)]
mod tests {
    /// The list names every column of the table as the migrations create it, in order.
    #[test]
    fn the_column_list_is_the_tables() {
        let sql: String = crate::schema::MIGRATIONS
            .iter()
            .map(|m| m.sql)
            .collect::<Vec<_>>()
            .join("\n");
        let code: String = sql
            .lines()
            .map(|l| l.split("--").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        let start = code
            .find("CREATE TABLE comb.cursor_states (")
            .expect("the table is created");
        let body = &code[start + "CREATE TABLE comb.cursor_states (".len()..];
        let (mut depth, mut parts, mut part) = (0, Vec::new(), String::new());
        for c in body.chars() {
            match c {
                '(' => depth += 1,
                ')' if depth == 0 => break,
                ')' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(std::mem::take(&mut part));
                    continue;
                }
                _ => {}
            }
            part.push(c);
        }
        parts.push(part);
        let columns: Vec<String> = parts
            .iter()
            .filter_map(|p| p.split_whitespace().next().map(str::to_string))
            .filter(|c| !c.eq_ignore_ascii_case("PRIMARY"))
            .collect();
        let listed = insert_state!();
        let listed = &listed[listed.find('(').unwrap() + 1..listed.find(')').unwrap()];
        let listed: Vec<String> = listed.split(',').map(|c| c.trim().to_string()).collect();
        assert_eq!(listed, columns);
    }
}
