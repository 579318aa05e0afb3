//! The storage a server runs on: one PostgreSQL, or a Citus cluster (its coordinator).
//!
//! Read once at start, when `comb migrate` (run by every server) finds or not the `citus`
//! extension ([`Backend::detect`]), and handed as a value to the owners that need it, through
//! their constructors. No other module asks which storage it is on: an owner asks the seam
//! for
//!
//! - the form of a statement to run: each owner writes both forms of a statement that
//!   differs, side by side and whole, as a [`Forms`], and runs `backend.sql(&FORMS)`
//!   (`docs/citus-statements.md` lists them and says why each differs);
//! - what the storage can or cannot do, by the named capabilities below, each saying why.
//!
//! `layering.rs` checks that nothing outside this module names the storage's kinds and that
//! no owner makes a statement by rewriting another's text.

use tokio_postgres::Client;
use uuid::Uuid;

/// The storage's kind. Private: owners ask [`Backend`]'s capabilities, never the kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Postgres,
    Citus,
}

/// The storage this server runs on, read once at start ([`Backend::detect`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Backend {
    kind: Kind,
}

/// A statement's two forms, both written out whole: the one PostgreSQL runs, and the one a
/// Citus coordinator runs. Picked by [`Backend::sql`].
pub(crate) struct Forms {
    pub(crate) postgres: &'static str,
    pub(crate) citus: &'static str,
}

impl Backend {
    /// One PostgreSQL (what tests of one database construct).
    #[cfg(test)]
    pub(crate) const POSTGRES: Backend = Backend {
        kind: Kind::Postgres,
    };

    /// A Citus coordinator.
    #[cfg(test)]
    pub(crate) const CITUS: Backend = Backend { kind: Kind::Citus };

