//! Hand-off: a push leases what it stores to a pop waiting on this server, in its own
//! transaction, and hands the messages over in memory after commit.
//!
//! Without it, a message delivered at light load costs the push's transaction, then a claim
//! by the woken pop (a walk, a lock, a read of state and messages, a new state version), then
//! the ack. With it, the push's transaction also locks the waiting groups' cursors of the
//! partitions it filled (`SKIP LOCKED`: a push never waits on a consumer) and, in a statement
//! after that lock (its snapshot then holds every version written before), appends each
//! cursor's next state version holding a fresh lease over the pushed messages — only where
//! the group's next message is one of this push's (so nothing before it is skipped, however
//! pushes race: positions in a partition commit in order, and this push's are the newest),
//! the cursor holds no lease, rests for no failed message (`available_at`), has nothing
//! settled or counted ahead, and the queue holds nothing back (`delayedProcessing`,
//! `windowBuffer`). The lease is an ordinary one: acked, extended, or expired (an attempt
//! counted) like a claim's.
//!
//! The lock and the grant are statements of the push's own function
//! ([`super::store::STORE_FUNCTION`]), last: for one offer its own short steps
//! ([`GRANT_ONE`]), for several a call of `comb.hand_off` ([`HAND_OFF_FUNCTION`]), so a push
//! that hands off is still one call. The lock and the reads after it must be statements of
//! their own: one that locked
//! `SKIP LOCKED` and read the state itself would read it with a snapshot taken before its
//! lock, and a claim that committed in between would have its version written again from the
//! one before (two versions of one `ver`); a PL/pgSQL function's statements each take their
//! own snapshot (READ COMMITTED), so the grant's is taken once the lock is held. Pushes
//! without waiting pops here do not call it.
//!
//! Waiting pops offer themselves ([`crate::wake::Wake::offer`]); a push reserves the oldest
//! offer of each group of the queue (fan-out: one pop per group), and gives back a lease
//! whose pop went away before it was answered, at once.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use deadpool_postgres::Pool;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use crate::db::{DbError, Pipelined, Prepared};
use crate::wake::{HandedMessage, HandedOff, Reserved, Wake};

/// Leases the pushed messages of partition `$1[i]` to group `$2[i]` under lease `$3[i]`
/// (`$4[i]`: the lease's length when the queue sets no `leaseTime`; `$5[i]`: most messages),
/// where the group's next message is one of this push's (`$6`, the ids stored) and nothing
/// holds it back. Run by [`HAND_OFF_FUNCTION`] after [`crate::cursor::LOCK_FREE_SQL`], on
/// the cursors it locked. Returns the messages leased, with their group and lease.
const GRANT_SQL: &str = concat!(
    "
WITH w AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::float8[], $5::int8[])
        AS w(partition_id, consumer_group, lease_id, default_lease, batch)
),
st AS MATERIALIZED (
    SELECT w.lease_id AS new_lease, w.default_lease, w.batch, o.options, s.*
    FROM w
    CROSS JOIN LATERAL ",
    crate::cursor::state_of!("w.partition_id", "w.consumer_group"),
    " s
    CROSS JOIN LATERAL (SELECT ",
    crate::catalog::options_of_partition!("w.partition_id"),
    " AS options) o
    WHERE s.lease_id IS NULL AND s.available_at <= now()
      AND cardinality(s.settled) = 0 AND cardinality(s.attempt_pos) = 0
      AND coalesce((o.options->>'delayedProcessing')::float8, 0) = 0
      AND coalesce((o.options->>'windowBuffer')::float8, 0) = 0
),
picked AS MATERIALIZED (
    SELECT st.partition_id, st.consumer_group, m.pos, m.message_id, m.created_at
    FROM st
    CROSS JOIN LATERAL (
        SELECT m.pos, m.message_id, m.created_at
        FROM ",
    crate::messages::partition_messages!("st.partition_id"),
    "
          AND m.pos > st.cursor_pos AND m.seg >= st.cursor_seg
        ORDER BY m.pos
        LIMIT st.batch
    ) m
),
ok AS (
    -- The next message is this push's, so every one after it is too (they are the newest).
    SELECT partition_id, consumer_group, max(pos) AS upto
    FROM picked
    GROUP BY partition_id, consumer_group
    HAVING bool_and(message_id = ANY($6::uuid[]))
),
granted AS (
    ",
    crate::cursor::insert_state!(),
    "
    SELECT st.partition_id, st.consumer_group, ",
    crate::cursor::newest_gen!(),
    ", st.ver + 1,
           st.cursor_pos, st.cursor_seg, st.settled, st.attempt_pos, st.attempt_cnt,
           st.new_lease,
           now() + make_interval(secs => coalesce((st.options->>'leaseTime')::float8,
                                                  st.default_lease)),
           ok.upto, st.available_at, clock_timestamp()
    FROM st
    JOIN ok ON ok.partition_id = st.partition_id AND ok.consumer_group = st.consumer_group
    RETURNING partition_id, consumer_group, lease_id
)
SELECT g.partition_id, g.consumer_group, g.lease_id, p.pos, p.message_id, p.created_at
FROM granted g
JOIN picked p ON p.partition_id = g.partition_id AND p.consumer_group = g.consumer_group"
);

