//! Hostile and careless clients: what a flood of names nobody uses leaves in the server's
//! memory. Sizes of the registries, read from `/metrics`, never timing.

use futures_util::StreamExt;
use reqwest::StatusCode;
use serde_json::json;

use crate::common::{Env, xorshift};

/// The value of `comb_registry_entries{registry="<name>"}` in a `/metrics` text.
fn registry(metrics: &str, name: &str) -> u64 {
    let prefix = format!("comb_registry_entries{{registry=\"{name}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no registry {name} in /metrics"))
        .trim()
        .parse()
        .expect("a count")
}

const REGISTRIES: [&str; 8] = [
    "wake_groups",
    "wake_queues",
    "wake_offers",
    "queue_counters",
    "catalog_queues",
    "catalog_partitions",
    "catalog_subscriptions",
    "catalog_options",
];

/// 109,000 random names that exist nowhere, in 10,000 requests: pops that wait and pops that
/// do not, over the queue and a named partition, with and without a group; batches of acks of
/// random messages (100 names each); lease extensions of random ids; lookups and listings.
/// Afterwards every registry keyed by names holds at most what it held before.
#[tokio::test]
async fn a_flood_of_random_names_leaves_the_registries_as_they_were() {
    let env = Env::start().await;
    // Something that exists, so the registries hold entries of their own to compare with.
    env.push(json!([{"queue": "real", "partition": "p", "payload": 1}]))
        .await;
    let popped = env.pop("/api/v1/pop/queue/real?autoAck=true").await;
    assert!(popped.is_some(), "the real message is delivered");
    let before = env.metrics_text().await;
    let base = env.server.base_url();
    let requests = 10_000u64;
    const ACKS_PER_BATCH: usize = 100;
    let answered =
        futures_util::stream::iter(0..requests)
            .map(|i| {
                let http = env.http.clone();
                let base = base.clone();
                async move {
                    let mut seed = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                    let name = format!("n{:016x}", xorshift(&mut seed));
                    let id = uuid::Uuid::from_u64_pair(xorshift(&mut seed), xorshift(&mut seed));
                    let request = match i % 10 {
                    0 => http.get(format!(
                        "{base}/api/v1/pop/queue/{name}?wait=true&timeout=1"
                    )),
                    1 => http.get(format!(
                        "{base}/api/v1/pop/queue/{name}?consumerGroup={name}&wait=true&timeout=1"
                    )),
                    2 => http.get(format!("{base}/api/v1/pop/queue/{name}?consumerGroup={name}")),
                    3 => http.get(format!(
                        "{base}/api/v1/pop/queue/{name}/partition/{name}?wait=true&timeout=1"
                    )),
                    // A partition that does not exist in a queue that does.
                    4 => http.get(format!(
                        "{base}/api/v1/pop/queue/real/partition/{name}?wait=true&timeout=1"
                    )),
                    5 => {
                        let acks: Vec<_> = (0..ACKS_PER_BATCH)
                            .map(|k| {
                                let p = uuid::Uuid::from_u64_pair(
                                    xorshift(&mut seed),
                                    xorshift(&mut seed),
                                );
                                json!({"transactionId": format!("{name}-{k}"),
                                       "partitionId": p, "status": "completed"})
                            })
                            .collect();
                        http.post(format!("{base}/api/v1/ack/batch"))
                            .json(&json!({"acknowledgments": acks, "consumerGroup": name}))
                    }
                    6 => http
                        .post(format!("{base}/api/v1/lease/{id}/extend"))
                        .json(&json!({"seconds": 30})),
                    7 => http.get(format!("{base}/api/v1/resources/queues/{name}")),
                    8 => http.get(format!("{base}/api/v1/messages?queue={name}")),
                    _ => http.get(format!("{base}/api/v1/consumer-groups/{name}")),
                };
                    let status = request.send().await.expect("request").status();
                    assert!(!status.is_server_error(), "request {i} answered {status}");
                    status
                }
            })
            .buffer_unordered(64)
            .fold(0u64, |n, status| async move {
                n + u64::from(status != StatusCode::TOO_MANY_REQUESTS)
            })
            .await;
    assert!(answered > requests / 2, "{answered} answered of {requests}");
    let after = env.metrics_text().await;
    // Per-queue counters are emptied by the per-minute record, and the catalog forgets all
    // when its relay reconnects: afterwards each holds at most what it held before.
    for name in REGISTRIES {
        assert!(
            registry(&after, name) <= registry(&before, name),
            "registry {name} grew from {} to {} with {requests} requests on random names",
            registry(&before, name),
            registry(&after, name),
        );
    }
    assert_eq!(registry(&after, "wake_groups"), 0, "no pop waits now");
    assert_eq!(registry(&after, "wake_queues"), 0, "no pop waits now");
    assert_eq!(registry(&after, "wake_offers"), 0, "no pop waits now");
    assert!(
        registry(&before, "catalog_queues") >= 1,
        "the real queue is known"
    );
}
