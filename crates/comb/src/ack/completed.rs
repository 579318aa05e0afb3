//! Acks that only complete messages under their cursor's live lease, the common case, judged
//! in SQL: the cursors are locked, their next versions written and the transaction committed
//! in one call of two statements, where the general path ([`super::store`]) reads the
//! state, applies the rules in memory and writes back in two. The SQL follows the rules of
//! [`Cursor::apply`](crate::cursor::Cursor::apply) for this case exactly; a cursor it cannot judge (a
//! message not in the lease, one settled already, another lease, an expired one, no cursor)
//! is left untouched, and its acks go the general way.

use std::collections::HashMap;

use tokio_postgres::Statement;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use super::{AckItem, AckOutcome, AckStatus};
use crate::db::DbError;

/// The judgement's reads, up to the cursors' next positions (`moved`): the cursors of the
/// items, their state read by `$state`, their acked messages named by `$messages`.
macro_rules! judge_reads {
    (state: $state:expr; messages: $messages:literal) => {
        concat!(
            "
WITH c AS (
    SELECT i.partition_id, i.consumer_group, i.lease_id, ($4::text[])[i.lo:i.hi] AS txids,
           i.digest
    FROM unnest($1::uuid[], $2::text[], $3::uuid[], $5::int[], $6::int[], $7::bytea[])
        AS i(partition_id, consumer_group, lease_id, lo, hi, digest)
),
judged AS MATERIALIZED (
    SELECT c.partition_id, c.consumer_group, s.ver, s.cursor_pos, s.cursor_seg, s.settled,
           s.attempt_pos, s.attempt_cnt, s.lease_id, s.lease_expires_at, s.lease_upto,
           s.available_at, s.last_claimed_at, f.pos AS acked, f.seg AS acked_seg, f.base,
           CASE WHEN f.whole THEN ARRAY(SELECT x FROM unnest(s.settled) x
                                         WHERE x > s.lease_upto ORDER BY x)
                WHEN cardinality(s.settled) = 0 THEN f.pos
                ELSE ARRAY(SELECT DISTINCT x FROM unnest(s.settled || f.pos) x ORDER BY x)
           END AS merged
    FROM c
    CROSS JOIN LATERAL ",
            $state,
            " s
    CROSS JOIN LATERAL (
        -- The lease's digest, set by its claim, kept only while nothing moved the cursor:
        -- the acked ids are
        -- exactly the lease's, every message of it is settled, and the position moves from
        -- its last one (`base`, with its segment) over what was settled beyond. No message
        -- is read but that last one's segment, and the branches below never run.
        SELECT ARRAY[s.lease_upto] AS pos,
               ARRAY[coalesce((SELECT m.seg FROM ",
            crate::messages::partition_messages!($messages),
            "
                                 AND m.pos = s.lease_upto AND m.seg >= s.cursor_seg LIMIT 1),
                              s.cursor_seg)] AS seg,
               cardinality(c.txids)::bigint AS found, s.lease_upto AS base, true AS whole
        WHERE s.lease_digest = c.digest
        UNION ALL
        -- The lease's whole range, read when the ack names as many messages as it spans:
        -- taken when its messages are exactly the acked ones (compared sorted), and then
        -- the probe below never runs (`LIMIT 1`).
        SELECT w.pos, w.seg, w.found, s.cursor_pos, false FROM (
            SELECT array_agg(m.pos) AS pos, array_agg(m.seg) AS seg, count(*) AS found,
                   array_agg(m.transaction_id ORDER BY m.transaction_id COLLATE \"C\") AS txids
            FROM (
                SELECT m.pos, m.seg, m.transaction_id FROM ",
            crate::messages::partition_messages!($messages),
            "
                  AND m.pos > s.cursor_pos AND m.pos <= s.lease_upto AND m.seg >= s.cursor_seg
                  AND cardinality(c.txids) = s.lease_upto - s.cursor_pos
                ORDER BY m.pos
            ) m
        ) w WHERE w.txids = c.txids
        UNION ALL
        -- Aggregated in the order the subquery sorts them: one sort for both arrays.
        SELECT array_agg(m.pos) AS pos, array_agg(m.seg) AS seg, count(*) AS found,
               s.cursor_pos, false
        FROM (
            SELECT m.pos, m.seg FROM ",
            crate::messages::partition_messages!($messages),
            " AND m.transaction_id = ANY (c.txids)
              AND m.pos > s.cursor_pos AND m.pos <= s.lease_upto AND m.seg >= s.cursor_seg
            ORDER BY m.pos
        ) m
        LIMIT 1
    ) f
    WHERE s.lease_id IS NOT NULL AND s.lease_expires_at > now()
      AND (c.lease_id IS NULL OR s.lease_id = c.lease_id)
      AND f.found = cardinality(c.txids)
      AND NOT (f.pos && s.settled)
),
moved AS (
    SELECT j.*, j.base + r.run AS next_pos
    FROM judged j
    CROSS JOIN LATERAL (
        -- Settled positions are distinct and above the base (the position, or the lease's
        -- last message when it is settled whole), so the k-th equals base + k exactly along
        -- the run that starts right after it.
        SELECT coalesce(max(x.k), 0) AS run
        FROM unnest(j.merged) WITH ORDINALITY AS x(p, k)
        WHERE x.p = j.base + x.k
    ) r
)"
        )
    };
}

/// The next version of each moved cursor, as the judgement's insert selects it, into
/// generation `$gen`.
macro_rules! judge_select {
    (gen: $gen:expr) => {
        concat!(
            "SELECT m.partition_id, m.consumer_group, ",
            $gen,
            ", m.ver + 1,
           m.next_pos,
           greatest(m.cursor_seg, (SELECT max(a.seg) FROM unnest(m.acked, m.acked_seg)
                                       AS a(pos, seg) WHERE a.pos <= m.next_pos)),
           ARRAY(SELECT x FROM unnest(m.merged) x WHERE x > m.next_pos),
           ARRAY(SELECT a FROM unnest(m.attempt_pos) a WHERE a > m.next_pos),
           ARRAY(SELECT n FROM unnest(m.attempt_pos, m.attempt_cnt) AS x(a, n)
                 WHERE a > m.next_pos),
           CASE WHEN m.next_pos >= m.lease_upto THEN NULL ELSE m.lease_id END,
           CASE WHEN m.next_pos >= m.lease_upto THEN NULL ELSE m.lease_expires_at END,
           m.lease_upto, m.available_at, m.last_claimed_at
    FROM moved m"
        )
    };
}

/// Judges and writes the cursors of completing acks, one row per cursor (`$1` partition, `$2`
/// group, `$3` the lease id its items name, NULL for none), with its acked transaction ids,
/// distinct and in byte order, at `$5[k]..=$6[k]` of `$4`, and their digest `$7`
/// ([`Cursors`]), and returns each
/// cursor it moved with whether its lease ended and its partition's and queue's names. The
/// cursors must be locked by an earlier statement of the transaction, whose snapshot this one
/// then follows.
///
/// A cursor is judged when its lease is live, its items name that lease or none, and every
/// acked message lies in the lease's range above the position, not settled yet. Its acked
/// positions join the settled ones; the position moves over the run that follows it (and
/// the segment to the last settled message's), attempts at or below it are forgotten, and
/// the lease ends once the position reaches the lease's last message.
///
/// The broker groups the items by cursor: the unnest, sort and de-duplication of every item
/// cost a third of the judgement of a large ack here. The acked messages are sorted once (a
/// subquery feeding both arrays), and with nothing settled the acked positions are the merge
/// as they are (sorted, and distinct: positions are unique).
///
/// An ack of a lease's whole batch, the usual case with large pops, is judged as a move of the
/// cursor alone while nothing moved the cursor since its claim: the claim wrote the digest of
/// the ids it leased (an extension carries it), and the broker sends the digest of the acked
/// ones; when they are equal, no message is read but the last one's segment. Otherwise (the
/// digest is gone once another writer wrote a version, as a partial ack does, or was never
/// written, by a hand-off or a server that does not know it), such an ack is judged by reading the
/// lease's range once and comparing its transaction ids with the acked ones, sorted. The probe
/// by ids runs through the range by position, testing each message against every acked id
/// (`= ANY` of an array is a linear search), quadratic in the batch: an ack of 1,000 took
/// 8.7 ms there, 1.6 ms compared whole. Positions are dense in a lease's range unless
/// retention dropped some, so the range is read only when the ack names as many messages
/// as it spans; anything else goes by the probe, with the same result.
macro_rules! judge_sql {
    (state: $state:expr; messages: $messages:literal; partition: $partition:literal) => {
        judge_sql!(state: $state; messages: $messages; partition: $partition;
            gen: crate::cursor::newest_gen!())
    };
    (state: $state:expr; messages: $messages:literal; partition: $partition:literal;
     gen: $gen:expr) => {
        concat!(
            "",
            judge_reads!(state: $state; messages: $messages),
            ",
written AS (
    ",
            crate::cursor::insert_state!(),
            "
    ",
            judge_select!(gen: $gen),
            "
    RETURNING partition_id, consumer_group, lease_id IS NULL AS released
)
SELECT w.partition_id, w.consumer_group, w.released, p.name AS partition, q.name AS queue
FROM written w
",
            crate::catalog::join_partition_and_queue!($partition)
        )
    };
}

/// The judgement of completing acks (see [`judge_sql!`]).
pub const JUDGE_SQL: &str = judge_sql!(
    state: crate::cursor::state_of!("c.partition_id", "c.consumer_group");
    messages: "c.partition_id";
    partition: "w.partition_id"
);

/// The acks of one partition on Citus as one function of it (`a_partition`), made by `comb
/// migrate` ([`crate::schema::citus::delegate`]) and called alone, outside a transaction
/// block: Citus sends the call to the partition's worker, which runs it as a transaction of
/// its own and commits it there in one phase. Its statements, each a router statement of
/// the worker's shards: the cursors' lock (in the order of [`crate::cursor::LOCK_SQL`]), the
/// partition's and queue's names, the newest generation, then the judgement's reads
/// ([`judge_reads!`], for the cursors of one partition, `$8`, named to every distributed
/// table; the state read by a subquery: `comb.cursor_state` run on the worker would be a
/// distributed query from a shard) and, for each cursor it moved, the insert
/// of the new version from variables ([`crate::cursor::StateByValues`]). Sent from the
/// coordinator as two statements, the insert (a data-modifying CTE, which Citus never routes
/// whole) was a step of its own, with intermediate results through the coordinator, and the
/// ack committed in two phases; run whole on the worker, the same steps sent their results
/// to every node and the worker committed them in two phases. (Not `force_delegation`: the
/// call is a transaction of its own.)
pub(crate) static JUDGE_CITUS_FUNCTION: std::sync::LazyLock<String> = std::sync::LazyLock::new(
    || {
        let reads = judge_reads!(
            state: crate::cursor::state_in_partition!("c.partition_id", "c.consumer_group", one "$8");
            messages: "c.partition_id AND m.partition_id = $8"
        );
        let state =
            crate::cursor::StateByValues::of(judge_select!(gen: "judge_newest_gen"), "judge");
        crate::schema::citus::function_of_partition(
            crate::schema::versioned!("comb.judge_acks"),
            "a_partitions uuid[], a_groups text[], a_leases uuid[], a_txids text[], \
             a_lo int[], a_hi int[], a_digests bytea[], a_partition uuid",
            "partition_id uuid, consumer_group text, released boolean, partition text, \
             queue text",
            &format!(
                "DECLARE
{declare}    judge_partition text;
    judge_queue text;
BEGIN
    PERFORM 1 FROM {cursors} WHERE c.partition_id = $8 AND c.consumer_group = ANY($2)
        ORDER BY c.consumer_group FOR NO KEY UPDATE OF c;
    SELECT p.name, q.name INTO judge_partition, judge_queue
        FROM (SELECT $8::uuid) AS w(partition_id)
        {names}
        WHERE p.id = $8;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    {newest_gen};
    FOR {vars} IN
{reads}
{select}
    LOOP
        {insert};
        RETURN QUERY SELECT judge_partition_id, judge_consumer_group,
            judge_lease_id IS NULL, judge_partition, judge_queue;
    END LOOP;
END;",
                declare = state.declare,
                cursors = crate::cursor::cursors!(),
                names = crate::catalog::join_partition_and_queue!("w.partition_id"),
                newest_gen = state.newest_gen,
                vars = state.vars,
                select = state.select,
                insert = state.insert,
            ),
        )
    },
);

/// [`JUDGE_CITUS_FUNCTION`]'s signature, distribution argument and delegation (not forced).
pub(crate) const JUDGE_CITUS_SIGNATURE: (&str, &str, bool) = (
    concat!(
        crate::schema::versioned!("comb.judge_acks"),
        "(uuid[], text[], uuid[], text[], integer[], integer[], bytea[], uuid)"
    ),
    "a_partition",
    false,
);

/// The call of [`JUDGE_CITUS_FUNCTION`], with [`JUDGE_SQL`]'s parameters and the partition: the
/// judgement of one partition's acks on Citus.
pub(crate) const JUDGE_CITUS_CALL: &str = concat!(
    "SELECT * FROM ",
    crate::schema::versioned!("comb.judge_acks"),
    "($1::uuid[], $2::text[], $3::uuid[], $4::text[], $5::int[], $6::int[], $7::bytea[],
      $8::uuid)"
);