/// [`HAND_OFF_FUNCTION`]'s name in this build's set of functions.
pub(crate) const HAND_OFF_NAME: &str = crate::schema::versioned!("comb.hand_off");

/// `comb.hand_off(partitions, groups, leases, lengths, batches, ids)`, the hand-off in one
/// call: locks the offered cursors no one else holds ([`crate::cursor::LOCK_FREE_SQL`]),
/// keeps the offers whose cursor it locked, and grants them ([`GRANT_SQL`]) in a statement
/// of its own, whose snapshot is taken after the lock. Made on every start by `comb migrate`
/// ([`crate::schema::install_functions`]); not on Citus, where nothing hands off. Its
/// statements are planned as the consumer path's are ([`crate::db::consumer_plans`]): once
/// per session, generically, and never as whole-table reads. (Left to the default, each
/// call planned its grant again, which cost more than running it.)
pub(crate) static HAND_OFF_FUNCTION: LazyLock<String> = LazyLock::new(|| {
    format!(
        "
CREATE FUNCTION {name}(a_partitions uuid[], a_groups text[],
    a_leases uuid[], a_lengths float8[], a_batches int8[], a_ids uuid[])
RETURNS TABLE (partition_id uuid, consumer_group text, lease_id uuid, pos bigint,
    message_id uuid, created_at timestamptz)
LANGUAGE plpgsql {plans} AS $body$
#variable_conflict use_column
DECLARE
    held_partitions uuid[];
    held_groups text[];
BEGIN
    SELECT array_agg(l.partition_id), array_agg(l.consumer_group)
        INTO held_partitions, held_groups
        FROM ({lock}) l;
    IF held_partitions IS NULL THEN
        RETURN;
    END IF;
    SELECT array_agg(w.p), array_agg(w.g), array_agg(w.l), array_agg(w.d), array_agg(w.b)
        INTO a_partitions, a_groups, a_leases, a_lengths, a_batches
        FROM unnest(a_partitions, a_groups, a_leases, a_lengths, a_batches)
            AS w(p, g, l, d, b)
        WHERE (w.p, w.g) IN (SELECT * FROM unnest(held_partitions, held_groups));
    RETURN QUERY {grant};
END $body$",
        name = HAND_OFF_NAME,
        plans = crate::db::function_plans(),
        lock = crate::cursor::LOCK_FREE_SQL,
        grant = GRANT_SQL,
    )
});

/// The variables of [`GRANT_ONE`], declared by the push's function.
pub(crate) const GRANT_ONE_DECLARE: &str = "    st record;
    opts jsonb;
    msg record;
    picked_pos bigint[] := '{}';
    picked_ids uuid[] := '{}';
    picked_at timestamptz[] := '{}';
";

