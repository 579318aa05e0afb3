//! The wire contract: a real answer of every route, and an error answer of every route
//! family, validated against the OpenAPI document the server serves (JSON Schema draft
//! 2020-12, as OpenAPI 3.1 uses), with `$ref`s resolved in the document's components.
//!
//! Object schemas are checked strictly here (`additionalProperties: false` where a schema
//! does not say otherwise), so an answer field renamed or added without its type changing
//! fails as surely as one removed or retyped.

use std::collections::{BTreeMap, BTreeSet};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::common::Env;

/// One answer as the server gave it.
struct Answer {
    status: StatusCode,
    content_type: String,
    text: String,
}

/// The served document and what was checked against it.
struct Contract {
    doc: Value,
    exercised: BTreeSet<(String, String)>,
    failures: Vec<String>,
}

impl Contract {
    /// The document `env` serves, made strict.
    async fn of(env: &Env) -> Contract {
        let (status, mut doc) = env.get("/api/v1/openapi.json").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(doc["openapi"].as_str().map(|v| &v[..3]), Some("3.1"));
        strict(&mut doc);
        Contract {
            doc,
            exercised: BTreeSet::new(),
            failures: Vec::new(),
        }
    }

    /// Every operation the document describes, as (METHOD, path template).
    fn operations(&self) -> BTreeSet<(String, String)> {
        let mut out = BTreeSet::new();
        for (path, item) in self.doc["paths"].as_object().expect("paths") {
            for method in item.as_object().expect("path item").keys() {
                if ["get", "post", "put", "delete", "patch"].contains(&method.as_str()) {
                    out.insert((method.to_uppercase(), path.clone()));
                }
            }
        }
        out
    }

    /// Calls `path` (concrete) as the operation `template` and validates the answer, which
    /// must have status `want`. The answer's JSON body, for the next calls.
    async fn call(
        &mut self,
        env: &Env,
        method: Method,
        template: &str,
        path: &str,
        body: Option<Value>,
        want: StatusCode,
    ) -> Value {
        let mut request = env.http.request(method.clone(), env.url(path));
        if let Some(b) = &body {
            request = request.json(b);
        }
        let response = request.send().await.expect("request");
        let answer = Answer {
            status: response.status(),
            content_type: response
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string(),
            text: response.text().await.expect("body"),
        };
        let what = format!("{method} {path}");
        if answer.status != want {
            self.failures.push(format!(
                "{what}: status {} (wanted {want}): {}",
                answer.status, answer.text
            ));
            return Value::Null;
        }
        self.exercised
            .insert((method.as_str().to_string(), template.to_string()));
        self.validate(&what, &method, template, &answer)
    }

    /// Validates `answer` against the response the document gives `template` for its
    /// status (the exact status, else its range such as `4XX`, else `default`).
    fn validate(&mut self, what: &str, method: &Method, template: &str, answer: &Answer) -> Value {
        let op = &self.doc["paths"][template][method.as_str().to_lowercase()];
        if op.is_null() {
            self.failures
                .push(format!("{what}: the document has no operation {template}"));
            return Value::Null;
        }
        let code = answer.status.as_u16().to_string();
        let range = format!("{}XX", &code[..1]);
        let responses = &op["responses"];
        let Some(mut response) = [code.as_str(), range.as_str(), "default"]
            .iter()
            .map(|k| &responses[*k])
            .find(|r| !r.is_null())
        else {
            self.failures
                .push(format!("{what}: status {code} is not documented"));
            return Value::Null;
        };
        if let Some(r) = response["$ref"].as_str() {
            response = self
                .doc
                .pointer(&r[1..])
                .expect("a response reference resolves");
        }
        let content = &response["content"];
        if content.is_null() || content.as_object().is_some_and(|c| c.is_empty()) {
            if !answer.text.is_empty() {
                self.failures.push(format!(
                    "{what}: documented without a body, answered {}",
                    answer.text
                ));
            }
            return Value::Null;
        }
        let media = answer.content_type.split(';').next().unwrap_or("").trim();
        let Some((_, media_type)) = content
            .as_object()
            .expect("content")
            .iter()
            .find(|(m, _)| m.split(';').next().unwrap_or("").trim() == media)
        else {
            self.failures.push(format!(
                "{what}: content type {media:?} is not documented for {code}"
            ));
            return Value::Null;
        };
        if media != "application/json" && media != "application/problem+json" {
            // Text (Prometheus exposition): documented as a string.
            return Value::Null;
        }
        let body: Value = match serde_json::from_str(&answer.text) {
            Ok(v) => v,
            Err(e) => {
                self.failures
                    .push(format!("{what}: not JSON ({e}): {}", answer.text));
                return Value::Null;
            }
        };
        // The response's schema, with the document's components beside it so that
        // `#/components/...` references resolve.
        let mut schema = media_type["schema"].clone();
        if let Value::Object(m) = &mut schema {
            m.insert("components".into(), self.doc["components"].clone());
        } else {
            schema = json!({"allOf": [schema], "components": self.doc["components"]});
        }
        let validator = match jsonschema::draft202012::new(&schema) {
            Ok(v) => v,
            Err(e) => {
                self.failures
                    .push(format!("{what}: the schema does not compile: {e}"));
                return body;
            }
        };
        let errors: Vec<String> = validator
            .iter_errors(&body)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        if !errors.is_empty() {
            self.failures.push(format!(
                "{what} ({code}): {}\n  body: {body}",
                errors.join("; ")
            ));
        }
        body
    }
}

