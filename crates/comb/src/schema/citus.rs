//! The schema on a Citus cluster: which table is distributed by what, applied by `comb
//! migrate` after the migrations when the database has the `citus` extension (the
//! coordinator). Without Citus nothing here runs and the schema is the migrations' alone.
//!
//! Every claim, read and write of the data path names one partition, so everything keyed by
//! partition is distributed by its partition id, co-located with `comb.partitions` (hash of
//! the same uuid, the same shard on the same worker): a statement about one partition's
//! messages, cursors and dead letters runs on one worker. Small catalog tables read by every
//! statement are reference tables (a copy on every node, joined locally). The per-minute
//! statistics and the maintenance log stay on the coordinator: they are written once a minute
//! per server and read by listings, never by the data path. See `docs/scale-out.md`.
//!
//! Distributing is idempotent: each table is distributed only when it is not yet, so a
//! server starting on a distributed schema does nothing, and a table added by a later
//! migration is distributed on the next start that knows it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio_postgres::Client;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use crate::backend::Backend;

/// The partition a Citus statement is about, as its last parameter; nothing on PostgreSQL.
pub(crate) fn with_partition<'a>(
    params: &[&'a (dyn ToSql + Sync)],
    one: &'a Option<Uuid>,
) -> Vec<&'a (dyn ToSql + Sync)> {
    let mut all = params.to_vec();
    if one.is_some() {
        all.push(one);
    }
    all
}

/// The indexes of `items` grouped by partition, first appearance first: Citus's forms of the
/// data path's statements take one partition each.
pub(crate) fn by_partition<T>(items: &[T], of: impl Fn(&T) -> Uuid) -> Vec<(Uuid, Vec<usize>)> {
    let mut out: Vec<(Uuid, Vec<usize>)> = Vec::new();
    for (k, i) in items.iter().enumerate() {
        let p = of(i);
        match out.iter_mut().find(|(q, _)| *q == p) {
            Some((_, ks)) => ks.push(k),
            None => out.push((p, vec![k])),
        }
    }
    out
}

/// The shard of `comb.partitions` (and so of every co-located table) holding each partition,
/// and the active primary worker holding that shard (none when the coordinator holds it).
const SHARDS_SQL: &str = "
SELECT DISTINCT ON (p.id) p.id, s.shard, n.nodename, n.nodeport
FROM unnest($1::uuid[]) AS p(id)
CROSS JOIN LATERAL
  (SELECT get_shard_id_for_distribution_column('comb.partitions', p.id) AS shard) s
LEFT JOIN pg_dist_placement pl ON pl.shardid = s.shard
LEFT JOIN pg_dist_node n ON n.groupid = pl.groupid AND n.groupid > 0 AND n.isactive
  AND n.noderole = 'primary'
ORDER BY p.id, n.nodename NULLS LAST";

/// How long a partition's shard is trusted. Rebalancing moves shards between workers but
/// keeps their ids; splitting a shard (`citus_split_shard_by_split_points`) makes new ones. A
/// stale shard id costs performance only: the batch it routes may write two shards (a
/// two-phase commit), never a wrong result.
const PLACEMENT_TTL: Duration = Duration::from_secs(60);

/// Placements kept at most; past this the cache starts afresh (deleted partitions' entries
/// go with it).
const PLACEMENT_CAP: usize = 100_000;

/// Which shard and worker hold which partition, cached: the push and ack fusers batch a
/// worker's partitions together (direct route), or a shard's (through the coordinator), so
/// that a fused batch commits on one node without a two-phase commit (the coordinator
/// commits a transaction that wrote several shards in two phases, even when they sit on one
/// worker; a worker running its own shards' statements commits in one; see
/// `docs/scale-out.md`).
#[derive(Default)]
pub(crate) struct Placement {
    known: Mutex<HashMap<Uuid, Placed>>,
}

/// Why [`Placement::lane`] could not say: no connection, or the look-up failed.
#[derive(Debug)]
pub(crate) enum Unplaced {
    Pool(deadpool_postgres::PoolError),
    Query(tokio_postgres::Error),
}

impl From<deadpool_postgres::PoolError> for Unplaced {
    fn from(e: deadpool_postgres::PoolError) -> Unplaced {
        Unplaced::Pool(e)
    }
}

impl From<tokio_postgres::Error> for Unplaced {
    fn from(e: tokio_postgres::Error) -> Unplaced {
        Unplaced::Query(e)
    }
}

/// Where a fused batch goes on Citus ([`Placement::lane`]): a worker, whose batches are
/// transactions of that worker over its shards (direct route), or a shard, whose batches go
/// through the coordinator and touch that shard alone.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Lane {
    Worker(Node),
    Shard(i64),
}