/// Which items of `items` (by index) belong to cursors whose every item completes a message:
/// the ones [`JUDGE_SQL`] may judge.
pub(crate) fn completing(items: &[&AckItem]) -> Vec<usize> {
    let mut all_complete: HashMap<(Uuid, &str), bool> = HashMap::new();
    for i in items {
        *all_complete
            .entry((i.partition_id, i.group.as_str()))
            .or_insert(true) &= i.status == AckStatus::Completed;
    }
    (0..items.len())
        .filter(|&k| all_complete[&(items[k].partition_id, items[k].group.as_str())])
        .collect()
}

/// The completing acks on one PostgreSQL in one call (`comb.complete_acks`, [`JUDGE_SQL`]'s
/// parameters), a transaction of its own: the cursors' lock ([`crate::cursor::LOCK_SQL`]),
/// then [`JUDGE_SQL`] in a statement of its own, whose snapshot is taken once the locks are
/// held. One statement where `BEGIN`, the lock, the judgement and `COMMIT` were four: each
/// costs the database a message exchange, a snapshot and a send. Its statements are planned as
/// the consumer path's are ([`crate::db::consumer_plans`]). Made on every start by `comb
/// migrate` ([`crate::schema::install_functions`]); not on Citus, which has its own
/// ([`JUDGE_CITUS_FUNCTION`]).
pub(crate) static COMPLETE_FUNCTION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "
CREATE FUNCTION {name}(a_partitions uuid[], a_groups text[],
    a_leases uuid[], a_txids text[], a_lo int[], a_hi int[], a_digests bytea[])
