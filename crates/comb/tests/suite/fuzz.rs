//! Bad input never hurts (bounded run): the hand-written edge cases and 1,500 cases generated
//! from the OpenAPI description, each answered below 500 with a complete problem+json on
//! error, no refused request changing the database, and the server healthy afterwards. The
//! long run is `comb-audit fuzz` in `make chaos`.

use crate::common;
use comb_harness::Postgres;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_request_gets_a_5xx_an_unclear_error_or_stores_anything_when_refused() {
    let url = tokio::task::spawn_blocking(|| Postgres::shared().create_database("fuzz"))
        .await
        .unwrap()
        .expect("database");
    let report = comb_audit::fuzz::against_new_server(common::comb_bin(), &url, 1_500, 1)
        .await
        .expect("fuzz runs");
    println!("{}", report.summary());
    assert!(report.cases > 1_500);
    assert!(report.findings.is_empty(), "{}", report.summary());
}