/// A partition's shard, its worker, and when they were read.
type Placed = (i64, Option<Node>, Instant);

/// A worker as the coordinator names it (`pg_dist_node`): host and port.
pub(crate) type Node = (String, u16);

impl Placement {
    /// The cached shard of each of `ids`, and the ids not cached (or cached too long ago),
    /// sorted, without repeats: those are for [`Placement::look_up`].
    pub(crate) fn known(&self, ids: &[Uuid]) -> (HashMap<Uuid, i64>, Vec<Uuid>) {
        let now = Instant::now();
        let mut out = HashMap::with_capacity(ids.len());
        let mut missing = Vec::new();
        let known = self.known.lock().unwrap();
        for id in ids {
            match known.get(id) {
                Some((shard, _, at)) if now.duration_since(*at) < PLACEMENT_TTL => {
                    out.insert(*id, *shard);
                }
                _ => missing.push(*id),
            }
        }
        missing.sort_unstable();
        missing.dedup();
        (out, missing)
    }

    /// Where a fused batch of requests naming the partitions `ids` may go, from the cache or
    /// else read from `pool` (one round trip): with `by_worker` (the direct route), the one
    /// worker holding them all; else the one shard holding them all. `None` when they span
    /// workers (or shards), or one is not found: such a request is a batch of its own.
    pub(crate) async fn lane(
        &self,
        pool: &deadpool_postgres::Pool,
        ids: &[Uuid],
        by_worker: bool,
    ) -> Result<Option<Lane>, Unplaced> {
        let (mut shards, missing) = self.known(ids);
        if !missing.is_empty() {
            let client = pool.get().await?;
            shards.extend(self.look_up(&client, &missing).await?);
        }
        let Some(first) = ids.first() else {
            return Ok(None);
        };
        if !ids.iter().all(|id| shards.contains_key(id)) {
            return Ok(None);
        }
        if by_worker {
            let known = self.known.lock().unwrap();
            let node_of = |id: &Uuid| known.get(id).and_then(|(_, node, _)| node.clone());
            if let Some(node) = node_of(first)
                && ids[1..]
                    .iter()
                    .all(|id| node_of(id).as_ref() == Some(&node))
            {
                return Ok(Some(Lane::Worker(node)));
            }
        }
        let shard = shards[first];
        Ok(ids
            .iter()
            .all(|id| shards[id] == shard)
            .then_some(Lane::Shard(shard)))
    }

    /// The worker holding `id`'s shard, as last read (cached for as long as its shard; a
    /// stale worker costs a hop, never a wrong result): `None` when not cached or not read
    /// yet, `Some(None)` when the shard sits on the coordinator or its worker is inactive.
    pub(crate) fn node(&self, id: Uuid) -> Option<Option<Node>> {
        let known = self.known.lock().unwrap();
        match known.get(&id) {
            Some((_, node, at)) if at.elapsed() < PLACEMENT_TTL => Some(node.clone()),
            _ => None,
        }
    }

    /// Reads the shards of `ids` and their workers (one round trip) and caches them.
    pub(crate) async fn look_up(
        &self,
        client: &Client,
        ids: &[Uuid],
    ) -> Result<HashMap<Uuid, i64>, tokio_postgres::Error> {
        let rows = client.query(SHARDS_SQL, &[&ids]).await?;
        let now = Instant::now();
        let mut known = self.known.lock().unwrap();
        if known.len() > PLACEMENT_CAP {
            known.clear();
        }
        let mut out = HashMap::with_capacity(rows.len());
        for r in rows {
            let (id, shard): (Uuid, i64) = (r.get(0), r.get(1));
            let node = r
                .get::<_, Option<String>>(2)
                .zip(r.get::<_, Option<i32>>(3))
                .and_then(|(host, port)| Some((host, u16::try_from(port).ok()?)));
            known.insert(id, (shard, node, now));
            out.insert(id, shard);
        }
        Ok(out)
    }
}

/// The tables read and written with every request: a copy on every node.
pub(crate) const REFERENCE: &[&str] = &[
    "comb.queues",
    "comb.subscriptions",
    "comb.segments",
    "comb.cursor_gens",
    "comb.system_modes",
    "comb.stream_queries",
    "comb.partition_ids",
];

/// The table every distributed table is co-located with, and its distribution column.
pub(crate) const ANCHOR: (&str, &str) = ("comb.partitions", "id");