RETURNS TABLE (partition_id uuid, consumer_group text, released boolean, partition text,
    queue text)
LANGUAGE plpgsql {plans} AS $body$
#variable_conflict use_column
DECLARE
    st record;
    found_n bigint;
    acked_pos bigint;
    acked_seg integer;
    next_pos bigint;
BEGIN
    IF cardinality(a_txids) = 1 THEN
{single}
    END IF;
    PERFORM 1 FROM ({lock}) l;
    RETURN QUERY {judge};
END $body$",
        name = COMPLETE_NAME,
        plans = crate::db::function_plans(),
        lock = crate::cursor::LOCK_SQL,
        judge = JUDGE_SQL,
        single = JUDGE_ONE,
    )
});

/// [`JUDGE_SQL`] for a single ack whose cursor has nothing settled and no attempt counted
/// (the common case: a message acked in order, or one ahead of an unacked one), in PL/pgSQL
/// statements a few plan nodes each: the cursor's lock, then its state and the acked message,
/// each read by a statement of its own (so after the lock), and the new version from
/// variables. Starting a statement's executor costs by its plan's nodes, and
/// [`JUDGE_SQL`]'s plan, with its aggregates, array subqueries and insert, cost more to start
/// than to run. Any other case falls through to [`JUDGE_SQL`], the cursor still locked.
/// The rules, applied to one position `p` and a state with nothing settled: the position
/// moves to `p` if `p` follows it (and the segment to `p`'s), else `p` is settled; the lease
/// ends once the position reaches the lease's last message.
const JUDGE_ONE: &str = concat!(
    "        PERFORM ",
    crate::cursor::lock_one!("a_partitions[1]", "a_groups[1]"),
    ";
        SELECT s.* INTO st FROM ",
    crate::cursor::state_of!("a_partitions[1]", "a_groups[1]"),
    " s;
        IF FOUND AND st.lease_id IS NOT NULL AND st.lease_expires_at > now()
           AND (a_leases[1] IS NULL OR a_leases[1] = st.lease_id)
           AND cardinality(st.settled) = 0 AND cardinality(st.attempt_pos) = 0 THEN
            SELECT count(*), min(m.pos), min(m.seg) INTO found_n, acked_pos, acked_seg
            FROM ",
    crate::messages::partition_messages!("a_partitions[1]"),
    "
              AND m.transaction_id = a_txids[1]
              AND m.pos > st.cursor_pos AND m.pos <= st.lease_upto AND m.seg >= st.cursor_seg;
            IF found_n = 1 THEN
                next_pos := CASE WHEN acked_pos = st.cursor_pos + 1 THEN acked_pos
                                 ELSE st.cursor_pos END;
                ",
    crate::cursor::insert_state!(),
    "
                VALUES (st.partition_id, st.consumer_group, ",
    crate::cursor::newest_gen!(),
    ", st.ver + 1,
                        next_pos,
                        CASE WHEN acked_pos <= next_pos THEN greatest(st.cursor_seg, acked_seg)
                             ELSE st.cursor_seg END,
                        CASE WHEN acked_pos > next_pos THEN ARRAY[acked_pos]
                             ELSE st.settled END,
                        st.attempt_pos, st.attempt_cnt,
                        CASE WHEN next_pos >= st.lease_upto THEN NULL ELSE st.lease_id END,
                        CASE WHEN next_pos >= st.lease_upto THEN NULL
                             ELSE st.lease_expires_at END,
                        st.lease_upto, st.available_at, st.last_claimed_at);
                RETURN QUERY SELECT st.partition_id, st.consumer_group,
                                    next_pos >= st.lease_upto, p.name, q.name
                    FROM (SELECT st.partition_id) AS w(partition_id)
                    ",
    crate::catalog::join_partition_and_queue!("w.partition_id"),
    ";
                RETURN;
            END IF;
        END IF;"
);

