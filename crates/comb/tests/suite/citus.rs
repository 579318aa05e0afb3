//! Comb on a Citus cluster (`comb_harness::Citus`: a coordinator and two workers on
//! loopback, `scripts/install-citus.sh`): what `comb migrate` distributes, and by what
//! (`docs/scale-out.md`). Without Citus the schema is left as the migrations make it.

use std::process::Command;

use comb_harness::{Citus, Postgres};

use crate::common;

/// Runs `comb migrate` against `url` and returns its combined output; panics if it fails.
fn migrate(url: &str) -> String {
    let out = Command::new(common::comb_bin())
        .arg("migrate")
        .env("DATABASE_URL", url)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "comb migrate failed:\n{text}");
    text
}

/// Every table of schema `comb` with its Citus kind, distribution column and co-location.
fn layout(citus: &Citus, db: &str) -> Vec<(String, String, String, String)> {
    let rows = citus
        .coordinator()
        .psql(
            db,
            "SELECT c.oid::regclass::text, coalesce(t.citus_table_type, 'none'),
                    coalesce(t.distribution_column, ''), coalesce(t.colocation_id::text, '')
             FROM pg_class c
             LEFT JOIN citus_tables t ON t.table_name = c.oid::regclass
             WHERE c.relnamespace = 'comb'::regnamespace AND c.relkind IN ('r', 'p')
               AND NOT c.relispartition
             ORDER BY 1",
        )
        .unwrap();
    rows.lines()
        .map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            (f[0].into(), f[1].into(), f[2].into(), f[3].into())
        })
        .collect()
}

#[tokio::test]
async fn migrate_distributes_by_partition_co_located_with_catalogs_as_reference_tables() {
    let (citus, url) = tokio::task::spawn_blocking(|| {
        let citus = Citus::shared();
        let url = citus.create_database("citus_layout").unwrap();
        (citus, url)
    })
    .await
    .unwrap();
    let db = url.rsplit('/').next().unwrap().to_string();
    let first = migrate(&url);
    assert!(first.contains("distributed on Citus"), "{first}");

    let layout = layout(citus, &db);
    let of = |t: &str| {
        layout
            .iter()
            .find(|r| r.0 == t)
            .unwrap_or_else(|| panic!("{t} is not in {layout:?}"))
            .clone()
    };
    let anchor = of("comb.partitions");
    assert_eq!(
        (anchor.1.as_str(), anchor.2.as_str()),
        ("distributed", "id")
    );
    for t in [
        "comb.messages",
        "comb.cursor_states",
        "comb.cursors",
        "comb.segment_partitions",
        "comb.dead_letters",
        "comb.dead_letter_requeues",
        "comb.traces",
    ] {
        let r = of(t);
        assert_eq!(
            (r.1.as_str(), r.2.as_str(), r.3.as_str()),
            ("distributed", "partition_id", anchor.3.as_str()),
            "{t}: distributed by partition, co-located with comb.partitions"
        );
    }
    for t in [
        "comb.queues",
        "comb.subscriptions",
        "comb.segments",
        "comb.cursor_gens",
        "comb.system_modes",
    ] {
        assert_eq!(of(t).1, "reference", "{t}");
    }
    // Written once a minute or by maintenance, read by listings: on the coordinator.
    for t in [
        "comb.migrations",
        "comb.maintenance_runs",
        "comb.server_minutes",
        "comb.queue_minutes",
        "comb.group_minutes",
        "comb.queue_counts",
    ] {
        assert_eq!(of(t).1, "none", "{t} stays a table of the coordinator");
    }
    // Every leaf of a distributed partitioned table is distributed too (segments and
    // generations made by maintenance are attached to these parents).
    let leaves = citus
        .coordinator()
        .psql(
            &db,
            "SELECT count(*) FROM pg_inherits i
             WHERE i.inhparent IN ('comb.messages'::regclass, 'comb.cursor_states'::regclass)
               AND NOT EXISTS (SELECT 1 FROM pg_dist_partition d
                               WHERE d.logicalrelid = i.inhrelid)",
        )
        .unwrap();
    assert_eq!(leaves, "0");
    // Functions of one partition run beside its rows.
    let functions = citus
        .coordinator()
        .psql(
            &db,
            "SELECT string_agg(objid::regprocedure::text, ',' ORDER BY 1) FROM pg_dist_object
             WHERE classid = 'pg_proc'::regclass AND distribution_argument_index = 0
               AND colocationid::text = (SELECT colocation_id::text FROM citus_tables
                                         WHERE table_name = 'comb.partitions'::regclass)",
        )
        .unwrap();
    assert!(
        functions.contains("comb.partition_head(uuid)"),
        "{functions}"
    );
    assert!(functions.contains("comb.claimable_now("), "{functions}");
    // The state view was set aside and made again.
    assert_eq!(
        citus
            .coordinator()
            .psql(&db, "SELECT count(*) FROM comb.cursors_now")
            .unwrap(),
        "0"
    );

    // A second start finds everything distributed and does nothing.
    let again = migrate(&url);
    assert!(!again.contains("distributed on Citus"), "{again}");
}

#[tokio::test]
async fn without_citus_the_schema_keeps_its_keys() {
    let url = tokio::task::spawn_blocking(|| Postgres::shared().create_database("no_citus"))
        .await
        .unwrap()
        .unwrap();
    let out = migrate(&url);
    assert!(!out.contains("distributed on Citus"), "{out}");
    let db = url.rsplit('/').next().unwrap();
    let keys = Postgres::shared()
        .psql(
            db,
            "SELECT string_agg(conname, ',' ORDER BY conname) FROM pg_constraint
             WHERE conname IN ('partitions_queue_id_name_key', 'dead_letters_pkey',
                               'dead_letter_requeues_pkey')",
        )
        .unwrap();
    assert_eq!(
        keys,
        "dead_letter_requeues_pkey,dead_letters_pkey,partitions_queue_id_name_key"
    );
}