/// Tables distributed by partition, co-located with [`ANCHOR`], in the order they are
/// distributed (`cursor_states` before `cursors`: Citus follows the view joining them).
pub(crate) const BY_PARTITION: &[&str] = &[
    "comb.messages",
    "comb.cursor_states",
    "comb.cursors",
    "comb.segment_partitions",
    "comb.dead_letters",
    "comb.dead_letter_requeues",
    "comb.traces",
    "comb.stream_partitions",
    "comb.stream_states",
    "comb.stream_state_keys",
];

/// Unique keys that must include the distribution column on Citus (it enforces uniqueness per
/// shard only), as (table, constraint, the key with the column). Dead letters are looked up
/// by id within their partition; the catalog keeps a partition's name unique per queue under
/// its queue's row lock instead of with `partitions_queue_id_name_key`.
const REKEYED: &[(&str, &str, &str)] = &[
    (
        "comb.dead_letters",
        "dead_letters_pkey",
        "(partition_id, id)",
    ),
    (
        "comb.dead_letter_requeues",
        "dead_letter_requeues_pkey",
        "(partition_id, dead_letter_id)",
    ),
];

/// Functions of the data path whose every call names one partition (`p`): run on the worker
/// holding it, beside its rows.
const FUNCTIONS: &[&str] = &[
    "comb.partition_head(uuid)",
    "comb.claimable_now(uuid, bigint, integer, double precision, double precision, double precision)",
];

/// `comb.cursor_state` in PL/pgSQL. Citus cannot plan a statement that calls a SQL function
/// reading a distributed table with parameters ("parameterized queries for SQL functions
/// referencing distributed tables are not supported"): PostgreSQL would inline the function
/// only after Citus has refused it. A PL/pgSQL function runs its query on its own, a router
/// query on the partition's worker. Same result as the migrations' SQL version.
///
/// It returns its columns by name, not the table's row type: a function of the table's type
/// makes the table depend on itself in Citus's eyes, which then refuses to attach a new
/// generation to it.
const CURSOR_STATE: &str = "
CREATE FUNCTION comb.cursor_state(p uuid, g text)
RETURNS TABLE (partition_id uuid, consumer_group text, gen integer, ver bigint,
               cursor_pos bigint, cursor_seg integer, settled bigint[], attempt_pos bigint[],
               attempt_cnt integer[], lease_id uuid, lease_expires_at timestamptz,
               lease_upto bigint, available_at timestamptz, last_claimed_at timestamptz)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY SELECT s.partition_id, s.consumer_group, s.gen, s.ver, s.cursor_pos,
                        s.cursor_seg, s.settled, s.attempt_pos, s.attempt_cnt, s.lease_id,
                        s.lease_expires_at, s.lease_upto, s.available_at, s.last_claimed_at
    FROM comb.cursor_states s
    WHERE s.partition_id = p AND s.consumer_group = g
    ORDER BY s.gen DESC, s.ver DESC LIMIT 1;
END $$";

/// `comb.partition_head` in PL/pgSQL, for the reason of [`CURSOR_STATE`].
const PARTITION_HEAD: &str = "
CREATE OR REPLACE FUNCTION comb.partition_head(p uuid)
RETURNS TABLE (pos bigint, at timestamptz)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY SELECT h.pos, h.at FROM (
        (SELECT m.pos, m.created_at AS at FROM comb.messages m
         WHERE m.partition_id = p
           AND m.seg >= (SELECT min(s.seg) FROM comb.segments s WHERE NOT s.summarized)
         ORDER BY m.pos DESC LIMIT 1)
        UNION ALL
        (SELECT sp.max_pos, sp.max_created_at FROM comb.segment_partitions sp
         WHERE sp.partition_id = p ORDER BY sp.seg DESC LIMIT 1)
        UNION ALL
        SELECT 0::bigint, NULL::timestamptz
    ) h
    ORDER BY h.pos DESC LIMIT 1;
END $$";

/// The administration's figures in PL/pgSQL, for the reason of [`CURSOR_STATE`]: the
/// migrations' SQL functions (schema versions 9 and 12) join distributed tables to function
/// calls per partition, which Citus cannot plan ("could not create distributed plan") and
/// refuses with parameters. Here each function runs on the coordinator and sends statements
/// Citus can plan: per partition (its head, its cursors' latest states, the one message after
/// the slowest cursor) a router statement on the partition's worker, and per queue one
/// listing of its partitions or cursors over every shard. Same results as the SQL versions;
/// the per-partition statements are round trips from the coordinator to a worker, so a
/// figure computed now costs about a round trip per partition (`docs/scale-out.md`).
const FIGURES: &str = "
CREATE OR REPLACE FUNCTION comb.partition_stats(p uuid)
RETURNS TABLE (head bigint, head_at timestamptz, pending bigint, processing bigint,
               oldest_pending_at timestamptz, groups bigint)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    h_pos bigint;
    h_at timestamptz;
    slow_pos bigint;
    slow_seg integer;
    busy bigint;
    n bigint;
    oldest timestamptz;
