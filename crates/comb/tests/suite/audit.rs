//! The short delivery audit: 10,000 numbered messages across 100 partitions, two consumer
//! groups that fail 1 % of deliveries and lose a consumer mid-batch, and one `kill -9` of
//! the server halfway. Nothing accepted may be lost or handed out of order, and duplicates
//! may not exceed what was in flight when the server died. The long scenarios run in
//! `make chaos` (`comb-audit chaos`).

use crate::common;
use comb_harness::Postgres;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_lost_or_reordered_across_a_server_kill_and_a_consumer_death() {
    let url = tokio::task::spawn_blocking(|| Postgres::shared().create_database("audit"))
        .await
        .unwrap()
        .expect("database");
    short_audit_passes(&url, 10_000).await;
}

/// Runs the short audit of `messages` against a fresh database at `url` and asserts that all
/// were accepted, every group met deliberate failures or a death, and nothing was lost or
/// reordered (the Citus run shares it).
pub(crate) async fn short_audit_passes(url: &str, messages: u64) {
    let out = comb_audit::scenario::short_audit(common::comb_bin(), url, messages).await;
    println!("{}", out.render());
    assert!(out.report.accepted >= messages, "{}", out.render());
    assert!(
        out.report
            .groups
            .iter()
            .all(|g| g.expected_redeliveries > 0),
        "every group saw deliberate failures or a death: {}",
        out.render()
    );
    assert!(out.passed(), "{}", out.render());
}

/// The audit is not blind: consumers that settle at delivery (`autoAck`) and die holding
/// batches lose messages for real, and the audit must count them and fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_counts_messages_lost_by_at_most_once_consumers() {
    let url = tokio::task::spawn_blocking(|| Postgres::shared().create_database("audit_amo"))
        .await
        .unwrap()
        .expect("database");
    let out = comb_audit::scenario::at_most_once_loses(common::comb_bin(), &url, 2_000).await;
    println!("{}", out.render());
    assert!(out.report.lost() > 0, "{}", out.render());
    assert!(!out.passed());
    // No assertion on order here: auto-ack takes no lease, so two consumers of one group may
    // hold consecutive batches of a partition at once and record them in either order. Order
    // under leases is what the other audits check.
}