/// Closes every component object schema that lists its properties and says nothing of
/// others, except those another schema extends through `allOf` (a closed schema there would
/// refuse the members its siblings add).
fn strict(doc: &mut Value) {
    fn allof_refs(v: &Value, out: &mut BTreeSet<String>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::Array(parts)) = m.get("allOf") {
                    for p in parts {
                        if let Some(r) = p["$ref"].as_str() {
                            out.insert(r.rsplit('/').next().unwrap_or("").to_string());
                        }
                    }
                }
                m.values().for_each(|v| allof_refs(v, out));
            }
            Value::Array(a) => a.iter().for_each(|v| allof_refs(v, out)),
            _ => {}
        }
    }
    let mut extended = BTreeSet::new();
    allof_refs(doc, &mut extended);
    let schemas = doc["components"]["schemas"]
        .as_object_mut()
        .expect("component schemas");
    for (name, schema) in schemas.iter_mut() {
        if extended.contains(name) {
            continue;
        }
        if let Value::Object(m) = schema
            && m.contains_key("properties")
            && !m.contains_key("additionalProperties")
            && !m.contains_key("allOf")
        {
            m.insert("additionalProperties".into(), Value::Bool(false));
        }
    }
}

/// The routes the server has: one duration series per route in `/metrics`.
async fn served_routes(env: &Env) -> BTreeSet<(String, String)> {
    let text = env.metrics_text().await;
    let re = regex::Regex::new(
        r#"^comb_http_request_duration_seconds_count\{method="([A-Z]+)",route="([^"]+)"\}"#,
    )
    .unwrap();
    text.lines()
        .filter_map(|l| re.captures(l))
        .map(|c| (c[1].to_string(), c[2].to_string()))
        .collect()
}