BEGIN
    SELECT h.pos, h.at INTO h_pos, h_at FROM comb.partition_head(p) h;
    SELECT coalesce(min(s.cursor_pos), 0), coalesce(min(s.cursor_seg), 0),
           coalesce(max(CASE WHEN s.lease_id IS NOT NULL AND s.lease_expires_at > now()
                             THEN greatest(s.lease_upto - s.cursor_pos
                                           - cardinality(ARRAY(SELECT 1 FROM unnest(s.settled) x
                                                               WHERE x <= s.lease_upto)), 0)
                             ELSE 0 END), 0),
           count(*)
      INTO slow_pos, slow_seg, busy, n
    FROM comb.cursors cu
    CROSS JOIN LATERAL (
        SELECT st.cursor_pos, st.cursor_seg, st.settled, st.lease_id, st.lease_expires_at,
               st.lease_upto
        FROM comb.cursor_states st
        WHERE st.partition_id = p AND st.consumer_group = cu.consumer_group
        ORDER BY st.gen DESC, st.ver DESC LIMIT 1) s
    WHERE cu.partition_id = p;
    IF h_pos > slow_pos THEN
        SELECT m.created_at INTO oldest FROM comb.messages m
        WHERE m.partition_id = p AND m.pos > slow_pos AND m.seg >= slow_seg
        ORDER BY m.pos LIMIT 1;
    END IF;
    head := h_pos;
    head_at := h_at;
    pending := greatest(h_pos - slow_pos - busy, 0);
    processing := busy;
    oldest_pending_at := oldest;
    groups := n;
    RETURN NEXT;
END $$;

CREATE OR REPLACE FUNCTION comb.cursor_lag(p uuid, g text)
RETURNS TABLE (cursor_pos bigint, head bigint, lag bigint, oldest_unsettled_at timestamptz,
               lease_id uuid, lease_expires_at timestamptz, last_claimed_at timestamptz)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    s record;
    h bigint;
    oldest timestamptz;
BEGIN
    SELECT st.cursor_pos AS pos, st.cursor_seg AS seg, st.settled AS settled,
           st.lease_id AS lease, st.lease_expires_at AS expires, st.last_claimed_at AS claimed
      INTO s
    FROM comb.cursor_states st
    WHERE st.partition_id = p AND st.consumer_group = g
    ORDER BY st.gen DESC, st.ver DESC LIMIT 1;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT x.pos INTO h FROM comb.partition_head(p) x;
    IF h > s.pos THEN
        SELECT m.created_at INTO oldest FROM comb.messages m
        WHERE m.partition_id = p AND m.pos > s.pos AND m.seg >= s.seg
          AND m.pos <> ALL (s.settled)
        ORDER BY m.pos LIMIT 1;
    END IF;
    cursor_pos := s.pos;
    head := h;
    lag := greatest(h - s.pos - cardinality(s.settled), 0);
    oldest_unsettled_at := oldest;
    lease_id := CASE WHEN s.expires > now() THEN s.lease END;
    lease_expires_at := CASE WHEN s.expires > now() THEN s.expires END;
    last_claimed_at := nullif(s.claimed, '-infinity');
    RETURN NEXT;
END $$;

CREATE OR REPLACE FUNCTION comb.queue_live(q uuid)
RETURNS TABLE (partitions bigint, total bigint, pending bigint, processing bigint,
               oldest_pending_at timestamptz, last_message_at timestamptz, dead_letters bigint)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    ids uuid[] := '{}';
    dead bigint := 0;
BEGIN
    IF q IS NOT NULL THEN
        ids := ARRAY(SELECT p.id FROM comb.partitions p WHERE p.queue_id = q);
        SELECT count(*) INTO dead FROM comb.dead_letters d
        WHERE d.queue_id = q
          AND NOT EXISTS (SELECT 1 FROM comb.dead_letter_requeues r
                          WHERE r.partition_id = d.partition_id AND r.dead_letter_id = d.id);
    END IF;
    RETURN QUERY
    SELECT count(*), coalesce(sum(s.head), 0)::bigint, coalesce(sum(s.pending), 0)::bigint,
           coalesce(sum(s.processing), 0)::bigint, min(s.oldest_pending_at), max(s.head_at),
           dead
    FROM unnest(ids) AS k(id) CROSS JOIN LATERAL comb.partition_stats(k.id) s;
