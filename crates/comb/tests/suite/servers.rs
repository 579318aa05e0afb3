//! The server registry (`GET /api/v1/system/servers`): every server registers as it starts,
//! beats, leaves when it stops, and is forgotten by the maintenance leader once it misses
//! three beats.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;

use crate::common::{self, Env};

async fn servers(env: &Env) -> Vec<Value> {
    let (s, body) = env.get("/api/v1/system/servers").await;
    assert_eq!(s, StatusCode::OK, "{body}");
    body["servers"].as_array().expect("a list").clone()
}

#[tokio::test]
async fn servers_register_leave_and_are_forgotten_when_silent() {
    let env = Env::start_with(&["--maintenance-interval-ms", "300"]).await;
    // Registered before it serves: listed at once, with its release and function set.
    let listed = servers(&env).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    let me = &listed[0];
    assert_eq!(me["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(me["functionsVersion"], 4);
    assert_eq!(
        me["schemaVersion"].to_string(),
        env.sql("SELECT max(version) FROM comb.migrations")
    );
    assert_eq!(me["listen"], env.server.addr().to_string());
    assert!(me["startedAt"].is_string() && me["heartbeatAt"].is_string());

    // A second server is listed beside it; stopped gracefully, it leaves at once.
    let mut second = env
        .second_server_with(&["--maintenance-interval-ms", "300"])
        .await;
    let listed = servers(&env).await;
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(
        listed
            .iter()
            .any(|s| s["listen"] == second.addr().to_string())
    );
    assert!(second.terminate(common::PATIENCE).is_some());
    assert_eq!(servers(&env).await.len(), 1);

    // Killed, a third stays listed until it has missed three beats, then is forgotten.
    let mut third = env.second_server().await;
    let third_addr = third.addr().to_string();
    assert_eq!(servers(&env).await.len(), 2);
    third.kill();
    common::until("the killed server forgotten", || async {
        let listed = servers(&env).await;
        listed.len() == 1 && listed[0]["listen"] != third_addr.as_str()
    })
    .await;
    // The living server kept beating: it is still there.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let listed = servers(&env).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["listen"], env.server.addr().to_string());
}

#[tokio::test]
async fn a_registry_that_cannot_be_read_is_a_problem() {
    let env = Env::start().await;
    env.sql("ALTER TABLE comb.servers RENAME TO servers_away");
    let r = env
        .http
        .get(env.url("/api/v1/system/servers"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        r.headers()["content-type"].to_str().unwrap(),
        "application/problem+json"
    );
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["code"], "database_error", "{body}");
    env.sql("ALTER TABLE comb.servers_away RENAME TO servers");
    assert_eq!(servers(&env).await.len(), 1);
}
