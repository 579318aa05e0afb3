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