END $$;

CREATE OR REPLACE FUNCTION comb.group_live(q uuid, g text)
RETURNS TABLE (partitions bigint, lag bigint, oldest_unsettled_at timestamptz, leased bigint)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    ids uuid[] := '{}';
BEGIN
    IF q IS NOT NULL THEN
        ids := ARRAY(SELECT c.partition_id FROM comb.cursors c
                     WHERE c.queue_id = q AND c.consumer_group = g);
    END IF;
    RETURN QUERY
    SELECT count(*), coalesce(sum(x.lag), 0)::bigint, min(x.oldest_unsettled_at),
           count(x.lease_id)
    FROM unnest(ids) AS k(id) CROSS JOIN LATERAL comb.cursor_lag(k.id, g) x;
END $$;

CREATE OR REPLACE FUNCTION comb.lagging_cursors(q uuid, g text, min_secs float8)
RETURNS TABLE (partition_id uuid, lag bigint, oldest_unsettled_at timestamptz)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    ids uuid[];
BEGIN
    ids := ARRAY(SELECT c.partition_id FROM comb.cursors c
                 WHERE c.queue_id = q AND c.consumer_group = g);
    RETURN QUERY
    SELECT k.id, x.lag, x.oldest_unsettled_at
    FROM unnest(ids) AS k(id) CROSS JOIN LATERAL comb.cursor_lag(k.id, g) x
    WHERE x.lag > 0 AND x.oldest_unsettled_at <= now() - make_interval(secs => min_secs);
END $$;

CREATE OR REPLACE FUNCTION comb.queue_figures(ids uuid[], live_budget bigint)
RETURNS TABLE (queue_id uuid, partitions bigint, total bigint, pending bigint,
               processing bigint, dead_letters bigint, oldest_pending_at timestamptz,
               last_message_at timestamptz, figures_at timestamptz, live boolean)
LANGUAGE plpgsql STABLE SET jit = off AS $$
#variable_conflict use_column
DECLARE
    qs uuid[];
    ns bigint[];
BEGIN
    SELECT coalesce(array_agg(x.q), '{}'), coalesce(array_agg(x.n), '{}') INTO qs, ns
    FROM (SELECT p.queue_id AS q, count(*) AS n FROM comb.partitions p
          WHERE p.queue_id = ANY (ids) GROUP BY p.queue_id) x;
    RETURN QUERY
    WITH snap AS (SELECT * FROM comb.latest_snapshot()),
    sized AS (
        SELECT i.id, coalesce(k.n, 0) AS n
        FROM unnest(ids) AS i(id) LEFT JOIN unnest(qs, ns) AS k(id, n) ON k.id = i.id
    ),
    chosen AS MATERIALIZED (
        SELECT s.id, s.n, m.total, m.pending, m.processing, m.dead_letters,
               m.oldest_pending_at, m.last_message_at, m.taken_at,
               m.taken_at IS NULL OR sum(s.n) OVER (ORDER BY s.n, s.id) <= live_budget AS live
        FROM sized s
        LEFT JOIN snap ON true
        LEFT JOIN comb.queue_minutes m
               ON m.day = snap.day AND m.minute = snap.minute AND m.queue_id = s.id
    )
    SELECT c.id, c.n,
           CASE WHEN c.live THEN l.total ELSE c.total END,
           CASE WHEN c.live THEN l.pending ELSE c.pending END,
           CASE WHEN c.live THEN l.processing ELSE c.processing END,
           CASE WHEN c.live THEN l.dead_letters ELSE c.dead_letters END,
           CASE WHEN c.live THEN l.oldest_pending_at ELSE c.oldest_pending_at END,
           CASE WHEN c.live THEN l.last_message_at ELSE c.last_message_at END,
           CASE WHEN c.live THEN now() ELSE c.taken_at END,
           c.live
    FROM chosen c
    CROSS JOIN LATERAL comb.queue_live(CASE WHEN c.live THEN c.id END) l;
END $$;

CREATE OR REPLACE FUNCTION comb.group_figures(queue_ids uuid[], groups text[], live_budget bigint)
RETURNS TABLE (queue_id uuid, consumer_group text, partitions bigint, lag bigint,
               oldest_unsettled_at timestamptz, leased bigint, figures_at timestamptz,
               live boolean)
LANGUAGE plpgsql STABLE SET jit = off AS $$
#variable_conflict use_column
DECLARE
    qs uuid[];
    gs text[];
    ns bigint[];