/// [`COMPLETE_FUNCTION`]'s name in this build's set of functions.
pub(crate) const COMPLETE_NAME: &str = crate::schema::versioned!("comb.complete_acks");

/// The call of [`COMPLETE_FUNCTION`].
pub(crate) const COMPLETE_CALL: &str = concat!(
    "SELECT * FROM ",
    crate::schema::versioned!("comb.complete_acks"),
    "($1, $2, $3, $4, $5, $6, $7)"
);

/// The cursors of the chosen items, as [`judge_sql!`] takes them: one element per cursor, in
/// the order of their first items, and the acked transaction ids of cursor `k`, distinct and in
/// byte order, at `txids[lo[k] - 1..hi[k]]` (SQL's bounds, from 1).
#[derive(Debug, Default, PartialEq)]
struct Cursors<'a> {
    partitions: Vec<Uuid>,
    groups: Vec<&'a str>,
    /// The lease the cursor's items name; the nil id, which no lease has, when they name
    /// different ones (nothing is judged then: the general path answers each).
    leases: Vec<Option<Uuid>>,
    txids: Vec<&'a str>,
    lo: Vec<i32>,
    hi: Vec<i32>,
    /// The digest of each cursor's ids ([`crate::cursor::digest`]), compared with the one
    /// its claim wrote with the lease.
    digests: Vec<Vec<u8>>,
}