/// [`GRANT_SQL`]'s rules for a single offer (`o_partitions[1]`, `o_groups[1]`, …, the
/// stored ids `a_ids`), the common case, as steps of the push's own function
/// ([`super::store::STORE_FUNCTION`]) in PL/pgSQL statements a few plan nodes each: the
/// cursor's lock ([`crate::cursor::lock_one!`], `SKIP LOCKED`), then its state, its queue's
/// options and the messages after its position, each
/// read by a statement of its own (so after the lock), and the new version from variables.
/// Starting a statement's executor costs by its plan's nodes, and [`GRANT_SQL`]'s plan, with
/// its joins, aggregate and insert, cost more to start than to run. The segments before the
/// cursor's are pruned as the executor starts (the bound is a parameter here, where the
/// grant's joins made it a run-time one).
pub(crate) const GRANT_ONE: &str = concat!(
    "        PERFORM ",
    crate::cursor::lock_one!("o_partitions[1]", "o_groups[1]"),
    " SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        SELECT s.* INTO st FROM ",
    crate::cursor::state_of!("o_partitions[1]", "o_groups[1]"),
    " s;
        IF NOT FOUND OR st.lease_id IS NOT NULL OR st.available_at > now()
           OR cardinality(st.settled) > 0 OR cardinality(st.attempt_pos) > 0 THEN
            RETURN;
        END IF;
        opts := ",
    crate::catalog::options_of_partition!("o_partitions[1]"),
    ";
        IF coalesce((opts->>'delayedProcessing')::float8, 0) <> 0
           OR coalesce((opts->>'windowBuffer')::float8, 0) <> 0 THEN
            RETURN;
        END IF;
        FOR msg IN SELECT m.pos, m.message_id, m.created_at FROM ",
    crate::messages::partition_messages!("o_partitions[1]"),
    "
                AND m.pos > st.cursor_pos AND m.seg >= st.cursor_seg
                ORDER BY m.pos LIMIT o_batches[1] LOOP
            -- The next message is this push's, so every one after it is too.
            IF NOT (msg.message_id = ANY (a_ids)) THEN
                RETURN;
            END IF;
            picked_pos := picked_pos || msg.pos;
            picked_ids := picked_ids || msg.message_id;
            picked_at := picked_at || msg.created_at;
        END LOOP;
        IF cardinality(picked_pos) = 0 THEN
            RETURN;
        END IF;
        ",
    crate::cursor::insert_state!(),
    "
        VALUES (st.partition_id, st.consumer_group, ",
    crate::cursor::newest_gen!(),
    ", st.ver + 1,
                st.cursor_pos, st.cursor_seg, st.settled, st.attempt_pos, st.attempt_cnt,
                o_leases[1],
                now() + make_interval(secs => coalesce((opts->>'leaseTime')::float8,
                                                       o_lengths[1])),
                picked_pos[cardinality(picked_pos)], st.available_at, clock_timestamp());
        FOR k IN 1 .. cardinality(picked_pos) LOOP
            partition_id := st.partition_id;
            consumer_group := st.consumer_group;
            lease_id := o_leases[1];
            pos := picked_pos[k];
            message_id := picked_ids[k];
            created_at := picked_at[k];
            RETURN NEXT;
        END LOOP;
        RETURN;"
);

/// Gives back lease `$3` of the cursor (`$1` partition, `$2` group), if it still holds it:
/// the next state version without the lease, nothing counted (its messages were never handed
/// out). Run after [`crate::cursor::LOCK_ONE_SQL`].
const RELEASE_SQL: &str = concat!(
    "\n",
    crate::cursor::insert_state!(),
    "
SELECT s.partition_id, s.consumer_group, ",
    crate::cursor::newest_gen!(),
    ", s.ver + 1,
       s.cursor_pos, s.cursor_seg, s.settled, s.attempt_pos, s.attempt_cnt, NULL, NULL,
       s.lease_upto, s.available_at, s.last_claimed_at
FROM ",
    crate::cursor::state_of!("$1", "$2"),
    " s
WHERE s.lease_id = $3"
);

/// A reserved pop and the partition a push offers it.
pub(crate) struct Offered {
    pub(crate) queue: Arc<str>,
    pub(crate) partition_id: Uuid,
    pub(crate) partition: Arc<str>,
    pub(crate) lease_id: Uuid,
    pub(crate) pop: Reserved,
    /// The messages leased to it, once the push committed.
    granted: Vec<HandedMessage>,
}

/// Reserves, for each queue of the batch that pops wait on here, one waiting pop per group,
/// each offered the first partition of that queue the batch fills: `firsts` holds each queue
/// of the batch once, with that partition's id and name. Not on Citus, where a push's
/// transaction keeps to the statements of one shard as they are.
pub(crate) fn reserve(
    backend: crate::backend::Backend,
    wake: &Wake,
    firsts: Vec<(Arc<str>, Uuid, Arc<str>)>,
) -> Vec<Offered> {
    if !backend.hands_off_in_push() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (queue, partition_id, partition) in firsts {
        if !wake.has_offers(&queue) {
            continue;
        }
        for pop in wake.reserve(&queue) {
            out.push(Offered {
                queue: queue.clone(),
                partition_id,
                partition: partition.clone(),
                lease_id: Uuid::now_v7(),
                pop,
                granted: Vec::new(),
            });
        }
    }
    out
}

/// The offers of a batch as [`HAND_OFF_FUNCTION`]'s arrays take them: for each offered pop,
/// its partition, group, lease id, default lease length and batch.
pub(crate) struct Offers<'a> {
    pub(crate) partitions: Vec<Uuid>,
    pub(crate) groups: Vec<&'a str>,
    pub(crate) leases: Vec<Uuid>,
    pub(crate) lengths: Vec<f64>,
    pub(crate) batches: Vec<i64>,
}