BEGIN
    SELECT coalesce(array_agg(x.q), '{}'), coalesce(array_agg(x.g), '{}'),
           coalesce(array_agg(x.n), '{}')
      INTO qs, gs, ns
    FROM (SELECT c.queue_id AS q, c.consumer_group AS g, count(*) AS n FROM comb.cursors c
          WHERE c.queue_id = ANY (queue_ids) GROUP BY c.queue_id, c.consumer_group) x;
    RETURN QUERY
    WITH snap AS (SELECT * FROM comb.latest_snapshot()),
    sized AS (
        SELECT i.q, i.g, coalesce(k.n, 0) AS n
        FROM unnest(queue_ids, groups) AS i(q, g)
        LEFT JOIN unnest(qs, gs, ns) AS k(q, g, n) ON k.q = i.q AND k.g = i.g
    ),
    chosen AS MATERIALIZED (
        SELECT s.q, s.g, s.n, m.lag, m.oldest_unsettled_at, m.leased, m.taken_at,
               m.taken_at IS NULL OR sum(s.n) OVER (ORDER BY s.n, s.q, s.g) <= live_budget AS live
        FROM sized s
        LEFT JOIN snap ON true
        LEFT JOIN comb.group_minutes m
               ON m.day = snap.day AND m.minute = snap.minute AND m.queue_id = s.q
              AND m.consumer_group = s.g
    )
    SELECT c.q, c.g, c.n,
           CASE WHEN c.live THEN l.lag ELSE c.lag END,
           CASE WHEN c.live THEN l.oldest_unsettled_at ELSE c.oldest_unsettled_at END,
           CASE WHEN c.live THEN l.leased ELSE c.leased END,
           CASE WHEN c.live THEN now() ELSE c.taken_at END,
           c.live
    FROM chosen c
    CROSS JOIN LATERAL comb.group_live(CASE WHEN c.live THEN c.q END, c.g) l;
END $$;
";

/// Row locks of several partitions, taken on the coordinator one partition at a time.
///
/// Citus locks rows (`FOR UPDATE`, `FOR NO KEY UPDATE`) only in a statement of one shard; a
/// push of several partitions, an ack of several cursors and the expiry of several leases lock
/// rows on several. These functions run on the coordinator and lock each partition's row with
/// a router statement of its own, in the same order as the one statement they replace, so the
/// caller still sends one statement. Each returns the ids it locked, as the statement did.
const LOCKS: &str = "
CREATE OR REPLACE FUNCTION comb.lock_partitions(ids uuid[]) RETURNS SETOF uuid
LANGUAGE plpgsql AS $$
DECLARE
    one uuid;
BEGIN
    FOR one IN SELECT DISTINCT i FROM unnest(ids) i ORDER BY 1 LOOP
        RETURN QUERY SELECT p.id FROM comb.partitions p WHERE p.id = one FOR NO KEY UPDATE;
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION comb.lock_cursors(ids uuid[], groups text[]) RETURNS SETOF uuid
LANGUAGE plpgsql AS $$
DECLARE
    one record;
BEGIN
    FOR one IN SELECT DISTINCT i, g FROM unnest(ids, groups) AS x(i, g) ORDER BY 1, 2 LOOP
        RETURN QUERY SELECT c.partition_id FROM comb.cursors c
        WHERE c.partition_id = one.i AND c.consumer_group = one.g FOR NO KEY UPDATE;
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION comb.lock_expired(ids uuid[], grp text) RETURNS SETOF uuid
LANGUAGE plpgsql AS $$
DECLARE
    one uuid;
BEGIN
    FOR one IN SELECT DISTINCT i FROM unnest(ids) i ORDER BY 1 LOOP
        RETURN QUERY SELECT c.partition_id FROM comb.cursors c
        CROSS JOIN LATERAL (
            SELECT s.lease_id, s.lease_expires_at FROM comb.cursor_states s
            WHERE s.partition_id = c.partition_id AND s.partition_id = one
              AND s.consumer_group = grp
            ORDER BY s.gen DESC, s.ver DESC LIMIT 1) s
        WHERE c.partition_id = one AND c.consumer_group = grp
          AND s.lease_id IS NOT NULL AND s.lease_expires_at <= now()
        FOR NO KEY UPDATE OF c SKIP LOCKED;
    END LOOP;
END $$;
";

/// Key of the advisory lock that serialises distribution among servers starting together.
/// Comb's other keys count up from `0x636f_6d62_0001` (migrations, the maintenance leader,
/// snapshots); this one stands apart from them.
const DISTRIBUTION_LOCK: i64 = 0x636f_6d62_c175;

