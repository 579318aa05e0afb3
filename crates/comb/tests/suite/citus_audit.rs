//! The short delivery audit on a Citus cluster (`comb_harness::Citus`), beside the one on
//! PostgreSQL in the audit's own test binary (`tests/audit.rs`, which says why).

use comb_harness::Citus;

/// The delivery audit of `make test` (`audit.rs`) on the cluster: four pushers racing over
/// 100 partitions, two groups of three consumers that fail 1 % of deliveries and lose a
/// consumer mid-batch, and a `kill -9` of the server once 40 % are accepted (within a
/// minute). Fewer messages than on one PostgreSQL: a debug build on a busy 2-core machine
/// pushes a few dozen a second through the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delivery_audit_loses_and_reorders_nothing_across_a_server_kill() {
    let url = tokio::task::spawn_blocking(|| Citus::shared().create_database("citus_audit"))
        .await
        .unwrap()
        .expect("database");
    crate::audit::short_audit_passes(&url, 1_000).await;
}