#[tokio::test]
async fn every_route_answers_as_its_schema_says() {
    use Method as M;
    use StatusCode as S;
    let env = Env::start().await;
    let mut c = Contract::of(&env).await;
    let (q, p) = ("contract", "p1");

    // The data path.
    c.call(
        &env,
        M::POST,
        "/api/v1/configure",
        "/api/v1/configure",
        Some(json!({"queue": q, "namespace": "ns", "task": "t", "options": {"leaseTime": 60}})),
        S::OK,
    )
    .await;
    let items: Vec<Value> = (0..12)
        .map(|i| json!({"queue": q, "partition": p, "payload": {"n": i}, "transactionId": format!("m{i}"), "traceId": "tr"}))
        .collect();
    let pushed = c
        .call(
            &env,
            M::POST,
            "/api/v1/push",
            "/api/v1/push",
            Some(json!({ "items": items })),
            S::CREATED,
        )
        .await;
    let partition_id = pushed[0]["partition_id"].as_str().unwrap_or("").to_string();
    let popped = c
        .call(
            &env,
            M::GET,
            "/api/v1/pop/queue/{queue}",
            &format!("/api/v1/pop/queue/{q}?consumerGroup=g1&batch=2"),
            None,
            S::OK,
        )
        .await;
    let m = &popped["messages"][0];
    c.call(
        &env,
        M::POST,
        "/api/v1/ack",
        "/api/v1/ack",
        Some(
            json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                    "leaseId": m["leaseId"], "consumerGroup": "g1", "status": "completed"}),
        ),
        S::OK,
    )
    .await;
    let m = &popped["messages"][1];
    c.call(
        &env,
        M::POST,
        "/api/v1/ack/batch",
        "/api/v1/ack/batch",
        Some(json!({"consumerGroup": "g1", "acknowledgments": [
            {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
             "leaseId": m["leaseId"], "status": "failed", "error": "boom"}]})),
        S::OK,
    )
    .await;
    let popped = c
        .call(
            &env,
            M::GET,
            "/api/v1/pop/queue/{queue}/partition/{partition}",
            &format!("/api/v1/pop/queue/{q}/partition/{p}?consumerGroup=g2"),
            None,
            S::OK,
        )
        .await;
    let m = &popped["messages"][0];
    c.call(
        &env,
        M::POST,
        "/api/v1/lease/{leaseId}/extend",
        &format!(
            "/api/v1/lease/{}/extend",
            m["leaseId"].as_str().unwrap_or("")
        ),
        Some(json!({"seconds": 30})),
        S::OK,
    )
    .await;
    c.call(
        &env,
        M::POST,
        "/api/v1/transaction",
        "/api/v1/transaction",
        Some(json!({"operations": [
            {"type": "ack", "transactionId": m["transactionId"], "partitionId": m["partitionId"],
             "leaseId": m["leaseId"], "consumerGroup": "g2", "status": "completed"},
            {"type": "push", "items": [{"queue": "contract-out", "payload": {"x": 1}}]},
        ]})),
        S::OK,
    )
    .await;
    c.call(
        &env,
        M::POST,
        "/api/v1/pop",
        "/api/v1/pop",
        Some(json!({"queue": q, "consumerGroup": "g3", "batch": 1, "autoAck": true})),
        S::OK,
    )
    .await;
    // Nothing left for a group past the end: 204, without a body.
    c.call(
        &env,
        M::GET,
        "/api/v1/pop/queue/{queue}",
        &format!("/api/v1/pop/queue/{q}?consumerGroup=late&subscriptionMode=new"),
        None,
        S::NO_CONTENT,
    )
    .await;

    // Streams.
    let registered = c
        .call(
            &env,
            M::POST,
            "/streams/v1/queries",
            "/streams/v1/queries",
            Some(json!({"name": "sq", "source_queue": q, "sink_queue": "contract-sink", "config_hash": "h1"})),
            S::OK,
        )
        .await;
    let query_id = registered["query_id"].clone();
    let leased = c
        .call(
            &env,
            M::GET,
            "/api/v1/pop/queue/{queue}",
            &format!("/api/v1/pop/queue/{q}?consumerGroup=streams.sq&batch=1"),
            None,
            S::OK,
        )
        .await;
    let m = &leased["messages"][0];
    c.call(
        &env,
        M::POST,
        "/streams/v1/cycle",
        "/streams/v1/cycle",
        Some(json!({"query_id": query_id, "partition_id": partition_id,
                    "consumer_group": "streams.sq",
                    "state_ops": [{"type": "upsert", "key": "k", "value": {"acc": 1}}],
                    "push_items": [{"queue": "contract-sink", "payload": {"sum": 1}}],
                    "ack": {"transactionId": m["transactionId"], "leaseId": m["leaseId"],
                            "status": "completed", "count": 1}})),
        S::OK,
    )
    .await;
    c.call(
        &env,
        M::POST,
        "/streams/v1/state/get",
        "/streams/v1/state/get",
        Some(json!({"query_id": query_id, "partition_id": partition_id})),
        S::OK,
    )
    .await;
    c.call(
        &env,
        M::GET,
        "/api/v1/streams/queries",
        "/api/v1/streams/queries",
        None,
        S::OK,
    )
    .await;

    // Probes and the document.
    for route in ["/health", "/ready", "/metrics", "/api/v1/openapi.json"] {
        c.call(&env, M::GET, route, route, None, S::OK).await;
    }

    // The administration.
    let gets = [
        (
            "/api/v1/resources/overview",
            "/api/v1/resources/overview".to_string(),
        ),
        (
            "/api/v1/resources/queues",
            "/api/v1/resources/queues".into(),
        ),
        (
            "/api/v1/resources/queues/{queue}",
            format!("/api/v1/resources/queues/{q}"),
        ),
        (
            "/api/v1/resources/partitions",
            format!("/api/v1/resources/partitions?queue={q}"),
        ),
        (
            "/api/v1/resources/namespaces",
            "/api/v1/resources/namespaces".into(),
        ),
        ("/api/v1/resources/tasks", "/api/v1/resources/tasks".into()),
        ("/api/v1/consumer-groups", "/api/v1/consumer-groups".into()),
        (
            "/api/v1/consumer-groups/lagging",
            "/api/v1/consumer-groups/lagging?minLagSeconds=0".into(),
        ),
        (
            "/api/v1/consumer-groups/{group}",
            "/api/v1/consumer-groups/g1".into(),
        ),
        ("/api/v1/messages", format!("/api/v1/messages?queue={q}")),
        (
            "/api/v1/messages/{partitionId}/{transactionId}",
            format!("/api/v1/messages/{partition_id}/m5"),
        ),
        (
            "/api/v1/system/maintenance",
            "/api/v1/system/maintenance".into(),
        ),
        (
            "/api/v1/system/maintenance/pop",
            "/api/v1/system/maintenance/pop".into(),
        ),
        ("/api/v1/system/servers", "/api/v1/system/servers".into()),
        ("/api/v1/status", "/api/v1/status".into()),
        ("/api/v1/status/queues", "/api/v1/status/queues".into()),
        (
            "/api/v1/status/queues/{queue}",
            format!("/api/v1/status/queues/{q}"),
        ),
        (
            "/api/v1/status/analytics",
            "/api/v1/status/analytics".into(),
        ),
        (
            "/api/v1/analytics/postgres-stats",
            "/api/v1/analytics/postgres-stats".into(),
        ),
        (
            "/api/v1/analytics/system-metrics",
            "/api/v1/analytics/system-metrics".into(),
        ),
        (
            "/api/v1/analytics/worker-metrics",
            "/api/v1/analytics/worker-metrics".into(),
        ),
        ("/api/v1/dlq", format!("/api/v1/dlq?queue={q}")),
    ];
    for (template, path) in &gets {
        c.call(&env, M::GET, template, path, None, S::OK).await;
    }
    c.call(
        &env,
        M::POST,
        "/api/v1/traces",
        "/api/v1/traces",
        Some(
            json!({"transactionId": "m5", "partitionId": partition_id, "consumerGroup": "g1",
                    "eventType": "processing", "data": {"text": "step", "traceName": "order-1"}}),
        ),
        S::CREATED,
    )
    .await;
    for (template, path) in [
        ("/api/v1/traces/names", "/api/v1/traces/names".to_string()),
        (
            "/api/v1/traces/by-name/{traceName}",
            "/api/v1/traces/by-name/order-1".into(),
        ),
        (
            "/api/v1/traces/{partitionId}/{transactionId}",
            format!("/api/v1/traces/{partition_id}/m5"),
        ),
    ] {
        c.call(&env, M::GET, template, &path, None, S::OK).await;
    }
    let posts = [
        // m1 failed for g1 above (before the seeks below move g1).
        (
            "/api/v1/messages/{partitionId}/{transactionId}/retry",
            format!("/api/v1/messages/{partition_id}/m1/retry"),
            json!({}),
        ),
        (
            "/api/v1/system/maintenance",
            "/api/v1/system/maintenance".to_string(),
            json!({"enabled": false}),
        ),
        (
            "/api/v1/system/maintenance/pop",
            "/api/v1/system/maintenance/pop".into(),
            json!({"enabled": false}),
        ),
        (
            "/api/v1/stats/refresh",
            "/api/v1/stats/refresh".into(),
            json!({}),
        ),
        (
            "/api/v1/consumer-groups/{group}/subscription",
            "/api/v1/consumer-groups/g1/subscription".into(),
            json!({"subscriptionTimestamp": "2026-01-01T00:00:00Z"}),
        ),
        (
            "/api/v1/consumer-groups/{group}/queues/{queue}/seek",
            format!("/api/v1/consumer-groups/g1/queues/{q}/seek"),
            json!({"toStart": true}),
        ),
        (
            "/api/v1/consumer-groups/{group}/queues/{queue}/partitions/{partition}/seek",
            format!("/api/v1/consumer-groups/g1/queues/{q}/partitions/{p}/seek"),
            json!({"toEnd": true}),
        ),
        (
            "/api/v1/messages/{partitionId}/{transactionId}/dlq",
            format!("/api/v1/messages/{partition_id}/m6/dlq"),
            json!({"consumerGroup": "g3"}),
        ),
        (
            "/api/v1/dlq/requeue",
            "/api/v1/dlq/requeue".into(),
            json!({"queue": q, "consumerGroup": "g3"}),
        ),
        (
            "/api/v1/dlq/purge",
            "/api/v1/dlq/purge".into(),
            json!({"queue": q}),
        ),
    ];
    for (template, path, body) in posts {
        c.call(&env, M::POST, template, &path, Some(body), S::OK)
            .await;
    }
    let deletes = [
        (
            "/api/v1/messages/{partitionId}/{transactionId}",
            format!("/api/v1/messages/{partition_id}/m8"),
        ),
        (
            "/api/v1/consumer-groups/{group}/queues/{queue}",
            format!("/api/v1/consumer-groups/g2/queues/{q}"),
        ),
        (
            "/api/v1/queues/{queue}/clear",
            format!("/api/v1/queues/{q}/clear"),
        ),
        (
            "/api/v1/resources/queues/{queue}",
            format!("/api/v1/resources/queues/{q}"),
        ),
    ];
    for (template, path) in &deletes {
        c.call(&env, M::DELETE, template, path, None, S::OK).await;
    }

    assert!(c.failures.is_empty(), "{}", c.failures.join("\n"));
    let documented = c.operations();
    let served = served_routes(&env).await;
    assert_eq!(
        documented, served,
        "the document describes the routes served"
    );
    let missed: Vec<_> = served.difference(&c.exercised).collect();
    assert!(missed.is_empty(), "routes not exercised: {missed:?}");
}