/// The text of a data-path function of one partition for [`delegate`]: `name` (versioned), in
/// PL/pgSQL, running `body` (its statements, which name the arguments by position), custom
/// plans (so that Citus routes each statement by the partition's value, which
/// `force_delegation` then checks), columns before the function's own names.
pub(crate) fn function_of_partition(name: &str, args: &str, returns: &str, body: &str) -> String {
    format!(
        "
CREATE FUNCTION {name}({args})
RETURNS TABLE ({returns})
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan AS $body$
#variable_conflict use_column
BEGIN
{body}
END $body$"
    )
}

/// Makes functions of the data path that Citus runs on a partition's worker: each `create` (a
/// `CREATE FUNCTION` of a versioned name, made when absent and never replaced, as
/// [`super::install_functions`] does), then, once, distributed by its argument `arg` (`signature`),
/// co-located with [`ANCHOR`]. A call is sent whole to the worker holding that argument's
/// shard: outside a transaction block always, inside one only with `force` (Citus's
/// `force_delegation`, which then requires every step of the function's statements to name
/// that argument's value). Nothing without Citus.
pub(crate) async fn delegate(
    client: &Client,
    backend: Backend,
    functions: &[(&str, (&str, &str, bool))],
) -> Result<(), tokio_postgres::Error> {
    if !backend.distributes_schema() {
        return Ok(());
    }
    client
        .execute("SELECT pg_advisory_lock($1)", &[&DISTRIBUTION_LOCK])
        .await?;
    let mut done = Ok(());
    for (create, (signature, arg, force)) in functions {
        done = delegate_locked(client, create, signature, arg, *force).await;
        if done.is_err() {
            break;
        }
    }
    let unlocked = client
        .execute("SELECT pg_advisory_unlock($1)", &[&DISTRIBUTION_LOCK])
        .await;
    done?;
    unlocked?;
    Ok(())
}

async fn delegate_locked(
    client: &Client,
    create: &str,
    signature: &str,
    arg: &str,
    force: bool,
) -> Result<(), tokio_postgres::Error> {
    let made: bool = client
        .query_one("SELECT to_regprocedure($1) IS NOT NULL", &[&signature])
        .await?
        .get(0);
    if !made {
        client.batch_execute(create).await?;
    }
    let delegated: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_dist_object
             WHERE classid = 'pg_proc'::regclass AND objid = $1::text::regprocedure
               AND distribution_argument_index IS NOT NULL
               AND force_delegation IS NOT DISTINCT FROM $2)",
            &[&signature, &force],
        )
        .await?
        .get(0);
    if !delegated {
        client
            .execute(
                "SELECT create_distributed_function($1::text::regprocedure,
                     distribution_arg_name => $2, colocate_with => $3, force_delegation => $4)",
                &[&signature, &arg, &ANCHOR.0, &force],
            )
            .await?;
    }
    Ok(())
}

/// Distributes the schema when the database has Citus; returns the tables it distributed now
/// (empty without Citus, or when everything already is).
pub(crate) async fn distribute(
    client: &Client,
    backend: Backend,
) -> Result<Vec<String>, tokio_postgres::Error> {
    if !backend.distributes_schema() {
        return Ok(Vec::new());
    }
    client
        .execute("SELECT pg_advisory_lock($1)", &[&DISTRIBUTION_LOCK])
        .await?;
    let done = distribute_locked(client).await;
    let unlocked = client
        .execute("SELECT pg_advisory_unlock($1)", &[&DISTRIBUTION_LOCK])
        .await;
    let done = done?;
    unlocked?;
    Ok(done)
}

/// Whether `table` is already `kind` (`reference` or `distributed`). A table Citus linked to
/// a reference table by a foreign key on its own (a "local" table in its metadata) is not yet.
async fn is(client: &Client, table: &str, kind: &str) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM citus_tables
                            WHERE table_name = $1::text::regclass AND citus_table_type = $2)",
            &[&table, &kind],
        )
        .await?
        .get(0))
}

/// All or nothing: a failure leaves the schema as the migrations made it (the state function
/// and view set aside below included).
async fn distribute_locked(client: &Client) -> Result<Vec<String>, tokio_postgres::Error> {
    client.batch_execute("BEGIN").await?;
    match distribute_in(client).await {
        Ok(done) => {
            client.batch_execute("COMMIT").await?;
            Ok(done)
        }
        Err(e) => {
            let _ = client.batch_execute("ROLLBACK").await;
            Err(e)
        }
    }
}