    /// The storage behind `client`: Citus when the database has the `citus` extension (the
    /// coordinator), else PostgreSQL. Read once, by `schema::migrate`.
    pub(crate) async fn detect(client: &Client) -> Result<Backend, tokio_postgres::Error> {
        let citus: bool = client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')",
                &[],
            )
            .await?
            .get(0);
        Ok(Backend {
            kind: if citus { Kind::Citus } else { Kind::Postgres },
        })
    }

    fn citus(self) -> bool {
        self.kind == Kind::Citus
    }

    /// The form of a statement this storage runs.
    pub(crate) fn sql(self, forms: &Forms) -> &'static str {
        match self.kind {
            Kind::Postgres => forms.postgres,
            Kind::Citus => forms.citus,
        }
    }

    /// Whether the schema is distributed over a cluster: tables distributed by partition,
    /// catalogs as reference tables (`schema::citus::distribute`), and the data path's
    /// functions of one partition made to run on its worker (`schema::citus::delegate`).
    pub(crate) fn distributes_schema(self) -> bool {
        self.citus()
    }

    /// Whether the data path's SQL functions of one database (`comb.store_batch`,
    /// `comb.hand_off`, `comb.complete_acks`) are installed and called. Citus runs a function
    /// whole on one worker only when every statement in it names one partition's value
    /// (`force_delegation`), which these functions of many partitions do not: there the push
    /// is `BEGIN`, statements, `COMMIT` in one round trip, and the acks' judgement is a
    /// delegated function per partition.
    pub(crate) fn runs_data_path_functions(self) -> bool {
        !self.citus()
    }

    /// Whether rows lock only in a statement of one shard. Citus takes `FOR UPDATE` / `FOR
    /// NO KEY UPDATE` locks only in a router statement: locks of several partitions go
    /// through coordinator functions locking one partition at a time (the `Forms` of the
    /// locks), and a pop of a whole queue lists its candidates unlocked over every worker,
    /// then claims each as a named partition (`pop::claim::claim_listed`).
    pub(crate) fn rows_lock_in_one_shard_only(self) -> bool {
        self.citus()
    }

    /// Whether a data-path statement may read or write several partitions at once. Citus
    /// runs a statement on one worker (a router statement, no two-phase commit for a write,
    /// a plan it can make with parameters) only when it names one partition: there the
    /// statements take the partition as their last parameter ([`Backend::one_partition`])
    /// and a batch of several partitions is sent one statement per partition.
    pub(crate) fn statements_span_partitions(self) -> bool {
        !self.citus()
    }

    /// The partition a statement's Citus form names as its last parameter (`None` on
    /// PostgreSQL, whose forms take none): see [`Backend::statements_span_partitions`].
    pub(crate) fn one_partition(self, partition: Uuid) -> Option<Uuid> {
        self.citus().then_some(partition)
    }

    /// Whether a push hands its messages off to pops waiting here, in its own transaction
    /// (`push::handoff`). Not on Citus: a push's transaction keeps to the statements of one
    /// shard as they are, and the hand-off's cursor locks would span the group's shards.
    pub(crate) fn hands_off_in_push(self) -> bool {
        !self.citus()
    }

    /// Whether fused pushes and acks are batched per worker or per shard. On Citus a
    /// transaction the coordinator runs over several shards commits in two phases, even on
    /// one worker; one a worker runs over its own shards commits in one: a fused batch keeps
    /// to one worker (direct route) or one shard (`schema::citus::Placement::lane`).
    pub(crate) fn fuses_per_shard(self) -> bool {
        self.citus()
    }

    /// Whether a partition's id is derived from its queue and name (`catalog::ids`), so that
    /// its shard is known before its row exists and its creation runs on its worker. On
    /// PostgreSQL ids are random and a partition's creation locks its queue's row.
    pub(crate) fn derives_partition_ids(self) -> bool {
        self.citus()
    }

    /// Whether work over several partitions that needs no atomicity across them (a batch of
    /// acks) commits a transaction per partition: on Citus one over partitions of several
    /// workers would commit in two phases across them.
    pub(crate) fn commits_each_partition_alone(self) -> bool {
        self.citus()
    }

    /// Whether a transaction writing partitions on several workers must enlist each worker
    /// as modified before anything else (`catalog::enlist_workers`): Citus counts delegated
    /// calls as reads when it decides on two-phase commit.
    pub(crate) fn enlists_workers_for_two_phase_commit(self) -> bool {
        self.citus()
    }

    /// Whether a statement with parameters must be planned for its values. Citus routes a
    /// statement to one worker only in a custom plan and refuses generic plans of the
    /// claim's statements ("could not create distributed plan"): its connections set
    /// `plan_cache_mode = force_custom_plan` after the consumer path's settings.
    pub(crate) fn plans_for_each_execution(self) -> bool {
        self.citus()
    }

    /// Whether a statement may join tables of many partitions on other columns than the
    /// partition, or walk them recursively. Citus cannot plan such joins over every shard
    /// ("could not create distributed plan"), nor a recursive walk but over one shard:
    /// listings there read per partition or group per worker, then merge.
    pub(crate) fn joins_across_partitions(self) -> bool {
        !self.citus()
    }

    /// Whether a lease can be found by its id alone with one index read. On Citus the
    /// lease's cursors may lie on any shard: leases granted here are remembered
    /// (`lease::granted`) so that an extension by id alone names its partitions.
    pub(crate) fn finds_leases_by_id(self) -> bool {
        !self.citus()
    }

    /// Whether the administration's moves of cursors and requeues of dead letters over
    /// several partitions can run: they lock and write several partitions in one statement,
    /// which Citus cannot (`admin::not_on_cluster`, answered 501).
    pub(crate) fn moves_cursors_of_many_partitions(self) -> bool {
        !self.citus()
    }

    /// Whether a generation's drop must lock `comb.cursor_states` whole first. Delegated
    /// calls on Citus lock the parent table before its generations, and the drop must take
    /// locks in the same order (`maintenance::generations`).
    pub(crate) fn drops_lock_the_parent_first(self) -> bool {
        self.citus()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_storage_runs_its_own_form() {
        const F: Forms = Forms {
            postgres: "SELECT 1",
            citus: "SELECT 2",
        };
        assert_eq!(Backend::POSTGRES.sql(&F), "SELECT 1");
        assert_eq!(Backend::CITUS.sql(&F), "SELECT 2");
        let p = Uuid::nil();
        assert_eq!(Backend::POSTGRES.one_partition(p), None);
        assert_eq!(Backend::CITUS.one_partition(p), Some(p));
    }
}