/// One refusal per family of routes, each a problem answer as the document describes it.
#[tokio::test]
async fn refusals_answer_as_the_problem_schema_says() {
    use Method as M;
    use StatusCode as S;
    let env = Env::start().await;
    let mut c = Contract::of(&env).await;
    let cases: Vec<(M, &str, String, Option<Value>, S)> = vec![
        (
            M::POST,
            "/api/v1/push",
            "/api/v1/push".into(),
            Some(json!({"items": [{"queue": "bad name!", "payload": 1}]})),
            S::BAD_REQUEST,
        ),
        (
            M::GET,
            "/api/v1/pop/queue/{queue}",
            "/api/v1/pop/queue/q?batch=0".into(),
            None,
            S::BAD_REQUEST,
        ),
        (
            M::POST,
            "/api/v1/ack",
            "/api/v1/ack".into(),
            Some(json!({"transactionId": "t", "partitionId": "nope", "status": "completed"})),
            S::BAD_REQUEST,
        ),
        (
            M::POST,
            "/api/v1/transaction",
            "/api/v1/transaction".into(),
            Some(json!({"operations": []})),
            S::BAD_REQUEST,
        ),
        (
            M::POST,
            "/api/v1/lease/{leaseId}/extend",
            format!("/api/v1/lease/{}/extend", uuid::Uuid::new_v4()),
            None,
            S::CONFLICT,
        ),
        (
            M::POST,
            "/api/v1/configure",
            "/api/v1/configure".into(),
            Some(json!({"queue": "q", "options": {"nope": 1}})),
            S::BAD_REQUEST,
        ),
        (
            M::POST,
            "/streams/v1/queries",
            "/streams/v1/queries".into(),
            Some(json!({"name": ""})),
            S::BAD_REQUEST,
        ),
        (
            M::GET,
            "/api/v1/resources/queues/{queue}",
            "/api/v1/resources/queues/absent".into(),
            None,
            S::NOT_FOUND,
        ),
        (
            M::GET,
            "/api/v1/consumer-groups/{group}",
            "/api/v1/consumer-groups/absent".into(),
            None,
            S::NOT_FOUND,
        ),
        (
            M::GET,
            "/api/v1/messages",
            "/api/v1/messages?limit=0".into(),
            None,
            S::BAD_REQUEST,
        ),
        (
            M::POST,
            "/api/v1/dlq/requeue",
            "/api/v1/dlq/requeue".into(),
            Some(json!({})),
            S::BAD_REQUEST,
        ),
        (
            M::POST,
            "/api/v1/system/maintenance",
            "/api/v1/system/maintenance".into(),
            Some(json!({"enabled": "yes"})),
            S::BAD_REQUEST,
        ),
        (
            M::GET,
            "/api/v1/traces/by-name/{traceName}",
            "/api/v1/traces/by-name/x?limit=-1".into(),
            None,
            S::BAD_REQUEST,
        ),
        (
            M::GET,
            "/api/v1/status/queues/{queue}",
            "/api/v1/status/queues/absent".into(),
            None,
            S::NOT_FOUND,
        ),
        (
            M::GET,
            "/api/v1/dlq",
            "/api/v1/dlq".into(),
            None,
            S::BAD_REQUEST,
        ),
    ];
    let mut families = BTreeMap::new();
    for (method, template, path, body, want) in cases {
        let answer = c.call(&env, method, template, &path, body, want).await;
        families.insert(template, answer["code"].clone());
    }
    assert!(c.failures.is_empty(), "{}", c.failures.join("\n"));
    for (template, code) in families {
        assert!(code.is_string(), "{template}: a problem with a code");
    }
}