/// The functions the coordinator runs itself, in PL/pgSQL, each text with the signatures it
/// makes. Made once per database ([`make_once`]), never replaced under running servers: a
/// text is pinned by a test, and a changed function takes a new name.
pub(crate) const COORDINATOR_FUNCTIONS: &[(&str, &[&str])] = &[
    (PARTITION_HEAD, &["comb.partition_head(uuid)"]),
    (
        FIGURES,
        &[
            "comb.partition_stats(uuid)",
            "comb.cursor_lag(uuid, text)",
            "comb.queue_live(uuid)",
            "comb.group_live(uuid, text)",
            "comb.lagging_cursors(uuid, text, float8)",
            "comb.queue_figures(uuid[], bigint)",
            "comb.group_figures(uuid[], text[], bigint)",
        ],
    ),
    (
        LOCKS,
        &[
            "comb.lock_partitions(uuid[])",
            "comb.lock_cursors(uuid[], text[])",
            "comb.lock_expired(uuid[], text)",
        ],
    ),
];

/// Runs `text` only when one of `signatures` is not a PL/pgSQL function yet: on the first
/// distribution (the migrations made SQL functions of some of these names, which Citus
/// cannot plan), or when a migration made one again. Otherwise a server starting leaves the
/// bodies that running servers call as they are.
async fn make_once(
    client: &Client,
    text: &str,
    signatures: &[&str],
) -> Result<(), tokio_postgres::Error> {
    let sigs: Vec<&str> = signatures.to_vec();
    let made: i64 = client
        .query_one(
            "SELECT count(*) FROM unnest($1::text[]) s
             JOIN pg_proc f ON f.oid = to_regprocedure(s)
             JOIN pg_language l ON l.oid = f.prolang AND l.lanname = 'plpgsql'",
            &[&sigs],
        )
        .await?
        .get(0);
    if made < signatures.len() as i64 {
        client.batch_execute(text).await?;
    }
    Ok(())
}

async fn distribute_in(client: &Client) -> Result<Vec<String>, tokio_postgres::Error> {
    let mut done = Vec::new();
    for t in REFERENCE {
        if !is(client, t, "reference").await? {
            client
                .execute("SELECT create_reference_table($1::text::regclass)", &[t])
                .await?;
            done.push(t.to_string());
        }
    }
    let (anchor, column) = ANCHOR;
    if !is(client, anchor, "distributed").await? {
        client
            .batch_execute(
                "ALTER TABLE comb.partitions DROP CONSTRAINT IF EXISTS partitions_queue_id_name_key",
            )
            .await?;
        client
            .execute(
                "SELECT create_distributed_table($1::text::regclass, $2)",
                &[&anchor, &column],
            )
            .await?;
        done.push(anchor.to_string());
    }
    // The state function returns the state table's row type and the view reads it: Citus
    // refuses to distribute a table its own dependents depend on in a circle, so both are
    // set aside and made again once the table is distributed — the function in PL/pgSQL
    // (below), the view as it was.
    let mut set_aside = Vec::new();
    if !is(client, "comb.cursor_states", "distributed").await? {
        let v: String = client
            .query_one("SELECT pg_get_viewdef('comb.cursors_now'::regclass)", &[])
            .await?
            .get(0);
        client
            .batch_execute(
                "DROP VIEW comb.cursors_now; DROP FUNCTION comb.cursor_state(uuid, text);",
            )
            .await?;
        set_aside.push(CURSOR_STATE.to_string());
        set_aside.push(format!("CREATE VIEW comb.cursors_now AS {v}"));
    }
    for t in BY_PARTITION {
        if is(client, t, "distributed").await? {
            continue;
        }
        for (table, constraint, key) in REKEYED.iter().filter(|r| r.0 == *t) {
            client
                .batch_execute(&format!(
                    "ALTER TABLE {table} DROP CONSTRAINT {constraint}, ADD PRIMARY KEY {key}"
                ))
                .await?;
        }
        client
            .execute(
                "SELECT create_distributed_table($1::text::regclass, 'partition_id', colocate_with => $2)",
                &[t, &anchor],
            )
            .await?;
        done.push(t.to_string());
    }
    for sql in set_aside {
        client.batch_execute(&sql).await?;
    }
    for (text, signatures) in COORDINATOR_FUNCTIONS {
        make_once(client, text, signatures).await?;
    }
    for f in FUNCTIONS {
        let is: bool = client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_dist_object
                 WHERE classid = 'pg_proc'::regclass AND objid = $1::text::regprocedure
                   AND distribution_argument_index IS NOT NULL)",
                &[f],
            )
            .await?
            .get(0);
        if !is {
            client
                .execute(
                    "SELECT create_distributed_function($1::text::regprocedure, distribution_arg_name => 'p',
                                                        colocate_with => $2)",
                    &[f, &anchor],
                )
                .await?;
            done.push(f.to_string());
        }
    }
    Ok(done)
}