impl<'a> Cursors<'a> {
    fn of(items: &[&'a AckItem], chosen: &[usize]) -> Cursors<'a> {
        let mut index: HashMap<(Uuid, &str), usize> = HashMap::new();
        let mut each: Vec<(Option<Uuid>, Vec<&'a str>)> = Vec::new();
        let mut c = Cursors::default();
        for &k in chosen {
            let item = items[k];
            let at = *index
                .entry((item.partition_id, item.group.as_str()))
                .or_insert_with(|| {
                    c.partitions.push(item.partition_id);
                    c.groups.push(item.group.as_str());
                    each.push((None, Vec::new()));
                    each.len() - 1
                });
            let (lease, txids) = &mut each[at];
            match (*lease, item.lease_id) {
                (None, named) => *lease = named,
                (Some(held), Some(named)) if held != named => *lease = Some(Uuid::nil()),
                _ => {}
            }
            txids.push(item.transaction_id.as_str());
        }
        for (lease, mut txids) in each {
            txids.sort_unstable();
            txids.dedup();
            c.leases.push(lease);
            c.digests.push(crate::cursor::digest(txids.iter().copied()));
            c.lo.push(c.txids.len() as i32 + 1);
            c.txids.extend(txids);
            c.hi.push(c.txids.len() as i32);
        }
        c
    }
}

/// Settles the items at `chosen` in one call, a transaction of its own: `judge` is
/// [`COMPLETE_CALL`], or on Citus [`JUDGE_CITUS_CALL`] for `partition`.
/// Returns an outcome for each chosen item whose cursor was judged, `None` for the others
/// (nothing of their cursor changed). The last item of a cursor whose lease ended says so.
pub(crate) async fn settle(
    client: &tokio_postgres::Client,
    judge: &Statement,
    items: &[&AckItem],
    chosen: &[usize],
    partition: Option<Uuid>,
) -> Result<Vec<Option<AckOutcome>>, DbError> {
    let c = Cursors::of(items, chosen);
    let judge_params: [&(dyn ToSql + Sync); 8] = [
        &c.partitions,
        &c.groups,
        &c.leases,
        &c.txids,
        &c.lo,
        &c.hi,
        &c.digests,
        &partition,
    ];
    // Only the Citus form ([`JUDGE_CITUS_FUNCTION`]) names its partition.
    let judge_params = if partition.is_some() {
        &judge_params[..]
    } else {
        &judge_params[..7]
    };
    let judged = client.query(judge, judge_params).await?;
    let mut moved: HashMap<(Uuid, String), (bool, String, String)> = HashMap::new();
    for r in &judged {
        moved.insert(
            (r.get("partition_id"), r.get("consumer_group")),
            (r.get("released"), r.get("partition"), r.get("queue")),
        );
    }
    let mut outcomes: Vec<Option<AckOutcome>> = (0..items.len()).map(|_| None).collect();
    // The last item of each cursor carries the lease's end.
    let mut last: HashMap<(Uuid, &str), usize> = HashMap::new();
    for &k in chosen {
        last.insert((items[k].partition_id, items[k].group.as_str()), k);
    }
    for &k in chosen {
        let item = items[k];
        let Some((released, partition, queue)) =
            moved.get(&(item.partition_id, item.group.to_string()))
        else {
            continue;
        };
        outcomes[k] = Some(AckOutcome {
            result: Ok(()),
            queue_name: Some(queue.clone()),
            partition_name: Some(partition.clone()),
            lease_released: *released && last[&(item.partition_id, item.group.as_str())] == k,
            dlq: false,
            discarded: false,
        });
    }
    Ok(outcomes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::GroupName;

    fn item(partition: u128, group: &str, txid: &str, lease: Option<u128>) -> AckItem {
        AckItem {
            partition_id: Uuid::from_u128(partition),
            transaction_id: txid.to_string(),
            group: GroupName::parse(group.to_string()).unwrap(),
            status: AckStatus::Completed,
            lease_id: lease.map(Uuid::from_u128),
            error: None,
        }
    }

    #[test]
    fn cursors_take_their_items_distinct_in_byte_order_with_the_lease_they_name() {
        let items = [
            item(1, "g", "b", None),
            item(2, "g", "z", Some(7)),
            item(1, "g", "a", Some(5)),
            item(1, "h", "x", None),
            item(1, "g", "b", Some(5)),
            item(2, "g", "y", Some(8)),
            item(3, "g", "B", None),
        ];
        let items: Vec<&AckItem> = items.iter().collect();
        // The fourth item is left to the general path.
        let c = Cursors::of(&items, &[0, 1, 2, 4, 5, 6]);
        assert_eq!(
            c,
            Cursors {
                partitions: [1, 2, 3].map(Uuid::from_u128).to_vec(),
                groups: vec!["g", "g", "g"],
                leases: vec![Some(Uuid::from_u128(5)), Some(Uuid::nil()), None],
                txids: vec!["a", "b", "y", "z", "B"],
                lo: vec![1, 3, 5],
                hi: vec![2, 4, 5],
                digests: vec![
                    crate::cursor::digest(["a", "b"]),
                    crate::cursor::digest(["y", "z"]),
                    crate::cursor::digest(["B"]),
                ],
            }
        );
    }
}