impl<'a> Offers<'a> {
    pub(crate) fn of(offered: &'a [Offered]) -> Offers<'a> {
        Offers {
            partitions: offered.iter().map(|o| o.partition_id).collect(),
            groups: offered.iter().map(|o| o.pop.group.as_str()).collect(),
            leases: offered.iter().map(|o| o.lease_id).collect(),
            lengths: offered
                .iter()
                .map(|o| o.pop.wants.default_lease_secs)
                .collect(),
            batches: offered
                .iter()
                .map(|o| i64::from(o.pop.wants.batch))
                .collect(),
        }
    }
}

/// Keeps, for each offered pop, the messages leased to it (`rows`: the hand-off's).
pub(crate) fn record_granted(offered: &mut [Offered], rows: &[&Row]) {
    let mut by_lease: HashMap<Uuid, Vec<(i64, Uuid, chrono::DateTime<chrono::Utc>)>> =
        HashMap::new();
    for r in rows {
        by_lease.entry(r.get("lease_id")).or_default().push((
            r.get("pos"),
            r.get("message_id"),
            r.get("created_at"),
        ));
    }
    for o in offered.iter_mut() {
        if let Some(mut leased) = by_lease.remove(&o.lease_id) {
            leased.sort_unstable_by_key(|l| l.0);
            o.granted = leased
                .into_iter()
                .map(|(pos, message_id, created_at)| HandedMessage {
                    pos,
                    message_id,
                    transaction_id: String::new(),
                    trace_id: None,
                    producer_sub: None,
                    payload: bytes::Bytes::new(),
                    created_at,
                })
                .collect();
        }
    }
}

/// After the push committed: sends each offered pop what was leased to it (the rest resume
/// looking for themselves, their offer dropped), and gives back at once a lease whose pop
/// went away. Returns the (partition, group) pairs handed all they were pushed (fewer
/// messages than the pop's batch): their group needs no hint of the partition.
/// `fill` completes a leased message from the pushed one of its id (transaction and trace
/// ids, producer, payload), or says it is not one of the push's: the grant leases only those,
/// so that never happens, and if it did the lease would be given back, not handed over.
pub(crate) fn deliver(
    pool: &Pool,
    wake: &Arc<Wake>,
    offered: Vec<Offered>,
    fill: impl Fn(&mut HandedMessage) -> bool,
) -> Vec<(Uuid, String)> {
    let mut quiet = Vec::new();
    for mut o in offered {
        if o.granted.is_empty() {
            continue;
        }
        let ours = o.granted.iter_mut().all(&fill);
        let full = o.granted.len() >= usize::try_from(o.pop.wants.batch).unwrap_or(usize::MAX);
        let handed = HandedOff {
            partition_id: o.partition_id,
            partition: o.partition.clone(),
            lease_id: o.lease_id,
            messages: std::mem::take(&mut o.granted),
        };
        let n = handed.messages.len() as u64;
        let sent = if ours {
            o.pop.to.send(handed).map_err(|_| ())
        } else {
            Err(())
        };
        match sent {
            Ok(()) => {
                crate::metrics::HANDOFFS.add(1);
                crate::metrics::HANDED_OFF.add(n);
                if !full {
                    quiet.push((o.partition_id, o.pop.group.clone()));
                }
            }
            Err(_) => {
                // The pop went away between its reservation and now: the lease goes back.
                // (The reserved pop, if still there, looks for itself: its offer is gone.)
                let (pool, wake) = (pool.clone(), wake.clone());
                tokio::spawn(async move {
                    let group = o.pop.group;
                    match release(&pool, o.partition_id, &group, o.lease_id).await {
                        Ok(()) => {
                            crate::metrics::HANDOFFS_RELEASED.add(1);
                            wake.released(&o.queue, &group, o.partition_id, true);
                        }
                        // The lease then ends at its expiry, and counts an attempt.
                        Err(e) => tracing::warn!(error = %e, "hand-off lease not given back"),
                    }
                });
            }
        }
    }
    quiet
}

/// Gives back a lease a push made for a pop that went away: a new state version without it.
async fn release(pool: &Pool, partition: Uuid, group: &str, lease: Uuid) -> Result<(), DbError> {
    let client = pool.get().await?;
    let lock = client.prepare_cached(crate::cursor::LOCK_ONE_SQL).await?;
    let release = client.prepare_cached(RELEASE_SQL).await?;
    let p = Pipelined::on(&client);
    let lock_params: [&(dyn ToSql + Sync); 2] = [&partition, &group];
    let params: [&(dyn ToSql + Sync); 3] = [&partition, &group, &lease];
    let (begin, locked, released, commit) = tokio::join!(
        p.begin(),
        p.query(&lock, &lock_params),
        p.execute(&release, &params),
        p.commit()
    );
    begin?;
    locked?;
    released?;
    commit?;
    Ok(())
}
